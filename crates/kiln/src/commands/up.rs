//! `kiln up`: a server and N local agents in one process on embedded defaults.

use super::shared::{apply_web, ctrl_c};
use crate::cli::UpArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, start_embedded_config, usage};
use std::io::Write;
use std::time::Duration;

pub(super) async fn run(a: UpArgs) -> CmdResult {
    let mut config = kiln_server::ServerConfig::new(a.data_dir.clone(), a.listen.clone());
    config.lease_ttl = a.lease_ttl;
    config.database_url = a.database_url.clone();
    apply_web(&mut config, &a.web)?;
    if let Some(cert) = &a.web.tls_cert {
        // The local agents reach the server over TLS too: they trust its certificate.
        let pem = std::fs::read(cert).map_err(|e| usage(format!("--tls-cert {}: {e}", cert.display())))?;
        kiln_api::client::trust_root_pem(&pem).map_err(|e| usage(format!("--tls-cert {}: {e}", cert.display())))?;
    }
    let (handle, stop, tasks) = start_embedded_config(config, a.agents).await?;
    let url = handle.url();
    println!("Kiln is up: server {url}, {} local agent(s), data in {}", a.agents, a.data_dir.display());
    println!("export KILN_SERVER={url} KILN_TOKEN={}", handle.admin_token);
    println!("web UI: {url}/");
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    eprintln!("shutting down");
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    handle.shutdown().await?;
    Ok(exit::OK)
}
