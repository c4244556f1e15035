//! `POST /v1/repos`, `GET /v1/repos`.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

fn repo(name: &str, url: &str) -> api::CreateRepo {
    api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: name.into(),
        clone_url: url.into(),
        webhook_secret: None,
        secret_pools: None,
    }
}

#[tokio::test]
async fn create_then_list() {
    let app = TestApp::new().await;
    let res = app.admin().post("/v1/repos").json(&repo(" web ", " /srv/web ")).send().await;
    let created: api::Repo = res.assert_status(StatusCode::CREATED).json();
    assert_eq!((created.name.as_str(), created.clone_url.as_str()), ("web", "/srv/web"), "trimmed");
    let list: serde_json::Value = app.admin().get("/v1/repos").send().await.assert_status(StatusCode::OK).json();
    assert_eq!(list["repos"][0]["name"], "web");
    assert_eq!(list["repos"][0]["id"], created.id.as_str());
    let dup = app.admin().post("/v1/repos").json(&repo("web", "/other")).send().await;
    assert_eq!(dup.assert_status(StatusCode::CONFLICT).error_code(), api::codes::CONFLICT);
}

#[tokio::test]
async fn invalid_repositories_are_refused() {
    let app = TestApp::new().await;
    for (name, url) in [("", "/x"), ("a b", "/x"), ("ok", " ")] {
        let res = app.admin().post("/v1/repos").json(&repo(name, url)).send().await;
        assert_eq!(res.assert_status(StatusCode::UNPROCESSABLE_ENTITY).error_code(), api::codes::INVALID);
    }
    let res = app.admin().post("/v1/repos").body("{not json").send().await.assert_status(StatusCode::BAD_REQUEST);
    assert!(res.text().contains("invalid JSON body"), "{}", res.text());
}
