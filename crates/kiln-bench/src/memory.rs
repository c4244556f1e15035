//! `kiln bench memory` (issue 47): the resident memory of a real `kiln
//! server` and `kiln agent` — idle, after 200 runs, after a 200 MB log, and
//! after 100 artifacts — read from `/proc/PID/status` (`VmRSS`, and the
//! peak `VmHWM`) once the work settled. Targets: server ≤ 40 MB and agent
//! ≤ 25 MB after the workload, idle agent ≤ 15 MB. Baseline in the same
//! invocation: the resident memory of a `sleep` process, the floor of any
//! process here.
//!
//! `kiln agent` runs the lean `kiln-agent` binary when it sits beside `kiln`
//! (`crates/kiln/src/lean_agent.rs`); `memory_agent_exe` says which binary
//! the agent ran. For comparison, an agent kept in the `kiln` process
//! (`KILN_AGENT_IN_PROCESS=1`) is measured idle first, then stopped.

use crate::util::{Launch, add_repo, repo_with, spawn_agent_deployed, spawn_server, token, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use std::time::Duration;

const RUNS: usize = 200;
const LOG_MB: u64 = 200;
const ARTIFACT_RUNS: usize = 10;
const ARTIFACTS_PER_RUN: usize = 10;

/// A field of `/proc/PID/status` in MB (`NaN` when absent).
fn status_mb(pid: u32, name: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The executable `pid` runs and its size in MB.
fn exe(pid: u32) -> (String, f64) {
    let path = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    let mb = std::fs::metadata(&path).map_or(f64::NAN, |m| m.len() as f64 / (1024.0 * 1024.0));
    (path, mb)
}

/// Waits until an agent named `name` registered.
async fn registered(c: &Client, name: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !c.list_agents().await?.iter().any(|a| a.name == name) {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the agent {name} did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// `VmRSS` and `VmHWM` of `pid` in MB.
fn rss_mb(pid: u32) -> (f64, f64) {
    (status_mb(pid, "VmRSS:"), status_mb(pid, "VmHWM:"))
}

fn report(stage: &str, server: u32, agent: u32) {
    let (s, s_peak) = rss_mb(server);
    let (a, a_peak) = rss_mb(agent);
    kiln_cmd::outln!("memory_server_{stage}_rss_mb: {s:.1}");
    kiln_cmd::outln!("memory_agent_{stage}_rss_mb: {a:.1}");
    kiln_cmd::outln!("memory_server_{stage}_peak_mb: {s_peak:.1}");
    kiln_cmd::outln!("memory_agent_{stage}_peak_mb: {a_peak:.1}");
    // Anonymous memory (heap, stacks) apart from the pages of the binary
    // itself (file-backed, shared by every process of it).
    for (who, pid) in [("server", server), ("agent", agent)] {
        kiln_cmd::outln!("memory_{who}_{stage}_anon_mb: {:.1}", status_mb(pid, "RssAnon:"));
        kiln_cmd::outln!("memory_{who}_{stage}_file_mb: {:.1}", status_mb(pid, "RssFile:"));
        // Each thread holds its stack's touched pages (tokio's blocking
        // threads stay 10 s after their last task).
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
        kiln_cmd::outln!("memory_{who}_{stage}_threads: {threads}");
    }
}

/// Submits `n` runs of `repo`, at most 20 at a time, and waits for each.
async fn runs(c: &Client, repo: &str, n: usize) -> anyhow::Result<()> {
    let mut left = n;
    while left > 0 {
        let batch = left.min(20);
        let mut ids = Vec::with_capacity(batch);
        for _ in 0..batch {
            ids.push(
                c.submit_run(repo, &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?.run_id,
            );
        }
        for id in ids {
            let run = wait_terminal(c, &id).await?;
            anyhow::ensure!(run.status.is_success(), "benchmark run of {repo} failed: {run:?}");
        }
        left -= batch;
    }
    Ok(())
}

/// Lets the processes settle (freed memory returned, log windows flushed).
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

pub async fn run() -> anyhow::Result<i32> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let data = tmp.join("data");
    let (server, url) = spawn_server(&data, "127.0.0.1:0")?;
    let c = Client::new(&url, &token(&data, "admin.token")?);

    // For comparison: the agent in the `kiln` process, idle.
    let in_process = Launch { env: vec![("KILN_AGENT_IN_PROCESS".into(), "1".into())], ..Launch::default() };
    let agent = spawn_agent_deployed(&url, &data.join("agent.token"), "mem-in-process", &tmp, 4, &in_process)?;
    registered(&c, "mem-in-process").await?;
    settle().await;
    let pid = agent.0.id();
    let (path, mb) = exe(pid);
    kiln_cmd::outln!("memory_agent_in_process_exe: {path}");
    kiln_cmd::outln!("memory_agent_in_process_exe_mb: {mb:.1}");
    kiln_cmd::outln!("memory_agent_in_process_idle_rss_mb: {:.1}", rss_mb(pid).0);
    kiln_cmd::outln!("memory_agent_in_process_idle_anon_mb: {:.1}", status_mb(pid, "RssAnon:"));
    kiln_cmd::outln!("memory_agent_in_process_idle_file_mb: {:.1}", status_mb(pid, "RssFile:"));
    drop(agent);

    let agent = spawn_agent_deployed(&url, &data.join("agent.token"), "mem", &tmp, 4, &Launch::default())?;
    let (spid, apid) = (server.0.id(), agent.0.id());

    // Baseline: the floor of any process on this machine.
    let mut sleep = std::process::Command::new("sleep").arg("30").spawn()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    kiln_cmd::outln!("memory_baseline_sleep_rss_mb: {:.1}", rss_mb(sleep.id()).0);
    let _ = sleep.kill();
    let _ = sleep.wait();

    // Idle: registered, nothing run yet.
    registered(&c, "mem").await?;
    settle().await;
    for (who, pid) in [("server", spid), ("agent", apid)] {
        let (path, mb) = exe(pid);
        kiln_cmd::outln!("memory_{who}_exe: {path}");
        kiln_cmd::outln!("memory_{who}_exe_mb: {mb:.1}");
    }
    report("idle", spid, apid);

    eprintln!("bench memory: {RUNS} runs ...");
    repo_with(&tmp.join("noop"), "version: 1\njobs:\n  - name: noop\n    steps: [\"true\"]\n")?;
    add_repo(&c, "noop", &tmp.join("noop")).await?;
    runs(&c, "noop", RUNS).await?;
    settle().await;
    report("after_runs", spid, apid);

    eprintln!("bench memory: a {LOG_MB} MB log ...");
    let lines = LOG_MB * 1_000_000 / 100;
    repo_with(
        &tmp.join("log"),
        &format!(
            "version: 1\njobs:\n  - name: loud\n    steps:\n      - yes 'kiln bench memory - a line of log output, one hundred bytes long with its newline at the end, okay.' | head -n {lines}\n"
        ),
    )?;
    add_repo(&c, "log", &tmp.join("log")).await?;
    runs(&c, "log", 1).await?;
    settle().await;
    report("after_log", spid, apid);

    eprintln!("bench memory: {} artifacts ...", ARTIFACT_RUNS * ARTIFACTS_PER_RUN);
    let mut wf =
        String::from("version: 1\njobs:\n  - name: publish\n    steps:\n      - mkdir -p out && for i in $(seq 1 ");
    wf.push_str(&format!(
        "{ARTIFACTS_PER_RUN}); do head -c 1000000 /dev/urandom > out/a$i; done\n    artifacts:\n      publish:\n"
    ));
    for i in 1..=ARTIFACTS_PER_RUN {
        wf.push_str(&format!("        - {{name: a{i}, path: out/a{i}}}\n"));
    }
    repo_with(&tmp.join("art"), &wf)?;
    add_repo(&c, "art", &tmp.join("art")).await?;
    runs(&c, "art", ARTIFACT_RUNS).await?;
    settle().await;
    report("after_artifacts", spid, apid);

    drop(agent);
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}
