//! The claim long-poll policy over a real store.

use super::env::Env;
use crate::services::claim::{self, CAPACITY_PAUSE};
use axum::http::StatusCode;
use kiln_api as api;
use kiln_store::OutboxEvent;

#[tokio::test]
async fn a_replaced_session_is_refused_as_a_stale_epoch() {
    let env = Env::new().await;
    let (agent, _) = env.agent(1).await;
    let e = claim::claim(&env.state, &agent, &Env::claim_request("old", "c1", 0)).await.unwrap_err();
    assert_eq!((e.status, e.code), (StatusCode::CONFLICT, api::codes::STALE_EPOCH));
    let e = claim::claim(&env.state, "no-such-agent", &Env::claim_request("s", "c1", 0)).await.unwrap_err();
    assert_eq!(e.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn nothing_queued_answers_none_when_the_wait_runs_out() {
    let env = Env::new().await;
    let agent = env.agent(1).await;
    assert!(env.claim_now(&agent, "c1").await.is_none());
}

#[tokio::test]
async fn a_waiting_claim_is_woken_by_a_new_delivery() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let agent = env.agent(1).await;
    let state = env.state.clone();
    let req = Env::claim_request(&agent.1, "c1", 60_000);
    let waiting = tokio::spawn(async move { claim::claim(&state, &agent.0, &req).await });
    // The claim is parked on the dispatcher (nothing queued yet); the
    // relay's push wakes it whenever it lands.
    env.submit("r").await;
    assert_eq!(env.relay().await, 1);
    let a = waiting.await.unwrap().unwrap().expect("an assignment");
    assert_eq!((a.job_name.as_str(), a.epoch), ("build", 1));
}

#[tokio::test]
async fn a_lost_response_is_recovered_by_the_claim_request_id() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let agent = env.agent(2).await;
    env.submit("r").await;
    env.relay().await;
    let first = env.claim_now(&agent, "c1").await.expect("claimed");
    // The agent retries the same call: the same attempt, not a second one.
    let again = env.claim_now(&agent, "c1").await.expect("recovered");
    assert_eq!((again.job_id, again.epoch), (first.job_id.clone(), first.epoch));
    assert!(env.claim_now(&agent, "c2").await.is_none(), "nothing else to claim");
}

#[tokio::test]
async fn stale_and_duplicate_deliveries_are_absorbed() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let agent = env.agent(2).await;
    env.submit("r").await;
    env.relay().await;
    let job = env.state.store.ready_jobs().await.unwrap().remove(0);
    // A delivery of an older generation, queued first: tried, absorbed.
    let stale = OutboxEvent { id: 0, dispatch_generation: job.dispatch_generation - 1, ..job.clone() };
    env.state.dispatcher.push_front(stale);
    let a = env.claim_now(&agent, "c1").await.expect("the live delivery is claimed");
    assert_eq!(a.job_id, job.job_id);
    // A duplicate of the claimed delivery: absorbed, nothing granted.
    env.state.dispatcher.push(job);
    assert!(env.claim_now(&agent, "c2").await.is_none());
    assert_eq!(env.state.dispatcher.depth(), 0);
}

#[tokio::test]
async fn an_agent_at_capacity_leaves_the_job_queued_for_others() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["one"]).await;
    let _repo = env.pipeline("s", &["two"]).await;
    let agent = env.agent(1).await;
    env.submit("r").await;
    env.relay().await;
    env.claim_now(&agent, "c1").await.expect("first job");
    env.submit("s").await;
    env.relay().await;
    // Full: answered "nothing" after the capacity pause (bounded by its
    // wait), the job back at the front of its queue.
    let req = Env::claim_request(&agent.1, "c2", CAPACITY_PAUSE.as_millis() as u64 * 10);
    assert!(claim::claim(&env.state, &agent.0, &req).await.unwrap().is_none());
    assert_eq!(env.state.dispatcher.depth(), 1);
    let other = env.agent(1).await;
    assert_eq!(env.claim_now(&other, "c3").await.expect("another agent takes it").job_name, "two");
}

#[tokio::test]
async fn labels_must_cover_the_jobs_class() {
    let env = Env::new().await;
    let wf = "version: 1\njobs:\n  - name: big\n    runs-on: {size: large}\n    steps:\n      - echo\n";
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", wf)]).await;
    env.submit("r").await;
    env.relay().await;
    let small = env.agent(1).await;
    assert!(env.claim_now(&small, "c1").await.is_none());
    assert_eq!(env.state.dispatcher.depth(), 1, "left for an agent that fits");
    let big = env.state.store.register_agent("big", r#"{"size":"large"}"#, 1).await.unwrap();
    assert_eq!(env.claim_now(&(big.id, big.session_id), "c2").await.unwrap().job_name, "big");
}
