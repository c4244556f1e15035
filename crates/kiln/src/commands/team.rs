//! `kiln team add|ls|set|rm`, `kiln queue` and `kiln priority` (issue 44):
//! teams and their shares, the queue by team × lane × labels, and moving a
//! run to another lane.

use super::shared::{client, run_ref};
use crate::cli::{PriorityArgs, QueueArgs, TeamCommand};
use kiln_api::exit;
use kiln_cmd::CmdResult;

fn quota(q: Option<u32>) -> String {
    q.map_or("-".to_string(), |n| n.to_string())
}

pub(super) async fn run(cmd: TeamCommand) -> CmdResult {
    match cmd {
        TeamCommand::Add { name, weight, max_running, max_queued, conn } => {
            let t = client(&conn)?
                .create_team(&kiln_api::CreateTeam { name, weight: Some(weight), max_running, max_queued })
                .await?;
            kiln_cmd::outln!(
                "team {} created: weight {}, max running {}, max queued {}; move repositories into it with \
                 `kiln repo set REPO --team {}`",
                t.name,
                t.weight,
                quota(t.max_running),
                quota(t.max_queued),
                t.name
            );
        }
        TeamCommand::Ls { json, conn } => {
            let list = client(&conn)?.list_teams().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            kiln_cmd::outln!(
                "{:<20} {:>6} {:>12} {:>11} {:>6}",
                "TEAM",
                "WEIGHT",
                "MAX RUNNING",
                "MAX QUEUED",
                "REPOS"
            );
            for t in list.teams {
                kiln_cmd::outln!(
                    "{:<20} {:>6} {:>12} {:>11} {:>6}",
                    t.name,
                    t.weight,
                    quota(t.max_running),
                    quota(t.max_queued),
                    t.repos
                );
            }
        }
        TeamCommand::Set { name, weight, max_running, max_queued, conn } => {
            if weight.is_none() && max_running.is_none() && max_queued.is_none() {
                return Err(kiln_cmd::usage("nothing to change: give --weight, --max-running or --max-queued"));
            }
            let t = client(&conn)?
                .update_team(
                    &name,
                    &kiln_api::UpdateTeam {
                        weight,
                        max_running: max_running.map(|q| q.0),
                        max_queued: max_queued.map(|q| q.0),
                    },
                )
                .await?;
            kiln_cmd::outln!(
                "team {}: weight {}, max running {}, max queued {} (applies within a second)",
                t.name,
                t.weight,
                quota(t.max_running),
                quota(t.max_queued)
            );
        }
        TeamCommand::Rm { name, conn } => {
            let t = client(&conn)?.delete_team(&name).await?;
            kiln_cmd::outln!("team {} removed", t.name);
        }
    }
    Ok(exit::OK)
}

pub(super) async fn queue(a: QueueArgs) -> CmdResult {
    let q = client(&a.conn)?.queue().await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&q).expect("json"));
        return Ok(exit::OK);
    }
    kiln_cmd::outln!(
        "{} slots on connected agents; a waiting job moves up one lane every {}",
        q.slots,
        super::shared::duration_text(q.aging_step_secs as i64 * 1000)
    );
    kiln_cmd::outln!(
        "{:<20} {:>6} {:>9} {:>9} {:>7} {:>8}  QUOTAS",
        "TEAM",
        "WEIGHT",
        "RUNNING",
        "ENTITLED",
        "READY",
        "PENDING"
    );
    for t in &q.teams {
        let mut quotas = Vec::new();
        if let Some(m) = t.max_running {
            quotas.push(format!("max running {m}"));
        }
        if let Some(m) = t.max_queued {
            quotas.push(format!("max queued {m}"));
        }
        kiln_cmd::outln!(
            "{:<20} {:>6} {:>9} {:>9.1} {:>7} {:>8}  {}",
            t.team,
            t.weight,
            t.running,
            t.entitled_slots,
            t.ready,
            t.pending,
            if quotas.is_empty() { "-".to_string() } else { quotas.join(", ") }
        );
        for l in &t.lanes {
            let labels = if l.labels.is_empty() {
                "any agent".to_string()
            } else {
                l.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
            };
            let oldest = l
                .oldest_ready_secs
                .map(|s| format!(", oldest waiting {}", super::shared::duration_text((s * 1000.0) as i64)))
                .unwrap_or_default();
            kiln_cmd::outln!(
                "  {:<10} {:<24} running {}, ready {}, pending {}{oldest}",
                l.priority,
                labels,
                l.running,
                l.ready,
                l.pending
            );
        }
    }
    Ok(exit::OK)
}

pub(super) async fn priority(a: PriorityArgs) -> CmdResult {
    let run = run_ref(&a.run, a.repo.as_deref())?;
    let r = client(&a.conn)?.set_priority(&run, &a.priority).await?;
    kiln_cmd::outln!("run {}#{} is now {} ({})", r.repo, r.number, r.priority, r.id);
    Ok(exit::OK)
}
