//! Cancellation (spec 000 §9): bump the run's cancel version, cancel its jobs
//! that are not running, and keep the run `cancelling` while attempts still
//! run (their completion or fencing ends it; see `complete.rs`). The rule is
//! kiln-core's [`plan_cancel`]; this file writes what it decides.

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, parse_enum};
use crate::model::RunRecord;
use crate::rows::load_run;
use crate::store::{SqlStore, lock_run};
use crate::tx::advance::{finish_run, release_job_groups};
use kiln_core::cancel::{CancelVerdict, plan_cancel};
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
