//! What happens to a job whose attempt ended without success (spec 000 §8,
//! invariant 6): retried within its budget after a backoff, failed (and with
//! `fail-fast`, its matrix siblings stopped), or cancelled because
//! cancellation committed first.
//!
//! Invariant protected: retries are counted in the database, per job and per
//! failure class; deterministic failures get only the workflow's `retry:`,
//! infrastructure failures (agent lost, upload failed) a fixed budget; a job
//! of a cancelling run or a fail-fast sibling is never retried.

use crate::backoff::Backoff;
use crate::job::{JobEvent, JobStatus};
use crate::run::RunStatus;
use crate::{InvalidTransition, backoff::DEFAULT_INFRA_RETRIES};
use rand::Rng;

/// Why an attempt did not succeed, for the retry budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The job's own commands failed (non-zero exit, a required output not
    /// sealed): retried only per the workflow's `retry:`.
    Deterministic,
    /// The infrastructure failed (agent lost, upload failed): retried up to
    /// [`RetryBudget::max_infra_retries`].
    Infrastructure,
}

/// Retries used and allowed, as counted in the job's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    pub failure_used: u32,
    pub infra_used: u32,
    /// The workflow's `retry:`.
    pub max_failure_retries: u32,
    pub max_infra_retries: u32,
}

impl RetryBudget {
    /// A budget with the default infrastructure allowance.
    pub fn new(failure_used: u32, infra_used: u32, max_failure_retries: u32) -> Self {
        RetryBudget { failure_used, infra_used, max_failure_retries, max_infra_retries: DEFAULT_INFRA_RETRIES }
    }

    /// (used, allowed) for a class.
    pub fn of(&self, class: FailureClass) -> (u32, u32) {
        match class {
            FailureClass::Deterministic => (self.failure_used, self.max_failure_retries),
            FailureClass::Infrastructure => (self.infra_used, self.max_infra_retries),
        }
    }
}

/// What the failure rule needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureFacts<'a> {
    pub run: RunStatus,
    /// The job alone was asked to stop (fail-fast of a matrix sibling).
    pub cancel_requested: bool,
    pub class: FailureClass,
    pub budget: RetryBudget,
    /// What went wrong (the job's message).
    pub message: &'a str,
    /// The job's matrix group, when the matrix is `fail-fast`.
    pub fail_fast_group: Option<&'a str>,
}

/// The message of a job cancelled with its run (and of the attempt whose
/// completion came after cancellation).
pub const CANCELLED: &str = "cancelled";
/// The message of a job cancelled by fail-fast while it ran.
pub const CANCELLED_BY_FAIL_FAST: &str = "cancelled: fail-fast (a matrix sibling failed)";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureVerdict {
    /// Cancellation committed first: the job is cancelled with message `why`;
    /// then the run is advanced.
    Cancel { why: &'static str },
    /// Count one more retry of `class` and make the job ready again (a new
    /// dispatch generation) available after `delay_ms`, with `message`.
    Retry { class: FailureClass, attempt: u32, delay_ms: u64, message: String },
    /// The job fails with `message`; then the run is advanced.
    Fail { message: String },
    /// The job fails with `message`, its matrix siblings in `group` are
    /// stopped ([`fail_fast_siblings`]), then the run is advanced.
    FailFast { message: String, group: String },
}

impl FailureVerdict {
    /// The job's status after the verdict, from `from` (running, or ready for
    /// a job failed before it ran).
    pub fn job_status(&self, from: JobStatus) -> Result<JobStatus, InvalidTransition> {
        from.transition(match self {
            FailureVerdict::Cancel { .. } => JobEvent::Cancel,
            FailureVerdict::Retry { .. } => JobEvent::Retry,
            FailureVerdict::Fail { .. } | FailureVerdict::FailFast { .. } => JobEvent::Failed,
        })
    }
}

/// The failure rule. `rng` supplies the backoff's jitter (inject a seeded
/// one for exact tests).
pub fn decide_failure(f: &FailureFacts<'_>, backoff: &Backoff, rng: &mut impl Rng) -> FailureVerdict {
    if matches!(f.run, RunStatus::Cancelling | RunStatus::Cancelled) || f.cancel_requested {
        let why = if f.cancel_requested { CANCELLED_BY_FAIL_FAST } else { CANCELLED };
        return FailureVerdict::Cancel { why };
    }
    let (used, allowed) = f.budget.of(f.class);
    if used < allowed {
        let attempt = used + 1;
        let delay_ms = backoff.delay_ms(attempt, rng);
        return FailureVerdict::Retry {
            class: f.class,
            attempt,
            delay_ms,
            message: format!("retrying: {}", f.message),
        };
    }
    let message = f.message.to_string();
    match f.fail_fast_group {
        Some(group) => FailureVerdict::FailFast { message, group: group.to_string() },
        None => FailureVerdict::Fail { message },
    }
}

/// What fail-fast does to one sibling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiblingAction {
    /// Pending or ready: cancelled now, with this message.
    Cancel { why: String },
    /// Running: asked to stop; it ends `cancelled` when it reports or is fenced.
    Stop,
}

/// `fail-fast`: job `failed` of matrix `group` failed. `jobs`: every job of
/// the run as (name, status, matrix group). Returns the siblings it acts on,
/// by index; finished siblings are left alone.
pub fn fail_fast_siblings(
    failed: &str,
    group: &str,
    jobs: &[(&str, JobStatus, Option<&str>)],
) -> Vec<(usize, SiblingAction)> {
    jobs.iter()
        .enumerate()
        .filter(|(_, (name, _, g))| *name != failed && *g == Some(group))
        .filter_map(|(i, (_, status, _))| {
            if status.can_cancel_at_once() {
                Some((i, SiblingAction::Cancel { why: format!("cancelled: fail-fast after `{failed}` failed") }))
            } else {
                (*status == JobStatus::Running).then_some((i, SiblingAction::Stop))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureClass::{Deterministic as Det, Infrastructure as Infra};
    use rand::SeedableRng;

    fn budget(failure_used: u32, infra_used: u32, max_failure: u32) -> RetryBudget {
        RetryBudget { failure_used, infra_used, max_failure_retries: max_failure, max_infra_retries: 3 }
    }

    #[test]
    fn table() {
        let backoff = Backoff { base_ms: 100, max_ms: 1000 };
        let retry = |class, attempt, delay_ms| FailureVerdict::Retry {
            class,
            attempt,
            delay_ms,
            message: "retrying: step exited with code 1".into(),
        };
        let fail = || FailureVerdict::Fail { message: "step exited with code 1".into() };
        // (run, cancel_requested, class, budget, fail-fast group) → verdict; the
        // delays are those of a StdRng seeded with 7: jitter in [ceiling/2, ceiling],
        // ceilings 100, 200, 400 ms for retries 1, 2, 3.
        let rows = [
            (RunStatus::Running, false, Det, budget(0, 0, 0), None, fail()),
            (RunStatus::Running, false, Det, budget(0, 0, 2), None, retry(Det, 1, 51)),
            (RunStatus::Running, false, Det, budget(1, 0, 2), None, retry(Det, 2, 103)),
            (RunStatus::Running, false, Det, budget(2, 0, 2), None, fail()),
            // The infrastructure budget is separate from `retry:`.
            (RunStatus::Running, false, Infra, budget(2, 0, 2), None, retry(Infra, 1, 51)),
            (RunStatus::Queued, false, Infra, budget(0, 2, 0), None, retry(Infra, 3, 206)),
            (RunStatus::Running, false, Infra, budget(0, 3, 5), None, fail()),
            (
                RunStatus::Running,
                false,
                Det,
                budget(0, 0, 0),
                Some("test"),
                FailureVerdict::FailFast { message: "step exited with code 1".into(), group: "test".into() },
            ),
            // A retry left wins over fail-fast.
            (RunStatus::Running, false, Det, budget(0, 0, 1), Some("test"), retry(Det, 1, 51)),
            // Cancellation committed first: never retried.
            (RunStatus::Cancelling, false, Infra, budget(0, 0, 0), None, FailureVerdict::Cancel { why: CANCELLED }),
            (RunStatus::Cancelled, false, Det, budget(0, 0, 3), None, FailureVerdict::Cancel { why: CANCELLED }),
            (
                RunStatus::Running,
                true,
                Det,
                budget(0, 0, 3),
                Some("test"),
                FailureVerdict::Cancel { why: CANCELLED_BY_FAIL_FAST },
            ),
            (
                RunStatus::Cancelling,
                true,
                Det,
                budget(0, 0, 3),
                None,
                FailureVerdict::Cancel { why: CANCELLED_BY_FAIL_FAST },
            ),
        ];
        for (run, cancel_requested, class, budget, group, want) in rows {
            let facts = FailureFacts {
                run,
                cancel_requested,
                class,
                budget,
                message: "step exited with code 1",
                fail_fast_group: group,
            };
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            assert_eq!(decide_failure(&facts, &backoff, &mut rng), want, "{facts:?}");
        }
    }

    #[test]
    fn verdicts_move_a_running_job() {
        let rows = [
            (FailureVerdict::Cancel { why: CANCELLED }, JobStatus::Running, Some(JobStatus::Cancelled)),
            (
                FailureVerdict::Retry { class: Det, attempt: 1, delay_ms: 0, message: String::new() },
                JobStatus::Running,
                Some(JobStatus::Ready),
            ),
            (FailureVerdict::Fail { message: String::new() }, JobStatus::Running, Some(JobStatus::Failed)),
            (FailureVerdict::Fail { message: String::new() }, JobStatus::Success, None),
            (
                FailureVerdict::Retry { class: Det, attempt: 1, delay_ms: 0, message: String::new() },
                JobStatus::Ready,
                None,
            ),
        ];
        for (v, from, want) in rows {
            assert_eq!(v.job_status(from).ok(), want, "{v:?} from {from}");
        }
    }

    #[test]
    fn fail_fast_acts_on_unfinished_siblings_only() {
        use JobStatus::*;
        let jobs = [
            ("test (1)", Failed, Some("test")),
            ("test (2)", Pending, Some("test")),
            ("test (3)", Ready, Some("test")),
            ("test (4)", Running, Some("test")),
            ("test (5)", Success, Some("test")),
            ("lint (1)", Pending, Some("lint")),
            ("build", Running, None),
        ];
        let why = "cancelled: fail-fast after `test (1)` failed".to_string();
        assert_eq!(
            fail_fast_siblings("test (1)", "test", &jobs),
            vec![
                (1, SiblingAction::Cancel { why: why.clone() }),
                (2, SiblingAction::Cancel { why }),
                (3, SiblingAction::Stop),
            ]
        );
    }
}
