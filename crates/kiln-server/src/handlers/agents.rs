//! Agent registration, the claim long-poll and the session stream.

use super::body::parse;
use crate::auth::{JoinGrant, check_agent_path};
use crate::credentials::AgentCaller;
use crate::error::ApiResult;
use crate::services::agents::{self, SessionEvent};
use crate::services::claim;
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, State as S};
use axum::response::sse::{Event, Sse};
use axum::{Extension, Json};
use futures::{Stream, StreamExt};
use kiln_api as api;
use std::convert::Infallible;

/// `POST /v1/agents/register` with a join token: a new agent in the
/// token's pool, and its session credential.
#[utoipa::path(
    operation_id = "agents_register",
    post, path = "/v1/agents/register", tag = "agent",
    request_body = api::RegisterAgent,
    responses(
        (status = 200, description = "The agent, registered, and its session credential", body = api::AgentRegistration),
    ),
    security(("join_token" = [])),
)]
pub(crate) async fn register(
    S(state): S<State>,
    Extension(grant): Extension<JoinGrant>,
    body: Bytes,
) -> ApiResult<Json<api::AgentRegistration>> {
    let req: api::RegisterAgent = parse(&body)?;
    Ok(Json(agents::register(&state, &grant, req).await?))
}

/// `POST /v1/agents/{agent}/claim`: held open up to `wait_ms` (see `claim`).
#[utoipa::path(
    operation_id = "agents_claim",
    post, path = "/v1/agents/{agent}/claim", tag = "agent",
    params(
        ("agent" = String, Path, description = "The agent's id"),
    ),
    request_body = api::ClaimRequest,
    responses(
        (status = 200, description = "An assignment, or none when `wait_ms` passed without one", body = api::ClaimResponse),
    ),
    security(("agent_session" = [])),
)]
pub(crate) async fn claim(
    S(state): S<State>,
    Extension(caller): Extension<AgentCaller>,
    Path(agent_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::ClaimResponse>> {
    check_agent_path(&caller, &agent_id)?;
    let mut req: api::ClaimRequest = parse(&body)?;
    // The session is the credential's, whatever the body says.
    req.session_id = caller.session_id;
    let assignment = claim::claim(&state, &agent_id, &req).await?;
    Ok(Json(api::ClaimResponse { assignment }))
}

/// `POST /v1/agents/{agent}/drain`: the caller's session drains.
#[utoipa::path(
    operation_id = "agents_drain",
    post, path = "/v1/agents/{agent}/drain", tag = "agent",
    params(
        ("agent" = String, Path, description = "The agent's id"),
    ),
    responses(
        (status = 200, description = "The session drains", body = super::answers::Draining),
    ),
    security(("agent_session" = [])),
)]
pub(crate) async fn drain(
    S(state): S<State>,
    Extension(caller): Extension<AgentCaller>,
    Path(agent_id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    check_agent_path(&caller, &agent_id)?;
    agents::drain(&state, &agent_id, &caller.session_id).await?;
    Ok(Json(serde_json::json!({ "draining": true })))
}

/// `GET /v1/agents/{agent}/session?session_id=…`: `ping` every second,
/// `cancel` notices for the session's attempts.
/// The session is the credential's (a `session_id` query is ignored).
#[utoipa::path(
    operation_id = "agents_session",
    get, path = "/v1/agents/{agent}/session", tag = "agent",
    params(
        ("agent" = String, Path, description = "The agent's id"),
    ),
    responses(
        (status = 200, description = "Server-sent events: `ping` (data `{}`) every second, `cancel` (data: a `CancelNotice`) for the session's attempts", content_type = "text/event-stream"),
    ),
    security(("agent_session" = [])),
)]
pub(crate) async fn session(
    S(state): S<State>,
    Extension(caller): Extension<AgentCaller>,
    Path(agent_id): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    check_agent_path(&caller, &agent_id)?;
    let events = agents::session(&state, &agent_id, &caller.session_id).await?;
    Ok(Sse::new(events.map(|ev| {
        Ok(match ev {
            SessionEvent::Ping => Event::default().event("ping").data("{}"),
            SessionEvent::Cancel(notice) => Event::default().event("cancel").json_data(notice).expect("json"),
        })
    })))
}
