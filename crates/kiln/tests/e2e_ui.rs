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

#[tokio::test(flavor = "multi_thread")]
async fn sign_in_graph_and_live_log_in_chromium() {
    let (chromium, driver) = (std::path::Path::new("/usr/bin/chromium"), std::path::Path::new("/usr/bin/chromedriver"));
    if !chromium.exists() || !driver.exists() {
        assert!(
            std::env::var("KILN_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "chromium/chromedriver missing but KILN_REQUIRE_BROWSER=1"
        );
        eprintln!("skipping: install chromium and chromium-driver to run the browser test");
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

    let port = free_port();
    let _driver = Driver(
        Command::new(driver).arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap(),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--window-size=1200,900"]
        }),
    );
    let mut b = ClientBuilder::rustls().unwrap();
    b.capabilities(caps);
    let mut browser = None;
    for _ in 0..100 {
        match b.connect(&format!("http://127.0.0.1:{port}")).await {
            Ok(c) => {
                browser = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let c = browser.expect("chromedriver session");
    let wait = || c.wait().at_most(Duration::from_secs(30)).every(Duration::from_millis(100));

    // Sign in.
    c.goto(&format!("{}/", up.url)).await.unwrap();
    let input = wait().for_element(Locator::Css("form.signin input")).await.unwrap();
    input.send_keys(&up.token).await.unwrap();
    c.find(Locator::Css("form.signin button")).await.unwrap().click().await.unwrap();
    wait().for_element(Locator::Css("#signout:not([hidden])")).await.unwrap();

    // The run page: the matrix is one collapsed node that expands on click.
    c.goto(&format!("{}/#/runs/{}", up.url, run.run_id)).await.unwrap();
    let node = wait().for_element(Locator::XPath("//*[name()='text' and contains(., 'test ×2')]")).await.unwrap();
    shot("run-collapsed", &c.screenshot().await.unwrap());
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
    c.close().await.unwrap();
}
