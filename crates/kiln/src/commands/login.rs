//! `kiln login URL`, `kiln logout`, `kiln context list|use`: the CLI's
//! profile of named contexts (server and API token; see `profile` for
//! where it lives and how it ranks against flags and the environment).

use super::profile::{self, Context, Profile};
use super::shared::{TokenSource, read_token};
use crate::cli::{ContextCommand, LoginArgs};
use crate::term::for_stdout;
use kiln_api::{ApiError, Client, exit};
use kiln_cmd::{CmdResult, Failure, usage};
use std::io::{IsTerminal, Read};

/// A run id no run has: reading it proves the token (404 for every scope
/// that may read runs; 401 for a token the server does not know).
const PROBE_RUN: &str = "00000000-0000-0000-0000-000000000000";

pub(super) async fn login(a: LoginArgs) -> CmdResult {
    let url = a.url.trim().trim_end_matches('/').to_string();
    kiln_api::client::check_server_urls(&url).map_err(usage)?;
    check_name(&a.context)?;
    let token = match a.token_file.as_deref() {
        Some(p) if p != std::path::Path::new("-") => {
            let source = TokenSource { what: "API", env: "--token-file", file: "admin.token" };
            read_token(&source, false, Some(p), None)?
        }
        _ => read_stdin_token()?,
    };
    verify(&url, &token).await?;
    let path = profile::config_path()?;
    let mut p = Profile::load(&path)?;
    let replaced = p.contexts.insert(a.context.clone(), Context { server: url.clone(), token }).is_some();
    p.current = Some(a.context.clone());
    p.save(&path)?;
    kiln_cmd::outln!(
        "logged in to {url}: context `{}` ({}, now current) in {}",
        a.context,
        if replaced { "replaced" } else { "added" },
        path.display()
    );
    Ok(exit::OK)
}

/// The token from standard input: one line on a terminal (asked for on
/// stderr), else everything, trimmed.
fn read_stdin_token() -> Result<String, Failure> {
    let stdin = std::io::stdin();
    let mut token = String::new();
    if stdin.is_terminal() {
        eprint!("API token (e.g. the server's DATA_DIR/admin.token), then Enter: ");
        stdin.read_line(&mut token).map_err(|e| usage(format!("standard input: {e}")))?;
    } else {
        stdin.lock().read_to_string(&mut token).map_err(|e| usage(format!("standard input: {e}")))?;
    }
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(usage(
            "no token on standard input: `kiln login URL < FILE`, `printf %s \"$TOKEN\" | kiln login URL`, \
             or --token-file FILE; nothing was written",
        ));
    }
    Ok(token)
}

/// Ask the server whether it knows `token`; nothing is written unless it does.
async fn verify(url: &str, token: &str) -> Result<(), Failure> {
    match Client::new(url, token).get_run(PROBE_RUN).await {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(404) => Ok(()),
        Err(e @ ApiError::Status { status: 401 | 403, .. }) => Err(Failure {
            message: format!(
                "{url} refused the token ({e}); nothing was written. Check the token (the server's \
                 DATA_DIR/admin.token, or one from `kiln token create`)"
            ),
            code: exit::AUTH,
        }),
        Err(e) => Err(Failure {
            message: format!("cannot check the token with {url}: {e}; nothing was written. Is the server running?"),
            code: e.exit_code(),
        }),
    }
}

/// Context names: 1-64 characters of [A-Za-z0-9._-].
fn check_name(name: &str) -> Result<(), Failure> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok { Ok(()) } else { Err(usage(format!("context name `{name}`: use 1-64 characters of A-Z a-z 0-9 . _ -"))) }
}

pub(super) fn logout(context: Option<String>) -> CmdResult {
    let path = profile::config_path()?;
    let mut p = Profile::load(&path)?;
    let Some(name) = context.or_else(|| p.current.clone()) else {
        return Err(usage(format!(
            "no current context in {} (contexts: {}); name one with --context NAME",
            path.display(),
            p.names()
        )));
    };
    let Some(removed) = p.contexts.remove(&name) else {
        return Err(usage(format!("no context `{name}` in {} (contexts: {})", path.display(), p.names())));
    };
    if p.current.as_deref() == Some(name.as_str()) {
        p.current = None;
    }
    p.save(&path)?;
    kiln_cmd::outln!("{}", for_stdout(&format!("logged out: context `{name}` ({}) removed", removed.server)));
    Ok(exit::OK)
}

pub(super) fn context(command: ContextCommand) -> CmdResult {
    let path = profile::config_path()?;
    let mut p = Profile::load(&path)?;
    match command {
        ContextCommand::List { json } => {
            let current = p.current.as_deref();
            if json {
                let list: Vec<_> = p
                    .contexts
                    .iter()
                    .map(|(name, c)| {
                        serde_json::json!({ "name": name, "server": c.server, "current": current == Some(name.as_str()) })
                    })
                    .collect();
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
            } else {
                kiln_cmd::outln!("{:<1} {:<20} SERVER", "", "NAME");
                for (name, c) in &p.contexts {
                    let mark = if current == Some(name.as_str()) { "*" } else { "" };
                    kiln_cmd::outln!("{}", for_stdout(&format!("{mark:<1} {name:<20} {}", c.server)));
                }
            }
        }
        ContextCommand::Use { name } => {
            if !p.contexts.contains_key(&name) {
                return Err(usage(format!("no context `{name}` in {} (contexts: {})", path.display(), p.names())));
            }
            p.current = Some(name.clone());
            p.save(&path)?;
            kiln_cmd::outln!("current context: {name}");
        }
    }
    Ok(exit::OK)
}
