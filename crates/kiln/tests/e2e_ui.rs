//! The embedded web UI in a real browser (Debian's headless Chromium driven
//! through chromedriver): sign in, the run page's job graph with a collapsed
//! matrix group that expands, a job's log streamed live, and log text that
//! tries to inject HTML rendered inert. Screenshots are kept under the
//! target dir (`CARGO_TARGET_TMPDIR/ui-*.png`).
//!
//! Needs `chromium` and `chromium-driver` (installed by `scripts/test`). With
//! `KILN_REQUIRE_BROWSER=1` (set by `scripts/test`) a missing browser fails the
//! test instead of skipping it.

use fantoccini::{ClientBuilder, Locator};
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

struct Driver(Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn shot(name: &str, png: &[u8]) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::write(dir.join(format!("ui-{name}.png")), png);
}

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// False (skip) when Chromium is missing, unless `KILN_REQUIRE_BROWSER=1`.
fn have_browser() -> bool {
    if std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    assert!(
        std::env::var("KILN_REQUIRE_BROWSER").as_deref() != Ok("1"),
        "chromium/chromedriver missing but KILN_REQUIRE_BROWSER=1"
    );
    eprintln!("skipping: install chromium and chromium-driver to run the browser test");
    false
}

/// A headless Chromium session through chromedriver; downloads go to
/// `downloads` when given.
async fn browser(downloads: Option<&std::path::Path>) -> (Driver, fantoccini::Client) {
    let port = free_port();
    let driver = Driver(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut opts = serde_json::json!({
        "binary": CHROMIUM,
        "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1200,900"]
    });
    if let Some(dir) = downloads {
        opts["prefs"] = serde_json::json!({
            "download.default_directory": dir,
            "download.prompt_for_download": false,
            "safebrowsing.enabled": false,
        });
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), opts);
    let mut b = ClientBuilder::rustls().unwrap();
    b.capabilities(caps);
    for _ in 0..100 {
        match b.connect(&format!("http://127.0.0.1:{port}")).await {
            Ok(c) => return (driver, c),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("no chromedriver session");
}

async fn sign_in(c: &fantoccini::Client, url: &str, token: &str) {
    let wait = c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));
    c.goto(&format!("{url}/")).await.unwrap();
    let input = wait.for_element(Locator::Css("form.signin input")).await.unwrap();
    input.send_keys(token).await.unwrap();
    c.find(Locator::Css("form.signin button")).await.unwrap().click().await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(30))
        .every(Duration::from_millis(100))
        .for_element(Locator::Css("#signout:not([hidden])"))
        .await
        .unwrap();
    // The session is an HttpOnly cookie: no script can read the token, and
    // nothing keeps it in the page's storage.
    let seen = c
        .execute("return [document.cookie, JSON.stringify(localStorage), JSON.stringify(sessionStorage)];", vec![])
        .await
        .unwrap();
    assert!(!seen.to_string().contains(token), "the token is visible to scripts: {seen}");
}

/// Waits until the text of `css` contains `needle`.
async fn wait_text(c: &fantoccini::Client, css: &str, needle: &str) -> bool {
    for _ in 0..300 {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && e.text().await.unwrap_or_default().contains(needle)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn sign_in_graph_and_live_log_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let gate = tempfile::tempdir().unwrap();
    let wf = format!(
        r#"version: 1
jobs:
  - name: test
    matrix: {{shard: [1, 2]}}
    steps:
      - printf '<script>document.title="pwned"</script> \033[31mred\033[0m shard %s\n' "$KILN_MATRIX_SHARD"
      - while [ ! -e {gate}/go ]; do sleep 0.05; done; echo after-gate
  - name: report
    needs: test
    steps: ["echo report"]
"#,
        gate = gate.path().display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "ui", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run = api.submit_run("ui", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();

    let (_driver, c) = browser(None).await;
    let wait = || c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));

    // Sign in.
    sign_in(&c, &up.url, &up.token).await;

    // The run page: the matrix is one collapsed node that expands on click.
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    let node = wait().for_element(Locator::XPath("//*[name()='text' and contains(., 'test ×2')]")).await.unwrap();
    shot("run-collapsed", &c.screenshot().await.unwrap());
    // Who started it and with what trust (issue 14).
    assert!(wait_text(&c, "dl.meta", "Started by").await);
    let meta = c.find(Locator::Css("dl.meta")).await.unwrap().text().await.unwrap();
    assert!(meta.contains("trusted") && meta.contains("manual"), "{meta}");
    node.click().await.unwrap();
    wait().for_element(Locator::XPath("//*[name()='text' and contains(., 'test (shard=1)')]")).await.unwrap();
    shot("run-expanded", &c.screenshot().await.unwrap());

    // A job's log streams live: the first step's line shows while the job still runs.
    let job = api.get_run(&run.run_id).await.unwrap().jobs[0].id.clone();
    c.goto(&format!("{}/#/runs/{}/jobs/{}", up.url, run.run_id, job)).await.unwrap();
    let mut live = false;
    for _ in 0..300 {
        let text = c.find(Locator::Css(".log")).await.ok();
        if let Some(t) = text
            && t.text().await.unwrap_or_default().contains("shard 1")
        {
            live = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(live, "the log line did not appear while the job was running");
    assert_eq!(api.get_run(&run.run_id).await.unwrap().jobs[0].status, "running");
    // Output that looks like HTML is shown as text and never runs.
    let log_text = c.find(Locator::Css(".log")).await.unwrap().text().await.unwrap();
    assert!(log_text.contains("<script>document.title=\"pwned\"</script>"), "{log_text}");
    assert!(!log_text.contains("\u{1b}["), "terminal escapes are not shown raw");
    let injected = c
        .execute(
            "return document.querySelectorAll('.log script').length + (document.title === 'pwned' ? 100 : 0);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(injected, serde_json::json!(0), "log text became markup");
    let red = c
        .execute("return [...document.querySelectorAll('.log span')].some(s => s.textContent.includes('red') && getComputedStyle(s).color !== getComputedStyle(document.querySelector('.log')).color);", vec![])
        .await
        .unwrap();
    assert_eq!(red, serde_json::json!(true), "ANSI colour rendered as a styled span");
    shot("log-live", &c.screenshot().await.unwrap());

    std::fs::write(gate.path().join("go"), "").unwrap();
    let done = kiln_testkit::wait_run(&api, &run.run_id, 120).await;
    assert_eq!(done.status, "success");
    let mut ended = false;
    for _ in 0..300 {
        let t = c.find(Locator::Css(".log")).await.unwrap().text().await.unwrap_or_default();
        if t.contains("after-gate") {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the rest of the log arrived live");
    shot("log-done", &c.screenshot().await.unwrap());

    // The session survives a reload (the cookie), and Sign out clears the
    // cookie: the browser no longer sends a credential.
    c.refresh().await.unwrap();
    wait().for_element(Locator::Css("#signout:not([hidden])")).await.unwrap();
    c.find(Locator::Css("#signout")).await.unwrap().click().await.unwrap();
    wait().for_element(Locator::Css("form.signin")).await.unwrap();
    let status = c
        .execute("return fetch('/v1/repos', {credentials: 'same-origin'}).then(r => r.status);", vec![])
        .await
        .unwrap();
    assert_eq!(status, serde_json::json!(401), "signed out, the browser holds no credential");
    c.close().await.unwrap();
}

/// Start a run from the UI, watch its log lines arrive, open an artifact
/// link (the file lands in the browser's download directory with the
/// published bytes), and cancel the run with the button.
#[tokio::test(flavor = "multi_thread")]
async fn start_run_open_artifact_and_cancel_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let wf = r#"version: 1
jobs:
  - name: build
    needs: []
    cache: {kind: deps, version: "1", paths: [deps]}
    steps:
      - mkdir -p out deps && printf 'artifact bytes of %s\n' "$KILN_RUN_ID" > out/app.txt && echo x > deps/x
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
  - name: slow
    needs: []
    steps:
      - i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "webapp", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let downloads = tempfile::tempdir().unwrap();
    let (_driver, c) = browser(Some(downloads.path())).await;
    let wait = || c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));
    sign_in(&c, &up.url, &up.token).await;

    // Start a run with the form on the runs page.
    let form = wait().for_element(Locator::Css("form.start-run")).await.unwrap();
    wait().for_element(Locator::Css("form.start-run select option[value='webapp']")).await.unwrap();
    shot("start-form", &c.screenshot().await.unwrap());
    form.find(Locator::Css("button[type=submit]")).await.unwrap().click().await.unwrap();
    let mut run_id = String::new();
    for _ in 0..300 {
        let url = c.current_url().await.unwrap();
        if let Some(id) = url.fragment().and_then(|f| f.strip_prefix("/runs/")) {
            run_id = id.to_string();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!run_id.is_empty(), "the form leads to the new run's page");
    let run = api.get_run(&run_id).await.unwrap();
    assert_eq!(run.repo, "webapp");

    // The slow job's log: lines appear while it runs.
    let slow = run.jobs.iter().find(|j| j.name == "slow").unwrap().id.clone();
    c.goto(&format!("{}/#/runs/{}/jobs/{}", up.url, run_id, slow)).await.unwrap();
    assert!(wait_text(&c, ".log", "tick 3").await, "log lines arrive live");
    shot("start-live-log", &c.screenshot().await.unwrap());

    // The artifact link on the run page downloads exactly the published bytes.
    kiln_testkit::until(&api, &run_id, 60, "build succeeding", |r| {
        r.jobs.iter().any(|j| j.name == "build" && j.status == "success")
    })
    .await;
    c.goto(&format!("{}/#/runs/{}", up.url, run_id)).await.unwrap();
    // The job's cache result shows on the run page (issue 15).
    assert!(wait_text(&c, "table.cards", "cache miss").await, "the job table shows the cache result");
    let link = wait().for_element(Locator::Css("button[title='Download app']")).await.unwrap();
    link.click().await.unwrap();
    let expected = format!("artifact bytes of {run_id}\n");
    let got = kiln_testkit::wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(downloads.path().join("app")).ok().filter(|s| *s == expected)
    });
    assert_eq!(
        got.as_deref(),
        Some(expected.as_str()),
        "downloaded artifact: {:?}",
        std::fs::read_dir(downloads.path()).unwrap().flatten().map(|e| e.path()).collect::<Vec<_>>()
    );

    // Cancel with the button (confirming the dialog): the run ends cancelled.
    let cancel = wait().for_element(Locator::XPath("//button[normalize-space()='Cancel']")).await.unwrap();
    cancel.click().await.unwrap();
    c.accept_alert().await.unwrap();
    let done = kiln_testkit::wait_run(&api, &run_id, 60).await;
    assert_eq!(done.status, "cancelled");
    assert!(wait_text(&c, "main", "cancelled").await, "the page shows it");
    shot("run-cancelled", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
}

/// The run form is made from the workflow's declared inputs (issue 16): a
/// select for a choice, a checkbox for a boolean, a number field; the values
/// chosen are what the run is frozen with. The declaration is read with
/// `GET /v1/repos/{repo}/workflow-inputs`, which a trigger token may call for
/// its own repository only.
#[tokio::test(flavor = "multi_thread")]
async fn run_form_is_made_from_declared_inputs_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = r#"version: 1
inputs:
  target: {type: choice, options: [staging, production], default: staging, description: Where to deploy}
  count: {type: number, default: 2}
  dry-run: {type: boolean, default: true}
  note: {type: string}
jobs:
  - name: show
    steps: ["echo \"target=${{ inputs.target }} count=${{ inputs.count }}\""]
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "formy", "--url"]).arg(repo.path()).status().unwrap().success());
    let other =
        TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo]\n")]).unwrap();
    assert!(up.cli().args(["repo", "add", "other", "--url"]).arg(other.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);

    // The declaration as the API gives it.
    let d = api.workflow_inputs("formy", "HEAD", None).await.unwrap();
    assert!(d.declared && d.manual);
    let names: Vec<&str> = d.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["count", "dry-run", "note", "target"]);
    let target = d.inputs.iter().find(|i| i.name == "target").unwrap();
    assert_eq!((target.kind.as_str(), target.options.len(), target.default.as_deref()), ("choice", 2, Some("staging")));
    // A trigger token of another repository learns nothing about this one.
    let t = api
        .create_token(&kiln_api::CreateToken {
            name: "other-trigger".into(),
            scope: "trigger".into(),
            repo: Some("other".into()),
            trusted: None,
        })
        .await
        .unwrap();
    let as_other = Client::new(&up.url, &t.token);
    assert_eq!(as_other.workflow_inputs("formy", "HEAD", None).await.unwrap_err().status(), Some(404));
    assert!(as_other.workflow_inputs("other", "HEAD", None).await.unwrap().inputs.is_empty());

    let (_driver, c) = browser(None).await;
    let wait = || c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));
    sign_in(&c, &up.url, &up.token).await;
    // Pick the repository: the fields appear.
    wait().for_element(Locator::Css("form.start-run select[name=repo] option[value='formy']")).await.unwrap();
    c.execute(
        "const s = document.querySelector('form.start-run select[name=repo]'); s.value = 'formy'; s.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await
    .unwrap();
    let choice = wait().for_element(Locator::Css("select[name='input-target']")).await.unwrap();
    choice.select_by_value("production").await.unwrap();
    let count = c.find(Locator::Css("input[name='input-count'][type=number]")).await.unwrap();
    count.send_keys("5").await.unwrap();
    let dry = c.find(Locator::Css("input[name='input-dry-run'][type=checkbox]")).await.unwrap();
    assert!(dry.prop("checked").await.unwrap().as_deref() == Some("true"), "the default is shown");
    dry.click().await.unwrap();
    shot("inputs-form", &c.screenshot().await.unwrap());
    c.find(Locator::Css("form.start-run button[type=submit]")).await.unwrap().click().await.unwrap();
    let mut run_id = String::new();
    for _ in 0..300 {
        let url = c.current_url().await.unwrap();
        if let Some(id) = url.fragment().and_then(|f| f.strip_prefix("/runs/")) {
            run_id = id.to_string();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!run_id.is_empty(), "the form leads to the new run's page");
    let run = kiln_testkit::wait_run(&api, &run_id, 120).await;
    assert_eq!(run.status, "success");
    let inputs: Vec<(&str, &str)> = run.inputs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(inputs, [("count", "5"), ("dry-run", "false"), ("target", "production")], "the frozen inputs");
    c.close().await.unwrap();
}
