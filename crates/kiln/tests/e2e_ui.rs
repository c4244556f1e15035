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

/// chromedriver in its own process group, killed with the Chromium it
/// started (a test that ends without closing its session left Chromium
/// running after the suite).
struct Driver(Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
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
    browser_in(downloads, None).await
}

/// [`browser`] with Chromium in the time zone `tz` (its `TZ`), so that
/// local-time rendering is checked against a zone that is not UTC.
async fn browser_in(downloads: Option<&std::path::Path>, tz: Option<&str>) -> (Driver, fantoccini::Client) {
    let port = free_port();
    let mut cmd = Command::new(CHROMEDRIVER);
    cmd.arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    if let Some(tz) = tz {
        cmd.env("TZ", tz);
    }
    let driver = Driver(cmd.spawn().unwrap());
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
    // The browser holds a `__Host-` cookie (Secure, host-only: Chromium
    // treats http://127.0.0.1 as a secure context) whose value is a session
    // id, not the token (issue 39).
    let cookie = c.get_named_cookie("__Host-kiln_session").await.expect("the __Host- session cookie");
    assert!(cookie.secure() == Some(true) && cookie.domain().is_none_or(|d| !d.starts_with('.')), "{cookie:?}");
    assert!(!cookie.value().contains(token) && !token.contains(cookie.value()), "{cookie:?}");
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
    let session = c.get_named_cookie("__Host-kiln_session").await.unwrap().value().to_string();
    c.find(Locator::Css("#signout")).await.unwrap().click().await.unwrap();
    wait().for_element(Locator::Css("form.signin")).await.unwrap();
    let status = c
        .execute("return fetch('/v1/repos', {credentials: 'same-origin'}).then(r => r.status);", vec![])
        .await
        .unwrap();
    assert_eq!(status, serde_json::json!(401), "signed out, the browser holds no credential");
    c.close().await.unwrap();
    // The session is gone on the server too: the cookie's old value,
    // replayed, authenticates nothing.
    let replay = reqwest::Client::new()
        .get(format!("{}/v1/repos", up.url))
        .header("cookie", format!("__Host-kiln_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status().as_u16(), 401, "a signed-out session id still authenticates");
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
      - mkdir -p site/sub && echo page > site/index.html && echo deep > site/sub/d.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
        - {name: site, path: site}
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

    // A directory artifact downloads as a normal .tar.gz of its tree
    // (issue 41, item 5), never Kiln's internal archive.
    let link = wait().for_element(Locator::Css("button[title='Download site (.tar.gz)']")).await.unwrap();
    link.click().await.unwrap();
    let tgz = downloads.path().join("site.tar.gz");
    let got = kiln_testkit::wait_for(Duration::from_secs(30), || {
        let out = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("tar").arg("-xzf").arg(&tgz).arg("-C").arg(out.path()).status().ok()?;
        let deep = std::fs::read_to_string(out.path().join("sub/d.txt")).ok()?;
        ok.success().then(|| (std::fs::read_to_string(out.path().join("index.html")).unwrap_or_default(), deep))
    });
    assert_eq!(got, Some(("page\n".to_string(), "deep\n".to_string())), "plain tar unpacks the UI's download");

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

/// Issue 41, item 3: a job no agent can take says why on the run page —
/// in the graph node instead of a bare "ready", and beside the job in the
/// table, naming the labels the agents have — and a job after it says it
/// waits for it; the page follows the reason as it changes (cancelled:
/// the reasons go).
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_job_says_why_on_the_run_page_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = "version: 1\njobs:\n  - name: build\n    runs-on: ubuntu-latest\n    steps: [echo never]\n  - name: deploy\n    \
              steps: [echo never]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "gha", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("gha", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    let why = format!(
        "waiting: no connected agent has labels {{os: ubuntu-latest}}; agents: local-1 {{arch: {arch}, os: {os}}}"
    );
    kiln_testkit::until(&api, &run.run_id, 60, "build to say why it waits", |r| {
        r.jobs[0].waiting.as_deref() == Some(why.as_str())
    })
    .await;

    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, "td .waiting[data-job='build']", &why).await, "the reason beside the job");
    assert!(wait_text(&c, "td .waiting[data-job='deploy']", "waiting for needs: build (ready)").await);
    // The graph node says it too, not a bare "ready" (the node's text is
    // clipped; its title has it all).
    let node = c
        .find(Locator::XPath("//*[name()='g' and contains(@class, 'node')][.//*[name()='text' and .='build']]"))
        .await
        .unwrap();
    let sub = node.find(Locator::Css("text.sub")).await.unwrap().text().await.unwrap();
    assert!(sub.starts_with("waiting: no connected agent"), "{sub}");
    let title = node.find(Locator::Css("title")).await.unwrap().html(true).await.unwrap();
    assert!(title.contains(&why), "{title}");
    shot("run-waiting", &c.screenshot().await.unwrap());

    // The page follows: cancelled, nothing waits any more.
    api.cancel_run(&run.run_id).await.unwrap();
    assert!(wait_text(&c, "main", "cancelled").await);
    for _ in 0..300 {
        if c.find_all(Locator::Css(".waiting")).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.find_all(Locator::Css(".waiting")).await.unwrap().is_empty(), "no reason left once cancelled");
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

// ---------- issue 17: the web UI's pages ----------

/// Runs `js` (a function body that returns a value) until it returns
/// `want`; the last value it returned otherwise.
async fn wait_js(c: &fantoccini::Client, js: &str, want: serde_json::Value) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..300 {
        match c.execute(js, vec![]).await {
            Ok(v) if v == want => return v,
            Ok(v) => last = v,
            Err(e) => last = serde_json::Value::String(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// The current URL's fragment once it starts with `prefix`.
async fn wait_fragment(c: &fantoccini::Client, prefix: &str) -> String {
    for _ in 0..300 {
        let url = c.current_url().await.unwrap();
        if let Some(f) = url.fragment()
            && f.starts_with(prefix)
        {
            return f.to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the URL never reached #{prefix}: {}", c.current_url().await.unwrap());
}

/// Rows of the first `table.cards` body (a `td[colspan]` notice is no row).
const ROWS: &str = "return [...document.querySelectorAll('table.cards tbody tr')].filter(r => !r.querySelector('td[colspan]')).length;";

async fn wait_run_done(api: &Client, run: &str) -> kiln_api::Run {
    kiln_testkit::wait_run(api, run, 120).await
}

/// The agents page lists every registered agent with its labels, capacity,
/// what it runs, when it was last seen and its version; it survives a reload.
/// The repositories page adds a repository; its page sets and deletes a
/// secret, whose value never reaches the page (the API gives names only).
#[tokio::test(flavor = "multi_thread")]
async fn agents_repos_and_secrets_pages_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let api = Client::new(&up.url, &up.token);
    let agents = {
        let mut found = Vec::new();
        for _ in 0..300 {
            found = api.list_agents().await.unwrap();
            if found.len() == 2 && found.iter().all(|a| a.connected) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        found
    };
    assert_eq!(agents.len(), 2, "{agents:?}");
    let (_driver, c) = browser(None).await;
    let wait = || c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));
    sign_in(&c, &up.url, &up.token).await;

    // Agents: from the nav link, then as a deep link after a reload.
    c.find(Locator::Css("header nav a[href='#/agents']")).await.unwrap().click().await.unwrap();
    for pass in ["clicked", "reloaded"] {
        for a in &agents {
            let row = format!("table.agents tr[data-agent='{}']", a.name);
            assert!(wait_text(&c, &row, &a.name).await, "{pass}: agent {} listed", a.name);
            let text = c.find(Locator::Css(&row)).await.unwrap().text().await.unwrap();
            assert!(text.contains(&format!("{} / {}", a.running_jobs, a.max_jobs)), "{pass}: capacity in {text:?}");
            for (k, v) in &a.labels {
                assert!(text.contains(&format!("{k}={v}")), "{pass}: label {k}={v} in {text:?}");
            }
            if let Some(v) = &a.version {
                assert!(text.contains(v.as_str()), "{pass}: version in {text:?}");
            }
            assert!(text.contains("idle") && text.contains("ago"), "{pass}: state and last seen in {text:?}");
        }
        assert!(wait_text(&c, "main", "2 agents · 2 connected").await);
        shot("agents", &c.screenshot().await.unwrap());
        c.refresh().await.unwrap();
        assert_eq!(wait_fragment(&c, "/agents").await, "/agents");
    }

    // Repositories: add one with the form; its page opens.
    let repo =
        TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo]\n")]).unwrap();
    c.goto(&format!("{}/#/repos", up.url)).await.unwrap();
    let form = wait().for_element(Locator::Css("form.add-repo")).await.unwrap();
    form.find(Locator::Css("input[name=name]")).await.unwrap().send_keys("fromui").await.unwrap();
    form.find(Locator::Css("input[name=clone_url]"))
        .await
        .unwrap()
        .send_keys(&repo.path().display().to_string())
        .await
        .unwrap();
    form.find(Locator::Css("button[type=submit]")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_fragment(&c, "/repos/").await, "/repos/fromui");
    assert_eq!(api.get_repo("fromui").await.unwrap().clone_url, repo.path().display().to_string());
    assert!(wait_text(&c, "dl.meta", &repo.path().display().to_string()).await);
    c.goto(&format!("{}/#/repos", up.url)).await.unwrap();
    assert!(wait_text(&c, "table.repos", "fromui").await, "listed");

    // A secret: set with the form, listed by name; its value is nowhere on
    // the page and the API returns names only.
    const VALUE: &str = "s3cr3t-value-9f1c";
    c.goto(&format!("{}/#/repos/fromui", up.url)).await.unwrap();
    let form = wait().for_element(Locator::Css("form.put-secret")).await.unwrap();
    form.find(Locator::Css("input[name=secret-name]")).await.unwrap().send_keys("DEPLOY_KEY").await.unwrap();
    let value = form.find(Locator::Css("input[name=secret-value]")).await.unwrap();
    assert_eq!(value.attr("type").await.unwrap().as_deref(), Some("password"));
    value.send_keys(VALUE).await.unwrap();
    form.find(Locator::Css("button[type=submit]")).await.unwrap().click().await.unwrap();
    assert!(wait_text(&c, "table.secrets", "DEPLOY_KEY").await, "the secret is listed");
    let secrets = api.list_secrets("fromui").await.unwrap();
    assert_eq!(secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["DEPLOY_KEY"]);
    let page = c
        .execute(
            "return document.documentElement.outerHTML + [...document.querySelectorAll('input')].map(i => i.value).join(' ');",
            vec![],
        )
        .await
        .unwrap();
    assert!(!page.to_string().contains(VALUE), "the secret's value is on the page");
    let raw = c
        .execute("return fetch('/v1/repos/fromui/secrets', {credentials: 'same-origin'}).then(r => r.text());", vec![])
        .await
        .unwrap();
    assert!(raw.to_string().contains("DEPLOY_KEY") && !raw.to_string().contains(VALUE), "{raw}");
    shot("repo-secrets", &c.screenshot().await.unwrap());
    // The page is a deep link too.
    c.refresh().await.unwrap();
    assert!(wait_text(&c, "table.secrets", "DEPLOY_KEY").await, "listed after a reload");
    // Delete it (confirming).
    wait()
        .for_element(Locator::Css("button[aria-label='Delete secret DEPLOY_KEY']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.accept_alert().await.unwrap();
    assert!(wait_text(&c, "table.secrets", "No secrets.").await);
    assert!(api.list_secrets("fromui").await.unwrap().is_empty());
    c.close().await.unwrap();
}

/// The run page shows the commit's message and author; a job's log has a
/// section per step with its outcome and duration that collapses; "Retry
/// failed jobs" starts a run where only the failed job runs again; run
/// pages follow the run over SSE.
#[tokio::test(flavor = "multi_thread")]
async fn commit_steps_and_retry_failed_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    // Steps run as another user (uid 65534 under root): a dir they may read.
    let marker = kiln_testkit::step_writable_tempdir().unwrap();
    let wf = format!(
        r#"version: 1
jobs:
  - name: build
    needs: []
    steps:
      - name: compile
        run: echo compiling
  - name: flaky
    needs: []
    steps:
      - name: prepare
        run: echo preparing
      - name: check
        run: test -e {m}/ok || {{ echo not yet; exit 3; }}
      - name: after
        run: echo never
"#,
        m = marker.path().display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let sha = repo.commit(&[("NOTES", "x\n")], "Add the flaky check\n\nIt fails until the marker exists.").unwrap();
    assert!(up.cli().args(["repo", "add", "steps", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("steps", &SubmitRun { commit_sha: sha.clone(), ..Default::default() }, None).await.unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "failed");
    let flaky = done.jobs.iter().find(|j| j.name == "flaky").unwrap();
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;

    // Commit message (subject and body), author and the full SHA.
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, "dl.meta", "Add the flaky check").await);
    let meta = c.find(Locator::Css("dl.meta")).await.unwrap().text().await.unwrap();
    assert!(meta.contains("It fails until the marker exists."), "{meta}");
    assert!(meta.contains("kiln-test") && meta.contains("test@kiln.invalid"), "{meta}");
    assert!(meta.contains(&sha), "{meta}");

    // Step sections of the failed job: outcomes and durations as recorded.
    c.goto(&format!("{}/#/runs/{}/jobs/{}", up.url, run.run_id, flaky.id)).await.unwrap();
    let outcomes = "return [...document.querySelectorAll('.log section.step .step-head .badge')].map(b => b.textContent).join(',');";
    assert_eq!(wait_js(&c, outcomes, "success,failure,skipped".into()).await, "success,failure,skipped");
    let names = c
        .execute("return [...document.querySelectorAll('.log section.step .nm')].map(b => b.textContent);", vec![])
        .await
        .unwrap();
    assert_eq!(names, serde_json::json!(["1/3 · prepare", "2/3 · check", "3/3 · after"]));
    let durs = c
        .execute("return [...document.querySelectorAll('.log section.step .dur')].map(b => b.textContent);", vec![])
        .await
        .unwrap();
    let durs: Vec<String> = serde_json::from_value(durs).unwrap();
    assert!(durs[0].ends_with('s') && durs[1].ends_with('s') && durs[2].is_empty(), "durations {durs:?}");
    // A step's lines are inside its section; its header collapses them. A
    // finished log opens with its successful steps collapsed (issue 42),
    // the failed one open.
    assert!(wait_text(&c, ".log section.step[data-step='2']", "not yet").await);
    let head = c.find(Locator::Css(".log section.step[data-step='1'] .step-head")).await.unwrap();
    let expanded =
        "return document.querySelector(\".log section.step[data-step='1'] .step-head\").getAttribute('aria-expanded');";
    assert_eq!(wait_js(&c, expanded, "false".into()).await, "false", "the successful step is collapsed");
    let log = c.find(Locator::Css(".log")).await.unwrap().text().await.unwrap();
    assert!(!log.contains("preparing") && log.contains("not yet"), "step 1 collapsed: {log}");
    shot("steps-collapsed", &c.screenshot().await.unwrap());
    head.click().await.unwrap();
    assert_eq!(head.attr("aria-expanded").await.unwrap().as_deref(), Some("true"));
    assert!(wait_text(&c, ".log", "preparing").await, "expanded");
    head.click().await.unwrap();
    assert_eq!(head.attr("aria-expanded").await.unwrap().as_deref(), Some("false"));
    head.click().await.unwrap();
    assert!(wait_text(&c, ".log", "preparing").await, "expanded again");

    // Retry failed jobs: the new run re-runs only `flaky`; `build` is kept.
    std::fs::write(marker.path().join("ok"), "").unwrap();
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    let btn = c
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("button.retry-failed:not([disabled])"))
        .await
        .unwrap();
    btn.click().await.unwrap();
    let mut new_id = String::new();
    for _ in 0..300 {
        let url = c.current_url().await.unwrap();
        let id = url.fragment().unwrap_or_default().trim_start_matches("/runs/").to_string();
        if id != run.run_id && !id.contains('/') && !id.is_empty() {
            new_id = id;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(new_id, run.run_id, "the button leads to the new run");
    let retried = wait_run_done(&api, &new_id).await;
    assert_eq!(retried.status, "success");
    assert_eq!(retried.parent_run_id.as_deref(), Some(run.run_id.as_str()));
    let build = retried.jobs.iter().find(|j| j.name == "build").unwrap();
    assert!(build.attempts.is_empty(), "build was pinned, not run again: {build:?}");
    let flaky2 = retried.jobs.iter().find(|j| j.name == "flaky").unwrap();
    assert_eq!(flaky2.attempts.len(), 1);
    // The open page followed the run to its end over SSE.
    assert!(wait_text(&c, "main h1 + .badge", "success").await, "the run page shows success");
    let disabled = c.execute("return document.querySelector('button.retry-failed').disabled;", vec![]).await.unwrap();
    assert_eq!(disabled, serde_json::json!(true), "nothing failed: nothing to retry");
    shot("retried", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
}

/// The runs list filters by repository, status, event, branch and actor,
/// and pages, on the server (the query lives in the URL's hash, so a
/// filtered list survives a reload); new runs arrive over SSE, with no
/// request repeated while the page is open.
#[tokio::test(flavor = "multi_thread")]
async fn runs_list_filters_pages_and_live_updates_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let wf = "version: 1\njobs:\n  - name: a\n    steps: [echo hi]\n";
    let (ra, rb) = (
        TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap(),
        TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap(),
    );
    assert!(up.cli().args(["repo", "add", "alpha", "--url"]).arg(ra.path()).status().unwrap().success());
    assert!(up.cli().args(["repo", "add", "beta", "--url"]).arg(rb.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let submit = |c: Client, repo: &'static str, event: Option<&'static str>| async move {
        let req = SubmitRun { commit_sha: "main".into(), event: event.map(Into::into), ..Default::default() };
        c.submit_run(repo, &req, None).await.unwrap().run_id
    };
    let mut alpha = Vec::new();
    for _ in 0..3 {
        alpha.push(submit(api.clone(), "alpha", None).await);
    }
    let beta = submit(api.clone(), "beta", Some("push")).await;
    let bot = api
        .create_token(&kiln_api::CreateToken {
            name: "ci-bot".into(),
            scope: "trigger".into(),
            repo: Some("alpha".into()),
            // Trusted, so `kiln up`'s host agents run it (an untrusted run
            // would wait for an agent of the `forks` pool).
            trusted: Some(true),
        })
        .await
        .unwrap();
    let by_bot = submit(Client::new(&up.url, &bot.token), "alpha", None).await;
    alpha.push(by_bot.clone());
    for r in alpha.iter().chain([&beta]) {
        wait_run_done(&api, r).await;
    }
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    let ids = "return [...document.querySelectorAll('table.cards tbody tr a.mono')].map(a => a.getAttribute('href').slice(7));";

    // By repository, as a deep link; the filter survives a reload.
    c.goto(&format!("{}/#/?repo=beta", up.url)).await.unwrap();
    for _ in 0..2 {
        assert_eq!(wait_js(&c, ids, serde_json::json!([beta])).await, serde_json::json!([beta]));
        let sel = c.execute("return document.querySelector('select[name=f-repo]').value;", vec![]).await.unwrap();
        assert_eq!(sel, "beta");
        c.refresh().await.unwrap();
    }
    // By event, chosen in the form: the hash follows.
    c.goto(&format!("{}/#/", up.url)).await.unwrap();
    assert_eq!(wait_js(&c, ROWS, 5.into()).await, 5);
    // Each row names its run by number, workflow and who started it
    // (issue 42): alpha's fourth run was the bot's, beta's first the admin's.
    let numbers =
        "return [...document.querySelectorAll('table.cards tbody tr td[data-l=\"#\"]')].map(td => td.textContent);";
    let shown = serde_json::json!(["#4", "#1", "#3", "#2", "#1"]);
    assert_eq!(wait_js(&c, numbers, shown.clone()).await, shown);
    assert!(wait_text(&c, "table.cards tbody", "pipeline").await);
    assert!(wait_text(&c, "table.cards tbody", "ci-bot").await);
    let rows = c.find(Locator::Css("table.cards tbody")).await.unwrap().text().await.unwrap();
    assert!(!rows.contains("admin.token") && rows.contains("admin"), "{rows}");
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("select[name=f-event] option[value=push]"))
        .await
        .unwrap();
    c.find(Locator::Css("select[name=f-event]")).await.unwrap().select_by_value("push").await.unwrap();
    assert_eq!(wait_fragment(&c, "/?").await, "/?event=push");
    assert_eq!(wait_js(&c, ids, serde_json::json!([beta])).await, serde_json::json!([beta]));
    // By actor (typed, then Filter), by status, by branch.
    c.goto(&format!("{}/#/", up.url)).await.unwrap();
    let actor =
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("input[name=f-actor]")).await.unwrap();
    // A token's runs show (and filter by) the token's name; the bootstrap
    // admin token's as `admin`, never `admin.token` (issue 42).
    let bot_actor = api.get_run(&by_bot).await.unwrap().actor.unwrap();
    assert_eq!(bot_actor, "ci-bot");
    assert_eq!(api.get_run(&beta).await.unwrap().actor.as_deref(), Some("admin"));
    actor.send_keys(&bot_actor).await.unwrap();
    c.find(Locator::Css("form.filters button[type=submit]")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_fragment(&c, "/?actor=").await, "/?actor=ci-bot");
    assert_eq!(wait_js(&c, ids, serde_json::json!([by_bot])).await, serde_json::json!([by_bot]));
    c.goto(&format!("{}/#/?status=failed", up.url)).await.unwrap();
    assert!(wait_text(&c, "table.cards", "No runs match.").await);
    c.goto(&format!("{}/#/?branch=main&repo=alpha", up.url)).await.unwrap();
    assert_eq!(wait_js(&c, ROWS, 4.into()).await, 4);
    c.goto(&format!("{}/#/?branch=nope", up.url)).await.unwrap();
    assert!(wait_text(&c, "table.cards", "No runs match.").await);

    // Pages of two (newest first): the server's cursor, no run twice.
    c.goto(&format!("{}/#/?repo=alpha&limit=2", up.url)).await.unwrap();
    let newest_first: Vec<String> = alpha.iter().rev().cloned().collect();
    assert_eq!(wait_js(&c, ids, serde_json::json!(newest_first[..2])).await, serde_json::json!(newest_first[..2]));
    c.find(Locator::Css("button.older")).await.unwrap().click().await.unwrap();
    assert!(wait_fragment(&c, "/?repo=alpha&before=").await.ends_with("&limit=2"));
    assert_eq!(wait_js(&c, ids, serde_json::json!(newest_first[2..])).await, serde_json::json!(newest_first[2..]));
    c.refresh().await.unwrap();
    assert_eq!(wait_js(&c, ids, serde_json::json!(newest_first[2..])).await, serde_json::json!(newest_first[2..]));
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("a.newest"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(wait_js(&c, ids, serde_json::json!(newest_first[..2])).await, serde_json::json!(newest_first[..2]));

    // Live: a new run shows up without a reload, and the page repeats no
    // request (one event stream, no polling).
    c.goto(&format!("{}/#/", up.url)).await.unwrap();
    assert_eq!(wait_js(&c, ROWS, 5.into()).await, 5);
    let requests =
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/workflow-runs')).length;";
    let before = c.execute(requests, vec![]).await.unwrap();
    let fresh = submit(api.clone(), "beta", None).await;
    let row = format!("return !!document.querySelector(\"a[href='#/runs/{fresh}']\");");
    assert_eq!(wait_js(&c, &row, true.into()).await, true, "the new run arrived");
    wait_run_done(&api, &fresh).await;
    let finished = format!(
        "return document.querySelector(\"a[href='#/runs/{fresh}']\").closest('tr').textContent.includes('success');"
    );
    assert_eq!(wait_js(&c, &finished, true.into()).await, true, "its status followed");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = c.execute(requests, vec![]).await.unwrap();
    assert_eq!(before, after, "no request repeated while the list was open");
    shot("runs-filtered", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
}

/// The theme toggle switches light and dark and is remembered across
/// reloads; timestamps are in the viewer's time zone (Chromium runs in
/// Asia/Kolkata here); deep links to a log line, the agents page and a
/// repository survive a reload; an unknown page says so.
#[tokio::test(flavor = "multi_thread")]
async fn theme_local_time_and_deep_links_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = "version: 1\njobs:\n  - name: lines\n    steps: [\"printf 'one\\\\ntwo\\\\nthree\\\\n'\"]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "deep", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("deep", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "success");
    let (_driver, c) = browser_in(None, Some("Asia/Kolkata")).await;
    sign_in(&c, &up.url, &up.token).await;

    // Theme: the toggle flips it, the choice is kept.
    let theme =
        "return [document.documentElement.dataset.theme || '', getComputedStyle(document.body).backgroundColor];";
    let start = c.execute(theme, vec![]).await.unwrap();
    assert_eq!(start, serde_json::json!(["", "rgb(255, 255, 255)"]), "headless Chromium prefers light");
    c.find(Locator::Css("#theme")).await.unwrap().click().await.unwrap();
    assert_eq!(c.execute(theme, vec![]).await.unwrap(), serde_json::json!(["dark", "rgb(15, 19, 24)"]));
    let label = c.find(Locator::Css("#theme")).await.unwrap().attr("aria-label").await.unwrap();
    assert_eq!(label.as_deref(), Some("Switch to light theme"));
    c.refresh().await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#signout:not([hidden])")).await.unwrap();
    assert_eq!(c.execute(theme, vec![]).await.unwrap(), serde_json::json!(["dark", "rgb(15, 19, 24)"]), "kept");
    shot("dark", &c.screenshot().await.unwrap());
    c.find(Locator::Css("#theme")).await.unwrap().click().await.unwrap();
    assert_eq!(c.execute(theme, vec![]).await.unwrap(), serde_json::json!(["light", "rgb(255, 255, 255)"]));
    c.refresh().await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#signout:not([hidden])")).await.unwrap();
    assert_eq!(c.execute(theme, vec![]).await.unwrap(), serde_json::json!(["light", "rgb(255, 255, 255)"]));

    // Local time: the run's creation in the browser's zone, named.
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, "dd.created", "GMT+5:30").await, "the zone is named");
    let shown = c
        .execute(
            "const t = document.querySelector('dd.created time');
             const f = new Intl.DateTimeFormat(undefined, { year: 'numeric', month: 'short', day: 'numeric',
               hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short', timeZone: 'Asia/Kolkata' });
             return [Intl.DateTimeFormat().resolvedOptions().timeZone, new Date(t.dateTime).getTime(),
                     t.textContent === f.format(new Date(t.dateTime))];",
            vec![],
        )
        .await
        .unwrap();
    // `datetime` keeps the exact instant; whole milliseconds of the API's value.
    // (ICU may name the zone by its older alias.)
    assert!(["Asia/Kolkata", "Asia/Calcutta"].contains(&shown[0].as_str().unwrap_or_default()), "{shown}");
    assert_eq!((&shown[1], &shown[2]), (&serde_json::json!(done.created_at_ms), &serde_json::json!(true)), "{shown}");

    // Deep links: a log line, highlighted again after a reload.
    let job = &done.jobs[0].id;
    c.goto(&format!("{}/#/runs/{}/jobs/{}?line=3", up.url, run.run_id, job)).await.unwrap();
    for _ in 0..2 {
        let hl = "const l = document.querySelectorAll('.ln.hl'); return l.length === 1 ? l[0].id : l.length;";
        assert_eq!(wait_js(&c, hl, "L3".into()).await, "L3", "line 3 highlighted");
        c.refresh().await.unwrap();
    }
    // Pages by their hash, after a reload.
    for (hash, h1) in [("/agents", "Agents"), ("/repos", "Repositories"), ("/repos/deep", "deep")] {
        c.goto(&format!("{}/#{hash}", up.url)).await.unwrap();
        c.refresh().await.unwrap();
        assert!(wait_text(&c, "main h1", h1).await, "#{hash} after a reload");
    }
    c.goto(&format!("{}/#/no/such/page", up.url)).await.unwrap();
    assert!(wait_text(&c, "main h1", "Not found").await);
    c.close().await.unwrap();
}

const AXE: &str = include_str!("fixtures/axe/axe.min.js");

/// axe-core's violations on the current page, of any impact (issue 42:
/// every page passes with none).
async fn axe_violations(c: &fantoccini::Client) -> Vec<String> {
    let have = c.execute("return typeof window.axe;", vec![]).await.unwrap();
    if have != "object" {
        c.execute(AXE, vec![]).await.unwrap();
        let have = c.execute("return typeof window.axe;", vec![]).await.unwrap();
        assert_eq!(have, "object", "axe-core loaded");
    }
    let v = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, { resultTypes: ['violations'] }).then(r => done(r.violations
               .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' — ' + v.nodes.slice(0, 4)
                 .map(n => n.target.join(' ') + ': ' + (n.failureSummary || '').replace(/\\s+/g, ' ')).join(' | '))),
               e => done(['axe failed: ' + e]));",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// Horizontal overflow of the current page: (innerWidth, scrollWidth).
async fn widths(c: &fantoccini::Client) -> (i64, i64) {
    let v = c.execute("return [innerWidth, document.documentElement.scrollWidth];", vec![]).await.unwrap();
    (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
}

/// Every page (sign-in, runs, a run with inputs, outputs and artifacts, a
/// job's log, agents, repositories, a repository, not found) passes
/// axe-core with no violation at all, in the light and the dark theme, and
/// fits a 375 px wide screen.
#[tokio::test(flavor = "multi_thread")]
async fn accessibility_and_narrow_screen_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = "version: 1\ninputs:\n  target: {type: string, default: staging}\njobs:\n  - name: works\n    needs: []\n    outputs: [version]\n    artifacts:\n      publish:\n        - {name: report, path: out/report.txt}\n    steps:\n      - name: hello\n        run: echo hello world; mkdir -p out; echo x > out/report.txt; echo version=1.0 >> \"$KILN_OUTPUT\"\n  - name: breaks\n    needs: []\n    steps:\n      - name: fail\n        run: \"echo a-rather-long-line-without-any-space-that-must-scroll-inside-the-log-box-and-not-widen-the-page-0123456789; exit 1\"\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(
        up.cli()
            .args(["repo", "add", "a11y-repository-with-a-long-name", "--url"])
            .arg(repo.path())
            .status()
            .unwrap()
            .success()
    );
    let api = Client::new(&up.url, &up.token);
    api.put_secret("a11y-repository-with-a-long-name", "API_TOKEN", "x").await.unwrap();
    let run = api
        .submit_run(
            "a11y-repository-with-a-long-name",
            &SubmitRun { commit_sha: "main".into(), ..Default::default() },
            None,
        )
        .await
        .unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "failed");
    let breaks = done.jobs.iter().find(|j| j.name == "breaks").unwrap().id.clone();
    let (_driver, c) = browser(None).await;
    let pages: Vec<(&str, String, &str)> = vec![
        ("runs", "/".into(), "table.cards tbody a.mono"),
        ("run", format!("/runs/{}", run.run_id), "table.artifacts tr[data-artifact] .digest"),
        ("log", format!("/runs/{}/jobs/{breaks}", run.run_id), ".log section.step"),
        ("agents", "/agents".into(), "table.agents tbody tr[data-agent]"),
        ("repos", "/repos".into(), "table.repos tbody a"),
        ("repo", "/repos/a11y-repository-with-a-long-name".into(), "table.secrets tr[data-secret]"),
        ("not found", "/no/such/page".into(), "main h1"),
    ];
    let mut problems = Vec::new();

    // The sign-in page first.
    c.goto(&format!("{}/", up.url)).await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("form.signin")).await.unwrap();
    problems.extend(axe_violations(&c).await.into_iter().map(|v| format!("sign-in: {v}")));
    // The audit itself works: an image without a text alternative is found.
    c.execute(
        "const i = document.createElement('img'); i.id = 'planted'; i.src = 'data:,'; document.body.append(i);",
        vec![],
    )
    .await
    .unwrap();
    let planted = axe_violations(&c).await;
    assert!(planted.iter().any(|v| v.starts_with("image-alt")), "axe saw the planted violation: {planted:?}");
    c.execute("document.getElementById('planted').remove();", vec![]).await.unwrap();
    sign_in(&c, &up.url, &up.token).await;
    for theme in ["light", "dark"] {
        c.execute(&format!("localStorage.setItem('kiln.theme', '{theme}');"), vec![]).await.unwrap();
        for (name, hash, ready) in &pages {
            c.goto(&format!("{}/#{hash}", up.url)).await.unwrap();
            c.refresh().await.unwrap();
            c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css(ready)).await.unwrap();
            problems.extend(axe_violations(&c).await.into_iter().map(|v| format!("{name} ({theme}): {v}")));
        }
    }
    // 375 px wide: nothing wider than the screen.
    c.execute("localStorage.setItem('kiln.theme', 'light');", vec![]).await.unwrap();
    c.set_window_size(375, 812).await.unwrap();
    for (name, hash, ready) in &pages {
        c.goto(&format!("{}/#{hash}", up.url)).await.unwrap();
        c.refresh().await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css(ready)).await.unwrap();
        let (inner, scroll) = widths(&c).await;
        assert!(inner <= 400, "the window is narrow: innerWidth {inner}");
        if scroll > inner {
            problems.push(format!("{name} at {inner}px: scrollWidth {scroll}"));
        }
        shot(&format!("narrow-{name}"), &c.screenshot().await.unwrap());
    }
    assert!(problems.is_empty(), "accessibility / narrow-screen problems:\n{}", problems.join("\n"));
    c.close().await.unwrap();
}

/// The server's degradation level shows in the UI (spec 004): a server
/// whose available memory is below its critical level says so in a banner
/// on every page, new runs refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_degraded_server_says_so_in_a_banner_in_chromium() {
    if !have_browser() {
        return;
    }
    let levels = "1000TiB,1000TiB,1000TiB";
    let s = kiln_testkit::KilnServer::start(BIN.as_ref(), &["--resource-interval", "200ms", "--memory-levels", levels])
        .unwrap();
    let (_driver, c) = browser(None).await;
    sign_in(&c, &s.url, &s.token).await;
    assert!(wait_text(&c, "#health", "critical").await, "the banner shows the level");
    let text = c.find(Locator::Css("#health")).await.unwrap().text().await.unwrap();
    assert!(text.contains("memory available") && text.contains("new runs are refused"), "{text}");
    c.goto(&format!("{}/#/agents", s.url)).await.unwrap();
    assert!(wait_text(&c, "#health", "critical").await, "on every page");
    shot("degraded-banner", &c.screenshot().await.unwrap());
}

// ---------- issue 42: the run page ----------

/// A size as the UI prints it (`size()` in index.html).
fn size_text(n: i64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (n as f64, 0);
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{n} B") } else { format!("{v:.1} {}", units[i]) }
}

/// The URL's run once it is another run than `old`.
async fn wait_other_run(c: &fantoccini::Client, old: &str) -> String {
    for _ in 0..300 {
        let url = c.current_url().await.unwrap();
        let id = url.fragment().unwrap_or_default().trim_start_matches("/runs/").to_string();
        if id != old && !id.contains('/') && !id.is_empty() {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page never left run {old}: {}", c.current_url().await.unwrap());
}

/// The run page shows the run's inputs and each job's outputs; lists the
/// run's artifacts with size, digest and expiry, each downloadable as a
/// normal file or archive; and re-runs one job (with what needs it) in a
/// new run, the other successes kept.
#[tokio::test(flavor = "multi_thread")]
async fn inputs_outputs_artifacts_and_rerunning_one_job_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let wf = r#"version: 1
inputs:
  target: {type: string, default: staging}
jobs:
  - name: build
    needs: []
    outputs: [version]
    steps:
      - mkdir -p out site/sub && echo hello-app > out/app.txt && echo page > site/index.html && echo deep > site/sub/d.txt
      - echo "version=1.2.3" >> "$KILN_OUTPUT"
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
        - {name: site, path: site}
  - name: deploy
    needs: [build]
    steps: ["echo deploying to ${{ inputs.target }}"]
  - name: lint
    needs: []
    steps: ["echo lint"]
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "shop", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let inputs = [("target".to_string(), "production".to_string())].into();
    let run = api
        .submit_run("shop", &SubmitRun { commit_sha: "main".into(), inputs, ..Default::default() }, None)
        .await
        .unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "success");
    let build = done.jobs.iter().find(|j| j.name == "build").unwrap();

    // The artifact list of the API (issue 42): both, with their job.
    let listed = api.run_artifacts(&run.run_id).await.unwrap();
    let names: Vec<(&str, &str)> =
        listed.artifacts.iter().map(|a| (a.job.as_str(), a.artifact.name.as_str())).collect();
    assert_eq!(names, [("build", "app"), ("build", "site")]);

    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, "dd.run-inputs-shown", "target=production").await, "the run's inputs");
    assert!(wait_text(&c, "tr[data-job='build'] .outputs", "version=1.2.3").await, "the job's outputs");
    let retry = c.find(Locator::Css("button.retry")).await.unwrap();
    assert_eq!(retry.attr("disabled").await.unwrap(), None, "an ended run may be retried");

    // The artifacts: size, full digest, expiry, download links.
    let rows = c
        .execute(
            "return [...document.querySelectorAll('table.artifacts tbody tr')].map(r => [r.dataset.artifact,
               r.querySelector('.size').textContent, r.querySelector('.digest').textContent,
               r.querySelector('.expires').textContent.trim() !== '',
               [...r.querySelectorAll('.download a')].map(a => a.textContent)]);",
            vec![],
        )
        .await
        .unwrap();
    let app = build.artifacts.iter().find(|a| a.name == "app").unwrap();
    let site = build.artifacts.iter().find(|a| a.name == "site").unwrap();
    assert_eq!(
        rows,
        serde_json::json!([
            ["app", "10 B", app.sha256, true, ["file"]],
            ["site", size_text(site.size), site.sha256, true, [".tar.gz", ".zip"]]
        ]),
        "the artifact list"
    );
    let expiry = c.find(Locator::Css("tr[data-artifact='app'] .expires")).await.unwrap().text().await.unwrap();
    assert_eq!(expiry == "never", app.expires_at.is_none(), "expiry shown as the API gives it: {expiry}");
    // The links download with the session: the file as it is, the directory
    // as a gzip'd tarball and a zip.
    let fetched = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const get = sel => fetch(document.querySelector(sel).href).then(async r => [r.status, [...new Uint8Array(await r.arrayBuffer()).slice(0, 10)]]);
             Promise.all([get(\"tr[data-artifact='app'] .download a\"), get(\"tr[data-artifact='site'] .download a[href$='tar.gz']\"),
               get(\"tr[data-artifact='site'] .download a[href$='zip']\")]).then(done, e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    let hello: Vec<u8> = b"hello-app\n".to_vec();
    assert_eq!(fetched[0], serde_json::json!([200, hello]), "{fetched}");
    assert_eq!(fetched[1][0], 200, "{fetched}");
    assert_eq!((fetched[1][1][0].as_u64(), fetched[1][1][1].as_u64()), (Some(0x1f), Some(0x8b)), "gzip: {fetched}");
    assert_eq!(
        (fetched[2][1][0].as_u64(), fetched[2][1][1].as_u64()),
        (Some(b'P' as u64), Some(b'K' as u64)),
        "zip: {fetched}"
    );
    // Issue 45: each artifact's provenance is linked and checked in the
    // page (signature with the server's published keys, subject digest).
    let states = wait_js(
        &c,
        "return [...document.querySelectorAll('table.artifacts tbody tr .prov-state')].map(e => e.dataset.state);",
        serde_json::json!(["ok", "ok"]),
    )
    .await;
    assert_eq!(states, serde_json::json!(["ok", "ok"]), "both verify in the page");
    let text = c.find(Locator::Css("tr[data-artifact='app'] .prov-state")).await.unwrap().text().await.unwrap();
    assert!(text.contains("verified") && text.contains("trusted") && text.contains("host executor"), "{text}");
    let env = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch(document.querySelector(\"tr[data-artifact='app'] .provenance a\").href).then(r => r.json()).then(done, e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(env["payloadType"], "application/vnd.in-toto+json", "the link is the envelope: {env}");
    // A tampered envelope is refused by the same check.
    let bad = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch(document.querySelector(\"tr[data-artifact='app'] .provenance a\").href).then(r => r.json()).then(env => {
               const p = JSON.parse(atob(env.payload)); p.subject[0].digest.sha256 = '0'.repeat(64);
               env.payload = btoa(JSON.stringify(p));
               return checkProvenance(env, {name: 'app', sha256: '0'.repeat(64)});
             }).then(v => done(v.state), e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(bad, "bad", "a rewritten statement does not verify in the page");
    // No job is cancellable in an ended run; each may be re-run.
    assert_eq!(c.execute("return document.querySelectorAll('button.job-cancel').length;", vec![]).await.unwrap(), 0);
    shot("run-artifacts", &c.screenshot().await.unwrap());

    // Re-run `build`: a new run where build and deploy run again; lint is kept.
    c.find(Locator::Css("tr[data-job='build'] button.job-retry")).await.unwrap().click().await.unwrap();
    let child = wait_other_run(&c, &run.run_id).await;
    let again = wait_run_done(&api, &child).await;
    assert_eq!(again.status, "success");
    assert_eq!(again.parent_run_id.as_deref(), Some(run.run_id.as_str()));
    let tries = |name: &str| again.jobs.iter().find(|j| j.name == name).unwrap().attempts.len();
    assert_eq!((tries("build"), tries("deploy"), tries("lint")), (1, 1, 0), "build and what needs it ran again");
    assert!(wait_text(&c, "dd.run-inputs-shown", "target=production").await, "the retry keeps the inputs");
    c.close().await.unwrap();
}

/// A job's log while it runs: the running step shows how long it has run
/// and its header sticks at the top while its output scrolls; timestamps
/// and the agent's bookkeeping lines are toggles (the log never says
/// "epoch"); the Retry button waits for the run to end; one job is
/// cancelled from the run page while the others go on. A finished log
/// opens with its successful steps collapsed and jumps to the first error.
#[tokio::test(flavor = "multi_thread")]
async fn log_toggles_sticky_steps_jump_to_error_and_cancelling_one_job_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 3).unwrap();
    let gate = kiln_testkit::step_writable_tempdir().unwrap();
    let wf = format!(
        r#"version: 1
jobs:
  - name: slow
    needs: []
    steps:
      - name: count
        run: seq 1 400
      - name: hold
        run: while [ ! -e {g}/go ]; do sleep 0.05; done
  - name: after-slow
    needs: [slow]
    steps: ["echo never"]
  - name: breaks
    needs: []
    steps:
      - name: fine
        run: seq 1 300
      - name: boom
        run: echo boom >&2; exit 4
"#,
        g = gate.path().display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "live", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("live", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let running = kiln_testkit::until(&api, &run.run_id, 60, "slow holding", |r| {
        r.jobs.iter().any(|j| j.name == "slow" && j.status == "running")
    })
    .await;
    let slow = running.jobs.iter().find(|j| j.name == "slow").unwrap().id.clone();
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;

    // The running job's log.
    c.goto(&format!("{}/#/runs/{}/jobs/{}", up.url, run.run_id, slow)).await.unwrap();
    let hold_running = "return (s => s ? s.querySelector('.badge').textContent + ' ' + /^\\d+(ms|s)$|^\\d+m \\d+s$/.test(s.querySelector('.dur').textContent) : 'none')(document.querySelector(\".log section.step[data-step='2']\"));";
    assert_eq!(
        wait_js(&c, hold_running, "running true".into()).await,
        "running true",
        "the running step's elapsed time"
    );
    assert!(wait_text(&c, ".log section.step[data-step='1']", "400").await);
    // Scrolled into step 1's output, its header stays at the top of the log.
    let stuck = "const log = document.querySelector('.log'); log.scrollTop = 3000;
        const head = document.querySelector(\".log section.step[data-step='1'] .step-head\");
        const natural = head.parentElement.getBoundingClientRect().top;
        return [Math.round(head.getBoundingClientRect().top - log.getBoundingClientRect().top) <= 6, natural < log.getBoundingClientRect().top - 100];";
    assert_eq!(wait_js(&c, stuck, serde_json::json!([true, true])).await, serde_json::json!([true, true]), "sticky");
    // Timestamps: hidden, then shown on every output line as hh:mm:ss.
    let ts = "return [...document.querySelectorAll('.log .ln.stdout .ts')].slice(0, 50).map(t => getComputedStyle(t).display !== 'none' && /^\\d\\d:\\d\\d:\\d\\d$/.test(t.textContent)).every(Boolean) ? 'shown' : 'hidden';";
    assert_eq!(c.execute(ts, vec![]).await.unwrap(), "hidden");
    c.find(Locator::Css("input.ts-toggle")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_js(&c, ts, "shown".into()).await, "shown", "timestamps toggled on");
    // Bookkeeping (the checkout line) only with "details"; no "epoch".
    let checkout = "return [...document.querySelectorAll('.log .ln')].filter(l => l.textContent.includes('checking out') && l.offsetParent !== null).length;";
    assert_eq!(c.execute(checkout, vec![]).await.unwrap(), 0, "bookkeeping hidden");
    let main = c.find(Locator::Css("main")).await.unwrap().text().await.unwrap();
    assert!(!main.to_lowercase().contains("epoch"), "the log view says no epoch: {main}");
    c.find(Locator::Css("input.details-toggle")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_js(&c, checkout, 1.into()).await, 1, "bookkeeping shown with details");
    shot("log-running-toggles", &c.screenshot().await.unwrap());

    // The run page: Retry waits for the end; cancel `slow` alone.
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    let retry_disabled =
        "return document.querySelector('button.retry') && document.querySelector('button.retry').disabled;";
    assert_eq!(wait_js(&c, retry_disabled, true.into()).await, true, "no retry while the run runs");
    let cancel = c
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("tr[data-job='slow'] button.job-cancel"))
        .await
        .unwrap();
    cancel.click().await.unwrap();
    c.accept_alert().await.unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "failed");
    let st = |name: &str| done.jobs.iter().find(|j| j.name == name).unwrap().status.to_string();
    assert_eq!((st("slow"), st("after-slow"), st("breaks")), ("cancelled".into(), "skipped".into(), "failed".into()));
    assert!(wait_text(&c, "tr[data-job='slow']", "cancelled").await, "the page follows");
    assert_eq!(wait_js(&c, retry_disabled, false.into()).await, false, "retry offered once the run ended");

    // The failed job's finished log: the successful step is collapsed;
    // "first error" brings the failed step into view.
    let breaks = done.jobs.iter().find(|j| j.name == "breaks").unwrap().id.clone();
    c.goto(&format!("{}/#/runs/{}/jobs/{}", up.url, run.run_id, breaks)).await.unwrap();
    let folded = "return [...document.querySelectorAll('.log section.step .step-head')].map(h => h.getAttribute('aria-expanded')).join(',');";
    assert_eq!(wait_js(&c, folded, "false,true".into()).await, "false,true", "success folded, failure open");
    // Open the long successful step, go to the top: the failure is out of view.
    c.find(Locator::Css(".log section.step[data-step='1'] .step-head")).await.unwrap().click().await.unwrap();
    let in_view = "const log = document.querySelector('.log'); const r = document.querySelector(\".log section.step[data-step='2']\").getBoundingClientRect(); const l = log.getBoundingClientRect(); return r.top >= l.top - 1 && r.top < l.bottom;";
    c.execute("document.querySelector('.log').scrollTop = 0;", vec![]).await.unwrap();
    assert_eq!(c.execute(in_view, vec![]).await.unwrap(), false, "the failed step starts out of view");
    c.find(Locator::Css("button.jump-error:not([disabled])")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_js(&c, in_view, true.into()).await, true, "jumped to the first error");
    shot("log-jump-error", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
}

/// At 375 px the job graph is drawn at its own size (text legible, nodes
/// apart) and scrolls sideways in its own box, never widening the page;
/// the logo is drawn (no emoji font needed), table headers do not break
/// inside a word, and the runs list prints no "null".
#[tokio::test(flavor = "multi_thread")]
async fn graph_logo_and_headers_at_375px_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = "version: 1\njobs:\n  - name: compile-everything\n    steps: [echo 1]\n  - name: test-everything\n    steps: [echo 2]\n  - name: package-everything\n    steps: [echo 3]\n  - name: publish-everything\n    steps: [echo 4]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "narrow", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("narrow", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    wait_run_done(&api, &run.run_id).await;
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;

    // The logo: an inline drawing and the word, no emoji.
    let logo = c
        .execute(
            "const b = document.querySelector('header .brand'); return [!!b.querySelector('svg'), b.textContent];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(logo, serde_json::json!([true, "Kiln"]));
    // The runs list: no "null" printed under it (the pager).
    assert!(wait_text(&c, "table.cards tbody", "narrow").await);
    let main = c.find(Locator::Css("main")).await.unwrap().text().await.unwrap();
    assert!(!main.contains("null"), "{main}");

    c.set_window_size(375, 812).await.unwrap();
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css(".graph svg .node")).await.unwrap();
    let m = c
        .execute(
            "const g = document.querySelector('.graph'), gr = g.getBoundingClientRect();
             const nodes = [...g.querySelectorAll('.node rect:not(.bar)')].map(r => r.getBoundingClientRect());
             const texts = [...g.querySelectorAll('.node text:not(.sub)')].map(t => t.getBoundingClientRect().height);
             let overlap = false;
             for (let i = 0; i < nodes.length; i++) for (let j = i + 1; j < nodes.length; j++) {
               const a = nodes[i], b = nodes[j];
               if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) overlap = true;
             }
             return { inner: innerWidth, page: document.documentElement.scrollWidth, right: Math.round(gr.right),
               scrolls: g.scrollWidth > g.clientWidth, nodes: nodes.length, minWidth: Math.min(...nodes.map(n => n.width)),
               minText: Math.min(...texts), overlap };",
            vec![],
        )
        .await
        .unwrap();
    shot("graph-375", &c.screenshot().await.unwrap());
    let inner = m["inner"].as_i64().unwrap();
    assert!(inner <= 400, "{m}");
    assert!(m["page"].as_i64().unwrap() <= inner, "the page is no wider than the screen: {m}");
    assert!(m["right"].as_i64().unwrap() <= inner, "the graph's box fits the screen: {m}");
    assert_eq!(m["nodes"], 4, "{m}");
    assert!(m["minWidth"].as_f64().unwrap() >= 200.0, "nodes at their own size, not shrunk: {m}");
    assert!(m["minText"].as_f64().unwrap() >= 12.0, "legible job names: {m}");
    assert_eq!(m["overlap"], false, "{m}");
    assert_eq!(m["scrolls"], true, "a graph wider than the screen scrolls in its box: {m}");
    // The last node can be scrolled into view inside the box.
    let last = c
        .execute(
            "const g = document.querySelector('.graph'); g.scrollLeft = g.scrollWidth;
             const n = [...g.querySelectorAll('.node rect:not(.bar)')].pop().getBoundingClientRect();
             return n.right <= g.getBoundingClientRect().right + 1 && n.left >= 0;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(last, true);

    // Table headers wrap between words, never inside one.
    c.set_window_size(760, 900).await.unwrap();
    for page in ["/", &format!("/runs/{}", run.run_id)] {
        c.goto(&format!("{}/#{page}", up.url)).await.unwrap();
        c.refresh().await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("table.cards tbody tr td")).await.unwrap();
        let broken = c
            .execute(
                "const out = [];
                 for (const th of document.querySelectorAll('table.cards th')) {
                   const t = th.firstChild; if (!t || t.nodeType !== 3) continue;
                   const re = /\\S+/g; let m;
                   while ((m = re.exec(t.data))) {
                     const r = document.createRange(); r.setStart(t, m.index); r.setEnd(t, m.index + m[0].length);
                     const lines = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
                     if (lines.size > 1) out.push(m[0]);
                   }
                 }
                 return out;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(broken, serde_json::json!([]), "headers broken inside a word on {page}");
    }
    c.close().await.unwrap();
}

/// Issue 43: the run page lists the failed tests first with their message;
/// the log link opens the job's log at the line that names the test.
#[tokio::test(flavor = "multi_thread")]
async fn failed_tests_first_with_a_link_to_the_log_line_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = r#"version: 1
jobs:
  - name: unit
    reports: {junit: [junit.xml]}
    steps:
      - echo "warming up"
      - |
        for i in 1 2 3 4 5; do echo "running test_$i"; done
        echo "test_three FAILED because the answer was 41"
        printf '%s' '<testsuite name="unit"><testcase name="test_one"/><testcase name="test_three"><failure message="expected 42, got 41"/></testcase></testsuite>' > junit.xml
        exit 1
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "ui-tests", "--url"]).arg(repo.path()).status().unwrap().success());
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("ui-tests", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "failed");
    let t = api.run_tests(&run.run_id, false).await.unwrap();
    assert_eq!(t.summary.total, 2, "{t:?}");
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, ".tests-summary", "2 tests: 1 failed, 1 passed").await);
    let row = c.find(Locator::Css("table.tests-failed tr[data-test='unit :: test_three']")).await.unwrap();
    let text = row.text().await.unwrap();
    assert!(text.contains("expected 42, got 41") && text.contains("unit"), "{text}");
    assert!(
        c.find(Locator::Css("table.tests-failed tr[data-test='unit :: test_one']")).await.is_err(),
        "passed tests are not listed"
    );
    assert!(axe_violations(&c).await.is_empty(), "{:?}", axe_violations(&c).await);
    shot("run-tests", &c.screenshot().await.unwrap());
    // The repository page lists its quarantined tests, an expired one as blocking again.
    let q = up
        .cli()
        .args([
            "tests",
            "quarantine",
            "ui-tests",
            "unit :: test_three",
            "--owner",
            "dana",
            "--reason",
            "off by one",
            "--expires",
            "1s",
        ])
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.goto(&format!("{}/#/repos/ui-tests", up.url)).await.unwrap();
    assert!(wait_text(&c, "table.quarantined tr[data-test='unit :: test_three']", "expired: blocks again").await);
    let text = c.find(Locator::Css("table.quarantined")).await.unwrap().text().await.unwrap();
    assert!(text.contains("dana") && text.contains("off by one"), "{text}");
    assert!(axe_violations(&c).await.is_empty(), "{:?}", axe_violations(&c).await);
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    let row = c
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("table.tests-failed tr[data-test='unit :: test_three']"))
        .await
        .unwrap();
    row.find(Locator::Css("a")).await.unwrap().click().await.unwrap();
    let hl = "const l = document.querySelector('.log .ln.hl'); return l ? l.textContent : '';";
    let mut line = String::new();
    for _ in 0..300 {
        line = c.execute(hl, vec![]).await.ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        if !line.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(line.contains("test_three FAILED because"), "the highlighted line: {line:?}");
    assert!(c.current_url().await.unwrap().as_str().contains("find=test_three"));
    c.close().await.unwrap();
}

/// The queue page (issue 44): each team with its weight, quotas, running
/// and ready jobs, the slots it is entitled to, and its lanes by labels; a
/// run's page says its lane and team.
#[tokio::test(flavor = "multi_thread")]
async fn the_queue_page_shows_teams_shares_and_lanes_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let api = Client::new(&up.url, &up.token);
    api.create_team(&kiln_api::CreateTeam {
        name: "web".into(),
        weight: Some(3),
        max_running: Some(1),
        max_queued: None,
    })
    .await
    .unwrap();
    let wf = "version: 1\njobs:\n  - name: m\n    matrix: {i: [1, 2, 3, 4]}\n    steps: [\"sleep 3\"]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    let out = up.cli().args(["repo", "add", "shop", "--team", "web", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run =
        api.submit_run("shop", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    c.find(Locator::Css("header nav a[href='#/queue']")).await.unwrap().click().await.unwrap();
    assert_eq!(wait_fragment(&c, "/queue").await, "/queue");
    let row = "table.queue tr[data-team='web']";
    assert!(wait_text(&c, row, "max running 1").await, "the team and its quota");
    assert!(wait_text(&c, &format!("{row} .lane[data-lane='normal']"), "ready").await, "its normal lane");
    let text = c.find(Locator::Css(row)).await.unwrap().text().await.unwrap();
    assert!(text.contains("any agent") && text.contains("running"), "{text}");
    assert!(wait_text(&c, "main", "slot").await);
    shot("queue", &c.screenshot().await.unwrap());
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    assert!(wait_text(&c, "dd.run-priority", "normal").await);
    let p = c.find(Locator::Css("dd.run-priority")).await.unwrap().text().await.unwrap();
    assert!(p.contains("team web"), "{p}");
}

/// Deployments in the UI (issue 46): a run's deploy waits with an Approve
/// button; approving it in the page starts the deploy; the Environments
/// page and the environment's page say what runs now and who approved it.
#[tokio::test(flavor = "multi_thread")]
async fn approve_a_deployment_and_see_it_on_the_environment_page_in_chromium() {
    if !have_browser() {
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = "version: 1\njobs:\n  - name: ship\n    environment: {name: production, url: \"https://shop.example\"}\n    \
              steps: [echo shipped]\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    assert!(up.cli().args(["repo", "add", "shop", "--url"]).arg(repo.path()).status().unwrap().success());
    let made = up.cli().args(["env", "create", "production", "--approvers", "admin"]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let api = Client::new(&up.url, &up.token);
    let run =
        api.submit_run("shop", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    kiln_testkit::until(&api, &run.run_id, 60, "the deploy to wait for approval", |r| {
        r.jobs[0].message.as_deref().is_some_and(|m| m.starts_with("waiting for approval"))
    })
    .await;

    let (_driver, c) = browser(None).await;
    sign_in(&c, &up.url, &up.token).await;
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    if !wait_text(&c, ".approval[data-env='production']", "0 of 1").await {
        let text = c.find(Locator::Css("main")).await.unwrap().text().await.unwrap_or_default();
        let logs = c.execute("return JSON.stringify(window.__errors || [])", vec![]).await.unwrap();
        panic!("the approval box: {text}\n{logs}");
    }
    assert!(wait_text(&c, "td .waiting[data-job='ship']", "waiting for approval to deploy to `production`").await);
    c.find(Locator::Css(".approval input[name='comment']")).await.unwrap().send_keys("looks good").await.unwrap();
    shot("deploy-approval", &c.screenshot().await.unwrap());
    c.find(Locator::Css(".approval button.approve")).await.unwrap().click().await.unwrap();
    let done = wait_run_done(&api, &run.run_id).await;
    assert_eq!(done.status, "success");

    c.goto(&format!("{}/#/environments", up.url)).await.unwrap();
    assert!(wait_text(&c, "tr[data-env='production']", "shop#1").await, "what production runs now");
    assert!(wait_text(&c, "tr[data-env='production']", "1 approval from admin").await);
    c.goto(&format!("{}/#/environments/production", up.url)).await.unwrap();
    assert!(wait_text(&c, ".current", "shop#1").await);
    assert!(wait_text(&c, "table.deployments tbody tr", "admin").await, "who approved it");
    assert!(wait_text(&c, "table.deployments tbody tr", "success").await);
    shot("environment", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
}
