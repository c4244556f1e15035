//! Deployment environments and approvals (issue 46): `kiln env`, `kiln
//! approve`, `kiln reject`. Environment writes are an admin's; a decision
//! on a run's deployment is checked against the environment's approvers
//! by the service (a read token listed by name may decide).

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::{environments, runs};
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State as S};
use axum::http::StatusCode;
use kiln_api as api;

#[utoipa::path(
    operation_id = "environments_list",
    get, path = "/v1/environments", tag = "environments",
    responses((status = 200, description = "Every environment, by name", body = api::EnvironmentList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>) -> ApiResult<Json<api::EnvironmentList>> {
    Ok(Json(environments::list(&state).await?))
}

#[utoipa::path(
    operation_id = "environments_create",
    post, path = "/v1/environments", tag = "environments",
    request_body(content = api::CreateEnvironment, content_type = "application/json"),
    responses(
        (status = 201, description = "The environment", body = api::Environment),
        (status = 409, description = "An environment of that name exists", body = api::ErrorBody),
        (status = 422, description = "A bad name or rule", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Environment>)> {
    let req: api::CreateEnvironment = parse(&body)?;
    Ok((StatusCode::CREATED, Json(environments::create(&state, &by, req).await?)))
}

#[utoipa::path(
    operation_id = "environments_get",
    get, path = "/v1/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "The environment's name")),
    responses((status = 200, description = "The environment", body = api::Environment)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn get(S(state): S<State>, Path(env): Path<String>) -> ApiResult<Json<api::Environment>> {
    Ok(Json(environments::get(&state, &env).await?))
}

#[utoipa::path(
    operation_id = "environments_update",
    patch, path = "/v1/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "The environment's name")),
    request_body(content = api::UpdateEnvironment, content_type = "application/json"),
    responses((status = 200, description = "The environment (its rules apply to the next decision)", body = api::Environment)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn update(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(env): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Environment>> {
    let req: api::UpdateEnvironment = parse(&body)?;
    Ok(Json(environments::update(&state, &by, &env, req).await?))
}

#[utoipa::path(
    operation_id = "environments_delete",
    delete, path = "/v1/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "The environment's name")),
    responses(
        (status = 200, description = "The environment, removed", body = api::Environment),
        (status = 409, description = "Deploy jobs to it are queued or running", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(env): Path<String>,
) -> ApiResult<Json<api::Environment>> {
    Ok(Json(environments::delete(&state, &by, &env).await?))
}

#[utoipa::path(
    operation_id = "runs_decide_deployment",
    post, path = "/v1/workflow-runs/{run}/approvals", tag = "environments",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    request_body(content = api::DecideDeployment, content_type = "application/json"),
    responses(
        (status = 201, description = "The decision; the run's deploy jobs to the environment start (enough approvals) or are cancelled (rejected)", body = api::Approval),
        (status = 403, description = "Not one of the environment's approvers, or the run's own author under --prevent-self-review", body = api::ErrorBody),
        (status = 409, description = "The run has ended, or this approver decided already", body = api::ErrorBody),
        (status = 422, description = "No such environment in the run", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn decide(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Approval>)> {
    let req: api::DecideDeployment = parse(&body)?;
    let run = runs::resolve_id(&state, &run).await?;
    Ok((StatusCode::CREATED, Json(environments::decide(&state, &by, &run, req).await?)))
}

#[utoipa::path(
    operation_id = "runs_approvals",
    get, path = "/v1/workflow-runs/{run}/approvals", tag = "environments",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses((status = 200, description = "The run's approvals and rejections, oldest first", body = api::ApprovalList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn approvals(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Json<api::ApprovalList>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(environments::approvals(&state, &run).await?))
}

/// `?limit=` of a deployment list.
#[derive(serde::Deserialize)]
pub(crate) struct DeploymentsQuery {
    limit: Option<u32>,
}

#[utoipa::path(
    operation_id = "environments_deployments",
    get, path = "/v1/environments/{env}/deployments", tag = "environments",
    params(
        ("env" = String, Path, description = "The environment's name"),
        ("limit" = Option<u32>, Query, description = "At most this many, newest first (default 50, at most 500)"),
    ),
    responses((status = 200, description = "Its deployments, newest first", body = api::DeploymentList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn deployments(
    S(state): S<State>,
    Path(env): Path<String>,
    axum::extract::Query(q): axum::extract::Query<DeploymentsQuery>,
) -> ApiResult<Json<api::DeploymentList>> {
    Ok(Json(environments::deployments(&state, &env, q.limit).await?))
}

#[utoipa::path(
    operation_id = "environments_rollback",
    post, path = "/v1/environments/{env}/rollback", tag = "environments",
    params(("env" = String, Path, description = "The environment's name")),
    request_body(content = api::RollbackRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The rollback run: the environment's deploy jobs of the earlier deployment's run again, with its pinned artifact generations (no build runs)", body = api::RollbackAccepted),
        (status = 403, description = "Not one of the environment's approvers", body = api::ErrorBody),
        (status = 404, description = "No such environment, or no such deployment of it", body = api::ErrorBody),
        (status = 409, description = "Nothing to return to, the deployment failed, or its bytes expired", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn rollback(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(env): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::RollbackAccepted>)> {
    let req: api::RollbackRequest =
        if body.iter().all(u8::is_ascii_whitespace) { Default::default() } else { parse(&body)? };
    Ok((StatusCode::CREATED, Json(environments::rollback(&state, &by, &env, req).await?)))
}

#[utoipa::path(
    operation_id = "runs_rings",
    get, path = "/v1/workflow-runs/{run}/rings", tag = "environments",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses((status = 200, description = "The run's promotions between deploy rings, in file order", body = api::RingPromotionList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn rings(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Json<api::RingPromotionList>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(crate::services::rings::promotions(&state, &run).await?))
}

#[utoipa::path(
    operation_id = "runs_promote",
    post, path = "/v1/workflow-runs/{run}/promote", tag = "environments",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "The run's next promotion, promoted now: its bake and gate are skipped", body = api::RingPromotion),
        (status = 403, description = "Not one of the environment's approvers", body = api::ErrorBody),
        (status = 409, description = "The run ended, deploys no rings, has no promotion left, or its gate failed", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn promote(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
) -> ApiResult<Json<api::RingPromotion>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(crate::services::rings::manual(&state, &by, &run, kiln_store::Manual::Promote).await?))
}

#[utoipa::path(
    operation_id = "runs_pause",
    post, path = "/v1/workflow-runs/{run}/pause", tag = "environments",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "The run's next promotion, paused until `kiln promote`", body = api::RingPromotion),
        (status = 403, description = "Not one of the environment's approvers", body = api::ErrorBody),
        (status = 409, description = "The run ended, deploys no rings, has no promotion left, or its gate failed", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn pause(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
) -> ApiResult<Json<api::RingPromotion>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(crate::services::rings::manual(&state, &by, &run, kiln_store::Manual::Pause).await?))
}
