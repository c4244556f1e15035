//! An attempt's life inside other transactions: the live-epoch check every
//! agent call passes (invariant 3, spec 000 §8) and ending an attempt with
//! its log marker (spec 000 §13: `seal` when it ended through its agent,
//! `gap` when the agent was lost).

use crate::db::{Exec, Row, Tx};
use crate::dialect::{LogMarker, SYSTEM_STREAM, Sql, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::{JobRecord, RunRecord};
use crate::rows::{JOB_COLS, JobBudget, budget_from_row, job_from_row, run_cols_as_run, run_from_row_as};
use kiln_core::AttemptOutcome;
use kiln_core::lease::{AttemptLease, check_live};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Checks that `(job, epoch)` is the job's current running attempt with a
/// live lease (invariant 3), as kiln-core's [`check_live`] decides. Returns
/// the job, its budget and the transaction's clock (unix ms), all read in one
/// statement after the caller's locks: each statement is a round trip (to
/// PostgreSQL, or to SQLite's connection thread), and this check opens every
/// agent call that publishes.
pub(crate) async fn require_live(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<(JobRecord, JobBudget, i64)> {
    static SQL: Sql = Sql::new(live_select);
    let row = tx.sql(&SQL).bind(job_id).bind(epoch).fetch_optional().await?;
    live(row, job_id, epoch)
}

/// [`require_live`] with the job's run, in the same statement (the
/// completion reads both).
pub(crate) async fn require_live_with_run(
    tx: &mut Tx,
    job_id: &str,
    epoch: i64,
) -> Result<(JobRecord, JobBudget, i64, RunRecord)> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT j.*, {run} FROM ({live}) j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id",
            run = run_cols_as_run(),
            live = live_select(d)
        )
    });
    let row = tx.sql(&SQL).bind(job_id).bind(epoch).fetch_optional().await?;
    let run = row.as_ref().map(|r| run_from_row_as(r, "run_")).transpose()?;
    let (job, budget, now) = live(row, job_id, epoch)?;
    Ok((job, budget, now, run.expect("a row was read")))
}

/// The job `$1`, its attempt `$2`'s outcome and lease, and the clock.
fn live_select(d: &crate::dialect::Dialect) -> String {
    format!(
        "SELECT {JOB_COLS}, \
         (SELECT a.outcome FROM attempts a WHERE a.job_id = $1 AND a.epoch = $2) AS live_outcome, \
         (SELECT a.lease_deadline FROM attempts a WHERE a.job_id = $1 AND a.epoch = $2) AS live_deadline, \
         {now} AS live_now FROM jobs WHERE id = $1",
        now = d.now_ms
    )
}

/// [`require_live`]'s check of what [`live_select`] read.
fn live(row: Option<Row>, job_id: &str, epoch: i64) -> Result<(JobRecord, JobBudget, i64)> {
    let row = row.ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
    let (job, budget) = (job_from_row(&row)?, budget_from_row(&row)?);
    let attempt = match row.get::<Option<String>>("live_outcome")? {
        Some(outcome) => {
            Some(AttemptLease { outcome: parse_enum(&outcome)?, lease_deadline: row.get("live_deadline")? })
        }
        None => None,
    };
    let now = row.get::<i64>("live_now")?;
    check_live(epoch, job.current_epoch, attempt, now)
        .map_err(|stale| StoreError::StaleEpoch(stale.message(job_id, epoch)))?;
    Ok((job, budget, now))
}

/// The lease of the attempt `(job, epoch)`, if the job ever had that epoch.
pub(crate) async fn attempt_lease(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<Option<AttemptLease>> {
    let row = tx
        .sql("SELECT outcome, lease_deadline FROM attempts WHERE job_id = $1 AND epoch = $2")
        .bind(job_id)
        .bind(epoch)
        .fetch_optional()
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(AttemptLease { outcome: parse_enum(row.str("outcome")?)?, lease_deadline: row.get("lease_deadline")? }))
}

/// What an agent's completion reports of its attempt besides the outcome:
/// the steps' results (JSON) and how its sandbox ended (issue 40, item 5).
#[derive(Clone, Copy, Default)]
pub(crate) struct Reported<'a> {
    pub(crate) steps: Option<&'a String>,
    pub(crate) sandbox: Option<&'a crate::model::SandboxEnd>,
}

/// End the running attempt `(job, epoch)` with `outcome`, and record what
/// its agent `reported` with it (in the same statement). An attempt that
/// ended through its agent (anything but `lost`) gets its `seal` marker and
/// counts as released (its sandbox confirmed gone). Returns how long the
/// attempt held its slot (claim to end, ms); `None`: it was not running.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn end_attempt(
    tx: &mut Tx,
    job_id: &str,
    epoch: i64,
    outcome: AttemptOutcome,
    exit_code: Option<i32>,
    message: Option<&str>,
    class: Option<kiln_core::failure::FailureClass>,
    reported: Reported<'_>,
    now: i64,
) -> Result<Option<i64>> {
    // The sandbox's own evidence, if it reported one (`$10` = 1), wins
    // over the default an ending through the agent gives.
    // With how long it held its slot and every agent stream's committed
    // offset (for the seal marker; nothing else writes them in this
    // transaction: the job's lock, or SQLite's one writer, keeps log
    // appends out).
    static END: Sql = Sql::new(|_| {
        let progress: Vec<String> = crate::tx::logs::PROGRESS_STREAMS
            .iter()
            .map(|s| {
                format!("(SELECT committed FROM log_progress WHERE job_id = $6 AND epoch = $7 AND stream = '{s}')")
            })
            .collect();
        format!(
            "UPDATE attempts SET outcome = $1, exit_code = $2, message = $3, failure_class = $4, finished_at = $5, \
             released_at = $8, steps = COALESCE($9, steps), \
             release_evidence = CASE WHEN $10 = 1 THEN $11 WHEN $8 IS NULL THEN release_evidence \
             ELSE COALESCE(release_evidence, 'the attempt ended through its agent') END, \
             cleanup_error = CASE WHEN $10 = 1 THEN $12 ELSE cleanup_error END \
             WHERE job_id = $6 AND epoch = $7 AND outcome = {running} \
             RETURNING COALESCE(finished_at - started_at, 0), {progress}",
            running = lit(AttemptOutcome::Running),
            progress = progress.join(", ")
        )
    });
    let end = reported.sandbox;
    let ended = tx
        .sql(&END)
        .bind(outcome.as_str())
        .bind(exit_code)
        .bind(message)
        .bind(class.map(|c| c.as_str()))
        .bind(now)
        .bind(job_id)
        .bind(epoch)
        // Ended through its agent: its sandbox is gone (the agent kills it
        // before it reports). A lost attempt waits for a confirmation
        // (issue 40, item 5: a timeout alone certifies nothing).
        .bind((outcome != AttemptOutcome::Lost).then_some(now))
        .bind(reported.steps)
        .bind(i64::from(end.is_some()))
        .bind(end.map(|e| &e.evidence))
        .bind(end.and_then(|e| e.cleanup_error.as_deref()))
        .optional::<(i64, Option<i64>, Option<i64>, Option<i64>, Option<i64>)>()
        .await?;
    // An attempt that ended through its agent has a sealed log: what was
    // committed is all there is (spec 000 §13: `log.sealed` is distinct from
    // a dropped connection, which gets a gap marker when it is fenced).
    let Some((held, p0, p1, p2, p3)) = ended else { return Ok(None) };
    if outcome != AttemptOutcome::Lost {
        let committed: BTreeMap<&str, i64> = crate::tx::logs::PROGRESS_STREAMS
            .iter()
            .zip([p0, p1, p2, p3])
            .filter_map(|(s, c)| c.map(|c| (*s, c)))
            .collect();
        let payload = serde_json::json!({ "epoch": epoch, "outcome": outcome.as_str(), "committed": committed });
        append_marker(tx, job_id, epoch, LogMarker::Seal, &payload).await?;
    }
    Ok(Some(held))
}

/// spec 000 §13: a log whose agent was lost never ends cleanly: the fenced
/// epoch's log gets an explicit gap line after everything it had committed,
/// then the `gap` marker.
pub(crate) async fn append_gap_marker(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<()> {
    let (offset, seq): (i64, i64) = tx
        .sql(
            "SELECT COALESCE(MAX(byte_offset + length), 0), COALESCE(MAX(seq) + 1, 0) FROM log_chunks \
             WHERE job_id = $1 AND epoch = $2 AND stream = $3",
        )
        .bind(job_id)
        .bind(epoch)
        .bind(SYSTEM_STREAM)
        .one()
        .await?;
    let text = format!(
        "[kiln] ⚠ gap: the agent of attempt {epoch} was lost; output it had not delivered is missing, and this log has no clean end\n"
    );
    tx.sql(
        "INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(job_id)
    .bind(epoch)
    .bind(SYSTEM_STREAM)
    .bind(seq)
    .bind(offset)
    .bind(text.len() as i64)
    .bind(hex::encode(Sha256::digest(text.as_bytes())))
    .bind(text.as_bytes())
    .execute()
    .await?;
    let committed = committed_offsets(tx, job_id, epoch).await?;
    let payload = serde_json::json!({ "epoch": epoch, "reason": "agent lost", "committed": committed });
    append_marker(tx, job_id, epoch, LogMarker::Gap, &payload).await
}

/// The contiguous committed offset of each stream of an attempt's log.
async fn committed_offsets(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> = tx
        .sql("SELECT stream, committed FROM log_progress WHERE job_id = $1 AND epoch = $2")
        .bind(job_id)
        .bind(epoch)
        .all()
        .await?;
    Ok(rows.into_iter().collect())
}

/// A marker row: an event in the log, stored as a chunk whose stream is the
/// marker's word (one per attempt and kind).
async fn append_marker(
    tx: &mut Tx,
    job_id: &str,
    epoch: i64,
    marker: LogMarker,
    payload: &serde_json::Value,
) -> Result<()> {
    use crate::dialect::Word;
    let data = serde_json::to_vec(payload).expect("json");
    tx.sql(
        "INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data) \
         VALUES ($1, $2, $3, 0, 0, $4, $5, $6) ON CONFLICT DO NOTHING",
    )
    .bind(job_id)
    .bind(epoch)
    .bind(marker.word())
    .bind(data.len() as i64)
    .bind(hex::encode(Sha256::digest(&data)))
    .bind(&data)
    .execute()
    .await?;
    Ok(())
}
