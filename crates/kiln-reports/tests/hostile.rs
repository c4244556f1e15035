//! The hostile corpus: every input here is refused or truncated with a
//! clear annotation, never expanded, never read past the cap, never a
//! panic. The annotations' exact text is snapshotted at the end.

use kiln_reports::{AnnotationKind, Limits, Outcome, Report, parse_junit, parse_tap};
use std::io::Read;

fn junit(s: &[u8]) -> Report {
    parse_junit(s, &Limits::default())
}

fn kinds(r: &Report) -> Vec<AnnotationKind> {
    r.annotations.iter().map(|a| a.kind).collect()
}

const BILLION_LAUGHS: &str = r#"<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<testsuite name="s"><testcase name="&lol9;"><failure message="&lol9;">&lol9;</failure></testcase></testsuite>"#;

#[test]
fn billion_laughs_is_refused_unexpanded() {
    let r = junit(BILLION_LAUGHS.as_bytes());
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::DoctypeRefused]);
    assert!(r.tests.is_empty());
}

const XXE: &str = r#"<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<testsuite name="s"><testcase name="t"><failure message="&xxe;">&xxe;</failure></testcase></testsuite>"#;

#[test]
fn external_entity_is_refused_and_never_read() {
    let r = junit(XXE.as_bytes());
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::DoctypeRefused]);
    let all = serde_json::to_string(&r).unwrap();
    assert!(!all.contains("root:"), "{all}");
}

#[test]
fn undeclared_entities_are_kept_as_written() {
    // Without a DOCTYPE an entity cannot be declared: `&xxe;` stays text.
    let r = junit(br#"<testsuite name="s"><testcase name="t &amp; &#x41;"><failure message="m &xxe;">body &xxe; &lt;</failure></testcase></testsuite>"#);
    assert!(!r.truncated, "{:?}", r.annotations);
    let t = &r.tests[0];
    assert_eq!(t.name, "t & A");
    assert_eq!(t.message.as_deref(), Some("m &xxe;"));
    assert_eq!(t.excerpt.as_deref(), Some("body &xxe; <"));
    assert_eq!(kinds(&r), vec![AnnotationKind::UnknownEntity]);
}

#[test]
fn deep_nesting_stops_at_the_depth_cap() {
    let mut doc = String::from("<testsuites><testsuite name=\"s\"><testcase name=\"before\"/>");
    doc.push_str(&"<a>".repeat(100_000));
    doc.push_str(&"</a>".repeat(100_000));
    doc.push_str("</testsuite></testsuites>");
    let r = junit(doc.as_bytes());
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::TooDeep]);
    assert_eq!(r.tests.len(), 1, "the test before the bomb is kept");
    // Deep inside a test case too.
    let mut doc = String::from("<testsuite><testcase name=\"t\"><failure>");
    doc.push_str(&"<x>".repeat(100_000));
    let r = junit(doc.as_bytes());
    assert_eq!(kinds(&r), vec![AnnotationKind::TooDeep]);
    assert!(r.tests.is_empty(), "an unfinished test case is not reported");
}

/// A lazily generated stream of `total` bytes: a header, then the same
/// chunk over and over. Counts what was pulled from it.
struct Lazy {
    header: Vec<u8>,
    chunk: Vec<u8>,
    total: u64,
    pos: u64,
}

impl Lazy {
    fn new(header: &str, chunk: &str, total: u64) -> Lazy {
        Lazy { header: header.as_bytes().to_vec(), chunk: chunk.as_bytes().to_vec(), total, pos: 0 }
    }
}

impl Read for Lazy {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < buf.len() && self.pos < self.total {
            let p = self.pos as usize;
            buf[n] = if p < self.header.len() {
                self.header[p]
            } else {
                self.chunk[(p - self.header.len()) % self.chunk.len()]
            };
            n += 1;
            self.pos += 1;
        }
        Ok(n)
    }
}

const GB: u64 = 1 << 30;

#[test]
fn a_1gb_junit_stream_stops_at_the_size_cap() {
    let limits = Limits::default();
    let case = format!(
        "<testcase classname=\"c\" name=\"t\" time=\"0.001\"><failure message=\"m\">{}</failure></testcase>\n",
        "x".repeat(900)
    );
    let mut src = Lazy::new("<?xml version=\"1.0\"?><testsuites><testsuite name=\"big\">", &case, GB);
    let r = parse_junit(&mut src, &limits);
    assert!(r.truncated);
    // The excerpts past the text budget are dropped too (and said).
    assert_eq!(kinds(&r), vec![AnnotationKind::InputTooLarge, AnnotationKind::TextCut, AnnotationKind::DuplicateIds]);
    assert_eq!(r.bytes_read, limits.max_bytes);
    // Pulled from the source: the cap and one probe byte, nothing more.
    assert_eq!(src.pos, limits.max_bytes + 1);
    assert!(r.tests.len() > 60_000, "{}", r.tests.len());
    assert!(r.tests.iter().all(|t| t.outcome == Outcome::Failed));
}

#[test]
fn a_1gb_text_node_stops_at_the_size_cap() {
    let limits = Limits { max_bytes: 16 << 20, ..Limits::default() };
    let mut src = Lazy::new("<testsuite><testcase name=\"t\"><system-out>", "y", GB);
    let r = parse_junit(&mut src, &limits);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::InputTooLarge]);
    assert_eq!(src.pos, limits.max_bytes + 1);
}

#[test]
fn a_1gb_tap_stream_stops_at_the_size_cap() {
    let limits = Limits { max_bytes: 16 << 20, ..Limits::default() };
    let mut src = Lazy::new("TAP version 14\n", &format!("ok - a test point {}\n", "p".repeat(100)), GB);
    let r = parse_tap(&mut src, "big.tap", &limits);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::InputTooLarge, AnnotationKind::DuplicateIds]);
    assert_eq!(src.pos, limits.max_bytes + 1);
    // One line without a newline, 1 GB long: cut, then the cap.
    let mut src = Lazy::new("TAP version 14\nok 1 - ", "z", GB);
    let r = parse_tap(&mut src, "line.tap", &limits);
    assert!(r.truncated);
    assert!(r.has(AnnotationKind::InputTooLarge));
    assert!(r.has(AnnotationKind::TextCut));
    assert!(r.tests[0].name.len() <= limits.max_line_bytes);
}

#[test]
fn invalid_utf8_is_repaired_and_said() {
    let r = junit(b"<testsuite name=\"s\xff\"><testcase name=\"caf\xc3\" time=\"1\"><failure message=\"bad \xfe\xfe\">out \x80</failure></testcase></testsuite>");
    assert!(!r.truncated, "{:?}", r.annotations);
    assert_eq!(kinds(&r), vec![AnnotationKind::InvalidUtf8]);
    let t = &r.tests[0];
    assert_eq!(t.suite, "s\u{FFFD}");
    assert_eq!(t.name, "caf\u{FFFD}");
    assert_eq!(t.message.as_deref(), Some("bad \u{FFFD}\u{FFFD}"));
    let r = parse_tap(&b"TAP version 14\n1..1\nnot ok 1 - \xff\xfe\n"[..], "u.tap", &Limits::default());
    assert!(!r.truncated);
    assert_eq!(r.tests[0].name, "\u{FFFD}\u{FFFD}");
    assert_eq!(kinds(&r), vec![AnnotationKind::InvalidUtf8]);
    // UTF-16 is not read as UTF-8 XML: annotated, not a panic.
    let utf16: Vec<u8> = "\u{feff}<testsuite/>".encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
    let r = junit(&utf16);
    assert!(r.truncated);
    assert!(r.has(AnnotationKind::InvalidUtf8));
}

#[test]
fn huge_attributes_and_messages_are_cut() {
    let limits = Limits::default();
    let big = "é".repeat(5 << 20); // 10 MB
    let doc = format!(
        "<testsuite name=\"s\"><testcase name=\"{big}\"><failure message=\"{big}\">{big}</failure></testcase></testsuite>"
    );
    let r = parse_junit(doc.as_bytes(), &limits);
    assert!(!r.truncated, "{:?}", r.annotations);
    let t = &r.tests[0];
    assert!(t.id.as_str().len() <= kiln_reports::TestId::MAX_LEN + 3);
    assert!(t.message.as_ref().unwrap().len() <= limits.max_message_bytes + 64);
    assert!(t.excerpt.as_ref().unwrap().len() <= limits.max_excerpt_bytes + 64);
    assert!(r.has(AnnotationKind::TextCut));
}

#[test]
fn element_count_bomb_stops_at_the_element_cap() {
    let limits = Limits { max_elements: 100_000, ..Limits::default() };
    let mut doc = String::from("<testsuite name=\"s\"><testcase name=\"a\"/><properties>");
    doc.push_str(&"<property name=\"k\" value=\"v\"/>".repeat(200_000));
    doc.push_str("</properties><testcase name=\"b\"/></testsuite>");
    let r = parse_junit(doc.as_bytes(), &limits);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::TooManyElements]);
    assert_eq!(r.tests.len(), 1);
}

#[test]
fn test_count_cap() {
    let limits = Limits { max_tests: 1000, ..Limits::default() };
    let doc = format!("<testsuite>{}</testsuite>", "<testcase name=\"t\"/>".repeat(5000));
    let r = parse_junit(doc.as_bytes(), &limits);
    assert!(r.truncated);
    assert_eq!(r.tests.len(), 1000);
    assert!(r.has(AnnotationKind::TooManyTests));
    let tap = format!("1..5000\n{}", "ok\n".repeat(5000));
    let r = parse_tap(tap.as_bytes(), "t.tap", &limits);
    assert!(r.truncated);
    assert_eq!(r.tests.len(), 1000);
    assert!(r.has(AnnotationKind::TooManyTests));
}

#[test]
fn text_budget_keeps_outcomes_and_drops_excerpts() {
    let limits = Limits { max_total_text_bytes: 10_000, ..Limits::default() };
    let case = format!("<testcase name=\"t\"><failure message=\"m\">{}</failure></testcase>", "x".repeat(1000));
    let doc = format!("<testsuite>{}</testsuite>", case.repeat(100));
    let r = parse_junit(doc.as_bytes(), &limits);
    assert!(!r.truncated, "outcomes are complete");
    assert_eq!(r.tests.len(), 100);
    assert!(r.tests.iter().all(|t| t.outcome == Outcome::Failed && t.message.as_deref() == Some("m")));
    let kept: usize = r.tests.iter().filter_map(|t| t.excerpt.as_ref()).map(String::len).sum();
    assert!(kept <= 10_000);
    assert!(r.has(AnnotationKind::TextCut));
}

#[test]
fn broken_off_and_foreign_documents() {
    let r = junit(b"<testsuite name=\"s\"><testcase name=\"a\"/><testcase name=\"b\"><failure>bo");
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::Malformed]);
    assert_eq!(r.tests.len(), 1);
    let r = junit(b"<testsuite><testcase name=\"a\"></testsuite>");
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::Malformed]);
    let r = junit(b"<html><body>502 Bad Gateway</body></html>");
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::Empty]);
    let r = junit(b"");
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::Empty]);
    // An empty but well-formed report is complete: no tests ran.
    let r = junit(b"<testsuites/>");
    assert!(!r.truncated, "{:?}", r.annotations);
}

#[test]
fn tap_incomplete_streams_are_truncated() {
    let l = Limits::default();
    let r = parse_tap(&b"TAP version 14\n1..3\nok 1\nok 2\n"[..], "short.tap", &l);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::PlanMismatch]);
    let r = parse_tap(&b"TAP version 14\nok 1\nnot ok 2\n"[..], "noplan.tap", &l);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::PlanMismatch]);
    let r = parse_tap(&b"TAP version 14\n# Subtest: s\n    ok 1 - inner\n"[..], "open.tap", &l);
    assert!(r.truncated);
    assert!(r.has(AnnotationKind::Malformed));
    assert_eq!(r.tests.len(), 1);
    let r = parse_tap(&b"<html>not tap</html>\n"[..], "html.tap", &l);
    assert!(r.truncated);
    assert_eq!(kinds(&r), vec![AnnotationKind::Empty]);
    let r = parse_tap(&b"1..0 # SKIP no database\n"[..], "skipall.tap", &l);
    assert!(!r.truncated, "{:?}", r.annotations);
    assert!(r.tests.is_empty());
    // A subtest point with no parent, name or number, two levels in.
    let r = parse_tap(&b"TAP version 14\n        ok\n1..1\n"[..], "orphan.tap", &l);
    assert!(r.truncated, "{:?}", r.annotations);
    assert_eq!(r.tests[0].name, "test 1");
    let deep = format!("TAP version 14\n{}ok 1 - deep\n1..1\n", " ".repeat(4 * 100_000));
    let r = parse_tap(deep.as_bytes(), "deep.tap", &l);
    assert!(r.truncated);
    assert!(r.has(AnnotationKind::TooDeep));
}

/// The exact text users see for each refusal.
#[test]
fn annotation_texts() {
    let small = Limits { max_bytes: 200, max_elements: 5, max_tests: 2, ..Limits::default() };
    let cases: Vec<(&str, Report)> = vec![
        ("billion laughs", junit(BILLION_LAUGHS.as_bytes())),
        ("external entity", junit(XXE.as_bytes())),
        ("deep", junit(format!("<testsuite>{}", "<a>".repeat(100)).as_bytes())),
        (
            "input cap",
            parse_junit(
                Lazy::new("<testsuite>", "<testcase name=\"t\"/>", 1000),
                &Limits { max_tests: 1000, max_elements: 1000, ..small.clone() },
            ),
        ),
        ("elements", parse_junit(&b"<testsuite><properties><p/><p/><p/><p/><p/></properties></testsuite>"[..], &small)),
        (
            "tests",
            parse_junit(
                &b"<testsuite><testcase name=\"a\"/><testcase name=\"a\"/><testcase name=\"c\"/></testsuite>"[..],
                &small,
            ),
        ),
        ("broken", junit(b"<testsuite><testcase name=\"a\"></testsuite>")),
        ("cut off", junit(b"<testsuite><testcase name=\"a\">")),
        ("foreign", junit(b"<html/>")),
        ("utf8", junit(b"<testsuite><testcase name=\"\xff\"/></testsuite>")),
        ("entity", junit(b"<testsuite><testcase name=\"a\"><failure>&nbsp;</failure></testcase></testsuite>")),
        ("bail out", parse_tap(&b"1..2\nok 1\nBail out! no db\n"[..], "b.tap", &small)),
        ("short plan", parse_tap(&b"1..3\nok 1\n"[..], "p.tap", &small)),
        ("no plan", parse_tap(&b"ok 1\n"[..], "n.tap", &small)),
    ];
    let out: Vec<_> = cases.iter().map(|(name, r)| (name, r.truncated, &r.annotations)).collect();
    insta::assert_json_snapshot!("annotation_texts", out);
}
