//! `kiln bench failover`: a real server with the default 30 s lease TTL and
//! real agent processes (this binary's `agent` subcommand). An agent running
//! a job is SIGKILLed (or SIGSTOPped) while a second agent idles; the figure
//! is the time from the signal to the replacement attempt's claim (database
//! time).

use crate::util::{now_ms, percentile, repo_with, spawn_agent, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::process::Command;
use std::time::Duration;

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
        forge: Default::default(),
        name: "hang".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
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
    kiln_cmd::outln!("lease_ttl_ms: {}", ttl.as_millis());
    kiln_cmd::outln!("sigkill_to_reclaim_p50_ms: {:.0}", percentile(&kill_ms, 0.5));
    kiln_cmd::outln!("sigkill_to_reclaim_max_ms: {:.0}", kill_ms.last().copied().unwrap_or(f64::NAN));
    kiln_cmd::outln!("sigstop_to_reclaim_ms: {:.0}", stop_ms.first().copied().unwrap_or(f64::NAN));
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}
