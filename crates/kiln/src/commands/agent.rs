//! `kiln agent`: an agent process claiming jobs from a server.

use super::shared::{TokenSource, apply_agent_tuning, check_transport, read_token};
use crate::cli::AgentArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, agent_config, default_labels, usage};
use tokio::signal::unix::{SignalKind, signal as unix_signal};

/// Environment variable holding the agent token (the alternative to `--token-file`).
pub(crate) const TOKEN_ENV: &str = "KILN_AGENT_TOKEN";

/// The agent token from `--token-file` or `KILN_AGENT_TOKEN`; `--token` is
/// refused: an argument is readable by every local user in /proc/PID/cmdline.
pub(crate) fn agent_token(a: &AgentArgs, env: Option<String>) -> Result<String, Failure> {
    let source = TokenSource { what: "agent", env: TOKEN_ENV, file: "agent.token" };
    read_token(&source, a.token.is_some(), a.token_file.as_deref(), env)
}

pub(super) async fn run(a: AgentArgs) -> CmdResult {
    let Some(server) = a.server.clone() else {
        return Err(usage("no server: pass --server URL (e.g. http://127.0.0.1:7070) or set KILN_SERVER"));
    };
    check_transport(&server, a.insecure)?;
    let token = agent_token(&a, std::env::var(TOKEN_ENV).ok())?;
    let name = a.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "agent".into())
    });
    let mut cfg = agent_config(server, token, name, default_labels(), a.work_dir.clone(), 1);
    cfg.sandbox_dir = a.sandbox_dir.clone();
    // Hidden from host steps besides the work dir (issue 39, item 8).
    cfg.hide_paths.extend(a.token_file.iter().cloned());
    for p in &a.hide_path {
        if !p.exists() {
            return Err(usage(format!("--hide-path {}: no such file or directory", p.display())));
        }
        cfg.hide_paths.push(p.clone());
    }
    apply_agent_tuning(&mut cfg, &a.tuning)?;
    cfg.storage_levels = Some(a.storage.levels);
    cfg.memory_levels = Some(a.storage.memory);
    cfg.metrics_listen = a.metrics_listen;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let (drain, drain_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(kiln_agent::run_draining(cfg, drain_rx, rx));
    tokio::pin!(task);
    let mut term = unix_signal(SignalKind::terminate()).map_err(|e| anyhow::anyhow!("SIGTERM handler: {e}"))?;
    let mut usr1 = unix_signal(SignalKind::user_defined1()).map_err(|e| anyhow::anyhow!("SIGUSR1 handler: {e}"))?;
    let joined = |r: Result<anyhow::Result<()>, tokio::task::JoinError>| -> CmdResult {
        r.map_err(|e| anyhow::anyhow!(e))??;
        Ok(exit::OK)
    };
    // SIGTERM drains: no more claims, running jobs finish (up to
    // --drain-timeout, then they are handed back). SIGINT, SIGUSR1
    // (preemption) or a second SIGTERM hand them back now: killed, and
    // completed as infrastructure failures so the server re-dispatches them
    // at once instead of waiting for their leases.
    tokio::select! {
        r = &mut task => return joined(r),
        _ = term.recv() => {
            tracing::info!(timeout = ?a.drain_timeout, "SIGTERM: draining");
            let _ = drain.send(true);
            tokio::select! {
                r = &mut task => return joined(r),
                _ = tokio::time::sleep(a.drain_timeout) => {
                    tracing::warn!("drain timeout passed: handing the running jobs back");
                }
                _ = term.recv() => {}
                _ = usr1.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        _ = usr1.recv() => tracing::warn!("SIGUSR1 (preemption): handing the running jobs back"),
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = stop.send(true);
    joined(task.await)
}

#[cfg(test)]
mod tests {
    use super::agent_token;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn ok(r: Result<String, kiln_cmd::Failure>) -> String {
        r.unwrap_or_else(|e| panic!("{}", e.message))
    }

    fn args(extra: &[&str]) -> crate::cli::AgentArgs {
        let mut argv = vec!["kiln", "agent", "--server", "http://127.0.0.1:1"];
        argv.extend(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Agent(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_token_comes_from_a_file_or_the_environment_never_argv() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.token");
        std::fs::write(&file, "kiln_secret\n").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(ok(agent_token(&args(&["--token-file", f]), None)), "kiln_secret");
        assert_eq!(ok(agent_token(&args(&[]), Some("kiln_env\n".into()))), "kiln_env");
        // The file wins over the environment.
        assert_eq!(ok(agent_token(&args(&["--token-file", f]), Some("other".into()))), "kiln_secret");

        let refused = agent_token(&args(&["--token", "kiln_secret"]), Some("x".into())).err().unwrap();
        assert_eq!(refused.code, kiln_api::exit::USAGE);
        assert!(refused.message.contains("--token-file") && refused.message.contains("KILN_AGENT_TOKEN"));
        assert!(!refused.message.contains("kiln_secret"), "the message does not echo the token");

        let missing = agent_token(&args(&[]), None).err().unwrap();
        assert!(missing.message.contains("--token-file"), "{}", missing.message);
        let absent = agent_token(&args(&["--token-file", "/nonexistent/agent.token"]), None).err().unwrap();
        assert!(absent.message.contains("/nonexistent/agent.token"), "{}", absent.message);
        std::fs::write(&file, "\n").unwrap();
        assert!(agent_token(&args(&["--token-file", f]), None).err().unwrap().message.contains("empty"));
    }
}
