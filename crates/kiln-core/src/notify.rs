//! Notifications on run end (issue 42): which event a finished run is, and
//! whether a subscription wants it. The store calls these inside the
//! transaction that ends the run, so the decision and the outbox row that
//! carries it commit together.

use crate::RunStatus;

/// What a run end is, for a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyEvent {
    /// The run succeeded and the previous conclusive run of the same
    /// workflow on the same branch did too (or there was none).
    Success,
    /// The run succeeded and the previous conclusive run failed.
    Fixed,
    Failure,
    Cancelled,
}

impl NotifyEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Success => "success",
            NotifyEvent::Fixed => "fixed",
            NotifyEvent::Failure => "failure",
            NotifyEvent::Cancelled => "cancelled",
        }
    }
}

/// The events a subscription may name: the four run-end events and
/// `always` (every one of them).
pub const SUBSCRIBABLE: &[&str] = &["failure", "fixed", "success", "cancelled", "always"];

/// The event of a run that ended with `status`, given the status of the
/// previous conclusive (success or failed; cancelled runs are passed over)
/// run of the same workflow on the same branch. `None`: not a run end.
pub fn classify(status: RunStatus, previous: Option<RunStatus>) -> Option<NotifyEvent> {
    Some(match status {
        RunStatus::Success if previous == Some(RunStatus::Failed) => NotifyEvent::Fixed,
        RunStatus::Success => NotifyEvent::Success,
        RunStatus::Failed => NotifyEvent::Failure,
        RunStatus::Cancelled => NotifyEvent::Cancelled,
        RunStatus::Queued | RunStatus::Running | RunStatus::Cancelling => return None,
    })
}

/// Whether a subscription to `events` is sent `event`. A fixed run is a
/// success too: `success` subscribers get it (as `fixed`).
pub fn wants(events: &[String], event: NotifyEvent) -> bool {
    events.iter().any(|e| {
        e == "always" || e == event.as_str() || (event == NotifyEvent::Fixed && e == NotifyEvent::Success.as_str())
    })
}

/// Parse a subscription's event list (`failure,fixed`): known names only,
/// at least one, each once, in the order given.
pub fn parse_events(list: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for e in list.iter().map(|e| e.trim().to_ascii_lowercase()) {
        if e.is_empty() {
            continue;
        }
        if !SUBSCRIBABLE.contains(&e.as_str()) {
            return Err(format!("unknown event `{e}`; use {}", SUBSCRIBABLE.join(", ")));
        }
        if !out.contains(&e) {
            out.push(e);
        }
    }
    if out.is_empty() {
        return Err(format!("no events given; use some of {}", SUBSCRIBABLE.join(", ")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RunStatus::*;

    #[test]
    fn every_end_is_classified_against_the_previous_conclusive_run() {
        let rows: &[(RunStatus, Option<RunStatus>, Option<NotifyEvent>)] = &[
            (Success, None, Some(NotifyEvent::Success)),
            (Success, Some(Success), Some(NotifyEvent::Success)),
            (Success, Some(Failed), Some(NotifyEvent::Fixed)),
            (Failed, None, Some(NotifyEvent::Failure)),
            (Failed, Some(Failed), Some(NotifyEvent::Failure)),
            (Failed, Some(Success), Some(NotifyEvent::Failure)),
            (Cancelled, Some(Failed), Some(NotifyEvent::Cancelled)),
            (Queued, None, None),
            (Running, Some(Failed), None),
            (Cancelling, None, None),
        ];
        for (status, previous, want) in rows {
            assert_eq!(classify(*status, *previous), *want, "{status:?} after {previous:?}");
        }
    }

    #[test]
    fn subscriptions_match_their_events_and_fixed_is_a_success() {
        let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(wants(&s(&["failure", "fixed"]), NotifyEvent::Fixed));
        assert!(wants(&s(&["failure", "fixed"]), NotifyEvent::Failure));
        assert!(!wants(&s(&["failure", "fixed"]), NotifyEvent::Success));
        assert!(!wants(&s(&["failure", "fixed"]), NotifyEvent::Cancelled));
        assert!(wants(&s(&["success"]), NotifyEvent::Fixed));
        assert!(!wants(&s(&["fixed"]), NotifyEvent::Success));
        for e in [NotifyEvent::Success, NotifyEvent::Fixed, NotifyEvent::Failure, NotifyEvent::Cancelled] {
            assert!(wants(&s(&["always"]), e));
        }
    }

    #[test]
    fn event_lists_are_checked() {
        let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_events(&s(&["Failure", " fixed", "failure"])).unwrap(), s(&["failure", "fixed"]));
        assert_eq!(
            parse_events(&s(&["failure", "broken"])).unwrap_err(),
            "unknown event `broken`; use failure, fixed, success, cancelled, always"
        );
        assert!(parse_events(&s(&["", " "])).unwrap_err().starts_with("no events given"));
    }
}
