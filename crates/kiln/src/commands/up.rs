//! `kiln up`: a server and N local agents in one process on embedded defaults.

use super::shared::ctrl_c;
use crate::cli::UpArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, start_embedded};
use std::io::Write;
use std::time::Duration;

pub(super) async fn run(a: UpArgs) -> CmdResult {
    let (handle, stop, tasks) =
        start_embedded(&a.data_dir, &a.listen, a.agents, a.lease_ttl, a.database_url.clone()).await?;
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
