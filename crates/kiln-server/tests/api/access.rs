//! Who may do what: attempts bound to the session that claimed them,
//! scoped API tokens, join tokens, agent removal, and the audit log.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;

/// Finding 2 of issue 13: any holder of the agent token could complete any
/// job. Now a call on an attempt needs that attempt's token.
#[tokio::test]
async fn only_the_claiming_session_may_act_on_an_attempt() {
    let app = TestApp::new().await;
    let (run, _agent, a) = super::claimed(&app, &["build"]).await;
    let intruder = super::register(&app, "intruder", 1).await;
    let path = |what: &str| format!("/v1/jobs/{}/attempts/{}/{what}", a.job_id, a.epoch);
    let done = api::Completion::success();
    // The join token, another agent's session credential, its own session
    // credential used as if it were the attempt's, garbage: all refused.
    for (caller, want) in [
        (app.agent(), StatusCode::UNAUTHORIZED),
        (app.with_token(&intruder.credential), StatusCode::FORBIDDEN),
        (app.with_token("kiln_a1.00"), StatusCode::FORBIDDEN),
        (app.admin(), StatusCode::UNAUTHORIZED),
    ] {
        caller.post(&path("complete")).json(&done).send().await.assert_status(want);
    }
    for what in ["heartbeat", "restore", "artifacts", "image"] {
        let res = app.with_token(&intruder.credential).post(&path(what)).json(&serde_json::json!({})).send().await;
        res.assert_status(StatusCode::FORBIDDEN);
    }
    let seal = format!("/v1/jobs/{}/attempts/{}/artifacts/g/seal", a.job_id, a.epoch);
    app.with_token(&intruder.credential)
        .post(&seal)
        .json(&serde_json::json!({}))
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);
    // Nothing changed: the job is still running under its holder, who
    // completes it.
    let view = super::get_run(&app, &run).await;
    assert_eq!((view.jobs[0].status.as_str(), view.jobs[0].attempts[0].outcome.as_str()), ("running", "running"));
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);
}

/// A claim request id replayed by another session recovers nothing.
#[tokio::test]
async fn another_session_cannot_recover_a_claim_by_its_request_id() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let other = super::register(&app, "other", 1).await;
    let got = super::claim(&app, &other, "c1").await;
    assert!(got.is_none(), "the request id c1 is the first agent's: {got:?}");
    let again = super::claim(&app, &_agent, "c1").await.expect("its own replay");
    assert_eq!((again.epoch, again.attempt_token.as_str()), (a.epoch, a.attempt_token.as_str()));
}

async fn token(app: &TestApp, scope: &str, repo: Option<&str>, trusted: Option<bool>) -> api::CreatedToken {
    let body =
        api::CreateToken { name: format!("{scope}-token"), scope: scope.into(), repo: repo.map(Into::into), trusted };
    app.admin().post("/v1/tokens").json(&body).send().await.assert_status(StatusCode::CREATED).json()
}

#[tokio::test]
async fn read_tokens_read_and_change_nothing() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let run = super::submit(&app, "r").await;
    let t = token(&app, "read", None, None).await;
    assert!(t.token.starts_with("kiln_t1.") && !t.info.trusted);
    let read = app.with_token(&t.token);
    read.get("/v1/repos").send().await.assert_status(StatusCode::OK);
    read.get(&format!("/v1/workflow-runs/{run}")).send().await.assert_status(StatusCode::OK);
    for (method, path) in [
        ("POST", "/v1/repos/r/workflow-runs".to_string()),
        ("POST", format!("/v1/workflow-runs/{run}/cancel")),
        ("POST", format!("/v1/workflow-runs/{run}/retry")),
        ("POST", format!("/v1/workflow-runs/{run}/jobs/build/cancel")),
        ("POST", format!("/v1/workflow-runs/{run}/jobs/build/retry")),
        ("GET", "/v1/repos/r/secrets".to_string()),
        ("PUT", "/v1/repos/r/secrets/X".to_string()),
        ("GET", "/v1/tokens".to_string()),
        ("POST", "/v1/tokens".to_string()),
        ("GET", "/v1/audit".to_string()),
        ("GET", "/v1/agents".to_string()),
        ("GET", "/v1/overview".to_string()),
    ] {
        let m = method.parse().unwrap();
        let res = read.request(m, &path).json(&serde_json::json!({"value": "x"})).send().await;
        assert_eq!(res.assert_status(StatusCode::FORBIDDEN).error_code(), api::codes::FORBIDDEN, "{method} {path}");
    }
    assert_eq!(super::get_run(&app, &run).await.status, "queued", "nothing changed");
    // The admin's overview: the queued run's job waits in the queue under
    // no labels; nothing runs.
    let o: api::Overview = app.admin().get("/v1/overview").send().await.assert_status(StatusCode::OK).json();
    let queue: Vec<_> = o.queue.iter().map(|q| (q.labels.len(), q.eligible)).collect();
    assert_eq!(queue, vec![(0, 1)], "{o:?}");
    assert!(o.running.is_empty() && o.agents.is_empty(), "{o:?}");
    assert_eq!(o.jobs.get("ready"), Some(&1), "{o:?}");
    // Scope errors are 422 and create nothing.
    for bad in [
        api::CreateToken { name: "x".into(), scope: "root".into(), repo: None, trusted: None },
        api::CreateToken { name: "x".into(), scope: "trigger".into(), repo: None, trusted: None },
        api::CreateToken { name: "x".into(), scope: "read".into(), repo: Some("r".into()), trusted: None },
        api::CreateToken { name: "x y".into(), scope: "read".into(), repo: None, trusted: None },
    ] {
        app.admin().post("/v1/tokens").json(&bad).send().await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    }
    let listed: serde_json::Value = app.admin().get("/v1/tokens").send().await.assert_status(StatusCode::OK).json();
    assert_eq!(listed["tokens"].as_array().unwrap().len(), 1);
    assert!(!listed.to_string().contains(&t.token), "secrets are never listed");
}

#[tokio::test]
async fn trigger_tokens_start_untrusted_runs_of_their_repository_only() {
    let app = TestApp::new().await;
    let _r = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let _other = super::repo(&app, "other", &super::pipeline(&["build"])).await;
    let other_run = super::submit(&app, "other").await;
    let t = token(&app, "trigger", Some("r"), None).await;
    let trig = app.with_token(&t.token);
    let body = api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() };
    let run: api::SubmitRunResponse =
        trig.post("/v1/repos/r/workflow-runs").json(&body).send().await.assert_status(StatusCode::ACCEPTED).json();
    let view: api::Run =
        trig.get(&format!("/v1/workflow-runs/{}", run.run_id)).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(view.trust, "untrusted", "a trigger token is not trusted unless made so");
    trig.get("/v1/repos/r/workflow-runs").send().await.assert_status(StatusCode::OK);
    // Another repository does not exist for it; runs of it neither.
    trig.post("/v1/repos/other/workflow-runs").json(&body).send().await.assert_status(StatusCode::NOT_FOUND);
    trig.get(&format!("/v1/workflow-runs/{other_run}")).send().await.assert_status(StatusCode::NOT_FOUND);
    trig.get("/v1/repos/other/workflow-runs").send().await.assert_status(StatusCode::NOT_FOUND);
    trig.post(&format!("/v1/workflow-runs/{}/cancel", run.run_id)).send().await.assert_status(StatusCode::FORBIDDEN);
    // Issue 42: one job's cancel and retry are refused too, of its own
    // repository's runs and of another's; its own run's artifact list is a
    // read it may make, another repository's run reads as not found.
    for r in [&run.run_id, &other_run] {
        for action in ["cancel", "retry"] {
            let path = format!("/v1/workflow-runs/{r}/jobs/build/{action}");
            trig.post(&path).send().await.assert_status(StatusCode::FORBIDDEN);
        }
    }
    assert_eq!(super::get_run(&app, &other_run).await.jobs[0].status, "ready", "nothing changed");
    let listed: api::RunArtifacts = trig
        .get(&format!("/v1/workflow-runs/{}/artifacts", run.run_id))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert!(listed.artifacts.is_empty());
    trig.get(&format!("/v1/workflow-runs/{other_run}/artifacts")).send().await.assert_status(StatusCode::NOT_FOUND);
    trig.get("/v1/repos").send().await.assert_status(StatusCode::FORBIDDEN);

    // A trusted trigger token starts trusted runs; revoked, it is refused.
    let trusted = token(&app, "trigger", Some("r"), Some(true)).await;
    let run: api::SubmitRunResponse = app
        .with_token(&trusted.token)
        .post("/v1/repos/r/workflow-runs")
        .json(&body)
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED)
        .json();
    assert_eq!(super::get_run(&app, &run.run_id).await.trust, "trusted");
    app.admin().delete(&format!("/v1/tokens/{}", trusted.info.id)).send().await.assert_status(StatusCode::OK);
    let res = app.with_token(&trusted.token).post("/v1/repos/r/workflow-runs").json(&body).send().await;
    res.assert_status(StatusCode::UNAUTHORIZED);
    // A token with a wrong secret for a real id is refused too.
    let forged = format!("kiln_t1.{}.{}", t.info.id, "0".repeat(48));
    app.with_token(&forged).get("/v1/repos/r/workflow-runs").send().await.assert_status(StatusCode::UNAUTHORIZED);

    // The audit log names who started what.
    let audit: serde_json::Value =
        app.admin().get("/v1/audit?limit=50").send().await.assert_status(StatusCode::OK).json();
    let entries = audit["entries"].as_array().unwrap();
    let submits: Vec<&str> =
        entries.iter().filter(|e| e["action"] == "run.submit").map(|e| e["actor"].as_str().unwrap()).collect();
    assert!(submits.contains(&format!("token:{}", t.info.id).as_str()), "{submits:?}");
    assert!(submits.contains(&"admin.token"), "{submits:?}");
    assert!(entries.iter().any(|e| e["action"] == "token.revoke" && e["target"] == trusted.info.id.as_str()));
}

#[tokio::test]
async fn join_tokens_register_agents_into_their_pool_until_revoked() {
    let app = TestApp::new().await;
    let body = api::CreateJoinToken { name: "gpu-boxes".into(), pool: Some("gpu".into()) };
    let j: api::CreatedJoinToken =
        app.admin().post("/v1/agent-tokens").json(&body).send().await.assert_status(StatusCode::CREATED).json();
    let reg = api::RegisterAgent {
        name: "g1".into(),
        labels: Default::default(),
        max_jobs: 1,
        version: None,
        executor: None,
        fresh_start: false,
    };
    let got: api::AgentRegistration = app
        .with_token(&j.token)
        .post("/v1/agents/register")
        .json(&reg)
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert_eq!(got.pool, "gpu");
    // A join token is not an API token, nor an attempt's.
    app.with_token(&j.token).get("/v1/repos").send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.admin().delete(&format!("/v1/agent-tokens/{}", j.info.id)).send().await.assert_status(StatusCode::OK);
    app.with_token(&j.token)
        .post("/v1/agents/register")
        .json(&reg)
        .send()
        .await
        .assert_status(StatusCode::UNAUTHORIZED);
    // The agents list shows the pool; removing the agent ends its credential.
    let agents: serde_json::Value = app.admin().get("/v1/agents").send().await.assert_status(StatusCode::OK).json();
    assert_eq!(agents["agents"][0]["pool"], "gpu");
    app.admin().delete(&format!("/v1/agents/{}", got.agent_id)).send().await.assert_status(StatusCode::OK);
    let claim = api::ClaimRequest { session_id: got.session_id.clone(), claim_request_id: "c".into(), wait_ms: 0 };
    let res =
        app.with_token(&got.credential).post(&format!("/v1/agents/{}/claim", got.agent_id)).json(&claim).send().await;
    res.assert_status(StatusCode::NOT_FOUND);
}

/// `kiln agents rm` of an agent with a running attempt: its lease ends now,
/// the reconciler fences it, and its token can no longer complete it.
#[tokio::test]
async fn removing_an_agent_fences_its_running_attempts() {
    let app = TestApp::new().await;
    let (run, agent, a) = super::claimed(&app, &["build"]).await;
    app.admin().delete(&format!("/v1/agents/{}", agent.agent_id)).send().await.assert_status(StatusCode::OK);
    app.run_pending_work().await;
    let view = super::get_run(&app, &run).await;
    assert_eq!(view.jobs[0].attempts[0].outcome, "lost");
    let res = super::complete(&app, &a, "success").await;
    assert_eq!(res.assert_status(StatusCode::CONFLICT).error_code(), api::codes::STALE_EPOCH);
}

/// An agent says its executor at registration; the server answers whether
/// it takes untrusted work (by default: a container agent of pool `forks`)
/// and refuses an unknown executor, registering nothing.
#[tokio::test]
async fn registration_says_whether_an_agent_takes_untrusted_work() {
    let app = TestApp::new().await;
    let body = api::CreateJoinToken { name: "pr-boxes".into(), pool: Some("forks".into()) };
    let j: api::CreatedJoinToken =
        app.admin().post("/v1/agent-tokens").json(&body).send().await.assert_status(StatusCode::CREATED).json();
    let reg = |name: &str, executor: Option<&str>| api::RegisterAgent {
        name: name.into(),
        labels: Default::default(),
        max_jobs: 1,
        version: None,
        executor: executor.map(Into::into),
        fresh_start: false,
    };
    for (name, executor, takes) in [("c", Some("container"), true), ("h", Some("host"), false), ("o", None, false)] {
        let got: api::AgentRegistration = app
            .with_token(&j.token)
            .post("/v1/agents/register")
            .json(&reg(name, executor))
            .send()
            .await
            .assert_status(StatusCode::OK)
            .json();
        assert_eq!(got.takes_untrusted, Some(takes), "{executor:?}");
        assert_eq!(got.untrusted_agents.as_deref(), Some("pools: forks, container executor"));
    }
    // An agent of the default pool never does, whatever its executor.
    let got: api::AgentRegistration = app
        .agent()
        .post("/v1/agents/register")
        .json(&reg("d", Some("container")))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert_eq!(got.takes_untrusted, Some(false));
    let agents: serde_json::Value = app.admin().get("/v1/agents").send().await.assert_status(StatusCode::OK).json();
    assert_eq!(agents["agents"].as_array().map(Vec::len), Some(4));
    let c = agents["agents"].as_array().unwrap().iter().find(|a| a["name"] == "c").unwrap();
    assert_eq!((c["executor"].as_str(), c["takes_untrusted"].as_bool()), (Some("container"), Some(true)));
    let res = app.with_token(&j.token).post("/v1/agents/register").json(&reg("m", Some("microvm"))).send().await;
    res.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    let agents: serde_json::Value = app.admin().get("/v1/agents").send().await.assert_status(StatusCode::OK).json();
    assert_eq!(agents["agents"].as_array().map(Vec::len), Some(4), "nothing registered");
}

/// Teams, the queue and lanes (issue 44): a read token sees the teams and
/// the queue and changes neither; a trigger token starts runs of its
/// repository but may not choose their lane, nor read the queue (it names
/// every team); only an admin moves a run to another lane.
#[tokio::test]
async fn only_admins_change_teams_and_lanes() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let run = super::submit(&app, "r").await;
    let read = token(&app, "read", None, None).await;
    let read = app.with_token(&read.token);
    read.get("/v1/teams").send().await.assert_status(StatusCode::OK);
    read.get("/v1/teams/default").send().await.assert_status(StatusCode::OK);
    read.get("/v1/queue").send().await.assert_status(StatusCode::OK);
    let team = serde_json::json!({ "name": "x" });
    read.post("/v1/teams").json(&team).send().await.assert_status(StatusCode::FORBIDDEN);
    read.delete("/v1/teams/default").send().await.assert_status(StatusCode::FORBIDDEN);
    let urgent = serde_json::json!({ "priority": "urgent" });
    read.post(&format!("/v1/workflow-runs/{run}/priority"))
        .json(&urgent)
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);

    let trigger = token(&app, "trigger", Some("r"), None).await;
    let trigger = app.with_token(&trigger.token);
    trigger.get("/v1/queue").send().await.assert_status(StatusCode::FORBIDDEN);
    trigger.get("/v1/teams").send().await.assert_status(StatusCode::FORBIDDEN);
    trigger
        .post(&format!("/v1/workflow-runs/{run}/priority"))
        .json(&urgent)
        .send()
        .await
        .assert_status(StatusCode::FORBIDDEN);
    let asked = serde_json::json!({ "commit_sha": "HEAD", "priority": "urgent" });
    let res = trigger.post("/v1/repos/r/workflow-runs").json(&asked).send().await.assert_status(StatusCode::FORBIDDEN);
    assert!(res.text().contains("only an admin token may set a run's priority"), "{}", res.text());
    trigger
        .post("/v1/repos/r/workflow-runs")
        .json(&serde_json::json!({ "commit_sha": "HEAD" }))
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED);

    // The admin: a lane for a new run, another for a queued one.
    let made: api::SubmitRunResponse = app
        .admin()
        .post("/v1/repos/r/workflow-runs")
        .json(&asked)
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED)
        .json();
    assert_eq!(super::get_run(&app, &made.run_id).await.priority, "urgent");
    let bad = serde_json::json!({ "priority": "asap" });
    let res = app.admin().post(&format!("/v1/workflow-runs/{run}/priority")).json(&bad).send().await;
    res.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    let moved: api::Run = app
        .admin()
        .post(&format!("/v1/workflow-runs/{run}/priority"))
        .json(&serde_json::json!({ "priority": "background" }))
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    assert_eq!(moved.priority, "background");
    let audit = app.admin().get("/v1/audit").send().await.text();
    assert!(audit.contains("run.priority"), "the change is audited: {audit}");
}
