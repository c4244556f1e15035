//! `GET /v1/repos/{repo}/secrets`, `PUT|DELETE /v1/repos/{repo}/secrets/{name}`.

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::repos;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, State as S};
use axum::{Extension, Json};
use kiln_api as api;

#[utoipa::path(
    operation_id = "secrets_put",
    put, path = "/v1/repos/{repo}/secrets/{name}", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    request_body = api::PutSecret,
    responses(
        (status = 200, description = "The secret, stored (its value is never returned)", body = api::SecretInfo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn put(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SecretInfo>> {
    let req: api::PutSecret = parse(&body)?;
    Ok(Json(repos::put_secret(&state, &by, &repo, &name, &req.value).await?))
}

#[utoipa::path(
    operation_id = "secrets_list",
    get, path = "/v1/repos/{repo}/secrets", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
    ),
    responses(
        (status = 200, description = "The repository's secrets: names, never values", body = super::answers::SecretList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let secrets = repos::list_secrets(&state, &repo).await?;
    Ok(Json(serde_json::json!({ "secrets": secrets })))
}

#[utoipa::path(
    operation_id = "secrets_delete",
    delete, path = "/v1/repos/{repo}/secrets/{name}", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    responses(
        (status = 200, description = "The secret, deleted", body = super::answers::Deleted),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    repos::delete_secret(&state, &by, &repo, &name).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}
