//! The Kiln server: public API, agent API, SSE logs, and the background loops
//! (outbox relay, reconciler). Stateless apart from the store and the object
//! store; every authoritative decision is a store transaction.

mod artifacts;
mod auth;
mod capability;
mod dispatch;
mod error;
mod git;
mod images;
mod logarchive;
mod loops;
mod routes;
mod views;

pub use git::normalize_url;
pub use images::{RegistryConfig, ResolveError, Resolver};

use anyhow::Context;
use dispatch::Dispatcher;
use kiln_store::{PgStore, SqliteStore, Store};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Notify, broadcast, watch};

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
    /// Base delay of retry backoff.
    pub retry_base: Duration,
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
    /// How image references are resolved to digests at acceptance.
    pub registries: RegistryConfig,
    /// Where bytes live: "" for `DATA_DIR/objects`, `file:///DIR`, or
    /// `s3://BUCKET[/PREFIX]?endpoint=…&region=…` (credentials from the
    /// environment; agents get presigned URLs).
    pub object_store: String,
}

impl ServerConfig {
    pub fn new(data_dir: PathBuf, listen: String) -> Self {
        ServerConfig {
            data_dir,
            listen,
            database_url: None,
            lease_ttl: Duration::from_secs(30),
            loss_grace: Duration::from_secs(3),
            retry_base: Duration::from_millis(500),
            gc_grace: Duration::from_secs(15 * 60),
            gc_interval: Duration::from_secs(30),
            log_archive_after: Duration::from_secs(60),
            log_archive_interval: Duration::from_secs(10),
            dispatch_sweep: Duration::ZERO,
            registries: RegistryConfig::default(),
            object_store: String::new(),
        }
    }
}

pub(crate) struct AppState {
    pub store: Arc<dyn Store>,
    pub config: ServerConfig,
    pub admin_token: String,
    pub agent_token: String,
    pub mirrors: git::Mirrors,
    pub dispatcher: Dispatcher,
    /// Wakes the outbox relay after a transaction wrote outbox events.
    pub relay_wake: Notify,
    /// Job ids whose logs or status changed (SSE followers listen).
    pub job_events: broadcast::Sender<String>,
    /// Cancellation notices for agent session streams.
    pub cancel_events: broadcast::Sender<CancelEvent>,
    pub blob: kiln_blob::BlobStore,
    pub signer: capability::Signer,
    /// Parsed log archive indexes, by object key (see `logarchive`).
    pub log_indexes: std::sync::Mutex<std::collections::HashMap<String, Arc<logarchive::Index>>>,
    /// Resolves `image.ref` tags to digests at acceptance.
    pub resolver: Resolver,
}

pub(crate) type State = Arc<AppState>;

#[derive(Debug, Clone)]
pub(crate) struct CancelEvent {
    pub session: String,
    pub job_id: String,
    pub epoch: i64,
}

/// A running server.
pub struct ServerHandle {
    pub addr: SocketAddr,
    pub admin_token: String,
    pub agent_token: String,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServerHandle {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting requests and end the background loops.
    /// Long-lived streams (agent sessions, log followers) get a short grace,
    /// then the server stops regardless.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        let mut task = self.task;
        match tokio::time::timeout(Duration::from_secs(3), &mut task).await {
            Ok(r) => r?,
            Err(_) => {
                task.abort();
                Ok(())
            }
        }
    }

    /// Wait until the server stops on its own (it normally does not).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await?
    }
}

/// Read `DATA_DIR/NAME`, or create it with a fresh random token (mode 0600).
fn load_or_create_token(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let read = || std::fs::read_to_string(&path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
    if let Some(t) = read() {
        return Ok(t);
    }
    // Replicas starting at once on one data dir must agree: write a private
    // file, then link it into place only if no other process did first.
    let token = format!("kiln_{}", hex::encode(rand::random::<[u8; 24]>()));
    let tmp = dir.join(format!(".{name}.{}.{}", std::process::id(), hex::encode(rand::random::<[u8; 6]>())));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(token),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read().with_context(|| format!("{} exists but is empty", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// Open the metadata store the configuration names (see
/// [`ServerConfig::database_url`]).
async fn open_store(config: &ServerConfig) -> anyhow::Result<Arc<dyn Store>> {
    let backoff = kiln_core::Backoff { base_ms: config.retry_base.as_millis() as u64, max_ms: 60_000 };
    let url = config.database_url.as_deref().unwrap_or("");
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PgStore::connect(url).await.with_context(|| format!("cannot open database {}", redact(url)))?;
        return Ok(Arc::new(store.with_backoff(backoff)));
    }
    let db_path = match url.strip_prefix("sqlite:") {
        _ if url.is_empty() => config.data_dir.join("kiln.db"),
        Some(p) if !p.trim_start_matches("//").is_empty() => PathBuf::from(p.trim_start_matches("//")),
        _ => anyhow::bail!("--database-url {url}: expected postgres://USER@HOST:PORT/DB or sqlite:PATH"),
    };
    let store =
        SqliteStore::open(&db_path).await.with_context(|| format!("cannot open database {}", db_path.display()))?;
    Ok(Arc::new(store.with_backoff(backoff)))
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

/// Open the store, bind the listener and start serving in the background.
pub async fn start(mut config: ServerConfig) -> anyhow::Result<ServerHandle> {
    let url = config.database_url.as_deref().unwrap_or("");
    if (url.starts_with("postgres://") || url.starts_with("postgresql://")) && config.dispatch_sweep.is_zero() {
        // A shared database may have other replicas: see their ready jobs
        // (at once when notified; this often regardless).
        config.dispatch_sweep = Duration::from_secs(5);
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let admin_token = load_or_create_token(&config.data_dir, "admin.token")?;
    let agent_token = load_or_create_token(&config.data_dir, "agent.token")?;
    let blob_key = load_or_create_token(&config.data_dir, "blob.key")?;
    let blob = kiln_blob::BlobStore::open_url(&config.object_store, &config.data_dir.join("objects"))
        .map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!(object_store = %blob.describe(), "object store");
    let store = open_store(&config).await?;
    let listener =
        TcpListener::bind(&config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let (job_events, _) = broadcast::channel(4096);
    let state = Arc::new(AppState {
        store,
        mirrors: git::Mirrors::new(config.data_dir.join("mirrors")),
        resolver: Resolver::new(config.registries.clone()),
        config,
        admin_token: admin_token.clone(),
        agent_token: agent_token.clone(),
        dispatcher: Dispatcher::default(),
        relay_wake: Notify::new(),
        job_events,
        cancel_events: broadcast::channel(1024).0,
        blob,
        signer: capability::Signer::new(blob_key.into_bytes()),
        log_indexes: Default::default(),
    });
    let (shutdown, mut rx) = watch::channel(false);
    loops::spawn(state.clone(), shutdown.subscribe()).await?;
    let app = routes::router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|v| *v).await;
            })
            .await
            .context("server failed")
    });
    tracing::info!(%addr, "kiln server listening");
    Ok(ServerHandle { addr, admin_token, agent_token, shutdown, task })
}

#[cfg(test)]
mod token_tests {
    #[test]
    fn concurrent_starts_on_one_data_dir_agree_on_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..8).map(|_| s.spawn(|| super::load_or_create_token(dir.path(), "agent.token").unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(tokens.iter().all(|t| *t == tokens[0]), "{tokens:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join("agent.token")).unwrap().trim(), tokens[0]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("agent.token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary files left");
    }
}
