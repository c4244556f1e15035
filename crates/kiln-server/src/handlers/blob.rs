//! The data plane: capability URLs, no bearer token, bodies streamed.

use crate::error::ApiResult;
use crate::security::BLOB_CSP;
use crate::services::artifacts::{self, Object};
use crate::state::State;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State as S};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use kiln_api as api;
use serde::Deserialize;

#[derive(Deserialize)]
pub(crate) struct CapQuery {
    cap: Option<String>,
}

/// `PUT /blob/uploads/{generation}/parts/{part}?cap=…`
pub(crate) async fn put_part(
    S(state): S<State>,
    Path((generation, part)): Path<(String, u64)>,
    Query(q): Query<CapQuery>,
    body: Body,
) -> ApiResult<Json<api::PartReceipt>> {
    let reader = tokio_util::io::StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
    Ok(Json(artifacts::put_part(&state, &generation, part, q.cap.as_deref(), reader).await?))
}

/// `GET /blob/objects/{generation}?cap=…`: the bytes, or a redirect to the
/// object store.
pub(crate) async fn get_object(
    S(state): S<State>,
    Path(generation): Path<String>,
    Query(q): Query<CapQuery>,
) -> ApiResult<Response> {
    Ok(match artifacts::open_object(&state, &generation, q.cap.as_deref()).await? {
        Object::Redirect(url) => {
            (StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, url)]).into_response()
        }
        Object::File { file, len, sha256 } => {
            let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
            (
                [
                    (axum::http::header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (axum::http::header::CONTENT_LENGTH, len.to_string()),
                    (axum::http::header::HeaderName::from_static("x-kiln-sha256"), sha256),
                    // Never rendered from the UI's origin: downloaded, and
                    // sandboxed should anything display it anyway.
                    (axum::http::header::CONTENT_DISPOSITION, "attachment".to_string()),
                    (axum::http::header::CONTENT_SECURITY_POLICY, BLOB_CSP.to_string()),
                    (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
                ],
                Body::from_stream(stream),
            )
                .into_response()
        }
    })
}
