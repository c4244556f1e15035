//! Job status (contract: `pending|ready|running|success|failed|cancelled|skipped`).
//!
//! pending → ready (all needs succeeded; outbox event written in the same
//! transaction) → running (claim created an attempt) → success | failed |
//! cancelled; running → ready again when an attempt is lost or retried.

use crate::{InvalidTransition, string_enum};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Pending,
    Ready,
    Running,
    Success,
    Failed,
    Cancelled,
    Skipped,
}

string_enum!(JobStatus { Pending => "pending", Ready => "ready", Running => "running", Success => "success", Failed => "failed", Cancelled => "cancelled", Skipped => "skipped" });

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    /// Every predecessor succeeded.
    NeedsMet,
    /// A claim transaction created a new attempt.
    Claimed,
    /// The current attempt completed successfully with its outputs sealed.
    Succeeded,
    /// The current attempt failed and no retry budget is left.
    Failed,
    /// The current attempt failed or was lost and the budget allows another.
    Retry,
    /// The run was cancelled.
    Cancel,
    /// A predecessor failed or was cancelled: this job will never run.
    Skip,
}

impl JobStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Success | Self::Failed | Self::Cancelled | Self::Skipped)
    }

    pub fn can_claim(self) -> bool {
        self == Self::Ready
    }

    /// Not started: cancelling its run (or fail-fast) cancels it at once; a
    /// running job is asked to stop instead.
    pub fn can_cancel_at_once(self) -> bool {
        matches!(self, Self::Pending | Self::Ready)
    }

    /// Holds a matrix `max-parallel` slot or a concurrency group.
    pub fn occupies_slot(self) -> bool {
        matches!(self, Self::Ready | Self::Running)
    }

    /// Finished without success: a need in this state can no longer succeed.
    pub fn is_unsuccessful(self) -> bool {
        matches!(self, Self::Failed | Self::Cancelled | Self::Skipped)
    }

    /// A finished job in this state fails its run (a skipped one does not).
    pub fn fails_run(self) -> bool {
        matches!(self, Self::Failed | Self::Cancelled)
    }

    pub fn transition(self, event: JobEvent) -> Result<JobStatus, InvalidTransition> {
        use JobEvent as E;
        use JobStatus as S;
        Ok(match (self, event) {
            (S::Pending, E::NeedsMet) => S::Ready,
            (S::Ready, E::Claimed) => S::Running,
            (S::Running, E::Succeeded) => S::Success,
            (S::Running | S::Ready, E::Failed) => S::Failed,
            (S::Running, E::Retry) => S::Ready,
            (S::Pending | S::Ready | S::Running, E::Cancel) => S::Cancelled,
            (S::Pending | S::Ready, E::Skip) => S::Skipped,
            (from, ev) => {
                return Err(InvalidTransition { from: from.as_str(), event: ev.name() });
            }
        })
    }
}

impl JobEvent {
    pub const ALL: [JobEvent; 7] = [
        JobEvent::NeedsMet,
        JobEvent::Claimed,
        JobEvent::Succeeded,
        JobEvent::Failed,
        JobEvent::Retry,
        JobEvent::Cancel,
        JobEvent::Skip,
    ];
    fn name(self) -> &'static str {
        match self {
            JobEvent::NeedsMet => "needs_met",
            JobEvent::Claimed => "claimed",
            JobEvent::Succeeded => "succeeded",
            JobEvent::Failed => "failed",
            JobEvent::Retry => "retry",
            JobEvent::Cancel => "cancel",
            JobEvent::Skip => "skip",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards() {
        use JobStatus as S;
        // (status, claim, cancel at once, occupies a slot, unsuccessful, fails the run)
        let rows = [
            (S::Pending, false, true, false, false, false),
            (S::Ready, true, true, true, false, false),
            (S::Running, false, false, true, false, false),
            (S::Success, false, false, false, false, false),
            (S::Failed, false, false, false, true, true),
            (S::Cancelled, false, false, false, true, true),
            (S::Skipped, false, false, false, true, false),
        ];
        for (s, claim, cancel, slot, unsuccessful, fails) in rows {
            let got = (s.can_claim(), s.can_cancel_at_once(), s.occupies_slot(), s.is_unsuccessful(), s.fails_run());
            assert_eq!(got, (claim, cancel, slot, unsuccessful, fails), "{s}");
        }
    }

    #[test]
    fn every_pair() {
        use JobEvent as E;
        use JobStatus as S;
        for s in S::ALL {
            for e in E::ALL {
                let got = s.transition(e).ok();
                let want = match (s, e) {
                    (S::Pending, E::NeedsMet) => Some(S::Ready),
                    (S::Ready, E::Claimed) => Some(S::Running),
                    (S::Running, E::Succeeded) => Some(S::Success),
                    (S::Running | S::Ready, E::Failed) => Some(S::Failed),
                    (S::Running, E::Retry) => Some(S::Ready),
                    (S::Pending | S::Ready | S::Running, E::Cancel) => Some(S::Cancelled),
                    (S::Pending | S::Ready, E::Skip) => Some(S::Skipped),
                    _ => None,
                };
                assert_eq!(got, want, "{s} {e:?}");
                if s.is_terminal() {
                    assert_eq!(got, None, "terminal {s} moved on {e:?}");
                }
            }
        }
    }
}
