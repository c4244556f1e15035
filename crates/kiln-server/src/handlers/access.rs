//! `/v1/tokens`, `/v1/agent-tokens`, `/v1/agents`, `/v1/overview`, `/v1/audit` (admin scope).

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::access;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::http::StatusCode;
use axum::{Extension, Json};
use kiln_api as api;
use serde::Deserialize;
use serde_json::{Value, json};

#[utoipa::path(
    operation_id = "access_create_token",
    post, path = "/v1/tokens", tag = "access",
    request_body = api::CreateToken,
    responses(
        (status = 201, description = "The token (shown once) and its record", body = api::CreatedToken),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::CreatedToken>)> {
    let req: api::CreateToken = parse(&body)?;
    Ok((StatusCode::CREATED, Json(access::create_token(&state, &p, req).await?)))
}

#[utoipa::path(
    operation_id = "access_list_tokens",
    get, path = "/v1/tokens", tag = "access",
    responses(
        (status = 200, description = "API tokens (never their secrets)", body = super::answers::TokenList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list_tokens(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "tokens": access::list_tokens(&state).await? })))
}

#[utoipa::path(
    operation_id = "access_revoke_token",
    delete, path = "/v1/tokens/{id}", tag = "access",
    params(
        ("id" = String, Path, description = "The token's id"),
    ),
    responses(
        (status = 200, description = "Revoked", body = super::answers::Revoked),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn revoke_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    access::revoke_token(&state, &p, &id).await?;
    Ok(Json(json!({ "revoked": id })))
}

#[utoipa::path(
    operation_id = "access_create_join_token",
    post, path = "/v1/agent-tokens", tag = "access",
    request_body = api::CreateJoinToken,
    responses(
        (status = 201, description = "The join token (shown once) and its record", body = api::CreatedJoinToken),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create_join_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::CreatedJoinToken>)> {
    let req: api::CreateJoinToken = parse(&body)?;
    Ok((StatusCode::CREATED, Json(access::create_join_token(&state, &p, req).await?)))
}

#[utoipa::path(
    operation_id = "access_list_join_tokens",
    get, path = "/v1/agent-tokens", tag = "access",
    responses(
        (status = 200, description = "Agent join tokens", body = super::answers::JoinTokenList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list_join_tokens(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "agent_tokens": access::list_join_tokens(&state).await? })))
}

#[utoipa::path(
    operation_id = "access_revoke_join_token",
    delete, path = "/v1/agent-tokens/{id}", tag = "access",
    params(
        ("id" = String, Path, description = "The join token's id"),
    ),
    responses(
        (status = 200, description = "Revoked", body = super::answers::Revoked),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn revoke_join_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    access::revoke_join_token(&state, &p, &id).await?;
    Ok(Json(json!({ "revoked": id })))
}

#[utoipa::path(
    operation_id = "access_list_agents",
    get, path = "/v1/agents", tag = "access",
    responses(
        (status = 200, description = "Registered agents", body = super::answers::AgentList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list_agents(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "agents": access::list_agents(&state).await? })))
}

#[utoipa::path(
    operation_id = "access_overview",
    get, path = "/v1/overview", tag = "access",
    responses(
        (status = 200, description = "Jobs by status, queues, agents and running jobs now", body = api::Overview),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn overview(S(state): S<State>) -> ApiResult<Json<api::Overview>> {
    Ok(Json(crate::services::overview::overview(&state).await?))
}

#[utoipa::path(
    operation_id = "access_remove_agent",
    delete, path = "/v1/agents/{agent}", tag = "access",
    params(
        ("agent" = String, Path, description = "The agent's id"),
    ),
    responses(
        (status = 200, description = "Removed: its sessions end, its attempts are fenced", body = super::answers::Removed),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn remove_agent(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    access::remove_agent(&state, &p, &id).await?;
    Ok(Json(json!({ "removed": id })))
}

#[derive(Deserialize)]
pub(crate) struct AuditQuery {
    before: Option<i64>,
    limit: Option<u32>,
}

#[utoipa::path(
    operation_id = "access_audit",
    get, path = "/v1/audit", tag = "access",
    params(
        ("before" = Option<i64>, Query, description = "Only entries with a smaller id"),
        ("limit" = Option<u32>, Query, description = "At most this many (default 100, at most 1000)"),
    ),
    responses(
        (status = 200, description = "The audit log, newest first", body = super::answers::AuditLog),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn audit(S(state): S<State>, Query(q): Query<AuditQuery>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "entries": access::list_audit(&state, q.before, q.limit).await? })))
}
