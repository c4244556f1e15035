//! The store's error type and how database errors map onto it.
//!
//! The variants are a contract with callers (the server maps them to HTTP
//! statuses): `NotFound`, `Conflict`, `StaleEpoch` and `Invalid` are decided
//! answers; `Unavailable`, `Busy` and `Retryable` mean nothing was decided and
//! the call may be made again.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    /// The named epoch is not the job's current live attempt: it is fenced.
    #[error("stale epoch: {0}")]
    StaleEpoch(String),
    /// The same idempotency key was used with a different request body.
    #[error("idempotency key reused with a different request")]
    IdempotencyMismatch,
    #[error("invalid: {0}")]
    Invalid(String),
    /// The database could not be reached or failed; nothing was decided.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Rows the call needs are locked by a concurrent transaction and the
    /// caller asked not to wait (`ClaimInput::skip_locked`); nothing was decided.
    #[error("busy: {0}")]
    Busy(String),
    /// The transaction lost a serialization race or a deadlock (PostgreSQL):
    /// nothing was decided and the whole call may run again. The store reruns
    /// it a bounded number of times itself; a caller sees this only when every
    /// rerun lost too (the server answers 503, as for `Unavailable`).
    #[error("database unavailable: serialization failure, retry: {0}")]
    Retryable(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The error mapping every backend shares; a backend maps its own codes
/// first (see [`pg_err`]).
pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::RowNotFound => StoreError::NotFound("row".into()),
        sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(d.message().to_string()),
        // FIX (conformance test `unknown_repository_is_not_unavailable`): a
        // reference to a missing row (accept_run with an unknown repo_id or
        // parent_run_id) is the caller's error, not an outage; it used to fall
        // through to `Unavailable` ("nothing was decided, retry").
        sqlx::Error::Database(d) if d.is_foreign_key_violation() => {
            StoreError::Invalid(format!("references a missing record: {}", d.message()))
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

/// PostgreSQL: a serialization failure (40001) or deadlock (40P01) is
/// [`StoreError::Retryable`]; everything else as [`db_err`].
pub(crate) fn pg_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(d) = &e
        && matches!(d.code().as_deref(), Some("40001" | "40P01"))
    {
        return StoreError::Retryable(d.message().to_string());
    }
    db_err(e)
}

pub(crate) fn parse_enum<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T> {
    s.parse::<T>().map_err(StoreError::Invalid)
}
