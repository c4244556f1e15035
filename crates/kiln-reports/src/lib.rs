//! Test reports for Kiln (issue 43): JUnit XML and TAP 13/14 parsed into
//! one model with hostile-input caps, the flaky-test decision, and
//! timing-based test splitting.
//!
//! Pure: no I/O beyond reading from a [`std::io::Read`], no clock, no
//! randomness, no dependency on the server or store crates, so the agent
//! (which parses), the server (which decides flakiness when a run ends)
//! and the CLI (`kiln tests split`) can all link it.
//!
//! # The model
//!
//! [`parse_junit`] and [`parse_tap`] each return a [`Report`]: the
//! [`TestCase`]s in document order, `truncated`, and the
//! [`Annotation`]s saying what was refused, cut or repaired. Parsing never
//! fails and never panics: a broken or hostile file is a report with
//! `truncated: true` and an annotation that says why, so a caller stores
//! and shows it like any other (and the job's own outcome is the caller's
//! business, not the parser's).
//!
//! Per test: its [`TestId`], `suite`, `class`, `name`, `file`, [`Outcome`]
//! (passed, failed, error, skipped), `duration_ms`, `message` (bounded),
//! `excerpt` (bounded: failure text, `system-out`, `system-err`, TAP
//! diagnostics; kept for tests that did not pass or needed a retry), and
//! the runner's own retry records ([`RetryRecord`]: JUnit
//! `flakyFailure`/`flakyError` as Surefire's `rerunFailingTestsCount` and
//! nextest's `retries` write them for a test that passed on a retry,
//! `rerunFailure`/`rerunError` for one that failed every time).
//!
//! # The test id
//!
//! `suite :: class :: name`, with empty parts left out and `class` left
//! out when it repeats the suite or the name; whitespace folded, one line,
//! at most [`TestId::MAX_LEN`] bytes; repeated ids within one report get
//! ` #2`, ` #3` …. The file is not part of it. The full rule, and why, is
//! on [`TestId`]. Examples from the real fixtures:
//!
//! | producer | id |
//! |---|---|
//! | pytest | `pytest :: tests.test_sample :: test_fails` |
//! | cargo-nextest | `sample :: tests::flaky` (suite = binary id) |
//! | Surefire | `org.acme.FlakyTest :: testFlaky` |
//! | jest-junit | `cart :: cart computes the total` |
//! | go-junit-report | `package/subtests :: TestSubtests/Subtest#01` |
//! | TAP | `node-test-tap13.tap :: math / nested :: divides` (suite = the source name the caller passes) |
//!
//! # Caps ([`Limits`])
//!
//! Input bytes (the reader is never read past the cap plus one probe
//! byte), element nesting, element count, test count, message, excerpt and
//! line length, retry records per test, and a total text budget per
//! report; each is enforced while streaming. quick-xml's pull reader
//! processes no DTD and expands no entity; a `<!DOCTYPE` refuses the
//! document (billion laughs, external entities), an undeclared `&name;`
//! stays as written. Invalid UTF-8 is replaced with U+FFFD and annotated.
//! Which annotations truncate is listed on [`AnnotationKind`].
//!
//! # Flakiness ([`flaky`]) and splitting ([`split`])
//!
//! [`flaky::decide`] takes every attempt that ran one commit SHA and flags
//! the tests that both passed and failed; attempts whose report is
//! missing or truncated, or where more than half the tests failed, never
//! count. [`flaky::flake_rate`] is a test's rate over history.
//! [`split::split`] bin-packs test ids into N shards by recorded
//! durations (LPT; unknown tests weigh the median and are counted), or
//! deals them round-robin in count mode; deterministic for the same input.

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
pub use model::{
    Annotation, AnnotationKind, Counts, Format, Outcome, Report, RetryKind, RetryRecord, TestCase, TestId,
};
pub use tap::parse_tap;
