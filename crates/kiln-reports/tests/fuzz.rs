//! Property tests of both parsers: arbitrary bytes and structured
//! mutations of well-formed reports never panic, and every cap holds.

use kiln_reports::{Limits, Outcome, Report, TestId, parse_junit, parse_tap};
use proptest::prelude::*;

/// Small caps, so the fuzzer reaches them.
fn small() -> Limits {
    Limits {
        max_bytes: 16 << 10,
        max_depth: 8,
        max_elements: 400,
        max_tests: 20,
        max_message_bytes: 64,
        max_excerpt_bytes: 128,
        max_retries_per_test: 3,
        max_total_text_bytes: 1024,
        max_line_bytes: 256,
    }
}

/// Room for the cut marker (`… [N more bytes cut]`).
const MARKER: usize = 40;

fn check_caps(r: &Report, l: &Limits) {
    assert!(r.bytes_read <= l.max_bytes);
    assert!(r.tests.len() <= l.max_tests);
    let mut text = 0;
    for t in &r.tests {
        assert!(t.id.as_str().len() <= TestId::MAX_LEN + 3 + 8, "{}", t.id);
        assert!(!t.id.as_str().contains('\n'));
        if let Some(m) = &t.message {
            assert!(m.len() <= l.max_message_bytes + MARKER, "{m:?}");
        }
        if let Some(e) = &t.excerpt {
            assert!(e.len() <= l.max_excerpt_bytes + MARKER, "{}", e.len());
            text += e.len();
        }
        assert!(t.retries.len() <= l.max_retries_per_test);
        for x in &t.retries {
            assert!(x.outcome.is_failure());
            if let Some(e) = &x.excerpt {
                assert!(e.len() <= l.max_excerpt_bytes + MARKER);
                text += e.len();
            }
        }
    }
    assert!(text <= l.max_total_text_bytes, "{text}");
    // Anything fatal is said.
    if r.truncated {
        assert!(!r.annotations.is_empty());
    }
}

/// One generated test case and what it should parse to.
#[derive(Clone, Debug)]
struct Case {
    name: String,
    outcome: Outcome,
    flaky: usize,
    out: String,
}

fn text() -> impl Strategy<Value = String> {
    // Includes the characters that must be escaped, and non-ASCII.
    proptest::string::string_regex("[a-zA-Z0-9 <>&\"'é€😀\\n]{0,40}").unwrap()
}

fn case() -> impl Strategy<Value = Case> {
    (
        text(),
        prop_oneof![Just(Outcome::Passed), Just(Outcome::Failed), Just(Outcome::Error), Just(Outcome::Skipped)],
        0usize..3,
        text(),
    )
        .prop_map(|(name, outcome, flaky, out)| Case { name, outcome, flaky, out })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\n', "&#10;")
}

fn junit_doc(cases: &[Case]) -> String {
    let mut d = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites><testsuite name=\"fuzz\">");
    for (i, c) in cases.iter().enumerate() {
        d.push_str(&format!("<testcase classname=\"c{i}\" name=\"{}\" time=\"0.{i}\">", esc(&c.name)));
        for _ in 0..c.flaky {
            d.push_str(&format!(
                "<flakyFailure message=\"{}\"><stackTrace>{}</stackTrace></flakyFailure>",
                esc(&c.out),
                esc(&c.out)
            ));
        }
        match c.outcome {
            Outcome::Passed => {}
            Outcome::Failed => d.push_str(&format!("<failure message=\"{}\">{}</failure>", esc(&c.out), esc(&c.out))),
            Outcome::Error => {
                d.push_str(&format!("<error message=\"m\"><![CDATA[{}]]></error>", c.out.replace("]]>", "")))
            }
            Outcome::Skipped => d.push_str("<skipped/>"),
        }
        d.push_str(&format!("<system-out>{}</system-out></testcase>", esc(&c.out)));
    }
    d.push_str("</testsuite></testsuites>");
    d
}

fn tap_doc(cases: &[Case]) -> String {
    let mut d = format!("TAP version 14\n1..{}\n", cases.len());
    for (i, c) in cases.iter().enumerate() {
        let name = c.name.replace('\\', "\\\\").replace('#', "\\#").replace('\n', " ");
        let line = match c.outcome {
            Outcome::Passed => format!("ok {} - {name}\n", i + 1),
            Outcome::Failed | Outcome::Error => format!("not ok {} - {name}\n", i + 1),
            Outcome::Skipped => format!("ok {} - {name} # SKIP why\n", i + 1),
        };
        d.push_str(&line);
        if c.outcome != Outcome::Passed {
            d.push_str(&format!(
                "  ---\n  message: '{}'\n  duration_ms: {i}\n  ...\n",
                c.out.replace('\'', "''").replace('\n', " ")
            ));
        }
    }
    d
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Duplicate(usize, usize),
    Delete(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 1..8),
                Just(b"<!DOCTYPE x [<!ENTITY a \"b\">]>".to_vec()),
                Just(b"<testcase name=\"x\">".to_vec()),
                Just(b"</testsuite>".to_vec()),
                Just(b"&a;".to_vec()),
                Just(b"\xff\xfe".to_vec()),
                Just(b"<![CDATA[".to_vec()),
                Just(b"\n    ok 1 - sub\n".to_vec()),
                Just(b"\n        ok\n".to_vec()),
                Just(b"\n    not ok # SKIP\n    1..3\n".to_vec()),
                Just(b"\n  ---\n  message: |\n".to_vec()),
                Just(b"\nBail out!\n".to_vec()),
            ]
        )
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Delete(a, b)),
    ]
}

fn apply(mut d: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = d.len().max(1);
        match m {
            Mutation::Truncate(at) => d.truncate(at % len),
            Mutation::Insert(at, b) => {
                let at = at % len;
                let at = at.min(d.len());
                d.splice(at..at, b.iter().copied());
            }
            Mutation::Duplicate(a, n) => {
                let a = (a % len).min(d.len());
                let end = (a + n % 200).min(d.len());
                let slice = d[a..end].to_vec();
                d.splice(end..end, slice);
            }
            Mutation::Delete(a, n) => {
                let a = (a % len).min(d.len());
                let end = (a + n % 50).min(d.len());
                d.drain(a..end);
            }
        }
    }
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn junit_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let l = small();
        check_caps(&parse_junit(&bytes[..], &l), &l);
    }

    #[test]
    fn tap_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let l = small();
        check_caps(&parse_tap(&bytes[..], "fuzz.tap", &l), &l);
    }

    /// Well-formed reports parse completely, with the generated outcomes.
    #[test]
    fn junit_well_formed_round_trip(cases in proptest::collection::vec(case(), 0..12)) {
        let l = Limits::default();
        let r = parse_junit(junit_doc(&cases).as_bytes(), &l);
        prop_assert!(!r.truncated, "{:?}", r.annotations);
        prop_assert_eq!(r.tests.len(), cases.len());
        for (t, c) in r.tests.iter().zip(&cases) {
            prop_assert_eq!(t.outcome, c.outcome);
            prop_assert_eq!(&t.name, &c.name);
            prop_assert_eq!(t.retries.len(), c.flaky);
        }
    }

    #[test]
    fn tap_well_formed_round_trip(cases in proptest::collection::vec(case(), 0..12)) {
        let l = Limits::default();
        let r = parse_tap(tap_doc(&cases).as_bytes(), "f.tap", &l);
        prop_assert!(!r.truncated, "{:?}", r.annotations);
        prop_assert_eq!(r.tests.len(), cases.len());
        for (t, c) in r.tests.iter().zip(&cases) {
            let want = if c.outcome == Outcome::Error { Outcome::Failed } else { c.outcome };
            prop_assert_eq!(t.outcome, want);
        }
    }

    #[test]
    fn junit_mutated(cases in proptest::collection::vec(case(), 0..30), ms in proptest::collection::vec(mutation(), 1..4)) {
        let l = small();
        let doc = apply(junit_doc(&cases).into_bytes(), &ms);
        check_caps(&parse_junit(&doc[..], &l), &l);
    }

    #[test]
    fn tap_mutated(cases in proptest::collection::vec(case(), 0..30), ms in proptest::collection::vec(mutation(), 1..4)) {
        let l = small();
        let doc = apply(tap_doc(&cases).into_bytes(), &ms);
        check_caps(&parse_tap(&doc[..], "m.tap", &l), &l);
    }
}
