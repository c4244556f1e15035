//! Real reports (see tests/fixtures/README.md for where each comes from):
//! the parsed model of each is snapshotted, and the facts that matter are
//! asserted beside it so a snapshot update cannot quietly lose them.

use kiln_reports::{AnnotationKind, Limits, Outcome, Report, RetryKind, TestId, parse_junit, parse_tap};
use std::path::Path;

fn fixture(name: &str) -> std::fs::File {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn junit(name: &str) -> Report {
    parse_junit(fixture(name), &Limits::default())
}

fn tap(name: &str) -> Report {
    parse_tap(fixture(name), name, &Limits::default())
}

fn test<'r>(r: &'r Report, id: &str) -> &'r kiln_reports::TestCase {
    r.tests
        .iter()
        .find(|t| t.id.as_str() == id)
        .unwrap_or_else(|| panic!("no test `{id}` in {:?}", r.tests.iter().map(|t| t.id.as_str()).collect::<Vec<_>>()))
}

fn outcomes(r: &Report) -> Vec<(&str, Outcome)> {
    r.tests.iter().map(|t| (t.id.as_str(), t.outcome)).collect()
}

#[test]
fn pytest_junitxml() {
    let r = junit("pytest.xml");
    assert!(!r.truncated, "{:?}", r.annotations);
    assert!(r.annotations.is_empty(), "{:?}", r.annotations);
    assert_eq!(
        outcomes(&r),
        vec![
            ("pytest :: tests.test_sample :: test_passes", Outcome::Passed),
            ("pytest :: tests.test_sample :: test_fails", Outcome::Failed),
            ("pytest :: tests.test_sample :: test_errors", Outcome::Error),
            ("pytest :: tests.test_sample :: test_skipped", Outcome::Skipped),
            ("pytest :: tests.test_sample.TestGroup :: test_param[1]", Outcome::Passed),
            ("pytest :: tests.test_sample.TestGroup :: test_param[2]", Outcome::Passed),
        ]
    );
    let fails = test(&r, "pytest :: tests.test_sample :: test_fails");
    assert!(
        fails.message.as_deref().unwrap().starts_with("AssertionError: lists differ\nassert [1, 2, 3] == [1, 2, 4]")
    );
    assert!(fails.excerpt.as_deref().unwrap().contains("tests/test_sample.py:12: AssertionError"));
    assert_eq!(fails.duration_ms, Some(1));
    let skipped = test(&r, "pytest :: tests.test_sample :: test_skipped");
    assert_eq!(skipped.message.as_deref(), Some("not on this platform"));
    insta::assert_json_snapshot!("pytest", r);
}

#[test]
fn pytest_xunit1_with_output() {
    let r = junit("pytest-xunit1-logging.xml");
    assert!(!r.truncated);
    let fails = test(&r, "pytest :: tests.test_sample :: test_fails");
    assert_eq!(fails.file.as_deref(), Some("tests/test_sample.py"));
    assert!(fails.excerpt.as_deref().unwrap().contains("--- system-err ---"), "{:?}", fails.excerpt);
    assert!(fails.excerpt.as_deref().unwrap().contains("about to fail"));
    // A passing test's output is not kept.
    assert_eq!(test(&r, "pytest :: tests.test_sample :: test_passes").excerpt, None);
    insta::assert_json_snapshot!("pytest-xunit1-logging", r);
}

#[test]
fn nextest_junit_with_flaky_and_rerun_records() {
    let r = junit("nextest.xml");
    assert!(!r.truncated, "{:?}", r.annotations);
    let flaky = test(&r, "sample :: tests::flaky");
    assert_eq!(flaky.outcome, Outcome::Passed);
    assert_eq!(flaky.retries.len(), 2);
    assert!(flaky.retries.iter().all(|x| x.kind == RetryKind::Flaky && x.outcome == Outcome::Failed));
    assert!(flaky.retries[0].excerpt.as_deref().unwrap().contains("flaky failure on try 1"));
    assert!(flaky.runner_flaky());
    let fails = test(&r, "sample :: tests::fails");
    assert_eq!(fails.outcome, Outcome::Failed);
    assert_eq!(fails.retries.iter().map(|x| x.kind).collect::<Vec<_>>(), vec![RetryKind::Rerun, RetryKind::Rerun]);
    assert!(fails.message.as_deref().unwrap().contains("panicked at src/lib.rs:11:9"));
    let c = r.counts();
    assert_eq!((c.passed, c.failed, c.runner_flaky), (2, 2, 1));
    insta::assert_json_snapshot!("nextest", r);
}

#[test]
fn surefire_flaky_records() {
    let r = junit("surefire-flaky.xml");
    assert!(!r.truncated, "{:?}", r.annotations);
    let t = test(&r, "org.acme.FlakyTest :: testFlaky");
    assert_eq!(t.outcome, Outcome::Passed);
    assert_eq!(
        t.retries.iter().map(|x| (x.kind, x.outcome)).collect::<Vec<_>>(),
        vec![
            (RetryKind::Flaky, Outcome::Failed),
            (RetryKind::Flaky, Outcome::Failed),
            (RetryKind::Flaky, Outcome::Failed),
            (RetryKind::Flaky, Outcome::Error)
        ]
    );
    assert_eq!(t.retries[0].message.as_deref(), Some("expected: <1> but was: <0>"));
    let e = t.retries[0].excerpt.as_deref().unwrap();
    assert!(e.starts_with("org.opentest4j.AssertionFailedError"), "{e}");
    assert!(e.contains("--- system-out ---"));
    assert_eq!(test(&r, "org.acme.FlakyTest :: testStable").outcome, Outcome::Passed);
    insta::assert_json_snapshot!("surefire-flaky", r);
}

#[test]
fn surefire_failures() {
    let r = junit("surefire-failing.xml");
    assert!(!r.truncated);
    assert_eq!(r.counts().failed, 2);
    let t = test(&r, "org.apache.maven.surefire.test.FailingTest :: defaultTestValueIs_Value");
    // Newlines inside an attribute are spaces to any XML parser (attribute
    // value normalisation); a `&#10;` stays a newline (pytest).
    assert_eq!(t.message.as_deref(), Some("Expected: \"wrong\"      got: \"value\""));
    insta::assert_json_snapshot!("surefire-failing", r);
}

#[test]
fn jest_junit() {
    let r = junit("jest-junit.xml");
    assert!(!r.truncated);
    let t = test(&r, "cart :: cart computes the total");
    assert_eq!(t.outcome, Outcome::Failed);
    // jest-junit writes no message attribute: the text's first line.
    assert_eq!(t.message.as_deref(), Some("Error: expect(received).toEqual(expected) // deep equality"));
    assert_eq!(t.file.as_deref(), Some("__tests__/cart.test.js"));
    assert_eq!(test(&r, "cart :: cart applies a coupon").outcome, Outcome::Skipped);
    assert_eq!(
        test(&r, "cart :: cart checkout throws on empty cart").message.as_deref(),
        Some("TypeError: cart is empty")
    );
    insta::assert_json_snapshot!("jest-junit", r);
}

#[test]
fn go_junit_report() {
    let r = junit("go-junit-report.xml");
    assert!(!r.truncated);
    assert_eq!(r.tests.len(), 11);
    let t = test(&r, "package/subtests :: TestSubtests/Subtest#01");
    assert_eq!((t.outcome, t.message.as_deref()), (Outcome::Failed, Some("Failed")));
    assert!(t.excerpt.as_deref().unwrap().contains("subtests_test.go:10: error message"));
    assert_eq!(test(&r, "package/subtests :: TestSubtests/Subtest#02").outcome, Outcome::Skipped);
    insta::assert_json_snapshot!("go-junit-report", r);
}

#[test]
fn node_tap13_subtests_yaml_skip_todo() {
    let r = tap("node-test-tap13.tap");
    assert!(!r.truncated, "{:?}", r.annotations);
    assert_eq!(
        outcomes(&r),
        vec![
            ("node-test-tap13.tap :: math :: adds", Outcome::Passed),
            ("node-test-tap13.tap :: math :: multiplies", Outcome::Failed),
            ("node-test-tap13.tap :: math / nested :: divides", Outcome::Passed),
            ("node-test-tap13.tap :: skipped one", Outcome::Skipped),
            ("node-test-tap13.tap :: todo one", Outcome::Skipped),
            ("node-test-tap13.tap :: top level passes", Outcome::Passed),
        ]
    );
    let m = test(&r, "node-test-tap13.tap :: math :: multiplies");
    assert_eq!(m.message.as_deref(), Some("two times two\n\n4 !== 5"));
    assert_eq!(m.duration_ms, Some(1));
    assert!(m.excerpt.as_deref().unwrap().contains("operator: 'strictEqual'"));
    assert_eq!(test(&r, "node-test-tap13.tap :: todo one").message.as_deref(), Some("TODO: write it"));
    insta::assert_json_snapshot!("node-test-tap13", r);
}

#[test]
fn tap14_spec_features() {
    let r = tap("tap14.tap");
    assert!(!r.truncated, "{:?}", r.annotations);
    assert_eq!(
        outcomes(&r),
        vec![
            ("tap14.tap :: parses the config", Outcome::Passed),
            ("tap14.tap :: rejects a bad token", Outcome::Failed),
            ("tap14.tap :: database :: connects", Outcome::Passed),
            ("tap14.tap :: database :: migrates", Outcome::Skipped),
            ("tap14.tap :: database :: pools # connections", Outcome::Skipped),
            ("tap14.tap :: test 4", Outcome::Skipped),
            ("tap14.tap :: cleanup", Outcome::Failed),
        ]
    );
    let t = test(&r, "tap14.tap :: rejects a bad token");
    assert_eq!((t.message.as_deref(), t.duration_ms), (Some("expected 401, got 200"), Some(4)));
    assert_eq!(test(&r, "tap14.tap :: parses the config").duration_ms, Some(12));
    insta::assert_json_snapshot!("tap14", r);
}

#[test]
fn tap14_bail_out_truncates() {
    let r = tap("tap14-bailout.tap");
    assert!(r.truncated);
    assert!(r.has(AnnotationKind::BailOut));
    assert!(r.annotations[0].message.contains("Database unreachable"), "{:?}", r.annotations);
    assert_eq!(r.tests.len(), 2);
    insta::assert_json_snapshot!("tap14-bailout", r);
}

#[test]
fn perl_test_more_tap() {
    let r = tap("perl-test-more.tap");
    assert!(!r.truncated, "{:?}", r.annotations);
    let t = test(&r, "perl-test-more.tap :: adds");
    assert_eq!(t.outcome, Outcome::Failed);
    assert_eq!(t.message.as_deref(), Some("Failed test 'adds'"));
    assert!(t.excerpt.as_deref().unwrap().contains("expected: '5'"), "{:?}", t.excerpt);
    assert_eq!(test(&r, "perl-test-more.tap :: test 3").message.as_deref(), Some("no network"));
    assert_eq!(test(&r, "perl-test-more.tap :: flies").outcome, Outcome::Skipped);
    insta::assert_json_snapshot!("perl-test-more", r);
}

#[test]
fn test_ids_are_stable_across_runs_of_the_same_suite() {
    // Two real runs of the same pytest suite (different timestamps,
    // durations, logging options) give the same ids.
    let a: Vec<TestId> = junit("pytest.xml").tests.into_iter().map(|t| t.id).collect();
    let b: Vec<TestId> = junit("pytest-xunit1-logging.xml").tests.into_iter().map(|t| t.id).collect();
    assert_eq!(a, b);
}
