//! Calls of a running attempt: heartbeat, log chunks, completion, image
//! digest. Each names `(job, epoch)` in its path.

use super::body::parse;
use crate::error::{ApiErr, ApiResult};
use crate::services::attempts;
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State as S};
use axum::http::HeaderMap;
use base64::Engine;
use kiln_api as api;
use tracing::Instrument;

#[utoipa::path(
    operation_id = "attempts_heartbeat",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/heartbeat", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    responses(
        (status = 200, description = "The lease, renewed", body = api::HeartbeatResponse),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn heartbeat(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
) -> ApiResult<Json<api::HeartbeatResponse>> {
    Ok(Json(attempts::heartbeat(&state, &job, epoch).await?))
}

/// A chunk comes as JSON (`data` in base64) or as a raw body
/// (`application/octet-stream`) with its identity in `kiln-log-*` headers.
#[utoipa::path(
    operation_id = "attempts_append_log",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/logs", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
        ("kiln-log-stream" = Option<String>, Header, description = "A raw chunk's stream"),
        ("kiln-log-seq" = Option<i64>, Header, description = "A raw chunk's sequence number"),
        ("kiln-log-offset" = Option<i64>, Header, description = "A raw chunk's offset"),
        ("kiln-log-sha256" = Option<String>, Header, description = "A raw chunk's sha256"),
        ("kiln-log-crc32c" = Option<String>, Header, description = "A raw chunk's CRC-32C"),
        ("kiln-log-in-order" = Option<String>, Header, description = "`1`: the chunk follows the last committed one"),
    ),
    request_body(description = "A chunk as JSON (`data` in base64), or as a raw body with its identity in `kiln-log-*` headers", content((api::LogChunk = "application/json"), ("application/octet-stream"))),
    responses(
        (status = 200, description = "Committed offsets by stream", body = api::LogAck),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn append_log(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::LogAck>> {
    let raw = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/octet-stream"));
    let chunk = if raw { raw_chunk(&headers, body)? } else { json_chunk(&body)? };
    Ok(Json(attempts::append_log(&state, &job, epoch, chunk).await?))
}

/// A short job's few small chunks in one request (see [`api::LogChunkBatch`]).
#[utoipa::path(
    operation_id = "attempts_append_log_batch",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/logs/batch", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::LogChunkBatch,
    responses(
        (status = 200, description = "How many chunks, from the first, committed; committed offsets by stream", body = api::LogBatchAck),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn append_log_batch(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::LogBatchAck>> {
    let batch: api::LogChunkBatch = parse(&body)?;
    let chunks = batch.chunks.into_iter().map(raw_of_json).collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(attempts::append_log_batch(&state, &job, epoch, chunks).await?))
}

/// A chunk in a JSON body (`data` in base64).
fn json_chunk(body: &Bytes) -> ApiResult<api::RawLogChunk> {
    raw_of_json(parse(body)?)
}

/// A JSON chunk's bytes, decoded.
fn raw_of_json(c: api::LogChunk) -> ApiResult<api::RawLogChunk> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(c.data.as_bytes())
        .map_err(|e| ApiErr::bad_request(format!("chunk data is not base64: {e}")))?;
    Ok(api::RawLogChunk {
        stream: c.stream,
        seq: c.seq,
        offset: c.offset,
        sha256: c.sha256,
        crc32c: c.crc32c,
        data: data.into(),
        in_order: c.in_order,
    })
}

/// A chunk as a raw body, its identity in `kiln-log-*` headers.
fn raw_chunk(headers: &HeaderMap, body: Bytes) -> ApiResult<api::RawLogChunk> {
    use api::log_headers as h;
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ApiErr::bad_request(format!("a raw log chunk needs the {name} header")))
    };
    let int =
        |name: &str| get(name)?.parse::<i64>().map_err(|_| ApiErr::bad_request(format!("{name} must be an integer")));
    Ok(api::RawLogChunk {
        stream: get(h::STREAM)?.to_string(),
        seq: int(h::SEQ)?,
        offset: int(h::OFFSET)?,
        sha256: headers.get(h::SHA256).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        crc32c: headers.get(h::CRC32C).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        data: body,
        in_order: headers.get(h::IN_ORDER).is_some_and(|v| v.as_bytes() == b"1"),
    })
}

#[utoipa::path(
    operation_id = "attempts_complete",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/complete", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::Completion,
    responses(
        (status = 200, description = "The job's status after the completion", body = api::CompletionAck),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn complete(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::CompletionAck>> {
    let c: api::Completion = parse(&body)?;
    // A span of the run's trace (issue 19): the agent's attempt sends its
    // context with each call. Only the trace's shape rests on it: who may
    // complete is decided by the attempt token, as before.
    let parent = headers.get(api::trace::HEADER).and_then(|v| v.to_str().ok()).and_then(api::trace::TraceParent::parse);
    let span = tracing::info_span!("complete", job_id = %job, epoch, trace_id = tracing::field::Empty);
    api::trace::enter(&span, parent);
    let job_status = attempts::complete(&state, &job, epoch, c).instrument(span).await?;
    Ok(Json(api::CompletionAck { job_status: job_status.into() }))
}

/// Issue 40, item 5: a fenced attempt's agent says its sandbox is gone.
#[utoipa::path(
    operation_id = "attempts_release",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/release", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::SandboxEnd,
    responses(
        (status = 200, description = "Whether the fenced attempt's sandbox was recorded as gone", body = api::ReleaseAck),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn release(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ReleaseAck>> {
    let end: api::SandboxEnd = parse(&body)?;
    Ok(Json(api::ReleaseAck { released: attempts::release(&state, &job, epoch, end).await? }))
}

/// A Dockerfile job's attempt commits the digest of the image it built,
/// before any user step runs; the answer is the digest every attempt must run.
#[utoipa::path(
    operation_id = "attempts_commit_image",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/image", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::ImageCommit,
    responses(
        (status = 200, description = "The digest every attempt of the job must run", body = api::ImageCommit),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn commit_image(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ImageCommit>> {
    let req: api::ImageCommit = parse(&body)?;
    let digest = attempts::commit_image(&state, &job, epoch, &req.digest, req.repository.is_none()).await?;
    Ok(Json(api::ImageCommit { digest, repository: req.repository }))
}
