//! The one Kiln binary. Thin: flag parsing and output; the work happens in
//! kiln-server, kiln-agent, kiln-workflow and kiln-api; `kiln bench` is kiln-bench.

mod alloc;
mod cli;
mod commands;
mod telemetry;
pub mod term;

pub use cli::Cli;

/// Parse arguments, run the command, and return the process exit code
/// (see `kiln_api::exit`).
pub fn main_entry() -> i32 {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if cli.command.is_daemon() || matches!(cli.command, cli::Command::Exec(_)) {
        // Server and agent files (database, WAL, tokens, objects, workspaces)
        // are private to the user running Kiln (issue 13); `kiln exec` runs
        // the same server and agents.
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        alloc::return_large_buffers();
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

/// Parse the command line. A global flag typed before the subcommand
/// (`kiln --json logs RUN`) that the subcommand has no flag of its own for
/// is refused (exit 2) rather than ignored.
fn parse() -> Result<Cli, i32> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let definition = Cli::command();
    let (mut cmd, mut m, mut path) = (&definition, &matches, String::from("kiln"));
    while let Some((name, sub)) = m.subcommand() {
        let Some(c) = cmd.find_subcommand(name) else { break };
        path = format!("{path} {name}");
        (cmd, m) = (c, sub);
    }
    for (id, flag) in
        [("server", "--server"), ("context", "--context"), ("token_file", "--token-file"), ("json", "--json")]
    {
        let given = m.try_contains_id(id).is_ok() && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        if given && !cmd.get_arguments().any(|a| a.get_id().as_str() == id) {
            eprintln!("error: `{path}` takes no {flag}; see `{path} --help`");
            return Err(kiln_api::exit::USAGE);
        }
    }
    Cli::from_arg_matches(&matches).map_err(|e| -> i32 { e.format(&mut Cli::command()).exit() })
}
