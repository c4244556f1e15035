//! Leases and fencing (spec 000 §8, invariants 3 and 6): only the job's
//! current epoch, still running, with an unexpired lease in database time,
//! may heartbeat, publish or complete; an expired lease is fenced (the
//! attempt is `lost`) before a replacement is authorized.
//!
//! Invariant protected: a stale runner may burn CPU; it can never publish.
//! The same rule serves the heartbeat, log chunks, uploads, seals, image
//! digests and completion.

use crate::attempt::AttemptOutcome;
use crate::job::JobStatus;
use crate::run::RunStatus;

/// The attempt row named by `(job, epoch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptLease {
    pub outcome: AttemptOutcome,
    pub lease_deadline: i64,
}

/// Why a call naming `(job, epoch)` is refused (HTTP 409 `stale_epoch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// The job never had that epoch.
    NoSuchEpoch,
    /// A newer epoch replaced it.
    Replaced { current: i64 },
    /// The attempt already ended.
    Ended(AttemptOutcome),
    /// Its lease ran out (fenced or about to be).
    Expired,
}

impl Stale {
    /// The refusal's message, as the store reports it.
    pub fn message(&self, job_id: &str, epoch: i64) -> String {
        match self {
            Stale::NoSuchEpoch => format!("job {job_id} has no attempt with epoch {epoch}"),
            Stale::Replaced { current } => format!("epoch {epoch} of job {job_id} was replaced by epoch {current}"),
            Stale::Ended(outcome) => format!("epoch {epoch} of job {job_id} already ended ({outcome})"),
            Stale::Expired => format!("the lease of epoch {epoch} of job {job_id} expired"),
        }
    }
}

/// Is `epoch` the job's live epoch at `now` (database time)? The checks run
/// in this order, so the reason names the first that fails.
pub fn check_live(epoch: i64, current_epoch: i64, attempt: Option<AttemptLease>, now: i64) -> Result<(), Stale> {
    let a = attempt.ok_or(Stale::NoSuchEpoch)?;
    if epoch != current_epoch {
        return Err(Stale::Replaced { current: current_epoch });
    }
    if !a.outcome.can_publish() {
        return Err(Stale::Ended(a.outcome));
    }
    if a.lease_deadline <= now {
        return Err(Stale::Expired);
    }
    Ok(())
}

/// Whether the holder of a live epoch is told to stop: its run is no longer
/// active (cancelling), or the job alone was asked to stop (fail-fast of a
/// matrix sibling, a concurrency group's cancel-in-progress).
pub fn stop_requested(run: RunStatus, job_cancel_requested: bool) -> bool {
    job_cancel_requested || !run.can_claim()
}

/// The heartbeat's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// Extend the lease to `lease_deadline`; `stop`: tell the holder to stop.
    Extend {
        lease_deadline: i64,
        stop: bool,
    },
    Stale(Stale),
}

/// The heartbeat rule: a live epoch's lease is extended to `now + ttl_ms`.
pub fn decide_heartbeat(
    epoch: i64,
    current_epoch: i64,
    attempt: Option<AttemptLease>,
    run: RunStatus,
    job_cancel_requested: bool,
    now: i64,
    ttl_ms: i64,
) -> LeaseVerdict {
    match check_live(epoch, current_epoch, attempt, now) {
        Ok(()) => {
            LeaseVerdict::Extend { lease_deadline: now + ttl_ms, stop: stop_requested(run, job_cancel_requested) }
        }
        Err(s) => LeaseVerdict::Stale(s),
    }
}

/// The attempt message of a fenced epoch.
pub const LOST_ATTEMPT: &str = "lease expired: agent lost";
/// The failure message (infrastructure class) of a job whose epoch was fenced.
pub const LOST_JOB: &str = "agent lost (lease expired)";

/// After fencing `epoch` (its attempt is now `lost`): does the job's failure
/// rule run? Only when the fenced epoch was the job's running one; a job
/// already decided otherwise is left alone.
pub fn fence_fails_job(job: JobStatus, current_epoch: i64, epoch: i64) -> bool {
    current_epoch == epoch && job == JobStatus::Running
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptOutcome::{Lost, Running, Success};

    fn at(outcome: AttemptOutcome, lease_deadline: i64) -> Option<AttemptLease> {
        Some(AttemptLease { outcome, lease_deadline })
    }

    #[test]
    fn heartbeat_table() {
        let extend = |stop| LeaseVerdict::Extend { lease_deadline: 1_100, stop };
        // (epoch, current, attempt, run, job cancel_requested) → verdict, at now = 1000, ttl 100
        let rows = [
            (2, 2, at(Running, 1_001), RunStatus::Running, false, extend(false)),
            (1, 1, at(Running, 5_000), RunStatus::Queued, false, extend(false)),
            (2, 2, at(Running, 1_001), RunStatus::Cancelling, false, extend(true)),
            (2, 2, at(Running, 1_001), RunStatus::Running, true, extend(true)),
            (3, 2, None, RunStatus::Running, false, LeaseVerdict::Stale(Stale::NoSuchEpoch)),
            (1, 2, at(Lost, 0), RunStatus::Running, false, LeaseVerdict::Stale(Stale::Replaced { current: 2 })),
            // Replaced wins over ended: the first failing check names the reason.
            (1, 2, at(Success, 5_000), RunStatus::Running, false, LeaseVerdict::Stale(Stale::Replaced { current: 2 })),
            (2, 2, at(Success, 5_000), RunStatus::Running, false, LeaseVerdict::Stale(Stale::Ended(Success))),
            (2, 2, at(Running, 1_000), RunStatus::Running, false, LeaseVerdict::Stale(Stale::Expired)),
            (2, 2, at(Running, 999), RunStatus::Cancelling, true, LeaseVerdict::Stale(Stale::Expired)),
        ];
        for (epoch, current, attempt, run, cancel, want) in rows {
            assert_eq!(decide_heartbeat(epoch, current, attempt, run, cancel, 1_000, 100), want, "{epoch} {attempt:?}");
        }
    }

    #[test]
    fn stale_messages() {
        let rows = [
            (Stale::NoSuchEpoch, "job j has no attempt with epoch 3"),
            (Stale::Replaced { current: 4 }, "epoch 3 of job j was replaced by epoch 4"),
            (Stale::Ended(Lost), "epoch 3 of job j already ended (lost)"),
            (Stale::Expired, "the lease of epoch 3 of job j expired"),
        ];
        for (s, want) in rows {
            assert_eq!(s.message("j", 3), want);
        }
    }

    #[test]
    fn fence_table() {
        let rows = [
            (JobStatus::Running, 2, 2, true),
            (JobStatus::Running, 3, 2, false),
            (JobStatus::Cancelled, 2, 2, false),
            (JobStatus::Ready, 2, 2, false),
        ];
        for (job, current, epoch, want) in rows {
            assert_eq!(fence_fails_job(job, current, epoch), want, "{job} {current} {epoch}");
        }
    }
}
