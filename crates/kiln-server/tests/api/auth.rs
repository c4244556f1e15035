//! Bearer tokens: two scopes, neither grants the other's calls.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

#[tokio::test]
async fn no_token_is_401_with_what_to_send() {
    let app = TestApp::new().await;
    let res = app.anonymous().get("/v1/repos").send().await.assert_status(StatusCode::UNAUTHORIZED);
    assert_eq!(res.error_code(), api::codes::UNAUTHORIZED);
    assert!(res.json::<api::ErrorBody>().error.message.contains("Authorization: Bearer"));
    let res = app.anonymous().post("/v1/agents/register").json(&serde_json::json!({})).send().await;
    res.assert_status(StatusCode::UNAUTHORIZED);
    app.anonymous()
        .get("/v1/repos")
        .header("authorization", "Bearer nope")
        .send()
        .await
        .assert_status(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_agent_token_is_refused_on_the_public_api_and_back() {
    let app = TestApp::new().await;
    app.agent().get("/v1/repos").send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.agent().get("/v1/workflow-runs/x").send().await.assert_status(StatusCode::UNAUTHORIZED);
    let reg = api::RegisterAgent { name: "a".into(), labels: Default::default(), max_jobs: 1 };
    app.admin().post("/v1/agents/register").json(&reg).send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.admin().post("/v1/jobs/j/attempts/1/heartbeat").send().await.assert_status(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_get_may_carry_the_token_in_the_query_for_event_source() {
    let app = TestApp::new().await;
    app.anonymous().get("/v1/repos?token=kiln_admin_test").send().await.assert_status(StatusCode::OK);
    // Percent-encoded as a browser may send it; never on a POST.
    app.anonymous().get("/v1/repos?token=kiln%5Fadmin%5Ftest").send().await.assert_status(StatusCode::OK);
    let create = api::CreateRepo { name: "r".into(), clone_url: "/x".into(), webhook_secret: None, secret_pools: None };
    let res = app.anonymous().post("/v1/repos?token=kiln_admin_test").json(&create).send().await;
    res.assert_status(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_endpoints_are_404_json() {
    let app = TestApp::new().await;
    let res = app.anonymous().get("/v2/nothing").send().await.assert_status(StatusCode::NOT_FOUND);
    assert_eq!(res.error_code(), api::codes::NOT_FOUND);
}
