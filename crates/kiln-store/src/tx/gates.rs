//! The environment gate a deploy job waits on (issue 46), read by the
//! advance pass: the environment's rules and the run's approvals. Below
//! both `advance` (which asks for the gates) and `environments` (which
//! writes approvals and then advances the run).

use crate::db::{Exec, Row, Tx};
use crate::dialect::Sql;
use crate::error::{Result, StoreError};
use crate::model::{ApprovalRecord, EnvironmentRecord, RunRecord};
use kiln_core::advance::EnvironmentGate;
use std::collections::HashMap;

pub(crate) const ENV_COLS: &str = "name, approvers, min_approvals, prevent_self_review, refs, wait_ms, approval_ttl_ms, \
     keep_deployments, require_provenance, created_at, updated_at";

pub(crate) fn env_from_row(row: &Row) -> Result<EnvironmentRecord> {
    let list = |v: &str| serde_json::from_str::<Vec<String>>(v).unwrap_or_default();
    Ok(EnvironmentRecord {
        name: row.get("name")?,
        approvers: list(row.str("approvers")?),
        min_approvals: u32::try_from(row.get::<i64>("min_approvals")?).unwrap_or(0),
        prevent_self_review: row.get::<i64>("prevent_self_review")? != 0,
        refs: list(row.str("refs")?),
        wait_ms: row.get("wait_ms")?,
        approval_ttl_ms: row.get("approval_ttl_ms")?,
        keep_deployments: u32::try_from(row.get::<i64>("keep_deployments")?).unwrap_or(10),
        require_provenance: row.get("require_provenance")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

pub(crate) async fn get_in(tx: &mut Tx, name: &str) -> Result<Option<EnvironmentRecord>> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {ENV_COLS} FROM environments WHERE name = $1"));
    tx.sql(&SQL).bind(name).fetch_optional().await?.as_ref().map(env_from_row).transpose()
}

pub(crate) fn not_found(name: &str) -> StoreError {
    StoreError::NotFound(format!("environment `{name}` (create it with `kiln env create {name}`)"))
}

pub(crate) fn approval_from_row(row: &Row) -> Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        run_id: row.get("run_id")?,
        environment: row.get("environment")?,
        actor: row.get("actor")?,
        decision: row.get("decision")?,
        comment: row.get("comment")?,
        created_at: row.get("created_at")?,
        expires_at: row.get("expires_at")?,
    })
}

pub(crate) const APPROVAL_COLS: &str = "run_id, environment, actor, decision, comment, created_at, expires_at";

pub(crate) async fn approvals_in(tx: &mut Tx, run_id: &str) -> Result<Vec<ApprovalRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!("SELECT {APPROVAL_COLS} FROM environment_approvals WHERE run_id = $1 ORDER BY created_at, actor")
    });
    tx.sql(&SQL).bind(run_id).fetch_all().await?.iter().map(approval_from_row).collect()
}

/// The gate of each environment `run`'s jobs deploy to, as of `now`, and
/// each one's wait before a deploy job may start (ms). An environment that
/// no longer exists gates nothing (acceptance refused runs naming an
/// unknown one).
pub(crate) async fn gates(
    tx: &mut Tx,
    run: &RunRecord,
    now: i64,
) -> Result<(HashMap<String, EnvironmentGate>, HashMap<String, i64>)> {
    let mut names: Vec<&str> =
        run.definition.jobs.iter().filter_map(|j| j.environment.as_ref().map(|e| e.name.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    let (mut gates, mut waits) = (HashMap::new(), HashMap::new());
    if names.is_empty() {
        return Ok((gates, waits));
    }
    let approvals = approvals_in(tx, &run.id).await?;
    for name in names {
        let Some(env) = get_in(tx, name).await? else { continue };
        // A rollback returns to bytes deployed before: no wait.
        waits.insert(name.to_string(), if run.rollback_of.is_some() { 0 } else { env.wait_ms });
        let live: Vec<&ApprovalRecord> =
            approvals.iter().filter(|a| a.environment == name && a.expires_at > now).collect();
        let gate = if let Some(r) = live.iter().find(|a| a.decision == "rejected") {
            let by = actor_label(&r.actor);
            let why = match &r.comment {
                Some(c) if !c.is_empty() => format!("cancelled: deployment to `{name}` rejected by {by}: {c}"),
                _ => format!("cancelled: deployment to `{name}` rejected by {by}"),
            };
            EnvironmentGate::Rejected(why)
        } else {
            let need = env.approvals_needed() as usize;
            let have = live.iter().filter(|a| a.decision == "approved").count();
            if have >= need {
                EnvironmentGate::Open
            } else {
                let who = if env.approvers.is_empty() { "an admin".to_string() } else { env.approvers.join(", ") };
                EnvironmentGate::Waiting(format!(
                    "waiting for approval to deploy to `{name}`: {have} of {need} (approvers: {who}; `kiln approve \
                     {} --env {name}`)",
                    run.id
                ))
            }
        };
        gates.insert(name.to_string(), gate);
    }
    Ok((gates, waits))
}

/// How an approval's actor reads in a message (`admin.token` → `admin`;
/// a token as `token:ID`, named by the API layer where it answers).
fn actor_label(actor: &str) -> &str {
    if actor == "admin.token" { "admin" } else { actor }
}
