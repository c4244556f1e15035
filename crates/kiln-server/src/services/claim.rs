//! The claim long-poll (spec 000 §7, §15; invariant 2). The dispatch queues
//! only suggest work: each delivery compatible with the agent's labels is
//! tried with the store's claim transaction, which alone decides ownership.
//!
//! Policy, in order:
//! - a claim request id that already created an attempt returns it again
//!   (the agent lost the response and retried);
//! - a stale or duplicate delivery is absorbed (claim says no, job not
//!   ready at that generation) and the next one is tried;
//! - a job still ready but declined (this agent is at capacity) goes back
//!   to the front of its queue for the other agents, and this agent is
//!   answered "nothing" after [`CAPACITY_PAUSE`] rather than spin;
//! - a job this agent may never run (invariant 12: untrusted, `image:`,
//!   secrets of another pool) stays queued with its needs noted, so this
//!   agent and the others like it pass over it, and the next job is tried;
//! - a job whose run another transaction holds (`Busy`) goes to the back
//!   of the queue and the others are tried; met busy twice, the request
//!   pauses [`BUSY_PAUSE`] to give the holder a moment;
//! - a job whose team holds its running quota (the claim transaction
//!   counts it) goes back to its queue and the dispatcher passes over the
//!   team until it has room;
//! - with nothing to try, the request waits for new deliveries until its
//!   `wait_ms` (at most a minute) runs out.

use crate::error::ApiResult;
use crate::services::assignment::Handout;
use crate::services::{agents, assignment};
use crate::state::AppState;
use kiln_api as api;
use kiln_core::JobStatus;
use kiln_core::claim::placement_refusal;
use kiln_store::{ClaimInput, ClaimOutcome, OutboxEvent, StoreError};
use std::collections::HashSet;
use std::time::Duration;

/// Longest a claim request may wait for work.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// How long an agent at capacity waits before it hears "nothing".
pub(crate) const CAPACITY_PAUSE: Duration = Duration::from_millis(500);
/// How long a request that met the same busy job twice waits.
const BUSY_PAUSE: Duration = Duration::from_millis(5);

/// Claim an attempt for `agent_id`'s session, waiting up to `req.wait_ms`
/// for one; `None` when there is nothing for it.
pub(crate) async fn claim(
    state: &AppState,
    agent_id: &str,
    req: &api::ClaimRequest,
) -> ApiResult<Option<api::Assignment>> {
    // The agent, and whether this request was seen before (a retry whose
    // answer was lost), in one read.
    let (agent, seen) = state.store.get_agent_for_claim(agent_id, &req.claim_request_id).await?;
    agents::same_session(&agent, &req.session_id)?;
    // This replica has agents: it takes a share of the offering.
    let _polling = state.dispatcher.poll_started();
    if seen
        && let Some(c) = state.store.claimed_by_request(&req.claim_request_id, &req.session_id).await?
        && let Handout::Assignment(a) = assignment::for_claim(state, &agent, &c).await?
    {
        return Ok(Some(*a));
    }
    let wait = Duration::from_millis(req.wait_ms).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    // Jobs whose run another transaction held when this request tried them.
    let mut busy: HashSet<(String, i64)> = HashSet::new();
    loop {
        // Registered before looking at the queues: a delivery pushed while
        // this request tries the others still wakes it.
        let notified = state.dispatcher.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let policy = &state.config.untrusted;
        let fits = |needs: &kiln_core::claim::JobPlacement| {
            placement_refusal(needs, &agent.name, &agent.pool, agent.executor, policy).is_none()
        };
        while let Some(ev) = state.dispatcher.pop_for(&agent.labels, fits) {
            let input = ClaimInput {
                agent_id: agent.id.clone(),
                session_id: req.session_id.clone(),
                claim_request_id: req.claim_request_id.clone(),
                job_id: ev.job_id.clone(),
                dispatch_generation: ev.dispatch_generation,
                lease_ttl_ms: state.lease_ttl_ms(),
                // Agents of two replicas may claim the same job at the same
                // moment (a spare job, or while the replicas' views of who
                // offers what differ): the loser moves on at once instead
                // of waiting for the winner.
                skip_locked: true,
                untrusted: policy.clone(),
            };
            let team = ev.team.clone();
            let outcome = state.store.claim_placed(input).await;
            match &outcome {
                Ok(ClaimOutcome::Claimed(c)) => state.dispatcher.claimed(&team, c.started),
                _ => state.dispatcher.unclaimed(&team),
            }
            match outcome {
                Ok(ClaimOutcome::AtQuota(team, held)) => {
                    // The team holds its quota (another replica's claims,
                    // or this one's view was behind): its jobs wait, the
                    // others' are tried.
                    state.dispatcher.at_quota(&team, held);
                    state.dispatcher.push_back(ev);
                }
                Ok(ClaimOutcome::Misplaced(needs, why)) => {
                    // Never for this agent: the job waits for one that may
                    // run it; this agent tries the next.
                    tracing::debug!(job = %ev.job_id, agent = %agent.name, ?why, "not placed on this agent");
                    state.dispatcher.note_placement(ev, needs);
                }
                Ok(ClaimOutcome::Claimed(c)) => {
                    if let Some(ms) = c.eligible_wait_ms {
                        state.metrics.dispatch_latency.observe(ms as f64 / 1000.0);
                        state
                            .metrics
                            .queue_wait
                            .with_label_values(&[&c.run.team, &c.run.priority])
                            .observe(ms as f64 / 1000.0);
                    }
                    state.job_changed(&c.job.id);
                    if state.live_agents.session_gone(&req.session_id) {
                        // The agent stopped (drained, preempted, killed)
                        // while this long poll waited: the attempt has no
                        // runner, so its lease gets the loss grace rather
                        // than a full TTL.
                        let grace = state.config.loss_grace.as_millis() as i64;
                        state.store.shorten_session_leases(&req.session_id, grace).await?;
                        tracing::warn!(session = %req.session_id, "claimed for an agent that is gone: lease shortened");
                    }
                    match assignment::for_claim(state, &agent, &c).await? {
                        Handout::Assignment(a) => return Ok(Some(*a)),
                        Handout::Withheld(why) => withheld(state, &c, &why).await?,
                    }
                }
                Ok(ClaimOutcome::Declined) => {
                    if still_ready(state, &ev).await {
                        // This agent is full (the database still counts an
                        // attempt it considers over): hand the job to the
                        // others at once, and answer after a pause.
                        state.dispatcher.push_front(ev);
                        state.dispatcher.notify.notify_waiters();
                        tokio::time::sleep(CAPACITY_PAUSE.min(wait)).await;
                        return Ok(None);
                    }
                    // A duplicate or stale delivery: absorbed.
                }
                Err(StoreError::Busy(_)) => {
                    // By the time this job comes round again, its run is
                    // most likely free (and the job claimed elsewhere).
                    let again = !busy.insert((ev.job_id.clone(), ev.dispatch_generation));
                    state.dispatcher.push_back(ev);
                    if tokio::time::Instant::now() >= deadline {
                        return Ok(None);
                    }
                    if again {
                        busy.clear();
                        tokio::time::sleep(BUSY_PAUSE).await;
                    }
                }
                Err(e) => {
                    state.dispatcher.push_front(ev);
                    return Err(e.into());
                }
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(None);
        }
    }
}

/// The claimed attempt may not run on this agent (its secrets are not for
/// this pool): it fails at once with the reason, as a job failure (running
/// it elsewhere is the operator's decision, not a retry's).
async fn withheld(state: &AppState, c: &kiln_store::ClaimedAttempt, why: &str) -> ApiResult<()> {
    tracing::warn!(run = %c.run.id, job = %c.job.name, epoch = c.epoch, "{why}");
    let done = api::Completion {
        outcome: api::AttemptOutcome::Failed,
        exit_code: None,
        message: Some(why.to_string()),
        infra_failure: false,
        failure_class: None,
        outputs: Default::default(),
        steps: Default::default(),
        telemetry: None,
        sandbox: None,
        quarantined: Vec::new(),
        reports_staged: None,
    };
    crate::services::attempts::complete(state, &c.job.id, c.epoch, done).await.map(|_| ())
}

/// Whether the delivery's job is still ready at its generation (so a "no"
/// from the claim was about this agent, not the job).
async fn still_ready(state: &AppState, ev: &OutboxEvent) -> bool {
    state
        .store
        .get_job(&ev.job_id)
        .await
        .is_ok_and(|j| j.status == JobStatus::Ready && j.dispatch_generation == ev.dispatch_generation)
}
