//! `kiln bench artifacts`: upload + seal of a 1 GiB artifact through a
//! real agent process, beside `cp` + `sha256sum` (and, on S3, a bare PUT +
//! GET) of the same bytes.

use crate::util::{percentile, repo_with, spawn_agent, wait_terminal_every};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::process::Command;

/// Upload + seal of a 1 GiB artifact through a real agent, beside `cp` +
/// `sha256sum` of the same file. Kiln's publish time is the difference
/// between a job that copies the file into its workspace and publishes it and
/// the same job without `publish` (database times of the attempts), so it
/// covers freezing, hashing, uploading, verifying and sealing.
///
/// With `database_url` (`postgres`: a throwaway durable server) the server's
/// metadata is on PostgreSQL, and what the three runs cost it (CPU,
/// transactions, WAL) is printed too, for docs/capacity.md.
pub async fn run(object_store: String, database_url: Option<&str>) -> Result<i32, Failure> {
    const SIZE: u64 = 1 << 30;
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-artifacts-{}", std::process::id()));
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
    let (_pg, pg_url) = crate::util::postgres_for("artifacts", database_url).await?;
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    config.object_store = object_store.clone();
    config.database_url = pg_url.clone();
    if let Some(levels) = crate::util::storage_levels_from_env()? {
        config.degradation.storage_pct = levels;
    }
    let meter = crate::costs::Meter {
        server_pids: vec![std::process::id()],
        pg_port: _pg.as_ref().map(|p| p.port()),
        pg_url: pg_url.clone(),
    };
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "art".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await?;
    let agent = spawn_agent(&server.url(), &server.agent_token, "uploader", &tmp)?;
    let mut publish = vec![];
    // The server runs in this process (the agent in its own): its CPU time
    // and what it read back from the bucket over the three uploads.
    let (cpu0, read0) = (cpu_ms(), kiln_blob::s3::bytes_read());
    let m0 = meter.read().await;
    for _ in 0..3 {
        let r = c.submit_run("art", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
        // Every 100 ms: polling every 5 ms would be a good part of the
        // server's CPU measured here.
        let run = wait_terminal_every(&c, &r.run_id, std::time::Duration::from_millis(100)).await?;
        if !run.status.is_success() {
            return Err(anyhow::anyhow!("benchmark run failed: {run:?}").into());
        }
        let dur = |j: &kiln_api::Job| {
            let a = j.attempts.last().expect("attempt");
            (a.finished_at_ms.unwrap_or(a.started_at_ms) - a.started_at_ms) as f64
        };
        publish.push(dur(&run.jobs[0]) - dur(&run.jobs[1]));
    }
    let m1 = meter.read().await;
    let gb = 3.0 * SIZE as f64 / 1e9;
    let server_cpu_per_gb = (cpu_ms() - cpu0) / gb;
    let server_read_per_gb = (kiln_blob::s3::bytes_read() - read0) as f64 / gb;
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
    kiln_cmd::outln!("artifact_object_store: {}", if s3_base.is_some() { "s3" } else { "local" });
    kiln_cmd::outln!("artifact_size_bytes: {SIZE}");
    kiln_cmd::outln!("artifact_upload_seal_ms: {kiln_ms:.0}");
    kiln_cmd::outln!("artifact_upload_seal_mb_per_s: {:.0}", SIZE as f64 / 1e6 / (kiln_ms / 1000.0));
    kiln_cmd::outln!("artifact_server_cpu_ms_per_gb: {server_cpu_per_gb:.0}");
    kiln_cmd::outln!("artifact_backend: {}", if pg_url.is_some() { "postgres" } else { "sqlite" });
    // Three runs of two jobs, one of which publishes the artifact.
    kiln_cmd::outln!(
        "artifact_cost: {}",
        crate::costs::window_fields(
            &m0,
            &m1,
            &[("artifact_bytes", 3 * SIZE), ("artifacts", 3), ("runs", 3), ("jobs", 6)]
        )
    );
    if s3_base.is_some() {
        kiln_cmd::outln!("artifact_server_bytes_read_per_gb: {server_read_per_gb:.0}");
    }
    kiln_cmd::outln!("baseline_cp_sha256sum_ms: {base_ms:.0}");
    kiln_cmd::outln!("artifact_ratio_vs_cp_sha256sum: {:.2}", base_ms / kiln_ms);
    if let Some(b) = s3_base {
        kiln_cmd::outln!("baseline_s3_put_then_get_sha256_ms: {b:.0}");
        kiln_cmd::outln!("artifact_ratio_vs_s3_put_get: {:.2}", b / kiln_ms);
    }
    drop(agent);
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}

/// CPU time (user + system, every thread) of this process so far, in
/// milliseconds, from `/proc/self/stat` (in clock ticks of 10 ms: Linux's
/// USER_HZ is 100).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (ticks(11) + ticks(12)) * 10.0
}
