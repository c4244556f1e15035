//! Logs end to end (spec 000 §13) with real `kiln server` and `kiln agent`
//! processes: archival of finished logs to the object store, replay across
//! archival, and the journal trimmed only after the archive is stored.

use futures::StreamExt;
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_for, wait_run};
use std::path::Path;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn segments(data: &Path, job: &str) -> Vec<std::path::PathBuf> {
    let dir = data.join("objects/objects/logs").join(job);
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "seg")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

async fn events(c: &Client, job: &str, last: Option<&str>) -> Vec<(String, String, String)> {
    let s = c.log_events(job, last).await.unwrap();
    let evs: Vec<_> = tokio::time::timeout(Duration::from_secs(30), s.map(|e| e.unwrap()).collect::<Vec<_>>())
        .await
        .expect("the stream ends");
    evs.into_iter().map(|e| (e.id, e.event, e.data)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn finished_logs_move_to_the_object_store_and_replay_identically() {
    let server = KilnServer::start(BIN.as_ref(), &["--log-archive-after", "300ms"]).unwrap();
    let data = server.data_dir();
    // Archival will fail at first: the object store cannot create the
    // directory its staging files go to.
    std::fs::create_dir_all(data.join("objects/staging")).unwrap();
    std::fs::write(data.join("objects/staging/logs"), "not a directory").unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: loud\n    steps:\n      - seq 1 40000\n      - echo warning >&2\n      - seq 40001 80000\n",
    )])
    .unwrap();
    server.add_repo("loud", &repo);
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("loud", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id, 60).await;
    assert_eq!(run.status, "success");
    let job = run.jobs[0].id.clone();
    let before = events(&c, &job, None).await;
    assert_eq!(before.last().unwrap().1, "end");
    assert!(before.iter().any(|e| e.1 == "sealed"), "the completed attempt's log is sealed");
    let rows = kiln_testkit::journal_rows(&data, &job);
    assert!(rows > 3, "{rows}");

    // The archiver tries and fails: the journal keeps every row.
    wait_for(Duration::from_secs(20), || server.log().contains("cannot archive log").then_some(()))
        .expect("archival attempted");
    assert_eq!(kiln_testkit::journal_rows(&data, &job), rows, "nothing trimmed while the archive cannot be stored");
    assert_eq!(events(&c, &job, None).await, before);

    // The store recovers: the log is archived, then trimmed from the journal.
    std::fs::remove_file(data.join("objects/staging/logs")).unwrap();
    wait_for(Duration::from_secs(20), || (kiln_testkit::journal_rows(&data, &job) == 0).then_some(()))
        .expect("journal trimmed");
    let segs = segments(&data, &job);
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert!(segs[0].with_extension("idx.json").exists());
    assert!(std::fs::metadata(&segs[0]).unwrap().permissions().readonly(), "segments are immutable");

    // Replay from the archive: the same events with the same ids, and a
    // resume from the middle yields exactly the rest.
    let after = events(&c, &job, None).await;
    assert_eq!(after, before);
    let mid = &before[before.len() / 2].0;
    let resumed = events(&c, &job, Some(mid)).await;
    assert_eq!(resumed[..], before[before.len() / 2 + 1..]);
    let out = server.cli().args(["logs", &r.run_id]).output().unwrap();
    let numbers: Vec<u32> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(numbers, (1..=80000).collect::<Vec<u32>>(), "kiln logs reads the archive");

    // A damaged segment is never served as the log: the stream stops short
    // of its end marker instead.
    let seg = &segs[0];
    let mut perms = std::fs::metadata(seg).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(seg, perms).unwrap();
    let mut bytes = std::fs::read(seg).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(seg, bytes).unwrap();
    let damaged = events(&c, &job, None).await;
    assert!(damaged.iter().all(|e| e.1 != "end"), "a corrupt archive must not end cleanly");
    assert!(server.log().contains("corrupt"), "{}", server.log());
}

/// Every byte of a job's log, all streams, in event order.
async fn log_text(c: &Client, job: &str) -> String {
    use base64::Engine;
    let mut out = Vec::new();
    for (_, ev, data) in events(c, job, None).await {
        if ev == "chunk" {
            let le: kiln_api::LogEvent = serde_json::from_str(&data).unwrap();
            out.extend(base64::engine::general_purpose::STANDARD.decode(le.data).unwrap());
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_reach_the_job_and_are_masked_in_its_log() {
    use base64::Engine;
    const VALUE: &str = "tok-3f9a-SECRET-77";
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: deploy\n    secrets: [DEPLOY_TOKEN]\n    steps:\n      - test \"$DEPLOY_TOKEN\" = \"tok-3f9a-SECRET-77\"\n      - echo \"token is $DEPLOY_TOKEN\"\n      - printf %s \"$DEPLOY_TOKEN\" | base64\n      - \"printf 'split: tok-3f9a-'; sleep 0.5; printf 'SECRET-77 end\\\\n'\"\n      - echo \"to stderr $DEPLOY_TOKEN\" >&2\n",
    )])
    .unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);

    // Asking for a secret the repository lacks refuses the run.
    let out = server.cli().args(["run", "--repo", "app", "--commit", "main"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not have: DEPLOY_TOKEN"), "{err}");
    assert!(c.list_runs("app", None, Some(10)).await.unwrap().runs.is_empty(), "nothing stored");

    let mut set = server
        .cli()
        .args(["secret", "set", "app", "DEPLOY_TOKEN"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(set.stdin.as_mut().unwrap(), format!("{VALUE}\n").as_bytes()).unwrap();
    assert!(set.wait().unwrap().success());
    let listed = server.cli().args(["secret", "list", "app"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.trim(), "DEPLOY_TOKEN", "names only");

    let r = c.submit_run("app", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id, 60).await;
    assert_eq!(run.status, "success", "the job saw the value: {run:#?}");
    let text = log_text(&c, &run.jobs[0].id).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(VALUE);
    assert!(!text.contains(VALUE) && !text.contains("3f9a-SECRET") && !text.contains(&b64), "{text}");
    assert!(text.contains("token is ***"), "{text}");
    assert!(text.contains("split: *** end"), "a value split across writes is masked: {text}");
    assert!(text.contains("to stderr ***"), "{text}");
    let raw = reqwest::Client::new()
        .get(format!("{}/v1/workflow-runs/{}", server.url, r.run_id))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!raw.contains(VALUE), "the API never shows the value");
}

/// Requests to an agent log route answered 200, from the server's
/// `kiln_http_request_duration_seconds` histogram.
async fn log_requests(server: &KilnServer, route: &str) -> u64 {
    let text = kiln_testkit::metrics_text(&server.url, &server.token).await;
    text.lines()
        .filter(|l| l.starts_with("kiln_http_request_duration_seconds_count{"))
        .filter(|l| l.contains(&format!("route=\"{route}\"")) && l.contains("status=\"200\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Issue 47, item 3: a short job's small chunks cut together (its stdout
/// and stderr at the step's end, its last `system` lines) leave in one
/// `…/logs/batch` request, committed in one transaction, instead of one
/// request and one transaction each; the log reads as it was written.
#[tokio::test(flavor = "multi_thread")]
async fn a_short_jobs_small_chunks_leave_in_fewer_requests_than_chunks() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: short\n    steps:\n      - \"printf 'to out\\\\n'; printf 'to err\\\\n' >&2\"\n",
    )])
    .unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    let mut chunks = 0;
    for _ in 0..3 {
        let r =
            c.submit_run("app", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let run = wait_run(&c, &r.run_id, 60).await;
        assert_eq!(run.status, "success", "{run:#?}");
        let job = &run.jobs[0].id;
        let text = log_text(&c, job).await;
        assert!(text.contains("to out\n") && text.contains("to err\n"), "{text}");
        let out_at = text.find("to out").unwrap();
        assert!(text.find("✓ step 1/1").is_some_and(|ok| ok > out_at), "the step's end after its output: {text}");
        chunks += events(&c, job, None).await.iter().filter(|(_, ev, _)| ev == "chunk").count() as u64;
    }
    let batches = log_requests(&server, "/v1/jobs/{job}/attempts/{epoch}/logs/batch").await;
    let singles = log_requests(&server, "/v1/jobs/{job}/attempts/{epoch}/logs").await;
    assert!(batches >= 1, "no batch: {singles} single requests for {chunks} chunks");
    assert!(batches + singles < chunks, "{batches} batches and {singles} single requests for {chunks} chunks");
}

fn signal(pid: u32, sig: &str) {
    assert!(
        std::process::Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success()
    );
}

/// The log's numbered lines (`seq 1 n`) are all there, once each, in
/// order, and nothing was dropped.
fn assert_counts_to(text: &str, n: usize) {
    let numbers: Vec<u32> = text.lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(numbers.len(), n, "nothing lost");
    if let Some(i) = numbers.iter().enumerate().position(|(i, &n)| n != i as u32 + 1) {
        panic!("out of order at line {i}: {:?}", &numbers[i.saturating_sub(3)..(i + 3).min(numbers.len())]);
    }
    assert!(!text.contains("dropped"), "nothing dropped");
}

/// The server stops answering (SIGSTOP) while a step writes 20 MB: the
/// agent keeps draining the pipe into its on-disk spool, the step finishes,
/// and once the server is back every byte arrives, in order.
#[tokio::test(flavor = "multi_thread")]
async fn output_spools_to_disk_while_the_server_is_unreachable() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let agent = server.agent("a1", &["--log-buffer", "65536"]).unwrap();
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let (go, done) = (flags.path().join("go"), flags.path().join("done"));
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        &format!(
            "version: 1\njobs:\n  - name: loud\n    steps:\n      - while [ ! -f {go} ]; do sleep 0.05; done\n      - seq 1 3000000\n      - touch {done}\n",
            go = go.display(),
            done = done.display()
        ),
    )])
    .unwrap();
    server.add_repo("loud", &repo);
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("loud", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let job = wait_for(Duration::from_secs(30), || {
        let run = futures::executor::block_on(c.get_run(&r.run_id)).ok()?;
        (run.jobs[0].status == "running").then(|| run.jobs[0].id.clone())
    })
    .expect("job running");
    tokio::time::sleep(Duration::from_millis(300)).await;

    signal(server.child.id(), "STOP");
    std::fs::write(&go, "").unwrap();
    let finished = wait_for(Duration::from_secs(20), || done.exists().then_some(()));
    let spool = agent.work_dir().join("attempts").join(format!("{job}-1")).join("log-spool/stdout.spool");
    let spooled = std::fs::metadata(&spool).map(|m| m.len()).unwrap_or(0);
    signal(server.child.id(), "CONT");
    finished.expect("the step finished while the server was stopped: its pipe never filled");
    assert!(spooled > 1_000_000, "output waited on disk ({spooled} bytes in {})", spool.display());

    let run = wait_run(&c, &r.run_id, 120).await;
    assert_eq!(run.status, "success", "{run:#?}");
    let text = log_text(&c, &job).await;
    // The combined view keeps the step header after the step's output.
    let header = text.find("▶ step 3/3").expect("third step header");
    // ...and after step 2's own outcome line.
    let mut before = text[..header].lines().rev();
    let shown = &text[header.saturating_sub(200)..header + 20];
    assert!(before.next().is_some_and(|l| l.starts_with("✓ step 2/3")), "{shown}");
    assert_eq!(before.next(), Some("3000000"), "{shown}");
    assert_counts_to(&text, 3_000_000);
}

/// A step writing faster than its output is shipped, with a small memory
/// buffer (`--log-buffer`), is held back by its pipe while the server keeps
/// taking chunks: every line arrives once, in order, nothing is dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_loud_step_waits_for_its_log() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &["--log-buffer", "65536"]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: loud\n    steps:\n      - seq 1 2000000\n",
    )])
    .unwrap();
    server.add_repo("loud", &repo);
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("loud", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id, 120).await;
    assert_eq!(run.status, "success", "{run:#?}");
    let text = log_text(&c, &run.jobs[0].id).await;
    assert_counts_to(&text, 2_000_000);
}

/// Issue 20: a step leads a session of its own, which on a kernel with
/// scheduler autogroups is a scheduling group of its own, at nice 0 unless
/// the agent sets it: an agent started with `nice -n 7` runs its steps at
/// nice 7, their session included, not at the weight of a whole session
/// beside the server sharing its host. `--step-nice 19` (issue 47) runs
/// them at nice 19, session included; a floor below the agent's own
/// changes nothing. (Steps run at 19 by default; `--step-nice 0` keeps
/// the agent's own.)
#[tokio::test(flavor = "multi_thread")]
async fn a_niced_agents_steps_keep_its_priority_in_their_own_session() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: prio\n    steps:\n      - echo \"process-nice $(nice)\"; cat /proc/self/autogroup 2>/dev/null || echo no-autogroups\n",
    )])
    .unwrap();
    server.add_repo("prio", &repo);
    let c = Client::new(&server.url, &server.token);
    // (agent, its own nice value, its flags, the steps' nice value): by
    // default steps run at 19 (issue 47: a server sharing the machine comes
    // first); `--step-nice` lowers them, never raises them, and 0 keeps
    // the agent's own.
    let own: &[&str] = &["--step-nice", "0"];
    let floor: &[&str] = &["--step-nice", "3"];
    for (name, nice, extra, want) in
        [("niced", Some(7), floor, 7), ("default", None, &[][..], 19), ("own", None, own, 0)]
    {
        let agent = match nice {
            Some(n) => server.agent_niced(name, extra, n).unwrap(),
            None => server.agent(name, extra).unwrap(),
        };
        let r =
            c.submit_run("prio", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let run = wait_run(&c, &r.run_id, 60).await;
        assert_eq!(run.status, "success", "{run:#?}");
        let text = log_text(&c, &run.jobs[0].id).await;
        drop(agent);
        assert!(text.contains(&format!("process-nice {want}\n")), "{name}: {text}");
        if text.contains("no-autogroups") {
            eprintln!("this kernel has no scheduler autogroups: only the process nice value is checked");
            continue;
        }
        assert!(text.contains(&format!(" nice {want}\n")), "the step's session is at nice {want}: {text}");
        // A group of its own (the step leads its session), not the agent's.
        // A process still in the boot session (as a CI runner may start the
        // tests) is in the root group, whose file is empty: any autogroup
        // the step shows is then one of its own.
        let agent_group = std::fs::read_to_string(format!("/proc/{}/autogroup", std::process::id())).unwrap();
        assert!(text.contains("/autogroup-"), "the step is in an autogroup: {text}");
        if let Some(group) = agent_group.split_whitespace().next() {
            assert!(!text.contains(&format!("{group} ")), "{text} vs the test's {agent_group}");
        }
    }
}

/// Output faster than the agent's byte-rate limit is drained and dropped,
/// the step ends normally, and the log marks the gap.
#[tokio::test(flavor = "multi_thread")]
async fn output_over_the_rate_limit_is_dropped_with_a_gap_marker() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &["--log-rate-limit", "1000000"]).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: flood\n    steps:\n      - head -c 300000000 /dev/zero\n      - echo after the flood\n",
    )])
    .unwrap();
    server.add_repo("flood", &repo);
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("flood", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id, 120).await;
    assert_eq!(run.status, "success", "{run:#?}");
    let text = log_text(&c, &run.jobs[0].id).await;
    assert!(text.contains("after the flood"));
    assert!(
        text.contains("bytes of output dropped here: faster than this agent's log rate limit of 1000000 bytes/s"),
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(text.len() < 100_000_000, "most of the flood was dropped: {}", text.len());
}

/// A job held running by a real agent (its step waits for `done`), whose
/// stdout a test writes as the attempt would, with the attempt's token.
struct HeldJob {
    /// Dropped first (fields drop in order): the agent stops before its
    /// job's repository and flag directory go.
    _agent: kiln_testkit::KilnAgent,
    /// The repository the job checks out (a retry checks out again).
    _repo: TestRepo,
    _flag: tempfile::TempDir,
    done: std::path::PathBuf,
    run_id: String,
    job: String,
    token: String,
}

/// Starts a [`HeldJob`] in repository `name` of `server`, once it runs.
async fn hold_a_job(server: &KilnServer, name: &str) -> HeldJob {
    let flag = kiln_testkit::step_writable_tempdir().unwrap();
    let done = flag.path().join("done");
    // The job only waits (it prints nothing to stdout itself).
    let wf = format!(
        "version: 1\njobs:\n  - name: hold\n    steps:\n      - while [ ! -e {} ]; do sleep 0.1; done\n",
        done.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo(name, &repo);
    let agent = server.agent("holder", &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run(name, &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let mut job = None;
    for _ in 0..1200 {
        let run = c.get_run(&r.run_id).await.unwrap();
        if run.jobs[0].status == "running" && run.jobs[0].current_epoch == 1 {
            job = Some(run.jobs[0].id.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let job = job.expect("the job runs");
    let key = std::fs::read_to_string(server.data_dir().join("blob.key")).unwrap();
    let token = kiln_server::credentials::AgentKeys::new(key.trim().as_bytes()).attempt_token(&job, 1);
    HeldJob { _repo: repo, _flag: flag, done, _agent: agent, run_id: r.run_id, job, token }
}

/// Issue 20: an agent keeps several chunks of a stream in flight, and one of
/// them can be refused for a while (a full server disk) and retried later.
/// Against a real server process, as the attempt itself (its token): a
/// chunk whose predecessor has not been committed is answered 503
/// (retryable) and commits nothing, however often it is tried, until the
/// predecessor gets through; six chunks tried all at once in reverse order,
/// each retried while refused, still commit in offset order. The reader
/// (SSE, as the web UI reads it) sees every line once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_chunk_retried_later_still_commits_before_the_chunks_sent_after_it() {
    use sha2::{Digest, Sha256};
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let held = hold_a_job(&server, "order").await;
    let (done, job, token) = (&held.done, held.job.clone(), held.token.clone());
    let c = Client::new(&server.url, &server.token);
    let attempt = Client::new(&server.url, &token);
    let line = |i: usize| format!("line {i:02}\n");
    let chunk = |i: usize| {
        let data = line(i);
        kiln_api::RawLogChunk {
            stream: "stdout".into(),
            seq: i as i64,
            offset: (i * data.len()) as i64,
            sha256: Some(hex::encode(Sha256::digest(data.as_bytes()))),
            crc32c: None,
            data: data.into_bytes().into(),
            in_order: true,
        }
    };
    // Chunk 1 is tried while chunk 0 is "refused" (not sent yet): 503,
    // retryable, every time, and nothing of it is committed.
    for _ in 0..3 {
        let e = attempt.append_log_raw(&job, 1, &chunk(1)).await.unwrap_err();
        assert_eq!(e.status(), Some(503), "{e}");
        assert!(e.is_retryable(), "{e}");
    }
    // As the agent does: chunk 1 keeps being retried while chunk 0's retry
    // finally gets through.
    let send = |i: usize| {
        let (attempt, job, c) = (attempt.clone(), job.clone(), chunk(i));
        tokio::spawn(async move {
            for _ in 0..600 {
                match attempt.append_log_raw(&job, 1, &c).await {
                    Ok(ack) => return ack,
                    Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
                    Err(e) => panic!("chunk {} refused: {e}", c.seq),
                }
            }
            panic!("chunk {} never committed", c.seq)
        })
    };
    let second = send(1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(attempt.append_log_raw(&job, 1, &chunk(0)).await.unwrap().committed["stdout"], 8);
    assert_eq!(second.await.unwrap().committed["stdout"], 16);
    // Six more at once, the last first.
    let tasks: Vec<_> = (2..8).rev().map(send).collect();
    for t in tasks {
        t.await.unwrap();
    }
    // An identical retry is still accepted.
    assert_eq!(attempt.append_log_raw(&job, 1, &chunk(3)).await.unwrap().committed["stdout"], 64);
    std::fs::write(done, "").unwrap();
    let run = wait_run(&c, &held.run_id, 60).await;
    assert_eq!(run.status, "success");
    let mut offsets = vec![];
    for (_, ev, data) in events(&c, &job, None).await {
        if ev == "chunk" {
            let le: kiln_api::LogEvent = serde_json::from_str(&data).unwrap();
            if le.stream == "stdout" {
                offsets.push(le.offset);
            }
        }
    }
    assert_eq!(offsets, (0..8).map(|i| i * 8).collect::<Vec<_>>(), "events follow the offsets");
    let want: String = (0..8).map(line).collect();
    assert!(log_text(&c, &job).await.contains(&want), "every line once, in order");
}

/// Issue 20, durability under the fast path: a real server process is
/// SIGKILLed while bulk chunks (256 KiB) of one stream are in flight, sent
/// as an agent sends them (eight at once, in order, checked by CRC-32C,
/// retried while refused with 503, with the attempt's token). Restarted on
/// the same data, it replays every chunk it acknowledged before the kill,
/// byte for byte at its offset, before anything is sent again; then the
/// chunks whose answers were lost are sent again (identical retries where
/// the old process had committed them), and the log holds every byte once,
/// in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_sigkilled_mid_stream_keeps_every_acknowledged_byte() {
    use base64::Engine;
    use std::sync::{Arc, Mutex};
    const CHUNK: usize = 256 * 1024;
    const N: usize = 48;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let held = hold_a_job(&server, "durable").await;
    let (done, job, token) = (&held.done, held.job.clone(), held.token.clone());
    let attempt = Client::new(&server.url, &token);
    // Chunk i: 64-byte lines naming the chunk and the line.
    fn bytes(i: usize) -> Vec<u8> {
        (0..CHUNK / 64).flat_map(|l| format!("chunk {i:04} line {l:05} {:>41}\n", "").into_bytes()).collect()
    }
    fn chunk(i: usize) -> kiln_api::RawLogChunk {
        kiln_api::RawLogChunk {
            stream: "stdout".into(),
            seq: i as i64,
            offset: (i * CHUNK) as i64,
            sha256: None,
            crc32c: Some(kiln_api::types::log_crc32c(&bytes(i))),
            data: bytes(i).into(),
            in_order: true,
        }
    }
    assert_eq!(bytes(3).len(), CHUNK);

    // Eight in flight, each retried while the server answers "not yet"
    // (503: its predecessor is still on its way), as the agent does; the
    // acknowledged ones are noted. The server is SIGKILLed as chunk KILL_AT
    // would be sent: at least KILL_AT - 8 chunks are acknowledged by then,
    // and the rest of the window is in flight.
    const KILL_AT: usize = 16;
    let acked: Arc<Mutex<Vec<(usize, i64)>>> = Arc::default();
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = server.child.id().to_string();
    let sender = {
        let (attempt, job, acked, killed) = (attempt.clone(), job.clone(), acked.clone(), killed.clone());
        tokio::spawn(async move {
            futures::stream::iter(0..N)
                .map(|i| {
                    let (attempt, job, acked, killed, pid) =
                        (attempt.clone(), job.clone(), acked.clone(), killed.clone(), pid.clone());
                    async move {
                        use std::sync::atomic::Ordering::SeqCst;
                        if i == KILL_AT {
                            killed.store(true, SeqCst);
                            let st = std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap();
                            assert!(st.success(), "kill -KILL {pid}");
                        }
                        for tries in 0.. {
                            if killed.load(SeqCst) {
                                return;
                            }
                            assert!(tries < 3000, "chunk {i} was never committed");
                            match attempt.append_log_raw(&job, 1, &chunk(i)).await {
                                Ok(ack) => {
                                    acked.lock().unwrap().push((i, ack.committed["stdout"]));
                                    return;
                                }
                                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
                                Err(_) if killed.load(SeqCst) => return,
                                Err(e) => panic!("chunk {i} refused before the kill: {e}"),
                            }
                        }
                    }
                })
                .buffer_unordered(8)
                .collect::<Vec<()>>()
                .await
        })
    };
    sender.await.unwrap();
    let server = tokio::task::spawn_blocking(move || server.kill_and_restart(&[])).await.unwrap().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!((KILL_AT - 8..=KILL_AT).contains(&acked.len()), "{} acknowledged", acked.len());
    eprintln!("{} of {N} chunks acknowledged before the kill", acked.len());
    // In order: what was acknowledged is a prefix of the stream, and each
    // acknowledgement names a committed end at or past its chunk.
    let end = acked.iter().map(|&(_, committed)| committed).max().unwrap() as usize;
    for &(i, committed) in &acked {
        assert!(committed as usize >= (i + 1) * CHUNK, "chunk {i} acked at {committed}");
    }
    assert_eq!(end % CHUNK, 0);

    // Before anything is sent again: the restarted server replays the
    // acknowledged prefix, byte for byte.
    let c = Client::new(&server.url, &server.token);
    let want: Vec<u8> = (0..end / CHUNK).flat_map(bytes).collect();
    let mut got = Vec::new();
    {
        let events = c.log_events(&job, None).await.unwrap();
        tokio::pin!(events);
        while got.len() < end {
            let ev = tokio::time::timeout(Duration::from_secs(30), events.next())
                .await
                .unwrap_or_else(|_| panic!("replay stopped at {} of the {end} acknowledged bytes", got.len()))
                .expect("the feed stays open while the job runs")
                .unwrap();
            if ev.event == "chunk" {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data).unwrap();
                if le.stream == "stdout" {
                    assert_eq!(le.offset as usize, got.len(), "chunks replay in offset order, without holes");
                    got.extend(base64::engine::general_purpose::STANDARD.decode(le.data).unwrap());
                }
            }
        }
    }
    assert!(got.len() >= end);
    assert!(got[..end] == want[..], "the acknowledged bytes after the kill differ from those sent");

    // Everything again from the first chunk not acknowledged, retried until
    // it commits (an identical retry where the old process had committed
    // it without its answer getting out).
    let attempt = Client::new(&server.url, &token);
    for i in end / CHUNK..N {
        let mut tries = 0;
        loop {
            match attempt.append_log_raw(&job, 1, &chunk(i)).await {
                Ok(ack) => {
                    assert_eq!(ack.committed["stdout"] as usize, (i + 1) * CHUNK);
                    break;
                }
                Err(e) if e.is_retryable() && tries < 200 => tries += 1,
                Err(e) => panic!("chunk {i} after the restart: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    std::fs::write(done, "").unwrap();
    let run = wait_run(&c, &held.run_id, 60).await;
    assert_eq!(run.status, "success", "{run:#?}");
    let mut stdout = Vec::new();
    for (_, ev, data) in events(&c, &job, None).await {
        if ev == "chunk" {
            let le: kiln_api::LogEvent = serde_json::from_str(&data).unwrap();
            if le.stream == "stdout" {
                stdout.extend(base64::engine::general_purpose::STANDARD.decode(le.data).unwrap());
            }
        }
    }
    let all: Vec<u8> = (0..N).flat_map(bytes).collect();
    assert!(stdout == all, "the whole log, once, in order ({} bytes of {})", stdout.len(), all.len());
}
