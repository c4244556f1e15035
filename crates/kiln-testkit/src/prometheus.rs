//! A real Prometheus for tests (Debian's `prometheus` package, or
//! `KILN_PROMETHEUS`), started on a free loopback port and scraping every
//! second an exporter the test serves, whose `kiln_test_error_ratio` it
//! sets. Used by kiln-deploy's gate tests and the deployments e2e tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The gauge the exporter serves.
pub const METRIC: &str = "kiln_test_error_ratio";
/// How long to wait for Prometheus to start and to see a new value.
const WAIT: Duration = Duration::from_secs(60);

pub fn prometheus_binary() -> PathBuf {
    let path =
        std::env::var_os("KILN_PROMETHEUS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
    assert!(
        path.exists(),
        "{} is missing: these tests run a real Prometheus. Install Debian's `prometheus` package \
         (`apt-get install prometheus`, which scripts/test does), or set KILN_PROMETHEUS to a \
         Prometheus 2.x binary",
        path.display()
    );
    path
}

/// An exporter serving `kiln_test_error_ratio <value>` on loopback.
pub struct Exporter {
    pub addr: SocketAddr,
    value: Arc<AtomicU64>,
}

impl Exporter {
    pub async fn start(value: f64) -> Exporter {
        let bits = Arc::new(AtomicU64::new(value.to_bits()));
        let shared = bits.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let v = f64::from_bits(shared.load(Ordering::SeqCst));
                async move { format!("# TYPE {METRIC} gauge\n{METRIC} {v}\n") }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Exporter { addr, value: bits }
    }

    pub fn set(&self, value: f64) {
        self.value.store(value.to_bits(), Ordering::SeqCst);
    }
}

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    child: Child,
    /// Its base URL (with the path prefix, if any).
    pub base: String,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second; `prefix` serves
    /// its API under a path (`--web.external-url`), as behind a proxy.
    pub fn start(target: SocketAddr, prefix: &str) -> Prometheus {
        let binary = prometheus_binary();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: kiln_test\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if !prefix.is_empty() {
            cmd.arg(format!("--web.external-url=http://127.0.0.1:{port}{prefix}"));
        }
        let child = cmd.spawn().expect("start prometheus");
        Prometheus { child, base: format!("http://127.0.0.1:{port}{prefix}"), dir }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// Polls `query` until its first value satisfies `want` (bounded).
    pub async fn wait_for(&mut self, query: &str, want: impl Fn(f64) -> bool) {
        let http = reqwest::Client::new();
        let url = format!("{}/api/v1/query", self.base.trim_end_matches('/'));
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", self.log());
            }
            let mut query_url = reqwest::Url::parse(&url).unwrap();
            query_url.query_pairs_mut().append_pair("query", query);
            match http.get(query_url).send().await {
                Ok(r) => {
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    let value = body["data"]["result"][0]["value"][1].as_str().and_then(|v| v.parse::<f64>().ok());
                    if value.is_some_and(&want) {
                        return;
                    }
                    last = body.to_string();
                }
                Err(e) => last = e.to_string(),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "prometheus did not answer {query} as wanted within {WAIT:?}; last: {last}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
