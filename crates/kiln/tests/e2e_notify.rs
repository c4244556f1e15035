//! Badges and notifications (issue 42) with the real binary: `kiln up`
//! with an agent, a repository whose run fails then is fixed, a local HTTP
//! receiver that fails twice before it accepts. The notification arrives
//! signed (HMAC-SHA256 of the body under the secret from --secret-file),
//! is retried with backoff through the outbox, is delivered once per run
//! end, and the delivery log says how it went. The CLI refuses bad input
//! in the user's words; the badge of a public repository needs no token.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use kiln_testkit::{KilnUp, TestRepo, wait_for, write_private};
use serde_json::Value;
use sha2::Sha256;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");
const SECRET: &str = "e2e-notify-secret-0123456789abcdef";
/// Fails until the commit adds the file `ok`.
const CI: &str = "version: 1\njobs:\n  - name: check\n    steps:\n      - test -f ok\n";

/// One request the receiver got, and what it answered.
#[derive(Clone, Debug)]
struct Received {
    delivery: String,
    event: String,
    signature: String,
    body: Vec<u8>,
    answered: u16,
}

/// A local webhook receiver: answers 500 to its first `failures` requests,
/// then 200; records every request.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start(failures: usize) -> Receiver {
        type Shared = (Arc<Mutex<Vec<Received>>>, usize);
        async fn hook(State((got, failures)): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
            let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let mut got = got.lock().unwrap();
            let code = if got.len() < failures { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK };
            got.push(Received {
                delivery: h("x-kiln-delivery"),
                event: h("x-kiln-event"),
                signature: h("x-kiln-signature-256"),
                body: body.to_vec(),
                answered: code.as_u16(),
            });
            code
        }
        let got = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new().route("/hook", axum::routing::post(hook)).with_state((got.clone(), failures));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, got }
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

/// What the docs tell receivers to do: HMAC-SHA256 of the raw body under
/// the secret, hex, after `sha256=`, compared in constant time.
fn verifies(secret: &str, body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else { return false };
    let Ok(sig) = hex::decode(hex_sig) else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn kiln(up: &KilnUp, args: &[&str]) -> Output {
    up.cli().args(args).output().expect("run kiln")
}

/// `kiln run --repo r`, then `kiln wait`: the run id and wait's exit code.
fn run_to_end(up: &KilnUp) -> (String, i32) {
    let out = kiln(up, &["run", "--repo", "r"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let waited = kiln(up, &["wait", &run]);
    (run, waited.status.code().unwrap_or(-1))
}

/// `kiln notify log r --json`.
fn delivery_log(up: &KilnUp) -> Vec<Value> {
    let out = kiln(up, &["notify", "log", "r", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The log entry of run `run` once it is no longer pending (polled with a
/// deadline; the sender runs on its own).
fn settled(up: &KilnUp, run: &str) -> Value {
    let found = wait_for(Duration::from_secs(60), || {
        delivery_log(up).into_iter().find(|d| d["run"] == run && d["status"] != "pending")
    });
    found.unwrap_or_else(|| panic!("no settled delivery for {run}: {:?}\n{}", delivery_log(up), up.log()))
}

fn secret_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let file = dir.path().join("notify.secret");
    write_private(dir.path(), &file, &format!("{SECRET}\n")).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_end_is_delivered_signed_retried_after_two_failures_and_never_twice() {
    let receiver = Receiver::start(2).await;
    let up = KilnUp::start_with(BIN.as_ref(), 1, &["--notify-retry-base", "50ms"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    let out = up.cli().args(["repo", "add", "r", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir);
    let out = up
        .cli()
        .args(["notify", "add", "r", "--url", &receiver.url, "--on", "failure,fixed", "--secret-file"])
        .arg(&secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("of r: {} on failure,fixed (kiln format)", receiver.url)), "{}", text(&out));
    let ls = kiln(&up, &["notify", "ls", "r"]);
    assert!(text(&ls).contains(&receiver.url) && text(&ls).contains("failure,fixed"), "{}", text(&ls));
    for out in [&out, &ls, &kiln(&up, &["notify", "ls", "r", "--json"]), &kiln(&up, &["secret", "ls", "r"])] {
        assert!(!text(out).contains(SECRET), "the secret is never shown: {}", text(out));
    }

    // The run fails: the receiver answers 500, 500, then 200.
    let (run1, code) = run_to_end(&up);
    assert_eq!(code, 1, "the first commit fails its check");
    let d1 = settled(&up, "r#1");
    assert_eq!(d1["status"], "delivered", "{d1}");
    assert_eq!(d1["event"], "failure");
    assert_eq!(d1["attempts"], 3, "two failures, then the delivery: {d1}");
    assert_eq!(d1["last_status_code"], 200);
    assert!(d1["delivered_at_ms"].as_i64().is_some());
    let id1 = d1["id"].as_str().unwrap().to_string();
    let got = receiver.got();
    assert_eq!(got.iter().map(|r| r.answered).collect::<Vec<_>>(), vec![500, 500, 200]);
    for r in &got {
        assert_eq!(r.delivery, id1, "one delivery id on every retry");
        assert_eq!(r.event, "failure");
        assert!(
            verifies(SECRET, &r.body, &r.signature),
            "signature {} over {}",
            r.signature,
            String::from_utf8_lossy(&r.body)
        );
        assert!(!verifies("another-secret-0123456789", &r.body, &r.signature));
        assert_eq!(r.body, got[0].body, "the same body on every retry");
    }
    let body: Value = serde_json::from_slice(&got[2].body).unwrap();
    assert_eq!(body["event"], "failure");
    assert_eq!(body["delivery"], id1.as_str());
    assert_eq!(body["repo"], "r");
    assert_eq!(body["run"], "r#1");
    assert_eq!(body["run_id"], run1.as_str());
    assert_eq!(body["run_number"], 1);
    assert_eq!(body["status"], "failed");
    assert_eq!(body["workflow"], ".kiln/ci.yaml");
    assert_eq!(body["branch"], "main");
    assert_eq!(body["commit"], repo.head().unwrap().as_str());
    assert!(body["url"].as_str().unwrap().ends_with(&format!("/#/runs/{run1}")), "{body}");

    // The fix: a success after a failure is `fixed`, delivered at once.
    repo.commit(&[("ok", "")], "fix").unwrap();
    let (_run2, code) = run_to_end(&up);
    assert_eq!(code, 0);
    let d2 = settled(&up, "r#2");
    assert_eq!(
        (d2["status"].as_str(), d2["event"].as_str(), d2["attempts"].as_i64()),
        (Some("delivered"), Some("fixed"), Some(1))
    );
    let got = receiver.got();
    let fixed: Vec<&Received> = got.iter().filter(|r| r.delivery == d2["id"].as_str().unwrap()).collect();
    assert_eq!(fixed.len(), 1);
    assert_eq!(fixed[0].event, "fixed");
    assert!(verifies(SECRET, &fixed[0].body, &fixed[0].signature));
    // Never twice: the sender went on to the second run end, and the first
    // one's was acknowledged once and never sent again.
    let first: Vec<u16> = got.iter().filter(|r| r.delivery == id1).map(|r| r.answered).collect();
    assert_eq!(first, vec![500, 500, 200]);
    assert_eq!(delivery_log(&up).len(), 2, "one row per (notification, run end)");

    // The human log: run, event, status, attempts, last answer.
    let log = kiln(&up, &["notify", "log", "r"]);
    let line = text(&log).lines().find(|l| l.starts_with("r#1 ")).map(str::to_string).unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(..6), Some(&["r#1", "failure", "delivered", "3", "HTTP", "200"][..]), "{}", text(&log));

    // Removing the notification: nothing more is sent for later runs.
    let id =
        serde_json::from_slice::<Vec<Value>>(&kiln(&up, &["notify", "ls", "r", "--json"]).stdout).unwrap()[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
    let rm = kiln(&up, &["notify", "rm", "r", &id]);
    assert!(rm.status.success() && text(&rm).contains(&format!("notification {id} of r removed")), "{}", text(&rm));
    let again = kiln(&up, &["notify", "rm", "r", &id]);
    assert_eq!(again.status.code(), Some(3), "{}", text(&again));
    assert!(
        text(&again).contains(&format!("repository r has no notification {id}; see `kiln notify ls r`")),
        "{}",
        text(&again)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_badge_of_a_public_repository_needs_no_token() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI), ("ok", "")]).unwrap();
    let out = up.cli().args(["repo", "add", "r", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let badge = |query: &'static str| {
        let url = format!("{}/v1/repos/r/badge.svg{query}", up.url);
        async move {
            let res = reqwest::get(url).await.unwrap();
            let status = res.status().as_u16();
            (status, res.text().await.unwrap())
        }
    };
    // Private by default: not found without a token.
    assert_eq!(badge("").await.0, 404);
    let set = kiln(&up, &["repo", "set", "r", "--public"]);
    assert!(set.status.success() && text(&set).contains("badge:              public"), "{}", text(&set));
    let (status, svg) = badge("").await;
    assert_eq!(status, 200);
    assert!(svg.contains("<title>kiln: none</title>"), "{svg}");
    let (_, code) = run_to_end(&up);
    assert_eq!(code, 0);
    let (_, svg) = badge("?workflow=ci&branch=main").await;
    assert!(svg.contains(r#"aria-label="kiln: passing""#), "{svg}");
    let (_, svg) = badge("?branch=release").await;
    assert!(svg.contains("kiln: none"), "{svg}");
    let set = kiln(&up, &["repo", "set", "r", "--private"]);
    assert!(set.status.success(), "{}", text(&set));
    assert_eq!(badge("").await.0, 404);
    let both = kiln(&up, &["repo", "set", "r", "--public", "--private"]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
}

/// `kiln notify add` in the user's words: what is wrong, and nothing added.
#[test]
fn notify_add_refuses_bad_input_and_adds_nothing() {
    let up = KilnUp::start(BIN.as_ref(), 0).unwrap();
    let repo = TestRepo::new(&[(".kiln/ci.yaml", CI)]).unwrap();
    let out = up.cli().args(["repo", "add", "r", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir);
    let secret = secret.to_str().unwrap();

    let help = text(&kiln(&up, &["notify", "add", "--help"]));
    for want in ["--secret-file <FILE>", "--on <EVENTS>", "failure, fixed", "X-Kiln-Signature-256", "--format"] {
        assert!(help.contains(want), "{want} in:\n{help}");
    }
    assert!(text(&kiln(&up, &["notify", "--help"])).contains("log"), "the delivery log is listed");

    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let url = "http://127.0.0.1:9/hook";
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["--url", url, "--on", "failure", "--secret-file", "/nonexistent/notify.secret"],
            2,
            "error: --secret-file /nonexistent/notify.secret: No such file or directory (os error 2)\n",
        ),
        (
            vec!["--url", "ftp://example.com/hook", "--on", "failure", "--secret-file", secret],
            2,
            "error: --url `ftp://example.com/hook`: a notification URL is http:// or https:// (e.g. https://hooks.example.com/kiln)\n",
        ),
        (
            vec!["--url", url, "--on", "failure,broken", "--secret-file", secret],
            2,
            "error: --on: unknown event `broken`; use failure, fixed, success, cancelled, always\n",
        ),
        (
            vec!["--url", url, "--on", "failure"],
            2,
            "error: --secret-file FILE is required: the receiver checks each body's signature with that secret (make one with `openssl rand -hex 32 > notify.secret`)\n",
        ),
        (
            vec!["--url", url, "--on", "failure", "--secret", SECRET],
            2,
            "error: --secret is refused: a secret on the command line is visible to every local user (/proc/PID/cmdline); pass --secret-file FILE (or - for standard input)\n",
        ),
    ];
    for (args, code, want) in cases {
        let out = up.cli().args(["notify", "add", "r"]).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        assert_eq!(stderr(&out), want, "{args:?}");
    }
    // A secret too short to be one: the server says so.
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "hunter2\n").unwrap();
    let out = up
        .cli()
        .args(["notify", "add", "r", "--url", url, "--on", "failure", "--secret-file"])
        .arg(&short)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("a notification secret is 16 to 1024 printable characters"), "{}", text(&out));
    let ls = kiln(&up, &["notify", "ls", "r"]);
    assert!(ls.status.success());
    assert_eq!(
        stderr(&ls),
        "no notifications for r; add one with `kiln notify add r --url URL --secret-file FILE --on failure,fixed`\n"
    );
}
