//! The Prometheus gate's specification and its reading from a workflow's
//! (YAML-turned-JSON) value. Validation lives here so that every gate the
//! runner sees has already been refused or accepted for the same reasons.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::condition::Condition;

/// How often a gate measures when the workflow does not say.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest accepted `interval`: Prometheus's own scrape and rule
/// evaluation rarely run faster, so shorter intervals only re-read the same
/// samples.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest a single query may take: `min(interval, MAX_QUERY_TIMEOUT)`.
pub const MAX_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many measurements per gate (`duration / interval`), which
/// bounds the verdict's size: one second for two and three quarter hours.
pub const MAX_MEASUREMENTS: u32 = 10_000;
/// The longest accepted `query`, in bytes (it travels in the URL).
pub const MAX_QUERY_LEN: usize = 16 * 1024;

const KEYS: &str = "query, success, interval, failure-limit, duration";

/// A gate between two rings that asks Prometheus: every `interval`, the
/// instant query `query` is run and its answer checked against `success`;
/// the gate fails as soon as more than `failure_limit` measurements failed,
/// and passes after `max(1, duration / interval)` measurements otherwise.
/// See the crate docs for the full semantics.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusGate {
    /// A PromQL expression evaluated as an instant query (`/api/v1/query`).
    pub query: String,
    /// What each answer must meet.
    pub success: Condition,
    /// Time between the starts of two measurements; the first is immediate.
    pub interval: Duration,
    /// How many measurements may fail without failing the gate.
    pub failure_limit: u32,
    /// How long the gate measures: `max(1, duration / interval)`
    /// measurements (rounded down).
    pub duration: Duration,
}

impl PrometheusGate {
    /// A gate with the defaults: one measurement (`interval` 30 s,
    /// `duration` = `interval`), no failure allowed.
    pub fn new(query: impl Into<String>, success: Condition) -> PrometheusGate {
        PrometheusGate {
            query: query.into(),
            success,
            interval: DEFAULT_INTERVAL,
            failure_limit: 0,
            duration: DEFAULT_INTERVAL,
        }
    }

    /// How many measurements a passing gate takes: `max(1, duration /
    /// interval)`, rounded down (and 1 for a zero interval, which
    /// [`validate`](Self::validate) refuses anyway).
    pub fn measurement_count(&self) -> u32 {
        let n = self.duration.as_nanos().checked_div(self.interval.as_nanos()).unwrap_or(1);
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// The timeout of each query: `min(interval, 10 s)`, so one slow answer
    /// never delays the next measurement.
    pub fn query_timeout(&self) -> Duration {
        self.interval.min(MAX_QUERY_TIMEOUT)
    }

    /// Checks what [`from_value`](Self::from_value) checks, for gates built
    /// in code. Errors name the key, as in `interval: …`.
    pub fn validate(&self) -> Result<(), String> {
        if self.query.trim().is_empty() {
            return Err("query: must not be empty".into());
        }
        if self.query.len() > MAX_QUERY_LEN {
            return Err(format!("query: is {} bytes long; at most {MAX_QUERY_LEN} are accepted", self.query.len()));
        }
        if self.interval < MIN_INTERVAL {
            return Err(format!("interval: {} is shorter than the minimum of 1s", fmt_duration(self.interval)));
        }
        if self.duration < self.interval {
            return Err(format!(
                "duration: {} is shorter than the interval ({}); the gate measures every interval for the duration",
                fmt_duration(self.duration),
                fmt_duration(self.interval)
            ));
        }
        let count = self.measurement_count();
        if count > MAX_MEASUREMENTS {
            return Err(format!(
                "duration: {} at an interval of {} is {count} measurements; at most {MAX_MEASUREMENTS} are allowed (lengthen the interval)",
                fmt_duration(self.duration),
                fmt_duration(self.interval)
            ));
        }
        if self.failure_limit >= count {
            return Err(format!(
                "failure-limit: {} lets all {count} measurement{} fail, so the gate could never fail; lower it or lengthen the duration",
                self.failure_limit,
                plural(count)
            ));
        }
        Ok(())
    }

    /// Reads a gate from a workflow value such as
    /// `{"query": "…", "success": "result < 0.05", "interval": "30s",
    /// "failure-limit": 1, "duration": "2m"}`. Only `query` and `success`
    /// are required; unknown keys are refused by name. Errors start with
    /// the key they concern (`success: expected a number after `<`, …`).
    pub fn from_value(value: &Value) -> Result<PrometheusGate, String> {
        let Value::Object(map) = value else {
            return Err(format!("a Prometheus gate is a mapping with the keys {KEYS}, not {}", kind(value)));
        };
        let mut unknown: Vec<&str> =
            map.keys().map(String::as_str).filter(|k| !KEYS.split(", ").any(|known| known == *k)).collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            let hint = if unknown.contains(&"failure_limit") || unknown.contains(&"failureLimit") {
                " (the key is spelled `failure-limit`)"
            } else {
                ""
            };
            return Err(format!(
                "unknown key{} {}{hint}; a Prometheus gate accepts {KEYS}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
            ));
        }
        let query = required_string(map, "query")?;
        let success = required_string(map, "success")?;
        let success = Condition::parse(success).map_err(|e| format!("success: {e}"))?;
        let interval = optional_duration(map, "interval")?.unwrap_or(DEFAULT_INTERVAL);
        let duration = optional_duration(map, "duration")?.unwrap_or(interval);
        let failure_limit = match map.get("failure-limit") {
            None => 0,
            Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                format!("failure-limit: expected a whole number of measurements (0, 1, 2, …), not {}", kind(v))
            })?,
        };
        let gate = PrometheusGate { query: query.to_string(), success, interval, failure_limit, duration };
        gate.validate()?;
        Ok(gate)
    }

    /// The gate as a value [`from_value`](Self::from_value) reads back
    /// (durations written as `30s`, `2m`, …).
    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "query": self.query,
            "success": self.success.as_str(),
            "interval": fmt_duration(self.interval),
            "failure-limit": self.failure_limit,
            "duration": fmt_duration(self.duration),
        })
    }
}

fn required_string<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    match map.get(key) {
        None => Err(format!("{key}: is required")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{key}: expected a string, not {}", kind(other))),
    }
}

fn optional_duration(map: &Map<String, Value>, key: &str) -> Result<Option<Duration>, String> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => humantime::parse_duration(s.trim())
            .map(Some)
            .map_err(|e| format!("{key}: `{s}` is not a duration ({e}); write one such as \"30s\" or \"2m\"")),
        Some(other) => Err(format!("{key}: expected a duration such as \"30s\" or \"2m\", not {}", kind(other))),
    }
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

pub(crate) fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_one_measurement_every_30s_with_no_failure_allowed() {
        let g = PrometheusGate::from_value(&json!({"query": "up", "success": "result == 1"})).unwrap();
        assert_eq!(g.interval, Duration::from_secs(30));
        assert_eq!(g.duration, Duration::from_secs(30));
        assert_eq!(g.failure_limit, 0);
        assert_eq!(g.measurement_count(), 1);
        assert_eq!(g.query_timeout(), Duration::from_secs(10));
        assert_eq!(g, PrometheusGate::new("up", "result == 1".parse().unwrap()));
    }

    #[test]
    fn full_gate_reads_and_round_trips() {
        let v = json!({"query": "sum(rate(errors[1m]))", "success": "result < 0.05",
            "interval": "30s", "failure-limit": 1, "duration": "2m"});
        let g = PrometheusGate::from_value(&v).unwrap();
        assert_eq!(g.interval, Duration::from_secs(30));
        assert_eq!(g.duration, Duration::from_secs(120));
        assert_eq!(g.failure_limit, 1);
        assert_eq!(g.measurement_count(), 4);
        assert_eq!(g.to_value(), v);
        assert_eq!(PrometheusGate::from_value(&g.to_value()).unwrap(), g);
    }

    #[test]
    fn measurement_count_rounds_down_and_is_at_least_one() {
        let mut g = PrometheusGate::new("up", "result == 1".parse().unwrap());
        g.interval = Duration::from_secs(60);
        g.duration = Duration::from_secs(150);
        assert_eq!(g.measurement_count(), 2);
        g.duration = Duration::from_secs(10);
        assert_eq!(g.measurement_count(), 1);
        g.interval = Duration::ZERO;
        assert_eq!(g.measurement_count(), 1);
        g.interval = Duration::from_secs(2);
        assert_eq!(g.query_timeout(), Duration::from_secs(2));
    }

    #[test]
    fn refusals_name_the_key_and_say_what_to_do() {
        let base = || json!({"query": "up", "success": "result == 1"});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            PrometheusGate::from_value(&b).unwrap_err()
        };
        let cases = [
            (with("query", json!("  ")), "query: must not be empty"),
            (with("query", json!(3)), "query: expected a string, not the number 3"),
            (
                with("success", json!("result <")),
                "success: expected a number after `<`, found the end of the condition at column 9",
            ),
            (with("interval", json!("500ms")), "interval: 500ms is shorter than the minimum of 1s"),
            (with("interval", json!(30)), "interval: expected a duration such as \"30s\" or \"2m\", not the number 30"),
            (
                with("duration", json!("10s")),
                "duration: 10s is shorter than the interval (30s); the gate measures every interval for the duration",
            ),
            (
                with("failure-limit", json!(-1)),
                "failure-limit: expected a whole number of measurements (0, 1, 2, …), not the number -1",
            ),
            (
                with("failure-limit", json!(1)),
                "failure-limit: 1 lets all 1 measurement fail, so the gate could never fail; lower it or lengthen the duration",
            ),
            (
                with("failure_limit", json!(1)),
                "unknown key `failure_limit` (the key is spelled `failure-limit`); a Prometheus gate accepts query, success, interval, failure-limit, duration",
            ),
            (
                with("zzz", json!(1)),
                "unknown key `zzz`; a Prometheus gate accepts query, success, interval, failure-limit, duration",
            ),
            (PrometheusGate::from_value(&json!({"success": "result == 1"})).unwrap_err(), "query: is required"),
            (PrometheusGate::from_value(&json!({"query": "up"})).unwrap_err(), "success: is required"),
            (
                PrometheusGate::from_value(&json!(["up"])).unwrap_err(),
                "a Prometheus gate is a mapping with the keys query, success, interval, failure-limit, duration, not a list",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
        let bad = with("interval", json!("soon"));
        assert!(bad.starts_with("interval: `soon` is not a duration ("), "{bad}");
        let mut many = base();
        many["interval"] = json!("1s");
        many["duration"] = json!("3h");
        assert_eq!(
            PrometheusGate::from_value(&many).unwrap_err(),
            "duration: 3h at an interval of 1s is 10800 measurements; at most 10000 are allowed (lengthen the interval)"
        );
    }
}
