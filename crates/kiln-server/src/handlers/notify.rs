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

#[utoipa::path(
    operation_id = "notify_create",
    post, path = "/v1/repos/{repo}/notifications", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),),
    request_body(content = api::CreateNotification, content_type = "application/json"),
    responses((status = 201, description = "The notification (never its secret)", body = api::Notification)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Notification>)> {
    let req: api::CreateNotification = parse(&body)?;
    Ok((StatusCode::CREATED, Json(notify::add(&state, &by, &repo, req).await?)))
}

#[utoipa::path(
    operation_id = "notify_list",
    get, path = "/v1/repos/{repo}/notifications", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),),
    responses((status = 200, description = "The repository's notifications (never their secrets)", body = crate::handlers::answers::NotificationList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let list = notify::list(&state, &repo).await?;
    Ok(Json(serde_json::json!({ "notifications": list })))
}

#[utoipa::path(
    operation_id = "notify_delete",
    delete, path = "/v1/repos/{repo}/notifications/{id}", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),
        ("id" = String, Path, description = "The notification's id"),
    ),
    responses((status = 200, description = "The notification removed", body = api::Notification)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, id)): Path<(String, String)>,
) -> ApiResult<Json<api::Notification>> {
    Ok(Json(notify::remove(&state, &by, &repo, &id).await?))
}

#[utoipa::path(
    operation_id = "notify_deliveries",
    get, path = "/v1/repos/{repo}/notifications/deliveries", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),
        ("limit" = Option<u32>, Query, description = "At most this many, newest first"),
    ),
    responses((status = 200, description = "The delivery log", body = crate::handlers::answers::NotificationDeliveryList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn deliveries(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<super::repos::Limit>,
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
#[utoipa::path(
    operation_id = "notify_badge",
    get, path = "/v1/repos/{repo}/badge.svg", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),
        ("workflow" = Option<String>, Query, description = "The workflow (name, file name or path); default any"),
        ("branch" = Option<String>, Query, description = "The branch; default the repository's default branch"),
    ),
    responses((status = 200, description = "An SVG badge of the newest run", content_type = "image/svg+xml", body = String)),
    security((), ("api_token" = []), ("ui_session" = [])),
)]
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
