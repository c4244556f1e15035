//! TAP 13 and TAP 14 (and the versionless TAP older producers write).
//!
//! Read line by line, each line bounded ([`Limits::max_line_bytes`]):
//! test points (`ok`/`not ok`, number, description, `# SKIP`/`# TODO`
//! directives, `\#` escapes), plans (`1..N`, `1..0 # SKIP why`), YAML
//! diagnostics blocks (`---` … `...`, indented two spaces past their test
//! point; only top-level scalar keys are read: `duration_ms`, `message`,
//! else `error` as Node's runner writes it; the block itself becomes the
//! excerpt), subtests (indented four spaces per level, TAP 14 and Node's
//! TAP 13; the `# Subtest:` comment is optional) and `Bail out!`.
//!
//! Subtests: a test point with subtests is a summary of them, so its
//! subtests are the report's tests (their class is the enclosing test
//! points' names joined with `" / "`), and the summary itself is reported
//! only when it failed while none of its subtests did (a failed plan, a
//! hook), so that failure is not lost.
//!
//! Outcomes: `ok` → passed; `not ok` → failed; `# SKIP` → skipped; `not
//! ok # TODO` → skipped (TAP: a TODO failure is not a failure; its message
//! says TODO); `ok # TODO` → passed.
//!
//! Truncated when: the input cap is hit, a `Bail out!`, fewer test points
//! than the plan (or no plan at all: TAP's sign of a producer that
//! stopped early), subtests left open at the end, a cap on depth or test
//! count.

use crate::input::{Capped, Utf8Lossy};
use crate::limits::{CountedKey, Limits, Notes};
use crate::model::{AnnotationKind, Format, Outcome, Report, TestCase, TestId};
use crate::text::{Bounded, bounded};
use std::io::{BufRead, BufReader, Read};

/// Parse a TAP stream from `input`; `source` names it (usually the
/// report's path relative to the workspace) and is every test's suite.
/// Never fails and never panics; see [`crate::parse_junit`].
pub fn parse_tap<R: Read>(input: R, source: &str, limits: &Limits) -> Report {
    let mut r = BufReader::with_capacity(64 * 1024, Utf8Lossy::new(Capped::new(input, limits.max_bytes)));
    let mut p = Tap::new(source, limits);
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let mut yaml: Option<Yaml> = None;
    loop {
        let (got, cut) = match read_line_bounded(&mut r, &mut line, limits.max_line_bytes) {
            Ok(x) => x,
            Err(e) => {
                p.notes.fatal(AnnotationKind::Io, format!("reading the report failed after line {line_no}: {e}"));
                break;
            }
        };
        if !got {
            break;
        }
        line_no += 1;
        if cut {
            p.notes.count(CountedKey::LineCut, || format!("line {line_no}"));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if let Some(y) = yaml.as_mut() {
            let indent = leading_spaces(text);
            if text.trim() == "..." && indent <= y.indent {
                let y = yaml.take().expect("checked");
                p.apply_yaml(y);
            } else {
                y.push(text);
            }
            continue;
        }
        let indent = leading_spaces(text);
        let body = &text[indent..];
        // A YAML block opens right after a test point, two spaces in.
        if body == "---"
            && let Some(target) = p.yaml_target.take()
            && indent >= target.0 * 4
        {
            yaml = Some(Yaml::new(indent, target, limits));
            continue;
        }
        p.yaml_target = None;
        let level = indent / 4;
        if level > limits.max_depth {
            p.notes.fatal(
                AnnotationKind::TooDeep,
                format!(
                    "subtests nested deeper than {} levels at line {line_no}: stopped reading there; the report holds the test points before",
                    limits.max_depth
                ),
            );
            break;
        }
        if !p.line(level, body, line_no) {
            break;
        }
    }
    if let Some(y) = yaml.take() {
        p.apply_yaml(y);
    }
    let lossy = r.get_ref();
    let capped = lossy.get_ref();
    let mut report = Report::new(Format::Tap);
    report.bytes_read = capped.read;
    if capped.exceeded {
        p.notes.fatal(
            AnnotationKind::InputTooLarge,
            format!(
                "the report is larger than the {} byte cap: read the first {} bytes only; the report holds the test points in them",
                limits.max_bytes, capped.read
            ),
        );
    }
    let (replaced, first) = (lossy.replaced, lossy.first_at);
    p.finish(&mut report);
    p.notes.finish(&mut report, replaced, first);
    report
}

/// Read one line (up to and including `\n`) keeping at most `max` bytes of
/// it; the rest of a longer line is consumed and dropped. Returns (a line
/// was read, it was cut).
fn read_line_bounded<R: BufRead>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<(bool, bool)> {
    buf.clear();
    let mut any = false;
    let mut cut = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok((any, cut));
        }
        any = true;
        let (take, done) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if take > room {
            cut = true;
        }
        buf.extend_from_slice(&avail[..take.min(room)]);
        r.consume(take);
        if done {
            return Ok((true, cut));
        }
    }
}

fn leading_spaces(s: &str) -> usize {
    s.len() - s.trim_start_matches(' ').len()
}

#[derive(Default)]
struct Level {
    /// Finished tests of this level (and lifted subtests), in order.
    pending: Vec<TestCase>,
    plan: Option<u64>,
    points: u64,
}

struct Tap<'l> {
    source: String,
    limits: &'l Limits,
    notes: Notes,
    levels: Vec<Level>,
    created: usize,
    /// (level, index into that level's pending) of the test a YAML block
    /// right after would describe.
    yaml_target: Option<(usize, Option<usize>)>,
    /// The same, for `#` diagnostics lines; kept across them.
    diag_target: Option<(usize, Option<usize>)>,
    seen_anything: bool,
    stopped: bool,
    text_budget: usize,
}

struct Yaml {
    indent: usize,
    target: (usize, Option<usize>),
    lines: Vec<String>,
    text: Bounded,
}

impl Yaml {
    fn new(indent: usize, target: (usize, Option<usize>), limits: &Limits) -> Yaml {
        Yaml { indent, target, lines: Vec::new(), text: Bounded::new(limits.max_excerpt_bytes) }
    }

    fn push(&mut self, line: &str) {
        let strip = leading_spaces(line).min(self.indent);
        let l = &line[strip..];
        self.text.push(l);
        self.text.push("\n");
        // Only the keys' lines are needed for the scalars; bound them too.
        if self.lines.len() < 4096 {
            self.lines.push(l.to_string());
        }
    }

    /// A top-level scalar: plain, quoted or a `|`/`>` block.
    fn scalar(&self, key: &str) -> Option<String> {
        let prefix = format!("{key}:");
        let i = self.lines.iter().position(|l| l.starts_with(&prefix))?;
        let v = self.lines[i][prefix.len()..].trim();
        if v.starts_with('|') || v.starts_with('>') {
            let mut out = Vec::new();
            for l in &self.lines[i + 1..] {
                if !l.is_empty() && !l.starts_with(' ') {
                    break;
                }
                out.push(l.trim());
            }
            let joined = out.join("\n");
            return Some(joined.trim().to_string());
        }
        if let Some(q) = v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            return Some(q.replace("''", "'"));
        }
        if let Some(q) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            return Some(q.replace("\\n", "\n").replace("\\\"", "\"").replace("\\\\", "\\"));
        }
        Some(v.to_string())
    }
}

impl<'l> Tap<'l> {
    fn new(source: &str, limits: &'l Limits) -> Tap<'l> {
        Tap {
            source: source.to_string(),
            limits,
            notes: Notes::default(),
            levels: vec![Level::default()],
            created: 0,
            yaml_target: None,
            diag_target: None,
            seen_anything: false,
            stopped: false,
            text_budget: limits.max_total_text_bytes,
        }
    }

    fn level_mut(&mut self, level: usize) -> &mut Level {
        while self.levels.len() <= level {
            self.levels.push(Level::default());
        }
        &mut self.levels[level]
    }

    /// One non-YAML line; false to stop reading.
    fn line(&mut self, level: usize, body: &str, line_no: u64) -> bool {
        if let Some(reason) = body.strip_prefix("Bail out!") {
            let reason = reason.trim();
            self.notes.fatal(
                AnnotationKind::BailOut,
                if reason.is_empty() {
                    format!("the producer bailed out at line {line_no}: the run stopped early")
                } else {
                    format!(
                        "the producer bailed out at line {line_no} (\"{}\"): the run stopped early",
                        bounded(reason, 200).0
                    )
                },
            );
            self.stopped = true;
            return false;
        }
        if let Some(diag) = body.strip_prefix('#')
            && !diag.trim_start().starts_with("Subtest")
            && let Some((l, Some(idx))) = self.diag_target
            && l == level
        {
            // Test::More-style diagnostics of the test point just before.
            self.diag(level, idx, diag.strip_prefix(' ').unwrap_or(diag));
            return true;
        }
        if body.starts_with("TAP version") || body.starts_with("pragma ") || body.starts_with('#') {
            self.seen_anything |= body.starts_with("TAP version");
            return true;
        }
        self.diag_target = None;
        if let Some(plan) = parse_plan(body) {
            self.seen_anything = true;
            self.level_mut(level).plan = Some(plan);
            return true;
        }
        let Some(point) = parse_point(body) else {
            return true; // not TAP: a producer's own output, ignored
        };
        self.seen_anything = true;
        if self.created >= self.limits.max_tests {
            self.notes.fatal(
                AnnotationKind::TooManyTests,
                format!(
                    "more than {} test points at line {line_no}: stopped reading there; the report holds the first {}",
                    self.limits.max_tests, self.created
                ),
            );
            self.stopped = true;
            return false;
        }
        self.created += 1;
        // Subtests of this point, if it has any, are one level in.
        let children = if self.levels.len() > level + 1 {
            let child = self.levels.remove(level + 1);
            // Deeper levels left open belong to nothing now.
            self.levels.truncate(level + 1);
            if let Some(plan) = child.plan
                && child.points < plan
            {
                self.notes.fatal(
                    AnnotationKind::PlanMismatch,
                    format!(
                        "subtest `{}` planned {plan} test points but has {} (line {line_no}): it stopped early",
                        point.name, child.points
                    ),
                );
            }
            child.pending
        } else {
            Vec::new()
        };
        let points = self.level_mut(level).points;
        let name = if point.name.is_empty() {
            format!("test {}", point.number.unwrap_or(points + 1))
        } else {
            point.name.clone()
        };
        let case = TestCase {
            id: TestId(String::new()),
            suite: self.source.clone(),
            class: None,
            name: name.clone(),
            file: None,
            outcome: point.outcome,
            duration_ms: None,
            message: point.message.map(|m| bounded(&m, self.limits.max_message_bytes).0),
            excerpt: None,
            retries: Vec::new(),
        };
        let any_child_failed = children.iter().any(|c| c.outcome.is_failure());
        let include_self = children.is_empty() || (case.outcome.is_failure() && !any_child_failed);
        let lvl = self.level_mut(level);
        lvl.points += 1;
        for mut c in children {
            c.class = Some(match c.class.take() {
                None => name.clone(),
                Some(inner) => format!("{name} / {inner}"),
            });
            lvl.pending.push(c);
        }
        let idx = if include_self {
            lvl.pending.push(case);
            Some(lvl.pending.len() - 1)
        } else {
            None
        };
        self.yaml_target = Some((level, idx));
        self.diag_target = Some((level, idx));
        true
    }

    /// A `#` comment line right after a test point that did not pass: its
    /// diagnostics, added to its excerpt (bounded; the total budget is
    /// spent when the excerpt is finished).
    fn diag(&mut self, level: usize, idx: usize, line: &str) {
        let cap = self.limits.max_excerpt_bytes;
        let Some(case) = self.levels.get_mut(level).and_then(|l| l.pending.get_mut(idx)) else { return };
        if case.outcome == Outcome::Passed {
            return;
        }
        if case.message.is_none() && !line.trim().is_empty() {
            case.message = Some(bounded(line.trim(), self.limits.max_message_bytes).0);
        }
        let e = case.excerpt.get_or_insert_with(String::new);
        if e.len() >= cap {
            return;
        }
        let mut b = Bounded::new(cap - e.len());
        b.push(line);
        b.push("\n");
        let len = b.text.len();
        if len > self.text_budget {
            return;
        }
        self.text_budget -= len;
        e.push_str(&b.text);
    }

    fn apply_yaml(&mut self, y: Yaml) {
        let (level, Some(idx)) = y.target else { return };
        let duration =
            y.scalar("duration_ms").and_then(|d| d.parse::<f64>().ok()).filter(|d| d.is_finite() && *d >= 0.0);
        let message = y.scalar("message").or_else(|| y.scalar("error")).filter(|m| !m.is_empty());
        let max_message = self.limits.max_message_bytes;
        let Some(case) = self.levels.get_mut(level).and_then(|l| l.pending.get_mut(idx)) else { return };
        if let Some(d) = duration {
            case.duration_ms = Some(d.round().min(u64::MAX as f64) as u64);
        }
        if case.outcome != Outcome::Passed {
            if case.message.is_none()
                && let Some(m) = message
            {
                case.message = Some(bounded(m.trim(), max_message).0);
            }
            let cut = y.text.dropped > 0;
            let (text, _) = y.text.finish();
            if text.len() <= self.text_budget {
                self.text_budget -= text.len();
                match case.excerpt.as_mut() {
                    Some(e) => e.push_str(&text),
                    None => case.excerpt = Some(text),
                }
            } else {
                let n = case.name.clone();
                self.notes.count(CountedKey::TextBudget, || format!("test `{n}`"));
            }
            if cut {
                let n = case.name.clone();
                self.notes.count(CountedKey::ExcerptCut, || format!("test `{n}`"));
            }
        }
    }

    fn finish(&mut self, report: &mut Report) {
        let capped = self.notes.truncated;
        if self.levels.len() > 1 {
            let open: usize = self.levels[1..].iter().map(|l| l.pending.len()).sum();
            if !self.stopped && !capped {
                self.notes.fatal(
                    AnnotationKind::Malformed,
                    format!("the report ends inside a subtest ({open} of its test points have no closing test point): it was cut off"),
                );
            }
            // Keep what finished, under no parent.
            let rest: Vec<TestCase> = self.levels.drain(1..).flat_map(|l| l.pending).collect();
            self.levels[0].pending.extend(rest);
        }
        let top = &self.levels[0];
        if !self.stopped && !capped {
            match top.plan {
                Some(plan) if top.points < plan => self.notes.fatal(
                    AnnotationKind::PlanMismatch,
                    format!(
                        "the plan announced {plan} test points but the report has {}: the run stopped early",
                        top.points
                    ),
                ),
                Some(plan) if top.points > plan => self.notes.note(
                    AnnotationKind::PlanMismatch,
                    format!("the plan announced {plan} test points but the report has {}", top.points),
                ),
                Some(_) => {}
                None if !self.seen_anything => self.notes.fatal(
                    AnnotationKind::Empty,
                    "no TAP version line, plan or test point: this is not a TAP report".into(),
                ),
                None => self.notes.fatal(
                    AnnotationKind::PlanMismatch,
                    format!("no plan (`1..N`) after {} test points: the run may have stopped early", top.points),
                ),
            }
        }
        let mut tests = std::mem::take(&mut self.levels[0].pending);
        for t in &mut tests {
            t.id = TestId::new(&t.suite, t.class.as_deref(), &t.name);
        }
        crate::limits::dedupe_ids(&mut tests, &mut self.notes);
        report.tests = tests;
    }
}

struct Point {
    outcome: Outcome,
    number: Option<u64>,
    name: String,
    message: Option<String>,
}

/// `1..N` with an optional `# …` comment; N.
fn parse_plan(body: &str) -> Option<u64> {
    let rest = body.strip_prefix("1..")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = rest[digits.len()..].trim_start();
    if digits.is_empty() || !(after.is_empty() || after.starts_with('#')) {
        return None;
    }
    digits.parse().ok()
}

fn parse_point(body: &str) -> Option<Point> {
    let (ok, rest) = if let Some(r) = body.strip_prefix("not ok") {
        (false, r)
    } else if let Some(r) = body.strip_prefix("ok") {
        (true, r)
    } else {
        return None;
    };
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None; // "okay", "nothing"
    }
    let rest = rest.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let number = digits.parse().ok();
    let rest = rest[digits.len()..].trim_start();
    let rest = rest.strip_prefix('-').unwrap_or(rest).trim_start();
    // The first unescaped `#` starts a directive if SKIP or TODO follows.
    let bytes = rest.as_bytes();
    let mut split = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'#' => {
                let d = rest[i + 1..].trim_start();
                let upper: String = d.chars().take(4).collect::<String>().to_ascii_uppercase();
                if upper == "SKIP" || upper == "TODO" {
                    split = Some(i);
                    break;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    let (desc, directive) = match split {
        Some(i) => (&rest[..i], Some(rest[i + 1..].trim())),
        None => (rest, None),
    };
    let name = unescape(desc.trim());
    let (outcome, message) = match directive {
        Some(d) => {
            let kind = d[..4].to_ascii_uppercase();
            // "SKIP", "skipped", "Skipping: …": the reason follows the word.
            let reason = d[4..].trim_start_matches(|c: char| c.is_ascii_alphabetic()).trim_start_matches(':').trim();
            let reason = (!reason.is_empty()).then(|| unescape(reason));
            match (kind.as_str(), ok) {
                ("SKIP", _) => (Outcome::Skipped, reason),
                ("TODO", false) => {
                    (Outcome::Skipped, Some(reason.map(|r| format!("TODO: {r}")).unwrap_or_else(|| "TODO".into())))
                }
                _ => (Outcome::Passed, None),
            }
        }
        None => (if ok { Outcome::Passed } else { Outcome::Failed }, None),
    };
    Some(Point { outcome, number, name, message })
}

/// TAP escapes: `\#` and `\\`.
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('#' | '\\')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points() {
        let p = parse_point("not ok 3 - a \\# b # TODO later").unwrap();
        assert_eq!(
            (p.outcome, p.name.as_str(), p.message.as_deref()),
            (Outcome::Skipped, "a # b", Some("TODO: later"))
        );
        let p = parse_point("ok 2 skipped one # SKIP not on linux").unwrap();
        assert_eq!(
            (p.outcome, p.name.as_str(), p.message.as_deref()),
            (Outcome::Skipped, "skipped one", Some("not on linux"))
        );
        let p = parse_point("ok 4 - issue #12 fixed").unwrap();
        assert_eq!((p.outcome, p.name.as_str()), (Outcome::Passed, "issue #12 fixed"));
        let p = parse_point("ok 5 # skip").unwrap();
        assert_eq!((p.outcome, p.name.as_str(), p.message), (Outcome::Skipped, "", None));
        assert!(parse_point("okay").is_none());
        assert!(parse_point("not ok").is_some());
        assert_eq!(parse_plan("1..4"), Some(4));
        assert_eq!(parse_plan("1..0 # SKIP no db"), Some(0));
        assert_eq!(parse_plan("1..x"), None);
    }
}
