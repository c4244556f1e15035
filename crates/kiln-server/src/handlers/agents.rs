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
pub(crate) async fn register(
    S(state): S<State>,
    Extension(grant): Extension<JoinGrant>,
    body: Bytes,
) -> ApiResult<Json<api::AgentRegistration>> {
    let req: api::RegisterAgent = parse(&body)?;
    Ok(Json(agents::register(&state, &grant, req).await?))
}

/// `POST /v1/agents/{agent}/claim`: held open up to `wait_ms` (see `claim`).
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
