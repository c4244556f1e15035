//! `GET /v1/jobs/{job}/logs/events`: SSE with ids, replay from `Last-Event-ID`.

use axum::http::StatusCode;
use base64::Engine;
use kiln_api as api;
use kiln_testkit::{SseEvent, TestApp};
use sha2::{Digest, Sha256};

async fn append(app: &TestApp, a: &api::Assignment, seq: i64, offset: i64, text: &str) {
    let chunk = api::LogChunk {
        stream: "stdout".into(),
        seq,
        offset,
        data: base64::engine::general_purpose::STANDARD.encode(text),
        sha256: Some(hex::encode(Sha256::digest(text.as_bytes()))),
        crc32c: None,
        in_order: false,
    };
    let path = format!("/v1/jobs/{}/attempts/{}/logs", a.job_id, a.epoch);
    app.holder(a).post(&path).json(&chunk).send().await.assert_status(StatusCode::OK);
}

fn chunk_text(ev: &SseEvent) -> String {
    let e: api::LogEvent = serde_json::from_str(&ev.data).unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(e.data).unwrap()).unwrap()
}

#[tokio::test]
async fn replay_from_last_event_id_then_end() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    append(&app, &a, 0, 0, "one\n").await;
    append(&app, &a, 1, 4, "two\n").await;
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);

    let path = format!("/v1/jobs/{}/logs/events", a.job_id);
    let all = app.admin().get(&path).send().await.assert_status(StatusCode::OK);
    assert_eq!(all.header("content-type"), Some("text/event-stream"));
    let events = all.sse_events();
    let chunks: Vec<&SseEvent> = events.iter().filter(|e| e.event == "chunk").collect();
    assert_eq!(chunks.iter().map(|e| chunk_text(e)).collect::<Vec<_>>(), ["one\n", "two\n"]);
    let end = events.last().unwrap();
    assert_eq!(end.event, "end");
    assert_eq!(serde_json::from_str::<api::LogEnd>(&end.data).unwrap().status, "success");

    // A reconnecting follower names the last id it saw: the rest only.
    let first = chunks[0].id.clone().unwrap();
    let rest = app.admin().get(&path).header("last-event-id", &first).send().await.sse_events();
    assert_eq!(rest, events[1..]);
    let by_query = app.admin().get(&format!("{path}?after={first}")).send().await.sse_events();
    assert_eq!(by_query, events[1..]);

    // The same after the log moved to the object store.
    app.advance(std::time::Duration::from_secs(3600));
    assert_eq!(app.run_pending_work().await.archived, 1);
    assert_eq!(app.admin().get(&path).send().await.sse_events(), events);
    app.admin().get("/v1/jobs/nope/logs/events").send().await.assert_status(StatusCode::NOT_FOUND);
}
