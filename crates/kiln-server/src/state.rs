//! The shared state of one server process: the store, the object store,
//! the in-memory dispatch queues and the notification channels between
//! handlers, services and background rounds.

use crate::capability::Signer;
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::credentials::{AgentKeys, TokenCache};
use crate::dispatch::Dispatcher;
use crate::git::Mirrors;
use crate::images::Resolver;
use crate::log_index::IndexCache;
use crate::oidc::Issuer;
use crate::sealing::SecretBox;
use kiln_store::Store;
use std::sync::Arc;
use tokio::sync::{Notify, broadcast};

/// What a server is built from (see `App`).
pub struct AppParts {
    pub config: ServerConfig,
    pub store: Arc<dyn Store>,
    pub blob: kiln_blob::BlobStore,
    pub admin_token: String,
    pub agent_token: String,
    /// Key of the data plane's capability URLs.
    pub blob_key: Vec<u8>,
    pub clock: Arc<dyn Clock>,
    /// Seals secret values at rest.
    pub secrets: SecretBox,
    /// Signs jobs' OIDC identity tokens.
    pub oidc: Issuer,
}

pub(crate) struct AppState {
    pub store: Arc<dyn Store>,
    pub config: ServerConfig,
    pub admin_token: String,
    pub agent_token: String,
    pub mirrors: Mirrors,
    pub dispatcher: Dispatcher,
    /// Wakes the outbox relay after a transaction wrote outbox events.
    pub relay_wake: Notify,
    /// Wakes the reconciler (lease fencing) before its next round: a lost
    /// agent's shortened leases expire then.
    pub reconcile_wake: Notify,
    /// The server is shutting down: connections it closes itself say
    /// nothing about the agents at their other end.
    pub stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Job ids whose logs or status changed, and ids of runs just accepted
    /// (SSE followers listen: a job's log feed for its id, run feeds for any).
    pub job_events: broadcast::Sender<String>,
    /// Cancellation notices for agent session streams.
    pub cancel_events: broadcast::Sender<CancelEvent>,
    pub blob: kiln_blob::BlobStore,
    pub signer: Signer,
    /// Session credentials and attempt tokens of agents.
    pub agent_keys: AgentKeys,
    /// API tokens recently read from the store.
    pub tokens: TokenCache,
    /// Seals and opens secret values.
    pub secrets: SecretBox,
    /// Signs jobs' OIDC identity tokens and publishes their keys.
    pub oidc: Issuer,
    /// Signs the provenance of bound artifacts (issue 45) and publishes
    /// its keys (`DATA_DIR/attestation`); `None` if the keys could not be
    /// opened (then no artifact is bound: completions are refused, 503).
    pub attestation: Option<Arc<Issuer>>,
    /// Parsed log archive indexes, by object key.
    pub log_indexes: IndexCache,
    /// Resolves `image.ref` tags to digests at acceptance.
    pub resolver: Resolver,
    /// Server-side "now" (see `clock`): capability expiry and grace periods.
    pub clock: Arc<dyn Clock>,
    /// Wakes the planner after a webhook delivery was accepted.
    pub planner_wake: Notify,
    /// Counters of the webhook ingress.
    pub webhooks: WebhookCounts,
    /// Bytes of unauthenticated request bodies that may be held at once
    /// (`--unauthenticated-body-budget`; see `handlers::body`).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// HTTP client of the forges' status APIs.
    pub forge_http: reqwest::Client,
    /// HTTP client of outgoing notifications: redirects are not followed
    /// (a signed body goes only where it was sent).
    pub notify_http: reqwest::Client,
    /// Scheduled workflows per repository (the scheduler's cache).
    pub schedule_indexes: ScheduleIndexes,
    /// This process, as the holder of leader leases.
    pub instance_id: String,
    /// Counters of the build caches.
    pub cache_counts: CacheCounts,
    /// Series of `/metrics` kept with the prometheus crate.
    pub metrics: crate::metrics::Metrics,
    /// Agents whose session stream is open to this server.
    pub live_agents: LiveAgents,
    /// Disk and memory, and the degradation level they give.
    pub resources: crate::resources::ResourceMonitor,
}

pub(crate) type State = Arc<AppState>;

/// The longest wait for a notification receiver's answer.
pub(crate) const NOTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Tells an agent session to stop one of its attempts now.
#[derive(Debug, Clone)]
pub(crate) struct CancelEvent {
    pub session: String,
    pub job_id: String,
    pub epoch: i64,
}

impl AppState {
    pub fn new(parts: AppParts) -> State {
        let AppParts { config, store, blob, admin_token, agent_token, blob_key, clock, secrets, oidc } = parts;
        // Issue 45: the provenance signer, handed to the store, which signs
        // each binding's statement in the transaction that binds it.
        let attestation = match Issuer::open_with(
            &config.data_dir.join("attestation"),
            crate::oidc::ATTESTATION_ROTATE_EVERY,
            crate::oidc::ATTESTATION_KEEP_AFTER_ROTATION,
        ) {
            Ok(i) => {
                let i = Arc::new(i);
                store.set_attester(Arc::new(crate::attestation::Attester::new(i.clone(), config.base_url())));
                Some(i)
            }
            Err(e) => {
                tracing::error!("cannot open the attestation keys: {e:#}; no artifact is bound until they can be");
                None
            }
        };
        let resources = crate::resources::ResourceMonitor::new(config.data_dir.clone(), config.degradation);
        resources.sample_now();
        let body_budget = Arc::new(tokio::sync::Semaphore::new(config.unauthenticated_body_budget));
        Arc::new(AppState {
            store,
            mirrors: Mirrors::new(config.data_dir.join("mirrors")),
            resolver: Resolver::new(config.registries.clone()),
            config,
            admin_token,
            agent_token,
            dispatcher: Dispatcher::default(),
            relay_wake: Notify::new(),
            reconcile_wake: Notify::new(),
            stopping: Default::default(),
            job_events: broadcast::channel(4096).0,
            cancel_events: broadcast::channel(1024).0,
            blob,
            agent_keys: AgentKeys::new(&blob_key),
            tokens: TokenCache::default(),
            secrets,
            oidc,
            attestation,
            signer: Signer::new(blob_key),
            log_indexes: Default::default(),
            clock,
            planner_wake: Notify::new(),
            webhooks: Default::default(),
            body_budget,
            forge_http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .connect_timeout(std::time::Duration::from_secs(10))
                .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("HTTP client"),
            notify_http: reqwest::Client::builder()
                .timeout(NOTIFY_TIMEOUT)
                .connect_timeout(std::time::Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("kiln-notify/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("HTTP client"),
            schedule_indexes: Default::default(),
            instance_id: uuid::Uuid::new_v4().to_string(),
            cache_counts: Default::default(),
            metrics: Default::default(),
            live_agents: Default::default(),
            resources,
        })
    }

    /// Wake SSE followers of `job` (its log or status changed), or of the
    /// run lists (a run id: the run was just accepted).
    pub fn job_changed(&self, job: &str) {
        let _ = self.job_events.send(job.to_string());
    }

    /// The `iss` of identity tokens: the URL this server is reached at
    /// (`--public-url`, else derived from the listen address).
    pub fn issuer_url(&self) -> String {
        self.config.base_url()
    }

    /// Lease TTL in milliseconds.
    pub fn lease_ttl_ms(&self) -> i64 {
        self.config.lease_ttl.as_millis() as i64
    }
}

/// Counters of the ingress, exported on `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct WebhookCounts {
    pub accepted: std::sync::atomic::AtomicU64,
    pub duplicate: std::sync::atomic::AtomicU64,
    pub ignored: std::sync::atomic::AtomicU64,
    pub rejected_signature: std::sync::atomic::AtomicU64,
    pub rejected_payload: std::sync::atomic::AtomicU64,
}

/// The scheduled workflows of one repository at its default branch's tip.
#[derive(Clone)]
pub(crate) struct ScheduleIndex {
    /// When (server clock) it was read.
    pub read_at_ms: i64,
    pub sha: String,
    /// (path, workflow) of every workflow with `on.schedule`.
    pub workflows: Vec<(String, Arc<kiln_workflow::Workflow>)>,
}

pub(crate) type ScheduleIndexes = std::sync::Mutex<std::collections::HashMap<String, ScheduleIndex>>;

/// Counters of the build caches, exported on `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct CacheCounts {
    pub hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
    pub saves: std::sync::atomic::AtomicU64,
    pub conflicts: std::sync::atomic::AtomicU64,
    pub evictions: std::sync::atomic::AtomicU64,
    /// Reports of a refused or failed restore (the job ran cold).
    pub integrity_failures: std::sync::atomic::AtomicU64,
    pub bytes_restored: std::sync::atomic::AtomicU64,
    /// Lookups answered by `restore-prefix` (an entry saved for other inputs).
    pub prefix_hits: std::sync::atomic::AtomicU64,
    pub bytes_saved: std::sync::atomic::AtomicU64,
    /// Estimated build time saved by hits, in milliseconds.
    pub ms_saved: std::sync::atomic::AtomicU64,
}

/// The agents whose session stream is open to this server process (agent
/// id → session id): what `GET /v1/agents` reports as `connected`, and what
/// a waiting job's message is decided against. With replicas each knows its
/// own connections only.
#[derive(Debug, Default)]
pub(crate) struct LiveAgents(std::sync::Mutex<LiveInner>);

#[derive(Debug, Default)]
pub(crate) struct LiveInner {
    /// Agent id → its session whose stream is open here.
    live: std::collections::HashMap<String, String>,
    /// Sessions whose stream ended here (bounded: cleared past `GONE_MAX`).
    gone: std::collections::HashSet<String>,
}

const GONE_MAX: usize = 10_000;

impl LiveAgents {
    pub fn connect(&self, agent_id: &str, session_id: &str) {
        self.0.lock().expect("live agents").live.insert(agent_id.to_string(), session_id.to_string());
    }

    /// The stream of `session_id` ended (a newer session of the agent stays).
    pub fn disconnect(&self, agent_id: &str, session_id: &str) {
        let mut inner = self.0.lock().expect("live agents");
        if inner.live.get(agent_id).is_some_and(|s| s == session_id) {
            inner.live.remove(agent_id);
        }
        if inner.gone.len() >= GONE_MAX {
            inner.gone.clear();
        }
        inner.gone.insert(session_id.to_string());
    }

    /// How many agents have their session stream open here.
    pub fn connected_count(&self) -> usize {
        self.0.lock().expect("live agents").live.len()
    }

    /// The agents whose session stream is open here.
    pub fn connected_ids(&self) -> Vec<String> {
        self.0.lock().expect("live agents").live.keys().cloned().collect()
    }

    pub fn is_connected(&self, agent_id: &str) -> bool {
        self.0.lock().expect("live agents").live.contains_key(agent_id)
    }

    /// Whether `session_id`'s stream was open here and has ended: an
    /// attempt claimed for it now (a long poll its agent abandoned when it
    /// stopped) has nobody to run it.
    pub fn session_gone(&self, session_id: &str) -> bool {
        self.0.lock().expect("live agents").gone.contains(session_id)
    }
}
