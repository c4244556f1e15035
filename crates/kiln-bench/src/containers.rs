//! `kiln bench containers`: the container executor's overhead per job.
//!
//! An embedded server with three in-process agents on one machine: one runs
//! steps on the host, two in containers (through `--engine`): `cold`
//! creates each job's container when the job starts (`--warm-containers 0`),
//! `warm` keeps the next one started (the default, `--warm-containers 1`).
//! The same one-step `true` job runs sequentially on each (the image warm in
//! the engine's store), in interleaved rounds so that the host's noise falls
//! on all three alike; the figure is the difference of the attempts'
//! start-to-finish times (claim to completion, database time: checkout,
//! container create + start unless warm, the exec, completion; the
//! container is removed after the completion).

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
    Ok(out)
}

pub async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-containers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let image = a.image.clone();
    let registry = image.split('/').next().unwrap_or_default().to_string();
    repo_with(
        &tmp.join("host-repo"),
        "version: 1\njobs:\n  - name: noop\n    runs-on: {executor: host}\n    steps:\n      - \"true\"\n",
    )?;
    for pool in ["cold", "warm"] {
        repo_with(
            &tmp.join(format!("{pool}-repo")),
            &format!(
                "version: 1\njobs:\n  - name: noop\n    image: {image}\n    runs-on: {{executor: container, pool: {pool}}}\n    steps:\n      - \"true\"\n"
            ),
        )?;
    }
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    // As `kiln server` and `kiln agent` read it (see `bench logs`).
    let storage_levels = crate::util::storage_levels_from_env()?;
    if let Some(levels) = storage_levels {
        config.degradation.storage_pct = levels;
    }
    if registry.starts_with("127.") || registry.starts_with("localhost") {
        config.registries.insecure.push(registry);
    }
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    for (name, dir) in [("host", "host-repo"), ("cold", "cold-repo"), ("warm", "warm-repo")] {
        c.create_repo(&kiln_api::CreateRepo {
            team: None,
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
    for kind in ["host", "cold", "warm"] {
        let mut labels = BTreeMap::from([("executor".to_string(), "container".to_string())]);
        let executor = if kind == "host" {
            labels.insert("executor".into(), "host".into());
            kiln_agent::ExecutorKind::Host
        } else {
            labels.insert("pool".into(), kind.into());
            let mut settings = kiln_agent::ContainerSettings::new(a.engine.clone());
            settings.warm_containers = if kind == "warm" { 1 } else { 0 };
            kiln_agent::ExecutorKind::Container(settings)
        };
        let cfg = kiln_agent::AgentConfig {
            server: server.url(),
            token: server.agent_token.clone(),
            name: format!("bench-{kind}-{}", std::process::id()),
            labels,
            work_dir: tmp.join("agents").join(kind),
            sandbox_dir: None,
            step_user: None,
            step_nice: kiln_agent::DEFAULT_STEP_NICE,
            hide_paths: vec![],
            step_env: Default::default(),
            user_toolchains: false,
            keep_sandboxes: false,
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
            storage_levels,
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
        for repo in ["host", "cold", "warm"] {
            durations(&c, repo, 2).await?;
        }
        // Interleaved rounds: the host's noise falls on all three alike.
        let (mut host, mut cold, mut warm) = (vec![], vec![], vec![]);
        let rounds = a.sequential.div_ceil(5).max(1);
        for r in 0..rounds {
            let n = (a.sequential - r * 5).min(5);
            host.extend(durations(&c, "host", n).await?);
            cold.extend(durations(&c, "cold", n).await?);
            warm.extend(durations(&c, "warm", n).await?);
        }
        for v in [&mut host, &mut cold, &mut warm] {
            v.sort_by(|a, b| a.total_cmp(b));
        }
        anyhow::Ok((host, cold, warm))
    }
    .await;
    let _ = stop.send(true);
    for t in agents {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    let (host, cold, warm) = result?;
    let h50 = percentile(&host, 0.5);
    let (w50, c50) = (percentile(&warm, 0.5), percentile(&cold, 0.5));
    kiln_cmd::outln!("container_job_p50_ms: {w50:.1}");
    kiln_cmd::outln!("container_job_p95_ms: {:.1}", percentile(&warm, 0.95));
    kiln_cmd::outln!("cold_container_job_p50_ms: {c50:.1}");
    kiln_cmd::outln!("cold_container_job_p95_ms: {:.1}", percentile(&cold, 0.95));
    kiln_cmd::outln!("baseline_host_job_p50_ms: {h50:.1}");
    kiln_cmd::outln!("baseline_host_job_p95_ms: {:.1}", percentile(&host, 0.95));
    kiln_cmd::outln!("container_overhead_p50_ms: {:.1}", w50 - h50);
    kiln_cmd::outln!("cold_container_overhead_p50_ms: {:.1}", c50 - h50);
    kiln_cmd::outln!("container_overhead_target_p50_ms: 150");
    Ok(exit::OK)
}
