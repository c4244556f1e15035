//! Health, readiness and the UI need no token; `/metrics` needs an admin or read token.

use axum::http::StatusCode;
use kiln_testkit::TestApp;

#[tokio::test]
async fn health_readiness_and_the_ui() {
    let app = TestApp::new().await;
    assert_eq!(app.anonymous().get("/healthz").send().await.assert_status(StatusCode::OK).text(), "ok");
    let ready = app.anonymous().get("/readyz").send().await.assert_status(StatusCode::OK).text();
    assert!(ready.starts_with("ready (degradation: "), "{ready}");
    let ui = app.anonymous().get("/").send().await.assert_status(StatusCode::OK);
    assert!(ui.header("content-type").unwrap().starts_with("text/html"));
}

#[tokio::test]
async fn metrics_expose_the_dispatch_queue_depth() {
    let app = TestApp::new().await;
    let res = app.admin().get("/metrics").send().await.assert_status(StatusCode::OK);
    assert_eq!(res.header("content-type"), Some("text/plain; version=0.0.4"));
    assert!(res.text().contains("\nkiln_dispatch_queue_depth 0\n"), "{}", res.text());
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    super::submit(&app, "r").await;
    assert_eq!(app.run_pending_work().await.relayed, 1);
    let res = app.admin().get("/metrics").send().await;
    assert!(res.text().contains("\nkiln_dispatch_queue_depth 1\n"), "{}", res.text());
}

/// Spec 004 degradation: at `critical` a new run is refused with 503 and
/// `Retry-After` and nothing is stored; `/readyz` and `/metrics` say so. At
/// `degraded` only runs with a `size: large` job are refused. (Thresholds
/// at 0 % make the real disk's use critical or degraded; the e2e test fills
/// a real tmpfs.)
#[tokio::test]
async fn degradation_refuses_new_runs_with_retry_after() {
    use kiln_core::degradation::Thresholds;
    let app =
        TestApp::with_config(|c| c.degradation = Thresholds { storage_pct: [0.0, 0.0, 0.0], ..c.degradation }).await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let res = app
        .admin()
        .post("/v1/repos/r/workflow-runs")
        .json(&serde_json::json!({"commit_sha": "main"}))
        .send()
        .await
        .assert_status(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.error_code(), "unavailable");
    assert!(res.text().contains("critical degradation"), "{}", res.text());
    assert_eq!(res.header("retry-after"), Some("30"));
    let runs: serde_json::Value = app.admin().get("/v1/repos/r/workflow-runs").send().await.json();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "nothing stored");
    let ready = app.anonymous().get("/readyz").send().await.assert_status(StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.text().contains("degradation: critical"), "{}", ready.text());
    assert!(ready.header("retry-after").is_some());
    let metrics = app.admin().get("/metrics").send().await.text();
    assert!(metrics.contains("\nkiln_degradation_level 3\n"), "{metrics}");
    assert!(metrics.contains("\nkiln_runs_refused_degraded_total 1\n"), "{metrics}");

    let app =
        TestApp::with_config(|c| c.degradation = Thresholds { storage_pct: [0.0, 0.0, 101.0], ..c.degradation }).await;
    let large = "version: 1\njobs:\n  - name: big\n    runs-on: {size: large}\n    steps: [echo]\n";
    let _big = super::repo(&app, "big", large).await;
    let _small = super::repo(&app, "small", &super::pipeline(&["a"])).await;
    let res = app
        .admin()
        .post("/v1/repos/big/workflow-runs")
        .json(&serde_json::json!({"commit_sha": "main"}))
        .send()
        .await
        .assert_status(StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.text().contains("size: large"), "{}", res.text());
    super::submit(&app, "small").await;
    let ready = app.anonymous().get("/readyz").send().await.assert_status(StatusCode::OK);
    assert!(ready.text().starts_with("ready (degradation: degraded: the data directory"), "{}", ready.text());
}

/// Job timeouts at acceptance: a job without `timeout` runs with the
/// server's default (in its assignment), one over the maximum is refused
/// with 422 naming the job, and nothing is stored.
#[tokio::test]
async fn job_timeouts_default_and_maximum() {
    use std::time::Duration;
    let app = TestApp::with_config(|c| {
        c.job_timeout = Duration::from_secs(600);
        c.max_job_timeout = Duration::from_secs(3600);
    })
    .await;
    let long = "version: 1\njobs:\n  - name: slow\n    timeout: 2h\n    steps: [echo]\n";
    let _long = super::repo(&app, "long", long).await;
    let res = app
        .admin()
        .post("/v1/repos/long/workflow-runs")
        .json(&serde_json::json!({"commit_sha": "main"}))
        .send()
        .await
        .assert_status(StatusCode::UNPROCESSABLE_ENTITY);
    assert!(res.text().contains("job `slow` asks for `timeout: 7200s`"), "{}", res.text());
    let (_run, _agent, a) = super::claimed(&app, &["a"]).await;
    assert_eq!(a.timeout_secs, Some(600), "the server's default");
}

/// Issue 19: request durations by route pattern (ids never make series)
/// and stale-result rejections, counted exactly.
#[tokio::test]
async fn metrics_count_requests_by_route_and_stale_results() {
    let app = TestApp::new().await;
    let scrape = |text: &str, series: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse::<f64>().ok()))
            .map_or(0, |v| v as u64)
    };
    let healthz = "kiln_http_request_duration_seconds_count{method=\"GET\",route=\"/healthz\",status=\"200\"}";
    let stale = "kiln_stale_results_rejected_total";
    // Jobs by status: one job ready (nobody claims it yet).
    let _q = super::repo(&app, "q", &super::pipeline(&["x"])).await;
    super::submit(&app, "q").await;
    let text = app.admin().get("/metrics").send().await.text();
    assert_eq!(scrape(&text, "kiln_jobs{status=\"ready\"}"), 1, "{text}");
    assert_eq!(scrape(&text, "kiln_jobs{status=\"running\"}"), 0, "{text}");
    assert!(text.contains("\nkiln_agents_connected 0\n"), "{text}");
    let before = app.admin().get("/metrics").send().await.text();
    for _ in 0..3 {
        app.anonymous().get("/healthz").send().await.assert_status(StatusCode::OK);
    }
    let (_run, _agent, a) = super::claimed(&app, &["build"]).await;
    super::complete(&app, &a, "success").await.assert_status(StatusCode::OK);
    for _ in 0..2 {
        let hb = app.holder(&a).post(&format!("/v1/jobs/{}/attempts/1/heartbeat", a.job_id)).send().await;
        hb.assert_status(StatusCode::CONFLICT);
    }
    let after = app.admin().get("/metrics").send().await.text();
    assert_eq!(scrape(&after, healthz) - scrape(&before, healthz), 3, "{after}");
    assert_eq!(scrape(&after, stale) - scrape(&before, stale), 2, "{after}");
    // The route is the pattern, not the job's id.
    assert!(after.contains("route=\"/v1/jobs/{job}/attempts/{epoch}/heartbeat\""), "{after}");
    assert!(!after.contains(&a.job_id), "ids never label a series");
    assert!(after.contains("# TYPE kiln_http_request_duration_seconds histogram"));
}

/// Issue 18's queue timeout: a job no agent claims within `--queue-timeout`
/// fails saying why, its dependents are skipped and the run ends; a job
/// claimed in time is not touched, and nothing fails before the timeout.
#[tokio::test]
async fn a_job_no_agent_claims_fails_at_the_queue_timeout() {
    use std::time::Duration;
    // Long enough that setting up two repositories and runs on a loaded
    // host never reaches it (400 ms did once, under a full test run).
    let app = TestApp::with_config(|c| c.queue_timeout = Duration::from_secs(3)).await;
    let wf = "version: 1\njobs:\n  - name: build\n    runs-on: ubuntu-latest\n    steps: [make]\n  - name: test\n    steps: [make test]\n";
    let _repo = super::repo(&app, "stuck", wf).await;
    let stuck = super::submit(&app, "stuck").await;
    let _ok = super::repo(&app, "fine", &super::pipeline(&["only"])).await;
    let fine = super::submit(&app, "fine").await;
    app.run_pending_work().await;
    assert_eq!(app.app().queue_timeout_once().await.unwrap(), 0, "not overdue yet");
    // An agent without the labels `build` needs claims the other run's job.
    let agent = super::register(&app, "a1", 4).await;
    let a = super::claim(&app, &agent, "c1").await.expect("the fine run's job");
    assert_eq!(a.run_id, fine);
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(app.app().queue_timeout_once().await.unwrap(), 1, "only the unclaimed job");
    let r = super::get_run(&app, &stuck).await;
    assert_eq!(r.status, "failed");
    assert_eq!((r.jobs[0].status.as_str(), r.jobs[1].status.as_str()), ("failed", "skipped"));
    let m = r.jobs[0].message.as_deref().unwrap_or("");
    assert!(m.starts_with("queue timeout: no agent claimed the job within 3s (no agent is connected"), "{m}");
    assert!(r.jobs[0].attempts.is_empty());
    assert_eq!(super::get_run(&app, &fine).await.jobs[0].status, "running", "a claimed job is not touched");
    assert_eq!(app.app().queue_timeout_once().await.unwrap(), 0, "once");
    let text = app.admin().get("/metrics").send().await.text();
    assert!(text.contains("\nkiln_queue_timeouts_total 1\n"), "{text}");
}
