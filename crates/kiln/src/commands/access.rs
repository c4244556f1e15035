//! `kiln token`, `kiln agent-token`, `kiln agents`, `kiln audit`.

use super::shared::{client, duration_text, when};
use crate::cli::{AgentTokenCommand, AgentsCommand, AuditArgs, TokenCommand};
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn token(cmd: TokenCommand) -> CmdResult {
    match cmd {
        TokenCommand::Create { name, scope, repo, trusted, conn } => {
            let t = client(&conn)?.create_token(&kiln_api::CreateToken { name, scope, repo, trusted }).await?;
            eprintln!(
                "created {} token {} ({}{}); it is shown only now:",
                t.info.scope,
                t.info.id,
                t.info.name,
                if t.info.trusted { ", starts trusted runs" } else { "" }
            );
            kiln_cmd::outln!("{}", t.token);
        }
        TokenCommand::Ls { json, conn } => {
            let list = client(&conn)?.list_tokens().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("no API tokens yet; create one with `kiln token create --name NAME`");
                return Ok(exit::OK);
            }
            for t in list {
                let state = match t.revoked_at_ms {
                    Some(ms) => format!("revoked {}", when(ms)),
                    None => t.last_used_at_ms.map_or("never used".into(), |ms| format!("used {}", when(ms))),
                };
                kiln_cmd::outln!(
                    "{:<14} {:<8} {:<20} {:<8} {}{}",
                    t.id,
                    t.scope,
                    t.name,
                    if t.trusted { "trusted" } else { "-" },
                    state,
                    t.repo_id.map(|r| format!(" repo {r}")).unwrap_or_default()
                );
            }
        }
        TokenCommand::Revoke { id, conn } => {
            client(&conn)?.revoke_token(&id).await?;
            kiln_cmd::outln!("token {id} revoked");
        }
    }
    Ok(exit::OK)
}

pub(super) async fn agent_token(cmd: AgentTokenCommand) -> CmdResult {
    match cmd {
        AgentTokenCommand::Create { name, pool, conn } => {
            let t = client(&conn)?.create_join_token(&kiln_api::CreateJoinToken { name, pool: Some(pool) }).await?;
            eprintln!(
                "created join token {} ({}, pool {}); it is shown only now. Start an agent with it in a file:\n  \
                 kiln agent --server URL --token-file FILE --name NAME",
                t.info.id, t.info.name, t.info.pool
            );
            kiln_cmd::outln!("{}", t.token);
        }
        AgentTokenCommand::Ls { json, conn } => {
            let list = client(&conn)?.list_join_tokens().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("no agent join tokens yet; create one with `kiln agent-token create --name NAME`");
                return Ok(exit::OK);
            }
            for t in list {
                let state = t.revoked_at_ms.map_or("active".into(), |ms| format!("revoked {}", when(ms)));
                kiln_cmd::outln!("{:<14} {:<20} pool {:<12} {}", t.id, t.name, t.pool, state);
            }
        }
        AgentTokenCommand::Revoke { id, conn } => {
            client(&conn)?.revoke_join_token(&id).await?;
            kiln_cmd::outln!("join token {id} revoked");
        }
    }
    Ok(exit::OK)
}

/// What the Agents page's State column says: `draining`, `busy`, `idle` or
/// `offline` (no session connection to the server that answered).
fn agent_state(a: &kiln_api::AgentInfo) -> &'static str {
    if a.draining {
        "draining"
    } else if !a.connected {
        "offline"
    } else if a.running_jobs > 0 {
        "busy"
    } else {
        "idle"
    }
}

pub(super) async fn agents(cmd: AgentsCommand) -> CmdResult {
    match cmd {
        AgentsCommand::Ls { json, conn } => {
            let list = client(&conn)?.list_agents().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!(
                    "no agents registered; start one with `kiln agent --server URL --token-file FILE` \
                     (a join token from `kiln agent-token create`), or `kiln up --agents N`"
                );
                return Ok(exit::OK);
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            kiln_cmd::outln!(
                "{:<20} {:<9} {:<6} {:<28} {:<10} {:<28} {:<10} {:<12} ID",
                "NAME",
                "STATE",
                "JOBS",
                "RUNNING",
                "LAST SEEN",
                "LABELS",
                "VERSION",
                "POOL"
            );
            for a in list {
                let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let running = match a.jobs.as_slice() {
                    [] => "-".to_string(),
                    [j] => format!("{}#{} {}", j.repo, j.run_number, j.job),
                    [j, more @ ..] => format!("{}#{} {} +{}", j.repo, j.run_number, j.job, more.len()),
                };
                kiln_cmd::outln!(
                    "{}",
                    crate::term::for_stdout(&format!(
                        "{:<20} {:<9} {:<6} {:<28} {:<10} {:<28} {:<10} {:<12} {}",
                        a.name,
                        agent_state(&a),
                        format!("{}/{}", a.running_jobs, a.max_jobs),
                        running,
                        format!("{} ago", duration_text((now - a.last_seen_at_ms).max(0))),
                        labels.join(","),
                        a.version.as_deref().unwrap_or("-"),
                        a.pool,
                        a.id
                    ))
                );
            }
        }
        AgentsCommand::Rm { id, conn } => {
            client(&conn)?.remove_agent(&id).await?;
            kiln_cmd::outln!("agent {id} removed; its running jobs go to other agents");
        }
    }
    Ok(exit::OK)
}

pub(super) async fn audit(a: AuditArgs) -> CmdResult {
    let entries = client(&a.conn)?.audit(None, a.limit).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&entries).expect("json"));
        return Ok(exit::OK);
    }
    for e in entries {
        kiln_cmd::outln!("{}  {:<20} {:<18} {} {}", when(e.at_ms), e.actor, e.action, e.target, e.detail);
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    #[test]
    fn when_is_utc_civil_time() {
        assert_eq!(super::super::shared::when(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::super::shared::when(1_796_146_200_000), "2026-12-01 17:30:00Z");
        assert_eq!(super::super::shared::when(951_782_400_000), "2000-02-29 00:00:00Z");
    }
}
