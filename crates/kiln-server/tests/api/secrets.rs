//! Repository secrets: set, list (names only), delete.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

#[tokio::test]
async fn put_list_delete_never_showing_values() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let put = api::PutSecret { value: "hunter2".into() };
    let info: api::SecretInfo =
        app.admin().put("/v1/repos/r/secrets/DB_PASS").json(&put).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(info.name, "DB_PASS");
    assert!(info.updated_at_ms > 0);
    let list = app.admin().get("/v1/repos/r/secrets").send().await.assert_status(StatusCode::OK);
    assert!(!list.text().contains("hunter2"), "{}", list.text());
    assert_eq!(list.json::<serde_json::Value>()["secrets"][0]["name"], "DB_PASS");
    // At rest the value is sealed: the database holds no clear text.
    let rows = app.store().all_secrets().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].2.starts_with("kiln-sealed:v1:") && !rows[0].2.contains("hunter2"), "{:?}", rows[0]);
    let del = app.admin().delete("/v1/repos/r/secrets/DB_PASS").send().await.assert_status(StatusCode::OK);
    assert_eq!(del.json::<serde_json::Value>()["deleted"], "DB_PASS");
    let again = app.admin().delete("/v1/repos/r/secrets/DB_PASS").send().await;
    assert_eq!(again.assert_status(StatusCode::NOT_FOUND).error_code(), api::codes::NOT_FOUND);
}

#[tokio::test]
async fn bad_names_values_and_repositories() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let put = api::PutSecret { value: "v".into() };
    app.admin().put("/v1/repos/r/secrets/1ABC").json(&put).send().await.assert_status(StatusCode::BAD_REQUEST);
    let empty = api::PutSecret { value: String::new() };
    app.admin().put("/v1/repos/r/secrets/OK").json(&empty).send().await.assert_status(StatusCode::BAD_REQUEST);
    app.admin().put("/v1/repos/nope/secrets/OK").json(&put).send().await.assert_status(StatusCode::NOT_FOUND);
    app.admin().get("/v1/repos/nope/secrets").send().await.assert_status(StatusCode::NOT_FOUND);
}
