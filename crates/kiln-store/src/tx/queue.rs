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
use crate::store::{SqlStore, lock_job, lock_run_of_job};
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
    let mut tx = store.read_tx().await?;
    tx.sql(&SQL).bind(max_wait_ms).bind(i64::from(limit)).all().await
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
