//! Deployment environments (issue 46): their protection rules and the
//! approvals runs get for them. The gate itself is read by `advance`
//! (`tx::gates`): a deploy job waits there until its run holds enough
//! unexpired approvals, is cancelled when one approver rejected, and then
//! queues in its environment's deploy queue.

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::{ApprovalRecord, EnvironmentRecord, RunRecord};
use crate::store::SqlStore;
use crate::tx::gates::{APPROVAL_COLS, ENV_COLS, approval_from_row, approvals_in, env_from_row, get_in, not_found};
use kiln_core::JobStatus;

fn check(env: &EnvironmentRecord) -> Result<()> {
    if !kiln_workflow::valid_environment_name(&env.name) {
        return Err(StoreError::Invalid(format!(
            "environment name `{}`: 1 to 64 letters, digits, `-`, `_` or `.`, starting with a letter or digit",
            env.name
        )));
    }
    if env.approvers.len() > 100 || env.refs.len() > 100 {
        return Err(StoreError::Invalid("at most 100 approvers and 100 ref patterns".into()));
    }
    if env.min_approvals > 0 && !env.approvers.is_empty() && env.min_approvals as usize > env.approvers.len() {
        return Err(StoreError::Invalid(format!(
            "--min-approvals {} but only {} approver(s) listed: no run could ever be approved",
            env.min_approvals,
            env.approvers.len()
        )));
    }
    if !(0..=30 * 86_400_000).contains(&env.wait_ms) {
        return Err(StoreError::Invalid("--wait: from 0 to 30 days".into()));
    }
    if env.keep_deployments > 1000 {
        return Err(StoreError::Invalid("--keep-deployments: at most 1000".into()));
    }
    if !(60_000..=366 * 86_400_000).contains(&env.approval_ttl_ms) {
        return Err(StoreError::Invalid("an approval's lifetime: from 1 minute to 366 days".into()));
    }
    if let Some(p) = &env.require_provenance {
        kiln_provenance::deploy::DeployPolicy::parse(p).map_err(StoreError::Invalid)?;
    }
    Ok(())
}

/// `EnvironmentStore::get_environment`.
pub(crate) async fn get_environment(store: &SqlStore, name: &str) -> Result<EnvironmentRecord> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {ENV_COLS} FROM environments WHERE name = $1"));
    let row = store.reader().await?.sql(&SQL).bind(name).fetch_optional().await?;
    env_from_row(&row.ok_or_else(|| not_found(name))?)
}

/// `EnvironmentStore::list_environments`, by name.
pub(crate) async fn list_environments(store: &SqlStore) -> Result<Vec<EnvironmentRecord>> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {ENV_COLS} FROM environments ORDER BY name"));
    store.reader().await?.sql(&SQL).fetch_all().await?.iter().map(env_from_row).collect()
}

/// `EnvironmentStore::put_environment`: create (`create`) or replace.
pub(crate) async fn put_environment(
    store: &SqlStore,
    env: &EnvironmentRecord,
    create: bool,
) -> Result<EnvironmentRecord> {
    check(env)?;
    store
        .transaction(Isolation::Serializable, &(env, create), |tx, &(env, create)| {
            Box::pin(async move {
                let now = now(tx).await?;
                let existing = get_in(tx, &env.name).await?;
                match (&existing, create) {
                    (Some(_), true) => {
                        return Err(StoreError::Conflict(format!("environment `{}` already exists", env.name)));
                    }
                    (None, false) => return Err(not_found(&env.name)),
                    _ => {}
                }
                let json = |v: &[String]| serde_json::to_string(v).unwrap_or_else(|_| "[]".into());
                if existing.is_some() {
                    tx.sql(
                        "UPDATE environments SET approvers = $1, min_approvals = $2, prevent_self_review = $3, \
                         refs = $4, wait_ms = $5, approval_ttl_ms = $6, updated_at = $7, keep_deployments = $9, \
                         require_provenance = $10 WHERE name = $8",
                    )
                } else {
                    tx.sql(
                        "INSERT INTO environments (approvers, min_approvals, prevent_self_review, refs, wait_ms, \
                         approval_ttl_ms, updated_at, name, created_at, keep_deployments, require_provenance) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $7, $9, $10)",
                    )
                }
                .bind(json(&env.approvers))
                .bind(i64::from(env.min_approvals))
                .bind(i64::from(env.prevent_self_review))
                .bind(json(&env.refs))
                .bind(env.wait_ms)
                .bind(env.approval_ttl_ms)
                .bind(now)
                .bind(&env.name)
                .bind(i64::from(env.keep_deployments))
                .bind(&env.require_provenance)
                .execute()
                .await?;
                Ok(())
            })
        })
        .await?;
    get_environment(store, &env.name).await
}

/// `EnvironmentStore::delete_environment`: refused while a live run has a
/// job deploying to it.
pub(crate) async fn delete_environment(store: &SqlStore, name: &str) -> Result<EnvironmentRecord> {
    let env = get_environment(store, name).await?;
    store
        .transaction(Isolation::Serializable, &name, |tx, &name| {
            Box::pin(async move {
                let key = kiln_core::advance::environment_group(name);
                static LIVE: Sql = Sql::new(|_| {
                    format!(
                        "SELECT COUNT(*) FROM jobs WHERE concurrency_group = $1 AND status IN ({}, {}, {})",
                        lit(JobStatus::Pending),
                        lit(JobStatus::Ready),
                        lit(JobStatus::Running)
                    )
                });
                let live: i64 = tx.sql(&LIVE).bind(&key).scalar().await?;
                if live > 0 {
                    return Err(StoreError::Conflict(format!(
                        "environment `{name}` has {live} deploy job(s) queued or running; cancel them first"
                    )));
                }
                tx.sql("DELETE FROM environments WHERE name = $1").bind(name).execute().await?;
                tx.sql("DELETE FROM deployment_pins WHERE environment = $1").bind(name).execute().await?;
                Ok(())
            })
        })
        .await?;
    Ok(env)
}

/// `EnvironmentStore::run_approvals`.
pub(crate) async fn run_approvals(store: &SqlStore, run_id: &str) -> Result<Vec<ApprovalRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!("SELECT {APPROVAL_COLS} FROM environment_approvals WHERE run_id = $1 ORDER BY created_at, actor")
    });
    store.reader().await?.sql(&SQL).bind(run_id).fetch_all().await?.iter().map(approval_from_row).collect()
}

/// `EnvironmentStore::decide_deployment`: one approver's decision on a
/// run's deployment to `environment`, and the run advanced with it (its
/// deploy jobs become ready, or are cancelled) in the same transaction.
/// Who may decide is the caller's check; here: the run is live, one of its
/// jobs deploys to the environment, and the approver decided nothing yet.
pub(crate) async fn decide_deployment(store: &SqlStore, a: &ApprovalRecord) -> Result<ApprovalRecord> {
    store
        .transaction(Isolation::Serializable, a, |tx, a| {
            Box::pin(async move {
                let now = now(tx).await?;
                let run = crate::rows::load_run(tx, &a.run_id).await?;
                if run.status.is_terminal() {
                    return Err(StoreError::Conflict(format!("run {} has ended ({})", a.run_id, run.status.as_str())));
                }
                if !run.definition.jobs.iter().any(|j| j.environment.as_ref().is_some_and(|e| e.name == a.environment))
                {
                    return Err(StoreError::Invalid(format!(
                        "run {} has no job deploying to environment `{}`",
                        a.run_id, a.environment
                    )));
                }
                let env = get_in(tx, &a.environment).await?.ok_or_else(|| not_found(&a.environment))?;
                let prior: Option<String> = tx
                    .sql("SELECT decision FROM environment_approvals WHERE run_id = $1 AND environment = $2 AND actor = $3 AND expires_at > $4")
                    .bind(&a.run_id)
                    .bind(&a.environment)
                    .bind(&a.actor)
                    .bind(now)
                    .scalar_optional()
                    .await?;
                if let Some(d) = prior {
                    return Err(StoreError::Conflict(format!(
                        "you already {d} this run's deployment to `{}`",
                        a.environment
                    )));
                }
                tx.sql("DELETE FROM environment_approvals WHERE run_id = $1 AND environment = $2 AND actor = $3")
                    .bind(&a.run_id)
                    .bind(&a.environment)
                    .bind(&a.actor)
                    .execute()
                    .await?;
                tx.sql(
                    "INSERT INTO environment_approvals (run_id, environment, actor, decision, comment, created_at, \
                     expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&a.run_id)
                .bind(&a.environment)
                .bind(&a.actor)
                .bind(&a.decision)
                .bind(&a.comment)
                .bind(now)
                .bind(now + env.approval_ttl_ms)
                .execute()
                .await?;
                crate::tx::advance::advance_run(tx, &a.run_id, now).await?;
                let rows = approvals_in(tx, &a.run_id).await?;
                rows.into_iter()
                    .find(|r| r.environment == a.environment && r.actor == a.actor)
                    .ok_or_else(|| StoreError::Unavailable("the approval just written is gone".into()))
            })
        })
        .await
}

/// A deploy job of `run` ended `status` (success or failed) through its
/// attempt `epoch`: record what it deployed (issue 46) — in the completion
/// transaction, with the artifact generations it restored as they are
/// bound in this run and the approvals its run holds. Not a deploy job:
/// nothing.
pub(crate) async fn record_deployment(
    tx: &mut Tx,
    run: &RunRecord,
    job: &crate::model::JobRecord,
    epoch: i64,
    status: JobStatus,
    now: i64,
) -> Result<()> {
    let Some(def) = usize::try_from(job.index).ok().and_then(|i| run.definition.jobs.get(i)) else { return Ok(()) };
    let Some(env) = &def.environment else { return Ok(()) };
    let artifacts: Vec<crate::model::DeployedArtifact> = crate::tx::provenance::restored(tx, &run.id, def)
        .await?
        .into_iter()
        .map(|r| crate::model::DeployedArtifact {
            name: r.name,
            from_job: r.from_job,
            run_id: r.run_id,
            generation: r.generation,
            sha256: r.sha256,
        })
        .collect();
    let approvals: Vec<String> = approvals_in(tx, &run.id)
        .await?
        .into_iter()
        .filter(|a| a.environment == env.name && a.decision == "approved" && a.expires_at > now)
        .map(|a| a.actor)
        .collect();
    tx.sql(
        "INSERT INTO deployments (id, environment, repo_id, run_id, job_id, job_name, epoch, commit_sha, url, status, \
         triggered_by, approvals, artifacts, created_at, rollback_of, ring) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
         $9, $10, $11, $12, $13, $14, $15, $16) ON CONFLICT (job_id) DO UPDATE SET epoch = EXCLUDED.epoch, \
         status = EXCLUDED.status, approvals = EXCLUDED.approvals, artifacts = EXCLUDED.artifacts, \
         created_at = EXCLUDED.created_at",
    )
    .bind(crate::rows::new_id())
    .bind(&env.name)
    .bind(&run.repo_id)
    .bind(&run.id)
    .bind(&job.id)
    .bind(&job.name)
    .bind(epoch)
    .bind(&run.commit_sha)
    .bind(&env.url)
    .bind(status.as_str())
    .bind(&run.actor)
    .bind(serde_json::to_string(&approvals).unwrap_or_else(|_| "[]".into()))
    .bind(serde_json::to_string(&artifacts).unwrap_or_else(|_| "[]".into()))
    .bind(now)
    .bind(&run.rollback_of)
    .bind(env.ring.as_ref().map(|r| r.name.as_str()))
    .execute()
    .await?;
    pin(tx, &env.name, &job.id, &artifacts).await
}

/// Pin what the deployment of `job_id` deployed against expiry (an
/// artifact binding of a pinned generation never expires:
/// `tx::artifacts::live_binding`), and release the pins of the
/// environment's deployments that are neither its current one (newest
/// success) nor among its `keep_deployments` newest.
async fn pin(tx: &mut Tx, environment: &str, job_id: &str, artifacts: &[crate::model::DeployedArtifact]) -> Result<()> {
    let id: String = tx.sql("SELECT id FROM deployments WHERE job_id = $1").bind(job_id).scalar().await?;
    for a in artifacts {
        tx.sql(
            "INSERT INTO deployment_pins (deployment_id, environment, generation_id) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&id)
        .bind(environment)
        .bind(&a.generation)
        .execute()
        .await?;
    }
    let keep: i64 = tx
        .sql("SELECT keep_deployments FROM environments WHERE name = $1")
        .bind(environment)
        .scalar_optional()
        .await?
        .unwrap_or(10);
    tx.sql(
        "DELETE FROM deployment_pins WHERE environment = $1 \
         AND deployment_id NOT IN (SELECT k.id FROM (SELECT id FROM deployments WHERE environment = $1 \
         ORDER BY created_at DESC, id DESC LIMIT $2) k) \
         AND deployment_id NOT IN (SELECT c.id FROM (SELECT id FROM deployments WHERE environment = $1 \
         AND status = 'success' ORDER BY created_at DESC, id DESC LIMIT 1) c)",
    )
    .bind(environment)
    .bind(keep)
    .execute()
    .await?;
    Ok(())
}

/// A deployment with its repository's name and run number; tables `d`
/// (deployments), `p` (repos), `r` (runs).
pub(crate) const DEPLOYMENT_COLS: &str = "d.id, d.environment, d.repo_id, p.name AS repo_name, d.run_id, \
    r.run_number, d.job_id, d.job_name, d.epoch, d.commit_sha, d.url, d.status, d.triggered_by, d.approvals, \
    d.artifacts, d.created_at, d.rollback_of, d.ring";
/// The joins [`DEPLOYMENT_COLS`] reads from.
pub(crate) const DEPLOYMENT_FROM: &str =
    "deployments d JOIN repos p ON p.id = d.repo_id JOIN runs r ON r.id = d.run_id";

pub(crate) fn deployment_from_row(row: &crate::db::Row) -> Result<crate::model::DeploymentRecord> {
    Ok(crate::model::DeploymentRecord {
        id: row.get("id")?,
        environment: row.get("environment")?,
        repo_id: row.get("repo_id")?,
        repo_name: row.get("repo_name")?,
        run_id: row.get("run_id")?,
        run_number: row.get("run_number")?,
        job_id: row.get("job_id")?,
        job_name: row.get("job_name")?,
        epoch: row.get("epoch")?,
        commit_sha: row.get("commit_sha")?,
        url: row.get("url")?,
        status: row.get("status")?,
        triggered_by: row.get("triggered_by")?,
        approvals: serde_json::from_str(row.str("approvals")?).unwrap_or_default(),
        artifacts: serde_json::from_str(row.str("artifacts")?).unwrap_or_default(),
        created_at: row.get("created_at")?,
        rollback_of: row.get("rollback_of")?,
        ring: row.get("ring")?,
    })
}

/// `EnvironmentStore::deployments`: an environment's deployments, newest
/// first (at most `limit`).
pub(crate) async fn deployments(
    store: &SqlStore,
    environment: &str,
    limit: u32,
) -> Result<Vec<crate::model::DeploymentRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT {DEPLOYMENT_COLS} FROM {DEPLOYMENT_FROM} WHERE d.environment = $1 \
             ORDER BY d.created_at DESC, d.id DESC LIMIT $2"
        )
    });
    let rows =
        store.reader().await?.sql(&SQL).bind(environment).bind(i64::from(limit.clamp(1, 500))).fetch_all().await?;
    rows.iter().map(deployment_from_row).collect()
}
