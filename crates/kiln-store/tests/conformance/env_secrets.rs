//! Environment secrets and the provenance gate (issue 46).
//!
//! An environment's secrets are stored as the server sealed them, listed
//! by name only, resealed with every other secret (under `env:NAME`) and
//! removed with their environment. A deploy job of an environment with a
//! `--require-provenance` policy starts only if every artifact it restores
//! has a statement that verifies and satisfies the policy; otherwise it is
//! cancelled naming the failed check and the artifact (another ref, an
//! untrusted run), and its run fails.

use super::*;
use kiln_core::RunStatus;

fn wf(yaml: &str) -> Workflow {
    kiln_workflow::parse(yaml).unwrap_or_else(|d| panic!("workflow does not parse:\n{d}"))
}

fn env(name: &str, policy: Option<&str>) -> EnvironmentRecord {
    EnvironmentRecord {
        name: name.into(),
        approval_ttl_ms: 30 * 86_400_000,
        require_provenance: policy.map(Into::into),
        ..Default::default()
    }
}

pub async fn environment_secrets_are_listed_by_name_resealed_and_removed_with_their_environment<S: Store + 'static>(
    o: &Opener<S>,
) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    assert!(matches!(s.put_env_secret("staging", "TOKEN", "sealed-1").await, Err(StoreError::NotFound(_))));
    s.put_environment(&env("staging", None), true).await.unwrap();
    s.put_environment(&env("production", None), true).await.unwrap();
    s.put_env_secret("staging", "TOKEN", "sealed-1").await.unwrap();
    s.put_env_secret("staging", "DB", "sealed-db").await.unwrap();
    s.put_env_secret("staging", "TOKEN", "sealed-2").await.unwrap();
    s.put_env_secret("production", "TOKEN", "sealed-prod").await.unwrap();
    let names: Vec<String> = s.list_env_secrets("staging").await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["DB", "TOKEN"]);
    let want = ["TOKEN".to_string(), "MISSING".to_string()];
    assert_eq!(
        s.env_secret_values("staging", &want).await.unwrap(),
        BTreeMap::from([("TOKEN".to_string(), "sealed-2".to_string())]),
        "only the named ones that exist, the newest value"
    );
    assert_eq!(
        s.env_secret_values("production", &want).await.unwrap()["TOKEN"],
        "sealed-prod",
        "each environment its own"
    );
    // Listed for resealing under `env:NAME`, and resealed with the rest.
    let all = s.all_secrets().await.unwrap();
    let scope = kiln_store::env_secret_scope("staging");
    assert!(all.contains(&(scope.clone(), "TOKEN".into(), "sealed-2".into())), "{all:?}");
    let stale = vec![(scope.clone(), "TOKEN".to_string(), "sealed-1".to_string(), "x".to_string())];
    assert!(matches!(s.replace_secrets(&stale).await, Err(StoreError::Conflict(_))));
    let fresh = vec![(scope.clone(), "TOKEN".to_string(), "sealed-2".to_string(), "sealed-3".to_string())];
    assert_eq!(s.replace_secrets(&fresh).await.unwrap(), 1);
    assert_eq!(s.env_secret_values("staging", &want).await.unwrap()["TOKEN"], "sealed-3");
    assert_eq!(s.env_secret_values("production", &want).await.unwrap()["TOKEN"], "sealed-prod");
    // Deleted one by one, and with their environment.
    assert!(s.delete_env_secret("staging", "DB").await.unwrap());
    assert!(!s.delete_env_secret("staging", "DB").await.unwrap());
    s.delete_environment("staging").await.unwrap();
    assert!(s.all_secrets().await.unwrap().iter().all(|(scope_, _, _)| *scope_ != scope));
    s.put_environment(&env("staging", None), true).await.unwrap();
    assert!(s.list_env_secrets("staging").await.unwrap().is_empty(), "a new environment of the name has none");
    assert_eq!(s.list_env_secrets("production").await.unwrap().len(), 1);
}

const DEPLOY: &str = "version: 1
jobs:
  - name: build
    steps: [x]
    artifacts:
      publish:
        - {name: app, path: out/app}
  - name: deploy
    needs: build
    environment: production
    artifacts:
      restore:
        - {from_job: build, name: app, path: app}
    steps: [x]
";

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A run of [`DEPLOY`] from `git_ref` whose build bound `app`: its id and
/// the generation.
async fn built<S: Store>(s: &S, repo: &RepoRecord, git_ref: &str) -> (String, String) {
    built_as(s, repo, git_ref, "trusted").await
}

async fn built_as<S: Store>(s: &S, repo: &RepoRecord, git_ref: &str, trust: &str) -> (String, String) {
    let run = NewRun { git_ref: Some(git_ref.into()), trust: trust.into(), ..new_run(&repo.id, wf(DEPLOY)) };
    let run = s.accept_run(run).await.unwrap().run_id;
    let a = agent(s, &format!("a-{}", uuid::Uuid::new_v4().simple()), 4).await;
    let build = job_id(s, &run, "build").await;
    // This agent (default pool, host executor) may run untrusted code too.
    let mut input = claim_input(&a, &build, s.get_job(&build).await.unwrap().dispatch_generation, LONG_TTL);
    input.untrusted = kiln_core::claim::UntrustedPolicy { pools: vec!["default".into()], host_executor: true };
    s.claim(input).await.unwrap().expect("the build is claimed");
    let g = s.create_generation(&build, 1, "app", 10, SHA, 10).await.unwrap();
    s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    (run, g.id)
}

pub async fn a_deploy_job_restoring_an_artifact_its_environment_refuses_is_cancelled_naming_the_check<
    S: Store + 'static,
>(
    o: &Opener<S>,
) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    assert!(
        matches!(s.put_environment(&env("production", Some("signed")), true).await, Err(StoreError::Invalid(_))),
        "a policy that does not parse is refused"
    );
    let policy = format!("trusted,repo={},ref=refs/heads/main", r.name);
    s.put_environment(&env("production", Some(&policy)), true).await.unwrap();
    assert_eq!(s.get_environment("production").await.unwrap().require_provenance.as_deref(), Some(policy.as_str()));

    // Built from a feature branch: the deploy never starts, the run fails.
    let (run, generation) = built(s, &r, "refs/heads/feature").await;
    let v = view(s, &run).await;
    let deploy = jv(&v, "deploy");
    assert_eq!(deploy.job.status, JobStatus::Cancelled, "{:?}", deploy.job);
    let msg = deploy.job.message.clone().unwrap_or_default();
    assert!(
        msg.contains(&format!("provenance check `ref` failed for artifact `app` (generation {generation})"))
            && msg.contains("refs/heads/feature")
            && msg.contains("refs/heads/main"),
        "{msg}"
    );
    assert_eq!(v.run.status, RunStatus::Failed);
    assert!(deploy.attempts.is_empty(), "it never ran");

    // What a promotion or rollback asks: the same refusal, by its check.
    let art = |run_id: &str, generation: &str| DeployedArtifact {
        name: "app".into(),
        from_job: "build".into(),
        run_id: run_id.into(),
        generation: generation.into(),
        sha256: SHA.into(),
    };
    let refusal = s.provenance_refusal("production", &[art(&run, &generation)]).await.unwrap().expect("refused");
    assert_eq!((refusal.check, refusal.generation.as_str()), ("ref", generation.as_str()));
    let none = s.provenance_refusal("production", &[art(&run, "no-such-generation")]).await.unwrap().unwrap();
    assert_eq!(none.check, "provenance", "no statement: refused");

    // Built from main by an untrusted run (a fork's pull request): refused by `trusted`.
    let (untrusted, _) = built_as(s, &r, "refs/heads/main", "untrusted").await;
    let v = view(s, &untrusted).await;
    let deploy = jv(&v, "deploy");
    let msg = deploy.job.message.clone().unwrap_or_default();
    assert_eq!(deploy.job.status, JobStatus::Cancelled, "{msg}");
    assert!(msg.contains("provenance check `trusted` failed for artifact `app`"), "{msg}");
    assert_eq!(v.run.status, RunStatus::Failed);

    // Built from main: the deploy is ready to run.
    let (main, main_gen) = built(s, &r, "refs/heads/main").await;
    assert_eq!(jv(&view(s, &main).await, "deploy").job.status, JobStatus::Ready);
    assert_eq!(s.provenance_refusal("production", &[art(&main, &main_gen)]).await.unwrap(), None);

    // Another environment's policy names another repository: refused by `repo`.
    s.put_environment(&env("staging", Some("repo=elsewhere")), true).await.unwrap();
    let r2 = s.provenance_refusal("staging", &[art(&main, &main_gen)]).await.unwrap().unwrap();
    assert_eq!(r2.check, "repo", "{r2}");
    // No policy: nothing is checked.
    s.put_environment(&env("staging", None), false).await.unwrap();
    assert_eq!(s.provenance_refusal("staging", &[art(&run, &generation)]).await.unwrap(), None);
    // Main's deploy runs; then, the policy cleared, a feature build deploys.
    let a = agent(s, "deployer", 4).await;
    let d = job_id(s, &main, "deploy").await;
    claim(s, &a, &d, LONG_TTL).await;
    assert_eq!(s.complete(&d, 1, success()).await.unwrap(), "success");
    s.put_environment(&env("production", None), false).await.unwrap();
    let (feature2, _) = built(s, &r, "refs/heads/feature").await;
    assert_eq!(jv(&view(s, &feature2).await, "deploy").job.status, JobStatus::Ready);
}
