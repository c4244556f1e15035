//! `kiln server`: the server alone, until SIGINT/SIGTERM.

use super::shared::{apply_server_tuning, apply_web, ctrl_c};
use crate::cli::ServerArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};
use std::io::Write;

pub(super) async fn run(a: ServerArgs) -> CmdResult {
    if let Some(url) = &a.database_url
        && !["postgres://", "postgresql://", "sqlite:"].iter().any(|p| url.starts_with(p))
    {
        return Err(usage(format!("--database-url {url}: expected postgres://USER@HOST:PORT/DB or sqlite:PATH")));
    }
    let mut config = kiln_server::ServerConfig::new(a.data_dir.clone(), a.listen.clone());
    config.lease_ttl = a.lease_ttl;
    config.database_url = a.database_url.clone();
    apply_server_tuning(&mut config, &a.tuning)?;
    apply_web(&mut config, &a.web)?;
    let handle = kiln_server::start(config).await?;
    kiln_cmd::outln!("kiln server listening on {} (tokens in {})", handle.url(), a.data_dir.display());
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    handle.shutdown().await?;
    Ok(exit::OK)
}
