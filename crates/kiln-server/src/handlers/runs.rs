//! Workflow runs: submit and list (per repository), get, cancel, retry.

use super::body::{json_blocking, parse};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::acceptance::{self, Submission};
use crate::services::runs;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use kiln_api as api;
use serde::Deserialize;

/// `POST /v1/repos/{repo}/workflow-runs` (`Idempotency-Key` header) → 202.
pub(crate) async fn submit(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let request: api::SubmitRun = parse(&body)?;
    let idempotency_key = headers.get("idempotency-key").map(|v| v.as_bytes().to_vec());
    let run_id = acceptance::submit(&state, Submission { repo, request, idempotency_key, by }).await?;
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id })))
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/repos/{repo}/workflow-runs?status=…&limit=…`, newest first.
pub(crate) async fn list(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Response> {
    json_blocking(runs::list(&state, &repo, q.status.as_deref(), q.limit).await?).await
}

pub(crate) async fn get(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Response> {
    json_blocking(runs::get(&state, &run).await?).await
}

pub(crate) async fn cancel(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
) -> ApiResult<Json<api::Run>> {
    Ok(Json(runs::cancel(&state, &by, &run).await?))
}

pub(crate) async fn retry(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let run_id = acceptance::retry(&state, &by, &run).await?;
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id })))
}
