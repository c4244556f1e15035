//! Deploy gates (issue 46): the decision, between two rings of a deployment
//! (canary → early → all), whether to promote. This crate holds the
//! Prometheus gate: its specification as a workflow writes it, its
//! condition language, one measurement against Prometheus's HTTP API, and
//! the loop that turns measurements into a verdict. The server persists
//! and shows what it is given; nothing here touches the store.
//!
//! # Semantics (as Argo Rollouts' analysis runs)
//!
//! A gate is `{query, success, interval, failure-limit, duration}`
//! ([`PrometheusGate::from_value`]):
//!
//! * Every `interval` (default 30 s, at least 1 s) the instant query `query`
//!   is sent to `/api/v1/query` of the configured Prometheus (the base URL
//!   may carry a path prefix). The first measurement is taken at once; the
//!   k-th at `k × interval` after the start, however long earlier answers
//!   took. Each request times out after `min(interval, 10 s)`.
//! * A measurement **succeeds** when the answer meets `success`
//!   ([`Condition`]: `result < 0.05`, `result[1] >= 0.99 && len(result) ==
//!   2`, …). It **fails** when the condition is false (NaN meets no
//!   comparison), when the query returned no series and the condition reads
//!   a sample, when Prometheus refused the query (its `errorType` and
//!   `error` are quoted), answered a non-JSON error, a range vector or a
//!   string, timed out, or could not be reached. The measurement's message
//!   says which.
//! * The gate **fails** as soon as more than `failure-limit` (default 0)
//!   measurements failed — it does not wait for the rest of `duration`.
//! * The gate **passes** after `max(1, duration / interval)` measurements
//!   (rounded down; `duration` defaults to `interval`, i.e. one measurement)
//!   with at most `failure-limit` failures. The verdict is given right after
//!   the last measurement, at `(n − 1) × interval`.
//!
//! Refused when read: an empty query, `interval` < 1 s, `duration` <
//! `interval`, more than [`MAX_MEASUREMENTS`] measurements, a
//! `failure-limit` that lets every measurement fail (such a gate could never
//! fail), unknown keys. Errors start with the key (`success: expected a
//! number after `<`, found the end of the condition at column 9`).
//!
//! # Using it
//!
//! ```no_run
//! # async fn example() -> Result<(), String> {
//! use kiln_deploy::{PrometheusGate, run_gate};
//! let gate = PrometheusGate::from_value(&serde_json::json!({
//!     "query": "sum(rate(http_errors_total[1m])) / sum(rate(http_requests_total[1m]))",
//!     "success": "result < 0.05",
//!     "interval": "30s",
//!     "failure-limit": 1,
//!     "duration": "5m",
//! }))?;
//! let http = reqwest::Client::new();
//! let verdict = run_gate(&http, "http://prometheus:9090", &gate, |m| {
//!     println!("{} {}", if m.ok { "ok" } else { "FAILED" }, m.message);
//! })
//! .await;
//! println!("promote: {} ({})", verdict.passed, verdict.reason);
//! # Ok(()) }
//! ```
//!
//! A caller that must survive restarts can take measurements itself with
//! [`measure()`] on its own schedule and count them with a [`GateTally`]
//! rebuilt from the stored ones.
//!
//! | what | module |
//! |---|---|
//! | the condition language | [`condition`] |
//! | the gate's keys, defaults and refusals | [`gate`] |
//! | one query and its message | [`measure`](mod@measure) |
//! | counting to a verdict, the schedule | [`verdict`] |

pub mod condition;
pub mod gate;
pub mod measure;
pub mod verdict;

pub use condition::{Condition, ConditionError, EvalError};
pub use gate::{MAX_MEASUREMENTS, PrometheusGate};
pub use measure::{Measurement, measure};
pub use verdict::{GateState, GateTally, GateVerdict, run_gate};
