//! Job outputs end to end (issue 16) with the real `kiln` binary, real
//! agents running real shells and real git: values written to
//! `$KILN_OUTPUT` flow through two jobs (env, `run`, a job's and a step's
//! `if:`), hostile values stay inert, and a fenced attempt's outputs never
//! reach anyone — its agent is SIGSTOPped after its step wrote them, a
//! replacement writes others, and downstream sees the replacement's.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, KilnUp, TestRepo, step_writable_tempdir, wait_for, wait_run};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn logs(cli: std::process::Command, run: &str) -> String {
    let mut cli = cli;
    let o = cli.args(["logs", run]).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

const FLOW: &str = r#"version: 1
jobs:
  - name: build
    outputs: [version, notes, hostile]
    steps:
      - run: |
          echo "version=1.2.3" >> "$KILN_OUTPUT"
          printf 'notes<<EOF\nfirst line\nsecond = line\nEOF\n' >> "$KILN_OUTPUT"
          printf '%s\n' 'hostile="; touch pwned-run; echo `touch pwned-tick` $(touch pwned-sub)' >> "$KILN_OUTPUT"
          echo "undeclared=x" >> "$KILN_OUTPUT"
  - name: test
    needs: [build]
    outputs: [url]
    env:
      VERSION: ${{ needs.build.outputs.version }}
    steps:
      - name: use ${{ needs.build.outputs.version }}
        run: |
          echo "env=$VERSION run=${{ needs.build.outputs.version }}"
          echo "notes=[${{ needs.build.outputs.notes }}]"
          echo "hostile=[${{ needs.build.outputs.hostile }}]"
          for f in pwned*; do [ -e "$f" ] && echo "found-$f"; done; true
      - run: echo "url=https://example.com/v$VERSION" >> "$KILN_OUTPUT"
      - name: for 1.x
        if: startsWith(needs.build.outputs.version, '1.')
        run: echo "step-if saw 1.x"
      - name: for 2.x
        if: startsWith(needs.build.outputs.version, '2.')
        run: echo "step-if-wrongly-ran"
  - name: deploy
    needs: [test]
    if: startsWith(needs.test.outputs.url, 'https://example.com/v1.')
    steps:
      - echo "deploying ${{ needs.test.outputs.url }}"
  - name: never
    needs: [test]
    if: needs.test.outputs.url == 'nope'
    steps:
      - echo never-ran
"#;

#[tokio::test(flavor = "multi_thread")]
async fn outputs_flow_through_jobs_and_stay_data() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", FLOW)]).unwrap();
    let out = up.cli().args(["repo", "add", "outs", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
    let c = Client::new(&up.url, &up.token);
    let run = c.submit_run("outs", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 180).await;
    let all = logs(up.cli(), &run.run_id);
    assert_eq!(done.status, "success", "{all}\n{}", up.log());

    let job = |name: &str| done.jobs.iter().find(|j| j.name == name).unwrap();
    // Bound with the run, visible in its API object; undeclared names dropped.
    let build = &job("build").outputs;
    assert_eq!(build["version"], "1.2.3");
    assert_eq!(build["notes"], "first line\nsecond = line");
    assert!(!build.contains_key("undeclared"), "{build:?}");
    assert!(all.contains("ignored output not declared in the job's `outputs`: undeclared"), "{all}");
    assert_eq!(job("test").outputs["url"], "https://example.com/v1.2.3");
    let steps = &job("test").attempts[0].steps;
    assert_eq!(steps.len(), 4, "{steps:#?}");
    assert_eq!(steps[0].name, "use 1.2.3");
    assert!(steps[..3].iter().all(|s| s.outcome == "success" && s.duration_ms.is_some()), "{steps:#?}");
    // A step's `if:` reads them too.
    assert_eq!((steps[3].name.as_str(), steps[3].outcome.as_str()), ("for 2.x", "skipped"), "{steps:#?}");
    assert!(all.contains("step-if saw 1.x") && !all.contains("step-if-wrongly-ran"), "{all}");

    // Read downstream in env, run and a step name; a hostile value is data.
    assert!(all.contains("env=1.2.3 run=1.2.3"), "{all}");
    assert!(all.contains("notes=[first line\nsecond = line]"), "{all}");
    assert!(all.contains("hostile=[\"; touch pwned-run; echo `touch pwned-tick` $(touch pwned-sub)]"), "{all}");
    assert!(!all.contains("found-pwned"), "{all}");
    assert!(all.contains("use 1.2.3"), "{all}");
    // And in `if:` of the jobs that need it.
    assert_eq!(job("deploy").status, "success");
    assert!(all.contains("deploying https://example.com/v1.2.3"), "{all}");
    assert_eq!(job("never").status, "skipped", "{all}");
    assert!(!all.contains("never-ran"), "{all}");

    // `kiln status --json` carries them too.
    let out = up.cli().args(["status", &run.run_id, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"][0]["outputs"]["version"], "1.2.3", "{v}");
}

/// Epoch 1 writes its output, then waits; its agent is paused (SIGSTOP), so
/// its lease expires and the job is fenced. Epoch 2, on another agent,
/// writes a different value and the run finishes. When the first agent
/// resumes it can publish nothing: downstream saw epoch 2's value only.
const FENCED: &str = r#"version: 1
jobs:
  - name: build
    outputs: [version]
    steps:
      - run: |
          echo "version=from-epoch-$KILN_EPOCH" >> "$KILN_OUTPUT"
          if [ "$KILN_EPOCH" = 1 ]; then
            touch "$SYNC/written"
            i=0; while [ ! -e "$SYNC/release" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
          fi
  - name: use
    needs: [build]
    steps:
      - echo "downstream saw ${{ needs.build.outputs.version }}"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_attempts_outputs_never_reach_anyone() {
    let sync = step_writable_tempdir().unwrap();
    let server =
        KilnServer::start(BIN.as_ref(), &["--lease-ttl", "3s", "--loss-grace", "1s", "--retry-base", "100ms"]).unwrap();
    let wf = FENCED.replace("$SYNC", &sync.path().display().to_string());
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("fenced", &repo);
    let c = Client::new(&server.url, &server.token);
    let a = server.agent("agent-a", &[]).unwrap();
    let run =
        c.submit_run("fenced", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let written = wait_for(Duration::from_secs(120), || sync.path().join("written").exists().then_some(()));
    assert!(written.is_some(), "epoch 1 never wrote its output; agent log:\n{}", a.log());

    // Epoch 1's output is written; its agent vanishes before completing.
    a.signal("STOP");
    let b = server.agent("agent-b", &[]).unwrap();
    let done = wait_run(&c, &run.run_id, 240).await;
    let all = logs(server.cli(), &run.run_id);
    assert_eq!(done.status, "success", "{all}\nB:\n{}\nserver:\n{}", b.log(), server.log());
    let build = &done.jobs[0];
    assert_eq!(build.attempts.len(), 2, "{:#?}", build.attempts);
    assert_eq!(build.attempts[0].outcome, "lost");
    assert_eq!(build.outputs["version"], "from-epoch-2");
    assert!(all.contains("downstream saw from-epoch-2"), "{all}");

    // The first agent comes back, its step finishes with its own value:
    // it is fenced and nothing changes.
    std::fs::write(sync.path().join("release"), "").unwrap();
    a.signal("CONT");
    let fenced = wait_for(Duration::from_secs(60), || a.log().contains("fenced").then_some(()));
    assert!(fenced.is_some(), "agent A never noticed it was fenced:\n{}", a.log());
    let after = c.get_run(&run.run_id).await.unwrap();
    assert_eq!(after.jobs[0].outputs["version"], "from-epoch-2");
    assert_eq!(after.jobs[0].attempts.len(), 2);
    assert!(!logs(server.cli(), &run.run_id).contains("from-epoch-1"), "epoch 1's value reached a log");
}
