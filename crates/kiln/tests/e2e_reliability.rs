//! The reliability layer with real processes and a real full disk (spec
//! 004, "Graceful Degradation"): the server's data directory is a small
//! tmpfs that a test fills while a job streams its log and publishes an
//! artifact. The server reports `critical`, refuses new runs with 503 and
//! `Retry-After`, loses nothing it acknowledged, and recovers by itself
//! when space returns.
//!
//! Mounting a tmpfs needs root (CI runs as root); without it the test
//! skips with a message, unless `KILN_REQUIRE_ROOT=1`.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, step_processes, until, wait_for, wait_run};
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// Unmounts the tmpfs when the test ends (after the server is gone).
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    assert!(std::env::var("KILN_REQUIRE_ROOT").as_deref() != Ok("1"), "KILN_REQUIRE_ROOT=1 but not root");
    eprintln!("SKIPPED: mounting a tmpfs data directory needs root");
    false
}

/// Fill the filesystem of `dir` until a write fails (returns the file).
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.flush();
    path
}

async fn readyz(url: &str) -> (u16, String, Option<String>) {
    let r = reqwest::get(format!("{url}/readyz")).await.unwrap();
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, r.text().await.unwrap(), retry)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_new_runs_loses_nothing_and_recovers() {
    if !root() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(&dir).status().unwrap();
    assert!(ok.success(), "mount tmpfs");
    let _mount = Mount(dir.clone());

    let wf = r#"version: 1
jobs:
  - name: produce
    steps:
      - for i in $(seq 1 400); do echo "line $i of the log"; sleep 0.02; done
      - head -c 524288 /dev/urandom > blob.bin && sha256sum blob.bin | cut -d' ' -f1 > blob.sha
    artifacts:
      publish:
        - {name: blob, path: blob.bin}
        - {name: blob-sha, path: blob.sha}
  - name: consume
    steps:
      - test "$(sha256sum blob.bin | cut -d' ' -f1)" = "$(cat blob.sha)" && echo "artifact intact"
    artifacts:
      restore:
        - {from_job: produce, name: blob, path: blob.bin}
        - {from_job: produce, name: blob-sha, path: blob.sha}
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    let s = KilnServer::start_in(
        BIN.as_ref(),
        data,
        &["--resource-interval", "200ms", "--retry-base", "100ms", "--storage-levels", "80,90,95"],
    )
    .unwrap();
    s.add_repo("disk", &repo);
    let agent = s.agent("disk-agent", &[]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    assert!(readyz(&s.url).await.1.starts_with("ready (degradation: normal"));

    let run = c.submit_run("disk", &body, None).await.unwrap().run_id;
    let logs = |run: &str| {
        let out = s.cli().args(["logs", run, "produce"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_for(Duration::from_secs(60), || logs(&run).contains("line 40 of").then_some(())).expect("the job streams");

    // The disk fills while the job writes its log.
    let filler = fill(&dir);
    let critical = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let r = readyz(&s.url).await;
            if r.0 == 503 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("readyz reports critical");
    assert!(critical.1.contains("degradation: critical"), "{}", critical.1);
    assert!(critical.2.is_some(), "Retry-After on /readyz");
    let e = c.submit_run("disk", &body, None).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert!(e.to_string().contains("critical degradation"), "{e}");
    // Hold the disk full while the job keeps writing (a scenario, not a wait).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Space returns: the server recovers by itself.
    std::fs::remove_file(&filler).unwrap();
    until_ready(&s.url).await;
    let finished = wait_for(Duration::from_secs(120), || {
        let out = s.cli().args(["status", &run, "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        matches!(v["status"].as_str(), Some("success" | "failed" | "cancelled")).then_some(())
    });
    assert!(finished.is_some(), "the run finishes\nagent:\n{}\nserver:\n{}", agent.log(), s.log());
    let done = wait_run(&c, &run, 10).await;
    let text = logs(&run);
    assert_eq!(done.status, "success", "{text}\n{}", s.log());
    // Every line, once, in order: nothing acknowledged was lost.
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("line ")).collect();
    let want: Vec<String> = (1..=400).map(|i| format!("line {i} of the log")).collect();
    assert_eq!(lines, want, "the whole log, in order");
    let consume = s.cli().args(["logs", &run, "consume"]).output().unwrap();
    assert!(String::from_utf8_lossy(&consume.stdout).contains("artifact intact"));
    // New work is accepted again.
    let again = c.submit_run("disk", &body, None).await.unwrap().run_id;
    let _ = until(&c, &again, 120, "accepted and running", |r| r.status != "queued").await;
}

/// Issue 40: at critical degradation a webhook delivery is recorded and
/// answered 202 (forges do not send it again), and a schedule tick that
/// falls due is held, not skipped; when the level drops the push is planned
/// and the held tick fires, once.
#[tokio::test(flavor = "multi_thread")]
async fn triggers_at_critical_degradation_wait_and_run_once_after() {
    if !root() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(&dir).status().unwrap();
    assert!(ok.success(), "mount tmpfs");
    let _mount = Mount(dir.clone());
    let ci = "version: 1\non:\n  push:\n    branches: [main]\njobs:\n  - name: build\n    steps: [echo pushed]\n";
    let nightly =
        "version: 1\non:\n  schedule:\n    - cron: '* * * * *'\njobs:\n  - name: tick\n    steps: [echo ticked]\n";
    let repo = TestRepo::new(&[(".kiln/ci.yaml", ci), (".kiln/nightly.yaml", nightly)]).unwrap();
    let flags = ["--resource-interval", "200ms", "--retry-base", "100ms", "--storage-levels", "80,90,95"];
    let s = KilnServer::start_in(BIN.as_ref(), data, &flags).unwrap();
    const SECRET: &str = "critical-webhook-secret-0123";
    let mut add = s
        .cli()
        .args(["repo", "add", "r", "--url"])
        .arg(repo.path())
        .args(["--forge", "github", "--forge-repo", "acme/widget", "--webhook-secret-file", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    add.stdin.take().unwrap().write_all(SECRET.as_bytes()).unwrap();
    assert!(add.wait().unwrap().success());
    let c = Client::new(&s.url, &s.token);
    let seen = wait_for(Duration::from_secs(60), || s.log().contains("schedule: first seen").then_some(()));
    assert!(seen.is_some(), "{}", s.log());

    // The disk fills (1 MiB left: the database still takes a small row).
    let filler = fill(&dir);
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&filler).unwrap().set_len(len - (1 << 20)).unwrap();
    let critical = tokio::time::timeout(Duration::from_secs(30), async {
        while readyz(&s.url).await.0 != 503 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    critical.await.expect("readyz reports critical");
    let runs = |l: &[kiln_api::RunSummary], e: &str| l.iter().filter(|r| r.event == e).count();
    // (A tick may have fired before the disk filled.)
    let ticks_before = runs(&c.list_runs("r", None, None).await.unwrap().runs, "schedule");

    // A push arrives: recorded, 202.
    let sha = repo.head().unwrap();
    let payload = serde_json::json!({
        "ref": "refs/heads/main", "before": "0".repeat(40), "after": sha, "commits": [],
        "repository": {"full_name": "acme/widget", "id": 1}, "sender": {"login": "dev"}, "pusher": {"name": "dev"},
    });
    let body = serde_json::to_vec(&payload).unwrap();
    let (name, value) = kiln_forge::sign(kiln_forge::Forge::Github, SECRET.as_bytes(), &body);
    let res = reqwest::Client::new()
        .post(format!("{}/v1/repos/r/webhooks/github", s.url))
        .header("X-GitHub-Event", "push")
        .header("X-GitHub-Delivery", "critical-1")
        .header(name, value)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    assert_eq!(status, 202, "{}", res.text().await.unwrap());
    // A tick falls due and is held (the next minute, at most).
    let held = wait_for(Duration::from_secs(90), || s.log().contains("scheduled run waits").then_some(()));
    assert!(held.is_some(), "{}", s.log());
    let list = c.list_runs("r", None, None).await.unwrap().runs;
    assert_eq!((runs(&list, "push"), runs(&list, "schedule")), (0, ticks_before), "nothing at critical: {list:?}");
    let deliveries = s.cli().args(["repo", "deliveries", "r", "--json"]).output().unwrap();
    let deliveries: serde_json::Value = serde_json::from_slice(&deliveries.stdout).unwrap();
    assert_eq!(deliveries[0]["status"], "pending", "{deliveries}");
    assert!(deliveries[0]["message"].as_str().unwrap_or("").contains("critical degradation"), "{deliveries}");

    // Space returns: one push run and one scheduled run.
    std::fs::remove_file(&filler).unwrap();
    until_ready(&s.url).await;
    let mut list = Vec::new();
    for _ in 0..600 {
        list = c.list_runs("r", None, None).await.unwrap().runs;
        if runs(&list, "push") > 0 && runs(&list, "schedule") > ticks_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(runs(&list, "push") > 0 && runs(&list, "schedule") > ticks_before, "{list:?}\n{}", s.log());
    // More trigger rounds (5 s each) fire nothing more for the held tick.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let list = c.list_runs("r", None, None).await.unwrap().runs;
    assert_eq!((runs(&list, "push"), runs(&list, "schedule")), (1, ticks_before + 1), "{list:?}");
}

async fn until_ready(url: &str) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while readyz(url).await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("readyz recovers");
}

/// Graceful drain and preemption of a real agent process (spec 004): on
/// SIGTERM it claims nothing more, lets its running job finish (not
/// killed, one attempt) and exits 0; the next job waits for another agent.
/// On SIGUSR1 it hands its running job back at once: the job runs again on
/// another agent without waiting for the lease to expire.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_and_sigusr1_hands_jobs_back() {
    let wf = r#"version: 1
jobs:
  - name: first
    steps:
      - echo started; sleep 2; echo finished-while-draining
  - name: second
    steps:
      - echo second ran
"#;
    let preempt = r#"version: 1
jobs:
  - name: spot
    steps:
      - if [ "$KILN_EPOCH" = 1 ]; then echo on-epoch-1; sleep 600; fi; echo ran-on-epoch-$KILN_EPOCH
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf), (".kiln/preempt.yaml", preempt)]).unwrap();
    // A long lease: a hand-back that waited for the lease would time the test out.
    let s = KilnServer::start(BIN.as_ref(), &["--lease-ttl", "5m", "--retry-base", "100ms"]).unwrap();
    s.add_repo("drain", &repo);
    let c = Client::new(&s.url, &s.token);
    let logs = |run: &str, job: &str| {
        let out = s.cli().args(["logs", run, job]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let mut a = s.agent("drainer", &[]).unwrap();
    let run =
        c.submit_run("drain", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = run.run_id;
    wait_for(Duration::from_secs(60), || logs(&run, "first").contains("started").then_some(())).expect("first runs");
    a.signal("TERM");
    let code = wait_for(Duration::from_secs(60), || a.child.try_wait().ok().flatten()).expect("the agent exits");
    assert!(code.success(), "exit {code:?}\n{}", a.log());
    let r = c.get_run(&run).await.unwrap();
    assert_eq!(r.jobs[0].status, "success", "the running job finished: {}", a.log());
    assert_eq!(r.jobs[0].attempts.len(), 1);
    assert!(logs(&run, "first").contains("finished-while-draining"));
    assert!(!logs(&run, "second").contains("second ran"), "the drained agent ran nothing more");
    // A claim the drained agent abandoned may still be answered with the
    // next job; that attempt gets the loss grace, not the 5 min lease.
    let b = s.agent("after-drain", &[]).unwrap();
    assert_eq!(wait_run(&c, &run, 60).await.status, "success");
    assert!(logs(&run, "second").contains("second ran"));
    // Only the agent about to be preempted may take the next job.
    drop(b);

    // Preemption: SIGUSR1 hands the job back; another agent runs it at once.
    let spot = s.agent("spot", &[]).unwrap();
    let body =
        SubmitRun { commit_sha: "main".into(), workflow_path: Some(".kiln/preempt.yaml".into()), ..Default::default() };
    let run = c.submit_run("drain", &body, None).await.unwrap().run_id;
    wait_for(Duration::from_secs(60), || logs(&run, "spot").contains("on-epoch-1").then_some(()))
        .expect("epoch 1 runs");
    // The agent that takes the job over, started once `spot` holds it.
    let _rescuer = s.agent("rescuer", &[]).unwrap();
    spot.signal("USR1");
    let done = wait_run(&c, &run, 60).await;
    assert_eq!(done.status, "success", "{}", spot.log());
    assert!(logs(&run, "spot").contains("ran-on-epoch-2"));
    assert_eq!(done.jobs[0].attempts[0].outcome, "failed", "handed back: {:?}", done.jobs[0].attempts);
    assert_eq!(done.jobs[0].attempts[0].failure_class.as_deref(), Some("agent_lost"));
    assert_eq!(done.jobs[0].attempts[1].failure_class, None);
}

/// Spec 004's hang detector and failure classes with a real agent: a job
/// silent for `hang-after` gets a warning in its log, one silent for
/// `hang-kill-after` is killed (its process too) and fails with class
/// `hang`; output resets the silence; a timed-out job is class `timeout`
/// and retried when its `retry: on` names it, a step failure is not.
#[tokio::test(flavor = "multi_thread")]
async fn hangs_are_warned_then_killed_and_timeouts_retried_per_policy() {
    let wf = r#"version: 1
jobs:
  - name: silent
    needs: []
    hang-after: 1s
    hang-kill-after: 3s
    steps:
      - echo started; sleep 600 & wait
  - name: chatty
    needs: []
    hang-after: 1s
    hang-kill-after: 2s
    steps:
      - for i in 1 2 3 4 5 6 7 8; do echo "tick $i"; sleep 0.5; done
  - name: slow
    needs: []
    timeout: 1s
    retry: {max: 1, on: [timeout]}
    steps:
      - sleep 30
  - name: broken
    needs: []
    retry: {max: 2, on: [timeout]}
    steps:
      - exit 3
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    let s = KilnServer::start(BIN.as_ref(), &["--retry-base", "100ms"]).unwrap();
    s.add_repo("hang", &repo);
    let _a = s.agent("hang-agent", &["--max-jobs", "4"]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let logs = |run: &str, job: &str| {
        let out = s.cli().args(["logs", run, job]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let run = c.submit_run("hang", &body, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(done.status, "failed");
    let job = |name: &str| done.jobs.iter().find(|j| j.name == name).unwrap();
    let classes = |name: &str| job(name).attempts.iter().map(|a| a.failure_class.clone()).collect::<Vec<_>>();

    let silent = logs(&run.run_id, "silent");
    assert!(silent.contains("⚠ hang: no output for 1s; it is killed after 3s without output"), "{silent}");
    assert!(silent.contains("hang: no output for 3s; the job is killed"), "{silent}");
    assert_eq!(silent.matches("⚠ hang").count(), 1, "one warning per silence: {silent}");
    let j = job("silent");
    assert_eq!(j.status, "failed");
    assert_eq!(classes("silent"), [Some("hang".to_string())], "`hang` is not retried by default");
    assert_eq!(j.attempts[0].exit_code, Some(124));
    assert!(j.attempts[0].message.as_deref().unwrap_or("").contains("hang: no output for 3s"), "{:?}", j.attempts);
    // The step's own `sleep 600` child was killed with it (the run is over:
    // no step process of it is left).
    let left = wait_for(Duration::from_secs(10), || step_processes(&run.run_id).is_empty().then_some(()));
    assert!(left.is_some(), "step processes left: {:?}", step_processes(&run.run_id));

    assert_eq!(job("chatty").status, "success", "output resets the silence: {}", logs(&run.run_id, "chatty"));
    assert!(!logs(&run.run_id, "chatty").contains("hang:"));

    assert_eq!(job("slow").status, "failed");
    assert_eq!(classes("slow"), [Some("timeout".to_string()), Some("timeout".to_string())], "retried once on timeout");
    assert!(job("slow").attempts.iter().all(|a| a.exit_code == Some(124)));

    assert_eq!(classes("broken"), [Some("step_failed".to_string())], "a step failure is not in `on`");
    assert_eq!(job("broken").attempts[0].exit_code, Some(3));
}

/// The queue timeout with a real server and agent: a job whose `runs-on`
/// no connected agent has fails after `--queue-timeout`, naming the labels
/// and the agents there are; its run ends `failed`.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_no_agent_can_take_fails_at_the_queue_timeout() {
    let wf = "version: 1\njobs:\n  - name: build\n    runs-on: {os: ubuntu-latest}\n    steps: [echo never]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    let s = KilnServer::start(BIN.as_ref(), &["--queue-timeout", "2s"]).unwrap();
    s.add_repo("stuck", &repo);
    let _a = s.agent("linux-agent", &["--labels", "os=linux"]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let run = c.submit_run("stuck", &body, None).await.unwrap().run_id;
    let done = wait_run(&c, &run, 60).await;
    assert_eq!(done.status, "failed");
    let m = done.jobs[0].message.clone().unwrap_or_default();
    assert!(m.starts_with("queue timeout: no agent claimed the job within 2s"), "{m}");
    assert!(m.contains("no connected agent has labels {os: ubuntu-latest}; agents: linux-agent"), "{m}");
    assert!(done.jobs[0].attempts.is_empty());
}

/// The run-level timeout (spec 004's hierarchy): the server's
/// `--run-timeout` applies to a workflow without a top-level `timeout`, and
/// cancels the run — its running attempt killed and classed `cancelled`
/// (never retried), its waiting jobs cancelled — saying why; a workflow's
/// own `timeout` replaces the default.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_past_its_timeout_is_cancelled_with_every_job() {
    let stuck = r#"version: 1
jobs:
  - name: forever
    needs: []
    retry: 3
    steps: [sleep 600]
  - name: after
    needs: [forever]
    steps: [echo never]
  - name: unclaimable
    needs: []
    runs-on: {os: nowhere}
    steps: [echo never]
"#;
    let own = "version: 1\ntimeout: 1h\njobs:\n  - name: slow\n    steps: [sleep 4, echo done]\n";
    let repo = TestRepo::new(&[(".kiln/stuck.yaml", stuck), (".kiln/own.yaml", own)]).unwrap();
    let s = KilnServer::start(BIN.as_ref(), &["--run-timeout", "2s"]).unwrap();
    s.add_repo("timeouts", &repo);
    let _a = s.agent("a1", &[]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let submit =
        |path: &str| SubmitRun { commit_sha: "main".into(), workflow_path: Some(path.into()), ..Default::default() };
    let stuck_run = c.submit_run("timeouts", &submit(".kiln/stuck.yaml"), None).await.unwrap().run_id;
    let own_run = c.submit_run("timeouts", &submit(".kiln/own.yaml"), None).await.unwrap().run_id;

    let done = wait_run(&c, &stuck_run, 60).await;
    assert_eq!(done.status, "cancelled", "{done:?}");
    let m = done.message.clone().unwrap_or_default();
    assert!(m.contains("timed out after 2s"), "{m}");
    let forever = &done.jobs[0];
    assert_eq!(forever.status, "cancelled");
    assert_eq!(forever.attempts.len(), 1, "a timed-out run is not retried: {:?}", forever.attempts);
    assert_eq!(forever.attempts[0].failure_class.as_deref(), Some("cancelled"));
    assert_eq!(done.jobs[1].status, "cancelled");
    assert_eq!(done.jobs[2].status, "cancelled");
    assert!(done.jobs[2].attempts.is_empty());
    assert!(step_processes(&stuck_run).is_empty(), "the step's processes were killed");

    // Its own `timeout: 1h` outlives the server's 2 s default.
    let done = wait_run(&c, &own_run, 60).await;
    assert_eq!(done.status, "success", "{done:?}");
}

/// Spec 004's stage timeout for finalizing: the steps are done, but the
/// artifact upload stalls (the server is SIGSTOPped); past the agent's
/// `--finalize-timeout` the attempt stops and, once the server answers
/// again, completes as `timeout` (exit 124) naming the stage and the flag.
/// Nothing of the stalled upload is bound.
#[tokio::test(flavor = "multi_thread")]
async fn finalizing_longer_than_the_finalize_timeout_fails_as_timeout() {
    stalled_upload_times_out(
        &["--finalize-timeout", "2s"],
        "stage timed out",
        &["finalizing the job", "took longer than 2s", "--finalize-timeout"],
    )
    .await;
}

/// Spec 004's operation timeout for an artifact upload: the same stalled
/// upload, stopped by `--upload-timeout` (the stage's limit is far off),
/// fails as `timeout` naming the artifact and the flag.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_longer_than_the_upload_timeout_fails_as_timeout() {
    stalled_upload_times_out(
        &["--upload-timeout", "2s"],
        "uploading artifact `out` took longer than 2s",
        &["uploading artifact `out` took longer than 2s", "(kiln agent --upload-timeout)"],
    )
    .await;
}

/// A job's steps produce a 4 MiB artifact; the server is SIGSTOPped while
/// it is uploaded; the agent runs with `agent_args`, logs `gave_up` when it
/// stops waiting, and the attempt's message then has every `expected`.
async fn stalled_upload_times_out(agent_args: &[&str], gave_up: &str, expected: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    // Steps run as an unprivileged user: the marker directory is theirs too.
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let (ready, go) = (tmp.path().join("ready"), tmp.path().join("go"));
    let wf = format!(
        r#"version: 1
jobs:
  - name: publish
    steps:
      - head -c 4194304 /dev/urandom > out.bin
      - touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done
    artifacts:
      publish:
        - {{name: out, path: out.bin}}
"#,
        ready = ready.display(),
        go = go.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    s.add_repo("finalize", &repo);
    let agent = s.agent("a1", agent_args).unwrap();
    let c = Client::new(&s.url, &s.token);
    let run =
        c.submit_run("finalize", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let ran = wait_for(Duration::from_secs(60), || ready.exists().then_some(()));
    assert!(ran.is_some(), "the steps ran: {}\n{}", agent.log(), s.log());
    let pid = nix::unistd::Pid::from_raw(s.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::fs::write(&go, "").unwrap();
    // Until the agent has given up on the upload (it says so in its own log).
    let stopped = wait_for(Duration::from_secs(60), || agent.log().contains(gave_up).then_some(()));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(stopped.is_some(), "{}", agent.log());
    let done = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(done.status, "failed", "{done:?}");
    let a = &done.jobs[0].attempts[0];
    assert_eq!(a.failure_class.as_deref(), Some("timeout"), "{a:?}");
    assert_eq!(a.exit_code, Some(124), "{a:?}");
    let message = a.message.clone().unwrap_or_default();
    for e in expected {
        assert!(message.contains(e), "{e:?} in {message}");
    }
    assert_eq!(done.jobs[0].attempts.len(), 1, "{:?}", done.jobs[0].attempts);
    assert!(c.artifact(&run.run_id, "publish", "out").await.is_err(), "a timed-out attempt binds nothing");
}

/// `--memory-levels`: with less memory available than the critical level
/// the server reports `critical` on `/readyz` (naming the memory) and
/// refuses new runs with 503 + `Retry-After`; levels that increase are
/// refused at start, and nothing starts.
#[tokio::test(flavor = "multi_thread")]
async fn memory_below_the_critical_level_refuses_new_runs() {
    let levels = "1000TiB,1000TiB,1000TiB";
    let s = KilnServer::start(BIN.as_ref(), &["--resource-interval", "200ms", "--memory-levels", levels]).unwrap();
    let repo =
        TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [\"true\"]\n")]).unwrap();
    s.add_repo("mem", &repo);
    let (status, body, retry) = readyz(&s.url).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("degradation: critical") && body.contains("MiB of memory available"), "{body}");
    assert!(retry.is_some(), "Retry-After on /readyz");
    let c = Client::new(&s.url, &s.token);
    let e =
        c.submit_run("mem", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    let runs = c.list_runs("mem", None, None).await.unwrap();
    assert!(runs.runs.is_empty(), "nothing was stored: {:?}", runs.runs);

    let out = Command::new(BIN)
        .args(["server", "--memory-levels", "1GiB,2GiB,3GiB", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("must not increase"), "{out:?}");
}
