//! `POST /v1/repos`, `GET /v1/repos`, `GET|PATCH|DELETE /v1/repos/{repo}`, hook info, deliveries, webhooks.

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::repos;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use kiln_api as api;

pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Repo>)> {
    let req: api::CreateRepo = parse(&body)?;
    Ok((StatusCode::CREATED, Json(repos::create(&state, &by, req).await?)))
}

pub(crate) async fn list(S(state): S<State>) -> ApiResult<Json<serde_json::Value>> {
    let repos = repos::list(&state).await?;
    Ok(Json(serde_json::json!({ "repos": repos })))
}

/// `PATCH /v1/repos/{repo}`.
pub(crate) async fn update(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Repo>> {
    let req: api::UpdateRepo = parse(&body)?;
    Ok(Json(repos::update(&state, &by, &repo, req).await?))
}

/// `DELETE /v1/repos/{repo}` (admin): the removed repository.
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
) -> ApiResult<Json<api::Repo>> {
    Ok(Json(repos::delete(&state, &by, &repo).await?))
}

/// `GET /v1/repos/{repo}`.
pub(crate) async fn get(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<api::Repo>> {
    Ok(Json(repos::shown(&state, state.store.get_repo(&repo).await?).await?))
}

/// `GET /v1/repos/{repo}/hook-info`.
pub(crate) async fn hook_info(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<api::HookInfo>> {
    Ok(Json(repos::hook_info(&state, &repo).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct Limit {
    limit: Option<u32>,
}

/// `GET /v1/repos/{repo}/deliveries`.
pub(crate) async fn deliveries(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<Limit>,
) -> ApiResult<Json<serde_json::Value>> {
    let list = repos::deliveries(&state, &repo, q.limit).await?;
    Ok(Json(serde_json::json!({ "deliveries": list })))
}

/// `POST /v1/repos/{repo}/webhooks/{forge}`: authenticated by the forge's
/// signature or token only (no bearer token).
pub(crate) async fn webhook(
    S(state): S<State>,
    Path((repo, forge)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::WebhookAck>)> {
    let (status, ack) = crate::services::webhooks::receive(&state, &repo, &forge, &headers, &body).await?;
    Ok((status, Json(ack)))
}
