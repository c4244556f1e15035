//! Environment secrets and provenance policies through the HTTP API (issue
//! 46): only an admin sets, lists and deletes them; values are never
//! returned and are sealed at rest; a trusted run's deploy job gets its
//! environment's secrets (over the repository's of the same name), while a
//! job without that environment, a job of another environment and any job
//! of an untrusted run do not; acceptance counts an environment's secrets
//! only for that environment's jobs.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;
use std::collections::BTreeMap;

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    secrets: [TOKEN, SHARED]
    steps: ["echo build"]
  - name: deploy
    needs: build
    environment: production
    secrets: [TOKEN, SHARED, PROD_ONLY]
    steps: ["echo deploy"]
  - name: stage
    needs: build
    environment: staging
    secrets: [TOKEN, SHARED]
    steps: ["echo stage"]
"#;

/// A job without `environment:` asking for production's secret.
const SNEAKY: &str = "version: 1\njobs:\n  - name: peek\n    secrets: [PROD_ONLY]\n    steps: [\"echo peek\"]\n";

async fn token(app: &TestApp, name: &str, scope: &str, trusted: Option<bool>) -> String {
    let body = api::CreateToken { name: name.into(), scope: scope.into(), repo: None, trusted };
    app.admin()
        .post("/v1/tokens")
        .json(&body)
        .send()
        .await
        .assert_status(StatusCode::CREATED)
        .json::<api::CreatedToken>()
        .token
}

async fn put(app: &TestApp, path: &str, value: &str) -> kiln_testkit::TestResponse {
    app.admin().put(path).json(&api::PutSecret { value: value.into() }).send().await
}

/// Claim and succeed every claimable job until the run ends: what each job
/// was handed, by job name.
async fn handed(app: &TestApp, run: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let agent = super::register(app, &format!("a-{run}"), 4).await;
    let mut out = BTreeMap::new();
    for i in 0..20 {
        app.run_pending_work().await;
        match super::claim(app, &agent, &format!("{run}-{i}")).await {
            Some(a) => {
                out.insert(a.job_name.clone(), a.secrets.clone());
                super::complete(app, &a, "success").await.assert_status(StatusCode::OK);
            }
            None if super::get_run(app, run).await.status == "success" => return out,
            None => {}
        }
    }
    panic!("run {run} did not end: {:?}", super::get_run(app, run).await);
}

#[tokio::test]
async fn environment_secrets_reach_only_that_environments_jobs_of_trusted_runs() {
    // The test's agents (default pool, host executor) claim untrusted runs
    // too (the unsafe opt-in): this is about secrets, not placement.
    let app = TestApp::with_config(|c| {
        c.untrusted = kiln_core::claim::UntrustedPolicy { pools: vec!["default".into()], host_executor: true }
    })
    .await;
    let repo = super::repo(&app, "shop", WORKFLOW).await;
    for name in ["production", "staging"] {
        let env = api::CreateEnvironment { name: name.into(), ..Default::default() };
        app.admin().post("/v1/environments").json(&env).send().await.assert_status(StatusCode::CREATED);
    }

    // Only an admin: a read token may neither set nor list them.
    let reader = token(&app, "reader", "read", None).await;
    let body = api::PutSecret { value: "prod-token-value".into() };
    let path = "/v1/environments/production/secrets/TOKEN";
    app.with_token(&reader).put(path).json(&body).send().await.assert_status(StatusCode::FORBIDDEN);
    app.with_token(&reader)
        .get("/v1/environments/production/secrets")
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);
    app.with_token(&reader).delete(path).send().await.assert_status(StatusCode::FORBIDDEN);
    // Bad input changes nothing.
    put(&app, "/v1/environments/nowhere/secrets/TOKEN", "x").await.assert_status(StatusCode::NOT_FOUND);
    put(&app, "/v1/environments/production/secrets/1BAD", "x").await.assert_status(StatusCode::BAD_REQUEST);
    put(&app, "/v1/environments/production/secrets/TOKEN", "").await.assert_status(StatusCode::BAD_REQUEST);
    assert!(app.store().list_env_secrets("production").await.unwrap().is_empty());

    let info: api::SecretInfo = put(&app, path, "prod-token-value").await.assert_status(StatusCode::OK).json();
    assert_eq!(info.name, "TOKEN");
    put(&app, "/v1/environments/production/secrets/PROD_ONLY", "prod-only-value").await.assert_status(StatusCode::OK);
    put(&app, "/v1/environments/staging/secrets/TOKEN", "staging-token-value").await.assert_status(StatusCode::OK);
    put(&app, "/v1/repos/shop/secrets/TOKEN", "repo-token-value").await.assert_status(StatusCode::OK);
    put(&app, "/v1/repos/shop/secrets/SHARED", "repo-shared-value").await.assert_status(StatusCode::OK);
    // Names only, never values; sealed at rest.
    let list = app.admin().get("/v1/environments/production/secrets").send().await.assert_status(StatusCode::OK);
    assert!(!list.text().contains("value"), "{}", list.text());
    let names: Vec<String> = list.json::<serde_json::Value>()["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["PROD_ONLY", "TOKEN"]);
    let rows = app.store().all_secrets().await.unwrap();
    let env_rows: Vec<_> = rows.iter().filter(|r| r.0.starts_with("env:")).collect();
    assert_eq!(env_rows.len(), 3, "{rows:?}");
    assert!(env_rows.iter().all(|r| r.2.starts_with("kiln-sealed:v1:") && !r.2.contains("value")), "{env_rows:?}");
    // The audit log names them, never their values.
    let audit = app.admin().get("/v1/audit").send().await.assert_status(StatusCode::OK).text();
    assert!(audit.contains("env:production/TOKEN") && !audit.contains("prod-token-value"), "{audit}");

    // A trusted run: each deploy job its own environment's, over the repository's.
    let run = super::submit(&app, "shop").await;
    let got = handed(&app, &run).await;
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(got["build"], BTreeMap::from([s("SHARED", "repo-shared-value"), s("TOKEN", "repo-token-value")]));
    assert_eq!(
        got["deploy"],
        BTreeMap::from([
            s("PROD_ONLY", "prod-only-value"),
            s("SHARED", "repo-shared-value"),
            s("TOKEN", "prod-token-value")
        ])
    );
    assert_eq!(got["stage"], BTreeMap::from([s("SHARED", "repo-shared-value"), s("TOKEN", "staging-token-value")]));

    // An untrusted run (outside code: a pull request's event): nothing.
    let res = app
        .admin()
        .post("/v1/repos/shop/workflow-runs")
        .json(&api::SubmitRun { commit_sha: "HEAD".into(), event: Some("pull_request".into()), ..Default::default() })
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED);
    let run = res.json::<api::SubmitRunResponse>().run_id;
    assert_eq!(super::get_run(&app, &run).await.trust, "untrusted");
    let got = handed(&app, &run).await;
    assert_eq!(got.len(), 3);
    assert!(got.values().all(BTreeMap::is_empty), "an untrusted run got secrets: {got:?}");

    // A job without an environment may not ask for an environment's secret.
    repo.commit(&[(".kiln/sneaky.yaml", SNEAKY)], "sneaky").unwrap();
    let res = app
        .admin()
        .post("/v1/repos/shop/workflow-runs")
        .json(&api::SubmitRun {
            commit_sha: "HEAD".into(),
            workflow_path: Some(".kiln/sneaky.yaml".into()),
            ..Default::default()
        })
        .send()
        .await
        .assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(res.text().contains("PROD_ONLY"), "{}", res.text());

    // Deleted one by one (404 the second time), and with their environment.
    app.admin().delete("/v1/environments/staging/secrets/TOKEN").send().await.assert_status(StatusCode::OK);
    app.admin().delete("/v1/environments/staging/secrets/TOKEN").send().await.assert_status(StatusCode::NOT_FOUND);
    app.admin().delete("/v1/environments/production").send().await.assert_status(StatusCode::OK);
    assert!(app.store().all_secrets().await.unwrap().iter().all(|r| !r.0.starts_with("env:")));
}

#[tokio::test]
async fn a_provenance_policy_is_validated_shown_and_cleared() {
    let app = TestApp::new().await;
    let bad = api::CreateEnvironment {
        name: "production".into(),
        require_provenance: Some("ref=main".into()),
        ..Default::default()
    };
    let res =
        app.admin().post("/v1/environments").json(&bad).send().await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(res.text().contains("ref=refs/heads/main"), "{}", res.text());
    app.admin().get("/v1/environments/production").send().await.assert_status(StatusCode::NOT_FOUND);
    let good = api::CreateEnvironment {
        name: "production".into(),
        require_provenance: Some(" ref=refs/heads/main, trusted ".into()),
        ..Default::default()
    };
    let made: api::Environment =
        app.admin().post("/v1/environments").json(&good).send().await.assert_status(StatusCode::CREATED).json();
    assert_eq!(made.require_provenance.as_deref(), Some("trusted,ref=refs/heads/main"), "the canonical form");
    let patch = |p: &str| api::UpdateEnvironment { require_provenance: Some(p.into()), ..Default::default() };
    let res = app
        .admin()
        .request(axum::http::Method::PATCH, "/v1/environments/production")
        .json(&patch("unknown"))
        .send()
        .await;
    assert!(res.assert_status(StatusCode::UNPROCESSABLE_ENTITY).text().contains("unknown provenance check"));
    let shown: api::Environment = app.admin().get("/v1/environments/production").send().await.json();
    assert_eq!(shown.require_provenance.as_deref(), Some("trusted,ref=refs/heads/main"), "unchanged");
    let cleared: api::Environment = app
        .admin()
        .request(axum::http::Method::PATCH, "/v1/environments/production")
        .json(&patch("none"))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert_eq!(cleared.require_provenance, None);
}
