//! Deploy gates (issue 46): the decision, between two rings of a deployment
//! (canary → early → all), whether to promote. This first part holds the
//! Prometheus gate's specification and its condition language.

pub mod condition;
pub mod gate;

pub use condition::{Condition, ConditionError, EvalError};
pub use gate::{MAX_MEASUREMENTS, PrometheusGate};
