//! `kiln bench dispatch`: throughput and trigger-to-start latency against an
//! embedded `kiln up`, each printed beside a bare `sh -c true` baseline
//! measured in the same invocation.

use crate::args::BenchArgs;
use crate::util::{now_ms, percentile, repo_with, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::{Failure, start_embedded};
use std::process::Command as Proc;
use std::time::{Duration, Instant};

pub(crate) async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = std::env::temp_dir().join(format!("kiln-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(&repo, "version: 1\njobs:\n  - name: noop\n    steps:\n      - \"true\"\n")?;
    let (handle, stop, tasks) =
        start_embedded(&tmp.join("data"), "127.0.0.1:0", a.agents, Duration::from_secs(30), None).await?;
    let c = Client::new(&handle.url(), &handle.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        forge: Default::default(),
        name: "bench".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
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
        if mine.len() == n && mine.iter().all(|r| r.status.is_terminal()) {
            break mine.iter().filter(|r| !r.status.is_success()).count();
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

    kiln_cmd::outln!("noop_jobs_per_s: {rate:.1}");
    kiln_cmd::outln!("baseline_sh_true_per_s: {sh_rate:.1}");
    kiln_cmd::outln!("noop_runs_failed: {failed}");
    kiln_cmd::outln!("trigger_to_start_p50_ms: {:.1}", percentile(&starts, 0.5));
    kiln_cmd::outln!("trigger_to_start_p95_ms: {:.1}", percentile(&starts, 0.95));
    kiln_cmd::outln!("baseline_sh_true_p50_ms: {:.2}", percentile(&lat, 0.5));
    kiln_cmd::outln!("baseline_sh_true_p95_ms: {:.2}", percentile(&lat, 0.95));
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if failed == 0 { exit::OK } else { exit::RUN_FAILED })
}
