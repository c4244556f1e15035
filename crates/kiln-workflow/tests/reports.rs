//! `reports:` (issue 43): which test reports a job's agent reads.

use kiln_workflow::parse;

fn job(reports: &str) -> String {
    format!("version: 1\njobs:\n  - name: test\n    steps: [pytest]\n    reports: {reports}\n")
}

#[test]
fn reports_take_paths_or_globs_per_format() {
    let w = parse(&job("{junit: [reports/*.xml, junit.xml], tap: out.tap}")).unwrap();
    let r = w.jobs[0].reports.as_ref().unwrap();
    assert_eq!(r.junit, ["reports/*.xml", "junit.xml"]);
    assert_eq!(r.tap, ["out.tap"]);
    // No `reports:`: nothing read, and the definition's hash is unchanged.
    let plain = parse("version: 1\njobs:\n  - name: test\n    steps: [pytest]\n").unwrap();
    assert!(plain.jobs[0].reports.is_none());
    assert_ne!(plain.canonical_hash(), w.canonical_hash());
}

#[test]
fn bad_reports_are_refused_naming_what_to_write() {
    for (bad, says) in [
        ("[a.xml]", "`reports` of job `test`"),
        ("{junit: []}", "is empty"),
        ("{junit: /etc/passwd}", "relative"),
        ("{junit: ../up.xml}", ".."),
        ("{xunit: [a.xml]}", "xunit"),
        ("{}", "names no report"),
        ("{junit: '[bad'}", "reports.junit"),
    ] {
        let e = parse(&job(bad)).expect_err(bad).to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
