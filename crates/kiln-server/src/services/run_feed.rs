//! Run updates pushed over SSE (issue 17: the web UI follows the run list
//! and a run's page without each browser polling every repository).
//!
//! A feed re-reads its view (the filtered run list, or one run) when a job
//! changed or a run was accepted on this server (`AppState::job_events`),
//! and at least every [`FALLBACK`] for changes committed by another
//! replica; it sends the view only when it differs from the last one sent.
//! The first view is read before the stream starts, so a bad filter or an
//! unknown run is an HTTP error, not an event.

use crate::error::ApiResult;
use crate::services::runs::{self, ListFilter};
use crate::state::State;
use std::future::Future;
use std::time::Duration;

/// The JSON views, each one an SSE event's data.
pub(crate) type Feed = tokio_stream::wrappers::ReceiverStream<String>;

/// Re-read this often even without news (changes made by other replicas).
const FALLBACK: Duration = Duration::from_secs(3);
/// After a wake-up, wait this long so that a burst of changes (a log
/// chunk per line) is one read.
const SETTLE: Duration = Duration::from_millis(150);

/// `GET /v1/workflow-runs/events?…`: the list `GET /v1/workflow-runs?…`
/// gives, as `runs` events, whenever it changes.
pub(crate) async fn follow_list(state: &State, q: ListFilter) -> ApiResult<Feed> {
    let read = {
        let state = state.clone();
        move || {
            let (state, q) = (state.clone(), q.clone());
            async move { Ok(serde_json::to_string(&runs::list(&state, None, &q).await?).expect("json")) }
        }
    };
    follow(state, read).await
}

/// `GET /v1/workflow-runs/{run}/events`: the run as `GET
/// /v1/workflow-runs/{run}` gives it, as `run` events, whenever it changes.
pub(crate) async fn follow_run(state: &State, run: String) -> ApiResult<Feed> {
    let read = {
        let state = state.clone();
        move || {
            let (state, run) = (state.clone(), run.clone());
            async move { Ok(serde_json::to_string(&runs::get(&state, &run).await?).expect("json")) }
        }
    };
    follow(state, read).await
}

async fn follow<F, Fut>(state: &State, read: F) -> ApiResult<Feed>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ApiResult<String>> + Send + 'static,
{
    let mut events = state.job_events.subscribe();
    let mut last = read().await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
    tx.send(last.clone()).await.ok();
    tokio::spawn(async move {
        loop {
            let tick = tokio::time::sleep(FALLBACK);
            tokio::pin!(tick);
            tokio::select! {
                _ = &mut tick => {}
                m = events.recv() => match m {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        tokio::time::sleep(SETTLE).await;
                        while events.try_recv().is_ok() {}
                    }
                    Err(_) => return,
                },
                _ = tx.closed() => return,
            }
            match read().await {
                Ok(now) if now != last => {
                    if tx.send(now.clone()).await.is_err() {
                        return;
                    }
                    last = now;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("run feed: {}", e.message),
            }
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}
