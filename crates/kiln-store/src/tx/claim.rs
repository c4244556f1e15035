//! The claim (spec 000 §7, invariant 2): one transaction — run active, job
//! ready, dispatch generation matches, predecessors decided, agent
//! compatible, capacity admitted → a new attempt with epoch + 1 and a lease
//! in database time. Duplicate deliveries and retried claim requests are
//! absorbed.
//!
//! Runs at READ COMMITTED on PostgreSQL ([`Isolation::LockedReadCommitted`]).
//! Rules for such transactions (SQLite's single writer serializes
//! everything): a decision reads only rows that the transaction locked before
//! (`FOR UPDATE`, in the order run, job, agent; each statement after a lock
//! reads the newest committed rows), or is rechecked in the `WHERE` of the
//! `UPDATE`/`INSERT` that acts on it. Every such transaction changes the job
//! row it locked, so a SERIALIZABLE transaction that waited for that lock
//! fails with a serialization error and reruns on the new state.
//!
//! Placement (invariant 12) is part of the claim: the run's trust, the
//! job's `image:` and credentials, and the repository's secret pools are read
//! under the run lock; the agent's pool and executor under the agent lock.
//!
//! Fair share (issue 44): a team with a running quota has its row locked
//! and what it holds counted (reservations included) before the attempt is
//! inserted. No virtual time is written here: the dispatcher charges its
//! starts to their teams once a second (`TeamStore::charge_teams`), so the
//! claims of one team never wait for each other on its row.
//!
//! The eligibility rule is kiln-core's [`decide_claim`] (its first checks,
//! [`check_delivery`], run before anything else is read); capacity is
//! admitted by the attempt's insert itself (kiln-core's
//! [`kiln_core::claim::admits`], rechecked in one statement).

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit, terminal_jobs};
use crate::error::{Result, StoreError};
use crate::model::{ClaimInput, ClaimOutcome, ClaimedAttempt, JobRecord, RepoRecord, RunRecord, job_placement};
use crate::rows::{JOB_COLS, RUN_COLS, job_from_row, load_job, load_run, repo_cols, repo_from_row_as, run_from_row};
use crate::store::SqlStore;
use kiln_core::claim::{ClaimAgent, ClaimFacts, ClaimRefusal, Executor, check_delivery, decide_claim, replay_stands};
use kiln_core::{AttemptOutcome, JobStatus, RunStatus};
use std::collections::BTreeMap;

/// `AttemptStore::claim`. The run, the job and the agent are locked in that
/// order before anything is decided, so two claims of one job, or of one
/// agent's capacity, run one after the other and the second sees the first's
/// attempt. Declined: stale, duplicate, not yet due, incompatible or full;
/// misplaced: the agent may never run the job.
pub(crate) async fn claim(store: &SqlStore, req: &ClaimInput) -> Result<ClaimOutcome> {
    store.transaction(Isolation::LockedReadCommitted, req, |tx, req| Box::pin(claim_tx(tx, req))).await
}

async fn claim_tx(tx: &mut Tx, req: &ClaimInput) -> Result<ClaimOutcome> {
    Ok(match claim_rows(tx, req).await? {
        Ok(c) => ClaimOutcome::Claimed(c),
        Err(Some(Refusal::Misplaced(placement, why))) => ClaimOutcome::Misplaced(placement, why),
        Err(Some(Refusal::AtQuota(team, held))) => ClaimOutcome::AtQuota(team, held),
        Err(None) => ClaimOutcome::Declined,
    })
}

enum Refusal {
    Misplaced(kiln_core::claim::JobPlacement, kiln_core::claim::PlacementRefusal),
    AtQuota(String, u32),
}

type Refused = Option<Refusal>;

async fn claim_rows(tx: &mut Tx, req: &ClaimInput) -> Result<std::result::Result<ClaimedAttempt, Refused>> {
    static PREDECESSORS_OPEN: Sql = Sql::new(|d| {
        format!(
            "SELECT COUNT(*) FROM jobs WHERE run_id = $1 AND name IN (SELECT value FROM {names}) \
             AND status NOT IN {terminal}",
            names = d.json_texts(2),
            terminal = terminal_jobs(),
        )
    });
    // The agent, locked, and the database clock read in the same statement.
    static AGENT: Sql = Sql::new(|d| {
        format!(
            "SELECT session_id, max_jobs, name, labels, pool, executor, {now} AS now FROM agents WHERE id = $1{lock}",
            now = d.now_ms,
            lock = d.for_update,
        )
    });
    static ATTEMPT: Sql = Sql::new(|_| {
        format!(
            "INSERT INTO attempts (job_id, epoch, run_id, agent_id, session_id, runner, claim_request_id, \
             lease_deadline, outcome, started_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, {running}, $9 \
             WHERE (SELECT COUNT(*) FROM attempts WHERE session_id = $5 AND outcome = {running}) < $10 \
             ON CONFLICT (claim_request_id) DO NOTHING",
            running = lit(AttemptOutcome::Running)
        )
    });
    static RUNNING: Sql = Sql::new(|_| {
        format!(
            "UPDATE jobs SET status = {running}, current_epoch = $1, next_attempt_at = NULL, \
             started_at = COALESCE(started_at, $2) WHERE id = $3",
            running = lit(JobStatus::Running)
        )
    });
    static RUN_STARTED: Sql = Sql::new(|_| {
        format!(
            "UPDATE runs SET status = {running}, updated_at = $1 WHERE id = $2 AND status = {queued}",
            running = lit(RunStatus::Running),
            queued = lit(RunStatus::Queued),
        )
    });
    let Some((mut run, mut job, prior, repo)) =
        lock_claim_rows(tx, &req.job_id, &req.claim_request_id, req.skip_locked).await?
    else {
        return Ok(Err(None));
    };
    // A retried claim request returns what the first one committed.
    if let Some((job_id, epoch)) = prior {
        return Ok(still_running(tx, &job_id, epoch).await?.ok_or(None));
    }
    if check_delivery(run.status, job.status, job.dispatch_generation, req.dispatch_generation).is_err() {
        return Ok(Err(None));
    }
    // Predecessors decided (defensive: readiness already implies it; which
    // outcomes let the job run is its `if:`, evaluated when it became ready).
    let mut needs_unfinished = 0;
    if !job.needs.is_empty() {
        let open: i64 = tx
            .sql(&PREDECESSORS_OPEN)
            .bind(&job.run_id)
            .bind(serde_json::to_string(&job.needs).expect("names"))
            .scalar()
            .await?;
        needs_unfinished = usize::try_from(open).unwrap_or(usize::MAX);
    }
    // The agent, locked (claims of one agent take its capacity one at a
    // time), and the database clock, read once the run and job locks are held.
    #[allow(clippy::type_complexity)]
    let agent: Option<(String, i64, String, String, String, String, i64)> =
        tx.sql(&AGENT).bind(&req.agent_id).optional().await?;
    let now = match &agent {
        Some(a) => a.6,
        None => now(tx).await?,
    };
    // What the job asks of its agent: the repository's secret pools, read
    // with the run (a change applies to the next claim), and its team's
    // running quota, if it has one (issue 44).
    let ClaimRepo { quota, record: repo } = repo;
    let team = run.team.clone();
    let placement = job_placement(&run, &job, &repo.secret_pools);
    let required: BTreeMap<String, String> = serde_json::from_str(&job.class_key).unwrap_or_default();
    let labels: BTreeMap<String, String> =
        agent.as_ref().and_then(|a| serde_json::from_str(&a.3).ok()).unwrap_or_default();
    let facts = ClaimFacts {
        run: run.status,
        job: job.status,
        dispatch_generation: job.dispatch_generation,
        requested_generation: req.dispatch_generation,
        needs_unfinished,
        next_attempt_at: job.next_attempt_at,
        now,
        current_epoch: job.current_epoch,
        required_labels: &required,
        placement: &placement,
        untrusted: &req.untrusted,
        agent: agent.as_ref().map(|(session, max_jobs, name, _, pool, executor, _)| ClaimAgent {
            session_current: *session == req.session_id,
            labels: &labels,
            name: name.as_str(),
            pool: pool.as_str(),
            executor: Executor::reported(Some(executor.as_str())),
            // Admitted by the attempt's insert below.
            running: None,
            max_jobs: u32::try_from(*max_jobs).unwrap_or(0),
        }),
        lease_ttl_ms: req.lease_ttl_ms,
    };
    let grant = match decide_claim(&facts) {
        Ok(grant) => grant,
        Err(ClaimRefusal::UnknownAgent) => return Err(StoreError::NotFound(format!("agent {}", req.agent_id))),
        Err(ClaimRefusal::SessionReplaced) => {
            return Err(StoreError::StaleEpoch(format!("agent session {} was replaced", req.session_id)));
        }
        Err(ClaimRefusal::Placement(why)) => return Ok(Err(Some(Refusal::Misplaced(placement, why)))),
        Err(_) => return Ok(Err(None)),
    };
    let Some((_, max_jobs, agent_name, ..)) = agent else { unreachable!("a grant names a known agent") };
    // A team with a running quota (issue 44): its row is locked, so claims
    // of it are counted one at a time; the count of what it holds is read
    // after the lock, so it includes every committed claim. Without one,
    // nothing is locked.
    if let Some(max) = quota.and_then(|m| u32::try_from(m).ok()) {
        tx.sql(&LOCK_TEAM).bind(&team).execute().await?;
        let held: i64 = tx.sql(&TEAM_HOLDS).bind(&team).scalar().await?;
        let held = u32::try_from(held).unwrap_or(u32::MAX);
        if held >= max {
            return Ok(Err(Some(Refusal::AtQuota(team, held))));
        }
    }
    // Capacity admission for this agent session and the attempt, in one
    // statement (the count is read after the agent lock).
    let (epoch, deadline) = (grant.epoch, grant.lease_deadline);
    let inserted = tx
        .sql(&ATTEMPT)
        .bind(&job.id)
        .bind(epoch)
        .bind(&job.run_id)
        .bind(&req.agent_id)
        .bind(&req.session_id)
        .bind(&agent_name)
        .bind(&req.claim_request_id)
        .bind(deadline)
        .bind(now)
        .bind(max_jobs)
        .execute()
        .await?;
    if inserted == 0 {
        // Full, or the same claim request committed an attempt concurrently
        // (the insert waited for it): that one stands.
        let prior: Option<(String, i64)> = tx
            .sql("SELECT job_id, epoch FROM attempts WHERE claim_request_id = $1")
            .bind(&req.claim_request_id)
            .optional()
            .await?;
        let Some((job_id, epoch)) = prior else { return Ok(Err(None)) };
        return Ok(still_running(tx, &job_id, epoch).await?.ok_or(None));
    }
    tx.sql(&RUNNING).bind(epoch).bind(now).bind(&job.id).execute().await?;
    if grant.run != run.status {
        tx.sql(&RUN_STARTED).bind(now).bind(&job.run_id).execute().await?;
        run.status = grant.run;
    }
    // The rows as this transaction left them (both are locked).
    job.status = grant.job;
    job.current_epoch = epoch;
    let eligible_wait_ms = job.next_attempt_at.map(|at| (now - at).max(0));
    job.next_attempt_at = None;
    job.started_at = job.started_at.or(Some(now));
    Ok(Ok(ClaimedAttempt {
        run,
        job,
        epoch,
        lease_deadline: deadline,
        eligible_wait_ms,
        started: true,
        repo: Some(repo),
    }))
}

/// Jobs a team holds: running, claimed-but-not-started included (a claim
/// makes its job `running` with a live attempt at once).
static TEAM_HOLDS: Sql = Sql::new(|_| {
    format!(
        "SELECT COUNT(*) FROM jobs j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
         WHERE j.status = {running} AND p.team = $1",
        running = lit(JobStatus::Running)
    )
});

/// Lock a team's row (a team with a running quota): the count of what it
/// holds is then read after every committed claim of it.
static LOCK_TEAM: Sql = Sql::new(|_| "UPDATE teams SET pass = pass WHERE name = $1".to_string());

/// `AttemptStore::claimed_by_request`.
pub(crate) async fn claimed_by_request(
    store: &SqlStore,
    claim_request_id: &str,
    session_id: &str,
) -> Result<Option<ClaimedAttempt>> {
    // Usually there is none: one statement, no transaction. Another
    // session's request id recovers nothing (its assignment is not ours).
    let prior: Option<(String, i64)> = store
        .reader()
        .await?
        .sql("SELECT job_id, epoch FROM attempts WHERE claim_request_id = $1 AND session_id = $2")
        .bind(claim_request_id)
        .bind(session_id)
        .optional()
        .await?;
    let Some((job_id, epoch)) = prior else {
        return Ok(None);
    };
    store.read(&(job_id, epoch), |tx, (job_id, epoch)| Box::pin(still_running(tx, job_id, *epoch))).await
}

/// The attempt `(job, epoch)` a claim request created, if it is still the
/// job's running epoch.
async fn still_running(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<Option<ClaimedAttempt>> {
    let (job, _) = load_job(tx, job_id).await?;
    let run = load_run(tx, &job.run_id).await?;
    let deadline: i64 = tx
        .sql("SELECT lease_deadline FROM attempts WHERE job_id = $1 AND epoch = $2")
        .bind(job_id)
        .bind(epoch)
        .scalar()
        .await?;
    let c = ClaimedAttempt {
        run,
        job,
        epoch,
        lease_deadline: deadline,
        eligible_wait_ms: None,
        started: false,
        repo: None,
    };
    Ok(replay_stands(c.job.status, c.job.current_epoch, epoch).then_some(c))
}

/// The first statements of a claim: the job's run row, locked, then the job
/// row, locked (the spec's order), with the attempt a claim request already
/// committed, if any. `None`: no such job. With `skip_locked`, a run row
/// another transaction holds is `Busy` at once.
async fn lock_claim_rows(
    tx: &mut Tx,
    job_id: &str,
    claim_request_id: &str,
    skip_locked: bool,
) -> Result<Option<(RunRecord, JobRecord, Option<(String, i64)>, ClaimRepo)>> {
    static RUN: Sql = Sql::new(|d| {
        format!(
            "SELECT {RUN_COLS}, {REPO}, {repo} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.id = (SELECT run_id FROM jobs WHERE id = $1){lock}",
            repo = repo_cols("p", "repo_"),
            lock = d.for_update_of_run
        )
    });
    static RUN_SKIP_LOCKED: Sql = Sql::new(|d| {
        format!(
            "SELECT {RUN_COLS}, {REPO}, {repo} FROM runs r JOIN repos p ON p.id = r.repo_id \
             WHERE r.id = (SELECT run_id FROM jobs WHERE id = $1){lock}",
            repo = repo_cols("p", "repo_"),
            lock = d.for_update_of_run_skip_locked
        )
    });
    // The repository (its secret pools are part of the placement) and its
    // team's running quota, read with the run.
    const REPO: &str = "(SELECT t.max_running FROM teams t WHERE t.name = p.team) AS team_quota";
    static JOB: Sql = Sql::new(|d| {
        format!(
            "SELECT {JOB_COLS}, (SELECT a.job_id FROM attempts a WHERE a.claim_request_id = $1) AS prior_job, \
             (SELECT a.epoch FROM attempts a WHERE a.claim_request_id = $1) AS prior_epoch \
             FROM jobs WHERE id = $2{lock}",
            lock = d.for_update
        )
    });
    let sql = if skip_locked { &RUN_SKIP_LOCKED } else { &RUN };
    let Some(row) = tx.sql(sql).bind(job_id).fetch_optional().await? else {
        if skip_locked {
            let exists: Option<String> =
                tx.sql("SELECT id FROM jobs WHERE id = $1").bind(job_id).scalar_optional().await?;
            if exists.is_some() {
                return Err(StoreError::Busy(format!("the run of job {job_id} is locked by another transaction")));
            }
        }
        return Ok(None);
    };
    let run = run_from_row(&row)?;
    let repo = ClaimRepo { quota: row.get("team_quota")?, record: repo_from_row_as(&row, "repo_")? };
    let Some(row) = tx.sql(&JOB).bind(claim_request_id).bind(job_id).fetch_optional().await? else {
        return Ok(None);
    };
    let prior = match (row.get::<Option<String>>("prior_job")?, row.get::<Option<i64>>("prior_epoch")?) {
        (Some(j), Some(e)) => Some((j, e)),
        _ => None,
    };
    Ok(Some((run, job_from_row(&row)?, prior, repo)))
}

/// What a claim reads of the run's repository: the repository and its
/// team's running quota, if it has one.
struct ClaimRepo {
    quota: Option<i64>,
    record: RepoRecord,
}
