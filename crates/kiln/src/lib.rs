//! The one Kiln binary. Thin: flag parsing and output; the work happens in
//! kiln-server, kiln-agent, kiln-workflow and kiln-api; `kiln bench` is kiln-bench.

mod cli;
mod commands;
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
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| {
        // PostgreSQL's "there is no transaction in progress" notice (a
        // ROLLBACK after a failed serializable COMMIT) is not worth a line each.
        tracing_subscriber::EnvFilter::new(if cli.command.is_daemon() {
            "info,sqlx=warn,sqlx::postgres::notice=error"
        } else {
            "warn,sqlx::postgres::notice=error"
        })
    });
    // Colours only on a terminal (a redirected log stays plain text), and never with NO_COLOR.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        cli::LogFormat::Text => logs.with_ansi(ansi).init(),
        cli::LogFormat::Json => logs.json().with_current_span(true).with_span_list(true).init(),
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(commands::run(cli))
}
