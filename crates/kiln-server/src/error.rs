//! The one error type at the HTTP edge: `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_api::{ErrorBody, ErrorDetail, codes};
use kiln_store::StoreError;

#[derive(Debug)]
pub struct ApiErr {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (a 503 that will pass).
    pub retry_after: Option<u64>,
}

impl ApiErr {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiErr { status, code, message: message.into(), retry_after: None }
    }
    /// 503 `unavailable` with `Retry-After: secs`.
    pub fn unavailable_for(secs: u64, message: impl Into<String>) -> Self {
        ApiErr { retry_after: Some(secs), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE, message) }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID, message)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, message)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "missing or invalid bearer token (send `Authorization: Bearer <token>`; see DATA_DIR/admin.token)",
        )
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL, message)
    }
}

impl From<StoreError> for ApiErr {
    fn from(e: StoreError) -> Self {
        let msg = e.to_string();
        match e {
            StoreError::NotFound(what) => ApiErr::not_found(format!("{what} not found")),
            StoreError::Conflict(m) => ApiErr::new(StatusCode::CONFLICT, codes::CONFLICT, m),
            StoreError::StaleEpoch(m) => ApiErr::new(StatusCode::CONFLICT, codes::STALE_EPOCH, m),
            StoreError::IdempotencyMismatch => ApiErr::new(
                StatusCode::CONFLICT,
                codes::IDEMPOTENCY_MISMATCH,
                "this Idempotency-Key was already used with a different request body; use a new key",
            ),
            StoreError::Invalid(m) => ApiErr::bad_request(m),
            StoreError::Unavailable(_) | StoreError::Busy(_) | StoreError::Retryable(_) => {
                ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE, msg)
            }
        }
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code, "{}", self.message);
        }
        let code = crate::metrics::ErrorCode(self.code);
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_string(), message: self.message } };
        let mut res = match self.retry_after {
            Some(secs) => {
                (self.status, [(axum::http::header::RETRY_AFTER, secs.to_string())], Json(body)).into_response()
            }
            None => (self.status, Json(body)).into_response(),
        };
        res.extensions_mut().insert(code);
        res
    }
}

pub type ApiResult<T> = Result<T, ApiErr>;
