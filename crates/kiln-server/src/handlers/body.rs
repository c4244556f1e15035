//! Request parsing shared by the handlers.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::body::Bytes;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

/// A JSON body, or 400 saying what is wrong with it.
pub(crate) fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiErr::bad_request(format!("invalid JSON body: {e}")))
}

/// Base URL for capability links: the address the caller used to reach us.
pub(crate) fn base_url(headers: &HeaderMap, state: &AppState) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| state.config.listen.clone());
    format!("http://{host}")
}
