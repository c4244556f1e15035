//! Agents: register, claim → assignment, the session stream.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::{TestApp, next_frame};

#[tokio::test]
async fn register_validates_and_answers_lease_timing() {
    let app = TestApp::new().await;
    let reg = super::register(&app, "a1", 2).await;
    assert!(!reg.agent_id.is_empty() && !reg.session_id.is_empty());
    assert_eq!((reg.lease_ttl_ms, reg.heartbeat_interval_ms), (30_000, 10_000));
    for (name, max_jobs) in [("", 1), ("a", 0), ("a", 257)] {
        let body = api::RegisterAgent {
            name: name.into(),
            labels: Default::default(),
            max_jobs,
            version: None,
            executor: None,
            fresh_start: false,
        };
        let res = app.agent().post("/v1/agents/register").json(&body).send().await;
        res.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    }
}

#[tokio::test]
async fn claim_gets_the_relayed_job_and_a_replaced_session_is_refused() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["build"])).await;
    let run = super::submit(&app, "r").await;
    let agent = super::register(&app, "a1", 1).await;
    assert!(super::claim(&app, &agent, "c0").await.is_none(), "nothing relayed yet");
    app.run_pending_work().await;
    let a = super::claim(&app, &agent, "c1").await.expect("assignment");
    assert_eq!((a.run_id.as_str(), a.job_name.as_str(), a.epoch), (run.as_str(), "build", 1));
    assert_eq!(a.steps[0].run, "echo build");
    // Another agent's credential may not claim for this agent, and the
    // join token claims nothing.
    let other = super::register(&app, "a2", 1).await;
    let body = api::ClaimRequest { session_id: agent.session_id.clone(), claim_request_id: "c2".into(), wait_ms: 0 };
    let path = format!("/v1/agents/{}/claim", agent.agent_id);
    let res = app.with_token(&other.credential).post(&path).json(&body).send().await;
    assert_eq!(res.assert_status(StatusCode::FORBIDDEN).error_code(), api::codes::FORBIDDEN);
    app.agent().post(&path).json(&body).send().await.assert_status(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_session_stream_pings_and_carries_cancel_notices() {
    let app = TestApp::new().await;
    let (run, agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/agents/{}/session?session_id={}", agent.agent_id, agent.session_id);
    let res = app.with_token(&agent.credential).get(&path).send_streaming().await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body().into_data_stream();
    let first = next_frame(&mut body).await.unwrap();
    assert!(first.starts_with("event: ping"), "{first}");
    app.admin().post(&format!("/v1/workflow-runs/{run}/cancel")).send().await.assert_status(StatusCode::OK);
    // Pings may come first; the notice follows without waiting for a heartbeat.
    let notice = loop {
        let frame = next_frame(&mut body).await.expect("stream open");
        if let Some(rest) = frame.strip_prefix("event: cancel\ndata: ") {
            break serde_json::from_str::<api::CancelNotice>(rest.trim_end()).unwrap();
        }
    };
    assert_eq!((notice.job_id, notice.epoch), (a.job_id, a.epoch));
    drop(body);
    // The join token opens no session stream; another agent's credential
    // opens none of this agent's.
    app.agent().get(&path).send().await.assert_status(StatusCode::UNAUTHORIZED);
    let other = super::register(&app, "a2", 1).await;
    app.with_token(&other.credential).get(&path).send().await.assert_status(StatusCode::FORBIDDEN);
}
