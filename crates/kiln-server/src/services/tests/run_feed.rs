//! The run feeds (web UI over SSE): the view now, then again when it
//! changed, and nothing when it did not.

use super::env::Env;
use crate::services::run_feed;
use crate::services::runs::ListFilter;
use futures::StreamExt;
use kiln_api as api;
use std::time::Duration;

async fn next(feed: &mut (impl futures::Stream<Item = String> + Unpin)) -> api::RunList {
    let data = tokio::time::timeout(Duration::from_secs(10), feed.next()).await.expect("an event").unwrap();
    serde_json::from_str(&data).unwrap()
}

#[tokio::test]
async fn the_list_feed_sends_the_list_then_each_change() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let first = env.submit("r").await;
    let mut feed = Box::pin(
        run_feed::follow_list(&env.state, ListFilter { limit: Some(10), ..Default::default() }).await.unwrap(),
    );
    let now = next(&mut feed).await;
    assert_eq!(now.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [first.as_str()]);
    // Nothing changed: nothing is sent.
    assert!(tokio::time::timeout(Duration::from_millis(500), feed.next()).await.is_err());
    // A new run is sent at once (acceptance wakes the feed).
    let second = env.submit("r").await;
    let now = next(&mut feed).await;
    assert_eq!(now.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [second.as_str(), first.as_str()]);
}

#[tokio::test]
async fn the_run_feed_refuses_an_unknown_run_and_a_bad_filter_is_400() {
    let env = Env::new().await;
    let e = run_feed::follow_run(&env.state, "0190aaaa-0000-7000-8000-000000000000".into()).await.expect_err("refused");
    assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
    let bad = ListFilter { status: Some("nope".into()), ..Default::default() };
    let e = run_feed::follow_list(&env.state, bad).await.expect_err("refused");
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
}
