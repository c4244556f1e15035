//! Typed HTTP client for the public and agent APIs.

use crate::access::*;
use crate::types::*;
use futures::{Stream, StreamExt};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status and body.
    #[error("{message} ({status} {code})")]
    Status { status: u16, code: String, message: String },
    /// The request never got an answer (connection refused, reset, timeout).
    #[error("cannot reach the Kiln server: {0}")]
    Transport(String),
    #[error("unexpected response from server: {0}")]
    Decode(String),
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            ApiError::Status { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The named epoch is no longer current: the caller must stop its work.
    pub fn is_stale_epoch(&self) -> bool {
        self.status() == Some(409) && self.code() == Some(codes::STALE_EPOCH)
    }

    /// Retry classifier: transport failures and 502/503/504 may succeed later;
    /// every other status is a decision of the server and is final.
    pub fn is_retryable(&self) -> bool {
        match self {
            ApiError::Transport(_) => true,
            ApiError::Status { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            ApiError::Decode(_) => false,
        }
    }

    /// CLI exit code for this error (see [`crate::exit`]).
    pub fn exit_code(&self) -> i32 {
        match self.status() {
            Some(401 | 403) => crate::exit::AUTH,
            Some(s) if s >= 500 => crate::exit::UNAVAILABLE,
            Some(_) => crate::exit::REFUSED,
            None => crate::exit::UNAVAILABLE,
        }
    }
}

/// One Server-Sent Event as received.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: String,
}

/// A client of one server, or of several replicas (`URL1,URL2`): requests go
/// to the current one; a transport failure (refused, reset, timed out) moves
/// to the next, so the caller's retry reaches another replica.
#[derive(Clone)]
pub struct Client {
    bases: std::sync::Arc<Vec<String>>,
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    token: String,
    http: reqwest::Client,
    /// Sent as the `traceparent` header on JSON calls (an attempt's
    /// heartbeats and completion), see [`crate::trace`].
    traceparent: Option<String>,
}

/// Certificates (PEM) every client built later trusts besides the system's
/// roots: see [`trust_root_pem`].
static EXTRA_ROOTS: std::sync::Mutex<Vec<reqwest::Certificate>> = std::sync::Mutex::new(Vec::new());

/// Trust the certificates of `pem` (a private CA, or a server's self-signed
/// certificate) in every [`Client`] built after this call, besides the
/// system's roots. `kiln up --tls-cert` does this for its own agents; any
/// other process can name such a file in `KILN_CA_CERT`.
pub fn trust_root_pem(pem: &[u8]) -> Result<(), ApiError> {
    let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| ApiError::Decode(e.to_string()))?;
    if certs.is_empty() {
        return Err(ApiError::Decode("no PEM certificate found".into()));
    }
    EXTRA_ROOTS.lock().unwrap_or_else(|e| e.into_inner()).extend(certs);
    Ok(())
}

/// The extra roots: those of [`trust_root_pem`] and of `KILN_CA_CERT`.
fn extra_roots() -> Vec<reqwest::Certificate> {
    let mut roots = EXTRA_ROOTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(path) = std::env::var_os("KILN_CA_CERT").filter(|p| !p.is_empty()) {
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|pem| reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string()))
        {
            Ok(certs) => roots.extend(certs),
            Err(e) => tracing::warn!("KILN_CA_CERT {}: {e}", std::path::Path::new(&path).display()),
        }
    }
    roots
}

/// Check a `--server`/`KILN_SERVER` value (one URL, or several separated
/// by commas): each must be an http(s) URL with a host. The message says
/// how to fix it, e.g. "server URL needs a scheme: http://localhost:7070".
pub fn check_server_urls(servers: &str) -> Result<(), String> {
    let urls: Vec<&str> = servers.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    if urls.is_empty() {
        return Err("no server URL: set KILN_SERVER or pass --server, e.g. http://127.0.0.1:7070".into());
    }
    for u in urls {
        let lower = u.to_ascii_lowercase();
        if !lower.starts_with("http://") && !lower.starts_with("https://") {
            return Err(match u.split_once("://") {
                Some((scheme, _)) => format!("server URL {u}: the scheme must be http or https, not {scheme}"),
                None => format!("server URL needs a scheme: http://{u}"),
            });
        }
        match reqwest::Url::parse(u) {
            Ok(url) if url.host_str().is_some_and(|h| !h.is_empty()) => {}
            Ok(_) => return Err(format!("server URL {u} has no host, e.g. http://127.0.0.1:7070")),
            Err(e) => return Err(format!("server URL {u}: {e}")),
        }
    }
    Ok(())
}

impl Client {
    /// `base` is a server URL, or several separated by commas.
    pub fn new(base: &str, token: &str) -> Client {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // Below the server's header-read timeout (30 s by default), which
            // also closes keep-alive connections idle that long: a pooled
            // connection is dropped here first rather than reused as it closes.
            .pool_idle_timeout(Duration::from_secs(20))
            .tls_certs_merge(extra_roots())
            .build()
            .expect("http client");
        let mut bases: Vec<String> =
            base.split(',').map(|b| b.trim().trim_end_matches('/').to_string()).filter(|b| !b.is_empty()).collect();
        if bases.is_empty() {
            bases.push(String::new());
        }
        Client { bases: bases.into(), current: Default::default(), token: token.to_string(), http, traceparent: None }
    }

    /// The same servers (and connection pool) with another bearer token.
    pub fn with_token(&self, token: &str) -> Client {
        Client { token: token.to_string(), ..self.clone() }
    }

    /// The same client, sending `traceparent` (a W3C trace context) with
    /// its JSON calls: an attempt's calls join the run's trace (issue 19).
    pub fn with_traceparent(&self, traceparent: &str) -> Client {
        Client { traceparent: Some(traceparent.to_string()), ..self.clone() }
    }

    /// The server requests currently go to.
    pub fn base_url(&self) -> &str {
        &self.bases[self.idx()]
    }

    /// Every configured server URL.
    pub fn base_urls(&self) -> &[String] {
        &self.bases
    }

    fn idx(&self) -> usize {
        self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len()
    }

    fn url_at(&self, i: usize, path: &str) -> String {
        format!("{}{}", self.bases[i], path)
    }

    /// A request to server `i` failed in transport: move on to the next
    /// server (once, however many requests saw the failure).
    fn failed(&self, i: usize, e: reqwest::Error) -> ApiError {
        if self.bases.len() > 1 {
            let next = (i + 1) % self.bases.len();
            if self
                .current
                .compare_exchange(i, next, std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed)
                .is_ok()
            {
                tracing::warn!(failed = %self.bases[i], next = %self.bases[next], "server unreachable; switching");
            }
        }
        ApiError::Transport(e.to_string())
    }

    async fn send<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<T, ApiError> {
        let i = self.idx();
        let mut req = self.http.request(method, self.url_at(i, path)).bearer_auth(&self.token);
        if let Some(tp) = &self.traceparent {
            req = req.header(crate::trace::HEADER, tp);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        req = req.timeout(timeout.unwrap_or(Duration::from_secs(60)));
        let resp = req.send().await.map_err(|e| self.failed(i, e))?;
        decode(resp).await
    }

    // ----- public API -----

    pub async fn create_repo(&self, body: &CreateRepo) -> Result<Repo, ApiError> {
        self.send(Method::POST, "/v1/repos", Some(body), &[], None).await
    }

    pub async fn get_repo(&self, repo: &str) -> Result<Repo, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/repos/{}", enc(repo)), None, &[], None).await
    }

    pub async fn update_repo(&self, repo: &str, body: &UpdateRepo) -> Result<Repo, ApiError> {
        self.send(Method::PATCH, &format!("/v1/repos/{}", enc(repo)), Some(body), &[], None).await
    }

    /// `DELETE /v1/repos/{repo}`: the removed repository.
    pub async fn delete_repo(&self, repo: &str) -> Result<Repo, ApiError> {
        self.send::<(), _>(Method::DELETE, &format!("/v1/repos/{}", enc(repo)), None, &[], None).await
    }

    pub async fn hook_info(&self, repo: &str) -> Result<HookInfo, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/repos/{}/hook-info", enc(repo)), None, &[], None).await
    }

    pub async fn deliveries(&self, repo: &str, limit: u32) -> Result<Vec<Delivery>, ApiError> {
        #[derive(serde::Deserialize)]
        struct List {
            deliveries: Vec<Delivery>,
        }
        let path = format!("/v1/repos/{}/deliveries?limit={limit}", enc(repo));
        let r: List = self.send::<(), _>(Method::GET, &path, None, &[], None).await?;
        Ok(r.deliveries)
    }

    pub async fn list_repos(&self) -> Result<Vec<Repo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Repos {
            repos: Vec<Repo>,
        }
        let r: Repos = self.send::<(), _>(Method::GET, "/v1/repos", None, &[], None).await?;
        Ok(r.repos)
    }

    pub async fn put_secret(&self, repo: &str, name: &str, value: &str) -> Result<SecretInfo, ApiError> {
        let body = PutSecret { value: value.to_string() };
        self.send(Method::PUT, &format!("/v1/repos/{}/secrets/{}", enc(repo), enc(name)), Some(&body), &[], None).await
    }

    pub async fn list_secrets(&self, repo: &str) -> Result<Vec<SecretInfo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Secrets {
            secrets: Vec<SecretInfo>,
        }
        let r: Secrets =
            self.send::<(), _>(Method::GET, &format!("/v1/repos/{}/secrets", enc(repo)), None, &[], None).await?;
        Ok(r.secrets)
    }

    pub async fn delete_secret(&self, repo: &str, name: &str) -> Result<(), ApiError> {
        let _: serde_json::Value = self
            .send::<(), _>(Method::DELETE, &format!("/v1/repos/{}/secrets/{}", enc(repo), enc(name)), None, &[], None)
            .await?;
        Ok(())
    }

    /// `PUT /v1/environments/{env}/secrets/{name}` (issue 46).
    pub async fn put_env_secret(&self, env: &str, name: &str, value: &str) -> Result<SecretInfo, ApiError> {
        let body = PutSecret { value: value.to_string() };
        self.send(Method::PUT, &format!("/v1/environments/{}/secrets/{}", enc(env), enc(name)), Some(&body), &[], None)
            .await
    }

    pub async fn list_env_secrets(&self, env: &str) -> Result<Vec<SecretInfo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Secrets {
            secrets: Vec<SecretInfo>,
        }
        let r: Secrets =
            self.send::<(), _>(Method::GET, &format!("/v1/environments/{}/secrets", enc(env)), None, &[], None).await?;
        Ok(r.secrets)
    }

    pub async fn delete_env_secret(&self, env: &str, name: &str) -> Result<(), ApiError> {
        let path = format!("/v1/environments/{}/secrets/{}", enc(env), enc(name));
        let _: serde_json::Value = self.send::<(), _>(Method::DELETE, &path, None, &[], None).await?;
        Ok(())
    }

    pub async fn create_notification(&self, repo: &str, body: &CreateNotification) -> Result<Notification, ApiError> {
        self.send(Method::POST, &format!("/v1/repos/{}/notifications", enc(repo)), Some(body), &[], None).await
    }

    pub async fn list_notifications(&self, repo: &str) -> Result<Vec<Notification>, ApiError> {
        #[derive(serde::Deserialize)]
        struct List {
            notifications: Vec<Notification>,
        }
        let path = format!("/v1/repos/{}/notifications", enc(repo));
        let r: List = self.send::<(), _>(Method::GET, &path, None, &[], None).await?;
        Ok(r.notifications)
    }

    /// `DELETE /v1/repos/{repo}/notifications/{id}`: the removed notification.
    pub async fn delete_notification(&self, repo: &str, id: &str) -> Result<Notification, ApiError> {
        let path = format!("/v1/repos/{}/notifications/{}", enc(repo), enc(id));
        self.send::<(), _>(Method::DELETE, &path, None, &[], None).await
    }

    /// The delivery log, newest first.
    pub async fn notification_deliveries(&self, repo: &str, limit: u32) -> Result<Vec<NotificationDelivery>, ApiError> {
        #[derive(serde::Deserialize)]
        struct List {
            deliveries: Vec<NotificationDelivery>,
        }
        let path = format!("/v1/repos/{}/notifications/deliveries?limit={limit}", enc(repo));
        let r: List = self.send::<(), _>(Method::GET, &path, None, &[], None).await?;
        Ok(r.deliveries)
    }

    pub async fn submit_run(
        &self,
        repo: &str,
        body: &SubmitRun,
        idempotency_key: Option<&str>,
    ) -> Result<SubmitRunResponse, ApiError> {
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
        self.send(Method::POST, &format!("/v1/repos/{}/workflow-runs", enc(repo)), Some(body), &headers, None).await
    }

    /// The inputs the workflow at `git_ref` declares (`GET
    /// /v1/repos/{repo}/workflow-inputs`).
    pub async fn workflow_inputs(
        &self,
        repo: &str,
        git_ref: &str,
        workflow: Option<&str>,
    ) -> Result<crate::WorkflowInputs, ApiError> {
        let mut path = format!("/v1/repos/{}/workflow-inputs?ref={}", enc(repo), enc(git_ref));
        if let Some(w) = workflow {
            path.push_str(&format!("&workflow={}", enc(w)));
        }
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// The workflow files at `git_ref` and which a run without a workflow path starts.
    pub async fn list_workflows(&self, repo: &str, git_ref: &str) -> Result<crate::WorkflowList, ApiError> {
        let path = format!("/v1/repos/{}/workflows?ref={}", enc(repo), enc(git_ref));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    pub async fn list_runs(&self, repo: &str, status: Option<&str>, limit: Option<u32>) -> Result<RunList, ApiError> {
        self.list_runs_before(repo, status, limit, None).await
    }

    /// [`Self::list_runs`] from the page after `before` (a previous page's
    /// `next_before`).
    pub async fn list_runs_before(
        &self,
        repo: &str,
        status: Option<&str>,
        limit: Option<u32>,
        before: Option<&str>,
    ) -> Result<RunList, ApiError> {
        let mut q = vec![];
        if let Some(b) = before {
            q.push(format!("before={}", enc(b)));
        }
        if let Some(s) = status {
            q.push(format!("status={}", enc(s)));
        }
        if let Some(l) = limit {
            q.push(format!("limit={l}"));
        }
        let path = format!("/v1/repos/{}/workflow-runs?{}", enc(repo), q.join("&"));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// Runs newest first: of one repository (`GET
    /// /v1/repos/{repo}/workflow-runs`) or of all (`GET /v1/workflow-runs`),
    /// filtered by status and branch.
    pub async fn find_runs(
        &self,
        repo: Option<&str>,
        status: Option<&str>,
        branch: Option<&str>,
        event: Option<&str>,
        limit: Option<u32>,
    ) -> Result<RunList, ApiError> {
        let mut q = vec![];
        for (k, v) in [("status", status), ("branch", branch), ("event", event)] {
            if let Some(v) = v {
                q.push(format!("{k}={}", enc(v)));
            }
        }
        if let Some(l) = limit {
            q.push(format!("limit={l}"));
        }
        let path = match repo {
            Some(r) => format!("/v1/repos/{}/workflow-runs?{}", enc(r), q.join("&")),
            None => format!("/v1/workflow-runs?{}", q.join("&")),
        };
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    pub async fn get_run(&self, run: &str) -> Result<Run, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/workflow-runs/{}", enc(run)), None, &[], None).await
    }

    // ----- teams, lanes and the queue (issue 44) -----

    pub async fn list_teams(&self) -> Result<crate::TeamList, ApiError> {
        self.send::<(), _>(Method::GET, "/v1/teams", None, &[], None).await
    }

    pub async fn create_team(&self, body: &crate::CreateTeam) -> Result<crate::Team, ApiError> {
        self.send(Method::POST, "/v1/teams", Some(body), &[], None).await
    }

    pub async fn update_team(&self, team: &str, body: &crate::UpdateTeam) -> Result<crate::Team, ApiError> {
        self.send(Method::PATCH, &format!("/v1/teams/{}", enc(team)), Some(body), &[], None).await
    }

    pub async fn delete_team(&self, team: &str) -> Result<crate::Team, ApiError> {
        self.send::<(), _>(Method::DELETE, &format!("/v1/teams/{}", enc(team)), None, &[], None).await
    }

    pub async fn list_environments(&self) -> Result<crate::EnvironmentList, ApiError> {
        self.send::<(), _>(Method::GET, "/v1/environments", None, &[], None).await
    }

    pub async fn get_environment(&self, env: &str) -> Result<crate::Environment, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/environments/{}", enc(env)), None, &[], None).await
    }

    pub async fn create_environment(&self, body: &crate::CreateEnvironment) -> Result<crate::Environment, ApiError> {
        self.send(Method::POST, "/v1/environments", Some(body), &[], None).await
    }

    pub async fn update_environment(
        &self,
        env: &str,
        body: &crate::UpdateEnvironment,
    ) -> Result<crate::Environment, ApiError> {
        self.send(Method::PATCH, &format!("/v1/environments/{}", enc(env)), Some(body), &[], None).await
    }

    pub async fn delete_environment(&self, env: &str) -> Result<crate::Environment, ApiError> {
        self.send::<(), _>(Method::DELETE, &format!("/v1/environments/{}", enc(env)), None, &[], None).await
    }

    /// Approve or reject a run's deployment to an environment.
    pub async fn decide_deployment(
        &self,
        run: &str,
        body: &crate::DecideDeployment,
    ) -> Result<crate::Approval, ApiError> {
        self.send(Method::POST, &format!("/v1/workflow-runs/{}/approvals", enc(run)), Some(body), &[], None).await
    }

    /// An environment's deployments, newest first.
    pub async fn deployments(&self, env: &str, limit: u32) -> Result<crate::DeploymentList, ApiError> {
        let path = format!("/v1/environments/{}/deployments?limit={limit}", enc(env));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// `POST /v1/environments/{env}/rollback`.
    pub async fn rollback(&self, env: &str, req: &crate::RollbackRequest) -> Result<crate::RollbackAccepted, ApiError> {
        let path = format!("/v1/environments/{}/rollback", enc(env));
        self.send(Method::POST, &path, Some(req), &[], None).await
    }

    /// `GET /v1/workflow-runs/{run}/rings`.
    pub async fn run_rings(&self, run: &str) -> Result<crate::RingPromotionList, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/workflow-runs/{}/rings", enc(run)), None, &[], None).await
    }

    /// `POST /v1/workflow-runs/{run}/promote` (`pause: false`) or `/pause`: the run's next
    /// promotion between rings.
    pub async fn promote_run(&self, run: &str, pause: bool) -> Result<crate::RingPromotion, ApiError> {
        let what = if pause { "pause" } else { "promote" };
        self.send::<(), _>(Method::POST, &format!("/v1/workflow-runs/{}/{what}", enc(run)), None, &[], None).await
    }

    pub async fn run_approvals(&self, run: &str) -> Result<crate::ApprovalList, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/workflow-runs/{}/approvals", enc(run)), None, &[], None).await
    }

    pub async fn queue(&self) -> Result<crate::QueueView, ApiError> {
        self.send::<(), _>(Method::GET, "/v1/queue", None, &[], None).await
    }

    pub async fn set_priority(&self, run: &str, priority: &str) -> Result<Run, ApiError> {
        let body = crate::SetPriority { priority: priority.to_string() };
        self.send(Method::POST, &format!("/v1/workflow-runs/{}/priority", enc(run)), Some(&body), &[], None).await
    }

    pub async fn cancel_run(&self, run: &str) -> Result<Run, ApiError> {
        self.send::<(), _>(Method::POST, &format!("/v1/workflow-runs/{}/cancel", enc(run)), None, &[], None).await
    }

    pub async fn retry_run(&self, run: &str) -> Result<SubmitRunResponse, ApiError> {
        self.send::<(), _>(Method::POST, &format!("/v1/workflow-runs/{}/retry", enc(run)), None, &[], None).await
    }

    /// `POST /v1/workflow-runs/{run}/retry` with a body: `failed: true`
    /// retries from the failed jobs only.
    pub async fn retry_run_with(&self, run: &str, body: &RetryRun) -> Result<SubmitRunResponse, ApiError> {
        self.send(Method::POST, &format!("/v1/workflow-runs/{}/retry", enc(run)), Some(body), &[], None).await
    }

    /// `POST /v1/workflow-runs/{run}/jobs/{job}/retry` (issue 42): a new run
    /// in which `job` and everything downstream of it run again.
    pub async fn retry_job(&self, run: &str, job: &str) -> Result<SubmitRunResponse, ApiError> {
        let path = format!("/v1/workflow-runs/{}/jobs/{}/retry", enc(run), enc(job));
        self.send::<(), _>(Method::POST, &path, None, &[], None).await
    }

    /// `POST /v1/workflow-runs/{run}/jobs/{job}/cancel` (issue 42): cancel
    /// one job of an active run; the run as it now stands.
    pub async fn cancel_job(&self, run: &str, job: &str) -> Result<Run, ApiError> {
        let path = format!("/v1/workflow-runs/{}/jobs/{}/cancel", enc(run), enc(job));
        self.send::<(), _>(Method::POST, &path, None, &[], None).await
    }

    /// `GET /v1/workflow-runs/{run}/artifacts` (issue 42).
    pub async fn run_artifacts(&self, run: &str) -> Result<RunArtifacts, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/workflow-runs/{}/artifacts", enc(run)), None, &[], None).await
    }

    /// `GET /v1/workflow-runs/{run}/tests` (issue 43).
    pub async fn run_tests(&self, run: &str, failed_only: bool) -> Result<RunTests, ApiError> {
        let q = if failed_only { "?failed=true" } else { "" };
        self.send::<(), _>(Method::GET, &format!("/v1/workflow-runs/{}/tests{q}", enc(run)), None, &[], None).await
    }

    /// `GET /v1/repos/{repo}/tests/history?id=TEST_ID`.
    pub async fn test_history(&self, repo: &str, test_id: &str, limit: u32) -> Result<TestHistory, ApiError> {
        let path = format!("/v1/repos/{}/tests/history?id={}&limit={limit}", enc(repo), enc(test_id));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// `GET /v1/repos/{repo}/tests/timings?ref=REF`.
    pub async fn test_timings(&self, repo: &str, git_ref: Option<&str>) -> Result<TestTimings, ApiError> {
        let q = git_ref.map(|r| format!("?ref={}", enc(r))).unwrap_or_default();
        self.send::<(), _>(Method::GET, &format!("/v1/repos/{}/tests/timings{q}", enc(repo)), None, &[], None).await
    }

    /// `POST /v1/repos/{repo}/quarantine`.
    pub async fn quarantine(&self, repo: &str, body: &CreateQuarantine) -> Result<Quarantine, ApiError> {
        self.send(Method::POST, &format!("/v1/repos/{}/quarantine", enc(repo)), Some(body), &[], None).await
    }

    /// `DELETE /v1/repos/{repo}/quarantine?id=TEST_ID`: the ended quarantine.
    pub async fn unquarantine(&self, repo: &str, test_id: &str) -> Result<Quarantine, ApiError> {
        let path = format!("/v1/repos/{}/quarantine?id={}", enc(repo), enc(test_id));
        self.send::<(), _>(Method::DELETE, &path, None, &[], None).await
    }

    /// `GET /v1/repos/{repo}/quarantine`.
    pub async fn list_quarantine(&self, repo: &str) -> Result<Vec<Quarantine>, ApiError> {
        #[derive(serde::Deserialize)]
        struct List {
            quarantine: Vec<Quarantine>,
        }
        let path = format!("/v1/repos/{}/quarantine", enc(repo));
        let r: List = self.send::<(), _>(Method::GET, &path, None, &[], None).await?;
        Ok(r.quarantine)
    }

    /// Streams the SSE log events of a job, resuming after `last_event_id`.
    pub async fn log_events(
        &self,
        job: &str,
        last_event_id: Option<&str>,
    ) -> Result<impl Stream<Item = Result<SseEvent, ApiError>> + use<>, ApiError> {
        self.log_events_with(job, last_event_id, true).await
    }

    /// [`Client::log_events`]; with `follow` false (`?follow=false`) the
    /// server ends the stream once it has sent what is written now, even
    /// while the job still runs (an older server ignores it and follows).
    pub async fn log_events_with(
        &self,
        job: &str,
        last_event_id: Option<&str>,
        follow: bool,
    ) -> Result<impl Stream<Item = Result<SseEvent, ApiError>> + use<>, ApiError> {
        use eventsource_stream::Eventsource;
        let i = self.idx();
        let query = if follow { "" } else { "?follow=false" };
        let mut req = self
            .http
            .get(self.url_at(i, &format!("/v1/jobs/{}/logs/events{query}", enc(job))))
            .bearer_auth(&self.token)
            .header("Accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = req.send().await.map_err(|e| self.failed(i, e))?;
        if !resp.status().is_success() {
            return Err(decode::<serde_json::Value>(resp).await.err().unwrap_or(ApiError::Decode("error".into())));
        }
        Ok(resp.bytes_stream().eventsource().map(|r| match r {
            Ok(ev) => Ok(SseEvent { id: ev.id, event: ev.event, data: ev.data }),
            Err(e) => Err(ApiError::Transport(e.to_string())),
        }))
    }

    // ----- access (admin scope) -----

    pub async fn create_token(&self, body: &CreateToken) -> Result<CreatedToken, ApiError> {
        self.send(Method::POST, "/v1/tokens", Some(body), &[], None).await
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct L {
            tokens: Vec<TokenInfo>,
        }
        Ok(self.send::<(), L>(Method::GET, "/v1/tokens", None, &[], None).await?.tokens)
    }

    pub async fn revoke_token(&self, id: &str) -> Result<(), ApiError> {
        let _: serde_json::Value =
            self.send::<(), _>(Method::DELETE, &format!("/v1/tokens/{}", enc(id)), None, &[], None).await?;
        Ok(())
    }

    pub async fn create_join_token(&self, body: &CreateJoinToken) -> Result<CreatedJoinToken, ApiError> {
        self.send(Method::POST, "/v1/agent-tokens", Some(body), &[], None).await
    }

    pub async fn list_join_tokens(&self) -> Result<Vec<JoinTokenInfo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct L {
            agent_tokens: Vec<JoinTokenInfo>,
        }
        Ok(self.send::<(), L>(Method::GET, "/v1/agent-tokens", None, &[], None).await?.agent_tokens)
    }

    pub async fn revoke_join_token(&self, id: &str) -> Result<(), ApiError> {
        let _: serde_json::Value =
            self.send::<(), _>(Method::DELETE, &format!("/v1/agent-tokens/{}", enc(id)), None, &[], None).await?;
        Ok(())
    }

    pub async fn list_agents(&self) -> Result<Vec<AgentInfo>, ApiError> {
        #[derive(serde::Deserialize)]
        struct L {
            agents: Vec<AgentInfo>,
        }
        Ok(self.send::<(), L>(Method::GET, "/v1/agents", None, &[], None).await?.agents)
    }

    /// `GET /v1/overview`: queue, agents and running jobs (admin scope).
    pub async fn overview(&self) -> Result<Overview, ApiError> {
        self.send::<(), Overview>(Method::GET, "/v1/overview", None, &[], None).await
    }

    pub async fn remove_agent(&self, id: &str) -> Result<(), ApiError> {
        let _: serde_json::Value =
            self.send::<(), _>(Method::DELETE, &format!("/v1/agents/{}", enc(id)), None, &[], None).await?;
        Ok(())
    }

    /// Newest first; `before`: only entries with a smaller id (paging).
    pub async fn audit(&self, before: Option<i64>, limit: u32) -> Result<Vec<AuditEntry>, ApiError> {
        #[derive(serde::Deserialize)]
        struct L {
            entries: Vec<AuditEntry>,
        }
        let mut path = format!("/v1/audit?limit={limit}");
        if let Some(b) = before {
            path.push_str(&format!("&before={b}"));
        }
        Ok(self.send::<(), L>(Method::GET, &path, None, &[], None).await?.entries)
    }

    // ----- agent API -----

    pub async fn register_agent(&self, body: &RegisterAgent) -> Result<AgentRegistration, ApiError> {
        self.send(Method::POST, "/v1/agents/register", Some(body), &[], None).await
    }

    /// `POST /v1/agents/{agent}/drain` (session credential): this agent
    /// drains; `GET /v1/agents` shows it.
    pub async fn report_draining(&self, agent_id: &str) -> Result<(), ApiError> {
        let path = format!("/v1/agents/{}/drain", enc(agent_id));
        let _: serde_json::Value =
            self.send::<(), _>(Method::POST, &path, None, &[], Some(Duration::from_secs(10))).await?;
        Ok(())
    }

    pub async fn claim(&self, agent_id: &str, body: &ClaimRequest) -> Result<ClaimResponse, ApiError> {
        let timeout = Duration::from_millis(body.wait_ms) + Duration::from_secs(15);
        self.send(Method::POST, &format!("/v1/agents/{}/claim", enc(agent_id)), Some(body), &[], Some(timeout)).await
    }

    pub async fn heartbeat(&self, job: &str, epoch: i64) -> Result<HeartbeatResponse, ApiError> {
        self.send::<(), _>(
            Method::POST,
            &format!("/v1/jobs/{}/attempts/{epoch}/heartbeat", enc(job)),
            None,
            &[],
            Some(Duration::from_secs(10)),
        )
        .await
    }

    pub async fn append_log(&self, job: &str, epoch: i64, chunk: &LogChunk) -> Result<LogAck, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/logs", enc(job)), Some(chunk), &[], None).await
    }

    /// Several small chunks in one request (see [`LogChunkBatch`]).
    pub async fn append_log_batch(
        &self,
        job: &str,
        epoch: i64,
        batch: &LogChunkBatch,
    ) -> Result<LogBatchAck, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/logs/batch", enc(job)), Some(batch), &[], None)
            .await
    }

    /// [`Self::append_log`] with the bytes as the body (see [`RawLogChunk`]).
    pub async fn append_log_raw(&self, job: &str, epoch: i64, chunk: &RawLogChunk) -> Result<LogAck, ApiError> {
        use crate::types::log_headers as h;
        let i = self.idx();
        let mut req = self
            .http
            .post(self.url_at(i, &format!("/v1/jobs/{}/attempts/{epoch}/logs", enc(job))))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(h::STREAM, &chunk.stream)
            .header(h::SEQ, chunk.seq.to_string())
            .header(h::OFFSET, chunk.offset.to_string());
        if let Some(sha) = &chunk.sha256 {
            req = req.header(h::SHA256, sha);
        }
        if let Some(crc) = &chunk.crc32c {
            req = req.header(h::CRC32C, crc);
        }
        if chunk.in_order {
            req = req.header(h::IN_ORDER, "1");
        }
        let resp = req
            .body(chunk.data.clone())
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| self.failed(i, e))?;
        decode(resp).await
    }

    pub async fn complete(&self, job: &str, epoch: i64, body: &Completion) -> Result<CompletionAck, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/complete", enc(job)), Some(body), &[], None)
            .await
    }

    /// Agent: the recorded test durations for the attempt's `kiln tests split`.
    pub async fn attempt_timings(&self, job: &str, epoch: i64) -> Result<TestTimings, ApiError> {
        self.send::<(), _>(Method::GET, &format!("/v1/jobs/{}/attempts/{epoch}/timings", enc(job)), None, &[], None)
            .await
    }

    /// A step's `kiln tests next` (issue 43), with the attempt's shard
    /// capability as this client's token.
    pub async fn shard_next(&self, job: &str, epoch: i64, body: &ShardNext) -> Result<ShardBatch, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/shards/next", enc(job)), Some(body), &[], None)
            .await
    }

    /// Agent: stage one parsed test report of the attempt (issue 43).
    pub async fn stage_report(&self, job: &str, epoch: i64, body: &ReportUpload) -> Result<ReportAck, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/reports", enc(job)), Some(body), &[], None).await
    }

    /// A fenced attempt's sandbox is gone (issue 40, item 5): a cancel that
    /// waits for it can end.
    pub async fn release(&self, job: &str, epoch: i64, body: &SandboxEnd) -> Result<ReleaseAck, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/release", enc(job)), Some(body), &[], None).await
    }

    /// Commit the digest of the image this attempt built; returns the job's
    /// committed digest (the first one committed wins).
    pub async fn commit_image(&self, job: &str, epoch: i64, body: &ImageCommit) -> Result<ImageCommit, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/image", enc(job)), Some(body), &[], None).await
    }
}

impl Client {
    // ----- artifacts -----

    pub async fn create_upload(&self, job: &str, epoch: i64, body: &CreateUpload) -> Result<UploadSession, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/artifacts", enc(job)), Some(body), &[], None)
            .await
    }

    /// Upload one part to a capability URL (`part_url` with `{part}` replaced).
    pub async fn put_part(&self, url: &str, body: reqwest::Body) -> Result<PartReceipt, ApiError> {
        let resp = self
            .http
            .put(url)
            .body(body)
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        decode(resp).await
    }

    /// Presigned sessions: the request that uploads part `part`.
    pub async fn part_url(
        &self,
        job: &str,
        epoch: i64,
        generation: &str,
        part: u64,
        body: &PartUrlRequest,
    ) -> Result<PresignedPart, ApiError> {
        self.send(
            Method::POST,
            &format!("/v1/jobs/{}/attempts/{epoch}/artifacts/{}/parts/{part}", enc(job), enc(generation)),
            Some(body),
            &[],
            None,
        )
        .await
    }

    /// `PUT` a part to the object store through a presigned request (no
    /// Kiln credentials); returns the store's ETag.
    pub async fn put_presigned(&self, req: &PresignedPart, body: reqwest::Body) -> Result<String, ApiError> {
        let mut r = self.http.put(&req.url).body(body).timeout(Duration::from_secs(600));
        for (k, v) in &req.headers {
            r = r.header(k, v);
        }
        let resp = r.send().await.map_err(|e| ApiError::Transport(e.to_string()))?;
        let status = resp.status();
        let etag = resp.headers().get(reqwest::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
        match etag {
            Some(etag) if status.is_success() => Ok(etag),
            _ => {
                let text = resp.text().await.unwrap_or_default();
                Err(ApiError::Status {
                    status: status.as_u16(),
                    code: "object_store".into(),
                    message: format!(
                        "the object store answered {status}: {}",
                        text.chars().take(500).collect::<String>()
                    ),
                })
            }
        }
    }

    pub async fn seal(
        &self,
        job: &str,
        epoch: i64,
        generation: &str,
        sha256: Option<&str>,
        parts: Vec<UploadedPart>,
    ) -> Result<SealedGeneration, ApiError> {
        let body = SealRequest { sha256: sha256.map(str::to_string), parts };
        self.send(
            Method::POST,
            &format!("/v1/jobs/{}/attempts/{epoch}/artifacts/{}/seal", enc(job), enc(generation)),
            Some(&body),
            &[],
            Some(Duration::from_secs(600)),
        )
        .await
    }

    pub async fn restore(&self, job: &str, epoch: i64, body: &RestoreRequest) -> Result<ArtifactDownload, ApiError> {
        self.send(Method::POST, &format!("/v1/jobs/{}/attempts/{epoch}/restore", enc(job)), Some(body), &[], None).await
    }

    /// Agent: find a cache entry among `candidates` (namespaces this run may read).
    pub async fn cache_lookup(&self, job: &str, epoch: i64, body: &CacheLookup) -> Result<CacheLookupResult, ApiError> {
        let path = format!("/v1/jobs/{}/attempts/{epoch}/cache/lookup", enc(job));
        self.send(Method::POST, &path, Some(body), &[], None).await
    }

    /// Agent: bind a sealed `@cache` upload of this live attempt to its key.
    pub async fn cache_save(&self, job: &str, epoch: i64, body: &CacheSave) -> Result<CacheSaved, ApiError> {
        let path = format!("/v1/jobs/{}/attempts/{epoch}/cache/save", enc(job));
        self.send(Method::POST, &path, Some(body), &[], None).await
    }

    /// Agent: what happened to the job's cache (shown in the run).
    pub async fn cache_report(&self, job: &str, epoch: i64, body: &CacheInfo) -> Result<(), ApiError> {
        let path = format!("/v1/jobs/{}/attempts/{epoch}/cache/report", enc(job));
        let _: serde_json::Value = self.send(Method::POST, &path, Some(body), &[], None).await?;
        Ok(())
    }

    /// Public API: a download capability for a run's bound artifact.
    /// The DSSE envelope of a bound artifact's provenance (issue 45), as JSON.
    pub async fn artifact_provenance(&self, run: &str, job: &str, name: &str) -> Result<serde_json::Value, ApiError> {
        let path = format!("/v1/workflow-runs/{}/artifacts/{}/{}/provenance", enc(run), enc(job), enc(name));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// The DSSE envelope of a job's Test Result statement (issue 45), as JSON.
    pub async fn test_attestation(&self, run: &str, job: &str) -> Result<serde_json::Value, ApiError> {
        let path = format!("/v1/workflow-runs/{}/jobs/{}/test-attestation", enc(run), enc(job));
        self.send::<(), _>(Method::GET, &path, None, &[], None).await
    }

    /// The server's provenance keys (JWKS).
    pub async fn attestation_keys(&self) -> Result<serde_json::Value, ApiError> {
        self.send::<(), _>(Method::GET, "/.well-known/kiln-attestation-keys.json", None, &[], None).await
    }

    pub async fn artifact(&self, run: &str, job: &str, name: &str) -> Result<ArtifactDownload, ApiError> {
        self.send::<(), _>(
            Method::GET,
            &format!("/v1/workflow-runs/{}/artifacts/{}/{}", enc(run), enc(job), enc(name)),
            None,
            &[],
            None,
        )
        .await
    }

    /// `GET` a capability URL (artifact bytes) as a response to stream.
    pub async fn download(&self, url: &str) -> Result<reqwest::Response, ApiError> {
        let resp = self.http.get(url).send().await.map_err(|e| ApiError::Transport(e.to_string()))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(decode::<serde_json::Value>(resp).await.err().unwrap_or(ApiError::Decode("error".into())))
    }

    /// Open the agent session stream (fast loss detection). The returned
    /// response's body must be read (or kept) for as long as the agent lives.
    /// The session is the one the client's credential names (`session_id`
    /// is also sent for older servers).
    pub async fn open_session(&self, agent_id: &str, session_id: &str) -> Result<reqwest::Response, ApiError> {
        let i = self.idx();
        let resp = self
            .http
            .get(self.url_at(i, &format!("/v1/agents/{}/session?session_id={}", enc(agent_id), enc(session_id))))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.failed(i, e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(decode::<serde_json::Value>(resp).await.err().unwrap_or(ApiError::Decode("error".into())))
    }
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, ApiError> {
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| ApiError::Transport(e.to_string()))?;
    if status.is_success() {
        let slice: &[u8] = if bytes.is_empty() && status == StatusCode::NO_CONTENT { b"null" } else { &bytes };
        return serde_json::from_slice(slice).map_err(|e| ApiError::Decode(format!("{e}")));
    }
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(b) => Err(ApiError::Status { status: status.as_u16(), code: b.error.code, message: b.error.message }),
        Err(_) => Err(ApiError::Status {
            status: status.as_u16(),
            code: "http".into(),
            message: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
        }),
    }
}

/// Percent-encode a path segment (names may contain spaces).
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod server_url_tests {
    use super::check_server_urls;

    #[test]
    fn server_urls_need_an_http_scheme_and_a_host() {
        assert!(check_server_urls("http://localhost:7070").is_ok());
        assert!(check_server_urls("https://ci.example.com, http://10.0.0.1:7070/").is_ok());
        assert_eq!(
            check_server_urls("localhost:7070").unwrap_err(),
            "server URL needs a scheme: http://localhost:7070"
        );
        assert!(check_server_urls("ftp://x").unwrap_err().contains("http or https"));
        assert!(check_server_urls("http://").is_err());
        assert!(check_server_urls("").is_err());
    }
}
