//! JUnit XML as pytest, cargo-nextest, Maven Surefire, jest-junit and
//! go-junit-report write it.
//!
//! Read with quick-xml's pull reader, which never processes a DTD or
//! expands an entity: a `<!DOCTYPE …>` (the only place an `<!ENTITY …>` can
//! be declared) refuses the document before anything of it is used, so
//! billion-laughs bombs and external entities cannot fire. References to
//! the five predefined entities and character references are resolved;
//! any other `&name;` is kept as written (annotated).
//!
//! What is read: every `<testcase>` under `<testsuites>`/`<testsuite>` (at
//! any nesting; the innermost suite names it), its `name`, `classname`,
//! `file` and `time`; `<failure>`, `<error>`, `<skipped>` (outcome,
//! `message`, text); `<system-out>`/`<system-err>`; and the runners' retry
//! records `<flakyFailure>`, `<flakyError>` (the test passed on a retry:
//! Surefire's `rerunFailingTestsCount`, nextest's `retries`) and
//! `<rerunFailure>`, `<rerunError>` (it failed on every retry), each with
//! its own message, `time`, text and `stackTrace`/`system-out`/`system-err`.
//! Properties, suite-level output and unknown elements are skipped.

use crate::input::{Capped, Utf8Lossy};
use crate::limits::{CountedKey, Limits, Notes};
use crate::model::{AnnotationKind, Format, Outcome, Report, RetryKind, RetryRecord, TestCase, TestId};
use crate::text::{Bounded, bounded};
use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};
use std::io::{BufReader, Read};

/// Parse a JUnit XML report from `input`, within `limits`. Never fails and
/// never panics: whatever could not be read is in the report's
/// annotations, and `truncated` says whether the report is incomplete.
pub fn parse_junit<R: Read>(input: R, limits: &Limits) -> Report {
    let lossy = Utf8Lossy::new(Capped::new(input, limits.max_bytes));
    let mut reader = Reader::from_reader(BufReader::with_capacity(64 * 1024, lossy));
    {
        let c = reader.config_mut();
        c.check_end_names = true;
        c.expand_empty_elements = false;
        c.trim_text_start = false;
        c.trim_text_end = false;
    }
    let mut p = Parser::new(limits);
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let event = match reader.read_event_into(&mut buf) {
            Ok(e) => e,
            Err(e) => {
                let pos = reader.error_position();
                // An error caused by the cap is the cap's, said below.
                if !reader.get_ref().get_ref().get_ref().exceeded {
                    p.notes.fatal(
                        AnnotationKind::Malformed,
                        format!("not well-formed XML at byte {pos}: {e}; the report holds the test cases before it"),
                    );
                }
                break;
            }
        };
        match p.event(event) {
            Step::Go => {}
            Step::Stop => break,
            Step::Eof => {
                let pos = reader.buffer_position();
                p.at_eof(pos, reader.get_ref().get_ref().get_ref().exceeded);
                break;
            }
        }
    }
    let lossy = reader.get_ref().get_ref();
    let capped = lossy.get_ref();
    let mut report = Report::new(Format::Junit);
    report.bytes_read = capped.read;
    if capped.exceeded {
        p.notes.fatal(
            AnnotationKind::InputTooLarge,
            format!(
                "the report is larger than the {} byte cap: read the first {} bytes only; the report holds the test cases completed in them",
                limits.max_bytes, capped.read
            ),
        );
    }
    if !p.seen_root && !p.notes.truncated {
        p.notes.fatal(
            AnnotationKind::Empty,
            "no <testsuites>, <testsuite> or <testcase> element: this is not a JUnit report".into(),
        );
    }
    let (replaced, first) = (lossy.replaced, lossy.first_at);
    report.tests = p.tests;
    crate::limits::dedupe_ids(&mut report.tests, &mut p.notes);
    p.notes.finish(&mut report, replaced, first);
    report
}

enum Step {
    Go,
    Stop,
    Eof,
}

/// Where text goes while inside an element we read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// `<failure>`/`<error>`/`<skipped>` body.
    Body,
    Out,
    Err,
    /// A retry record's text or its children's.
    Retry,
}

struct CaseBuilder {
    depth: usize,
    suite: String,
    class: Option<String>,
    name: String,
    file: Option<String>,
    duration_ms: Option<u64>,
    outcome: Outcome,
    message: Option<String>,
    message_from_text: bool,
    body: Bounded,
    out: Bounded,
    err: Bounded,
    retries: Vec<RetryRecord>,
    retry: Option<RetryBuilder>,
}

struct RetryBuilder {
    depth: usize,
    kind: RetryKind,
    outcome: Outcome,
    message: Option<String>,
    duration_ms: Option<u64>,
    text: Bounded,
}

struct Parser<'l> {
    limits: &'l Limits,
    notes: Notes,
    tests: Vec<TestCase>,
    depth: usize,
    elements: u64,
    suites: Vec<(usize, String)>,
    case: Option<CaseBuilder>,
    /// (depth of the element whose text we take, sink)
    sink: Option<(usize, Sink)>,
    text_budget: usize,
    seen_root: bool,
}

impl<'l> Parser<'l> {
    fn new(limits: &'l Limits) -> Parser<'l> {
        Parser {
            limits,
            notes: Notes::default(),
            tests: Vec::new(),
            depth: 0,
            elements: 0,
            suites: Vec::new(),
            case: None,
            sink: None,
            text_budget: limits.max_total_text_bytes,
            seen_root: false,
        }
    }

    fn event(&mut self, event: Event<'_>) -> Step {
        match event {
            Event::Start(e) => {
                self.depth += 1;
                self.start(&e)
            }
            Event::Empty(e) => {
                // Counted as one level for the depth check, then closed.
                self.depth += 1;
                let step = self.start(&e);
                if let Step::Go = step {
                    self.end();
                }
                self.depth -= 1;
                step
            }
            Event::End(_) => {
                self.end();
                self.depth = self.depth.saturating_sub(1);
                Step::Go
            }
            Event::Text(t) => {
                self.text(&t.xml10_content());
                Step::Go
            }
            Event::CData(t) => {
                self.text(&t.xml10_content());
                Step::Go
            }
            Event::GeneralRef(r) => {
                match r.resolve_char_ref() {
                    Ok(Some(c)) => self.text(c.encode_utf8(&mut [0u8; 4])),
                    Ok(None) => match quick_xml::escape::resolve_xml_entity(&r) {
                        Some(s) => self.text(s),
                        None => {
                            let raw = format!("&{};", &*r);
                            self.notes.count(CountedKey::UnknownEntity, || format!("`{raw}`"));
                            self.text(&raw);
                        }
                    },
                    Err(_) => {
                        let raw = format!("&{};", &*r);
                        self.notes.count(CountedKey::UnknownEntity, || format!("`{raw}` (not a character)"));
                        self.text("\u{FFFD}");
                    }
                }
                Step::Go
            }
            Event::DocType(_) => {
                self.notes.fatal(
                    AnnotationKind::DoctypeRefused,
                    "refused: the report has a <!DOCTYPE …> declaration (where entities are declared); JUnit reports need none, and nothing of it was expanded or read"
                        .into(),
                );
                Step::Stop
            }
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) => Step::Go,
            Event::Eof => Step::Eof,
        }
    }

    fn at_eof(&mut self, pos: u64, capped: bool) {
        if self.depth > 0 && !capped {
            self.notes.fatal(
                AnnotationKind::Malformed,
                format!(
                    "the report ends at byte {pos} inside {} open element(s): it was cut off; the report holds the test cases completed before",
                    self.depth
                ),
            );
        }
    }

    fn start(&mut self, e: &BytesStart<'_>) -> Step {
        self.elements += 1;
        if self.elements > self.limits.max_elements {
            self.notes.fatal(
                AnnotationKind::TooManyElements,
                format!(
                    "more than {} elements: stopped reading there; the report holds the test cases before",
                    self.limits.max_elements
                ),
            );
            return Step::Stop;
        }
        if self.depth > self.limits.max_depth {
            self.notes.fatal(
                AnnotationKind::TooDeep,
                format!(
                    "elements nested deeper than {} levels: stopped reading there; the report holds the test cases before",
                    self.limits.max_depth
                ),
            );
            return Step::Stop;
        }
        let local = e.local_name();
        let name: &str = local.as_ref();
        if self.depth == 1 {
            if !matches!(name, "testsuites" | "testsuite" | "testcase") {
                self.notes.fatal(
                    AnnotationKind::Empty,
                    format!(
                        "the root element is <{}>, not <testsuites> or <testsuite>: this is not a JUnit report",
                        cut_name(name)
                    ),
                );
                return Step::Stop;
            }
            self.seen_root = true;
        }
        match (name, self.case.is_some()) {
            ("testsuite", false) => {
                let [suite] = self.attrs(e, ["name"]);
                let suite = suite.unwrap_or_default();
                self.suites.push((self.depth, suite));
            }
            ("testcase", false) => {
                if self.tests.len() >= self.limits.max_tests {
                    self.notes.fatal(
                        AnnotationKind::TooManyTests,
                        format!(
                            "more than {} test cases: stopped reading there; the report holds the first {}",
                            self.limits.max_tests,
                            self.tests.len()
                        ),
                    );
                    return Step::Stop;
                }
                let suite = self.suites.last().map(|s| s.1.clone()).unwrap_or_default();
                let [name, class, file, time] = self.attrs(e, ["name", "classname", "file", "time"]);
                let name = name.unwrap_or_default();
                let class = class.filter(|c| !c.is_empty());
                let file = file.filter(|c| !c.is_empty());
                let duration_ms = time.and_then(|t| parse_seconds(&t));
                let cap = self.limits.max_excerpt_bytes;
                self.case = Some(CaseBuilder {
                    depth: self.depth,
                    suite,
                    class,
                    name,
                    file,
                    duration_ms,
                    outcome: Outcome::Passed,
                    message: None,
                    message_from_text: false,
                    body: Bounded::new(cap),
                    out: Bounded::new(cap),
                    err: Bounded::new(cap),
                    retries: Vec::new(),
                    retry: None,
                });
            }
            (_, true) => self.start_in_case(e, name),
            _ => {}
        }
        Step::Go
    }

    fn start_in_case(&mut self, e: &BytesStart<'_>, name: &str) {
        let depth = self.depth;
        let case_depth = self.case.as_ref().map(|c| c.depth).unwrap_or(0);
        let in_retry = self.case.as_ref().and_then(|c| c.retry.as_ref()).map(|r| r.depth);
        if let Some(rd) = in_retry {
            // stackTrace / system-out / system-err of a retry record.
            if depth == rd + 1 && matches!(name, "stackTrace" | "system-out" | "system-err") {
                self.sink = Some((depth, Sink::Retry));
                if let Some(r) = self.case.as_mut().and_then(|c| c.retry.as_mut()) {
                    r.text.trim_end();
                    if !r.text.text.is_empty() {
                        r.text.push(&format!("\n--- {name} ---\n"));
                    }
                }
            }
            return;
        }
        if depth != case_depth + 1 {
            return;
        }
        let [message, kind, time] = self.attrs(e, ["message", "type", "time"]);
        let time = time.and_then(|t| parse_seconds(&t));
        let limits = self.limits;
        let mut count_retry_cut = false;
        let Some(case) = self.case.as_mut() else { return };
        let outcome = match name {
            "failure" => Some(Outcome::Failed),
            "error" => Some(Outcome::Error),
            "skipped" => Some(Outcome::Skipped),
            _ => None,
        };
        if let Some(outcome) = outcome {
            // A failure or error outranks a skip; the first failure wins.
            let rank = |o: Outcome| match o {
                Outcome::Passed => 0,
                Outcome::Skipped => 1,
                Outcome::Failed | Outcome::Error => 2,
            };
            if rank(outcome) > rank(case.outcome) {
                case.outcome = outcome;
                case.message = message.or(kind);
                case.message_from_text = case.message.as_deref().is_none_or(|m| m.trim().is_empty());
            }
            self.sink = Some((depth, Sink::Body));
            return;
        }
        let retry = match name {
            "flakyFailure" => Some((RetryKind::Flaky, Outcome::Failed)),
            "flakyError" => Some((RetryKind::Flaky, Outcome::Error)),
            "rerunFailure" => Some((RetryKind::Rerun, Outcome::Failed)),
            "rerunError" => Some((RetryKind::Rerun, Outcome::Error)),
            _ => None,
        };
        if let Some((kind_, outcome)) = retry {
            if case.retries.len() >= limits.max_retries_per_test {
                count_retry_cut = true;
            } else {
                case.retry = Some(RetryBuilder {
                    depth,
                    kind: kind_,
                    outcome,
                    message: message.or(kind),
                    duration_ms: time,
                    text: Bounded::new(limits.max_excerpt_bytes),
                });
                self.sink = Some((depth, Sink::Retry));
            }
        } else if name == "system-out" {
            self.sink = Some((depth, Sink::Out));
        } else if name == "system-err" {
            self.sink = Some((depth, Sink::Err));
        }
        if count_retry_cut {
            let id = self.case.as_ref().map(|c| c.name.clone()).unwrap_or_default();
            self.notes.count(CountedKey::RetriesCut, || format!("in test `{id}`"));
        }
    }

    fn end(&mut self) {
        let depth = self.depth;
        if let Some((d, _)) = self.sink
            && d == depth
        {
            self.sink = None;
            // Back to the retry record's own text, if inside one.
            if let Some(r) = self.case.as_ref().and_then(|c| c.retry.as_ref())
                && r.depth < depth
            {
                self.sink = Some((r.depth, Sink::Retry));
            }
        }
        if let Some(case) = self.case.as_mut()
            && let Some(r) = case.retry.as_ref()
            && r.depth == depth
        {
            let r = case.retry.take().expect("checked");
            let record = self.finish_retry(r);
            if let Some(case) = self.case.as_mut() {
                case.retries.push(record);
            }
            self.sink = None;
            return;
        }
        if self.case.as_ref().is_some_and(|c| c.depth == depth) {
            let case = self.case.take().expect("checked");
            self.finish_case(case);
            return;
        }
        if self.suites.last().is_some_and(|s| s.0 == depth) {
            self.suites.pop();
        }
    }

    fn text(&mut self, s: &str) {
        let Some((_, sink)) = self.sink else { return };
        let Some(case) = self.case.as_mut() else { return };
        match sink {
            Sink::Body => case.body.push(s),
            Sink::Out => case.out.push(s),
            Sink::Err => case.err.push(s),
            Sink::Retry => {
                if let Some(r) = case.retry.as_mut() {
                    r.text.push(s)
                }
            }
        }
    }

    fn finish_retry(&mut self, r: RetryBuilder) -> RetryRecord {
        let message = r.message.filter(|m| !m.trim().is_empty()).or_else(|| first_line(&r.text.text));
        let message = message.map(|m| self.message(&m));
        let mut text = r.text;
        text.trim_end();
        let excerpt = if text.is_empty() { None } else { self.excerpt(text) };
        RetryRecord { kind: r.kind, outcome: r.outcome, message, excerpt, duration_ms: r.duration_ms }
    }

    fn finish_case(&mut self, c: CaseBuilder) {
        let id = TestId::new(&c.suite, c.class.as_deref(), &c.name);
        let message = if c.message_from_text { first_line(&c.body.text) } else { c.message };
        let message = message.map(|m| self.message(&m));
        // Output is kept for what someone will look at: tests that did not
        // pass, or passed only on a retry. A passing test's output would
        // only spend the text budget.
        let keep = c.outcome != Outcome::Passed || !c.retries.is_empty();
        let excerpt = if keep {
            let mut all = Bounded::new(self.limits.max_excerpt_bytes);
            let mut cut = c.body.dropped > 0 || c.out.dropped > 0 || c.err.dropped > 0;
            let (body, _) = c.body.finish();
            all.push(body.trim_end());
            for (label, part) in [("system-out", c.out), ("system-err", c.err)] {
                if part.text.trim().is_empty() && part.dropped == 0 {
                    continue;
                }
                if !all.text.is_empty() {
                    all.push(&format!("\n--- {label} ---\n"));
                }
                let (t, _) = part.finish();
                all.push(t.trim_end());
            }
            cut |= all.dropped > 0;
            if all.text.is_empty() {
                None
            } else {
                if cut {
                    self.notes.count(CountedKey::ExcerptCut, || format!("test `{}`", id.0));
                }
                self.spend(all.finish().0, &id)
            }
        } else {
            None
        };
        self.tests.push(TestCase {
            id,
            suite: c.suite,
            class: c.class,
            name: c.name,
            file: c.file,
            outcome: c.outcome,
            duration_ms: c.duration_ms,
            message,
            excerpt,
            retries: c.retries,
        });
    }

    fn excerpt(&mut self, text: Bounded) -> Option<String> {
        let cut = text.dropped > 0;
        let (s, _) = text.finish();
        if cut {
            self.notes.count(CountedKey::ExcerptCut, || "a runner retry record".into());
        }
        self.spend(s, &TestId::from("a retry record"))
    }

    /// Take `s` out of the report's text budget, or drop it.
    fn spend(&mut self, s: String, id: &TestId) -> Option<String> {
        if s.len() > self.text_budget {
            self.notes.count(CountedKey::TextBudget, || format!("test `{}`", id.0));
            return None;
        }
        self.text_budget -= s.len();
        Some(s)
    }

    fn message(&mut self, m: &str) -> String {
        let (s, cut) = bounded(m.trim(), self.limits.max_message_bytes);
        if cut {
            self.notes
                .count(CountedKey::MessageCut, || format!("`{}…`", &s[..crate::text::floor_char_boundary(&s, 40)]));
        }
        s
    }

    /// The values of the attributes `keys` (unescaped; raw if one holds an
    /// unknown entity), in one pass over the tag, each cut to the message
    /// cap: no attribute we keep needs more.
    fn attrs<const N: usize>(&mut self, e: &BytesStart<'_>, keys: [&str; N]) -> [Option<String>; N] {
        let mut out: [Option<String>; N] = std::array::from_fn(|_| None);
        let cap = self.limits.max_message_bytes.max(TestId::MAX_LEN);
        for a in e.attributes().with_checks(false) {
            let a = match a {
                Ok(a) => a,
                Err(err) => {
                    self.notes.count(CountedKey::BadAttribute, || err.to_string());
                    continue;
                }
            };
            let local = a.key.local_name();
            let Some(i) = keys.iter().position(|k| *k == local.as_ref()) else { continue };
            if out[i].is_some() {
                continue; // the first of a repeated attribute wins
            }
            let v = match a.normalized_value(quick_xml::XmlVersion::Implicit1_0) {
                Ok(v) => v.into_owned(),
                Err(_) => {
                    let key = keys[i];
                    self.notes.count(CountedKey::UnknownEntity, || format!("in attribute `{key}`"));
                    a.value.to_string()
                }
            };
            let v = if v.len() > cap {
                let key = keys[i];
                self.notes.count(CountedKey::MessageCut, || format!("attribute `{key}`"));
                bounded(&v, cap).0
            } else {
                v
            };
            out[i] = Some(v);
        }
        out
    }
}

fn cut_name(s: &str) -> &str {
    &s[..crate::text::floor_char_boundary(s, 64)]
}

/// The first non-empty line of `s`, trimmed.
fn first_line(s: &str) -> Option<String> {
    s.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

/// JUnit `time` (seconds, possibly with thousands separators as old
/// Surefire wrote them: `1,234.5`) to whole milliseconds.
pub(crate) fn parse_seconds(s: &str) -> Option<u64> {
    let cleaned: String = s.trim().chars().filter(|c| *c != ',').collect();
    let secs: f64 = cleaned.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    let ms = (secs * 1000.0).round();
    if ms >= u64::MAX as f64 { Some(u64::MAX) } else { Some(ms as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0.034"), Some(34));
        assert_eq!(parse_seconds("1,200.5"), Some(1_200_500));
        assert_eq!(parse_seconds("-1"), None);
        assert_eq!(parse_seconds("NaN"), None);
        assert_eq!(parse_seconds("1e400"), None);
        assert_eq!(parse_seconds(""), None);
    }
}
