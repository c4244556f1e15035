//! Health, readiness and metrics (no token).

use crate::error::ApiErr;
use crate::state::State;
use axum::extract::State as S;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_api as api;
use kiln_core::degradation::Level;

#[utoipa::path(
    operation_id = "health_healthz",
    get, path = "/healthz", tag = "health",
    responses(
        (status = 200, description = "The process answers", content_type = "text/plain", body = String),
    ),
    security(()),
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// How long `/readyz` waits for the database.
const STORE_CHECK: std::time::Duration = std::time::Duration::from_secs(3);

/// Ready when the store answers and the server is not in critical
/// degradation; the body says the degradation level (and why) either way:
/// `ready (degradation: warning: …)`.
#[utoipa::path(
    operation_id = "health_readyz",
    get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready; the body says the degradation level", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready: the database does not answer, or critical degradation", body = api::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn readyz(S(state): S<State>) -> Response {
    let (level, why, _) = state.resources.status();
    let degradation = if why.is_empty() {
        format!("degradation: {}", level.as_str())
    } else {
        format!("degradation: {}: {why}", level.as_str())
    };
    // Bounded: with the database down the pool keeps retrying to connect
    // for its whole acquire timeout (30 s), far past any probe's own
    // timeout, and a probe that times out learns nothing. A database that
    // does not answer in time is reported as such.
    let answer = tokio::time::timeout(STORE_CHECK, state.store.list_repos()).await;
    let Ok(answer) = answer else {
        return ApiErr::new(
            StatusCode::SERVICE_UNAVAILABLE,
            api::codes::UNAVAILABLE,
            format!("database unavailable: no answer within {}s ({degradation})", STORE_CHECK.as_secs()),
        )
        .into_response();
    };
    match answer {
        Ok(_) if level == Level::Critical => ApiErr::unavailable_for(
            crate::resources::RETRY_AFTER_SECS,
            format!("not ready: {degradation}; new runs are refused"),
        )
        .into_response(),
        Ok(_) => (StatusCode::OK, format!("ready ({degradation})")).into_response(),
        Err(e) => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, api::codes::UNAVAILABLE, format!("{e} ({degradation})"))
            .into_response(),
    }
}

/// Prometheus text exposition (more series arrive with the reliability layer).
#[utoipa::path(
    operation_id = "health_metrics",
    get, path = "/metrics", tag = "health",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn metrics(S(state): S<State>) -> impl IntoResponse {
    use std::sync::atomic::Ordering::Relaxed;
    let w = &state.webhooks;
    let (_, _, sample) = state.resources.status();
    let body = format!(
        "# HELP kiln_dispatch_queue_depth Deliveries waiting in dispatch queues.\n\
         # TYPE kiln_dispatch_queue_depth gauge\n\
         kiln_dispatch_queue_depth {}\n\
         # HELP kiln_webhook_deliveries_total Webhook deliveries by outcome.\n\
         # TYPE kiln_webhook_deliveries_total counter\n\
         kiln_webhook_deliveries_total{{outcome=\"accepted\"}} {}\n\
         kiln_webhook_deliveries_total{{outcome=\"duplicate\"}} {}\n\
         kiln_webhook_deliveries_total{{outcome=\"ignored\"}} {}\n\
         kiln_webhook_deliveries_total{{outcome=\"bad_signature\"}} {}\n\
         kiln_webhook_deliveries_total{{outcome=\"bad_payload\"}} {}\n\
         # HELP kiln_cache_lookups_total Cache lookups by result.\n\
         # TYPE kiln_cache_lookups_total counter\n\
         kiln_cache_lookups_total{{result=\"hit\"}} {}\n\
         kiln_cache_lookups_total{{result=\"miss\"}} {}\n\
         kiln_cache_lookups_total{{result=\"prefix\"}} {}\n\
         # HELP kiln_cache_saves_total Cache archives bound to their key (first writer).\n\
         # TYPE kiln_cache_saves_total counter\n\
         kiln_cache_saves_total {}\n\
         # HELP kiln_cache_conflicts_total Saves refused because the key held other bytes.\n\
         # TYPE kiln_cache_conflicts_total counter\n\
         kiln_cache_conflicts_total {}\n\
         # HELP kiln_cache_evictions_total Cache entries evicted (TTL, quota, budget, damaged).\n\
         # TYPE kiln_cache_evictions_total counter\n\
         kiln_cache_evictions_total {}\n\
         # HELP kiln_cache_integrity_failures_total Restores refused or failed (the job ran cold).\n\
         # TYPE kiln_cache_integrity_failures_total counter\n\
         kiln_cache_integrity_failures_total {}\n\
         # HELP kiln_cache_restored_bytes_total Bytes restored from caches (as reported by agents).\n\
         # TYPE kiln_cache_restored_bytes_total counter\n\
         kiln_cache_restored_bytes_total {}\n\
         # HELP kiln_cache_saved_bytes_total Bytes of cache archives bound (first writers).\n\
         # TYPE kiln_cache_saved_bytes_total counter\n\
         kiln_cache_saved_bytes_total {}\n\
         # HELP kiln_cache_time_saved_seconds_total Estimated build time saved by hits: the saving attempt's steps \
         minus the hit's steps and restore.\n\
         # TYPE kiln_cache_time_saved_seconds_total counter\n\
         kiln_cache_time_saved_seconds_total {:.3}\n\
         # HELP kiln_degradation_level The server's degradation level (0 normal, 1 warning, 2 degraded, 3 critical).\n\
         # TYPE kiln_degradation_level gauge\n\
         kiln_degradation_level {}\n\
         # HELP kiln_storage_used_ratio Used fraction of the data directory's filesystem.\n\
         # TYPE kiln_storage_used_ratio gauge\n\
         kiln_storage_used_ratio {:.4}\n\
         # HELP kiln_memory_available_bytes Memory available to the server's host.\n\
         # TYPE kiln_memory_available_bytes gauge\n\
         kiln_memory_available_bytes {}\n\
         # HELP kiln_runs_refused_degraded_total Runs refused by degradation (503).\n\
         # TYPE kiln_runs_refused_degraded_total counter\n\
         kiln_runs_refused_degraded_total {}\n",
        state.dispatcher.depth(),
        w.accepted.load(Relaxed),
        w.duplicate.load(Relaxed),
        w.ignored.load(Relaxed),
        w.rejected_signature.load(Relaxed),
        w.rejected_payload.load(Relaxed),
        state.cache_counts.hits.load(Relaxed),
        state.cache_counts.misses.load(Relaxed),
        state.cache_counts.prefix_hits.load(Relaxed),
        state.cache_counts.saves.load(Relaxed),
        state.cache_counts.conflicts.load(Relaxed),
        state.cache_counts.evictions.load(Relaxed),
        state.cache_counts.integrity_failures.load(Relaxed),
        state.cache_counts.bytes_restored.load(Relaxed),
        state.cache_counts.bytes_saved.load(Relaxed),
        state.cache_counts.ms_saved.load(Relaxed) as f64 / 1000.0,
        state.resources.level().as_number(),
        sample.map_or(0.0, |s| s.storage_used_pct() / 100.0),
        sample.and_then(|s| s.memory_available_bytes).unwrap_or(0),
        state.resources.refused.load(Relaxed),
    );
    let m = &state.metrics;
    let db_now = state.clock.now_ms() - state.clock.ahead_of_database_ms();
    let c = &state.config;
    let connected = state.live_agents.connected_count();
    m.refresh(state.store.as_ref(), c.log_archive_after, c.delivery_alert_after, db_now, connected).await;
    let body =
        body + &format!(
            "# HELP kiln_dispatch_offer_replicas Live replicas sharing the offering of ready jobs, this one included \
             (0: it offers every ready job).\n\
             # TYPE kiln_dispatch_offer_replicas gauge\n\
             kiln_dispatch_offer_replicas {}\n",
            state.dispatcher.offer_members()
        ) + &m.encode();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub(crate) async fn no_such_endpoint() -> ApiErr {
    ApiErr::not_found("no such endpoint")
}
