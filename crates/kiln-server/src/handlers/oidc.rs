//! `/.well-known/openid-configuration` and `/.well-known/jwks.json`: how a
//! cloud provider verifies a job's identity token. Public, no token.

use crate::state::State;
use axum::Json;
use axum::extract::State as S;
use serde_json::Value;

#[utoipa::path(
    operation_id = "oidc_discovery",
    get, path = "/.well-known/openid-configuration", tag = "health",
    responses(
        (status = 200, description = "OpenID Connect discovery for job identity tokens", body = super::answers::OidcDiscovery),
    ),
    security(()),
)]
pub(crate) async fn discovery(S(state): S<State>) -> Json<Value> {
    Json(crate::oidc::discovery(&state.issuer_url()))
}

#[utoipa::path(
    operation_id = "oidc_jwks",
    get, path = "/.well-known/jwks.json", tag = "health",
    responses(
        (status = 200, description = "The keys that sign job identity tokens", body = super::answers::Jwks),
    ),
    security(()),
)]
pub(crate) async fn jwks(S(state): S<State>) -> Json<Value> {
    let state = state.clone();
    // Reads the key directory: off the async runtime.
    Json(tokio::task::spawn_blocking(move || state.oidc.jwks()).await.unwrap_or_default())
}

#[utoipa::path(
    operation_id = "attestation_jwks",
    get, path = "/.well-known/kiln-attestation-keys.json", tag = "health",
    responses(
        (status = 200, description = "The keys that sign artifact provenance (issue 45): JWKS, ECDSA P-256; retired keys stay listed for ten years", body = super::answers::Jwks),
    ),
    security(()),
)]
pub(crate) async fn attestation_jwks(S(state): S<State>) -> Json<Value> {
    let state = state.clone();
    Json(
        tokio::task::spawn_blocking(move || {
            state.attestation.as_ref().map(|a| a.jwks()).unwrap_or_else(|| serde_json::json!({ "keys": [] }))
        })
        .await
        .unwrap_or_default(),
    )
}
