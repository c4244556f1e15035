//! Test reports for Kiln (issue 43): JUnit XML and TAP 13/14 parsed into
//! one model with hostile-input caps, the flaky-test decision, and
//! timing-based test splitting. Pure: no I/O beyond reading from a
//! [`std::io::Read`], no clock, no randomness.

pub mod flaky;
mod input;
mod junit;
mod limits;
mod model;
pub mod split;
mod tap;
mod text;

pub use junit::parse_junit;
pub use limits::Limits;
pub use model::{Annotation, AnnotationKind, Counts, Format, Outcome, Report, RetryKind, RetryRecord, TestCase, TestId};
pub use tap::parse_tap;
