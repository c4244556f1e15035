//! Findings 6, 7, 9 and 10 (the HTTP edge and the CLI's terminal output),
//! and TLS: each against the real binary.

use crate::{BIN, names_under};
use kiln_api::{Client, CreateRepo, SubmitRun};
use kiln_testkit::{KilnServer, KilnUp, TestRepo, handoff_workflow, wait_run};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(url: &str) -> String {
    url.split("://").nth(1).unwrap().trim_end_matches('/').to_string()
}

/// `/healthz` on a fresh connection, with the time it took.
async fn healthz(url: &str) -> (bool, Duration) {
    let t = Instant::now();
    let ok = match tokio::time::timeout(Duration::from_secs(5), reqwest::get(format!("{url}/healthz"))).await {
        Ok(Ok(r)) => r.status().is_success(),
        _ => false,
    };
    (ok, t.elapsed())
}

/// Whether the server closed `s` (EOF or reset) within `wait`.
async fn closed_by_server(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // an error answer (e.g. 408) before the close
        }
    }
}

/// Finding 6: connections that trickle header bytes (or send nothing) are
/// closed after the header-read timeout while `/healthz` keeps answering,
/// and a connection past the cap is refused with a 503 in the API's error
/// shape instead of being held open.
#[tokio::test(flavor = "multi_thread")]
async fn slow_clients_time_out_and_connections_past_the_cap_are_refused() {
    let server = KilnServer::start(BIN.as_ref(), &["--header-read-timeout", "2s", "--max-connections", "64"]).unwrap();
    let at = addr(&server.url);
    // 48 slow clients: each sends a request head one byte at a time.
    let head = b"GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut slow = vec![];
    for _ in 0..48 {
        slow.push(TcpStream::connect(&at).await.unwrap());
    }
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        for s in &mut slow {
            let _ = s.write_all(&head[i % head.len()..i % head.len() + 1]).await;
        }
        i += 1;
        let (ok, took) = healthz(&server.url).await;
        assert!(
            ok && took < Duration::from_secs(2),
            "/healthz must answer while slow clients are connected ({took:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the 2 s header-read timeout every one of them is closed.
    for (n, s) in slow.iter_mut().enumerate() {
        assert!(closed_by_server(s, Duration::from_secs(5)).await, "slow client {n} still open after the timeout");
    }
    assert!(started.elapsed() < Duration::from_secs(8));
    drop(slow);

    // Fill the cap with idle connections: the next one is refused.
    let mut idle = vec![];
    for _ in 0..64 {
        idle.push(TcpStream::connect(&at).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extra = TcpStream::connect(&at).await.unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: kiln\r\n\r\n").await;
    let mut answer = vec![];
    let _ = tokio::time::timeout(Duration::from_secs(3), extra.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "past the cap: {answer:?}");
    let body: serde_json::Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{answer}");
    // The idle ones are closed by the header-read timeout too; then the
    // server answers again.
    for s in &mut idle {
        assert!(closed_by_server(s, Duration::from_secs(5)).await, "an idle connection outlived the timeout");
    }
    drop(idle);
    assert!(healthz(&server.url).await.0, "/healthz answers once the idle connections are gone");
}

/// A repository whose workflow is `yaml`, registered on `server`.
async fn repo_with(server: &KilnServer, c: &Client, name: &str, yaml: &str) -> TestRepo {
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", yaml)]).unwrap();
    c.create_repo(&CreateRepo {
        team: None,
        forge: Default::default(),
        name: name.into(),
        clone_url: repo.path().display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await
    .unwrap();
    let _ = server;
    repo
}

/// Finding 7: a run list carries summaries (no definition is read for it),
/// and a workflow whose frozen definition is too large is refused with 422
/// at submission — nothing stored.
#[tokio::test(flavor = "multi_thread")]
async fn run_lists_are_summaries_and_a_too_large_definition_is_refused() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    // A few hundred bytes of YAML: one job, a 16×16 matrix, eight long
    // steps — 256 jobs of 8 steps once expanded, about 800 KiB stored.
    let long = "x".repeat(380);
    let steps: String = (0..8).map(|i| format!("      - echo {i}{long}\n")).collect();
    let big = format!(
        "version: 1\njobs:\n  - name: wide\n    matrix: {{a: [{}], b: [{}]}}\n    steps:\n{steps}",
        (1..=16).map(|i| i.to_string()).collect::<Vec<_>>().join(", "),
        (1..=16).map(|i| i.to_string()).collect::<Vec<_>>().join(", "),
    );
    assert!(big.len() < 8 * 1024, "the file itself is small: {}", big.len());
    let _big_repo = repo_with(&server, &c, "big", &big).await;
    let sub = SubmitRun {
        commit_sha: "HEAD".into(),
        workflow_path: None,
        inputs: BTreeMap::new(),
        event: None,
        priority: None,
    };
    let e = c.submit_run("big", &sub, None).await.expect_err("a definition past the cap is refused");
    assert_eq!(e.status(), Some(422), "{e:?}");
    assert!(e.to_string().contains("KiB"), "the message names the limit: {e}");
    assert!(c.list_runs("big", None, None).await.unwrap().runs.is_empty(), "no run was stored");

    // An ordinary run is listed as a summary without its definition.
    let _small = repo_with(&server, &c, "small", "version: 1\njobs:\n  - name: a\n    steps: [\"true\"]\n").await;
    let run = c.submit_run("small", &sub, None).await.unwrap().run_id;
    let raw: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/repos/small/workflow-runs?limit=500", server.url))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = &raw["runs"][0];
    assert_eq!(listed["id"], run.as_str());
    assert!(listed.get("definition").is_none() && listed.get("jobs").is_none(), "{listed}");
}

/// Finding 10 (inputs): an oversized input is refused with 422 (not
/// accepted and then failed as infrastructure at every attempt), nothing
/// stored; an oversized body is 413 in the API's JSON error shape.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_inputs_are_422_and_oversized_bodies_413_json() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let _repo = repo_with(&server, &c, "r", "version: 1\njobs:\n  - name: a\n    steps: [\"true\"]\n").await;
    let before = names_under(&server.data_dir());
    for inputs in [
        BTreeMap::from([("blob".to_string(), "x".repeat(200 * 1024))]),
        (0..10).map(|i| (format!("k{i}"), "y".repeat(15 * 1024))).collect(),
    ] {
        let sub = SubmitRun { commit_sha: "HEAD".into(), workflow_path: None, inputs, event: None, priority: None };
        let e = c.submit_run("r", &sub, None).await.expect_err("oversized inputs are refused");
        assert_eq!(e.status(), Some(422), "{e:?}");
    }
    assert!(c.list_runs("r", None, None).await.unwrap().runs.is_empty(), "no run was stored");
    assert_eq!(names_under(&server.data_dir()), before, "nothing changed on disk");

    let res = reqwest::Client::new()
        .post(format!("{}/v1/repos", server.url))
        .bearer_auth(&server.token)
        .header("content-type", "application/json")
        .body(vec![b' '; 3 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 413);
    assert!(res.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("bytes"), "{body}");
}

/// Finding 10 (credentials): `?token=` no longer authenticates anything;
/// the UI signs in to an HttpOnly, SameSite=Strict cookie, and a
/// cookie-authenticated write needs the CSRF header.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_in_the_url_no_longer_authenticates() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let http = reqwest::Client::new();
    for path in ["/v1/repos", "/v1/jobs/nope/logs/events"] {
        let res = http.get(format!("{}{path}?token={}", server.url, server.token)).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 401, "{path}?token=… must not authenticate");
    }
    let res = http
        .post(format!("{}/v1/ui/session", server.url))
        .json(&serde_json::json!({"token": server.token}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 204);
    let cookie = res.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let jar = cookie.split(';').next().unwrap().to_string();
    let res = http.get(format!("{}/v1/repos", server.url)).header("cookie", &jar).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let create = serde_json::json!({"name": "r", "clone_url": "/nonexistent"});
    let res = http.post(format!("{}/v1/repos", server.url)).header("cookie", &jar).json(&create).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403, "a cookie-authenticated write without the CSRF header");
}

/// Finding 10 (headers and links): the UI and every API answer carry the
/// security headers; blobs are attachments under a sandboxing policy; a
/// download link comes from the public URL whatever `Host` the caller sent.
#[tokio::test(flavor = "multi_thread")]
async fn security_headers_attachments_and_links_from_the_public_url() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let _agent = server.agent("a1", &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &handoff_workflow(1000))]).unwrap();
    server.add_repo("h", &repo);
    let sub = SubmitRun {
        commit_sha: "HEAD".into(),
        workflow_path: None,
        inputs: BTreeMap::new(),
        event: None,
        priority: None,
    };
    let run = c.submit_run("h", &sub, None).await.unwrap().run_id;

    let http = reqwest::Client::new();
    let ui = http.get(format!("{}/", server.url)).send().await.unwrap();
    let h = ui.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'sha256-") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    let api = http.get(format!("{}/v1/repos", server.url)).bearer_auth(&server.token).send().await.unwrap();
    assert_eq!(api.headers()["x-content-type-options"], "nosniff");

    let done = wait_run(&c, &run, 120).await;
    assert!(done.status.is_success(), "{done:?}");
    // The caller lies about the host: the link is still the server's own.
    let link: serde_json::Value = http
        .get(format!("{}/v1/workflow-runs/{run}/artifacts/compile/app", server.url))
        .bearer_auth(&server.token)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = link["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("{}/blob/", server.url)), "{url}");
    let blob = http.get(url).send().await.unwrap();
    assert_eq!(blob.status().as_u16(), 200);
    let h = blob.headers();
    assert!(h["content-disposition"].to_str().unwrap().starts_with("attachment"), "{h:?}");
    assert!(h["content-security-policy"].to_str().unwrap().contains("sandbox"), "{h:?}");
    assert_eq!(h["x-content-type-options"], "nosniff");

    // With --public-url, links use it (a replica on the same data dir).
    let public = server.replica(&["--public-url", "https://ci.example.test/kiln"]).unwrap();
    let link: serde_json::Value = http
        .get(format!("{}/v1/workflow-runs/{run}/artifacts/compile/app", public.url))
        .bearer_auth(&server.token)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = link["url"].as_str().unwrap();
    assert!(url.starts_with("https://ci.example.test/kiln/blob/"), "{url}");
}

/// What a step prints to attack the terminal of whoever reads its log.
const HOSTILE_OUTPUT: &str = r#"printf 'A\033[31mred\033[0mB \033]52;c;cHduZWQ=\007C \033]8;;https://evil.example/\033\\link\033]8;;\033\\ \033]0;pwned-title\007 \033[2J\033[1Aend\n'"#;

/// `cmd` run under a pseudo-terminal (`script`), its output as bytes.
fn on_a_terminal(cmd: &str, env: &[(&str, &str)]) -> Vec<u8> {
    let mut c = Command::new("script");
    c.args(["-qec", cmd, "/dev/null"]).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("script(1) from util-linux");
    [out.stdout, out.stderr].concat()
}

/// Every ESC in `out` starts an SGR sequence (`ESC [ digits ; : m`).
fn only_sgr(out: &[u8]) -> bool {
    let mut rest = out;
    while let Some(i) = rest.iter().position(|&b| b == 0x1b) {
        let seq = &rest[i + 1..];
        let n = seq.iter().skip(1).take_while(|b| b.is_ascii_digit() || **b == b';' || **b == b':').count();
        if seq.first() != Some(&b'[') || seq.get(1 + n) != Some(&b'm') {
            return false;
        }
        rest = &seq[n + 2..];
    }
    true
}

/// Finding 9: on a terminal, `kiln logs` and `kiln run --follow` keep
/// colours and drop OSC 52 (clipboard), OSC 8 (links), title changes and
/// cursor movement; piped, the log's bytes are unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn cli_output_on_a_terminal_keeps_colours_and_drops_other_escapes() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let yaml = format!(
        "version: 1\njobs:\n  - name: loud\n    steps:\n      - {}\n",
        serde_json::to_string(HOSTILE_OUTPUT).unwrap()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &yaml)]).unwrap();
    let out = up.cli().args(["repo", "add", "loud", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env = [("KILN_SERVER", up.url.as_str()), ("KILN_TOKEN", up.token.as_str())];

    let follow = on_a_terminal(&format!("'{BIN}' run --repo loud --follow"), &env);
    let text = String::from_utf8_lossy(&follow);
    // The step's output line: colours kept, the OSC payloads and the
    // cursor movement gone. (The step header quotes the command as text.)
    assert!(text.contains("\r\nA\x1b[31mred\x1b[0mB C link  end\r\n"), "{text:?}");
    assert!(only_sgr(&follow), "only SGR escapes reach the terminal: {text:?}");

    let c = Client::new(&up.url, &up.token);
    let run = c.list_runs("loud", None, None).await.unwrap().runs[0].id.clone();
    let logs = on_a_terminal(&format!("'{BIN}' logs {run}"), &env);
    let text = String::from_utf8_lossy(&logs);
    assert!(text.contains("\r\nA\x1b[31mred\x1b[0mB C link  end\r\n"), "{text:?}");
    assert!(only_sgr(&logs), "{text:?}");

    // Not a terminal: the bytes as the step wrote them.
    let piped = up.cli().args(["logs", &run]).output().unwrap();
    assert!(String::from_utf8_lossy(&piped.stdout).contains("\x1b]52;c;cHduZWQ=\x07"));
}

/// A self-signed certificate for 127.0.0.1 and localhost: (cert, key) PEM.
fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// TLS: `kiln up --tls-cert/--tls-key` serves HTTPS (its own agents trust
/// the certificate and run a job), a client that trusts the certificate
/// works end to end, one that does not is refused, plain HTTP gets no
/// answer, and the UI's session cookie is `Secure`.
#[tokio::test(flavor = "multi_thread")]
async fn tls_end_to_end_with_a_self_signed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let up = KilnUp::start_with(
        BIN.as_ref(),
        1,
        &["--tls-cert", cert_file.to_str().unwrap(), "--tls-key", key_file.to_str().unwrap()],
    )
    .unwrap();
    assert!(up.url.starts_with("https://127.0.0.1:"), "{}", up.url);

    // Not trusted: refused by the client.
    let untrusted = Client::new(&up.url, &up.token);
    assert!(untrusted.list_repos().await.is_err(), "a client without the certificate must not connect");
    // Plain HTTP to the TLS port: no HTTP answer.
    let plain = reqwest::Client::new().get(format!("http://{}/healthz", addr(&up.url))).send().await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());

    kiln_api::client::trust_root_pem(cert.as_bytes()).unwrap();
    let c = Client::new(&up.url, &up.token);
    let repo =
        TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [\"echo over-tls\"]\n")])
            .unwrap();
    c.create_repo(&CreateRepo {
        team: None,
        forge: Default::default(),
        name: "t".into(),
        clone_url: repo.path().display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await
    .unwrap();
    let sub = SubmitRun {
        commit_sha: "HEAD".into(),
        workflow_path: None,
        inputs: BTreeMap::new(),
        event: None,
        priority: None,
    };
    let run = c.submit_run("t", &sub, None).await.unwrap().run_id;
    let done = wait_run(&c, &run, 120).await;
    assert!(done.status.is_success(), "the local agent ran the job over TLS: {done:?}");

    // The CLI, trusting the certificate through KILN_CA_CERT, follows the log.
    let out = up.cli().env("KILN_CA_CERT", &cert_file).args(["logs", &run]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("over-tls"));

    let http = reqwest::Client::builder()
        .tls_certs_merge([reqwest::Certificate::from_pem(cert.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let res = http
        .post(format!("{}/v1/ui/session", up.url))
        .json(&serde_json::json!({"token": up.token}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 204);
    assert!(res.headers()["set-cookie"].to_str().unwrap().contains("; Secure"));
    assert!(res.headers().contains_key("strict-transport-security"));
}

/// TLS (agents): plain `http://` to a server that is not on loopback is
/// refused at start with a clear error unless `--insecure`; loopback http
/// stays allowed.
#[test]
fn agents_refuse_plain_http_off_loopback_without_insecure() {
    let work = tempfile::tempdir().unwrap();
    let agent = |server: &str, extra: &[&str]| {
        Command::new(BIN)
            .env("KILN_STORAGE_LEVELS", "off") // the host disk's fill is not under test
            .args(["agent", "--server", server, "--name", "a", "--work-dir"])
            .env("KILN_AGENT_TOKEN", "t")
            .arg(work.path())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let out = agent("http://10.255.255.1:7070", &[]).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refusing plain http://") && err.contains("--insecure"), "{err}");
    // With --insecure (and on loopback without it) the agent goes on to
    // reach its server (whatever answers there).
    for (server, extra) in [("http://10.255.255.1:7070", &["--insecure"][..]), ("http://127.0.0.1:9", &[][..])] {
        let mut child = agent(server, extra);
        std::thread::sleep(Duration::from_millis(1500));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("refusing plain http"), "{server} {extra:?}: {err}");
        assert!(err.contains("register"), "it tried to register: {server} {extra:?}: {err}");
    }
}
