//! `kiln up`'s embedded deployment: a server and N in-process agents on the
//! embedded defaults (SQLite, local disk). The benchmarks measure the same
//! deployment, so it lives here rather than in the binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An agent configuration with the defaults of `kiln agent` (host executor,
/// no rate limits).
pub fn agent_config(
    server: String,
    token: String,
    name: String,
    labels: BTreeMap<String, String>,
    work_dir: PathBuf,
    max_jobs: u32,
) -> kiln_agent::AgentConfig {
    kiln_agent::AgentConfig {
        server,
        token,
        name,
        labels,
        work_dir,
        sandbox_dir: None,
        step_user: None,
        step_nice: kiln_agent::DEFAULT_STEP_NICE,
        max_jobs,
        executor: kiln_agent::ExecutorKind::Host,
        upload_rate_limit: None,
        log_limit: None,
        log_rate_limit: None,
        log_buffer: None,
        log_spool_limit: None,
        kill_grace: None,
        cache_timeout: None,
        prepare_timeout: None,
        finalize_timeout: None,
        op_timeouts: Default::default(),
        cache_local_budget: None,
        services_engine: None,
        storage_levels: None,
        memory_levels: None,
        metrics_listen: None,
        hide_paths: vec![],
        step_env: Default::default(),
        user_toolchains: true,
        keep_sandboxes: false,
    }
}

/// `os` and `arch` of this machine: every agent's labels unless overridden.
pub fn default_labels() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("os".into(), std::env::consts::OS.into());
    m.insert("arch".into(), std::env::consts::ARCH.into());
    m
}

/// Start an embedded server and `agents` local agents. Returns the server
/// handle and the agents' shutdown switch.
pub async fn start_embedded(
    data_dir: &Path,
    listen: &str,
    agents: u32,
    lease_ttl: Duration,
    database_url: Option<String>,
) -> anyhow::Result<(kiln_server::ServerHandle, tokio::sync::watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)> {
    let mut config = kiln_server::ServerConfig::new(data_dir.to_path_buf(), listen.to_string());
    config.lease_ttl = lease_ttl;
    config.database_url = database_url;
    start_embedded_config(config, agents).await
}

/// [`start_embedded`] with a complete server configuration (`kiln up`'s
/// flags); the agents work under `DATA_DIR/agents`.
pub async fn start_embedded_config(
    config: kiln_server::ServerConfig,
    agents: u32,
) -> anyhow::Result<(kiln_server::ServerHandle, tokio::sync::watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)> {
    start_embedded_agents(config, agents, |_| {}).await
}

/// [`start_embedded_config`] with each agent's configuration adjusted by
/// `tune` (`kiln up --labels`, `--max-jobs`, `--executor`, …).
pub async fn start_embedded_agents(
    mut config: kiln_server::ServerConfig,
    agents: u32,
    tune: impl Fn(&mut kiln_agent::AgentConfig),
) -> anyhow::Result<(kiln_server::ServerHandle, tokio::sync::watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)> {
    let data_dir = config.data_dir.clone();
    // Its local agents are `local-1`..`local-N`: surplus ones of an earlier
    // start with more agents are removed (no ghosts after a restart).
    config.embedded_agents = Some(agents);
    let handle = kiln_server::start(config).await?;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = vec![];
    for i in 1..=agents {
        let cfg = agent_config(
            handle.url(),
            handle.agent_token.clone(),
            format!("local-{i}"),
            default_labels(),
            data_dir.join("agents").join(format!("local-{i}")),
            1,
        );
        let mut cfg = cfg;
        // The server's data directory (tokens, keys, database): never seen
        // by a host step, even one running as this process's own user.
        cfg.hide_paths.push(std::path::absolute(&data_dir).unwrap_or_else(|_| data_dir.clone()));
        tune(&mut cfg);
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = kiln_agent::run(cfg, rx).await {
                tracing::error!("agent failed: {e:#}");
            }
        }));
    }
    Ok((handle, stop, tasks))
}
