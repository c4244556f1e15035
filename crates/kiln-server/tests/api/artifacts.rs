//! Artifacts end to end through the router: upload session, part on the
//! data plane, seal, completion binds, consumer restores, people download.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::TestApp;
use sha2::{Digest, Sha256};

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

/// The path and query of a capability URL handed out for `http://kiln.test`.
fn local(url: &str) -> String {
    url.strip_prefix("http://kiln.test").unwrap_or_else(|| panic!("{url} is not on this server")).to_string()
}

#[tokio::test]
async fn upload_seal_restore_download() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", WF).await;
    let run = super::submit(&app, "r").await;
    app.run_pending_work().await;
    let agent = super::register(&app, "a1", 2).await;
    let a = super::claim(&app, &agent, "c1").await.unwrap();
    let bytes = b"#!/bin/sh\necho built\n".to_vec();
    let sha = hex::encode(Sha256::digest(&bytes));

    let attempt = format!("/v1/jobs/{}/attempts/{}", a.job_id, a.epoch);
    let create =
        api::CreateUpload { name: "app".into(), size: bytes.len() as u64, sha256: Some(sha.clone()), kind: None };
    let s: api::UploadSession = app
        .holder(&a)
        .post(&format!("{attempt}/artifacts"))
        .json(&create)
        .send()
        .await
        .assert_status(StatusCode::OK)
        .json();
    let part = local(&s.part_url.replace("{part}", "0"));
    // The data plane takes no bearer token, only the capability.
    app.anonymous()
        .put(&part.replace("cap=", "cap=x"))
        .body(bytes.clone())
        .send()
        .await
        .assert_status(StatusCode::UNAUTHORIZED);
    let receipt: api::PartReceipt =
        app.anonymous().put(&part).body(bytes.clone()).send().await.assert_status(StatusCode::OK).json();
    assert_eq!(receipt.size, bytes.len() as u64);
    let seal = format!("{attempt}/artifacts/{}/seal", s.generation_id);
    let sealed: api::SealedGeneration = app.holder(&a).post(&seal).send().await.assert_status(StatusCode::OK).json();
    assert_eq!((sealed.state.as_str(), sealed.sha256.as_str()), ("sealed", sha.as_str()));

    let public = format!("/v1/workflow-runs/{run}/artifacts/compile/app");
    app.admin().get(&public).send().await.assert_status(StatusCode::NOT_FOUND);
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);
    let view = super::get_run(&app, &run).await;
    assert_eq!(view.jobs[0].artifacts.len(), 1);
    assert_eq!((view.jobs[0].artifacts[0].sha256.as_str(), view.jobs[0].artifacts[0].epoch), (sha.as_str(), 1));

    app.run_pending_work().await;
    let t = super::claim(&app, &agent, "c2").await.unwrap();
    let restore = api::RestoreRequest { from_job: "compile".into(), name: "app".into() };
    let path = format!("/v1/jobs/{}/attempts/{}/restore", t.job_id, t.epoch);
    let d: api::ArtifactDownload =
        app.holder(&t).post(&path).json(&restore).send().await.assert_status(StatusCode::OK).json();
    assert_eq!((d.sha256.as_str(), d.job.as_str()), (sha.as_str(), "compile"));
    let got = app.anonymous().get(&local(&d.url)).send().await.assert_status(StatusCode::OK);
    assert_eq!(got.header("x-kiln-sha256"), Some(sha.as_str()));
    assert_eq!(&got.body[..], &bytes[..]);

    let people: api::ArtifactDownload = app.admin().get(&public).send().await.assert_status(StatusCode::OK).json();
    app.anonymous().get(&local(&people.url)).send().await.assert_status(StatusCode::OK);
    // Capabilities expire on the server clock.
    app.advance(std::time::Duration::from_secs(15 * 60));
    app.anonymous().get(&local(&people.url)).send().await.assert_status(StatusCode::UNAUTHORIZED);
}
