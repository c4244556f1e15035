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

pub(crate) async fn put(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SecretInfo>> {
    let req: api::PutSecret = parse(&body)?;
    Ok(Json(repos::put_secret(&state, &by, &repo, &name, &req.value).await?))
}

pub(crate) async fn list(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let secrets = repos::list_secrets(&state, &repo).await?;
    Ok(Json(serde_json::json!({ "secrets": secrets })))
}

pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((repo, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    repos::delete_secret(&state, &by, &repo, &name).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}
