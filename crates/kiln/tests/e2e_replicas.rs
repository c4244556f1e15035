//! Several servers: clients and agents given several replica URLs move past
//! one that stops answering.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_run};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// An agent given several server URLs moves past one that does not answer.
#[tokio::test(flavor = "multi_thread")]
async fn agent_with_several_server_urls_skips_a_dead_one() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // Nothing listens there once the listener is dropped.
    let urls = format!("http://{dead},{}", server.url);
    let agent = std::process::Command::new(BIN)
        .env("KILN_STORAGE_LEVELS", "off") // the host disk's fill is not under test
        .args(["agent", "--server", &urls, "--name", "multi", "--work-dir"])
        .arg(server.data_dir().join("agent-work"))
        .env("KILN_AGENT_TOKEN", &server.agent_token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _agent = Kill(agent);
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: hi\n    steps: [\"echo hi\"]\n")])
        .unwrap();
    server.add_repo("hi", &repo);
    let c = Client::new(&urls, &server.token);
    let r = c.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await;
    let r = match r {
        Ok(r) => r,
        // The first call may hit the dead URL; the client has moved on.
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            c.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap()
        }
    };
    assert_eq!(c.base_url(), server.url, "the client moved to the live server");
    let run = wait_run(&c, &r.run_id, 60).await;
    assert_eq!(run.status, "success");
}

/// Two `kiln server` replicas on one PostgreSQL database and one data dir;
/// agents know both. A job's artifact hands off from `compile` to `test`;
/// the replica that `test`'s agent talks to is SIGKILLed while `test` runs:
/// the agent moves to the other replica, its lease and completion go on
/// there, the run succeeds with the exact bytes, and a new run goes through
/// the survivor alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_run_loses_nothing() {
    let Some((_pg, a, b)) = two_replicas(&["--loss-grace", "30s"]).await else {
        return;
    };
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let wf = format!(
        "version: 1\njobs:\n  - name: compile\n    steps:\n      - mkdir -p target && head -c 3000000 /dev/urandom > target/app.jar && sha256sum target/app.jar > target/app.sha\n    artifacts:\n      publish:\n        - {{name: app, path: target/app.jar}}\n        - {{name: sum, path: target/app.sha}}\n  - name: test\n    runs-on: {{via: a}}\n    artifacts:\n      restore:\n        - {{from_job: compile, name: app, path: target/app.jar}}\n        - {{from_job: compile, name: sum, path: target/app.sha}}\n    steps:\n      - while [ ! -f {go} ]; do sleep 0.05; done\n      - sha256sum -c target/app.sha\n",
        go = go.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    a.add_repo("app", &repo);
    let (ab, ba) = (format!("{},{}", a.url, b.url), format!("{},{}", b.url, a.url));
    // `test` runs on agent one, which talks to replica A first.
    let agent1 = kiln_testkit::KilnAgent::spawn(&a.bin, &ab, &a.agent_token, "one", &["--labels", "via=a"]).unwrap();
    let agent2 = kiln_testkit::KilnAgent::spawn(&a.bin, &ba, &a.agent_token, "two", &[]).unwrap();
    let c = Client::new(&ba, &b.token);
    let r = c.submit_run("app", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    kiln_testkit::until(&c, &r.run_id, 60, "test running", |r| r.jobs[1].status == "running").await;

    // SIGKILL replica A mid-run.
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    std::fs::write(&go, "").unwrap();
    let run = wait_run(&c, &r.run_id, 120).await;
    assert_eq!(run.status, "success", "{run:#?}\nB: {}\nagent1: {}\nagent2: {}", b.log(), agent1.log(), agent2.log());
    assert_eq!(run.jobs[1].attempts.len(), 1, "the test attempt itself was never lost: {run:#?}");
    assert!(agent1.log().contains("switching"), "agent one moved to replica B: {}", agent1.log());

    // The survivor alone runs a new pipeline end to end.
    std::fs::remove_file(&go).unwrap();
    std::fs::write(&go, "").unwrap();
    let r2 = c.submit_run("app", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run2 = wait_run(&c, &r2.run_id, 120).await;
    assert_eq!(run2.status, "success", "{run2:#?}\nB: {}", b.log());
}

/// A run accepted by replica A reaches an agent that only knows replica B
/// (B sweeps the ready jobs of the shared database into its queues).
#[tokio::test(flavor = "multi_thread")]
async fn a_run_accepted_by_one_replica_reaches_agents_of_another() {
    let Some((_pg, a, b)) = two_replicas(&[]).await else {
        return;
    };
    let _agent = b.agent("only-b", &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: hi\n    steps: [\"echo hi\"]\n")])
        .unwrap();
    a.add_repo("hi", &repo);
    let via_a = Client::new(&a.url, &a.token);
    let r = via_a.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&via_a, &r.run_id, 60).await;
    assert_eq!(run.status, "success", "{run:#?}\nA: {}\nB: {}", a.log(), b.log());
}

/// The same across replicas, with the periodic sweep an hour apart: only
/// replica A's commit notification (PostgreSQL `NOTIFY kiln_ready`, heard
/// by B's listener) can bring the job to B's queues, so the run finishing
/// proves the wakeup. A second run after the first checks that B keeps
/// listening.
#[tokio::test(flavor = "multi_thread")]
async fn ready_jobs_reach_another_replica_by_notification() {
    let Some((_pg, a, b)) = two_replicas(&["--dispatch-sweep", "1h"]).await else {
        return;
    };
    let _agent = b.agent("only-b", &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: one\n    steps: [\"echo one\"]\n  - name: two\n    steps: [\"echo two\"]\n",
    )])
    .unwrap();
    a.add_repo("hi", &repo);
    let via_a = Client::new(&a.url, &a.token);
    for _ in 0..2 {
        let r =
            via_a.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let run = wait_run(&via_a, &r.run_id, 60).await;
        assert_eq!(run.status, "success", "{run:#?}\nA: {}\nB: {}", a.log(), b.log());
    }
}

/// `kiln_dispatch_offer_replicas` of a replica (None: it does not answer).
async fn offer_replicas(url: &str, token: &str) -> Option<u64> {
    let body =
        reqwest::Client::new().get(format!("{url}/metrics")).bearer_auth(token).send().await.ok()?.text().await.ok()?;
    body.lines().find_map(|l| l.strip_prefix("kiln_dispatch_offer_replicas ")).and_then(|v| v.trim().parse().ok())
}

async fn until_offer_replicas(url: &str, token: &str, n: u64, what: &str) -> std::time::Duration {
    let t = std::time::Instant::now();
    while offer_replicas(url, token).await != Some(n) {
        assert!(t.elapsed() < std::time::Duration::from_secs(90), "{what}: offer replicas never became {n}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    t.elapsed()
}

/// Two replicas, each with an agent that knows only it, share the offering
/// of ready jobs (each job offered by one; both replicas' metrics say two
/// members) and every job runs once. Replica A is SIGKILLed: its offer
/// lease lapses, B offers every job again (its metric drops to 0), and
/// every run submitted after the kill, half of whose jobs A offered while
/// it lived, is claimed through B by B's agent, each exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_replicas_share_of_the_offering_passes_to_the_survivor() {
    let Some((_pg, a, b)) = two_replicas(&[]).await else {
        return;
    };
    let agent_a = a.agent("only-a", &[]).unwrap();
    let agent_b = b.agent("only-b", &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: one\n    steps: [\"true\"]\n  - name: two\n    steps: [\"true\"]\n  - name: three\n    steps: [\"true\"]\n",
    )])
    .unwrap();
    a.add_repo("hi", &repo);
    let logs = |a: &KilnServer, b: &KilnServer| format!("A: {}\nB: {}", a.log(), b.log());
    until_offer_replicas(&a.url, &a.token, 2, "A").await;
    until_offer_replicas(&b.url, &b.token, 2, "B").await;

    let via_b = Client::new(&b.url, &b.token);
    let submit = |n: usize| {
        let c = via_b.clone();
        async move {
            let mut ids = vec![];
            for _ in 0..n {
                let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
                ids.push(c.submit_run("hi", &body, None).await.unwrap().run_id);
            }
            ids
        }
    };
    let mut runners = std::collections::BTreeSet::new();
    for id in submit(6).await {
        let run = wait_run(&via_b, &id, 60).await;
        assert_eq!(run.status, "success", "{run:#?}\n{}", logs(&a, &b));
        for j in &run.jobs {
            assert_eq!(j.attempts.len(), 1, "one attempt per job: {run:#?}");
            runners.insert(j.attempts[0].runner.clone());
        }
    }
    assert!(runners.contains("only-b"), "B's agent ran jobs: {runners:?}");

    // SIGKILL replica A (its agent stays, talking to nobody).
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let ids = submit(10).await;
    let took = until_offer_replicas(&b.url, &b.token, 0, "B after A died").await;
    eprintln!("B offers everything {took:?} after A was killed");
    for id in ids {
        let run = wait_run(&via_b, &id, 120).await;
        assert_eq!(run.status, "success", "{run:#?}\n{}\nagent b: {}", logs(&a, &b), agent_b.log());
        for j in &run.jobs {
            assert_eq!(j.attempts.len(), 1, "one attempt per job: {run:#?}");
            assert_eq!(j.attempts[0].runner, "only-b", "{run:#?}");
        }
    }
    drop(agent_a);
}

/// Two replicas (`kiln server` processes) with `extra` flags on one fresh
/// database of a throwaway PostgreSQL server (kept alive by the first
/// element); `None` when PostgreSQL is not installed.
async fn two_replicas(extra: &[&str]) -> Option<(kiln_testkit::TempPostgres, KilnServer, KilnServer)> {
    if !kiln_testkit::postgres_available() {
        return None;
    }
    let pg = kiln_testkit::TempPostgres::start().unwrap();
    let url = pg.create_database().await.unwrap();
    let args: Vec<&str> = ["--database-url", url.as_str()].into_iter().chain(extra.iter().copied()).collect();
    let a = KilnServer::start(BIN.as_ref(), &args).unwrap();
    let b = a.replica(&args).unwrap();
    Some((pg, a, b))
}
