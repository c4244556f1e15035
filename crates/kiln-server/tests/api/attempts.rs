//! Calls of a running attempt: heartbeat, log chunks, completion, image.

use axum::http::StatusCode;
use base64::Engine;
use kiln_api as api;
use kiln_testkit::TestApp;
use sha2::{Digest, Sha256};

#[tokio::test]
async fn heartbeat_of_the_live_epoch_only() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let ok = app.holder(&a).post(&format!("/v1/jobs/{}/attempts/1/heartbeat", a.job_id)).send().await;
    let hb: api::HeartbeatResponse = ok.assert_status(StatusCode::OK).json();
    assert_eq!((hb.cancel_requested, hb.lease_ttl_ms), (false, 30_000));
    // Epoch 2 is not this token's attempt (nobody holds it yet).
    let other = app.holder(&a).post(&format!("/v1/jobs/{}/attempts/2/heartbeat", a.job_id)).send().await;
    assert_eq!(other.assert_status(StatusCode::FORBIDDEN).error_code(), api::codes::FORBIDDEN);
    // Once epoch 1 is over, its own token is refused as stale.
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);
    let stale = app.holder(&a).post(&format!("/v1/jobs/{}/attempts/1/heartbeat", a.job_id)).send().await;
    assert_eq!(stale.assert_status(StatusCode::CONFLICT).error_code(), api::codes::STALE_EPOCH);
}

#[tokio::test]
async fn log_chunks_as_json_or_raw_identical_retries_accepted() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/logs", a.job_id, a.epoch);
    let sha = |d: &[u8]| hex::encode(Sha256::digest(d));
    let json = api::LogChunk {
        stream: "stdout".into(),
        seq: 0,
        offset: 0,
        data: base64::engine::general_purpose::STANDARD.encode("hello\n"),
        sha256: Some(sha(b"hello\n")),
        crc32c: None,
        in_order: false,
    };
    let ack: api::LogAck = app.holder(&a).post(&path).json(&json).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(ack.committed.get("stdout"), Some(&6));
    let retry: api::LogAck = app.holder(&a).post(&path).json(&json).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(retry.committed, ack.committed);
    let raw = app
        .holder(&a)
        .post(&path)
        .header("content-type", "application/octet-stream")
        .header(api::log_headers::STREAM, "stdout")
        .header(api::log_headers::SEQ, "1")
        .header(api::log_headers::OFFSET, "6")
        .header(api::log_headers::SHA256, &sha(b"world\n"))
        .body("world\n")
        .send()
        .await;
    assert_eq!(raw.assert_status(StatusCode::OK).json::<api::LogAck>().committed.get("stdout"), Some(&12));
    // Conflicting bytes for an identity already committed: refused.
    let mut conflict = json.clone();
    conflict.data = base64::engine::general_purpose::STANDARD.encode("HELLO\n");
    conflict.sha256 = Some(sha(b"HELLO\n"));
    app.holder(&a).post(&path).json(&conflict).send().await.assert_status(StatusCode::CONFLICT);
    let mut bad = json.clone();
    bad.stream = "seal".into();
    app.holder(&a).post(&path).json(&bad).send().await.assert_status(StatusCode::BAD_REQUEST);
    let no_headers =
        app.holder(&a).post(&path).header("content-type", "application/octet-stream").body("x").send().await;
    no_headers.assert_status(StatusCode::BAD_REQUEST);
    let other = format!("/v1/jobs/{}/attempts/{}/logs", a.job_id, a.epoch + 1);
    app.holder(&a).post(&other).json(&json).send().await.assert_status(StatusCode::FORBIDDEN);
}

/// `…/logs/batch`: a short job's few small chunks in one request. Only the
/// attempt's own token; every chunk checked before any is stored (a
/// malformed one refuses the batch whole); a refusal after the first stops
/// the batch there (`accepted` says how many committed); a stale epoch is
/// the batch's answer.
#[tokio::test]
async fn a_batch_of_log_chunks_commits_in_order_and_is_refused_whole_when_malformed() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/logs/batch", a.job_id, a.epoch);
    let c = |stream: &str, seq: i64, offset: i64, text: &str| api::LogChunk {
        stream: stream.into(),
        seq,
        offset,
        data: base64::engine::general_purpose::STANDARD.encode(text),
        sha256: None,
        crc32c: Some(api::log_crc32c(text.as_bytes())),
        in_order: true,
    };
    let batch = |chunks: Vec<api::LogChunk>| api::LogChunkBatch { chunks };
    let stored = || async {
        let rows = app.store().log_chunks_after(&a.job_id, 0, 100).await.unwrap();
        rows.into_iter().map(|r| (r.stream, r.offset, String::from_utf8(r.data).unwrap())).collect::<Vec<_>>()
    };

    // Who may send: the attempt's own token only.
    let good = batch(vec![c("system", 0, 0, "checking out\n"), c("stdout", 0, 0, "hi\n"), c("system", 1, 13, "ok\n")]);
    app.anonymous().post(&path).json(&good).send().await.assert_status(StatusCode::UNAUTHORIZED);
    app.admin().post(&path).json(&good).send().await.assert_status(StatusCode::UNAUTHORIZED);
    let other = format!("/v1/jobs/{}/attempts/{}/logs/batch", a.job_id, a.epoch + 1);
    app.holder(&a).post(&other).json(&good).send().await.assert_status(StatusCode::FORBIDDEN);

    // Malformed: refused whole, nothing stored.
    let big = "x".repeat(api::LOG_BATCH_CHUNK_MAX + 1);
    let mut wrong_crc = c("stdout", 0, 0, "hi\n");
    wrong_crc.crc32c = Some(api::log_crc32c(b"HI\n"));
    let mut not_base64 = c("stdout", 0, 0, "hi\n");
    not_base64.data = "%%%".into();
    let too_many: Vec<api::LogChunk> = (0..=api::LOG_BATCH_MAX_CHUNKS as i64).map(|i| c("stdout", i, i, "a")).collect();
    for (bad, why) in [
        (batch(vec![]), "empty"),
        (batch(too_many), "too many chunks"),
        (batch(vec![c("system", 0, 0, "a\n"), c("stdout", 0, 0, &big)]), "a large chunk"),
        (batch(vec![c("system", 0, 0, "a\n"), c("seal", 0, 0, "b")]), "not an agent stream"),
        (batch(vec![c("system", 0, 0, "a\n"), wrong_crc]), "a wrong crc32c"),
        (batch(vec![c("system", 0, 0, "a\n"), not_base64]), "not base64"),
    ] {
        let r = app.holder(&a).post(&path).json(&bad).send().await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{why}: {}", r.text());
    }
    app.holder(&a).post(&path).body("{").send().await.assert_status(StatusCode::BAD_REQUEST);
    assert!(stored().await.is_empty(), "nothing of a refused batch is stored");

    // In order, in one request; its identical retry is accepted.
    for _ in 0..2 {
        let ack: api::LogBatchAck =
            app.holder(&a).post(&path).json(&good).send().await.assert_status(StatusCode::OK).json();
        assert_eq!(ack.accepted, 3);
        assert_eq!((ack.committed.get("stdout"), ack.committed.get("system")), (Some(&3), Some(&16)));
    }
    let want =
        |v: &[(&str, i64, &str)]| v.iter().map(|(s, o, t)| (s.to_string(), *o, t.to_string())).collect::<Vec<_>>();
    assert_eq!(stored().await, want(&[("system", 0, "checking out\n"), ("stdout", 0, "hi\n"), ("system", 13, "ok\n")]));

    // A conflict after the first: the first commits, `accepted` stops there.
    let mixed = batch(vec![c("stderr", 0, 0, "warn\n"), c("stdout", 1, 0, "HI\n"), c("system", 2, 16, "no\n")]);
    let ack: api::LogBatchAck =
        app.holder(&a).post(&path).json(&mixed).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(ack.accepted, 1);
    assert_eq!(stored().await.len(), 4);

    // Once the attempt is over: the batch's answer is the stale epoch.
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);
    let late = batch(vec![c("stdout", 1, 3, "late\n")]);
    let r = app.holder(&a).post(&path).json(&late).send().await;
    assert_eq!(r.assert_status(StatusCode::CONFLICT).error_code(), api::codes::STALE_EPOCH);
}

/// A raw chunk checked by a CRC-32C instead of a SHA-256 (the agent's
/// default since 2026-12-05): the server digests the bytes itself, so the
/// chunk's identity is the same whichever check came with it. A check that
/// does not match the bytes is refused and commits nothing.
#[tokio::test]
async fn a_chunk_checked_by_crc32c_has_the_servers_digest_as_its_identity() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/logs", a.job_id, a.epoch);
    let send = |offset: i64, body: &'static str, sha: Option<String>, crc: Option<String>| {
        let mut req = app
            .holder(&a)
            .post(&path)
            .header("content-type", "application/octet-stream")
            .header(api::log_headers::STREAM, "stdout")
            .header(api::log_headers::SEQ, if offset == 0 { "0" } else { "1" })
            .header(api::log_headers::OFFSET, &offset.to_string());
        if let Some(sha) = sha {
            req = req.header(api::log_headers::SHA256, &sha);
        }
        if let Some(crc) = crc {
            req = req.header(api::log_headers::CRC32C, &crc);
        }
        req.body(body).send()
    };
    let crc = |d: &[u8]| Some(api::log_crc32c(d));
    let sha = |d: &[u8]| Some(hex::encode(Sha256::digest(d)));
    let committed = |r: kiln_testkit::TestResponse| r.assert_status(StatusCode::OK).json::<api::LogAck>().committed;
    // A wrong CRC, and a right CRC beside a wrong digest: refused, nothing committed.
    let r = send(0, "hello\n", None, crc(b"HELLO\n")).await.assert_status(StatusCode::BAD_REQUEST);
    assert!(r.text().contains("crc32c does not match"), "{}", r.text());
    send(0, "hello\n", sha(b"HELLO\n"), crc(b"hello\n")).await.assert_status(StatusCode::BAD_REQUEST);
    // Accepted with the CRC alone; its identical retry too, and a retry
    // that carries the SHA-256 instead is the same chunk.
    assert_eq!(committed(send(0, "hello\n", None, crc(b"hello\n")).await).get("stdout"), Some(&6));
    assert_eq!(committed(send(0, "hello\n", None, crc(b"hello\n")).await).get("stdout"), Some(&6));
    assert_eq!(committed(send(0, "hello\n", sha(b"hello\n"), None).await).get("stdout"), Some(&6));
    // Other bytes at that position, correctly checked, conflict.
    send(0, "HELLO\n", None, crc(b"HELLO\n")).await.assert_status(StatusCode::CONFLICT);
    assert_eq!(committed(send(6, "world\n", None, crc(b"world\n")).await).get("stdout"), Some(&12));
    let rows = app.store().log_chunks_after(&a.job_id, 0, 10).await.unwrap();
    let bytes: Vec<u8> = rows.iter().filter(|r| r.stream == "stdout").flat_map(|r| r.data.clone()).collect();
    assert_eq!(bytes, b"hello\nworld\n", "each chunk once, the refused ones nowhere");
}

#[tokio::test]
async fn complete_once_then_the_epoch_is_stale() {
    let app = TestApp::new().await;
    let (run, agent, a) = super::claimed(&app, &["build", "test"]).await;
    super::complete(&app, &a, "running").await.assert_status(StatusCode::BAD_REQUEST);
    super::complete(&app, &a, "lost").await.assert_status(StatusCode::BAD_REQUEST);
    super::complete(&app, &a, "nonsense").await.assert_status(StatusCode::BAD_REQUEST);
    let ack: api::CompletionAck = super::complete(&app, &a, "success").await.assert_status(StatusCode::OK).json();
    assert_eq!(ack.job_status, "success");
    let again = super::complete(&app, &a, "failed").await.assert_status(StatusCode::CONFLICT);
    assert_eq!(again.error_code(), api::codes::STALE_EPOCH);
    // The successor became ready in the same transaction; its event is relayed.
    assert_eq!(app.run_pending_work().await.relayed, 1);
    assert_eq!(super::claim(&app, &agent, "c2").await.unwrap().job_name, "test");
    assert_eq!(super::get_run(&app, &run).await.status, "running");
}

/// The class an agent reports is recorded on the attempt; an unknown one is
/// refused and changes nothing.
#[tokio::test]
async fn a_reported_failure_class_is_recorded_and_an_unknown_one_refused() {
    let app = TestApp::new().await;
    let (run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/complete", a.job_id, a.epoch);
    let mut body = api::Completion {
        outcome: api::AttemptOutcome::Failed,
        exit_code: Some(124),
        message: Some("timed out after 5s".into()),
        ..api::Completion::success()
    };
    body.failure_class = Some("flaky".into());
    let r = app.holder(&a).post(&path).json(&body).send().await.assert_status(StatusCode::BAD_REQUEST);
    assert!(r.text().contains("unknown failure_class `flaky`"), "{}", r.text());
    let j = &super::get_run(&app, &run).await.jobs[0];
    assert_eq!((j.status.as_str(), j.attempts[0].outcome.as_str()), ("running", "running"), "nothing changed");
    body.failure_class = Some("timeout".into());
    let ack: api::CompletionAck =
        app.holder(&a).post(&path).json(&body).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(ack.job_status, "failed", "no `retry:`: a timeout is final");
    let j = &super::get_run(&app, &run).await.jobs[0];
    assert_eq!(j.attempts[0].failure_class.as_deref(), Some("timeout"));
    // Counted by class on /metrics, the refused call not at all.
    let text = app.admin().get("/metrics").send().await.text();
    assert!(text.contains("\nkiln_attempt_failures_total{class=\"timeout\"} 1\n"), "{text}");
    assert!(!text.contains("class=\"flaky\""), "{text}");
}

#[tokio::test]
async fn an_image_digest_is_committed_once() {
    let app = TestApp::new().await;
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/image", a.job_id, a.epoch);
    let bad = api::ImageCommit { digest: "latest".into(), repository: None };
    app.holder(&a).post(&path).json(&bad).send().await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    let first = api::ImageCommit { digest: format!("sha256:{}", "a".repeat(64)), repository: None };
    let second = api::ImageCommit { digest: format!("sha256:{}", "b".repeat(64)), repository: None };
    let got: api::ImageCommit =
        app.holder(&a).post(&path).json(&first).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(got.digest, first.digest);
    let got: api::ImageCommit =
        app.holder(&a).post(&path).json(&second).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(got.digest, first.digest, "the first committed digest wins");
}

/// Issue 40, item 5: `POST …/release` is the attempt's own agent saying its
/// sandbox is gone. Only that attempt's token; not while it runs (its
/// completion says so, with the agent's evidence); it says how; a second
/// report changes nothing.
#[tokio::test]
async fn only_an_ended_attempts_own_agent_confirms_its_sandbox() {
    let app = TestApp::new().await;
    let (run, _agent, a) = super::claimed(&app, &["build"]).await;
    let path = format!("/v1/jobs/{}/attempts/{}/release", a.job_id, a.epoch);
    let end = api::SandboxEnd { evidence: "every process group was killed".into(), cleanup_error: None };
    // Not another attempt's, not with the admin token.
    let other = format!("/v1/jobs/{}/attempts/{}/release", a.job_id, a.epoch + 1);
    app.holder(&a).post(&other).json(&end).send().await.assert_status(StatusCode::FORBIDDEN);
    app.admin().post(&path).json(&end).send().await.assert_status(StatusCode::UNAUTHORIZED);
    // Not while it runs; not without saying how.
    app.holder(&a).post(&path).json(&end).send().await.assert_status(StatusCode::CONFLICT);
    let vague = api::SandboxEnd { evidence: " ".into(), cleanup_error: None };
    app.holder(&a).post(&path).json(&vague).send().await.assert_status(StatusCode::BAD_REQUEST);
    // The completion carries the evidence and what cleanup could not do.
    let done = api::Completion {
        sandbox: Some(api::SandboxEnd {
            evidence: "the job's container was killed and removed".into(),
            cleanup_error: Some("network kiln-x still in use".into()),
        }),
        ..api::Completion::success()
    };
    let complete = format!("/v1/jobs/{}/attempts/{}/complete", a.job_id, a.epoch);
    app.holder(&a).post(&complete).json(&done).send().await.assert_status(StatusCode::OK);
    let at = &super::get_run(&app, &run).await.jobs[0].attempts[0];
    assert!(at.released_at_ms.is_some());
    assert_eq!(at.release.as_deref(), Some("the job's container was killed and removed"));
    assert_eq!(at.cleanup_error.as_deref(), Some("network kiln-x still in use"));
    // Already confirmed: accepted, nothing changes.
    let ack: api::ReleaseAck = app.holder(&a).post(&path).json(&end).send().await.assert_status(StatusCode::OK).json();
    assert!(!ack.released);
}
