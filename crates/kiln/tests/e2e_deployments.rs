//! Deployments end to end (issue 46) with the real `kiln` binary and real
//! agents: `kiln env create`, a deploy matrix held for one `kiln approve`
//! (the CLI, as an approver's token), a ref outside `--refs` refused with
//! exit 2's message, ten deploys of one environment running one run at a
//! time in acceptance order, and `kiln deploys` naming the sha256 of the
//! artifact each deploy restored — the bytes the build produced.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::prometheus::{Exporter, METRIC, Prometheus};
use kiln_testkit::{KilnUp, TestRepo, wait_run};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release $KILN_RUN_ID" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: deploy
    needs: build
    environment: {name: production, url: "https://shop.example"}
    matrix: {region: [eu, us, ap]}
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps:
      - grep -q release app.txt && sleep 0.3
"#;

fn cli(up: &KilnUp, token: Option<&str>, args: &[&str]) -> (i32, String) {
    let mut cmd = up.cli();
    if let Some(t) = token {
        cmd.env("KILN_TOKEN", t);
    }
    let o = cmd.args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn deploys_wait_for_one_approval_run_in_order_and_record_what_they_deployed() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW)]).unwrap();
    let (code, out) = cli(&up, None, &["repo", "add", "shop", "--url", &repo.path().display().to_string()]);
    assert_eq!(code, 0, "{out}");
    let c = Client::new(&up.url, &up.token);
    let alice = c
        .create_token(&kiln_api::CreateToken { name: "alice".into(), scope: "read".into(), repo: None, trusted: None })
        .await
        .unwrap()
        .token;
    let (code, out) = cli(
        &up,
        None,
        &["env", "create", "production", "--approvers", "alice", "--refs", "main", "--prevent-self-review"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 approval(s) from alice; refs: main; no self-approval"), "{out}");

    // A ref outside --refs: refused when submitted, saying the rule.
    let o = std::process::Command::new("git").args(["branch", "feature"]).current_dir(repo.path()).status().unwrap();
    assert!(o.success());
    let (code, out) = cli(&up, None, &["run", "--repo", "shop", "--commit", "feature"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("--refs main") && out.contains("refs/heads/feature"), "{out}");

    // One run: build runs, the three deploys wait for alice.
    let first =
        c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = c.get_run(&first.run_id).await.unwrap();
        let build = r.jobs.iter().find(|j| j.name == "build").unwrap();
        if build.status == "success" {
            let deploys: Vec<_> = r.jobs.iter().filter(|j| j.name.starts_with("deploy")).collect();
            assert_eq!(deploys.len(), 3);
            let msg = deploys[0].message.clone().unwrap_or_default();
            if deploys.iter().all(|j| j.status == "pending") && msg.contains("waiting for approval") {
                assert!(msg.contains("0 of 1 (approvers: alice"), "{msg}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "the deploys never waited for approval: {r:?}\n{}", up.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The admin token is not an approver; alice is.
    let (code, out) = cli(&up, None, &["approve", &first.run_id]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("its approvers are alice"), "{out}");
    let (code, out) = cli(&up, Some(&alice), &["approve", &first.run_id, "--comment", "go"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("approved") && out.contains("as alice"), "{out}");
    let run = wait_run(&c, &first.run_id, 120).await;
    assert_eq!(run.status, "success", "{run:?}\n{}", up.log());

    // Ten more, submitted at once and approved at once: one run deploys at a time, in order.
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(
            c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let r = c.get_run(id).await.unwrap();
            if r.jobs.iter().any(|j| j.name == "build" && j.status == "success") {
                break;
            }
            assert!(Instant::now() < deadline, "build of {id} did not end\n{}", up.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (code, out) = cli(&up, Some(&alice), &["approve", id]);
        assert_eq!(code, 0, "{out}");
    }
    let mut runs = Vec::new();
    for id in &ids {
        let r = wait_run(&c, id, 300).await;
        assert_eq!(r.status, "success", "none cancelled: {r:?}\n{}", up.log());
        runs.push(r);
    }
    // Deploy windows (first deploy start → last deploy end) never overlap, and follow acceptance order.
    let window = |r: &kiln_api::Run| {
        let d: Vec<_> = r.jobs.iter().filter(|j| j.name.starts_with("deploy")).collect();
        (
            d.iter().filter_map(|j| j.started_at_ms).min().unwrap(),
            d.iter().filter_map(|j| j.finished_at_ms).max().unwrap(),
        )
    };
    for pair in runs.windows(2) {
        let (a, b) = (window(&pair[0]), window(&pair[1]));
        assert!(a.1 <= b.0, "run {} deployed while {} still was: {a:?} {b:?}", pair[1].id, pair[0].id);
    }

    // What each deployed: the build's artifact, by sha256.
    let l = c.deployments("production", 100).await.unwrap();
    assert_eq!(l.deployments.len(), 33, "3 deploy jobs × 11 runs");
    let arts = c.run_artifacts(&first.run_id).await.unwrap();
    let built = &arts.artifacts.iter().find(|a| a.artifact.name == "app").expect("the build's artifact").artifact;
    let mine: Vec<_> = l.deployments.iter().filter(|d| d.run_id == first.run_id).collect();
    assert_eq!(mine.len(), 3);
    for d in mine {
        assert_eq!(d.status, "success");
        assert_eq!(d.approvals, vec!["alice".to_string()]);
        assert_eq!(d.url.as_deref(), Some("https://shop.example"));
        assert_eq!(d.artifacts.len(), 1);
        assert_eq!(d.artifacts[0].sha256, built.sha256, "the deployed bytes are the built bytes");
    }
    let (code, out) = cli(&up, None, &["deploys", "production", "--limit", "3"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("app (from build) sha256:"), "{out}");
    assert!(out.contains("* what production runs now"), "{out}");
}

const ROLLBACK_WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release $KILN_RUN_ID" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt, expire-in: 1s}
  - name: deploy
    needs: build
    environment: production
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps:
      - sha256sum app.txt
"#;

/// `kiln rollback production` (issue 46): with the build's artifact
/// published under `expire-in: 1s` and the collector run many times since,
/// the rollback deploys the earlier deployment's sha256 again — its build
/// pinned, not run (no attempt) — and the bytes of a deployment that is no
/// longer kept expire as any others.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_deploys_the_earlier_bytes_again_without_a_build_after_gc() {
    let server =
        kiln_testkit::KilnServer::start(BIN.as_ref(), &["--gc-interval", "300ms", "--artifact-gc-grace", "1s"])
            .unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", ROLLBACK_WORKFLOW)]).unwrap();
    server.add_repo("shop", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run_cli = |args: &[&str]| {
        let o = server.cli().args(args).output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let (code, out) = run_cli(&["env", "create", "production", "--wait", "10m", "--keep-deployments", "2"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_cli(&["rollback", "production"]);
    assert_ne!(code, 0, "nothing deployed yet: {out}");
    assert!(out.contains("no successful deployment"), "{out}");
    // Two deploys of different bytes (each run's id is in its artifact). The
    // environment waits 10 minutes before a deploy: approve-less, it is
    // the wait alone; shortened here so the first two deploy at all.
    let (code, out) = run_cli(&["env", "set", "production", "--wait", "0"]);
    assert_eq!(code, 0, "{out}");
    let mut runs = Vec::new();
    for _ in 0..2 {
        let r =
            c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let r = wait_run(&c, &r.run_id, 120).await;
        assert_eq!(r.status, "success", "{r:?}\n{}", server.log());
        runs.push(r);
    }
    // From now on alice (a read token, which may not start trusted runs
    // of its own) approves production's deploys, and rolls it back.
    let (code, out) = run_cli(&["env", "set", "production", "--wait", "10m", "--approvers", "alice"]);
    assert_eq!(code, 0, "{out}");
    let alice = c
        .create_token(&kiln_api::CreateToken { name: "alice".into(), scope: "read".into(), repo: None, trusted: None })
        .await
        .unwrap()
        .token;
    let l = c.deployments("production", 10).await.unwrap().deployments;
    assert_eq!(l.len(), 2);
    let (second, first) = (&l[0], &l[1]);
    assert_eq!(first.run_id, runs[0].id);
    assert_ne!(first.artifacts[0].sha256, second.artifacts[0].sha256, "two different builds");

    // Past expire-in, with the collector running every 300 ms: the deployed
    // bytes stay (pinned), so a rollback to them needs no build.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, out) = run_cli(&["rollback", "production"]);
    assert_ne!(code, 0, "the admin is not production's approver: {out}");
    assert!(out.contains("its approvers are alice"), "{out}");
    let o = server
        .cli()
        .env("KILN_TOKEN", &alice)
        .args(["rollback", "production", "--comment", "errors up"])
        .output()
        .unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}\n{}", server.log());
    assert!(out.contains(&format!("back to deployment {}", first.id)), "{out}");
    assert!(out.contains(&first.artifacts[0].sha256), "{out}");
    let back_id =
        out.split("): run ").nth(1).and_then(|s| s.split_whitespace().next()).expect("the run id").to_string();
    let back = wait_run(&c, &back_id, 120).await;
    assert_eq!(back.status, "success", "no wait for a rollback: {back:?}\n{}", server.log());
    assert_eq!(back.event, "rollback");
    assert_eq!(back.trust, "trusted", "the deployment's run's trust, whoever approved the rollback");
    let build = back.jobs.iter().find(|j| j.name == "build").unwrap();
    assert_eq!(build.status, "success");
    assert!(build.attempts.is_empty(), "no build ran: {build:?}");
    let deploy = back.jobs.iter().find(|j| j.name == "deploy").unwrap();
    assert_eq!(deploy.attempts.len(), 1);
    let (_, log) = run_cli(&["logs", &back.id, "deploy"]);
    assert!(log.contains(&first.artifacts[0].sha256), "the deploy step hashed the first build's bytes: {log}");
    let now = c.deployments("production", 1).await.unwrap().deployments.remove(0);
    assert_eq!(now.run_id, back.id);
    assert_eq!(now.rollback_of.as_deref(), Some(first.id.as_str()));
    assert_eq!(now.artifacts[0].sha256, first.artifacts[0].sha256, "the same sha256 deployed again");
    let approvals = c.run_approvals(&back.id).await.unwrap().approvals;
    assert_eq!(approvals.len(), 1, "the rollback is its own approval: {approvals:?}");
    assert_eq!(approvals[0].comment.as_deref(), Some("errors up"));

    // Two newer deployments (keep 2): the second run's bytes are no longer
    // pinned, are collected, and a rollback to them is refused.
    let (code, out) = run_cli(&["env", "set", "production", "--wait", "0", "--approvers", ""]);
    assert_eq!(code, 0, "{out}");
    for _ in 0..2 {
        let r =
            c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        assert_eq!(wait_run(&c, &r.run_id, 120).await.status, "success");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let arts = c.run_artifacts(&runs[1].id).await.unwrap();
        if arts.artifacts.iter().all(|a| a.artifact.expired) {
            break;
        }
        assert!(Instant::now() < deadline, "the unpinned bytes never expired: {arts:?}\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out) = run_cli(&["rollback", "production", "--to", &second.id]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("has expired"), "{out}");
}

const SECRET_WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    secrets: [DEPLOY_KEY]
    steps:
      - test "$DEPLOY_KEY" = "repo-value-1234" && echo "build has the repository's key"
      - mkdir -p out && echo "release" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: deploy
    needs: build
    environment: production
    secrets: [DEPLOY_KEY]
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps:
      - echo "deploying with $DEPLOY_KEY"
      - test "$DEPLOY_KEY" = "env-value-5678"
"#;

/// `kiln secret set NAME --env ENV` from stdin.
fn set_env_secret(up: &KilnUp, name: &str, env: &str, value: &str) -> (i32, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = up
        .cli()
        .args(["secret", "set", name, "--env", env])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

/// Issue 46: an environment's secret reaches its deploy job (masked in the
/// log, over the repository's secret of the same name) and not the build;
/// `--require-provenance` lets main's artifact deploy and cancels a feature
/// branch's deploy naming the failed check — with the real agent, the real
/// attestation keys and the real CLI.
#[tokio::test(flavor = "multi_thread")]
async fn an_environments_secret_reaches_only_its_deploy_job_and_its_policy_refuses_other_refs() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", SECRET_WORKFLOW)]).unwrap();
    let (code, out) = cli(&up, None, &["repo", "add", "shop", "--url", &repo.path().display().to_string()]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(&up, None, &["env", "create", "production", "--require-provenance", "ref=main"]);
    assert_ne!(code, 0, "a bare branch name is refused: {out}");
    assert!(out.contains("ref=refs/heads/main"), "{out}");
    let (code, out) =
        cli(&up, None, &["env", "create", "production", "--require-provenance", "ref=refs/heads/main,trusted"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(&up, None, &["env", "show", "production"]);
    assert!(code == 0 && out.contains("provenance: trusted,ref=refs/heads/main"), "{out}");
    // Values from stdin; with --env only NAME.
    let (code, out) = set_env_secret(&up, "DEPLOY_KEY", "production", "env-value-5678\n");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("secret DEPLOY_KEY of environment production set (14 bytes)"), "{out}");
    let (code, out) = cli(&up, None, &["secret", "set", "shop", "DEPLOY_KEY", "--env", "production"]);
    assert_ne!(code, 0, "REPO NAME with --env is refused: {out}");
    let mut set = up.cli();
    let o = set
        .args(["secret", "set", "shop", "DEPLOY_KEY"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut o = o;
        o.stdin.take().unwrap().write_all(b"repo-value-1234").unwrap();
        assert!(o.wait().unwrap().success());
    }
    let (code, out) = cli(&up, None, &["secret", "ls", "--env", "production"]);
    assert!(code == 0 && out.trim() == "DEPLOY_KEY", "{out}");

    let c = Client::new(&up.url, &up.token);
    let run = c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(r.status, "success", "{r:?}\n{}", up.log());
    let (code, log) = cli(&up, None, &["logs", &run.run_id, "deploy"]);
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("deploying with ***"), "the deploy job's log masks it: {log}");
    assert!(!log.contains("env-value-5678"), "{log}");
    let (_, log) = cli(&up, None, &["logs", &run.run_id, "build"]);
    assert!(log.contains("build has the repository's key"), "{log}");

    // A feature branch's build: its deploy is cancelled by the policy, the run fails.
    let o = std::process::Command::new("git").args(["branch", "feature"]).current_dir(repo.path()).status().unwrap();
    assert!(o.success());
    let run =
        c.submit_run("shop", &SubmitRun { commit_sha: "feature".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(r.status, "failed", "{r:?}");
    let deploy = r.jobs.iter().find(|j| j.name == "deploy").unwrap();
    assert_eq!(deploy.status, "cancelled");
    let msg = deploy.message.clone().unwrap_or_default();
    assert!(
        msg.contains("provenance check `ref` failed for artifact `app`") && msg.contains("refs/heads/feature"),
        "{msg}"
    );
    assert!(deploy.attempts.is_empty(), "it never ran: {deploy:?}");
}

const RINGS_WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release $KILN_RUN_ID" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: deploy
    needs: build
    environment: production
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    rings:
      - name: canary
        gate: {prometheus: {query: "vector(0)", success: "result < 0.05", interval: 1s, duration: 2s}}
      - name: early
        gate: {prometheus: {query: kiln_test_error_ratio, success: "result < 0.05", interval: 2s}}
      - name: all
    steps:
      - echo "ring $KILN_RING" && sha256sum app.txt
"#;

/// Rings with Prometheus gates (issue 46), with Debian's real Prometheus
/// scraping an exporter whose error ratio the test sets: a passing sequence
/// promotes canary → early → all with no human action; with the error
/// ratio up, the gate after ring 2 (`early`) fails at its first
/// measurement, the last ring is cancelled saying why, and the server rolls
/// `production` back on its own — to the first run's bytes, nothing built.
#[tokio::test(flavor = "multi_thread")]
async fn a_passing_gate_sequence_promotes_every_ring_and_a_failing_ring_2_gate_rolls_back() {
    let exporter = Exporter::start(0.0).await;
    let mut prom = Prometheus::start(exporter.addr, "");
    prom.wait_for(METRIC, |v| v == 0.0).await;
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &["--prometheus-url", &prom.base]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", RINGS_WORKFLOW)]).unwrap();
    server.add_repo("shop", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run_cli = |args: &[&str]| {
        let o = server.cli().args(args).output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let (code, out) = run_cli(&["env", "create", "production"]);
    assert_eq!(code, 0, "{out}");

    // Healthy: every ring deploys, promoted by the gates alone.
    let r = c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let first = wait_run(&c, &r.run_id, 180).await;
    assert_eq!(first.status, "success", "{first:?}\n{}", server.log());
    let promotions = c.run_rings(&first.id).await.unwrap().promotions;
    assert_eq!(
        promotions.iter().map(|p| (p.to_ring.as_str(), p.state.as_str(), p.by.is_none())).collect::<Vec<_>>(),
        vec![("early", "passed", true), ("all", "passed", true)],
        "{promotions:?}"
    );
    assert_eq!(promotions[0].measured, 2, "the canary gate measures for its duration (2s at 1s)");
    let deployed = c.deployments("production", 10).await.unwrap().deployments;
    let rings: Vec<&str> = deployed.iter().rev().filter_map(|d| d.ring.as_deref()).collect();
    assert_eq!(rings, vec!["canary", "early", "all"]);
    let first_sha = deployed[0].artifacts[0].sha256.clone();
    let (code, out) = run_cli(&["rings", &first.id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("canary → early [passed]") && out.contains("early → all [passed]"), "{out}");

    // The error ratio goes up: ring 2's gate fails and production is rolled back.
    exporter.set(0.5);
    prom.wait_for(METRIC, |v| v == 0.5).await;
    let r = c.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let second = wait_run(&c, &r.run_id, 180).await;
    assert_eq!(second.status, "failed", "{second:?}\n{}", server.log());
    let all = second.jobs.iter().find(|j| j.name == "deploy (all)").unwrap();
    assert_eq!(all.status, "cancelled");
    let msg = all.message.clone().unwrap_or_default();
    assert!(msg.contains("not promoted to `all`: the gate after ring `early` failed"), "{msg}");
    assert!(msg.contains("0.5") && msg.contains("result < 0.05"), "names the value and the condition: {msg}");
    // The rollback run is asked for by the gate runner after the failing
    // measurement (the first: failure-limit 0).
    let deadline = Instant::now() + Duration::from_secs(60);
    let gate = loop {
        let p = c.run_rings(&second.id).await.unwrap().promotions;
        let g = p.iter().find(|g| g.to_ring == "all").cloned().expect("the gate before `all`");
        if g.rollback.as_deref().is_some_and(|r| r != "asked") {
            break g;
        }
        assert!(Instant::now() < deadline, "no rollback after the failed gate: {g:?}\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((gate.state.as_str(), gate.measured, gate.failures), ("failed", 1, 1), "{gate:?}");
    let back_id = gate.rollback.clone().unwrap();
    let back = wait_run(&c, &back_id, 180).await;
    assert_eq!(back.status, "success", "{back:?}\n{}", server.log());
    assert_eq!(back.event, "rollback");
    println!(
        "rollback_after_failed_gate_ms: {} (gate interval 2000 ms)",
        back.created_at_ms.saturating_sub(gate.started_at_ms.unwrap_or(back.created_at_ms))
    );
    let build = back.jobs.iter().find(|j| j.name == "build").unwrap();
    assert!(build.attempts.is_empty(), "the rollback built nothing: {build:?}");
    let now = c.deployments("production", 1).await.unwrap().deployments.remove(0);
    assert_eq!(now.run_id, back.id);
    assert_eq!(now.ring.as_deref(), Some("all"), "the rollback deployed every ring again");
    assert_eq!(now.artifacts[0].sha256, first_sha, "production runs the first run's bytes again");
    let (code, out) = run_cli(&["rings", &second.id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("early → all [failed]") && out.contains(&format!("rolled back by run {back_id}")), "{out}");
    // An ended run has nothing to pause.
    let (code, out) = run_cli(&["pause", &second.id]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("has ended"), "{out}");
}

const COMMAND_GATE_WORKFLOW: &str = r#"version: 1
inputs:
  gate: {type: string, default: pass}
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release $KILN_RUN_ID" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: deploy
    needs: build
    environment: staging
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    rings:
      - name: canary
        bake: 1h
        gate: {run: 'echo "checking $KILN_RING" && test "$KILN_INPUT_GATE" = pass'}
      - name: all
    steps:
      - echo "ring $KILN_RING" && sha256sum app.txt
"#;

const PROMETHEUS_GATE_WORKFLOW: &str = r#"version: 1
jobs:
  - name: deploy
    environment: staging
    rings:
      - {name: canary, gate: {prometheus: {query: up, success: result == 1}}}
      - {name: all}
    steps: [echo]
"#;

/// Waits until `job` of `run` is pending with a message containing `want`.
async fn wait_message(c: &Client, run: &str, job: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let v = c.get_run(run).await.unwrap();
        let j = v.jobs.iter().find(|j| j.name == job).unwrap_or_else(|| panic!("no job {job}: {v:?}"));
        let msg = j.message.clone().unwrap_or_default();
        if msg.contains(want) {
            return msg;
        }
        assert!(Instant::now() < deadline, "{job} never said {want:?}; it says {msg:?} ({})", j.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A command gate between rings (issue 46), paused and promoted by hand:
/// the gate's job waits out the bake (`kiln pause` holds it, only the
/// environment's approver may `kiln promote` it), runs its command, and
/// promotes the last ring when it passes; when it fails, the last ring is
/// skipped and the server rolls `staging` back to the previous run's bytes.
/// A server without `--prometheus-url` refuses a Prometheus gate at
/// acceptance.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_gate_waits_out_its_bake_obeys_pause_and_promote_and_its_failure_rolls_back() {
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/pipeline.yaml", COMMAND_GATE_WORKFLOW),
        (".kiln/prometheus.yaml", PROMETHEUS_GATE_WORKFLOW),
    ])
    .unwrap();
    server.add_repo("shop", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run_cli = |token: Option<&str>, args: &[&str]| {
        let mut cmd = server.cli();
        if let Some(t) = token {
            cmd.env("KILN_TOKEN", t);
        }
        let o = cmd.args(args).output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let (code, out) = run_cli(None, &["env", "create", "staging", "--approvers", "alice"]);
    assert_eq!(code, 0, "{out}");
    let alice = c
        .create_token(&kiln_api::CreateToken { name: "alice".into(), scope: "read".into(), repo: None, trusted: None })
        .await
        .unwrap()
        .token;

    // No Prometheus configured: a Prometheus gate is refused at acceptance.
    let submit = |path: &str, gate: &str| SubmitRun {
        commit_sha: "main".into(),
        workflow_path: Some(path.into()),
        inputs: [("gate".to_string(), gate.to_string())].into_iter().filter(|_| !gate.is_empty()).collect(),
        ..Default::default()
    };
    let e = c.submit_run("shop", &submit(".kiln/prometheus.yaml", ""), None).await.unwrap_err().to_string();
    assert!(e.contains("no Prometheus configured") && e.contains("--prometheus-url"), "{e}");

    // Run 1: approved by alice; the gate's job bakes for an hour.
    let one = c.submit_run("shop", &submit(".kiln/pipeline.yaml", "pass"), None).await.unwrap().run_id;
    let (code, out) = run_cli(Some(&alice), &["approve", &one]);
    assert_eq!(code, 0, "{out}");
    let msg = wait_message(&c, &one, "deploy (canary gate)", "baking ring `canary` for 1h").await;
    assert!(msg.contains("before promoting to `all`"), "{msg}");
    let (code, out) = run_cli(Some(&alice), &["pause", &one]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("canary → all [paused]") && out.contains("paused by alice"), "{out}");
    wait_message(&c, &one, "deploy (canary gate)", "paused by alice").await;
    let (code, out) = run_cli(None, &["promote", &one]);
    assert_ne!(code, 0, "the admin is not staging's approver: {out}");
    assert!(out.contains("its approvers are alice"), "{out}");
    let (code, out) = run_cli(Some(&alice), &["promote", &one]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[promoted]"), "{out}");
    let first = wait_run(&c, &one, 120).await;
    assert_eq!(first.status, "success", "{first:?}\n{}", server.log());
    let gate_job = first.jobs.iter().find(|j| j.name == "deploy (canary gate)").unwrap();
    assert_eq!(gate_job.status, "success");
    let first_sha = c.deployments("staging", 1).await.unwrap().deployments[0].artifacts[0].sha256.clone();

    // Run 2: its gate command fails; the last ring never deploys and the
    // server rolls staging back to run 1's bytes.
    let two = c.submit_run("shop", &submit(".kiln/pipeline.yaml", "fail"), None).await.unwrap().run_id;
    let (code, out) = run_cli(Some(&alice), &["approve", &two]);
    assert_eq!(code, 0, "{out}");
    wait_message(&c, &two, "deploy (canary gate)", "baking ring `canary`").await;
    let (code, out) = run_cli(Some(&alice), &["promote", &two]);
    assert_eq!(code, 0, "{out}");
    let second = wait_run(&c, &two, 120).await;
    assert_eq!(second.status, "failed", "{second:?}\n{}", server.log());
    let status = |name: &str| second.jobs.iter().find(|j| j.name == name).unwrap().status.clone();
    assert_eq!(status("deploy (canary)"), "success");
    assert_eq!(status("deploy (canary gate)"), "failed");
    assert_eq!(status("deploy (all)"), "skipped");
    let deadline = Instant::now() + Duration::from_secs(60);
    let back_id = loop {
        let p = c.run_rings(&two).await.unwrap().promotions;
        if let Some(r) = p.iter().find_map(|g| g.rollback.clone()).filter(|r| r != "asked") {
            assert_eq!(p[0].state, "failed", "{p:?}");
            assert!(p[0].message.contains("the gate command (job `deploy (canary gate)`) failed"), "{p:?}");
            break r;
        }
        assert!(Instant::now() < deadline, "no rollback after the failed command gate: {p:?}\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let back = wait_run(&c, &back_id, 120).await;
    assert_eq!(back.status, "success", "a rollback neither bakes nor waits for approval: {back:?}\n{}", server.log());
    assert!(back.jobs.iter().find(|j| j.name == "build").unwrap().attempts.is_empty(), "nothing built");
    let now = c.deployments("staging", 1).await.unwrap().deployments.remove(0);
    assert_eq!((now.run_id.as_str(), now.ring.as_deref()), (back.id.as_str(), Some("all")));
    assert_eq!(now.artifacts[0].sha256, first_sha, "staging runs run 1's bytes again");
}
