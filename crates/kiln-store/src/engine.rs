//! The store's transactions, written once for every SQL backend.
//!
//! This file is compiled once per backend: `sqlite.rs` and `postgres.rs` each
//! include it as their `engine` module, after defining the dialect items it
//! uses through `super::` (`Db`, `DbRow`, `StoreImpl`, `db_err`, `sql`,
//! `sql_owned`, `NOW_SQL`, `lock_run_of_job`, `lock_job`, `retryable`,
//! `MAX_TX_RETRIES`). SQL is written in SQLite's dialect with `?`
//! placeholders; a backend's `sql` rewrites what it must (PostgreSQL:
//! numbered placeholders, its clock, `json_each`). Every trait method is one
//! transaction taken with [`write_tx!`], retried when the backend reports a
//! serialization failure or deadlock.

use super::{
    Db, DbRow, FOR_UPDATE, FOR_UPDATE_OF_RUN, FOR_UPDATE_OF_RUN_SKIP_LOCKED, NOW_SQL, StoreImpl, Tx, db_err,
    lock_run_of_job,
};
use crate::*;
use crate::{new_id, parse_enum};
use kiln_core::backoff::DEFAULT_INFRA_RETRIES;
use kiln_core::{AttemptOutcome, JobStatus, RunStatus};
use sqlx::Row;
use std::collections::{BTreeMap, HashMap};

/// A SQL literal in the engine's dialect, as the backend runs it.
macro_rules! q {
    ($s:literal) => {
        super::sql($s)
    };
}

/// SQL assembled from compile-time constants only (column lists, dialect
/// items), rewritten once per call site and kept.
macro_rules! sqlc {
    ($($t:tt)*) => {{
        static SQL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
        *SQL.get_or_init(|| Box::leak(super::sql_owned(format!($($t)*)).into_boxed_str()))
    }};
}

/// SQL assembled from compile-time column lists and column names only; user
/// values are always bound parameters.
macro_rules! sqlf {
    ($($t:tt)*) => { sqlx::AssertSqlSafe(super::sql_owned(format!($($t)*))) };
}
pub(crate) use {q, sqlf};

/// One protocol transaction: `$body` runs with `$tx` open and its `Ok` is
/// committed; an error rolls back. A serialization failure or deadlock
/// (PostgreSQL) reruns the whole body, a bounded number of times.
///
/// `write_tx!(store, locked |tx| …)` begins the transaction with
/// `begin_locked` instead: on PostgreSQL READ COMMITTED rather than
/// SERIALIZABLE, for transactions whose every decision reads rows locked
/// first or is rechecked in an `UPDATE`'s `WHERE` (see the rules at
/// [`lock_claim_rows`]).
macro_rules! write_tx {
    ($store:expr, |$tx:ident| $body:block) => {
        write_tx!(@ begin, $store, |$tx| $body)
    };
    ($store:expr, locked |$tx:ident| $body:block) => {
        write_tx!(@ begin_locked, $store, |$tx| $body)
    };
    (@ $begin:ident, $store:expr, |$tx:ident| $body:block) => {{
        let mut tries = 0u32;
        loop {
            let mut $tx = $store.$begin().await?;
            let r: Result<_> = async { $body }.await;
            let r = match r {
                Ok(v) => $tx.commit().await.map(|()| v).map_err(super::db_err),
                Err(e) => {
                    let _ = $tx.rollback().await;
                    Err(e)
                }
            };
            match r {
                Err(e) if super::retryable(&e) && tries < super::MAX_TX_RETRIES => {
                    tries += 1;
                    super::retry_pause(tries).await;
                }
                r => break r,
            }
        }
    }};
}
pub(crate) use write_tx;

pub(crate) async fn now(tx: &mut Tx<'_>) -> Result<i64> {
    sqlx::query_scalar::<_, i64>(NOW_SQL).fetch_one(&mut **tx).await.map_err(db_err)
}

// ---------- row mapping ----------

const RUN_COLS: &str = "r.id, r.repo_id, p.name AS repo_name, r.status, r.commit_sha, r.git_ref, r.event, r.trust, \
    r.workflow_path, r.workflow_hash, r.definition, r.inputs, r.parent_run_id, r.cancel_version, r.message, \
    r.created_at, r.finished_at";

/// One column of a row, decoded; a bad value is `Invalid`, not an outage.
fn col<'r, T: sqlx::Decode<'r, Db> + sqlx::Type<Db>>(row: &'r DbRow, name: &str) -> Result<T> {
    row.try_get(name).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// A JSON column (definition, inputs, needs).
fn json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|e| StoreError::Invalid(e.to_string()))
}

fn run_from_row(row: &DbRow) -> Result<RunRecord> {
    let definition: String = col(row, "definition")?;
    let inputs: String = col(row, "inputs")?;
    Ok(RunRecord {
        id: col(row, "id")?,
        repo_id: col(row, "repo_id")?,
        repo_name: col(row, "repo_name")?,
        status: parse_enum(col::<&str>(row, "status")?)?,
        commit_sha: col(row, "commit_sha")?,
        git_ref: col(row, "git_ref")?,
        event: col(row, "event")?,
        trust: col(row, "trust")?,
        workflow_path: col(row, "workflow_path")?,
        workflow_hash: col(row, "workflow_hash")?,
        definition: json(&definition)?,
        inputs: json(&inputs)?,
        parent_run_id: col(row, "parent_run_id")?,
        cancel_version: col(row, "cancel_version")?,
        message: col(row, "message")?,
        created_at: col(row, "created_at")?,
        finished_at: col(row, "finished_at")?,
    })
}

const JOB_COLS: &str = "id, run_id, job_index, name, status, needs, class_key, dispatch_generation, current_epoch, \
    next_attempt_at, image_digest, message, started_at, finished_at, failure_retries, infra_retries, max_failure_retries, cancel_requested";

fn job_from_row(row: &DbRow) -> Result<JobRecord> {
    let needs: String = col(row, "needs")?;
    Ok(JobRecord {
        id: col(row, "id")?,
        run_id: col(row, "run_id")?,
        index: col(row, "job_index")?,
        name: col(row, "name")?,
        status: parse_enum(col::<&str>(row, "status")?)?,
        needs: json(&needs)?,
        class_key: col(row, "class_key")?,
        dispatch_generation: col(row, "dispatch_generation")?,
        current_epoch: col(row, "current_epoch")?,
        next_attempt_at: col(row, "next_attempt_at")?,
        image_digest: col(row, "image_digest")?,
        message: col(row, "message")?,
        started_at: col(row, "started_at")?,
        finished_at: col(row, "finished_at")?,
        cancel_requested: col::<i64>(row, "cancel_requested")? != 0,
    })
}

const ATTEMPT_COLS: &str =
    "job_id, epoch, agent_id, session_id, runner, lease_deadline, outcome, exit_code, message, started_at, finished_at";

fn attempt_from_row(row: &DbRow) -> Result<AttemptRecord> {
    Ok(AttemptRecord {
        job_id: col(row, "job_id")?,
        epoch: col(row, "epoch")?,
        agent_id: col(row, "agent_id")?,
        session_id: col(row, "session_id")?,
        runner: col(row, "runner")?,
        lease_deadline: col(row, "lease_deadline")?,
        outcome: parse_enum(col::<&str>(row, "outcome")?)?,
        exit_code: col(row, "exit_code")?,
        message: col(row, "message")?,
        started_at: col(row, "started_at")?,
        finished_at: col(row, "finished_at")?,
    })
}

fn repo_from_row(row: &DbRow) -> Result<RepoRecord> {
    Ok(RepoRecord {
        id: col(row, "id")?,
        name: col(row, "name")?,
        clone_url: col(row, "clone_url")?,
        webhook_secret: col(row, "webhook_secret")?,
        created_at: col(row, "created_at")?,
    })
}

pub(crate) async fn load_run<'e, E: sqlx::Executor<'e, Database = Db>>(ex: E, run_id: &str) -> Result<RunRecord> {
    let row = sqlx::query(sqlf!("SELECT {RUN_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id WHERE r.id = ?"))
        .bind(run_id)
        .fetch_optional(ex)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
    run_from_row(&row)
}

pub(crate) async fn load_job<'e, E: sqlx::Executor<'e, Database = Db>>(
    ex: E,
    job_id: &str,
) -> Result<(JobRecord, JobBudget)> {
    let row = sqlx::query(sqlf!("SELECT {JOB_COLS} FROM jobs WHERE id = ?"))
        .bind(job_id)
        .fetch_optional(ex)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
    let budget = JobBudget {
        failure_retries: col(&row, "failure_retries")?,
        infra_retries: col(&row, "infra_retries")?,
        max_failure_retries: col(&row, "max_failure_retries")?,
        cancel_requested: col::<i64>(&row, "cancel_requested")? != 0,
    };
    Ok((job_from_row(&row)?, budget))
}

pub(crate) struct JobBudget {
    failure_retries: i64,
    infra_retries: i64,
    max_failure_retries: i64,
    /// The job alone was asked to stop (fail-fast of a matrix sibling).
    cancel_requested: bool,
}

// ---------- shared transaction steps ----------

/// Make a job ready with a new dispatch generation and write its outbox event
/// in the same transaction (spec 000 §9, invariant 5).
async fn make_ready(tx: &mut Tx<'_>, job_id: &str, available_at: i64, now: i64) -> Result<()> {
    let (gen_, class): (i64, String) = sqlx::query_as(q!(
        "UPDATE jobs SET status = 'ready', dispatch_generation = dispatch_generation + 1, next_attempt_at = ? \
         WHERE id = ? RETURNING dispatch_generation, class_key"
    ))
    .bind(available_at)
    .bind(job_id)
    .fetch_one(&mut **tx)
    .await
    .map_err(db_err)?;
    sqlx::query(q!(
        "INSERT INTO outbox (job_id, dispatch_generation, class_key, available_at, created_at) VALUES (?, ?, ?, ?, ?)"
    ))
    .bind(job_id)
    .bind(gen_)
    .bind(class)
    .bind(available_at)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// After a job of `run_id` finished: make pending jobs whose needs all
/// succeeded ready, skip pending jobs downstream of a failure, and finish the
/// run when nothing is left to run.
async fn advance_run(tx: &mut Tx<'_>, run_id: &str, now: i64) -> Result<()> {
    let run = advance_run_inner(tx, run_id, now).await?;
    // Only a job in a concurrency group occupies one: a run without job
    // groups frees no slot (and, completing at READ COMMITTED, must not
    // touch other runs' jobs).
    if run.definition.jobs.iter().any(|j| j.concurrency.is_some()) {
        release_job_groups(tx, now).await?;
    }
    Ok(())
}

/// Job-level concurrency groups: start the oldest job waiting on each group
/// that no job occupies (ready or running) any more.
async fn release_job_groups(tx: &mut Tx<'_>, now: i64) -> Result<()> {
    loop {
        let next: Option<(String, String)> = sqlx::query_as(
            q!("SELECT j.id, j.run_id FROM jobs j JOIN runs r ON r.id = j.run_id \
             WHERE j.group_waiting = 1 AND j.status = 'pending' AND NOT EXISTS ( \
               SELECT 1 FROM jobs o WHERE o.concurrency_group = j.concurrency_group AND o.status IN ('ready', 'running')) \
             ORDER BY r.created_at, j.job_index LIMIT 1"),
        )
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
        let Some((job_id, run_id)) = next else { return Ok(()) };
        sqlx::query(q!("UPDATE jobs SET group_waiting = 0 WHERE id = ?"))
            .bind(&job_id)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        Box::pin(advance_run_inner(tx, &run_id, now)).await?;
    }
}

/// Returns the run as loaded (before this step changed it).
async fn advance_run_inner(tx: &mut Tx<'_>, run_id: &str, now: i64) -> Result<RunRecord> {
    let run = load_run(&mut **tx, run_id).await?;
    let held: i64 = sqlx::query_scalar(q!("SELECT held FROM runs WHERE id = ?"))
        .bind(run_id)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    let rows =
        sqlx::query(q!("SELECT id, name, status, needs, job_index FROM jobs WHERE run_id = ? ORDER BY job_index"))
            .bind(run_id)
            .fetch_all(&mut **tx)
            .await
            .map_err(db_err)?;
    let mut status: HashMap<String, JobStatus> = HashMap::new();
    let mut jobs = Vec::new();
    for r in &rows {
        let id: String = r.get("id");
        let name: String = r.get("name");
        let st: JobStatus = parse_enum(r.get::<&str, _>("status"))?;
        let needs: Vec<String> = serde_json::from_str(r.get::<&str, _>("needs")).unwrap_or_default();
        let index: i64 = r.get("job_index");
        status.insert(name.clone(), st);
        jobs.push((id, name, needs, index));
    }
    if run.status.can_claim() && held == 0 {
        // Matrix groups occupying their `max-parallel` slots.
        let group_of = |index: i64| run.definition.jobs.get(index as usize).and_then(|j| j.matrix.as_ref());
        let mut occupied: HashMap<String, u32> = HashMap::new();
        for (_, name, _, index) in &jobs {
            if let Some(m) = group_of(*index)
                && matches!(status[name], JobStatus::Ready | JobStatus::Running)
            {
                *occupied.entry(m.group.clone()).or_default() += 1;
            }
        }
        // Jobs are listed so that needs always name earlier jobs: one pass
        // decides every job whose needs are all decided.
        for (id, name, needs, index) in &jobs {
            if status[name] != JobStatus::Pending {
                continue;
            }
            let def = run.definition.jobs.get(*index as usize);
            let all_decided = needs.iter().all(|n| status.get(n).is_some_and(|s| s.is_terminal()));
            // Without `if:`, a job whose needs can no longer all (or a quorum)
            // succeed is skipped at once, even while other needs still run.
            let hopeless = def.is_some_and(|d| d.condition.is_none()) && {
                let lost = needs
                    .iter()
                    .filter(|n| {
                        matches!(status.get(*n), Some(JobStatus::Failed | JobStatus::Cancelled | JobStatus::Skipped))
                    })
                    .count();
                let required = def.and_then(|d| d.quorum).map(|q| q as usize).unwrap_or(needs.len());
                needs.len() - lost < required
            };
            if !all_decided && !hopeless {
                continue;
            }
            let ctx = condition_context(&run, needs, &status, def.and_then(|d| d.quorum));
            // Without `if:`, a job runs when its needs succeeded (spec 000 §2).
            let expr = def.and_then(|d| d.condition.clone());
            let go = kiln_workflow::eval_condition(expr.as_deref().unwrap_or("success()"), &ctx);
            match go {
                Ok(true) => {
                    if let Some(m) = def.and_then(|d| d.matrix.as_ref())
                        && let Some(max) = m.max_parallel
                    {
                        let n = occupied.entry(m.group.clone()).or_default();
                        if *n >= max {
                            continue; // waits for a sibling to finish
                        }
                        *n += 1;
                    }
                    if let Some(cc) = def.and_then(|d| d.concurrency.as_ref()) {
                        let group = kiln_workflow::render_group(&cc.group, &ctx).unwrap_or_else(|_| cc.group.clone());
                        let key = format!("{}:{group}", run.repo_id);
                        if !enter_job_group(tx, id, &key, cc.cancel_in_progress, now).await? {
                            continue; // waits for its concurrency group
                        }
                    }
                    make_ready(tx, id, now, now).await?;
                    status.insert(name.clone(), JobStatus::Ready);
                    let ok = needs.iter().filter(|n| status.get(*n) == Some(&JobStatus::Success)).count();
                    if def.and_then(|d| d.quorum).is_some() && ok < needs.len() {
                        // Ran on a quorum: say so where users look.
                        sqlx::query(q!("UPDATE jobs SET message = ? WHERE id = ?"))
                            .bind(format!("degraded: {ok} of {} needs succeeded (quorum)", needs.len()))
                            .bind(id)
                            .execute(&mut **tx)
                            .await
                            .map_err(db_err)?;
                    }
                }
                Ok(false) | Err(_) => {
                    let why = match (&go, &expr) {
                        (Err(e), _) => format!("skipped: its condition could not be evaluated: {e}"),
                        (_, Some(c)) => format!("skipped: condition `{c}` is false"),
                        (_, None) => "skipped: a job it needs did not succeed".to_string(),
                    };
                    sqlx::query(q!("UPDATE jobs SET status = 'skipped', finished_at = ?, message = ? WHERE id = ?"))
                        .bind(now)
                        .bind(why)
                        .bind(id)
                        .execute(&mut **tx)
                        .await
                        .map_err(db_err)?;
                    status.insert(name.clone(), JobStatus::Skipped);
                }
            }
        }
    }
    let active = status.values().any(|s| !s.is_terminal());
    if active || run.status.is_terminal() {
        return Ok(run);
    }
    let final_status = if run.status == RunStatus::Cancelling {
        RunStatus::Cancelled
    } else if status.values().any(|s| matches!(s, JobStatus::Failed | JobStatus::Cancelled)) {
        RunStatus::Failed
    } else {
        RunStatus::Success
    };
    finish_run(tx, run_id, final_status, None, now).await?;
    Ok(run)
}

/// A job about to become ready joins its concurrency group `key`. Returns
/// false when the group is occupied: the job waits (`group_waiting`), older
/// waiting jobs of the group are superseded (cancelled), and with
/// cancel-in-progress the occupant is stopped (a ready one cancelled, a
/// running one asked to stop).
async fn enter_job_group(tx: &mut Tx<'_>, job_id: &str, key: &str, cancel_in_progress: bool, now: i64) -> Result<bool> {
    sqlx::query(q!("UPDATE jobs SET concurrency_group = ? WHERE id = ?"))
        .bind(key)
        .bind(job_id)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
    let occupants: Vec<(String, String)> = sqlx::query_as(q!(
        "SELECT id, status FROM jobs WHERE concurrency_group = ? AND id != ? AND status IN ('ready', 'running')"
    ))
    .bind(key)
    .bind(job_id)
    .fetch_all(&mut **tx)
    .await
    .map_err(db_err)?;
    if occupants.is_empty() {
        return Ok(true);
    }
    let superseded: Vec<(String, String)> = sqlx::query_as(
        q!("SELECT id, run_id FROM jobs WHERE concurrency_group = ? AND id != ? AND group_waiting = 1 AND status = 'pending'"),
    )
    .bind(key)
    .bind(job_id)
    .fetch_all(&mut **tx)
    .await
    .map_err(db_err)?;
    for (other, other_run) in &superseded {
        sqlx::query(q!(
            "UPDATE jobs SET status = 'cancelled', group_waiting = 0, finished_at = ?, message = ? WHERE id = ?"
        ))
        .bind(now)
        .bind(format!("cancelled: superseded by job {job_id} in concurrency group `{key}`"))
        .bind(other)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
        Box::pin(advance_run_inner(tx, other_run, now)).await?;
    }
    if cancel_in_progress {
        let mut still_running = false;
        for (occupant, status) in &occupants {
            if status == "running" {
                still_running = true;
                sqlx::query(q!("UPDATE jobs SET cancel_requested = 1 WHERE id = ?"))
                    .bind(occupant)
                    .execute(&mut **tx)
                    .await
                    .map_err(db_err)?;
            } else {
                let run: String = sqlx::query_scalar(q!(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ?, message = ? WHERE id = ? RETURNING run_id"
                ))
                .bind(now)
                .bind(format!("cancelled in progress by job {job_id} in concurrency group `{key}`"))
                .bind(occupant)
                .fetch_one(&mut **tx)
                .await
                .map_err(db_err)?;
                Box::pin(advance_run_inner(tx, &run, now)).await?;
            }
        }
        if !still_running {
            return Ok(true);
        }
    }
    sqlx::query(q!("UPDATE jobs SET group_waiting = 1, message = ? WHERE id = ?"))
        .bind(format!("waiting for concurrency group `{key}`"))
        .bind(job_id)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
    Ok(false)
}

/// spec 000 §13: a log whose agent was lost never ends cleanly: the fenced
/// epoch's log gets an explicit gap line after everything it had committed.
async fn append_gap_marker(tx: &mut Tx<'_>, job_id: &str, epoch: i64) -> Result<()> {
    use sha2::{Digest, Sha256};
    let (offset, seq): (i64, i64) =
        sqlx::query_as(q!("SELECT COALESCE(MAX(byte_offset + length), 0), COALESCE(MAX(seq) + 1, 0) FROM log_chunks \
         WHERE job_id = ? AND epoch = ? AND stream = 'system'"))
        .bind(job_id)
        .bind(epoch)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    let text = format!(
        "[kiln] ⚠ gap: the agent of attempt {epoch} was lost; output it had not delivered is missing, and this log has no clean end\n"
    );
    sqlx::query(
        q!("INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data) VALUES (?, ?, 'system', ?, ?, ?, ?, ?)"),
    )
    .bind(job_id)
    .bind(epoch)
    .bind(seq)
    .bind(offset)
    .bind(text.len() as i64)
    .bind(hex::encode(Sha256::digest(text.as_bytes())))
    .bind(text.as_bytes())
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    let committed = committed_offsets(tx, job_id, epoch).await?;
    let payload = serde_json::json!({ "epoch": epoch, "reason": "agent lost", "committed": committed });
    append_marker(tx, job_id, epoch, LOG_GAP, &payload).await
}

/// The context an `if:` is evaluated in: the frozen run's trigger and the
/// results of the job's needs.
fn condition_context(
    run: &RunRecord,
    needs: &[String],
    status: &HashMap<String, JobStatus>,
    quorum: Option<u32>,
) -> kiln_workflow::ConditionContext {
    use kiln_workflow::JobResult;
    let branch = run.git_ref.as_deref().and_then(|r| match r.strip_prefix("refs/heads/") {
        Some(b) => Some(b.to_string()),
        None if r.starts_with("refs/") || (r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())) => None,
        None => Some(r.to_string()),
    });
    kiln_workflow::ConditionContext {
        event: run.event.clone(),
        git_ref: run.git_ref.clone(),
        branch,
        inputs: run.inputs.clone(),
        needs_results: needs
            .iter()
            .map(|n| match status.get(n) {
                Some(JobStatus::Success) => JobResult::Success,
                Some(JobStatus::Cancelled) => JobResult::Cancelled,
                Some(JobStatus::Skipped) => JobResult::Skipped,
                _ => JobResult::Failure,
            })
            .collect(),
        run_cancelled: false,
        quorum,
    }
}

/// spec 000 §9 cancellation inside a transaction: bump the cancel version,
/// cancel jobs that are not running, and keep the run `cancelling` while
/// attempts still run. A terminal or already cancelling run is left as is.
async fn cancel_in_tx(tx: &mut Tx<'_>, run_id: &str, message: Option<&str>, now: i64) -> Result<()> {
    let run = load_run(&mut **tx, run_id).await?;
    if run.status.is_terminal() || run.status == RunStatus::Cancelling {
        return Ok(());
    }
    sqlx::query(q!("UPDATE jobs SET status = 'cancelled', finished_at = ?, message = 'cancelled' \
         WHERE run_id = ? AND status IN ('pending', 'ready')"))
    .bind(now)
    .bind(run_id)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    sqlx::query(q!("UPDATE runs SET cancel_version = cancel_version + 1, updated_at = ?, message = COALESCE(?, message) WHERE id = ?"))
        .bind(now)
        .bind(message)
        .bind(run_id)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
    let running: i64 = sqlx::query_scalar(q!("SELECT COUNT(*) FROM jobs WHERE run_id = ? AND status = 'running'"))
        .bind(run_id)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    release_job_groups(tx, now).await?;
    if running > 0 {
        // Keep the run CANCELLING while physical termination is unresolved.
        sqlx::query(q!("UPDATE runs SET status = 'cancelling' WHERE id = ?"))
            .bind(run_id)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        Ok(())
    } else {
        finish_run(tx, run_id, RunStatus::Cancelled, None, now).await
    }
}

/// Marks a run terminal and lets the next run waiting on its concurrency
/// group start (spec 003: at most one running per group).
pub(crate) async fn finish_run(
    tx: &mut Tx<'_>,
    run_id: &str,
    status: RunStatus,
    message: Option<&str>,
    now: i64,
) -> Result<()> {
    sqlx::query(
        q!("UPDATE runs SET status = ?, finished_at = ?, updated_at = ?, held = 0, message = COALESCE(?, message) WHERE id = ?"),
    )
    .bind(status.as_str())
    .bind(now)
    .bind(now)
    .bind(message)
    .bind(run_id)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    release_group(tx, run_id, now).await
}

/// If `run_id` belongs to a concurrency group with no active run left, start
/// the oldest run waiting in it.
async fn release_group(tx: &mut Tx<'_>, run_id: &str, now: i64) -> Result<()> {
    let grp: Option<(String, Option<String>)> =
        sqlx::query_as(q!("SELECT repo_id, concurrency_group FROM runs WHERE id = ?"))
            .bind(run_id)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db_err)?;
    let Some((repo_id, Some(group))) = grp else { return Ok(()) };
    let busy: i64 =
        sqlx::query_scalar(q!("SELECT COUNT(*) FROM runs WHERE repo_id = ? AND concurrency_group = ? AND held = 0 \
         AND status IN ('queued', 'running', 'cancelling')"))
        .bind(&repo_id)
        .bind(&group)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    if busy > 0 {
        return Ok(());
    }
    let next: Option<String> = sqlx::query_scalar(q!(
        "SELECT id FROM runs WHERE repo_id = ? AND concurrency_group = ? AND held = 1 AND status = 'queued' \
         ORDER BY created_at, id LIMIT 1"
    ))
    .bind(&repo_id)
    .bind(&group)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err)?;
    if let Some(next) = next {
        sqlx::query(q!("UPDATE runs SET held = 0, updated_at = ? WHERE id = ?"))
            .bind(now)
            .bind(&next)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        Box::pin(advance_run(tx, &next, now)).await?;
    }
    Ok(())
}

/// Ends an attempt that did not succeed: retry within the budget or fail the job.
async fn fail_or_retry(
    store: &StoreImpl,
    tx: &mut Tx<'_>,
    job: &JobRecord,
    budget: &JobBudget,
    infra: bool,
    message: &str,
    now: i64,
) -> Result<JobStatus> {
    let run = load_run(&mut **tx, &job.run_id).await?;
    if run.status == RunStatus::Cancelling || run.status == RunStatus::Cancelled || budget.cancel_requested {
        let why = if budget.cancel_requested { "cancelled: fail-fast (a matrix sibling failed)" } else { "cancelled" };
        sqlx::query(q!("UPDATE jobs SET status = 'cancelled', finished_at = ?, message = ? WHERE id = ?"))
            .bind(now)
            .bind(why)
            .bind(&job.id)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        advance_run(tx, &job.run_id, now).await?;
        return Ok(JobStatus::Cancelled);
    }
    let (col, used, allowed) = if infra {
        ("infra_retries", budget.infra_retries, DEFAULT_INFRA_RETRIES as i64)
    } else {
        ("failure_retries", budget.failure_retries, budget.max_failure_retries)
    };
    if used < allowed {
        let at = now + store.retry_delay((used + 1) as u32);
        sqlx::query(sqlf!("UPDATE jobs SET {col} = {col} + 1, message = ? WHERE id = ?"))
            .bind(format!("retrying: {message}"))
            .bind(&job.id)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        make_ready(tx, &job.id, at, now).await?;
        return Ok(JobStatus::Ready);
    }
    sqlx::query(q!("UPDATE jobs SET status = 'failed', finished_at = ?, message = ? WHERE id = ?"))
        .bind(now)
        .bind(message)
        .bind(&job.id)
        .execute(&mut **tx)
        .await
        .map_err(db_err)?;
    if let Some(m) = run.definition.jobs.get(job.index as usize).and_then(|d| d.matrix.as_ref())
        && m.fail_fast
    {
        fail_fast(tx, &run, &m.group, &job.name, now).await?;
    }
    advance_run(tx, &job.run_id, now).await?;
    Ok(JobStatus::Failed)
}

/// `fail-fast`: a matrix job failed, so its siblings stop: waiting ones are
/// cancelled now, running ones are asked to stop (heartbeat
/// `cancel_requested`) and end `cancelled` when they report or are fenced.
async fn fail_fast(tx: &mut Tx<'_>, run: &RunRecord, group: &str, failed: &str, now: i64) -> Result<()> {
    let siblings: Vec<&str> = run
        .definition
        .jobs
        .iter()
        .filter(|j| j.name != failed && j.matrix.as_ref().is_some_and(|m| m.group == group))
        .map(|j| j.name.as_str())
        .collect();
    let names = serde_json::to_string(&siblings).expect("names");
    sqlx::query(q!("UPDATE jobs SET status = 'cancelled', finished_at = ?, message = ? \
         WHERE run_id = ? AND status IN ('pending', 'ready') AND name IN (SELECT value FROM json_each(?))"))
    .bind(now)
    .bind(format!("cancelled: fail-fast after `{failed}` failed"))
    .bind(&run.id)
    .bind(&names)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    sqlx::query(q!("UPDATE jobs SET cancel_requested = 1 WHERE run_id = ? AND status = 'running' \
         AND name IN (SELECT value FROM json_each(?))"))
    .bind(&run.id)
    .bind(&names)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Whether a run takes part in a concurrency group, its own or one of its
/// jobs' (spec 003): completing its jobs can then start or cancel work of
/// other runs.
fn uses_concurrency_groups(run: &RunRecord) -> bool {
    run.definition.concurrency.is_some() || run.definition.jobs.iter().any(|j| j.concurrency.is_some())
}

/// The completion transaction (spec 000 §9). `Ok(None)`: not decided,
/// because the run uses concurrency groups and `serializable` is false.
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
    store: &StoreImpl,
    tx: &mut Tx<'_>,
    job_id: &str,
    epoch: i64,
    c: &CompletionInput,
    serializable: bool,
) -> Result<Option<Result<String>>> {
    lock_run_of_job(tx, job_id).await?;
    // Then the job: its log's seal marker commits in id order with
    // the chunks appended under the same lock.
    super::lock_job(tx, job_id).await?;
    let now = now(tx).await?;
    let (job, budget) = require_live(tx, job_id, epoch, now).await?;
    let run = load_run(&mut **tx, &job.run_id).await?;
    if !serializable && uses_concurrency_groups(&run) {
        return Ok(None);
    }
    if !run.status.can_claim() || budget.cancel_requested {
        // Cancellation (of the run, or of this job by fail-fast)
        // committed first: the late completion is rejected,
        // but it does confirm the sandbox ended.
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
                let g: Option<String> = sqlx::query_scalar(q!(
                    "SELECT id FROM artifact_generations WHERE job_id = ? AND epoch = ? AND name = ? \
                     AND state = 'sealed' ORDER BY sealed_at DESC, id DESC LIMIT 1"
                ))
                .bind(job_id)
                .bind(epoch)
                .bind(name)
                .fetch_optional(&mut **tx)
                .await
                .map_err(db_err)?;
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
                sqlx::query(
                    q!("INSERT INTO artifact_bindings (run_id, job_id, name, generation_id, created_at) VALUES (?, ?, ?, ?, ?)"),
                )
                .bind(&job.run_id)
                .bind(job_id)
                .bind(name)
                .bind(g)
                .bind(now)
                .execute(&mut **tx)
                .await
                .map_err(db_err)?;
            }
            end_attempt(tx, job_id, epoch, AttemptOutcome::Success, c.exit_code, c.message.as_deref(), now).await?;
            sqlx::query(q!("UPDATE jobs SET status = 'success', finished_at = ?, \
                 message = CASE WHEN message LIKE 'degraded:%' THEN message END WHERE id = ?"))
            .bind(now)
            .bind(job_id)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
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

/// Checks that `(job, epoch)` is the job's current running attempt with a
/// live lease (invariant 3). Returns the job and its attempt.
pub(crate) async fn require_live(
    tx: &mut Tx<'_>,
    job_id: &str,
    epoch: i64,
    now: i64,
) -> Result<(JobRecord, JobBudget)> {
    let (job, budget) = load_job(&mut **tx, job_id).await?;
    let row = sqlx::query(q!("SELECT outcome, lease_deadline FROM attempts WHERE job_id = ? AND epoch = ?"))
        .bind(job_id)
        .bind(epoch)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
    let Some(row) = row else {
        return Err(StoreError::StaleEpoch(format!("job {job_id} has no attempt with epoch {epoch}")));
    };
    let outcome: AttemptOutcome = parse_enum(row.get::<&str, _>("outcome"))?;
    let deadline: i64 = row.get("lease_deadline");
    if epoch != job.current_epoch {
        return Err(StoreError::StaleEpoch(format!(
            "epoch {epoch} of job {job_id} was replaced by epoch {}",
            job.current_epoch
        )));
    }
    if !outcome.can_publish() {
        return Err(StoreError::StaleEpoch(format!("epoch {epoch} of job {job_id} already ended ({outcome})")));
    }
    if deadline <= now {
        return Err(StoreError::StaleEpoch(format!("the lease of epoch {epoch} of job {job_id} expired")));
    }
    Ok((job, budget))
}

async fn end_attempt(
    tx: &mut Tx<'_>,
    job_id: &str,
    epoch: i64,
    outcome: AttemptOutcome,
    exit_code: Option<i32>,
    message: Option<&str>,
    now: i64,
) -> Result<()> {
    let ended = sqlx::query(q!("UPDATE attempts SET outcome = ?, exit_code = ?, message = ?, finished_at = ? \
         WHERE job_id = ? AND epoch = ? AND outcome = 'running'"))
    .bind(outcome.as_str())
    .bind(exit_code)
    .bind(message)
    .bind(now)
    .bind(job_id)
    .bind(epoch)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    // An attempt that ended through its agent has a sealed log: what was
    // committed is all there is (spec 000 §13: `log.sealed` is distinct from
    // a dropped connection, which gets a gap marker when it is fenced).
    if ended.rows_affected() > 0 && outcome != AttemptOutcome::Lost {
        let committed = committed_offsets(tx, job_id, epoch).await?;
        let payload = serde_json::json!({ "epoch": epoch, "outcome": outcome.as_str(), "committed": committed });
        append_marker(tx, job_id, epoch, LOG_SEAL, &payload).await?;
    }
    Ok(())
}

/// Log rows that are events rather than bytes: `seal` (the attempt ended
/// through its agent; every committed byte is all there is) and `gap` (the
/// agent was lost; bytes it had not delivered are missing).
pub(crate) const LOG_SEAL: &str = "seal";
pub(crate) const LOG_GAP: &str = "gap";

async fn committed_offsets(tx: &mut Tx<'_>, job_id: &str, epoch: i64) -> Result<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as(q!("SELECT stream, committed FROM log_progress WHERE job_id = ? AND epoch = ?"))
            .bind(job_id)
            .bind(epoch)
            .fetch_all(&mut **tx)
            .await
            .map_err(db_err)?;
    Ok(rows.into_iter().collect())
}

async fn append_marker(
    tx: &mut Tx<'_>,
    job_id: &str,
    epoch: i64,
    kind: &str,
    payload: &serde_json::Value,
) -> Result<()> {
    use sha2::{Digest, Sha256};
    let data = serde_json::to_vec(payload).expect("json");
    sqlx::query(q!("INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data) \
         VALUES (?, ?, ?, 0, 0, ?, ?, ?) ON CONFLICT DO NOTHING"))
    .bind(job_id)
    .bind(epoch)
    .bind(kind)
    .bind(data.len() as i64)
    .bind(hex::encode(Sha256::digest(&data)))
    .bind(&data)
    .execute(&mut **tx)
    .await
    .map_err(db_err)?;
    Ok(())
}

async fn claimed(tx: &mut Tx<'_>, job_id: &str, epoch: i64) -> Result<ClaimedAttempt> {
    let (job, _) = load_job(&mut **tx, job_id).await?;
    let run = load_run(&mut **tx, &job.run_id).await?;
    let deadline: i64 = sqlx::query_scalar(q!("SELECT lease_deadline FROM attempts WHERE job_id = ? AND epoch = ?"))
        .bind(job_id)
        .bind(epoch)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)?;
    Ok(ClaimedAttempt { run, job, epoch, lease_deadline: deadline })
}

/// The database clock in the engine's dialect, for SQL assembled with `sqlc!`.
const NOW_EXPR: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The first statements of a claim: the job's run row, locked, then the job
/// row, locked (the spec's order), with the attempt a claim request already
/// committed, if any. `None`: no such job. With `skip_locked`, a run row
/// another transaction holds is `Busy` at once.
///
/// Rules for transactions begun with `write_tx!(…, locked …)` (READ
/// COMMITTED on PostgreSQL; SQLite's single writer serializes everything):
/// a decision reads only rows that the transaction locked before (`FOR
/// UPDATE`, in the order run, job, agent; each statement after a lock reads
/// the newest committed rows), or is rechecked in the `WHERE` of the
/// `UPDATE`/`INSERT` that acts on it. Every such transaction changes the job
/// row it locked, so a SERIALIZABLE transaction that waited for that lock
/// fails with a serialization error and reruns on the new state.
async fn lock_claim_rows(
    tx: &mut Tx<'_>,
    job_id: &str,
    claim_request_id: &str,
    skip_locked: bool,
) -> Result<Option<(RunRecord, JobRecord, Option<(String, i64)>)>> {
    let sql = if skip_locked {
        sqlc!(
            "SELECT {RUN_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.id = (SELECT run_id FROM jobs WHERE id = ?){FOR_UPDATE_OF_RUN_SKIP_LOCKED}"
        )
    } else {
        sqlc!(
            "SELECT {RUN_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.id = (SELECT run_id FROM jobs WHERE id = ?){FOR_UPDATE_OF_RUN}"
        )
    };
    let row = sqlx::query(sql).bind(job_id).fetch_optional(&mut **tx).await.map_err(db_err)?;
    let Some(row) = row else {
        if skip_locked {
            let exists: Option<String> = sqlx::query_scalar(q!("SELECT id FROM jobs WHERE id = ?"))
                .bind(job_id)
                .fetch_optional(&mut **tx)
                .await
                .map_err(db_err)?;
            if exists.is_some() {
                return Err(StoreError::Busy(format!("the run of job {job_id} is locked by another transaction")));
            }
        }
        return Ok(None);
    };
    let run = run_from_row(&row)?;
    let row = sqlx::query(sqlc!(
        "SELECT {JOB_COLS}, (SELECT a.job_id FROM attempts a WHERE a.claim_request_id = ?) AS prior_job, \
         (SELECT a.epoch FROM attempts a WHERE a.claim_request_id = ?) AS prior_epoch \
         FROM jobs WHERE id = ?{FOR_UPDATE}"
    ))
    .bind(claim_request_id)
    .bind(claim_request_id)
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err)?;
    let Some(row) = row else { return Ok(None) };
    let prior = match (col::<Option<String>>(&row, "prior_job")?, col::<Option<i64>>(&row, "prior_epoch")?) {
        (Some(j), Some(e)) => Some((j, e)),
        _ => None,
    };
    Ok(Some((run, job_from_row(&row)?, prior)))
}

// ---------- trait implementations ----------

#[async_trait]
impl RepoStore for StoreImpl {
    async fn create_repo(&self, name: &str, clone_url: &str, webhook_secret: Option<&str>) -> Result<RepoRecord> {
        let id = new_id();
        let now = write_tx!(self, |tx| {
            let now = now(&mut tx).await?;
            let res = sqlx::query(q!(
                "INSERT INTO repos (id, name, clone_url, webhook_secret, created_at) VALUES (?, ?, ?, ?, ?)"
            ))
            .bind(&id)
            .bind(name)
            .bind(clone_url)
            .bind(webhook_secret)
            .bind(now)
            .execute(&mut *tx)
            .await;
            // (clippy::single_match: `if let` instead of a one-armed match; no behaviour change.)
            if let Err(e) = res {
                return Err(match db_err(e) {
                    StoreError::Conflict(_) => StoreError::Conflict(format!("repository `{name}` already exists")),
                    other => other,
                });
            }
            Ok(now)
        })?;
        Ok(RepoRecord {
            id,
            name: name.into(),
            clone_url: clone_url.into(),
            webhook_secret: webhook_secret.map(Into::into),
            created_at: now,
        })
    }

    async fn get_repo(&self, name_or_id: &str) -> Result<RepoRecord> {
        let row = sqlx::query(q!("SELECT * FROM repos WHERE name = ? OR id = ? LIMIT 1"))
            .bind(name_or_id)
            .bind(name_or_id)
            .fetch_optional(&self.reader)
            .await
            .map_err(db_err)?
            .ok_or_else(|| StoreError::NotFound(format!("repository `{name_or_id}`")))?;
        repo_from_row(&row)
    }

    async fn list_repos(&self) -> Result<Vec<RepoRecord>> {
        let rows =
            sqlx::query(q!("SELECT * FROM repos ORDER BY name")).fetch_all(&self.reader).await.map_err(db_err)?;
        rows.iter().map(repo_from_row).collect()
    }

    async fn put_secret(&self, repo_id: &str, name: &str, value: &str) -> Result<()> {
        sqlx::query(q!("INSERT INTO secrets (repo_id, name, value, updated_at) \
             VALUES (?, ?, ?, CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
             ON CONFLICT (repo_id, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at"))
        .bind(repo_id)
        .bind(name)
        .bind(value)
        .execute(&self.writer)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn delete_secret(&self, repo_id: &str, name: &str) -> Result<bool> {
        let r = sqlx::query(q!("DELETE FROM secrets WHERE repo_id = ? AND name = ?"))
            .bind(repo_id)
            .bind(name)
            .execute(&self.writer)
            .await
            .map_err(db_err)?;
        Ok(r.rows_affected() > 0)
    }

    async fn list_secrets(&self, repo_id: &str) -> Result<Vec<(String, i64)>> {
        sqlx::query_as(q!("SELECT name, updated_at FROM secrets WHERE repo_id = ? ORDER BY name"))
            .bind(repo_id)
            .fetch_all(&self.reader)
            .await
            .map_err(db_err)
    }

    async fn secret_values(&self, repo_id: &str, names: &[String]) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for name in names {
            let v: Option<String> = sqlx::query_scalar(q!("SELECT value FROM secrets WHERE repo_id = ? AND name = ?"))
                .bind(repo_id)
                .bind(name)
                .fetch_optional(&self.reader)
                .await
                .map_err(db_err)?;
            if let Some(v) = v {
                out.insert(name.clone(), v);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl RunStore for StoreImpl {
    async fn accept_run(&self, run: NewRun) -> Result<Accepted> {
        write_tx!(self, |tx| {
            if let Some(idem) = &run.idempotency {
                let existing: Option<(String, String)> =
                    sqlx::query_as(q!("SELECT request_digest, run_id FROM idempotency WHERE scope = ? AND key = ?"))
                        .bind(&idem.scope)
                        .bind(&idem.key)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db_err)?;
                if let Some((digest, run_id)) = existing {
                    return if digest == idem.request_digest {
                        Ok(Accepted { run_id, created: false })
                    } else {
                        Err(StoreError::IdempotencyMismatch)
                    };
                }
            }
            let now = now(&mut tx).await?;
            let run_id = new_id();
            let definition = serde_json::to_string(&run.workflow).map_err(|e| StoreError::Invalid(e.to_string()))?;
            let inputs = serde_json::to_string(&run.inputs).map_err(|e| StoreError::Invalid(e.to_string()))?;
            sqlx::query(
            q!("INSERT INTO runs (id, repo_id, status, commit_sha, git_ref, event, trust, workflow_path, workflow_hash, \
             definition, inputs, parent_run_id, created_at, updated_at) \
             VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
        )
        .bind(&run_id)
        .bind(&run.repo_id)
        .bind(&run.commit_sha)
        .bind(&run.git_ref)
        .bind(&run.event)
        .bind(&run.trust)
        .bind(&run.workflow_path)
        .bind(run.workflow.canonical_hash())
        .bind(&definition)
        .bind(&inputs)
        .bind(&run.parent_run_id)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
            for (i, job) in run.workflow.jobs.iter().enumerate() {
                let job_id = new_id();
                sqlx::query(q!(
                    "INSERT INTO jobs (id, run_id, job_index, name, status, needs, class_key, max_failure_retries, \
                 image_digest) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)"
                ))
                .bind(&job_id)
                .bind(&run_id)
                .bind(i as i64)
                .bind(&job.name)
                .bind(serde_json::to_string(&job.needs).expect("names serialise"))
                .bind(class_key(&job.runs_on))
                .bind(job.retry as i64)
                .bind(run.image_digests.get(&job.name))
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            }
            // Run-level concurrency group (spec 003): at most one active run per
            // group; a newer run supersedes queued ones and waits for (or, with
            // cancel-in-progress, cancels) the running one.
            let mut held = false;
            if let Some(cc) = &run.concurrency {
                sqlx::query(q!("UPDATE runs SET concurrency_group = ? WHERE id = ?"))
                    .bind(&cc.group)
                    .bind(&run_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                let others: Vec<(String, String, i64)> = sqlx::query_as(q!(
                    "SELECT id, status, held FROM runs WHERE repo_id = ? AND concurrency_group = ? AND id != ? \
                 AND status IN ('queued', 'running', 'cancelling') ORDER BY created_at"
                ))
                .bind(&run.repo_id)
                .bind(&cc.group)
                .bind(&run_id)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_err)?;
                for (other, _, other_held) in &others {
                    if *other_held == 1 {
                        sqlx::query(q!(
                            "UPDATE jobs SET status = 'cancelled', finished_at = ?, message = 'cancelled: superseded' \
                         WHERE run_id = ? AND status IN ('pending', 'ready')"
                        ))
                        .bind(now)
                        .bind(other)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                        let why = format!("superseded by run {run_id} in concurrency group `{}`", cc.group);
                        finish_run(&mut tx, other, RunStatus::Cancelled, Some(&why), now).await?;
                    } else {
                        held = true;
                        if cc.cancel_in_progress {
                            let why =
                                format!("cancelled in progress by run {run_id} in concurrency group `{}`", cc.group);
                            cancel_in_tx(&mut tx, other, Some(&why), now).await?;
                        }
                    }
                }
                if held {
                    // The group may have been freed by the cancellation just above.
                    let busy: i64 = sqlx::query_scalar(
                    q!("SELECT COUNT(*) FROM runs WHERE repo_id = ? AND concurrency_group = ? AND id != ? AND held = 0 \
                     AND status IN ('queued', 'running', 'cancelling')"),
                )
                .bind(&run.repo_id)
                .bind(&cc.group)
                .bind(&run_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_err)?;
                    held = busy > 0;
                }
                if held {
                    sqlx::query(q!("UPDATE runs SET held = 1, message = ? WHERE id = ?"))
                        .bind(format!("waiting for concurrency group `{}`", cc.group))
                        .bind(&run_id)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                }
            }
            if !held {
                advance_run(&mut tx, &run_id, now).await?;
            }
            if let Some(idem) = &run.idempotency {
                sqlx::query(q!(
                    "INSERT INTO idempotency (scope, key, request_digest, run_id, created_at) VALUES (?, ?, ?, ?, ?)"
                ))
                .bind(&idem.scope)
                .bind(&idem.key)
                .bind(&idem.request_digest)
                .bind(&run_id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            }
            Ok(Accepted { run_id, created: true })
        })
    }

    async fn get_run(&self, run_id: &str) -> Result<RunView> {
        let mut conn = self.reader.acquire().await.map_err(db_err)?;
        let run = load_run(&mut *conn, run_id).await?;
        let job_rows = sqlx::query(sqlf!("SELECT {JOB_COLS} FROM jobs WHERE run_id = ? ORDER BY job_index"))
            .bind(run_id)
            .fetch_all(&mut *conn)
            .await
            .map_err(db_err)?;
        let attempt_rows =
            sqlx::query(sqlf!("SELECT {ATTEMPT_COLS} FROM attempts WHERE run_id = ? ORDER BY job_id, epoch"))
                .bind(run_id)
                .fetch_all(&mut *conn)
                .await
                .map_err(db_err)?;
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

    async fn list_runs(&self, repo_id: &str, status: Option<&str>, limit: u32) -> Result<Vec<RunRecord>> {
        let rows = sqlx::query(sqlf!(
            "SELECT {RUN_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.repo_id = ? AND (? IS NULL OR r.status = ?) ORDER BY r.created_at DESC, r.id DESC LIMIT ?"
        ))
        .bind(repo_id)
        .bind(status)
        .bind(status)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)?;
        rows.iter().map(run_from_row).collect()
    }

    async fn cancel_run(&self, run_id: &str) -> Result<RunRecord> {
        write_tx!(self, |tx| {
            super::lock_run(&mut tx, run_id).await?;
            let now = now(&mut tx).await?;
            cancel_in_tx(&mut tx, run_id, None, now).await?;
            let run = load_run(&mut *tx, run_id).await?;
            Ok(run)
        })
    }

    async fn get_job(&self, job_id: &str) -> Result<JobRecord> {
        Ok(load_job(&self.reader, job_id).await?.0)
    }
}

#[async_trait]
impl AgentStore for StoreImpl {
    async fn register_agent(&self, name: &str, labels: &str, max_jobs: u32) -> Result<AgentRecord> {
        let parsed: BTreeMap<String, String> =
            serde_json::from_str(labels).map_err(|e| StoreError::Invalid(format!("labels: {e}")))?;
        write_tx!(self, |tx| {
            let now = now(&mut tx).await?;
            let id = new_id();
            let session = new_id();
            sqlx::query(
            q!("INSERT INTO agents (id, name, labels, max_jobs, session_id, created_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?)"),
        )
        .bind(&id)
        .bind(name)
        .bind(labels)
        .bind(max_jobs as i64)
        .bind(&session)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
            Ok(AgentRecord { id, name: name.into(), labels: parsed.clone(), max_jobs, session_id: session })
        })
    }

    async fn get_agent(&self, agent_id: &str) -> Result<AgentRecord> {
        let row = sqlx::query(q!("SELECT id, name, labels, max_jobs, session_id FROM agents WHERE id = ?"))
            .bind(agent_id)
            .fetch_optional(&self.reader)
            .await
            .map_err(db_err)?
            .ok_or_else(|| StoreError::NotFound(format!("agent {agent_id}")))?;
        Ok(AgentRecord {
            id: row.get("id"),
            name: row.get("name"),
            labels: serde_json::from_str(row.get::<&str, _>("labels")).unwrap_or_default(),
            max_jobs: row.get::<i64, _>("max_jobs") as u32,
            session_id: row.get("session_id"),
        })
    }
}

#[async_trait]
impl AttemptStore for StoreImpl {
    async fn claim(&self, req: ClaimInput) -> Result<Option<ClaimedAttempt>> {
        // READ COMMITTED on PostgreSQL (see `lock_claim_rows`): the run, the
        // job and the agent are locked in that order before anything is
        // decided, so two claims of one job, or of one agent's capacity,
        // run one after the other and the second sees the first's attempt.
        write_tx!(
            self,
            locked
                | tx
                | {
                    let Some((mut run, mut job, prior)) =
                        lock_claim_rows(&mut tx, &req.job_id, &req.claim_request_id, req.skip_locked).await?
                    else {
                        return Ok(None);
                    };
                    // A retried claim request returns what the first one committed.
                    if let Some((job_id, epoch)) = prior {
                        let c = claimed(&mut tx, &job_id, epoch).await?;
                        return Ok((c.job.current_epoch == epoch && c.job.status == JobStatus::Running).then_some(c));
                    }
                    if !job.status.can_claim() || job.dispatch_generation != req.dispatch_generation {
                        return Ok(None);
                    }
                    if !run.status.can_claim() {
                        return Ok(None);
                    }
                    // Predecessors decided (defensive: readiness already implies it; which
                    // outcomes let the job run is its `if:`, evaluated when it became ready).
                    if !job.needs.is_empty() {
                        let preds_ok: i64 = sqlx::query_scalar(
                q!("SELECT COUNT(*) FROM jobs WHERE run_id = ? AND name IN (SELECT value FROM json_each(?)) AND status NOT IN ('success', 'failed', 'cancelled', 'skipped')"),
            )
            .bind(&job.run_id)
            .bind(serde_json::to_string(&job.needs).expect("names"))
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err)?;
                        if preds_ok != 0 {
                            return Ok(None);
                        }
                    }
                    // The agent, locked (claims of one agent take its capacity one at
                    // a time), and the database clock, read once the run and job
                    // locks are held.
                    let agent: Option<(String, i64, String, String, i64)> = sqlx::query_as(sqlc!(
                "SELECT session_id, max_jobs, name, labels, {NOW_EXPR} AS now FROM agents WHERE id = ?{FOR_UPDATE}"
            ))
            .bind(&req.agent_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_err)?;
                    let now = match &agent {
                        Some(a) => a.4,
                        None => now(&mut tx).await?,
                    };
                    if job.next_attempt_at.is_some_and(|t| t > now) {
                        return Ok(None);
                    }
                    let Some((session, max_jobs, agent_name, labels, _)) = agent else {
                        return Err(StoreError::NotFound(format!("agent {}", req.agent_id)));
                    };
                    if session != req.session_id {
                        return Err(StoreError::StaleEpoch(format!("agent session {} was replaced", req.session_id)));
                    }
                    // Compatibility is part of the claim, not only of queue routing: the
                    // agent must carry every label the job's `runs-on` requires.
                    let have: BTreeMap<String, String> = serde_json::from_str(&labels).unwrap_or_default();
                    let need: BTreeMap<String, String> = serde_json::from_str(&job.class_key).unwrap_or_default();
                    if !need.iter().all(|(k, v)| have.get(k) == Some(v)) {
                        return Ok(None);
                    }
                    // Capacity admission for this agent session and the attempt, in
                    // one statement (the count is read after the agent lock).
                    let epoch = job.current_epoch + 1;
                    let deadline = now + req.lease_ttl_ms;
                    let inserted = sqlx::query(q!(
                        "INSERT INTO attempts (job_id, epoch, run_id, agent_id, session_id, runner, claim_request_id, \
                 lease_deadline, outcome, started_at) \
                 SELECT ?, ?, ?, ?, ?, ?, ?, ?, 'running', ? \
                 WHERE (SELECT COUNT(*) FROM attempts WHERE session_id = ? AND outcome = 'running') < ? \
                 ON CONFLICT (claim_request_id) DO NOTHING"
                    ))
                    .bind(&job.id)
                    .bind(epoch)
                    .bind(&job.run_id)
                    .bind(&req.agent_id)
                    .bind(&req.session_id)
                    .bind(&agent_name)
                    .bind(&req.claim_request_id)
                    .bind(deadline)
                    .bind(now)
                    .bind(&req.session_id)
                    .bind(max_jobs)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?
                    .rows_affected();
                    if inserted == 0 {
                        // Full, or the same claim request committed an attempt
                        // concurrently (the insert waited for it): that one stands.
                        let prior: Option<(String, i64)> =
                            sqlx::query_as(q!("SELECT job_id, epoch FROM attempts WHERE claim_request_id = ?"))
                                .bind(&req.claim_request_id)
                                .fetch_optional(&mut *tx)
                                .await
                                .map_err(db_err)?;
                        let Some((job_id, epoch)) = prior else { return Ok(None) };
                        let c = claimed(&mut tx, &job_id, epoch).await?;
                        return Ok((c.job.current_epoch == epoch && c.job.status == JobStatus::Running).then_some(c));
                    }
                    sqlx::query(q!("UPDATE jobs SET status = 'running', current_epoch = ?, next_attempt_at = NULL, \
             started_at = COALESCE(started_at, ?) WHERE id = ?"))
                    .bind(epoch)
                    .bind(now)
                    .bind(&job.id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                    if run.status == RunStatus::Queued {
                        sqlx::query(q!(
                            "UPDATE runs SET status = 'running', updated_at = ? WHERE id = ? AND status = 'queued'"
                        ))
                        .bind(now)
                        .bind(&job.run_id)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                        run.status = RunStatus::Running;
                    }
                    // The rows as this transaction left them (both are locked).
                    job.status = JobStatus::Running;
                    job.current_epoch = epoch;
                    job.next_attempt_at = None;
                    job.started_at = job.started_at.or(Some(now));
                    Ok(Some(ClaimedAttempt { run, job, epoch, lease_deadline: deadline }))
                }
        )
    }

    async fn claimed_by_request(&self, claim_request_id: &str) -> Result<Option<ClaimedAttempt>> {
        // Usually there is none: one statement, no transaction.
        let prior: Option<(String, i64)> =
            sqlx::query_as(q!("SELECT job_id, epoch FROM attempts WHERE claim_request_id = ?"))
                .bind(claim_request_id)
                .fetch_optional(&self.reader)
                .await
                .map_err(db_err)?;
        let Some((job_id, epoch)) = prior else {
            return Ok(None);
        };
        let mut tx = self.reader.begin().await.map_err(db_err)?;
        let c = claimed(&mut tx, &job_id, epoch).await?;
        Ok((c.job.current_epoch == epoch && c.job.status == JobStatus::Running).then_some(c))
    }

    async fn heartbeat(&self, job_id: &str, epoch: i64, lease_ttl_ms: i64) -> Result<HeartbeatOutcome> {
        // The common case in one statement: extend the lease of the current,
        // running, unexpired epoch (the conditions are rechecked on the row
        // as it is updated, so a concurrent fence wins or loses cleanly) and
        // read the cancellation state. No row: the full transaction below
        // says precisely why the heartbeat is refused.
        //
        // One statement, no explicit transaction (one round trip; on
        // PostgreSQL it runs at READ COMMITTED): the `outcome = 'running'`
        // and lease conditions are rechecked on the newest version of the
        // attempt row if a concurrent transaction changed it, and every
        // transaction that ends an attempt (completion, fencing) changes
        // that row, so a heartbeat never revives an ended attempt. An
        // attempt that is running is its job's current epoch (a new epoch is
        // claimed only after the previous attempt ended).
        //
        // On PostgreSQL concurrent heartbeats share one statement (see
        // `postgres::extend_lease`): the same conditions, rechecked per row.
        let fast = super::extend_lease(self, job_id, epoch, lease_ttl_ms).await?;
        if let Some((deadline, cancel, status)) = fast {
            let cancel_requested = cancel != 0 || (status != "running" && status != "queued");
            return Ok(HeartbeatOutcome { cancel_requested, lease_deadline: deadline });
        }
        write_tx!(self, |tx| {
            lock_run_of_job(&mut tx, job_id).await?;
            let now = now(&mut tx).await?;
            let (job, budget) = require_live(&mut tx, job_id, epoch, now).await?;
            let deadline = now + lease_ttl_ms;
            sqlx::query(q!("UPDATE attempts SET lease_deadline = ? WHERE job_id = ? AND epoch = ?"))
                .bind(deadline)
                .bind(job_id)
                .bind(epoch)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            let status: String = sqlx::query_scalar(q!("SELECT status FROM runs WHERE id = ?"))
                .bind(&job.run_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_err)?;
            let cancel_requested = budget.cancel_requested || (status != "running" && status != "queued");
            Ok(HeartbeatOutcome { cancel_requested, lease_deadline: deadline })
        })
    }

    async fn complete(&self, job_id: &str, epoch: i64, c: CompletionInput) -> Result<String> {
        // READ COMMITTED on PostgreSQL unless the run takes part in a
        // concurrency group (see `complete_tx`); then SERIALIZABLE, as the
        // group's other runs and jobs are read and changed too.
        let first = write_tx!(self, locked | tx | { complete_tx(self, &mut tx, job_id, epoch, &c, false).await });
        if let Some(r) = first? {
            return r;
        }
        let r = write_tx!(self, |tx| { complete_tx(self, &mut tx, job_id, epoch, &c, true).await });
        r?.expect("a serializable completion decides")
    }

    async fn fence_expired(&self) -> Result<Vec<(String, i64)>> {
        // A cheap read first: the reconciler runs several times a second and
        // must not queue behind (or hold) the writer for nothing.
        let candidates: Vec<(String, i64)> =
            sqlx::query_as(q!("SELECT job_id, epoch FROM attempts WHERE outcome = 'running' \
             AND lease_deadline <= CAST(unixepoch('subsec') * 1000 AS INTEGER) ORDER BY lease_deadline"))
            .fetch_all(&self.reader)
            .await
            .map_err(db_err)?;
        // One transaction per attempt: each locks only its own run (no
        // transaction spans runs or tenants), and rechecks the lease in
        // database time: a heartbeat may have landed since the read.
        let mut fenced = Vec::new();
        for (job_id, epoch) in candidates {
            let done = write_tx!(self, |tx| {
                // A run another transaction holds (a completion racing the
                // lease, another replica's reconciler) is skipped: the next
                // round fences it if it is still expired.
                if !super::try_lock_run_of_job(&mut tx, &job_id).await? {
                    return Ok(false);
                }
                super::lock_job(&mut tx, &job_id).await?;
                let now = now(&mut tx).await?;
                let still: Option<i64> = sqlx::query_scalar(q!(
                    "SELECT epoch FROM attempts WHERE job_id = ? AND epoch = ? AND outcome = 'running' AND lease_deadline <= ?"
                ))
                .bind(&job_id)
                .bind(epoch)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_err)?;
                if still.is_none() {
                    return Ok(false);
                }
                // Fence first: the old epoch can no longer publish...
                end_attempt(
                    &mut tx,
                    &job_id,
                    epoch,
                    AttemptOutcome::Lost,
                    None,
                    Some("lease expired: agent lost"),
                    now,
                )
                .await?;
                append_gap_marker(&mut tx, &job_id, epoch).await?;
                let (job, budget) = load_job(&mut *tx, &job_id).await?;
                if job.current_epoch == epoch && job.status == JobStatus::Running {
                    // ...then authorize a replacement within the budget.
                    fail_or_retry(self, &mut tx, &job, &budget, true, "agent lost (lease expired)", now).await?;
                }
                Ok(true)
            })?;
            if done {
                fenced.push((job_id, epoch));
            }
        }
        Ok(fenced)
    }

    async fn commit_image_digest(&self, job_id: &str, epoch: i64, digest: &str) -> Result<String> {
        write_tx!(self, |tx| {
            super::lock_job(&mut tx, job_id).await?;
            let now = now(&mut tx).await?;
            require_live(&mut tx, job_id, epoch, now).await?;
            let stored: Option<String> = sqlx::query_scalar(q!(
                "UPDATE jobs SET image_digest = COALESCE(image_digest, ?) WHERE id = ? RETURNING image_digest"
            ))
            .bind(digest)
            .bind(job_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err)?;
            Ok(stored.unwrap_or_else(|| digest.to_string()))
        })
    }

    async fn shorten_session_leases(&self, session_id: &str, grace_ms: i64) -> Result<u64> {
        write_tx!(self, |tx| {
            let now = now(&mut tx).await?;
            let res = sqlx::query(q!(
                "UPDATE attempts SET lease_deadline = CASE WHEN lease_deadline < ? THEN lease_deadline ELSE ? END \
             WHERE session_id = ? AND outcome = 'running'"
            ))
            .bind(now + grace_ms)
            .bind(now + grace_ms)
            .bind(session_id)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
            Ok(res.rows_affected())
        })
    }
}

#[async_trait]
impl OutboxStore for StoreImpl {
    async fn pending_outbox(&self, limit: u32) -> Result<Vec<OutboxEvent>> {
        let rows: Vec<(i64, String, i64, String)> =
            sqlx::query_as(q!("SELECT id, job_id, dispatch_generation, class_key FROM outbox \
             WHERE published_at IS NULL AND available_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             ORDER BY id LIMIT ?"))
            .bind(limit as i64)
            .fetch_all(&self.reader)
            .await
            .map_err(db_err)?;
        Ok(rows
            .into_iter()
            .map(|(id, job_id, dispatch_generation, class_key)| OutboxEvent {
                id,
                job_id,
                dispatch_generation,
                class_key,
            })
            .collect())
    }

    async fn mark_published(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(ids).expect("ids");
        sqlx::query(q!("UPDATE outbox SET published_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each(?))"))
        .bind(list)
        .execute(&self.writer)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn ready_jobs(&self) -> Result<Vec<OutboxEvent>> {
        let rows: Vec<(String, i64, String)> =
            sqlx::query_as(q!("SELECT id, dispatch_generation, class_key FROM jobs WHERE status = 'ready' \
             AND COALESCE(next_attempt_at, 0) <= CAST(unixepoch('subsec') * 1000 AS INTEGER)"))
            .fetch_all(&self.reader)
            .await
            .map_err(db_err)?;
        Ok(rows
            .into_iter()
            .map(|(job_id, dispatch_generation, class_key)| OutboxEvent {
                id: 0,
                job_id,
                dispatch_generation,
                class_key,
            })
            .collect())
    }

    async fn ready_wakeups(&self) -> Result<Option<std::sync::Arc<tokio::sync::Notify>>> {
        super::ready_wakeups(self).await
    }
}

#[async_trait]
impl LogStore for StoreImpl {
    async fn append_log_chunk(&self, chunk: NewLogChunk) -> Result<Vec<(String, i64)>> {
        use sha2::{Digest, Sha256};
        if hex::encode(Sha256::digest(&chunk.data)) != chunk.sha256 {
            return Err(StoreError::Invalid("chunk sha256 does not match its bytes".into()));
        }
        if chunk.offset < 0 || chunk.seq < 0 {
            return Err(StoreError::Invalid("negative offset or seq".into()));
        }
        let len = chunk.data.len() as i64;
        write_tx!(self, |tx| {
            // Chunks of a job commit one at a time, so their ids (the SSE cursor)
            // become visible in order.
            super::lock_job(&mut tx, &chunk.job_id).await?;
            let now = now(&mut tx).await?;
            let existing: Option<(i64, String)> = sqlx::query_as(
            q!("SELECT length, sha256 FROM log_chunks WHERE job_id = ? AND epoch = ? AND stream = ? AND byte_offset = ?"),
        )
        .bind(&chunk.job_id)
        .bind(chunk.epoch)
        .bind(&chunk.stream)
        .bind(chunk.offset)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?;
            match existing {
                // An identical retry is accepted even after the attempt ended.
                Some((l, s)) if l == len && s == chunk.sha256 => {}
                Some(_) => {
                    return Err(StoreError::Conflict(format!(
                        "different bytes were already committed at {} offset {}",
                        chunk.stream, chunk.offset
                    )));
                }
                None => {
                    require_live(&mut tx, &chunk.job_id, chunk.epoch, now).await?;
                    // Overlap with a neighbour: only the closest chunks before and after
                    // can overlap (index seeks, not a scan of the stream).
                    let prev_end: Option<i64> = sqlx::query_scalar(q!(
                        "SELECT byte_offset + length FROM log_chunks WHERE job_id = ? AND epoch = ? AND stream = ? \
                     AND byte_offset < ? ORDER BY byte_offset DESC LIMIT 1"
                    ))
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .bind(chunk.offset)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                    let next_start: Option<i64> = sqlx::query_scalar(q!(
                        "SELECT byte_offset FROM log_chunks WHERE job_id = ? AND epoch = ? AND stream = ? \
                     AND byte_offset > ? ORDER BY byte_offset LIMIT 1"
                    ))
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .bind(chunk.offset)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                    let overlap = i64::from(
                        prev_end.is_some_and(|e| e > chunk.offset)
                            || next_start.is_some_and(|n| n < chunk.offset + len),
                    );
                    if overlap > 0 && len > 0 {
                        return Err(StoreError::Conflict(format!(
                            "chunk at {} offset {} overlaps bytes already committed",
                            chunk.stream, chunk.offset
                        )));
                    }
                    sqlx::query(q!(
                        "INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    ))
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .bind(chunk.seq)
                    .bind(chunk.offset)
                    .bind(len)
                    .bind(&chunk.sha256)
                    .bind(&chunk.data)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                    // Advance the contiguous committed offset of this stream.
                    let mut committed: i64 = sqlx::query_scalar(q!(
                        "SELECT committed FROM log_progress WHERE job_id = ? AND epoch = ? AND stream = ?"
                    ))
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?
                    .unwrap_or(0);
                    loop {
                        let next: Option<i64> = sqlx::query_scalar(
                        q!("SELECT length FROM log_chunks WHERE job_id = ? AND epoch = ? AND stream = ? AND byte_offset = ? AND length > 0"),
                    )
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .bind(committed)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db_err)?;
                        match next {
                            Some(l) => committed += l,
                            None => break,
                        }
                    }
                    sqlx::query(q!("INSERT INTO log_progress (job_id, epoch, stream, committed) VALUES (?, ?, ?, ?) \
                     ON CONFLICT (job_id, epoch, stream) DO UPDATE SET committed = excluded.committed"))
                    .bind(&chunk.job_id)
                    .bind(chunk.epoch)
                    .bind(&chunk.stream)
                    .bind(committed)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
                }
            }
            let progress: Vec<(String, i64)> = sqlx::query_as(q!(
                "SELECT stream, committed FROM log_progress WHERE job_id = ? AND epoch = ? ORDER BY stream"
            ))
            .bind(&chunk.job_id)
            .bind(chunk.epoch)
            .fetch_all(&mut *tx)
            .await
            .map_err(db_err)?;
            Ok(progress)
        })
    }

    async fn log_chunks_after(&self, job_id: &str, after_id: i64, limit: u32) -> Result<Vec<LogChunkRecord>> {
        let rows: Vec<(i64, i64, String, i64, Vec<u8>)> = sqlx::query_as(
            q!("SELECT id, epoch, stream, byte_offset, data FROM log_chunks WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?"),
        )
        .bind(job_id)
        .bind(after_id)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)?;
        Ok(rows
            .into_iter()
            .map(|(id, epoch, stream, offset, data)| LogChunkRecord { id, epoch, stream, offset, data })
            .collect())
    }

    async fn logs_to_archive(&self, grace_ms: i64, limit: u32) -> Result<Vec<String>> {
        sqlx::query_scalar(q!(
            "SELECT j.id FROM (SELECT DISTINCT job_id FROM log_chunks) c JOIN jobs j ON j.id = c.job_id \
             WHERE j.status IN ('success', 'failed', 'cancelled', 'skipped') \
               AND j.finished_at IS NOT NULL AND j.finished_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? \
             LIMIT ?"
        ))
        .bind(grace_ms)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)
    }

    async fn record_log_archive(&self, a: &LogArchive) -> Result<()> {
        write_tx!(self, |tx| {
            // The job row first: chunk appends (which lock it) wait for the trim.
            super::lock_job(&mut tx, &a.job_id).await?;
            let held: i64 =
                sqlx::query_scalar(q!("SELECT COUNT(*) FROM log_chunks WHERE job_id = ? AND id BETWEEN ? AND ?"))
                    .bind(&a.job_id)
                    .bind(a.first_id)
                    .bind(a.last_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_err)?;
            if held != a.chunks {
                return Err(StoreError::Conflict(format!(
                    "log of job {} changed while it was archived: {held} chunks in {}..={}, archive holds {}",
                    a.job_id, a.first_id, a.last_id, a.chunks
                )));
            }
            sqlx::query(q!(
                "INSERT INTO log_archives (job_id, first_id, last_id, segment_key, index_key, chunks, bytes, archived_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, CAST(unixepoch('subsec') * 1000 AS INTEGER))"
            ))
            .bind(&a.job_id)
            .bind(a.first_id)
            .bind(a.last_id)
            .bind(&a.segment_key)
            .bind(&a.index_key)
            .bind(a.chunks)
            .bind(a.bytes)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
            sqlx::query(q!("DELETE FROM log_chunks WHERE job_id = ? AND id BETWEEN ? AND ?"))
                .bind(&a.job_id)
                .bind(a.first_id)
                .bind(a.last_id)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            Ok(())
        })
    }

    async fn log_archives(&self, job_id: &str) -> Result<Vec<LogArchive>> {
        let rows: Vec<(String, i64, i64, String, String, i64, i64)> = sqlx::query_as(q!(
            "SELECT job_id, first_id, last_id, segment_key, index_key, chunks, bytes FROM log_archives \
             WHERE job_id = ? ORDER BY first_id"
        ))
        .bind(job_id)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)?;
        Ok(rows
            .into_iter()
            .map(|(job_id, first_id, last_id, segment_key, index_key, chunks, bytes)| LogArchive {
                job_id,
                first_id,
                last_id,
                segment_key,
                index_key,
                chunks,
                bytes,
            })
            .collect())
    }
}
