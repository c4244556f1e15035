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
    let reg = api::RegisterAgent {
        name: "a".into(),
        labels: Default::default(),
        max_jobs: 1,
        version: None,
        executor: None,
        fresh_start: false,
    };
    app.admin().post("/v1/agents/register").json(&reg).send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.admin().post("/v1/jobs/j/attempts/1/heartbeat").send().await.assert_status(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_token_in_the_query_grants_nothing() {
    let app = TestApp::new().await;
    app.anonymous().get("/v1/repos?token=kiln_admin_test").send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.anonymous().get("/v1/repos?token=kiln%5Fadmin%5Ftest").send().await.assert_status(StatusCode::UNAUTHORIZED);
    let create = api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "r".into(),
        clone_url: "/x".into(),
        webhook_secret: None,
        secret_pools: None,
    };
    let res = app.anonymous().post("/v1/repos?token=kiln_admin_test").json(&create).send().await;
    res.assert_status(StatusCode::UNAUTHORIZED);
}

/// The UI's session: a token in a JSON body becomes an HttpOnly,
/// SameSite=Strict cookie; a cookie-authenticated POST needs X-Kiln-CSRF.
#[tokio::test]
async fn the_ui_session_cookie_authenticates_with_a_csrf_header_on_writes() {
    let app = TestApp::new().await;
    let bad = serde_json::json!({"token": "kiln_agent_test"});
    app.anonymous().post("/v1/ui/session").json(&bad).send().await.assert_status(StatusCode::UNAUTHORIZED);
    let good = serde_json::json!({"token": "kiln_admin_test"});
    let res = app.anonymous().post("/v1/ui/session").json(&good).send().await.assert_status(StatusCode::NO_CONTENT);
    let cookie = res.headers.get("set-cookie").unwrap().to_str().unwrap().to_string();
    for attr in ["kiln_session=", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains("kiln_admin_test"), "the cookie holds a session id, not the token: {cookie}");
    assert!(!cookie.contains("Secure"), "no Secure attribute over plain http off loopback: {cookie}");
    let jar = cookie.split(';').next().unwrap().to_string();
    let jar = jar.as_str();
    app.anonymous().get("/v1/repos").header("cookie", jar).send().await.assert_status(StatusCode::OK);
    let create = api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "r".into(),
        clone_url: "/x".into(),
        webhook_secret: None,
        secret_pools: None,
    };
    let res = app.anonymous().post("/v1/repos").header("cookie", jar).json(&create).send().await;
    let res = res.assert_status(StatusCode::FORBIDDEN);
    assert_eq!(res.error_code(), "csrf");
    let res =
        app.anonymous().post("/v1/repos").header("cookie", jar).header("x-kiln-csrf", "1").json(&create).send().await;
    assert_ne!(res.status, StatusCode::FORBIDDEN);
    assert_ne!(res.status, StatusCode::UNAUTHORIZED);
    // The cookie is never an agent credential.
    let res = app.anonymous().post("/v1/agents/register").header("cookie", jar).header("x-kiln-csrf", "1").send().await;
    res.assert_status(StatusCode::UNAUTHORIZED);
    let res = app.anonymous().delete("/v1/ui/session").send().await.assert_status(StatusCode::NO_CONTENT);
    assert!(res.headers.get("set-cookie").unwrap().to_str().unwrap().contains("Max-Age=0"));
}

#[tokio::test]
async fn unknown_endpoints_are_404_json() {
    let app = TestApp::new().await;
    let res = app.anonymous().get("/v2/nothing").send().await.assert_status(StatusCode::NOT_FOUND);
    assert_eq!(res.error_code(), api::codes::NOT_FOUND);
}
