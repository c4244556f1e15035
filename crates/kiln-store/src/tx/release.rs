//! A cancel ends when the sandbox is known to be gone (issue 40, item 5;
//! spec 000 §9, §15: "a timeout alone cannot certify that untrusted
//! execution has ended"). A fenced attempt (`lost`) publishes nothing more,
//! but its run stays `cancelling` until its sandbox is confirmed gone: by
//! its agent's report after the fence ([`release_attempt`]), by the same
//! agent starting again after removing what its previous process left
//! ([`release_predecessors`]), or by the agent's removal
//! ([`release_removed`]). An attempt that ended through its agent is
//! released by its completion (`attempt::end_attempt`).

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::SandboxEnd;
use crate::store::{SqlStore, lock_run, lock_run_of_job};
use crate::tx::advance::advance_run;
use kiln_core::{AttemptOutcome, RunStatus};

/// `AttemptStore::release_attempt`: the agent of attempt `(job, epoch)`
/// (the caller holds the attempt's token) says its sandbox is gone. Only
/// once it ended; a second report changes nothing. A cancelling run with
/// nothing else to wait for is cancelled.
pub(crate) async fn release_attempt(store: &SqlStore, job_id: &str, epoch: i64, end: &SandboxEnd) -> Result<bool> {
    store
        .transaction(Isolation::Serializable, &(job_id, epoch, end), |tx, &(job_id, epoch, end)| {
            Box::pin(async move {
                lock_run_of_job(tx, job_id).await?;
                let now = now(tx).await?;
                let row: Option<(String, String, Option<i64>)> = tx
                    .sql("SELECT run_id, outcome, released_at FROM attempts WHERE job_id = $1 AND epoch = $2")
                    .bind(job_id)
                    .bind(epoch)
                    .optional()
                    .await?;
                let Some((run_id, outcome, released)) = row else {
                    return Err(StoreError::NotFound(format!("attempt {epoch} of job {job_id}")));
                };
                if parse_enum::<AttemptOutcome>(&outcome)? == AttemptOutcome::Running {
                    return Err(StoreError::Conflict(format!(
                        "attempt {epoch} of job {job_id} still runs: its completion confirms its sandbox"
                    )));
                }
                if released.is_some() {
                    return Ok(false);
                }
                tx.sql(
                    "UPDATE attempts SET released_at = $1, release_evidence = $2, cleanup_error = $3 \
                     WHERE job_id = $4 AND epoch = $5 AND released_at IS NULL",
                )
                .bind(now)
                .bind(&end.evidence)
                .bind(end.cleanup_error.as_deref())
                .bind(job_id)
                .bind(epoch)
                .execute()
                .await?;
                settle(tx, &run_id, now).await?;
                Ok(true)
            })
        })
        .await
}

/// Earlier agents of the same name and pool as agent `$1`.
const PREDECESSORS: &str = "a.agent_id IN (SELECT o.id FROM agents o JOIN agents me ON me.id = $1 \
    WHERE o.name = me.name AND o.pool = me.pool AND o.id <> me.id)";

/// `AgentStore::release_predecessors`: the agent `agent_id` has just
/// started, and before it registered it killed every process group and
/// removed every sandbox its previous process left in its work directory:
/// the fenced attempts of earlier agents of the same name and pool are
/// confirmed gone. Returns how many.
pub(crate) async fn release_predecessors(store: &SqlStore, agent_id: &str) -> Result<u64> {
    static RUNS: Sql = Sql::new(|_| {
        format!(
            "SELECT DISTINCT a.run_id FROM attempts a WHERE a.outcome = {lost} AND a.released_at IS NULL AND {PREDECESSORS}",
            lost = lit(AttemptOutcome::Lost)
        )
    });
    static OF_RUN: Sql = Sql::new(|_| {
        format!(
            "SELECT a.job_id, a.epoch FROM attempts a WHERE a.outcome = {lost} AND a.released_at IS NULL \
             AND a.run_id = $2 AND {PREDECESSORS}",
            lost = lit(AttemptOutcome::Lost)
        )
    });
    // The runs first (a cheap read), then one transaction per run: each
    // locks only its own run.
    let runs: Vec<String> = store.reader().await?.sql(&RUNS).bind(agent_id).scalars().await?;
    let mut n = 0;
    for run in runs {
        n += store
            .transaction(Isolation::Serializable, &(run.as_str(), agent_id), |tx, &(run, agent_id)| {
                Box::pin(async move {
                    lock_run(tx, run).await?;
                    let now = now(tx).await?;
                    let attempts: Vec<(String, i64)> = tx.sql(&OF_RUN).bind(agent_id).bind(run).all().await?;
                    let evidence = "its agent started again and removed what its previous process left";
                    for (job, epoch) in &attempts {
                        release(tx, job, *epoch, evidence, now).await?;
                    }
                    if !attempts.is_empty() {
                        settle(tx, run, now).await?;
                    }
                    Ok(attempts.len() as u64)
                })
            })
            .await?;
    }
    Ok(n)
}

/// The fenced attempts of the removed agent `agent_id` need no confirmation
/// any more (the operator said the machine is gone): called by
/// `remove_agent` in its transaction.
pub(crate) async fn release_removed(tx: &mut Tx, agent_id: &str, now: i64) -> Result<()> {
    static OF_AGENT: Sql = Sql::new(|_| {
        format!(
            "SELECT a.job_id, a.epoch, a.run_id FROM attempts a WHERE a.outcome = {lost} AND a.released_at IS NULL \
             AND a.agent_id = $1 ORDER BY a.run_id, a.job_id",
            lost = lit(AttemptOutcome::Lost)
        )
    });
    let attempts: Vec<(String, i64, String)> = tx.sql(&OF_AGENT).bind(agent_id).all().await?;
    let mut runs: Vec<&str> = Vec::new();
    for (job, epoch, run) in &attempts {
        release(tx, job, *epoch, "its agent was removed", now).await?;
        if runs.last() != Some(&run.as_str()) {
            runs.push(run);
        }
    }
    for run in runs {
        lock_run(tx, run).await?;
        settle(tx, run, now).await?;
    }
    Ok(())
}

async fn release(tx: &mut Tx, job_id: &str, epoch: i64, evidence: &str, now: i64) -> Result<()> {
    tx.sql(
        "UPDATE attempts SET released_at = $1, release_evidence = $2 WHERE job_id = $3 AND epoch = $4 \
         AND released_at IS NULL",
    )
    .bind(now)
    .bind(evidence)
    .bind(job_id)
    .bind(epoch)
    .execute()
    .await?;
    Ok(())
}

/// A cancelling run may end now that an attempt of it is confirmed gone.
async fn settle(tx: &mut Tx, run_id: &str, now: i64) -> Result<()> {
    let status: String = tx.sql("SELECT status FROM runs WHERE id = $1").bind(run_id).scalar().await?;
    if parse_enum::<RunStatus>(&status)? == RunStatus::Cancelling {
        advance_run(tx, run_id, now).await?;
    }
    Ok(())
}
