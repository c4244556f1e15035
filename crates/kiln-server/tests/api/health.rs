//! Health, readiness, metrics and the UI need no token.

use axum::http::StatusCode;
use kiln_testkit::TestApp;

#[tokio::test]
async fn health_readiness_and_the_ui() {
    let app = TestApp::new().await;
    assert_eq!(app.anonymous().get("/healthz").send().await.assert_status(StatusCode::OK).text(), "ok");
    assert_eq!(app.anonymous().get("/readyz").send().await.assert_status(StatusCode::OK).text(), "ready");
    let ui = app.anonymous().get("/").send().await.assert_status(StatusCode::OK);
    assert!(ui.header("content-type").unwrap().starts_with("text/html"));
}

#[tokio::test]
async fn metrics_expose_the_dispatch_queue_depth() {
    let app = TestApp::new().await;
    let res = app.anonymous().get("/metrics").send().await.assert_status(StatusCode::OK);
    assert_eq!(res.header("content-type"), Some("text/plain; version=0.0.4"));
    assert!(res.text().contains("\nkiln_dispatch_queue_depth 0\n"), "{}", res.text());
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    super::submit(&app, "r").await;
    assert_eq!(app.run_pending_work().await.relayed, 1);
    let res = app.anonymous().get("/metrics").send().await;
    assert!(res.text().contains("\nkiln_dispatch_queue_depth 1\n"), "{}", res.text());
}
