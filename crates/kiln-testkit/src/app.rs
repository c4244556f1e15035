//! `TestApp`: the whole server in process — SQLite store and local object
//! store in a temporary directory, a manual clock, fresh tokens — called
//! through its axum `Router` without a socket (`tower::ServiceExt::oneshot`).
//! Background work runs only when the test says so ([`TestApp::run_pending_work`]),
//! so tests never sleep to let a loop catch up.
//!
//! What the app cannot move: the store takes lease time and outbox backoff
//! from the database clock, so [`TestApp::advance`] shortens capabilities
//! and ages grace periods (log archival, garbage collection) but does not
//! expire a lease; configure a short `lease_ttl` for that.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use kiln_server::{App, AppParts, ManualClock, ServerConfig, WorkDone};
use kiln_store::{SqliteStore, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// Largest response body a test reads whole.
const MAX_RESPONSE: usize = 256 * 1024 * 1024;

pub struct TestApp {
    app: App,
    router: Router,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    admin_token: String,
    agent_token: String,
    dir: Arc<tempfile::TempDir>,
    /// The PostgreSQL database, when not the SQLite file in `dir`.
    database_url: Option<String>,
}

impl TestApp {
    /// A server with the default configuration.
    pub async fn new() -> TestApp {
        Self::with_config(|_| {}).await
    }

    /// A server whose configuration `tune` adjusts (data dir and listen
    /// address are the test's).
    pub async fn with_config(tune: impl FnOnce(&mut ServerConfig)) -> TestApp {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        Self::open(dir, None, tune).await
    }

    /// A server on a fresh database of the shared test PostgreSQL server;
    /// None when PostgreSQL is not installed.
    pub async fn on_postgres() -> Option<TestApp> {
        let pg = crate::TempPostgres::shared()?;
        let url = pg.create_database().await.expect("create database");
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        Some(Self::open(dir, Some(url), |_| {}).await)
    }

    /// Another server on this one's database, objects and data directory
    /// (a replica, or this server restarted), with its own clock set to
    /// this one's time.
    pub async fn replica(&self) -> TestApp {
        let other = Self::open(self.dir.clone(), self.database_url.clone(), |_| {}).await;
        other.clock.set_ms(kiln_server::Clock::now_ms(&*self.clock));
        other
    }

    async fn open(
        dir: Arc<tempfile::TempDir>,
        database_url: Option<String>,
        tune: impl FnOnce(&mut ServerConfig),
    ) -> TestApp {
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        let mut config = ServerConfig::new(data.clone(), "kiln.test:80".into());
        // Links are built from the public URL, never from a request's Host.
        config.public_url = Some("http://kiln.test".into());
        // API tests register placeholder clone URLs.
        config.probe_clone_urls = false;
        // Runs are not refused because the host's disk is nearly full (a CI
        // machine's may be); tests of the levels set their own.
        config.degradation.storage_pct = kiln_core::degradation::STORAGE_OFF;
        tune(&mut config);
        let store: Arc<dyn Store> = match &database_url {
            None => Arc::new(SqliteStore::open(&data.join("kiln.db")).await.expect("sqlite store")),
            Some(url) => Arc::new(kiln_store::PgStore::connect(url).await.expect("postgres store")),
        };
        let blob = kiln_blob::BlobStore::open_url("", &data.join("objects")).expect("local object store");
        let clock = Arc::new(ManualClock::new());
        let (admin_token, agent_token) = ("kiln_admin_test".to_string(), "kiln_agent_test".to_string());
        let app = App::new(AppParts {
            config,
            store: store.clone(),
            blob,
            admin_token: admin_token.clone(),
            agent_token: agent_token.clone(),
            blob_key: b"test blob key".to_vec(),
            secrets: kiln_server::sealing::SecretBox::from_hex(&"5e".repeat(32)).expect("key"),
            oidc: kiln_server::oidc::Issuer::open(&dir.path().join("oidc")).expect("oidc keys"),
            clock: clock.clone(),
        });
        let router = app.router();
        TestApp { app, router, store, clock, admin_token, agent_token, dir, database_url }
    }

    /// Requests with the admin token (the public API).
    pub fn admin(&self) -> Caller<'_> {
        Caller { app: self, token: Some(self.admin_token.clone()) }
    }

    /// Requests with the agent join token (`DATA_DIR/agent.token`): it
    /// registers agents and does nothing else.
    pub fn agent(&self) -> Caller<'_> {
        Caller { app: self, token: Some(self.agent_token.clone()) }
    }

    /// Requests with `token`: an agent's session credential, an attempt's
    /// token, a scoped API token.
    pub fn with_token(&self, token: &str) -> Caller<'_> {
        Caller { app: self, token: Some(token.to_string()) }
    }

    /// Requests of the agent session that holds `a` (its attempt token).
    pub fn holder(&self, a: &kiln_api::Assignment) -> Caller<'_> {
        self.with_token(&a.attempt_token)
    }

    /// Requests without a token (health, data plane, refusals).
    pub fn anonymous(&self) -> Caller<'_> {
        Caller { app: self, token: None }
    }

    /// Run every background round until a pass finds nothing left to do.
    pub async fn run_pending_work(&self) -> WorkDone {
        self.app.run_pending_work().await.expect("background work")
    }

    /// Jump the server clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    pub fn app(&self) -> &App {
        &self.app
    }

    /// The store, for arranging what the API cannot (and for asserting).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The server's data directory (objects, mirrors, database).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Register `repo` as `name`; it must succeed.
    pub async fn add_repo(&self, name: &str, repo: &crate::TestRepo) {
        let body = serde_json::json!({ "name": name, "clone_url": repo.path().display().to_string() });
        self.admin().post("/v1/repos").json(&body).send().await.assert_status(StatusCode::CREATED);
    }
}

/// Builds requests with one token (or none).
pub struct Caller<'a> {
    app: &'a TestApp,
    token: Option<String>,
}

impl<'a> Caller<'a> {
    pub fn request(&self, method: Method, path: &str) -> TestRequest<'a> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("kiln.test"));
        if let Some(t) = &self.token {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {t}")).expect("token"));
        }
        TestRequest { router: &self.app.router, method, uri: path.to_string(), headers, body: Bytes::new() }
    }

    pub fn get(&self, path: &str) -> TestRequest<'a> {
        self.request(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> TestRequest<'a> {
        self.request(Method::POST, path)
    }

    pub fn put(&self, path: &str) -> TestRequest<'a> {
        self.request(Method::PUT, path)
    }

    pub fn delete(&self, path: &str) -> TestRequest<'a> {
        self.request(Method::DELETE, path)
    }
}

pub struct TestRequest<'a> {
    router: &'a Router,
    method: Method,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

impl TestRequest<'_> {
    /// A JSON body.
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Self {
        self.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        self.body = serde_json::to_vec(body).expect("json").into();
        self
    }

    /// A raw body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("header name");
        self.headers.insert(name, HeaderValue::from_str(value).expect("header value"));
        self
    }

    /// Send and read the whole response (a stream must end: e.g. the log
    /// feed of a finished job).
    pub async fn send(self) -> TestResponse {
        let res = self.send_streaming().await;
        let status = res.status();
        let headers = res.headers().clone();
        let body = axum::body::to_bytes(res.into_body(), MAX_RESPONSE).await.expect("response body");
        TestResponse { status, headers, body }
    }

    /// Send and return the response with its body unread (an endless
    /// stream such as an agent session).
    pub async fn send_streaming(self) -> axum::response::Response {
        let mut req = Request::builder().method(self.method).uri(self.uri);
        *req.headers_mut().expect("request") = self.headers;
        let req = req.body(Body::from(self.body)).expect("request");
        self.router.clone().oneshot(req).await.expect("infallible router")
    }
}

#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl TestResponse {
    /// Panics (with the body) unless the status is `want`.
    #[track_caller]
    pub fn assert_status(self, want: StatusCode) -> Self {
        assert_eq!(self.status, want, "body: {}", self.text());
        self
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    #[track_caller]
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response is not the expected JSON ({e}): {}", self.text()))
    }

    /// The error code of an error body (`{"error": {"code", …}}`).
    #[track_caller]
    pub fn error_code(&self) -> String {
        self.json::<kiln_api::ErrorBody>().error.code
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The events of an SSE body: (event, id, data) per event.
    pub fn sse_events(&self) -> Vec<SseEvent> {
        parse_sse(&self.text())
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Parse an SSE text stream (comment lines and keep-alives skipped).
pub fn parse_sse(text: &str) -> Vec<SseEvent> {
    let mut out = vec![];
    for block in text.split("\n\n") {
        let mut ev = SseEvent::default();
        let mut data: Vec<&str> = vec![];
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                ev.event = v.trim_start().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                ev.id = Some(v.trim_start().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !ev.event.is_empty() || !data.is_empty() {
            ev.data = data.join("\n");
            out.push(ev);
        }
    }
    out
}

/// The next data frame of a streaming response body, as text.
pub async fn next_frame(
    body: &mut (impl futures::Stream<Item = Result<Bytes, axum::Error>> + Unpin),
) -> Option<String> {
    use futures::StreamExt;
    let chunk = body.next().await?.ok()?;
    Some(String::from_utf8_lossy(&chunk).into_owned())
}
