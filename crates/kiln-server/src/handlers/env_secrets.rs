//! `GET /v1/environments/{env}/secrets`, `PUT|DELETE
//! /v1/environments/{env}/secrets/{name}` (issue 46): an environment's
//! secrets, an admin's; values go in and are never returned.

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::env_secrets;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, State as S};
use axum::{Extension, Json};
use kiln_api as api;

#[utoipa::path(
    operation_id = "env_secrets_put",
    put, path = "/v1/environments/{env}/secrets/{name}", tag = "environments",
    params(
        ("env" = String, Path, description = "The environment's name"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    request_body = api::PutSecret,
    responses(
        (status = 200, description = "The secret, stored (its value is never returned)", body = api::SecretInfo),
        (status = 404, description = "No such environment", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn put(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((env, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SecretInfo>> {
    let req: api::PutSecret = parse(&body)?;
    Ok(Json(env_secrets::put(&state, &by, &env, &name, &req.value).await?))
}

#[utoipa::path(
    operation_id = "env_secrets_list",
    get, path = "/v1/environments/{env}/secrets", tag = "environments",
    params(
        ("env" = String, Path, description = "The environment's name"),
    ),
    responses(
        (status = 200, description = "The environment's secrets: names, never values", body = super::answers::SecretList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>, Path(env): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let secrets = env_secrets::list(&state, &env).await?;
    Ok(Json(serde_json::json!({ "secrets": secrets })))
}

#[utoipa::path(
    operation_id = "env_secrets_delete",
    delete, path = "/v1/environments/{env}/secrets/{name}", tag = "environments",
    params(
        ("env" = String, Path, description = "The environment's name"),
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
    Path((env, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    env_secrets::delete(&state, &by, &env, &name).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}
