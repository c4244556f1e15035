//! The Kiln server: public API, agent API, SSE logs, and the background
//! rounds (outbox relay, reconciler, dispatch sweep, garbage collector, log
//! archiver). Stateless apart from the store and the object store; every
//! authoritative decision is a store transaction.
//!
//! Layering, one-way (no module uses one that uses it back):
//! `lib` → `app` → `router` → `handlers` → `services` → `state` → leaves
//! (`config`, `clock`, `capability`, `dispatch`, `git`, `images`,
//! `log_index`, `error`, `views`); `loops` → `work` → `services`.

mod app;
mod auth;
mod boot;
mod capability;
mod clock;
mod config;
mod dispatch;
mod error;
mod git;
mod handlers;
mod images;
mod log_index;
mod loops;
mod router;
mod services;
mod state;
mod views;
mod work;

pub use app::{App, WorkDone};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::ServerConfig;
pub use git::normalize_url;
pub use images::{RegistryConfig, ResolveError, Resolver};
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
    let blob = kiln_blob::BlobStore::open_url(&config.object_store, &config.data_dir.join("objects"))
        .map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!(object_store = %blob.describe(), "object store");
    let store = boot::open_store(&config).await?;
    let listener =
        TcpListener::bind(&config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let app = App::new(AppParts {
        config,
        store,
        blob,
        admin_token: admin_token.clone(),
        agent_token: agent_token.clone(),
        blob_key: blob_key.into_bytes(),
        clock: Arc::new(SystemClock),
    });
    let (shutdown, mut rx) = watch::channel(false);
    loops::spawn(app.state().clone(), shutdown.subscribe()).await?;
    let router = app.router();
    let task = tokio::spawn(async move {
        axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|v| *v).await;
            })
            .await
            .context("server failed")
    });
    tracing::info!(%addr, "kiln server listening");
    Ok(ServerHandle { addr, admin_token, agent_token, shutdown, task })
}
