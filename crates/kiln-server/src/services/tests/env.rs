//! Fixtures for the services' unit tests: a real SQLite store and local
//! object store in a temporary directory, a manual clock, and real git
//! repositories (kiln-testkit's `TestRepo`).

use crate::clock::ManualClock;
use crate::config::ServerConfig;
use crate::services::{acceptance, claim};
use crate::state::{AppParts, AppState, State};
use crate::work;
use kiln_api as api;
use kiln_store::{SqliteStore, Store};
use kiln_testkit::TestRepo;
use std::sync::Arc;

pub(crate) struct Env {
    pub state: State,
    pub clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

/// A workflow of one job per name, each `echo NAME`.
pub(crate) fn workflow(jobs: &[&str]) -> String {
    let mut s = String::from("version: 1\njobs:\n");
    for j in jobs {
        s.push_str(&format!("  - name: {j}\n    steps:\n      - echo {j}\n"));
    }
    s
}

impl Env {
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data.join("kiln.db")).await.expect("store"));
        let clock = Arc::new(ManualClock::new());
        let mut config = ServerConfig::new(data.clone(), "kiln.test:80".into());
        // These tests are about the protocol, not degradation: the level
        // must not follow how full this machine's disk happens to be.
        config.degradation =
            kiln_core::degradation::Thresholds { storage_pct: [101.0, 101.0, 101.0], memory_bytes: [0, 0, 0] };
        let state = AppState::new(AppParts {
            config,
            store,
            blob: kiln_blob::BlobStore::open_url("", &data.join("objects")).expect("blob store"),
            admin_token: "admin".into(),
            agent_token: "agent".into(),
            blob_key: b"key".to_vec(),
            clock: clock.clone(),
            secrets: crate::sealing::SecretBox::from_hex(&"ab".repeat(32)).expect("key"),
            oidc: crate::oidc::Issuer::open(&data.join("oidc")).expect("oidc keys"),
        });
        Env { state, clock, _dir: dir }
    }

    /// A git repository holding `files`, registered as `name`.
    pub async fn repo(&self, name: &str, files: &[(&str, &str)]) -> TestRepo {
        let repo = TestRepo::new(files).expect("git repo");
        self.state.store.create_repo(name, &repo.path().display().to_string(), None).await.expect("create repo");
        repo
    }

    /// A repository `name` whose `.kiln/pipeline.yaml` is `workflow(jobs)`.
    pub async fn pipeline(&self, name: &str, jobs: &[&str]) -> TestRepo {
        self.repo(name, &[(".kiln/pipeline.yaml", &workflow(jobs))]).await
    }

    /// Submit HEAD of `repo`; the run id.
    pub async fn submit(&self, repo: &str) -> String {
        let request = api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() };
        let sub = acceptance::Submission {
            repo: repo.into(),
            request,
            idempotency_key: None,
            by: crate::auth::Principal::admin_file(),
            trace: None,
        };
        acceptance::submit(&self.state, sub).await.expect("submit")
    }

    /// Register an agent: (agent id, session id).
    pub async fn agent(&self, max_jobs: u32) -> (String, String) {
        let a = self.state.store.register_agent("a1", "{}", max_jobs).await.expect("register");
        (a.id, a.session_id)
    }

    /// Relay the outbox into the dispatch queues.
    pub async fn relay(&self) -> usize {
        work::relay_once(&self.state).await.expect("relay")
    }

    pub fn claim_request(session: &str, request_id: &str, wait_ms: u64) -> api::ClaimRequest {
        api::ClaimRequest { session_id: session.into(), claim_request_id: request_id.into(), wait_ms }
    }

    /// Claim without waiting.
    pub async fn claim_now(&self, agent: &(String, String), request_id: &str) -> Option<api::Assignment> {
        let req = Self::claim_request(&agent.1, request_id, 0);
        claim::claim(&self.state, &agent.0, &req).await.expect("claim")
    }
}
