//! Assignments: what the agent is told, and secrets only for trusted runs.

use super::env::Env;
use crate::services::{assignment, claim};
use kiln_store::ClaimInput;

const WF: &str = r#"version: 1
jobs:
  - name: deploy
    image:
      dockerfile: ci/Dockerfile
    runs-on: {size: small}
    secrets: [TOKEN]
    env:
      MODE: fast
    timeout: 5m
    artifacts:
      publish:
        - name: app
          path: out/app
    steps:
      - name: ship
        run: ./ship.sh
"#;

/// An agent whose labels fit the job's `runs-on`, with a container executor
/// (the job has `image:`), of the `default` pool.
async fn small_agent(env: &Env) -> (String, String) {
    let a = env.state.store.register_agent("small", r#"{"size":"small"}"#, 1).await.unwrap();
    env.state.store.set_agent_executor(&a.id, kiln_core::claim::Executor::Container).await.unwrap();
    (a.id, a.session_id)
}

/// [`small_agent`] of pool `forks`, which takes untrusted work.
async fn fork_box(env: &Env, name: &str) -> (String, String) {
    let a = env.state.store.register_agent_in(name, r#"{"size":"small"}"#, 1, "forks", None).await.unwrap();
    env.state.store.set_agent_executor(&a.id, kiln_core::claim::Executor::Container).await.unwrap();
    (a.id, a.session_id)
}

#[tokio::test]
async fn a_trusted_runs_assignment_carries_its_job_and_secrets() {
    let env = Env::new().await;
    let repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    let r = env.state.store.get_repo("r").await.unwrap();
    env.state.store.put_secret(&r.id, "TOKEN", "s3cret").await.unwrap();
    let mut request = kiln_api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() };
    request.inputs.insert("target-env".into(), "prod".into());
    let sub = crate::services::acceptance::Submission {
        repo: "r".into(),
        request,
        idempotency_key: None,
        by: crate::auth::Principal::admin_file(),
        trace: None,
    };
    crate::services::acceptance::submit(&env.state, sub).await.unwrap();
    env.relay().await;
    let agent = small_agent(&env).await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    assert_eq!(a.clone_url, repo.path().display().to_string());
    assert_eq!(a.commit_sha, repo.head().unwrap());
    assert_eq!((a.job_name.as_str(), a.epoch, a.size.as_deref()), ("deploy", 1, Some("small")));
    assert_eq!(a.steps.len(), 1);
    assert_eq!((a.steps[0].name.as_deref(), a.steps[0].run.as_str()), (Some("ship"), "./ship.sh"));
    assert_eq!(a.env.get("MODE").map(String::as_str), Some("fast"));
    assert_eq!(a.env.get("KILN_INPUT_TARGET_ENV").map(String::as_str), Some("prod"));
    assert_eq!(a.timeout_secs, Some(300));
    assert_eq!(a.image, None);
    assert_eq!(a.image_build.as_ref().map(|b| b.dockerfile.as_str()), Some("ci/Dockerfile"));
    assert_eq!(a.publish.len(), 1);
    assert_eq!((a.lease_ttl_ms, a.heartbeat_interval_ms), (30_000, 10_000));
    assert_eq!(a.secrets.get("TOKEN").map(String::as_str), Some("s3cret"));
}

#[tokio::test]
async fn an_untrusted_run_gets_no_secrets() {
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    let r = env.state.store.get_repo("r").await.unwrap();
    env.state.store.put_secret(&r.id, "TOKEN", "s3cret").await.unwrap();
    // No trigger makes untrusted runs yet (the forge triggers will): accept
    // one through the store as such a trigger would.
    let trusted = env.submit("r").await;
    let mut new = env.state.store.get_run(&trusted).await.unwrap().run;
    env.state.store.cancel_run(&trusted).await.unwrap();
    new.trust = "untrusted".into();
    let accepted = env
        .state
        .store
        .accept_run(kiln_store::NewRun {
            priority: "normal".into(),
            repo_id: new.repo_id,
            commit_sha: new.commit_sha,
            git_ref: None,
            event: "pull_request".into(),
            trust: new.trust,
            workflow_path: new.workflow_path,
            workflow: new.definition,
            inputs: Default::default(),
            parent_run_id: None,
            idempotency: None,
            concurrency: None,
            image_digests: Default::default(),
            actor: None,
            report_context: None,
            pin_succeeded: false,
            rerun_jobs: Vec::new(),
            traceparent: None,
            commit_title: None,
            commit_author: None,
            pull_request_title: None,
            rollback: None,
            audit: None,
        })
        .await
        .unwrap();
    let job = env.state.store.get_run(&accepted.run_id).await.unwrap().jobs.remove(0).job;
    let agent = fork_box(&env, "pr-box").await;
    let c = env
        .state
        .store
        .claim(ClaimInput {
            agent_id: agent.0.clone(),
            session_id: agent.1.clone(),
            claim_request_id: "c1".into(),
            job_id: job.id,
            dispatch_generation: job.dispatch_generation,
            lease_ttl_ms: 30_000,
            skip_locked: false,
            untrusted: Default::default(),
        })
        .await
        .unwrap()
        .expect("claimed");
    assert!(!assignment::may_read_secrets(&c));
    let record = env.state.store.get_agent(&agent.0).await.unwrap();
    let assignment::Handout::Assignment(a) = assignment::for_claim(&env.state, &record, &c).await.unwrap() else {
        panic!("an untrusted run's job runs, without its secrets");
    };
    assert!(a.secrets.is_empty(), "{:?}", a.secrets);
    // The recovery path builds the same assignment.
    let req = Env::claim_request(&agent.1, "c1", 0);
    assert!(claim::claim(&env.state, &agent.0, &req).await.unwrap().unwrap().secrets.is_empty());
}

#[tokio::test]
async fn a_pull_request_submitted_with_the_admin_token_is_untrusted_and_gets_no_secrets() {
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    let r = env.state.store.get_repo("r").await.unwrap();
    env.state.store.put_secret(&r.id, "TOKEN", "s3cret").await.unwrap();
    let request =
        kiln_api::SubmitRun { commit_sha: "HEAD".into(), event: Some("pull_request".into()), ..Default::default() };
    let by = crate::auth::Principal::admin_file();
    let sub =
        crate::services::acceptance::Submission { repo: "r".into(), request, idempotency_key: None, by, trace: None };
    let run = crate::services::acceptance::submit(&env.state, sub).await.unwrap();
    assert_eq!(env.state.store.get_run(&run).await.unwrap().run.trust, "untrusted");
    env.relay().await;
    let agent = fork_box(&env, "pr-box").await;
    let a = env.claim_now(&agent, "c1").await.unwrap();
    assert!(a.secrets.is_empty(), "{:?}", a.secrets);
    assert!(!a.attempt_token.is_empty(), "every assignment carries its attempt token");
    assert!(env.state.agent_keys.holds_attempt(&a.attempt_token, &a.job_id, a.epoch));
    let reads = env.state.store.list_audit(None, 100).await.unwrap();
    assert!(reads.iter().all(|e| e.action != "secret.read"), "{reads:?}");
}

#[tokio::test]
async fn secrets_are_not_handed_to_agents_of_other_pools() {
    let env = Env::new().await;
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", WF)]).await;
    let r = env.state.store.get_repo("r").await.unwrap();
    env.state.store.put_secret(&r.id, "TOKEN", "s3cret").await.unwrap();
    env.submit("r").await;
    env.relay().await;
    // An agent that joined with a token of pool `forks`: the repository
    // hands its secrets to `default` only. The job waits (invariant 12),
    // it does not fail there.
    let a = fork_box(&env, "pr-box").await;
    env.state.live_agents.connect(&a.0, &a.1);
    assert!(env.claim_now(&a, "c1").await.is_none(), "nothing runs there");
    let run = env.state.store.list_runs(&r.id, None, 10).await.unwrap().remove(0);
    let view = env.state.store.get_run(&run.id).await.unwrap();
    let job = &view.jobs[0];
    assert_eq!(job.job.status, kiln_core::JobStatus::Ready, "it waits for an agent of an allowed pool");
    assert!(job.attempts.is_empty());
    assert!(env.state.store.list_audit(None, 100).await.unwrap().iter().all(|e| e.action != "secret.read"));
    let shown = crate::services::runs::get(&env.state, &run.id).await.unwrap();
    let why = shown.jobs[0].message.clone().unwrap_or_default();
    assert!(why.contains("hands secrets and identity tokens to (default)"), "{why}");

    // The same job on an agent of an allowed pool gets them, and the
    // handout is in the audit log.
    let change = kiln_api::UpdateRepo { secret_pools: Some(vec!["forks".into()]), ..Default::default() };
    crate::services::repos::update(&env.state, &crate::auth::Principal::admin_file(), "r", change).await.unwrap();
    let b = fork_box(&env, "pr-box-2").await;
    let got = env.claim_now(&b, "c2").await.expect("claimed");
    assert_eq!(got.secrets.get("TOKEN").map(String::as_str), Some("s3cret"));
    let audit = env.state.store.list_audit(None, 100).await.unwrap();
    let read = audit.iter().find(|e| e.action == "secret.read").expect("audited");
    assert_eq!((read.actor.as_str(), read.target.as_str()), (format!("agent:{}", b.0).as_str(), "r/TOKEN"));
}

/// `runs-on: {arch: amd64}` is claimed by an agent that says `x86_64` (and
/// `arm64` by `aarch64`), as the image resolver treats them; another
/// architecture is not (issue 40).
#[tokio::test]
async fn an_arch_label_matches_its_other_common_name() {
    let env = Env::new().await;
    let wf = "version: 1\njobs:\n  - name: a\n    runs-on: {arch: amd64}\n    steps: [echo a]\n  \
              - name: b\n    needs: []\n    runs-on: {arch: arm64}\n    steps: [echo b]\n";
    let _repo = env.repo("r", &[(".kiln/pipeline.yaml", wf)]).await;
    env.submit("r").await;
    env.relay().await;
    let x86 = env.state.store.register_agent("x86", r#"{"arch":"x86_64"}"#, 1).await.unwrap();
    let arm = env.state.store.register_agent("arm", r#"{"arch":"aarch64"}"#, 1).await.unwrap();
    let riscv = env.state.store.register_agent("rv", r#"{"arch":"riscv64"}"#, 1).await.unwrap();
    assert!(env.claim_now(&(riscv.id, riscv.session_id), "c0").await.is_none(), "another architecture");
    let a = env.claim_now(&(x86.id, x86.session_id), "c1").await.expect("amd64 on x86_64");
    let b = env.claim_now(&(arm.id, arm.session_id), "c2").await.expect("arm64 on aarch64");
    assert_eq!((a.job_name.as_str(), b.job_name.as_str()), ("a", "b"));
}

/// Issue 40, item 9: a job caching an absolute path (a directory only a
/// container can be given without writing into the agent's machine) is
/// placed like a job with `image:`: a host agent never gets it, a
/// container agent does.
#[tokio::test]
async fn a_job_caching_an_absolute_path_goes_only_to_a_container_agent() {
    let env = Env::new().await;
    let wf = "version: 1\njobs:\n  - name: build\n    cache: {kind: dependencies, version: \"1\", paths: [/root/.m2]}\n    steps:\n      - mvn -q package\n";
    let _repo = env.repo("m", &[(".kiln/pipeline.yaml", wf)]).await;
    env.submit("m").await;
    env.relay().await;
    let host = env.state.store.register_agent("host", "{}", 1).await.unwrap();
    assert!(env.claim_now(&(host.id, host.session_id), "h1").await.is_none(), "a host agent never gets it");
    let ctr = env.state.store.register_agent("ctr", "{}", 1).await.unwrap();
    env.state.store.set_agent_executor(&ctr.id, kiln_core::claim::Executor::Container).await.unwrap();
    let a = env.claim_now(&(ctr.id, ctr.session_id), "c1").await.expect("the container agent claims it");
    assert_eq!(a.job_name, "build");
}
