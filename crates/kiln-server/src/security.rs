//! Response headers every answer carries (issue 13, finding 10), and the
//! API's JSON error shape for the errors axum answers itself (a body past
//! the limit, a malformed path or query, a wrong method).

use crate::error::ApiErr;
use crate::serve::Reserved;
use crate::state::State;
use axum::extract::{Request, State as S};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_api as api;

/// Largest accepted JSON body (log chunks are ≤ 1 MiB of bytes, base64
/// grows them); the data plane streams and has its own limits.
pub(crate) const MAX_BODY: usize = 2 * 1024 * 1024;

/// The policy of API and error responses: nothing may load, nothing may frame.
const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The policy of blob downloads: shown, if ever, in a sandbox without script
/// or same-origin access (they are also sent as attachments).
pub(crate) const BLOB_CSP: &str = "sandbox; default-src 'none'";

pub(crate) async fn headers(S(state): S<State>, req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let mut res = json_errors(res).await;
    let h = res.headers_mut();
    h.entry(header::X_CONTENT_TYPE_OPTIONS).or_insert(HeaderValue::from_static("nosniff"));
    h.entry(header::REFERRER_POLICY).or_insert(HeaderValue::from_static("no-referrer"));
    h.entry(header::X_FRAME_OPTIONS).or_insert(HeaderValue::from_static("DENY"));
    h.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(API_CSP));
    h.entry(axum::http::HeaderName::from_static("cross-origin-resource-policy"))
        .or_insert(HeaderValue::from_static("same-origin"));
    if state.config.tls.is_some() {
        h.entry(header::STRICT_TRANSPORT_SECURITY).or_insert(HeaderValue::from_static("max-age=31536000"));
    }
    res
}

/// A 4xx answer that is not JSON (axum's own rejections are plain text) in
/// the API's shape `{"error": {"code", "message"}}`; 413 is `too_large`.
async fn json_errors(res: Response) -> Response {
    let status = res.status();
    let is_json =
        res.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !status.is_client_error() || is_json {
        return res;
    }
    let text = axum::body::to_bytes(res.into_body(), 16 * 1024).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let (code, default) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (api::codes::TOO_LARGE, "the request body is too large"),
        StatusCode::UNAUTHORIZED => (api::codes::UNAUTHORIZED, "unauthorized"),
        StatusCode::NOT_FOUND => (api::codes::NOT_FOUND, "not found"),
        StatusCode::METHOD_NOT_ALLOWED => (api::codes::INVALID, "method not allowed on this endpoint"),
        _ => (api::codes::INVALID, "invalid request"),
    };
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("the request body is larger than this endpoint accepts ({} bytes)", MAX_BODY)
        }
        _ if text.is_empty() => default.to_string(),
        _ => text,
    };
    ApiErr::new(status, code, message).into_response()
}

/// Inside an authentication layer: the request authenticated, so a
/// connection on a reserved slot (see `serve`) may stay open after it.
pub(crate) async fn authenticated(req: Request, next: Next) -> Response {
    if let Some(r) = req.extensions().get::<Reserved>() {
        r.authenticated();
    }
    next.run(req).await
}

/// The data plane checks its capability in the handler: a reserved slot
/// stays open after an answer that shows the capability held.
pub(crate) async fn authenticated_if_served(req: Request, next: Next) -> Response {
    let reserved = req.extensions().get::<Reserved>().cloned();
    let res = next.run(req).await;
    if let Some(r) = reserved
        && res.status().is_success()
    {
        r.authenticated();
    }
    res
}

/// Routes open to anyone (webhooks, the UI, `/metrics`, discovery): not
/// served on a reserved connection slot, which is kept for authenticated
/// calls and health checks — answered 503 without reading the body.
pub(crate) async fn public_side(req: Request, next: Next) -> Response {
    if req.extensions().get::<Reserved>().is_some() {
        return crate::handlers::body::refuse_unread(ApiErr::unavailable_for(
            1,
            "the server's connections for unauthenticated callers are all in use; retry later",
        ));
    }
    next.run(req).await
}
