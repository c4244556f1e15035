//! `kiln server`: the server alone, until SIGINT/SIGTERM.

use super::shared::{apply_web, ctrl_c};
use crate::cli::ServerArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};
use std::io::Write;
use std::time::Duration;

pub(super) async fn run(a: ServerArgs) -> CmdResult {
    if let Some(url) = &a.database_url
        && !["postgres://", "postgresql://", "sqlite:"].iter().any(|p| url.starts_with(p))
    {
        return Err(usage(format!("--database-url {url}: expected postgres://USER@HOST:PORT/DB or sqlite:PATH")));
    }
    let object_store = a.object_store.clone().unwrap_or_default();
    if !object_store.is_empty()
        && let Err(e) = kiln_blob::BlobStore::open_url(&object_store, &a.data_dir.join("objects"))
    {
        return Err(usage(format!("--object-store: {e}")));
    }
    let mut config = kiln_server::ServerConfig::new(a.data_dir.clone(), a.listen.clone());
    config.lease_ttl = a.lease_ttl;
    config.database_url = a.database_url.clone();
    config.object_store = object_store;
    config.secrets_key_file = a.secrets_key_file.clone();
    config.loss_grace = a.loss_grace;
    if let Some(d) = a.dispatch_sweep {
        config.dispatch_sweep = d;
    }
    config.gc_grace = a.artifact_gc_grace;
    config.gc_interval = a.gc_interval;
    config.retry_base = a.retry_base;
    config.log_archive_after = a.log_archive_after;
    config.log_archive_interval = a.log_archive_after.clamp(Duration::from_millis(200), Duration::from_secs(10));
    config.registries.insecure = a.insecure_registries.clone();
    for entry in &a.registry_auth {
        let parsed = entry.split_once('=').and_then(|(h, c)| Some((h, c.split_once(':')?)));
        let Some((host, (user, password))) = parsed else {
            return Err(usage("--registry-auth must be HOST=USER:PASSWORD"));
        };
        config.registries.credentials.insert(host.trim().to_string(), (user.to_string(), password.to_string()));
    }
    apply_web(&mut config, &a.web)?;
    let handle = kiln_server::start(config).await?;
    println!("kiln server listening on {} (tokens in {})", handle.url(), a.data_dir.display());
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    handle.shutdown().await?;
    Ok(exit::OK)
}
