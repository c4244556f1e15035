//! Artifact routes (spec 000 §12). Control-plane handlers authorize and run
//! metadata transactions; the data-plane handlers (`/blob/…`) move bytes and
//! run no transaction (an upload only reads whether its epoch is still live).
//!
//! With an S3 object store the data plane is the store itself: the agent
//! asks for each part's presigned `UploadPart` (granted only while its epoch
//! is live, valid for minutes, bound to the part's MD5), and downloads are
//! presigned `GET`s. Sealing still happens here: the server assembles the
//! parts and checks size and sha256 of the object before it may be bound.

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
/// A presigned part upload is valid this long (asked for right before use).
const PART_URL_MS: i64 = 10 * 60 * 1000;

fn blob_err(e: BlobError) -> ApiErr {
    match e {
        BlobError::BadPart { .. } | BlobError::BadKey(_) => ApiErr::bad_request(e.to_string()),
        BlobError::Mismatch { .. } | BlobError::Invalid(_) => ApiErr::invalid(e.to_string()),
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
    tracing::info!(job, epoch, name = %req.name, size = req.size, generation = %g.id, "upload session opened");
    if let kiln_blob::BlobStore::S3(_) = &state.blob {
        return Ok(Json(api::UploadSession {
            part_url: String::new(),
            generation_id: g.id,
            part_size: PART_SIZE,
            expires_at_ms: expires,
            presigned: true,
        }));
    }
    let cap = state.signer.sign(Op::Put, &g.id, expires);
    Ok(Json(api::UploadSession {
        part_url: format!("{}/blob/uploads/{}/parts/{{part}}?cap={cap}", base_url(&headers, &state), g.id),
        generation_id: g.id,
        part_size: PART_SIZE,
        expires_at_ms: expires,
        presigned: false,
    }))
}

/// Number of parts of an object of `size` bytes (one empty part when 0).
fn part_count(size: u64, part_size: u64) -> u64 {
    size.div_ceil(part_size).max(1)
}

/// S3: a presigned `UploadPart` for one part of a live attempt's session.
/// The multipart upload is started on the first request; if two requests
/// race, the one recorded first wins and the other's upload is aborted.
pub async fn part_url(
    S(state): S<State>,
    Path((job, epoch, generation, part)): Path<(String, i64, String, u64)>,
    body: Bytes,
) -> ApiResult<Json<api::PresignedPart>> {
    let req: api::PartUrlRequest = crate::routes::parse(&body)?;
    let kiln_blob::BlobStore::S3(s3) = &state.blob else {
        return Err(ApiErr::bad_request(
            "this server's object store is local: upload parts to the session's part_url".to_string(),
        ));
    };
    // Refused (409) once the epoch is fenced, like a part sent to the server.
    let g = state.store.uploadable_generation(&generation).await?;
    if g.job_id != job || g.epoch != epoch {
        return Err(ApiErr::not_found(format!("upload session {generation} of job {job} epoch {epoch}")));
    }
    let (size, part_size) = (g.expected_size as u64, g.part_size as u64);
    if size == 0 {
        return Err(ApiErr::bad_request("an empty artifact has no parts: seal it".to_string()));
    }
    let parts = part_count(size, part_size);
    let want = if part + 1 < parts { part_size } else { size - part_size * (parts - 1) };
    if part >= parts || req.size != want {
        return Err(ApiErr::bad_request(format!(
            "part {part} of a {size}-byte artifact in {part_size}-byte parts: {} (asked for {} bytes)",
            if part >= parts { format!("there are {parts} parts") } else { format!("it has {want} bytes") },
            req.size
        )));
    }
    let md5 = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &req.content_md5);
    if md5.map(|d| d.len()) != Ok(16) {
        return Err(ApiErr::bad_request("content_md5 must be the base64 of a 16-byte MD5 digest".to_string()));
    }
    let upload_id = if g.upload_id.is_empty() {
        let mine = s3.begin_upload(&g.object_key).await.map_err(blob_err)?;
        let winner = state.store.set_generation_upload(&generation, &mine).await;
        if winner.as_deref().ok() != Some(mine.as_str()) {
            let _ = s3.abort_upload(&g.object_key, &mine).await;
        }
        winner?
    } else {
        g.upload_id.clone()
    };
    let ttl = std::time::Duration::from_millis(PART_URL_MS as u64);
    let signed = s3.presign_part(&g.object_key, &upload_id, part, &req.content_md5, ttl).await.map_err(blob_err)?;
    Ok(Json(api::PresignedPart {
        part,
        url: signed.url,
        headers: signed.headers,
        expires_at_ms: now_ms() + PART_URL_MS,
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
    let kiln_blob::BlobStore::Local(local) = &state.blob else {
        return Err(ApiErr::bad_request("this server's object store takes parts directly (presigned)".to_string()));
    };
    let reader = tokio_util::io::StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
    let info = local
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
        let done = match &state.blob {
            kiln_blob::BlobStore::Local(local) => local.complete(&g.object_key, &expected).await,
            kiln_blob::BlobStore::S3(s3) => {
                let etags = part_etags(&req.parts, part_count(expected.size, g.part_size as u64), expected.size)?;
                s3.complete(&g.object_key, &g.upload_id, &etags, &expected).await
            }
        };
        if let Err(e) = done {
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
        state: g.state.into(),
    }))
}

/// The ETags of a presigned session's parts, in order: every part once.
fn part_etags(parts: &[api::UploadedPart], count: u64, size: u64) -> ApiResult<Vec<String>> {
    if size == 0 {
        return Ok(vec![]);
    }
    let mut etags = vec![None; count as usize];
    for p in parts {
        match etags.get_mut(p.part as usize) {
            Some(slot @ None) if !p.etag.is_empty() => *slot = Some(p.etag.clone()),
            Some(_) if !p.etag.is_empty() => {
                return Err(ApiErr::bad_request(format!("part {} is named twice", p.part)));
            }
            _ => return Err(ApiErr::bad_request(format!("part {} is not a part of this session", p.part))),
        }
    }
    etags
        .into_iter()
        .enumerate()
        .map(|(i, e)| e.ok_or_else(|| ApiErr::invalid(format!("part {i} has no ETag: upload it, then seal"))))
        .collect()
}

async fn download(state: &State, headers: &HeaderMap, b: &BoundArtifact) -> ApiResult<api::ArtifactDownload> {
    let expires = now_ms() + DOWNLOAD_CAP_MS;
    let url = match &state.blob {
        kiln_blob::BlobStore::S3(s3) => s3
            .presign_get(&b.generation.object_key, std::time::Duration::from_millis(DOWNLOAD_CAP_MS as u64))
            .await
            .map_err(blob_err)?,
        kiln_blob::BlobStore::Local(_) => {
            let cap = state.signer.sign(Op::Get, &b.generation.id, expires);
            format!("{}/blob/objects/{}?cap={cap}", base_url(headers, state), b.generation.id)
        }
    };
    Ok(api::ArtifactDownload {
        name: b.name.clone(),
        job: b.job_name.clone(),
        epoch: b.generation.epoch,
        size: b.generation.expected_size as u64,
        sha256: b.generation.expected_sha256.clone(),
        url,
        expires_at_ms: expires,
    })
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
    Ok(Json(download(&state, &headers, &b).await?))
}

/// Public API: a download capability for a run's bound artifact.
pub async fn get_artifact(
    S(state): S<State>,
    Path((run, job, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<api::ArtifactDownload>> {
    let b = state.store.resolve_binding(&run, &job, &name).await?;
    Ok(Json(download(&state, &headers, &b).await?))
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
    let local = match &state.blob {
        kiln_blob::BlobStore::Local(local) => local,
        kiln_blob::BlobStore::S3(s3) => {
            // An older link: send the client to the store.
            let ttl = std::time::Duration::from_millis(DOWNLOAD_CAP_MS as u64);
            let url = s3.presign_get(&g.object_key, ttl).await.map_err(blob_err)?;
            return Ok((StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, url)]).into_response());
        }
    };
    let (file, len) = local.open(&g.object_key).await.map_err(blob_err)?;
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
