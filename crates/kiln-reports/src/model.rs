//! The one model both parsers produce: a [`Report`] of [`TestCase`]s, each
//! with a stable [`TestId`], plus whether the report is complete and what
//! was refused or cut ([`Annotation`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which format a report was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Junit,
    Tap,
}

/// A test's final outcome in one report.
///
/// `Error` is JUnit's `<error>` (the test could not run to an assertion: an
/// exception outside the assertion, a setup failure); both `Failed` and
/// `Error` count as a failure everywhere ([`Outcome::is_failure`]). A TAP
/// `not ok … # TODO` is `Skipped` (TAP: a TODO failure is not a failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Failed,
    Error,
    Skipped,
}

impl Outcome {
    /// Failed or error.
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Failed | Outcome::Error)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
            Outcome::Skipped => "skipped",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A test's stable identity across runs, used for history, quarantine
/// (one id per line in `KILN_QUARANTINE`) and splitting.
///
/// **The rule** ([`TestId::new`]): the non-empty parts of `suite`, `class`
/// and `name`, in that order, joined with `" :: "`, where `class` is left
/// out when it equals `suite` (Surefire, nextest and go-junit-report write
/// the same string in both) or `name` (jest-junit's default templates). Each part is trimmed, and every run of
/// whitespace or control characters inside it (a newline in a
/// parametrised name, a tab) becomes one space, so the id is one printable
/// line. The file is *not* part of the id: a test moved to another file
/// keeps its history, and not every runner writes a file. An id longer
/// than [`TestId::MAX_LEN`] bytes is cut (at a character boundary) and
/// ends in `…`.
///
/// Two test cases of one report with the same id (a parametrised test
/// whose parameters do not reach its name) get `" #2"`, `" #3"` … appended
/// in document order, so every row of a report has its own id; the parser
/// adds an annotation when it does this.
///
/// The id is a key, not a path to parse back: `::` may occur inside a part.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TestId(pub String);

impl TestId {
    /// Longest id, in bytes, before the `…`.
    pub const MAX_LEN: usize = 1024;
    /// Between the parts.
    pub const SEPARATOR: &'static str = " :: ";

    /// The id of a test, by the rule in the type's docs.
    pub fn new(suite: &str, class: Option<&str>, name: &str) -> TestId {
        let clean = is_normal_part;
        let class_s = class.unwrap_or("");
        if clean(suite) && clean(class_s) && clean(name) {
            // The usual case: nothing to normalise, one allocation.
            let mut id = String::with_capacity(suite.len() + class_s.len() + name.len() + 8);
            for part in [suite, if class_s == suite || class_s == name { "" } else { class_s }, name] {
                if part.is_empty() {
                    continue;
                }
                if !id.is_empty() {
                    id.push_str(Self::SEPARATOR);
                }
                id.push_str(part);
            }
            if id.len() <= Self::MAX_LEN {
                return TestId(id);
            }
        }
        let suite = normalize_part(suite);
        let class = class.map(normalize_part).unwrap_or_default();
        let name = normalize_part(name);
        let mut parts: Vec<&str> = Vec::with_capacity(3);
        if !suite.is_empty() {
            parts.push(&suite);
        }
        if !class.is_empty() && class != suite && class != name {
            parts.push(&class);
        }
        if !name.is_empty() {
            parts.push(&name);
        }
        let mut id = parts.join(Self::SEPARATOR);
        if id.len() > Self::MAX_LEN {
            let cut = crate::text::floor_char_boundary(&id, Self::MAX_LEN);
            id.truncate(cut);
            id.push('…');
        }
        TestId(id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for TestId {
    fn from(s: &str) -> TestId {
        TestId(s.to_string())
    }
}

/// Whether `normalize_part(p) == p` (one pass over ASCII, the usual case).
fn is_normal_part(p: &str) -> bool {
    let b = p.as_bytes();
    if b.first() == Some(&b' ') || b.last() == Some(&b' ') {
        return false;
    }
    let mut prev_space = false;
    for &c in b {
        if c >= 0x80 {
            return normalize_part(p) == p;
        }
        if c < 0x20 || c == 0x7f || (c == b' ' && prev_space) {
            return false;
        }
        prev_space = c == b' ';
    }
    true
}

/// Trim, and fold every run of whitespace/control characters into one space.
fn normalize_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut gap = false;
    for c in s.trim().chars() {
        if c.is_whitespace() || c.is_control() {
            gap = true;
        } else {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.push(c);
        }
    }
    out
}

/// One test case of a report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// See [`TestId`] for the rule.
    pub id: TestId,
    /// JUnit: the innermost `<testsuite name>`; TAP: the source name the
    /// caller gave (usually the report's path).
    pub suite: String,
    /// JUnit `classname`; TAP: the enclosing subtests' names joined with
    /// `" / "`.
    pub class: Option<String>,
    pub name: String,
    /// JUnit `file` attribute (pytest, jest-junit with `addFileAttribute`);
    /// TAP: none.
    pub file: Option<String>,
    pub outcome: Outcome,
    /// The runner's own figure (JUnit `time`, TAP YAML `duration_ms`), in
    /// milliseconds; `None` when absent or unreadable.
    pub duration_ms: Option<u64>,
    /// The failure/error/skip message (its `message` attribute, else the
    /// first line of its text), at most [`Limits::max_message_bytes`](crate::Limits).
    pub message: Option<String>,
    /// A bounded excerpt of the failure text and the test's output
    /// (`system-out`, `system-err`; TAP: the YAML diagnostics block), at most
    /// [`Limits::max_excerpt_bytes`](crate::Limits).
    pub excerpt: Option<String>,
    /// The runner's own earlier attempts of this test within this report
    /// (JUnit `flakyFailure`/`flakyError`, which Surefire and nextest write
    /// for a test that passed on a retry, and `rerunFailure`/`rerunError`
    /// for one that failed on every retry), in document order.
    pub retries: Vec<RetryRecord>,
}

impl TestCase {
    /// The runner itself saw this test both fail and pass (a flaky
    /// record on a test that finally passed).
    pub fn runner_flaky(&self) -> bool {
        self.outcome == Outcome::Passed && self.retries.iter().any(|r| r.outcome.is_failure())
    }
}

/// One earlier attempt of a test, as the runner recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryRecord {
    /// `flaky` (`flakyFailure`/`flakyError`: the test later passed) or
    /// `rerun` (`rerunFailure`/`rerunError`: it failed again).
    pub kind: RetryKind,
    /// `Failed` or `Error`.
    pub outcome: Outcome,
    pub message: Option<String>,
    /// Its stack trace and output, bounded like [`TestCase::excerpt`].
    pub excerpt: Option<String>,
    pub duration_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryKind {
    Flaky,
    Rerun,
}

/// What a parser refused, cut or could not read, for the user to see.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    pub kind: AnnotationKind,
    /// What happened, where (byte offset or line), and what it means for
    /// the report.
    pub message: String,
}

/// The kinds of [`Annotation`]; the ones marked *truncates* set
/// [`Report::truncated`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnnotationKind {
    /// The input is larger than `max_bytes` (*truncates*).
    InputTooLarge,
    /// Elements nested deeper than `max_depth` (*truncates*).
    TooDeep,
    /// More than `max_elements` elements (*truncates*).
    TooManyElements,
    /// More than `max_tests` test cases (*truncates*).
    TooManyTests,
    /// A `<!DOCTYPE …>` (and so any `<!ENTITY …>`): refused, nothing of it
    /// expanded (*truncates*).
    DoctypeRefused,
    /// Not well-formed XML / not TAP; parsing stopped here (*truncates*).
    Malformed,
    /// Bytes that are not UTF-8, replaced with U+FFFD.
    InvalidUtf8,
    /// A reference to an entity other than the five XML ones, kept as
    /// written.
    UnknownEntity,
    /// An attribute that could not be read (duplicate, unquoted), ignored.
    BadAttribute,
    /// Messages or excerpts cut to their caps.
    TextCut,
    /// Test cases whose ids collided got `#2`, `#3` … suffixes.
    DuplicateIds,
    /// TAP `Bail out!` (*truncates*: the run stopped early).
    BailOut,
    /// TAP: fewer (or more) test points than the plan announced
    /// (*truncates* when fewer).
    PlanMismatch,
    /// A reading error of the underlying reader (*truncates*).
    Io,
    /// No test cases at all where some were expected (*truncates*).
    Empty,
}

/// A parsed report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: Format,
    pub tests: Vec<TestCase>,
    /// The report does not cover everything the file held or the run
    /// meant to run (a cap was hit, the document was refused or broken
    /// off, a TAP bail-out or a short plan). A truncated report never
    /// counts towards flakiness and never lets a quarantine excuse a
    /// failure.
    pub truncated: bool,
    /// What was refused, cut or repaired, in the order found; at most
    /// [`Limits::max_annotations`](crate::Limits) (the last one then says
    /// how many more were dropped).
    pub annotations: Vec<Annotation>,
    /// Bytes of input read (up to the cap).
    pub bytes_read: u64,
}

impl Report {
    pub(crate) fn new(format: Format) -> Report {
        Report { format, tests: Vec::new(), truncated: false, annotations: Vec::new(), bytes_read: 0 }
    }

    /// Tests per outcome: (passed, failed, error, skipped).
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for t in &self.tests {
            match t.outcome {
                Outcome::Passed => c.passed += 1,
                Outcome::Failed => c.failed += 1,
                Outcome::Error => c.error += 1,
                Outcome::Skipped => c.skipped += 1,
            }
        }
        c.runner_flaky = self.tests.iter().filter(|t| t.runner_flaky()).count();
        c
    }

    /// Whether an annotation of this kind was recorded.
    pub fn has(&self, kind: AnnotationKind) -> bool {
        self.annotations.iter().any(|a| a.kind == kind)
    }
}

/// Per-outcome totals of one report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    pub error: usize,
    pub skipped: usize,
    /// Passed tests with a runner-recorded failed retry.
    pub runner_flaky: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The fast path agrees with the rule, and ids are one clean line.
        #[test]
        fn fast_path_agrees(s in "[ a\t\né\u{2003}\u{7f}]{0,12}", c in "[ b\t]{0,4}") {
            proptest::prop_assert_eq!(is_normal_part(&s), normalize_part(&s) == s);
            let id = TestId::new(&s, Some(&c), &s);
            proptest::prop_assert_eq!(is_normal_part(&id.0) || id.0.is_empty(), true);
        }
    }

    #[test]
    fn test_id_rule() {
        assert_eq!(TestId::new("pytest", Some("tests.test_a"), "test_x").0, "pytest :: tests.test_a :: test_x");
        // class equal to suite is left out (Surefire, nextest, go-junit-report)
        assert_eq!(TestId::new("a.B", Some("a.B"), "t").0, "a.B :: t");
        // class equal to name is left out (jest-junit)
        assert_eq!(TestId::new("cart", Some("cart adds"), "cart adds").0, "cart :: cart adds");
        assert_eq!(TestId::new("", None, "t").0, "t");
        assert_eq!(TestId::new(" s ", Some(""), "a\n  b\tc").0, "s :: a b c");
        let long = "é".repeat(2000);
        let id = TestId::new("s", None, &long);
        assert!(id.0.len() <= TestId::MAX_LEN + '…'.len_utf8());
        assert!(id.0.ends_with('…'));
    }
}
