//! `kiln bench containers`: the container executor's overhead per job.
//!
//! An embedded server with two in-process agents on one machine: one runs
//! steps on the host, one in containers (through `--engine`). The same
//! one-step `true` job runs sequentially on each (the image warm in the
//! engine's store); the figure is the difference of the attempts'
//! start-to-finish times (claim to completion, database time: checkout,
//! container create + start, the exec, container removal, completion).

use crate::args::BenchArgs;
use crate::util::{percentile, repo_with, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::collections::BTreeMap;
use std::time::Duration;

/// Start-to-finish (ms) of the only attempt of each of `n` sequential runs.
async fn durations(c: &Client, repo: &str, n: u32) -> anyhow::Result<Vec<f64>> {
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let mut out = vec![];
    for _ in 0..n {
        let r = c.submit_run(repo, &body, None).await?;
        let run = wait_terminal(c, &r.run_id).await?;
        anyhow::ensure!(run.status.is_success(), "bench run {} {}: {:?}", r.run_id, run.status, run.jobs[0].message);
        let a = &run.jobs[0].attempts[0];
        out.push((a.finished_at_ms.unwrap_or(a.started_at_ms) - a.started_at_ms) as f64);
    }
    out.sort_by(|a, b| a.total_cmp(b));
    Ok(out)
}

pub async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = std::env::temp_dir().join(format!("kiln-bench-containers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let image = a.image.clone();
    let registry = image.split('/').next().unwrap_or_default().to_string();
    repo_with(
        &tmp.join("host-repo"),
        "version: 1\njobs:\n  - name: noop\n    runs-on: {executor: host}\n    steps:\n      - \"true\"\n",
    )?;
    repo_with(
        &tmp.join("ctr-repo"),
        &format!(
            "version: 1\njobs:\n  - name: noop\n    image: {image}\n    runs-on: {{executor: container}}\n    steps:\n      - \"true\"\n"
        ),
    )?;
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    if registry.starts_with("127.") || registry.starts_with("localhost") {
        config.registries.insecure.push(registry);
    }
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    for (name, dir) in [("host", "host-repo"), ("ctr", "ctr-repo")] {
        c.create_repo(&kiln_api::CreateRepo {
            forge: Default::default(),
            name: name.into(),
            clone_url: tmp.join(dir).display().to_string(),
            webhook_secret: None,
            secret_pools: None,
        })
        .await?;
    }
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut agents = vec![];
    for kind in ["host", "container"] {
        let executor = if kind == "host" {
            kiln_agent::ExecutorKind::Host
        } else {
            kiln_agent::ExecutorKind::Container(kiln_agent::ContainerSettings::new(a.engine.clone()))
        };
        let cfg = kiln_agent::AgentConfig {
            server: server.url(),
            token: server.agent_token.clone(),
            name: format!("bench-{kind}-{}", std::process::id()),
            labels: BTreeMap::from([("executor".to_string(), kind.to_string())]),
            work_dir: tmp.join("agents").join(kind),
            sandbox_dir: None,
            step_user: None,
            max_jobs: 1,
            executor,
            upload_rate_limit: None,
            log_limit: None,
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
            log_rate_limit: None,
            log_buffer: None,
            log_spool_limit: None,
        };
        let rx = stop_rx.clone();
        agents.push(tokio::spawn(async move {
            if let Err(e) = kiln_agent::run(cfg, rx).await {
                eprintln!("bench agent failed: {e:#}");
            }
        }));
    }
    let result = async {
        // Warm up: mirrors, the image in the engine's store.
        durations(&c, "host", 2).await?;
        durations(&c, "ctr", 2).await?;
        let host = durations(&c, "host", a.sequential).await?;
        let ctr = durations(&c, "ctr", a.sequential).await?;
        anyhow::Ok((host, ctr))
    }
    .await;
    let _ = stop.send(true);
    for t in agents {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    let (host, ctr) = result?;
    let (h50, c50) = (percentile(&host, 0.5), percentile(&ctr, 0.5));
    kiln_cmd::outln!("container_job_p50_ms: {c50:.1}");
    kiln_cmd::outln!("container_job_p95_ms: {:.1}", percentile(&ctr, 0.95));
    kiln_cmd::outln!("baseline_host_job_p50_ms: {h50:.1}");
    kiln_cmd::outln!("baseline_host_job_p95_ms: {:.1}", percentile(&host, 0.95));
    kiln_cmd::outln!("container_overhead_p50_ms: {:.1}", c50 - h50);
    kiln_cmd::outln!("container_overhead_target_p50_ms: 500");
    Ok(exit::OK)
}
