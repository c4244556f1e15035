//! The operating signals end to end (issue 19): a real `kiln server` and a
//! real `kiln agent --metrics-listen` run a scripted scenario (a success
//! that saves a cache, a success that hits it, a step failure, an agent
//! SIGKILLed mid-job); `/metrics` of both is scraped before and after and
//! the counters must have moved by exactly what happened. `promtool check
//! metrics` must pass on both scrapes, `promtool check rules` on the shipped
//! alert rules, and every metric the rules and the Grafana dashboard name
//! must exist in the real scrape. A real Prometheus scrapes a real server
//! and agent, evaluates the shipped alert rules and answers every query of
//! the dashboard. promtool and prometheus (Debian `prometheus`) are
//! required: without them these tests fail.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_for, wait_run};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const CACHED: &str = r#"version: 1
jobs:
  - name: build
    cache: {kind: dependencies, version: "1", inputs: [lock.txt], paths: [deps]}
    steps:
      - mkdir -p deps && echo built > deps/out && echo done
"#;
const FAILING: &str = "version: 1\njobs:\n  - name: test\n    steps:\n      - echo failing && exit 3\n";
const SLOW: &str = "version: 1\njobs:\n  - name: slow\n    steps:\n      - echo started && sleep 600\n";

fn root() -> PathBuf {
    // The checkout the test runs in (cargo sets it at run time): a shared
    // target dir may hold a binary built from another checkout.
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("../..")
}

/// A sample's value by its exact name and labels as printed
/// (`kiln_x_total{class="infra"}`); 0 when absent.
fn value(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().expect("a sample value"))
}

/// The names of every sample and family in a scrape.
fn names(scrape: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in scrape.lines() {
        let name = match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split(' ').next(),
            None if !l.starts_with('#') => l.split(['{', ' ']).next(),
            None => None,
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            out.insert(n.to_string());
        }
    }
    out
}

/// Every `kiln_…` metric name in `text` (PromQL expressions).
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("kiln_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is required (Debian package `prometheus`; scripts/test installs it)");
    if let Some(s) = stdin {
        child.stdin.take().expect("stdin").write_all(s.as_bytes()).expect("write to promtool");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The PromQL of every panel target of the shipped Grafana dashboard.
fn dashboard_exprs() -> Vec<String> {
    let dashboard = std::fs::read_to_string(root().join("deploy/grafana/kiln-dashboard.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    json["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect()
}

/// The base URL of the agent's own /metrics, from its start-up line.
fn agent_metrics_url(agent: &kiln_testkit::KilnAgent) -> String {
    wait_for(Duration::from_secs(60), || {
        agent.log().lines().find_map(|l| {
            let at = l.find("agent metrics on http://")?;
            Some(l[at + "agent metrics on ".len()..].trim_end_matches("/metrics").trim().to_string())
        })
    })
    .unwrap_or_else(|| panic!("the agent never announced its metrics address:\n{}", agent.log()))
}

/// `/metrics` of `url`, with `token` (the server's needs an admin or read
/// token, as Prometheus sends with `authorization: credentials_file:`; the
/// agent's own listener takes none).
async fn scrape_with(url: &str, token: Option<&str>) -> String {
    let mut req = reqwest::Client::new().get(format!("{url}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("scrape");
    assert!(r.status().is_success());
    r.text().await.expect("body")
}

async fn submit(c: &Client, repo: &str) -> String {
    c.submit_run(repo, &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None)
        .await
        .expect("submit")
        .run_id
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_scenario_moves_every_counter_by_exactly_what_happened() {
    let server = KilnServer::start(BIN.as_ref(), &["--lease-ttl", "3s", "--retry-base", "100ms"]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let mut repos = Vec::new();
    for (name, wf) in [("cached", CACHED), ("failing", FAILING), ("slow", SLOW)] {
        let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf), ("lock.txt", "v1\n")]).unwrap();
        server.add_repo(name, &repo);
        repos.push(repo);
    }
    let agent = server.agent("m1", &["--metrics-listen", "127.0.0.1:0"]).unwrap();
    let agent_url = agent_metrics_url(&agent);
    let before = scrape_with(&server.url, Some(&server.token)).await;
    let agent_before = scrape_with(&agent_url, None).await;

    // A success that saves its cache, a success that hits it, a failure.
    for (repo, want) in [("cached", "success"), ("cached", "success"), ("failing", "failed")] {
        let id = submit(&c, repo).await;
        let run = wait_run(&c, &id, 120).await;
        assert_eq!(run.status, want, "{run:#?}\n{}", agent.log());
    }
    // An agent lost mid-job: SIGKILL while the step sleeps.
    let slow = submit(&c, "slow").await;
    kiln_testkit::until(&c, &slow, 120, "the slow job running", |r| {
        r.jobs[0].status == "running" && r.jobs[0].attempts.len() == 1
    })
    .await;
    let agent_during = scrape_with(&agent_url, None).await;
    agent.signal("KILL");
    let lost = kiln_testkit::until(&c, &slow, 60, "the attempt fenced", |r| {
        r.jobs[0].attempts.first().is_some_and(|a| a.outcome == "lost")
    })
    .await;
    assert_eq!(lost.jobs[0].status, "ready", "an agent loss is retried: {lost:#?}");
    let after = scrape_with(&server.url, Some(&server.token)).await;

    let delta = |series: &str| value(&after, series) - value(&before, series);
    let want: BTreeMap<&str, f64> = [
        ("kiln_trigger_persist_duration_seconds_count{trigger=\"api\"}", 4.0),
        ("kiln_dispatch_latency_seconds_count", 4.0),
        ("kiln_attempts_finished_total{outcome=\"success\"}", 2.0),
        ("kiln_attempts_finished_total{outcome=\"failed\"}", 1.0),
        ("kiln_attempts_finished_total{outcome=\"cancelled\"}", 0.0),
        ("kiln_attempts_finished_total{outcome=\"lost\"}", 1.0),
        ("kiln_attempt_failures_total{class=\"step_failed\"}", 1.0),
        ("kiln_attempt_failures_total{class=\"agent_lost\"}", 1.0),
        ("kiln_attempt_failures_total{class=\"infra\"}", 0.0),
        ("kiln_retries_total{class=\"agent_lost\"}", 1.0),
        ("kiln_retries_total{class=\"step_failed\"}", 0.0),
        ("kiln_jobs_finished_total{status=\"success\"}", 2.0),
        ("kiln_jobs_finished_total{status=\"failed\"}", 1.0),
        ("kiln_jobs_finished_total{status=\"cancelled\"}", 0.0),
        ("kiln_log_gaps_total{reason=\"agent_lost\"}", 1.0),
        ("kiln_log_gaps_total{reason=\"rate_limit\"}", 0.0),
        ("kiln_log_truncations_total", 0.0),
        ("kiln_stale_results_rejected_total", 0.0),
        ("kiln_queue_timeouts_total", 0.0),
        ("kiln_cache_lookups_total{result=\"miss\"}", 1.0),
        ("kiln_cache_lookups_total{result=\"hit\"}", 1.0),
        ("kiln_cache_saves_total", 1.0),
        ("kiln_cache_conflicts_total", 0.0),
        ("kiln_cache_integrity_failures_total", 0.0),
        // Three attempts reached their steps and completed with telemetry.
        ("kiln_attempt_phase_duration_seconds_count{phase=\"prepare\"}", 3.0),
        ("kiln_attempt_phase_duration_seconds_count{phase=\"command\"}", 3.0),
        ("kiln_attempt_phase_duration_seconds_count{phase=\"publication\"}", 3.0),
    ]
    .into_iter()
    .collect();
    let got: BTreeMap<&str, f64> = want.keys().map(|s| (*s, delta(s))).collect();
    assert_eq!(got, want, "server /metrics after:\n{after}");
    assert!(delta("kiln_log_ingested_bytes_total") > 0.0, "{after}");
    assert!(delta("kiln_cache_saved_bytes_total") > 0.0, "{after}");
    assert!(delta("kiln_cache_restored_bytes_total") > 0.0, "{after}");
    // Gauges as the store has them now: the lost run waits for an agent.
    assert_eq!(value(&after, "kiln_runs{status=\"running\"}"), 1.0, "{after}");
    assert_eq!(value(&after, "kiln_jobs{status=\"ready\"}"), 1.0, "{after}");
    assert_eq!(value(&after, "kiln_jobs{status=\"running\"}"), 0.0, "{after}");
    assert!(after.contains("kiln_oldest_eligible_job_age_seconds{labels=\"any\"} "), "{after}");
    assert_eq!(value(&after, "kiln_agent_capacity_slots{agent=\"m1\"}"), 1.0, "{after}");
    assert_eq!(value(&after, "kiln_agent_reserved_slots{agent=\"m1\"}"), 0.0, "fenced: nothing reserved");
    assert_eq!(value(&after, "kiln_agents_connected"), 0.0, "{after}");
    assert_eq!(value(&after, "kiln_reconciler_lag_seconds"), 0.0, "nothing expired waits: {after}");

    // The agent's own series, while the slow job ran.
    let agent_delta = |series: &str| value(&agent_during, series) - value(&agent_before, series);
    assert_eq!(value(&agent_during, "kiln_agent_jobs_running"), 1.0, "{agent_during}");
    assert_eq!(value(&agent_during, "kiln_agent_slots"), 1.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_claims_total{result=\"assigned\"}"), 4.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_claims_total{result=\"error\"}"), 0.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_step_duration_seconds_count{outcome=\"success\"}"), 2.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_step_duration_seconds_count{outcome=\"failure\"}"), 1.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_attempt_duration_seconds_count"), 3.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_heartbeats_total{result=\"stale\"}"), 0.0, "{agent_during}");
    assert!(agent_delta("kiln_agent_log_bytes_sent_total") > 0.0, "{agent_during}");
    assert!(agent_during.contains("kiln_agent_disk_level "), "{agent_during}");
    assert!(agent_during.contains("kiln_agent_log_spool_bytes "), "{agent_during}");
    // The cache save uploaded its archive in parts, none of them again; the
    // host executor pulls no image (the series exist, at 0).
    assert!(agent_during.contains("kiln_agent_multipart_retries_total{target=\"server\"} "), "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_multipart_retries_total{target=\"server\"}"), 0.0, "{agent_during}");
    assert_eq!(agent_delta("kiln_agent_multipart_retries_total{target=\"object_store\"}"), 0.0, "{agent_during}");
    for result in ["pulled", "present", "failed"] {
        let series = format!("kiln_agent_image_pull_duration_seconds_count{{result=\"{result}\"}}");
        assert!(agent_during.contains(&format!("{series} 0\n")), "{agent_during}");
    }

    // The expositions are valid and lint-clean.
    for (what, text) in [("server", &after), ("agent", &agent_during)] {
        let (ok, out) = promtool(&["check", "metrics"], Some(text));
        assert!(ok, "promtool check metrics on the {what}'s scrape:\n{out}\n{text}");
    }

    // Every metric the shipped alert rules and dashboard use is real (the
    // dashboard's agent panels read the agents' scrape).
    let mut have = names(&after);
    have.extend(names(&agent_during));
    let rules = std::fs::read_to_string(root().join("deploy/prometheus/kiln-alerts.yml")).unwrap();
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for (what, text) in [("alert rules", rules.clone()), ("dashboard", exprs.join("\n"))] {
        let used = referenced(&text);
        assert!(!used.is_empty());
        let missing: Vec<_> = used.difference(&have).collect();
        assert!(missing.is_empty(), "the {what} use metrics the server does not export: {missing:?}");
    }
}

/// The shipped rules load in Prometheus, and each alert's runbook link
/// names a section of docs/operations.md.
#[test]
fn alert_rules_pass_promtool_and_link_existing_runbook_sections() {
    let path = root().join("deploy/prometheus/kiln-alerts.yml");
    let (ok, out) = promtool(&["check", "rules", path.to_str().unwrap()], None);
    assert!(ok, "promtool check rules:\n{out}");
    let rules = std::fs::read_to_string(&path).unwrap();
    let runbook = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    // GitHub's anchors: a heading lower-cased, spaces to dashes.
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(|h| h.trim().to_lowercase().replace(' ', "-"))
        .collect();
    let mut alerts = 0;
    for l in rules.lines() {
        if l.trim_start().starts_with("- alert:") {
            alerts += 1;
        }
        if let Some(url) = l.trim().strip_prefix("runbook_url:") {
            let url = url.trim().trim_matches('"');
            let anchor = url.strip_prefix("docs/operations.md#").unwrap_or_else(|| panic!("{url}"));
            assert!(anchors.contains(anchor), "no section `{anchor}` in docs/operations.md: {anchors:?}");
        }
    }
    assert_eq!(rules.matches("runbook_url:").count(), alerts, "every alert links its runbook");
    assert!(alerts >= 6);
}

/// A real Prometheus (Debian `prometheus`) scrapes a real server and agent
/// once a second and loads the shipped alert rules: every rule evaluates
/// without error, and every query of the shipped Grafana dashboard
/// evaluates, and returns series whenever the metrics it reads exist.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_evaluates_every_dashboard_query_and_alert_rule() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let mut repos = Vec::new();
    for (name, wf) in [("cached", CACHED), ("failing", FAILING)] {
        let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf), ("lock.txt", "v1\n")]).unwrap();
        server.add_repo(name, &repo);
        repos.push(repo);
    }
    let agent = server.agent("m1", &["--metrics-listen", "127.0.0.1:0"]).unwrap();
    let agent_url = agent_metrics_url(&agent);

    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let host = |url: &str| url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let rules = root().join("deploy/prometheus/kiln-alerts.yml");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\nscrape_configs:\n  \
         - job_name: kiln\n    authorization: {{credentials_file: '{}'}}\n    static_configs: [{{targets: ['{}']}}]\n  \
         - job_name: kiln-agent\n    static_configs: [{{targets: ['{}']}}]\n",
        rules.display(),
        server.data_dir().join("admin.token").display(),
        host(&server.url),
        host(&agent_url)
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = Kill(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus is required (Debian package `prometheus`; scripts/test installs it)"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let prom_log = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let query = |q: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r = http.get(format!("{base}/api/v1/query")).query(&[("query", q.as_str())]).send().await;
            match r {
                Ok(r) => r.json::<serde_json::Value>().await.ok(),
                Err(_) => None,
            }
        }
    };
    // Samples of the server's target so far.
    let samples = |v: Option<serde_json::Value>| -> f64 {
        v.and_then(|v| v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse().ok())).unwrap_or(0.0)
    };
    let scrapes = || query("count_over_time(up{job=\"kiln\"}[10m])".into());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while samples(scrapes().await) < 1.0 {
        assert!(std::time::Instant::now() < deadline, "Prometheus never scraped the server:\n{}", prom_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    for (repo, want) in [("cached", "success"), ("cached", "success"), ("failing", "failed")] {
        let id = submit(&c, repo).await;
        let run = wait_run(&c, &id, 120).await;
        assert_eq!(run.status, want, "{run:#?}\n{}", agent.log());
    }
    // Three more scrapes of both targets: every series that exists now has
    // at least two samples, so a rate over it has a value.
    let start = samples(scrapes().await);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while samples(scrapes().await) < start + 3.0
        || samples(query("count_over_time(up{job=\"kiln-agent\"}[10m])".into()).await) < 4.0
    {
        assert!(std::time::Instant::now() < deadline, "Prometheus stopped scraping:\n{}", prom_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let up = query("min(up)".into()).await.expect("query");
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "both targets are up: {up}\n{}", prom_log());

    // What exists in the scrapes now.
    let mut have = names(&scrape_with(&server.url, Some(&server.token)).await);
    have.extend(names(&scrape_with(&agent_url, None).await));
    let exprs = dashboard_exprs();
    let mut with_data = 0;
    for expr in &exprs {
        let v = query(expr.clone()).await.unwrap_or_else(|| panic!("no answer for `{expr}`"));
        assert_eq!(v["status"], "success", "Prometheus refused the dashboard query `{expr}`: {v}");
        let series = v["data"]["result"].as_array().map_or(0, Vec::len);
        if referenced(expr).is_subset(&have) {
            assert!(series > 0, "the dashboard query `{expr}` returned nothing although its metrics exist: {v}");
            with_data += 1;
        }
    }
    assert!(with_data * 2 > exprs.len(), "most panels show data after a success and a failure: {with_data}");

    // Every alert rule loaded and evaluated without error.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r: serde_json::Value = http.get(format!("{base}/api/v1/rules")).send().await.unwrap().json().await.unwrap();
        let rules: Vec<&serde_json::Value> = r["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        let alerts = rules.iter().filter(|r| r["type"] == "alerting").count();
        let bad: Vec<_> = rules.iter().filter(|r| r["health"] != "ok").collect();
        if alerts >= 6 && bad.is_empty() {
            break;
        }
        let unknown = bad.iter().all(|r| r["health"] == "unknown");
        assert!(unknown, "alert rules failed to evaluate: {bad:#?}");
        assert!(std::time::Instant::now() < deadline, "rules never evaluated: {r}\n{}", prom_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
