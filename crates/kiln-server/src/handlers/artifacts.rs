//! Artifact control plane: upload sessions, presigned parts, seal,
//! restore (agent token), and the public download link (admin token).

use super::body::{base_url, parse};
use crate::error::ApiResult;
use crate::services::artifacts;
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State as S};
use kiln_api as api;

pub(crate) async fn create_upload(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::UploadSession>> {
    let req: api::CreateUpload = parse(&body)?;
    Ok(Json(artifacts::create_upload(&state, &base_url(&state), &job, epoch, req).await?))
}

pub(crate) async fn part_url(
    S(state): S<State>,
    Path((job, epoch, generation, part)): Path<(String, i64, String, u64)>,
    body: Bytes,
) -> ApiResult<Json<api::PresignedPart>> {
    let req: api::PartUrlRequest = parse(&body)?;
    Ok(Json(artifacts::part_url(&state, (&job, epoch), &generation, part, req).await?))
}

pub(crate) async fn seal(
    S(state): S<State>,
    Path((job, epoch, generation)): Path<(String, i64, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SealedGeneration>> {
    let req: api::SealRequest = if body.is_empty() { Default::default() } else { parse(&body)? };
    Ok(Json(artifacts::seal(&state, (&job, epoch), &generation, req).await?))
}

pub(crate) async fn restore(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ArtifactDownload>> {
    let req: api::RestoreRequest = parse(&body)?;
    Ok(Json(artifacts::restore(&state, &base_url(&state), (&job, epoch), req).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct GetQuery {
    format: Option<String>,
}

/// `GET /v1/workflow-runs/{run}/artifacts/{job}/{name}`: the download
/// capability as JSON; with `?format=tar.gz|zip` or an `Accept` naming one
/// (`application/gzip`, `application/zip`), the artifact itself: a
/// directory or glob as that archive (issue 41, item 5), a file as it is.
pub(crate) async fn get(
    S(state): S<State>,
    Path((run, job, name)): Path<(String, String, String)>,
    axum::extract::Query(q): axum::extract::Query<GetQuery>,
    headers: axum::http::HeaderMap,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let run = crate::services::runs::resolve_id(&state, &run).await?;
    let Some(format) = super::blob::asked_format(q.format.as_deref(), &headers)? else {
        return Ok(Json(artifacts::get(&state, &base_url(&state), (&run, &job, &name)).await?).into_response());
    };
    let g = artifacts::bound_generation(&state, (&run, &job, &name)).await?;
    if g.kind != api::types::ARTIFACT_ARCHIVE {
        return Ok(super::blob::object_response(artifacts::open_sealed(&state, &g).await?));
    }
    let (file, len) = artifacts::export_archive(&state, &g, format).await?;
    Ok(super::blob::export_response(file, len, &g.name, format))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/lookup`.
pub(crate) async fn cache_lookup(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::CacheLookupResult>> {
    let req: api::CacheLookup = parse(&body)?;
    Ok(Json(crate::services::caches::lookup(&state, &base_url(&state), (&job, epoch), req).await?))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/save`.
pub(crate) async fn cache_save(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::CacheSaved>> {
    let req: api::CacheSave = parse(&body)?;
    Ok(Json(crate::services::caches::save(&state, (&job, epoch), req).await?))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/report`.
pub(crate) async fn cache_report(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let req: api::CacheInfo = parse(&body)?;
    crate::services::caches::report(&state, (&job, epoch), req).await?;
    Ok(Json(serde_json::json!({})))
}
