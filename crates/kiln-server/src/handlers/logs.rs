//! `GET /v1/jobs/{job}/logs/events`: the log feed as SSE, `id:` per event,
//! replay from `Last-Event-ID` (or `?after=`); `?follow=false` ends the
//! stream once it has caught up.

use crate::error::ApiResult;
use crate::services::log_feed::{self, FeedEvent};
use crate::state::State;
use axum::extract::{Path, Query, State as S};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use kiln_core::logs;
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;

#[derive(Deserialize)]
pub(crate) struct EventsQuery {
    after: Option<i64>,
    /// `false`: end the stream once it has caught up, even while the job
    /// still runs (what is there now); default `true`, follow to the end.
    follow: Option<bool>,
}

#[utoipa::path(
    operation_id = "logs_events",
    get, path = "/v1/jobs/{job}/logs/events", tag = "runs",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("after" = Option<i64>, Query, description = "Replay after this event id (as `Last-Event-ID`)"),
        ("follow" = Option<bool>, Query, description = "`false`: end once caught up (default `true`: follow to the job's end)"),
        ("Last-Event-ID" = Option<String>, Header, description = "Replay after this event id"),
    ),
    responses(
        (status = 200, description = "Server-sent events, each with an `id:`: `chunk` (data: a `LogEvent`), `sealed` (`LogSealed`), `gap` (`LogGap`), `end` (`LogEnd`, the last)", content_type = "text/event-stream"),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn events(
    S(state): S<State>,
    Path(job): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let cursor = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .or(q.after)
        .unwrap_or(0);
    let feed = if q.follow.unwrap_or(true) {
        log_feed::follow(&state, &job, cursor).await?.boxed()
    } else {
        log_feed::snapshot(&state, &job, cursor).await?.boxed()
    };
    let stream = feed.map(|ev| Ok(sse_event(ev)));
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

fn sse_event(ev: FeedEvent) -> Event {
    match ev {
        FeedEvent::Chunk { id, chunk } => {
            Event::default().id(id.to_string()).event(logs::event::CHUNK).json_data(chunk)
        }
        FeedEvent::Sealed { id, data } => Ok(Event::default().id(id.to_string()).event(logs::event::SEALED).data(data)),
        FeedEvent::Gap { id, data } => Ok(Event::default().id(id.to_string()).event(logs::event::GAP).data(data)),
        FeedEvent::End { id, end } => Event::default().id(id.to_string()).event(logs::event::END).json_data(end),
    }
    .expect("json")
}
