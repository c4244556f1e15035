//! Command implementations, one file per command; `shared` holds what
//! several of them use. Modules here depend on `shared` (and `run` on
//! `logs`), never on this file.

mod access;
mod agent;
mod artifact;
mod cancel;
mod logs;
mod repo;
mod retry;
mod run;
mod secret;
mod server;
mod shared;
mod status;
mod up;
mod validate;

use crate::cli::{ArtifactCommand, Cli, Command};

/// Run the command; print a failure as `error: …`. Returns the exit code.
pub async fn run(cli: Cli) -> i32 {
    let res = match cli.command {
        Command::Up(a) => up::run(a).await,
        Command::Server(a) => server::run(a).await,
        Command::Agent(a) => agent::run(a).await,
        Command::Repo { command } => repo::run(command).await,
        Command::Secret { command } => secret::run(command).await,
        Command::Token { command } => access::token(command).await,
        Command::AgentToken { command } => access::agent_token(command).await,
        Command::Agents { command } => access::agents(command).await,
        Command::Audit(a) => access::audit(a).await,
        Command::Run(a) => run::run(a).await,
        Command::Status(a) => status::run(a).await,
        Command::Logs(a) => logs::run(a).await,
        Command::Cancel(a) => cancel::run(a).await,
        Command::Retry(a) => retry::run(a).await,
        Command::Validate { file } => Ok(validate::run(&file)),
        Command::Artifact { command: ArtifactCommand::Get { run, job, name, output, conn } } => {
            artifact::get(&conn, &run, &job, &name, &output).await
        }
        Command::Bench(a) => kiln_bench::run(a).await,
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::term::for_stderr(&e.message));
            e.code
        }
    }
}
