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

#[utoipa::path(
    operation_id = "artifacts_create_upload",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/artifacts", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::CreateUpload,
    responses(
        (status = 200, description = "An upload session: a candidate generation of this attempt", body = api::UploadSession),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn create_upload(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::UploadSession>> {
    let req: api::CreateUpload = parse(&body)?;
    Ok(Json(artifacts::create_upload(&state, &base_url(&state), &job, epoch, req).await?))
}

#[utoipa::path(
    operation_id = "artifacts_part_url",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/parts/{part}", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
        ("generation" = String, Path, description = "The artifact generation's id"),
        ("part" = u64, Path, description = "The part's number, from 0"),
    ),
    request_body = api::PartUrlRequest,
    responses(
        (status = 200, description = "Where to PUT the part", body = api::PresignedPart),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn part_url(
    S(state): S<State>,
    Path((job, epoch, generation, part)): Path<(String, i64, String, u64)>,
    body: Bytes,
) -> ApiResult<Json<api::PresignedPart>> {
    let req: api::PartUrlRequest = parse(&body)?;
    Ok(Json(artifacts::part_url(&state, (&job, epoch), &generation, part, req).await?))
}

#[utoipa::path(
    operation_id = "artifacts_seal",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
        ("generation" = String, Path, description = "The artifact generation's id"),
    ),
    request_body(content = Option<api::SealRequest>, description = "Optional", content_type = "application/json"),
    responses(
        (status = 200, description = "The generation, verified and sealed (bound only by the completion)", body = api::SealedGeneration),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn seal(
    S(state): S<State>,
    Path((job, epoch, generation)): Path<(String, i64, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SealedGeneration>> {
    let req: api::SealRequest = if body.is_empty() { Default::default() } else { parse(&body)? };
    Ok(Json(artifacts::seal(&state, (&job, epoch), &generation, req).await?))
}

#[utoipa::path(
    operation_id = "artifacts_restore",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/restore", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::RestoreRequest,
    responses(
        (status = 200, description = "Where to download a needed job's bound artifact", body = api::ArtifactDownload),
    ),
    security(("attempt_token" = [])),
)]
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
#[utoipa::path(
    operation_id = "artifacts_get",
    get, path = "/v1/workflow-runs/{run}/artifacts/{job}/{name}", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("job" = String, Path, description = "The job's name"),
        ("name" = String, Path, description = "The artifact's name"),
        ("format" = Option<String>, Query, description = "`tar.gz` or `zip`: the artifact itself, as that archive"),
    ),
    responses(
        (status = 200, description = "The download capability as JSON; with `format` or an `Accept` naming one, the artifact itself (a directory or glob as that archive, a file as it is)", content((api::ArtifactDownload = "application/json"), ("application/gzip"), ("application/zip"), ("application/octet-stream"))),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
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

/// `GET /v1/workflow-runs/{run}/artifacts/{job}/{name}/provenance`: the
/// signed provenance written when the artifact was bound (issue 45).
#[utoipa::path(
    operation_id = "artifacts_provenance",
    get, path = "/v1/workflow-runs/{run}/artifacts/{job}/{name}/provenance", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("job" = String, Path, description = "The job's name"),
        ("name" = String, Path, description = "The artifact's name"),
    ),
    responses(
        (status = 200, description = "The DSSE envelope of its SLSA provenance (check it with `kiln verify`)", body = super::answers::DsseEnvelope),
        (status = 404, description = "No such binding, or it was bound before provenance existed", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn provenance(
    S(state): S<State>,
    Path((run, job, name)): Path<(String, String, String)>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let run = crate::services::runs::resolve_id(&state, &run).await?;
    let env = artifacts::provenance(&state, (&run, &job, &name)).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], env).into_response())
}

/// `GET /v1/workflow-runs/{run}/jobs/{job}/test-attestation`: the signed
/// in-toto Test Result statement bound with the job's reports (issue 45).
#[utoipa::path(
    operation_id = "tests_attestation",
    get, path = "/v1/workflow-runs/{run}/jobs/{job}/test-attestation", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("job" = String, Path, description = "The job's name or id"),
    ),
    responses(
        (status = 200, description = "The DSSE envelope of its Test Result statement over the artifacts it restored (check it with `kiln verify --test-result`)", body = super::answers::DsseEnvelope),
        (status = 404, description = "No such job, or it bound no reports", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn test_attestation(
    S(state): S<State>,
    Path((run, job)): Path<(String, String)>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let run = crate::services::runs::resolve_id(&state, &run).await?;
    let env = artifacts::test_attestation(&state, &run, &job).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], env).into_response())
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/lookup`.
#[utoipa::path(
    operation_id = "artifacts_cache_lookup",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/cache/lookup", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::CacheLookup,
    responses(
        (status = 200, description = "The first candidate found, or no hit", body = api::CacheLookupResult),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn cache_lookup(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::CacheLookupResult>> {
    let req: api::CacheLookup = parse(&body)?;
    Ok(Json(crate::services::caches::lookup(&state, &base_url(&state), (&job, epoch), req).await?))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/save`.
#[utoipa::path(
    operation_id = "artifacts_cache_save",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/cache/save", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::CacheSave,
    responses(
        (status = 200, description = "Whether the sealed generation was bound to the key", body = api::CacheSaved),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn cache_save(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::CacheSaved>> {
    let req: api::CacheSave = parse(&body)?;
    Ok(Json(crate::services::caches::save(&state, (&job, epoch), req).await?))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/report`.
#[utoipa::path(
    operation_id = "artifacts_cache_report",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/cache/report", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::CacheInfo,
    responses(
        (status = 200, description = "Recorded", body = super::answers::Empty),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn cache_report(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let req: api::CacheInfo = parse(&body)?;
    crate::services::caches::report(&state, (&job, epoch), req).await?;
    Ok(Json(serde_json::json!({})))
}
