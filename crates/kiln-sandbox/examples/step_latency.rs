//! Measures the host executor's per-step overhead: `cargo run --release -p
//! kiln-sandbox --example step_latency` prints `name: value` lines beside a
//! bare `sh -c true` spawn.

use kiln_sandbox::{Executor, HostConfig, HostExecutor, StepEvent, StepRequest};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let exec = HostExecutor::new(HostConfig::new(ws.clone(), dir.path().to_path_buf(), dir.path().join("pgids")));
    exec.prepare().await.unwrap();
    let req = StepRequest { name: "t".into(), command: "true".into(), ..Default::default() };
    let n = 100;
    let mut lat = vec![];
    for _ in 0..n {
        let t = Instant::now();
        let mut h = exec.exec(&req).await.unwrap();
        while let Some(ev) = h.next().await {
            if matches!(ev, StepEvent::Exited(_)) {
                break;
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let mut base = vec![];
    for _ in 0..n {
        let t = Instant::now();
        tokio::process::Command::new("/bin/sh").args(["-c", "true"]).status().await.unwrap();
        base.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    base.sort_by(|a, b| a.total_cmp(b));
    let mut ns = vec![];
    for _ in 0..n {
        let t = Instant::now();
        tokio::process::Command::new("/usr/bin/unshare")
            .args(["--pid", "--kill-child=SIGKILL", "--", "/bin/sh", "-c", "true"])
            .status()
            .await
            .unwrap();
        ns.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ns.sort_by(|a, b| a.total_cmp(b));
    println!("baseline_unshare_sh_true_p50_ms: {:.2}", ns[n / 2]);
    println!("host_step_true_p50_ms: {:.2}", lat[n / 2]);
    println!("host_step_true_p95_ms: {:.2}", lat[n * 95 / 100]);
    println!("baseline_sh_true_p50_ms: {:.2}", base[n / 2]);
}
