//! Artifact routes (spec 000 §12). Control-plane handlers authorize and run
//! metadata transactions; the data-plane handlers (`/blob/…`) move bytes and
//! run no transaction (an upload only reads whether its epoch is still live).

use crate::State;
use crate::capability::{Op, now_ms};
use crate::error::{ApiErr, ApiResult};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use kiln_api as api;
use kiln_blob::{BlobError, ObjectInfo};
use kiln_store::{BoundArtifact, StoreError};
use serde::Deserialize;

/// Parts are 64 MiB (the last may be shorter).
pub const PART_SIZE: u64 = 64 * 1024 * 1024;
/// Largest artifact accepted (100 GiB).
pub const MAX_ARTIFACT: u64 = 100 * 1024 * 1024 * 1024;
const UPLOAD_CAP_MS: i64 = 60 * 60 * 1000;
const DOWNLOAD_CAP_MS: i64 = 15 * 60 * 1000;

fn blob_err(e: BlobError) -> ApiErr {
    match e {
        BlobError::BadPart { .. } | BlobError::BadKey(_) => ApiErr::bad_request(e.to_string()),
        BlobError::Mismatch { .. } => ApiErr::invalid(e.to_string()),
        BlobError::NotFound(_) => ApiErr::not_found(e.to_string()),
        BlobError::Exists(_) => ApiErr::new(StatusCode::CONFLICT, api::codes::CONFLICT, e.to_string()),
        BlobError::Io(_) => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, api::codes::UNAVAILABLE, e.to_string()),
    }
}

/// Base URL for capability links: the address the caller used to reach us.
fn base_url(headers: &HeaderMap, state: &State) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| state.config.listen.clone());
    format!("http://{host}")
}

pub async fn create_upload(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::UploadSession>> {
    let req: api::CreateUpload = crate::routes::parse(&body)?;
    if req.size > MAX_ARTIFACT {
        return Err(ApiErr::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            api::codes::TOO_LARGE,
            format!("artifact `{}` is {} bytes; the limit is {MAX_ARTIFACT}", req.name, req.size),
        ));
    }
    let g = state
        .store
        .create_generation(
            &job,
            epoch,
            &req.name,
            req.size as i64,
            req.sha256.as_deref().unwrap_or(""),
            PART_SIZE as i64,
        )
        .await?;
    let expires = now_ms() + UPLOAD_CAP_MS;
    let cap = state.signer.sign(Op::Put, &g.id, expires);
    tracing::info!(job, epoch, name = %req.name, size = req.size, generation = %g.id, "upload session opened");
    Ok(Json(api::UploadSession {
        part_url: format!("{}/blob/uploads/{}/parts/{{part}}?cap={cap}", base_url(&headers, &state), g.id),
        generation_id: g.id,
        part_size: PART_SIZE,
        expires_at_ms: expires,
    }))
}

#[derive(Deserialize)]
pub struct CapQuery {
    cap: Option<String>,
}

/// Data plane: write one part. Refused (409) once the epoch is fenced.
pub async fn put_part(
    S(state): S<State>,
    Path((generation, part)): Path<(String, u64)>,
    Query(q): Query<CapQuery>,
    body: Body,
) -> ApiResult<Json<api::PartReceipt>> {
    if !state.signer.verify(q.cap.as_deref().unwrap_or(""), Op::Put, &generation, now_ms()) {
        return Err(ApiErr::unauthorized());
    }
    let g = state.store.uploadable_generation(&generation).await?;
    let reader = tokio_util::io::StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
    let info = state
        .blob
        .write_part(&g.object_key, part, g.part_size as u64, g.expected_size as u64, reader)
        .await
        .map_err(blob_err)?;
    Ok(Json(api::PartReceipt { part, size: info.size, sha256: info.sha256 }))
}

/// Verify the stored bytes against the session's size and sha256, then seal
/// the generation for this epoch. Idempotent for a lost response.
pub async fn seal(
    S(state): S<State>,
    Path((job, epoch, generation)): Path<(String, i64, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SealedGeneration>> {
    let req: api::SealRequest = if body.is_empty() { Default::default() } else { crate::routes::parse(&body)? };
    let mut g = state.store.get_generation(&generation).await?;
    if g.job_id != job || g.epoch != epoch {
        return Err(ApiErr::not_found(format!("upload session {generation} of job {job} epoch {epoch}")));
    }
    if g.state == "uploading" {
        match req.sha256.as_deref() {
            // The digest is named now (or confirmed): refused if it differs
            // from one named when the session was opened.
            Some(sha) => g = state.store.set_generation_digest(&generation, &job, epoch, sha).await?,
            None if g.expected_sha256.is_empty() => {
                return Err(ApiErr::invalid(format!(
                    "upload session {generation} was opened without a sha256: name it when sealing"
                )));
            }
            None => {}
        }
        // Refuse a fenced epoch before touching the bytes.
        state.store.uploadable_generation(&generation).await?;
        let expected = ObjectInfo { size: g.expected_size as u64, sha256: g.expected_sha256.clone() };
        if let Err(e) = state.blob.complete(&g.object_key, &expected).await {
            if matches!(e, BlobError::Mismatch { .. } | BlobError::NotFound(_)) {
                let _ = state.store.fail_generation(&generation, &e.to_string()).await;
                return Err(ApiErr::invalid(format!("artifact `{}` failed verification: {e}", g.name)));
            }
            return Err(blob_err(e));
        }
    } else if g.state != "sealed" {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            api::codes::CONFLICT,
            format!("upload session {generation} is {}", g.state),
        ));
    }
    let g = state.store.seal_generation(&generation, &job, epoch).await?;
    tracing::info!(job, epoch, name = %g.name, generation = %g.id, "artifact sealed");
    Ok(Json(api::SealedGeneration {
        generation_id: g.id,
        name: g.name,
        size: g.expected_size as u64,
        sha256: g.expected_sha256,
        state: g.state,
    }))
}

fn download(state: &State, headers: &HeaderMap, b: &BoundArtifact) -> api::ArtifactDownload {
    let expires = now_ms() + DOWNLOAD_CAP_MS;
    let cap = state.signer.sign(Op::Get, &b.generation.id, expires);
    api::ArtifactDownload {
        name: b.name.clone(),
        job: b.job_name.clone(),
        epoch: b.generation.epoch,
        size: b.generation.expected_size as u64,
        sha256: b.generation.expected_sha256.clone(),
        url: format!("{}/blob/objects/{}?cap={cap}", base_url(headers, state), b.generation.id),
        expires_at_ms: expires,
    }
}

/// Agent: resolve a producer's binding for the consuming attempt.
pub async fn restore(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::ArtifactDownload>> {
    let req: api::RestoreRequest = crate::routes::parse(&body)?;
    let consumer = state.store.get_job(&job).await?;
    if consumer.current_epoch != epoch || consumer.status != kiln_core::JobStatus::Running {
        return Err(StoreError::StaleEpoch(format!("epoch {epoch} of job {job} is not the live attempt")).into());
    }
    let b = state.store.resolve_binding(&consumer.run_id, &req.from_job, &req.name).await?;
    Ok(Json(download(&state, &headers, &b)))
}

/// Public API: a download capability for a run's bound artifact.
pub async fn get_artifact(
    S(state): S<State>,
    Path((run, job, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<api::ArtifactDownload>> {
    let b = state.store.resolve_binding(&run, &job, &name).await?;
    Ok(Json(download(&state, &headers, &b)))
}

/// Data plane: stream a sealed object.
pub async fn get_object(
    S(state): S<State>,
    Path(generation): Path<String>,
    Query(q): Query<CapQuery>,
) -> ApiResult<Response> {
    if !state.signer.verify(q.cap.as_deref().unwrap_or(""), Op::Get, &generation, now_ms()) {
        return Err(ApiErr::unauthorized());
    }
    let g = state.store.get_generation(&generation).await?;
    if g.state != "sealed" {
        return Err(ApiErr::not_found(format!("artifact generation {generation} is {}", g.state)));
    }
    let (file, len) = state.blob.open(&g.object_key).await.map_err(blob_err)?;
    let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (axum::http::header::CONTENT_LENGTH, len.to_string()),
            (axum::http::header::HeaderName::from_static("x-kiln-sha256"), g.expected_sha256.clone()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
