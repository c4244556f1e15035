//! Cancellation of a run (spec 000 §9): it takes the run lock, records a
//! cancellation version, prevents further claims and publication, and asks
//! running attempts to stop. The run stays `cancelling` while physical
//! termination is unresolved.
//!
//! Invariant protected (invariant 5): cancellation and completion are
//! serialized on the run. If completion commits first, cancellation observes
//! its result (a finished run is left as is); if cancellation commits first,
//! a late completion is rejected (see [`crate::complete`]).

use crate::job::JobStatus;
use crate::run::{RunEvent, RunStatus};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelVerdict {
    /// The run is finished or already cancelling: nothing changes.
    NoOp,
    /// Cancel the jobs at these indexes (pending or ready) with message
    /// [`crate::failure::CANCELLED`], bump the run's cancel version, and move the run to
    /// `run`: `cancelling` while attempts still run (their heartbeats say
    /// stop; each ends `cancelled` when it reports or is fenced) or while
    /// a fenced attempt's sandbox is not confirmed gone, else `cancelled`
    /// (finished now).
    Cancel { jobs: Vec<usize>, run: RunStatus },
}

/// `awaiting_release`: a fenced attempt of the run has not been confirmed
/// gone (issue 40, item 5) — a lapsed lease certifies nothing, so the run
/// is cancelling until it is.
pub fn plan_cancel(run: RunStatus, jobs: &[JobStatus], awaiting_release: bool) -> CancelVerdict {
    if !run.can_cancel() {
        return CancelVerdict::NoOp;
    }
    let cancel: Vec<usize> = jobs.iter().enumerate().filter(|(_, s)| s.can_cancel_at_once()).map(|(i, _)| i).collect();
    let running = jobs.contains(&JobStatus::Running) || awaiting_release;
    let event = if running { RunEvent::CancelRequested } else { RunEvent::Cancelled };
    CancelVerdict::Cancel { jobs: cancel, run: run.transition(event).expect("an active run can be cancelled") }
}

/// What cancelling one job of a run does (issue 42: `POST
/// /v1/workflow-runs/{run}/jobs/{job}/cancel`, `kiln cancel RUN --job
/// NAME`). Serialized on the run like [`plan_cancel`]; the rest of the run
/// goes on: the job's dependents are skipped and the run, once nothing is
/// left, ends `failed` (a cancelled job fails its run, see
/// [`crate::advance`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelJobVerdict {
    /// Pending or ready: `cancelled` now (its outbox event, if any, finds
    /// it no longer ready and is absorbed), then the run advances.
    CancelNow,
    /// Running: its attempt is asked to stop (the heartbeat's
    /// `cancel_requested`); from now on its completion binds nothing and
    /// ends the job `cancelled`, as does fencing its lease (invariant 3:
    /// the stopped attempt can no longer publish).
    Stop,
    /// Already asked to stop: nothing changes (idempotent).
    AlreadyStopping,
    /// Nothing to cancel: the run is not active (finished, or already
    /// cancelling as a whole), or the job has ended.
    Refuse(CancelJobRefusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelJobRefusal {
    RunNotActive(RunStatus),
    JobEnded(JobStatus),
}

pub fn plan_cancel_job(run: RunStatus, job: JobStatus, stop_requested: bool) -> CancelJobVerdict {
    if !run.can_cancel() {
        return CancelJobVerdict::Refuse(CancelJobRefusal::RunNotActive(run));
    }
    if job.is_terminal() {
        return CancelJobVerdict::Refuse(CancelJobRefusal::JobEnded(job));
    }
    if job.can_cancel_at_once() {
        CancelJobVerdict::CancelNow
    } else if stop_requested {
        CancelJobVerdict::AlreadyStopping
    } else {
        CancelJobVerdict::Stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    #[test]
    fn table() {
        let cancel = |jobs: Vec<usize>, run| CancelVerdict::Cancel { jobs, run };
        let rows = [
            (RunStatus::Queued, vec![Ready, Pending, Pending], cancel(vec![0, 1, 2], RunStatus::Cancelled)),
            (RunStatus::Running, vec![Success, Running, Pending, Ready], cancel(vec![2, 3], RunStatus::Cancelling)),
            (RunStatus::Running, vec![Success, Failed, Ready, Skipped], cancel(vec![2], RunStatus::Cancelled)),
            (RunStatus::Running, vec![Running], cancel(vec![], RunStatus::Cancelling)),
            (RunStatus::Cancelling, vec![Running, Pending], CancelVerdict::NoOp),
            (RunStatus::Success, vec![Success], CancelVerdict::NoOp),
            (RunStatus::Cancelled, vec![Cancelled], CancelVerdict::NoOp),
            (RunStatus::Failed, vec![Failed, Skipped], CancelVerdict::NoOp),
        ];
        for (run, jobs, want) in rows {
            assert_eq!(plan_cancel(run, &jobs, false), want, "{run} {jobs:?}");
        }
        // A fenced attempt nobody confirmed gone keeps it cancelling, even
        // with nothing running; a finished run stays as it is.
        for (run, jobs, want) in [
            (RunStatus::Running, vec![Ready, Pending], cancel(vec![0, 1], RunStatus::Cancelling)),
            (RunStatus::Running, vec![Running], cancel(vec![], RunStatus::Cancelling)),
            (RunStatus::Failed, vec![Failed], CancelVerdict::NoOp),
        ] {
            assert_eq!(plan_cancel(run, &jobs, true), want, "{run} {jobs:?} awaiting a release");
        }
    }

    #[test]
    fn cancelling_one_job_covers_every_run_and_job_status() {
        use CancelJobRefusal::*;
        use CancelJobVerdict as V;
        let runs = [
            RunStatus::Queued,
            RunStatus::Running,
            RunStatus::Cancelling,
            RunStatus::Success,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ];
        let jobs = [Pending, Ready, Running, Success, Failed, Cancelled, Skipped];
        for run in runs {
            for job in jobs {
                for stop in [false, true] {
                    let want = match (run, job) {
                        (RunStatus::Cancelling | RunStatus::Success | RunStatus::Failed | RunStatus::Cancelled, _) => {
                            V::Refuse(RunNotActive(run))
                        }
                        (_, Success | Failed | Cancelled | Skipped) => V::Refuse(JobEnded(job)),
                        (_, Pending | Ready) => V::CancelNow,
                        (_, Running) if stop => V::AlreadyStopping,
                        (_, Running) => V::Stop,
                    };
                    assert_eq!(plan_cancel_job(run, job, stop), want, "{run} {job} stop={stop}");
                }
            }
        }
    }
}
