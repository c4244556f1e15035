//! Handler tests through `TestApp`: the whole server in process, called
//! through its router without a socket, background work driven explicitly.
//! One module per route family; the real binary's behaviour is proven by
//! the e2e suite in `crates/kiln/tests`.

mod access;
mod agents;
mod artifacts;
mod attempts;
mod auth;
mod caches;
mod edge;
mod env_secrets;
mod environments;
mod health;
mod logs;
mod notify;
mod repos;
mod runs;
mod secrets;
mod webhooks;
mod work;

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::{TestApp, TestRepo};

/// A workflow of one job per name, each `echo NAME`, sequential.
pub fn pipeline(jobs: &[&str]) -> String {
    let mut s = String::from("version: 1\njobs:\n");
    for j in jobs {
        s.push_str(&format!("  - name: {j}\n    steps:\n      - echo {j}\n"));
    }
    s
}

/// A repository `name` holding `workflow` as `.kiln/pipeline.yaml`, registered.
pub async fn repo(app: &TestApp, name: &str, workflow: &str) -> TestRepo {
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", workflow)]).unwrap();
    app.add_repo(name, &repo).await;
    repo
}

/// Submit HEAD of `repo`; the run id.
pub async fn submit(app: &TestApp, repo: &str) -> String {
    let res = app
        .admin()
        .post(&format!("/v1/repos/{repo}/workflow-runs"))
        .json(&api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() })
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED);
    res.json::<api::SubmitRunResponse>().run_id
}

pub async fn register(app: &TestApp, name: &str, max_jobs: u32) -> api::AgentRegistration {
    let body = api::RegisterAgent {
        name: name.into(),
        labels: Default::default(),
        max_jobs,
        version: None,
        executor: None,
        fresh_start: false,
    };
    app.agent().post("/v1/agents/register").json(&body).send().await.assert_status(StatusCode::OK).json()
}

/// One claim call that does not wait.
pub async fn claim(app: &TestApp, agent: &api::AgentRegistration, request_id: &str) -> Option<api::Assignment> {
    let body =
        api::ClaimRequest { session_id: agent.session_id.clone(), claim_request_id: request_id.into(), wait_ms: 0 };
    let res = app
        .with_token(&agent.credential)
        .post(&format!("/v1/agents/{}/claim", agent.agent_id))
        .json(&body)
        .send()
        .await;
    res.assert_status(StatusCode::OK).json::<api::ClaimResponse>().assignment
}

/// A run of `jobs` submitted, relayed and its first job claimed.
pub async fn claimed(app: &TestApp, jobs: &[&str]) -> (String, api::AgentRegistration, api::Assignment) {
    let _repo = repo(app, "r", &pipeline(jobs)).await;
    let run = submit(app, "r").await;
    app.run_pending_work().await;
    let agent = register(app, "a1", 4).await;
    let a = claim(app, &agent, "c1").await.expect("an assignment");
    (run, agent, a)
}

pub async fn get_run(app: &TestApp, run: &str) -> api::Run {
    app.admin().get(&format!("/v1/workflow-runs/{run}")).send().await.assert_status(StatusCode::OK).json()
}

pub async fn complete(app: &TestApp, a: &api::Assignment, outcome: &str) -> kiln_testkit::TestResponse {
    let body = api::Completion {
        outcome: outcome.into(),
        exit_code: Some(0),
        message: None,
        infra_failure: false,
        failure_class: None,
        outputs: Default::default(),
        steps: Default::default(),
        telemetry: None,
        sandbox: None,
        quarantined: Vec::new(),
        reports_staged: None,
    };
    app.holder(a).post(&format!("/v1/jobs/{}/attempts/{}/complete", a.job_id, a.epoch)).json(&body).send().await
}
