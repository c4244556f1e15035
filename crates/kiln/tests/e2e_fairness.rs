//! Fair share end to end (issue 44) with the real `kiln` binary and real
//! agents: one team's matrix backlog does not starve another team's job; an
//! `urgent` run goes before a `normal` backlog and a `background` one still
//! starts before the backlog drains (aging); a team's running quota holds
//! on real agents; `kiln team`, `kiln queue`, `kiln priority` and the
//! `waiting` text as a user reads them.
//!
//! No wall-clock assertion: what is checked is the order of starts — how
//! many of the backlog's jobs started between a job becoming ready and its
//! own start (oldest-first would start the whole backlog first).

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo, until, wait_run};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn cli(up: &KilnUp, args: &[&str]) -> (i32, String, String) {
    let o = up.cli().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(up: &KilnUp, args: &[&str]) -> String {
    let (code, out, err) = cli(up, args);
    assert_eq!(code, 0, "kiln {args:?}: {out}{err}");
    out
}

/// A workflow of `n` parallel jobs of `step` (a matrix).
fn matrix(n: u32, step: &str) -> String {
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    format!("version: 1\njobs:\n  - name: m\n    matrix: {{i: [{}]}}\n    steps: [\"{step}\"]\n", values.join(", "))
}

const ONE: &str = "version: 1\njobs:\n  - name: one\n    steps: [\"sleep 0.2\"]\n";

async fn submit(c: &Client, repo: &str, workflow: &str, priority: Option<&str>) -> String {
    let body = SubmitRun {
        commit_sha: "HEAD".into(),
        workflow_path: Some(workflow.into()),
        priority: priority.map(str::to_string),
        ..Default::default()
    };
    c.submit_run(repo, &body, None).await.unwrap().run_id
}

fn running(r: &kiln_api::Run) -> usize {
    r.jobs.iter().filter(|j| j.status == "running").count()
}

/// Jobs of `backlog` that started after `from` and before `to` (ms).
fn started_between(backlog: &kiln_api::Run, from: i64, to: i64) -> usize {
    backlog.jobs.iter().filter_map(|j| j.started_at_ms).filter(|s| *s > from && *s < to).count()
}

fn started_after(backlog: &kiln_api::Run, at: i64) -> usize {
    backlog.jobs.iter().filter_map(|j| j.started_at_ms).filter(|s| *s > at).count()
}

/// Team b's one job, submitted while team a's 40-job matrix saturates the
/// four slots, starts with the next free slot rather than after a's
/// backlog; `kiln queue` shows both teams; a waiting job says where it
/// stands.
#[tokio::test(flavor = "multi_thread")]
async fn another_teams_job_is_not_starved_by_a_matrix_backlog() {
    let up = KilnUp::start(BIN.as_ref(), 4).unwrap();
    let big = TestRepo::new(&[(".kiln/m.yaml", &matrix(40, "sleep 1"))]).unwrap();
    let hot = TestRepo::new(&[(".kiln/one.yaml", ONE)]).unwrap();
    ok(&up, &["team", "add", "a"]);
    ok(&up, &["team", "add", "b", "--weight", "1"]);
    let ls = ok(&up, &["team", "ls"]);
    assert!(ls.contains("TEAM") && ls.lines().any(|l| l.starts_with("a ")), "{ls}");
    ok(&up, &["repo", "add", "big", "--team", "a", "--url", &big.path().display().to_string()]);
    ok(&up, &["repo", "add", "hot", "--url", &hot.path().display().to_string()]);
    ok(&up, &["repo", "set", "hot", "--team", "b"]);
    assert!(ok(&up, &["repo", "list"]).lines().any(|l| l.starts_with("hot") && l.contains(" b ")));
    let c = Client::new(&up.url, &up.token);

    let a = submit(&c, "big", ".kiln/m.yaml", None).await;
    let busy = until(&c, &a, 120, "four running", |r| running(r) >= 4).await;
    assert_eq!(busy.team, "a");
    // The backlog as a user reads it: the queue, and why a job waits.
    let q: kiln_api::QueueView = serde_json::from_str(&ok(&up, &["queue", "--json"])).unwrap();
    let ta = q.teams.iter().find(|t| t.team == "a").expect("team a in the queue");
    assert!(ta.ready > 0 && ta.running > 0, "{ta:?}");
    let table = ok(&up, &["queue"]);
    assert!(table.contains("TEAM") && table.contains("normal"), "{table}");
    let waiting = until(&c, &a, 30, "a waiting text", |r| {
        r.jobs.iter().any(|j| j.waiting.as_deref().is_some_and(|w| w.contains("other jobs ready in lane normal")))
    })
    .await;
    let w = waiting.jobs.iter().find_map(|j| j.waiting.clone()).unwrap();
    assert!(w.starts_with("waiting: every agent that can run it is busy"), "{w}");

    let b = submit(&c, "hot", ".kiln/one.yaml", None).await;
    let b = wait_run(&c, &b, 120).await;
    let a = wait_run(&c, &a, 300).await;
    assert_eq!((a.status.as_str(), b.status.as_str()), ("success", "success"));
    let b_start = b.jobs[0].started_at_ms.unwrap();
    let ahead = started_between(&a, b.created_at_ms, b_start);
    assert!(ahead <= 4, "b waited for {ahead} of a's jobs to start (one per slot at most)");
    let behind = started_after(&a, b_start);
    assert!(behind >= 10, "a's backlog was still long when b started ({behind} after it): the test means something");
}

/// Under saturation by `normal` work an `urgent` run starts with the next
/// free slot; a `background` one waits behind the older normal work, but
/// ages (`--aging-step 2s`) and starts before normal work that arrived
/// after it — oldest-first within a lane, never starved by newer arrivals;
/// an admin raises a queued run with `kiln priority`; the wait is measured
/// per team and lane.
#[tokio::test(flavor = "multi_thread")]
async fn urgent_goes_first_and_background_ages_into_the_top_lane() {
    let up = KilnUp::start_with(BIN.as_ref(), 2, &["--aging-step", "2s"]).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/m.yaml", &matrix(12, "sleep 1")),
        (".kiln/later.yaml", &matrix(20, "sleep 1")),
        (".kiln/one.yaml", ONE),
    ])
    .unwrap();
    ok(&up, &["repo", "add", "r", "--url", &repo.path().display().to_string()]);
    let c = Client::new(&up.url, &up.token);
    let m = submit(&c, "r", ".kiln/m.yaml", None).await;
    until(&c, &m, 120, "two running", |r| running(r) >= 2).await;

    let urgent = submit(&c, "r", ".kiln/one.yaml", Some("urgent")).await;
    let background = submit(&c, "r", ".kiln/one.yaml", Some("background")).await;
    let raised = submit(&c, "r", ".kiln/one.yaml", Some("background")).await;
    let out = ok(&up, &["priority", &raised, "urgent"]);
    assert!(out.contains("is now urgent"), "{out}");
    let raised_at = now_ms();
    // Normal work that arrives after the background run.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let later = submit(&c, "r", ".kiln/later.yaml", None).await;
    let (urgent, background, raised) =
        (wait_run(&c, &urgent, 120).await, wait_run(&c, &background, 120).await, wait_run(&c, &raised, 120).await);
    let (m, later) = (wait_run(&c, &m, 300).await, wait_run(&c, &later, 300).await);
    assert_eq!((m.status.as_str(), later.status.as_str()), ("success", "success"));
    let lanes = (urgent.priority.as_str(), background.priority.as_str(), raised.priority.as_str());
    assert_eq!(lanes, ("urgent", "background", "urgent"));

    let u_start = urgent.jobs[0].started_at_ms.unwrap();
    let ahead = started_between(&m, urgent.created_at_ms, u_start);
    assert!(ahead <= 2, "urgent waited for {ahead} normal starts (one per slot at most)");
    let r_start = raised.jobs[0].started_at_ms.unwrap();
    let ahead = started_between(&m, raised_at, r_start);
    assert!(ahead <= 2, "raised to urgent, it waited for {ahead} normal starts");

    let bg_start = background.jobs[0].started_at_ms.unwrap();
    assert!(started_between(&m, background.created_at_ms, bg_start) >= 1, "background waits behind older normal work");
    let behind = started_after(&later, bg_start);
    assert!(behind >= 10, "aged, background went before the normal work that arrived after it ({behind} of 20)");

    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", up.url))
        .bearer_auth(&up.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for lane in ["urgent", "normal", "background"] {
        let series = format!("kiln_queue_wait_seconds_count{{priority=\"{lane}\",team=\"default\"}}");
        assert!(metrics.contains(&series), "{series} in /metrics");
    }
    assert!(metrics.contains("kiln_job_seconds_total{team=\"default\"}"), "cost per team");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A team's running quota holds on real agents (a claimed job that has not
/// started counts), a team over its queued cap is refused with exit 3 and a
/// message saying which cap, a cap lifted at runtime applies at once, and
/// only an empty team can be removed.
#[tokio::test(flavor = "multi_thread")]
async fn quotas_hold_on_real_agents_and_caps_are_said() {
    let up = KilnUp::start(BIN.as_ref(), 3).unwrap();
    let repo = TestRepo::new(&[(".kiln/m.yaml", &matrix(6, "sleep 0.5"))]).unwrap();
    let out = ok(&up, &["team", "add", "web", "--weight", "2", "--max-running", "1", "--max-queued", "3"]);
    assert!(out.contains("kiln repo set REPO --team web"), "{out}");
    ok(&up, &["repo", "add", "r", "--team", "web", "--url", &repo.path().display().to_string()]);
    let run_id = ok(&up, &["run", "--repo", "r"]).trim().to_string();
    let c = Client::new(&up.url, &up.token);
    // Six queued jobs: over the cap of three.
    let (code, _, err) = cli(&up, &["run", "--repo", "r"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("team `web` has") && err.contains("at its cap of 3"), "{err}");
    let held = until(&c, &run_id, 60, "a job waiting on the quota", |r| {
        r.jobs.iter().any(|j| j.waiting.as_deref().is_some_and(|w| w.contains("--max-running")))
    })
    .await;
    let w = held.jobs.iter().find_map(|j| j.waiting.clone().filter(|w| w.contains("--max-running"))).unwrap();
    assert_eq!(w, "waiting: team web holds 1 of the 1 jobs it may run at once (--max-running)");
    let (code, _, err) = cli(&up, &["team", "rm", "web"]);
    assert_eq!(code, 3, "a team with repositories stays: {err}");
    assert!(err.contains("still has 1 repository"), "{err}");
    ok(&up, &["team", "set", "web", "--max-queued", "none"]);
    let second = ok(&up, &["run", "--repo", "r"]);
    assert!(!second.trim().is_empty(), "the cap lifted at runtime");

    let run = wait_run(&c, &run_id, 120).await;
    assert_eq!(run.status, "success");
    // Never two of the team's jobs at once, though three agents were free.
    let mut spans: Vec<(i64, i64)> =
        run.jobs.iter().map(|j| (j.started_at_ms.unwrap(), j.finished_at_ms.unwrap())).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1, "two jobs of the team overlapped: {spans:?}");
    }
}

async fn offer_replicas(url: &str, token: &str) -> Option<u64> {
    let body =
        reqwest::Client::new().get(format!("{url}/metrics")).bearer_auth(token).send().await.ok()?.text().await.ok()?;
    body.lines().find_map(|l| l.strip_prefix("kiln_dispatch_offer_replicas ")).and_then(|v| v.trim().parse().ok())
}

async fn until_offer_replicas(url: &str, token: &str, n: u64) {
    let t = std::time::Instant::now();
    while offer_replicas(url, token).await != Some(n) {
        assert!(t.elapsed() < std::time::Duration::from_secs(90), "offer replicas never became {n}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Two `kiln server` replicas on PostgreSQL, two agents on each: team b's
/// job submitted through one replica starts with the next free slot while
/// team a's backlog, submitted through the other, fills every slot. Then
/// the replica a's run went through is SIGKILLed mid-backlog: its agents
/// move to the survivor, which orders by the virtual times the claim
/// transactions persisted, and b's next job again starts with a free slot.
#[tokio::test(flavor = "multi_thread")]
async fn fair_share_holds_across_two_replicas_and_after_one_is_killed() {
    use kiln_testkit::{KilnAgent, KilnServer};
    if !kiln_testkit::postgres_available() {
        return;
    }
    let pg = kiln_testkit::TempPostgres::start().unwrap();
    let url = pg.create_database().await.unwrap();
    let args = ["--database-url", url.as_str()];
    let a = KilnServer::start(BIN.as_ref(), &args).unwrap();
    let b = a.replica(&args).unwrap();
    let (ab, ba) = (format!("{},{}", a.url, b.url), format!("{},{}", b.url, a.url));
    let _agents: Vec<KilnAgent> = vec![
        KilnAgent::spawn(&a.bin, &ab, &a.agent_token, "a1", &[]).unwrap(),
        KilnAgent::spawn(&a.bin, &ab, &a.agent_token, "a2", &[]).unwrap(),
        KilnAgent::spawn(&a.bin, &ba, &a.agent_token, "b1", &[]).unwrap(),
        KilnAgent::spawn(&a.bin, &ba, &a.agent_token, "b2", &[]).unwrap(),
    ];
    let big = TestRepo::new(&[(".kiln/m.yaml", &matrix(80, "sleep 1"))]).unwrap();
    let hot = TestRepo::new(&[(".kiln/one.yaml", ONE)]).unwrap();
    let run_cli = |args: &[&str]| {
        let o = a.cli().args(args).output().unwrap();
        assert!(o.status.success(), "kiln {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run_cli(&["team", "add", "a"]);
    run_cli(&["team", "add", "b"]);
    run_cli(&["repo", "add", "big", "--team", "a", "--url", &big.path().display().to_string()]);
    run_cli(&["repo", "add", "hot", "--team", "b", "--url", &hot.path().display().to_string()]);
    until_offer_replicas(&a.url, &a.token, 2).await;
    until_offer_replicas(&b.url, &b.token, 2).await;
    let (via_a, via_b) = (Client::new(&a.url, &a.token), Client::new(&b.url, &b.token));

    let backlog = submit(&via_a, "big", ".kiln/m.yaml", None).await;
    until(&via_b, &backlog, 120, "four running", |r| running(r) >= 4).await;
    let first = submit(&via_b, "hot", ".kiln/one.yaml", None).await;
    let first = wait_run(&via_b, &first, 120).await;

    // SIGKILL replica A mid-backlog; the survivor offers everything.
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    until_offer_replicas(&b.url, &b.token, 0).await;
    let now = via_b.get_run(&backlog).await.unwrap();
    assert!(now.jobs.iter().filter(|j| j.status == "ready").count() >= 10, "a's backlog outlived the kill");
    let second = submit(&via_b, "hot", ".kiln/one.yaml", None).await;
    let second = wait_run(&via_b, &second, 120).await;
    let backlog = wait_run(&via_b, &backlog, 300).await;
    assert_eq!((first.status.as_str(), second.status.as_str()), ("success", "success"));
    assert_eq!(backlog.status, "success", "{}", b.log());
    for (what, r) in [("through the other replica", &first), ("after the kill", &second)] {
        let start = r.jobs[0].started_at_ms.unwrap();
        let ahead = started_between(&backlog, r.created_at_ms, start);
        assert!(ahead <= 4, "{what}: b waited for {ahead} of a's starts (one per slot at most)");
        assert!(started_after(&backlog, start) >= 5, "{what}: a's backlog was still there");
    }
    drop(pg);
}
