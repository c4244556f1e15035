//! Test reports (issue 43): staged under the live epoch only, bound by the
//! completion (whatever its outcome), never read for a fenced attempt;
//! flaky tests decided when the run ends; quarantine with an owner, a cap
//! and an expiry that ends it once.

use super::*;

fn wf(yaml: &str) -> Workflow {
    kiln_workflow::parse(yaml).unwrap_or_else(|d| panic!("workflow does not parse:\n{d}"))
}

const SUITE: &str = r#"version: 1
jobs:
  - {name: test, retry: 2, reports: {junit: [junit.xml]}, steps: [x]}
"#;

fn report(path: &str, cases: &[(&str, &str)]) -> StagedReport {
    StagedReport {
        path: path.into(),
        format: "junit".into(),
        truncated: false,
        annotations: "[]".into(),
        tests: cases
            .iter()
            .map(|(id, outcome)| StagedTest {
                test_id: id.to_string(),
                suite: "s".into(),
                name: id.to_string(),
                outcome: outcome.to_string(),
                duration_ms: Some(10),
                message: (*outcome == "failed").then(|| format!("{id} broke")),
                ..Default::default()
            })
            .collect(),
    }
}

pub async fn reports_bind_with_the_live_attempt_and_flakes_are_decided_at_run_end<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (repo, run_id) = start(s, wf(SUITE)).await;
    let old = agent(s, "old", 4).await;
    let new = agent(s, "new", 4).await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &old, &test, LONG_TTL).await;

    // Epoch 1 stages a report, then vanishes: fenced, its report is never read.
    assert!(s.stage_report(&test, 1, &report("junit.xml", &[("a", "passed"), ("b", "passed")])).await.unwrap());
    // A retried upload of the same path changes nothing.
    assert!(!s.stage_report(&test, 1, &report("junit.xml", &[("a", "failed")])).await.unwrap());
    s.heartbeat(&test, 1, SHORT_TTL).await.unwrap();
    expire(SHORT_TTL).await;
    s.fence_expired().await.unwrap();
    assert_eq!(claim(s, &new, &test, LONG_TTL).await.epoch, 2);
    assert_stale(s.stage_report(&test, 1, &report("late.xml", &[("a", "passed")])).await);
    assert_stale(s.complete(&test, 1, success()).await);
    let t = s.run_tests(&run_id, false).await.unwrap();
    assert!(t.attempts.is_empty() && t.tests.is_empty(), "a fenced attempt's report counts nowhere: {t:?}");
    // Epoch 2 stages a report while it runs: not collected (live); epoch
    // 1's, unbound and ended, is.
    s.stage_report(&test, 2, &report("early.xml", &[("a", "passed")])).await.unwrap();
    assert_eq!(s.collect_staged_reports(60_000, 100).await.unwrap(), 0, "within the grace");
    assert_eq!(s.collect_staged_reports(0, 100).await.unwrap(), 1, "the fenced attempt's report only");

    // Epoch 2 fails with `b` failing: bound, though the job is retried.
    s.stage_report(&test, 2, &report("junit.xml", &[("a", "passed"), ("b", "failed")])).await.unwrap();
    assert_eq!(s.complete(&test, 2, failure(1)).await.unwrap(), "ready");
    let t = s.run_tests(&run_id, true).await.unwrap();
    assert_eq!(t.attempts.len(), 1);
    assert_eq!((t.attempts[0].epoch, t.attempts[0].state.as_str(), t.attempts[0].failed), (2, "complete", 1));
    assert_eq!(t.tests.len(), 1, "failed only: {:?}", t.tests);
    assert_eq!(t.tests[0].test.message.as_deref(), Some("b broke"));
    assert!(!t.decided && t.flaky.is_empty(), "flakiness is decided when the run ends");

    // Epoch 3 passes everything: the run ends, `b` passed and failed for
    // this commit: flaky; `a` never failed.
    assert_eq!(claim(s, &old, &test, LONG_TTL).await.epoch, 3);
    s.stage_report(&test, 3, &report("junit.xml", &[("a", "passed"), ("b", "passed")])).await.unwrap();
    assert_eq!(s.complete(&test, 3, success()).await.unwrap(), "success");
    let t = s.run_tests(&run_id, false).await.unwrap();
    assert!(t.decided);
    assert_eq!(s.collect_staged_reports(0, 100).await.unwrap(), 0, "bound reports stay");
    assert_eq!(t.flaky, vec![("b".to_string(), 1, 1)]);
    assert_eq!(t.attempts.len(), 2);
    assert!(t.tests.iter().all(|r| r.epoch == 3), "the last bound attempt's tests: {:?}", t.tests);
    // The history has both of b's results, newest first, flagged.
    let h = s.test_history(&repo.id, "b", 10).await.unwrap();
    assert_eq!(
        h.iter().map(|e| (e.epoch, e.outcome.as_str(), e.flaky)).collect::<Vec<_>>(),
        [(3, "passed", true), (2, "failed", true)]
    );
    let d = s.test_durations(&repo.id, "refs/heads/main").await.unwrap();
    assert_eq!(d.get("a"), Some(&10));

    // Bad input changes nothing.
    let mut bad = report("bad.xml", &[("c", "exploded")]);
    assert!(matches!(s.stage_report(&test, 3, &bad).await, Err(StoreError::Invalid(_))));
    bad.tests.clear();
    bad.format = "xunit".into();
    assert!(matches!(s.stage_report(&test, 3, &bad).await, Err(StoreError::Invalid(_))));
}

pub async fn quarantine_has_an_owner_a_cap_and_an_end<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (repo, run_id) = start(s, wf(SUITE)).await;
    let a = agent(s, "a", 4).await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &test, LONG_TTL).await;
    // A suite of 100 tests: 2% is 2.
    let cases: Vec<(String, &str)> = (0..100).map(|i| (format!("t{i}"), "passed")).collect();
    let cases: Vec<(&str, &str)> = cases.iter().map(|(n, o)| (n.as_str(), *o)).collect();
    s.stage_report(&test, 1, &report("junit.xml", &cases)).await.unwrap();
    s.complete(&test, 1, success()).await.unwrap();
    let q = |id: &str, ms: i64| NewQuarantine {
        repo_id: repo.id.clone(),
        test_id: id.into(),
        owner: "alice".into(),
        reason: "races".into(),
        link: None,
        created_by: "admin".into(),
        expires_in_ms: ms,
        max_percent: 2.0,
    };
    s.quarantine_test(&q("t1", 60_000)).await.unwrap();
    assert!(matches!(s.quarantine_test(&q("t1", 60_000)).await, Err(StoreError::Conflict(_))), "already");
    s.quarantine_test(&q("t2", 200)).await.unwrap();
    let capped = s.quarantine_test(&q("t3", 60_000)).await;
    assert!(matches!(capped, Err(StoreError::Invalid(ref m)) if m.contains("at most 2")), "{capped:?}");
    assert_eq!(s.quarantined_ids(&repo.id).await.unwrap(), ["t1", "t2"]);
    // t2 expires: ended once (by `expiry`), no longer quarantined, room again.
    expire(300).await;
    assert_eq!(s.quarantined_ids(&repo.id).await.unwrap(), ["t1"], "an expired quarantine mutes nothing");
    let ended = s.expire_quarantines().await.unwrap();
    assert_eq!(
        ended.iter().map(|q| (q.test_id.as_str(), q.ended_by.as_deref())).collect::<Vec<_>>(),
        [("t2", Some("expiry"))]
    );
    assert!(s.expire_quarantines().await.unwrap().is_empty(), "each expiry is reported once");
    s.quarantine_test(&q("t3", 60_000)).await.unwrap();
    // Removal ends it; removing again finds none.
    let gone = s.end_quarantine(&repo.id, "t1", "bob").await.unwrap().unwrap();
    assert_eq!(gone.ended_by.as_deref(), Some("bob"));
    assert!(s.end_quarantine(&repo.id, "t1", "bob").await.unwrap().is_none());
    let listed = s.list_quarantine(&repo.id, 86_400_000).await.unwrap();
    assert_eq!(listed.first().map(|q| q.test_id.as_str()), Some("t3"), "open ones first: {listed:?}");
    assert_eq!(listed.len(), 3);
    let gauges = s.test_gauges(86_400_000).await.unwrap();
    assert_eq!(gauges.get(&repo.name).map(|g| g.1), Some(1));
}

pub async fn quarantined_failures_pass_only_with_a_complete_covering_report<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (repo, run_id) = start(s, wf("version: 1\njobs:\n  - {name: test, reports: {junit: [j.xml]}, steps: [x]}\n  - {name: other, needs: [], reports: {junit: [j.xml]}, steps: [x]}\n  - {name: third, needs: [], reports: {junit: [j.xml]}, steps: [x]}\n")).await;
    let a = agent(s, "a", 4).await;
    let q = NewQuarantine {
        repo_id: repo.id.clone(),
        test_id: "q".into(),
        owner: "alice".into(),
        reason: "races".into(),
        link: None,
        created_by: "admin".into(),
        expires_in_ms: 60_000,
        max_percent: 2.0,
    };
    s.quarantine_test(&q).await.unwrap();
    let excused =
        |ids: &[&str]| CompletionInput { quarantined: ids.iter().map(|s| s.to_string()).collect(), ..success() };
    // Covered: success with the annotation.
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &test, LONG_TTL).await;
    s.stage_report(&test, 1, &report("j.xml", &[("q", "failed"), ("ok", "passed")])).await.unwrap();
    assert_eq!(s.complete(&test, 1, excused(&["q"])).await.unwrap(), "success");
    assert_eq!(s.get_job(&test).await.unwrap().message.as_deref(), Some("quarantined failures: 1"));
    // Not covered (an agent that lets another failure through): failed.
    let other = job_id(s, &run_id, "other").await;
    claim(s, &a, &other, LONG_TTL).await;
    s.stage_report(&other, 1, &report("j.xml", &[("q", "failed"), ("x", "failed")])).await.unwrap();
    assert_eq!(s.complete(&other, 1, excused(&["q", "x"])).await.unwrap(), "failed");
    assert!(s.get_job(&other).await.unwrap().message.unwrap_or_default().contains("not quarantined"));
    // A truncated report excuses nothing.
    let third = job_id(s, &run_id, "third").await;
    claim(s, &a, &third, LONG_TTL).await;
    let mut cut = report("j.xml", &[("q", "failed")]);
    cut.truncated = true;
    s.stage_report(&third, 1, &cut).await.unwrap();
    assert_eq!(s.complete(&third, 1, excused(&["q"])).await.unwrap(), "failed");
    let t = s.run_tests(&run_id, false).await.unwrap();
    let states: Vec<&str> = t.attempts.iter().map(|a| a.state.as_str()).collect();
    assert_eq!(states, ["complete", "complete", "truncated"]);
}

pub async fn shard_batches_are_leased_to_the_live_attempt_and_come_back_when_it_is_lost<S: Store + 'static>(
    o: &Opener<S>,
) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(
        s,
        wf("version: 1\njobs:\n  - {name: a, reports: {junit: [j.xml]}, steps: [x]}\n  - {name: b, needs: [], reports: {junit: [j.xml]}, steps: [x]}\n"),
    )
    .await;
    let one = agent(s, "one", 4).await;
    let two = agent(s, "two", 4).await;
    let a = job_id(s, &run_id, "a").await;
    let b = job_id(s, &run_id, "b").await;
    claim(s, &one, &a, LONG_TTL).await;
    claim(s, &two, &b, LONG_TTL).await;
    let plan: Vec<Vec<String>> = (0..3).map(|i| vec![format!("t{i}")]).collect();
    // The first call seeds; later plans are ignored.
    let first = s.shard_next(&a, 1, "unit", &plan).await.unwrap();
    assert_eq!((first.batch, first.tests.clone(), first.total), (Some(0), vec!["t0".to_string()], 3));
    let other = s.shard_next(&b, 1, "unit", &[vec!["zzz".to_string()]]).await.unwrap();
    assert_eq!(other.tests, ["t1"]);
    // A stale epoch gets nothing.
    assert_stale(s.shard_next(&a, 7, "unit", &plan).await);
    // Job a's attempt is lost: its batch goes back and b gets it next.
    s.heartbeat(&a, 1, SHORT_TTL).await.unwrap();
    expire(SHORT_TTL).await;
    s.fence_expired().await.unwrap();
    let next = s.shard_next(&b, 1, "unit", &[]).await.unwrap();
    assert_eq!(next.tests, ["t0"], "the lost attempt's batch came back first");
    let last = s.shard_next(&b, 1, "unit", &[]).await.unwrap();
    assert_eq!(last.tests, ["t2"]);
    let none = s.shard_next(&b, 1, "unit", &[]).await.unwrap();
    assert_eq!((none.batch, none.pending), (None, 0));
    // b completes: its batches are done and never come back.
    s.complete(&b, 1, success()).await.unwrap();
    assert_eq!(claim(s, &one, &a, LONG_TTL).await.epoch, 2);
    let after = s.shard_next(&a, 2, "unit", &[]).await.unwrap();
    assert_eq!((after.batch, after.leased, after.total), (None, 0, 3), "{after:?}");
}

/// Issue 45: the completion that binds a job's reports also binds their
/// signed in-toto Test Result statement, over the artifacts the job
/// restored (by sha256): passed, quarantined (warned) and failed tests; a
/// fenced attempt's reports are never attested.
pub async fn test_results_are_attested_over_the_restored_artifacts<S: Store + 'static>(o: &Opener<S>) {
    const WF: &str = r#"version: 1
jobs:
  - name: build
    steps: [x]
    artifacts: {publish: [{name: jar, path: app.jar}]}
  - name: test
    needs: [build]
    reports: {junit: [junit.xml]}
    steps: [x]
    artifacts: {restore: [{from_job: build, name: jar, path: app.jar}]}
"#;
    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (repo, run_id) = start(s, wf(WF)).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = s.create_generation(&build, 1, "jar", 10, SHA, 1 << 20).await.unwrap();
    s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    s.quarantine_test(&NewQuarantine {
        repo_id: repo.id.clone(),
        test_id: "flaky".into(),
        owner: "alice".into(),
        reason: "tracked in #1".into(),
        link: None,
        created_by: "admin".into(),
        expires_in_ms: 7 * 86_400_000,
        max_percent: 100.0,
    })
    .await
    .unwrap();

    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &test, LONG_TTL).await;
    s.stage_report(&test, 1, &report("junit.xml", &[("ok", "passed")])).await.unwrap();
    s.heartbeat(&test, 1, SHORT_TTL).await.unwrap();
    expire(SHORT_TTL).await;
    s.fence_expired().await.unwrap();
    assert!(s.test_attestation(&test).await.unwrap().is_none(), "a fenced attempt's reports are not attested");
    claim(s, &a, &test, LONG_TTL).await;
    let cases = [("ok", "passed"), ("flaky", "failed"), ("broken", "failed"), ("gone", "skipped")];
    s.stage_report(&test, 2, &report("junit.xml", &cases)).await.unwrap();
    s.complete(&test, 2, failure(1)).await.unwrap();

    let att = s.test_attestation(&test).await.unwrap().expect("attested");
    assert_eq!((att.epoch, att.result.as_str(), att.run_id.as_str()), (2, "FAILED", run_id.as_str()));
    let payload = kiln_provenance::dsse::verify(
        &kiln_provenance::dsse::parse(att.envelope.as_bytes()).unwrap(),
        kiln_provenance::dsse::IN_TOTO,
        &test_keys(),
    )
    .expect("signed by the server's key");
    let st: kiln_provenance::statement::Statement = serde_json::from_slice(&payload).unwrap();
    assert_eq!(st.predicate_type, kiln_provenance::statement::TEST_RESULT_V01);
    assert_eq!(st.subject.len(), 1);
    assert_eq!((st.subject[0].name.as_str(), st.subject[0].digest["sha256"].as_str()), ("jar", SHA));
    let names = |k: &str| {
        st.predicate[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(names("passedTests"), ["ok"]);
    assert_eq!(names("warnedTests"), ["flaky"], "a quarantined failure is a warning");
    assert_eq!(names("failedTests"), ["broken"]);
}
