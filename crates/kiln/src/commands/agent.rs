//! `kiln agent`: an agent process claiming jobs from a server.

use super::shared::{TokenSource, check_transport, ctrl_c, read_token};
use crate::cli::AgentArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, agent_config, default_labels, usage};

/// Environment variable holding the agent token (the alternative to `--token-file`).
pub(crate) const TOKEN_ENV: &str = "KILN_AGENT_TOKEN";

/// The agent token from `--token-file` or `KILN_AGENT_TOKEN`; `--token` is
/// refused: an argument is readable by every local user in /proc/PID/cmdline.
pub(crate) fn agent_token(a: &AgentArgs, env: Option<String>) -> Result<String, Failure> {
    let source = TokenSource { what: "agent", env: TOKEN_ENV, file: "agent.token" };
    read_token(&source, a.token.is_some(), a.token_file.as_deref(), env)
}

pub(super) async fn run(a: AgentArgs) -> CmdResult {
    check_transport(&a.server, a.insecure)?;
    let token = agent_token(&a, std::env::var(TOKEN_ENV).ok())?;
    let mut labels = default_labels();
    for l in &a.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| usage(format!("label `{l}` must be key=value")))?;
        labels.insert(k.trim().into(), v.trim().into());
    }
    let name = a.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "agent".into())
    });
    let mut cfg = agent_config(a.server, token, name, labels, a.work_dir, a.max_jobs.max(1));
    cfg.sandbox_dir = a.sandbox_dir.clone();
    cfg.step_user = a.step_user.clone();
    cfg.upload_rate_limit = a.upload_rate_limit;
    cfg.log_limit = a.log_limit;
    cfg.log_rate_limit = a.log_rate_limit;
    cfg.log_buffer = a.log_buffer;
    cfg.log_spool_limit = a.log_spool_limit;
    cfg.kill_grace = Some(a.kill_grace);
    cfg.cache_timeout = Some(a.cache_timeout);
    cfg.cache_local_budget = a.cache_local_budget;
    if a.executor == "container" {
        let mut settings = kiln_agent::ContainerSettings::new(a.engine.clone());
        settings.default_image = a.default_image.clone();
        settings.network = a.container_network.parse().map_err(usage)?;
        cfg.executor = kiln_agent::ExecutorKind::Container(settings);
    }
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(kiln_agent::run(cfg, rx));
    tokio::pin!(task);
    tokio::select! {
        r = &mut task => { r.map_err(|e| anyhow::anyhow!(e))??; }
        _ = ctrl_c() => {
            let _ = stop.send(true);
            task.await.map_err(|e| anyhow::anyhow!(e))??;
        }
    }
    Ok(exit::OK)
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
