//! Who is calling, and may they make this call.
//!
//! - Public API: the bearer token is `DATA_DIR/admin.token` (scope `admin`)
//!   or an API token made with `kiln token create` (scope `admin`, `read` or
//!   `trigger` of one repository; see [`policy`]). The resolved [`Principal`]
//!   rides in the request's extensions for trust and the audit log. The web
//!   UI sends a session id in its cookie (`__Host-kiln_session`, or
//!   `kiln_session` over plain http off loopback; HttpOnly,
//!   SameSite=Strict, set by `POST /v1/ui/session`), which stands for the
//!   token it signed in with until it expires or is signed out; a
//!   cookie-authenticated request that is not a GET must also carry
//!   `X-Kiln-CSRF` (a header no cross-site form can set and no cross-origin
//!   script may send without a CORS preflight, which this server never
//!   grants). Tokens in URLs are not accepted: they end up in logs, history
//!   and `Referer`s.
//! - Agent registration: a join token (see `credentials`).
//! - Claims and the session stream: the agent's session credential, for
//!   that agent's path only.
//! - Calls on an attempt: that attempt's token, for its `(job, epoch)` only.

use crate::credentials::{self, API_PREFIX, AgentCaller, JOIN_PREFIX, TOKEN_CACHE_TTL, TOUCH_EVERY, same};
use crate::error::ApiErr;
use crate::state::{AppState, State};
use axum::extract::{MatchedPath, Request, State as S};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use kiln_api::codes;
use kiln_store::StoreError;
use std::time::Instant;

/// What an API credential may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Everything, including tokens, secrets and agents.
    Admin,
    /// Every read except secrets, tokens, agents and the audit log.
    Read,
    /// Start runs of one repository and read that repository's runs.
    Trigger { repo_id: String },
}

/// The caller of a public API request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// For the audit log: `admin.token` or `token:ID`.
    pub actor: String,
    pub scope: Scope,
    /// Runs it starts may be trusted (read secrets); see `kiln_core::Trust`.
    pub may_start_trusted: bool,
}

impl Principal {
    pub fn admin_file() -> Principal {
        Principal { actor: "admin.token".into(), scope: Scope::Admin, may_start_trusted: true }
    }
}

/// The web UI's session cookie (issue 39, item 12): it holds a random
/// session id, never a token (see `handlers::ui`). `__Host-` (Secure, host
/// only, `Path=/`: no other host or plain-http origin can set or shadow it)
/// where the browser takes a Secure cookie — over TLS, and on loopback,
/// which browsers treat as a secure context — else the plain name.
pub(crate) const SESSION_COOKIE: &str = "__Host-kiln_session";
/// The session cookie's name over plain http off loopback.
pub(crate) const PLAIN_SESSION_COOKIE: &str = "kiln_session";
/// The header a cookie-authenticated non-GET request must carry.
pub(crate) const CSRF_HEADER: &str = "x-kiln-csrf";

/// The token of an `Authorization: Bearer` header (the only way agents
/// send their credentials).
fn bearer(req: &Request) -> Option<String> {
    let h = req.headers().get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    h.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

/// The value of cookie `name`.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name && !v.is_empty()).then(|| v.trim_matches('"').to_string())
        })
}

/// A credential of the public API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An `Authorization: Bearer` token.
    Bearer(String),
    /// The UI's session cookie: a session id.
    Session(String),
}

/// The UI session id a request's cookie carries, if any.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<String> {
    cookie(headers, SESSION_COOKIE).or_else(|| cookie(headers, PLAIN_SESSION_COOKIE))
}

/// The public-API credential a request carries: its bearer token, else the
/// UI's session cookie (then a non-GET must carry [`CSRF_HEADER`]).
/// `Ok(None)`: no credential at all.
pub(crate) fn public_credential(req: &Request) -> Result<Option<Credential>, ApiErr> {
    if let Some(t) = bearer(req) {
        return Ok(Some(Credential::Bearer(t)));
    }
    let Some(t) = session_cookie(req.headers()) else { return Ok(None) };
    if !matches!(*req.method(), Method::GET | Method::HEAD) && !req.headers().contains_key(CSRF_HEADER) {
        return Err(ApiErr::new(
            StatusCode::FORBIDDEN,
            "csrf",
            format!("a request authenticated by the session cookie must carry the {CSRF_HEADER} header"),
        ));
    }
    Ok(Some(Credential::Session(t)))
}

/// Decode `%XX` escapes of a query value (a browser may encode the token).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(x);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn forbidden(message: impl Into<String>) -> ApiErr {
    ApiErr::new(StatusCode::FORBIDDEN, codes::FORBIDDEN, message)
}

/// The principal of an API token, or `None` if it is not a valid one.
pub(crate) async fn principal(state: &AppState, token: &str) -> Result<Option<Principal>, ApiErr> {
    if same(token, &state.admin_token) {
        return Ok(Some(Principal::admin_file()));
    }
    let Some((id, secret)) = credentials::split(token, API_PREFIX) else { return Ok(None) };
    let cached = {
        let entries = state.tokens.entries.lock().expect("token cache");
        entries.get(id).filter(|(_, at)| at.elapsed() < TOKEN_CACHE_TTL).map(|(t, _)| t.clone())
    };
    let record = match cached {
        Some(t) => t,
        None => match state.store.get_api_token(id).await {
            Ok(t) => {
                state.tokens.entries.lock().expect("token cache").insert(id.to_string(), (t.clone(), Instant::now()));
                t
            }
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        },
    };
    if record.revoked_at.is_some() || !same(&credentials::hash_secret(secret), &record.token_hash) {
        return Ok(None);
    }
    touched(state, id).await;
    Ok(principal_of(record))
}

/// Who signed in to the UI session `session_id`: the credential it was
/// made from, as long as that still stands (the session unexpired and not
/// signed out, the token not revoked, `admin.token` not replaced).
pub(crate) async fn session_principal(state: &AppState, session_id: &str) -> Result<Option<Principal>, ApiErr> {
    let s = match state.store.get_ui_session(&credentials::hash_secret(session_id)).await {
        Ok(s) => s,
        Err(StoreError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if s.actor == ADMIN_ACTOR {
        let current = credentials::hash_secret(&state.admin_token);
        return Ok(same(&current, &s.token_hash).then(Principal::admin_file));
    }
    let record = match state.store.get_api_token(&s.actor).await {
        Ok(t) => t,
        Err(StoreError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if record.revoked_at.is_some() || !same(&record.token_hash, &s.token_hash) {
        return Ok(None);
    }
    touched(state, &record.id).await;
    Ok(principal_of(record))
}

/// The actor of a UI session made from `DATA_DIR/admin.token`.
pub(crate) const ADMIN_ACTOR: &str = "admin.token";

/// The credential a token is, for a UI session: (actor, hash of its
/// secret). `None`: not an API token of ours.
pub(crate) fn session_subject(state: &AppState, token: &str) -> Option<(String, String)> {
    if same(token, &state.admin_token) {
        return Some((ADMIN_ACTOR.to_string(), credentials::hash_secret(&state.admin_token)));
    }
    let (id, secret) = credentials::split(token, API_PREFIX)?;
    Some((id.to_string(), credentials::hash_secret(secret)))
}

/// Record (at most every `TOUCH_EVERY`) that API token `id` was used.
async fn touched(state: &AppState, id: &str) {
    let due = {
        let mut touched = state.tokens.touched.lock().expect("token cache");
        let due = touched.get(id).is_none_or(|at| at.elapsed() >= TOUCH_EVERY);
        if due {
            touched.insert(id.to_string(), Instant::now());
        }
        due
    };
    if due && let Err(e) = state.store.touch_api_token(id).await {
        tracing::warn!("cannot record the use of token {id}: {e}");
    }
}

/// The principal of a valid API token's record.
fn principal_of(record: kiln_store::ApiTokenRecord) -> Option<Principal> {
    let scope = match record.scope.as_str() {
        "admin" => Scope::Admin,
        "read" => Scope::Read,
        "trigger" => Scope::Trigger { repo_id: record.repo_id? },
        _ => return None,
    };
    Some(Principal { actor: format!("token:{}", record.id), scope, may_start_trusted: record.trusted })
}

/// What a scope may do with a route (`method`, matched path).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Allow,
    Deny,
    /// Allowed if the run, job or repository in the path is the token's repository.
    IfOwnRepo,
}

/// The public API's authorization table.
pub(crate) fn policy(scope: &Scope, method: &Method, path: &str) -> Access {
    // Notifications: their URLs may hold a receiver's token (Slack's do).
    const ADMIN_ONLY_READS: &[&str] = &[
        "/v1/repos/{repo}/secrets",
        "/v1/environments/{env}/secrets",
        "/v1/repos/{repo}/notifications",
        "/v1/repos/{repo}/notifications/deliveries",
        "/v1/tokens",
        "/v1/agent-tokens",
        "/v1/agents",
        "/v1/overview",
        "/v1/audit",
    ];
    const TRIGGER_READS: &[&str] = &[
        BADGE,
        "/v1/repos/{repo}/workflow-runs",
        "/v1/repos/{repo}/workflow-inputs",
        "/v1/repos/{repo}/workflows",
        "/v1/workflow-runs/{run}",
        "/v1/workflow-runs/{run}/events",
        "/v1/jobs/{job}/logs/events",
        "/v1/workflow-runs/{run}/artifacts/{job}/{name}",
        "/v1/workflow-runs/{run}/artifacts/{job}/{name}/provenance",
        "/v1/workflow-runs/{run}/jobs/{job}/test-attestation",
        "/v1/workflow-runs/{run}/artifacts",
        "/v1/workflow-runs/{run}/tests",
        "/v1/repos/{repo}/tests/history",
        "/v1/repos/{repo}/tests/timings",
        "/v1/repos/{repo}/quarantine",
        "/v1/workflow-runs/{run}/approvals",
        "/v1/workflow-runs/{run}/rings",
    ];
    match scope {
        Scope::Admin => Access::Allow,
        // A deployment's approvers are API tokens by name, of any scope but
        // trigger; the service checks the environment's list.
        Scope::Read if method == Method::POST && [APPROVALS, ROLLBACK, PROMOTE, PAUSE].contains(&path) => Access::Allow,
        Scope::Read if method == Method::GET && !ADMIN_ONLY_READS.contains(&path) => Access::Allow,
        Scope::Read => Access::Deny,
        Scope::Trigger { .. } if method == Method::GET && TRIGGER_READS.contains(&path) => Access::IfOwnRepo,
        Scope::Trigger { .. } if method == Method::POST && path == "/v1/repos/{repo}/workflow-runs" => {
            Access::IfOwnRepo
        }
        Scope::Trigger { .. } => Access::Deny,
    }
}

/// Deciding a run's deployment (issue 46).
pub(crate) const APPROVALS: &str = "/v1/workflow-runs/{run}/approvals";
/// Rolling an environment back (issue 46): its approvers, by name.
pub(crate) const ROLLBACK: &str = "/v1/environments/{env}/rollback";

/// Promoting or pausing a run's deploy rings (issue 46): its environment's approvers.
pub(crate) const PROMOTE: &str = "/v1/workflow-runs/{run}/promote";
pub(crate) const PAUSE: &str = "/v1/workflow-runs/{run}/pause";

/// The badge route: open to anyone for a public repository, else to a
/// token this table lets read it (see [`may_read_badge`]).
pub(crate) const BADGE: &str = "/v1/repos/{repo}/badge.svg";

/// Whether `p` may read the badge of repository `repo_id` (a private
/// repository's): what the table says of `GET` on [`BADGE`].
pub(crate) fn may_read_badge(p: &Principal, repo_id: &str) -> bool {
    match policy(&p.scope, &Method::GET, BADGE) {
        Access::Allow => true,
        Access::Deny => false,
        Access::IfOwnRepo => matches!(&p.scope, Scope::Trigger { repo_id: own } if own == repo_id),
    }
}

/// The caller of a `GET` on an open route, if it carries a valid
/// public-API credential (its bearer token, else the UI's session cookie;
/// a missing or invalid one is no caller).
pub(crate) async fn optional_principal(state: &AppState, headers: &HeaderMap) -> Result<Option<Principal>, ApiErr> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    if let Some(token) = token {
        return principal(state, &token).await;
    }
    match session_cookie(headers) {
        Some(id) => session_principal(state, &id).await,
        None => Ok(None),
    }
}

/// The repository a trigger-scoped request is about, from its path.
async fn repo_of_request(state: &AppState, uri_path: &str, path: &str) -> Result<Option<String>, ApiErr> {
    let segs: Vec<&str> = uri_path.split('/').collect();
    let pattern: Vec<&str> = path.split('/').collect();
    let param =
        |name: &str| pattern.iter().position(|p| *p == name).and_then(|i| segs.get(i)).map(|s| percent_decode(s));
    let found = if let Some(repo) = param("{repo}") {
        state.store.get_repo(&repo).await.map(|r| r.id)
    } else if let Some(run) = param("{run}") {
        // `hello#3`, a prefix, an id: resolved as the handler will; one
        // that does not resolve reads as not found (no ids disclosed).
        match crate::services::run_ref::resolve_id(state, &run).await {
            Ok(id) => state.store.get_run(&id).await.map(|v| v.run.repo_id),
            Err(_) => return Ok(None),
        }
    } else if let Some(job) = param("{job}") {
        match state.store.get_job(&job).await {
            Ok(j) => state.store.get_run(&j.run_id).await.map(|v| v.run.repo_id),
            Err(e) => Err(e),
        }
    } else {
        return Ok(None);
    };
    match found {
        Ok(id) => Ok(Some(id)),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Public API: resolve the caller, check the route against its scope.
pub async fn require_api(S(state): S<State>, mut req: Request, next: Next) -> Result<Response, ApiErr> {
    let found = match public_credential(&req)? {
        None => None,
        Some(Credential::Bearer(token)) => principal(&state, &token).await?,
        Some(Credential::Session(id)) => session_principal(&state, &id).await?,
    };
    let Some(p) = found else { return Err(ApiErr::unauthorized()) };
    let path = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    match policy(&p.scope, req.method(), &path) {
        Access::Allow => {}
        Access::Deny => {
            return Err(forbidden(format!("this token may not call {} {path}", req.method())));
        }
        Access::IfOwnRepo => {
            let Scope::Trigger { repo_id } = &p.scope else { unreachable!("only trigger scopes are repo-bound") };
            // Another repository's run reads as "not found": a trigger token
            // learns nothing about repositories it is not for.
            let uri_path = req.uri().path().to_string();
            if repo_of_request(&state, &uri_path, &path).await?.as_deref() != Some(repo_id.as_str()) {
                return Err(ApiErr::not_found("no such repository, run or job for this token".to_string()));
            }
        }
    }
    req.extensions_mut().insert(p);
    Ok(next.run(req).await)
}

/// What a join token lets an agent register as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JoinGrant {
    pub pool: String,
    /// `None`: `DATA_DIR/agent.token`.
    pub token_id: Option<String>,
}

/// `POST /v1/agents/register`: a join token.
pub async fn require_join(S(state): S<State>, mut req: Request, next: Next) -> Result<Response, ApiErr> {
    let Some(token) = bearer(&req) else { return Err(ApiErr::unauthorized()) };
    let grant = if same(&token, &state.agent_token) {
        JoinGrant { pool: "default".into(), token_id: None }
    } else {
        let Some((id, secret)) = credentials::split(&token, JOIN_PREFIX) else {
            return Err(ApiErr::unauthorized());
        };
        match state.store.get_join_token(id).await {
            Ok(t) if t.revoked_at.is_none() && same(&credentials::hash_secret(secret), &t.token_hash) => {
                JoinGrant { pool: t.pool, token_id: Some(t.id) }
            }
            Ok(_) | Err(StoreError::NotFound(_)) => return Err(ApiErr::unauthorized()),
            Err(e) => return Err(e.into()),
        }
    };
    req.extensions_mut().insert(grant);
    Ok(next.run(req).await)
}

/// Claims and the session stream: a session credential (the handler checks
/// it names the agent of the path).
pub async fn require_session(S(state): S<State>, mut req: Request, next: Next) -> Result<Response, ApiErr> {
    let caller = bearer(&req).and_then(|t| state.agent_keys.verify_session(&t)).ok_or_else(ApiErr::unauthorized)?;
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}

/// Refuse a session credential used on another agent's path.
pub(crate) fn check_agent_path(caller: &AgentCaller, agent_id: &str) -> Result<(), ApiErr> {
    if caller.agent_id != agent_id {
        return Err(forbidden("this credential belongs to another agent"));
    }
    Ok(())
}

/// `/v1/jobs/{job}/attempts/{epoch}/…`: the token of exactly that attempt.
/// The `(job, epoch)` an attempt route names.
fn attempt_in_path(req: &Request) -> Result<(String, i64), ApiErr> {
    let segs: Vec<&str> = req.uri().path().split('/').collect();
    // ["", "v1", "jobs", JOB, "attempts", EPOCH, …]
    match (segs.get(3), segs.get(5).and_then(|e| e.parse::<i64>().ok())) {
        (Some(job), Some(epoch)) => Ok((percent_decode(job), epoch)),
        _ => Err(ApiErr::bad_request("expected /v1/jobs/{job}/attempts/{epoch}/…")),
    }
}

pub async fn require_attempt(S(state): S<State>, req: Request, next: Next) -> Result<Response, ApiErr> {
    let Some(token) = bearer(&req) else { return Err(ApiErr::unauthorized()) };
    let (job, epoch) = attempt_in_path(&req)?;
    if !state.agent_keys.holds_attempt(&token, &job, epoch) {
        // A credential of ours that is not this attempt's is refused as
        // such; anything else is simply not a credential.
        let ours = state.agent_keys.verify_session(&token).is_some() || token.starts_with("kiln_a1.");
        return Err(if ours {
            forbidden(format!("this credential does not hold attempt {epoch} of job {job}"))
        } else {
            ApiErr::unauthorized()
        });
    }
    Ok(next.run(req).await)
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/shards/next` (issue 43): the
/// attempt's own token, or the shard capability its steps hold (which
/// allows nothing else).
pub async fn require_shard(S(state): S<State>, req: Request, next: Next) -> Result<Response, ApiErr> {
    let Some(token) = bearer(&req) else { return Err(ApiErr::unauthorized()) };
    let (job, epoch) = attempt_in_path(&req)?;
    if !state.agent_keys.holds_shard(&token, &job, epoch) && !state.agent_keys.holds_attempt(&token, &job, epoch) {
        return Err(ApiErr::unauthorized());
    }
    Ok(next.run(req).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn req(method: Method, headers: &[(&str, &str)], uri: &str) -> Request {
        let mut b = axum::http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn credentials_come_from_the_header_or_the_cookie_never_the_query() {
        let get = |h: &[(&str, &str)], uri: &str| public_credential(&req(Method::GET, h, uri)).unwrap();
        let bearer = |t: &str| Some(Credential::Bearer(t.into()));
        let session = |t: &str| Some(Credential::Session(t.into()));
        assert_eq!(get(&[("authorization", "Bearer t1")], "/v1/repos"), bearer("t1"));
        assert_eq!(get(&[], "/v1/repos?token=t1"), None, "a token in the URL is ignored");
        assert_eq!(get(&[("cookie", "a=b; kiln_session=t2; c=d")], "/"), session("t2"));
        assert_eq!(get(&[("cookie", "a=b; __Host-kiln_session=t3")], "/"), session("t3"));
        assert_eq!(get(&[("cookie", "kiln_session=")], "/"), None);
        // A cookie-authenticated POST needs the CSRF header; a bearer one does not.
        let post = |h: &[(&str, &str)]| public_credential(&req(Method::POST, h, "/v1/repos"));
        assert_eq!(post(&[("cookie", "kiln_session=t2")]).unwrap_err().status, StatusCode::FORBIDDEN);
        assert_eq!(post(&[("cookie", "kiln_session=t2"), ("x-kiln-csrf", "1")]).unwrap(), session("t2"));
        assert_eq!(post(&[("authorization", "Bearer t1")]).unwrap(), bearer("t1"));
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(percent_decode("kiln_ab12"), "kiln_ab12");
        assert_eq!(percent_decode("a%2Bb%3D%3d"), "a+b==");
        assert_eq!(percent_decode("bad%zz%4"), "bad%zz%4");
    }

    #[test]
    fn a_private_badge_is_for_readers_of_its_repository() {
        let p = |scope: Scope| Principal { actor: "t".into(), scope, may_start_trusted: false };
        assert!(may_read_badge(&p(Scope::Admin), "r"));
        assert!(may_read_badge(&p(Scope::Read), "r"));
        assert!(may_read_badge(&p(Scope::Trigger { repo_id: "r".into() }), "r"));
        assert!(!may_read_badge(&p(Scope::Trigger { repo_id: "other".into() }), "r"));
    }

    #[test]
    fn the_policy_table() {
        let trigger = Scope::Trigger { repo_id: "r".into() };
        let (get, post, put, delete) = (Method::GET, Method::POST, Method::PUT, Method::DELETE);
        use Access::*;
        let rows: &[(&Scope, &Method, &str, Access)] = &[
            (&Scope::Admin, &put, "/v1/repos/{repo}/secrets/{name}", Allow),
            (&Scope::Admin, &post, "/v1/tokens", Allow),
            (&Scope::Read, &get, "/v1/workflow-runs/{run}", Allow),
            (&Scope::Read, &get, "/v1/repos", Allow),
            (&Scope::Read, &get, "/v1/jobs/{job}/logs/events", Allow),
            (&Scope::Read, &get, "/v1/repos/{repo}/secrets", Deny),
            (&Scope::Read, &get, "/v1/tokens", Deny),
            (&Scope::Read, &get, "/v1/agents", Deny),
            (&Scope::Read, &get, "/v1/overview", Deny),
            (&trigger, &get, "/v1/overview", Deny),
            (&Scope::Read, &get, "/v1/audit", Deny),
            (&Scope::Read, &post, "/v1/repos/{repo}/workflow-runs", Deny),
            (&Scope::Read, &post, "/v1/workflow-runs/{run}/cancel", Deny),
            (&Scope::Read, &delete, "/v1/repos/{repo}/secrets/{name}", Deny),
            (&trigger, &post, "/v1/repos/{repo}/workflow-runs", IfOwnRepo),
            (&trigger, &get, "/v1/repos/{repo}/workflow-runs", IfOwnRepo),
            (&trigger, &get, "/v1/repos/{repo}/workflow-inputs", IfOwnRepo),
            (&Scope::Read, &get, "/v1/repos/{repo}/workflow-inputs", Allow),
            (&trigger, &get, "/v1/repos/{repo}/workflows", IfOwnRepo),
            (&Scope::Read, &get, "/v1/repos/{repo}/workflows", Allow),
            (&trigger, &get, "/v1/workflow-runs/{run}", IfOwnRepo),
            (&trigger, &get, "/v1/jobs/{job}/logs/events", IfOwnRepo),
            (&trigger, &get, "/v1/workflow-runs/{run}/events", IfOwnRepo),
            (&trigger, &get, "/v1/workflow-runs/{run}/jobs/{job}/test-attestation", IfOwnRepo),
            (&Scope::Read, &get, "/v1/workflow-runs/{run}/jobs/{job}/test-attestation", Allow),
            (&trigger, &get, "/v1/workflow-runs/events", Deny),
            (&Scope::Read, &get, "/v1/workflow-runs/events", Allow),
            (&Scope::Read, &get, "/v1/workflow-runs/{run}/events", Allow),
            (&trigger, &get, "/v1/repos", Deny),
            (&trigger, &post, "/v1/workflow-runs/{run}/retry", Deny),
            (&trigger, &post, "/v1/workflow-runs/{run}/cancel", Deny),
            // Issue 42: one job's retry and cancel are the run's actions,
            // an admin's; its artifact list a read of the run.
            (&Scope::Admin, &post, "/v1/workflow-runs/{run}/jobs/{job}/retry", Allow),
            (&Scope::Admin, &post, "/v1/workflow-runs/{run}/jobs/{job}/cancel", Allow),
            (&Scope::Read, &post, "/v1/workflow-runs/{run}/jobs/{job}/retry", Deny),
            (&Scope::Read, &post, "/v1/workflow-runs/{run}/jobs/{job}/cancel", Deny),
            (&trigger, &post, "/v1/workflow-runs/{run}/jobs/{job}/retry", Deny),
            (&trigger, &post, "/v1/workflow-runs/{run}/jobs/{job}/cancel", Deny),
            (&Scope::Read, &get, "/v1/workflow-runs/{run}/artifacts", Allow),
            (&trigger, &get, "/v1/workflow-runs/{run}/artifacts", IfOwnRepo),
            (&trigger, &post, "/v1/repos", Deny),
            (&trigger, &get, "/v1/repos/{repo}/secrets", Deny),
            (&trigger, &put, "/v1/repos/{repo}/secrets/{name}", Deny),
            // Issue 46: environment secrets are an admin's, like a repository's.
            (&Scope::Admin, &put, "/v1/environments/{env}/secrets/{name}", Allow),
            (&Scope::Admin, &get, "/v1/environments/{env}/secrets", Allow),
            (&Scope::Read, &get, "/v1/environments/{env}/secrets", Deny),
            (&Scope::Read, &put, "/v1/environments/{env}/secrets/{name}", Deny),
            (&Scope::Read, &delete, "/v1/environments/{env}/secrets/{name}", Deny),
            (&trigger, &get, "/v1/environments/{env}/secrets", Deny),
            (&trigger, &put, "/v1/environments/{env}/secrets/{name}", Deny),
            // Issue 42: notifications are an admin's (their URLs and log
            // are admin-only reads); a badge is a read of its repository.
            (&Scope::Admin, &post, "/v1/repos/{repo}/notifications", Allow),
            (&Scope::Admin, &get, "/v1/repos/{repo}/notifications", Allow),
            (&Scope::Admin, &delete, "/v1/repos/{repo}/notifications/{id}", Allow),
            (&Scope::Admin, &get, "/v1/repos/{repo}/notifications/deliveries", Allow),
            (&Scope::Read, &post, "/v1/repos/{repo}/notifications", Deny),
            (&Scope::Read, &get, "/v1/repos/{repo}/notifications", Deny),
            (&Scope::Read, &delete, "/v1/repos/{repo}/notifications/{id}", Deny),
            (&Scope::Read, &get, "/v1/repos/{repo}/notifications/deliveries", Deny),
            (&trigger, &post, "/v1/repos/{repo}/notifications", Deny),
            (&trigger, &get, "/v1/repos/{repo}/notifications", Deny),
            (&trigger, &delete, "/v1/repos/{repo}/notifications/{id}", Deny),
            (&trigger, &get, "/v1/repos/{repo}/notifications/deliveries", Deny),
            (&Scope::Admin, &get, BADGE, Allow),
            (&Scope::Read, &get, BADGE, Allow),
            (&trigger, &get, BADGE, IfOwnRepo),
        ];
        for (scope, method, path, want) in rows {
            assert_eq!(&policy(scope, method, path), want, "{scope:?} {method} {path}");
        }
    }
}
