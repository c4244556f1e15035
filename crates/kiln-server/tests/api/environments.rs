//! Deployment environments through the HTTP API (issue 46): refs refused at
//! acceptance, one approval per run for a 20-way matrix deploy, approvers by
//! token name, self-review, a retry needing its own approval, and who may
//! change environments.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

const DEPLOY: &str = "version: 1\njobs:\n  - name: deploy\n    environment: {name: production, url: \"https://shop.example\"}\n    matrix: {region: [r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, r16, r17, r18, r19, r20]}\n    steps: [\"echo deploy\"]\n";

async fn token(app: &TestApp, name: &str, scope: &str) -> String {
    let trusted = (scope == "admin").then_some(true);
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

async fn submit_as(app: &TestApp, token: Option<&str>, commit: &str) -> kiln_testkit::TestResponse {
    match token {
        Some(t) => app.with_token(t),
        None => app.admin(),
    }
    .post("/v1/repos/shop/workflow-runs")
    .json(&api::SubmitRun { commit_sha: commit.into(), ..Default::default() })
    .send()
    .await
}

fn statuses(run: &api::Run) -> Vec<String> {
    run.jobs.iter().map(|j| j.status.as_str().to_string()).collect()
}

#[tokio::test]
async fn a_matrix_deploy_needs_one_approval_and_refs_selfreview_and_reruns_are_enforced() {
    let app = TestApp::new().await;
    let repo = super::repo(&app, "shop", DEPLOY).await;
    repo.commit(&[("README", "x")], "second").unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git").args(args).current_dir(repo.path()).status().unwrap().success();
        assert!(ok, "git {args:?}");
    };
    git(&["branch", "feature"]);

    // An unknown environment is refused at acceptance (it would deploy unprotected).
    let res = submit_as(&app, None, "main").await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(res.text().contains("environment `production`, which does not exist"), "{}", res.text());

    let alice = token(&app, "alice", "read").await;
    let bob = token(&app, "bob", "admin").await;
    let env = api::CreateEnvironment {
        name: "production".into(),
        approvers: vec!["alice".into(), "bob".into()],
        min_approvals: Some(1),
        prevent_self_review: true,
        refs: vec!["main".into(), "release/*".into()],
        ..Default::default()
    };
    // Only an admin changes environments.
    app.with_token(&alice).post("/v1/environments").json(&env).send().await.assert_status(StatusCode::FORBIDDEN);
    let made: api::Environment =
        app.admin().post("/v1/environments").json(&env).send().await.assert_status(StatusCode::CREATED).json();
    assert_eq!(made.approval_ttl_secs, 30 * 86_400, "an approval stands 30 days by default");
    app.with_token(&alice).get("/v1/environments/production").send().await.assert_status(StatusCode::OK);

    // A ref outside --refs: 422 naming the rule.
    let res = submit_as(&app, None, "feature").await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    let text = res.text();
    assert!(text.contains("--refs main,release/*") && text.contains("refs/heads/feature"), "{text}");

    // Bob starts a run from main: all 20 expansions wait for approval.
    let run = submit_as(&app, Some(&bob), "main")
        .await
        .assert_status(StatusCode::ACCEPTED)
        .json::<api::SubmitRunResponse>()
        .run_id;
    app.run_pending_work().await;
    let r = super::get_run(&app, &run).await;
    assert_eq!(r.jobs.len(), 20);
    assert!(statuses(&r).iter().all(|s| s == "pending"), "{:?}", statuses(&r));
    let waiting = r.jobs[0].message.clone().unwrap_or_default();
    assert!(waiting.contains("waiting for approval to deploy to `production`: 0 of 1"), "{waiting}");

    let approvals = format!("/v1/workflow-runs/{run}/approvals");
    let approve =
        api::DecideDeployment { environment: None, decision: "approve".into(), comment: Some("ship it".into()) };
    // Bob started it: no self-approval. The admin.token is not a listed approver.
    let res = app.with_token(&bob).post(&approvals).json(&approve).send().await.assert_status(StatusCode::FORBIDDEN);
    assert!(res.text().contains("--prevent-self-review"), "{}", res.text());
    let res = app.admin().post(&approvals).json(&approve).send().await.assert_status(StatusCode::FORBIDDEN);
    assert!(res.text().contains("its approvers are alice, bob"), "{}", res.text());
    // Another token of bob's name is still bob.
    let bob2 = token(&app, "bob", "read").await;
    let res = app.with_token(&bob2).post(&approvals).json(&approve).send().await.assert_status(StatusCode::FORBIDDEN);
    assert!(res.text().contains("--prevent-self-review"), "{}", res.text());
    // A trigger token never decides.
    let trig =
        api::CreateToken { name: "alice".into(), scope: "trigger".into(), repo: Some("shop".into()), trusted: None };
    let trig: api::CreatedToken =
        app.admin().post("/v1/tokens").json(&trig).send().await.assert_status(StatusCode::CREATED).json();
    app.with_token(&trig.token).post(&approvals).json(&approve).send().await.assert_status(StatusCode::FORBIDDEN);

    // Alice (a read token listed by name) approves once: every expansion becomes ready.
    let a: api::Approval =
        app.with_token(&alice).post(&approvals).json(&approve).send().await.assert_status(StatusCode::CREATED).json();
    assert_eq!((a.by.as_str(), a.decision.as_str(), a.environment.as_str()), ("alice", "approved", "production"));
    let r = super::get_run(&app, &run).await;
    assert!(statuses(&r).iter().all(|s| s == "ready"), "one approval for all 20: {:?}", statuses(&r));
    app.with_token(&alice).post(&approvals).json(&approve).send().await.assert_status(StatusCode::CONFLICT);
    let list: api::ApprovalList = app.admin().get(&approvals).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(list.approvals.len(), 1);
    let audit = app.admin().get("/v1/audit").send().await.assert_status(StatusCode::OK).text();
    assert!(audit.contains("deployment.approve") && audit.contains("environment production: ship it"), "{audit}");

    // A retry of the approved run is a new run: it waits for its own approval.
    let retry = app
        .admin()
        .post(&format!("/v1/workflow-runs/{run}/retry"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED)
        .json::<api::SubmitRunResponse>()
        .run_id;
    app.run_pending_work().await;
    let r = super::get_run(&app, &retry).await;
    assert!(statuses(&r).iter().all(|s| s == "pending"), "a re-run needs a fresh approval: {:?}", statuses(&r));
    // Rejected: cancelled with who and why; the run fails.
    let reject = api::DecideDeployment {
        environment: Some("production".into()),
        decision: "reject".into(),
        comment: Some("not on a Friday".into()),
    };
    app.with_token(&alice)
        .post(&format!("/v1/workflow-runs/{retry}/approvals"))
        .json(&reject)
        .send()
        .await
        .assert_status(StatusCode::CREATED);
    let r = super::get_run(&app, &retry).await;
    assert_eq!(r.status, "failed");
    assert!(statuses(&r).iter().all(|s| s == "cancelled"));
    assert_eq!(
        r.jobs[0].message.as_deref(),
        Some("cancelled: deployment to `production` rejected by alice: not on a Friday")
    );
}

/// `POST /v1/environments/{env}/rollback` (issue 46): its approvers only
/// (a read token listed by name may; an admin not listed may not); nothing
/// deployed, or no such deployment of it, changes nothing; bad bodies 4xx.
#[tokio::test]
async fn only_an_environments_approvers_roll_it_back_and_a_refusal_changes_nothing() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "shop", DEPLOY).await;
    let alice = token(&app, "alice", "read").await;
    let mallory = token(&app, "mallory", "read").await;
    let trigger = app
        .admin()
        .post("/v1/tokens")
        .json(&api::CreateToken {
            name: "ci".into(),
            scope: "trigger".into(),
            repo: Some("shop".into()),
            trusted: None,
        })
        .send()
        .await
        .assert_status(StatusCode::CREATED)
        .json::<api::CreatedToken>()
        .token;
    let env = api::CreateEnvironment {
        name: "production".into(),
        approvers: vec!["alice".into()],
        min_approvals: Some(1),
        ..Default::default()
    };
    app.admin().post("/v1/environments").json(&env).send().await.assert_status(StatusCode::CREATED);
    let url = "/v1/environments/production/rollback";
    let body = api::RollbackRequest::default();
    let res = app.admin().post(url).json(&body).send().await.assert_status(StatusCode::FORBIDDEN);
    assert!(res.text().contains("its approvers are alice"), "{}", res.text());
    app.with_token(&mallory).post(url).json(&body).send().await.assert_status(StatusCode::FORBIDDEN);
    app.with_token(&trigger).post(url).json(&body).send().await.assert_status(StatusCode::FORBIDDEN);
    let res = app.with_token(&alice).post(url).json(&body).send().await.assert_status(StatusCode::CONFLICT);
    assert!(res.text().contains("no successful deployment"), "{}", res.text());
    let to = api::RollbackRequest { to: Some("nope".into()), comment: None };
    app.with_token(&alice).post(url).json(&to).send().await.assert_status(StatusCode::NOT_FOUND);
    app.with_token(&alice)
        .post("/v1/environments/staging/rollback")
        .json(&body)
        .send()
        .await
        .assert_status(StatusCode::NOT_FOUND);
    let res = app.with_token(&alice).post(url).body("{\"to\": 3, \"force\": true}").send().await;
    assert!(res.status.is_client_error(), "a bad body is refused: {}", res.status);
    let runs: api::RunList =
        app.admin().get("/v1/repos/shop/workflow-runs").send().await.assert_status(StatusCode::OK).json();
    assert!(runs.runs.is_empty(), "no run was accepted by a refused rollback");
    let audit = app.admin().get("/v1/audit").send().await.assert_status(StatusCode::OK).text();
    assert!(!audit.contains("deployment.rollback"), "{audit}");
}
