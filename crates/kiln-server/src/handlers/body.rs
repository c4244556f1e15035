//! Request parsing shared by the handlers.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
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
