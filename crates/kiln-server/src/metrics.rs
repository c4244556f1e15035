//! Series kept with the `prometheus` crate (spec 000 §15, issue 19): HTTP
//! request durations by route, stale-result rejections, jobs by status and
//! connected agents. The older hand-written series of `/metrics` stay beside them
//! until they move here.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The error code of an API error answer, set by `ApiErr` on its response
/// so the metrics layer can count rejections by kind.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

pub struct Metrics {
    registry: Registry,
    http: HistogramVec,
    stale: IntCounter,
    /// Set at each scrape.
    pub jobs: IntGaugeVec,
    pub agents_connected: IntGauge,
    /// Failed attempts by failure class (agent reports, lost leases).
    pub attempt_failures: IntCounterVec,
    /// Jobs failed by the queue timeout.
    pub queue_timeouts: IntCounter,
    pub run_timeouts: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let http = HistogramVec::new(
            HistogramOpts::new("kiln_http_request_duration_seconds", "HTTP requests by route, method and status.")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
            &["route", "method", "status"],
        )
        .expect("valid histogram");
        let stale = IntCounter::new(
            "kiln_stale_results_rejected_total",
            "Calls of an attempt that no longer owns its job (stale epoch), refused.",
        )
        .expect("valid counter");
        let jobs = IntGaugeVec::new(
            Opts::new("kiln_jobs", "Jobs not yet finished, by status (pending, ready, running)."),
            &["status"],
        )
        .expect("valid gauge");
        let agents_connected =
            IntGauge::new("kiln_agents_connected", "Agents whose session stream is open on this server process.")
                .expect("valid gauge");
        let attempt_failures = IntCounterVec::new(
            Opts::new(
                "kiln_attempt_failures_total",
                "Attempts that ended without success, by failure class (step_failed, timeout, hang, agent_lost, \
                 infra, cancelled).",
            ),
            &["class"],
        )
        .expect("valid counter");
        let queue_timeouts = IntCounter::new(
            "kiln_queue_timeouts_total",
            "Jobs failed because no agent claimed them within --queue-timeout.",
        )
        .expect("valid counter");
        registry.register(Box::new(attempt_failures.clone())).expect("unique metric");
        registry.register(Box::new(queue_timeouts.clone())).expect("unique metric");
        let run_timeouts =
            IntCounter::new("kiln_run_timeouts_total", "Runs cancelled because they passed their run-level timeout.")
                .expect("valid metric");
        registry.register(Box::new(run_timeouts.clone())).expect("unique metric");
        registry.register(Box::new(http.clone())).expect("unique metric");
        registry.register(Box::new(stale.clone())).expect("unique metric");
        registry.register(Box::new(jobs.clone())).expect("unique metric");
        registry.register(Box::new(agents_connected.clone())).expect("unique metric");
        Metrics { registry, http, stale, jobs, agents_connected, attempt_failures, queue_timeouts, run_timeouts }
    }
}

impl Metrics {
    /// The text exposition of these series.
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a malformed family would
        // be a bug caught by the tests.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Count one answered request: its duration by route pattern, method and
/// status, and a stale-epoch refusal (told by the answer's [`ErrorCode`]).
/// The middleware in `router` calls it for every request.
impl Metrics {
    pub(crate) fn observe(&self, route: &str, method: &str, status: &str, secs: f64, code: Option<&ErrorCode>) {
        self.http.with_label_values(&[route, method, status]).observe(secs);
        if code.is_some_and(|c| c.0 == kiln_api::codes::STALE_EPOCH) {
            self.stale.inc();
        }
    }
}
