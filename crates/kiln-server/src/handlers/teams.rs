//! Teams, priority lanes and the queue (issue 44): `kiln team`, `kiln
//! priority`, `kiln queue`. Writes are an admin's (the read scope reads).

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::{queue, runs, teams};
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State as S};
use axum::http::StatusCode;
use kiln_api as api;

#[utoipa::path(
    operation_id = "teams_list",
    get, path = "/v1/teams", tag = "teams",
    responses((status = 200, description = "Every team, by name", body = api::TeamList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(S(state): S<State>) -> ApiResult<Json<api::TeamList>> {
    Ok(Json(teams::list(&state).await?))
}

#[utoipa::path(
    operation_id = "teams_create",
    post, path = "/v1/teams", tag = "teams",
    request_body(content = api::CreateTeam, content_type = "application/json"),
    responses(
        (status = 201, description = "The team", body = api::Team),
        (status = 409, description = "A team of that name exists", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn create(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Team>)> {
    let req: api::CreateTeam = parse(&body)?;
    Ok((StatusCode::CREATED, Json(teams::create(&state, &by, req).await?)))
}

#[utoipa::path(
    operation_id = "teams_get",
    get, path = "/v1/teams/{team}", tag = "teams",
    params(("team" = String, Path, description = "The team's name")),
    responses((status = 200, description = "The team", body = api::Team)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn get(S(state): S<State>, Path(team): Path<String>) -> ApiResult<Json<api::Team>> {
    Ok(Json(teams::view(state.store.get_team(&team).await?)))
}

#[utoipa::path(
    operation_id = "teams_update",
    patch, path = "/v1/teams/{team}", tag = "teams",
    params(("team" = String, Path, description = "The team's name")),
    request_body(content = api::UpdateTeam, content_type = "application/json"),
    responses((status = 200, description = "The team; the dispatcher applies it within a second", body = api::Team)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn update(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(team): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Team>> {
    let req: api::UpdateTeam = parse(&body)?;
    Ok(Json(teams::update(&state, &by, &team, req).await?))
}

#[utoipa::path(
    operation_id = "teams_delete",
    delete, path = "/v1/teams/{team}", tag = "teams",
    params(("team" = String, Path, description = "The team's name")),
    responses(
        (status = 200, description = "The team, removed", body = api::Team),
        (status = 409, description = "It still has repositories, or it is `default`", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn delete(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(team): Path<String>,
) -> ApiResult<Json<api::Team>> {
    Ok(Json(teams::delete(&state, &by, &team).await?))
}

#[utoipa::path(
    operation_id = "queue_get",
    get, path = "/v1/queue", tag = "teams",
    responses((status = 200, description = "Live jobs per team × lane × class, and each team's share", body = api::QueueView)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn queue_view(S(state): S<State>) -> ApiResult<Json<api::QueueView>> {
    Ok(Json(queue::view(&state).await?))
}

#[utoipa::path(
    operation_id = "runs_set_priority",
    post, path = "/v1/workflow-runs/{run}/priority", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    request_body(content = api::SetPriority, content_type = "application/json"),
    responses(
        (status = 200, description = "The run in its new lane (its ready jobs queued again in it)", body = api::Run),
        (status = 409, description = "The run has ended", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn set_priority(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::Run>> {
    let req: api::SetPriority = parse(&body)?;
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(teams::set_priority(&state, &by, &run, &req.priority).await?))
}
