//! The route table: the public API (admin token), the agent API (agent
//! token), the data plane (capability URLs), health endpoints and the UI
//! (its page and cookie session); every answer gets `security`'s headers.

use crate::auth;
use crate::handlers::{agents, artifacts, attempts, blob, health, logs, repos, runs, secrets, ui};
use crate::security::{self, MAX_BODY};
use crate::state::State;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::{Router, middleware};

pub(crate) fn router(state: State) -> Router {
    let public = Router::new()
        .route("/v1/repos", post(repos::create).get(repos::list))
        .route("/v1/repos/{repo}/workflow-runs", post(runs::submit).get(runs::list))
        .route("/v1/repos/{repo}/secrets", get(secrets::list))
        .route("/v1/repos/{repo}/secrets/{name}", put(secrets::put).delete(secrets::delete))
        .route("/v1/workflow-runs/{run}", get(runs::get))
        .route("/v1/workflow-runs/{run}/cancel", post(runs::cancel))
        .route("/v1/workflow-runs/{run}/retry", post(runs::retry))
        .route("/v1/jobs/{job}/logs/events", get(logs::events))
        .route("/v1/workflow-runs/{run}/artifacts/{job}/{name}", get(artifacts::get))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_admin));
    let agent = Router::new()
        .route("/v1/agents/register", post(agents::register))
        .route("/v1/agents/{agent}/claim", post(agents::claim))
        .route("/v1/jobs/{job}/attempts/{epoch}/heartbeat", post(attempts::heartbeat))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs", post(attempts::append_log))
        .route("/v1/jobs/{job}/attempts/{epoch}/complete", post(attempts::complete))
        .route("/v1/jobs/{job}/attempts/{epoch}/image", post(attempts::commit_image))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts", post(artifacts::create_upload))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/parts/{part}", post(artifacts::part_url))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal", post(artifacts::seal))
        .route("/v1/jobs/{job}/attempts/{epoch}/restore", post(artifacts::restore))
        .route("/v1/agents/{agent}/session", get(agents::session))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_agent));
    // Data plane: capability URLs, no bearer token, bodies streamed to disk.
    let data = Router::new()
        .route("/blob/uploads/{generation}/parts/{part}", put(blob::put_part))
        .route("/blob/objects/{generation}", get(blob::get_object))
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(public)
        .merge(agent)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/", get(ui::page))
        .route("/v1/ui/session", post(ui::sign_in).delete(ui::sign_out))
        .fallback(health::no_such_endpoint)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .merge(data)
        .layer(middleware::from_fn_with_state(state.clone(), security::headers))
        .with_state(state)
}
