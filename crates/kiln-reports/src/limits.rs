//! The caps every parser holds itself to, and the collector of what it
//! refused or cut.

use crate::model::{Annotation, AnnotationKind, Report, TestCase, TestId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Caps on what a parser reads and keeps. Every one is enforced while
/// streaming, so memory stays near `max_bytes` (one XML event at most)
/// plus `max_total_text_bytes` whatever the input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Input bytes read; the rest is never read (the report is truncated).
    pub max_bytes: u64,
    /// Element nesting (JUnit) or subtest nesting (TAP).
    pub max_depth: usize,
    /// Elements (start and empty tags) in a JUnit document.
    pub max_elements: u64,
    /// Test cases in one report.
    pub max_tests: usize,
    /// One test's (or retry record's) message.
    pub max_message_bytes: usize,
    /// One test's (or retry record's) excerpt.
    pub max_excerpt_bytes: usize,
    /// Runner retry records kept per test (more are counted in the
    /// annotation, not kept).
    pub max_retries_per_test: usize,
    /// All messages and excerpts of one report together; past it, further
    /// excerpts are dropped (tests and outcomes are still read).
    pub max_total_text_bytes: usize,
    /// One TAP line; the rest of a longer line is skipped.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: 64 << 20,
            max_depth: 64,
            max_elements: 4_000_000,
            max_tests: 250_000,
            max_message_bytes: 2 << 10,
            max_excerpt_bytes: 16 << 10,
            max_retries_per_test: 16,
            max_total_text_bytes: 32 << 20,
            max_line_bytes: 64 << 10,
        }
    }
}

/// Collects annotations: fatal ones as they happen, repeated repairs
/// (invalid UTF-8, unknown entities, cut texts …) counted and reported
/// once each with their first occurrence.
#[derive(Default)]
pub(crate) struct Notes {
    list: Vec<Annotation>,
    counted: BTreeMap<CountedKey, (u64, String)>,
    pub truncated: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CountedKey {
    UnknownEntity,
    MessageCut,
    ExcerptCut,
    TextBudget,
    DuplicateIds,
    BadAttribute,
    RetriesCut,
    LineCut,
}

impl Notes {
    /// Something that makes the report incomplete.
    pub fn fatal(&mut self, kind: AnnotationKind, message: String) {
        self.truncated = true;
        self.list.push(Annotation { kind, message });
    }

    /// Something worth saying that leaves the report complete.
    pub fn note(&mut self, kind: AnnotationKind, message: String) {
        self.list.push(Annotation { kind, message });
    }

    /// One more of a repeated repair; `first` describes the first.
    pub fn count(&mut self, key: CountedKey, first: impl FnOnce() -> String) {
        self.counted.entry(key).or_insert_with(|| (0, first())).0 += 1;
    }

    pub fn finish(mut self, report: &mut Report, utf8_replaced: u64, utf8_first: Option<u64>) {
        if utf8_replaced > 0 {
            self.list.push(Annotation {
                kind: AnnotationKind::InvalidUtf8,
                message: format!(
                    "{utf8_replaced} invalid UTF-8 byte sequence(s) replaced with U+FFFD (first at byte {}); the report is otherwise read as written",
                    utf8_first.unwrap_or(0)
                ),
            });
        }
        for (key, (n, first)) in self.counted {
            let (kind, what) = match key {
                CountedKey::UnknownEntity => (
                    AnnotationKind::UnknownEntity,
                    "reference(s) to entities other than the five XML ones kept as written",
                ),
                CountedKey::MessageCut => (AnnotationKind::TextCut, "message(s) cut to the message cap"),
                CountedKey::ExcerptCut => (AnnotationKind::TextCut, "excerpt(s) cut to the excerpt cap"),
                CountedKey::TextBudget => (
                    AnnotationKind::TextCut,
                    "excerpt(s) dropped: the report's total text budget was spent (outcomes are complete)",
                ),
                CountedKey::DuplicateIds => {
                    (AnnotationKind::DuplicateIds, "test id(s) repeated in this report got a ` #N` suffix")
                }
                CountedKey::BadAttribute => (AnnotationKind::BadAttribute, "unreadable attribute(s) ignored"),
                CountedKey::RetriesCut => {
                    (AnnotationKind::TextCut, "runner retry record(s) past the per-test cap not kept")
                }
                CountedKey::LineCut => (AnnotationKind::TextCut, "line(s) longer than the line cap cut"),
            };
            self.list.push(Annotation { kind, message: format!("{n} {what}; first: {first}") });
        }
        report.truncated |= self.truncated;
        report.annotations.extend(self.list);
    }
}

/// Give every repeated id of a report a ` #2`, ` #3` … suffix in
/// document order (sorting, not hashing: no id is cloned for it).
pub(crate) fn dedupe_ids(tests: &mut [TestCase], notes: &mut Notes) {
    // Usually there is none: a set of borrowed ids says so without a sort.
    let mut seen = std::collections::HashSet::with_capacity(tests.len());
    if tests.iter().all(|t| seen.insert(t.id.as_str())) {
        return;
    }
    drop(seen);
    let mut order: Vec<usize> = (0..tests.len()).collect();
    order.sort_by(|a, b| tests[*a].id.cmp(&tests[*b].id).then(a.cmp(b)));
    let mut i = 0;
    while i < order.len() {
        let mut j = i + 1;
        while j < order.len() && tests[order[j]].id == tests[order[i]].id {
            j += 1;
        }
        for (n, &k) in order[i + 1..j].iter().enumerate() {
            let first = &tests[order[i]].id.0;
            notes.count(CountedKey::DuplicateIds, || format!("`{first}`"));
            let id = format!("{} #{}", tests[k].id.0, n + 2);
            tests[k].id = TestId(id);
        }
        i = j;
    }
}
