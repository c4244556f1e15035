//! `POST /v1/repos`, `GET /v1/repos`, `GET|PATCH|DELETE /v1/repos/{repo}`, hook info, deliveries, webhooks.

use super::body::{declared_within, parse, read_unauthenticated, refuse_unread};
use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::repos;
use crate::state::{AppState, State};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kiln_api as api;

#[utoipa::path(
    operation_id = "repos_create",
    post, path = "/v1/repos", tag = "repos",
    request_body = api::CreateRepo,
    responses(
        (status = 201, description = "The repository, registered", body = api::Repo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Repo>)> {
    let req: api::CreateRepo = parse(&body)?;
    Ok((StatusCode::CREATED, Json(repos::create(&state, &by, req).await?)))
}

#[utoipa::path(
    operation_id = "repos_list",
    get, path = "/v1/repos", tag = "repos",
    responses(
        (status = 200, description = "Every repository", body = super::answers::RepoList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>) -> ApiResult<Json<serde_json::Value>> {
    let repos = repos::list(&state).await?;
    Ok(Json(serde_json::json!({ "repos": repos })))
}

/// `PATCH /v1/repos/{repo}`.
#[utoipa::path(
    operation_id = "repos_update",
    patch, path = "/v1/repos/{repo}", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
    ),
    request_body = api::UpdateRepo,
    responses(
        (status = 200, description = "The repository, updated", body = api::Repo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn update(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Repo>> {
    let req: api::UpdateRepo = parse(&body)?;
    Ok(Json(repos::update(&state, &by, &repo, req).await?))
}

/// `DELETE /v1/repos/{repo}` (admin): the removed repository.
#[utoipa::path(
    operation_id = "repos_delete",
    delete, path = "/v1/repos/{repo}", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
    ),
    responses(
        (status = 200, description = "The repository, removed", body = api::Repo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
) -> ApiResult<Json<api::Repo>> {
    Ok(Json(repos::delete(&state, &by, &repo).await?))
}

/// `GET /v1/repos/{repo}`.
#[utoipa::path(
    operation_id = "repos_get",
    get, path = "/v1/repos/{repo}", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
    ),
    responses(
        (status = 200, description = "The repository", body = api::Repo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn get(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<api::Repo>> {
    Ok(Json(repos::shown(&state, state.store.get_repo(&repo).await?).await?))
}

/// `GET /v1/repos/{repo}/hook-info`.
#[utoipa::path(
    operation_id = "repos_hook_info",
    get, path = "/v1/repos/{repo}/hook-info", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
    ),
    responses(
        (status = 200, description = "What to paste into the forge's webhook settings", body = api::HookInfo),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn hook_info(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<api::HookInfo>> {
    Ok(Json(repos::hook_info(&state, &repo).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct Limit {
    pub(crate) limit: Option<u32>,
}

/// `GET /v1/repos/{repo}/deliveries`.
#[utoipa::path(
    operation_id = "repos_deliveries",
    get, path = "/v1/repos/{repo}/deliveries", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("limit" = Option<u32>, Query, description = "At most this many deliveries"),
    ),
    responses(
        (status = 200, description = "The repository's webhook deliveries, newest first", body = super::answers::DeliveryList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn deliveries(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<Limit>,
) -> ApiResult<Json<serde_json::Value>> {
    let list = repos::deliveries(&state, &repo, q.limit).await?;
    Ok(Json(serde_json::json!({ "deliveries": list })))
}

/// `POST /v1/repos/{repo}/webhooks/{forge}`: authenticated by the forge's
/// signature or token only (no bearer token).
#[utoipa::path(
    operation_id = "repos_webhook",
    post, path = "/v1/repos/{repo}/webhooks/{forge}", tag = "webhooks",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("forge" = String, Path, description = "`github`, `gitlab`, `gitea` or `forgejo`"),
    ),
    request_body(content = Object, description = "The forge's delivery, as it sends it; verified by its signature (`X-Hub-Signature-256`, `X-Gitlab-Token`, `X-Gitea-Signature`) against the repository's webhook secret", content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted: planning runs", body = api::WebhookAck),
        (status = 200, description = "A redelivery: the first answer again (`duplicate`)", body = api::WebhookAck),
    ),
    security(()),
)]
pub(crate) async fn webhook(
    S(state): S<State>,
    Path((repo, forge)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<api::WebhookAck>), Response> {
    // Issue 39, item 7: nothing is read before the delivery could verify,
    // and what is read counts against the unauthenticated body budget.
    declared_within(&headers, &body, kiln_forge::MAX_BODY_BYTES)?;
    before_body(&state, &repo, &forge, &headers).await.map_err(refuse_unread)?;
    let body = read_unauthenticated(&state, &headers, body, kiln_forge::MAX_BODY_BYTES).await?;
    let (status, ack) = crate::services::webhooks::receive(&state, &repo, &forge, &headers, &body.bytes)
        .await
        .map_err(IntoResponse::into_response)?;
    Ok((status, Json(ack)))
}

/// Refuse, before reading any of its body, a delivery that cannot verify
/// whatever its body: an unknown forge or repository, a repository without
/// a webhook secret, a signature header missing or malformed. The refusal
/// is the one `receive` gives (it checks these before it looks at the
/// body), so a delivery is answered the same whether its body was read.
async fn before_body(state: &AppState, repo: &str, forge: &str, headers: &HeaderMap) -> ApiResult<()> {
    let verifiable = match forge.parse::<kiln_forge::Forge>() {
        Err(_) => false,
        Ok(forge) => match state.store.get_repo(repo).await {
            Ok(r) => {
                r.webhook_secret.is_some()
                    && !matches!(
                        // Any secret: only the header's presence and shape are checked here.
                        kiln_forge::verify(forge, headers, b"", b"-"),
                        Err(kiln_forge::VerifyError::MissingHeader(_) | kiln_forge::VerifyError::MalformedHeader(_))
                    )
            }
            Err(kiln_store::StoreError::NotFound(_)) => false,
            Err(e) => return Err(e.into()),
        },
    };
    if verifiable {
        return Ok(());
    }
    match crate::services::webhooks::receive(state, repo, forge, headers, b"").await {
        Err(e) => Err(e),
        Ok(_) => Err(ApiErr::new(StatusCode::UNAUTHORIZED, api::codes::UNAUTHORIZED, "the delivery does not verify")),
    }
}
