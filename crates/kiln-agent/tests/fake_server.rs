//! The agent against a fake Kiln server over real HTTP, with real git
//! repositories and real processes. Faking the server (not the client)
//! exercises the agent's real wire behaviour: retries, ids, ordering.

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
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
/// The session credential registration hands out (claims, session stream).
const CREDENTIAL: &str = "kiln_s1.agent-1.session-1.cafe";
/// The token of the attempts this server assigns (every call on them).
const ATTEMPT_TOKEN: &str = "kiln_a1.beef";

#[derive(Debug, Clone)]
enum Event {
    Claim(String),
    Heartbeat(u16),
    Chunk(String, LogChunk, u16),
    Complete(Completion),
    /// A session stream connection (1-based count).
    Session(u32),
    CreateUpload(CreateUpload),
    Part {
        generation: String,
        part: u64,
        len: usize,
        sha256: String,
        status: u16,
    },
    Seal(String, u16),
    Restore(RestoreRequest, u16),
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
    /// Answer 409 conflict (final) to every post of this (stream, seq).
    refuse_chunk: Option<(String, i64)>,
    /// Answer each log chunk after this long (a server's sync time).
    log_delay: Duration,
    /// Log chunks being answered now, and the most at once.
    logs_in_flight: usize,
    max_logs_in_flight: usize,
    heartbeats: Heartbeats,
    fenced: bool,
    bad_auth: u32,
    /// The fake's own base URL (for capability URLs).
    base: String,
    part_size: u64,
    uploads: HashMap<String, CreateUpload>,
    parts: HashMap<(String, u64), Vec<u8>>,
    /// Answer 503 to the first PUT of this part.
    fail_part_once: Option<u64>,
    /// Answer 409 stale_epoch to every PUT of this part.
    stale_part: Option<u64>,
    /// Bound artifacts for restore: (from_job, name) → bytes.
    artifacts: HashMap<(String, String), Vec<u8>>,
    /// Announce a wrong sha256 for restored artifacts.
    wrong_restore_sha: bool,
    sessions: u32,
    /// End the first session stream once this file exists.
    drop_first_session_when: Option<PathBuf>,
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

    /// Index of the first event matching `f`.
    fn position(&self, f: impl Fn(&Event) -> bool) -> Option<usize> {
        self.events().iter().position(f)
    }

    fn uploads_opened(&self) -> Vec<CreateUpload> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::CreateUpload(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// (part, len, sha256, status) of every PUT, in arrival order.
    fn part_puts(&self) -> Vec<(u64, usize, String, u16)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Part { generation, part, len, sha256, status } => {
                    assert_eq!(generation, "gen-1", "one upload session per test");
                    Some((part, len, sha256, status))
                }
                _ => None,
            })
            .collect()
    }

    /// The stored object of a generation: its parts concatenated.
    fn object(&self, generation: &str) -> Vec<u8> {
        let s = self.state.lock().unwrap();
        let mut out = vec![];
        for n in 0.. {
            match s.parts.get(&(generation.to_string(), n)) {
                Some(p) => out.extend_from_slice(p),
                None => break,
            }
        }
        out
    }

    fn claims(&self) -> Vec<String> {
        self.events().into_iter().filter_map(|e| if let Event::Claim(id) = e { Some(id) } else { None }).collect()
    }

    fn completions(&self) -> Vec<Completion> {
        self.events().into_iter().filter_map(|e| if let Event::Complete(c) = e { Some(c) } else { None }).collect()
    }

    /// Accepted chunks of one stream, in offset order: the order the real
    /// server commits them in (several are in flight at once, so they can
    /// arrive in another).
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
        out.sort_by_key(|c| c.offset);
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
            let data = base64::engine::general_purpose::STANDARD.decode(&c.data).unwrap();
            assert!(!data.is_empty() && data.len() <= 1024 * 1024, "chunk size {} over the 1 MiB maximum", data.len());
            // The agent checks its bytes with a CRC-32C (the server digests them).
            assert_eq!(c.crc32c, Some(kiln_api::types::log_crc32c(&data)), "crc32c of {stream} chunk {i}");
            assert_eq!(c.sha256, None, "the agent does not digest {stream} chunk {i}");
            bytes.extend(data);
        }
        String::from_utf8(bytes).unwrap()
    }
}

fn error(status: StatusCode, code: &str) -> Response {
    let body = ErrorBody { error: ErrorDetail { code: code.into(), message: format!("fake server says {code}") } };
    (status, Json(body)).into_response()
}

fn authorized(fake: &Fake, headers: &HeaderMap, want: &str) -> bool {
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {want}"));
    if !ok {
        fake.record(|s| s.bad_auth += 1);
    }
    ok
}

async fn register(State(fake): State<Arc<Fake>>, headers: HeaderMap, Json(_): Json<RegisterAgent>) -> Response {
    if !authorized(&fake, &headers, TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    Json(AgentRegistration {
        agent_id: "agent-1".into(),
        session_id: "session-1".into(),
        lease_ttl_ms: 5_000,
        heartbeat_interval_ms: 100,
        credential: CREDENTIAL.into(),
        pool: "default".into(),
        takes_untrusted: None,
        untrusted_agents: None,
    })
    .into_response()
}

async fn claim(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path(agent): Path<String>,
    Json(req): Json<ClaimRequest>,
) -> Response {
    if !authorized(&fake, &headers, CREDENTIAL) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    assert_eq!((agent.as_str(), req.session_id.as_str(), req.wait_ms), ("agent-1", "session-1", 20_000));
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
    headers: HeaderMap,
    Path((_job, _epoch)): Path<(String, i64)>,
) -> Response {
    if !authorized(&fake, &headers, ATTEMPT_TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    let mut cancel = false;
    let mut stale = false;
    fake.record(|s| {
        match &s.heartbeats {
            Heartbeats::Ok => {}
            Heartbeats::StaleWhen(p) => stale = p.exists() || s.fenced,
            Heartbeats::CancelWhen(p) => cancel = p.exists(),
        }
        s.fenced |= stale;
        s.events.push(Event::Heartbeat(if stale { 409 } else { 200 }));
    });
    if stale {
        return error(StatusCode::CONFLICT, codes::STALE_EPOCH);
    }
    Json(HeartbeatResponse { cancel_requested: cancel, lease_ttl_ms: 5_000 }).into_response()
}

async fn logs(
    State(fake): State<Arc<Fake>>,
    Path((job, _epoch)): Path<(String, i64)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // The agent sends raw bodies with the identity in headers; recorded here
    // in the JSON shape (data in base64) the assertions read.
    let mut delay = Duration::ZERO;
    fake.record(|s| {
        s.logs_in_flight += 1;
        s.max_logs_in_flight = s.max_logs_in_flight.max(s.logs_in_flight);
        delay = s.log_delay;
    });
    tokio::time::sleep(delay).await;
    fake.record(|s| s.logs_in_flight -= 1);
    let h = |name: &str| headers.get(name).expect("log header").to_str().unwrap().to_string();
    use kiln_api::types::log_headers as lh;
    let c = LogChunk {
        stream: h(lh::STREAM),
        seq: h(lh::SEQ).parse().unwrap(),
        offset: h(lh::OFFSET).parse().unwrap(),
        data: base64::engine::general_purpose::STANDARD.encode(&body),
        sha256: headers.get(lh::SHA256).map(|v| v.to_str().unwrap().to_string()),
        crc32c: headers.get(lh::CRC32C).map(|v| v.to_str().unwrap().to_string()),
        in_order: headers.contains_key(lh::IN_ORDER),
    };
    let (mut status, mut conflict) = (200, false);
    fake.record(|s| {
        if s.fenced {
            status = 409;
        } else if s.fail_chunk_once.as_ref() == Some(&(c.stream.clone(), c.seq)) {
            s.fail_chunk_once = None;
            status = 503;
        } else if s.refuse_chunk.as_ref() == Some(&(c.stream.clone(), c.seq)) {
            (status, conflict) = (409, true);
        }
        s.events.push(Event::Chunk(job.clone(), c.clone(), status));
    });
    match status {
        409 if conflict => error(StatusCode::CONFLICT, codes::CONFLICT),
        409 => error(StatusCode::CONFLICT, codes::STALE_EPOCH),
        503 => error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE),
        _ => Json(LogAck { committed: BTreeMap::new() }).into_response(),
    }
}

async fn complete(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path((_job, _epoch)): Path<(String, i64)>,
    Json(c): Json<Completion>,
) -> Response {
    if !authorized(&fake, &headers, ATTEMPT_TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    let fenced = fake.state.lock().unwrap().fenced;
    fake.record(|s| s.events.push(Event::Complete(c.clone())));
    if fenced {
        return error(StatusCode::CONFLICT, codes::STALE_EPOCH);
    }
    Json(CompletionAck { job_status: c.outcome.as_str().into() }).into_response()
}

async fn session(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path(agent): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&fake, &headers, CREDENTIAL) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    assert_eq!((agent.as_str(), q.get("session_id").map(String::as_str)), ("agent-1", Some("session-1")));
    let mut n = 0;
    let mut drop_when = None;
    fake.record(|s| {
        s.sessions += 1;
        n = s.sessions;
        s.events.push(Event::Session(n));
        if n == 1 {
            drop_when = s.drop_first_session_when.clone();
        }
    });
    // A ping at once (so headers and a first event go out), then every 200 ms;
    // the first connection ends once `drop_when` exists.
    let pings = futures::stream::unfold(true, move |first| {
        let drop_when = drop_when.clone();
        async move {
            if !first {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if drop_when.as_ref().is_some_and(|p| p.exists()) {
                return None;
            }
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"event: ping\ndata: {}\n\n")), false))
        }
    });
    Response::builder().header("content-type", "text/event-stream").body(Body::from_stream(pings)).unwrap()
}

async fn create_upload(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path((_job, _epoch)): Path<(String, i64)>,
    Json(c): Json<CreateUpload>,
) -> Response {
    if !authorized(&fake, &headers, ATTEMPT_TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    let mut session = None;
    fake.record(|s| {
        s.events.push(Event::CreateUpload(c.clone()));
        let generation = format!("gen-{}", s.uploads.len() + 1);
        s.uploads.insert(generation.clone(), c.clone());
        session = Some(UploadSession {
            part_url: format!("{}/parts/{generation}/{{part}}", s.base),
            generation_id: generation,
            part_size: s.part_size,
            expires_at_ms: i64::MAX,
            presigned: false,
        });
    });
    Json(session.unwrap()).into_response()
}

async fn put_part(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path((generation, part)): Path<(String, u64)>,
    body: Bytes,
) -> Response {
    // A capability URL: the agent must not send its token there.
    assert!(headers.get("authorization").is_none(), "token sent to a part URL");
    let sha256 = hex::encode(Sha256::digest(&body));
    let mut status = 200;
    fake.record(|s| {
        if s.stale_part == Some(part) {
            status = 409;
        } else if s.fail_part_once == Some(part) {
            s.fail_part_once = None;
            status = 503;
        } else {
            s.parts.insert((generation.clone(), part), body.to_vec());
        }
        s.events.push(Event::Part {
            generation: generation.clone(),
            part,
            len: body.len(),
            sha256: sha256.clone(),
            status,
        });
    });
    match status {
        409 => error(StatusCode::CONFLICT, codes::STALE_EPOCH),
        503 => error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE),
        _ => Json(PartReceipt { part, size: body.len() as u64, sha256: Some(sha256) }).into_response(),
    }
}

async fn seal(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path((_job, _epoch, generation)): Path<(String, i64, String)>,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&fake, &headers, ATTEMPT_TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    let req: kiln_api::SealRequest = serde_json::from_slice(&body).unwrap_or_default();
    let object = fake.object(&generation);
    let actual = hex::encode(Sha256::digest(&object));
    let mut sealed = None;
    fake.record(|s| {
        let declared = s.uploads.get(&generation).cloned();
        // Like the server: the digest named at open or at seal must match the stored bytes.
        let named = declared.as_ref().and_then(|d| d.sha256.clone()).or(req.sha256.clone());
        let ok = declared.as_ref().is_some_and(|d| d.size == object.len() as u64) && named.as_deref() == Some(&actual);
        s.events.push(Event::Seal(generation.clone(), if ok { 200 } else { 422 }));
        if ok {
            let d = declared.unwrap();
            sealed = Some(SealedGeneration {
                generation_id: generation.clone(),
                name: d.name,
                size: d.size,
                sha256: actual.clone(),
                state: "sealed".into(),
            });
        }
    });
    match sealed {
        Some(g) => Json(g).into_response(),
        None => error(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID),
    }
}

async fn restore(
    State(fake): State<Arc<Fake>>,
    headers: HeaderMap,
    Path((_job, _epoch)): Path<(String, i64)>,
    Json(r): Json<RestoreRequest>,
) -> Response {
    if !authorized(&fake, &headers, ATTEMPT_TOKEN) {
        return error(StatusCode::UNAUTHORIZED, codes::UNAUTHORIZED);
    }
    let mut found = None;
    fake.record(|s| {
        let bytes = s.artifacts.get(&(r.from_job.clone(), r.name.clone()));
        s.events.push(Event::Restore(r.clone(), if bytes.is_some() { 200 } else { 404 }));
        found = bytes.map(|b| {
            let mut sha256 = hex::encode(Sha256::digest(b));
            if s.wrong_restore_sha {
                sha256 = hex::encode(Sha256::digest(b"something else"));
            }
            ArtifactDownload {
                name: r.name.clone(),
                job: r.from_job.clone(),
                epoch: 1,
                size: b.len() as u64,
                sha256,
                url: format!("{}/blobs/{}/{}", s.base, r.from_job, r.name),
                expires_at_ms: i64::MAX,
                kind: "file".into(),
                tar_gz_url: None,
                zip_url: None,
            }
        });
    });
    match found {
        Some(d) => Json(d).into_response(),
        None => error(StatusCode::NOT_FOUND, codes::NOT_FOUND),
    }
}

async fn blob(State(fake): State<Arc<Fake>>, Path((job, name)): Path<(String, String)>) -> Response {
    let bytes = fake.state.lock().unwrap().artifacts.get(&(job, name)).cloned();
    match bytes {
        Some(b) => b.into_response(),
        None => error(StatusCode::NOT_FOUND, codes::NOT_FOUND),
    }
}

async fn serve(fake: Arc<Fake>) -> String {
    let app = Router::new()
        .route("/v1/agents/register", post(register))
        .route("/v1/agents/{agent}/claim", post(claim))
        .route("/v1/jobs/{job}/attempts/{epoch}/heartbeat", post(heartbeat))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs", post(logs))
        .route("/v1/jobs/{job}/attempts/{epoch}/complete", post(complete))
        .route("/v1/agents/{agent}/session", get(session))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts", post(create_upload))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal", post(seal))
        .route("/v1/jobs/{job}/attempts/{epoch}/restore", post(restore))
        .route("/parts/{generation}/{part}", put(put_part))
        .route("/blobs/{job}/{name}", get(blob))
        .layer(DefaultBodyLimit::disable())
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let base = format!("http://{addr}");
    fake.state.lock().unwrap().base = base.clone();
    base
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=Kiln Test", "-c", "user.email=test@kiln.invalid", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
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
    std::fs::write(src.join("script.sh"), "#!/bin/sh\necho \"script ran with $1\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(src.join("script.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "initial"]);
    git(&src, &["push", "-q", origin.to_str().unwrap(), "HEAD:refs/heads/main"]);
    // A later commit on the branch: the job must get the frozen one.
    std::fs::write(src.join("hello.txt"), "a newer commit\n").unwrap();
    let sha = git(&src, &["rev-parse", "HEAD"]);
    git(&src, &["commit", "-q", "-am", "newer"]);
    git(&src, &["push", "-q", origin.to_str().unwrap(), "HEAD:refs/heads/main"]);
    (origin.to_str().unwrap().to_string(), sha)
}

struct Harness {
    fake: Arc<Fake>,
    dir: tempfile::TempDir,
    url: String,
    sha: String,
    shutdown: watch::Sender<bool>,
    agent: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    upload_rate_limit: Option<u64>,
    log_limit: Option<u64>,
    metrics_listen: Option<std::net::SocketAddr>,
}

impl Harness {
    fn new() -> Harness {
        let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("kiln_agent=debug").try_init();
        let dir = tempfile::tempdir().unwrap();
        let (url, sha) = make_repo(dir.path());
        let fake: Arc<Fake> = Arc::default();
        fake.state.lock().unwrap().part_size = 1024 * 1024;
        Harness {
            fake,
            dir,
            url,
            sha,
            shutdown: watch::Sender::new(false),
            agent: None,
            upload_rate_limit: None,
            log_limit: None,
            metrics_listen: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn work_dir(&self) -> PathBuf {
        self.path("agent")
    }

    fn sandbox_dir(&self) -> PathBuf {
        self.path("sandbox")
    }

    fn assignment(&self, steps: &[(Option<&str>, &str)]) -> Assignment {
        Assignment {
            run_id: "run-1".into(),
            job_id: "job-1".into(),
            job_name: "build".into(),
            epoch: 3,
            repo: "demo".into(),
            clone_url: self.url.clone(),
            clone_credential: None,
            commit_sha: self.sha.clone(),
            steps: steps
                .iter()
                .map(|(name, run)| StepSpec {
                    name: name.map(str::to_string),
                    run: run.to_string(),
                    ..Default::default()
                })
                .collect(),
            env: BTreeMap::from([("CUSTOM".to_string(), "custom-value".to_string())]),
            timeout_secs: None,
            hang_after_secs: None,
            hang_kill_after_secs: None,
            image: None,
            image_digest: None,
            image_error: None,
            image_build: None,
            build_registry: None,
            size: None,
            publish: vec![],
            restore: vec![],
            secrets: BTreeMap::new(),
            lease_ttl_ms: 5_000,
            heartbeat_interval_ms: 100,
            attempt_token: ATTEMPT_TOKEN.into(),
            cache: None,
            services: vec![],
            outputs: vec![],
            reports: None,
            quarantine: vec![],
            shard_token: String::new(),
            traceparent: None,
            checkout: None,
            trusted: false,
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
            sandbox_dir: Some(self.sandbox_dir()),
            hide_paths: vec![],
            step_env: Default::default(),
            user_toolchains: false,
            keep_sandboxes: false,
            // Steps write to the test's own (0700) temp dir: under a root
            // test runner they keep root (the kiln e2e and hostile tests
            // cover the default, `nobody`).
            step_user: Some("root".into()),
            step_nice: 0,
            max_jobs: 1,
            executor: ExecutorKind::Host,
            kill_grace: None,
            cache_timeout: None,
            prepare_timeout: None,
            finalize_timeout: None,
            op_timeouts: Default::default(),
            cache_local_budget: None,
            services_engine: None,
            // The host's disk may be nearly full on a CI machine: claims here
            // do not depend on it (tests/disk covers the level).
            storage_levels: Some(kiln_core::degradation::STORAGE_OFF),
            memory_levels: None,
            metrics_listen: self.metrics_listen,
            upload_rate_limit: self.upload_rate_limit,
            log_limit: self.log_limit,
            log_rate_limit: None,
            log_buffer: None,
            log_spool_limit: None,
        };
        self.agent = Some(tokio::spawn(kiln_agent::run(config, self.shutdown.subscribe())));
    }

    /// Waits until the agent is claiming again after `n` attempts: with one
    /// slot, that means the n-th attempt finished and was cleaned up.
    async fn wait_attempts_done(&self, n: usize) {
        self.fake
            .wait_until("the agent to claim again", |s| {
                let ids: std::collections::HashSet<&String> =
                    s.events.iter().filter_map(|e| if let Event::Claim(id) = e { Some(id) } else { None }).collect();
                s.handed.len() >= n && ids.len() > n
            })
            .await;
    }

    async fn stop(mut self) {
        self.shutdown.send(true).unwrap();
        let agent = self.agent.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), agent).await.expect("agent did not stop").unwrap().unwrap();
        assert_eq!(
            self.fake.state.lock().unwrap().bad_auth,
            0,
            "every call carries its credential: join token, session credential or attempt token"
        );
    }
}

/// A step that starts `sleep 1000` in the background, records its *host*
/// pid in `$PID_FILE` (atomically), and waits. Steps run in their own PID
/// namespace with their own /proc, where no pid is a host pid: the test
/// finds the sleeper from the host by its environment (`PID_FILE=…`).
const BACKGROUND_SLEEP: &str = "sh -c 'read -r p _ < /proc/self/stat; echo $p > \"$PID_FILE.tmp\"; \
     mv \"$PID_FILE.tmp\" \"$PID_FILE\"; exec sleep 1000' & wait";

fn alive(pid_file: &std::path::Path) -> bool {
    let want = format!("PID_FILE={}", pid_file.display());
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { return false };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        env.split(|b| *b == 0).any(|v| v == want.as_bytes()) && kiln_sandbox::process_alive(pid)
    })
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
    assert_eq!((completions[0].outcome.as_str(), completions[0].exit_code), ("success", Some(0)));

    let stdout = h.fake.log("stdout");
    // A job slot's kept sandbox: `slot-<n>-<random>/ws`.
    let ws_line = stdout.lines().find(|l| l.starts_with("ws=")).expect("the ws line");
    let ws = std::path::PathBuf::from(ws_line.trim_start_matches("ws=").split(" pwd=").next().unwrap());
    assert_eq!(ws.parent().and_then(|p| p.parent()), Some(h.sandbox_dir().as_path()), "{ws_line}");
    assert!(ws.parent().unwrap().file_name().unwrap().to_string_lossy().starts_with("slot-0-"), "{ws_line}");
    assert!(ws.ends_with("ws"), "{ws_line}");
    assert!(stdout.starts_with("hello from the repo\nscript ran with arg\n"), "{}", &stdout[..200.min(stdout.len())]);
    assert!(stdout.contains("job=build id=job-1 epoch=3 run=run-1\n"));
    assert!(stdout.contains(&format!("commit={} custom=custom-value\n", h.sha)));
    assert!(stdout.contains(&format!("ws={} pwd={}\n", ws.display(), ws.display())));
    assert!(!stdout.contains(TOKEN), "the agent token reached the step");
    assert!(stdout.contains(&format!("{}\n", "x".repeat(200_000))));
    use base64::Engine;
    let sizes: Vec<usize> = h
        .fake
        .accepted("job-1", "stdout")
        .iter()
        .map(|c| base64::engine::general_purpose::STANDARD.decode(&c.data).unwrap().len())
        .collect();
    assert!(sizes.iter().all(|n| *n <= 1024 * 1024), "no chunk over the 1 MiB maximum: {sizes:?}");
    assert_eq!(h.fake.log("stderr"), "to-stderr\n");
    let system = h.fake.log("system");
    assert!(system.contains("▶ step 1/2: check\n"), "{system}");
    assert!(system.contains("▶ step 2/2: head -c 200000 /dev/zero | tr '\\0' x; echo\n"), "{system}");
    assert!(system.ends_with("✓ job success\n"), "{system}");

    // Every chunk was acknowledged before the completion was sent.
    let events = h.fake.events();
    let done = events.iter().position(|e| matches!(e, Event::Complete(_))).unwrap();
    assert!(!events[done..].iter().any(|e| matches!(e, Event::Chunk(..))));
    // The workspace is gone; the mirror stays for the next job.
    assert_attempts_dir_emptied(&h.work_dir()).await;
    assert_eq!(std::fs::read_dir(h.work_dir().join("mirrors")).unwrap().count(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_fails_the_job_and_later_steps_never_run() {
    let mut h = Harness::new();
    let marker = h.path("third-step-ran");
    let mut a = h.assignment(&[(None, "echo one"), (Some("boom"), "echo two; exit 3"), (None, "touch \"$MARKER\"")]);
    a.env.insert("MARKER".into(), marker.display().to_string());
    // A second job of the same repository reuses the mirror.
    let mut b = h.assignment(&[(None, "cat hello.txt")]);
    b.job_id = "job-2".into();
    h.start(vec![a, b]).await;
    h.wait_attempts_done(2).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].outcome.as_str(), c[0].exit_code, c[0].infra_failure), ("failed", Some(3), false));
    assert!(c[0].message.as_deref().unwrap().contains("step 2/3 `boom` failed: exit code 3"), "{:?}", c[0].message);
    assert!(!marker.exists(), "the step after the failure ran");
    assert_eq!(c[1].outcome, "success");
    assert_eq!(h.fake.log_of("job-2", "stdout"), "hello from the repo\n");
    let system = h.fake.log("system");
    assert!(system.contains("✗ step 2/3 failed: exit code 3"), "{system}");
    assert!(!system.contains("▶ step 3/3"), "the third step never started: {system}");
    assert!(system.contains("○ step 3/3"), "and is reported skipped: {system}");
    assert_eq!(std::fs::read_dir(h.work_dir().join("mirrors")).unwrap().count(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_attempt_is_killed_and_never_completes() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[(None, &format!("echo started; {BACKGROUND_SLEEP}"))]);
    a.env.insert("PID_FILE".into(), pid_file.display().to_string());
    h.fake.state.lock().unwrap().heartbeats = Heartbeats::StaleWhen(pid_file.clone());
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    assert!(!alive(&pid_file), "the step survived fencing");
    assert!(h.fake.completions().is_empty(), "a fenced attempt completed");
    let events = h.fake.events();
    let fenced = events.iter().position(|e| matches!(e, Event::Heartbeat(409))).unwrap();
    assert!(!events[fenced + 1..].iter().any(|e| matches!(e, Event::Heartbeat(_))), "heartbeats after the fence");
    // The log shipper may have had one chunk on the wire when the heartbeat
    // was refused (this fake accepts it; a server refuses it); nothing after.
    let chunks = |events: &[Event]| events.iter().filter(|e| matches!(e, Event::Chunk(..))).count();
    let in_flight = chunks(&events[fenced + 1..]);
    assert!(in_flight <= 1, "chunks after the fence: {:?}", &events[fenced + 1..]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(chunks(&h.fake.events()[fenced + 1..]), in_flight, "the fenced attempt kept shipping its log");
    assert_attempts_dir_emptied(&h.work_dir()).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requested_kills_the_step_and_completes_cancelled() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[(None, BACKGROUND_SLEEP), (None, "echo never")]);
    a.env.insert("PID_FILE".into(), pid_file.display().to_string());
    h.fake.state.lock().unwrap().heartbeats = Heartbeats::CancelWhen(pid_file.clone());
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].outcome.as_str(), c[0].infra_failure), ("cancelled", false));
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
    assert_eq!(claims[0], claims[1], "the retry must reuse the claim_request_id");
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
    assert_eq!(posts[0].0, posts[1].0, "the retry must carry identical seq, offset and bytes");
    assert_eq!(h.fake.log("stdout"), "first-chunk\n");
    assert_eq!(h.fake.completions()[0].outcome, "success");
    h.stop().await;
}

/// Chunks go `in_order` (the server commits each only after the one before
/// it); the chunk after one refused for good is sent without the flag, so
/// the hole is explicit and the rest of the log is not held up (issue 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chunk_after_one_given_up_declares_the_hole() {
    let mut h = Harness::new();
    h.fake.state.lock().unwrap().refuse_chunk = Some(("stdout".into(), 1));
    let a = h.assignment(&[(None, "echo one; sleep 0.5; echo two; sleep 0.5; echo three; sleep 0.5; echo four")]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;
    let posts: Vec<(i64, bool, u16)> = h
        .fake
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Chunk(_, c, s) if c.stream == "stdout" => Some((c.seq, c.in_order, s)),
            _ => None,
        })
        .collect();
    assert_eq!(
        posts,
        [(0, true, 200), (1, true, 409), (2, false, 200), (3, true, 200)],
        "refused once and given up; the next declares the hole; then in order again"
    );
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
    assert!(msg.contains("checkout") && msg.contains("0123456789abcdef0123456789abcdef01234567"), "{msg}");
    assert!(h.fake.log("stdout").is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_timeout_is_killed_and_fails() {
    let mut h = Harness::new();
    let pid_file = h.path("step.pid");
    let mut a = h.assignment(&[(None, BACKGROUND_SLEEP)]);
    a.env.insert("PID_FILE".into(), pid_file.display().to_string());
    a.timeout_secs = Some(1);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let c = &h.fake.completions()[0];
    assert_eq!(
        (c.outcome.as_str(), c.message.as_deref(), c.infra_failure, c.exit_code),
        ("failed", Some("timed out after 1s"), false, Some(124))
    );
    assert!(!alive(&pid_file));
    h.stop().await;
}

// ------------------------------------------------------------ artifacts

const MIB: usize = 1024 * 1024;

fn sha_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `n` deterministic pseudo-random bytes.
fn pseudo_random(n: usize, seed: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 32);
    let mut block = Sha256::digest(seed.as_bytes());
    while out.len() < n {
        out.extend_from_slice(&block);
        block = Sha256::digest(block);
    }
    out.truncate(n);
    out
}

impl Harness {
    /// A job whose single step writes `size` random bytes to `out/app.bin`
    /// (and a copy outside the workspace, returned) and publishes it.
    fn publishing_job(&self, size: usize) -> (Assignment, PathBuf) {
        let copy = self.path("published-copy.bin");
        let mut a = self.assignment(&[(
            Some("build"),
            &format!("mkdir -p out; head -c {size} /dev/urandom > out/app.bin; cp out/app.bin \"$COPY\""),
        )]);
        a.env.insert("COPY".into(), copy.display().to_string());
        a.publish = vec![PublishSpec { name: "app.bin".into(), path: "out/app.bin".into() }];
        (a, copy)
    }
}

fn is_complete(e: &Event) -> bool {
    matches!(e, Event::Complete(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_file_is_uploaded_in_parts_and_sealed_before_success() {
    let mut h = Harness::new();
    let size = 3 * MIB + MIB / 2;
    let (a, copy) = h.publishing_job(size);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let written = std::fs::read(&copy).unwrap();
    assert_eq!(written.len(), size);
    let opened = h.fake.uploads_opened();
    // The digest is named at seal time: the frozen bytes are read once, while uploading.
    assert_eq!(opened, [CreateUpload { name: "app.bin".into(), size: size as u64, sha256: None, kind: None }]);
    let puts = h.fake.part_puts();
    assert_eq!(
        puts.iter().map(|p| (p.0, p.1, p.3)).collect::<Vec<_>>(),
        [(0, MIB, 200), (1, MIB, 200), (2, MIB, 200), (3, MIB / 2, 200)]
    );
    assert_eq!(h.fake.object("gen-1"), written, "reassembled bytes");

    let last_part = h.fake.events().iter().rposition(|e| matches!(e, Event::Part { .. })).unwrap();
    let seal = h.fake.position(|e| matches!(e, Event::Seal(g, 200) if g == "gen-1")).expect("sealed");
    let done = h.fake.position(is_complete).unwrap();
    assert!(last_part < seal && seal < done, "parts, then seal, then completion");
    let c = &h.fake.completions()[0];
    assert_eq!((c.outcome.as_str(), c.exit_code), ("success", Some(0)));
    let system = h.fake.log("system");
    assert!(system.contains(&format!("uploading artifact `app.bin`: {size} bytes\n")), "{system}");
    assert!(
        system.contains(&format!("✓ artifact `app.bin` sealed: {size} bytes, sha256 {}\n", sha_hex(&written))),
        "{system}"
    );
    // The spool goes with the attempt.
    assert_attempts_dir_emptied(&h.work_dir()).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_refused_with_503_is_resent_with_identical_bytes() {
    let mut h = Harness::new();
    h.fake.state.lock().unwrap().fail_part_once = Some(1);
    // A free port for the agent's /metrics (bound and released here).
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    h.metrics_listen = Some(addr);
    let (a, copy) = h.publishing_job(2 * MIB + 10);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;
    let scrape = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(scrape.contains("kiln_agent_multipart_retries_total{target=\"server\"} 1\n"), "{scrape}");
    assert!(scrape.contains("kiln_agent_multipart_retries_total{target=\"object_store\"} 0\n"), "{scrape}");

    let puts: Vec<_> = h.fake.part_puts().into_iter().filter(|p| p.0 == 1).collect();
    assert_eq!(puts.len(), 2, "{puts:?}");
    assert_eq!((puts[0].3, puts[1].3), (503, 200));
    assert_eq!((puts[0].1, &puts[0].2), (puts[1].1, &puts[1].2), "the retry carries identical bytes");
    assert_eq!(h.fake.object("gen-1"), std::fs::read(&copy).unwrap());
    assert_eq!(h.fake.completions()[0].outcome, "success");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_epoch_on_a_part_fences_the_attempt() {
    let mut h = Harness::new();
    h.fake.state.lock().unwrap().stale_part = Some(1);
    let (a, _) = h.publishing_job(3 * MIB);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let puts = h.fake.part_puts();
    assert_eq!(puts.iter().map(|p| (p.0, p.3)).collect::<Vec<_>>(), [(0, 200), (1, 409)], "no part after the fence");
    let events = h.fake.events();
    assert!(!events.iter().any(|e| matches!(e, Event::Seal(..))), "sealed");
    assert!(h.fake.completions().is_empty(), "a fenced attempt completed");
    let fenced = events.iter().position(|e| matches!(e, Event::Part { status: 409, .. })).unwrap();
    // The heartbeat loop and the log shipper run beside the upload: each may
    // have had one request on the wire when the part was refused. Nothing
    // after those — six heartbeat intervals later there is still no new one.
    let talk = |events: &[Event]| {
        let beats = events.iter().filter(|e| matches!(e, Event::Heartbeat(_))).count();
        let chunks = events.iter().filter(|e| matches!(e, Event::Chunk(..))).count();
        (beats, chunks)
    };
    let (beats, chunks) = talk(&events[fenced + 1..]);
    assert!(beats <= 1 && chunks <= 1, "the fenced attempt kept talking: {:?}", &events[fenced + 1..]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = h.fake.events();
    assert_eq!(
        talk(&later[fenced + 1..]),
        (beats, chunks),
        "the fenced attempt kept talking: {:?}",
        &later[fenced + 1..]
    );
    assert_attempts_dir_emptied(&h.work_dir()).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_declared_artifact_fails_the_job_and_a_directory_is_one_archive() {
    let mut h = Harness::new();
    let publish = |name: &str, path: &str| PublishSpec { name: name.into(), path: path.into() };
    let mut missing = h.assignment(&[(None, "echo built nothing")]);
    missing.publish = vec![publish("app.bin", "out/app.bin")];
    let mut dir = h.assignment(&[(None, "mkdir -p out/classes; echo x > out/classes/A.class")]);
    dir.job_id = "job-2".into();
    dir.publish = vec![publish("classes", "out/classes")];
    // A failing step: outputs are not even looked at.
    let mut failing = h.assignment(&[(None, "mkdir out; echo x > out/app.bin; exit 1")]);
    failing.job_id = "job-3".into();
    failing.publish = vec![publish("app.bin", "out/app.bin")];
    h.start(vec![missing, dir, failing]).await;
    h.wait_attempts_done(3).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 3);
    assert_eq!(
        (c[0].outcome.as_str(), c[0].infra_failure, c[0].exit_code, c[0].message.as_deref()),
        ("failed", false, None, Some("declared artifact `app.bin` was not produced at `out/app.bin`"))
    );
    // Issue 16: a directory is published as one archive (kind `archive`).
    assert_eq!((c[1].outcome.as_str(), c[1].infra_failure), ("success", false), "{:?}", c[1].message);
    assert_eq!((c[2].outcome.as_str(), c[2].exit_code, c[2].infra_failure), ("failed", Some(1), false));
    let opened = h.fake.uploads_opened();
    assert_eq!(opened.len(), 1, "only the directory's upload session: {opened:?}");
    assert_eq!((opened[0].name.as_str(), opened[0].kind.as_deref()), ("classes", Some("archive")));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_artifacts_are_in_place_before_the_first_step() {
    let mut h = Harness::new();
    let bytes = pseudo_random(300 * 1024 + 7, "app.jar");
    h.fake.state.lock().unwrap().artifacts.insert(("compile".into(), "app.jar".into()), bytes.clone());
    let mut a = h.assignment(&[
        (None, "sha256sum deps/lib/app.jar; wc -c < deps/lib/app.jar; ls -A deps/lib"),
        (None, "cat hello.txt"),
    ]);
    a.restore =
        vec![RestoreSpec { from_job: "compile".into(), name: "app.jar".into(), path: "deps/lib/app.jar".into() }];
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    assert_eq!(h.fake.completions()[0].outcome, "success");
    assert_eq!(
        h.fake.log("stdout"),
        format!("{}  deps/lib/app.jar\n{}\napp.jar\nhello from the repo\n", sha_hex(&bytes), bytes.len()),
        "exact bytes at the path, no temporary file left beside them"
    );
    let restored = h
        .fake
        .position(|e| matches!(e, Event::Restore(r, 200) if r.from_job == "compile" && r.name == "app.jar"))
        .unwrap();
    let first_output = h.fake.position(|e| matches!(e, Event::Chunk(_, c, _) if c.stream == "stdout")).unwrap();
    assert!(restored < first_output);
    let system = h.fake.log("system");
    assert!(system.contains("restoring artifact `compile/app.jar` to deps/lib/app.jar\n"), "{system}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_cannot_be_trusted_or_found_fails_before_any_step() {
    let mut h = Harness::new();
    let marker = h.path("step-ran");
    {
        let mut s = h.fake.state.lock().unwrap();
        s.artifacts.insert(("compile".into(), "app.jar".into()), pseudo_random(1000, "x"));
        s.wrong_restore_sha = true;
    }
    let restore =
        |name: &str, path: &str| RestoreSpec { from_job: "compile".into(), name: name.into(), path: path.into() };
    let job = |id: &str, spec: RestoreSpec| {
        let mut a = h.assignment(&[(None, "touch \"$MARKER\"")]);
        a.job_id = id.into();
        a.env.insert("MARKER".into(), marker.display().to_string());
        a.restore = vec![spec];
        a
    };
    let corrupt = job("job-1", restore("app.jar", "deps/app.jar"));
    let missing = job("job-2", restore("nope", "deps/nope"));
    let escaping = job("job-3", restore("app.jar", "../outside.jar"));
    h.start(vec![corrupt, missing, escaping]).await;
    h.wait_attempts_done(3).await;

    let c = h.fake.completions();
    assert_eq!(c.len(), 3);
    assert_eq!((c[0].outcome.as_str(), c[0].infra_failure), ("failed", true));
    let msg = c[0].message.as_deref().unwrap();
    assert!(msg.contains("artifact `compile/app.jar` failed verification"), "{msg}");
    assert_eq!(
        (c[1].outcome.as_str(), c[1].infra_failure, c[1].message.as_deref()),
        ("failed", false, Some("required artifact `compile/nope` is not available"))
    );
    assert_eq!((c[2].outcome.as_str(), c[2].infra_failure), ("failed", false));
    assert!(c[2].message.as_deref().unwrap().contains("relative to the workspace"), "{:?}", c[2].message);
    assert!(!marker.exists(), "a step ran");
    assert!(!h.path("outside.jar").exists());
    for job in ["job-1", "job-2", "job-3"] {
        assert!(!h.fake.log_of(job, "system").contains("▶ step"));
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_go_through_the_agent_wide_rate_limit() {
    let mut h = Harness::new();
    h.upload_rate_limit = Some(2 * MIB as u64);
    let (a, copy) = h.publishing_job(3 * MIB);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    // Timing is the token bucket's unit tests' business (injected clock);
    // here: a limited upload still delivers every byte, in order.
    assert_eq!(h.fake.part_puts().len(), 3);
    assert_eq!(h.fake.object("gen-1"), std::fs::read(&copy).unwrap());
    assert_eq!(h.fake.completions()[0].outcome, "success");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_session_stream_is_reopened_and_running_attempts_heartbeat_at_once() {
    let mut h = Harness::new();
    let started = h.path("started");
    let release = h.path("release");
    let mut a =
        h.assignment(&[(None, "touch \"$STARTED\"; while [ ! -e \"$RELEASE\" ]; do sleep 0.05; done; echo released")]);
    a.env.insert("STARTED".into(), started.display().to_string());
    a.env.insert("RELEASE".into(), release.display().to_string());
    // No periodic heartbeat within the test: any heartbeat is the reconnect's.
    a.heartbeat_interval_ms = 600_000;
    h.fake.state.lock().unwrap().drop_first_session_when = Some(started);
    h.start(vec![a]).await;
    h.fake
        .wait_until("a heartbeat after the session reconnect", |s| {
            let reconnect = s.events.iter().position(|e| matches!(e, Event::Session(2)));
            reconnect.is_some_and(|r| s.events[r..].iter().any(|e| matches!(e, Event::Heartbeat(200))))
        })
        .await;
    std::fs::write(&release, "").unwrap();
    h.wait_attempts_done(1).await;

    let events = h.fake.events();
    let first = events.iter().position(|e| matches!(e, Event::Session(1))).unwrap();
    let second = events.iter().position(|e| matches!(e, Event::Session(2))).unwrap();
    let beat = events.iter().position(|e| matches!(e, Event::Heartbeat(_))).unwrap();
    assert!(first < second, "{events:?}");
    assert!(second < beat, "the first heartbeat must follow the reconnect: {events:?}");
    assert_eq!(h.fake.state.lock().unwrap().sessions, 2, "one reconnect");
    assert_eq!(h.fake.completions()[0].outcome, "success");
    assert_eq!(h.fake.log("stdout"), "released\n");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_headers_arrive_before_the_output_of_their_step() {
    let mut h = Harness::new();
    let a = h.assignment(&[(None, "echo one"), (None, "echo two"), (None, "echo three")]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;

    let events = h.fake.events();
    let chunk = |stream: &str, text: &str| {
        events
            .iter()
            .position(|e| match e {
                Event::Chunk(_, c, 200) => {
                    c.stream == stream
                        && String::from_utf8(base64::engine::general_purpose::STANDARD.decode(&c.data).unwrap())
                            .unwrap()
                            .contains(text)
                }
                _ => false,
            })
            .unwrap_or_else(|| panic!("no {stream} chunk with {text:?}: {events:?}"))
    };
    // The note and the first header may share a chunk (system lines wait
    // for the flush timer like output); in order either way.
    assert!(chunk("system", "checking out") <= chunk("system", "▶ step 1/3"));
    let system = h.fake.log("system");
    assert!(system.find("checking out") < system.find("▶ step 1/3"), "{system}");
    for (i, out) in ["one", "two", "three"].iter().enumerate() {
        let header = chunk("system", &format!("▶ step {}/3", i + 1));
        assert!(header < chunk("stdout", out), "step {} header after its output", i + 1);
        if i > 0 {
            assert!(chunk("stdout", ["one", "two"][i - 1]) < header);
        }
    }
    assert_eq!(h.fake.log("stdout"), "one\ntwo\nthree\n");
    h.stop().await;
}

/// The attempt directory is moved aside and deleted in the background: wait
/// for it (bounded) instead of expecting it gone at once. The sandbox dir
/// then holds only the job slots' kept sandboxes (see `slots.rs`), with
/// nothing of the job but its workspace: `home/`, `tmp/` and `shm/` empty, the
/// output file empty.
async fn assert_attempts_dir_emptied(work_dir: &std::path::Path) {
    let count = |d: &std::path::Path| std::fs::read_dir(d).map(|d| d.count()).unwrap_or(0);
    // The harness's sandbox dir is the work dir's sibling.
    let sandbox = work_dir.with_file_name("sandbox");
    let mut left = vec![];
    for _ in 0..200 {
        left.clear();
        if count(&work_dir.join("attempts")) > 0 {
            left.push(work_dir.join("attempts"));
        }
        for e in std::fs::read_dir(&sandbox).into_iter().flatten() {
            let p = e.unwrap().path();
            let slot = p.file_name().unwrap().to_string_lossy().starts_with("slot-");
            let clean = slot
                && count(&p.join("home")) == 0
                && count(&p.join("tmp")) == 0
                && count(&p.join("shm")) == 0
                && std::fs::metadata(p.join("outputs/output")).map_or(true, |m| m.len() == 0)
                && std::fs::read_dir(&p).unwrap().all(|e| {
                    ["ws", "home", "tmp", "shm", "outputs"].contains(&e.unwrap().file_name().to_string_lossy().as_ref())
                });
            if !clean {
                left.push(p);
            }
        }
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("attempt directories were not removed: {left:?}");
}

/// Whether `text` reaches the fake server's `stream` log within 15 s.
async fn arrives_within_15s(h: &Harness, stream: &str, text: &str) -> bool {
    for _ in 0..300 {
        if h.fake.log(stream).contains(text) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// Output is shipped while the step still runs (64 KiB or 2 s, whichever
/// first): a step that prints a little and then blocks has its line delivered
/// before it ends. The step only ends once the line arrived, so a streamer
/// that waited for the step's end would hang here (bounded, then fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_output_is_shipped_while_the_step_runs() {
    let mut h = Harness::new();
    let gate = h.path("gate");
    let a = h.assignment(&[(
        None,
        &format!("echo early-line; while [ ! -e {} ]; do sleep 0.05; done; echo late", gate.display()),
    )]);
    h.start(vec![a]).await;
    let seen = arrives_within_15s(&h, "stdout", "early-line").await;
    std::fs::write(&gate, "").unwrap();
    assert!(seen, "the first line was not shipped while the step was running");
    h.wait_attempts_done(1).await;
    assert_eq!(h.fake.log("stdout"), "early-line\nlate\n");
    h.stop().await;
}

/// A loud stream's window (chunks in flight at once) grows past its base of
/// 8 while the server acknowledges full chunks quickly, and stays at 8 when
/// every acknowledgement is slow (a busy server gets no more than before).
/// Every byte arrives either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loud_streams_window_grows_only_while_the_server_keeps_up() {
    // 30 ms: the server is the bottleneck (a backlog builds), yet well
    // within FAST_ACK (100 ms); 150 ms: every acknowledgement is slow.
    for (delay_ms, grows) in [(30, true), (150, false)] {
        let mut h = Harness::new();
        h.fake.record(|s| s.log_delay = Duration::from_millis(delay_ms));
        let a = h.assignment(&[(None, "head -c 48000000 /dev/zero | tr '\\0' x")]);
        h.start(vec![a]).await;
        h.wait_attempts_done(1).await;
        assert_eq!(h.fake.completions()[0].outcome, "success");
        assert_eq!(h.fake.log("stdout").len(), 48_000_000, "every byte");
        let most = h.fake.state.lock().unwrap().max_logs_in_flight;
        if grows {
            assert!(most > 8, "acknowledged within {delay_ms} ms: the window grows past 8 (at most {most} at once)");
        } else {
            assert!(most <= 8, "acknowledged after {delay_ms} ms: the window stays at 8 (but {most} at once)");
        }
        h.stop().await;
    }
}

/// A step's header reaches the server while the step runs, even when the
/// step prints nothing: system lines wait for the flush timer, never for the
/// step's end (the step only ends once its header arrived).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_steps_header_is_shipped_while_it_runs() {
    let mut h = Harness::new();
    let gate = h.path("gate");
    let a = h.assignment(&[(Some("silent"), &format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display()))]);
    h.start(vec![a]).await;
    let seen = arrives_within_15s(&h, "system", "▶ step 1/1: silent").await;
    std::fs::write(&gate, "").unwrap();
    assert!(seen, "the step header was not shipped while the step was running: {:?}", h.fake.log("system"));
    h.wait_attempts_done(1).await;
    assert!(h.fake.log("system").ends_with("✓ job success\n"), "{}", h.fake.log("system"));
    h.stop().await;
}

/// A step writing far more than the attempt's output limit finishes normally:
/// its pipes keep draining, the log keeps the first `limit` bytes and says
/// that the rest was truncated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_over_the_limit_is_truncated_and_the_step_finishes() {
    let mut h = Harness::new();
    h.log_limit = Some(1 << 20);
    let a = h.assignment(&[(None, "head -c 50000000 /dev/zero | tr '\\0' y; echo; echo still-running >&2")]);
    h.start(vec![a]).await;
    h.wait_attempts_done(1).await;
    let c = &h.fake.completions()[0];
    assert_eq!((c.outcome.as_str(), c.exit_code), ("success", Some(0)), "the step finished normally");
    let shipped = h.fake.log("stdout").len() + h.fake.log("stderr").len();
    assert_eq!(shipped, 1 << 20, "exactly the limit was shipped");
    let system = h.fake.log("system");
    assert!(system.contains("truncated: this attempt's output reached its limit of 1048576 bytes"), "{system}");
    // 50,000,000 bytes and a newline on stdout, `still-running\n` on stderr.
    let dropped = 50_000_000 + 1 + 14 - (1 << 20);
    assert!(system.contains(&format!("truncated: {dropped} bytes of output were dropped")), "{system}");
    assert!(system.ends_with("✓ job success\n"), "the count comes before the final status: {system}");
    h.stop().await;
}

/// A bare repository of `files` files (more than a pristine copy keeps, so
/// a job slot's workspace is reset in place), with two commits: the
/// second changes `f1.txt`, removes `f2.txt` and adds `new.txt`. Returns
/// its URL and both commits.
fn make_big_repo(dir: &std::path::Path, name: &str, files: usize) -> (String, String, String) {
    let origin = dir.join(format!("{name}.git"));
    let src = dir.join(format!("{name}-src"));
    git(dir, &["init", "-q", "--bare", origin.to_str().unwrap()]);
    for i in 0..files {
        let d = src.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("{name} file {i}\n")).unwrap();
    }
    std::fs::write(src.join("f1.txt"), "one\n").unwrap();
    std::fs::write(src.join("f2.txt"), "two\n").unwrap();
    git(&src, &["init", "-q"]);
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "first"]);
    let c1 = git(&src, &["rev-parse", "HEAD"]);
    std::fs::write(src.join("f1.txt"), "one, changed\n").unwrap();
    std::fs::remove_file(src.join("f2.txt")).unwrap();
    std::fs::write(src.join("new.txt"), "new\n").unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "second"]);
    let c2 = git(&src, &["rev-parse", "HEAD"]);
    git(&src, &["push", "-q", origin.to_str().unwrap(), "HEAD:refs/heads/main"]);
    (origin.to_str().unwrap().to_string(), c1, c2)
}

/// `checkout: {reuse: true}` (issue 47): a trusted job's workspace of a big
/// tree is kept by its job slot and brought to the next trusted job's
/// commit in place — what the earlier job left (a failed job's dirty tree
/// too) is gone, changed files are the new commit's, unchanged ones are
/// the same inodes — and it never goes to a job of another trust level or
/// another repository. A rerun of the same commit finds the workspace
/// already at its tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_workspace_is_cleaned_and_never_crosses_trust_or_repository() {
    let mut h = Harness::new();
    let (url, c1, c2) = make_big_repo(h.dir.path(), "big", 2_100);
    let (other_url, _, other_c2) = make_big_repo(h.dir.path(), "other", 2_100);
    let job = |h: &Harness, id: &str, sha: &str, trusted: bool, reuse: bool, run: &str| {
        let mut a = h.assignment(&[(None, run)]);
        a.job_id = id.into();
        a.clone_url = url.clone();
        a.commit_sha = sha.into();
        a.trusted = trusted;
        a.checkout = reuse.then(|| kiln_api::CheckoutSpec { reuse: true, ..Default::default() });
        a
    };
    let probe = "echo \"ino=$(stat -c %i d5/f500.txt)\"; cat f1.txt; ls; git status --porcelain; git log -1 --format=head=%H; \
                 echo \"mode=$(stat -c %a d0/f0.txt)\"; cat d1/f100.txt; test -L d2/link || echo no-link";
    let jobs = vec![
        // A failing trusted job that dirties its tree every way it can.
        job(
            &h,
            "job-1",
            &c1,
            true,
            true,
            &format!(
                "{probe}; echo dirty > dirty.txt; echo mangled > f1.txt; mkdir -p target/debug; echo bin > target/debug/out; \
             chmod 600 d0/f0.txt; rm d1/f100.txt; ln -s /etc d2/link; exit 1"
            ),
        ),
        // The next trusted job of the repository, at the next commit.
        job(&h, "job-2", &c2, true, true, probe),
        // The same commit again (no reuse asked): already at its tree.
        job(&h, "job-3", &c2, true, false, probe),
        // An untrusted job (never sent `reuse` by a server; refused anyway).
        job(&h, "job-4", &c2, false, true, &format!("{probe}; echo untrusted > left-by-untrusted.txt")),
        // A trusted job after it: the untrusted job's tree is not reused.
        job(&h, "job-5", &c2, true, true, probe),
        // Another repository in the same slot.
        {
            let mut a = job(
                &h,
                "job-6",
                &other_c2,
                true,
                true,
                "cat d0/f0.txt; echo \"big=$(grep -rl 'big file' --exclude-dir=.git . | wc -l)\"",
            );
            a.clone_url = other_url.clone();
            a
        },
    ];
    h.start(jobs).await;
    h.wait_attempts_done(6).await;
    let c = h.fake.completions();
    let outcomes: Vec<&str> = c.iter().map(|c| c.outcome.as_str()).collect();
    assert_eq!(outcomes, ["failed", "success", "success", "success", "success", "success"], "{c:?}");
    let out = |job: &str| h.fake.log_of(job, "stdout");
    let ino = |job: &str| out(job).lines().find_map(|l| l.strip_prefix("ino=").map(str::to_string)).unwrap();
    let system = |job: &str| h.fake.log_of(job, "system");

    // job-2: the failed job's tree, brought to c2 and cleaned.
    let two = out("job-2");
    assert!(system("job-2").contains("bringing it from"), "{}", system("job-2"));
    assert_eq!(ino("job-2"), ino("job-1"), "unchanged files are kept, not written again: {two}");
    assert!(two.contains("one, changed\n"), "f1.txt is the new commit's: {two}");
    for gone in ["dirty.txt", "target", "f2.txt"] {
        assert!(!two.lines().any(|l| l == gone), "{gone} is still there: {two}");
    }
    assert!(two.lines().any(|l| l == "new.txt"), "{two}");
    assert!(
        !two.lines().any(|l| l.starts_with("?? ") || l.starts_with(" M ") || l.starts_with(" D ")),
        "git status in the step shows the job's changes as gone: {two}"
    );
    assert!(two.contains(&format!("head={c2}")), "{two}");
    assert!(two.contains("mode=644\nbig file 100\nno-link\n"), "a mode, a deleted file and a link put back: {two}");
    // A rerun of the same commit: the same workspace, nothing checked out.
    assert_eq!(ino("job-3"), ino("job-2"), "{}", out("job-3"));
    // The untrusted job got a fresh checkout; the trusted job after it too.
    assert_ne!(ino("job-4"), ino("job-3"), "an untrusted job got a trusted job's workspace");
    assert!(system("job-4").contains("trusted runs only"), "{}", system("job-4"));
    assert_ne!(ino("job-5"), ino("job-4"), "a trusted job got an untrusted job's workspace");
    assert!(!out("job-5").contains("left-by-untrusted"), "{}", out("job-5"));
    assert!(out("job-5").contains("one, changed\n"), "{}", out("job-5"));
    // Another repository: its own files only.
    let six = out("job-6");
    assert!(six.starts_with("other file 0\n"), "{six}");
    assert!(six.contains("big=0\n"), "files of another repository: {six}");
    assert!(system("job-6").contains("checking out afresh"), "{}", system("job-6"));
    h.stop().await;
}

/// `checkout: {depth, filter: blob:none, sparse}` (issue 47): the files
/// outside the sparse set are absent, `git log` in the job sees the given
/// depth, `git status` is clean, and the partial mirror never fetched the
/// blobs outside the checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_partial_and_shallow_checkouts_hold_only_what_they_ask() {
    let mut h = Harness::new();
    let dir = h.dir.path().to_path_buf();
    let origin = dir.join("mono.git");
    let src = dir.join("mono-src");
    git(&dir, &["init", "-q", "--bare", origin.to_str().unwrap()]);
    git(&origin, &["config", "uploadpack.allowFilter", "true"]);
    for (p, text) in [
        ("README.md", "top\n"),
        ("docs/guide.md", "guide\n"),
        ("docs/deep/more.md", "more\n"),
        ("tools/lint/lint.sh", "lint\n"),
        ("tools/other/big.bin", "other tool\n"),
        ("src/main.rs", "fn main() {}\n"),
    ] {
        std::fs::create_dir_all(src.join(p).parent().unwrap()).unwrap();
        std::fs::write(src.join(p), text).unwrap();
    }
    git(&src, &["init", "-q"]);
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "c0"]);
    for i in 1..5 {
        std::fs::write(src.join("docs/guide.md"), format!("guide {i}\n")).unwrap();
        git(&src, &["commit", "-q", "-am", &format!("c{i}")]);
    }
    let sha = git(&src, &["rev-parse", "HEAD"]);
    let src_blob = git(&src, &["rev-parse", "HEAD:src/main.rs"]);
    git(&src, &["push", "-q", origin.to_str().unwrap(), "HEAD:refs/heads/main"]);
    let probe = "find . -path ./.git -prune -o -type f -print | sort; echo \"commits=$(git log --format=%H | wc -l)\"; \
                 git status --porcelain; echo status-done";
    let mut jobs = vec![];
    for (id, spec) in [
        (
            "job-1",
            kiln_api::CheckoutSpec {
                depth: Some(2),
                filter: Some("blob:none".into()),
                sparse: vec!["docs".into(), "tools/lint".into()],
                ..Default::default()
            },
        ),
        ("job-2", kiln_api::CheckoutSpec { depth: Some(1), ..Default::default() }),
        ("job-3", kiln_api::CheckoutSpec { sparse: vec!["src".into()], ..Default::default() }),
    ] {
        let mut a = h.assignment(&[(None, probe)]);
        a.job_id = id.into();
        a.clone_url = origin.to_str().unwrap().into();
        a.commit_sha = sha.clone();
        a.trusted = true;
        a.checkout = Some(spec);
        jobs.push(a);
    }
    // A plain checkout after them: the whole tree, the whole history.
    let mut plain = h.assignment(&[(None, probe)]);
    plain.job_id = "job-4".into();
    plain.clone_url = origin.to_str().unwrap().into();
    plain.commit_sha = sha.clone();
    jobs.push(plain);
    h.start(jobs).await;
    h.wait_attempts_done(4).await;
    let c = h.fake.completions();
    assert!(c.iter().all(|c| c.outcome == "success"), "{c:?}");
    let out = |job: &str| h.fake.log_of(job, "stdout");
    assert_eq!(
        out("job-1"),
        "./README.md\n./docs/deep/more.md\n./docs/guide.md\n./tools/lint/lint.sh\ncommits=2\nstatus-done\n",
        "sparse, partial, depth 2"
    );
    assert_eq!(
        out("job-2"),
        "./README.md\n./docs/deep/more.md\n./docs/guide.md\n./src/main.rs\n./tools/lint/lint.sh\n./tools/other/big.bin\n\
         commits=1\nstatus-done\n",
        "depth 1"
    );
    assert_eq!(out("job-3"), "./README.md\n./src/main.rs\ncommits=5\nstatus-done\n", "sparse");
    assert!(
        out("job-4").contains("./tools/other/big.bin\n") && out("job-4").contains("commits=5\n"),
        "{}",
        out("job-4")
    );
    // The partial mirror has the commits but never fetched src/main.rs.
    let partial = std::fs::read_dir(h.work_dir().join("mirrors"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-partial.git"))
        .expect("a partial mirror");
    let probe = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&partial)
        .args(["cat-file", "-e", &src_blob])
        .env("GIT_NO_LAZY_FETCH", "1")
        .status()
        .unwrap();
    assert!(!probe.success(), "the partial mirror holds a blob outside the sparse checkout");
    h.stop().await;
}
