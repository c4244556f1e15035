//! Badges and notifications (issue 42) through the router: who may add,
//! list, remove and read the log of notifications (admins only; a trigger
//! token, the agent token, a read token and another repository's token
//! may not), the signing secret never returned, bad input refused with
//! what to do, and the badge served without a token only for a public
//! repository (a private one reads as not found).

use axum::http::{Method, StatusCode};
use kiln_api as api;
use kiln_testkit::TestApp;

const SECRET: &str = "notify-secret-0123456789abcdef";

async fn token(app: &TestApp, scope: &str, repo: Option<&str>) -> String {
    let body =
        api::CreateToken { name: format!("{scope}-t"), scope: scope.into(), repo: repo.map(Into::into), trusted: None };
    let t: api::CreatedToken =
        app.admin().post("/v1/tokens").json(&body).send().await.assert_status(StatusCode::CREATED).json();
    t.token
}

fn add_body() -> serde_json::Value {
    serde_json::json!({ "url": "http://127.0.0.1:9/hook", "secret": SECRET, "events": ["failure", "fixed"] })
}

#[tokio::test]
async fn only_admins_manage_notifications_and_the_secret_is_never_returned() {
    let app = TestApp::new().await;
    let _r = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let _o = super::repo(&app, "other", &super::pipeline(&["build"])).await;
    let res = app.admin().post("/v1/repos/r/notifications").json(&add_body()).send().await;
    let res = res.assert_status(StatusCode::CREATED);
    assert!(!res.text().contains(SECRET), "{}", res.text());
    let n: api::Notification = res.json();
    assert_eq!(
        (n.repo.as_str(), n.events.clone(), n.format.as_str()),
        ("r", vec!["failure".into(), "fixed".into()], "kiln")
    );

    let own_trigger = token(&app, "trigger", Some("r")).await;
    let other_trigger = token(&app, "trigger", Some("other")).await;
    let read = token(&app, "read", None).await;
    let calls: Vec<(Method, String)> = vec![
        (Method::POST, "/v1/repos/r/notifications".into()),
        (Method::GET, "/v1/repos/r/notifications".into()),
        (Method::GET, "/v1/repos/r/notifications/deliveries".into()),
        (Method::DELETE, format!("/v1/repos/r/notifications/{}", n.id)),
    ];
    for (method, path) in &calls {
        for (who, caller, want) in [
            ("trigger token of r", app.with_token(&own_trigger), StatusCode::FORBIDDEN),
            ("trigger token of another repository", app.with_token(&other_trigger), StatusCode::FORBIDDEN),
            ("read token", app.with_token(&read), StatusCode::FORBIDDEN),
            ("agent token", app.agent(), StatusCode::UNAUTHORIZED),
            ("no token", app.anonymous(), StatusCode::UNAUTHORIZED),
        ] {
            let res = caller.request(method.clone(), path).json(&add_body()).send().await;
            assert_eq!(res.status, want, "{who}: {method} {path}: {}", res.text());
            assert!(!res.text().contains(SECRET));
        }
    }
    // Nothing was added or removed by them.
    let list = app.admin().get("/v1/repos/r/notifications").send().await.assert_status(StatusCode::OK);
    assert!(!list.text().contains(SECRET), "{}", list.text());
    let list: serde_json::Value = list.json();
    assert_eq!(list["notifications"].as_array().unwrap().len(), 1);
    // The secret is no listed secret either, and no repository field shows it.
    let secrets = app.admin().get("/v1/repos/r/secrets").send().await.assert_status(StatusCode::OK);
    assert_eq!(secrets.json::<serde_json::Value>()["secrets"], serde_json::json!([]));
    let repo = app.admin().get("/v1/repos/r").send().await.assert_status(StatusCode::OK);
    assert!(!repo.text().contains(SECRET));
    // Another repository's path does not reach r's notification.
    let res = app.admin().delete(&format!("/v1/repos/other/notifications/{}", n.id)).send().await;
    res.assert_status(StatusCode::NOT_FOUND);
    let gone: api::Notification = app
        .admin()
        .delete(&format!("/v1/repos/r/notifications/{}", n.id))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert_eq!(gone.id, n.id);
}

#[tokio::test]
async fn bad_notifications_are_refused_with_what_to_do() {
    let app = TestApp::new().await;
    let _r = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let cases = [
        (
            serde_json::json!({"url": "ftp://x/h", "secret": SECRET, "events": ["failure"]}),
            "`ftp://x/h`: a notification URL is http:// or https://, not ftp:",
        ),
        (
            serde_json::json!({"url": "http://x/h", "secret": "short", "events": ["failure"]}),
            "a notification secret is 16 to 1024 printable characters (e.g. `openssl rand -hex 32 > notify.secret`)",
        ),
        (
            serde_json::json!({"url": "http://x/h", "secret": SECRET, "events": ["failure", "broken"]}),
            "unknown event `broken`; use failure, fixed, success, cancelled, always",
        ),
        (
            serde_json::json!({"url": "http://x/h", "secret": SECRET, "events": ["failure"], "format": "teams"}),
            "unknown format `teams`; use kiln (default) or slack",
        ),
    ];
    for (body, want) in cases {
        let res = app.admin().post("/v1/repos/r/notifications").json(&body).send().await;
        let res = res.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(res.json::<api::ErrorBody>().error.message, want);
    }
    let list: serde_json::Value = app.admin().get("/v1/repos/r/notifications").send().await.json();
    assert_eq!(list["notifications"], serde_json::json!([]), "nothing was added");
    let res = app.admin().post("/v1/repos/nope/notifications").json(&add_body()).send().await;
    res.assert_status(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_badge_is_public_only_for_a_public_repository() {
    let app = TestApp::new().await;
    let _r = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let _o = super::repo(&app, "other", &super::pipeline(&["build"])).await;
    // Private (the default): not found without a token, or with another
    // repository's; the same answer as a repository that does not exist.
    let missing = app.anonymous().get("/v1/repos/nope/badge.svg").send().await.assert_status(StatusCode::NOT_FOUND);
    let private = app.anonymous().get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json::<api::ErrorBody>().error.message.replace("`nope`", "`X`"),
        private.json::<api::ErrorBody>().error.message.replace("`r`", "`X`"),
    );
    let other = token(&app, "trigger", Some("other")).await;
    app.with_token(&other).get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::NOT_FOUND);
    app.agent().get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::NOT_FOUND);
    // A token that may read r gets it.
    let own = token(&app, "trigger", Some("r")).await;
    let read = token(&app, "read", None).await;
    for t in [own.as_str(), read.as_str()] {
        let res = app.with_token(t).get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::OK);
        assert!(res.text().contains("kiln: none"), "{}", res.text());
    }
    app.admin().get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::OK);
    // Public: anyone; a private repository again after --private.
    let set = |public: bool| serde_json::json!({ "public": public });
    let repo: api::Repo = app
        .admin()
        .request(Method::PATCH, "/v1/repos/r")
        .json(&set(true))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert!(repo.public);
    let res = app.anonymous().get("/v1/repos/r/badge.svg?branch=main").send().await.assert_status(StatusCode::OK);
    assert_eq!(res.header("content-type"), Some("image/svg+xml; charset=utf-8"));
    assert_eq!(res.header("cache-control"), Some("no-cache"));
    let svg = res.text();
    assert!(
        svg.starts_with("<svg") && svg.contains(r#"role="img""#) && svg.contains("<title>kiln: none</title>"),
        "{svg}"
    );
    let res = app.anonymous().get("/v1/repos/r/badge.svg?workflow=../x").send().await;
    let res = res.assert_status(StatusCode::BAD_REQUEST);
    assert!(res.json::<api::ErrorBody>().error.message.contains("is not a workflow"));
    app.admin().request(Method::PATCH, "/v1/repos/r").json(&set(false)).send().await.assert_status(StatusCode::OK);
    app.anonymous().get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_badge_shows_the_newest_run_of_the_branch() {
    let app = TestApp::new().await;
    let _r = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let _run = super::submit(&app, "r").await;
    let svg = app.admin().get("/v1/repos/r/badge.svg").send().await.assert_status(StatusCode::OK).text();
    assert!(svg.contains("kiln: running"), "a queued run: {svg}");
    let svg = app.admin().get("/v1/repos/r/badge.svg?workflow=pipeline").send().await.text();
    assert!(svg.contains("kiln: running"), "{svg}");
    let svg = app.admin().get("/v1/repos/r/badge.svg?workflow=release").send().await.text();
    assert!(svg.contains("kiln: none"), "{svg}");
}
