//! Pipelines as graphs end to end (spec 003 "Deep Dive 3"): a matrix fanned
//! out over real agents and fanned in, `if: always()`, and a concurrency group
//! where three runs race through the real binary.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

async fn until(c: &Client, run: &str, what: &str, f: impl Fn(&kiln_api::Run) -> bool) -> kiln_api::Run {
    kiln_testkit::until(c, run, 60, what, f).await
}

async fn wait_run(c: &Client, run: &str) -> kiln_api::Run {
    kiln_testkit::wait_run(c, run, 120).await
}

#[tokio::test(flavor = "multi_thread")]
async fn matrix_fan_in_and_a_concurrency_group_race() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let gate = tempfile::tempdir().unwrap();
    let wf = format!(
        r#"version: 1
concurrency: {{group: "deploy-${{{{ branch }}}}"}}
jobs:
  - name: build
    matrix: {{shard: [1, 2]}}
    steps:
      - echo "shard=$KILN_MATRIX_SHARD"; while [ ! -e {gate}/$KILN_RUN_ID ]; do sleep 0.05; done
  - name: report
    needs: build
    if: always()
    steps: ["echo report-ran"]
"#,
        gate = gate.path().display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let out = up.cli().args(["repo", "add", "graphs", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success());
    let c = Client::new(&up.url, &up.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let r1 = c.submit_run("graphs", &body, None).await.unwrap().run_id;
    // r1 runs both shards on the two agents.
    let running =
        until(&c, &r1, "both shards running", |r| r.jobs.iter().filter(|j| j.status == "running").count() == 2).await;
    let names: Vec<_> = running.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["build (shard=1)", "build (shard=2)", "report"]);

    let r2 = c.submit_run("graphs", &body, None).await.unwrap().run_id;
    let r3 = c.submit_run("graphs", &body, None).await.unwrap().run_id;
    let v2 = c.get_run(&r2).await.unwrap();
    assert_eq!(v2.status, "cancelled", "r2 was superseded by r3 while waiting");
    assert!(v2.message.as_deref().unwrap_or("").contains("superseded"), "{:?}", v2.message);
    assert!(v2.jobs.iter().all(|j| j.attempts.is_empty()), "a superseded run never ran");
    let v3 = c.get_run(&r3).await.unwrap();
    assert_eq!(v3.status, "queued");
    assert!(v3.jobs.iter().all(|j| j.status == "pending"), "r3 waits while r1 holds the group");

    std::fs::write(gate.path().join(&r1), "").unwrap();
    let d1 = wait_run(&c, &r1).await;
    assert_eq!(d1.status, "success", "{d1:#?}");
    let logs = up.cli().args(["logs", &r1]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("shard=1") && logs.contains("shard=2") && logs.contains("report-ran"), "{logs}");
    // The group is free again: r3 starts on its own.
    until(&c, &r3, "r3 starts once r1 finished", |r| r.status == "running").await;
    std::fs::write(gate.path().join(&r3), "").unwrap();
    assert_eq!(wait_run(&c, &r3).await.status, "success");
    // Exactly one run of the group was ever active at a time.
    let (a1, b3) = (d1.finished_at_ms.unwrap(), c.get_run(&r3).await.unwrap());
    let first_start_r3 = b3.jobs.iter().flat_map(|j| j.attempts.iter()).map(|a| a.started_at_ms).min().unwrap();
    assert!(first_start_r3 >= a1, "r3 started before r1 finished");
}
