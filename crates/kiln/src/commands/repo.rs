//! `kiln repo add|list`.

use super::shared::client;
use crate::cli::RepoCommand;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(cmd: RepoCommand) -> CmdResult {
    match cmd {
        RepoCommand::Add { name, url, webhook_secret, secret_pools, conn } => {
            let c = client(&conn)?;
            let url = absolutize(&url);
            let r = c.create_repo(&kiln_api::CreateRepo { name, clone_url: url, webhook_secret, secret_pools }).await?;
            println!(
                "registered repository {} ({}); secrets go to agent pools: {}",
                r.name,
                r.clone_url,
                r.secret_pools.join(", ")
            );
        }
        RepoCommand::List { conn } => {
            let c = client(&conn)?;
            for r in c.list_repos().await? {
                println!("{:<24} {}", r.name, r.clone_url);
            }
        }
    }
    Ok(exit::OK)
}

/// Local paths are made absolute so the server and agents find them from anywhere.
fn absolutize(url: &str) -> String {
    if url.contains("://") || url.contains('@') {
        return url.to_string();
    }
    std::fs::canonicalize(url).map(|p| p.display().to_string()).unwrap_or_else(|_| url.to_string())
}
