//! The agent against a fake Kiln server over real HTTP, with real git
//! repositories and real processes. Faking the server (not the client)
//! exercises the agent's real wire behaviour: retries, ids, ordering.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use kiln_agent::{AgentConfig, ExecutorKind};
use kiln_api::types::*;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

const TOKEN: &str = "agent-secret-token-4f2a";

#[derive(Debug, Clone)]
enum Event {
    Claim(String),
    Heartbeat(u16),
    Chunk(String, LogChunk, u16),
    Complete(Completion),
}

#[derive(Default)]
enum Heartbeats {
    #[default]
    Ok,
    /// 409 stale_epoch once this file exists.
    StaleWhen(PathBuf),
    /// cancel_requested once this file exists.
    CancelWhen(PathBuf),
}

#[derive(Default)]
struct FakeState {
    events: Vec<Event>,
    queue: VecDeque<Assignment>,
    handed: HashMap<String, Assignment>,
    /// Commit the next assignment, then answer 503 (a lost acknowledgement).
    lose_first_claim_response: bool,
    /// Answer 503 to the first post of this (stream, seq).
    fail_chunk_once: Option<(String, i64)>,
    heartbeats: Heartbeats,
    fenced: bool,
    bad_auth: u32,
}

#[derive(Default)]
struct Fake {
    state: Mutex<FakeState>,
    changed: Notify,
}

impl Fake {
    fn record(&self, f: impl FnOnce(&mut FakeState)) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_waiters();
    }

    async fn wait_until(&self, what: &str, cond: impl Fn(&FakeState) -> bool) {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if cond(&self.state.lock().unwrap()) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
    }

    fn events(&self) -> Vec<Event> {
        self.state.lock().unwrap().events.clone()
    }

    fn claims(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| {
                if let Event::Claim(id) = e {
                    Some(id)
                } else {
                    None
                }
            })
            .collect()
    }

    fn completions(&self) -> Vec<Completion> {
        self.events()
            .into_iter()
            .filter_map(|e| {
                if let Event::Complete(c) = e {
                    Some(c)
                } else {
                    None
                }
            })
            .collect()
    }

    /// Accepted chunks of one stream, in arrival order.
    fn accepted(&self, job: &str, stream: &str) -> Vec<LogChunk> {
        let mut out: Vec<LogChunk> = vec![];
        for e in self.events() {
            if let Event::Chunk(j, c, 200) = e
                && j == job
                && c.stream == stream
                && !out.contains(&c)
            {
                out.push(c);
            }
        }
        out
    }

    /// The stream's bytes, checking seq, offset and digest of every chunk.
    fn log(&self, stream: &str) -> String {
        self.log_of("job-1", stream)
    }

    fn log_of(&self, job: &str, stream: &str) -> String {
        let mut bytes = vec![];
        for (i, c) in self.accepted(job, stream).iter().enumerate() {
            assert_eq!(c.seq, i as i64, "seq of {stream} chunk {i}");
            assert_eq!(c.offset, bytes.len() as i64, "offset of {stream} chunk {i}");
            let data = base64::engine::general_purpose::STANDARD
                .decode(&c.data)
                .unwrap();
            assert!(
                !data.is_empty() && data.len() <= 64 * 1024,
                "chunk size {}",
                data.len()
            );
            assert_eq!(
                c.sha256,
                hex::encode(Sha256::digest(&data)),
                "digest of {stream} chunk {i}"
            );
            bytes.extend(data);
        }
        String::from_utf8(bytes).unwrap()
    }
}

fn error(status: StatusCode, code: &str) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.into(),
            message: format!("fake server says {code}"),
        },
    };
    (status, Json(body)).into_response()
}

fn authorized(fake: &Fake, headers: &HeaderMap) -> bool {
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !ok {
        fake.record(|s| s.bad_auth += 1);
    }
    ok
}

async fn register(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Json(_): Json<RegisterAgent>,
) -> Response {
    if !authorized(&fake, &headers) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    Json(AgentRegistration {
        agent_id: "agent-1".into(),
        session_id: "session-1".into(),
        lease_ttl_ms: 5_000,
        heartbeat_interval_ms: 100,
    })
    .into_response()
}

async fn claim(
    State(fake): State<Arc<Fake>>,
    Path(agent): Path<String>,
    Json(req): Json<ClaimRequest>,
) -> Response {
    assert_eq!(
        (agent.as_str(), req.session_id.as_str(), req.wait_ms),
        ("agent-1", "session-1", 20_000)
    );
    let mut lose = false;
    let mut assignment = None;
    fake.record(|s| {
        s.events.push(Event::Claim(req.claim_request_id.clone()));
        if let Some(a) = s.handed.get(&req.claim_request_id) {
            assignment = Some(a.clone());
        } else if let Some(a) = s.queue.pop_front() {
            s.handed.insert(req.claim_request_id.clone(), a.clone());
            assignment = Some(a);
            lose = std::mem::take(&mut s.lose_first_claim_response);
        }
    });
    if lose {
        return error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE);
    }
    if assignment.is_none() {
        // A short long-poll.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Json(ClaimResponse { assignment }).into_response()
}

async fn heartbeat(
    State(fake): State<Arc<Fake>>,
    Path((_job, _epoch)): Path<(String, i64)>,
) -> Response {
    let mut cancel = false;
    let mut stale = false;
    fake.record(|s| {
        match &s.heartbeats {
            Heartbeats::Ok => {}
            Heartbeats::StaleWhen(p) => stale = p.exists() || s.fenced,
            Heartbeats::CancelWhen(p) => cancel = p.exists(),
        }
        s.fenced |= stale;
        s.events
            .push(Event::Heartbeat(if stale { 409 } else { 200 }));
    });
    if stale {
        return error(StatusCode::CONFLICT, codes::STALE_EPOCH);
    }
    Json(HeartbeatResponse {
        cancel_requested: cancel,
        lease_ttl_ms: 5_000,
    })
    .into_response()
}

async fn logs(
    State(fake): State<Arc<Fake>>,
    Path((job, _epoch)): Path<(String, i64)>,
    Json(c): Json<LogChunk>,
) -> Response {
    let mut status = 200;
    fake.record(|s| {
        if s.fenced {
            status = 409;
        } else if s.fail_chunk_once.as_ref() == Some(&(c.stream.clone(), c.seq)) {
            s.fail_chunk_once = None;
            status = 503;
        }
        s.events.push(Event::Chunk(job.clone(), c.clone(), status));
    });
    match status {
        409 => error(StatusCode::CONFLICT, codes::STALE_EPOCH),
        503 => error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE),
        _ => Json(LogAck {
            committed: BTreeMap::new(),
        })
        .into_response(),
    }
}

async fn complete(
    State(fake): State<Arc<Fake>>,
    Path((_job, _epoch)): Path<(String, i64)>,
    Json(c): Json<Completion>,
) -> Response {
    let fenced = fake.state.lock().unwrap().fenced;
    fake.record(|s| s.events.push(Event::Complete(c.clone())));
    if fenced {
        return error(StatusCode::CONFLICT, codes::STALE_EPOCH);
    }
    Json(CompletionAck {
        job_status: c.outcome.clone(),
    })
    .into_response()
}

async fn serve(fake: Arc<Fake>) -> String {
    let app = Router::new()
        .route("/v1/agents/register", post(register))
        .route("/v1/agents/{agent}/claim", post(claim))
        .route("/v1/jobs/{job}/attempts/{epoch}/heartbeat", post(heartbeat))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs", post(logs))
        .route("/v1/jobs/{job}/attempts/{epoch}/complete", post(complete))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=Kiln Test",
            "-c",
            "user.email=test@kiln.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A bare repository with one commit: `hello.txt` and an executable script.
fn make_repo(dir: &std::path::Path) -> (String, String) {
    let origin = dir.join("origin.git");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    git(dir, &["init", "-q", "--bare", origin.to_str().unwrap()]);
    git(&src, &["init", "-q"]);
    std::fs::write(src.join("hello.txt"), "hello from the repo\n").unwrap();
    std::fs::write(
        src.join("script.sh"),
        "#!/bin/sh\necho \"script ran with $1\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        src.join("script.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "initial"]);
    git(
        &src,
        &[
            "push",
            "-q",
            origin.to_str().unwrap(),
            "HEAD:refs/heads/main",
        ],
    );
    // A later commit on the branch: the job must get the frozen one.
    std::fs::write(src.join("hello.txt"), "a newer commit\n").unwrap();
    let sha = git(&src, &["rev-parse", "HEAD"]);
    git(&src, &["commit", "-q", "-am", "newer"]);
    git(
        &src,
        &[
            "push",
            "-q",
            origin.to_str().unwrap(),
            "HEAD:refs/heads/main",
        ],
    );
    (origin.to_str().unwrap().to_string(), sha)
}

struct Harness {
    fake: Arc<Fake>,
    dir: tempfile::TempDir,
    url: String,
    sha: String,
    shutdown: watch::Sender<bool>,
    agent: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Harness {
    fn new() -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("kiln_agent=debug")
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let (url, sha) = make_repo(dir.path());
        Harness {
            fake: Arc::default(),
            dir,
            url,
            sha,
            shutdown: watch::Sender::new(false),
            agent: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn work_dir(&self) -> PathBuf {
        self.path("agent")
    }

    fn assignment(&self, steps: &[(Option<&str>, &str)]) -> Assignment {
        Assignment {
            run_id: "run-1".into(),
            job_id: "job-1".into(),
            job_name: "build".into(),
            epoch: 3,
            repo: "demo".into(),
            clone_url: self.url.clone(),
            commit_sha: self.sha.clone(),
            steps: steps
                .iter()
                .map(|(name, run)| StepSpec {
                    name: name.map(str::to_string),
                    run: run.to_string(),
                })
                .collect(),
            env: BTreeMap::from([("CUSTOM".to_string(), "custom-value".to_string())]),
            timeout_secs: None,
            image: None,
            publish: vec![],
            restore: vec![],
            lease_ttl_ms: 5_000,
            heartbeat_interval_ms: 100,
        }
    }

    async fn start(&mut self, assignments: Vec<Assignment>) {
        self.fake.state.lock().unwrap().queue.extend(assignments);
        let server = serve(self.fake.clone()).await;
        let config = AgentConfig {
            server,
            token: TOKEN.into(),
            name: "test-agent".into(),
            labels: BTreeMap::new(),
            work_dir: self.work_dir(),
            max_jobs: 1,
            executor: ExecutorKind::Host,
        };
        self.agent = Some(tokio::spawn(kiln_agent::run(
            config,
            self.shutdown.subscribe(),
        )));
    }

    /// Waits until the agent is claiming again after `n` attempts: with one
    /// slot, that means the n-th attempt finished and was cleaned up.
    async fn wait_attempts_done(&self, n: usize) {
        self.fake
            .wait_until("the agent to claim again", |s| {
                let ids: std::collections::HashSet<&String> = s
                    .events
                    .iter()
                    .filter_map(|e| {
                        if let Event::Claim(id) = e {
                            Some(id)
                        } else {
                            None
                        }
                    })
                    .collect();
                s.handed.len() >= n && ids.len() > n
            })
            .await;
    }

    async fn stop(mut self) {
        self.shutdown.send(true).unwrap();
        let agent = self.agent.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), agent)
            .await
            .expect("agent did not stop")
            .unwrap()
            .unwrap();
        assert_eq!(
            self.fake.state.lock().unwrap().bad_auth,
            0,
            "every call carries the agent token"
        );
    }
}

fn alive(pid_file: &std::path::Path) -> bool {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kiln_sandbox::process_alive(pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_steps_in_the_checkout_and_streams_logs() {
    let mut h = Harness::new();
    let a = h.assignment(&[
        (
            Some("check"),
            "cat hello.txt; ./script.sh arg; echo \"job=$KILN_JOB id=$KILN_JOB_ID epoch=$KILN_EPOCH run=$KILN_RUN_ID\"; \
             echo \"commit=$KILN_COMMIT custom=$CUSTOM\"; echo \"ws=$KILN_WORKSPACE pwd=$(pwd)\"; echo to-stderr >&2; env",
        ),
        (None, "head -c 200000 /dev/zero | tr '\\0' x; echo"),
    ]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let completions = h.fake.completions();
    assert_eq!(completions.len(), 1);
    assert_eq!(
        (completions[0].outcome.as_str(), completions[0].exit_code),
        ("success", Some(0))
    );

    let stdout = h.fake.log("stdout");
    let ws = h.work_dir().join("attempts").join("job-1-3").join("ws");
    assert!(
        stdout.starts_with("hello from the repo\nscript ran with arg\n"),
        "{}",
        &stdout[..200.min(stdout.len())]
    );
    assert!(stdout.contains("job=build id=job-1 epoch=3 run=run-1\n"));
    assert!(stdout.contains(&format!("commit={} custom=custom-value\n", h.sha)));
    assert!(stdout.contains(&format!("ws={} pwd={}\n", ws.display(), ws.display())));
    assert!(!stdout.contains(TOKEN), "the agent token reached the step");
    assert!(stdout.contains(&format!("{}\n", "x".repeat(200_000))));
    assert!(
        h.fake.accepted("job-1", "stdout").len() >= 4,
        "200 kB of output is several 64 KiB chunks"
    );
    assert_eq!(h.fake.log("stderr"), "to-stderr\n");
    let system = h.fake.log("system");
    assert!(system.contains("▶ step 1/2: check\n"), "{system}");
    assert!(
        system.contains("▶ step 2/2: head -c 200000 /dev/zero | tr '\\0' x; echo\n"),
        "{system}"
    );
    assert!(system.ends_with("✓ job success\n"), "{system}");

    // Every chunk was acknowledged before the completion was sent.
    let events = h.fake.events();
    let done = events
        .iter()
        .position(|e| matches!(e, Event::Complete(_)))
        .unwrap();
    assert!(!events[done..].iter().any(|e| matches!(e, Event::Chunk(..))));
    // The workspace is gone; the mirror stays for the next job.
    assert_eq!(
        std::fs::read_dir(h.work_dir().join("attempts"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(h.work_dir().join("mirrors"))
            .unwrap()
            .count(),
        1
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_fails_the_job_and_later_steps_never_run() {
    let mut h = Harness::new();
    let marker = h.path("third-step-ran");
    let mut a = h.assignment(&[
        (None, "echo one"),
        (Some("boom"), "echo two; exit 3"),
        (None, "touch \"$MARKER\""),
    ]);
    a.env.insert("MARKER".into(), marker.display().to_string());
    // A second job of the same repository reuses the mirror.
    let mut b = h.assignment(&[(None, "cat hello.txt")]);
    b.job_id = "job-2".into();
    h.start(vec![a, b]).await;
    h.wait_attempts_done(2).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 2);
    assert_eq!(
        (c[0].outcome.as_str(), c[0].exit_code, c[0].infra_failure),
        ("failed", Some(3), false)
    );
    assert!(
        c[0].message
            .as_deref()
            .unwrap()
            .contains("step 2/3 `boom` failed: exit code 3"),
        "{:?}",
        c[0].message
    );
    assert!(!marker.exists(), "the step after the failure ran");
    assert_eq!(c[1].outcome, "success");
    assert_eq!(h.fake.log_of("job-2", "stdout"), "hello from the repo\n");
    let system = h.fake.log("system");
    assert!(
        system.contains("✗ step 2/3 failed: exit code 3\n"),
        "{system}"
    );
    assert!(!system.contains("step 3/3"), "{system}");
    assert_eq!(
        std::fs::read_dir(h.work_dir().join("mirrors"))
            .unwrap()
            .count(),
        1
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_attempt_is_killed_and_never_completes() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[(None, "echo started; sleep 1000 & echo $! > \"$PID_FILE.tmp\"; mv \"$PID_FILE.tmp\" \"$PID_FILE\"; wait")]);
    a.env
        .insert("PID_FILE".into(), pid_file.display().to_string());
    h.fake.state.lock().unwrap().heartbeats = Heartbeats::StaleWhen(pid_file.clone());
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    assert!(!alive(&pid_file), "the step survived fencing");
    assert!(
        h.fake.completions().is_empty(),
        "a fenced attempt completed"
    );
    let events = h.fake.events();
    let fenced = events
        .iter()
        .position(|e| matches!(e, Event::Heartbeat(409)))
        .unwrap();
    assert!(
        !events[fenced + 1..]
            .iter()
            .any(|e| matches!(e, Event::Heartbeat(_))),
        "heartbeats after the fence"
    );
    assert!(
        !events[fenced + 1..]
            .iter()
            .any(|e| matches!(e, Event::Chunk(_, _, 200)))
    );
    assert_eq!(
        std::fs::read_dir(h.work_dir().join("attempts"))
            .unwrap()
            .count(),
        0
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requested_kills_the_step_and_completes_cancelled() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[
        (
            None,
            "sleep 1000 & echo $! > \"$PID_FILE.tmp\"; mv \"$PID_FILE.tmp\" \"$PID_FILE\"; wait",
        ),
        (None, "echo never"),
    ]);
    a.env
        .insert("PID_FILE".into(), pid_file.display().to_string());
    h.fake.state.lock().unwrap().heartbeats = Heartbeats::CancelWhen(pid_file.clone());
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].outcome.as_str(), c[0].infra_failure),
        ("cancelled", false)
    );
    assert!(!alive(&pid_file));
    assert!(!h.fake.log("system").contains("step 2/2"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_response_is_recovered_with_the_same_claim_request_id() {
    let mut h = Harness::new();
    h.fake.state.lock().unwrap().lose_first_claim_response = true;
    let a = h.assignment(&[(None, "echo recovered")]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let claims = h.fake.claims();
    assert_eq!(
        claims[0], claims[1],
        "the retry must reuse the claim_request_id"
    );
    assert_ne!(claims[1], claims[2], "a new logical claim gets a fresh id");
    assert_eq!(h.fake.completions()[0].outcome, "success");
    assert_eq!(h.fake.log("stdout"), "recovered\n");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_chunk_is_retried_with_identical_bytes() {
    let mut h = Harness::new();
    h.fake.state.lock().unwrap().fail_chunk_once = Some(("stdout".into(), 0));
    let a = h.assignment(&[(None, "echo first-chunk")]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let posts: Vec<(LogChunk, u16)> = h
        .fake
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Chunk(_, c, s) if c.stream == "stdout" => Some((c, s)),
            _ => None,
        })
        .collect();
    assert_eq!(posts[0].1, 503);
    assert_eq!(posts[1].1, 200);
    assert_eq!(
        posts[0].0, posts[1].0,
        "the retry must carry identical seq, offset and bytes"
    );
    assert_eq!(h.fake.log("stdout"), "first-chunk\n");
    assert_eq!(h.fake.completions()[0].outcome, "success");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_failure_is_an_infrastructure_failure() {
    let mut h = Harness::new();
    let mut a = h.assignment(&[(None, "echo never")]);
    a.commit_sha = "0123456789abcdef0123456789abcdef01234567".into();
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let c = &h.fake.completions()[0];
    assert_eq!((c.outcome.as_str(), c.infra_failure), ("failed", true));
    let msg = c.message.as_deref().unwrap();
    assert!(
        msg.contains("checkout") && msg.contains("0123456789abcdef0123456789abcdef01234567"),
        "{msg}"
    );
    assert!(h.fake.log("stdout").is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_timeout_is_killed_and_fails() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[(None, "sleep 1000 & echo $! > \"$PID_FILE\"; wait")]);
    a.env
        .insert("PID_FILE".into(), pid_file.display().to_string());
    a.timeout_secs = Some(1);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let c = &h.fake.completions()[0];
    assert_eq!(
        (c.outcome.as_str(), c.message.as_deref(), c.infra_failure),
        ("failed", Some("timed out after 1s"), false)
    );
    assert!(!alive(&pid_file));
    h.stop().await;
}
