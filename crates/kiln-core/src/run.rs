//! Workflow run status (contract: `queued|running|cancelling|success|failed|cancelled`).

use crate::{InvalidTransition, string_enum};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    Cancelling,
    Success,
    Failed,
    Cancelled,
}

string_enum!(RunStatus { Queued => "queued", Running => "running", Cancelling => "cancelling", Success => "success", Failed => "failed", Cancelled => "cancelled" });

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEvent {
    /// The first attempt of one of its jobs was claimed.
    Started,
    /// Every job finished and every one succeeded (or was skipped by policy).
    AllSucceeded,
    /// A job failed and nothing is running any more.
    Failed,
    /// Cancellation requested while attempts may still run.
    CancelRequested,
    /// Cancellation requested or confirmed with nothing running.
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Success | Self::Failed | Self::Cancelled)
    }

    /// Claims and publication are allowed only while the run is active.
    pub fn can_claim(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    /// A cancellation request acts on the run (a finished or already
    /// cancelling run is left as is).
    pub fn can_cancel(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    pub fn transition(self, event: RunEvent) -> Result<RunStatus, InvalidTransition> {
        use RunEvent as E;
        use RunStatus as S;
        let next = match (self, event) {
            (S::Queued | S::Running, E::Started) => S::Running,
            (S::Queued | S::Running, E::AllSucceeded) => S::Success,
            (S::Queued | S::Running, E::Failed) => S::Failed,
            (S::Queued | S::Running, E::CancelRequested) => S::Cancelling,
            (S::Queued | S::Running | S::Cancelling, E::Cancelled) => S::Cancelled,
            (from, ev) => {
                return Err(InvalidTransition { from: from.as_str(), event: event_name(ev) });
            }
        };
        Ok(next)
    }
}

fn event_name(e: RunEvent) -> &'static str {
    match e {
        RunEvent::Started => "started",
        RunEvent::AllSucceeded => "all_succeeded",
        RunEvent::Failed => "failed",
        RunEvent::CancelRequested => "cancel_requested",
        RunEvent::Cancelled => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_accept_no_event() {
        for s in RunStatus::ALL.iter().copied().filter(|s| s.is_terminal()) {
            for e in [
                RunEvent::Started,
                RunEvent::AllSucceeded,
                RunEvent::Failed,
                RunEvent::CancelRequested,
                RunEvent::Cancelled,
            ] {
                assert!(s.transition(e).is_err(), "{s} accepted {e:?}");
            }
        }
    }

    #[test]
    fn table() {
        use RunEvent as E;
        use RunStatus as S;
        let cases = [
            (S::Queued, E::Started, Some(S::Running)),
            (S::Running, E::AllSucceeded, Some(S::Success)),
            (S::Running, E::Failed, Some(S::Failed)),
            (S::Running, E::CancelRequested, Some(S::Cancelling)),
            (S::Cancelling, E::Cancelled, Some(S::Cancelled)),
            (S::Cancelling, E::Started, None),
            (S::Cancelling, E::AllSucceeded, None),
            (S::Cancelling, E::Failed, None),
        ];
        for (s, e, want) in cases {
            assert_eq!(s.transition(e).ok(), want, "{s} {e:?}");
        }
    }

    #[test]
    fn guards() {
        use RunStatus as S;
        // (status, claim, cancel, terminal)
        let rows = [
            (S::Queued, true, true, false),
            (S::Running, true, true, false),
            (S::Cancelling, false, false, false),
            (S::Success, false, false, true),
            (S::Failed, false, false, true),
            (S::Cancelled, false, false, true),
        ];
        for (s, claim, cancel, terminal) in rows {
            assert_eq!((s.can_claim(), s.can_cancel(), s.is_terminal()), (claim, cancel, terminal), "{s}");
        }
    }

    #[test]
    fn string_roundtrip() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>().unwrap(), *s);
        }
    }
}
