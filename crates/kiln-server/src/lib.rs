//! The Kiln server: public API, agent API, SSE logs, and the background
//! rounds (outbox relay, reconciler, dispatch sweep, garbage collector, log
//! archiver). Stateless apart from the store and the object store; every
//! authoritative decision is a store transaction.
//!
//! Layering, one-way (no module uses one that uses it back):
//! `lib` → `app` → `router` → `handlers` → `services` → `state` → leaves
//! (`config`, `clock`, `capability`, `dispatch`, `git`, `images`,
//! `log_index`, `error`, `views`, `serve`); `loops` → `work` → `services`.

mod app;
pub(crate) mod attestation;
mod auth;
mod boot;
mod capability;
mod clock;
mod config;
pub mod credentials;
mod dispatch;
mod error;
mod git;
mod handlers;
mod images;
mod log_index;
mod loops;
pub mod metrics;
pub mod oidc;
pub mod openapi;
mod resources;
mod router;
pub mod sealing;
mod security;
mod serve;
mod services;
mod state;
mod views;
mod work;

pub use app::{App, WorkDone};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ServerConfig, TlsFiles};
pub use git::normalize_url;
pub use images::{RegistryConfig, ResolveError, Resolver};
pub use serve::{default_max_connections, default_reserved_connections};
pub use state::AppParts;

use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A running server.
pub struct ServerHandle {
    pub addr: SocketAddr,
    pub admin_token: String,
    pub agent_token: String,
    /// `https` when serving TLS.
    scheme: &'static str,
    shutdown: watch::Sender<bool>,
    /// Set before `shutdown`: streams closed from here on are not agent losses.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServerHandle {
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stop accepting requests and end the background loops.
    /// Long-lived streams (agent sessions, log followers) get a short grace,
    /// then the server stops regardless.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
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

/// `kiln secret rotate-key`: seal every secret under a new key, in one
/// transaction, then put the new key in place (running servers pick it up
/// at their next read of a secret). Returns how many secrets and the new
/// key's id.
pub async fn rotate_secrets_key(config: &ServerConfig) -> anyhow::Result<(u64, String)> {
    let path = config.secrets_key_path();
    anyhow::ensure!(path.exists(), "{} does not exist: there is no key to rotate", path.display());
    let old = sealing::SecretBox::load_or_create(&path)?;
    let store = boot::open_store(config).await?;
    let new_hex = sealing::new_key_hex();
    let new = sealing::SecretBox::from_hex(&new_hex)?;
    let mut changes = Vec::new();
    for (repo_id, name, stored) in store.all_secrets().await? {
        let plain = old.open(&repo_id, &name, &stored).map_err(|e| anyhow::anyhow!("secret {name}: {e}"))?;
        let resealed = new.seal(&repo_id, &name, &plain);
        changes.push((repo_id, name, stored, resealed));
    }
    // The new key is on disk before any value needs it.
    let next = path.with_extension("next");
    sealing::write_key_file(&next, &new_hex)?;
    if let Err(e) = store.replace_secrets(&changes).await {
        let _ = std::fs::remove_file(&next);
        return Err(anyhow::anyhow!("nothing was changed: {e}"));
    }
    std::fs::rename(&next, &path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok((changes.len() as u64, new.key_id()))
}

/// Open the store, bind the listener and start serving in the background.
pub async fn start(mut config: ServerConfig) -> anyhow::Result<ServerHandle> {
    let url = config.database_url.as_deref().unwrap_or("");
    if (url.starts_with("postgres://") || url.starts_with("postgresql://")) && config.dispatch_sweep.is_zero() {
        // A shared database may have other replicas: see their ready jobs
        // (at once when notified; this often regardless).
        config.dispatch_sweep = Duration::from_secs(5);
    }
    // Tokens, keys, the database and the objects: the data dir is private
    // to the server's user (0700, also when it existed before).
    boot::private_dir(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let admin_token = boot::load_or_create_token(&config.data_dir, "admin.token")?;
    let agent_token = boot::load_or_create_token(&config.data_dir, "agent.token")?;
    let blob_key = boot::load_or_create_token(&config.data_dir, "blob.key")?;
    if config.object_store.is_empty() {
        let objects = config.data_dir.join("objects");
        boot::private_dir(&objects).with_context(|| format!("cannot create {}", objects.display()))?;
    }
    let secrets = sealing::SecretBox::load_or_create(&config.secrets_key_path())?;
    let oidc = oidc::Issuer::open(&config.data_dir.join("oidc"))?;
    let blob = kiln_blob::BlobStore::open_url(&config.object_store, &config.data_dir.join("objects"))
        .map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!(object_store = %blob.describe(), "object store");
    let tls = match &config.tls {
        Some(files) => Some(serve::tls_acceptor(&files.cert, &files.key)?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let store = boot::open_store(&config).await?;
    // PostgreSQL keeps log bytes in the object store (SQLite: in segment
    // files beside its database).
    store.set_log_objects(Arc::new(services::log_archive::LogObjectsIn(blob.clone())));
    let sealed = boot::seal_legacy_secrets(&*store, &secrets).await?;
    if sealed > 0 {
        tracing::info!(sealed, "sealed secrets stored in clear by an earlier version");
    }
    if let Some(keep) = config.embedded_agents {
        boot::forget_surplus_local_agents(&*store, keep).await?;
    }
    let listener =
        TcpListener::bind(&config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    if config.public_url.is_none() {
        // Derived from the address actually bound (a port 0 resolved).
        let mut bound = config.clone();
        bound.listen = addr.to_string();
        config.public_url = Some(bound.base_url());
    }
    let limits = serve::ConnLimits {
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
        body_read_timeout: config.body_read_timeout,
        reserved_connections: config
            .reserved_connections
            .unwrap_or_else(|| serve::default_reserved_connections(config.max_connections)),
    };
    let app = App::new(AppParts {
        config,
        store,
        blob,
        admin_token: admin_token.clone(),
        agent_token: agent_token.clone(),
        blob_key: blob_key.into_bytes(),
        clock: Arc::new(SystemClock),
        secrets,
        oidc,
    });
    let (shutdown, _) = watch::channel(false);
    let stopping = app.state().stopping.clone();
    loops::spawn(app.state().clone(), shutdown.subscribe()).await?;
    let router = app.router();
    let rx = shutdown.subscribe();
    let task = tokio::spawn(serve::serve(listener, router, tls, limits, rx));
    tracing::info!(%addr, scheme, "kiln server listening");
    Ok(ServerHandle { addr, admin_token, agent_token, scheme, shutdown, stopping, task })
}
