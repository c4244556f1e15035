//! A fake forge for tests: a real HTTP server on 127.0.0.1 that accepts the
//! commit-status endpoints of GitHub, GitLab and Gitea/Forgejo as their
//! documentation describes them, checks the authentication header, the body
//! shape and the state vocabulary of each, and records what it accepted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::Forge;

/// One status the fake accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedStatus {
    pub forge: Forge,
    /// `owner/name`, or GitLab's project path (decoded) or id.
    pub repo: String,
    pub sha: String,
    /// GitHub/Gitea `context`, GitLab `name`.
    pub context: String,
    /// The forge's own word (`failed`, `canceled`, `failure`, ...).
    pub state: String,
    pub description: Option<String>,
    pub target_url: Option<String>,
}

struct Shared {
    token: String,
    statuses: Mutex<Vec<RecordedStatus>>,
    failing: AtomicUsize,
    requests: AtomicUsize,
    next_id: AtomicU64,
}

/// The running fake. Dropping it stops the server.
pub struct FakeForge {
    url: String,
    shared: Arc<Shared>,
    _shutdown: oneshot::Sender<()>,
}

impl FakeForge {
    /// Start on 127.0.0.1 on a free port (within the current tokio runtime),
    /// accepting `token` for all three forges.
    pub async fn start(token: &str) -> FakeForge {
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            statuses: Mutex::new(Vec::new()),
            failing: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/repos/{owner}/{repo}/statuses/{sha}", post(github))
            .route("/api/v4/projects/{project}/statuses/{sha}", post(gitlab))
            .route("/api/v1/repos/{owner}/{repo}/statuses/{sha}", post(gitea))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        FakeForge { url: format!("http://{addr}"), shared, _shutdown: tx }
    }

    /// The base URL, usable as the `api_url` of all three forges.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Every accepted status, in order.
    pub fn statuses(&self) -> Vec<RecordedStatus> {
        self.shared.statuses.lock().unwrap().clone()
    }

    /// Answer the next `n` requests with 503.
    pub fn set_failing(&self, n: usize) {
        self.shared.failing.store(n, Ordering::SeqCst);
    }

    /// How many requests reached the fake (including refused ones).
    pub fn request_count(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

fn err(code: StatusCode, body: Value) -> Response {
    (code, axum::Json(body)).into_response()
}

/// Count the request and apply `set_failing`: `Some` is the refusal.
fn refuse(s: &Shared) -> Option<Response> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let failing = s.failing.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    failing.is_ok().then(|| err(StatusCode::SERVICE_UNAVAILABLE, json!({ "message": "Service Unavailable (fake)" })))
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn valid_sha(sha: &str) -> bool {
    (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

fn json_body(h: &HeaderMap, body: &[u8]) -> Result<serde_json::Map<String, Value>, String> {
    let ct = header(h, "content-type").unwrap_or("");
    if !ct.starts_with("application/json") {
        return Err(format!("content-type {ct:?} is not application/json"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("body is not a JSON object".into()),
        Err(e) => Err(format!("Problems parsing JSON: {e}")),
    }
}

/// An optional string field: absent or null → None; another type → Err.
fn opt_str(m: &serde_json::Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key} is not a string")),
    }
}

fn now() -> String {
    // A fixed, well-formed timestamp; the fake keeps no clock.
    "2024-01-01T00:00:00Z".to_owned()
}

/// GitHub and Gitea share the shape: `{state, target_url?, description?, context?}`.
fn github_like(
    forge: Forge,
    s: &Shared,
    owner: String,
    repo: String,
    sha: String,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if let Some(r) = refuse(s) {
        return r;
    }
    let want_auth = match forge {
        Forge::Github => format!("Bearer {}", s.token),
        _ => format!("token {}", s.token),
    };
    if header(headers, "authorization") != Some(want_auth.as_str()) {
        let msg = match forge {
            Forge::Github => json!({ "message": "Bad credentials", "status": "401" }),
            _ => json!({ "message": "token is required" }),
        };
        return err(StatusCode::UNAUTHORIZED, msg);
    }
    if forge == Forge::Github {
        if header(headers, "user-agent").is_none_or(str::is_empty) {
            return err(
                StatusCode::FORBIDDEN,
                json!({ "message": "Request forbidden by administrative rules. Please make sure your request has a User-Agent header" }),
            );
        }
        if header(headers, "accept") != Some("application/vnd.github+json")
            || header(headers, "x-github-api-version") != Some("2022-11-28")
        {
            return err(
                StatusCode::BAD_REQUEST,
                json!({ "message": "expected Accept: application/vnd.github+json and X-GitHub-Api-Version: 2022-11-28" }),
            );
        }
    }
    let unprocessable = |m: String| err(StatusCode::UNPROCESSABLE_ENTITY, json!({ "message": m }));
    if !valid_sha(&sha) {
        return unprocessable(format!("No commit found for SHA: {sha}"));
    }
    let m = match json_body(headers, body) {
        Ok(m) => m,
        Err(e) => return err(StatusCode::BAD_REQUEST, json!({ "message": e })),
    };
    let states: &[&str] = match forge {
        Forge::Github => &["error", "failure", "pending", "success"],
        _ => &["pending", "success", "error", "failure", "warning"],
    };
    let state = match m.get("state").and_then(Value::as_str) {
        Some(st) if states.contains(&st) => st.to_owned(),
        other => return unprocessable(format!("Validation Failed: state {other:?} is not one of {states:?}")),
    };
    let (description, target_url, context) =
        match (opt_str(&m, "description"), opt_str(&m, "target_url"), opt_str(&m, "context")) {
            (Ok(d), Ok(t), Ok(c)) => (d, t, c.unwrap_or_else(|| "default".to_owned())),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                return unprocessable(format!("Validation Failed: {e}"));
            }
        };
    if forge == Forge::Github && description.as_ref().is_some_and(|d| d.chars().count() > 140) {
        return unprocessable("Validation Failed: description is too long (maximum is 140 characters)".into());
    }
    let id = s.next_id.fetch_add(1, Ordering::SeqCst);
    let full = format!("{owner}/{repo}");
    s.statuses.lock().unwrap().push(RecordedStatus {
        forge,
        repo: full,
        sha,
        context: context.clone(),
        state: state.clone(),
        description: description.clone(),
        target_url: target_url.clone(),
    });
    let body = json!({
        "id": id,
        "url": format!("/repos/{owner}/{repo}/statuses/{id}"),
        "state": state,
        "status": state,
        "description": description,
        "target_url": target_url,
        "context": context,
        "created_at": now(),
        "updated_at": now(),
    });
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

async fn github(
    State(s): State<Arc<Shared>>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    github_like(Forge::Github, &s, owner, repo, sha, &headers, &body)
}

async fn gitea(
    State(s): State<Arc<Shared>>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    github_like(Forge::Gitea, &s, owner, repo, sha, &headers, &body)
}

/// GitLab takes its parameters from the query string or the body (JSON or
/// form); the fake accepts the query string and a JSON body.
async fn gitlab(
    State(s): State<Arc<Shared>>,
    Path((project, sha)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(r) = refuse(&s) {
        return r;
    }
    if header(&headers, "private-token") != Some(s.token.as_str()) {
        return err(StatusCode::UNAUTHORIZED, json!({ "message": "401 Unauthorized" }));
    }
    let bad = |m: &str| err(StatusCode::BAD_REQUEST, json!({ "error": m }));
    // `project` arrives decoded: an id, or a path that was one encoded segment.
    let project_ok = project.bytes().all(|b| b.is_ascii_digit())
        || (project.contains('/')
            && project
                .split('/')
                .all(|seg| !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))));
    if project.is_empty() || !project_ok {
        return err(StatusCode::NOT_FOUND, json!({ "message": "404 Project Not Found" }));
    }
    if !valid_sha(&sha) {
        return err(StatusCode::NOT_FOUND, json!({ "message": "404 Commit Not Found" }));
    }
    let mut params: HashMap<String, Value> = HashMap::new();
    if let Some(q) = query {
        for (k, v) in form_pairs(&q) {
            params.insert(k, Value::String(v));
        }
    }
    if !body.is_empty() {
        match json_body(&headers, &body) {
            Ok(m) => params.extend(m),
            Err(e) => return bad(&e),
        }
    }
    let m: serde_json::Map<String, Value> = params.into_iter().collect();
    const STATES: [&str; 5] = ["pending", "running", "success", "failed", "canceled"];
    let state = match m.get("state").and_then(Value::as_str) {
        None => return bad("state is missing"),
        Some(st) if STATES.contains(&st) => st.to_owned(),
        Some(_) => return bad("state does not have a valid value"),
    };
    let (name, description, target_url) = match (
        // `name`, or its alias `context`.
        match opt_str(&m, "name") {
            Ok(None) => opt_str(&m, "context"),
            other => other,
        },
        opt_str(&m, "description"),
        opt_str(&m, "target_url"),
    ) {
        (Ok(n), Ok(d), Ok(t)) => (n.unwrap_or_else(|| "default".to_owned()), d, t),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad(&e),
    };
    let mut statuses = s.statuses.lock().unwrap();
    // Like GitLab: a status cannot "transition" to the state it is in.
    let current = statuses
        .iter()
        .rev()
        .find(|r| r.forge == Forge::Gitlab && r.repo == project && r.sha == sha && r.context == name);
    if let Some(cur) = current
        && cur.state == state
    {
        return err(
            StatusCode::BAD_REQUEST,
            json!({ "message": format!("Cannot transition status via :{state} from :{state}") }),
        );
    }
    statuses.push(RecordedStatus {
        forge: Forge::Gitlab,
        repo: project,
        sha: sha.clone(),
        context: name.clone(),
        state: state.clone(),
        description: description.clone(),
        target_url: target_url.clone(),
    });
    let id = s.next_id.fetch_add(1, Ordering::SeqCst);
    let body = json!({
        "id": id,
        "sha": sha,
        "ref": null,
        "status": state,
        "name": name,
        "target_url": target_url,
        "description": description,
        "created_at": now(),
        "started_at": null,
        "finished_at": null,
        "allow_failure": false,
        "coverage": null,
        "author": { "username": "kiln" },
    });
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

/// `a=b&c=d` pairs, percent-decoded.
fn form_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
