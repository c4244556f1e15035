//! The forge loop with real processes (issue 14): `kiln server` and a
//! `kiln agent`, a repository connected with the CLI (secrets from a file
//! and stdin), signed webhook deliveries over HTTP, commit statuses received
//! by a fake forge; and a server SIGKILLed between accepting a delivery and
//! planning it, which plans it exactly once after the restart.

use kiln_forge::Forge;
use kiln_forge::fake::FakeForge;
use kiln_testkit::{KilnServer, TestRepo};
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");
const SECRET: &str = "e2e-webhook-secret-0123456789";
const TOKEN: &str = "e2e-forge-token";
const CI: &str = "version: 1
on:
  push:
    branches: [main]
jobs:
  - name: build
    steps: [echo built $KILN_COMMIT]
";

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn push_body(before: &str, after: &str) -> Vec<u8> {
    let p = format!("{}/../kiln-forge/tests/fixtures/github/push_branch.json", manifest_dir());
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["ref"] = json!("refs/heads/main");
    // The repository the hook belongs to (`--forge-repo`).
    v["repository"]["full_name"] = json!("acme/widget");
    v["before"] = json!(before);
    v["after"] = json!(after);
    v["commits"] = json!([]);
    serde_json::to_vec(&v).unwrap()
}

async fn deliver(server: &KilnServer, id: &str, body: &[u8]) -> (u16, Value) {
    let (name, value) = kiln_forge::sign(Forge::Github, SECRET.as_bytes(), body);
    let res = reqwest::Client::new()
        .post(format!("{}/v1/repos/r/webhooks/github", server.url))
        .header("X-GitHub-Event", "push")
        .header("X-GitHub-Delivery", id)
        .header(name, value)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// `kiln repo add` with the forge flags: the webhook secret from stdin,
/// the forge token from a file.
fn connect(server: &KilnServer, repo: &TestRepo, forge: &FakeForge) {
    connect_with(server, repo, forge, &[]);
}

fn connect_with(server: &KilnServer, repo: &TestRepo, forge: &FakeForge, extra: &[&str]) {
    let token_file = server.data.path().join("forge.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut child = server
        .cli()
        .args(["repo", "add", "r", "--url"])
        .arg(repo.path())
        .args(["--forge", "github", "--forge-url", &forge.url(), "--forge-repo", "acme/widget"])
        .arg("--forge-token-file")
        .arg(&token_file)
        .args(["--webhook-secret-file", "-"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(format!("{SECRET}\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

async fn runs(server: &KilnServer) -> Vec<Value> {
    let res = reqwest::Client::new()
        .get(format!("{}/v1/repos/r/workflow-runs", server.url))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    let v: Value = res.json().await.unwrap();
    v["runs"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_push_runs_on_an_agent_and_the_commit_shows_success() {
    let forge = FakeForge::start(TOKEN).await;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();

    // A secret on the command line is refused, and nothing is registered.
    let out = server
        .cli()
        .args(["repo", "add", "r", "--url"])
        .arg(repo.path())
        .args(["--webhook-secret", SECRET])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--webhook-secret-file"));

    connect(&server, &repo, &forge);
    let info = server.cli().args(["repo", "hook-info", "r"]).output().unwrap();
    let info = String::from_utf8_lossy(&info.stdout).to_string();
    assert!(info.contains(&format!("{}/v1/repos/r/webhooks/github", server.url)), "{info}");
    assert!(!info.contains(SECRET), "{info}");

    let sha = repo.head().unwrap();
    let (status, ack) = deliver(&server, "e2e-1", &push_body(&"0".repeat(40), &sha)).await;
    assert_eq!(status, 202, "{ack}");
    let mut success = false;
    for _ in 0..300 {
        let s = forge.statuses();
        if s.iter().any(|x| x.state == "success") {
            success = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = forge.statuses();
    assert!(success, "statuses: {got:?}\n{}", server.log());
    assert!(got.iter().all(|s| s.sha == sha && s.context == "kiln/ci (push)"), "{got:?}");
    assert_eq!(got.last().unwrap().state, "success");
    let list = runs(&server).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["status"], "success");
    assert_eq!(list[0]["trust"], "trusted");
}

/// Acceptance, then SIGKILL before planning could finish (the pushed
/// commit had not reached the repository yet, so planning was deferred),
/// then a restart: the delivery is planned exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_accepted_before_a_crash_is_planned_once_after_restart() {
    let forge = FakeForge::start(TOKEN).await;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, &repo, &forge);
    // The pushed commit exists elsewhere first.
    let elsewhere = tempfile::tempdir().unwrap();
    git(elsewhere.path(), &["clone", "-q", &repo.path().display().to_string(), "w"]);
    let w = elsewhere.path().join("w");
    std::fs::write(w.join("new.txt"), "x").unwrap();
    git(&w, &["add", "."]);
    git(&w, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "pushed"]);
    let pushed = git(&w, &["rev-parse", "HEAD"]);
    let before = repo.head().unwrap();
    let body = push_body(&before, &pushed);

    let (status, ack) = deliver(&server, "crash-1", &body).await;
    assert_eq!(status, 202, "{ack}");
    // The planner tries, cannot find the commit, and defers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(runs(&server).await.is_empty());
    let server = server.kill_and_restart(&[]).unwrap();
    // Now the commit arrives.
    git(repo.path(), &["fetch", "-q", &w.display().to_string(), "main:refs/heads/incoming"]);
    git(repo.path(), &["merge", "-q", "--ff-only", "incoming"]);
    let mut list = Vec::new();
    for _ in 0..300 {
        list = runs(&server).await;
        if !list.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list.len(), 1, "{list:?}\n{}", server.log());
    assert_eq!(list[0]["commit_sha"], pushed.as_str());
    // A redelivery (and more planner rounds) start nothing more.
    let (status, again) = deliver(&server, "crash-1", &body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicate"], true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let list = runs(&server).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(again["runs"], json!([list[0]["id"]]));
}

async fn admin_get(server: &KilnServer, path: &str) -> Value {
    let res = reqwest::Client::new().get(format!("{}{path}", server.url)).bearer_auth(&server.token).send().await;
    res.unwrap().json().await.unwrap()
}

async fn metric(server: &KilnServer, series: &str) -> Option<f64> {
    let res = reqwest::Client::new().get(format!("{}/metrics", server.url)).bearer_auth(&server.token).send().await;
    let text = res.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Wait (bounded) until `f` holds for what the forge has received.
async fn statuses_until(forge: &FakeForge, what: &str, f: impl Fn(&[kiln_forge::fake::RecordedStatus]) -> bool) {
    for _ in 0..600 {
        if f(&forge.statuses()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: {:#?}", forge.statuses());
}

/// Issue 40: an accepted push is never dropped. The repository's remote is
/// gone far longer than planning used to try (8 attempts): the delivery
/// stays pending and is retried, becomes delayed past
/// `--delivery-alert-after` (the gauge, `kiln repo deliveries`, a pending
/// `kiln/delivery (push)` status saying why), and when the remote is back
/// the run is created once and both statuses are settled.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_push_outlives_a_long_remote_outage() {
    let forge = FakeForge::start(TOKEN).await;
    let flags = ["--retry-base", "20ms", "--delivery-retry-max", "300ms", "--delivery-alert-after", "2s"];
    let server = KilnServer::start(BIN.as_ref(), &flags).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, &repo, &forge);
    let _agent = server.agent("a1", &[]).unwrap();
    let before = repo.head().unwrap();
    let sha = repo.commit(&[("next.txt", "x")], "next").unwrap();
    // The remote becomes unreachable.
    let away = repo.path().with_extension("away");
    std::fs::rename(repo.path(), &away).unwrap();
    struct Back(std::path::PathBuf, std::path::PathBuf);
    impl Drop for Back {
        fn drop(&mut self) {
            let _ = std::fs::rename(&self.0, &self.1);
        }
    }
    let back = Back(away.clone(), repo.path().to_path_buf());

    let (status, ack) = deliver(&server, "outage-1", &push_body(&before, &sha)).await;
    assert_eq!(status, 202, "{ack}");
    let mut d = Value::Null;
    for _ in 0..600 {
        d = admin_get(&server, "/v1/repos/r/deliveries").await["deliveries"][0].clone();
        if d["attempts"].as_i64().unwrap_or(0) >= 16 && d["delayed"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d["attempts"].as_i64().unwrap_or(0) >= 16 && d["delayed"] == true, "{d}\n{}", server.log());
    assert_eq!(d["status"], "pending", "still retried, not given up: {d}");
    assert!(runs(&server).await.is_empty());
    statuses_until(&forge, "a pending delayed status", |s| {
        s.iter().any(|x| x.context == "kiln/delivery (push)" && x.state == "pending" && x.sha == sha)
    })
    .await;
    let delayed = forge.statuses().into_iter().rfind(|x| x.context == "kiln/delivery (push)").unwrap();
    assert!(delayed.description.as_deref().unwrap_or("").contains("delayed"), "{delayed:?}");
    assert_eq!(metric(&server, "kiln_deliveries_delayed").await, Some(1.0));
    assert_eq!(metric(&server, "kiln_deliveries_pending").await, Some(1.0));
    let out = server.cli().args(["repo", "deliveries", "r"]).output().unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("DELAYED") && listed.contains("attempts"), "{listed}");

    // The remote is back: one run, reported, and the delivery's own status settled.
    drop(back);
    statuses_until(&forge, "the run's success", |s| {
        s.iter().any(|x| x.context == "kiln/ci (push)" && x.state == "success")
    })
    .await;
    statuses_until(&forge, "the delivery's status settled", |s| {
        s.iter().rfind(|x| x.context == "kiln/delivery (push)").is_some_and(|x| x.state == "success")
    })
    .await;
    let list = runs(&server).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["commit_sha"], sha.as_str());
    let d = admin_get(&server, "/v1/repos/r/deliveries").await["deliveries"][0].clone();
    assert_eq!((d["status"].as_str(), d["delayed"].as_bool()), (Some("planned"), Some(false)), "{d}");
    assert_eq!(metric(&server, "kiln_deliveries_delayed").await, Some(0.0));
}

/// Issue 40: a push made while the server was down (no webhook reached
/// it) runs once after the restart, found by polling — on a branch other
/// than the default one that the workflow's `on:` matches.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_made_while_the_server_was_down_runs_once_after_restart() {
    let wf = "version: 1\non:\n  push:\n    branches: [main, 'release/*']\njobs:\n  - name: build\n    steps: [echo built]\n";
    let forge = FakeForge::start(TOKEN).await;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", wf)]).unwrap();
    git(repo.path(), &["branch", "release/1"]);
    connect_with(&server, &repo, &forge, &["--poll-interval", "1s"]);
    // The first poll records the heads (nothing runs).
    let polled = kiln_testkit::wait_for(Duration::from_secs(60), || server.log().contains("first poll").then_some(()));
    assert!(polled.is_some(), "{}", server.log());
    assert!(runs(&server).await.is_empty(), "the first poll only records the heads");
    // Down; a push to release/1 meanwhile; up again.
    let dir = repo.path().to_path_buf();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        git(&dir, &["checkout", "-q", "release/1"]);
        std::fs::write(dir.join("r.txt"), "1").unwrap();
        git(&dir, &["add", "."]);
        git(&dir, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "while down"]);
        git(&dir, &["rev-parse", "HEAD"])
    });
    let server = server.restart("TERM", Duration::from_secs(1), &[]).unwrap();
    let pushed = pusher.join().unwrap();
    let mut list = Vec::new();
    for _ in 0..600 {
        list = runs(&server).await;
        if !list.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list.len(), 1, "{list:?}\n{}", server.log());
    assert_eq!(
        (list[0]["commit_sha"].as_str(), list[0]["ref"].as_str()),
        (Some(pushed.as_str()), Some("refs/heads/release/1"))
    );
    // More polls start nothing more.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(runs(&server).await.len(), 1);
}

/// The webhook secret and the forge token are sealed at rest like secrets,
/// resealed by `kiln secret rotate-key`, and still work afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn forge_credentials_are_sealed_and_survive_a_key_rotation() {
    let forge = FakeForge::start(TOKEN).await;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, &repo, &forge);
    for name in ["kiln.db", "kiln.db-wal"] {
        let bytes = std::fs::read(server.data_dir().join(name)).unwrap_or_default();
        for clear in [SECRET, TOKEN] {
            assert!(!bytes.windows(clear.len()).any(|w| w == clear.as_bytes()), "{name} holds {clear} in clear");
        }
    }
    let out = server.cli().args(["secret", "rotate-key", "--data-dir"]).arg(server.data_dir()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 secrets sealed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let sha = repo.head().unwrap();
    let (status, ack) = deliver(&server, "rot-1", &push_body(&"0".repeat(40), &sha)).await;
    assert_eq!(status, 202, "the webhook secret still verifies after the rotation: {ack}");
    let mut sent = false;
    for _ in 0..200 {
        if !forge.statuses().is_empty() {
            sent = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sent, "the forge token still opens after the rotation\n{}", server.log());
}

/// The package's directory, read when the test runs: a test binary reused
/// from a build of another checkout (a shared target dir, as CI has) must
/// read this checkout's files.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")
}

/// Issue 43: a run's commit status says how its tests went,
/// `1 failed of 3 tests`, before the rest of the description.
#[tokio::test(flavor = "multi_thread")]
async fn the_commit_status_says_how_many_tests_failed() {
    let forge = FakeForge::start(TOKEN).await;
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let ci = r#"version: 1
on: {push: {}}
jobs:
  - name: test
    reports: {junit: [j.xml]}
    steps:
      - printf '%s' '<testsuite name="s"><testcase name="a"/><testcase name="b"/><testcase name="c"><failure message="no"/></testcase></testsuite>' > j.xml; exit 1
"#;
    let repo = TestRepo::new(&[(".kiln/ci.yaml", ci)]).unwrap();
    connect(&server, &repo, &forge);
    let sha = repo.head().unwrap();
    let (status, ack) = deliver(&server, "tests-1", &push_body(&"0".repeat(40), &sha)).await;
    assert_eq!(status, 202, "{ack}");
    statuses_until(&forge, "a failure status", |s| s.iter().any(|x| x.state == "failure")).await;
    let last = forge.statuses().into_iter().rfind(|x| x.state == "failure").unwrap();
    let d = last.description.clone().unwrap_or_default();
    assert!(d.starts_with("1 failed of 3 tests · Failed"), "{last:?}");
}
