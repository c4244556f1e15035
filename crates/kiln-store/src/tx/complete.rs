//! The completion transaction (spec 000 §9, invariants 4–6): bind the
//! attempt's sealed outputs, end the attempt, and either finish the job and
//! advance the run, or — for an attempt that did not succeed — retry within
//! the budget, fail (stopping fail-fast matrix siblings) or, when the run or
//! job was asked to stop, cancel.
//!
//! The retry/fail-fast rule is kiln-core's [`decide_failure`];
//! [`fail_or_retry`] writes what it decided (fencing in `lease.rs` uses it
//! too).

use crate::db::{Exec, Tx};
use crate::dialect::{GenerationState, Isolation, Sql, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::{Completed, CompletionInput, JobRecord, RunRecord};
use crate::rows::JobBudget;
use crate::store::{SqlStore, lock_job, lock_run_of_job};
use crate::tx::advance::{advance_loaded, advance_run, make_ready};
use crate::tx::attempt::{Reported, end_attempt, require_live_with_run};
use kiln_core::complete::{CompletionFacts, CompletionVerdict, decide_completion, missing_output, success_message};
use kiln_core::failure::{
    CANCELLED, ClassSet, ExitCodes, FailureClass, FailureFacts, FailureVerdict, RetryBudget, SiblingAction,
    decide_failure, fail_fast_siblings,
};
use kiln_core::{AttemptOutcome, JobStatus};

/// `AttemptStore::complete`.
///
/// READ COMMITTED on PostgreSQL unless the run takes part in a concurrency
/// group (see [`complete_tx`]); then SERIALIZABLE, as the group's other runs
/// and jobs are read and changed too.
pub(crate) async fn complete(store: &SqlStore, job_id: &str, epoch: i64, c: &CompletionInput) -> Result<Completed> {
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
/// jobs' (spec 003), or an environment's deploy queue (issue 46):
/// completing its jobs can then start or cancel work of other runs.
fn uses_concurrency_groups(run: &RunRecord) -> bool {
    run.definition.concurrency.is_some()
        || run.definition.jobs.iter().any(|j| j.concurrency.is_some() || j.environment.is_some())
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
) -> Result<Option<Result<Completed>>> {
    static SEALED: Sql = Sql::new(|_| {
        format!(
            "SELECT id FROM artifact_generations WHERE job_id = $1 AND epoch = $2 AND name = $3 \
             AND state = {sealed} ORDER BY sealed_at DESC, id DESC LIMIT 1",
            sealed = lit(GenerationState::Sealed)
        )
    });
    static SUCCEED: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {success}, finished_at = $1, message = $2 WHERE id = $3",
            success = lit(JobStatus::Success)
        )
    });
    lock_run_of_job(tx, job_id).await?;
    // Then the job: its log's seal marker commits in id order with the
    // chunks appended under the same lock.
    lock_job(tx, job_id).await?;
    let (job, budget, now, run) = require_live_with_run(tx, job_id, epoch).await?;
    if !serializable && uses_concurrency_groups(&run) {
        return Ok(None);
    }
    // The steps' results, and how the sandbox ended — recorded whatever the
    // verdict, with the attempt's end: the completion is how the agent says
    // its sandbox is gone, and what its cleanup could not do is shown on the
    // attempt (issue 40, item 5).
    let rep = Reported { steps: c.steps.as_ref(), sandbox: c.sandbox.as_ref() };
    // The job's status, the team whose slot the attempt held and for how long.
    let done =
        |status: JobStatus, held_ms| Completed { status: status.as_str().into(), team: run.team.clone(), held_ms };
    let verdict = decide_completion(&CompletionFacts {
        run: run.status,
        cancel_requested: budget.cancel_requested,
        reported: c.outcome,
        exit_code: c.exit_code,
        message: c.message.as_deref(),
        class: c.failure_class,
    });
    // Issue 43: a job that declares `reports:` binds what its attempt
    // staged (whatever the outcome; not when cancellation came first).
    let declares_reports =
        usize::try_from(job.index).ok().and_then(|i| run.definition.jobs.get(i)).is_some_and(|d| d.reports.is_some());
    let bound = match verdict {
        CompletionVerdict::Cancelled { .. } | CompletionVerdict::Invalid => None,
        _ if declares_reports => {
            crate::tx::test_reports::finish_batches(tx, job_id, epoch).await?;
            Some(crate::tx::test_reports::bind(tx, &job, epoch, now).await?)
        }
        _ => None,
    };
    // Failures let through as quarantined hold only if the bound reports
    // are complete and every failure in them is quarantined now.
    let mut quarantine_note = None;
    let verdict = match verdict {
        CompletionVerdict::Succeed if !c.quarantined.is_empty() => {
            let checked = match &bound {
                None => Err("failures were let through as quarantined, but the job declares no `reports:`".into()),
                Some(b) => crate::tx::test_reports::check_quarantined(b),
            };
            match checked {
                Ok(n) => {
                    quarantine_note = Some(format!("quarantined failures: {n}"));
                    CompletionVerdict::Succeed
                }
                Err(message) => CompletionVerdict::Fail { message, class: FailureClass::StepFailed },
            }
        }
        v => v,
    };
    // Issue 45: the bound reports, signed as a Test Result statement over
    // what the job restored (in this transaction, or no binding).
    if let Some(b) = &bound {
        let quarantined = b.failures.iter().filter(|(_, q)| *q).map(|(id, _)| id.clone()).collect();
        crate::tx::provenance::write_test_result(store, tx, &run, &job, epoch, &quarantined, now).await?;
    }
    let Some(ends) = verdict.attempt_outcome() else {
        return Err(StoreError::Invalid("completion outcome cannot be running".into()));
    };
    let (status, held) = match verdict {
        CompletionVerdict::Cancelled { accepted } => {
            // Cancellation (of the run, or of this job by fail-fast) committed
            // first: the late completion is rejected, but it does confirm the
            // sandbox ended.
            let class = FailureClass::Cancelled;
            let held =
                end_attempt(tx, job_id, epoch, ends, c.exit_code, Some(CANCELLED), Some(class), rep, now).await?;
            fail_or_retry(store, tx, &run, &job, &budget, class, c.exit_code, CANCELLED, now).await?;
            if accepted {
                return Ok(Some(Ok(done(JobStatus::Cancelled, held))));
            }
            // The job alone (issue 42: `kiln cancel RUN --job`, fail-fast)
            // or its whole run.
            let what = if run.status.can_claim() { format!("job `{}`", job.name) } else { format!("run {}", run.id) };
            return Ok(Some(Err(StoreError::Conflict(format!("{what} was cancelled before this completion")))));
        }
        CompletionVerdict::Succeed => {
            // spec 000 §9: every declared output must be SEALED for this
            // attempt; nothing is ever substituted from elsewhere.
            // Each with its `expire-in` (the server's default was frozen
            // into the definition at acceptance; None: never expires).
            let declared: Vec<(String, Option<u64>)> = usize::try_from(job.index)
                .ok()
                .and_then(|i| run.definition.jobs.get(i))
                .map(|j| j.artifacts.publish.iter().map(|p| (p.name.clone(), p.expire_in_secs)).collect())
                .unwrap_or_default();
            let mut sealed = Vec::new();
            for (name, expire_in) in &declared {
                let g: Option<String> = tx.sql(&SEALED).bind(job_id).bind(epoch).bind(name).scalar_optional().await?;
                match g {
                    Some(g) => sealed.push((name, g, *expire_in)),
                    None => {
                        let msg = missing_output(name, epoch);
                        let class = FailureClass::StepFailed;
                        let failed = AttemptOutcome::Failed;
                        let held =
                            end_attempt(tx, job_id, epoch, failed, c.exit_code, Some(&msg), Some(class), rep, now)
                                .await?;
                        let st = fail_or_retry(store, tx, &run, &job, &budget, class, None, &msg, now).await?;
                        return Ok(Some(Ok(done(st, held))));
                    }
                }
            }
            let declared_outputs = usize::try_from(job.index)
                .ok()
                .and_then(|i| run.definition.jobs.get(i))
                .map(|j| j.outputs.as_slice())
                .unwrap_or_default();
            crate::tx::outputs::check(declared_outputs, &c.outputs)?;
            crate::tx::outputs::bind(tx, &job.run_id, job_id, epoch, &c.outputs, now).await?;
            let bound: Vec<(String, String)> = sealed.iter().map(|(n, g, _)| ((*n).clone(), g.clone())).collect();
            for (name, g, expire_in) in sealed {
                // Issue 16: the expiry is fixed here, with the binding.
                let expires_at =
                    expire_in.map(|s| now.saturating_add(i64::try_from(s).unwrap_or(i64::MAX / 1000) * 1000));
                tx.sql(
                    "INSERT INTO artifact_bindings (run_id, job_id, name, generation_id, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(&job.run_id)
                .bind(job_id)
                .bind(name)
                .bind(g)
                .bind(now)
                .bind(expires_at)
                .execute()
                .await?;
            }
            // Issue 45: each binding with its signed provenance, or none.
            crate::tx::provenance::write(store, tx, &run, &job, epoch, &bound, now).await?;
            let message = quarantine_note.as_deref().or(c.message.as_deref());
            let held = end_attempt(tx, job_id, epoch, ends, c.exit_code, message, None, rep, now).await?;
            let message = quarantine_note.as_deref().or(success_message(job.message.as_deref()));
            tx.sql(&SUCCEED).bind(now).bind(message).bind(job_id).execute().await?;
            // The run as loaded above, under its lock: nothing since changed it.
            advance_loaded(tx, run.clone(), now).await?;
            (JobStatus::Success, held)
        }
        CompletionVerdict::Fail { message, class } => {
            let held = end_attempt(tx, job_id, epoch, ends, c.exit_code, Some(&message), Some(class), rep, now).await?;
            (fail_or_retry(store, tx, &run, &job, &budget, class, c.exit_code, &message, now).await?, held)
        }
        CompletionVerdict::Invalid => unreachable!("an invalid completion ends no attempt"),
    };
    // Issue 46: a deploy job that ended records what it deployed.
    if matches!(status, JobStatus::Success | JobStatus::Failed) {
        crate::tx::environments::record_deployment(tx, &run, &job, epoch, status, now).await?;
    }
    Ok(Some(Ok(done(status, held))))
}

/// Ends a job whose attempt did not succeed, as kiln-core's
/// [`decide_failure`] decides under the job's frozen `retry:` policy.
/// Returns the job's new status. `run`: the job's run as this transaction read it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn fail_or_retry(
    store: &SqlStore,
    tx: &mut Tx,
    run: &RunRecord,
    job: &JobRecord,
    budget: &JobBudget,
    class: FailureClass,
    exit_code: Option<i32>,
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
    let def = usize::try_from(job.index).ok().and_then(|i| run.definition.jobs.get(i));
    let matrix = def.and_then(|d| d.matrix.as_ref());
    let mut retry =
        RetryBudget::new(count(budget.failure_retries), count(budget.infra_retries), count(budget.max_failure_retries));
    if let Some(d) = def {
        // `retry: {on, exit_codes}` as frozen (validated at acceptance; an
        // empty `on` is `retry: N`'s own classes).
        let on: Vec<FailureClass> = d.retry_on.iter().filter_map(|c| FailureClass::parse(c)).collect();
        if !on.is_empty() {
            retry.on = ClassSet::of(on);
        }
        retry.exit_codes = ExitCodes::of(&d.retry_exit_codes).unwrap_or_default();
    }
    let facts = FailureFacts {
        run: run.status,
        cancel_requested: budget.cancel_requested,
        class,
        exit_code,
        budget: retry,
        message,
        fail_fast_group: matrix.filter(|m| m.fail_fast).map(|m| m.group.as_str()),
    };
    // The verdict is bound first: the thread-local rng must not live across an await.
    let verdict = decide_failure(&facts, store.backoff(), &mut rand::rng());
    match verdict {
        FailureVerdict::Cancel { why } => {
            tx.sql(&CANCEL).bind(now).bind(why).bind(&job.id).execute().await?;
            advance_run(tx, &job.run_id, now).await?;
            Ok(JobStatus::Cancelled)
        }
        FailureVerdict::Retry { class, delay_ms, message, .. } => {
            let at = now.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
            let spend = if class.is_infrastructure() {
                "UPDATE jobs SET infra_retries = infra_retries + 1, message = $1 WHERE id = $2"
            } else {
                "UPDATE jobs SET failure_retries = failure_retries + 1, message = $1 WHERE id = $2"
            };
            tx.sql(spend).bind(message).bind(&job.id).execute().await?;
            make_ready(tx, &job.id, at, now).await?;
            Ok(JobStatus::Ready)
        }
        FailureVerdict::Fail { message } => {
            tx.sql(&FAIL).bind(now).bind(message).bind(&job.id).execute().await?;
            advance_run(tx, &job.run_id, now).await?;
            Ok(JobStatus::Failed)
        }
        FailureVerdict::FailFast { message, group } => {
            tx.sql(&FAIL).bind(now).bind(message).bind(&job.id).execute().await?;
            fail_fast(tx, run, &group, &job.name, now).await?;
            advance_run(tx, &job.run_id, now).await?;
            Ok(JobStatus::Failed)
        }
    }
}

/// A retry count as stored (never negative) for kiln-core's budget.
fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// `fail-fast`: a matrix job failed, so its siblings stop as kiln-core's
/// [`fail_fast_siblings`] decides: waiting ones are cancelled now, running
/// ones are asked to stop (heartbeat `cancel_requested`) and end `cancelled`
/// when they report or are fenced. The run is locked, so its jobs' statuses
/// read here are the ones the writes act on.
async fn fail_fast(tx: &mut Tx, run: &RunRecord, group: &str, failed: &str, now: i64) -> Result<()> {
    static CANCEL_WAITING: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3",
            cancelled = lit(JobStatus::Cancelled),
        )
    });
    let rows = tx
        .sql("SELECT id, name, status, job_index FROM jobs WHERE run_id = $1 ORDER BY job_index")
        .bind(&run.id)
        .fetch_all()
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut jobs = Vec::with_capacity(rows.len());
    for r in &rows {
        let index: i64 = r.get("job_index")?;
        let def = usize::try_from(index).ok().and_then(|i| run.definition.jobs.get(i));
        ids.push(r.get::<String>("id")?);
        jobs.push((
            r.get::<String>("name")?,
            parse_enum::<JobStatus>(r.str("status")?)?,
            def.and_then(|d| d.matrix.as_ref()).map(|m| m.group.clone()),
        ));
    }
    let view: Vec<(&str, JobStatus, Option<&str>)> =
        jobs.iter().map(|(name, status, group)| (name.as_str(), *status, group.as_deref())).collect();
    for (i, action) in fail_fast_siblings(failed, group, &view) {
        match action {
            SiblingAction::Cancel { why } => {
                tx.sql(&CANCEL_WAITING).bind(now).bind(why).bind(&ids[i]).execute().await?;
            }
            SiblingAction::Stop => {
                tx.sql("UPDATE jobs SET cancel_requested = 1 WHERE id = $1").bind(&ids[i]).execute().await?;
            }
        }
    }
    Ok(())
}
