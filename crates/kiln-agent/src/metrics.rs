//! The agent's own `/metrics` (issue 19; `kiln agent --metrics-listen
//! ADDR`, off by default): what this process physically runs and how its
//! calls to the server fare. The server's `kiln_agent_reserved_slots` is
//! what the store holds for the agent; `kiln_agent_jobs_running` here is
//! what actually runs. Counters move at the event; the spool and the
//! disk are measured at each scrape.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use std::path::{Path, PathBuf};

pub(crate) struct AgentMetrics {
    registry: Registry,
    pub jobs_running: IntGauge,
    pub claims: IntCounterVec,
    pub heartbeats: IntCounterVec,
    pub log_bytes_sent: IntCounter,
    pub log_chunk_retries: IntCounter,
    pub steps: HistogramVec,
    pub phases: HistogramVec,
    pub attempt_duration: Histogram,
    pub multipart_retries: IntCounterVec,
    pub image_pull: HistogramVec,
    spool_bytes: IntGauge,
    disk_level: IntGauge,
    disk_used: Gauge,
}

const PHASES: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn counter_vec(r: &Registry, name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
    let c = reg(r, IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter"));
    for v in values {
        c.with_label_values(&[v]);
    }
    c
}

impl AgentMetrics {
    pub(crate) fn new(max_jobs: u32) -> AgentMetrics {
        let r = Registry::new();
        let jobs_running = reg(
            &r,
            IntGauge::new(
                "kiln_agent_jobs_running",
                "Attempts this agent process is running now (physical occupancy).",
            )
            .expect("valid gauge"),
        );
        let slots =
            reg(&r, IntGauge::new("kiln_agent_slots", "Job slots of this agent (--max-jobs).").expect("valid gauge"));
        slots.set(i64::from(max_jobs));
        let claims = counter_vec(
            &r,
            "kiln_agent_claims_total",
            "Claim long-polls answered, by result: assigned (a job), empty (nothing for this agent), error.",
            "result",
            &["assigned", "empty", "error"],
        );
        let heartbeats = counter_vec(
            &r,
            "kiln_agent_heartbeats_total",
            "Lease heartbeats sent, by result: ok, failed (retried), stale (the attempt was fenced).",
            "result",
            &["ok", "failed", "stale"],
        );
        let log_bytes_sent = reg(
            &r,
            IntCounter::new("kiln_agent_log_bytes_sent_total", "Log bytes the server acknowledged.")
                .expect("valid counter"),
        );
        let log_chunk_retries = reg(
            &r,
            IntCounter::new("kiln_agent_log_chunk_retries_total", "Log chunks sent again after a retryable failure.")
                .expect("valid counter"),
        );
        let steps = reg(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "kiln_agent_step_duration_seconds",
                    "Steps run, by outcome (success, failure, continued).",
                )
                .buckets(PHASES.to_vec()),
                &["outcome"],
            )
            .expect("valid histogram"),
        );
        let phases = reg(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "kiln_agent_attempt_phase_duration_seconds",
                    "Attempt phases, by phase: prepare (claim to first step), image, command (the steps), publish \
                     (last step's end to the completion sent).",
                )
                .buckets(PHASES.to_vec()),
                &["phase"],
            )
            .expect("valid histogram"),
        );
        let attempt_duration = reg(
            &r,
            Histogram::with_opts(
                HistogramOpts::new("kiln_agent_attempt_duration_seconds", "Attempts run, claim to clean-up.")
                    .buckets(PHASES.to_vec()),
            )
            .expect("valid histogram"),
        );
        // Spec 000 §15: multipart retries and image pull latency, apart
        // from the `image` phase (which also covers builds and commits).
        let multipart_retries = counter_vec(
            &r,
            "kiln_agent_multipart_retries_total",
            "Parts of artifact and cache uploads sent again after a failure, by target: server (the server's data \
             plane), object_store (a presigned URL).",
            "target",
            &["server", "object_store"],
        );
        let image_pull = reg(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "kiln_agent_image_pull_duration_seconds",
                    "Making a job's image present in the engine, by result: pulled (from its registry), present \
                     (already in the engine's image store), failed.",
                )
                .buckets(PHASES.to_vec()),
                &["result"],
            )
            .expect("valid histogram"),
        );
        for result in ["pulled", "present", "failed"] {
            image_pull.with_label_values(&[result]);
        }
        let spool_bytes = reg(
            &r,
            IntGauge::new("kiln_agent_log_spool_bytes", "Log bytes waiting in the running attempts' on-disk spools.")
                .expect("valid gauge"),
        );
        let disk_level = reg(
            &r,
            IntGauge::new(
                "kiln_agent_disk_level",
                "Degradation level of the workspaces' filesystem (0 normal, 1 warning, 2 degraded, 3 critical: no \
                 claims).",
            )
            .expect("valid gauge"),
        );
        let disk_used = reg(
            &r,
            Gauge::new("kiln_agent_disk_used_ratio", "Used fraction of the workspaces' filesystem.")
                .expect("valid gauge"),
        );
        AgentMetrics {
            registry: r,
            jobs_running,
            claims,
            heartbeats,
            log_bytes_sent,
            log_chunk_retries,
            steps,
            phases,
            attempt_duration,
            multipart_retries,
            image_pull,
            spool_bytes,
            disk_level,
            disk_used,
        }
    }

    fn measure(&self, attempts_dir: &Path, sandbox_dir: &Path, t: &kiln_core::degradation::Thresholds) {
        self.spool_bytes.set(i64::try_from(spool_bytes(attempts_dir)).unwrap_or(i64::MAX));
        let (level, _) = crate::disk::level(sandbox_dir, t);
        self.disk_level.set(i64::from(level.as_number()));
        if let Ok(st) = nix::sys::statvfs::statvfs(sandbox_dir) {
            let frag = st.fragment_size();
            let total = st.blocks() * frag;
            let used = total.saturating_sub(st.blocks_available() * frag);
            self.disk_used.set(if total == 0 { 0.0 } else { used as f64 / total as f64 });
        }
    }

    /// The text exposition of the agent's series.
    pub(crate) fn render(
        &self,
        attempts_dir: &Path,
        sandbox_dir: &Path,
        t: &kiln_core::degradation::Thresholds,
    ) -> String {
        self.measure(attempts_dir, sandbox_dir, t);
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Bytes of every running attempt's log spool (`attempts/*/log-spool/*`).
fn spool_bytes(attempts_dir: &Path) -> u64 {
    let Ok(attempts) = std::fs::read_dir(attempts_dir) else { return 0 };
    attempts
        .flatten()
        .filter_map(|a| std::fs::read_dir(a.path().join("log-spool")).ok())
        .flat_map(|d| d.flatten().filter_map(|f| f.metadata().ok()).map(|m| m.len()))
        .sum()
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<AgentMetrics>,
    attempts_dir: PathBuf,
    sandbox_dir: PathBuf,
    thresholds: kiln_core::degradation::Thresholds,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let (m, a, s, t) = (metrics.clone(), attempts_dir.clone(), sandbox_dir.clone(), thresholds);
            async move {
                let body = tokio::task::spawn_blocking(move || m.render(&a, &s, &t)).await.unwrap_or_default();
                ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
            }
        }),
    );
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::warn!(error = %e, "the metrics listener stopped");
    }
}
