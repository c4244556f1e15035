//! The completion transaction (spec 000 §9, invariants 4–6): bind the
//! attempt's sealed outputs, end the attempt, and either finish the job and
//! advance the run, or — for an attempt that did not succeed — retry within
//! the budget, fail (stopping fail-fast matrix siblings) or, when the run or
//! job was asked to stop, cancel.
//!
//! The retry/fail-fast rule is the pure function [`failure_verdict`];
//! [`fail_or_retry`] writes what it decided (fencing in `lease.rs` uses it
//! too).

use crate::db::{Exec, Tx, now};
use crate::dialect::{GenerationState, Isolation, Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::{CompletionInput, JobRecord, RunRecord};
use crate::rows::{JobBudget, load_run};
use crate::store::{SqlStore, lock_job, lock_run_of_job};
use crate::tx::advance::{advance_run, make_ready};
use crate::tx::attempt::{end_attempt, require_live};
use kiln_core::backoff::DEFAULT_INFRA_RETRIES;
use kiln_core::{AttemptOutcome, JobStatus, RunStatus};

/// `AttemptStore::complete`.
///
/// READ COMMITTED on PostgreSQL unless the run takes part in a concurrency
/// group (see [`complete_tx`]); then SERIALIZABLE, as the group's other runs
/// and jobs are read and changed too.
pub(crate) async fn complete(store: &SqlStore, job_id: &str, epoch: i64, c: &CompletionInput) -> Result<String> {
    let first = store
        .transaction(Isolation::LockedReadCommitted, &(store, job_id, epoch, c), |tx, &(store, job_id, epoch, c)| {
            Box::pin(complete_tx(store, tx, job_id, epoch, c, false))
        })
        .await?;
    if let Some(r) = first {
        return r;
    }
    let r = store
        .transaction(Isolation::Serializable, &(store, job_id, epoch, c), |tx, &(store, job_id, epoch, c)| {
            Box::pin(complete_tx(store, tx, job_id, epoch, c, true))
        })
        .await?;
    r.expect("a serializable completion decides")
}

/// Whether a run takes part in a concurrency group, its own or one of its
/// jobs' (spec 003): completing its jobs can then start or cancel work of
/// other runs.
fn uses_concurrency_groups(run: &RunRecord) -> bool {
    run.definition.concurrency.is_some() || run.definition.jobs.iter().any(|j| j.concurrency.is_some())
}

/// The completion transaction. `Ok(None)`: not decided, because the run uses
/// concurrency groups and `serializable` is false.
///
/// On PostgreSQL it first runs at READ COMMITTED (`serializable` false):
/// the run row and then the job row are locked before anything is read,
/// and every transaction that changes a run's jobs, attempts, artifact
/// generations or log locks the same rows first (claims and fencing the
/// run, seals and log appends the job; a heartbeat changes only its lease,
/// under `outcome = 'running'`, rechecked on the row this transaction
/// ends), so each statement after the locks reads the run as it stands. A
/// run in no concurrency group changes only its own rows. A run in a group
/// may have to start or cancel other runs' work, found by predicates over
/// rows it cannot lock first: that needs SERIALIZABLE, so it returns `None`
/// before writing anything and the caller reruns it serializable.
async fn complete_tx(
    store: &SqlStore,
    tx: &mut Tx,
    job_id: &str,
    epoch: i64,
    c: &CompletionInput,
    serializable: bool,
) -> Result<Option<Result<String>>> {
    static SEALED: Sql = Sql::new(|_| {
        format!(
            "SELECT id FROM artifact_generations WHERE job_id = $1 AND epoch = $2 AND name = $3 \
             AND state = {sealed} ORDER BY sealed_at DESC, id DESC LIMIT 1",
            sealed = lit(GenerationState::Sealed)
        )
    });
    static SUCCEED: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {success}, finished_at = $1, \
             message = CASE WHEN message LIKE 'degraded:%' THEN message END WHERE id = $2",
            success = lit(JobStatus::Success)
        )
    });
    lock_run_of_job(tx, job_id).await?;
    // Then the job: its log's seal marker commits in id order with the
    // chunks appended under the same lock.
    lock_job(tx, job_id).await?;
    let now = now(tx).await?;
    let (job, budget) = require_live(tx, job_id, epoch, now).await?;
    let run = load_run(tx, &job.run_id).await?;
    if !serializable && uses_concurrency_groups(&run) {
        return Ok(None);
    }
    if !run.status.can_claim() || budget.cancel_requested {
        // Cancellation (of the run, or of this job by fail-fast) committed
        // first: the late completion is rejected, but it does confirm the
        // sandbox ended.
        end_attempt(tx, job_id, epoch, AttemptOutcome::Cancelled, c.exit_code, Some("cancelled"), now).await?;
        fail_or_retry(store, tx, &job, &budget, false, "cancelled", now).await?;
        if c.outcome == AttemptOutcome::Cancelled {
            return Ok(Some(Ok(JobStatus::Cancelled.as_str().into())));
        }
        return Ok(Some(Err(StoreError::Conflict(format!("run {} was cancelled before this completion", run.id)))));
    }
    let status = match c.outcome {
        AttemptOutcome::Success => {
            // spec 000 §9: every declared output must be SEALED for this
            // attempt; nothing is ever substituted from elsewhere.
            let declared: Vec<String> = run
                .definition
                .jobs
                .get(job.index as usize)
                .map(|j| j.artifacts.publish.iter().map(|p| p.name.clone()).collect())
                .unwrap_or_default();
            let mut sealed = Vec::new();
            for name in &declared {
                let g: Option<String> = tx.sql(&SEALED).bind(job_id).bind(epoch).bind(name).scalar_optional().await?;
                match g {
                    Some(g) => sealed.push((name, g)),
                    None => {
                        let msg = format!("required artifact `{name}` was not sealed by epoch {epoch}");
                        end_attempt(tx, job_id, epoch, AttemptOutcome::Failed, c.exit_code, Some(&msg), now).await?;
                        let st = fail_or_retry(store, tx, &job, &budget, false, &msg, now).await?;
                        return Ok(Some(Ok(st.as_str().into())));
                    }
                }
            }
            for (name, g) in sealed {
                tx.sql(
                    "INSERT INTO artifact_bindings (run_id, job_id, name, generation_id, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&job.run_id)
                .bind(job_id)
                .bind(name)
                .bind(g)
                .bind(now)
                .execute()
                .await?;
            }
            end_attempt(tx, job_id, epoch, AttemptOutcome::Success, c.exit_code, c.message.as_deref(), now).await?;
            tx.sql(&SUCCEED).bind(now).bind(job_id).execute().await?;
            advance_run(tx, &job.run_id, now).await?;
            JobStatus::Success
        }
        AttemptOutcome::Failed | AttemptOutcome::Cancelled | AttemptOutcome::Lost => {
            let msg = c.message.clone().unwrap_or_else(|| match c.exit_code {
                Some(code) => format!("step exited with code {code}"),
                None => "attempt failed".into(),
            });
            end_attempt(tx, job_id, epoch, AttemptOutcome::Failed, c.exit_code, Some(&msg), now).await?;
            fail_or_retry(store, tx, &job, &budget, c.infra_failure, &msg, now).await?
        }
        AttemptOutcome::Running => {
            return Err(StoreError::Invalid("completion outcome cannot be running".into()));
        }
    };
    Ok(Some(Ok(status.as_str().into())))
}

/// Which retry budget an unsuccessful attempt spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// The agent or its infrastructure failed (lost lease, infra error).
    Infra,
    /// The job's own steps failed (the workflow's `retry`).
    Failure,
}

/// What becomes of a job whose attempt did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FailureVerdict {
    /// The run is being cancelled, or this job alone was asked to stop.
    Cancel(&'static str),
    /// Within budget: spend one and run again after backoff `n`.
    Retry { budget: Budget, n: u32 },
    /// Out of budget: the job fails; its matrix siblings stop if the matrix
    /// is fail-fast (the group is named).
    Fail { fail_fast_group: Option<String> },
}

/// The retry / fail-fast rule (spec 000 §9, invariant 6): retries are
/// counted in the database; infrastructure failures have their own budget.
pub(crate) fn failure_verdict(run: &RunRecord, job: &JobRecord, budget: &JobBudget, infra: bool) -> FailureVerdict {
    if matches!(run.status, RunStatus::Cancelling | RunStatus::Cancelled) || budget.cancel_requested {
        return FailureVerdict::Cancel(if budget.cancel_requested {
            "cancelled: fail-fast (a matrix sibling failed)"
        } else {
            "cancelled"
        });
    }
    let (kind, used, allowed) = if infra {
        (Budget::Infra, budget.infra_retries, DEFAULT_INFRA_RETRIES as i64)
    } else {
        (Budget::Failure, budget.failure_retries, budget.max_failure_retries)
    };
    if used < allowed {
        return FailureVerdict::Retry { budget: kind, n: (used + 1) as u32 };
    }
    let matrix = run.definition.jobs.get(job.index as usize).and_then(|d| d.matrix.as_ref());
    FailureVerdict::Fail { fail_fast_group: matrix.filter(|m| m.fail_fast).map(|m| m.group.clone()) }
}

/// Ends a job whose attempt did not succeed, as [`failure_verdict`] decides.
/// Returns the job's new status.
pub(crate) async fn fail_or_retry(
    store: &SqlStore,
    tx: &mut Tx,
    job: &JobRecord,
    budget: &JobBudget,
    infra: bool,
    message: &str,
    now: i64,
) -> Result<JobStatus> {
    static CANCEL: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3",
            cancelled = lit(JobStatus::Cancelled)
        )
    });
    static FAIL: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {failed}, finished_at = $1, message = $2 WHERE id = $3",
            failed = lit(JobStatus::Failed)
        )
    });
    let run = load_run(tx, &job.run_id).await?;
    match failure_verdict(&run, job, budget, infra) {
        FailureVerdict::Cancel(why) => {
            tx.sql(&CANCEL).bind(now).bind(why).bind(&job.id).execute().await?;
            advance_run(tx, &job.run_id, now).await?;
            Ok(JobStatus::Cancelled)
        }
        FailureVerdict::Retry { budget, n } => {
            let at = now + store.retry_delay(n);
            let spend = match budget {
                Budget::Infra => "UPDATE jobs SET infra_retries = infra_retries + 1, message = $1 WHERE id = $2",
                Budget::Failure => "UPDATE jobs SET failure_retries = failure_retries + 1, message = $1 WHERE id = $2",
            };
            tx.sql(spend).bind(format!("retrying: {message}")).bind(&job.id).execute().await?;
            make_ready(tx, &job.id, at, now).await?;
            Ok(JobStatus::Ready)
        }
        FailureVerdict::Fail { fail_fast_group } => {
            tx.sql(&FAIL).bind(now).bind(message).bind(&job.id).execute().await?;
            if let Some(group) = fail_fast_group {
                fail_fast(tx, &run, &group, &job.name, now).await?;
            }
            advance_run(tx, &job.run_id, now).await?;
            Ok(JobStatus::Failed)
        }
    }
}

/// `fail-fast`: a matrix job failed, so its siblings stop: waiting ones are
/// cancelled now, running ones are asked to stop (heartbeat
/// `cancel_requested`) and end `cancelled` when they report or are fenced.
async fn fail_fast(tx: &mut Tx, run: &RunRecord, group: &str, failed: &str, now: i64) -> Result<()> {
    static CANCEL_WAITING: Sql = Sql::new(|d| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 \
             WHERE run_id = $3 AND status IN ({pending}, {ready}) AND name IN (SELECT value FROM {names})",
            cancelled = lit(JobStatus::Cancelled),
            pending = lit(JobStatus::Pending),
            ready = lit(JobStatus::Ready),
            names = d.json_texts(4),
        )
    });
    static STOP_RUNNING: Sql = Sql::new(|d| {
        format!(
            "UPDATE jobs SET cancel_requested = 1 WHERE run_id = $1 AND status = {running} \
             AND name IN (SELECT value FROM {names})",
            running = lit(JobStatus::Running),
            names = d.json_texts(2),
        )
    });
    let siblings: Vec<&str> = run
        .definition
        .jobs
        .iter()
        .filter(|j| j.name != failed && j.matrix.as_ref().is_some_and(|m| m.group == group))
        .map(|j| j.name.as_str())
        .collect();
    let names = serde_json::to_string(&siblings).expect("names");
    tx.sql(&CANCEL_WAITING)
        .bind(now)
        .bind(format!("cancelled: fail-fast after `{failed}` failed"))
        .bind(&run.id)
        .bind(&names)
        .execute()
        .await?;
    tx.sql(&STOP_RUNNING).bind(&run.id).bind(&names).execute().await?;
    Ok(())
}
