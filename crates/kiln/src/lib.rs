//! The one Kiln binary. Thin: flag parsing and output; the work happens in
//! kiln-server, kiln-agent, kiln-workflow and kiln-api; `kiln bench` is kiln-bench.

mod alloc;
mod cli;
mod commands;
mod lean_agent;
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
    // `kiln agent` becomes the lean binary when it is there (this returns
    // only if it does not).
    let in_process = matches!(cli.command, cli::Command::Agent(_)).then(lean_agent::exec_lean_agent).flatten();
    if cli.command.is_daemon() || matches!(cli.command, cli::Command::Exec(_)) {
        daemon_process();
    }
    let service = match cli.command {
        cli::Command::Server(_) => "kiln-server",
        cli::Command::Agent(_) => "kiln-agent",
        _ => "kiln",
    };
    let log = cli.command.daemon_log().cloned();
    with_telemetry(log.as_ref(), service, async move {
        if let Some(why) = in_process {
            tracing::warn!("{why}");
        }
        commands::run(cli).await
    })
}

/// The `kiln-agent` binary's entry (`src/bin/kiln-agent.rs`): `kiln agent`
/// alone (`lean_agent`). Returns the process exit code.
pub fn agent_entry() -> i32 {
    let args = lean_agent::lean_args();
    daemon_process();
    let log = args.log.clone();
    with_telemetry(Some(&log), "kiln-agent", commands::run_agent(args))
}

/// What a daemon's process sets first, before any thread starts.
fn daemon_process() {
    // Server and agent files (database, WAL, tokens, objects, workspaces)
    // are private to the user running Kiln (issue 13); `kiln exec` runs
    // the same server and agents.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    alloc::return_large_buffers();
}

/// Run `command` on a Tokio runtime with the log subscriber (and the span
/// exporter) installed for a daemon of `log` (`None`: a client command)
/// named `service`; flush the spans after it. Returns its exit code.
fn with_telemetry(
    log: Option<&cli::DaemonLog>,
    service: &'static str,
    command: impl std::future::Future<Output = i32>,
) -> i32 {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async {
        let telemetry = match telemetry::init(log, service) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("kiln: {e}");
                return kiln_api::exit::USAGE;
            }
        };
        let code = command.await;
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
