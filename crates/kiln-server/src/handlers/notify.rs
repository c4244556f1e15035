//! `POST|GET /v1/repos/{repo}/notifications`, `DELETE
//! /v1/repos/{repo}/notifications/{id}`, `GET
//! /v1/repos/{repo}/notifications/deliveries`, and the badge `GET
//! /v1/repos/{repo}/badge.svg` (issue 42).

use super::body::parse;
use crate::auth::{self, Principal};
use crate::error::ApiResult;
use crate::services::notify;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kiln_api as api;

pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Notification>)> {
    let req: api::CreateNotification = parse(&body)?;
    Ok((StatusCode::CREATED, Json(notify::add(&state, &by, &repo, req).await?)))
}

pub(crate) async fn list(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let list = notify::list(&state, &repo).await?;
    Ok(Json(serde_json::json!({ "notifications": list })))
}

pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, id)): Path<(String, String)>,
) -> ApiResult<Json<api::Notification>> {
    Ok(Json(notify::remove(&state, &by, &repo, &id).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct Limit {
    limit: Option<u32>,
}

pub(crate) async fn deliveries(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<Limit>,
) -> ApiResult<Json<serde_json::Value>> {
    let list = notify::deliveries(&state, &repo, q.limit).await?;
    Ok(Json(serde_json::json!({ "deliveries": list })))
}

#[derive(serde::Deserialize)]
pub(crate) struct BadgeQuery {
    workflow: Option<String>,
    branch: Option<String>,
}

/// No token needed for a public repository; else a token that may read it.
pub(crate) async fn badge(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<BadgeQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let caller = auth::optional_principal(&state, &headers).await?;
    let reader = |repo_id: &str| caller.as_ref().is_some_and(|p| auth::may_read_badge(p, repo_id));
    let svg = notify::badge(&state, &repo, q.workflow.as_deref(), q.branch.as_deref(), reader).await?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], svg)
        .into_response())
}
