//! `kiln repo add|set|rm|show|hook-info|deliveries|list`.

use super::shared::{client, read_secret};
use crate::cli::{ForgeArgs, RepoCommand};
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, usage};
use std::path::Path;

pub(super) async fn run(cmd: RepoCommand) -> CmdResult {
    match cmd {
        RepoCommand::Add { name, url, secret_pools, team, forge, conn } => {
            let (webhook_secret, forge) = settings(forge)?;
            if let (_, Some(c)) = kiln_api::giturl::split_credential(&url)
                && (!c.password.is_empty() || forge.clone_token.is_none())
            {
                return Err(usage(
                    "--url holds a credential, and a command line is visible to every local user (/proc/PID/cmdline); \
                     give the URL without it and the token with --clone-token-file FILE (or - for standard input)",
                ));
            }
            let c = client(&conn)?;
            let url = absolutize(&url);
            let r = c
                .create_repo(&kiln_api::CreateRepo { name, clone_url: url, webhook_secret, secret_pools, team, forge })
                .await?;
            kiln_cmd::outln!(
                "registered repository {} ({}); secrets go to agent pools: {}",
                r.name,
                r.clone_url,
                r.secret_pools.join(", ")
            );
            if r.forge.is_some() || r.webhook_secret_set {
                kiln_cmd::outln!("connect the forge with: kiln repo hook-info {}", r.name);
            }
        }
        RepoCommand::Set { name, secret_pools, public, private, team, forge, conn } => {
            let (webhook_secret, forge) = settings(forge)?;
            let c = client(&conn)?;
            let public = if public {
                Some(true)
            } else if private {
                Some(false)
            } else {
                None
            };
            let r = c
                .update_repo(
                    &name,
                    &kiln_api::UpdateRepo { clone_url: None, webhook_secret, secret_pools, public, team, forge },
                )
                .await?;
            kiln_cmd::outln!("updated repository {}", r.name);
            print_repo(&r);
        }
        RepoCommand::Rm { name, conn } => {
            let r = client(&conn)?.delete_repo(&name).await?;
            kiln_cmd::outln!("removed repository {} ({})", r.name, r.clone_url);
        }
        RepoCommand::Show { name, json, conn } => {
            let c = client(&conn)?;
            let r = c.get_repo(&name).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&r).expect("json"));
            } else {
                print_repo(&r);
            }
        }
        RepoCommand::HookInfo { name, conn } => {
            let c = client(&conn)?;
            let h = c.hook_info(&name).await?;
            kiln_cmd::outln!("Add a webhook to {} on {}:", h.repo, h.forge);
            kiln_cmd::outln!("  Payload URL:   {}", h.url);
            kiln_cmd::outln!("  Content type:  {}", h.content_type);
            kiln_cmd::outln!(
                "  Secret:        {}",
                if h.secret_configured {
                    "the one you set with --webhook-secret-file"
                } else {
                    "NOT SET: deliveries are refused until `kiln repo set NAME --webhook-secret-file FILE`"
                }
            );
            kiln_cmd::outln!("  Events:        {}", h.events.join(", "));
            if h.forge == "gitlab" {
                kiln_cmd::outln!("  (GitLab sends the secret as its Secret token.)");
            }
            if !h.statuses_configured {
                kiln_cmd::outln!(
                    "Commit statuses are off: set --forge, --forge-repo and --forge-token-file with `kiln repo set`."
                );
            }
        }
        RepoCommand::Deliveries { name, limit, json, conn } => {
            let c = client(&conn)?;
            let list = c.deliveries(&name, limit).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
            } else {
                for d in list {
                    // A delivery that keeps meeting trouble is still pending
                    // (it is retried until planned); say how long it waits.
                    let (status, note) = if d.delayed {
                        let waited = super::shared::duration_text(super::shared::now_ms() - d.created_at_ms);
                        ("DELAYED", format!("waiting {waited}, {} attempts: ", d.attempts))
                    } else {
                        (d.status.as_str(), String::new())
                    };
                    kiln_cmd::outln!(
                        "{}  {:<7} {:<14} {:<9} {:<9} runs: {}  {note}{}",
                        d.id,
                        d.forge,
                        crate::term::clean(&d.event),
                        d.trust,
                        status,
                        d.runs.len(),
                        crate::term::clean(d.message.as_deref().unwrap_or(""))
                    );
                }
            }
        }
        RepoCommand::List { json, conn } => {
            let c = client(&conn)?;
            let list = c.list_repos().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("no repositories yet; register one with `kiln repo add NAME --url URL`");
                return Ok(exit::OK);
            }
            for r in list {
                kiln_cmd::outln!("{:<24} {:<16} {}", r.name, r.team, r.clone_url);
            }
        }
    }
    Ok(exit::OK)
}

fn print_repo(r: &kiln_api::Repo) {
    kiln_cmd::outln!("name:               {}", r.name);
    kiln_cmd::outln!("url:                {}", r.clone_url);
    kiln_cmd::outln!("forge:              {}", r.forge.as_deref().unwrap_or("(none)"));
    if let Some(u) = &r.forge_url {
        kiln_cmd::outln!("forge url:          {u}");
    }
    if let Some(p) = &r.forge_repo {
        kiln_cmd::outln!("forge repository:   {p}");
    }
    kiln_cmd::outln!("forge token:        {}", if r.forge_token_set { "set" } else { "not set" });
    kiln_cmd::outln!("webhook secret:     {}", if r.webhook_secret_set { "set" } else { "not set" });
    kiln_cmd::outln!("clone token:        {}", if r.clone_token_set { "set" } else { "not set" });
    kiln_cmd::outln!("default branch:     {}", r.default_branch.as_deref().unwrap_or("main"));
    if !r.protected_refs.is_empty() {
        kiln_cmd::outln!("protected refs:     {}", r.protected_refs.join(", "));
    }
    kiln_cmd::outln!("pull request trust: {}", r.pull_request_trust.as_deref().unwrap_or("write-access"));
    match r.poll_interval_secs {
        Some(s) => kiln_cmd::outln!("polling:            every {s}s"),
        None => kiln_cmd::outln!("polling:            off"),
    }
    kiln_cmd::outln!("secret pools:       {}", r.secret_pools.join(", "));
    kiln_cmd::outln!("team:               {}", r.team);
    kiln_cmd::outln!("badge:              {}", if r.public { "public" } else { "private (tokens that may read it)" });
}

/// The request fields of the forge flags; secrets read from their files.
fn settings(f: ForgeArgs) -> Result<(Option<String>, kiln_api::ForgeSettings), Failure> {
    if f.webhook_secret.is_some() {
        return Err(usage(
            "--webhook-secret is refused: a secret on the command line is visible to every local user \
             (/proc/PID/cmdline); pass --webhook-secret-file FILE (or - for standard input)",
        ));
    }
    let stdin_readers = [&f.webhook_secret_file, &f.forge_token_file, &f.clone_token_file]
        .iter()
        .filter(|p| p.as_deref() == Some(Path::new("-")))
        .count();
    if stdin_readers > 1 {
        return Err(usage(
            "only one of --webhook-secret-file, --forge-token-file and --clone-token-file can read standard input",
        ));
    }
    let webhook_secret =
        f.webhook_secret_file.as_deref().map(|p| read_secret("--webhook-secret-file", p)).transpose()?;
    let forge_token = f.forge_token_file.as_deref().map(|p| read_secret("--forge-token-file", p)).transpose()?;
    let clone_token = f.clone_token_file.as_deref().map(|p| read_secret("--clone-token-file", p)).transpose()?;
    let poll_interval_secs = match f.poll_interval.as_deref() {
        None => None,
        Some("0") => Some(0),
        Some(d) => {
            let d = kiln_cmd::parse_duration(d).map_err(|e| usage(format!("--poll-interval: {e}")))?;
            Some(d.as_secs().max(1))
        }
    };
    Ok((
        webhook_secret,
        kiln_api::ForgeSettings {
            forge: f.forge,
            forge_url: f.forge_url,
            forge_repo: f.forge_repo,
            forge_token,
            default_branch: f.default_branch,
            protected_refs: f.protected_refs,
            pull_request_trust: f.pull_request_trust,
            poll_interval_secs,
            clone_token,
        },
    ))
}

/// Local paths are made absolute so the server and agents find them from anywhere.
fn absolutize(url: &str) -> String {
    if url.contains("://") || url.contains('@') {
        return url.to_string();
    }
    std::fs::canonicalize(url).map(|p| p.display().to_string()).unwrap_or_else(|_| url.to_string())
}
