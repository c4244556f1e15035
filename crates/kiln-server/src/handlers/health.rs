//! Health, readiness and metrics (no token).

use crate::error::ApiErr;
use crate::state::State;
use axum::extract::State as S;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_api as api;

pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the store answers.
pub(crate) async fn readyz(S(state): S<State>) -> Response {
    match state.store.list_repos().await {
        Ok(_) => (StatusCode::OK, "ready").into_response(),
        Err(e) => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, api::codes::UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// Prometheus text exposition (more series arrive with the reliability layer).
pub(crate) async fn metrics(S(state): S<State>) -> impl IntoResponse {
    use std::sync::atomic::Ordering::Relaxed;
    let w = &state.webhooks;
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
         kiln_cache_time_saved_seconds_total {:.3}\n",
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
    );
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub(crate) async fn no_such_endpoint() -> ApiErr {
    ApiErr::not_found("no such endpoint")
}
