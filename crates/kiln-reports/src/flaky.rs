//! Which tests are flaky, decided when a run ends; and a test's flake rate
//! over history.
//!
//! **The rule** (issue 43): a test is flaky in a run when, for the run's
//! commit SHA, it both passed and failed (failed or error): across the
//! runner's own retries inside one attempt (JUnit `flakyFailure`), job
//! retries, and reruns of the run. No statistical wait: one pass and one
//! failure of the same code is the evidence.
//!
//! **Exclusions** — an attempt never counts, for any test, when
//! - its report is missing (the step crashed, the glob matched nothing),
//! - its report is truncated (a cap was hit, a bail-out: outcomes are
//!   unknown for the rest), or
//! - more than half of its executed (not skipped) tests failed: that is an
//!   infrastructure failure (a database down, a full disk), not a flaky
//!   test, and counting it would flag every test that passes elsewhere.
//!
//! The caller gathers the attempts of one SHA (all jobs, all attempts, all
//! reruns that ran that SHA) and calls [`decide`] once the run is terminal;
//! fenced attempts' reports never reach here (bound at completion).

use crate::model::{Outcome, Report, TestId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One attempt's results, as the flaky decision needs them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptResults {
    /// The caller's label for the attempt (e.g. `run/job#attempt`), echoed
    /// in the decision.
    pub attempt: String,
    pub reports: AttemptReports,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "tests")]
pub enum AttemptReports {
    /// The job declared reports and none were found.
    Missing,
    /// A report was truncated (see [`Report::truncated`]).
    Truncated,
    /// Every declared report was read completely.
    Complete(Vec<TestResult>),
}

/// One test's result in one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    pub id: TestId,
    pub outcome: Outcome,
    /// Outcomes of the runner's own earlier tries inside this attempt
    /// (JUnit retry records).
    pub runner_retries: Vec<Outcome>,
}

impl AttemptResults {
    /// From the parsed reports of one attempt (all of its report files);
    /// no reports at all is `Missing`, any truncated one `Truncated`.
    pub fn from_reports(attempt: impl Into<String>, reports: &[Report]) -> AttemptResults {
        let reports = if reports.is_empty() {
            AttemptReports::Missing
        } else if reports.iter().any(|r| r.truncated) {
            AttemptReports::Truncated
        } else {
            AttemptReports::Complete(
                reports
                    .iter()
                    .flat_map(|r| &r.tests)
                    .map(|t| TestResult {
                        id: t.id.clone(),
                        outcome: t.outcome,
                        runner_retries: t.retries.iter().map(|r| r.outcome).collect(),
                    })
                    .collect(),
            )
        };
        AttemptResults { attempt: attempt.into(), reports }
    }
}

/// Why an attempt did not count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    ReportMissing,
    ReportTruncated,
    /// More than half of the executed tests failed.
    MostTestsFailed,
}

impl Exclusion {
    pub fn describe(self) -> &'static str {
        match self {
            Exclusion::ReportMissing => "its test report is missing",
            Exclusion::ReportTruncated => "its test report is truncated",
            Exclusion::MostTestsFailed => {
                "more than half of its tests failed (an infrastructure failure, not a flaky test)"
            }
        }
    }
}

/// A test's verdict for one run (one SHA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Only passes in the counted attempts.
    Passed,
    /// Only failures.
    Failed,
    /// Both: flaky.
    Flaky,
}

/// The decision for one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunDecision {
    /// Every test seen executed (not skipped) in a counted attempt.
    pub verdicts: BTreeMap<TestId, TestTally>,
    /// Attempts that did not count, and why.
    pub excluded: Vec<(String, Exclusion)>,
}

/// How often a test passed and failed in the counted attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestTally {
    pub passes: u32,
    pub failures: u32,
}

impl TestTally {
    pub fn verdict(self) -> Verdict {
        match (self.passes > 0, self.failures > 0) {
            (true, true) => Verdict::Flaky,
            (false, true) => Verdict::Failed,
            _ => Verdict::Passed,
        }
    }
}

impl RunDecision {
    /// The flaky tests, in id order.
    pub fn flaky(&self) -> Vec<&TestId> {
        self.verdicts.iter().filter(|(_, t)| t.verdict() == Verdict::Flaky).map(|(id, _)| id).collect()
    }

    pub fn verdict(&self, id: &TestId) -> Option<Verdict> {
        self.verdicts.get(id).map(|t| t.verdict())
    }
}

/// Decide flakiness for one run from all attempts that ran its SHA.
pub fn decide(attempts: &[AttemptResults]) -> RunDecision {
    let mut d = RunDecision::default();
    for a in attempts {
        let tests = match &a.reports {
            AttemptReports::Missing => {
                d.excluded.push((a.attempt.clone(), Exclusion::ReportMissing));
                continue;
            }
            AttemptReports::Truncated => {
                d.excluded.push((a.attempt.clone(), Exclusion::ReportTruncated));
                continue;
            }
            AttemptReports::Complete(t) => t,
        };
        let executed = tests.iter().filter(|t| t.outcome != Outcome::Skipped).count();
        let failed = tests.iter().filter(|t| t.outcome.is_failure()).count();
        if failed * 2 > executed {
            d.excluded.push((a.attempt.clone(), Exclusion::MostTestsFailed));
            continue;
        }
        for t in tests {
            if t.outcome == Outcome::Skipped {
                continue;
            }
            let tally = d.verdicts.entry(t.id.clone()).or_default();
            for r in &t.runner_retries {
                if r.is_failure() {
                    tally.failures += 1;
                } else if *r == Outcome::Passed {
                    tally.passes += 1;
                }
            }
            if t.outcome.is_failure() {
                tally.failures += 1;
            } else {
                tally.passes += 1;
            }
        }
    }
    d
}

/// A test's flake rate over history (default-branch runs, newest last or
/// in any order): flaky runs over runs in which it was decided at all
/// (`None`: not run, or only in excluded attempts, is left out). `None`
/// when there is no such run.
pub fn flake_rate(history: &[Option<Verdict>]) -> Option<FlakeRate> {
    let runs = history.iter().flatten().count() as u32;
    if runs == 0 {
        return None;
    }
    let flaky = history.iter().flatten().filter(|v| **v == Verdict::Flaky).count() as u32;
    let failed = history.iter().flatten().filter(|v| **v == Verdict::Failed).count() as u32;
    Some(FlakeRate { runs, flaky, failed, rate: f64::from(flaky) / f64::from(runs) })
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlakeRate {
    /// Runs in which the test was decided.
    pub runs: u32,
    /// Of those, flaky.
    pub flaky: u32,
    /// Of those, failed on every counted attempt.
    pub failed: u32,
    /// `flaky / runs`.
    pub rate: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(label: &str, results: &[(&str, Outcome)]) -> AttemptResults {
        AttemptResults {
            attempt: label.into(),
            reports: AttemptReports::Complete(
                results
                    .iter()
                    .map(|(id, o)| TestResult { id: TestId::from(*id), outcome: *o, runner_retries: vec![] })
                    .collect(),
            ),
        }
    }

    use Outcome::*;

    #[test]
    fn passed_and_failed_for_the_same_sha_is_flaky() {
        let d = decide(&[
            attempt("1", &[("a", Failed), ("b", Passed), ("c", Failed), ("d", Passed)]),
            attempt("2", &[("a", Passed), ("b", Passed), ("c", Failed), ("d", Skipped)]),
        ]);
        assert_eq!(d.flaky(), vec![&TestId::from("a")]);
        assert_eq!(d.verdict(&"c".into()), Some(Verdict::Failed));
        assert_eq!(d.verdict(&"b".into()), Some(Verdict::Passed));
        assert!(d.excluded.is_empty());
    }

    #[test]
    fn runner_retries_inside_one_attempt_count() {
        let a = AttemptResults {
            attempt: "1".into(),
            reports: AttemptReports::Complete(vec![
                TestResult { id: "x".into(), outcome: Passed, runner_retries: vec![Failed, Error] },
                TestResult { id: "y".into(), outcome: Failed, runner_retries: vec![Failed] },
            ]),
        };
        let d = decide(&[a]);
        assert_eq!(d.flaky(), vec![&TestId::from("x")]);
        assert_eq!(d.verdicts[&TestId::from("x")], TestTally { passes: 1, failures: 2 });
        assert_eq!(d.verdict(&"y".into()), Some(Verdict::Failed));
    }

    #[test]
    fn missing_truncated_and_mostly_failed_attempts_never_count() {
        let infra = attempt("infra", &[("a", Failed), ("b", Failed), ("c", Passed)]);
        let d = decide(&[
            AttemptResults { attempt: "gone".into(), reports: AttemptReports::Missing },
            AttemptResults { attempt: "cut".into(), reports: AttemptReports::Truncated },
            infra,
            attempt("ok", &[("a", Passed), ("b", Passed), ("c", Passed)]),
        ]);
        assert!(d.flaky().is_empty(), "{d:?}");
        assert_eq!(
            d.excluded,
            vec![
                ("gone".into(), Exclusion::ReportMissing),
                ("cut".into(), Exclusion::ReportTruncated),
                ("infra".into(), Exclusion::MostTestsFailed)
            ]
        );
        // Exactly half failed still counts.
        let d = decide(&[attempt("1", &[("a", Failed), ("b", Passed)]), attempt("2", &[("a", Passed), ("b", Passed)])]);
        assert_eq!(d.flaky(), vec![&TestId::from("a")]);
    }

    #[test]
    fn rate_over_history() {
        use Verdict as V;
        let r = flake_rate(&[Some(V::Passed), Some(V::Flaky), None, Some(V::Failed), Some(V::Flaky)]).unwrap();
        assert_eq!((r.runs, r.flaky, r.failed), (4, 2, 1));
        assert!((r.rate - 0.5).abs() < 1e-9);
        assert!(flake_rate(&[None, None]).is_none());
    }
}
