//! Background work driven by the test: relay, fencing, garbage collection.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;
use sha2::{Digest, Sha256};
use std::time::Duration;

#[tokio::test]
async fn run_pending_work_relays_until_nothing_is_left() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    super::submit(&app, "r").await;
    super::submit(&app, "r").await;
    let done = app.run_pending_work().await;
    assert_eq!(done.relayed, 2);
    assert_eq!(app.app().dispatch_depth(), 2);
    assert_eq!(app.run_pending_work().await.total(), 0, "nothing left");
}

#[tokio::test]
async fn an_expired_lease_is_fenced_and_its_epoch_refused() {
    // A zero TTL: the lease is over as soon as the database clock moves on.
    let app = TestApp::with_config(|c| c.lease_ttl = Duration::ZERO).await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    assert_eq!(app.run_pending_work().await.fenced, 1);
    let hb = app.holder(&a).post(&format!("/v1/jobs/{}/attempts/{}/heartbeat", a.job_id, a.epoch)).send().await;
    assert_eq!(hb.assert_status(StatusCode::CONFLICT).error_code(), api::codes::STALE_EPOCH);
    let run = super::get_run(&app, &a.run_id).await;
    assert_eq!(run.jobs[0].attempts[0].outcome, "lost");
    assert_eq!(run.jobs[0].attempts[0].failure_class.as_deref(), Some("agent_lost"));
    let text = app.admin().get("/metrics").send().await.text();
    assert!(text.contains("\nkiln_attempt_failures_total{class=\"agent_lost\"} 1\n"), "{text}");
}

#[tokio::test]
async fn an_unbound_generation_is_collected_after_the_grace() {
    let app = TestApp::new().await;
    let wf = "version: 1\njobs:\n  - name: c\n    artifacts:\n      publish:\n        - name: app\n          path: app\n    steps:\n      - make\n";
    let _repo = super::repo(&app, "r", wf).await;
    super::submit(&app, "r").await;
    app.run_pending_work().await;
    let agent = super::register(&app, "a1", 1).await;
    let a = super::claim(&app, &agent, "c1").await.unwrap();
    let bytes = b"partial";
    let create =
        api::CreateUpload { name: "app".into(), size: 7, sha256: Some(hex::encode(Sha256::digest(bytes))), kind: None };
    let path = format!("/v1/jobs/{}/attempts/{}/artifacts", a.job_id, a.epoch);
    let s: api::UploadSession =
        app.holder(&a).post(&path).json(&create).send().await.assert_status(StatusCode::OK).json();
    // The attempt fails before sealing: the generation stays unbound.
    super::complete(&app, &a, "failed").await.assert_status(StatusCode::OK);
    assert_eq!(app.run_pending_work().await.collected, 0, "within the grace period");
    app.advance(Duration::from_secs(16 * 60));
    assert_eq!(app.run_pending_work().await.collected, 1);
    let g = app.store().get_generation(&s.generation_id).await.unwrap();
    assert_eq!(g.state, "deleted");
}
