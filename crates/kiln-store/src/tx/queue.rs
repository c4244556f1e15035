//! The queue timeout (issue 18, spec 004's timeout hierarchy): a job that
//! stays `ready` — no agent claimed it — for longer than the server's
//! `--queue-timeout` fails with the reason, and its run moves on (its
//! dependents are skipped), instead of waiting forever. Measured in
//! database time from when the job last became claimable
//! (`next_attempt_at`, also after a retry's backoff).

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::Result;
use crate::rows::load_job;
use crate::store::{SqlStore, lock_job, lock_run, lock_run_of_job};
use crate::tx::advance::advance_run;
use kiln_core::JobStatus;
use kiln_core::job::JobEvent;

/// Ready jobs claimable for at least `max_wait_ms`: (job id, its label
/// requirements as stored), at most `limit`, oldest first.
pub(crate) async fn overdue(store: &SqlStore, max_wait_ms: i64, limit: u32) -> Result<Vec<(String, String)>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT id, class_key FROM jobs WHERE status = {ready} AND next_attempt_at <= {now} - $1 \
             ORDER BY next_attempt_at LIMIT $2",
            ready = lit(JobStatus::Ready),
            now = d.now_ms
        )
    });
    store
        .read(&(max_wait_ms, limit), |tx, (max_wait_ms, limit)| {
            Box::pin(async move { tx.sql(&SQL).bind(*max_wait_ms).bind(i64::from(*limit)).all().await })
        })
        .await
}

/// Fail `job_id` with `message` if it is still ready and overdue (checked
/// again under the run's lock: a claim may have won meanwhile). Returns
/// whether it failed it.
pub(crate) async fn fail_overdue(store: &SqlStore, job_id: &str, max_wait_ms: i64, message: &str) -> Result<bool> {
    let args = (job_id.to_string(), max_wait_ms, message.to_string());
    store
        .transaction(Isolation::Serializable, &args, |tx, (job_id, max_wait_ms, message)| {
            Box::pin(fail_overdue_tx(tx, job_id, *max_wait_ms, message))
        })
        .await
}

async fn fail_overdue_tx(tx: &mut Tx, job_id: &str, max_wait_ms: i64, message: &str) -> Result<bool> {
    static FAIL: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {failed}, finished_at = $1, message = $2 \
             WHERE id = $3 AND status = {ready} AND next_attempt_at <= $4",
            failed = lit(JobStatus::Failed),
            ready = lit(JobStatus::Ready)
        )
    });
    lock_run_of_job(tx, job_id).await?;
    lock_job(tx, job_id).await?;
    let (job, _) = load_job(tx, job_id).await?;
    if job.status.transition(JobEvent::Failed).is_err() {
        return Ok(false);
    }
    let now = now(tx).await?;
    let failed = tx.sql(&FAIL).bind(now).bind(message).bind(job_id).bind(now - max_wait_ms).execute().await?;
    if failed == 0 {
        return Ok(false);
    }
    advance_run(tx, &job.run_id, now).await?;
    Ok(true)
}

/// Runs past their run-level `timeout` (`deadline_at`), at most `limit`,
/// earliest first.
pub(crate) async fn overdue_runs(store: &SqlStore, limit: u32) -> Result<Vec<String>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT id FROM runs WHERE deadline_at IS NOT NULL AND deadline_at <= {now} \
             ORDER BY deadline_at LIMIT $1",
            now = d.now_ms
        )
    });
    let rows: Vec<(String,)> = store
        .read(&limit, |tx, limit| Box::pin(async move { tx.sql(&SQL).bind(i64::from(*limit)).all().await }))
        .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Cancel `run_id` as timed out if its deadline has passed (checked again
/// under the run's lock): every waiting job is cancelled and every running
/// attempt is asked to stop, exactly as `kiln cancel` does — a timed-out run
/// is never retried. The deadline is cleared, so this happens once. Returns
/// whether it timed the run out.
pub(crate) async fn time_out_run(store: &SqlStore, run_id: &str) -> Result<bool> {
    store.transaction(Isolation::Serializable, run_id, |tx, run_id| Box::pin(time_out_run_tx(tx, run_id))).await
}

async fn time_out_run_tx(tx: &mut Tx, run_id: &str) -> Result<bool> {
    lock_run(tx, run_id).await?;
    let now = now(tx).await?;
    let row: Option<(Option<i64>, i64)> =
        tx.sql("SELECT deadline_at, created_at FROM runs WHERE id = $1").bind(run_id).optional().await?;
    let Some((Some(deadline), created)) = row else { return Ok(false) };
    if deadline > now {
        return Ok(false);
    }
    tx.sql("UPDATE runs SET deadline_at = NULL WHERE id = $1").bind(run_id).execute().await?;
    let after = std::time::Duration::from_millis(u64::try_from(deadline - created).unwrap_or(0));
    let message = format!("the run timed out after {} (its `timeout`)", kiln_workflow::format_duration(after));
    crate::tx::cancel::cancel_in_tx(tx, run_id, Some(&message), now).await?;
    Ok(true)
}
