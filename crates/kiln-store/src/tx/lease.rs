//! Leases (spec 000 §8, invariants 3 and 6): the heartbeat that extends the
//! current live epoch's lease, the reconciler's fencing of expired leases
//! (the old epoch can no longer publish before a replacement is
//! authorized), and the fast loss detection that shortens a vanished agent
//! session's leases.
//!
//! The rules are kiln-core's ([`kiln_core::lease`]): the live-epoch check,
//! the heartbeat's answer and whether fencing fails the job.

use crate::db::{Exec, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::HeartbeatOutcome;
use crate::rows::load_job;
use crate::store::{SqlStore, lock_job, lock_run_of_job, try_lock_run_of_job};
use crate::tx::attempt::{append_gap_marker, attempt_lease, end_attempt};
use crate::tx::complete::fail_or_retry;
use kiln_core::AttemptOutcome;
use kiln_core::failure::FailureClass;
use kiln_core::lease::{LOST_ATTEMPT, LOST_JOB, LeaseVerdict, decide_heartbeat, fence_fails_job, stop_requested};

/// `AttemptStore::heartbeat`.
pub(crate) async fn heartbeat(
    store: &SqlStore,
    job_id: &str,
    epoch: i64,
    lease_ttl_ms: i64,
) -> Result<HeartbeatOutcome> {
    // The common case in one statement: extend the lease of the current,
    // running, unexpired epoch (the conditions are rechecked on the row as
    // it is updated, so a concurrent fence wins or loses cleanly) and read
    // the cancellation state. No row: the full transaction below says
    // precisely why the heartbeat is refused.
    //
    // One statement, no explicit transaction (one round trip; on PostgreSQL
    // it runs at READ COMMITTED): the `outcome = 'running'` and lease
    // conditions are rechecked on the newest version of the attempt row if a
    // concurrent transaction changed it, and every transaction that ends an
    // attempt (completion, fencing) changes that row, so a heartbeat never
    // revives an ended attempt. An attempt that is running is its job's
    // current epoch (a new epoch is claimed only after the previous attempt
    // ended).
    //
    // On PostgreSQL concurrent heartbeats share one statement (see
    // `postgres::Heartbeats::extend`): the same conditions, rechecked per row.
    if let Some((deadline, cancel, status)) = store.extend_lease(job_id, epoch, lease_ttl_ms).await? {
        let cancel_requested = stop_requested(parse_enum(&status)?, cancel != 0);
        return Ok(HeartbeatOutcome { cancel_requested, lease_deadline: deadline });
    }
    store
        .transaction(Isolation::Serializable, &(job_id, epoch, lease_ttl_ms), |tx, &(job_id, epoch, ttl)| {
            Box::pin(heartbeat_tx(tx, job_id, epoch, ttl))
        })
        .await
}

/// The heartbeat's full path: extends a live lease the fast path missed
/// (rare), or says precisely why the epoch is not live.
async fn heartbeat_tx(tx: &mut Tx, job_id: &str, epoch: i64, lease_ttl_ms: i64) -> Result<HeartbeatOutcome> {
    lock_run_of_job(tx, job_id).await?;
    let now = now(tx).await?;
    let (job, budget) = load_job(tx, job_id).await?;
    let attempt = attempt_lease(tx, job_id, epoch).await?;
    let status: String = tx.sql("SELECT status FROM runs WHERE id = $1").bind(&job.run_id).scalar().await?;
    let verdict = decide_heartbeat(
        epoch,
        job.current_epoch,
        attempt,
        parse_enum(&status)?,
        budget.cancel_requested,
        now,
        lease_ttl_ms,
    );
    match verdict {
        LeaseVerdict::Extend { lease_deadline, stop } => {
            tx.sql("UPDATE attempts SET lease_deadline = $1 WHERE job_id = $2 AND epoch = $3")
                .bind(lease_deadline)
                .bind(job_id)
                .bind(epoch)
                .execute()
                .await?;
            Ok(HeartbeatOutcome { cancel_requested: stop, lease_deadline })
        }
        LeaseVerdict::Stale(stale) => Err(StoreError::StaleEpoch(stale.message(job_id, epoch))),
    }
}

/// `AttemptStore::fence_expired`: the reconciler's round.
pub(crate) async fn fence_expired(store: &SqlStore) -> Result<Vec<(String, i64)>> {
    static EXPIRED: Sql = Sql::new(|d| {
        format!(
            "SELECT job_id, epoch FROM attempts WHERE outcome = {running} AND lease_deadline <= {now} \
             ORDER BY lease_deadline",
            running = lit(AttemptOutcome::Running),
            now = d.now_ms,
        )
    });
    // A cheap read first: the reconciler runs several times a second and
    // must not queue behind (or hold) the writer for nothing.
    let candidates: Vec<(String, i64)> = store.reader().await?.sql(&EXPIRED).all().await?;
    // One transaction per attempt: each locks only its own run (no
    // transaction spans runs or tenants), and rechecks the lease in database
    // time: a heartbeat may have landed since the read.
    let mut fenced = Vec::new();
    for (job_id, epoch) in candidates {
        let done = store
            .transaction(Isolation::Serializable, &(store, job_id.as_str(), epoch), |tx, &(store, job_id, epoch)| {
                Box::pin(fence_tx(store, tx, job_id, epoch))
            })
            .await?;
        if done {
            fenced.push((job_id, epoch));
        }
    }
    Ok(fenced)
}

/// Fence the attempt `(job, epoch)` if its lease is still expired, and
/// authorize a replacement within the budget. `false`: not fenced (the run
/// is held elsewhere, or a heartbeat landed since the read).
async fn fence_tx(store: &SqlStore, tx: &mut Tx, job_id: &str, epoch: i64) -> Result<bool> {
    static STILL_EXPIRED: Sql = Sql::new(|_| {
        format!(
            "SELECT epoch FROM attempts WHERE job_id = $1 AND epoch = $2 AND outcome = {running} \
             AND lease_deadline <= $3",
            running = lit(AttemptOutcome::Running)
        )
    });
    // A run another transaction holds (a completion racing the lease,
    // another replica's reconciler) is skipped: the next round fences it if
    // it is still expired.
    if !try_lock_run_of_job(tx, job_id).await? {
        return Ok(false);
    }
    lock_job(tx, job_id).await?;
    let now = now(tx).await?;
    let still: Option<i64> = tx.sql(&STILL_EXPIRED).bind(job_id).bind(epoch).bind(now).scalar_optional().await?;
    if still.is_none() {
        return Ok(false);
    }
    // Fence first: the old epoch can no longer publish...
    let class = FailureClass::AgentLost;
    let nothing = Default::default();
    end_attempt(tx, job_id, epoch, AttemptOutcome::Lost, None, Some(LOST_ATTEMPT), Some(class), nothing, now).await?;
    // Its sandbox is not known to be gone (issue 40, item 5) unless its
    // agent was removed (the lease of a removed agent's attempt ends at
    // the removal): the operator said the machine is gone.
    tx.sql(
        "UPDATE attempts SET released_at = $1, release_evidence = 'its agent was removed' \
         WHERE job_id = $2 AND epoch = $3 AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.id = attempts.agent_id)",
    )
    .bind(now)
    .bind(job_id)
    .bind(epoch)
    .execute()
    .await?;
    append_gap_marker(tx, job_id, epoch).await?;
    let (job, budget) = load_job(tx, job_id).await?;
    if fence_fails_job(job.status, job.current_epoch, epoch) {
        // ...then authorize a replacement within the budget.
        let run = crate::rows::load_run(tx, &job.run_id).await?;
        fail_or_retry(store, tx, &run, &job, &budget, class, None, LOST_JOB, now).await?;
    }
    Ok(true)
}

/// `AttemptStore::extend_running_leases`: every running attempt whose lease
/// was still live `outage_ms` ago (database time) is moved to at least `now
/// + margin_ms`, never shortened. Leases that had expired before the outage
/// began stay expired (their agents were already silent), and only
/// `running` attempts: a fenced epoch stays fenced.
pub(crate) async fn extend_running_leases(store: &SqlStore, outage_ms: i64, margin_ms: i64) -> Result<u64> {
    static EXTEND: Sql = Sql::new(|_| {
        format!(
            "UPDATE attempts SET lease_deadline = $1 \
             WHERE outcome = {running} AND lease_deadline < $1 AND lease_deadline >= $2",
            running = lit(AttemptOutcome::Running)
        )
    });
    store
        .transaction(Isolation::Serializable, &(outage_ms, margin_ms), |tx, &(outage_ms, margin_ms)| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql(&EXTEND).bind(now + margin_ms).bind(now - outage_ms.max(0)).execute().await
            })
        })
        .await
}

/// `AttemptStore::shorten_session_leases`.
pub(crate) async fn shorten_session_leases(store: &SqlStore, session_id: &str, grace_ms: i64) -> Result<u64> {
    static SHORTEN: Sql = Sql::new(|_| {
        format!(
            "UPDATE attempts SET lease_deadline = CASE WHEN lease_deadline < $1 THEN lease_deadline ELSE $1 END \
             WHERE session_id = $2 AND outcome = {running}",
            running = lit(AttemptOutcome::Running)
        )
    });
    store
        .transaction(Isolation::Serializable, &(session_id, grace_ms), |tx, &(session_id, grace_ms)| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql(&SHORTEN).bind(now + grace_ms).bind(session_id).execute().await
            })
        })
        .await
}
