//! Acceptance: the trust decision, idempotency, and what refuses a run.

use super::env::{Env, workflow};
use crate::services::acceptance::{self, Submission};
use axum::http::StatusCode;
use kiln_api as api;
use kiln_core::Trust;

fn submission(repo: &str, commit: &str, key: Option<&[u8]>) -> Submission {
    Submission {
        repo: repo.into(),
        request: api::SubmitRun { commit_sha: commit.into(), ..Default::default() },
        idempotency_key: key.map(<[u8]>::to_vec),
        by: crate::auth::Principal::admin_file(),
        trace: None,
    }
}

#[tokio::test]
async fn an_api_run_is_frozen_trusted_at_the_resolved_sha() {
    let env = Env::new().await;
    let repo = env.pipeline("r", &["build"]).await;
    let sha = repo.head().unwrap();
    let id = acceptance::submit(&env.state, submission("r", "main", None)).await.unwrap();
    let run = env.state.store.get_run(&id).await.unwrap().run;
    assert_eq!(run.trust, "trusted");
    assert_eq!(run.commit_sha, sha);
    assert_eq!(
        run.git_ref.as_deref(),
        Some("refs/heads/main"),
        "a short name is stored as the full ref it resolved to"
    );
    assert_eq!(run.event, "manual");
}

#[tokio::test]
async fn the_same_idempotency_key_returns_the_same_run_and_a_different_body_is_refused() {
    let env = Env::new().await;
    let repo = env.pipeline("r", &["build"]).await;
    let first = acceptance::submit(&env.state, submission("r", "HEAD", Some(b"k1"))).await.unwrap();
    // The branch moves; a redelivery of the same request still names the first run.
    repo.commit(&[("README", "moved")], "move").unwrap();
    let again = acceptance::submit(&env.state, submission("r", "HEAD", Some(b"k1"))).await.unwrap();
    assert_eq!(again, first);
    let other = acceptance::submit(&env.state, submission("r", "main", Some(b"k1"))).await.unwrap_err();
    assert_eq!((other.status, other.code), (StatusCode::CONFLICT, api::codes::IDEMPOTENCY_MISMATCH));
    let fresh = acceptance::submit(&env.state, submission("r", "HEAD", Some(b"k2"))).await.unwrap();
    assert_ne!(fresh, first);
}

#[tokio::test]
async fn malformed_idempotency_keys_are_bad_requests() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let long = vec![b'k'; 201];
    for key in [&b""[..], &long[..], "clé".as_bytes()] {
        let e = acceptance::submit(&env.state, submission("r", "HEAD", Some(key))).await.unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{key:?}: {}", e.message);
    }
}

#[tokio::test]
async fn what_refuses_a_run() {
    let env = Env::new().await;
    let _repo = env.pipeline("r", &["build"]).await;
    let secret_wf = "version: 1\njobs:\n  - name: deploy\n    secrets: [TOKEN, API_KEY]\n    steps:\n      - echo hi\n";
    let _repo = env.repo("s", &[(".kiln/pipeline.yaml", secret_wf)]).await;
    let _repo = env.repo("bad", &[(".kiln/pipeline.yaml", "version: 1\njobs: 3\n")]).await;

    let e = acceptance::submit(&env.state, submission("nope", "HEAD", None)).await.unwrap_err();
    assert_eq!(e.status, StatusCode::NOT_FOUND);
    let e = acceptance::submit(&env.state, submission("r", "no-such-branch", None)).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", e.message);
    let e = acceptance::submit(&env.state, submission("bad", "HEAD", None)).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(e.message.contains("is not a valid workflow"), "{}", e.message);
    let mut sub = submission("r", "HEAD", None);
    sub.request.event = Some("tag".into());
    let e = acceptance::submit(&env.state, sub).await.unwrap_err();
    assert_eq!((e.status, e.message.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "unknown event `tag`"));
    let mut sub = submission("r", "HEAD", None);
    sub.request.workflow_path = Some(".kiln/other.yaml".into());
    let e = acceptance::submit(&env.state, sub).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Missing secrets are named, sorted, with what to do.
    let e = acceptance::submit(&env.state, submission("s", "HEAD", None)).await.unwrap_err();
    assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        e.message.contains("does not have: API_KEY, TOKEN; add them with `kiln secret set s NAME`"),
        "{}",
        e.message
    );
    let repo = env.state.store.get_repo("s").await.unwrap();
    env.state.store.put_secret(&repo.id, "TOKEN", "t").await.unwrap();
    env.state.store.put_secret(&repo.id, "API_KEY", "k").await.unwrap();
    acceptance::submit(&env.state, submission("s", "HEAD", None)).await.unwrap();
}

#[tokio::test]
async fn a_retry_keeps_the_frozen_run_and_its_trust() {
    let env = Env::new().await;
    let repo = env.pipeline("r", &["build"]).await;
    let parent = env.submit("r").await;
    repo.commit(&[(".kiln/pipeline.yaml", &workflow(&["other"]))], "change the pipeline").unwrap();
    let child = acceptance::retry(&env.state, &crate::auth::Principal::admin_file(), &parent, false).await.unwrap();
    let (p, c) = (env.state.store.get_run(&parent).await.unwrap(), env.state.store.get_run(&child).await.unwrap());
    assert_eq!(c.run.parent_run_id.as_deref(), Some(parent.as_str()));
    assert_eq!((c.run.commit_sha, c.run.workflow_hash), (p.run.commit_sha, p.run.workflow_hash));
    assert_eq!(c.jobs.iter().map(|j| j.job.name.as_str()).collect::<Vec<_>>(), ["build"]);
    assert_eq!((c.run.event.as_str(), c.run.trust.as_str()), ("retry", "trusted"));
    let e =
        acceptance::retry(&env.state, &crate::auth::Principal::admin_file(), "no-such-run", false).await.unwrap_err();
    assert_eq!(e.status, StatusCode::NOT_FOUND);
}

#[test]
fn the_concurrency_group_is_rendered_for_the_trigger() {
    let wf = kiln_workflow::parse(
        "version: 1\nconcurrency:\n  group: deploy-${{ branch }}\n  cancel-in-progress: true\njobs:\n  - name: a\n    steps:\n      - echo\n",
    )
    .unwrap();
    let c = acceptance::run_concurrency(&wf, "push", Some("refs/heads/main"), &Default::default(), &Default::default())
        .unwrap()
        .unwrap();
    assert_eq!((c.group.as_str(), c.cancel_in_progress), ("deploy-main", true));
    let plain = kiln_workflow::parse(&workflow(&["a"])).unwrap();
    assert!(
        acceptance::run_concurrency(&plain, "push", None, &Default::default(), &Default::default()).unwrap().is_none()
    );
}

fn git_in(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git").args(args).current_dir(dir).output().expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Issue 39: someone who can push a tag (a fork's author cannot, but a
/// contributor without rights to `main` may) makes a tag named `main` at
/// their own commit. A trusted run of `main` runs the branch, not the tag,
/// and its ref (what the identity token's `sub` says) is `refs/heads/main`;
/// a name that is only a tag runs the tag, and says so.
#[tokio::test]
async fn a_branch_name_runs_the_branch_not_a_tag_that_shadows_it() {
    let env = Env::new().await;
    let repo = env.pipeline("r", &["build"]).await;
    let main = repo.head().unwrap();
    let other = repo.commit(&[("evil.sh", "steal")], "not main").unwrap();
    git_in(repo.path(), &["tag", "main", &other]);
    git_in(repo.path(), &["tag", "v1", &other]);
    git_in(repo.path(), &["reset", "-q", "--hard", &main]);
    let id = acceptance::submit(&env.state, submission("r", "main", None)).await.unwrap();
    let run = env.state.store.get_run(&id).await.unwrap().run;
    assert_eq!((run.commit_sha.as_str(), run.git_ref.as_deref()), (main.as_str(), Some("refs/heads/main")));
    let id = acceptance::submit(&env.state, submission("r", "v1", None)).await.unwrap();
    let run = env.state.store.get_run(&id).await.unwrap().run;
    assert_eq!((run.commit_sha.as_str(), run.git_ref.as_deref()), (other.as_str(), Some("refs/tags/v1")));
}

/// Issue 39: a pull request's head (a fork's code, fetched into the mirror
/// when the pull request was planned) named by a caller who may start
/// trusted runs runs untrusted: it is not the repository's own code.
#[tokio::test]
async fn a_pull_request_head_never_runs_trusted_from_the_api() {
    let env = Env::new().await;
    let repo = env.pipeline("r", &["build"]).await;
    let main = repo.head().unwrap();
    let fork = repo.commit(&[("evil.sh", "steal")], "from a fork").unwrap();
    git_in(repo.path(), &["update-ref", "refs/pull/7/head", &fork]);
    git_in(repo.path(), &["reset", "-q", "--hard", &main]);
    let r = env.state.store.get_repo("r").await.unwrap();
    env.state.mirrors.fetch_ref(&r.id, &crate::git::Remote::new(&r.clone_url, None), "refs/pull/7/head").await.unwrap();
    let id = acceptance::submit(&env.state, submission("r", "refs/pull/7/head", None)).await.unwrap();
    let run = env.state.store.get_run(&id).await.unwrap().run;
    assert_eq!(run.commit_sha, fork);
    assert_eq!(run.trust, "untrusted", "a fork's commit ran trusted from the API");
    let id = acceptance::submit(&env.state, submission("r", &fork, None)).await;
    // A bare commit id is the caller's choice of commit; only refs are judged.
    assert!(id.is_ok());
}

/// Issue 40, item 8: one door. Every trigger kind freezes through the same
/// checks: a trusted run asking for secrets the repository lacks is
/// refused naming them, a definition past the stored limit is refused,
/// whatever asked for it (the schedule path skipped both before); an
/// untrusted run is not told which secrets exist.
#[tokio::test]
async fn every_trigger_is_refused_by_the_same_checks() {
    use crate::services::acceptance::{Freeze, freeze};
    use kiln_core::acceptance::TriggerKind;
    use kiln_core::trust::{PullRequestTrust, TrustTrigger};
    let env = Env::new().await;
    let secret_wf = "version: 1\njobs:\n  - name: deploy\n    secrets: [TOKEN]\n    steps:\n      - echo hi\n";
    let repo = env.repo("s", &[(".kiln/pipeline.yaml", secret_wf)]).await;
    let sha = repo.head().unwrap();
    let record = env.state.store.get_repo("s").await.unwrap();
    let parse = |y: &str| kiln_workflow::parse(y).unwrap();
    let step = format!("      - echo {}\n", "x".repeat(4000));
    // Under the file limit, past the stored one once its matrix expands.
    let big =
        format!("version: 1\njobs:\n  - name: big\n    matrix: {{n: [1, 2, 3, 4]}}\n    steps:\n{}", step.repeat(50));
    let trusted = |kind| match kind {
        TriggerKind::Api => {
            (TrustTrigger::Api { event: "manual", may_start_trusted: true, git_ref: Some("refs/heads/main") }, "manual")
        }
        TriggerKind::Retry => (TrustTrigger::Retry { parent: Trust::Trusted, may_start_trusted: true }, "retry"),
        TriggerKind::Push => {
            (TrustTrigger::Push { git_ref: "refs/heads/main", default_branch: "main", protected: false }, "push")
        }
        TriggerKind::PullRequest => (
            TrustTrigger::PullRequest {
                fork: false,
                author_write_access: Some(true),
                policy: PullRequestTrust::WriteAccess,
            },
            "pull_request",
        ),
        TriggerKind::Schedule => (TrustTrigger::Schedule, "schedule"),
    };
    let ask = |kind, trust, event: &str, yaml: &str| Freeze {
        kind,
        trust,
        repo: &record,
        commit_sha: sha.clone(),
        git_ref: Some("refs/heads/main".into()),
        event: event.into(),
        workflow_path: ".kiln/pipeline.yaml".into(),
        workflow: parse(yaml),
        inputs: Default::default(),
        image_digests: Default::default(),
        idempotency: None,
        parent_run_id: None,
        actor: "test".into(),
        report_context: None,
        pin_succeeded: false,
        rerun_jobs: Vec::new(),
        trace: None,
        pull_request_title: None,
        priority: None,
        audit: None,
        rollback: None,
    };
    for kind in TriggerKind::ALL {
        let (trust, event) = trusted(kind);
        let e = freeze(&env.state, ask(kind, trust, event, secret_wf)).await.err().unwrap();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{kind:?}: {}", e.message);
        assert!(e.message.contains("does not have: TOKEN"), "{kind:?}: {}", e.message);
        let e = freeze(&env.state, ask(kind, trust, event, &big)).await.err().unwrap();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{kind:?}: {}", e.message);
        assert!(e.message.contains("KiB definition"), "{kind:?}: {}", e.message);
    }
    assert!(env.state.store.list_runs(&record.id, None, 10).await.unwrap().is_empty(), "nothing was stored");

    // A fork's pull request runs untrusted: no secrets, and no word on
    // which exist.
    let fork = TrustTrigger::PullRequest { fork: true, author_write_access: None, policy: PullRequestTrust::SameRepo };
    let f = freeze(&env.state, ask(TriggerKind::PullRequest, fork, "pull_request", secret_wf)).await.unwrap();
    assert_eq!(f.trust, Trust::Untrusted);
    // With the secret set, every trusted trigger is accepted trusted.
    env.state.store.put_secret(&record.id, "TOKEN", "t").await.unwrap();
    for kind in TriggerKind::ALL {
        let (trust, event) = trusted(kind);
        let f = freeze(&env.state, ask(kind, trust, event, secret_wf)).await.unwrap();
        assert_eq!(f.trust, Trust::Trusted, "{kind:?}");
    }
}
