//! `kiln bench rollback` (issue 46): `kiln rollback production` to the
//! deploy job's attempt being claimed — the target p99 ≤ 1 s.
//!
//! A `kiln server` with one real `kiln agent` builds two releases (`build`
//! publishes `app`); their deploy jobs (`runs-on: {virtual: "yes"}`) are
//! claimed and completed over HTTP by a virtual agent that long-polls for
//! work and notes when each assignment reached it. Then `ROLLBACKS`
//! rollbacks, one at a time: each returns production to the release before
//! the current one (so they alternate), and is timed from the request to
//! the claim of its deploy job. Baseline in the same invocation: a retry of
//! a one-job run of the same virtual label (`POST …/retry`, also a frozen
//! re-acceptance with no git read) to its claim.

use crate::util::{percentile, repo_with};
use kiln_api::{ClaimRequest, Client, Completion, RegisterAgent, exit};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROLLBACKS: usize = 100;

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release $KILN_RUN_ID" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: deploy
    needs: build
    runs-on: {virtual: "yes"}
    environment: production
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps: ["true"]
"#;

const NOOP: &str = "version: 1\njobs:\n  - name: deploy\n    runs-on: {virtual: \"yes\"}\n    steps: [\"true\"]\n";

/// When each run's job reached the virtual agent.
type Claimed = Arc<Mutex<HashMap<String, Instant>>>;

pub async fn run() -> anyhow::Result<i32> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-rollback-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // Real processes (an embedded agent publishes no artifacts).
    use crate::util::{Launch, spawn_agent_deployed, spawn_server, token};
    let data = tmp.join("data");
    let (_server, url) = spawn_server(&data, "127.0.0.1:0")?;
    let _agent = spawn_agent_deployed(&url, &data.join("agent.token"), "real", &tmp, 1, &Launch::default())?;
    let c = Client::new(&url, &token(&data, "admin.token")?);
    repo_with(&tmp.join("shop"), WORKFLOW)?;
    std::fs::write(tmp.join("shop/.kiln/noop.yaml"), NOOP)?;
    crate::util::git(&tmp.join("shop"), &["add", "."])?;
    crate::util::git(&tmp.join("shop"), &["-c", "user.name=b", "-c", "user.email=b@k", "commit", "-q", "-m", "noop"])?;
    crate::util::add_repo(&c, "shop", &tmp.join("shop")).await?;
    c.create_environment(&kiln_api::CreateEnvironment { name: "production".into(), ..Default::default() }).await?;

    // Both releases are built before the virtual agent starts (it would
    // take any job, builds too); it then deploys them, and later takes only
    // deploy jobs (a rollback builds nothing).
    let mut releases = Vec::new();
    for _ in 0..2 {
        let body = kiln_api::SubmitRun { commit_sha: "main".into(), ..Default::default() };
        releases.push(c.submit_run("shop", &body, None).await?.run_id);
    }
    for id in &releases {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let r = c.get_run(id).await?;
            if r.jobs.iter().any(|j| j.name == "build" && j.status == "success") {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline && r.status != "failed", "release run {id}'s build: {r:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let claimed: Claimed = Arc::default();
    let agent = virtual_agent(&url, &token(&data, "agent.token")?, claimed.clone()).await?;
    for id in &releases {
        let r = crate::util::wait_terminal(&c, id).await?;
        let why: Vec<String> =
            r.jobs.iter().map(|j| format!("{} {} {}", j.name, j.status, j.message.as_deref().unwrap_or(""))).collect();
        anyhow::ensure!(r.status == "success", "release run {id} ended {}: {}", r.status, why.join("; "));
    }
    let body = kiln_api::SubmitRun {
        commit_sha: "main".into(),
        workflow_path: Some(".kiln/noop.yaml".into()),
        ..Default::default()
    };
    let noop = c.submit_run("shop", &body, None).await?.run_id;
    crate::util::wait_terminal(&c, &noop).await?;

    let (mut rollback, mut retry) = (Vec::with_capacity(ROLLBACKS), Vec::with_capacity(ROLLBACKS));
    for _ in 0..ROLLBACKS {
        let t = Instant::now();
        let r = c.rollback("production", &kiln_api::RollbackRequest::default()).await?;
        rollback.push(until_claimed(&claimed, &r.run_id, t).await?);
        crate::util::wait_terminal(&c, &r.run_id).await?;
        let t = Instant::now();
        let r = c.retry_run(&noop).await?;
        retry.push(until_claimed(&claimed, &r.run_id, t).await?);
        crate::util::wait_terminal(&c, &r.run_id).await?;
    }
    agent.abort();
    let mut shas = std::collections::BTreeSet::new();
    for d in c.deployments("production", 500).await.map(|l| l.deployments).unwrap_or_default() {
        shas.extend(d.artifacts.into_iter().map(|a| a.sha256));
    }
    for v in [&mut rollback, &mut retry] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    kiln_cmd::outln!("rollback_count: {ROLLBACKS}");
    kiln_cmd::outln!("rollback_distinct_sha256_deployed: {}", shas.len());
    kiln_cmd::outln!("rollback_to_claimed_p50_ms: {:.1}", percentile(&rollback, 0.5));
    kiln_cmd::outln!("rollback_to_claimed_p99_ms: {:.1}", percentile(&rollback, 0.99));
    kiln_cmd::outln!("rollback_to_claimed_max_ms: {:.1}", rollback.last().copied().unwrap_or(f64::NAN));
    kiln_cmd::outln!("baseline_retry_to_claimed_p50_ms: {:.1}", percentile(&retry, 0.5));
    kiln_cmd::outln!("baseline_retry_to_claimed_p99_ms: {:.1}", percentile(&retry, 0.99));
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}

/// Milliseconds from `t` until run `run`'s job reached the virtual agent.
async fn until_claimed(claimed: &Claimed, run: &str, t: Instant) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(at) = claimed.lock().ok().and_then(|m| m.get(run).copied()) {
            return Ok(at.saturating_duration_since(t).as_secs_f64() * 1000.0);
        }
        anyhow::ensure!(Instant::now() < deadline, "run {run}'s deploy job was never claimed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One virtual agent (label `virtual: yes`) claiming over HTTP with a long
/// poll, noting each assignment's arrival and completing it at once.
async fn virtual_agent(
    url: &str,
    agent_token: &str,
    claimed: Claimed,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let a = Client::new(url, agent_token);
    let reg = a
        .register_agent(&RegisterAgent {
            name: "virtual-rollback".into(),
            labels: [("virtual".to_string(), "yes".to_string())].into(),
            max_jobs: 1,
            version: None,
            executor: None,
            fresh_start: false,
        })
        .await?;
    let (agent, lease) = (a.with_token(&reg.credential), Client::new(url, agent_token));
    Ok(tokio::spawn(async move {
        loop {
            let req = ClaimRequest {
                session_id: reg.session_id.clone(),
                claim_request_id: uuid::Uuid::new_v4().to_string(),
                wait_ms: 5000,
            };
            let Some(asg) = agent.claim(&reg.agent_id, &req).await?.assignment else { continue };
            if let Ok(mut m) = claimed.lock() {
                m.insert(asg.run_id.clone(), Instant::now());
            }
            lease.with_token(&asg.attempt_token).complete(&asg.job_id, asg.epoch, &Completion::success()).await?;
        }
    }))
}
