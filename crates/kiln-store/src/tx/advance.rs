//! The shared steps that move a run forward (spec 000 §2, §9; spec 003
//! concurrency groups): make a job ready together with its outbox event
//! (invariant 5), decide the run's pending jobs after a job finished (ready,
//! skipped, or still waiting), hold and release job- and run-level
//! concurrency groups, and finish the run.
//!
//! The decisions are kiln-core's ([`kiln_core::advance`] for the run's jobs
//! and its final status, [`kiln_core::groups`] for group entry); this file
//! loads their inputs and writes what they decided.

use crate::db::{Exec, Tx};
use crate::dialect::{Sql, active_runs, lit};
use crate::error::{Result, parse_enum};
use crate::model::RunRecord;
use crate::rows::load_run;
use kiln_core::advance::{
    AdvanceJob, AdvancePass, AdvanceRun, Conditions, ENVIRONMENT_GROUP_PREFIX, GroupRule, JobRules, MatrixRule,
    NeedResult, Verdict,
};
use kiln_core::groups::{GroupAction, decide_group_entry};
use kiln_core::{AttemptOutcome, JobStatus, RunStatus};

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
    let run = load_run(tx, run_id).await?;
    advance_loaded(tx, run, now).await
}

/// [`advance_run`] of a run this transaction loaded after locking its row,
/// and has not changed since (its definition is not read and parsed again).
pub(crate) async fn advance_loaded(tx: &mut Tx, run: RunRecord, now: i64) -> Result<()> {
    advance_known(tx, run, None, now).await
}

/// [`advance_loaded`] with the run's jobs as this transaction knows them
/// (`Some`: the acceptance that just inserted them; they are not read).
pub(crate) async fn advance_known(tx: &mut Tx, run: RunRecord, jobs: Option<Vec<RunJob>>, now: i64) -> Result<()> {
    let run = advance_loaded_inner(tx, run, jobs, now).await?;
    // Only a job in a concurrency group occupies one: a run without job
    // groups frees no slot (and, completing at READ COMMITTED, must not
    // touch other runs' jobs).
    if run.definition.jobs.iter().any(|j| j.concurrency.is_some() || j.environment.is_some()) {
        release_job_groups(tx, now).await?;
    }
    Ok(())
}

/// Job-level concurrency groups: start the oldest job waiting on each group
/// that no job occupies (ready or running) any more. An environment's
/// deploy queue is occupied by other runs' jobs only (a run's deploy jobs
/// share its place).
pub(crate) async fn release_job_groups(tx: &mut Tx, now: i64) -> Result<()> {
    static NEXT: Sql = Sql::new(|_| {
        format!(
            "SELECT j.id, j.run_id FROM jobs j JOIN runs r ON r.id = j.run_id \
             WHERE j.group_waiting = 1 AND j.status = {pending} AND NOT EXISTS ( \
               SELECT 1 FROM jobs o WHERE o.concurrency_group = j.concurrency_group AND o.status IN ({ready}, {running}) \
               AND (o.run_id != j.run_id OR j.concurrency_group NOT LIKE '{env}%')) \
             AND NOT EXISTS ({rollout}) \
             ORDER BY r.created_at, j.job_index LIMIT 1",
            rollout = ROLLOUT.replace("$WHERE", &rollout_where("j.concurrency_group", "j.run_id")),
            pending = lit(JobStatus::Pending),
            ready = lit(JobStatus::Ready),
            running = lit(JobStatus::Running),
            env = ENVIRONMENT_GROUP_PREFIX,
        )
    });
    loop {
        let next: Option<(String, String)> = tx.sql(&NEXT).optional().await?;
        let Some((job_id, run_id)) = next else { return Ok(()) };
        tx.sql("UPDATE jobs SET group_waiting = 0 WHERE id = $1").bind(&job_id).execute().await?;
        Box::pin(advance_run_inner(tx, &run_id, now)).await?;
    }
}

/// A rollout in progress holds its environment's deploy queue between its
/// rings (issue 46): a job of another run waiting for a promotion (baking,
/// measuring, paused) or past it and not yet ended — a later ring, or a
/// command gate's job — occupies the queue `$KEY`, as its running deploy
/// jobs do, until the rollout ends or its gate failed.
const ROLLOUT: &str = "SELECT 1 FROM ring_gates g JOIN jobs o ON o.id = g.job_id WHERE $WHERE";

fn rollout_where(key: &str, run: &str) -> String {
    format!(
        "'{env}' || g.environment = {key} AND g.state != 'failed' AND o.run_id != {run} \
         AND o.status IN ({pending}, {ready}, {running})",
        env = ENVIRONMENT_GROUP_PREFIX,
        pending = lit(JobStatus::Pending),
        ready = lit(JobStatus::Ready),
        running = lit(JobStatus::Running),
    )
}

/// Decide the run's pending jobs and finish the run if nothing is left, as
/// kiln-core's [`AdvancePass`] decides. Returns the run as loaded (before
/// this step changed it).
async fn advance_run_inner(tx: &mut Tx, run_id: &str, now: i64) -> Result<RunRecord> {
    let run = load_run(tx, run_id).await?;
    advance_loaded_inner(tx, run, None, now).await
}

/// A job of a run as the advance pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunJob {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) status: JobStatus,
    pub(crate) needs: Vec<String>,
    pub(crate) index: i64,
}

/// The jobs of `run_id`, in their order.
pub(crate) async fn run_jobs(tx: &mut Tx, run_id: &str) -> Result<Vec<RunJob>> {
    let rows = tx
        .sql("SELECT id, name, status, needs, job_index FROM jobs WHERE run_id = $1 ORDER BY job_index")
        .bind(run_id)
        .fetch_all()
        .await?;
    rows.iter()
        .map(|r| {
            Ok(RunJob {
                id: r.get("id")?,
                name: r.get("name")?,
                status: parse_enum(r.str("status")?)?,
                needs: serde_json::from_str(r.str("needs")?).unwrap_or_default(),
                index: r.get("job_index")?,
            })
        })
        .collect()
}

/// [`advance_run_inner`] of the run as loaded, with its jobs if known.
async fn advance_loaded_inner(tx: &mut Tx, run: RunRecord, known: Option<Vec<RunJob>>, now: i64) -> Result<RunRecord> {
    let run_id = run.id.as_str();
    static SKIP: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {skipped}, finished_at = $1, message = $2 WHERE id = $3",
            skipped = lit(JobStatus::Skipped)
        )
    });
    let rows = match known {
        Some(jobs) => jobs,
        None => run_jobs(tx, run_id).await?,
    };
    let mut ids = Vec::with_capacity(rows.len());
    let mut jobs = Vec::with_capacity(rows.len());
    let mut indices = Vec::with_capacity(rows.len());
    for r in rows {
        indices.push(r.index);
        ids.push(r.id);
        jobs.push(AdvanceJob {
            rules: usize::try_from(r.index).ok().and_then(|i| run.definition.jobs.get(i)).map(job_rules),
            name: r.name,
            status: r.status,
            needs: r.needs,
        });
    }
    // Only a cancelling run waits for its fenced sandboxes (issue 40, item 5).
    let awaiting_release = run.status == RunStatus::Cancelling && awaiting_release(tx, run_id).await?;
    let advance = AdvanceRun {
        status: run.status,
        held: run.held,
        repo_id: run.repo_id.clone(),
        awaiting_release,
        environments: Default::default(),
        refused: Default::default(),
        promotions: Default::default(),
    };
    // `needs.<job>.outputs.<name>` in an `if:` reads what is bound so far.
    let outputs = if run.definition.jobs.iter().any(|j| !j.outputs.is_empty()) {
        crate::tx::outputs::of_run(tx, run_id).await?
    } else {
        crate::tx::outputs::RunOutputs::new()
    };
    let cond = RunConditions(&run, &outputs);
    let (environments, waits) = crate::tx::gates::gates(tx, &run, now).await?;
    let refused = if environments.is_empty() {
        Default::default()
    } else {
        crate::tx::deploy_gate::refusals(tx, &run, &jobs, &indices).await?
    };
    let promotions = crate::tx::promotions::promotions(tx, &run, &ids, &jobs, &indices, now).await?;
    let advance = AdvanceRun { environments, refused, promotions, ..advance };
    // A deploy job becomes ready after its environment's wait.
    let wait_of = |i: usize| -> i64 {
        let index = indices.get(i).and_then(|x| usize::try_from(*x).ok());
        index
            .and_then(|x| run.definition.jobs.get(x))
            .and_then(|j| j.environment.as_ref())
            .and_then(|e| waits.get(&e.name).copied())
            .unwrap_or(0)
    };
    let mut pass = AdvancePass::new(advance, jobs);
    while let Some(verdict) = pass.next_verdict(&cond) {
        match verdict {
            Verdict::Ready { job, note } => {
                make_ready(tx, &ids[job], now + wait_of(job), now).await?;
                if let Some(message) = note {
                    tx.sql("UPDATE jobs SET message = $1 WHERE id = $2")
                        .bind(message)
                        .bind(&ids[job])
                        .execute()
                        .await?;
                }
            }
            Verdict::Skip { job, why } => {
                tx.sql(&SKIP).bind(now).bind(why).bind(&ids[job]).execute().await?;
            }
            Verdict::EnterGroup { job, key, cancel_in_progress, ordered } => {
                let entered = enter_job_group(tx, &ids[job], &key, cancel_in_progress, ordered, now).await?;
                pass.resolve_group(entered);
            }
            Verdict::WaitApproval { job, message } | Verdict::WaitPromotion { job, message } => {
                tx.sql("UPDATE jobs SET message = $1 WHERE id = $2 AND (message IS NULL OR message != $1)")
                    .bind(message)
                    .bind(&ids[job])
                    .execute()
                    .await?;
            }
            Verdict::Reject { job, why } => {
                static REJECT: Sql = Sql::new(|_| {
                    format!(
                        "UPDATE jobs SET status = {cancelled}, finished_at = $1, message = $2 WHERE id = $3",
                        cancelled = lit(JobStatus::Cancelled)
                    )
                });
                tx.sql(&REJECT).bind(now).bind(why).bind(&ids[job]).execute().await?;
            }
            // They stay pending: nothing to write.
            Verdict::WaitMaxParallel { .. } | Verdict::WaitGroup { .. } => {}
            Verdict::Finish(status) => finish_run(tx, run_id, status, None, now).await?,
        }
    }
    Ok(run)
}

/// The parts of a frozen job definition kiln-core's advancement reads.
fn job_rules(def: &kiln_workflow::Job) -> JobRules {
    JobRules {
        condition: def.condition.clone(),
        quorum: def.quorum,
        matrix: def.matrix.as_ref().map(|m| MatrixRule {
            group: m.group.clone(),
            max_parallel: m.max_parallel,
            fail_fast: m.fail_fast,
        }),
        concurrency: match (&def.environment, &def.concurrency) {
            // A deploy job waits in its environment's queue: ordered unless
            // it says `queue: supersede-pending`.
            (Some(env), c) => Some(GroupRule {
                template: String::new(),
                cancel_in_progress: c.as_ref().is_some_and(|c| c.cancel_in_progress),
                ordered: c.as_ref().and_then(|c| c.queue) != Some(kiln_workflow::GroupQueue::SupersedePending),
                environment: Some(env.name.clone()),
            }),
            (None, Some(c)) => Some(GroupRule {
                template: c.group.clone(),
                cancel_in_progress: c.cancel_in_progress,
                ordered: c.queue == Some(kiln_workflow::GroupQueue::Ordered),
                environment: None,
            }),
            (None, None) => None,
        },
        environment: def.environment.as_ref().map(|e| e.name.clone()),
        promotion: def.promotion.is_some(),
    }
}

/// A job about to become ready joins its concurrency group `key` and does
/// what kiln-core's [`decide_group_entry`] says. Returns false when the job
/// waits for its group (`group_waiting`).
async fn enter_job_group(
    tx: &mut Tx,
    job_id: &str,
    key: &str,
    cancel_in_progress: bool,
    ordered: bool,
    now: i64,
) -> Result<bool> {
    // In an environment's deploy queue, the run's own jobs neither occupy
    // its place nor wait behind it.
    static OCCUPANTS: Sql = Sql::new(|_| {
        format!(
            "SELECT id, status FROM jobs WHERE concurrency_group = $1 AND id != $2 AND status IN ({ready}, {running}) \
             AND (run_id != (SELECT run_id FROM jobs WHERE id = $2) OR $1 NOT LIKE '{env}%') \
             UNION SELECT o.id, CASE WHEN o.status = {pending} THEN {ready} ELSE o.status END \
             FROM ring_gates g JOIN jobs o ON o.id = g.job_id WHERE {rollout_cols} \
             ORDER BY 1",
            ready = lit(JobStatus::Ready),
            running = lit(JobStatus::Running),
            pending = lit(JobStatus::Pending),
            env = ENVIRONMENT_GROUP_PREFIX,
            rollout_cols = rollout_where("$1", "(SELECT run_id FROM jobs WHERE id = $2)"),
        )
    });
    static WAITING: Sql = Sql::new(|_| {
        format!(
            "SELECT id, run_id FROM jobs WHERE concurrency_group = $1 AND id != $2 AND group_waiting = 1 \
             AND status = {pending} \
             AND (run_id != (SELECT run_id FROM jobs WHERE id = $2) OR $1 NOT LIKE '{env}%') ORDER BY id",
            pending = lit(JobStatus::Pending),
            env = ENVIRONMENT_GROUP_PREFIX,
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
    let rows: Vec<(String, String)> = tx.sql(&OCCUPANTS).bind(key).bind(job_id).all().await?;
    let mut occupants = Vec::with_capacity(rows.len());
    for (id, status) in rows {
        occupants.push((id, parse_enum::<JobStatus>(&status)?));
    }
    // A free group is entered whoever waits: its waiting jobs are not read
    // (no predicate read for SERIALIZABLE to track).
    let waiting: Vec<(String, String)> =
        if occupants.is_empty() { Vec::new() } else { tx.sql(&WAITING).bind(key).bind(job_id).all().await? };
    let waiting_ids: Vec<String> = waiting.iter().map(|(id, _)| id.clone()).collect();
    let entry = decide_group_entry(job_id, key, cancel_in_progress, ordered, &occupants, &waiting_ids);
    for action in entry.actions {
        match action {
            GroupAction::Supersede { job, why } => {
                tx.sql(&SUPERSEDE).bind(now).bind(why).bind(&job).execute().await?;
                let other_run = &waiting.iter().find(|(id, _)| *id == job).expect("a waiting job").1;
                Box::pin(advance_run_inner(tx, other_run, now)).await?;
            }
            GroupAction::CancelReady { job, why } => {
                let run: String = tx.sql(&CANCEL_READY).bind(now).bind(why).bind(&job).scalar().await?;
                Box::pin(advance_run_inner(tx, &run, now)).await?;
            }
            GroupAction::StopRunning { job } => {
                tx.sql("UPDATE jobs SET cancel_requested = 1 WHERE id = $1").bind(&job).execute().await?;
            }
        }
    }
    if let Some(message) = entry.wait_message {
        tx.sql("UPDATE jobs SET group_waiting = 1, message = $1 WHERE id = $2")
            .bind(message)
            .bind(job_id)
            .execute()
            .await?;
    }
    Ok(entry.enter)
}

/// kiln-core's [`Conditions`] over kiln-workflow's expression language and
/// the frozen run's trigger.
struct RunConditions<'a>(&'a RunRecord, &'a crate::tx::outputs::RunOutputs);

impl RunConditions<'_> {
    /// The context an `if:` is evaluated in: the frozen run's trigger and the
    /// results of the job's needs.
    fn context(&self, needs: &[NeedResult], quorum: Option<u32>) -> kiln_workflow::ConditionContext {
        use kiln_workflow::JobResult;
        let run = self.0;
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
            input_kinds: run.definition.input_kinds(),
            needs_results: needs
                .iter()
                .map(|n| match n {
                    NeedResult::Success => JobResult::Success,
                    NeedResult::Cancelled => JobResult::Cancelled,
                    NeedResult::Skipped => JobResult::Skipped,
                    NeedResult::Failure => JobResult::Failure,
                })
                .collect(),
            run_cancelled: false,
            quorum,
            needs_outputs: self.1.clone(),
            commit: run.commit_context(),
        }
    }
}

impl Conditions for RunConditions<'_> {
    fn eval_if(&self, expr: &str, needs: &[NeedResult], quorum: Option<u32>) -> std::result::Result<bool, String> {
        kiln_workflow::eval_condition(expr, &self.context(needs, quorum))
    }

    fn render_group(&self, template: &str) -> std::result::Result<String, String> {
        // Templates see the trigger only (no status functions).
        kiln_workflow::render_group(template, &self.context(&[], None))
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
    // With what the end has to do next, in the same statement: the run's
    // concurrency group, whether it bound test reports, whether its
    // repository has notifications. Each statement is a round trip.
    let ended: Option<(String, Option<String>, i64, i64)> = tx
        .sql(
            "UPDATE runs SET status = $1, finished_at = $2, updated_at = $3, held = 0, deadline_at = NULL, \
             message = COALESCE($4, message) WHERE id = $5 RETURNING repo_id, concurrency_group, \
             (SELECT COUNT(*) FROM test_attempts t WHERE t.run_id = $5), \
             (SELECT COUNT(*) FROM notifications n JOIN runs r ON r.repo_id = n.repo_id WHERE r.id = $5)",
        )
        .bind(status.as_str())
        .bind(now)
        .bind(now)
        .bind(message)
        .bind(run_id)
        .optional()
        .await?;
    let Some((repo_id, group, tests, subscriptions)) = ended else { return Ok(()) };
    // Issue 43: flaky tests are decided, and the run's tests summed up,
    // with the end itself (before the notifications that may read them).
    if tests > 0 {
        crate::tx::test_reports::on_run_end(tx, run_id, now).await?;
    }
    // Issue 42: the run end's notifications commit with the end itself.
    if subscriptions > 0 {
        crate::tx::notify::enqueue_on_end(tx, run_id, status, now).await?;
    }
    match group {
        Some(group) => release_group(tx, &repo_id, &group, now).await,
        None => Ok(()),
    }
}

/// The run group `group` of `repo_id` lost a run: if no active run is
/// left in it, start the oldest run waiting in it.
async fn release_group(tx: &mut Tx, repo_id: &str, group: &str, now: i64) -> Result<()> {
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
    let busy: i64 = tx.sql(&BUSY).bind(repo_id).bind(group).scalar().await?;
    if busy > 0 {
        return Ok(());
    }
    let next: Option<String> = tx.sql(&NEXT).bind(repo_id).bind(group).scalar_optional().await?;
    if let Some(next) = next {
        tx.sql("UPDATE runs SET held = 0, updated_at = $1 WHERE id = $2").bind(now).bind(&next).execute().await?;
        Box::pin(advance_run(tx, &next, now)).await?;
    }
    Ok(())
}

/// Whether a fenced attempt of `run_id` has a sandbox nobody has confirmed
/// gone.
pub(crate) async fn awaiting_release(tx: &mut Tx, run_id: &str) -> Result<bool> {
    static UNCONFIRMED: Sql = Sql::new(|_| {
        format!(
            "SELECT CAST(1 AS BIGINT) FROM attempts WHERE run_id = $1 AND outcome = {lost} AND released_at IS NULL \
             LIMIT 1",
            lost = lit(AttemptOutcome::Lost)
        )
    });
    Ok(tx.sql(&UNCONFIRMED).bind(run_id).scalar_optional::<i64>().await?.is_some())
}
