//! `kiln bench failover` and `kiln bench artifacts`.
//!
//! failover: a real server with the default 30 s lease TTL and real agent
//! processes (this binary's `agent` subcommand). An agent running a job is
//! SIGKILLed (or SIGSTOPped) while a second agent idles; the figure is the
//! time from the signal to the replacement attempt's claim (database time).

use crate::bench::{now_ms, percentile, repo_with, wait_terminal};
use crate::commands::Failure;
use kiln_api::{Client, SubmitRun, exit};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.id().to_string()]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_agent(server: &str, token: &str, name: &str, dir: &Path) -> anyhow::Result<Proc> {
    spawn_agent_with(server, token, name, dir, &[])
}

fn spawn_agent_with(server: &str, token: &str, name: &str, dir: &Path, extra: &[&str]) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["agent", "--server", server, "--token", token, "--name", name, "--work-dir"])
        .arg(dir.join(name))
        .args(extra)
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Proc(child))
}

async fn wait_epoch(c: &Client, run: &str, epoch: i64) -> anyhow::Result<kiln_api::Run> {
    loop {
        let r = c.get_run(run).await?;
        if r.jobs[0].attempts.iter().any(|a| a.epoch == epoch) {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn run() -> Result<i32, Failure> {
    let tmp = std::env::temp_dir().join(format!("kiln-bench-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(
        &repo,
        "version: 1\njobs:\n  - name: hang\n    steps:\n      - if [ \"$KILN_EPOCH\" = 1 ]; then sleep 600; fi\n",
    )?;
    let config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    let ttl = config.lease_ttl;
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        name: "hang".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
    })
    .await?;
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let mut kill_ms = vec![];
    let mut stop_ms = vec![];
    for (i, signal) in ["KILL", "KILL", "KILL", "STOP"].iter().enumerate() {
        let victim = spawn_agent(&server.url(), &server.agent_token, &format!("victim-{i}"), &tmp)?;
        let r = c.submit_run("hang", &body, None).await?;
        wait_epoch(&c, &r.run_id, 1).await?;
        let rescuer = spawn_agent(&server.url(), &server.agent_token, &format!("rescuer-{i}"), &tmp)?;
        // Let the rescuer register and start long-polling.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t0 = now_ms();
        Command::new("kill")
            .args([&format!("-{signal}"), &victim.0.id().to_string()])
            .status()
            .map_err(anyhow::Error::from)?;
        let run = wait_epoch(&c, &r.run_id, 2).await?;
        let started = run.jobs[0].attempts.iter().find(|a| a.epoch == 2).expect("epoch 2").started_at_ms;
        let dt = (started - t0) as f64;
        if *signal == "KILL" {
            kill_ms.push(dt)
        } else {
            stop_ms.push(dt)
        }
        wait_terminal(&c, &r.run_id).await?;
        drop(rescuer);
        drop(victim);
    }
    kill_ms.sort_by(|a, b| a.total_cmp(b));
    println!("lease_ttl_ms: {}", ttl.as_millis());
    println!("sigkill_to_reclaim_p50_ms: {:.0}", percentile(&kill_ms, 0.5));
    println!("sigkill_to_reclaim_max_ms: {:.0}", kill_ms.last().copied().unwrap_or(f64::NAN));
    println!("sigstop_to_reclaim_ms: {:.0}", stop_ms.first().copied().unwrap_or(f64::NAN));
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}

/// Upload + seal of a 1 GiB artifact through a real agent, beside `cp` +
/// `sha256sum` of the same file. Kiln's publish time is the difference
/// between a job that copies the file into its workspace and publishes it and
/// the same job without `publish` (database times of the attempts), so it
/// covers freezing, hashing, uploading, verifying and sealing.
pub async fn artifacts(object_store: String) -> Result<i32, Failure> {
    const SIZE: u64 = 1 << 30;
    let tmp = std::env::temp_dir().join(format!("kiln-bench-artifacts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(anyhow::Error::from)?;
    let big = tmp.join("big.bin");
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c {SIZE} /dev/urandom > {}", big.display()))
        .status()
        .map_err(anyhow::Error::from)?;
    if !st.success() {
        return Err(anyhow::anyhow!("cannot create the 1 GiB test file").into());
    }
    // Baseline: cp + sha256sum of the same file, same disk.
    let mut base = vec![];
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!("cp {b} {b}.copy && sha256sum {b}.copy >/dev/null && rm {b}.copy", b = big.display()))
            .status()
            .map_err(anyhow::Error::from)?;
        if !st.success() {
            return Err(anyhow::anyhow!("baseline failed").into());
        }
        base.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    base.sort_by(|a, b| a.total_cmp(b));
    let repo = tmp.join("repo");
    let copy = format!("      - mkdir -p target && cp {} target/app.bin\n", big.display());
    repo_with(
        &repo,
        &format!(
            "version: 1\njobs:\n  - name: publish\n    needs: []\n    steps:\n{copy}    artifacts:\n      publish:\n        - {{name: app, path: target/app.bin}}\n  - name: plain\n    needs: [publish]\n    steps:\n{copy}"
        ),
    )?;
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    config.object_store = object_store.clone();
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        name: "art".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
    })
    .await?;
    let agent = spawn_agent(&server.url(), &server.agent_token, "uploader", &tmp)?;
    let mut publish = vec![];
    for _ in 0..3 {
        let r = c.submit_run("art", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
        let run = wait_terminal(&c, &r.run_id).await?;
        if run.status != "success" {
            return Err(anyhow::anyhow!("benchmark run failed: {run:?}").into());
        }
        let dur = |j: &kiln_api::Job| {
            let a = j.attempts.last().expect("attempt");
            (a.finished_at_ms.unwrap_or(a.started_at_ms) - a.started_at_ms) as f64
        };
        publish.push(dur(&run.jobs[0]) - dur(&run.jobs[1]));
    }
    publish.sort_by(|a, b| a.total_cmp(b));
    let kiln_ms = percentile(&publish, 0.5).max(1.0);
    let base_ms = percentile(&base, 0.5);
    // S3 baseline: the same bytes PUT in one request and read back with a
    // sha256 (what the store itself costs, without Kiln).
    let mut s3_base = None;
    if let Ok(kiln_blob::BlobStore::S3(s3)) = kiln_blob::BlobStore::open_url(&object_store, &tmp) {
        let bytes = std::fs::read(&big).map_err(anyhow::Error::from)?;
        let key = format!("bench-baseline/{}", uuid::Uuid::new_v4());
        let t = std::time::Instant::now();
        s3.put_object(&key, &bytes).await.map_err(anyhow::Error::from)?;
        s3.hash(&key).await.map_err(anyhow::Error::from)?;
        s3_base = Some(t.elapsed().as_secs_f64() * 1000.0);
        let _ = s3.delete(&key).await;
    }
    println!("artifact_object_store: {}", if s3_base.is_some() { "s3" } else { "local" });
    println!("artifact_size_bytes: {SIZE}");
    println!("artifact_upload_seal_ms: {kiln_ms:.0}");
    println!("artifact_upload_seal_mb_per_s: {:.0}", SIZE as f64 / 1e6 / (kiln_ms / 1000.0));
    println!("baseline_cp_sha256sum_ms: {base_ms:.0}");
    println!("artifact_ratio_vs_cp_sha256sum: {:.2}", base_ms / kiln_ms);
    if let Some(b) = s3_base {
        println!("baseline_s3_put_then_get_sha256_ms: {b:.0}");
        println!("artifact_ratio_vs_s3_put_get: {:.2}", b / kiln_ms);
    }
    drop(agent);
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}

/// Log ingestion: one job writes 200 MB to stdout; every chunk is committed
/// (durable in the store) before the agent gets its acknowledgement. The
/// figure is 200 MB over the attempt's duration (database times), beside the
/// same bytes written to a file and fsynced.
pub async fn logs() -> Result<i32, Failure> {
    const SIZE: u64 = 200_000_000;
    let tmp = std::env::temp_dir().join(format!("kiln-bench-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(anyhow::Error::from)?;
    let t = std::time::Instant::now();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c {SIZE} /dev/zero | tr '\\0' x > {f} && sync {f}", f = tmp.join("out").display()))
        .status()
        .map_err(anyhow::Error::from)?;
    if !st.success() {
        return Err(anyhow::anyhow!("baseline failed").into());
    }
    let base_s = t.elapsed().as_secs_f64();
    let repo = tmp.join("repo");
    repo_with(
        &repo,
        &format!("version: 1\njobs:\n  - name: loud\n    steps:\n      - head -c {SIZE} /dev/zero | tr '\\0' x\n"),
    )?;
    let config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        name: "logs".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
    })
    .await?;
    let limit = (SIZE * 2).to_string();
    let agent = spawn_agent_with(&server.url(), &server.agent_token, "talker", &tmp, &["--log-limit", &limit])?;
    let r = c.submit_run("logs", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
    let run = wait_terminal(&c, &r.run_id).await?;
    let a = run.jobs[0].attempts.last().expect("attempt");
    let secs = (a.finished_at_ms.unwrap_or(a.started_at_ms) - a.started_at_ms) as f64 / 1000.0;
    println!("log_bytes: {SIZE}");
    println!("log_ingest_mb_per_s: {:.0}", SIZE as f64 / 1e6 / secs.max(0.001));
    println!("baseline_file_write_fsync_mb_per_s: {:.0}", SIZE as f64 / 1e6 / base_s);
    let latency_ok = write_to_reader_latency(&c, &tmp).await?;
    drop(agent);
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if run.status == "success" && latency_ok { exit::OK } else { exit::RUN_FAILED })
}

/// Write-to-reader latency: a step prints its clock (ns) every 50 ms; a
/// reader follows the job's SSE stream (the endpoint the web UI's log viewer
/// uses) and, per line, subtracts the printed time from its arrival time.
/// Same machine, same clock.
async fn write_to_reader_latency(c: &Client, tmp: &Path) -> anyhow::Result<bool> {
    use base64::Engine;
    use futures::StreamExt;
    const LINES: usize = 100;
    let repo = tmp.join("ticker");
    repo_with(
        &repo,
        &format!(
            "version: 1\njobs:\n  - name: ticker\n    steps:\n      - for i in $(seq 1 {LINES}); do date +%s%N; sleep 0.05; done\n"
        ),
    )?;
    c.create_repo(&kiln_api::CreateRepo {
        name: "ticker".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
    })
    .await?;
    let r = c.submit_run("ticker", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
    let job = c.get_run(&r.run_id).await?.jobs[0].id.clone();
    let events = c.log_events(&job, None).await?;
    tokio::pin!(events);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut partial = String::new();
    let mut lat_ms = Vec::new();
    while let Some(Ok(ev)) = tokio::time::timeout(Duration::from_secs(60), events.next()).await? {
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i128;
        match ev.event.as_str() {
            "chunk" => {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data)?;
                if le.stream != "stdout" {
                    continue;
                }
                partial.push_str(&String::from_utf8_lossy(&b64.decode(le.data)?));
                while let Some(i) = partial.find('\n') {
                    if let Ok(ts) = partial[..i].trim().parse::<i128>() {
                        lat_ms.push((now_ns - ts) as f64 / 1e6);
                    }
                    partial.drain(..=i);
                }
            }
            "end" => break,
            _ => {}
        }
    }
    lat_ms.sort_by(f64::total_cmp);
    // Baseline: the same loop read straight from a pipe.
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("for i in $(seq 1 {LINES}); do date +%s%N; sleep 0.05; done"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().expect("stdout")));
    let mut base_ms = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i128;
        if let Ok(ts) = line.trim().parse::<i128>() {
            base_ms.push((now_ns - ts) as f64 / 1e6);
        }
    }
    child.wait().await?;
    base_ms.sort_by(f64::total_cmp);
    println!("log_latency_lines: {}", lat_ms.len());
    println!("log_write_to_reader_p50_ms: {:.1}", percentile(&lat_ms, 0.5));
    println!("log_write_to_reader_p95_ms: {:.1}", percentile(&lat_ms, 0.95));
    println!("log_write_to_reader_max_ms: {:.1}", lat_ms.last().copied().unwrap_or(f64::NAN));
    println!("baseline_pipe_p95_ms: {:.2}", percentile(&base_ms, 0.95));
    Ok(lat_ms.len() == LINES)
}
