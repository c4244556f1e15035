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

pub(crate) async fn create_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::CreatedToken>)> {
    let req: api::CreateToken = parse(&body)?;
    Ok((StatusCode::CREATED, Json(access::create_token(&state, &p, req).await?)))
}

pub(crate) async fn list_tokens(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "tokens": access::list_tokens(&state).await? })))
}

pub(crate) async fn revoke_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    access::revoke_token(&state, &p, &id).await?;
    Ok(Json(json!({ "revoked": id })))
}

pub(crate) async fn create_join_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::CreatedJoinToken>)> {
    let req: api::CreateJoinToken = parse(&body)?;
    Ok((StatusCode::CREATED, Json(access::create_join_token(&state, &p, req).await?)))
}

pub(crate) async fn list_join_tokens(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "agent_tokens": access::list_join_tokens(&state).await? })))
}

pub(crate) async fn revoke_join_token(
    S(state): S<State>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    access::revoke_join_token(&state, &p, &id).await?;
    Ok(Json(json!({ "revoked": id })))
}

pub(crate) async fn list_agents(S(state): S<State>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "agents": access::list_agents(&state).await? })))
}

pub(crate) async fn overview(S(state): S<State>) -> ApiResult<Json<api::Overview>> {
    Ok(Json(crate::services::overview::overview(&state).await?))
}

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

pub(crate) async fn audit(S(state): S<State>, Query(q): Query<AuditQuery>) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "entries": access::list_audit(&state, q.before, q.limit).await? })))
}
