//! Attempt outcome (contract: `running|success|failed|lost|cancelled`).
//!
//! An attempt is one epoch of a job. Only a `running` attempt whose epoch is
//! the job's current epoch and whose lease is live may heartbeat, publish or
//! complete (spec 000 §8, invariant 3).

use crate::{InvalidTransition, string_enum};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Running,
    Success,
    Failed,
    Lost,
    Cancelled,
}

string_enum!(AttemptOutcome { Running => "running", Success => "success", Failed => "failed", Lost => "lost", Cancelled => "cancelled" });

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEvent {
    Succeeded,
    Failed,
    /// Lease expired or the agent vanished: the epoch is fenced.
    Fenced,
    Cancelled,
}

impl AttemptOutcome {
    pub fn is_terminal(self) -> bool {
        self != Self::Running
    }

    /// Heartbeats, log chunks, uploads and completion require a running attempt.
    pub fn can_publish(self) -> bool {
        self == Self::Running
    }

    pub fn transition(self, event: AttemptEvent) -> Result<AttemptOutcome, InvalidTransition> {
        match (self, event) {
            (Self::Running, AttemptEvent::Succeeded) => Ok(Self::Success),
            (Self::Running, AttemptEvent::Failed) => Ok(Self::Failed),
            (Self::Running, AttemptEvent::Fenced) => Ok(Self::Lost),
            (Self::Running, AttemptEvent::Cancelled) => Ok(Self::Cancelled),
            (from, ev) => Err(InvalidTransition {
                from: from.as_str(),
                event: match ev {
                    AttemptEvent::Succeeded => "succeeded",
                    AttemptEvent::Failed => "failed",
                    AttemptEvent::Fenced => "fenced",
                    AttemptEvent::Cancelled => "cancelled",
                },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_moves() {
        for s in AttemptOutcome::ALL {
            for e in [AttemptEvent::Succeeded, AttemptEvent::Failed, AttemptEvent::Fenced, AttemptEvent::Cancelled] {
                assert_eq!(s.transition(e).is_ok(), *s == AttemptOutcome::Running, "{s} {e:?}");
            }
        }
    }
}
