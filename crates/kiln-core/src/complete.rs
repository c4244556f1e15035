//! The completion transaction's decision (spec 000 §9): a completion of the
//! live epoch (checked first, see [`crate::lease::check_live`]) either
//! confirms a cancellation that committed first, binds the attempt's sealed
//! outputs and succeeds the job, or hands the job to the failure rule
//! ([`crate::failure::decide_failure`]).
//!
//! Invariant protected (invariants 4 and 5): only the completion of the
//! current live epoch binds outputs, and only if every declared output was
//! sealed by that epoch; a completion after cancellation committed never
//! succeeds.

use crate::attempt::{AttemptEvent, AttemptOutcome};
use crate::failure::FailureClass;
use crate::run::RunStatus;

/// The agent's report and the state it lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionFacts<'a> {
    pub run: RunStatus,
    /// The job alone was asked to stop (fail-fast, cancel-in-progress).
    pub cancel_requested: bool,
    pub reported: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub message: Option<&'a str>,
    /// The class the agent reports (`timeout`, `hang`, `infra`, …); none:
    /// `step_failed` (`agent_lost` for a `lost` report).
    pub class: Option<FailureClass>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionVerdict {
    /// Cancellation (of the run, or of this job) committed first: the
    /// attempt ends `cancelled` with message [`crate::failure::CANCELLED`] (it does confirm
    /// the sandbox ended), the job goes through the failure rule (which
    /// cancels it). `accepted`: the agent itself reported `cancelled`, so
    /// the call succeeds with status `cancelled`; otherwise it is refused
    /// (409: the run was cancelled before this completion).
    Cancelled { accepted: bool },
    /// Every declared output must be sealed by this epoch (the first that is
    /// not fails the job, see [`missing_output`]); then bind them, end the
    /// attempt `success`, the job `success` (keeping a quorum's `degraded:`
    /// message, see [`success_message`]), and advance the run.
    Succeed,
    /// End the attempt `failed` with `message`, then the failure rule with `class`.
    Fail { message: String, class: FailureClass },
    /// A completion cannot report `running`.
    Invalid,
}

impl CompletionVerdict {
    /// The outcome the attempt ends with.
    pub fn attempt_outcome(&self) -> Option<AttemptOutcome> {
        let event = match self {
            CompletionVerdict::Cancelled { .. } => AttemptEvent::Cancelled,
            CompletionVerdict::Succeed => AttemptEvent::Succeeded,
            CompletionVerdict::Fail { .. } => AttemptEvent::Failed,
            CompletionVerdict::Invalid => return None,
        };
        Some(AttemptOutcome::Running.transition(event).expect("a live attempt is running"))
    }
}

pub fn decide_completion(f: &CompletionFacts<'_>) -> CompletionVerdict {
    if !f.run.can_claim() || f.cancel_requested {
        return CompletionVerdict::Cancelled { accepted: f.reported == AttemptOutcome::Cancelled };
    }
    match f.reported {
        AttemptOutcome::Success => CompletionVerdict::Succeed,
        // An agent reporting `cancelled` or `lost` of an active run failed.
        AttemptOutcome::Failed | AttemptOutcome::Cancelled | AttemptOutcome::Lost => {
            let message = f.message.map(str::to_string).unwrap_or_else(|| match f.exit_code {
                Some(code) => format!("step exited with code {code}"),
                None => "attempt failed".into(),
            });
            let class = f.class.unwrap_or(if f.reported == AttemptOutcome::Lost {
                FailureClass::AgentLost
            } else {
                FailureClass::StepFailed
            });
            CompletionVerdict::Fail { message, class }
        }
        AttemptOutcome::Running => CompletionVerdict::Invalid,
    }
}

/// The failure message (deterministic class) when a declared output `name`
/// was not sealed by `epoch`: success without its outputs fails explicitly;
/// nothing is substituted from elsewhere.
pub fn missing_output(name: &str, epoch: i64) -> String {
    format!("required artifact `{name}` was not sealed by attempt {epoch}")
}

/// A successful job keeps only a quorum's `degraded:` note as its message.
pub fn success_message(previous: Option<&str>) -> Option<&str> {
    previous.filter(|m| m.starts_with("degraded:"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptOutcome as A;
    use CompletionVerdict as V;
    use FailureClass::{AgentLost as Lost, Infra, StepFailed as Det, Timeout};

    #[test]
    fn table() {
        let fail = |m: &str, class| V::Fail { message: m.to_string(), class };
        // (run, cancel_requested, reported, exit code, message, class) → verdict
        let rows = [
            (RunStatus::Running, false, A::Success, Some(0), None, None, V::Succeed),
            (RunStatus::Queued, false, A::Success, Some(0), Some("ok"), None, V::Succeed),
            (RunStatus::Running, false, A::Failed, Some(2), None, None, fail("step exited with code 2", Det)),
            (RunStatus::Running, false, A::Failed, None, None, None, fail("attempt failed", Det)),
            (
                RunStatus::Running,
                false,
                A::Failed,
                None,
                Some("upload failed"),
                Some(Infra),
                fail("upload failed", Infra),
            ),
            (
                RunStatus::Running,
                false,
                A::Failed,
                Some(124),
                Some("timed out"),
                Some(Timeout),
                fail("timed out", Timeout),
            ),
            (RunStatus::Running, false, A::Cancelled, Some(137), None, None, fail("step exited with code 137", Det)),
            (RunStatus::Running, false, A::Lost, None, None, None, fail("attempt failed", Lost)),
            (RunStatus::Running, false, A::Running, None, None, None, V::Invalid),
            // Cancellation committed first.
            (RunStatus::Cancelling, false, A::Success, Some(0), None, None, V::Cancelled { accepted: false }),
            (RunStatus::Cancelling, false, A::Cancelled, None, None, None, V::Cancelled { accepted: true }),
            (RunStatus::Running, true, A::Failed, Some(1), None, None, V::Cancelled { accepted: false }),
            (RunStatus::Running, true, A::Cancelled, None, None, None, V::Cancelled { accepted: true }),
        ];
        for (run, cancel_requested, reported, exit_code, message, class, want) in rows {
            let f = CompletionFacts { run, cancel_requested, reported, exit_code, message, class };
            assert_eq!(decide_completion(&f), want, "{f:?}");
        }
    }

    #[test]
    fn attempt_outcomes() {
        assert_eq!(V::Cancelled { accepted: true }.attempt_outcome(), Some(A::Cancelled));
        assert_eq!(V::Succeed.attempt_outcome(), Some(A::Success));
        assert_eq!(V::Fail { message: String::new(), class: Det }.attempt_outcome(), Some(A::Failed));
        assert_eq!(V::Invalid.attempt_outcome(), None);
    }

    #[test]
    fn messages() {
        assert_eq!(missing_output("app", 2), "required artifact `app` was not sealed by attempt 2");
        assert_eq!(
            success_message(Some("degraded: 2 of 3 needs succeeded (quorum)")),
            Some("degraded: 2 of 3 needs succeeded (quorum)")
        );
        assert_eq!(success_message(Some("retrying: step exited with code 1")), None);
        assert_eq!(success_message(None), None);
    }
}
