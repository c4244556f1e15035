//! Agent registration, the claim long-poll and the session stream.

use super::body::parse;
use crate::error::ApiResult;
use crate::services::agents::{self, SessionEvent};
use crate::services::claim;
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::response::sse::{Event, Sse};
use futures::{Stream, StreamExt};
use kiln_api as api;
use serde::Deserialize;
use std::convert::Infallible;

pub(crate) async fn register(S(state): S<State>, body: Bytes) -> ApiResult<Json<api::AgentRegistration>> {
    let req: api::RegisterAgent = parse(&body)?;
    Ok(Json(agents::register(&state, req).await?))
}

/// `POST /v1/agents/{agent}/claim`: held open up to `wait_ms` (see `claim`).
pub(crate) async fn claim(
    S(state): S<State>,
    Path(agent_id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<api::ClaimResponse>> {
    let req: api::ClaimRequest = parse(&body)?;
    let assignment = claim::claim(&state, &agent_id, &req).await?;
    Ok(Json(api::ClaimResponse { assignment }))
}

#[derive(Deserialize)]
pub(crate) struct SessionQuery {
    session_id: String,
}

/// `GET /v1/agents/{agent}/session?session_id=…`: `ping` every second,
/// `cancel` notices for the session's attempts.
pub(crate) async fn session(
    S(state): S<State>,
    Path(agent_id): Path<String>,
    Query(q): Query<SessionQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let events = agents::session(&state, &agent_id, &q.session_id).await?;
    Ok(Sse::new(events.map(|ev| {
        Ok(match ev {
            SessionEvent::Ping => Event::default().event("ping").data("{}"),
            SessionEvent::Cancel(notice) => Event::default().event("cancel").json_data(notice).expect("json"),
        })
    })))
}
