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
    let body = format!(
        "# HELP kiln_dispatch_queue_depth Deliveries waiting in dispatch queues.\n\
         # TYPE kiln_dispatch_queue_depth gauge\n\
         kiln_dispatch_queue_depth {}\n",
        state.dispatcher.depth()
    );
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub(crate) async fn no_such_endpoint() -> ApiErr {
    ApiErr::not_found("no such endpoint")
}
