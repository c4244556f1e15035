//! `kiln agent` through the lean `kiln-agent` binary (issue 47, item 2).
//!
//! One `kiln` binary holds the server, the agent, the web UI and the CLI.
//! An agent touches a part of its code spread over all of it, and the
//! kernel maps the neighbours of every page it faults in from a file the
//! page cache holds (fault-around), so most of an idle agent's resident
//! memory was pages of the `kiln` file (22 of 26 MB). `kiln-agent` is the
//! same agent code, the same flags and the same process setup, linked
//! without the server, store, UI, benchmarks and client commands.
//!
//! `kiln agent …` execs `kiln-agent` when it sits next to the `kiln`
//! executable and is the same build; otherwise the agent runs in the `kiln`
//! process, as before. `exec` keeps the process: its pid (a supervisor or a
//! test signalling it reaches the agent), its argv (`/proc/PID/cmdline`
//! still reads `kiln agent …`, never with a token), its environment, open
//! files and exit status. The handshake needs no other process:
//!
//! - `kiln` execs `kiln-agent` with [`FROM_ENV`] = `BUILD:KILN`, the build
//!   it expects and the `kiln` executable to come back to.
//! - A `kiln-agent` of that build runs the agent. One of another build
//!   (`cargo build --bin kiln` relinks `kiln` alone; an upgrade copied one
//!   binary) execs `KILN` back with [`OTHER_BUILD_ENV`] = its build, and
//!   `kiln` runs the agent itself, saying so in its log.
//! - [`IN_PROCESS_ENV`] (`KILN_AGENT_IN_PROCESS=1`) keeps the agent in the
//!   `kiln` process.
//!
//! `kiln up` and `kiln exec` run their agents in their own process: they
//! hold a server too.

use crate::cli::AgentArgs;
use clap::{Parser, Subcommand};
use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// This build, the same in `kiln` and `kiln-agent`: the version and a hash
/// of the workspace's sources and lock file (`build.rs`).
pub(crate) const BUILD_ID: &str = env!("KILN_BUILD_ID");

/// The lean binary's file name, looked for beside the `kiln` executable.
pub(crate) const LEAN_NAME: &str = "kiln-agent";

/// Set (to anything but `0`), `kiln agent` runs in the `kiln` process.
pub(crate) const IN_PROCESS_ENV: &str = "KILN_AGENT_IN_PROCESS";

/// `kiln` → `kiln-agent`: `BUILD:PATH`, the build `kiln` is and its executable.
pub(crate) const FROM_ENV: &str = "KILN_AGENT_FROM";

/// `kiln-agent` → `kiln`: the other build `kiln-agent` is (it handed the
/// agent back).
pub(crate) const OTHER_BUILD_ENV: &str = "KILN_AGENT_OTHER_BUILD";

/// `kiln agent`, once its flags parsed and before any thread started: exec
/// the lean binary if it is there and wanted. Returns only when the agent
/// runs in this process, with what its log should say about why (`None`:
/// nothing worth a line, e.g. no `kiln-agent` installed).
pub(crate) fn exec_lean_agent() -> Option<String> {
    if let Some(other) = std::env::var_os(OTHER_BUILD_ENV) {
        return Some(format!(
            "{LEAN_NAME} beside this kiln is build {}, not this kiln's {BUILD_ID}: the agent runs in the kiln \
             process (install kiln and {LEAN_NAME} from the same build)",
            other.to_string_lossy()
        ));
    }
    if std::env::var_os(IN_PROCESS_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    let kiln = std::env::current_exe().ok()?;
    let lean = kiln.with_file_name(LEAN_NAME);
    if !lean.is_file() {
        return None;
    }
    let mut from = OsString::from(format!("{BUILD_ID}:"));
    from.push(&kiln);
    let err = exec_as_argv(&lean).env(FROM_ENV, from).exec();
    Some(format!("cannot run {}: {err}; the agent runs in the kiln process", lean.display()))
}

/// A command running `program` with this process's arguments, `argv[0]`
/// included, so that it looks as this process did.
fn exec_as_argv(program: &Path) -> Command {
    let mut args = std::env::args_os();
    let mut cmd = Command::new(program);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    cmd.args(args);
    cmd
}

/// `kiln-agent`'s flags, run directly: `kiln agent`'s.
#[derive(Parser, Debug)]
#[command(
    name = "kiln-agent",
    version = concat!(env!("KILN_LONG_VERSION"), ", build ", env!("KILN_BUILD_ID")),
    about = "The Kiln agent alone: `kiln agent` without the server, store, web UI and client linked in",
    long_about = "The Kiln agent alone: `kiln agent` without the server, store, web UI and client linked in, \
so that an agent's resident memory stays small (docs/performance.md, issue 47).\n\n\
`kiln agent FLAGS` runs it when it is installed beside the `kiln` executable and is the same build \
(`--version` names the build): the process execs it, keeping its pid, arguments, environment and signals. \
Otherwise, or with KILN_AGENT_IN_PROCESS=1, `kiln agent` runs the agent in the kiln process. \
Install both binaries together (`cargo install --path crates/kiln` does).\n\n\
Run directly, `kiln-agent FLAGS` is `kiln agent FLAGS` (and `kiln-agent agent FLAGS` too). The flags, the \
environment (KILN_SERVER, KILN_AGENT_TOKEN, KILN_LOG, ...), the signals (SIGTERM drains; SIGINT, SIGUSR1 or \
a second SIGTERM hand the running jobs back) and the exit codes are `kiln agent`'s."
)]
struct Lean {
    #[command(flatten)]
    agent: AgentArgs,
}

/// `kiln agent`'s command line as `kiln` parsed it (`kiln [--server URL]
/// agent FLAGS`): what `kiln-agent` gets when `kiln` execs it.
#[derive(Parser, Debug)]
#[command(name = "kiln")]
struct AsKiln {
    #[command(subcommand)]
    command: AsKilnCommand,
    // `kiln`'s global flags that `kiln agent` has (`crate::cli::Cli`).
    #[arg(long = "server", id = "server", value_name = "URL", global = true, hide = true)]
    _server: Option<String>,
    #[arg(long = "token-file", id = "token_file", value_name = "FILE", global = true, hide = true)]
    _token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum AsKilnCommand {
    /// Run an agent that claims jobs from a server and executes them.
    Agent(AgentArgs),
}

/// `kiln-agent`'s arguments. Started by a `kiln` of another build, this
/// execs that `kiln` back instead (see the module docs); if that fails, the
/// agent runs here all the same.
pub(crate) fn lean_args() -> AgentArgs {
    let from = std::env::var_os(FROM_ENV);
    if let Some(from) = &from {
        let from = from.to_string_lossy();
        let (build, kiln) = from.split_once(':').unwrap_or((&from, ""));
        if build != BUILD_ID {
            let err = exec_as_argv(Path::new(kiln)).env_remove(FROM_ENV).env(OTHER_BUILD_ENV, BUILD_ID).exec();
            eprintln!(
                "{LEAN_NAME}: this is build {BUILD_ID}, not {build} of {kiln}, and running {kiln} failed ({err}): \
                 the agent runs here"
            );
        }
    }
    if from.is_some() || std::env::args_os().nth(1).is_some_and(|a| a == OsStr::new("agent")) {
        let AsKiln { command: AsKilnCommand::Agent(a), .. } = AsKiln::parse();
        a
    } else {
        Lean::parse().agent
    }
}

#[cfg(test)]
mod tests {
    use super::{AsKiln, AsKilnCommand, Lean};
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_lean_command_lines_are_well_formed() {
        Lean::command().debug_assert();
        AsKiln::command().debug_assert();
    }

    /// `kiln-agent` reads the command line `kiln` execs it with as `kiln`
    /// did, global flags included.
    #[test]
    fn the_lean_binary_parses_what_kiln_agent_parsed() {
        let argv = [
            "kiln",
            "--server",
            "http://a:7070,http://b:7070",
            "agent",
            "--token-file",
            "/t",
            "--max-jobs",
            "3",
            "--labels",
            "os=linux,size=large",
            "--drain-timeout",
            "5s",
            "--log-format",
            "json",
        ];
        let Command::Agent(kiln) = Cli::try_parse_from(argv).unwrap().command else { panic!("not agent") };
        let AsKilnCommand::Agent(lean) = AsKiln::try_parse_from(argv).unwrap().command;
        assert_eq!(format!("{kiln:?}"), format!("{lean:?}"));
        assert_eq!(lean.server.as_deref(), Some("http://a:7070,http://b:7070"));
        // Run directly: `kiln-agent FLAGS` is `kiln agent FLAGS`.
        let mut direct = vec!["kiln-agent"];
        direct.extend(&argv[4..]);
        direct.extend(["--server", "http://a:7070,http://b:7070"]);
        assert_eq!(format!("{:?}", Lean::try_parse_from(direct).unwrap().agent), format!("{lean:?}"));
    }
}
