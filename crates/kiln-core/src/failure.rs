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

/// Why an attempt did not succeed (spec 004's failure classes), recorded on
/// the attempt and matched by a job's `retry: {on: [...]}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureClass {
    /// A step's commands failed (non-zero exit), or the job's definition
    /// could not be run (an image that names no digest, a required output
    /// not sealed).
    StepFailed,
    /// The job (or a step) ran past its `timeout` and was killed (exit 124).
    Timeout,
    /// The job printed nothing for `hang-kill-after` and was killed.
    Hang,
    /// The agent stopped answering (its lease expired) or handed the job
    /// back (drain, preemption, shutdown).
    AgentLost,
    /// The infrastructure failed inside the attempt: checkout, image pull or
    /// build, cache, upload.
    Infra,
    /// The attempt was cancelled. Never retried.
    Cancelled,
}

impl FailureClass {
    pub const ALL: [FailureClass; 6] = [
        FailureClass::StepFailed,
        FailureClass::Timeout,
        FailureClass::Hang,
        FailureClass::AgentLost,
        FailureClass::Infra,
        FailureClass::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::StepFailed => "step_failed",
            FailureClass::Timeout => "timeout",
            FailureClass::Hang => "hang",
            FailureClass::AgentLost => "agent_lost",
            FailureClass::Infra => "infra",
            FailureClass::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Counted against the infrastructure allowance rather than the job's
    /// own `retry: max`.
    pub fn is_infrastructure(self) -> bool {
        matches!(self, FailureClass::AgentLost | FailureClass::Infra)
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of failure classes (`retry: {on: [...]}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassSet(u8);

impl ClassSet {
    /// What `retry: N` retries: the job's own failures.
    pub const OWN: ClassSet = ClassSet(1 << 0 | 1 << 1 | 1 << 2);

    pub fn of(classes: impl IntoIterator<Item = FailureClass>) -> ClassSet {
        ClassSet(classes.into_iter().fold(0, |acc, c| acc | 1 << c as u8))
    }

    pub fn contains(self, c: FailureClass) -> bool {
        self.0 & (1 << c as u8) != 0
    }
}

/// Exit codes 0-255 (`retry: {exit_codes: [...]}`); empty means any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitCodes([u64; 4]);

impl ExitCodes {
    /// `None` when a code is outside 0-255.
    pub fn of(codes: &[i32]) -> Option<ExitCodes> {
        let mut bits = [0u64; 4];
        for &c in codes {
            let c = u8::try_from(c).ok()?;
            bits[usize::from(c / 64)] |= 1 << (c % 64);
        }
        Some(ExitCodes(bits))
    }

    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// Whether a failure with `code` matches: any code when empty, and a
    /// failure without a code only then.
    pub fn admits(&self, code: Option<i32>) -> bool {
        if self.is_empty() {
            return true;
        }
        match code.and_then(|c| u8::try_from(c).ok()) {
            Some(c) => self.0[usize::from(c / 64)] & (1 << (c % 64)) != 0,
            None => false,
        }
    }
}

/// Retries used and allowed, as counted in the job's row.
///
/// The rule: a `cancelled` attempt is never retried. Any other class in
/// `on` (and, for `step_failed`, with an exit code in `exit_codes` when that
/// is set) may be retried up to `max_failure_retries` times; the job's own
/// classes (`step_failed`, `timeout`, `hang`) share that count.
/// Infrastructure classes (`agent_lost`, `infra`) have their own count and
/// are always allowed at least `max_infra_retries` (2 by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    pub failure_used: u32,
    pub infra_used: u32,
    /// The workflow's `retry: max` (or `retry: N`).
    pub max_failure_retries: u32,
    pub max_infra_retries: u32,
    /// The workflow's `retry: on` ([`ClassSet::OWN`] for `retry: N`).
    pub on: ClassSet,
    /// The workflow's `retry: exit_codes`.
    pub exit_codes: ExitCodes,
}

impl RetryBudget {
    /// A budget of `retry: N` with the default infrastructure allowance.
    pub fn new(failure_used: u32, infra_used: u32, max_failure_retries: u32) -> Self {
        RetryBudget {
            failure_used,
            infra_used,
            max_failure_retries,
            max_infra_retries: DEFAULT_INFRA_RETRIES,
            on: ClassSet::OWN,
            exit_codes: ExitCodes::default(),
        }
    }

    /// (used, allowed) for a failure of `class` with `exit_code`.
    pub fn of(&self, class: FailureClass, exit_code: Option<i32>) -> (u32, u32) {
        if class == FailureClass::Cancelled {
            return (self.failure_used, 0);
        }
        let listed =
            self.on.contains(class) && (class != FailureClass::StepFailed || self.exit_codes.admits(exit_code));
        let allowed = if listed { self.max_failure_retries } else { 0 };
        if class.is_infrastructure() {
            (self.infra_used, allowed.max(self.max_infra_retries))
        } else {
            (self.failure_used, allowed)
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
    /// The failed attempt's exit code, for `retry: exit_codes`.
    pub exit_code: Option<i32>,
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
    let (used, allowed) = f.budget.of(f.class, f.exit_code);
    if used < allowed {
        let attempt = used + 1;
        // A lost agent's job goes out again at once: fencing made the old
        // attempt harmless, and the loss says nothing about the job. A job
        // that keeps losing its agents (say, it exhausts their memory)
        // backs off from its second loss on.
        let delay_ms =
            if f.class == FailureClass::AgentLost && attempt == 1 { 0 } else { backoff.delay_ms(attempt, rng) };
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
    use FailureClass::{AgentLost as Lost, Infra, StepFailed as Det};
    use rand::SeedableRng;

    fn budget(failure_used: u32, infra_used: u32, max_failure: u32) -> RetryBudget {
        RetryBudget { max_infra_retries: 3, ..RetryBudget::new(failure_used, infra_used, max_failure) }
    }

    #[test]
    fn classes_round_trip_and_group() {
        for c in FailureClass::ALL {
            assert_eq!(FailureClass::parse(c.as_str()), Some(c));
        }
        assert_eq!(FailureClass::parse("flaky"), None);
        let infra: Vec<_> = FailureClass::ALL.into_iter().filter(|c| c.is_infrastructure()).collect();
        assert_eq!(infra, [FailureClass::AgentLost, FailureClass::Infra]);
    }

    /// The policy table: what `retry:` allows for each class.
    #[test]
    fn policy_allows_per_class_and_exit_code() {
        use FailureClass::*;
        let legacy = RetryBudget::new(0, 0, 2);
        // `retry: 2`: the job's own failures twice, infrastructure at least the default.
        for (class, code, allowed) in [
            (StepFailed, Some(1), 2),
            (Timeout, Some(124), 2),
            (Hang, Some(124), 2),
            (AgentLost, None, 2),
            (Infra, None, 2),
            (Cancelled, None, 0),
        ] {
            assert_eq!(legacy.of(class, code).1, allowed, "{class}");
        }
        // Defaults (no `retry:`): agent_lost and infra twice, nothing else.
        let none = RetryBudget::new(0, 0, 0);
        let allowed: Vec<_> = FailureClass::ALL.into_iter().map(|c| none.of(c, Some(1)).1).collect();
        assert_eq!(allowed, [0, 0, 0, 2, 2, 0]);
        // `retry: {max: 5, on: [timeout, agent_lost], exit_codes: [75]}`.
        let p = RetryBudget {
            on: ClassSet::of([Timeout, AgentLost]),
            exit_codes: ExitCodes::of(&[75]).unwrap(),
            ..RetryBudget::new(1, 1, 5)
        };
        assert_eq!(p.of(StepFailed, Some(75)), (1, 0), "step_failed is not in `on`");
        assert_eq!(p.of(Timeout, Some(124)), (1, 5), "exit codes filter step failures only");
        assert_eq!(p.of(Hang, None), (1, 0));
        assert_eq!(p.of(AgentLost, None), (1, 5));
        assert_eq!(p.of(Infra, None), (1, 2), "infra keeps the default allowance");
        // `on: [step_failed], exit_codes: [75, 255]`.
        let q = RetryBudget {
            on: ClassSet::of([StepFailed]),
            exit_codes: ExitCodes::of(&[75, 255]).unwrap(),
            ..RetryBudget::new(0, 0, 1)
        };
        assert_eq!(q.of(StepFailed, Some(75)).1, 1);
        assert_eq!(q.of(StepFailed, Some(255)).1, 1);
        assert_eq!(q.of(StepFailed, Some(1)).1, 0);
        assert_eq!(q.of(StepFailed, None).1, 0, "a failure without an exit code does not match a list");
        assert!(ExitCodes::of(&[256]).is_none() && ExitCodes::of(&[-1]).is_none());
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
            // A lost agent's job goes out again at once the first time, then backs off.
            (RunStatus::Running, false, Lost, budget(0, 0, 0), None, retry(Lost, 1, 0)),
            (RunStatus::Running, false, Lost, budget(0, 1, 0), None, retry(Lost, 2, 103)),
            (RunStatus::Running, false, Lost, budget(0, 3, 0), None, fail()),
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
                exit_code: Some(1),
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
