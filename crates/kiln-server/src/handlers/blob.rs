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
#[utoipa::path(
    operation_id = "blob_put_part",
    put, path = "/blob/uploads/{generation}/parts/{part}", tag = "data",
    params(
        ("generation" = String, Path, description = "The artifact generation's id"),
        ("part" = u64, Path, description = "The part's number, from 0"),
    ),
    request_body(content = Vec<u8>, description = "The part's bytes", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "The part, stored", body = api::PartReceipt),
    ),
    security(("capability" = [])),
)]
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
#[utoipa::path(
    operation_id = "blob_get_object",
    get, path = "/blob/objects/{generation}", tag = "data",
    params(
        ("generation" = String, Path, description = "The artifact generation's id"),
    ),
    responses(
        (status = 200, description = "The object's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 307, description = "A redirect to the object store"),
    ),
    security(("capability" = [])),
)]
pub(crate) async fn get_object(
    S(state): S<State>,
    Path(generation): Path<String>,
    Query(q): Query<CapQuery>,
) -> ApiResult<Response> {
    Ok(object_response(artifacts::open_object(&state, &generation, q.cap.as_deref()).await?))
}

/// The bytes of an object, or the redirect to them.
pub(crate) fn object_response(o: Object) -> Response {
    match o {
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
    }
}

#[derive(Deserialize)]
pub(crate) struct ExportQuery {
    cap: Option<String>,
    format: Option<String>,
}

/// The format asked for by `?format=` (checked) or, failing that, by the
/// `Accept` header (`application/gzip`, `application/zip`, …); None: none.
pub(crate) fn asked_format(
    format: Option<&str>,
    headers: &axum::http::HeaderMap,
) -> ApiResult<Option<kiln_cache::ExportFormat>> {
    if let Some(f) = format {
        return match kiln_cache::ExportFormat::parse(f) {
            Some(f) => Ok(Some(f)),
            None => Err(crate::error::ApiErr::bad_request(format!(
                "format `{f}` is not one Kiln makes: use `tar.gz` or `zip`"
            ))),
        };
    }
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let types: Vec<&str> = accept.split(',').map(|t| t.split(';').next().unwrap_or_default().trim()).collect();
    Ok(types.iter().find_map(|t| match *t {
        "application/zip" | "application/x-zip-compressed" => Some(kiln_cache::ExportFormat::Zip),
        "application/gzip"
        | "application/x-gzip"
        | "application/x-tar+gzip"
        | "application/x-gtar"
        | "application/x-tgz" => Some(kiln_cache::ExportFormat::TarGz),
        _ => None,
    }))
}

/// An exported archive as a download named `<name>.<extension>`.
pub(crate) fn export_response(
    file: tokio::fs::File,
    len: u64,
    name: &str,
    format: kiln_cache::ExportFormat,
) -> Response {
    let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024);
    let safe: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-+".contains(c) { c } else { '_' }).collect();
    (
        [
            (axum::http::header::CONTENT_TYPE, format.content_type().to_string()),
            (axum::http::header::CONTENT_LENGTH, len.to_string()),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{safe}.{}\"", format.extension()),
            ),
            (axum::http::header::CONTENT_SECURITY_POLICY, BLOB_CSP.to_string()),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `GET /blob/objects/{generation}/export?format=tar.gz|zip&cap=…`: an
/// archive generation as a normal `.tar.gz` or `.zip` (issue 41, item 5),
/// under the same capability as its bytes; `Accept` chooses when no
/// `format` is given (default `tar.gz`).
#[utoipa::path(
    operation_id = "blob_export_object",
    get, path = "/blob/objects/{generation}/export", tag = "data",
    params(
        ("generation" = String, Path, description = "The artifact generation's id"),
        ("format" = Option<String>, Query, description = "`tar.gz` (default) or `zip`"),
    ),
    responses(
        (status = 200, description = "An archive generation as a `.tar.gz` or `.zip`", content(("application/gzip"), ("application/zip"))),
    ),
    security(("capability" = [])),
)]
pub(crate) async fn export_object(
    S(state): S<State>,
    Path(generation): Path<String>,
    Query(q): Query<ExportQuery>,
    headers: axum::http::HeaderMap,
) -> ApiResult<Response> {
    let format = asked_format(q.format.as_deref(), &headers)?.unwrap_or(kiln_cache::ExportFormat::TarGz);
    let g = artifacts::generation_under_cap(&state, &generation, q.cap.as_deref()).await?;
    let (file, len) = artifacts::export_archive(&state, &g, format).await?;
    Ok(export_response(file, len, &g.name, format))
}
