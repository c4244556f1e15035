//! The log feed: replay after a cursor, `end` once the job is terminal,
//! and the same events (ids and bytes) after archival.

use super::env::Env;
use crate::services::attempts;
use crate::services::log_feed::{self, FeedEvent};
use crate::work;
use futures::StreamExt;
use kiln_api as api;
use sha2::{Digest, Sha256};
use std::time::Duration;

fn chunk(stream: &str, seq: i64, offset: i64, data: &[u8]) -> api::RawLogChunk {
    api::RawLogChunk {
        stream: stream.into(),
        seq,
        offset,
        sha256: Some(hex::encode(Sha256::digest(data))),
        crc32c: None,
        data: bytes_of(data),
        in_order: false,
    }
}

fn bytes_of(data: &[u8]) -> axum::body::Bytes {
    axum::body::Bytes::copy_from_slice(data)
}

/// (id, kind, text) of every event of the feed after `cursor`.
async fn read_all(env: &Env, job: &str, cursor: i64) -> Vec<(i64, String, String)> {
    use base64::Engine;
    let feed = log_feed::follow(&env.state, job, cursor).await.unwrap();
    feed.map(|ev| match ev {
        FeedEvent::Chunk { id, chunk } => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(chunk.data).unwrap();
            (id, format!("chunk:{}", chunk.stream), String::from_utf8(bytes).unwrap())
        }
        FeedEvent::Sealed { id, .. } => (id, "sealed".into(), String::new()),
        FeedEvent::Gap { id, data } => (id, "gap".into(), data),
        FeedEvent::End { id, end } => (id, "end".into(), end.status.to_string()),
    })
    .collect()
    .await
}

#[tokio::test]
async fn replay_after_a_cursor_then_end_and_the_same_after_archival() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    env.submit("r").await;
    env.relay().await;
    let agent = env.agent(1).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    let (job, epoch) = (a.job_id.as_str(), a.epoch);
    attempts::append_log(&env.state, job, epoch, chunk("stdout", 0, 0, b"one\n")).await.unwrap();
    attempts::append_log(&env.state, job, epoch, chunk("stderr", 0, 0, b"two\n")).await.unwrap();
    attempts::append_log(&env.state, job, epoch, chunk("stdout", 1, 4, b"three\n")).await.unwrap();
    let done = api::Completion::success();
    assert_eq!(attempts::complete(&env.state, job, epoch, done).await.unwrap(), "success");

    let all = read_all(&env, job, 0).await;
    let kinds: Vec<&str> = all.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"end"));
    assert_eq!(all.last().unwrap().2, "success");
    let texts: Vec<&str> = all.iter().filter(|(_, k, _)| k.starts_with("chunk")).map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(texts, ["one\n", "two\n", "three\n"]);
    let ids: Vec<i64> = all.iter().map(|(id, _, _)| *id).collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "ids in order: {ids:?}");

    // Resuming after the first event replays the rest, not the first.
    let first = all[0].0;
    let rest = read_all(&env, job, first).await;
    assert_eq!(rest, all[1..]);

    // Archival: not before the grace period (measured on the server clock)…
    assert_eq!(work::archive_once(&env.state).await.unwrap(), 0);
    env.clock.advance(env.state.config.log_archive_after + Duration::from_secs(1));
    assert_eq!(work::archive_once(&env.state).await.unwrap(), 1);
    assert!(env.state.store.log_chunks_after(job, 0, 10).await.unwrap().is_empty(), "journal trimmed");
    // …and then the feed means the same, from the object store.
    assert_eq!(read_all(&env, job, 0).await, all);
    assert_eq!(read_all(&env, job, first).await, all[1..]);
}

#[tokio::test]
async fn an_unknown_job_is_not_found() {
    let env = Env::new().await;
    let e = log_feed::follow(&env.state, "nope", 0).await.err().expect("refused");
    assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
}

/// Finding 4 of issue 13: a step printed a secret of the repository it
/// never declared (so the agent could not mask it); the archive masks it.
#[tokio::test]
async fn the_archive_masks_the_repositorys_secrets_in_a_trusted_runs_log() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let r = env.state.store.get_repo("r").await.unwrap();
    let by = crate::auth::Principal::admin_file();
    crate::services::repos::put_secret(&env.state, &by, "r", "DB_PASS", "hunter2-xyz").await.unwrap();
    env.submit("r").await;
    env.relay().await;
    let agent = env.agent(1).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    let (job, epoch) = (a.job_id.as_str(), a.epoch);
    attempts::append_log(&env.state, job, epoch, chunk("stdout", 0, 0, b"pass=hunter2-xyz!\n")).await.unwrap();
    let done = api::Completion::success();
    attempts::complete(&env.state, job, epoch, done).await.unwrap();
    env.clock.advance(env.state.config.log_archive_after + Duration::from_secs(1));
    assert_eq!(work::archive_once(&env.state).await.unwrap(), 1);
    let all = read_all(&env, job, 0).await;
    assert_eq!(all[0].2, "pass=***********!\n", "masked, same length");
    assert!(
        env.state.store.all_secrets().await.unwrap().iter().all(|(id, _, v)| *id == r.id && !v.contains("hunter2"))
    );
}

/// Issue 46: a deploy job's archived log is masked with its environment's
/// secrets too; a job that never got them (no `environment:`) is masked
/// with its repository's only.
#[tokio::test]
async fn the_archive_masks_an_environments_secrets_in_its_deploy_jobs_log() {
    const WF: &str = "version: 1\njobs:\n  - name: build\n    steps: [\"echo build\"]\n  - name: deploy\n    needs: build\n    environment: production\n    secrets: [PROD_KEY]\n    steps: [\"echo deploy\"]\n";
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    let record =
        kiln_store::EnvironmentRecord { name: "production".into(), approval_ttl_ms: 86_400_000, ..Default::default() };
    env.state.store.put_environment(&record, true).await.unwrap();
    let by = crate::auth::Principal::admin_file();
    crate::services::env_secrets::put(&env.state, &by, "production", "PROD_KEY", "prod-xyz-secret").await.unwrap();
    env.submit("r").await;
    let agent = env.agent(1).await;
    let mut jobs = Vec::new();
    for i in 0..2 {
        env.relay().await;
        let a = env.claim_now(&agent, &format!("c{i}")).await.expect("a job to claim");
        let secret = a.secrets.get("PROD_KEY").cloned();
        assert_eq!(secret.as_deref(), (a.job_name == "deploy").then_some("prod-xyz-secret"), "{}", a.job_name);
        let line = b"key=prod-xyz-secret!\n";
        attempts::append_log(&env.state, &a.job_id, a.epoch, chunk("stdout", 0, 0, line)).await.unwrap();
        attempts::complete(&env.state, &a.job_id, a.epoch, api::Completion::success()).await.unwrap();
        jobs.push((a.job_name.clone(), a.job_id.clone()));
    }
    env.clock.advance(env.state.config.log_archive_after + Duration::from_secs(1));
    assert_eq!(work::archive_once(&env.state).await.unwrap(), 2);
    for (name, id) in jobs {
        let all = read_all(&env, &id, 0).await;
        let want = if name == "deploy" { "key=***************!\n" } else { "key=prod-xyz-secret!\n" };
        assert_eq!(all[0].2, want, "{name}");
    }
}

/// `?follow=false` (`kiln logs` without `-f`): the feed of a job that is
/// still running ends, without `end`, once it sent what is written now.
#[tokio::test]
async fn a_snapshot_of_a_running_job_ends_once_caught_up() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    env.submit("r").await;
    env.relay().await;
    let agent = env.agent(1).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    let (job, epoch) = (a.job_id.as_str(), a.epoch);
    attempts::append_log(&env.state, job, epoch, chunk("stdout", 0, 0, b"one\n")).await.unwrap();
    attempts::append_log(&env.state, job, epoch, chunk("stdout", 1, 4, b"two\n")).await.unwrap();
    let feed = log_feed::snapshot(&env.state, job, 0).await.unwrap();
    let events: Vec<FeedEvent> =
        tokio::time::timeout(Duration::from_secs(10), feed.collect()).await.expect("the snapshot ends by itself");
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            FeedEvent::Chunk { .. } => "chunk",
            FeedEvent::End { .. } => "end",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["chunk", "chunk"], "what is written, and no `end`: the job still runs");
}
