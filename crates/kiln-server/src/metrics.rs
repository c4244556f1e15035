//! The operating signals of `/metrics` (spec 000 §15, issue 19), kept with
//! the `prometheus` crate. Counters and histograms move at the event, where
//! the server decides it (the trigger's acceptance, the claim, the
//! completion, fencing, log ingestion, sealing); gauges that the store
//! knows are read at each scrape ([`Metrics::refresh`]) with bounded
//! queries. The older hand-written series of `/metrics` (webhooks, caches,
//! degradation, storage) stay beside them in `handlers::health`.
//!
//! Every label takes a fixed, small set of values (a route pattern, a
//! status, a failure class, a phase) except two, bounded otherwise:
//! `labels` of the eligible-job ages (the [`CLASSES`] oldest compatibility
//! classes) and `agent` of the slot gauges (the registered agents).

use kiln_core::failure::FailureClass;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// The error code of an API error answer, set by `ApiErr` on its response
/// so the metrics layer can count rejections by kind.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

/// The window of `kiln_tests_flaky{repo}`: a week.
pub const FLAKY_WINDOW_MS: i64 = 7 * 24 * 3600 * 1000;

/// Compatibility classes whose oldest eligible job is exported (the oldest
/// first): the label's cardinality bound.
pub const CLASSES: u32 = 20;

/// Buckets of durations from milliseconds to minutes (store transactions,
/// dispatch).
const FAST: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of job phases, from a fraction of a second to an hour.
const PHASES: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];
/// Buckets of the wait from ready to claimed.
const DISPATCH: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

pub struct Metrics {
    registry: Registry,
    http: HistogramVec,
    stale: IntCounter,
    /// Set at each scrape.
    pub jobs: IntGaugeVec,
    runs: IntGaugeVec,
    pub agents_connected: IntGauge,
    agent_capacity: IntGaugeVec,
    agent_reserved: IntGaugeVec,
    oldest_eligible: GaugeVec,
    reconciler_lag: Gauge,
    unbound_age: Gauge,
    log_archive_lag: Gauge,
    deliveries_pending: IntGauge,
    deliveries_delayed: IntGauge,
    delivery_oldest_pending: Gauge,
    /// Failed attempts by failure class (agent reports, lost leases).
    pub attempt_failures: IntCounterVec,
    /// Jobs failed by the queue timeout.
    pub queue_timeouts: IntCounter,
    pub run_timeouts: IntCounter,
    /// Attempts ended, by outcome (success, failed, cancelled, lost).
    pub attempts_finished: IntCounterVec,
    /// Failed attempts whose job went back to ready (a retry), by class.
    pub retries: IntCounterVec,
    /// Jobs that reached a final status through a completion, a lost lease
    /// or the queue timeout, by status.
    pub jobs_finished: IntCounterVec,
    pub trigger_persist: HistogramVec,
    pub dispatch_latency: Histogram,
    pub phases: HistogramVec,
    pub log_bytes: IntCounter,
    pub log_truncations: IntCounter,
    pub log_gaps: IntCounterVec,
    pub log_dropped_bytes: IntCounterVec,
    pub log_archived_bytes: IntCounter,
    pub artifact_bytes: IntCounter,
    pub artifacts_sealed: IntCounter,
    /// Wait from ready to claimed, by team and lane (issue 44).
    pub queue_wait: HistogramVec,
    /// Slot-seconds of finished attempts, by team (cost per team; issue 44).
    pub job_seconds: prometheus::CounterVec,
    /// Live jobs by team, lane and state (refreshed every second).
    team_jobs: IntGaugeVec,
    /// Slots each team is entitled to and holds now, by team and kind.
    team_slots: GaugeVec,
    /// Tests in bound reports, by outcome (issue 43).
    pub tests: IntCounterVec,
    /// Tests flagged flaky in the last 7 days, by repository (scrape time).
    tests_flaky: IntGaugeVec,
    /// Tests quarantined now, by repository (scrape time).
    tests_quarantined: IntGaugeVec,
    /// Quarantines that expired (the test blocks again), by repository.
    quarantine_expiries: IntCounterVec,
    /// The store's transactions run again (serialization races), brought
    /// up to the store's own count at each scrape.
    db_retries: IntCounter,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn counter_vec(registry: &Registry, name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("unique metric");
    // Every known value is exported from the start (at 0), so a rate over
    // a series that has not moved yet is 0 rather than absent.
    for v in values {
        c.with_label_values(&[v]);
    }
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn int_gauge_vec(registry: &Registry, name: &str, help: &str, label: &str) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn histogram_vec(registry: &Registry, name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    let h =
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels).expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("unique metric");
    h
}

const CLASS_NAMES: [&str; 6] = ["step_failed", "timeout", "hang", "agent_lost", "infra", "cancelled"];

impl Default for Metrics {
    fn default() -> Self {
        let r = Registry::new();
        let http = histogram_vec(
            &r,
            "kiln_http_request_duration_seconds",
            "HTTP requests by route, method and status.",
            &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0],
            &["route", "method", "status"],
        );
        let stale = counter(
            &r,
            "kiln_stale_results_rejected_total",
            "Calls of an attempt that no longer owns its job (stale epoch), refused.",
        );
        let jobs =
            int_gauge_vec(&r, "kiln_jobs", "Jobs not yet finished, by status (pending, ready, running).", "status");
        let runs =
            int_gauge_vec(&r, "kiln_runs", "Runs not yet finished, by status (queued, running, cancelling).", "status");
        let agents_connected =
            IntGauge::new("kiln_agents_connected", "Agents whose session stream is open on this server process.")
                .expect("valid gauge");
        r.register(Box::new(agents_connected.clone())).expect("unique metric");
        let agent_capacity = int_gauge_vec(
            &r,
            "kiln_agent_capacity_slots",
            "Job slots each registered agent offers (--max-jobs).",
            "agent",
        );
        let agent_reserved = int_gauge_vec(
            &r,
            "kiln_agent_reserved_slots",
            "Running attempts the store holds for each agent (reservations; the agent's own kiln_agent_jobs_running \
             is its physical occupancy).",
            "agent",
        );
        let oldest_eligible = GaugeVec::new(
            Opts::new(
                "kiln_oldest_eligible_job_age_seconds",
                "Age of the oldest job that is ready and due but not claimed, per compatibility class (its runs-on \
                 labels; the 20 oldest classes).",
            ),
            &["labels"],
        )
        .expect("valid gauge");
        r.register(Box::new(oldest_eligible.clone())).expect("unique metric");
        let reconciler_lag = gauge(
            &r,
            "kiln_reconciler_lag_seconds",
            "How long the oldest lease past its deadline has waited to be fenced (0: none waits).",
        );
        let unbound_age = gauge(
            &r,
            "kiln_artifact_unbound_generation_age_seconds",
            "Age of the oldest artifact generation that no binding, cache entry or running attempt holds (awaiting \
             collection; 0: none).",
        );
        let log_archive_lag = gauge(
            &r,
            "kiln_log_archive_lag_seconds",
            "How long ago the longest-finished job whose log is still in the hot journal finished (0: none).",
        );
        let deliveries_pending = IntGauge::new(
            "kiln_deliveries_pending",
            "Accepted webhook and poll deliveries not yet planned into runs (retried until planned).",
        )
        .expect("valid gauge");
        r.register(Box::new(deliveries_pending.clone())).expect("unique metric");
        let deliveries_delayed = IntGauge::new(
            "kiln_deliveries_delayed",
            "Deliveries pending for longer than --delivery-alert-after (planning keeps meeting trouble).",
        )
        .expect("valid gauge");
        r.register(Box::new(deliveries_delayed.clone())).expect("unique metric");
        let delivery_oldest_pending = gauge(
            &r,
            "kiln_delivery_oldest_pending_seconds",
            "How long ago the oldest delivery not yet planned arrived (0: none).",
        );
        let attempt_failures = counter_vec(
            &r,
            "kiln_attempt_failures_total",
            "Attempts that ended without success, by failure class (step_failed, timeout, hang, agent_lost, infra, \
             cancelled).",
            "class",
            &CLASS_NAMES,
        );
        let db_retries = counter(
            &r,
            "kiln_db_transaction_retries_total",
            "Database transactions this server ran again after losing a serialization race or a deadlock \
             (PostgreSQL; each retry reruns the whole transaction).",
        );
        let queue_timeouts = counter(
            &r,
            "kiln_queue_timeouts_total",
            "Jobs failed because no agent claimed them within --queue-timeout.",
        );
        let attempts_finished = counter_vec(
            &r,
            "kiln_attempts_finished_total",
            "Attempts ended, by outcome: success, failed, cancelled (completed by their agent) or lost (fenced).",
            "outcome",
            &["success", "failed", "cancelled", "lost"],
        );
        let retries = counter_vec(
            &r,
            "kiln_retries_total",
            "Failed attempts after which their job was made ready again (a retry), by failure class.",
            "class",
            &CLASS_NAMES,
        );
        let jobs_finished = counter_vec(
            &r,
            "kiln_jobs_finished_total",
            "Jobs that reached a final status through an attempt's completion, a lost lease or the queue timeout, by \
             status.",
            "status",
            &["success", "failed", "cancelled"],
        );
        let trigger_persist = histogram_vec(
            &r,
            "kiln_trigger_persist_duration_seconds",
            "Time to persist an accepted trigger (the run, its jobs and their outbox events), by trigger (api, \
             retry, forge, schedule).",
            FAST,
            &["trigger"],
        );
        let dispatch_latency = Histogram::with_opts(
            HistogramOpts::new(
                "kiln_dispatch_latency_seconds",
                "Time from a job becoming eligible (ready and due) to its claim.",
            )
            .buckets(DISPATCH.to_vec()),
        )
        .expect("valid histogram");
        r.register(Box::new(dispatch_latency.clone())).expect("unique metric");
        let phases = histogram_vec(
            &r,
            "kiln_attempt_phase_duration_seconds",
            "Attempt phases as their agents measured them, by phase: prepare (claim to first step), image (pull or \
             build), command (the steps), publication (last step's end to the completion committed).",
            PHASES,
            &["phase"],
        );
        let log_bytes = counter(&r, "kiln_log_ingested_bytes_total", "Log bytes committed to the hot journal.");
        let log_truncations = counter(
            &r,
            "kiln_log_truncations_total",
            "Attempts whose output reached their log limit (the rest was dropped).",
        );
        let log_gaps = counter_vec(
            &r,
            "kiln_log_gaps_total",
            "Gaps in attempts' logs, by reason: agent_lost (a fenced attempt's log ends at its committed offset), \
             rate_limit and buffer_full (output dropped by the agent).",
            "reason",
            &["agent_lost", "rate_limit", "buffer_full"],
        );
        let log_dropped_bytes = counter_vec(
            &r,
            "kiln_log_dropped_bytes_total",
            "Output bytes agents dropped, by reason (limit, rate_limit, buffer_full).",
            "reason",
            &["limit", "rate_limit", "buffer_full"],
        );
        let log_archived_bytes = counter(
            &r,
            "kiln_log_archived_bytes_total",
            "Log bytes archived from the hot journal to the object store.",
        );
        let artifact_bytes = counter(&r, "kiln_artifact_sealed_bytes_total", "Bytes of artifact generations sealed.");
        let artifacts_sealed = counter(&r, "kiln_artifact_generations_sealed_total", "Artifact generations sealed.");
        let run_timeouts =
            counter(&r, "kiln_run_timeouts_total", "Runs cancelled because they passed their run-level timeout.");
        let tests = counter_vec(
            &r,
            "kiln_tests_total",
            "Tests in the reports bound by completions (each job attempt's), by outcome.",
            "outcome",
            &["passed", "failed", "error", "skipped"],
        );
        let tests_flaky =
            int_gauge_vec(&r, "kiln_tests_flaky", "Tests flagged flaky in the last 7 days, by repository.", "repo");
        let tests_quarantined =
            int_gauge_vec(&r, "kiln_tests_quarantined", "Tests quarantined now, by repository.", "repo");
        let quarantine_expiries = {
            let c = IntCounterVec::new(
                Opts::new(
                    "kiln_tests_quarantine_expired_total",
                    "Quarantines that expired (their test fails its job again), by repository.",
                ),
                &["repo"],
            )
            .expect("valid counter");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let queue_wait = histogram_vec(
            &r,
            "kiln_queue_wait_seconds",
            "Wait from ready to claimed, by team and priority lane (issue 44).",
            DISPATCH,
            &["team", "priority"],
        );
        let job_seconds = prometheus::CounterVec::new(
            Opts::new(
                "kiln_job_seconds_total",
                "Slot-seconds of finished job attempts (claimed to ended), by team: what each team costs.",
            ),
            &["team"],
        )
        .expect("valid counter");
        r.register(Box::new(job_seconds.clone())).expect("unique metric");
        let team_jobs = IntGaugeVec::new(
            Opts::new(
                "kiln_team_jobs",
                "Live jobs by team, priority lane and state (ready: waiting for a slot; pending: on their needs; running: \
                 claimed-but-not-started included).",
            ),
            &["team", "priority", "state"],
        )
        .expect("valid gauge");
        r.register(Box::new(team_jobs.clone())).expect("unique metric");
        let team_slots = GaugeVec::new(
            Opts::new(
                "kiln_team_slots",
                "Slots each team is entitled to by its weight (kind=entitled) and holds (kind=received) now.",
            ),
            &["team", "kind"],
        )
        .expect("valid gauge");
        r.register(Box::new(team_slots.clone())).expect("unique metric");
        Metrics {
            queue_wait,
            job_seconds,
            team_jobs,
            team_slots,
            tests,
            tests_flaky,
            tests_quarantined,
            quarantine_expiries,
            registry: r,
            http,
            stale,
            jobs,
            runs,
            agents_connected,
            agent_capacity,
            agent_reserved,
            oldest_eligible,
            reconciler_lag,
            unbound_age,
            log_archive_lag,
            deliveries_pending,
            deliveries_delayed,
            delivery_oldest_pending,
            attempt_failures,
            queue_timeouts,
            run_timeouts,
            attempts_finished,
            retries,
            jobs_finished,
            trigger_persist,
            dispatch_latency,
            phases,
            log_bytes,
            log_truncations,
            log_gaps,
            log_dropped_bytes,
            log_archived_bytes,
            artifact_bytes,
            artifacts_sealed,
            db_retries,
        }
    }
}

/// `{"os":"linux","size":"large"}` (a job's `class_key`) as `os=linux,size=large`;
/// no labels at all is `any`.
pub(crate) fn class_label(class_key: &str) -> String {
    let labels: std::collections::BTreeMap<String, String> = serde_json::from_str(class_key).unwrap_or_default();
    if labels.is_empty() {
        return "any".into();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
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

    /// Count one answered request: its duration by route pattern, method and
    /// status, and a stale-epoch refusal (told by the answer's [`ErrorCode`]).
    /// The middleware in `router` calls it for every request.
    pub(crate) fn observe(&self, route: &str, method: &str, status: &str, secs: f64, code: Option<&ErrorCode>) {
        self.http.with_label_values(&[route, method, status]).observe(secs);
        if code.is_some_and(|c| c.0 == kiln_api::codes::STALE_EPOCH) {
            self.stale.inc();
        }
    }

    /// One failed attempt of class `class`, after which its job has
    /// `job_status`: a retry if it is ready again, a finished job if final.
    pub(crate) fn failed_attempt(&self, class: FailureClass, job_status: &str) {
        self.attempt_failures.with_label_values(&[class.as_str()]).inc();
        if job_status == "ready" {
            self.retries.with_label_values(&[class.as_str()]).inc();
        }
    }

    /// A job reached `status`; counted if it is final.
    pub(crate) fn job_finished(&self, status: &str) {
        if matches!(status, "success" | "failed" | "cancelled") {
            self.jobs_finished.with_label_values(&[status]).inc();
        }
    }

    /// What an agent measured of an attempt the store just completed;
    /// `commit` is the completion transaction's own time.
    pub(crate) fn attempt_telemetry(&self, t: &kiln_api::AttemptTelemetry, commit: std::time::Duration) {
        let secs = |ms: u64| ms as f64 / 1000.0;
        if let Some(ms) = t.prepare_ms {
            self.phases.with_label_values(&["prepare"]).observe(secs(ms));
        }
        if let Some(ms) = t.image_ms {
            self.phases.with_label_values(&["image"]).observe(secs(ms));
        }
        if let Some(ms) = t.command_ms {
            self.phases.with_label_values(&["command"]).observe(secs(ms));
        }
        if let Some(ms) = t.publish_ms {
            self.phases.with_label_values(&["publication"]).observe(secs(ms) + commit.as_secs_f64());
        }
        if t.log_truncated_bytes > 0 {
            self.log_truncations.inc();
            self.log_dropped_bytes.with_label_values(&["limit"]).inc_by(t.log_truncated_bytes);
        }
        if t.log_rate_dropped_bytes > 0 {
            self.log_gaps.with_label_values(&["rate_limit"]).inc();
            self.log_dropped_bytes.with_label_values(&["rate_limit"]).inc_by(t.log_rate_dropped_bytes);
        }
        if t.log_buffer_dropped_bytes > 0 {
            self.log_gaps.with_label_values(&["buffer_full"]).inc();
            self.log_dropped_bytes.with_label_values(&["buffer_full"]).inc_by(t.log_buffer_dropped_bytes);
        }
    }

    /// The live jobs by team × lane × class, as the dispatcher's refresh
    /// read them.
    pub(crate) fn queue_groups(&self, groups: &[kiln_store::QueueGroup]) {
        let mut by: std::collections::BTreeMap<(&str, &str, &str), i64> = Default::default();
        for g in groups {
            for (state, n) in [("ready", g.ready), ("pending", g.pending), ("running", g.running)] {
                *by.entry((g.team.as_str(), g.lane.as_str(), state)).or_default() += n;
            }
        }
        self.team_jobs.reset();
        for ((team, lane, state), n) in by {
            self.team_jobs.with_label_values(&[team, lane, state]).set(n);
        }
    }

    /// Each team's entitled and received slots now.
    pub(crate) fn team_slots(&self, shares: &[(String, f64, f64)]) {
        self.team_slots.reset();
        for (team, entitled, received) in shares {
            self.team_slots.with_label_values(&[team, "entitled"]).set(*entitled);
            self.team_slots.with_label_values(&[team, "received"]).set(*received);
        }
    }

    /// A quarantine of `repo` expired.
    pub(crate) fn quarantine_expired(&self, repo: &str) {
        self.quarantine_expiries.with_label_values(&[repo]).inc();
    }

    /// A completion bound an attempt's reports.
    pub(crate) fn tests_bound(&self, t: &kiln_store::TestAttemptRecord) {
        for (outcome, n) in [("passed", t.passed), ("failed", t.failed), ("error", t.errored), ("skipped", t.skipped)] {
            self.tests.with_label_values(&[outcome]).inc_by(u64::try_from(n).unwrap_or(0));
        }
    }

    /// Set the scrape-time gauges from the store. A store that does not
    /// answer leaves the last values (`/readyz` says why).
    ///
    /// `log_archive_after` is the server's archive delay,
    /// `delivery_alert_after` its bound on pending deliveries, `db_now_ms`
    /// the database clock's now, `connected` the agents holding a session.
    pub(crate) async fn refresh(
        &self,
        store: &dyn kiln_store::Store,
        log_archive_after: std::time::Duration,
        delivery_alert_after: std::time::Duration,
        db_now_ms: i64,
        connected: usize,
    ) {
        let retries = store.transaction_retries();
        self.db_retries.inc_by(retries.saturating_sub(self.db_retries.get()));
        if let Ok(b) = store.delivery_backlog(delivery_alert_after.as_millis() as i64).await {
            self.deliveries_pending.set(i64::try_from(b.pending).unwrap_or(i64::MAX));
            self.deliveries_delayed.set(i64::try_from(b.delayed).unwrap_or(i64::MAX));
            self.delivery_oldest_pending.set(b.oldest_ms as f64 / 1000.0);
        }
        if let Ok(counts) = store.active_job_counts().await {
            for (status, n) in counts {
                self.jobs.with_label_values(&[status.as_str()]).set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        let secs = |ms: i64| ms as f64 / 1000.0;
        if let Ok(g) = store.operating_gauges(CLASSES).await {
            for (status, n) in &g.active_runs {
                self.runs.with_label_values(&[status.as_str()]).set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
            // Classes that have no eligible job any more leave the series.
            self.oldest_eligible.reset();
            for (class, ms) in &g.oldest_eligible_ms {
                self.oldest_eligible.with_label_values(&[&class_label(class)]).set(secs((*ms).max(0)));
            }
            self.reconciler_lag.set(secs(g.reconciler_lag_ms));
            let after = log_archive_after.as_millis() as i64;
            self.log_archive_lag.set(secs((g.oldest_unarchived_log_ms - after).max(0)));
        }
        if let (Ok(agents), Ok(running)) = (store.list_agents().await, store.running_per_agent().await) {
            self.agent_capacity.reset();
            self.agent_reserved.reset();
            for a in agents {
                self.agent_capacity.with_label_values(&[&a.name]).add(i64::from(a.max_jobs));
                let held = running.get(&a.id).copied().unwrap_or(0);
                self.agent_reserved.with_label_values(&[&a.name]).add(i64::from(held));
            }
        }
        if let Ok(oldest) = store.collectable_generations(0, 1).await {
            // The generation's time is the database clock's.
            self.unbound_age.set(oldest.first().map_or(0.0, |g| secs((db_now_ms - g.created_at).max(0))));
        }
        if let Ok(g) = store.test_gauges(FLAKY_WINDOW_MS).await {
            self.tests_flaky.reset();
            self.tests_quarantined.reset();
            for (repo, (flaky, quarantined)) in g {
                self.tests_flaky.with_label_values(&[&repo]).set(flaky);
                self.tests_quarantined.with_label_values(&[&repo]).set(quarantined);
            }
        }
        self.agents_connected.set(i64::try_from(connected).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_labels_are_compact_and_sorted() {
        assert_eq!(class_label("{}"), "any");
        assert_eq!(class_label(r#"{"size":"large","os":"linux"}"#), "os=linux,size=large");
    }

    #[test]
    fn a_failed_attempt_is_a_retry_only_when_its_job_is_ready_again() {
        let m = Metrics::default();
        m.failed_attempt(FailureClass::StepFailed, "failed");
        m.failed_attempt(FailureClass::AgentLost, "ready");
        assert_eq!(m.attempt_failures.with_label_values(&["step_failed"]).get(), 1);
        assert_eq!(m.retries.with_label_values(&["step_failed"]).get(), 0);
        assert_eq!(m.retries.with_label_values(&["agent_lost"]).get(), 1);
    }
}
