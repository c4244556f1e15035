//! `kiln token`, `kiln agent-token`, `kiln agents`, `kiln audit`.

use super::shared::client;
use crate::cli::{AgentTokenCommand, AgentsCommand, AuditArgs, TokenCommand};
use kiln_api::exit;
use kiln_cmd::CmdResult;

/// Milliseconds since the epoch as `2026-12-01 17:30:00Z` (UTC).
fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

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
            println!("{}", t.token);
        }
        TokenCommand::Ls { conn } => {
            for t in client(&conn)?.list_tokens().await? {
                let state = match t.revoked_at_ms {
                    Some(ms) => format!("revoked {}", when(ms)),
                    None => t.last_used_at_ms.map_or("never used".into(), |ms| format!("used {}", when(ms))),
                };
                println!(
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
            println!("token {id} revoked");
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
            println!("{}", t.token);
        }
        AgentTokenCommand::Ls { conn } => {
            for t in client(&conn)?.list_join_tokens().await? {
                let state = t.revoked_at_ms.map_or("active".into(), |ms| format!("revoked {}", when(ms)));
                println!("{:<14} {:<20} pool {:<12} {}", t.id, t.name, t.pool, state);
            }
        }
        AgentTokenCommand::Revoke { id, conn } => {
            client(&conn)?.revoke_join_token(&id).await?;
            println!("join token {id} revoked");
        }
    }
    Ok(exit::OK)
}

pub(super) async fn agents(cmd: AgentsCommand) -> CmdResult {
    match cmd {
        AgentsCommand::Ls { conn } => {
            for a in client(&conn)?.list_agents().await? {
                let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<34} {:<20} pool {:<12} max {:<3} since {} {}",
                    a.id,
                    a.name,
                    a.pool,
                    a.max_jobs,
                    when(a.created_at_ms),
                    labels.join(",")
                );
            }
        }
        AgentsCommand::Rm { id, conn } => {
            client(&conn)?.remove_agent(&id).await?;
            println!("agent {id} removed; its running jobs go to other agents");
        }
    }
    Ok(exit::OK)
}

pub(super) async fn audit(a: AuditArgs) -> CmdResult {
    let entries = client(&a.conn)?.audit(None, a.limit).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&entries).expect("json"));
        return Ok(exit::OK);
    }
    for e in entries {
        println!("{}  {:<20} {:<18} {} {}", when(e.at_ms), e.actor, e.action, e.target, e.detail);
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    #[test]
    fn when_is_utc_civil_time() {
        assert_eq!(super::when(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::when(1_796_146_200_000), "2026-12-01 17:30:00Z");
        assert_eq!(super::when(951_782_400_000), "2000-02-29 00:00:00Z");
    }
}
