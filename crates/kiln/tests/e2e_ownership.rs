//! Durable ownership end to end (spec 000 §7–§9, §12, §15) with real `kiln
//! server` and `kiln agent` processes that are SIGSTOPped, SIGCONTed and
//! SIGKILLed, real git, real files.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, handoff_workflow, wait_for, wait_run};
use std::path::Path;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

async fn wait_job<F: Fn(&kiln_api::Job) -> bool>(c: &Client, run: &str, job: usize, f: F) -> kiln_api::Run {
    for _ in 0..1200 {
        let r = c.get_run(run).await.unwrap();
        if f(&r.jobs[job]) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {job} of run {run} never reached the expected state: {:#?}", c.get_run(run).await.unwrap());
}

/// Bytes of any staged (not yet sealed) upload of `run`'s `job` at `epoch`.
fn staged_bytes(data: &Path, run: &str, job: &str, epoch: i64) -> u64 {
    let dir = data.join("objects/staging/artifacts").join(run).join(job).join(epoch.to_string());
    std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

/// The spec's opening scenario: the runner vanishes mid-upload, a replacement
/// finishes, the original comes back and reports — and is refused.
#[tokio::test(flavor = "multi_thread")]
async fn runner_vanishes_mid_upload_and_its_late_report_is_refused() {
    let server = KilnServer::start(
        BIN.as_ref(),
        &["--lease-ttl", "3s", "--artifact-gc-grace", "1s", "--gc-interval", "300ms", "--retry-base", "100ms"],
    )
    .unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &handoff_workflow(200_000_000))]).unwrap();
    server.add_repo("vanish", &repo);
    let c = Client::new(&server.url, &server.token);

    // Agent A uploads slowly; it gets epoch 1.
    let a = server.agent("agent-a", &["--upload-rate-limit", "20000000"]).unwrap();
    let run =
        c.submit_run("vanish", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_job(&c, &run.run_id, 0, |j| j.current_epoch == 1).await;
    let compile = r.jobs[0].id.clone();
    let data = server.data_dir();
    let midway =
        wait_for(Duration::from_secs(120), || (staged_bytes(&data, &run.run_id, &compile, 1) > 0).then_some(()));
    assert!(midway.is_some(), "agent A never started uploading; agent log:\n{}", a.log());

    // A vanishes mid-upload (paused: its connection stays up, so the TTL decides).
    a.signal("STOP");
    let r = wait_job(&c, &run.run_id, 0, |j| j.attempts.first().is_some_and(|at| at.outcome == "lost")).await;
    assert_eq!(r.jobs[0].status, "ready", "fenced before a replacement is authorized");

    // B claims epoch 2 and finishes the whole run.
    let b = server.agent("agent-b", &[]).unwrap();
    let done = wait_run(&c, &run.run_id, 300).await;
    assert_eq!(done.status, "success", "{done:#?}\nserver:\n{}\nB:\n{}", server.log(), b.log());

    // A comes back and reports: every call of epoch 1 is refused.
    a.signal("CONT");
    // As agent A would send them: with epoch 1's own attempt token.
    let agent_api = Client::new(&server.url, &epoch_token(&server.data_dir(), &compile, 1));
    let hb = agent_api.heartbeat(&compile, 1).await.unwrap_err();
    assert!(hb.is_stale_epoch(), "{hb}");
    let completion = kiln_api::Completion::success();
    assert!(agent_api.complete(&compile, 1, &completion).await.unwrap_err().is_stale_epoch());
    let chunk = kiln_api::LogChunk {
        stream: "stdout".into(),
        seq: 999,
        offset: 1 << 30,
        data: String::new(),
        sha256: Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into()),
        crc32c: None,
        in_order: false,
    };
    assert!(agent_api.append_log(&compile, 1, &chunk).await.unwrap_err().is_stale_epoch());
    let up = kiln_api::CreateUpload { name: "app".into(), size: 1, sha256: Some("0".repeat(64)), kind: None };
    assert!(agent_api.create_upload(&compile, 1, &up).await.unwrap_err().is_stale_epoch());

    let after = wait_for(Duration::from_secs(30), || a.log().contains("fenced").then_some(()));
    assert!(after.is_some(), "agent A should notice it was fenced:\n{}", a.log());

    // GET run: epoch 1 lost, epoch 2 success, the artifact bound to epoch 2.
    let r = c.get_run(&run.run_id).await.unwrap();
    let job = &r.jobs[0];
    assert_eq!(job.status, "success");
    assert_eq!(job.current_epoch, 2);
    let outcomes: Vec<_> = job.attempts.iter().map(|a| (a.epoch, a.outcome.as_str(), a.runner.as_str())).collect();
    assert_eq!(outcomes, vec![(1, "lost", "agent-a"), (2, "success", "agent-b")]);
    assert_eq!(job.artifacts.len(), 1);
    let art = &job.artifacts[0];
    assert_eq!((art.name.as_str(), art.epoch, art.size), ("app", 2, 200_000_000));

    // integration-test consumed exactly epoch 2's bytes.
    let logs = server.cli().args(["logs", &run.run_id, "integration-test"]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains(&format!("consumed {}", art.sha256)), "{logs}");
    // ...which are what `kiln artifact get` returns too.
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("app.jar");
    let g = server.cli().args(["artifact", "get", &run.run_id, "compile", "app", "-o"]).arg(&dest).output().unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let sha = std::process::Command::new("sha256sum").arg(&dest).output().unwrap();
    assert!(String::from_utf8_lossy(&sha.stdout).starts_with(&art.sha256));

    // Epoch 1's staged bytes are unbound and collected.
    let gone = wait_for(Duration::from_secs(30), || {
        (staged_bytes(&data, &run.run_id, &compile, 1) == 0
            && kiln_testkit::files_under(
                &data.join("objects/objects/artifacts").join(&run.run_id).join(&compile).join("1"),
            ) == 0)
            .then_some(())
    });
    assert!(gone.is_some(), "epoch 1's bytes were not collected");
    // Epoch 2's bytes are the bound content object (issue 45), its
    // session's own copy moved there.
    assert_eq!(
        kiln_testkit::files_under(&data.join("objects/objects/artifacts").join(&run.run_id).join(&compile).join("2")),
        0
    );
    let content = data.join("objects/objects/cas/sha256").join(&art.sha256);
    assert_eq!(std::fs::metadata(&content).map(|m| m.len()).ok(), Some(200_000_000));
    drop(b);
}

/// SIGKILL of an agent mid-step: its connection drops, the server shortens
/// its leases to the loss grace, another agent takes epoch 2 — long before the
/// 30 s TTL — and no process of the killed step survives.
#[tokio::test(flavor = "multi_thread")]
async fn killed_agent_loses_its_job_fast_and_leaves_no_orphans() {
    let server = KilnServer::start(BIN.as_ref(), &["--lease-ttl", "30s", "--retry-base", "100ms"]).unwrap();
    let tmp = kiln_testkit::step_writable_tempdir().unwrap();
    let pids = tmp.path().to_path_buf();
    let wf = format!(
        "version: 1\njobs:\n  - name: work\n    steps:\n      - if [ \"$KILN_EPOCH\" = 1 ]; then sh -c 'echo $$ > {p}/child; exec sleep 600' & echo $$ > {p}/shell; wait; fi; echo done-$KILN_EPOCH\n",
        p = pids.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("kill", &repo);
    let c = Client::new(&server.url, &server.token);
    let a = server.agent("victim", &[]).unwrap();
    let run = c.submit_run("kill", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let read_pid = |f: &str| -> Option<i32> { std::fs::read_to_string(pids.join(f)).ok()?.trim().parse().ok() };
    // Steps run in their own PID namespace with their own /proc: the pids
    // they write only say they started; their host processes are found by
    // their environment.
    wait_for(Duration::from_secs(60), || read_pid("shell")).expect("step started");
    wait_for(Duration::from_secs(10), || read_pid("child")).expect("child started");
    let step = kiln_testkit::step_processes(&run.run_id);
    assert!(step.len() >= 2, "the step's shell and child: {step:?}");

    a.signal("KILL");
    let b = server.agent("rescuer", &[]).unwrap();
    let done = wait_run(&c, &run.run_id, 25).await;
    assert_eq!(done.status, "success", "{done:#?}\n{}", server.log());
    let attempts: Vec<_> = done.jobs[0].attempts.iter().map(|a| (a.outcome.as_str(), a.runner.as_str())).collect();
    assert_eq!(attempts, vec![("lost", "victim"), ("success", "rescuer")]);
    for pid in step {
        let gone = wait_for(Duration::from_secs(10), || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()));
        assert!(gone.is_some(), "process {pid} of the killed agent's step survived");
    }
    // The lost attempt's log ends with an explicit gap, never a clean end.
    let logs = server.cli().args(["logs", &run.run_id]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    let gap = logs.find("gap: the agent of attempt 1 was lost").expect("a gap marker for epoch 1");
    assert!(logs[gap..].contains("done-2"), "epoch 2's output follows the gap: {logs}");
    drop(b);
}

/// A declared output that the steps never produced fails the job explicitly;
/// nothing is substituted and the successor never runs.
#[tokio::test(flavor = "multi_thread")]
async fn missing_required_artifact_fails_the_job() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: compile\n    steps: [\"echo compiled nothing\"]\n    artifacts:\n      publish:\n        - {name: app, path: target/app.jar}\n  - name: test\n    artifacts:\n      restore:\n        - {from_job: compile, name: app, path: app.jar}\n    steps: [\"echo should-not-run\"]\n",
    )])
    .unwrap();
    server.add_repo("missing", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run =
        c.submit_run("missing", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(r.status, "failed");
    assert_eq!(r.jobs[0].status, "failed");
    let msg = r.jobs[0].message.clone().unwrap_or_default();
    assert!(msg.contains("app"), "the failure names the artifact: {msg}");
    assert!(r.jobs[0].artifacts.is_empty());
    assert_eq!(r.jobs[1].status, "skipped");
    assert!(r.jobs[1].attempts.is_empty());
    let e = c.artifact(&run.run_id, "compile", "app").await.unwrap_err();
    assert_eq!(e.status(), Some(404));
}

/// spec 000 §15 "database is unavailable": claims and advancement pause and
/// nothing is guessed; once the database is back, the held completion lands.
#[tokio::test(flavor = "multi_thread")]
async fn database_unavailable_pauses_advancement() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let wf = format!(
        "version: 1\njobs:\n  - name: a\n    steps:\n      - while [ ! -e {} ]; do sleep 0.05; done\n  - name: b\n    steps: [\"echo b\"]\n",
        gate.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("dbdown", &repo);
    let c = Client::new(&server.url, &server.token);
    let _agent = server.agent("a", &[]).unwrap();
    let run =
        c.submit_run("dbdown", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    wait_job(&c, &run.run_id, 0, |j| j.status == "running").await;

    // Another process takes the database's write lock for a while.
    let locked = tmp.path().join("locked");
    let db = server.data_dir().join("kiln.db");
    let mut locker = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3,time\nc=sqlite3.connect({db:?}, isolation_level=None)\nc.execute('BEGIN EXCLUSIVE')\nopen({locked:?},'w').close()\ntime.sleep(14)\nc.execute('COMMIT')\n",
            db = db.display().to_string(),
            locked = locked.display().to_string()
        ))
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(10), || locked.exists().then_some(())).expect("lock taken");
    std::fs::write(&gate, "").unwrap();

    // New work cannot be accepted: a clear 503, not a guess.
    let e =
        c.submit_run("dbdown", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert!(e.is_retryable());
    // Reads still answer, and show nothing advanced: `a` is not success, `b` not ready.
    let r = c.get_run(&run.run_id).await.unwrap();
    assert_eq!(r.jobs[0].status, "running");
    assert_eq!(r.jobs[1].status, "pending");

    locker.wait().unwrap();
    let done = wait_run(&c, &run.run_id, 90).await;
    assert_eq!(done.status, "success", "{done:#?}\n{}", server.log());
    assert_eq!(done.jobs[0].attempts.len(), 1, "the held completion landed; no replacement was needed");
}

/// spec 000 §15 "host lost during multipart upload": the replacement starts a
/// fresh attempt-scoped generation; nothing of the lost session is resumed,
/// bound or kept.
#[tokio::test(flavor = "multi_thread")]
async fn host_lost_mid_upload_starts_a_fresh_generation() {
    let server = KilnServer::start(
        BIN.as_ref(),
        &["--artifact-gc-grace", "1s", "--gc-interval", "300ms", "--retry-base", "100ms"],
    )
    .unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: compile\n    steps:\n      - mkdir -p target && head -c 50000000 /dev/urandom > target/app.jar\n    artifacts:\n      publish:\n        - {name: app, path: target/app.jar}\n",
    )])
    .unwrap();
    server.add_repo("lost", &repo);
    let c = Client::new(&server.url, &server.token);
    let a = server.agent("doomed", &["--upload-rate-limit", "5000000"]).unwrap();
    let run = c.submit_run("lost", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_job(&c, &run.run_id, 0, |j| j.current_epoch == 1).await;
    let job = r.jobs[0].id.clone();
    let data = server.data_dir();
    wait_for(Duration::from_secs(60), || (staged_bytes(&data, &run.run_id, &job, 1) > 0).then_some(()))
        .expect("upload started");
    a.signal("KILL");
    let _b = server.agent("survivor", &[]).unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(done.status, "success", "{done:#?}");
    let j = &done.jobs[0];
    assert_eq!(j.attempts.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), vec!["lost", "success"]);
    assert_eq!(j.artifacts[0].epoch, 2);
    assert_eq!(j.artifacts[0].size, 50_000_000);
    // The lost session's staged parts are collected, never completed.
    let gone = wait_for(Duration::from_secs(30), || {
        (staged_bytes(&data, &run.run_id, &job, 1) == 0
            && kiln_testkit::files_under(
                &data.join("objects/objects/artifacts").join(&run.run_id).join(&job).join("1"),
            ) == 0)
            .then_some(())
    });
    assert!(gone.is_some(), "epoch 1's partial upload was not collected");
}

/// The server is SIGKILLed mid-run and restarted on the same data: the
/// accepted run, its attempt and its queued successor survive; the agent's
/// held calls land once the server is back; nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_run_loses_nothing() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let wf = format!(
        "version: 1\njobs:\n  - name: a\n    steps:\n      - while [ ! -e {} ]; do sleep 0.05; done; echo a-done\n  - name: b\n    steps: [\"echo b-done\"]\n",
        gate.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("crash", &repo);
    let c = Client::new(&server.url, &server.token);
    let _agent = server.agent("steady", &[]).unwrap();
    let run =
        c.submit_run("crash", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    wait_job(&c, &run.run_id, 0, |j| j.status == "running").await;

    let server = server.kill_and_restart(&[]).unwrap();
    std::fs::write(&gate, "").unwrap();
    let c = Client::new(&server.url, &server.token);
    let done = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(done.status, "success", "{done:#?}\n{}", server.log());
    for j in &done.jobs {
        assert_eq!(j.attempts.len(), 1, "{} ran once: {j:#?}", j.name);
    }
    let logs = server.cli().args(["logs", &run.run_id]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("a-done") && logs.contains("b-done"), "{logs}");
}

/// A graceful stop (SIGTERM) closes every agent's session stream from the
/// server's side: that is no agent loss. Down for several loss graces and
/// restarted, the server keeps the running job on its first attempt; then
/// an agent SIGKILLed while its job runs loses it within the grace.
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_server_restart_is_no_agent_loss() {
    let flags = ["--loss-grace", "200ms", "--retry-base", "100ms"];
    let server = KilnServer::start(BIN.as_ref(), &flags).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let wf = format!(
        "version: 1\njobs:\n  - name: a\n    steps:\n      - while [ ! -e {} ]; do sleep 0.05; done; echo a-done\n",
        gate.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("restart", &repo);
    let c = Client::new(&server.url, &server.token);
    let _agent = server.agent("steady", &[]).unwrap();
    let run =
        c.submit_run("restart", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    wait_job(&c, &run.run_id, 0, |j| j.status == "running").await;

    let server = server.restart("TERM", Duration::from_secs(2), &flags).unwrap();
    // Heartbeats resume against the new process; leave time for a fence.
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(&gate, "").unwrap();
    let c = Client::new(&server.url, &server.token);
    let done = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(done.status, "success", "{done:#?}\n{}", server.log());
    assert_eq!(done.jobs[0].attempts.len(), 1, "a graceful restart fenced the job: {:#?}", done.jobs[0]);
    assert!(!server.log().contains("agent connection lost"), "{}", server.log());
}

/// spec 000 §13: a process writing 1 GB to stdout with a 10 MiB limit
/// finishes normally; the log keeps 10 MiB and carries a truncation marker.
#[tokio::test(flavor = "multi_thread")]
async fn a_gigabyte_of_output_is_truncated_and_the_job_succeeds() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: loud\n    steps:\n      - head -c 1000000000 /dev/zero | tr '\\0' z; echo; echo done\n",
    )])
    .unwrap();
    server.add_repo("loud", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &["--log-limit", "10485760"]).unwrap();
    let run = c.submit_run("loud", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 300).await;
    assert_eq!(done.status, "success", "{done:#?}");
    let logs = server.cli().args(["logs", &run.run_id]).output().unwrap();
    let out = String::from_utf8_lossy(&logs.stdout);
    // The step's output is one run of z's (the step header mentions z too).
    let zs = out.split(|c: char| c != 'z').map(str::len).max().unwrap_or(0);
    assert_eq!(zs, 10 * 1024 * 1024, "exactly the limit is kept");
    assert!(out.contains("truncated: this attempt's output reached its limit of 10485760 bytes"), "marker");
    assert!(
        out.contains(&format!("truncated: {} bytes of output were dropped", 1_000_000_000 + 1 + 5 - 10 * 1024 * 1024))
    );
}

/// The attempt token the server issued for `(job, epoch)`, derived from the
/// data dir's `blob.key` as the server does (what the paused agent holds).
fn epoch_token(data: &std::path::Path, job: &str, epoch: i64) -> String {
    let key = std::fs::read_to_string(data.join("blob.key")).unwrap();
    kiln_server::credentials::AgentKeys::new(key.trim().as_bytes()).attempt_token(job, epoch)
}

/// Issue 40, item 5 (spec 000 §9, §15: a timeout alone cannot certify that
/// execution ended). A run is cancelled while its agent is SIGSTOPped: the
/// lease lapses and the attempt is fenced, but the run stays `cancelling`,
/// saying which agent it waits for, until that agent comes back, kills the
/// sandbox and says so — or, for a second run, until the paused agent is
/// removed.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_waits_for_the_paused_agent_to_confirm_its_sandbox_is_gone() {
    let server = KilnServer::start(BIN.as_ref(), &["--lease-ttl", "2s"]).unwrap();
    let wf = "version: 1\njobs:\n  - name: long\n    steps:\n      - echo started && sleep 600\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("confirm", &repo);
    let c = Client::new(&server.url, &server.token);
    let submit = || async {
        let sub = SubmitRun { commit_sha: "main".into(), ..Default::default() };
        c.submit_run("confirm", &sub, None).await.unwrap().run_id
    };
    let started = |run: String| {
        let logs = server.cli().args(["logs", &run, "long"]).output().unwrap();
        String::from_utf8_lossy(&logs.stdout).contains("started").then_some(())
    };

    // Agent a runs the job; it is paused, and the run cancelled.
    let a = server.agent("agent-a", &[]).unwrap();
    let run = submit().await;
    assert!(wait_for(Duration::from_secs(60), || started(run.clone())).is_some(), "{}", a.log());
    a.signal("STOP");
    assert_eq!(c.cancel_run(&run).await.unwrap().status, "cancelling");
    let r = wait_job(&c, &run, 0, |j| j.attempts.first().is_some_and(|at| at.outcome == "lost")).await;
    assert_eq!(r.status, "cancelling", "fenced, not confirmed: {r:#?}");
    assert_eq!(r.jobs[0].status, "cancelled");
    assert_eq!(r.jobs[0].attempts[0].released_at_ms, None);
    let msg = r.message.clone().unwrap_or_default();
    assert!(msg.contains("waiting for agent agent-a to confirm"), "{msg}");
    // Well past the lease, it still waits.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let r = c.get_run(&run).await.unwrap();
    assert_eq!((r.status.as_str(), r.finished_at_ms), ("cancelling", None), "{r:#?}");

    // a comes back: fenced, it kills the sandbox and says so; the run ends.
    a.signal("CONT");
    let done = wait_run(&c, &run, 60).await;
    assert_eq!(done.status, "cancelled", "{done:#?}\n{}", a.log());
    let at = &done.jobs[0].attempts[0];
    assert!(at.released_at_ms.is_some(), "{at:#?}");
    let how = at.release.clone().unwrap_or_default();
    assert!(how.contains("killed"), "the agent's own evidence: {how}");
    assert!(!done.message.unwrap_or_default().contains("waiting"), "no longer waiting");
    assert!(a.log().contains("sandbox is gone"), "{}", a.log());

    // Agent b is paused for good: its removal ends the wait.
    drop(a);
    let b = server.agent("agent-b", &[]).unwrap();
    let run = submit().await;
    assert!(wait_for(Duration::from_secs(60), || started(run.clone())).is_some(), "{}", b.log());
    b.signal("STOP");
    c.cancel_run(&run).await.unwrap();
    let r = wait_job(&c, &run, 0, |j| j.attempts.first().is_some_and(|at| at.outcome == "lost")).await;
    assert_eq!(r.status, "cancelling");
    let id = c.list_agents().await.unwrap().into_iter().find(|x| x.name == "agent-b").unwrap().id;
    let rm = server.cli().args(["agents", "rm", &id]).output().unwrap();
    assert!(rm.status.success(), "{}", String::from_utf8_lossy(&rm.stderr));
    let done = wait_run(&c, &run, 60).await;
    assert_eq!(done.status, "cancelled", "{done:#?}");
    assert_eq!(done.jobs[0].attempts[0].release.as_deref(), Some("its agent was removed"));
    b.signal("KILL");
}
