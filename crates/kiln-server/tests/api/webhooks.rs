//! The forge loop through the router (issue 14): signed deliveries in the
//! forges' documented formats (fixtures in `crates/kiln-forge/tests/fixtures`,
//! patched to this test's commits), planning into runs, commit statuses
//! received by a fake forge whose endpoints follow each forge's REST docs,
//! schedules with an injected clock, and reconciliation by polling.

use super::{get_run, register};
use axum::http::StatusCode;
use kiln_api as api;
use kiln_forge::Forge;
use kiln_forge::fake::FakeForge;
use kiln_testkit::{TestApp, TestRepo};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

const SECRET: &str = "a-webhook-secret-of-some-length";
const TOKEN: &str = "forge-token-123";

/// Build everything: `ci.yaml` runs on pushes to main and tags v*, and on
/// pull requests to main; `docs.yaml` only on branch pushes touching docs/
const CI: &str = "version: 1
on:
  push:
    branches: [main]
    tags: ['v*']
  pull_request:
    branches: [main]
jobs:
  - name: build
    secrets: [DEPLOY_KEY]
    steps: [echo build]
";
const DOCS: &str = "version: 1
on:
  push:
    branches: ['**']
    paths: ['docs/**']
jobs:
  - name: docs
    steps: [echo docs]
";

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn fixture(path: &str) -> Value {
    let p = format!("{}/../kiln-forge/tests/fixtures/{path}", manifest_dir());
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("fixture json")
}

struct Env {
    app: TestApp,
    forge: FakeForge,
    repo: TestRepo,
    kind: Forge,
}

/// A repository holding `files`, connected to a fake `kind` forge.
async fn connected(kind: Forge, files: &[(&str, &str)]) -> Env {
    // Its agents (default pool, host executor) also claim the untrusted runs
    // deliveries start (these tests are about triggers and trust, not
    // placement): the unsafe opt-in lets them.
    let app = TestApp::with_config(|c| {
        c.untrusted = kiln_core::claim::UntrustedPolicy { pools: vec!["default".into()], host_executor: true }
    })
    .await;
    let forge = FakeForge::start(TOKEN).await;
    let repo = TestRepo::new(files).unwrap();
    let body = json!({
        "name": "r",
        "clone_url": repo.path().display().to_string(),
        "webhook_secret": SECRET,
        "forge": kind.as_str(),
        "forge_url": forge.url(),
        "forge_repo": "acme/widget",
        "forge_token": TOKEN,
    });
    let created: api::Repo =
        app.admin().post("/v1/repos").json(&body).send().await.assert_status(StatusCode::CREATED).json();
    assert!(created.webhook_secret_set && created.forge_token_set);
    let text = app.admin().get("/v1/repos/r").send().await.text();
    assert!(!text.contains(SECRET) && !text.contains(TOKEN), "secrets are never shown: {text}");
    app.admin()
        .put("/v1/repos/r/secrets/DEPLOY_KEY")
        .json(&json!({ "value": "s3cr3t-deploy-key" }))
        .send()
        .await
        .assert_status(StatusCode::OK);
    Env { app, forge, repo, kind }
}

/// A push payload in `kind`'s format for `git_ref` from `before` to `after`.
fn push_payload(kind: Forge, git_ref: &str, before: &str, after: &str) -> Value {
    let mut v = match kind {
        Forge::Github => fixture("github/push_branch.json"),
        Forge::Gitlab => fixture("gitlab/push_branch.json"),
        Forge::Gitea => fixture("gitea/push_branch.json"),
    };
    v["ref"] = json!(git_ref);
    v["before"] = json!(before);
    v["after"] = json!(after);
    if kind == Forge::Gitlab {
        v["checkout_sha"] = json!(after);
        v["total_commits_count"] = json!(0);
    }
    if let Some(c) = v.get_mut("commits") {
        *c = json!([]);
    }
    if kind == Forge::Gitea {
        v["total_commits"] = json!(0);
    }
    bound(kind, v)
}

/// `v` naming the connected repository, `acme/widget` (the fixtures name
/// the forges' documentation examples; a delivery is bound to its
/// repository).
fn bound(kind: Forge, mut v: Value) -> Value {
    match kind {
        Forge::Github | Forge::Gitea => {
            if v.get("repository").is_some_and(Value::is_object) {
                v["repository"]["full_name"] = json!("acme/widget");
            }
        }
        Forge::Gitlab => {
            if v.get("project").is_some_and(Value::is_object) {
                v["project"]["path_with_namespace"] = json!("acme/widget");
            }
        }
    }
    v
}

fn push_event(kind: Forge) -> &'static str {
    match kind {
        Forge::Github | Forge::Gitea => "push",
        Forge::Gitlab => "Push Hook",
    }
}

/// Send `body` as a delivery of `event` with id `id`, signed with `secret`.
async fn deliver_with(
    env: &Env,
    event: &str,
    id: &str,
    body: &[u8],
    secret: Option<&str>,
) -> kiln_testkit::TestResponse {
    let (event_h, id_h) = match env.kind {
        Forge::Github => ("X-GitHub-Event", "X-GitHub-Delivery"),
        Forge::Gitlab => ("X-Gitlab-Event", "X-Gitlab-Event-UUID"),
        Forge::Gitea => ("X-Gitea-Event", "X-Gitea-Delivery"),
    };
    let mut req = env
        .app
        .anonymous()
        .post(&format!("/v1/repos/r/webhooks/{}", env.kind.as_str()))
        .header("content-type", "application/json")
        .header(event_h, event)
        .header(id_h, id)
        .body(body.to_vec());
    if let Some(secret) = secret {
        let (name, value) = kiln_forge::sign(env.kind, secret.as_bytes(), body);
        req = req.header(name, &value);
    }
    req.send().await
}

async fn deliver(env: &Env, event: &str, id: &str, body: &Value) -> kiln_testkit::TestResponse {
    let body = bound(env.kind, body.clone());
    deliver_with(env, event, id, &serde_json::to_vec(&body).unwrap(), Some(SECRET)).await
}

async fn runs(app: &TestApp) -> Vec<api::RunSummary> {
    let list: api::RunList = app.admin().get("/v1/repos/r/workflow-runs").send().await.json();
    list.runs
}

/// Claim and finish every job that can run, with `outcome`.
async fn finish_all(app: &TestApp, outcome: &str) -> Vec<api::Assignment> {
    let agent = register(app, "worker", 8).await;
    let mut handed = Vec::new();
    for i in 0..50 {
        app.run_pending_work().await;
        let Some(a) = super::claim(app, &agent, &format!("c{i}-{}", uuid_like())).await else { break };
        super::complete(app, &a, outcome).await.assert_status(StatusCode::OK);
        handed.push(a);
    }
    app.run_pending_work().await;
    handed
}

/// The states the forge received for `context`, in order.
fn states(forge: &FakeForge, context: &str) -> Vec<String> {
    forge.statuses().into_iter().filter(|s| s.context == context).map(|s| s.state).collect()
}

/// A signed push to main starts one run per matching workflow at the
/// payload's `after`, with event, ref, actor and trust recorded; the forge
/// sees pending then the result, each with a link to the run; a
/// redelivery answers with the same run and creates nothing.
async fn push_runs_and_reports(kind: Forge) {
    let env = connected(kind, &[(".kiln/ci.yaml", CI), (".kiln/docs.yaml", DOCS), ("src/a.rs", "1")]).await;
    let before = env.repo.head().unwrap();
    let after = env.repo.commit(&[("src/a.rs", "2")], "change src").unwrap();
    let payload = push_payload(kind, "refs/heads/main", &before, &after);
    let res = deliver(&env, push_event(kind), "d-1", &payload).await.assert_status(StatusCode::ACCEPTED);
    let ack: api::WebhookAck = res.json();
    assert_eq!(ack.status, "pending");
    assert!(!ack.duplicate);
    env.app.run_pending_work().await;

    let list = runs(&env.app).await;
    assert_eq!(list.len(), 1, "only ci.yaml matches (docs.yaml wants docs/**): {list:?}");
    let run = get_run(&env.app, &list[0].id).await;
    assert_eq!(run.commit_sha, after);
    assert_eq!(run.event, "push");
    assert_eq!(run.git_ref.as_deref(), Some("refs/heads/main"));
    assert_eq!(run.trust, "trusted");
    assert_eq!(run.workflow_path, ".kiln/ci.yaml");
    assert!(run.actor.is_some());

    // Redelivery: the same run, nothing new.
    let again: api::WebhookAck =
        deliver(&env, push_event(kind), "d-1", &payload).await.assert_status(StatusCode::OK).json();
    assert!(again.duplicate);
    assert_eq!(again.runs, vec![run.id.clone()]);
    env.app.run_pending_work().await;
    assert_eq!(runs(&env.app).await.len(), 1);

    let handed = finish_all(&env.app, "success").await;
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].secrets.get("DEPLOY_KEY").map(String::as_str), Some("s3cr3t-deploy-key"));
    let got = states(&env.forge, "kiln/ci (push)");
    let (pending, success) = match kind {
        Forge::Gitlab => ("pending", "success"),
        _ => ("pending", "success"),
    };
    assert_eq!(got.first().map(String::as_str), Some(pending), "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some(success), "{got:?}");
    let all = env.forge.statuses();
    assert!(all.iter().all(|s| s.sha == after && s.repo == "acme/widget"), "{all:?}");
    let link = format!("http://kiln.test/#/runs/{}", run.id);
    assert!(all.iter().all(|s| s.target_url.as_deref() == Some(link.as_str())), "{all:?}");
    let d: Value = env.app.admin().get("/v1/repos/r/deliveries").send().await.json();
    assert_eq!(d["deliveries"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["deliveries"][0]["status"], "planned");
}

#[tokio::test]
async fn github_push_starts_matching_runs_and_reports_statuses() {
    push_runs_and_reports(Forge::Github).await;
}

#[tokio::test]
async fn gitlab_push_starts_matching_runs_and_reports_statuses() {
    push_runs_and_reports(Forge::Gitlab).await;
}

#[tokio::test]
async fn gitea_push_starts_matching_runs_and_reports_statuses() {
    push_runs_and_reports(Forge::Gitea).await;
}

/// A failed run ends as the forge's own word for failure.
#[tokio::test]
async fn a_failed_run_reports_failure_in_each_forges_words() {
    for (kind, word) in [(Forge::Github, "failure"), (Forge::Gitlab, "failed"), (Forge::Gitea, "failure")] {
        let env = connected(kind, &[(".kiln/ci.yaml", CI)]).await;
        let sha = env.repo.head().unwrap();
        let payload = push_payload(kind, "refs/heads/main", &"0".repeat(40), &sha);
        deliver(&env, push_event(kind), "f-1", &payload).await.assert_status(StatusCode::ACCEPTED);
        finish_all(&env.app, "failed").await;
        let got = states(&env.forge, "kiln/ci (push)");
        assert_eq!(got.last().map(String::as_str), Some(word), "{kind}: {got:?}");
    }
}

/// Tampered body, wrong secret, missing signature: 401 and nothing stored.
#[tokio::test]
async fn forged_deliveries_are_refused_and_leave_nothing() {
    for kind in [Forge::Github, Forge::Gitlab, Forge::Gitea] {
        let env = connected(kind, &[(".kiln/ci.yaml", CI)]).await;
        let sha = env.repo.head().unwrap();
        let body = serde_json::to_vec(&push_payload(kind, "refs/heads/main", &"0".repeat(40), &sha)).unwrap();
        let ev = push_event(kind);
        deliver_with(&env, ev, "x1", &body, Some("not-the-secret-at-all"))
            .await
            .assert_status(StatusCode::UNAUTHORIZED);
        deliver_with(&env, ev, "x2", &body, None).await.assert_status(StatusCode::UNAUTHORIZED);
        // Signed, then one byte changed.
        let (name, value) = kiln_forge::sign(kind, SECRET.as_bytes(), &body);
        let mut tampered = body.clone();
        let at = tampered.iter().position(|b| *b == b'm').unwrap();
        tampered[at] = b'n';
        let (event_h, id_h) = match kind {
            Forge::Github => ("X-GitHub-Event", "X-GitHub-Delivery"),
            Forge::Gitlab => ("X-Gitlab-Event", "X-Gitlab-Event-UUID"),
            Forge::Gitea => ("X-Gitea-Event", "X-Gitea-Delivery"),
        };
        if kind != Forge::Gitlab {
            // (GitLab's token does not cover the body.)
            env.app
                .anonymous()
                .post(&format!("/v1/repos/r/webhooks/{}", kind.as_str()))
                .header(event_h, ev)
                .header(id_h, "x3")
                .header(name, &value)
                .body(tampered)
                .send()
                .await
                .assert_status(StatusCode::UNAUTHORIZED);
        }
        // A bearer token is no substitute for the forge's signature.
        env.app
            .admin()
            .post(&format!("/v1/repos/r/webhooks/{}", kind.as_str()))
            .header(event_h, ev)
            .header(id_h, "x4")
            .body(body.clone())
            .send()
            .await
            .assert_status(StatusCode::UNAUTHORIZED);
        env.app.run_pending_work().await;
        let d: Value = env.app.admin().get("/v1/repos/r/deliveries").send().await.json();
        assert_eq!(d["deliveries"].as_array().unwrap().len(), 0, "{kind}: {d}");
        assert!(runs(&env.app).await.is_empty());
        assert!(env.forge.statuses().is_empty());
        let metrics = env.app.admin().get("/metrics").send().await.text();
        assert!(metrics.contains("kiln_webhook_deliveries_total{outcome=\"bad_signature\"} "), "{metrics}");
        assert!(!metrics.contains("kiln_webhook_deliveries_total{outcome=\"bad_signature\"} 0\n"), "{metrics}");
    }
}

/// Unknown repository 401 (as a bad signature: no oracle); unknown forge
/// 404; malformed JSON 400 (signed); unsupported event 202 "ignored" and
/// recorded; ping answered; oversized body 413; a repository without a
/// webhook secret refuses every delivery.
#[tokio::test]
async fn bad_input_gets_a_clear_answer() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let post = |path: &str| env.app.anonymous().post(path);
    post("/v1/repos/nope/webhooks/github").body("{}").send().await.assert_status(StatusCode::UNAUTHORIZED);
    post("/v1/repos/r/webhooks/bitbucket").body("{}").send().await.assert_status(StatusCode::NOT_FOUND);
    let res = deliver_with(&env, "push", "m1", b"{not json", Some(SECRET)).await;
    res.assert_status(StatusCode::BAD_REQUEST);
    let ignored: api::WebhookAck =
        deliver(&env, "issues", "i1", &json!({"action": "opened"})).await.assert_status(StatusCode::ACCEPTED).json();
    assert_eq!(ignored.status, "ignored");
    let ping: api::WebhookAck =
        deliver(&env, "ping", "p1", &fixture("github/ping.json")).await.assert_status(StatusCode::ACCEPTED).json();
    assert_eq!(ping.status, "ignored");
    let big = vec![b' '; kiln_forge::MAX_BODY_BYTES + 1];
    post("/v1/repos/r/webhooks/github").body(big).send().await.assert_status(StatusCode::PAYLOAD_TOO_LARGE);
    let d: Value = env.app.admin().get("/v1/repos/r/deliveries").send().await.json();
    let statuses: Vec<&str> =
        d["deliveries"].as_array().unwrap().iter().map(|x| x["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, vec!["ignored", "ignored"], "{d}");
    assert!(runs(&env.app).await.is_empty());

    // No secret: nothing can be verified, so nothing is accepted.
    let plain = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    env.app.add_repo("plain", &plain).await;
    let body =
        serde_json::to_vec(&push_payload(Forge::Github, "refs/heads/main", &"0".repeat(40), &plain.head().unwrap()))
            .unwrap();
    let (name, value) = kiln_forge::sign(Forge::Github, b"", &body);
    let res = post("/v1/repos/plain/webhooks/github")
        .header("X-GitHub-Event", "push")
        .header("X-GitHub-Delivery", "n1")
        .header(name, &value)
        .body(body)
        .send()
        .await;
    let res = res.assert_status(StatusCode::UNAUTHORIZED);
    assert!(res.text().contains("signature does not verify"), "{}", res.text());
}

/// A pull request from a fork runs untrusted: no secrets in its assignment,
/// shown as untrusted; one from the repository by a collaborator is trusted.
#[tokio::test]
async fn a_fork_pull_request_runs_untrusted_without_secrets() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let base = env.repo.head().unwrap();
    let dir = env.repo.path();
    git(dir, &["checkout", "-q", "-b", "contrib"]);
    let head = env.repo.commit(&[("src/evil.sh", "cat /etc/passwd")], "from a fork").unwrap();
    git(dir, &["update-ref", "refs/pull/2/head", &head]);
    git(dir, &["checkout", "-q", "main"]);
    git(dir, &["branch", "-q", "-D", "contrib"]);
    let mut pr = fixture("github/pull_request_opened_fork.json");
    pr["number"] = json!(2);
    pr["pull_request"]["number"] = json!(2);
    pr["pull_request"]["head"]["sha"] = json!(head);
    pr["pull_request"]["base"]["sha"] = json!(base);
    pr["pull_request"]["base"]["ref"] = json!("main");
    deliver(&env, "pull_request", "pr-1", &pr).await.assert_status(StatusCode::ACCEPTED);
    env.app.run_pending_work().await;
    let list = runs(&env.app).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let run = get_run(&env.app, &list[0].id).await;
    assert_eq!(
        (run.trust.as_str(), run.event.as_str(), run.commit_sha.as_str()),
        ("untrusted", "pull_request", head.as_str())
    );
    assert_eq!(run.git_ref.as_deref(), Some("refs/pull/2/head"));
    let handed = finish_all(&env.app, "success").await;
    assert_eq!(handed.len(), 1);
    assert!(handed[0].secrets.is_empty(), "an untrusted run got secrets: {:?}", handed[0].secrets.keys());
    assert!(!serde_json::to_string(&handed[0]).unwrap().contains("s3cr3t-deploy-key"));
    assert_eq!(states(&env.forge, "kiln/ci (pull_request)").last().map(String::as_str), Some("success"));

    // The same pull request from a branch of the repository, by a collaborator.
    let mut same = pr.clone();
    same["pull_request"]["head"]["repo"] = pr["pull_request"]["base"]["repo"].clone();
    same["pull_request"]["author_association"] = json!("COLLABORATOR");
    deliver(&env, "pull_request", "pr-2", &same).await.assert_status(StatusCode::ACCEPTED);
    env.app.run_pending_work().await;
    let list = runs(&env.app).await;
    assert_eq!(list.len(), 2);
    assert_eq!(list.iter().filter(|r| r.trust == "trusted").count(), 1, "{list:?}");
}

/// Branch, tag and path filters include and exclude: a feature branch and
/// a tag that does not match start nothing; a matching tag runs ci; a push
/// touching docs/ runs docs (and ci, on main).
#[tokio::test]
async fn branch_tag_and_path_filters_choose_the_workflows() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI), (".kiln/docs.yaml", DOCS), ("src/a", "1")]).await;
    let dir = env.repo.path();
    let zero = "0".repeat(40);
    let base = env.repo.head().unwrap();
    let src = env.repo.commit(&[("src/a", "2")], "src").unwrap();
    // Pushed commits are on the pushed refs of the remote (planning checks).
    git(dir, &["branch", "feature", &src]);
    deliver(&env, "push", "b1", &push_payload(Forge::Github, "refs/heads/feature", &base, &src)).await;
    deliver(&env, "push", "b2", &push_payload(Forge::Github, "refs/tags/release-1", &zero, &src)).await;
    env.app.run_pending_work().await;
    let none = runs(&env.app).await;
    assert!(none.is_empty(), "feature (src only) and tag release-1 match nothing: {none:?}");

    git(dir, &["tag", "v1.0", &src]);
    deliver(&env, "push", "b3", &push_payload(Forge::Github, "refs/tags/v1.0", &zero, &src)).await;
    env.app.run_pending_work().await;
    let tagged = runs(&env.app).await;
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    let tag_run = get_run(&env.app, &tagged[0].id).await;
    assert_eq!((tag_run.workflow_path.as_str(), tag_run.git_ref.as_deref()), (".kiln/ci.yaml", Some("refs/tags/v1.0")));

    let docs = env.repo.commit(&[("docs/guide.md", "hi")], "docs").unwrap();
    git(dir, &["branch", "-f", "feature", &docs]);
    deliver(&env, "push", "b4", &push_payload(Forge::Github, "refs/heads/feature", &src, &docs)).await;
    env.app.run_pending_work().await;
    let after_docs = runs(&env.app).await;
    assert_eq!(after_docs.len(), 2, "{after_docs:?}");
    let newest = get_run(&env.app, &after_docs[0].id).await;
    assert_eq!(newest.workflow_path, ".kiln/docs.yaml");
    assert_eq!(newest.trust, "untrusted", "a push to an unprotected branch is untrusted");

    // Deleting a branch starts nothing.
    let mut del = push_payload(Forge::Github, "refs/heads/feature", &docs, &zero);
    del["deleted"] = json!(true);
    let ack: api::WebhookAck = deliver(&env, "push", "b5", &del).await.json();
    assert_eq!(ack.status, "ignored");
    env.app.run_pending_work().await;
    assert_eq!(runs(&env.app).await.len(), 2);
}

/// A workflow that fails validation at the pushed SHA: a failed status
/// naming the file and line, and no run; valid workflows still run.
#[tokio::test]
async fn an_invalid_workflow_fails_the_commit_status_with_its_line() {
    let bad = "version: 1\non:\n  push: {}\njobs:\n  - name: x\n    stepz: [a]\n";
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI), (".kiln/bad.yaml", bad)]).await;
    let sha = env.repo.head().unwrap();
    deliver(&env, "push", "v1", &push_payload(Forge::Github, "refs/heads/main", &"0".repeat(40), &sha)).await;
    env.app.run_pending_work().await;
    let list = runs(&env.app).await;
    assert_eq!(list.len(), 1);
    let bad_status: Vec<_> = env.forge.statuses().into_iter().filter(|s| s.context == "kiln/bad (push)").collect();
    assert_eq!(bad_status.len(), 1, "{bad_status:?}");
    assert_eq!(bad_status[0].state, "failure");
    let d = bad_status[0].description.clone().unwrap_or_default();
    assert!(d.starts_with(".kiln/bad.yaml:5:"), "names file and line: {d}");
}

/// A forge that is down delays statuses, never runs; they arrive once it
/// answers again, and never out of order.
#[tokio::test]
async fn a_forge_that_is_down_delays_statuses_not_runs() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let sha = env.repo.head().unwrap();
    env.forge.set_failing(1000);
    deliver(&env, "push", "down-1", &push_payload(Forge::Github, "refs/heads/main", &"0".repeat(40), &sha)).await;
    let handed = finish_all(&env.app, "success").await;
    assert_eq!(handed.len(), 1, "the run ran while the forge was down");
    assert!(env.forge.statuses().is_empty());
    env.forge.set_failing(0);
    // The retry waits for its backoff (database time).
    let mut got = Vec::new();
    for _ in 0..300 {
        env.app.run_pending_work().await;
        got = states(&env.forge, "kiln/ci (push)");
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got, vec!["success".to_string()], "only the current state is sent, nothing stale after it");
}

const NIGHTLY: &str = "version: 1
on:
  schedule:
    - cron: '* * * * *'
jobs:
  - name: nightly
    steps: [echo nightly]
";

async fn schedule_runs(app: &TestApp) -> Vec<api::RunSummary> {
    runs(app).await.into_iter().filter(|r| r.event == "schedule").collect()
}

fn advance_all(apps: &[&TestApp], by: Duration) {
    for a in apps {
        a.advance(by);
    }
}

/// Two replicas on one database and a restart in between: a `* * * * *`
/// workflow gets exactly one run per minute (the lease keeps the loop on
/// one replica; the idempotency record (workflow, tick) keeps even two
/// overlapping leaders from starting a tick twice), and ticks missed while
/// down run once on recovery.
#[tokio::test]
async fn schedules_fire_once_per_tick_across_replicas_and_restarts() {
    schedule_walk(TestApp::new().await).await;
}

/// The same walk with both replicas on PostgreSQL (skipped when it is not
/// installed, unless KILN_REQUIRE_POSTGRES=1).
#[tokio::test(flavor = "multi_thread")]
async fn schedules_fire_once_per_tick_across_replicas_on_postgres() {
    match TestApp::on_postgres().await {
        Some(app) => schedule_walk(app).await,
        None if std::env::var("KILN_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("PostgreSQL is required (KILN_REQUIRE_POSTGRES=1) but not installed")
        }
        None => eprintln!("skipped: PostgreSQL is not installed"),
    }
}

async fn schedule_walk(a: TestApp) {
    let repo = TestRepo::new(&[(".kiln/nightly.yaml", NIGHTLY)]).unwrap();
    a.add_repo("r", &repo).await;
    let now = kiln_server::Clock::now_ms(a.clock());
    a.clock().set_ms(now - now % 60_000 + 10_000);
    let b = a.replica().await;
    const TTL: i64 = 300;

    assert_eq!(a.app().triggers_round(TTL).await.unwrap(), Some((0, 0)), "first sight starts the cursor: no backfill");
    assert_eq!(b.app().triggers_round(TTL).await.unwrap(), None, "b waits while a holds the lease");

    // Minute 1 on a.
    advance_all(&[&a, &b], Duration::from_secs(60));
    assert_eq!(a.app().triggers_round(TTL).await.unwrap(), Some((1, 0)));
    assert_eq!(a.app().triggers_round(TTL).await.unwrap(), Some((0, 0)), "a tick fires once");
    assert_eq!(b.app().triggers_round(TTL).await.unwrap(), None);

    // a dies (no release); after its lease expires, a restarted c takes over.
    drop(a);
    let c = b.replica().await;
    tokio::time::sleep(Duration::from_millis(TTL as u64 + 200)).await;
    advance_all(&[&b, &c], Duration::from_secs(60));
    assert_eq!(c.app().triggers_round(TTL).await.unwrap(), Some((1, 0)), "minute 2 on the restarted replica");
    assert_eq!(b.app().triggers_round(TTL).await.unwrap(), None);

    // Minute 3: two leaders overlapping (a lease expired mid-round) still
    // start the tick once.
    advance_all(&[&b, &c], Duration::from_secs(60));
    let fired = b.app().schedule_once().await.unwrap() + c.app().schedule_once().await.unwrap();
    assert_eq!(fired, 1);
    let list = schedule_runs(&b).await;
    assert_eq!(list.len(), 3, "one run per minute: {list:?}");
    assert!(list.iter().all(|r| r.trust == "trusted" && r.actor.as_deref() == Some("schedule")));
    assert!(list.iter().all(|r| r.git_ref.as_deref() == Some("refs/heads/main")));

    // Down for five minutes: one run on recovery (the latest missed tick).
    advance_all(&[&b, &c], Duration::from_secs(300));
    assert_eq!(c.app().schedule_once().await.unwrap(), 1);
    assert_eq!(c.app().schedule_once().await.unwrap(), 0);
    assert_eq!(schedule_runs(&b).await.len(), 4);
}

/// Reconciliation: a push whose webhook never came gets its run within one
/// poll interval; the webhook arriving late finds the same run.
#[tokio::test]
async fn polling_starts_the_run_of_a_missed_webhook() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    env.app
        .admin()
        .request(axum::http::Method::PATCH, "/v1/repos/r")
        .json(&json!({ "poll_interval_secs": 1 }))
        .send()
        .await
        .assert_status(StatusCode::OK);
    assert_eq!(env.app.app().poll_once().await.unwrap(), 0, "the first poll only records the heads");
    assert!(runs(&env.app).await.is_empty());
    let before = env.repo.head().unwrap();
    let pushed = env.repo.commit(&[("src/x", "1")], "pushed, webhook lost").unwrap();
    let mut made = 0;
    for _ in 0..50 {
        made = env.app.app().poll_once().await.unwrap();
        if made > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(made, 1, "the moved head became a delivery within the interval");
    env.app.run_pending_work().await;
    let list = runs(&env.app).await;
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].commit_sha.as_str(), list[0].actor.as_deref()), (pushed.as_str(), Some("poll")));
    // The webhook, late: the same run.
    let ack: api::WebhookAck =
        deliver(&env, "push", "late", &push_payload(Forge::Github, "refs/heads/main", &before, &pushed)).await.json();
    assert_eq!(ack.status, "pending");
    env.app.run_pending_work().await;
    assert_eq!(runs(&env.app).await.len(), 1, "one run per push, however it was found");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(env.app.app().poll_once().await.unwrap(), 0, "nothing moved since");
}

/// A workflow that declares `on:` without `manual` is not started by hand.
#[tokio::test]
async fn a_workflow_without_on_manual_is_not_started_by_hand() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let res = env
        .app
        .admin()
        .post("/v1/repos/r/workflow-runs")
        .json(&api::SubmitRun {
            commit_sha: "HEAD".into(),
            workflow_path: Some(".kiln/ci.yaml".into()),
            ..Default::default()
        })
        .send()
        .await;
    let res = res.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(res.text().contains("manual"), "{}", res.text());
    assert!(runs(&env.app).await.is_empty());
}

/// Settings: hook-info tells what to paste; bad settings are refused and
/// change nothing; tokens of other scopes cannot change them.
#[tokio::test]
async fn repository_forge_settings_are_validated() {
    let env = connected(Forge::Gitlab, &[(".kiln/ci.yaml", CI)]).await;
    let info: api::HookInfo = env.app.admin().get("/v1/repos/r/hook-info").send().await.json();
    assert_eq!(info.url, "http://kiln.test/v1/repos/r/webhooks/gitlab");
    assert!(info.secret_configured && info.statuses_configured);
    let patch = |body: Value| env.app.admin().request(axum::http::Method::PATCH, "/v1/repos/r").json(&body).send();
    for bad in [
        json!({ "forge": "bitbucket" }),
        json!({ "forge_url": "http://forge.example.com" }),
        json!({ "forge_url": "ftp://x" }),
        json!({ "forge_repo": "../../etc" }),
        json!({ "pull_request_trust": "everyone" }),
        json!({ "webhook_secret": "short" }),
        json!({ "default_branch": "refs/heads/main" }),
        json!({ "clone_url": "/elsewhere" }),
    ] {
        patch(bad.clone()).await.assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    }
    let repo: api::Repo = env.app.admin().get("/v1/repos/r").send().await.json();
    assert_eq!(repo.forge.as_deref(), Some("gitlab"));
    assert_eq!(repo.pull_request_trust.as_deref(), Some("write-access"));
    let ok: api::Repo = patch(json!({ "protected_refs": ["release/*"], "forge_token": "" })).await.json();
    assert_eq!(ok.protected_refs, vec!["release/*".to_string()]);
    assert!(!ok.forge_token_set);
}

/// Who may touch the forge settings: admin only; read tokens see settings
/// (never secrets) and deliveries; trigger tokens see neither.
#[tokio::test]
async fn only_admin_tokens_change_forge_settings() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let make = |scope: &str| {
        let body = api::CreateToken {
            name: format!("{scope}-t"),
            scope: scope.into(),
            repo: (scope == "trigger").then(|| "r".to_string()),
            trusted: None,
        };
        env.app.admin().post("/v1/tokens").json(&body).send()
    };
    let read: api::CreatedToken = make("read").await.assert_status(StatusCode::CREATED).json();
    let trigger: api::CreatedToken = make("trigger").await.assert_status(StatusCode::CREATED).json();
    for t in [&read.token, &trigger.token] {
        env.app
            .with_token(t)
            .request(axum::http::Method::PATCH, "/v1/repos/r")
            .json(&json!({ "pull_request_trust": "same-repo" }))
            .send()
            .await
            .assert_status(StatusCode::FORBIDDEN);
    }
    let seen = env.app.with_token(&read.token).get("/v1/repos/r").send().await.assert_status(StatusCode::OK).text();
    assert!(!seen.contains(SECRET) && !seen.contains(TOKEN));
    env.app.with_token(&read.token).get("/v1/repos/r/deliveries").send().await.assert_status(StatusCode::OK);
    env.app.with_token(&trigger.token).get("/v1/repos/r/deliveries").send().await.assert_status(StatusCode::FORBIDDEN);
    env.app.with_token(&trigger.token).get("/v1/repos/r/hook-info").send().await.assert_status(StatusCode::FORBIDDEN);
    let repo: api::Repo = env.app.admin().get("/v1/repos/r").send().await.json();
    assert_eq!(repo.pull_request_trust.as_deref(), Some("write-access"), "nothing changed");
}

/// Retrying a failed run that came from a push reports under the same
/// context: the commit ends up showing the retry's success.
#[tokio::test]
async fn a_retry_reports_to_the_same_commit_status() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI)]).await;
    let sha = env.repo.head().unwrap();
    deliver(&env, "push", "r-1", &push_payload(Forge::Github, "refs/heads/main", &"0".repeat(40), &sha)).await;
    finish_all(&env.app, "failed").await;
    assert_eq!(states(&env.forge, "kiln/ci (push)").last().map(String::as_str), Some("failure"));
    let first = runs(&env.app).await[0].id.clone();
    let res = env.app.admin().post(&format!("/v1/workflow-runs/{first}/retry")).send().await;
    let retried: Value = res.assert_status(StatusCode::ACCEPTED).json();
    finish_all(&env.app, "success").await;
    let got = env.forge.statuses();
    let last = got.iter().rev().find(|s| s.context == "kiln/ci (push)").unwrap();
    assert_eq!(last.state, "success", "{got:?}");
    assert!(last.target_url.as_deref().unwrap().ends_with(retried["run_id"].as_str().unwrap()), "{got:?}");
}

/// A claim request id unique to this call (claims are idempotent per id).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The package's directory, read when the test runs: a test binary reused
/// from a build of another checkout (a shared target dir, as CI has) must
/// read this checkout's files.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")
}

/// A team over its queued-job cap (issue 44): a new API run is refused
/// with 429, `Retry-After` and the JSON error; a signed push for it is
/// kept (202) and its run is created once the team is under the cap. A
/// push to the default branch is `urgent`, an API run `normal`.
#[tokio::test]
async fn a_team_over_its_cap_refuses_api_runs_and_keeps_webhooks_until_there_is_room() {
    let env = connected(Forge::Github, &[(".kiln/ci.yaml", CI), ("src/a.rs", "1")]).await;
    let app = &env.app;
    app.admin()
        .post("/v1/teams")
        .json(&json!({ "name": "capped", "max_queued": 1 }))
        .send()
        .await
        .assert_status(StatusCode::CREATED);
    let moved: api::Repo = app
        .admin()
        .request(axum::http::Method::PATCH, "/v1/repos/r")
        .json(&json!({ "team": "capped" }))
        .send()
        .await
        .json();
    assert_eq!(moved.team, "capped");
    let submit =
        || app.admin().post("/v1/repos/r/workflow-runs").json(&json!({ "commit_sha": "HEAD", "event": "push" })).send();
    let first: api::SubmitRunResponse = submit().await.assert_status(StatusCode::ACCEPTED).json();
    assert_eq!(get_run(app, &first.run_id).await.priority, "normal", "an API run is normal");
    // One queued job: at the cap.
    let refused = submit().await.assert_status(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.error_code(), "over_quota");
    assert_eq!(refused.header("retry-after"), Some("30"));
    assert!(refused.text().contains("team `capped` has 1 queued jobs, at its cap of 1"), "{}", refused.text());
    assert_eq!(runs(app).await.len(), 1, "a refused run leaves nothing");

    // A push for the capped team: accepted and kept, not planned yet.
    let before = env.repo.head().unwrap();
    let after = env.repo.commit(&[("src/a.rs", "2")], "change").unwrap();
    let payload = push_payload(Forge::Github, "refs/heads/main", &before, &after);
    deliver(&env, "push", "cap-1", &payload).await.assert_status(StatusCode::ACCEPTED);
    app.run_pending_work().await;
    assert_eq!(runs(app).await.len(), 1, "over the cap: the delivery waits");
    let d: Value = app.admin().get("/v1/repos/r/deliveries").send().await.json();
    assert_eq!(d["deliveries"][0]["status"], "pending", "{d}");
    assert!(d["deliveries"][0]["message"].as_str().unwrap_or("").contains("at its cap"), "{d}");

    // The queued job runs: the team is under its cap, the push's run is created.
    assert_eq!(finish_all(app, "success").await.len(), 1);
    let mut planned = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.run_pending_work().await;
        planned = runs(app).await.into_iter().filter(|r| r.id != first.run_id).collect();
        if !planned.is_empty() {
            break;
        }
    }
    assert_eq!(planned.len(), 1, "the kept delivery's run once there is room");
    let run = get_run(app, &planned[0].id).await;
    assert_eq!((run.event.as_str(), run.commit_sha.as_str()), ("push", after.as_str()));
    assert_eq!(run.priority, "urgent", "a push to the default branch is urgent");
    assert_eq!(run.team, "capped");
}

/// A schedule tick of a team over its queued-job cap (issue 44) is not
/// refused: it stays due and fires once the team is under the cap, in the
/// `background` lane; a server saturated for `background` refuses new API
/// runs of that lane first (429), then `normal` ones, never `urgent` ones.
#[tokio::test]
async fn a_capped_teams_schedule_waits_and_saturation_refuses_the_lowest_lane_first() {
    let a = TestApp::with_config(|c| c.max_queued_jobs = Some(5)).await;
    let repo =
        TestRepo::new(&[(".kiln/nightly.yaml", NIGHTLY), (".kiln/pipeline.yaml", &super::pipeline(&["a", "b"]))])
            .unwrap();
    a.add_repo("r", &repo).await;
    a.admin().post("/v1/teams").json(&json!({ "name": "capped", "max_queued": 2 })).send().await;
    a.admin()
        .request(axum::http::Method::PATCH, "/v1/repos/r")
        .json(&json!({ "team": "capped" }))
        .send()
        .await
        .assert_status(StatusCode::OK);
    let now = kiln_server::Clock::now_ms(a.clock());
    a.clock().set_ms(now - now % 60_000 + 10_000);
    const TTL: i64 = 300;
    assert_eq!(a.app().triggers_round(TTL).await.unwrap(), Some((0, 0)), "first sight starts the cursor");
    // Two queued jobs: the team is at its cap.
    let submit = |priority: Option<&str>| {
        let mut body = json!({ "commit_sha": "HEAD", "workflow_path": ".kiln/pipeline.yaml" });
        if let Some(p) = priority {
            body["priority"] = json!(p);
        }
        a.admin().post("/v1/repos/r/workflow-runs").json(&body).send()
    };
    let held: api::SubmitRunResponse = submit(None).await.assert_status(StatusCode::ACCEPTED).json();
    a.advance(Duration::from_secs(60));
    assert_eq!(a.app().schedule_once().await.unwrap(), 0, "the tick waits while the team is at its cap");
    assert_eq!(a.app().schedule_once().await.unwrap(), 0);
    assert!(schedule_runs(&a).await.is_empty());
    // The queued run ends: the due tick fires, in the background lane.
    a.admin().post(&format!("/v1/workflow-runs/{}/cancel", held.run_id)).send().await.assert_status(StatusCode::OK);
    assert_eq!(a.app().schedule_once().await.unwrap(), 1, "under the cap: the tick that waited fires");
    let nightly = schedule_runs(&a).await;
    assert_eq!(nightly.len(), 1);
    assert_eq!(get_run(&a, &nightly[0].id).await.priority, "background");
    a.admin().post(&format!("/v1/workflow-runs/{}/cancel", nightly[0].id)).send().await.assert_status(StatusCode::OK);

    // Saturation (--max-queued-jobs 5) in another team: the lowest lane first.
    a.admin().request(axum::http::Method::PATCH, "/v1/repos/r").json(&json!({ "team": "default" })).send().await;
    submit(None).await.assert_status(StatusCode::ACCEPTED);
    submit(None).await.assert_status(StatusCode::ACCEPTED); // 4 queued
    let r = submit(Some("background")).await.assert_status(StatusCode::TOO_MANY_REQUESTS);
    assert!(r.text().contains("`background` runs are refused from 4 queued jobs"), "{}", r.text());
    submit(None).await.assert_status(StatusCode::ACCEPTED); // 6 queued
    let r = submit(None).await.assert_status(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("30"));
    submit(Some("urgent")).await.assert_status(StatusCode::ACCEPTED);
}
