//! Cancellation (spec 000 §9): bump the run's cancel version, cancel its jobs
//! that are not running, and keep the run `cancelling` while attempts still
//! run (their completion or fencing ends it; see `complete.rs`). The rule is
//! kiln-core's [`plan_cancel`]; this file writes what it decides.

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::StoreError;
use crate::error::{Result, parse_enum};
use crate::model::{JobRecord, RunRecord};
use crate::rows::{load_job, load_run};
use crate::store::{SqlStore, lock_job, lock_run, lock_run_of_job};
use crate::tx::advance::{advance_run, finish_run, release_job_groups};
use kiln_core::cancel::{CancelJobRefusal, CancelJobVerdict, CancelVerdict, plan_cancel, plan_cancel_job};
use kiln_core::failure::CANCELLED;
use kiln_core::{JobStatus, RunStatus};

/// `RunStore::cancel_run`.
pub(crate) async fn cancel_run(store: &SqlStore, run_id: &str) -> Result<RunRecord> {
    store.transaction(Isolation::Serializable, run_id, |tx, run_id| Box::pin(cancel_run_tx(tx, run_id))).await
}

async fn cancel_run_tx(tx: &mut Tx, run_id: &str) -> Result<RunRecord> {
    lock_run(tx, run_id).await?;
    let now = now(tx).await?;
    cancel_in_tx(tx, run_id, None, now).await?;
    load_run(tx, run_id).await
}

/// Cancellation inside a transaction (also of runs a newer run of the same
/// concurrency group cancels in progress). A terminal or already cancelling
/// run is left as is.
pub(crate) async fn cancel_in_tx(tx: &mut Tx, run_id: &str, message: Option<&str>, now: i64) -> Result<()> {
    static CANCEL_WAITING: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3",
            cancelled = lit(JobStatus::Cancelled),
        )
    });
    static CANCELLING: Sql = Sql::new(|_| {
        format!("UPDATE runs SET status = {cancelling} WHERE id = $1", cancelling = lit(RunStatus::Cancelling))
    });
    let run = load_run(tx, run_id).await?;
    let rows: Vec<(String, String)> =
        tx.sql("SELECT id, status FROM jobs WHERE run_id = $1 ORDER BY job_index").bind(run_id).all().await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut statuses = Vec::with_capacity(rows.len());
    for (id, status) in rows {
        ids.push(id);
        statuses.push(parse_enum::<JobStatus>(&status)?);
    }
    // A fenced attempt whose sandbox nobody confirmed gone keeps the run
    // cancelling, even with nothing running (issue 40, item 5).
    let awaiting = run.status.can_cancel() && crate::tx::advance::awaiting_release(tx, run_id).await?;
    let CancelVerdict::Cancel { jobs, run: ends } = plan_cancel(run.status, &statuses, awaiting) else {
        return Ok(());
    };
    for i in jobs {
        tx.sql(&CANCEL_WAITING).bind(now).bind(CANCELLED).bind(&ids[i]).execute().await?;
    }
    tx.sql(
        "UPDATE runs SET cancel_version = cancel_version + 1, updated_at = $1, message = COALESCE($2, message) \
         WHERE id = $3",
    )
    .bind(now)
    .bind(message)
    .bind(run_id)
    .execute()
    .await?;
    release_job_groups(tx, now).await?;
    if ends == RunStatus::Cancelling {
        // Keep the run CANCELLING while physical termination is unresolved.
        tx.sql(&CANCELLING).bind(run_id).execute().await?;
        Ok(())
    } else {
        finish_run(tx, run_id, ends, None, now).await
    }
}

/// The message of a job cancelled by itself (`kiln cancel RUN --job NAME`).
pub const JOB_CANCELLED: &str = "cancelled by request (this job only)";
/// The message of a running job asked to stop, until its attempt ends.
pub const JOB_STOPPING: &str = "stop requested (this job only); the running attempt is stopping";

/// `RunStore::cancel_job` (issue 42): cancel one job of an active run, as
/// kiln-core's [`plan_cancel_job`] decides. A waiting job is cancelled at
/// once and the run advances (its dependents are skipped; the run ends
/// `failed` once nothing is left); a running one is asked to stop through
/// its heartbeat, and its completion, whatever it reports, binds nothing
/// (see `complete.rs`). Serialized on the run (invariant 5). Returns the
/// job as it now stands; `Conflict` when there is nothing to cancel.
pub(crate) async fn cancel_job(store: &SqlStore, job_id: &str) -> Result<JobRecord> {
    store.transaction(Isolation::Serializable, job_id, |tx, job_id| Box::pin(cancel_job_tx(tx, job_id))).await
}

async fn cancel_job_tx(tx: &mut Tx, job_id: &str) -> Result<JobRecord> {
    static CANCEL_NOW: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3",
            cancelled = lit(JobStatus::Cancelled),
        )
    });
    lock_run_of_job(tx, job_id).await?;
    lock_job(tx, job_id).await?;
    let now = now(tx).await?;
    let (job, budget) = load_job(tx, job_id).await?;
    let run = load_run(tx, &job.run_id).await?;
    match plan_cancel_job(run.status, job.status, budget.cancel_requested) {
        CancelJobVerdict::CancelNow => {
            tx.sql(&CANCEL_NOW).bind(now).bind(JOB_CANCELLED).bind(job_id).execute().await?;
            advance_run(tx, &job.run_id, now).await?;
        }
        CancelJobVerdict::Stop => {
            tx.sql("UPDATE jobs SET cancel_requested = 1, message = $1 WHERE id = $2")
                .bind(JOB_STOPPING)
                .bind(job_id)
                .execute()
                .await?;
        }
        CancelJobVerdict::AlreadyStopping => {}
        CancelJobVerdict::Refuse(why) => {
            return Err(StoreError::Conflict(match why {
                CancelJobRefusal::RunNotActive(st) => {
                    format!("run {} is {st}: there is no job of it left to cancel", run.id)
                }
                CancelJobRefusal::JobEnded(st) => format!(
                    "job `{}` has already ended ({st}); to run it again use `kiln retry RUN --job NAME` once the run has ended",
                    job.name
                ),
            }));
        }
    }
    Ok(load_job(tx, job_id).await?.0)
}
