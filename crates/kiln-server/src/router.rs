//! The route table: the public API (API tokens by scope), the agent API
//! (join token to register, then the session credential, then each
//! attempt's token), the data plane (capability URLs), health endpoints
//! and the UI (its page and cookie session); every answer gets `security`'s
//! headers. See `auth` for who may call what. Every route here is in the
//! OpenAPI document (`openapi`; a test compares this file's routes with it).

use crate::auth;
use crate::handlers::{
    access, agents, artifacts, attempts, blob, env_secrets, environments, health, logs, notify, oidc, repos, runs,
    secrets, teams, tests_api, ui,
};
use crate::security::{self, MAX_BODY};
use crate::state::State;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, patch, post, put};
use axum::{Router, middleware};

pub(crate) fn router(state: State) -> Router {
    let public = Router::new()
        .route("/v1/repos", post(repos::create).get(repos::list))
        .route("/v1/repos/{repo}", get(repos::get).merge(patch(repos::update)).merge(delete(repos::delete)))
        .route("/v1/repos/{repo}/hook-info", get(repos::hook_info))
        .route("/v1/repos/{repo}/deliveries", get(repos::deliveries))
        .route("/v1/repos/{repo}/workflow-runs", post(runs::submit).get(runs::list))
        .route("/v1/repos/{repo}/workflow-inputs", get(runs::workflow_inputs))
        .route("/v1/repos/{repo}/workflows", get(runs::workflows))
        .route("/v1/repos/{repo}/secrets", get(secrets::list))
        .route("/v1/repos/{repo}/secrets/{name}", put(secrets::put).delete(secrets::delete))
        .route("/v1/repos/{repo}/notifications", post(notify::create).get(notify::list))
        .route("/v1/repos/{repo}/notifications/deliveries", get(notify::deliveries))
        .route("/v1/repos/{repo}/notifications/{id}", delete(notify::delete))
        .route("/v1/workflow-runs", get(runs::list_all))
        .route("/v1/workflow-runs/events", get(runs::list_events))
        .route("/v1/workflow-runs/{run}", get(runs::get))
        .route("/v1/workflow-runs/{run}/events", get(runs::run_events))
        .route("/v1/workflow-runs/{run}/cancel", post(runs::cancel))
        .route("/v1/workflow-runs/{run}/retry", post(runs::retry))
        .route("/v1/workflow-runs/{run}/jobs/{job}/retry", post(runs::retry_job))
        .route("/v1/workflow-runs/{run}/jobs/{job}/cancel", post(runs::cancel_job))
        .route("/v1/workflow-runs/{run}/artifacts", get(runs::artifacts))
        .route("/v1/workflow-runs/{run}/tests", get(tests_api::run_tests))
        .route("/v1/repos/{repo}/tests/history", get(tests_api::history))
        .route("/v1/repos/{repo}/tests/timings", get(tests_api::timings))
        .route("/v1/repos/{repo}/quarantine", post(tests_api::quarantine))
        .route("/v1/repos/{repo}/quarantine", get(tests_api::quarantine_list))
        .route("/v1/repos/{repo}/quarantine", delete(tests_api::unquarantine))
        .route("/v1/teams", get(teams::list))
        .route("/v1/teams", post(teams::create))
        .route("/v1/teams/{team}", get(teams::get))
        .route("/v1/teams/{team}", patch(teams::update))
        .route("/v1/teams/{team}", delete(teams::delete))
        .route("/v1/queue", get(teams::queue_view))
        .route("/v1/environments", get(environments::list))
        .route("/v1/environments", post(environments::create))
        .route("/v1/environments/{env}", get(environments::get))
        .route("/v1/environments/{env}", patch(environments::update))
        .route("/v1/environments/{env}", delete(environments::delete))
        .route("/v1/environments/{env}/deployments", get(environments::deployments))
        .route("/v1/environments/{env}/rollback", post(environments::rollback))
        .route("/v1/environments/{env}/secrets", get(env_secrets::list))
        .route("/v1/environments/{env}/secrets/{name}", put(env_secrets::put).delete(env_secrets::delete))
        .route("/v1/workflow-runs/{run}/approvals", get(environments::approvals))
        .route("/v1/workflow-runs/{run}/approvals", post(environments::decide))
        .route("/v1/workflow-runs/{run}/rings", get(environments::rings))
        .route("/v1/workflow-runs/{run}/promote", post(environments::promote))
        .route("/v1/workflow-runs/{run}/pause", post(environments::pause))
        .route("/v1/workflow-runs/{run}/priority", post(teams::set_priority))
        .route("/v1/jobs/{job}/logs/events", get(logs::events))
        .route("/v1/workflow-runs/{run}/artifacts/{job}/{name}", get(artifacts::get))
        .route("/v1/workflow-runs/{run}/artifacts/{job}/{name}/provenance", get(artifacts::provenance))
        .route("/v1/workflow-runs/{run}/jobs/{job}/test-attestation", get(artifacts::test_attestation))
        .route("/v1/tokens", post(access::create_token).get(access::list_tokens))
        .route("/v1/tokens/{id}", delete(access::revoke_token))
        .route("/v1/agent-tokens", post(access::create_join_token).get(access::list_join_tokens))
        .route("/v1/agent-tokens/{id}", delete(access::revoke_join_token))
        .route("/v1/agents", get(access::list_agents))
        .route("/v1/agents/{agent}", delete(access::remove_agent))
        .route("/v1/overview", get(access::overview))
        .route("/v1/audit", get(access::audit))
        // Label values name repositories' pools, agents and routes: an
        // admin or read token scrapes (issue 39, item 12).
        .route("/metrics", get(health::metrics))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_api));
    let join = Router::new()
        .route("/v1/agents/register", post(agents::register))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_join));
    let session = Router::new()
        .route("/v1/agents/{agent}/claim", post(agents::claim))
        .route("/v1/agents/{agent}/session", get(agents::session))
        .route("/v1/agents/{agent}/drain", post(agents::drain))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_session));
    let attempt = Router::new()
        .route("/v1/jobs/{job}/attempts/{epoch}/heartbeat", post(attempts::heartbeat))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs", post(attempts::append_log))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs/batch", post(attempts::append_log_batch))
        .route("/v1/jobs/{job}/attempts/{epoch}/complete", post(attempts::complete))
        .route("/v1/jobs/{job}/attempts/{epoch}/release", post(attempts::release))
        .route("/v1/jobs/{job}/attempts/{epoch}/image", post(attempts::commit_image))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts", post(artifacts::create_upload))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/parts/{part}", post(artifacts::part_url))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal", post(artifacts::seal))
        .route("/v1/jobs/{job}/attempts/{epoch}/restore", post(artifacts::restore))
        .route("/v1/jobs/{job}/attempts/{epoch}/cache/lookup", post(artifacts::cache_lookup))
        .route("/v1/jobs/{job}/attempts/{epoch}/cache/save", post(artifacts::cache_save))
        .route("/v1/jobs/{job}/attempts/{epoch}/cache/report", post(artifacts::cache_report))
        .route("/v1/jobs/{job}/attempts/{epoch}/timings", get(tests_api::attempt_timings))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_attempt));
    // A parsed test report: larger than other calls of an attempt.
    let reports = Router::new()
        .route("/v1/jobs/{job}/attempts/{epoch}/reports", post(tests_api::stage))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_attempt))
        .layer(DefaultBodyLimit::max(tests_api::MAX_REPORT_BODY));
    // `kiln tests next` in a step: the shard capability (or the attempt's token).
    let shards = Router::new()
        .route("/v1/jobs/{job}/attempts/{epoch}/shards/next", post(tests_api::shard_next))
        .route_layer(middleware::from_fn(security::authenticated))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_shard))
        .layer(DefaultBodyLimit::max(tests_api::MAX_REPORT_BODY));
    // Data plane: capability URLs, no bearer token, bodies streamed to disk.
    let data = Router::new()
        .route("/blob/uploads/{generation}/parts/{part}", put(blob::put_part))
        .route("/blob/objects/{generation}", get(blob::get_object))
        .route("/blob/objects/{generation}/export", get(blob::export_object))
        .layer(DefaultBodyLimit::disable())
        .route_layer(middleware::from_fn(security::authenticated_if_served));
    // Forge webhooks: the forge's signature is the credential; bodies up
    // to GitHub's own 25 MiB limit.
    // The webhook handler reads its body itself, within the budget of
    // unauthenticated bodies (`handlers::body::read_unauthenticated`).
    let hooks = Router::new()
        .route("/v1/repos/{repo}/webhooks/{forge}", post(repos::webhook))
        .layer(DefaultBodyLimit::max(kiln_forge::MAX_BODY_BYTES))
        .route_layer(middleware::from_fn(security::public_side));
    // Open to anyone: never served on a connection slot kept for
    // authenticated calls (`serve`'s reserved share).
    let open = Router::new()
        .route("/.well-known/openid-configuration", get(oidc::discovery))
        .route("/.well-known/jwks.json", get(oidc::jwks))
        .route("/.well-known/kiln-attestation-keys.json", get(oidc::attestation_jwks))
        .route("/", get(ui::page))
        // The OpenAPI document (no secrets in it).
        .route("/openapi.json", get(crate::openapi::serve))
        .route("/v1/ui/session", post(ui::sign_in).delete(ui::sign_out))
        // A public repository's badge needs no token; the handler checks
        // any token it carries against the policy table (`auth`).
        .route("/v1/repos/{repo}/badge.svg", get(notify::badge))
        .route_layer(middleware::from_fn(security::public_side));
    Router::new()
        .merge(public)
        .merge(join)
        .merge(session)
        .merge(attempt)
        .merge(open)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(health::no_such_endpoint)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .merge(data)
        .merge(hooks)
        .merge(reports)
        .merge(shards)
        .layer(middleware::from_fn_with_state(state.clone(), security::headers))
        .layer(middleware::from_fn_with_state(state.clone(), metrics_layer))
        .with_state(state)
}

/// Time every request and count stale-epoch refusals. The route is the
/// matched pattern (`/v1/jobs/{job}/…`), never the raw path, so ids do not
/// make new series; unmatched paths are `other`.
async fn metrics_layer(
    axum::extract::State(state): axum::extract::State<State>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    let route = req.extensions().get::<axum::extract::MatchedPath>().map_or("other", |p| p.as_str()).to_string();
    let method = req.method().as_str().to_string();
    let started = std::time::Instant::now();
    let res = next.run(req).await;
    let code = res.extensions().get::<crate::metrics::ErrorCode>();
    state.metrics.observe(&route, &method, res.status().as_str(), started.elapsed().as_secs_f64(), code);
    res
}
