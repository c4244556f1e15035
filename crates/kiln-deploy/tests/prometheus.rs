//! The gate against a real Prometheus (Debian's `prometheus` package): each
//! test starts its own Prometheus on a free loopback port, scraping every
//! second an exporter the test serves and whose value it sets. Assertions
//! are on verdicts and measurement counts, never on elapsed time; waits
//! poll Prometheus's query API with a bound.

use std::time::Duration;

use kiln_deploy::{Measurement, PrometheusGate, run_gate};
use kiln_testkit::prometheus::{Exporter, METRIC, Prometheus, free_port};

/// An exporter at `ratio` and a Prometheus that has scraped it.
async fn setup(ratio: f64, prefix: &str) -> (Exporter, Prometheus) {
    let exporter = Exporter::start(ratio).await;
    let mut prometheus = Prometheus::start(exporter.addr, prefix);
    prometheus.wait_for(METRIC, |v| v == ratio).await;
    (exporter, prometheus)
}

fn gate(query: &str, success: &str, interval: u64, duration: u64, failure_limit: u32) -> PrometheusGate {
    let gate = PrometheusGate {
        query: query.into(),
        success: success.parse().unwrap(),
        interval: Duration::from_secs(interval),
        failure_limit,
        duration: Duration::from_secs(duration),
    };
    gate.validate().unwrap();
    gate
}

async fn run(base: &str, gate: &PrometheusGate) -> (kiln_deploy::GateVerdict, Vec<Measurement>) {
    let http = reqwest::Client::new();
    let mut seen = Vec::new();
    let verdict = run_gate(&http, base, gate, |m| seen.push(m.clone())).await;
    assert_eq!(seen, verdict.measurements, "on_measurement saw every measurement");
    (verdict, seen)
}

#[tokio::test]
async fn a_healthy_ratio_passes_after_all_measurements() {
    let (_exporter, prometheus) = setup(0.01, "").await;
    let (verdict, _) = run(&prometheus.base, &gate(METRIC, "result < 0.05", 1, 3, 0)).await;
    assert!(verdict.passed, "{verdict:?}");
    assert_eq!(verdict.measurements.len(), 3);
    assert_eq!(verdict.reason, "3 of 3 measurements met `result < 0.05`");
    for m in &verdict.measurements {
        assert!(m.ok && m.values == [0.01], "{m:?}");
        assert_eq!(m.message, "result = 0.01 meets `result < 0.05`");
    }
    assert!(verdict.measurements.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));

    // A scalar answer, and several series in the order sort_desc gives.
    let (verdict, _) = run(&prometheus.base, &gate(&format!("scalar({METRIC})"), "result == 0.01", 1, 1, 0)).await;
    assert!(verdict.passed, "{verdict:?}");
    let (verdict, _) = run(
        &prometheus.base,
        &gate(
            &format!("sort_desc({METRIC} or vector(1))"),
            "len(result) == 2 && result[0] == 1 && result[1] < 0.05",
            1,
            1,
            0,
        ),
    )
    .await;
    assert!(verdict.passed, "{verdict:?}");
    assert_eq!(verdict.measurements[0].values, [1.0, 0.01]);
}

#[tokio::test]
async fn a_bad_ratio_fails_at_the_first_failed_measurement_with_no_failure_allowed() {
    let (exporter, mut prometheus) = setup(0.01, "").await;
    exporter.set(0.5);
    prometheus.wait_for(METRIC, |v| v == 0.5).await;
    let (verdict, _) = run(&prometheus.base, &gate(METRIC, "result < 0.05", 1, 5, 0)).await;
    assert!(!verdict.passed);
    assert_eq!(verdict.measurements.len(), 1, "fail fast: {verdict:?}");
    assert_eq!(verdict.reason, "1 measurement failed (limit 0): result = 0.5 does not meet `result < 0.05`");
}

#[tokio::test]
async fn with_failure_limit_1_the_gate_fails_at_the_second_failed_measurement() {
    let (exporter, mut prometheus) = setup(0.01, "").await;
    exporter.set(0.5);
    prometheus.wait_for(METRIC, |v| v == 0.5).await;
    let (verdict, _) = run(&prometheus.base, &gate(METRIC, "result < 0.05", 1, 5, 1)).await;
    assert!(!verdict.passed);
    assert_eq!(verdict.measurements.len(), 2, "{verdict:?}");
    assert!(verdict.measurements.iter().all(|m| !m.ok));
    assert_eq!(verdict.reason, "2 measurements failed (limit 1): result = 0.5 does not meet `result < 0.05`");
}

#[tokio::test]
async fn a_series_that_does_not_exist_is_a_failed_measurement_saying_no_series() {
    let (_exporter, prometheus) = setup(0.01, "").await;
    let (verdict, _) = run(&prometheus.base, &gate("kiln_test_no_such_metric", "result < 0.05", 1, 1, 0)).await;
    assert!(!verdict.passed);
    let m = &verdict.measurements[0];
    assert!(!m.ok && m.values.is_empty());
    assert!(m.message.starts_with("the query returned no series"), "{m:?}");
    // A condition on the count alone is met by no series.
    let (verdict, _) = run(&prometheus.base, &gate("kiln_test_no_such_metric", "len(result) == 0", 1, 1, 0)).await;
    assert!(verdict.passed, "{verdict:?}");
}

#[tokio::test]
async fn a_syntax_error_quotes_prometheus() {
    let (_exporter, prometheus) = setup(0.01, "").await;
    let (verdict, _) = run(&prometheus.base, &gate("sum(", "result < 0.05", 1, 1, 0)).await;
    assert!(!verdict.passed);
    let message = &verdict.measurements[0].message;
    assert!(
        message.starts_with("Prometheus refused the query (bad_data, HTTP 400): ") && message.contains("parse error"),
        "{message}"
    );
    assert!(verdict.reason.ends_with(message.as_str()), "{}", verdict.reason);
    // A range vector is refused by the gate, not by Prometheus.
    let (verdict, _) = run(&prometheus.base, &gate(&format!("{METRIC}[1m]"), "result < 0.05", 1, 1, 0)).await;
    assert!(verdict.measurements[0].message.starts_with("the query returned a range vector"));
}

#[tokio::test]
async fn a_path_prefix_in_the_base_url_is_kept() {
    let (_exporter, prometheus) = setup(0.01, "/prom").await;
    for base in [prometheus.base.clone(), format!("{}/", prometheus.base)] {
        let (verdict, _) = run(&base, &gate(METRIC, "result < 0.05", 1, 1, 0)).await;
        assert!(verdict.passed, "{base}: {verdict:?}");
    }
}

#[tokio::test]
async fn prometheus_down_is_a_failed_measurement_saying_so() {
    let port = free_port(); // bound and released: nothing listens there
    let base = format!("http://127.0.0.1:{port}");
    let (verdict, _) = run(&base, &gate(METRIC, "result < 0.05", 1, 1, 0)).await;
    assert!(!verdict.passed);
    let message = &verdict.measurements[0].message;
    assert!(
        message.starts_with(&format!("could not connect to Prometheus at http://127.0.0.1:{port}/: ")),
        "{message}"
    );
    assert!(message.to_lowercase().contains("refused"), "{message}");
}

#[tokio::test]
async fn a_silent_server_times_out_within_the_interval() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let (verdict, _) = run(&format!("http://{addr}"), &gate(METRIC, "result < 0.05", 1, 2, 1)).await;
    assert!(!verdict.passed);
    assert_eq!(verdict.measurements.len(), 2);
    for m in &verdict.measurements {
        assert_eq!(m.message, format!("Prometheus at http://{addr}/ did not answer within 1s"));
    }
}
