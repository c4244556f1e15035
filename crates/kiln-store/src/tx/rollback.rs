//! Rollback as a pointer flip (issue 46): a new run of the deployment's
//! frozen run in which only the environment's deploy jobs (and what follows
//! them) run, every job they need pinned to the generations the deployment
//! restored — no build runs, the same sha256 is deployed — accepted in one
//! transaction with the approver's approval. The deployed generations are
//! kept by their deployment's pins (`deployment_pins`).

use crate::db::{Exec, Tx};
use crate::dialect::{Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::{DeploymentRecord, NewRollback};
use crate::rows::PinnedFrom;
use crate::store::SqlStore;
use crate::tx::environments::{DEPLOYMENT_COLS, DEPLOYMENT_FROM, deployment_from_row};
use crate::tx::gates::{get_in, not_found};
use kiln_core::JobStatus;
use kiln_core::retry::{ParentJob, RollbackRefusal, rollback_plan};
use std::collections::{BTreeSet, HashMap};

async fn deployment_in(tx: &mut impl Exec, id: &str) -> Result<Option<DeploymentRecord>> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {DEPLOYMENT_COLS} FROM {DEPLOYMENT_FROM} WHERE d.id = $1"));
    tx.sql(&SQL).bind(id).fetch_optional().await?.as_ref().map(deployment_from_row).transpose()
}

/// `EnvironmentStore::rollback_target`: the deployment a rollback of
/// `environment` returns to — `to` (a successful deployment of it), or
/// else the newest successful one made by another run than its current
/// (newest successful) deployment, that deployed other bytes.
pub(crate) async fn rollback_target(store: &SqlStore, environment: &str, to: Option<&str>) -> Result<DeploymentRecord> {
    let mut r = store.reader().await?;
    if let Some(id) = to {
        let d = deployment_in(&mut r, id)
            .await?
            .filter(|d| d.environment == environment)
            .ok_or_else(|| StoreError::NotFound(format!("deployment {id} of environment `{environment}`")))?;
        if d.status != "success" {
            return Err(StoreError::Conflict(format!(
                "deployment {id} ended {}: only a successful deployment can be returned to",
                d.status
            )));
        }
        return Ok(d);
    }
    static SUCCESSES: Sql = Sql::new(|_| {
        format!(
            "SELECT {DEPLOYMENT_COLS} FROM {DEPLOYMENT_FROM} WHERE d.environment = $1 AND d.status = 'success' \
             ORDER BY d.created_at DESC, d.id DESC LIMIT 200"
        )
    });
    let rows = r.sql(&SUCCESSES).bind(environment).fetch_all().await?;
    let all: Vec<DeploymentRecord> = rows.iter().map(deployment_from_row).collect::<Result<_>>()?;
    let Some(current) = all.first() else {
        return Err(StoreError::Conflict(format!("environment `{environment}` has no successful deployment yet")));
    };
    let bytes = |d: &DeploymentRecord| -> BTreeSet<(String, String)> {
        d.artifacts.iter().map(|a| (a.name.clone(), a.sha256.clone())).collect()
    };
    all.iter()
        .find(|d| d.run_id != current.run_id && (bytes(d) != bytes(current) || d.commit_sha != current.commit_sha))
        .cloned()
        .ok_or_else(|| {
            StoreError::Conflict(format!(
                "environment `{environment}` has no earlier successful deployment to return to (its current one is \
                 {}, run #{} of {})",
                current.id, current.run_number, current.repo_name
            ))
        })
}

/// What a rollback run (of `parent`, returning to `rb.deployment_id`)
/// pins and skips, by job name ([`rollback_plan`]).
pub(crate) async fn plan(
    tx: &mut Tx,
    parent: &str,
    rb: &NewRollback,
) -> Result<(HashMap<String, PinnedFrom>, HashMap<String, String>)> {
    let d = deployment_in(tx, &rb.deployment_id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("deployment {}", rb.deployment_id)))?;
    if d.run_id != parent || d.environment != rb.environment {
        return Err(StoreError::Invalid(format!(
            "deployment {} was made by run {} to `{}`, not by run {parent} to `{}`",
            d.id, d.run_id, d.environment, rb.environment
        )));
    }
    let run = crate::rows::load_run(tx, parent).await?;
    let (indexed, mut from) = crate::rows::parent_jobs(tx, parent).await?;
    let deploy: BTreeSet<String> = indexed
        .iter()
        .filter(|(index, _)| {
            usize::try_from(*index)
                .ok()
                .and_then(|i| run.definition.jobs.get(i))
                .and_then(|j| j.environment.as_ref())
                .is_some_and(|e| e.name == d.environment)
        })
        .map(|(_, j)| j.name.clone())
        .collect();
    let jobs: Vec<ParentJob> = indexed.into_iter().map(|(_, j)| j).collect();
    let plan = rollback_plan(&jobs, &deploy).map_err(|why| match why {
        RollbackRefusal::NotEnded => {
            StoreError::Conflict(format!("run {parent} has jobs that have not ended; roll back once it has ended"))
        }
        RollbackRefusal::NoDeployJob => {
            StoreError::Invalid(format!("run {parent} has no job deploying to `{}`", d.environment))
        }
        RollbackRefusal::NeedNotSucceeded(job) => StoreError::Conflict(format!(
            "job `{job}` of run {parent}, which its deploy job needs, did not succeed: nothing of it to deploy"
        )),
    })?;
    let skipped = plan
        .skipped
        .iter()
        .map(|n| {
            (n.clone(), format!("skipped: a rollback runs only the deploy jobs (it did not succeed in run {parent})"))
        })
        .collect();
    from.retain(|name, _| plan.pinned.contains(name));
    Ok((from, skipped))
}

/// A job a rollback does not run: skipped at acceptance.
pub(crate) async fn skip_job(tx: &mut Tx, job_id: &str, why: &str, now: i64) -> Result<()> {
    static SKIP: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {skipped}, finished_at = $1, message = $2 WHERE id = $3",
            skipped = lit(JobStatus::Skipped)
        )
    });
    tx.sql(&SKIP).bind(now).bind(why).bind(job_id).execute().await?;
    Ok(())
}

/// The rollback run `run_id`'s flip, in its acceptance transaction: every
/// generation the deployment deployed is bound in the new run (pinned, not
/// expired) — else refused, nothing accepted — the run names the deployment
/// it returns to, and the approver's approval is recorded.
pub(crate) async fn bind(tx: &mut Tx, run_id: &str, rb: &NewRollback, now: i64) -> Result<()> {
    let d = deployment_in(tx, &rb.deployment_id)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("deployment {}", rb.deployment_id)))?;
    for a in &d.artifacts {
        let bound: i64 = tx
            .sql(
                "SELECT COUNT(*) FROM artifact_bindings b JOIN artifact_generations g ON g.id = b.generation_id \
                 WHERE b.run_id = $1 AND b.generation_id = $2 AND b.expired_at IS NULL AND g.deleted_at IS NULL",
            )
            .bind(run_id)
            .bind(&a.generation)
            .scalar()
            .await?;
        if bound == 0 {
            return Err(StoreError::Conflict(format!(
                "artifact `{}` (sha256 {}) that deployment {} deployed has expired: only the current and the \
                 newest `--keep-deployments` deployments of an environment keep their bytes",
                a.name, a.sha256, d.id
            )));
        }
    }
    tx.sql("UPDATE runs SET rollback_of = $1 WHERE id = $2").bind(&d.id).bind(run_id).execute().await?;
    if let Some(approver) = &rb.approver {
        let env = get_in(tx, &rb.environment).await?.ok_or_else(|| not_found(&rb.environment))?;
        tx.sql(
            "INSERT INTO environment_approvals (run_id, environment, actor, decision, comment, created_at, \
             expires_at) VALUES ($1, $2, $3, 'approved', $4, $5, $6)",
        )
        .bind(run_id)
        .bind(&rb.environment)
        .bind(approver)
        .bind(rb.comment.clone().unwrap_or_else(|| format!("rollback to deployment {}", d.id)))
        .bind(now)
        .bind(now + env.approval_ttl_ms)
        .execute()
        .await?;
    }
    Ok(())
}
