//! The one Kiln binary. Thin: flag parsing and output; the work happens in
//! kiln-server, kiln-agent, kiln-workflow and kiln-api; `kiln bench` is kiln-bench.

mod cli;
mod commands;
mod telemetry;
pub mod term;

pub use cli::Cli;

use clap::Parser;

/// Parse arguments, run the command, and return the process exit code
/// (see `kiln_api::exit`).
pub fn main_entry() -> i32 {
    let cli = Cli::parse();
    if cli.command.is_daemon() {
        // Server and agent files (database, WAL, tokens, objects, workspaces)
        // are private to the user running Kiln (issue 13).
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async {
        let telemetry = match telemetry::init(&cli) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("kiln: {e}");
                return kiln_api::exit::USAGE;
            }
        };
        let code = commands::run(cli).await;
        telemetry.shutdown().await;
        code
    })
}
