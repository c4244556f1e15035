//! `POST /v1/repos`, `GET /v1/repos`.

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::repos;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::State as S;
use axum::http::StatusCode;
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
