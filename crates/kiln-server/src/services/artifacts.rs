//! Artifacts (spec 000 §12; invariant 4): attempt-scoped upload sessions,
//! the data plane's parts, sealing, and resolving bindings for consumers.
//! Control-plane calls authorize and run metadata transactions; data-plane
//! calls (`/blob/…`) move bytes under a capability and run no transaction
//! (an upload only reads whether its epoch is still live).
//!
//! With an S3 object store the data plane is the store itself: the agent
//! asks for each part's presigned `UploadPart` (granted only while its epoch
//! is live, valid for minutes, bound to the part's MD5), and downloads are
//! presigned `GET`s. Sealing still happens here: the server assembles the
//! parts and checks the object's size and multipart ETag with one `HEAD`
//! (each part's MD5 was checked by the store), without reading it back;
//! the sha256 is the attempt's word, checked by every consumer (issue 40,
//! item 10). On the local store the server hashes the parts as it writes
//! them.
//! Uploaded bytes stay a candidate generation of one attempt; only the
//! completion transaction binds them.

use crate::capability::Op;
use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_blob::{BlobError, BlobStore, ObjectInfo};
use kiln_store::{BoundArtifact, StoreError};
use std::time::Duration;

/// Parts are 64 MiB (the last may be shorter).
pub const PART_SIZE: u64 = 64 * 1024 * 1024;
/// Largest artifact accepted (100 GiB).
pub const MAX_ARTIFACT: u64 = 100 * 1024 * 1024 * 1024;
const UPLOAD_CAP_MS: i64 = 60 * 60 * 1000;
pub(crate) const DOWNLOAD_CAP_MS: i64 = 15 * 60 * 1000;
/// A presigned part upload is valid this long (asked for right before use).
const PART_URL_MS: i64 = 10 * 60 * 1000;

pub(crate) fn blob_err(e: BlobError) -> ApiErr {
    match e {
        BlobError::BadPart { .. } | BlobError::BadKey(_) => ApiErr::bad_request(e.to_string()),
        BlobError::Mismatch { .. } | BlobError::Invalid(_) => ApiErr::invalid(e.to_string()),
        BlobError::NotFound(_) => ApiErr::not_found(e.to_string()),
        BlobError::Exists(_) => ApiErr::new(StatusCode::CONFLICT, api::codes::CONFLICT, e.to_string()),
        BlobError::Io(_) => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, api::codes::UNAVAILABLE, e.to_string()),
    }
}

/// Open an upload session for a declared output of the live epoch.
/// `base_url` is where the caller reached this server (for part URLs).
pub(crate) async fn create_upload(
    state: &AppState,
    base_url: &str,
    job: &str,
    epoch: i64,
    req: api::CreateUpload,
) -> ApiResult<api::UploadSession> {
    if req.size > MAX_ARTIFACT {
        return Err(ApiErr::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            api::codes::TOO_LARGE,
            format!("artifact `{}` is {} bytes; the limit is {MAX_ARTIFACT}", req.name, req.size),
        ));
    }
    let sha = req.sha256.as_deref().unwrap_or("");
    let kind = req.kind.as_deref().unwrap_or(api::ARTIFACT_FILE);
    let new = kiln_store::NewGeneration {
        name: &req.name,
        size: req.size as i64,
        sha256: sha,
        part_size: PART_SIZE as i64,
        kind,
    };
    let g = state.store.open_generation(job, epoch, new).await?;
    let expires = state.clock.now_ms() + UPLOAD_CAP_MS;
    tracing::info!(job, epoch, name = %req.name, size = req.size, generation = %g.id, "upload session opened");
    if let BlobStore::S3(_) = &state.blob {
        return Ok(api::UploadSession {
            part_url: String::new(),
            generation_id: g.id,
            part_size: PART_SIZE,
            expires_at_ms: expires,
            presigned: true,
        });
    }
    let cap = state.signer.sign(Op::Put, &g.id, expires);
    Ok(api::UploadSession {
        part_url: format!("{base_url}/blob/uploads/{}/parts/{{part}}?cap={cap}", g.id),
        generation_id: g.id,
        part_size: PART_SIZE,
        expires_at_ms: expires,
        presigned: false,
    })
}

/// Number of parts of an object of `size` bytes (one empty part when 0).
fn part_count(size: u64, part_size: u64) -> u64 {
    size.div_ceil(part_size).max(1)
}

/// S3: a presigned `UploadPart` for one part of a live attempt's session.
/// The multipart upload is started on the first request; if two requests
/// race, the one recorded first wins and the other's upload is aborted.
pub(crate) async fn part_url(
    state: &AppState,
    (job, epoch): (&str, i64),
    generation: &str,
    part: u64,
    req: api::PartUrlRequest,
) -> ApiResult<api::PresignedPart> {
    let BlobStore::S3(s3) = &state.blob else {
        return Err(ApiErr::bad_request(
            "this server's object store is local: upload parts to the session's part_url".to_string(),
        ));
    };
    // Refused (409) once the epoch is fenced, like a part sent to the server.
    let g = state.store.uploadable_generation(generation).await?;
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
        let mine = s3.begin_upload(&g.session_key).await.map_err(blob_err)?;
        let winner = state.store.set_generation_upload(generation, &mine).await;
        if winner.as_deref().ok() != Some(mine.as_str()) {
            let _ = s3.abort_upload(&g.session_key, &mine).await;
        }
        winner?
    } else {
        g.upload_id.clone()
    };
    let ttl = Duration::from_millis(PART_URL_MS as u64);
    let signed = s3.presign_part(&g.session_key, &upload_id, part, &req.content_md5, ttl).await.map_err(blob_err)?;
    Ok(api::PresignedPart {
        part,
        url: signed.url,
        headers: signed.headers,
        expires_at_ms: state.clock.now_ms() + PART_URL_MS,
    })
}

/// Data plane: write one part under an upload capability. Refused (409)
/// once the epoch is fenced.
pub(crate) async fn put_part<R: tokio::io::AsyncRead + Unpin>(
    state: &AppState,
    generation: &str,
    part: u64,
    cap: Option<&str>,
    bytes: R,
) -> ApiResult<api::PartReceipt> {
    if !state.signer.verify(cap.unwrap_or(""), Op::Put, generation, state.clock.now_ms()) {
        return Err(ApiErr::unauthorized());
    }
    let g = state.store.uploadable_generation(generation).await?;
    let BlobStore::Local(local) = &state.blob else {
        return Err(ApiErr::bad_request("this server's object store takes parts directly (presigned)".to_string()));
    };
    let info = local
        .write_part(&g.session_key, part, g.part_size as u64, g.expected_size as u64, bytes)
        .await
        .map_err(blob_err)?;
    Ok(api::PartReceipt { part, size: info.size, sha256: info.sha256 })
}

/// Verify the stored bytes against the session's size and sha256, then seal
/// the generation for this epoch. Idempotent for a lost response.
pub(crate) async fn seal(
    state: &AppState,
    (job, epoch): (&str, i64),
    generation: &str,
    req: api::SealRequest,
) -> ApiResult<api::SealedGeneration> {
    let mut g = state.store.get_generation(generation).await?;
    if g.job_id != job || g.epoch != epoch {
        return Err(ApiErr::not_found(format!("upload session {generation} of job {job} epoch {epoch}")));
    }
    if g.state == "uploading" {
        match req.sha256.as_deref() {
            // The digest is named now (or confirmed): refused if it differs
            // from one named when the session was opened.
            Some(sha) => g = state.store.set_generation_digest(generation, job, epoch, sha).await?,
            None if g.expected_sha256.is_empty() => {
                return Err(ApiErr::invalid(format!(
                    "upload session {generation} was opened without a sha256: name it when sealing"
                )));
            }
            None => {}
        }
        // Refuse a fenced epoch before touching the bytes.
        state.store.uploadable_generation(generation).await?;
        let expected = ObjectInfo { size: g.expected_size as u64, sha256: g.expected_sha256.clone() };
        // An earlier try moved the bytes to their content key already (its
        // response was lost): only the seal is left.
        let moved = g.content_addressed() && !state.blob.exists(&g.session_key).await.map_err(blob_err)?;
        if !moved {
            let done = match &state.blob {
                BlobStore::Local(local) => local.complete(&g.session_key, &expected).await,
                BlobStore::S3(s3) => {
                    let etags = part_etags(&req.parts, part_count(expected.size, g.part_size as u64), expected.size)?;
                    s3.complete(&g.session_key, &g.upload_id, &etags, &expected).await
                }
            };
            if let Err(e) = done {
                return Err(unverified(state, &g, e).await);
            }
            if state.blob.content_addressable(expected.size) {
                // Referenced first (the collector keeps the content object
                // from then on), moved, and only then sealed: a sealed
                // generation's bytes are always there.
                let key = state.store.reference_content(generation, job, epoch).await?;
                if let Err(e) = state.blob.promote(&g.session_key, &key, &expected).await {
                    return Err(unverified(state, &g, e).await);
                }
            }
        }
        if g.kind == "archive" {
            note_manifest(state, &g, (job, epoch)).await?;
        }
    } else if g.state != "sealed" {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            api::codes::CONFLICT,
            format!("upload session {generation} is {}", g.state),
        ));
    }
    let was_sealed = g.state == "sealed";
    let g = state.store.seal_generation(generation, job, epoch).await?;
    if !was_sealed {
        state.metrics.artifacts_sealed.inc();
        state.metrics.artifact_bytes.inc_by(g.expected_size.max(0) as u64);
    }
    tracing::info!(job, epoch, name = %g.name, generation = %g.id, "artifact sealed");
    Ok(api::SealedGeneration {
        generation_id: g.id,
        name: g.name,
        size: g.expected_size as u64,
        sha256: g.expected_sha256,
        state: g.state.into(),
    })
}

/// A directory artifact's manifest digest, read from the head of its
/// stored archive (issue 45: its provenance names it). An archive whose
/// manifest cannot be read is sealed without it, and the log says so (its
/// restore verifies every member anyway).
async fn note_manifest(state: &AppState, g: &kiln_store::GenerationRecord, (job, epoch): (&str, i64)) -> ApiResult<()> {
    let key = if state.blob.exists(&g.session_key).await.map_err(blob_err)? {
        g.session_key.clone()
    } else {
        kiln_store::content_key(&g.expected_sha256)
    };
    let limits = kiln_cache::Limits::default();
    let digest = match &state.blob {
        BlobStore::Local(local) => {
            let file = local.open(&key).await.map_err(blob_err)?.0.into_std().await;
            tokio::task::spawn_blocking(move || kiln_cache::manifest_digest(std::io::BufReader::new(file), &limits))
                .await
                .map_err(|e| ApiErr::internal(e.to_string()))?
        }
        BlobStore::S3(s3) => {
            // The manifest is at the head: its cap plus the tar headers.
            let n = (g.expected_size.max(0) as usize).min(64 << 20);
            let head = s3.read_range(&key, 0, n).await.map_err(blob_err)?;
            kiln_cache::manifest_digest(std::io::Cursor::new(head), &limits)
        }
    };
    match digest {
        Ok(sha) => state.store.note_manifest(&g.id, job, epoch, &sha).await?,
        Err(e) => tracing::warn!(generation = %g.id, name = %g.name, "cannot read the archive's manifest: {e}"),
    }
    Ok(())
}

/// A session whose bytes did not verify is failed (nothing of it is ever
/// sealed); any other object store error is the store's.
async fn unverified(state: &AppState, g: &kiln_store::GenerationRecord, e: BlobError) -> ApiErr {
    if matches!(e, BlobError::Mismatch { .. } | BlobError::NotFound(_)) {
        let _ = state.store.fail_generation(&g.id, &e.to_string()).await;
        return ApiErr::invalid(format!("artifact `{}` failed verification: {e}", g.name));
    }
    blob_err(e)
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

/// 410 `expired`: the retention of a bound artifact ran out and the
/// collector deleted its bytes (issue 16).
pub(crate) fn expired(what: &str) -> ApiErr {
    ApiErr::new(
        StatusCode::GONE,
        api::codes::EXPIRED,
        format!(
            "artifact {what} has expired: its retention (`expire-in` / kiln server --artifact-expire-in) ran out and its bytes were deleted"
        ),
    )
}

/// A download capability for a bound artifact; 410 once it expired.
async fn download(state: &AppState, base_url: &str, b: &BoundArtifact) -> ApiResult<api::ArtifactDownload> {
    if b.expired_at.is_some() || b.generation.state == "expired" {
        return Err(expired(&format!("`{}/{}`", b.job_name, b.name)));
    }
    download_of(state, base_url, &b.generation, &b.name, &b.job_name).await
}

/// A download capability for a sealed generation (an artifact's or a cache's).
pub(crate) async fn download_of(
    state: &AppState,
    base_url: &str,
    g: &kiln_store::GenerationRecord,
    name: &str,
    job_name: &str,
) -> ApiResult<api::ArtifactDownload> {
    let expires = state.clock.now_ms() + DOWNLOAD_CAP_MS;
    let url = match &state.blob {
        BlobStore::S3(s3) => {
            s3.presign_get(&g.object_key, Duration::from_millis(DOWNLOAD_CAP_MS as u64)).await.map_err(blob_err)?
        }
        BlobStore::Local(_) => {
            let cap = state.signer.sign(Op::Get, &g.id, expires);
            format!("{base_url}/blob/objects/{}?cap={cap}", g.id)
        }
    };
    // An archive as people download it: converted here, under the same
    // capability (issue 41, item 5).
    let export = |format: kiln_cache::ExportFormat| {
        let cap = state.signer.sign(Op::Get, &g.id, expires);
        format!("{base_url}/blob/objects/{}/export?format={}&cap={cap}", g.id, format.extension())
    };
    let archive = g.kind == kiln_api::types::ARTIFACT_ARCHIVE;
    Ok(api::ArtifactDownload {
        name: name.to_string(),
        job: job_name.to_string(),
        epoch: g.epoch,
        size: g.expected_size as u64,
        sha256: g.expected_sha256.clone(),
        url,
        expires_at_ms: expires,
        kind: g.kind.clone(),
        tar_gz_url: archive.then(|| export(kiln_cache::ExportFormat::TarGz)),
        zip_url: archive.then(|| export(kiln_cache::ExportFormat::Zip)),
    })
}

/// Agent: resolve a producer's binding for the consuming attempt, which
/// must be the live one.
pub(crate) async fn restore(
    state: &AppState,
    base_url: &str,
    (job, epoch): (&str, i64),
    req: api::RestoreRequest,
) -> ApiResult<api::ArtifactDownload> {
    let consumer = state.store.get_job(job).await?;
    if consumer.current_epoch != epoch || consumer.status != kiln_core::JobStatus::Running {
        return Err(StoreError::StaleEpoch(format!("epoch {epoch} of job {job} is not the live attempt")).into());
    }
    let b = state.store.resolve_binding(&consumer.run_id, &req.from_job, &req.name).await?;
    download(state, base_url, &b).await
}

/// Public API: a download capability for a run's bound artifact.
pub(crate) async fn get(
    state: &AppState,
    base_url: &str,
    (run, job, name): (&str, &str, &str),
) -> ApiResult<api::ArtifactDownload> {
    let b = state.store.resolve_binding(run, job, name).await?;
    download(state, base_url, &b).await
}

/// Public API: the bound generation of a run's artifact (for a download
/// in a normal format); 410 once it expired.
pub(crate) async fn bound_generation(
    state: &AppState,
    (run, job, name): (&str, &str, &str),
) -> ApiResult<kiln_store::GenerationRecord> {
    let b = state.store.resolve_binding(run, job, name).await?;
    if b.expired_at.is_some() || b.generation.state == "expired" {
        return Err(expired(&format!("`{}/{}`", b.job_name, b.name)));
    }
    Ok(b.generation)
}

/// The DSSE envelope (JSON) of a bound artifact's provenance (issue 45).
/// An expired artifact's statement stays readable: it says what was built.
pub(crate) async fn provenance(state: &AppState, (run, job, name): (&str, &str, &str)) -> ApiResult<String> {
    let b = state.store.resolve_binding(run, job, name).await?;
    match state.store.artifact_provenance(&b.generation.id).await? {
        Some(p) => Ok(p.envelope),
        None => Err(ApiErr::not_found(format!(
            "no provenance for `{job}/{name}`: it was bound before this server wrote provenance"
        ))),
    }
}

/// The Test Result statement of `job` (its name or id) of `run`.
pub(crate) async fn test_attestation(state: &AppState, run: &str, job: &str) -> ApiResult<String> {
    let r = state.store.get_run(run).await?;
    let Some(j) = r.jobs.iter().map(|v| &v.job).find(|j| j.name == job || j.id == job) else {
        return Err(ApiErr::not_found(format!("job `{job}` of run {run}")));
    };
    match state.store.test_attestation(&j.id).await? {
        Some(t) => Ok(t.envelope),
        None => Err(ApiErr::not_found(format!(
            "no test attestation for job `{job}`: it declares no `reports:`, or no attempt of it bound its reports yet"
        ))),
    }
}

/// Data plane: the sealed generation under a download capability.
pub(crate) async fn generation_under_cap(
    state: &AppState,
    generation: &str,
    cap: Option<&str>,
) -> ApiResult<kiln_store::GenerationRecord> {
    if !state.signer.verify(cap.unwrap_or(""), Op::Get, generation, state.clock.now_ms()) {
        return Err(ApiErr::unauthorized());
    }
    let g = state.store.get_generation(generation).await?;
    if g.state == "expired" {
        return Err(expired(&format!("`{}` (generation {generation})", g.name)));
    }
    if g.state != "sealed" {
        return Err(ApiErr::not_found(format!("artifact generation {generation} is {}", g.state)));
    }
    Ok(g)
}

/// Bytes of a stored object read at once into the export's copy.
const EXPORT_READ: usize = 8 << 20;

/// An archive generation as a normal `.tar.gz` or `.zip` (issue 41, item
/// 5): the stored archive is copied into a temporary file (from S3 in
/// pieces), checked against the recorded sha256, and exported with every
/// check `unpack` makes; the result is a temporary file (deleted once
/// closed) and its length. Nothing is sent before all of it verified.
pub(crate) async fn export_archive(
    state: &AppState,
    g: &kiln_store::GenerationRecord,
    format: kiln_cache::ExportFormat,
) -> ApiResult<(tokio::fs::File, u64)> {
    use tokio::io::AsyncWriteExt;
    if g.kind != api::types::ARTIFACT_ARCHIVE {
        return Err(ApiErr::bad_request(format!(
            "artifact `{}` is a single file: download it as it is (without `format`)",
            g.name
        )));
    }
    let size = g.expected_size.max(0) as u64;
    let internal = |e: std::io::Error| ApiErr::internal(format!("exporting artifact `{}`: {e}", g.name));
    let stored = match &state.blob {
        BlobStore::Local(local) => local.open(&g.object_key).await.map_err(blob_err)?.0.into_std().await,
        BlobStore::S3(_) => {
            let f = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(|e| ApiErr::internal(e.to_string()))?
                .map_err(internal)?;
            let mut f = tokio::fs::File::from_std(f);
            let mut at = 0u64;
            while at < size {
                let n = (size - at).min(EXPORT_READ as u64) as usize;
                let bytes = state.blob.read_range(&g.object_key, at, n).await.map_err(blob_err)?;
                if bytes.is_empty() {
                    break;
                }
                f.write_all(&bytes).await.map_err(internal)?;
                at += bytes.len() as u64;
            }
            f.flush().await.map_err(internal)?;
            f.into_std().await
        }
    };
    let (name, want, mtime) = (g.name.clone(), g.expected_sha256.clone(), (g.created_at.max(0) / 1000) as u64);
    let out = tokio::task::spawn_blocking(move || -> Result<(std::fs::File, u64), ApiErr> {
        use sha2::Digest;
        use std::io::{Read, Seek};
        let mut stored = stored;
        let io = |e: std::io::Error| ApiErr::internal(format!("exporting artifact `{name}`: {e}"));
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = stored.read(&mut buf).map_err(io)?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
        }
        if !hex::encode(h.finalize()).eq_ignore_ascii_case(&want) {
            return Err(ApiErr::internal(format!(
                "artifact `{name}`: the stored archive does not have its recorded sha256; nothing was sent"
            )));
        }
        stored.rewind().map_err(io)?;
        let mut out = tempfile::tempfile().map_err(io)?;
        let limits = kiln_cache::Limits::default();
        kiln_cache::export(std::io::BufReader::new(stored), &name, &mut out, format, mtime, &limits)
            .map_err(|e| ApiErr::internal(format!("artifact `{name}` cannot be exported: {e}")))?;
        let len = out.stream_position().map_err(io)?;
        out.rewind().map_err(io)?;
        Ok((out, len))
    })
    .await
    .map_err(|e| ApiErr::internal(e.to_string()))??;
    Ok((tokio::fs::File::from_std(out.0), out.1))
}

/// Where a sealed object's bytes come from.
pub(crate) enum Object {
    /// The local store's file.
    File { file: tokio::fs::File, len: u64, sha256: String },
    /// An S3 store: a fresh presigned URL (an older link was followed).
    Redirect(String),
}

/// Data plane: open a sealed object under a download capability.
pub(crate) async fn open_object(state: &AppState, generation: &str, cap: Option<&str>) -> ApiResult<Object> {
    let g = generation_under_cap(state, generation, cap).await?;
    open_sealed(state, &g).await
}

/// The bytes of the sealed generation `g`.
pub(crate) async fn open_sealed(state: &AppState, g: &kiln_store::GenerationRecord) -> ApiResult<Object> {
    match &state.blob {
        BlobStore::Local(local) => {
            let (file, len) = local.open(&g.object_key).await.map_err(blob_err)?;
            Ok(Object::File { file, len, sha256: g.expected_sha256.clone() })
        }
        BlobStore::S3(s3) => {
            let ttl = Duration::from_millis(DOWNLOAD_CAP_MS as u64);
            Ok(Object::Redirect(s3.presign_get(&g.object_key, ttl).await.map_err(blob_err)?))
        }
    }
}
