//! Run acceptance and reads of runs and jobs (spec 000 §5–6, invariants 1
//! and 9): a frozen run, its jobs, the readiness of its root jobs with their
//! outbox events, its run-level concurrency group (spec 003) and its
//! idempotency record, in one transaction.

use crate::db::{Exec, Tx};
use crate::dialect::{Isolation, Sql, active_runs, lit};
use crate::error::{Result, StoreError};
use crate::model::{
    Accepted, AttemptRecord, JobRecord, JobView, NewRun, RunFilter, RunRecord, RunSummaryRecord, RunView, class_key,
};
use crate::rows::PinnedFrom;
use crate::rows::{ATTEMPT_COLS, JOB_COLS, attempt_from_row, job_from_row, load_job, load_run, new_id};
use crate::rows::{RUN_SUMMARY_COLS, run_summary_from_row};
use crate::store::SqlStore;
use crate::tx::advance::{RunJob, advance_known, advance_run, finish_run};
use crate::tx::cancel::cancel_in_tx;
use kiln_core::{JobStatus, RunStatus};
use std::collections::HashMap;

/// `RunStore::accept_run`.
pub(crate) async fn accept_run(store: &SqlStore, run: &NewRun) -> Result<Accepted> {
    // The run's row, stamped with the database clock it returns (the
    // acceptance's "now": no statement of its own), its deadline `$13` ms
    // after it.
    static RUN: Sql = Sql::new(|d| {
        format!(
            "INSERT INTO runs (id, repo_id, status, commit_sha, git_ref, event, trust, workflow_path, workflow_hash, \
             definition, inputs, parent_run_id, created_at, updated_at, actor, deadline_at, traceparent, \
             commit_title, commit_author, run_number, pull_request_title, priority) \
             SELECT $1, $2, {queued}, $3, $4, $5, $6, $7, $8, $9, $10, $11, n.now, n.now, $12, n.now + $13, $14, $15, \
             $16, $17, $18, $19 FROM (SELECT {now} AS now) n \
             RETURNING created_at, (SELECT name FROM repos WHERE id = $2), (SELECT team FROM repos WHERE id = $2)",
            queued = lit(RunStatus::Queued),
            now = d.now_ms
        )
    });
    static JOB: Sql = Sql::new(|_| {
        format!(
            "INSERT INTO jobs (id, run_id, job_index, name, status, needs, class_key, max_failure_retries, \
             image_digest) VALUES ($1, $2, $3, $4, {pending}, $5, $6, $7, $8)",
            pending = lit(JobStatus::Pending)
        )
    });
    let pins = run.pin_succeeded || !run.rerun_jobs.is_empty() || run.rollback.is_some();
    if pins && run.parent_run_id.is_none() {
        return Err(StoreError::Invalid("pinning jobs needs the parent run".into()));
    }
    // A SERIALIZABLE acceptance on PostgreSQL takes the number before, in a
    // transaction of its own (see [`take_run_number`]); a plain one (READ
    // COMMITTED: it waits for the counter's row lock, it never fails on it)
    // and SQLite's one writer take it inside.
    let isolation = isolation(run);
    let taken = if store.dialect().row_locks && isolation == Isolation::Serializable {
        take_run_number(store, run).await?
    } else {
        None
    };
    store
        .transaction(isolation, &(run, taken), |tx, &(run, taken)| {
            Box::pin(async move {
                if let Some(idem) = &run.idempotency {
                    let existing: Option<(String, String)> = tx
                        .sql("SELECT request_digest, run_id FROM idempotency WHERE scope = $1 AND key = $2")
                        .bind(&idem.scope)
                        .bind(&idem.key)
                        .optional()
                        .await?;
                    if let Some((digest, run_id)) = existing {
                        return if digest == idem.request_digest {
                            Ok(Accepted { run_id, created: false })
                        } else {
                            Err(StoreError::IdempotencyMismatch)
                        };
                    }
                }
                let run_id = new_id();
                // The repository's next number: the counter only goes up,
                // so a number is never reused.
                let number = match taken {
                    Some(n) => n,
                    None => next_run_number(tx, &run.repo_id).await?,
                };
                let definition =
                    serde_json::to_string(&run.workflow).map_err(|e| StoreError::Invalid(e.to_string()))?;
                let inputs = serde_json::to_string(&run.inputs).map_err(|e| StoreError::Invalid(e.to_string()))?;
                let workflow_hash = run.workflow.canonical_hash();
                let (now, repo_name, team): (i64, String, String) = tx
                    .sql(&RUN)
                    .bind(&run_id)
                    .bind(&run.repo_id)
                    .bind(&run.commit_sha)
                    .bind(&run.git_ref)
                    .bind(&run.event)
                    .bind(&run.trust)
                    .bind(&run.workflow_path)
                    .bind(&workflow_hash)
                    .bind(&definition)
                    .bind(&inputs)
                    .bind(&run.parent_run_id)
                    .bind(&run.actor)
                    // (capped: the database adds it to the clock, unsaturated)
                    .bind(
                        run.workflow
                            .timeout_secs
                            .map(|t| i64::try_from(t).unwrap_or(i64::MAX).saturating_mul(1000).min(i64::MAX / 4)),
                    )
                    .bind(&run.traceparent)
                    .bind(&run.commit_title)
                    .bind(&run.commit_author)
                    .bind(number)
                    .bind(&run.pull_request_title)
                    .bind(&run.priority)
                    .one()
                    .await?;
                let pins = run.pin_succeeded || !run.rerun_jobs.is_empty() || run.rollback.is_some();
                let (pinned, skipped) = match (&run.parent_run_id, &run.rollback, pins) {
                    (Some(parent), Some(rb), _) => crate::tx::rollback::plan(tx, parent, rb).await?,
                    (Some(parent), None, true) => (pinned_of(tx, parent, &run.rerun_jobs).await?, HashMap::new()),
                    (None, _, true) => return Err(StoreError::Invalid("pinning jobs needs the parent run".into())),
                    (_, _, false) => (HashMap::new(), HashMap::new()),
                };
                let mut jobs = Vec::with_capacity(run.workflow.jobs.len());
                for (i, job) in run.workflow.jobs.iter().enumerate() {
                    let job_id = new_id();
                    jobs.push(RunJob {
                        id: job_id.clone(),
                        name: job.name.clone(),
                        status: JobStatus::Pending,
                        needs: job.needs.clone(),
                        index: i as i64,
                    });
                    tx.sql(&JOB)
                        .bind(&job_id)
                        .bind(&run_id)
                        .bind(i as i64)
                        .bind(&job.name)
                        .bind(serde_json::to_string(&job.needs).expect("names serialise"))
                        .bind(class_key(&job.runs_on))
                        .bind(job.retry as i64)
                        .bind(run.image_digests.get(&job.name))
                        .execute()
                        .await?;
                    if let Some(from) = pinned.get(&job.name) {
                        let parent = run.parent_run_id.as_deref().unwrap_or_default();
                        pin_job(tx, &run_id, &job_id, parent, from, run.rollback.is_some(), now).await?;
                    } else if let Some(why) = skipped.get(&job.name) {
                        crate::tx::rollback::skip_job(tx, &job_id, why, now).await?;
                    }
                }
                if let Some(rb) = &run.rollback {
                    crate::tx::rollback::bind(tx, &run_id, rb, now).await?;
                }
                let held = match &run.concurrency {
                    Some(cc) => enter_run_group(tx, run, &run_id, &cc.group, cc.cancel_in_progress, now).await?,
                    None => false,
                };
                if !held {
                    if pinned.is_empty() && skipped.is_empty() && run.rollback.is_none() {
                        // As inserted (nothing above changed the run or its
                        // jobs): not read back.
                        let record = inserted_run(run, &run_id, number, &workflow_hash, now, repo_name, team);
                        #[cfg(debug_assertions)]
                        {
                            // Every test that accepts a run checks the two agree.
                            let loaded = load_run(tx, &run_id).await?;
                            assert_eq!(format!("{loaded:?}"), format!("{record:?}"), "the run as inserted");
                            let read = crate::tx::advance::run_jobs(tx, &run_id).await?;
                            assert_eq!(read, jobs, "the jobs as inserted");
                        }
                        advance_known(tx, record, Some(jobs), now).await?;
                    } else {
                        advance_run(tx, &run_id, now).await?;
                    }
                }
                if let Some(context) = &run.report_context {
                    crate::tx::forge::insert_report(
                        tx,
                        &run.repo_id,
                        &run.commit_sha,
                        context,
                        Some(&run_id),
                        None,
                        "",
                        now,
                    )
                    .await?;
                }
                if let Some(idem) = &run.idempotency {
                    tx.sql(
                        "INSERT INTO idempotency (scope, key, request_digest, run_id, created_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(&idem.scope)
                    .bind(&idem.key)
                    .bind(&idem.request_digest)
                    .bind(&run_id)
                    .bind(now)
                    .execute()
                    .await?;
                }
                if let Some(a) = &run.audit {
                    tx.sql("INSERT INTO audit_log (at, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)")
                        .bind(now)
                        .bind(&a.actor)
                        .bind(&a.action)
                        .bind(&run_id)
                        .bind(&a.detail)
                        .execute()
                        .await?;
                }
                Ok(Accepted { run_id, created: true })
            })
        })
        .await
}

/// The run row the acceptance inserted, as [`load_run`] would read it back
/// (a run that pins or skips no job and returns to no deployment).
fn inserted_run(
    run: &NewRun,
    run_id: &str,
    number: i64,
    workflow_hash: &str,
    now: i64,
    repo_name: String,
    team: String,
) -> RunRecord {
    RunRecord {
        id: run_id.to_string(),
        repo_id: run.repo_id.clone(),
        repo_name,
        status: RunStatus::Queued,
        commit_sha: run.commit_sha.clone(),
        git_ref: run.git_ref.clone(),
        event: run.event.clone(),
        trust: run.trust.clone(),
        workflow_path: run.workflow_path.clone(),
        workflow_hash: workflow_hash.to_string(),
        definition: run.workflow.clone(),
        inputs: run.inputs.clone(),
        actor: run.actor.clone(),
        parent_run_id: run.parent_run_id.clone(),
        cancel_version: 0,
        message: None,
        created_at: now,
        finished_at: None,
        traceparent: run.traceparent.clone(),
        commit_title: run.commit_title.clone(),
        commit_author: run.commit_author.clone(),
        held: false,
        number,
        pull_request_title: run.pull_request_title.clone(),
        team,
        priority: run.priority.clone(),
        rollback_of: None,
    }
}

/// How an acceptance runs on PostgreSQL. A plain one (no concurrency
/// group, no job in a group or an environment, no parent run, no
/// idempotency key, no forge report) reads and writes only the rows it
/// inserts, and other transactions cannot see them before it commits:
/// READ COMMITTED is enough, and SERIALIZABLE only made acceptances of one
/// repository running together fail each other on SSI's page-level
/// conflicts between their new rows and run again whole (57 retries for 50
/// runs submitted at once). The others read rows other transactions change
/// (other runs of a group, a parent, the forge's report rows, the key's
/// record) and stay SERIALIZABLE. A plain acceptance takes its run number
/// in its own transaction: acceptances of one repository wait for the
/// counter's row lock in turn, for the few statements left after it.
fn isolation(run: &NewRun) -> Isolation {
    let plain = run.concurrency.is_none()
        && run.parent_run_id.is_none()
        && run.rollback.is_none()
        && run.idempotency.is_none()
        && run.report_context.is_none()
        && !run.pin_succeeded
        && run.rerun_jobs.is_empty()
        && run.workflow.jobs.iter().all(|j| j.concurrency.is_none() && j.environment.is_none());
    if plain { Isolation::LockedReadCommitted } else { Isolation::Serializable }
}

/// Takes the repository's next run number (and moves its counter on).
async fn next_run_number(tx: &mut Tx, repo_id: &str) -> Result<i64> {
    let next: i64 = tx
        .sql("UPDATE repos SET next_run_number = next_run_number + 1 WHERE id = $1 RETURNING next_run_number")
        .bind(repo_id)
        .scalar_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("repository {repo_id}")))?;
    Ok(next - 1)
}

/// PostgreSQL: the number of a run accepted SERIALIZABLE (not a plain
/// one: [`isolation`]), taken in a short transaction of its own before the
/// acceptance. Inside the SERIALIZABLE acceptance every
/// acceptance of one repository updated the repository's row, and all but
/// the first of those running together failed with a serialization error
/// and ran again whole (1.9–3 tries per acceptance in `kiln bench
/// control-plane`; 83 failures for 50 runs submitted at once). Here they
/// wait for the row lock in turn instead (READ COMMITTED).
///
/// The counter's commit does not wait for its WAL to reach the disk: the
/// acceptance commits after it and flushes the WAL up to itself, this
/// update included. A crash before that loses only a number no run has.
/// An acceptance refused inside its transaction (a retry of a run still
/// running, a rollback to expired bytes) skips the number it took:
/// numbers stay unique and increasing, and gapless but for those (the
/// checks that need no transaction run before). `None` for a resubmission
/// whose idempotency key is recorded already: it takes no number.
async fn take_run_number(store: &SqlStore, run: &NewRun) -> Result<Option<i64>> {
    if let Some(idem) = &run.idempotency {
        let known: Option<String> = store
            .reader()
            .await?
            .sql("SELECT run_id FROM idempotency WHERE scope = $1 AND key = $2")
            .bind(&idem.scope)
            .bind(&idem.key)
            .scalar_optional()
            .await?;
        if known.is_some() {
            return Ok(None);
        }
    }
    let number = store
        .transaction(Isolation::LockedReadCommitted, &run.repo_id, |tx, repo_id| {
            Box::pin(async move {
                tx.sql("SET LOCAL synchronous_commit = off").execute().await?;
                next_run_number(tx, repo_id).await
            })
        })
        .await?;
    Ok(Some(number))
}

/// The jobs of `parent` a retry of its failed jobs (`rerun` empty) or of
/// the jobs named in `rerun` (issue 42) pins, by name, as kiln-core
/// decides; refused (409) while the parent runs, or, retrying the failed
/// jobs, when nothing in it failed.
async fn pinned_of(tx: &mut Tx, parent: &str, rerun: &[String]) -> Result<HashMap<String, PinnedFrom>> {
    use kiln_core::retry::{RetryFailedRefusal, pinned_for_rerun, pinned_jobs};
    let (jobs, mut from) = crate::rows::parent_jobs(tx, parent).await?;
    let jobs: Vec<_> = jobs.into_iter().map(|(_, j)| j).collect();
    let decided = if rerun.is_empty() {
        pinned_jobs(&jobs)
    } else {
        if let Some(unknown) = rerun.iter().find(|n| !from.contains_key(*n)) {
            return Err(StoreError::NotFound(format!("job `{unknown}` in run {parent}")));
        }
        pinned_for_rerun(&jobs, &rerun.iter().cloned().collect())
    };
    let pinned = decided.map_err(|why| {
        StoreError::Conflict(match why {
            RetryFailedRefusal::NotEnded if !rerun.is_empty() => format!(
                "run {parent} has jobs that have not ended; re-run a job once the run has ended (or cancel it first)"
            ),
            RetryFailedRefusal::NotEnded => {
                format!("run {parent} has jobs that have not ended; retry its failed jobs once it has ended")
            }
            RetryFailedRefusal::NothingFailed => {
                format!("every job of run {parent} succeeded: no failed job to retry (a plain retry runs them all)")
            }
        })
    })?;
    from.retain(|name, _| pinned.contains(name));
    Ok(from)
}

/// Pin job `job_id` of the new run to its parent's job (spec 000 §9,
/// retry from job): `success` without running, with the parent job's
/// times, and bound to the very generations the parent's job bound, so
/// consumers restore the same bytes (invariant 4: bindings, never
/// substitutes). A rollback (`lenient`) binds what has not expired: it
/// checks the bytes it deploys itself (`tx::rollback::bind`); a pinned
/// job's other artifacts may be gone.
async fn pin_job(
    tx: &mut Tx,
    run_id: &str,
    job_id: &str,
    parent: &str,
    from: &PinnedFrom,
    lenient: bool,
    now: i64,
) -> Result<()> {
    static PIN: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {success}, message = $1, started_at = $2, finished_at = $3 WHERE id = $4",
            success = lit(JobStatus::Success)
        )
    });
    tx.sql(&PIN)
        .bind(format!("pinned: succeeded in run {parent}, not run again"))
        .bind(from.started_at)
        .bind(from.finished_at)
        .bind(job_id)
        .execute()
        .await?;
    // Bytes already expired cannot be restored: the retry is refused, not
    // started with inputs that answer 410 (issue 40).
    let expired: Option<String> = tx
        .sql("SELECT name FROM artifact_bindings WHERE job_id = $1 AND expired_at IS NOT NULL ORDER BY name LIMIT 1")
        .bind(&from.job_id)
        .scalar_optional()
        .await?;
    if let (Some(name), false) = (expired, lenient) {
        return Err(StoreError::Conflict(format!(
            "artifact `{name}` of the succeeded job this retry would reuse (run {parent}) has expired; retry the \
             whole run instead (a plain retry runs every job again)"
        )));
    }
    // The same retention, counted from the retry: a pinned binding lasts
    // as long as its parent's or the retention again from now, whichever
    // is later (spec 000 §12: pinned through retries). The generation is
    // kept while any binding of it lives (`expire_artifact`).
    tx.sql(
        "INSERT INTO artifact_bindings (run_id, job_id, name, generation_id, created_at, expires_at, expired_at) \
         SELECT $1, $2, name, generation_id, $3, \
         CASE WHEN expires_at IS NULL THEN NULL \
         WHEN expires_at > $3 + (expires_at - created_at) THEN expires_at \
         ELSE $3 + (expires_at - created_at) END, NULL FROM artifact_bindings WHERE job_id = $4 \
         AND expired_at IS NULL",
    )
    .bind(run_id)
    .bind(job_id)
    .bind(now)
    .bind(&from.job_id)
    .execute()
    .await?;
    // And the outputs its parent job bound (issue 16), so the jobs that run
    // again read the same values.
    tx.sql(
        "INSERT INTO job_outputs (run_id, job_id, name, value, epoch, created_at) \
         SELECT $1, $2, name, value, epoch, $3 FROM job_outputs WHERE job_id = $4",
    )
    .bind(run_id)
    .bind(job_id)
    .bind(now)
    .bind(&from.job_id)
    .execute()
    .await?;
    Ok(())
}

/// Run-level concurrency group (spec 003): at most one active run per group;
/// a newer run supersedes queued ones and waits for (or, with
/// cancel-in-progress, cancels) the running one. Returns whether the new run
/// is held (waits for the group).
async fn enter_run_group(
    tx: &mut Tx,
    run: &NewRun,
    run_id: &str,
    group: &str,
    cancel_in_progress: bool,
    now: i64,
) -> Result<bool> {
    static OTHERS: Sql = Sql::new(|_| {
        format!(
            "SELECT id, status, held FROM runs WHERE repo_id = $1 AND concurrency_group = $2 AND id != $3 \
             AND status IN {active} ORDER BY created_at",
            active = active_runs()
        )
    });
    static SUPERSEDE_JOBS: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 \
             WHERE run_id = $3 AND status IN ({pending}, {ready})",
            cancelled = lit(JobStatus::Cancelled),
            pending = lit(JobStatus::Pending),
            ready = lit(JobStatus::Ready),
        )
    });
    static BUSY: Sql = Sql::new(|_| {
        format!(
            "SELECT COUNT(*) FROM runs WHERE repo_id = $1 AND concurrency_group = $2 AND id != $3 AND held = 0 \
             AND status IN {active}",
            active = active_runs()
        )
    });
    tx.sql("UPDATE runs SET concurrency_group = $1 WHERE id = $2").bind(group).bind(run_id).execute().await?;
    let others: Vec<(String, String, i64)> = tx.sql(&OTHERS).bind(&run.repo_id).bind(group).bind(run_id).all().await?;
    let mut held = false;
    for (other, _, other_held) in &others {
        if *other_held == 1 {
            tx.sql(&SUPERSEDE_JOBS).bind(now).bind("cancelled: superseded").bind(other).execute().await?;
            let why = format!("superseded by run {run_id} in concurrency group `{group}`");
            finish_run(tx, other, RunStatus::Cancelled, Some(&why), now).await?;
        } else {
            held = true;
            if cancel_in_progress {
                let why = format!("cancelled in progress by run {run_id} in concurrency group `{group}`");
                cancel_in_tx(tx, other, Some(&why), now).await?;
            }
        }
    }
    if held {
        // The group may have been freed by the cancellation just above.
        let busy: i64 = tx.sql(&BUSY).bind(&run.repo_id).bind(group).bind(run_id).scalar().await?;
        held = busy > 0;
    }
    if held {
        tx.sql("UPDATE runs SET held = 1, message = $1 WHERE id = $2")
            .bind(format!("waiting for concurrency group `{group}`"))
            .bind(run_id)
            .execute()
            .await?;
    }
    Ok(held)
}

/// `RunStore::get_run`: the run, its jobs and their attempts, read from one
/// snapshot (a job still `running` beside its attempt already `lost` was
/// a read torn by the lease-expiry commit between two statements).
pub(crate) async fn get_run(store: &SqlStore, run_id: &str) -> Result<RunView> {
    store.read(run_id, |tx, run_id| Box::pin(get_run_tx(tx, run_id))).await
}

async fn get_run_tx(conn: &mut Tx, run_id: &str) -> Result<RunView> {
    static JOBS: Sql = Sql::new(|_| format!("SELECT {JOB_COLS} FROM jobs WHERE run_id = $1 ORDER BY job_index"));
    static ATTEMPTS: Sql =
        Sql::new(|_| format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE run_id = $1 ORDER BY job_id, epoch"));
    let run = load_run(conn, run_id).await?;
    let job_rows = conn.sql(&JOBS).bind(run_id).fetch_all().await?;
    let attempt_rows = conn.sql(&ATTEMPTS).bind(run_id).fetch_all().await?;
    let mut attempts: HashMap<String, Vec<AttemptRecord>> = HashMap::new();
    for r in &attempt_rows {
        let a = attempt_from_row(r)?;
        attempts.entry(a.job_id.clone()).or_default().push(a);
    }
    let jobs = job_rows
        .iter()
        .map(|r| {
            let job = job_from_row(r)?;
            let attempts = attempts.remove(&job.id).unwrap_or_default();
            Ok(JobView { job, attempts })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RunView { run, jobs })
}

/// `RunStore::list_runs`: newest first; the definition column is not read.
pub(crate) async fn list_runs(
    store: &SqlStore,
    repo_id: &str,
    status: Option<&str>,
    limit: u32,
) -> Result<Vec<RunSummaryRecord>> {
    static LIST: Sql = Sql::new(|_| {
        format!(
            "SELECT {RUN_SUMMARY_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.repo_id = $1 AND ($2 IS NULL OR r.status = $3) ORDER BY r.created_at DESC, r.id DESC LIMIT $4"
        )
    });
    let rows =
        store.reader().await?.sql(&LIST).bind(repo_id).bind(status).bind(status).bind(limit as i64).fetch_all().await?;
    rows.iter().map(run_summary_from_row).collect()
}

/// `RunStore::find_runs`: newest first, across repositories or in one,
/// by status, branch (the run's ref as named, or `refs/heads/BRANCH`),
/// event and actor; `before` a run id pages on (created_at, id), the
/// order of the list, so a page never repeats or skips a run.
pub(crate) async fn find_runs(store: &SqlStore, f: &RunFilter) -> Result<Vec<RunSummaryRecord>> {
    static FIND: Sql = Sql::new(|_| {
        format!(
            "SELECT {RUN_SUMMARY_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE ($1 IS NULL OR r.repo_id = $2) AND ($3 IS NULL OR r.status = $4) \
             AND ($5 IS NULL OR r.git_ref = $6 OR r.git_ref = $7) \
             AND ($8 IS NULL OR r.event = $9) AND ($10 IS NULL OR r.actor = $11) \
             AND ($12 IS NULL OR r.created_at < (SELECT b.created_at FROM runs b WHERE b.id = $13) \
                  OR (r.created_at = (SELECT b.created_at FROM runs b WHERE b.id = $14) AND r.id < $15)) \
             ORDER BY r.created_at DESC, r.id DESC LIMIT $16"
        )
    });
    let full_ref = f.branch.as_ref().map(|b| format!("refs/heads/{b}"));
    let before = f.before.as_deref();
    let rows = store
        .reader()
        .await?
        .sql(&FIND)
        .bind(f.repo_id.as_deref())
        .bind(f.repo_id.as_deref())
        .bind(f.status.as_deref())
        .bind(f.status.as_deref())
        .bind(f.branch.as_deref())
        .bind(f.branch.as_deref())
        .bind(full_ref.as_deref())
        .bind(f.event.as_deref())
        .bind(f.event.as_deref())
        .bind(f.actor.as_deref())
        .bind(f.actor.as_deref())
        .bind(before)
        .bind(before)
        .bind(before)
        .bind(before)
        .bind(f.limit as i64)
        .fetch_all()
        .await?;
    rows.iter().map(run_summary_from_row).collect()
}

/// `RunStore::find_runs_by_prefix`: the ids of runs starting with `prefix`
/// (at most `limit`).
pub(crate) async fn find_runs_by_prefix(store: &SqlStore, prefix: &str, limit: u32) -> Result<Vec<String>> {
    let pattern = format!("{}%", prefix.replace(['%', '_', '\\'], ""));
    store
        .reader()
        .await?
        .sql("SELECT id FROM runs WHERE id LIKE $1 ORDER BY id LIMIT $2")
        .bind(pattern)
        .bind(limit as i64)
        .scalars()
        .await
}

/// `RunStore::find_run_by_number`: the id of run `number` of repository
/// `repo_id` (`hello#123`).
pub(crate) async fn find_run_by_number(store: &SqlStore, repo_id: &str, number: i64) -> Result<String> {
    let id: Option<String> = store
        .reader()
        .await?
        .sql("SELECT id FROM runs WHERE repo_id = $1 AND run_number = $2")
        .bind(repo_id)
        .bind(number)
        .scalar_optional()
        .await?;
    id.ok_or_else(|| StoreError::NotFound(format!("run #{number}")))
}

/// `RunStore::run_id_neighbours`: the run ids just before and just after
/// `id` in id order (what a unique prefix of `id` must tell it from).
pub(crate) async fn run_id_neighbours(store: &SqlStore, id: &str) -> Result<(Option<String>, Option<String>)> {
    let mut r = store.reader().await?;
    let before: Option<String> = r.sql("SELECT MAX(id) FROM runs WHERE id < $1").bind(id).scalar().await?;
    let after: Option<String> = r.sql("SELECT MIN(id) FROM runs WHERE id > $1").bind(id).scalar().await?;
    Ok((before, after))
}

/// `RunStore::run_id_neighbours_of`: the ids of every run from the one
/// before the first of `ids` to the one after the last, in the database's
/// order (the one [`run_id_neighbours`] compares in), when they are at most
/// a few times as many as `ids`; otherwise, and for an id that is no run,
/// one [`run_id_neighbours`] each. A page of the run list used to cost two
/// statements per run.
pub(crate) async fn run_id_neighbours_of(
    store: &SqlStore,
    ids: &[String],
) -> Result<HashMap<String, (Option<String>, Option<String>)>> {
    static SPAN: Sql = Sql::new(|d| {
        format!(
            "SELECT id FROM runs WHERE \
             id >= COALESCE((SELECT MAX(id) FROM runs WHERE id < (SELECT MIN(id) FROM runs WHERE id IN \
               (SELECT value FROM {page}))), (SELECT MIN(id) FROM runs WHERE id IN (SELECT value FROM {page}))) \
             AND id <= COALESCE((SELECT MIN(id) FROM runs WHERE id > (SELECT MAX(id) FROM runs WHERE id IN \
               (SELECT value FROM {page}))), (SELECT MAX(id) FROM runs WHERE id IN (SELECT value FROM {page}))) \
             ORDER BY id LIMIT $2",
            page = d.json_texts(1)
        )
    });
    let mut out = HashMap::with_capacity(ids.len());
    if ids.is_empty() {
        return Ok(out);
    }
    let cap = ids.len() * 4 + 16;
    let page = serde_json::to_string(ids).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let span: Vec<(String,)> = store.reader().await?.sql(&SPAN).bind(page).bind(cap as i64 + 1).all().await?;
    if span.len() <= cap {
        let wanted: std::collections::HashSet<&String> = ids.iter().collect();
        for (i, (id,)) in span.iter().enumerate() {
            if wanted.contains(id) {
                let before = i.checked_sub(1).map(|b| span[b].0.clone());
                out.insert(id.clone(), (before, span.get(i + 1).map(|(a,)| a.clone())));
            }
        }
    }
    for id in ids {
        if !out.contains_key(id) {
            out.insert(id.clone(), run_id_neighbours(store, id).await?);
        }
    }
    Ok(out)
}

/// `RunStore::get_job`.
pub(crate) async fn get_job(store: &SqlStore, job_id: &str) -> Result<JobRecord> {
    Ok(load_job(&mut store.reader().await?, job_id).await?.0)
}
