//! Artifacts: upload under a capability, seal with verification, restore
//! and download only what the completion bound; capabilities expire on the
//! server clock.

use super::env::Env;
use crate::clock::Clock;
use crate::services::{artifacts, attempts};
use axum::http::StatusCode;
use kiln_api as api;
use sha2::{Digest, Sha256};
use std::time::Duration;

const WF: &str = r#"version: 1
jobs:
  - name: compile
    artifacts:
      publish:
        - name: app
          path: out/app
    steps:
      - make
  - name: test
    artifacts:
      restore:
        - from_job: compile
          name: app
          path: in/app
    steps:
      - ./in/app
"#;

/// The capability of a URL (`?cap=…`).
fn cap(url: &str) -> String {
    url.split("cap=").nth(1).expect("a capability").to_string()
}

#[tokio::test]
async fn upload_seal_bind_restore_download() {
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    env.submit("r").await;
    env.relay().await;
    let agent = env.agent(2).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    let (job, epoch) = (a.job_id.as_str(), a.epoch);
    let bytes = b"the app".to_vec();
    let sha = hex::encode(Sha256::digest(&bytes));
    let create = api::CreateUpload { name: "app".into(), size: bytes.len() as u64, sha256: None, kind: None };
    let s = artifacts::create_upload(&env.state, "http://kiln.test", job, epoch, create).await.unwrap();
    assert!(!s.presigned);
    assert_eq!(s.expires_at_ms, env.clock.now_ms() + 60 * 60 * 1000, "an hour on the server clock");
    assert!(s.part_url.starts_with(&format!("http://kiln.test/blob/uploads/{}/parts/{{part}}?cap=", s.generation_id)));
    let put_cap = cap(&s.part_url);

    // The data plane refuses a missing or wrong capability.
    let e = artifacts::put_part(&env.state, &s.generation_id, 0, None, &bytes[..]).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNAUTHORIZED);
    let e = artifacts::put_part(&env.state, "other", 0, Some(&put_cap), &bytes[..]).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNAUTHORIZED);
    let r = artifacts::put_part(&env.state, &s.generation_id, 0, Some(&put_cap), &bytes[..]).await.unwrap();
    assert_eq!(r.size, bytes.len() as u64);

    // Opened without a digest: sealing must name it; a wrong one fails verification.
    let e = artifacts::seal(&env.state, (job, epoch), &s.generation_id, Default::default()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    let sealed = artifacts::seal(
        &env.state,
        (job, epoch),
        &s.generation_id,
        api::SealRequest { sha256: Some(sha.clone()), parts: vec![] },
    )
    .await
    .unwrap();
    assert_eq!((sealed.state.as_str(), sealed.sha256.as_str()), ("sealed", sha.as_str()));
    // A lost response: sealing again answers the same.
    let again = artifacts::seal(&env.state, (job, epoch), &s.generation_id, Default::default()).await.unwrap();
    assert_eq!(again.generation_id, sealed.generation_id);

    // Nothing is visible to consumers before the completion binds it.
    let run = a.run_id.as_str();
    let e = artifacts::get(&env.state, "http://kiln.test", (run, "compile", "app")).await.unwrap_err();
    assert_eq!(e.status, StatusCode::NOT_FOUND);
    let ok = api::Completion::success();
    attempts::complete(&env.state, job, epoch, ok).await.unwrap();
    env.relay().await;
    let t = env.claim_now(&agent, "c2").await.unwrap();
    assert_eq!(t.job_name, "test");
    let restore = api::RestoreRequest { from_job: "compile".into(), name: "app".into() };
    let d = artifacts::restore(&env.state, "http://kiln.test", (&t.job_id, t.epoch), restore.clone()).await.unwrap();
    assert_eq!((d.sha256.as_str(), d.size, d.epoch), (sha.as_str(), bytes.len() as u64, epoch));
    // Only the consumer's live attempt may restore.
    let e = artifacts::restore(&env.state, "http://kiln.test", (&t.job_id, t.epoch + 1), restore).await.unwrap_err();
    assert_eq!((e.status, e.code), (StatusCode::CONFLICT, api::codes::STALE_EPOCH));

    let get_cap = cap(&d.url);
    match artifacts::open_object(&env.state, &s.generation_id, Some(&get_cap)).await.unwrap() {
        artifacts::Object::File { len, sha256, .. } => assert_eq!((len, sha256), (bytes.len() as u64, sha.clone())),
        artifacts::Object::Redirect(u) => panic!("a local store serves the bytes, not {u}"),
    }
    // A download capability lasts 15 minutes of server time.
    env.clock.advance(Duration::from_secs(15 * 60));
    let e = artifacts::open_object(&env.state, &s.generation_id, Some(&get_cap)).await.err().expect("expired");
    assert_eq!(e.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_wrong_digest_fails_the_generation() {
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    env.submit("r").await;
    env.relay().await;
    let agent = env.agent(1).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    let (job, epoch) = (a.job_id.as_str(), a.epoch);
    let create = api::CreateUpload {
        name: "app".into(),
        size: 3,
        sha256: Some(hex::encode(Sha256::digest(b"abc"))),
        kind: None,
    };
    let s = artifacts::create_upload(&env.state, "http://h", job, epoch, create).await.unwrap();
    artifacts::put_part(&env.state, &s.generation_id, 0, Some(&cap(&s.part_url)), &b"xyz"[..]).await.unwrap();
    let e = artifacts::seal(&env.state, (job, epoch), &s.generation_id, Default::default()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(e.message.contains("failed verification"), "{}", e.message);
    let e = artifacts::seal(&env.state, (job, epoch), &s.generation_id, Default::default()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::CONFLICT, "a failed generation cannot be sealed");
    let too_big = api::CreateUpload { name: "app".into(), size: artifacts::MAX_ARTIFACT + 1, sha256: None, kind: None };
    let e = artifacts::create_upload(&env.state, "http://h", job, epoch, too_big).await.unwrap_err();
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
}
