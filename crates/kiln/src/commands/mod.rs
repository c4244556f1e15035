//! Command implementations, one file per command; `shared` holds what
//! several of them use, `profile` where the CLI's server and token come
//! from. Modules here depend on `shared` and `profile` (and `run` and
//! `wait` on `logs`; `exec` on `run` and `validate`), never on this file.

mod access;
mod agent;
mod artifact;
mod cancel;
mod env;
mod exec;
mod login;
mod logs;
mod notify;
mod profile;
mod repo;
mod retry;
mod run;
mod runs;
mod secret;
mod server;
mod shared;
mod status;
mod team;
mod tests;
mod top;
mod up;
mod validate;
mod verify;
mod wait;

use crate::cli::{ArtifactCommand, CancelArgs, Cli, Command, LogsArgs, RetryArgs, RunRef, StatusArgs};

/// Run the command; print a failure as `error: …`. Returns the exit code.
pub async fn run(cli: Cli) -> i32 {
    let res = match cli.command {
        Command::Up(a) => up::run(*a).await,
        Command::Server(a) => server::run(a).await,
        Command::Agent(a) => agent::run(a).await,
        Command::Repo { command } => repo::run(command).await,
        Command::Secret { command } => secret::run(command).await,
        Command::Team { command } => team::run(command).await,
        Command::Env { command } => env::run(command).await,
        Command::Deploys(a) => env::deploys(a).await,
        Command::Approve(a) => env::decide(a, "approve").await,
        Command::Rollback(a) => env::rollback(a).await,
        Command::Promote(a) => env::promote(a, false).await,
        Command::Pause(a) => env::promote(a, true).await,
        Command::Rings(a) => env::rings(a).await,
        Command::Reject(a) => env::decide(a, "reject").await,
        Command::Queue(a) => team::queue(a).await,
        Command::Priority(a) => team::priority(a).await,
        Command::Notify { command } => notify::run(command).await,
        Command::Tests(a) => tests::run(a).await,
        Command::Token { command } => access::token(command).await,
        Command::AgentToken { command } => access::agent_token(command).await,
        Command::Agents { command, json, conn } => {
            access::agents(command.unwrap_or(crate::cli::AgentsCommand::Ls { json, conn })).await
        }
        Command::Top(a) => top::run(a).await,
        Command::Audit(a) => access::audit(a).await,
        Command::Login(a) => login::login(a).await,
        Command::Logout { context } => login::logout(context),
        Command::Context { command } => login::context(command),
        Command::Run(a) => run::run(a).await,
        Command::Exec(a) => exec::run(*a).await,
        Command::Runs(a) => runs::run(a).await,
        Command::Workflows(a) => run::workflows(a).await,
        Command::Status(a) => match shared::run_ref(&a.run, a.repo.as_deref()) {
            Ok(run) => status::run(StatusArgs { run, ..a }).await,
            Err(e) => Err(e),
        },
        Command::Logs(a) => match shared::run_ref(&a.run, a.repo.as_deref()) {
            Ok(run) => logs::run(LogsArgs { run, ..a }).await,
            Err(e) => Err(e),
        },
        Command::Cancel(a) => match shared::run_ref(&a.run, a.repo.as_deref()) {
            Ok(run) => cancel::run(CancelArgs { run, ..a }).await,
            Err(e) => Err(e),
        },
        Command::Retry(a) => match shared::run_ref(&a.run, a.repo.as_deref()) {
            Ok(run) => retry::run(RetryArgs { run, ..a }).await,
            Err(e) => Err(e),
        },
        Command::Wait(a) => match shared::run_ref(&a.run, a.repo.as_deref()) {
            Ok(run) => wait::run(RunRef { run, ..a }).await,
            Err(e) => Err(e),
        },
        Command::Validate { file: Some(file) } => Ok(validate::run(&file)),
        Command::Validate { file: None } => Ok(validate::checkout()),
        Command::Artifact { command: ArtifactCommand::Get { run, repo, job, name, output, extract, format, conn } } => {
            match shared::run_ref(&run, repo.as_deref()) {
                Ok(run) => {
                    let to = match (output, extract) {
                        (_, Some(dir)) => artifact::To::Extract(dir),
                        (Some(path), None) => artifact::To::Output(path),
                        (None, None) => unreachable!("clap requires -o or --extract"),
                    };
                    artifact::get(&conn, &run, &job, &name, to, format.as_deref()).await
                }
                Err(e) => Err(e),
            }
        }
        Command::Artifact { command: ArtifactCommand::Provenance { run, repo, job, name, output, conn } } => {
            match shared::run_ref(&run, repo.as_deref()) {
                Ok(run) => verify::provenance(&conn, &run, &job, &name, output.as_deref()).await,
                Err(e) => Err(e),
            }
        }
        Command::Keys { command } => verify::keys(command).await,
        Command::Verify(a) => verify::verify(a).await,
        Command::Artifact { command: ArtifactCommand::List { run, repo, job, json, conn } } => {
            match shared::run_ref(&run, repo.as_deref()) {
                Ok(run) => artifact::list(&conn, &run, job.as_deref(), json).await,
                Err(e) => Err(e),
            }
        }
        Command::Completions { shell } => Ok(generated(|out| {
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "kiln", out)
        })),
        Command::Man { dir: None } => Ok(generated(|out| {
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(out).expect("roff")
        })),
        Command::Man { dir: Some(dir) } => man_pages(&dir),
        Command::Bench(a) => kiln_bench::run(a).await,
        Command::Openapi => Ok(generated(|out| {
            out.extend_from_slice(kiln_server::openapi::json().as_bytes());
            out.push(b'\n');
        })),
    };
    exit_code(res)
}

/// `kiln agent` (and the lean `kiln-agent`): run the agent; print a failure
/// as `error: …`. Returns the exit code.
pub async fn run_agent(a: crate::cli::AgentArgs) -> i32 {
    exit_code(agent::run(a).await)
}

fn exit_code(res: kiln_cmd::CmdResult) -> i32 {
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::term::for_stderr(&e.message));
            e.code
        }
    }
}

/// `kiln man --dir DIR`: a page per subcommand.
fn man_pages(dir: &std::path::Path) -> kiln_cmd::CmdResult {
    let failed = |e: std::io::Error| kiln_cmd::Failure {
        code: kiln_api::exit::USAGE,
        message: format!("writing the manual pages into {}: {e}", dir.display()),
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), dir).map_err(failed)?;
    let pages = std::fs::read_dir(dir)
        .map_err(failed)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".1"))
        .count();
    eprintln!(
        "wrote {pages} manual pages into {} (`man -M … kiln-run` or `man -l {}/kiln-run.1`)",
        dir.display(),
        dir.display()
    );
    Ok(kiln_api::exit::OK)
}

/// Write what `write` generates (a completion script, the man page) to
/// standard output; a closed pipe ends quietly.
fn generated(write: impl FnOnce(&mut Vec<u8>)) -> i32 {
    let mut out = Vec::new();
    write(&mut out);
    kiln_cmd::write_stdout(&out);
    kiln_api::exit::OK
}
