//! The shared steps that move a run forward (spec 000 §2, §9; spec 003
//! concurrency groups): make a job ready together with its outbox event
//! (invariant 5), decide the run's pending jobs after a job finished (ready,
//! skipped, or still waiting), hold and release job- and run-level
//! concurrency groups, and finish the run.
//!
//! The decisions are the pure functions [`pending_verdict`] (one pending
//! job) and [`final_status`] (the run); everything else here writes what
//! they decided.

use crate::db::{Exec, Tx};
use crate::dialect::{Sql, active_runs, lit};
use crate::error::{Result, parse_enum};
use crate::model::RunRecord;
use crate::rows::load_run;
use kiln_core::{JobStatus, RunStatus};
use std::collections::HashMap;

/// Make a job ready with a new dispatch generation and write its outbox event
/// in the same transaction (spec 000 §9, invariant 5).
pub(crate) async fn make_ready(tx: &mut Tx, job_id: &str, available_at: i64, now: i64) -> Result<()> {
    static READY: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {ready}, dispatch_generation = dispatch_generation + 1, next_attempt_at = $1 \
             WHERE id = $2 RETURNING dispatch_generation, class_key",
            ready = lit(JobStatus::Ready)
        )
    });
    let (generation, class): (i64, String) = tx.sql(&READY).bind(available_at).bind(job_id).one().await?;
    tx.sql(
        "INSERT INTO outbox (job_id, dispatch_generation, class_key, available_at, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(job_id)
    .bind(generation)
    .bind(class)
    .bind(available_at)
    .bind(now)
    .execute()
    .await?;
    Ok(())
}

/// After a job of `run_id` finished: make pending jobs whose needs all
/// succeeded ready, skip pending jobs downstream of a failure, and finish the
/// run when nothing is left to run.
pub(crate) async fn advance_run(tx: &mut Tx, run_id: &str, now: i64) -> Result<()> {
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
pub(crate) async fn release_job_groups(tx: &mut Tx, now: i64) -> Result<()> {
    static NEXT: Sql = Sql::new(|_| {
        format!(
            "SELECT j.id, j.run_id FROM jobs j JOIN runs r ON r.id = j.run_id \
             WHERE j.group_waiting = 1 AND j.status = {pending} AND NOT EXISTS ( \
               SELECT 1 FROM jobs o WHERE o.concurrency_group = j.concurrency_group AND o.status IN ({ready}, {running})) \
             ORDER BY r.created_at, j.job_index LIMIT 1",
            pending = lit(JobStatus::Pending),
            ready = lit(JobStatus::Ready),
            running = lit(JobStatus::Running),
        )
    });
    loop {
        let next: Option<(String, String)> = tx.sql(&NEXT).optional().await?;
        let Some((job_id, run_id)) = next else { return Ok(()) };
        tx.sql("UPDATE jobs SET group_waiting = 0 WHERE id = $1").bind(&job_id).execute().await?;
        Box::pin(advance_run_inner(tx, &run_id, now)).await?;
    }
}

/// What becomes of one pending job, given the statuses of the run's jobs.
#[derive(Debug, PartialEq)]
pub(crate) enum PendingVerdict {
    /// Its needs are not decided yet: it stays pending.
    Undecided,
    /// It may run; `degraded` says so when it runs on a quorum.
    Run { degraded: Option<String> },
    /// It will never run, and why.
    Skip(String),
}

/// The readiness rule for one pending job (spec 000 §2; `if:`, quorum).
pub(crate) fn pending_verdict(
    run: &RunRecord,
    def: Option<&kiln_workflow::Job>,
    needs: &[String],
    status: &HashMap<String, JobStatus>,
) -> PendingVerdict {
    let all_decided = needs.iter().all(|n| status.get(n).is_some_and(|s| s.is_terminal()));
    // Without `if:`, a job whose needs can no longer all (or a quorum)
    // succeed is skipped at once, even while other needs still run.
    let hopeless = def.is_some_and(|d| d.condition.is_none()) && {
        let lost = needs
            .iter()
            .filter(|n| matches!(status.get(*n), Some(JobStatus::Failed | JobStatus::Cancelled | JobStatus::Skipped)))
            .count();
        let required = def.and_then(|d| d.quorum).map(|q| q as usize).unwrap_or(needs.len());
        needs.len() - lost < required
    };
    if !all_decided && !hopeless {
        return PendingVerdict::Undecided;
    }
    let quorum = def.and_then(|d| d.quorum);
    let ctx = condition_context(run, needs, status, quorum);
    // Without `if:`, a job runs when its needs succeeded (spec 000 §2).
    let expr = def.and_then(|d| d.condition.clone());
    let go = kiln_workflow::eval_condition(expr.as_deref().unwrap_or("success()"), &ctx);
    match (go, &expr) {
        (Ok(true), _) => {
            let ok = needs.iter().filter(|n| status.get(*n) == Some(&JobStatus::Success)).count();
            // Ran on a quorum: say so where users look.
            let degraded = (quorum.is_some() && ok < needs.len())
                .then(|| format!("degraded: {ok} of {} needs succeeded (quorum)", needs.len()));
            PendingVerdict::Run { degraded }
        }
        (Err(e), _) => PendingVerdict::Skip(format!("skipped: its condition could not be evaluated: {e}")),
        (Ok(false), Some(c)) => PendingVerdict::Skip(format!("skipped: condition `{c}` is false")),
        (Ok(false), None) => PendingVerdict::Skip("skipped: a job it needs did not succeed".to_string()),
    }
}

/// The status a run ends with once none of its jobs is active; `None` while
/// one is, or when the run already ended.
pub(crate) fn final_status(run: RunStatus, jobs: &HashMap<String, JobStatus>) -> Option<RunStatus> {
    if jobs.values().any(|s| !s.is_terminal()) || run.is_terminal() {
        return None;
    }
    Some(if run == RunStatus::Cancelling {
        RunStatus::Cancelled
    } else if jobs.values().any(|s| matches!(s, JobStatus::Failed | JobStatus::Cancelled)) {
        RunStatus::Failed
    } else {
        RunStatus::Success
    })
}

/// Decide the run's pending jobs and finish the run if nothing is left.
/// Returns the run as loaded (before this step changed it).
async fn advance_run_inner(tx: &mut Tx, run_id: &str, now: i64) -> Result<RunRecord> {
    let run = load_run(tx, run_id).await?;
    let held: i64 = tx.sql("SELECT held FROM runs WHERE id = $1").bind(run_id).scalar().await?;
    let rows = tx
        .sql("SELECT id, name, status, needs, job_index FROM jobs WHERE run_id = $1 ORDER BY job_index")
        .bind(run_id)
        .fetch_all()
        .await?;
    let mut status: HashMap<String, JobStatus> = HashMap::new();
    let mut jobs = Vec::new();
    for r in &rows {
        let id: String = r.get("id")?;
        let name: String = r.get("name")?;
        let st: JobStatus = parse_enum(r.str("status")?)?;
        let needs: Vec<String> = serde_json::from_str(r.str("needs")?).unwrap_or_default();
        let index: i64 = r.get("job_index")?;
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
            match pending_verdict(&run, def, needs, &status) {
                PendingVerdict::Undecided => {}
                PendingVerdict::Run { degraded } => {
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
                        let ctx = condition_context(&run, needs, &status, def.and_then(|d| d.quorum));
                        let group = kiln_workflow::render_group(&cc.group, &ctx).unwrap_or_else(|_| cc.group.clone());
                        let key = format!("{}:{group}", run.repo_id);
                        if !enter_job_group(tx, id, &key, cc.cancel_in_progress, now).await? {
                            continue; // waits for its concurrency group
                        }
                    }
                    make_ready(tx, id, now, now).await?;
                    status.insert(name.clone(), JobStatus::Ready);
                    if let Some(message) = degraded {
                        tx.sql("UPDATE jobs SET message = $1 WHERE id = $2").bind(message).bind(id).execute().await?;
                    }
                }
                PendingVerdict::Skip(why) => {
                    static SKIP: Sql = Sql::new(|_| {
                        format!(
                            "UPDATE jobs SET status = {skipped}, finished_at = $1, message = $2 WHERE id = $3",
                            skipped = lit(JobStatus::Skipped)
                        )
                    });
                    tx.sql(&SKIP).bind(now).bind(why).bind(id).execute().await?;
                    status.insert(name.clone(), JobStatus::Skipped);
                }
            }
        }
    }
    if let Some(final_status) = final_status(run.status, &status) {
        finish_run(tx, run_id, final_status, None, now).await?;
    }
    Ok(run)
}

/// A job about to become ready joins its concurrency group `key`. Returns
/// false when the group is occupied: the job waits (`group_waiting`), older
/// waiting jobs of the group are superseded (cancelled), and with
/// cancel-in-progress the occupant is stopped (a ready one cancelled, a
/// running one asked to stop).
async fn enter_job_group(tx: &mut Tx, job_id: &str, key: &str, cancel_in_progress: bool, now: i64) -> Result<bool> {
    static OCCUPANTS: Sql = Sql::new(|_| {
        format!(
            "SELECT id, status FROM jobs WHERE concurrency_group = $1 AND id != $2 AND status IN ({ready}, {running})",
            ready = lit(JobStatus::Ready),
            running = lit(JobStatus::Running),
        )
    });
    static WAITING: Sql = Sql::new(|_| {
        format!(
            "SELECT id, run_id FROM jobs WHERE concurrency_group = $1 AND id != $2 AND group_waiting = 1 \
             AND status = {pending}",
            pending = lit(JobStatus::Pending)
        )
    });
    static SUPERSEDE: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, group_waiting = 0, finished_at = $1, message = $2 WHERE id = $3",
            cancelled = lit(JobStatus::Cancelled)
        )
    });
    static CANCEL_READY: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3 RETURNING run_id",
            cancelled = lit(JobStatus::Cancelled)
        )
    });
    tx.sql("UPDATE jobs SET concurrency_group = $1 WHERE id = $2").bind(key).bind(job_id).execute().await?;
    let occupants: Vec<(String, String)> = tx.sql(&OCCUPANTS).bind(key).bind(job_id).all().await?;
    if occupants.is_empty() {
        return Ok(true);
    }
    let superseded: Vec<(String, String)> = tx.sql(&WAITING).bind(key).bind(job_id).all().await?;
    for (other, other_run) in &superseded {
        let why = format!("cancelled: superseded by job {job_id} in concurrency group `{key}`");
        tx.sql(&SUPERSEDE).bind(now).bind(why).bind(other).execute().await?;
        Box::pin(advance_run_inner(tx, other_run, now)).await?;
    }
    if cancel_in_progress {
        let mut still_running = false;
        for (occupant, status) in &occupants {
            if parse_enum::<JobStatus>(status)? == JobStatus::Running {
                still_running = true;
                tx.sql("UPDATE jobs SET cancel_requested = 1 WHERE id = $1").bind(occupant).execute().await?;
            } else {
                let why = format!("cancelled in progress by job {job_id} in concurrency group `{key}`");
                let run: String = tx.sql(&CANCEL_READY).bind(now).bind(why).bind(occupant).scalar().await?;
                Box::pin(advance_run_inner(tx, &run, now)).await?;
            }
        }
        if !still_running {
            return Ok(true);
        }
    }
    tx.sql("UPDATE jobs SET group_waiting = 1, message = $1 WHERE id = $2")
        .bind(format!("waiting for concurrency group `{key}`"))
        .bind(job_id)
        .execute()
        .await?;
    Ok(false)
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

/// Marks a run terminal and lets the next run waiting on its concurrency
/// group start (spec 003: at most one running per group).
pub(crate) async fn finish_run(
    tx: &mut Tx,
    run_id: &str,
    status: RunStatus,
    message: Option<&str>,
    now: i64,
) -> Result<()> {
    tx.sql(
        "UPDATE runs SET status = $1, finished_at = $2, updated_at = $3, held = 0, \
         message = COALESCE($4, message) WHERE id = $5",
    )
    .bind(status.as_str())
    .bind(now)
    .bind(now)
    .bind(message)
    .bind(run_id)
    .execute()
    .await?;
    release_group(tx, run_id, now).await
}

/// If `run_id` belongs to a concurrency group with no active run left, start
/// the oldest run waiting in it.
async fn release_group(tx: &mut Tx, run_id: &str, now: i64) -> Result<()> {
    static BUSY: Sql = Sql::new(|_| {
        format!(
            "SELECT COUNT(*) FROM runs WHERE repo_id = $1 AND concurrency_group = $2 AND held = 0 \
             AND status IN {active}",
            active = active_runs()
        )
    });
    static NEXT: Sql = Sql::new(|_| {
        format!(
            "SELECT id FROM runs WHERE repo_id = $1 AND concurrency_group = $2 AND held = 1 AND status = {queued} \
             ORDER BY created_at, id LIMIT 1",
            queued = lit(RunStatus::Queued)
        )
    });
    let group: Option<(String, Option<String>)> =
        tx.sql("SELECT repo_id, concurrency_group FROM runs WHERE id = $1").bind(run_id).optional().await?;
    let Some((repo_id, Some(group))) = group else { return Ok(()) };
    let busy: i64 = tx.sql(&BUSY).bind(&repo_id).bind(&group).scalar().await?;
    if busy > 0 {
        return Ok(());
    }
    let next: Option<String> = tx.sql(&NEXT).bind(&repo_id).bind(&group).scalar_optional().await?;
    if let Some(next) = next {
        tx.sql("UPDATE runs SET held = 0, updated_at = $1 WHERE id = $2").bind(now).bind(&next).execute().await?;
        Box::pin(advance_run(tx, &next, now)).await?;
    }
    Ok(())
}
