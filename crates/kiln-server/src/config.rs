//! Server configuration: every knob has a default that matches the
//! documented behaviour (ARCHITECTURE.md, "The contract").

use crate::images::RegistryConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    pub listen: String,
    /// Metadata database: `postgres://…` (PostgreSQL), `sqlite:PATH`, or
    /// `None` for SQLite at `DATA_DIR/kiln.db`.
    pub database_url: Option<String>,
    /// Lease TTL; agents heartbeat every TTL/3.
    pub lease_ttl: Duration,
    /// How long an agent's leases survive once its connection drops.
    pub loss_grace: Duration,
    /// An agent not seen this long (no session stream open to any replica)
    /// and running nothing is forgotten (`agent.expire` in the audit log);
    /// zero keeps offline agents until they are removed.
    pub agent_expiry: Duration,
    /// Quarantined tests at most this percentage of a repository's suite
    /// (issue 43; at least one test may always be quarantined).
    pub quarantine_max_percent: f64,
    /// How long a ready job waits before it moves up one priority lane
    /// (issue 44, kiln-core `fair`; default 2 minutes).
    pub aging_step: Duration,
    /// Saturation (issue 44): with this many jobs queued on the server,
    /// new API runs are refused (429) — `background` ones from 80 % of it,
    /// `normal` ones at it; `urgent` ones only by their team's cap. `None`:
    /// no server-wide limit.
    pub max_queued_jobs: Option<u64>,
    /// `kiln up`: this server runs that many local agents, `local-1` to
    /// `local-N`. Offline agents named `local-M` with M > N (left by an
    /// earlier `kiln up --agents` with more) are removed at start, so a
    /// restart leaves no ghosts (the others' names are taken over as each
    /// registers again).
    pub embedded_agents: Option<u32>,
    /// Base delay of retry backoff.
    pub retry_base: Duration,
    /// The longest wait between two attempts to plan a delivery that meets
    /// transient trouble (backoff from `2 × retry_base`; retried until it
    /// is planned or proven impossible).
    pub delivery_retry_max: Duration,
    /// A delivery not planned this long after it arrived is delayed: an
    /// alert (`kiln_deliveries_delayed`), `delayed` in its listing, and a
    /// pending commit status saying so.
    pub delivery_alert_after: Duration,
    /// Unbound artifact generations of ended attempts are deleted after this.
    pub gc_grace: Duration,
    /// How often the garbage collector runs.
    pub gc_interval: Duration,
    /// A finished job's log moves from the hot journal to the object store
    /// this long after the job ended.
    pub log_archive_after: Duration,
    /// How often the log archiver looks for finished logs.
    pub log_archive_interval: Duration,
    /// How often this replica re-reads the ready jobs into its dispatch
    /// queues regardless of wakeups (several replicas on one database; zero:
    /// the default, 5 s on PostgreSQL and never on SQLite, where one server
    /// owns the database file). On PostgreSQL a replica also re-reads them
    /// at once when another replica commits ready jobs (`LISTEN/NOTIFY`);
    /// this period is the safety net for lost notifications.
    pub dispatch_sweep: Duration,
    /// Several replicas on one database share the offering of ready jobs
    /// (each job queued by one replica whose agents claim; see `dispatch`).
    /// False: every replica queues every ready job.
    pub dispatch_offer_shared: bool,
    /// How image references are resolved to digests at acceptance.
    pub registries: RegistryConfig,
    /// Where agents push the images Dockerfile jobs build
    /// (`HOST[:PORT]/PATH`), so retries on any agent pull them by digest
    /// (issue 40, item 7). `None`: a built image stays on its agent.
    pub build_registry: Option<String>,
    /// Where bytes live: "" for `DATA_DIR/objects`, `file:///DIR`, or
    /// `s3://BUCKET[/PREFIX]?endpoint=…&region=…` (credentials from the
    /// environment; agents get presigned URLs).
    pub object_store: String,
    /// The key secrets are sealed with (`None`: `DATA_DIR/secrets.key`,
    /// created on first start). Keep it apart from the database's backups.
    pub secrets_key_file: Option<PathBuf>,
    /// The URL clients and agents reach this server at (`--public-url`):
    /// download and upload URLs are built from it, never from a request's
    /// `Host` header. `None`: derived from the listen address at start.
    pub public_url: Option<String>,
    /// The Prometheus the gates between deploy rings ask (`--prometheus-url`,
    /// issue 46). `None`: a workflow with a Prometheus gate is refused.
    pub prometheus_url: Option<String>,
    /// Serve HTTPS with this PEM certificate chain and private key.
    pub tls: Option<TlsFiles>,
    /// A connection must send a complete request head within this (also
    /// the longest idle gap between requests on a keep-alive connection).
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed.
    pub idle_timeout: Duration,
    /// Open connections at most; more are answered 503 and closed.
    pub max_connections: usize,
    /// Of `max_connections`, the slots kept for authenticated calls and
    /// health checks (`None`: `serve::default_reserved_connections`).
    pub reserved_connections: Option<usize>,
    /// A request body must arrive whole within this of its request head
    /// (the data plane's streamed uploads excepted); past it, 408.
    pub body_read_timeout: Duration,
    /// Bytes of request bodies from callers not yet authenticated (webhook
    /// deliveries before their signature is checked, UI sign-ins) held at
    /// once; past it such a request is answered 503 without being read.
    pub unauthenticated_body_budget: usize,
    /// How often the replica holding the `triggers` lease checks schedules
    /// and due polls (0: never; the lease is not taken).
    pub trigger_interval: Duration,
    /// How long a repository's scheduled workflows are cached before the
    /// default branch is fetched and read again.
    pub schedule_refresh: Duration,
    /// A cache entry unused this long is evicted.
    pub cache_ttl: Duration,
    /// Bytes of cache entries kept per repository (least recently used go first).
    pub cache_repo_quota: u64,
    /// How often the resource monitor samples the data directory's
    /// filesystem and the memory (spec 004).
    pub resource_interval: Duration,
    /// Where the degradation levels start.
    pub degradation: kiln_core::degradation::Thresholds,
    /// The timeout of a job that sets none (frozen into its run).
    pub job_timeout: Duration,
    /// A ready job no agent claimed for this long fails (0: never).
    pub queue_timeout: Duration,
    /// The longest `timeout` a job may ask for (longer: 422 at acceptance).
    pub max_job_timeout: Duration,
    /// The run-level timeout of a workflow that sets none (frozen into its
    /// run); zero: none.
    pub run_timeout: Duration,
    /// How long a bound artifact's bytes are kept when its `publish` entry
    /// sets no `expire-in` (frozen into the run at acceptance).
    pub artifact_expire_in: Duration,
    /// Bytes of cache entries kept in all.
    pub cache_global_budget: u64,
    /// `POST /v1/repos` checks that the clone URL answers as a git
    /// repository before registering it (the in-process test app turns this
    /// off: its API tests register placeholder URLs).
    pub probe_clone_urls: bool,
    /// Which agents take untrusted work (invariant 12): `--untrusted-pools`
    /// (default `forks`), container executors only unless
    /// `--untrusted-on-host-agents` (unsafe).
    pub untrusted: kiln_core::claim::UntrustedPolicy,
    /// Base delay of the retry backoff of notification deliveries
    /// (exponential with jitter; `--notify-retry-base`).
    pub notify_retry_base: Duration,
    /// The longest wait between two attempts of a notification delivery.
    pub notify_retry_max: Duration,
    /// Attempts of a notification delivery before it is given up.
    pub notify_max_attempts: u32,
}

/// `--tls-cert` and `--tls-key`.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerConfig {
    /// The base of the URLs the server hands out: `public_url`, or
    /// `http(s)://LISTEN` (an unspecified address as loopback).
    pub fn base_url(&self) -> String {
        if let Some(u) = &self.public_url {
            return u.trim_end_matches('/').to_string();
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let listen = match self.listen.parse::<std::net::SocketAddr>() {
            Ok(a) if a.ip().is_unspecified() => {
                let lo: std::net::IpAddr = if a.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                };
                std::net::SocketAddr::new(lo, a.port()).to_string()
            }
            _ => self.listen.clone(),
        };
        format!("{scheme}://{listen}")
    }

    pub fn new(data_dir: PathBuf, listen: String) -> Self {
        ServerConfig {
            data_dir,
            listen,
            database_url: None,
            lease_ttl: Duration::from_secs(30),
            loss_grace: Duration::from_millis(500),
            agent_expiry: Duration::from_secs(24 * 3600),
            quarantine_max_percent: 2.0,
            aging_step: Duration::from_millis(kiln_core::fair::AGING_STEP_MS as u64),
            max_queued_jobs: None,
            embedded_agents: None,
            retry_base: Duration::from_millis(500),
            delivery_retry_max: Duration::from_secs(300),
            delivery_alert_after: Duration::from_secs(600),
            gc_grace: Duration::from_secs(15 * 60),
            gc_interval: Duration::from_secs(30),
            log_archive_after: Duration::from_secs(60),
            log_archive_interval: Duration::from_secs(10),
            dispatch_sweep: Duration::ZERO,
            dispatch_offer_shared: true,
            registries: RegistryConfig::default(),
            build_registry: None,
            object_store: String::new(),
            secrets_key_file: None,
            public_url: None,
            prometheus_url: None,
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: crate::serve::default_max_connections(),
            reserved_connections: None,
            body_read_timeout: Duration::from_secs(60),
            unauthenticated_body_budget: 64 << 20,
            trigger_interval: Duration::from_secs(5),
            schedule_refresh: Duration::from_secs(60),
            cache_ttl: Duration::from_secs(7 * 24 * 3600),
            cache_repo_quota: 10 << 30,
            cache_global_budget: 100 << 30,
            probe_clone_urls: true,
            untrusted: kiln_core::claim::UntrustedPolicy::default(),
            resource_interval: Duration::from_secs(5),
            job_timeout: Duration::from_secs(3600),
            queue_timeout: Duration::from_secs(24 * 3600),
            max_job_timeout: Duration::from_secs(kiln_workflow::MAX_TIMEOUT_SECS),
            run_timeout: Duration::from_secs(24 * 3600),
            artifact_expire_in: Duration::from_secs(30 * 24 * 3600),
            degradation: kiln_core::degradation::Thresholds::default(),
            notify_retry_base: Duration::from_secs(5),
            notify_retry_max: Duration::from_secs(600),
            notify_max_attempts: 8,
        }
    }

    /// Where the secrets key lives.
    pub fn secrets_key_path(&self) -> PathBuf {
        self.secrets_key_file.clone().unwrap_or_else(|| self.data_dir.join("secrets.key"))
    }
}
