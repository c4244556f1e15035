//! Counting measurements into a verdict ([`GateTally`], pure) and the loop
//! that takes them on schedule ([`run_gate`]).
//!
//! The tally is separate from the loop so that a caller that persists
//! measurements (to survive a server restart) can rebuild the tally from
//! them and carry on; and so that the rules are tested without a clock.

use std::future::Future;
use std::time::Duration;

use crate::gate::{PrometheusGate, plural};
use crate::measure::{Measurement, measure};

/// Where a gate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateState {
    /// More measurements are needed.
    Measuring,
    /// All measurements were taken and at most `failure_limit` failed.
    Passed,
    /// More than `failure_limit` measurements failed.
    Failed,
}

/// The end of a gate.
#[derive(Debug, Clone, PartialEq)]
pub struct GateVerdict {
    pub passed: bool,
    /// Every measurement taken, in order.
    pub measurements: Vec<Measurement>,
    /// Why, in words: `3 of 3 measurements met `result < 0.05`` or `2
    /// measurements failed (limit 1): result = 0.31 does not meet …`.
    pub reason: String,
}

/// The pure counting rules of a gate: a measurement fails or succeeds; the
/// gate fails at the first failure beyond `failure_limit` and passes when
/// [`PrometheusGate::measurement_count`] measurements were taken without
/// that. Measurements recorded after the gate is decided are ignored.
#[derive(Debug, Clone)]
pub struct GateTally {
    condition: String,
    expected: u32,
    failure_limit: u32,
    failed: u32,
    measurements: Vec<Measurement>,
}

impl GateTally {
    pub fn new(gate: &PrometheusGate) -> GateTally {
        GateTally {
            condition: gate.success.to_string(),
            expected: gate.measurement_count(),
            failure_limit: gate.failure_limit,
            failed: 0,
            measurements: Vec::new(),
        }
    }

    /// Counts one measurement and says where the gate stands after it.
    pub fn record(&mut self, measurement: Measurement) -> GateState {
        if self.state() != GateState::Measuring {
            return self.state();
        }
        if !measurement.ok {
            self.failed += 1;
        }
        self.measurements.push(measurement);
        self.state()
    }

    pub fn state(&self) -> GateState {
        if self.failed > self.failure_limit {
            GateState::Failed
        } else if self.taken() >= self.expected {
            GateState::Passed
        } else {
            GateState::Measuring
        }
    }

    /// How many measurements were counted.
    pub fn taken(&self) -> u32 {
        u32::try_from(self.measurements.len()).unwrap_or(u32::MAX)
    }

    pub fn measurements(&self) -> &[Measurement] {
        &self.measurements
    }

    /// The verdict. While still measuring (a gate stopped early, e.g. by a
    /// cancelled deployment) it is a failure that says how far it got.
    pub fn into_verdict(self) -> GateVerdict {
        let state = self.state();
        let met = self.taken() - self.failed;
        let reason = match state {
            GateState::Passed if self.failed == 0 => {
                format!("{met} of {} measurement{} met `{}`", self.expected, plural(self.expected), self.condition)
            }
            GateState::Passed => format!(
                "{met} of {} measurement{} met `{}`; {} failed (limit {})",
                self.expected,
                plural(self.expected),
                self.condition,
                self.failed,
                self.failure_limit
            ),
            GateState::Failed => format!(
                "{} measurement{} failed (limit {}): {}",
                self.failed,
                plural(self.failed),
                self.failure_limit,
                self.measurements.iter().rev().find(|m| !m.ok).map_or("", |m| m.message.as_str())
            ),
            GateState::Measuring => format!(
                "the gate stopped after {} of {} measurement{} ({} failed, limit {})",
                self.taken(),
                self.expected,
                plural(self.expected),
                self.failed,
                self.failure_limit
            ),
        };
        GateVerdict { passed: state == GateState::Passed, measurements: self.measurements, reason }
    }
}

/// Runs a gate to its verdict: a first measurement at once, then one every
/// `interval` (measured from the start, so slow answers do not stretch the
/// schedule), until the gate passes or fails (see [`GateTally`]).
/// `on_measurement` sees each measurement as it is taken, e.g. to store or
/// show it. An invalid gate (see [`PrometheusGate::validate`]) fails at once
/// with no measurement.
///
/// Cancellation: the future holds no resource beyond one HTTP request;
/// dropping it stops the gate, and the measurements already passed to
/// `on_measurement` are all that was taken.
pub async fn run_gate(
    http: &reqwest::Client,
    prometheus: &str,
    gate: &PrometheusGate,
    on_measurement: impl FnMut(&Measurement),
) -> GateVerdict {
    let start = tokio::time::Instant::now();
    run_with(
        gate,
        |offset| async move {
            if let Some(at) = start.checked_add(offset) {
                tokio::time::sleep_until(at).await;
            }
        },
        || measure(http, prometheus, gate),
        on_measurement,
    )
    .await
}

/// The loop of [`run_gate`] with its clock and its measurement injected:
/// `wait(offset)` returns once `offset` has passed since the gate started.
async fn run_with<W, WF, M, MF>(
    gate: &PrometheusGate,
    mut wait: W,
    mut take: M,
    mut on_measurement: impl FnMut(&Measurement),
) -> GateVerdict
where
    W: FnMut(Duration) -> WF,
    WF: Future<Output = ()>,
    M: FnMut() -> MF,
    MF: Future<Output = Measurement>,
{
    if let Err(e) = gate.validate() {
        return GateVerdict { passed: false, measurements: Vec::new(), reason: format!("the gate is invalid: {e}") };
    }
    let mut tally = GateTally::new(gate);
    let mut k: u32 = 0;
    while tally.state() == GateState::Measuring {
        wait(gate.interval.saturating_mul(k)).await;
        let m = take().await;
        on_measurement(&m);
        tally.record(m);
        k += 1;
    }
    tally.into_verdict()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    fn gate(interval: u64, duration: u64, failure_limit: u32) -> PrometheusGate {
        PrometheusGate {
            query: "error_ratio".into(),
            success: "result < 0.05".parse().unwrap(),
            interval: Duration::from_secs(interval),
            failure_limit,
            duration: Duration::from_secs(duration),
        }
    }

    fn m(value: f64) -> Measurement {
        let (ok, message) = crate::measure::judge(&"result < 0.05".parse().unwrap(), &[value]);
        Measurement { at_ms: 0, values: vec![value], ok, message }
    }

    /// Runs the loop with a recording clock and scripted values; returns
    /// the verdict and the offsets at which measurements were taken.
    fn run(g: &PrometheusGate, values: &[f64]) -> (GateVerdict, Vec<Duration>) {
        let offsets = RefCell::new(Vec::new());
        let script = RefCell::new(values.iter().copied().collect::<VecDeque<f64>>());
        let mut seen = 0;
        let verdict = block_on(run_with(
            g,
            |offset| {
                offsets.borrow_mut().push(offset);
                async {}
            },
            || {
                let v = script.borrow_mut().pop_front().expect("the loop took more measurements than scripted");
                async move { m(v) }
            },
            |_| seen += 1,
        ));
        assert_eq!(seen, verdict.measurements.len());
        (verdict, offsets.into_inner())
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    fn secs(s: &[u64]) -> Vec<Duration> {
        s.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[test]
    fn passes_after_duration_over_interval_measurements_on_schedule() {
        let (v, offsets) = run(&gate(1, 3, 0), &[0.01, 0.02, 0.0]);
        assert!(v.passed);
        assert_eq!(offsets, secs(&[0, 1, 2]));
        assert_eq!(v.reason, "3 of 3 measurements met `result < 0.05`");
    }

    #[test]
    fn fails_fast_at_the_first_failure_beyond_the_limit() {
        let (v, offsets) = run(&gate(1, 5, 0), &[0.01, 0.5]);
        assert!(!v.passed);
        assert_eq!(offsets, secs(&[0, 1]));
        assert_eq!(v.reason, "1 measurement failed (limit 0): result = 0.5 does not meet `result < 0.05`");

        let (v, _) = run(&gate(1, 5, 1), &[0.5, 0.01, 0.31]);
        assert!(!v.passed);
        assert_eq!(v.measurements.len(), 3);
        assert_eq!(v.reason, "2 measurements failed (limit 1): result = 0.31 does not meet `result < 0.05`");
    }

    #[test]
    fn failures_within_the_limit_pass_and_are_said() {
        let (v, _) = run(&gate(30, 120, 1), &[0.01, 0.9, 0.01, 0.01]);
        assert!(v.passed);
        assert_eq!(v.reason, "3 of 4 measurements met `result < 0.05`; 1 failed (limit 1)");
    }

    #[test]
    fn one_measurement_by_default() {
        let g = PrometheusGate::new("x", "result < 0.05".parse().unwrap());
        let (v, offsets) = run(&g, &[0.0]);
        assert!(v.passed);
        assert_eq!(offsets, secs(&[0]));
        assert_eq!(v.reason, "1 of 1 measurement met `result < 0.05`");
    }

    #[test]
    fn an_invalid_gate_fails_without_measuring() {
        let (v, offsets) = run(&gate(0, 3, 0), &[]);
        assert!(!v.passed && v.measurements.is_empty() && offsets.is_empty());
        assert_eq!(v.reason, "the gate is invalid: interval: 0s is shorter than the minimum of 1s");
    }

    /// Every (state, measurement) pair of a 3-measurement gate with limit 1.
    #[test]
    fn tally_table() {
        let g = gate(1, 3, 1);
        // (outcomes so far, next outcome, state after)
        let table: &[(&[bool], bool, GateState)] = &[
            (&[], true, GateState::Measuring),
            (&[], false, GateState::Measuring),
            (&[true], true, GateState::Measuring),
            (&[false], false, GateState::Failed),
            (&[true, true], true, GateState::Passed),
            (&[true, true], false, GateState::Passed),
            (&[false, true], false, GateState::Failed),
            (&[true, false], true, GateState::Passed),
        ];
        let outcome = |ok| if ok { m(0.0) } else { m(1.0) };
        for (before, next, want) in table {
            let mut t = GateTally::new(&g);
            for ok in *before {
                assert_eq!(t.record(outcome(*ok)), GateState::Measuring);
            }
            assert_eq!(t.record(outcome(*next)), *want, "{before:?} then {next}");
            // a decided gate ignores further measurements
            if *want != GateState::Measuring {
                let n = t.taken();
                assert_eq!(t.record(outcome(!next)), *want);
                assert_eq!(t.taken(), n);
            }
        }
        let stopped = GateTally::new(&g).into_verdict();
        assert!(!stopped.passed);
        assert_eq!(stopped.reason, "the gate stopped after 0 of 3 measurements (0 failed, limit 1)");
    }
}
