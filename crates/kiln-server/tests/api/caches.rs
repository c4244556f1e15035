//! Cache endpoints of an attempt (issue 15): the namespaces come from the
//! run's trust and the server enforces them; knowing a key grants nothing.

use super::{claim, register};
use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::{TestApp, TestRepo};
use serde_json::json;

const WF: &str = "version: 1
jobs:
  - name: build
    cache: {kind: deps, version: '1', inputs: [], paths: [deps]}
    steps: [echo]
";

async fn claimed_run(app: &TestApp, event: &str, agent: &api::AgentRegistration, n: &str) -> api::Assignment {
    let body = api::SubmitRun { commit_sha: "HEAD".into(), event: Some(event.into()), ..Default::default() };
    app.admin().post("/v1/repos/r/workflow-runs").json(&body).send().await.assert_status(StatusCode::ACCEPTED);
    app.run_pending_work().await;
    claim(app, agent, n).await.expect("an assignment")
}

#[tokio::test]
async fn cache_namespaces_follow_the_runs_trust_and_are_enforced() {
    // One agent claims the trusted and the untrusted run (this test is about
    // cache namespaces, not placement): the unsafe opt-in lets it.
    let app = TestApp::with_config(|c| {
        c.untrusted = kiln_core::claim::UntrustedPolicy { pools: vec!["default".into()], host_executor: true }
    })
    .await;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF)]).unwrap();
    app.add_repo("r", &repo).await;
    let agent = register(&app, "a", 4).await;

    let trusted = claimed_run(&app, "manual", &agent, "c1").await;
    let spec = trusted.cache.clone().expect("the assignment carries the cache");
    assert_eq!(
        (spec.write_namespace.as_str(), spec.read_namespaces.clone()),
        ("protected", vec!["protected".to_string()])
    );
    let untrusted = claimed_run(&app, "pull_request", &agent, "c2").await;
    let uspec = untrusted.cache.clone().unwrap();
    assert!(uspec.write_namespace.starts_with("untrusted/"), "{uspec:?}");
    assert_eq!(uspec.read_namespaces, vec![uspec.write_namespace.clone(), "protected".to_string()]);

    let path = |a: &api::Assignment, what: &str| format!("/v1/jobs/{}/attempts/{}/cache/{what}", a.job_id, a.epoch);
    // Untrusted: may not write protected, nor read another untrusted namespace.
    let save = json!({ "generation_id": "g", "namespace": "protected", "key": "k" });
    app.holder(&untrusted)
        .post(&path(&untrusted, "save"))
        .json(&save)
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);
    let look = json!({ "candidates": [{ "namespace": "untrusted/refs/pull/9/head", "key": "k" }] });
    app.holder(&untrusted)
        .post(&path(&untrusted, "lookup"))
        .json(&look)
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);
    // Trusted: may not read untrusted namespaces at all.
    let look = json!({ "candidates": [{ "namespace": uspec.write_namespace, "key": "k" }] });
    app.holder(&trusted).post(&path(&trusted, "lookup")).json(&look).send().await.assert_status(StatusCode::FORBIDDEN);
    // Another attempt's token cannot use this attempt's endpoints.
    let look = json!({ "candidates": [{ "namespace": "protected", "key": "k" }] });
    let res = app.holder(&untrusted).post(&path(&trusted, "lookup")).json(&look).send().await;
    assert!(matches!(res.status, StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED), "{}", res.status);
    // A miss is an answer, not an error.
    let miss: api::CacheLookupResult = app
        .holder(&trusted)
        .post(&path(&trusted, "lookup"))
        .json(&look)
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert!(miss.hit.is_none());
    // Saving an upload that is not this attempt's sealed cache is refused.
    let save = json!({ "generation_id": "nope", "namespace": "protected", "key": "k" });
    app.holder(&trusted).post(&path(&trusted, "save")).json(&save).send().await.assert_status(StatusCode::NOT_FOUND);
}
