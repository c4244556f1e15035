//! Workflow runs: submit (idempotent), list, get, cancel, retry.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

fn submit_body(commit: &str) -> api::SubmitRun {
    api::SubmitRun { commit_sha: commit.into(), ..Default::default() }
}

#[tokio::test]
async fn submit_is_idempotent_per_key_and_body() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let send = |body: api::SubmitRun, key: &'static str| {
        let app = &app;
        async move { app.admin().post("/v1/repos/r/workflow-runs").header("idempotency-key", key).json(&body).send().await }
    };
    let first: api::SubmitRunResponse =
        send(submit_body("HEAD"), "k1").await.assert_status(StatusCode::ACCEPTED).json();
    let again: api::SubmitRunResponse =
        send(submit_body("HEAD"), "k1").await.assert_status(StatusCode::ACCEPTED).json();
    assert_eq!(again.run_id, first.run_id);
    let other = send(submit_body("main"), "k1").await.assert_status(StatusCode::CONFLICT);
    assert_eq!(other.error_code(), api::codes::IDEMPOTENCY_MISMATCH);
    let bad = app.admin().post("/v1/repos/r/workflow-runs").json(&submit_body("no-such-ref")).send().await;
    bad.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    let none = app.admin().post("/v1/repos/nope/workflow-runs").json(&submit_body("HEAD")).send().await;
    none.assert_status(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn list_newest_first_with_filters_and_get() {
    let app = TestApp::new().await;
    let repo = super::repo(&app, "r", &super::pipeline(&["a", "b"])).await;
    let older = super::submit(&app, "r").await;
    let newer = super::submit(&app, "r").await;
    let list: api::RunList =
        app.admin().get("/v1/repos/r/workflow-runs").send().await.assert_status(StatusCode::OK).json();
    let ids: Vec<&str> = list.runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, [newer.as_str(), older.as_str()]);
    assert!(list.runs.iter().all(|r| r.trust == "trusted" && r.event == "manual" && r.status == "queued"));
    let one: api::RunList = app.admin().get("/v1/repos/r/workflow-runs?limit=1").send().await.json();
    assert_eq!(one.runs.len(), 1);
    let none: api::RunList = app.admin().get("/v1/repos/r/workflow-runs?status=success").send().await.json();
    assert!(none.runs.is_empty());
    let bad = app.admin().get("/v1/repos/r/workflow-runs?status=done").send().await;
    bad.assert_status(StatusCode::BAD_REQUEST);

    let run = super::get_run(&app, &older).await;
    assert_eq!((run.status.as_str(), run.commit_sha.clone()), ("queued", repo.head().unwrap()));
    let jobs: Vec<(&str, &str)> = run.jobs.iter().map(|j| (j.name.as_str(), j.status.as_str())).collect();
    assert_eq!(jobs, [("a", "ready"), ("b", "pending")]);
    app.admin().get("/v1/workflow-runs/nope").send().await.assert_status(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cancel_then_retry() {
    let app = TestApp::new().await;
    let (run, _agent, _a) = super::claimed(&app, &["a", "b"]).await;
    let cancelled: api::Run =
        app.admin().post(&format!("/v1/workflow-runs/{run}/cancel")).send().await.assert_status(StatusCode::OK).json();
    // The first job's attempt still runs: the run is cancelling until it ends.
    assert_eq!(cancelled.status, "cancelling");
    assert_eq!(cancelled.jobs[1].status, "cancelled");
    let retry = app.admin().post(&format!("/v1/workflow-runs/{run}/retry")).send().await;
    let child: api::SubmitRunResponse = retry.assert_status(StatusCode::ACCEPTED).json();
    let child = super::get_run(&app, &child.run_id).await;
    assert_eq!(child.parent_run_id.as_deref(), Some(run.as_str()));
    assert_eq!((child.event.as_str(), child.trust.as_str()), ("retry", "trusted"));
    app.admin().post("/v1/workflow-runs/nope/cancel").send().await.assert_status(StatusCode::NOT_FOUND);
}

/// `POST /v1/workflow-runs/{run}/retry` with `{"failed": true}` or
/// `?failed=true` retries from the failed jobs: refused (409) while the run
/// still runs; an empty body is the plain retry; a malformed one is 400.
#[tokio::test]
async fn retry_of_the_failed_jobs_is_refused_while_the_run_goes_on() {
    let app = TestApp::new().await;
    let (run, _agent, _a) = super::claimed(&app, &["a", "b"]).await;
    let path = format!("/v1/workflow-runs/{run}/retry");
    let body = app.admin().post(&path).json(&api::RetryRun { failed: true }).send().await;
    assert!(body.assert_status(StatusCode::CONFLICT).text().contains("have not ended"));
    let query = app.admin().post(&format!("{path}?failed=true")).send().await;
    query.assert_status(StatusCode::CONFLICT);
    app.admin().post(&path).body("{").send().await.assert_status(StatusCode::BAD_REQUEST);
    let plain: api::SubmitRunResponse = app.admin().post(&path).send().await.assert_status(StatusCode::ACCEPTED).json();
    assert_eq!(super::get_run(&app, &plain.run_id).await.parent_run_id.as_deref(), Some(run.as_str()));
}
