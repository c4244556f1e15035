//! Findings 2, 4 and 5: a holder of the agent (join) token cannot act on
//! another agent's attempt or see secrets meant for other pools; secrets
//! are sealed at rest; a pull request's run is untrusted and gets none.

use crate::BIN;
use kiln_api::{Client, Completion, RegisterAgent, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, until, wait_run};

const WF: &str = "version: 1\njobs:\n  - name: deploy\n    secrets: [DEPLOY_TOKEN]\n    steps:\n      - \
                  echo \"token=${DEPLOY_TOKEN:-none}\"\n      - sleep 3\n";

async fn logs_of(c: &Client, job: &str) -> String {
    use futures::StreamExt;
    let mut out = String::new();
    let events = c.log_events(job, None).await.expect("log stream");
    futures::pin_mut!(events);
    while let Some(Ok(ev)) = events.next().await {
        if ev.event == "chunk" {
            let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD.decode(v["data"].as_str().unwrap()).unwrap();
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        if ev.event == "end" {
            break;
        }
    }
    out
}

/// A fake agent with the join token registers (that is what the token is
/// for), but its credentials cannot complete, heartbeat or upload for the
/// real agent's running job; the job finishes under its real holder.
#[tokio::test(flavor = "multi_thread")]
async fn a_join_token_holder_cannot_act_on_another_agents_attempt() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF)]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    c.put_secret("app", "DEPLOY_TOKEN", "tok-7f3a9c").await.unwrap();
    let _agent = server.agent("real", &[]).unwrap();
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let r = until(&c, &run.run_id, 60, "the job running", |r| r.jobs[0].status == "running").await;
    let job = r.jobs[0].id.clone();

    let fake = Client::new(&server.url, &server.agent_token);
    let reg = fake
        .register_agent(&RegisterAgent {
            name: "fake".into(),
            labels: Default::default(),
            max_jobs: 1,
            version: None,
            executor: None,
            fresh_start: false,
        })
        .await
        .expect("the join token registers");
    let as_fake = fake.with_token(&reg.credential);
    let done = Completion::success();
    for client in [&fake, &as_fake] {
        let e = client.complete(&job, 1, &done).await.expect_err("not the holder");
        assert!(matches!(e.status(), Some(401 | 403)), "{e:?}");
        let e = client.heartbeat(&job, 1).await.expect_err("not the holder");
        assert!(matches!(e.status(), Some(401 | 403)), "{e:?}");
    }
    let still = c.get_run(&run.run_id).await.unwrap();
    assert_eq!((still.jobs[0].status.as_str(), still.jobs[0].attempts.len()), ("running", 1), "nothing changed");
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(r.status, "success", "the real agent completed it");
    assert!(logs_of(&c, &job).await.contains("token=***"), "the trusted run's job got its (masked) secret");
}

/// A `pull_request` run is untrusted even from the admin token: its job
/// runs without the secret; and the database holds the secret sealed.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_run_gets_no_secrets_and_secrets_are_sealed_at_rest() {
    // The untrusted run goes to an agent of pool `forks`; a host one here,
    // with the unsafe opt-in (placement is proven in `placement`).
    let server = KilnServer::start(BIN.as_ref(), &["--untrusted-on-host-agents"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF)]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    c.put_secret("app", "DEPLOY_TOKEN", "tok-7f3a9c").await.unwrap();
    let _agent = server.pool_agent("forks", "real", &[]).unwrap();
    let pr = SubmitRun { commit_sha: "HEAD".into(), event: Some("pull_request".into()), ..Default::default() };
    let run = c.submit_run("app", &pr, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!((r.status.as_str(), r.trust.as_str()), ("success", "untrusted"));
    assert!(logs_of(&c, &r.jobs[0].id).await.contains("token=none"), "no secret for an untrusted run");

    // Sealed at rest: neither the database nor its WAL holds the value.
    for name in ["kiln.db", "kiln.db-wal"] {
        let bytes = std::fs::read(server.data_dir().join(name)).unwrap_or_default();
        assert!(!bytes.windows(10).any(|w| w == b"tok-7f3a9c"), "{name} holds the secret in clear");
    }
    // Rotating the key reseals it; the running server still hands it out,
    // to an agent of the repository's secret pools (`default`).
    let _trusted = server.agent("trusted", &[]).unwrap();
    let out = server.cli().args(["secret", "rotate-key", "--data-dir"]).arg(server.data_dir()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 secrets sealed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(r.status, "success");
    assert!(logs_of(&c, &r.jobs[0].id).await.contains("token=***"));
}
