//! `kiln bench webhooks`: webhook ingress against an embedded `kiln up`
//! (issue 14). 1,000 signed GitHub push deliveries in 10 s, of which 100
//! repeat an earlier delivery id and 50 carry a forged signature: exactly
//! 850 runs must result, none from a forged one. Printed: acknowledgement
//! latency under that load, and webhook-to-job-start on an idle system,
//! each beside the same figure for the API (what `kiln run` calls).

use crate::args::BenchArgs;
use crate::util::{now_ms, percentile, repo_with, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::{Failure, start_embedded};
use kiln_forge::Forge;
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, Instant};

const SECRET: &str = "bench-webhook-secret-0123456789";
const TOTAL: usize = 1000;
const REPEATS: usize = 100;
const FORGED: usize = 50;
const SPREAD: Duration = Duration::from_secs(10);

fn push(git_ref: &str, sha: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "ref": git_ref,
        "before": "0000000000000000000000000000000000000000",
        "after": sha,
        "created": true,
        "deleted": false,
        "forced": false,
        "commits": [],
        "repository": { "id": 1, "full_name": "bench/bench", "name": "bench" },
        "pusher": { "name": "bench", "email": "bench@kiln" },
        "sender": { "login": "bench", "id": 1 },
    }))
    .expect("json")
}

struct Delivery {
    id: String,
    git_ref: String,
    body: Vec<u8>,
    forged: bool,
}

async fn send(http: &reqwest::Client, url: &str, d: &Delivery) -> anyhow::Result<(u16, f64)> {
    let secret: &[u8] = if d.forged { b"not-the-secret-at-all" } else { SECRET.as_bytes() };
    let (name, value) = kiln_forge::sign(Forge::Github, secret, &d.body);
    let t = Instant::now();
    let res = http
        .post(url)
        .header("X-GitHub-Event", "push")
        .header("X-GitHub-Delivery", &d.id)
        .header(name, value)
        .body(d.body.clone())
        .send()
        .await?;
    let code = res.status().as_u16();
    let _ = res.bytes().await?;
    Ok((code, t.elapsed().as_secs_f64() * 1000.0))
}

pub(crate) async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-webhooks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(
        &repo,
        "version: 1\non:\n  push: {}\n  manual: {}\njobs:\n  - name: noop\n    steps:\n      - \"true\"\n",
    )?;
    let (handle, stop, tasks) =
        start_embedded(&tmp.join("data"), "127.0.0.1:0", a.agents, Duration::from_secs(30), None).await?;
    let c = Client::new(&handle.url(), &handle.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        // Deliveries are bound to the repository their payload names.
        forge: kiln_api::ForgeSettings { forge_repo: Some("bench/bench".into()), ..Default::default() },
        name: "bench".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: Some(SECRET.into()),
        secret_pools: None,
    })
    .await?;
    let head = c.submit_run("bench", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
    let warm = wait_terminal(&c, &head.run_id).await?;
    let sha = warm.commit_sha.clone();
    // Each push names a branch of its own, which the remote must hold (a
    // push's commit is checked against the pushed ref).
    let refs: String = (0..TOTAL).map(|i| format!("create refs/heads/b{i} {sha}\n")).collect();
    let mut update = std::process::Command::new("git")
        .args(["update-ref", "--stdin"])
        .current_dir(&repo)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("git update-ref: {e}"))?;
    std::io::Write::write_all(&mut update.stdin.take().expect("stdin"), refs.as_bytes())
        .map_err(|e| anyhow::anyhow!("git update-ref: {e}"))?;
    if !update.wait().map_err(|e| anyhow::anyhow!("git update-ref: {e}"))?.success() {
        return Err(anyhow::anyhow!("git update-ref failed").into());
    }
    let url = format!("{}/v1/repos/bench/webhooks/github", handle.url());
    let http = reqwest::Client::new();

    // The mix: unique pushes (one branch each), repeats of earlier ids
    // with the same body, and forged signatures on branches of their own.
    let unique = TOTAL - REPEATS - FORGED;
    let mut plan: Vec<Delivery> = (0..unique)
        .map(|i| {
            let git_ref = format!("refs/heads/b{i}");
            Delivery { id: format!("u-{i}"), body: push(&git_ref, &sha), git_ref, forged: false }
        })
        .collect();
    for j in 0..REPEATS {
        let src = &plan[j * 7 % unique];
        let d = Delivery { id: src.id.clone(), git_ref: src.git_ref.clone(), body: src.body.clone(), forged: false };
        plan.insert((j * 7 % unique) + 1 + j, d);
    }
    for k in 0..FORGED {
        let git_ref = format!("refs/heads/forged{k}");
        plan.insert(k * 19 + 3, Delivery { id: format!("f-{k}"), body: push(&git_ref, &sha), git_ref, forged: true });
    }

    // 1,000 deliveries spread over 10 s.
    let gap = SPREAD / TOTAL as u32;
    let t0 = Instant::now();
    let started = now_ms();
    let mut set = tokio::task::JoinSet::new();
    for (i, d) in plan.into_iter().enumerate() {
        let due = t0 + gap * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let (http, url) = (http.clone(), url.clone());
        set.spawn(async move {
            let r = send(&http, &url, &d).await;
            (d.forged, r)
        });
    }
    let mut acks = Vec::new();
    let (mut accepted, mut duplicate, mut refused, mut other) = (0, 0, 0, 0);
    while let Some(j) = set.join_next().await {
        let (forged, r) = j.map_err(anyhow::Error::from)?;
        let (code, ms) = r?;
        acks.push(ms);
        match (forged, code) {
            (false, 202) => accepted += 1,
            (false, 200) => duplicate += 1,
            (true, 401) => refused += 1,
            _ => other += 1,
        }
    }
    let send_secs = t0.elapsed().as_secs_f64();
    acks.sort_by(|a, b| a.total_cmp(b));

    // Every accepted delivery planned and run. The API lists 500 runs at
    // most: count them in the database itself (read-only, beside the server).
    let store = kiln_store::SqliteStore::open(&tmp.join("data").join("kiln.db")).await.map_err(anyhow::Error::from)?;
    let repo_id = c.get_repo("bench").await?.id;
    let deadline = Instant::now() + Duration::from_secs(600);
    let runs = loop {
        let runs = kiln_store::RunStore::list_runs(&store, &repo_id, None, 5000).await.map_err(anyhow::Error::from)?;
        let pushes: Vec<_> = runs.into_iter().filter(|r| r.event == "push").collect();
        if (pushes.len() >= unique && pushes.iter().all(|r| r.status.is_terminal())) || Instant::now() > deadline {
            break pushes;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let all_done_s = (now_ms() - started) as f64 / 1000.0;
    let refs: HashSet<String> = runs.iter().filter_map(|r| r.git_ref.clone()).collect();
    let from_forged = refs.iter().filter(|r| r.starts_with("refs/heads/forged")).count();
    let failed = runs.iter().filter(|r| r.status.as_str() != "success").count();

    // Idle latency: webhook → the job's attempt started, vs the API.
    let mut hook_starts = vec![];
    let mut api_starts = vec![];
    for i in 0..a.sequential {
        let git_ref = format!("refs/heads/idle{i}");
        let d =
            Delivery { id: format!("idle-{i}"), body: push(&git_ref, &sha), git_ref: git_ref.clone(), forged: false };
        let t = now_ms();
        let (code, _) = send(&http, &url, &d).await?;
        if code != 202 {
            return Err(anyhow::anyhow!("idle delivery answered {code}").into());
        }
        let run_id = loop {
            let ack = c.deliveries("bench", 1).await?;
            if let Some(id) = ack.first().and_then(|x| x.runs.first()) {
                break id.clone();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let run = wait_terminal(&c, &run_id).await?;
        if let Some(att) = run.jobs.first().and_then(|j| j.attempts.first()) {
            hook_starts.push((att.started_at_ms - t).max(0) as f64);
        }
        let t = now_ms();
        let r = c.submit_run("bench", &SubmitRun { commit_sha: sha.clone(), ..Default::default() }, None).await?;
        let run = wait_terminal(&c, &r.run_id).await?;
        if let Some(att) = run.jobs.first().and_then(|j| j.attempts.first()) {
            api_starts.push((att.started_at_ms - t).max(0) as f64);
        }
    }
    hook_starts.sort_by(|a, b| a.total_cmp(b));
    api_starts.sort_by(|a, b| a.total_cmp(b));

    // The API under the same load: 850 submissions over 8.5 s.
    let t1 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..unique {
        tokio::time::sleep_until((t1 + gap * i as u32).into()).await;
        let c = c.clone();
        let body = SubmitRun { commit_sha: sha.clone(), ..Default::default() };
        set.spawn(async move {
            let t = Instant::now();
            let r = c.submit_run("bench", &body, None).await;
            (r.is_ok(), t.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut api_acks = vec![];
    while let Some(j) = set.join_next().await {
        let (ok, ms) = j.map_err(anyhow::Error::from)?;
        if ok {
            api_acks.push(ms);
        }
    }
    api_acks.sort_by(|a, b| a.total_cmp(b));

    kiln_cmd::outln!("webhook_deliveries: {TOTAL}");
    kiln_cmd::outln!("webhook_send_seconds: {send_secs:.1}");
    kiln_cmd::outln!("webhook_accepted: {accepted}");
    kiln_cmd::outln!("webhook_duplicates_answered: {duplicate}");
    kiln_cmd::outln!("webhook_forged_refused: {refused}");
    kiln_cmd::outln!("webhook_unexpected_answers: {other}");
    kiln_cmd::outln!("webhook_runs: {}", runs.len());
    kiln_cmd::outln!("webhook_runs_expected: {unique}");
    kiln_cmd::outln!("webhook_runs_from_forged: {from_forged}");
    kiln_cmd::outln!("webhook_runs_failed: {failed}");
    kiln_cmd::outln!("webhook_all_runs_done_s: {all_done_s:.1}");
    kiln_cmd::outln!("webhook_ack_p50_ms: {:.1}", percentile(&acks, 0.5));
    kiln_cmd::outln!("webhook_ack_p99_ms: {:.1}", percentile(&acks, 0.99));
    kiln_cmd::outln!("api_submit_ack_p50_ms: {:.1}", percentile(&api_acks, 0.5));
    kiln_cmd::outln!("api_submit_ack_p99_ms: {:.1}", percentile(&api_acks, 0.99));
    kiln_cmd::outln!("webhook_to_start_p50_ms: {:.1}", percentile(&hook_starts, 0.5));
    kiln_cmd::outln!("webhook_to_start_p95_ms: {:.1}", percentile(&hook_starts, 0.95));
    kiln_cmd::outln!("api_trigger_to_start_p50_ms: {:.1}", percentile(&api_starts, 0.5));
    kiln_cmd::outln!("api_trigger_to_start_p95_ms: {:.1}", percentile(&api_starts, 0.95));
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    let ok = runs.len() == unique && from_forged == 0 && refused == FORGED && other == 0 && failed == 0;
    Ok(if ok { exit::OK } else { exit::RUN_FAILED })
}
