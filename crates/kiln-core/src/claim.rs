//! The claim's eligibility (spec 000 §7, invariant 2): run active, job
//! ready, dispatch generation matches, predecessors decided, retry backoff
//! over, the agent's session current, its labels compatible and its
//! capacity free → a new attempt with epoch = previous + 1 and a lease in
//! database time.
//!
//! Invariant protected: a queue delivery never grants ownership by itself;
//! duplicates and stale deliveries are absorbed (refused without effect).

use crate::job::{JobEvent, JobStatus};
use crate::run::{RunEvent, RunStatus};
use std::collections::BTreeMap;

/// The claiming agent, as its (locked) row stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAgent<'a> {
    /// The claim names the agent's current session.
    pub session_current: bool,
    pub labels: &'a BTreeMap<String, String>,
    /// Attempts of the session still running, and how many it may run.
    /// `None`: the caller admits capacity atomically with creating the
    /// attempt (the store's insert counts the session's running attempts in
    /// the same statement, see [`admits`]); the verdict then assumes room.
    pub running: Option<u32>,
    pub max_jobs: u32,
}

/// Everything the claim decides on, read under the run, job and agent locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFacts<'a> {
    pub run: RunStatus,
    pub job: JobStatus,
    pub dispatch_generation: i64,
    /// The generation the delivery carried.
    pub requested_generation: i64,
    /// Needs of the job that have not finished (defensive: readiness already
    /// implies none; which results let it run was its `if:`).
    pub needs_unfinished: usize,
    /// Retry backoff: not claimable before this (database time).
    pub next_attempt_at: Option<i64>,
    pub now: i64,
    pub current_epoch: i64,
    /// The job's `runs-on` labels.
    pub required_labels: &'a BTreeMap<String, String>,
    /// `None`: no such agent.
    pub agent: Option<ClaimAgent<'a>>,
    pub lease_ttl_ms: i64,
}

/// Why a claim is refused, in the order the checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefusal {
    /// The job is not ready (claimed already, finished, pending).
    NotReady,
    /// The delivery carried an older dispatch generation.
    StaleGeneration,
    /// The run is cancelling or finished.
    RunInactive,
    NeedsUnfinished,
    /// Its retry backoff has not passed.
    BackingOff,
    /// An error, not an absorbed delivery: no such agent (404).
    UnknownAgent,
    /// An error: the agent's session was replaced (409 stale).
    SessionReplaced,
    /// The agent lacks a label the job requires.
    Labels,
    /// The agent's session runs as many attempts as it may.
    Capacity,
}

impl ClaimRefusal {
    /// Refusals the caller reports as errors; the others are an absorbed
    /// (stale, duplicate, or not yet admissible) delivery: `Ok(None)`.
    pub fn is_error(self) -> bool {
        matches!(self, ClaimRefusal::UnknownAgent | ClaimRefusal::SessionReplaced)
    }
}

/// A granted claim: the new attempt and the statuses it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimGrant {
    pub epoch: i64,
    pub lease_deadline: i64,
    pub job: JobStatus,
    pub run: RunStatus,
}

/// The checks on the locked run and job alone, in the claim's order: a
/// caller may run them before reading anything else (the predecessors, the
/// agent) and stop there.
pub fn check_delivery(
    run: RunStatus,
    job: JobStatus,
    dispatch_generation: i64,
    requested_generation: i64,
) -> Result<(), ClaimRefusal> {
    if !job.can_claim() {
        return Err(ClaimRefusal::NotReady);
    }
    if dispatch_generation != requested_generation {
        return Err(ClaimRefusal::StaleGeneration);
    }
    if !run.can_claim() {
        return Err(ClaimRefusal::RunInactive);
    }
    Ok(())
}

/// Capacity admission: a session running `running` attempts may start
/// another while it runs fewer than `max_jobs`.
pub fn admits(running: u32, max_jobs: u32) -> bool {
    running < max_jobs
}

/// Every label the job requires, with the same value.
pub fn labels_match(required: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    required.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// The claim rule.
pub fn decide_claim(f: &ClaimFacts<'_>) -> Result<ClaimGrant, ClaimRefusal> {
    check_delivery(f.run, f.job, f.dispatch_generation, f.requested_generation)?;
    if f.needs_unfinished > 0 {
        return Err(ClaimRefusal::NeedsUnfinished);
    }
    if f.next_attempt_at.is_some_and(|t| t > f.now) {
        return Err(ClaimRefusal::BackingOff);
    }
    let agent = f.agent.as_ref().ok_or(ClaimRefusal::UnknownAgent)?;
    if !agent.session_current {
        return Err(ClaimRefusal::SessionReplaced);
    }
    // Compatibility is part of the claim, not only of queue routing.
    if !labels_match(f.required_labels, agent.labels) {
        return Err(ClaimRefusal::Labels);
    }
    if agent.running.is_some_and(|running| !admits(running, agent.max_jobs)) {
        return Err(ClaimRefusal::Capacity);
    }
    let job = f.job.transition(JobEvent::Claimed).expect("a ready job is claimable");
    let run =
        if f.run == RunStatus::Queued { f.run.transition(RunEvent::Started).expect("queued starts") } else { f.run };
    Ok(ClaimGrant { epoch: f.current_epoch + 1, lease_deadline: f.now + f.lease_ttl_ms, job, run })
}

/// A retried claim request (its acknowledgement was lost) returns the
/// attempt it created while that attempt is still the job's running epoch.
pub fn replay_stands(job: JobStatus, current_epoch: i64, claimed_epoch: i64) -> bool {
    current_epoch == claimed_epoch && job == JobStatus::Running
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimRefusal as R;

    #[test]
    fn table() {
        let linux = BTreeMap::from([("os".to_string(), "linux".to_string())]);
        let linux_big =
            BTreeMap::from([("os".to_string(), "linux".to_string()), ("size".to_string(), "big".to_string())]);
        let mac = BTreeMap::from([("os".to_string(), "macos".to_string())]);
        let agent = |labels, running, session_current| ClaimAgent {
            session_current,
            labels,
            running: Some(running),
            max_jobs: 2,
        };
        let base = ClaimFacts {
            run: RunStatus::Running,
            job: JobStatus::Ready,
            dispatch_generation: 3,
            requested_generation: 3,
            needs_unfinished: 0,
            next_attempt_at: Some(900),
            now: 1_000,
            current_epoch: 1,
            required_labels: &linux,
            agent: Some(agent(&linux_big, 1, true)),
            lease_ttl_ms: 30_000,
        };
        let grant = |run| Ok(ClaimGrant { epoch: 2, lease_deadline: 31_000, job: JobStatus::Running, run });
        let rows: Vec<(ClaimFacts, Result<ClaimGrant, ClaimRefusal>)> = vec![
            (base.clone(), grant(RunStatus::Running)),
            (ClaimFacts { run: RunStatus::Queued, ..base.clone() }, grant(RunStatus::Running)),
            (ClaimFacts { job: JobStatus::Running, ..base.clone() }, Err(R::NotReady)),
            (ClaimFacts { job: JobStatus::Pending, ..base.clone() }, Err(R::NotReady)),
            (ClaimFacts { requested_generation: 2, ..base.clone() }, Err(R::StaleGeneration)),
            (ClaimFacts { run: RunStatus::Cancelling, ..base.clone() }, Err(R::RunInactive)),
            (ClaimFacts { run: RunStatus::Failed, ..base.clone() }, Err(R::RunInactive)),
            (ClaimFacts { needs_unfinished: 1, ..base.clone() }, Err(R::NeedsUnfinished)),
            (ClaimFacts { next_attempt_at: Some(1_001), ..base.clone() }, Err(R::BackingOff)),
            (ClaimFacts { next_attempt_at: Some(1_000), ..base.clone() }, grant(RunStatus::Running)),
            (ClaimFacts { agent: None, ..base.clone() }, Err(R::UnknownAgent)),
            // An absorbed delivery is not an error, even from an unknown agent.
            (ClaimFacts { agent: None, requested_generation: 1, ..base.clone() }, Err(R::StaleGeneration)),
            (ClaimFacts { agent: Some(agent(&linux, 0, false)), ..base.clone() }, Err(R::SessionReplaced)),
            (ClaimFacts { agent: Some(agent(&mac, 0, true)), ..base.clone() }, Err(R::Labels)),
            (
                ClaimFacts { required_labels: &linux_big, agent: Some(agent(&linux, 0, true)), ..base.clone() },
                Err(R::Labels),
            ),
            (ClaimFacts { agent: Some(agent(&linux, 2, true)), ..base.clone() }, Err(R::Capacity)),
            // Capacity left to the caller's atomic admission.
            (
                ClaimFacts {
                    agent: Some(ClaimAgent { session_current: true, labels: &linux, running: None, max_jobs: 0 }),
                    ..base.clone()
                },
                grant(RunStatus::Running),
            ),
        ];
        for (facts, want) in rows {
            assert_eq!(decide_claim(&facts), want, "{facts:?}");
        }
        assert!(R::UnknownAgent.is_error() && R::SessionReplaced.is_error() && !R::Capacity.is_error());
    }

    #[test]
    fn delivery_table() {
        // (run, job, generation, requested) → the first refusal
        let rows = [
            (RunStatus::Running, JobStatus::Ready, 2, 2, Ok(())),
            (RunStatus::Queued, JobStatus::Ready, 2, 2, Ok(())),
            (RunStatus::Running, JobStatus::Running, 2, 2, Err(R::NotReady)),
            (RunStatus::Cancelling, JobStatus::Pending, 2, 1, Err(R::NotReady)),
            (RunStatus::Cancelling, JobStatus::Ready, 2, 1, Err(R::StaleGeneration)),
            (RunStatus::Cancelling, JobStatus::Ready, 2, 2, Err(R::RunInactive)),
        ];
        for (run, job, generation, requested, want) in rows {
            assert_eq!(check_delivery(run, job, generation, requested), want, "{run} {job}");
        }
        assert!(admits(1, 2) && !admits(2, 2) && !admits(0, 0));
    }

    #[test]
    fn replay_table() {
        let rows = [
            (JobStatus::Running, 2, 2, true),
            (JobStatus::Running, 3, 2, false),
            (JobStatus::Success, 2, 2, false),
            (JobStatus::Ready, 2, 2, false),
        ];
        for (job, current, claimed, want) in rows {
            assert_eq!(replay_stands(job, current, claimed), want);
        }
    }
}
