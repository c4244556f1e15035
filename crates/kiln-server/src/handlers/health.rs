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
         kiln_webhook_deliveries_total{{outcome=\"bad_payload\"}} {}\n",
        state.dispatcher.depth(),
        w.accepted.load(Relaxed),
        w.duplicate.load(Relaxed),
        w.ignored.load(Relaxed),
        w.rejected_signature.load(Relaxed),
        w.rejected_payload.load(Relaxed),
    );
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub(crate) async fn no_such_endpoint() -> ApiErr {
    ApiErr::not_found("no such endpoint")
}
