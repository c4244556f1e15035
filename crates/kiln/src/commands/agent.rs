//! `kiln agent`: an agent process claiming jobs from a server.

use super::shared::{check_transport, ctrl_c};
use crate::cli::AgentArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, agent_config, default_labels, usage};

pub(super) async fn run(a: AgentArgs) -> CmdResult {
    check_transport(&a.server, a.insecure)?;
    let mut labels = default_labels();
    for l in &a.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| usage(format!("label `{l}` must be key=value")))?;
        labels.insert(k.trim().into(), v.trim().into());
    }
    let name = a.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "agent".into())
    });
    let mut cfg = agent_config(a.server, a.token, name, labels, a.work_dir, a.max_jobs.max(1));
    cfg.upload_rate_limit = a.upload_rate_limit;
    cfg.log_limit = a.log_limit;
    cfg.log_rate_limit = a.log_rate_limit;
    cfg.log_buffer = a.log_buffer;
    cfg.log_spool_limit = a.log_spool_limit;
    cfg.kill_grace = Some(a.kill_grace);
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
