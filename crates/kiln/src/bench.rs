//! `kiln bench`: throughput and trigger-to-start latency against an embedded
//! `kiln up`, each printed beside a bare `sh -c true` baseline measured in the
//! same invocation. Output is `name: value` lines.

use crate::cli::BenchArgs;
use crate::commands::{Failure, start_embedded};
use kiln_api::{Client, SubmitRun, exit};
use std::process::Command as Proc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64
}

pub(crate) fn git(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let st = Proc::new("git").arg("-C").arg(dir).args(args).status()?;
    anyhow::ensure!(st.success(), "git {args:?} failed");
    Ok(())
}

/// A one-job, one-step `true` repository.
/// A one-commit git repository (branch `main`) holding `workflow` as
/// `.kiln/pipeline.yaml`: the repository every benchmark registers.
pub(crate) fn repo_with(dir: &std::path::Path, workflow: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join(".kiln"))?;
    std::fs::write(dir.join(".kiln/pipeline.yaml"), workflow)?;
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["add", "."])?;
    git(dir, &["-c", "user.name=bench", "-c", "user.email=bench@kiln", "commit", "-q", "-m", "bench"])?;
    Ok(())
}

pub(crate) async fn wait_terminal(c: &Client, run: &str) -> anyhow::Result<kiln_api::Run> {
    loop {
        let r = c.get_run(run).await?;
        if matches!(r.status.as_str(), "success" | "failed" | "cancelled") {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn run(a: BenchArgs) -> Result<i32, Failure> {
    let mut code = exit::OK;
    if matches!(a.suite.as_str(), "dispatch" | "all") {
        code = code.max(dispatch(&a).await?);
    }
    if matches!(a.suite.as_str(), "failover" | "all") {
        code = code.max(crate::bench_failover::run().await?);
    }
    if matches!(a.suite.as_str(), "artifacts" | "all") {
        code = code.max(crate::bench_failover::artifacts(a.object_store.clone().unwrap_or_default()).await?);
    }
    if matches!(a.suite.as_str(), "logs" | "all") {
        code = code.max(crate::bench_failover::logs().await?);
    }
    if matches!(a.suite.as_str(), "control-plane" | "all") {
        code = code.max(
            crate::bench_control::run(crate::bench_control::ControlArgs {
                claims_per_s: a.claims_per_s,
                heartbeats_per_s: a.heartbeats_per_s,
                seconds: a.seconds,
                hold: a.hold,
                agents: 32,
                database_url: a.database_url.clone(),
                replicas: a.replicas,
            })
            .await?,
        );
    }
    // Not part of `all`: it needs a container engine and a registry.
    if a.suite == "containers" {
        code = code.max(crate::bench_containers::run(&a).await?);
    }
    Ok(code)
}

async fn dispatch(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = std::env::temp_dir().join(format!("kiln-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(&repo, "version: 1\njobs:\n  - name: noop\n    steps:\n      - \"true\"\n")?;
    let (handle, stop, tasks) =
        start_embedded(&tmp.join("data"), "127.0.0.1:0", a.agents, Duration::from_secs(30), None).await?;
    let c = Client::new(&handle.url(), &handle.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        name: "bench".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
    })
    .await?;
    let head = String::from_utf8(
        Proc::new("git").arg("-C").arg(&repo).args(["rev-parse", "HEAD"]).output().map_err(anyhow::Error::from)?.stdout,
    )
    .map_err(anyhow::Error::from)?
    .trim()
    .to_string();
    let body = SubmitRun { commit_sha: head.clone(), ..Default::default() };

    // Warm up (mirror fetch, agent checkouts).
    let w = c.submit_run("bench", &body, None).await?;
    wait_terminal(&c, &w.run_id).await?;

    // Baseline: the same work as a bare loop of `sh -c true`.
    let n = a.runs as usize;
    let t0 = Instant::now();
    let mut lat = vec![];
    for _ in 0..n {
        let t = Instant::now();
        Proc::new("sh").args(["-c", "true"]).status().map_err(anyhow::Error::from)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let sh_rate = n as f64 / t0.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));

    // Throughput: all runs submitted at once.
    let t0 = Instant::now();
    let mut ids = vec![];
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let c = c.clone();
        let body = body.clone();
        set.spawn(async move { c.submit_run("bench", &body, None).await });
    }
    while let Some(r) = set.join_next().await {
        ids.push(r.map_err(anyhow::Error::from)??.run_id);
    }
    // Poll the run list (one cheap query) rather than every run.
    let failed = loop {
        let runs = c.list_runs("bench", None, Some(n as u32 + 10)).await?.runs;
        let mine: Vec<_> = runs.iter().filter(|r| ids.contains(&r.id)).collect();
        if mine.len() == n && mine.iter().all(|r| matches!(r.status.as_str(), "success" | "failed" | "cancelled")) {
            break mine.iter().filter(|r| r.status != "success").count();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rate = n as f64 / t0.elapsed().as_secs_f64();

    // Trigger-to-start on an idle system.
    let mut starts = vec![];
    for _ in 0..a.sequential {
        let t = now_ms();
        let r = c.submit_run("bench", &body, None).await?;
        let run = wait_terminal(&c, &r.run_id).await?;
        if let Some(att) = run.jobs.first().and_then(|j| j.attempts.first()) {
            starts.push((att.started_at_ms - t).max(0) as f64);
        }
    }
    starts.sort_by(|a, b| a.total_cmp(b));

    println!("noop_jobs_per_s: {rate:.1}");
    println!("baseline_sh_true_per_s: {sh_rate:.1}");
    println!("noop_runs_failed: {failed}");
    println!("trigger_to_start_p50_ms: {:.1}", percentile(&starts, 0.5));
    println!("trigger_to_start_p95_ms: {:.1}", percentile(&starts, 0.95));
    println!("baseline_sh_true_p50_ms: {:.2}", percentile(&lat, 0.5));
    println!("baseline_sh_true_p95_ms: {:.2}", percentile(&lat, 0.95));
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if failed == 0 { exit::OK } else { exit::RUN_FAILED })
}
