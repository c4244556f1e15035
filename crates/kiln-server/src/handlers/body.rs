//! Request parsing shared by the handlers.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A JSON answer serialized off the async runtime: a run view or a long
/// list may be large, and serializing it must not stall other requests.
pub(crate) async fn json_blocking<T: Serialize + Send + 'static>(value: T) -> ApiResult<Response> {
    let bytes = tokio::task::spawn_blocking(move || serde_json::to_vec(&value))
        .await
        .map_err(|e| ApiErr::internal(e.to_string()))?
        .map_err(|e| ApiErr::internal(e.to_string()))?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], bytes).into_response())
}

/// A JSON body, or 400 saying what is wrong with it.
pub(crate) fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiErr::bad_request(format!("invalid JSON body: {e}")))
}

/// Base URL for capability links: the configured public URL (`--public-url`,
/// or derived from the listen address), never the request's `Host` header,
/// which the caller chooses.
pub(crate) fn base_url(state: &AppState) -> String {
    state.config.base_url()
}

/// A body read from a caller not yet authenticated, with its share of the
/// server's budget for such bodies (released when this is dropped: keep it
/// while the bytes are in use).
pub(crate) struct Unverified {
    pub bytes: Bytes,
    _share: tokio::sync::OwnedSemaphorePermit,
}

/// An early answer to a request whose body was not (wholly) read: the
/// connection closes after it, so the rest of the body is never read.
pub(crate) fn refuse_unread(e: ApiErr) -> Response {
    let mut res = e.into_response();
    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

fn too_large(limit: usize) -> Response {
    refuse_unread(ApiErr::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        kiln_api::codes::TOO_LARGE,
        format!("the request body is larger than this endpoint accepts ({limit} bytes)"),
    ))
}

/// The length a request declares for its body (`Content-Length`, or what
/// the body itself knows), refused with 413 — unread — past `limit`.
#[allow(clippy::result_large_err)] // the refusal is the answer, built once
pub(crate) fn declared_within(headers: &HeaderMap, body: &Body, limit: usize) -> Result<Option<u64>, Response> {
    let declared = match headers.get(header::CONTENT_LENGTH) {
        None => http_body::Body::size_hint(body).exact(),
        Some(v) => match v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => return Err(refuse_unread(ApiErr::bad_request("the Content-Length header is malformed"))),
        },
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    Ok(declared)
}

/// Read the body of a request that is not authenticated yet (issue 39,
/// item 7): at most `limit` bytes, and only within the server's budget of
/// unauthenticated body bytes held at once (`--unauthenticated-body-budget`,
/// shared by webhook deliveries and UI sign-ins): the share is taken before
/// the first byte is read — the declared `Content-Length`, else `limit` —
/// and past the budget the request is answered 503 (`Retry-After`) without
/// reading anything. A declared length past `limit` is 413 at once. The
/// read itself is bounded in time by the connection's body deadline
/// (`serve`).
pub(crate) async fn read_unauthenticated(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Unverified, Response> {
    let declared = declared_within(headers, &body, limit)?;
    let want = declared.map_or(limit, |n| n as usize);
    let share = u32::try_from(want).unwrap_or(u32::MAX);
    let Ok(share) = state.body_budget.clone().try_acquire_many_owned(share) else {
        return Err(refuse_unread(ApiErr::unavailable_for(
            1,
            "too many unauthenticated request bodies are being received at once; retry later",
        )));
    };
    // Its share is taken: reserve it at once (no copies while growing).
    let mut buf = Vec::with_capacity(want);
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| refuse_unread(ApiErr::bad_request(format!("the request body could not be read: {e}"))))?;
        if buf.len() + chunk.len() > want {
            return Err(too_large(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Unverified { bytes: Bytes::from(buf), _share: share })
}
