//! The agent session stream (fast loss detection).
//!
//! For the agent's lifetime one task holds `GET /v1/agents/{id}/session`
//! open, reading its pings to the end. When the connection drops, the
//! server shortens the leases of this session's attempts to a short grace;
//! so on every successful reconnect after the first, the task asks every
//! running attempt to heartbeat *now* (see [`Beats`]), which restores the
//! full lease before the grace runs out.
//!
//! Reconnects are quick (100 ms growing to at most 1 s). A connection that
//! delivers nothing for [`SILENCE_LIMIT`] is treated as lost (a half-open
//! TCP connection never reports EOF).
//!
//! A 404 or 410 with an API error body means the server no longer knows
//! this agent or session (e.g. its data was reset): the task registers again
//! exactly as the claim slots do (once per stale session, shared), then
//! connects with the new session. A 404 *without* an API body means the
//! server has no session endpoint at all (an older server): the task logs it
//! and retries every 30 s, leaving leases to regular heartbeats.

use crate::control::backoff;
use crate::{Agent, reregister};
use kiln_api::types::SESSION_PING_MS;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A connection that sent nothing for this long is considered lost.
pub(crate) const SILENCE_LIMIT: Duration = Duration::from_millis(5 * SESSION_PING_MS);
/// The SSE line announcing a cancellation of one of this session's attempts.
const CANCEL_EVENT: &[u8] = b"event: cancel";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A connection that lived this long resets the reconnect backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// "Heartbeat now" triggers of the running attempts.
#[derive(Clone, Default)]
pub(crate) struct Beats {
    next: Arc<AtomicU64>,
    running: Arc<Mutex<HashMap<u64, Arc<Notify>>>>,
}

/// Keeps an attempt's trigger registered; removes it when dropped.
pub(crate) struct BeatGuard {
    id: u64,
    beats: Beats,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for BeatGuard {
    fn drop(&mut self) {
        self.beats.running.lock().expect("beats").remove(&self.id);
    }
}

impl Beats {
    pub(crate) fn register(&self) -> BeatGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        self.running.lock().expect("beats").insert(id, notify.clone());
        BeatGuard { id, beats: self.clone(), notify }
    }

    /// Asks every running attempt to heartbeat at once. A heartbeat loop
    /// busy with a request keeps the permit and beats again right after.
    pub(crate) fn beat_all(&self) -> usize {
        let running = self.running.lock().expect("beats");
        for n in running.values() {
            n.notify_one();
        }
        running.len()
    }
}

/// Runs until aborted: `run` aborts it once every slot ended, so the stream
/// stays open while attempts are still being stopped and completed at
/// shutdown (a drop would shorten their leases).
pub(crate) async fn session_loop(agent: Arc<Agent>) {
    let mut connected_before = false;
    let mut failures: u32 = 0;
    let mut missing_endpoint_logged = false;
    loop {
        let reg = agent.registration.lock().await.clone();
        let opened = agent.client.with_token(&reg.credential).open_session(&reg.agent_id, &reg.session_id).await;
        let delay = match opened {
            Ok(mut resp) => {
                if connected_before {
                    let n = agent.ctx.beats.beat_all();
                    tracing::info!(
                        running_attempts = n,
                        "session stream reconnected; heartbeating running attempts now"
                    );
                } else {
                    tracing::debug!("session stream connected");
                }
                connected_before = true;
                let since = Instant::now();
                let mut tail: Vec<u8> = Vec::new();
                let why = loop {
                    match tokio::time::timeout(SILENCE_LIMIT, resp.chunk()).await {
                        Ok(Ok(Some(bytes))) => {
                            // A `cancel` notice: heartbeat now, and the heartbeat's
                            // `cancel_requested` (the one authority) stops the attempt.
                            tail.extend_from_slice(&bytes);
                            if contains(&tail, CANCEL_EVENT) {
                                let n = agent.ctx.beats.beat_all();
                                tracing::info!(running_attempts = n, "cancel notice received; heartbeating now");
                                tail.clear();
                            }
                            let keep = tail.len().saturating_sub(CANCEL_EVENT.len());
                            tail.drain(..keep);
                        }
                        Ok(Ok(None)) => break "the server closed it".to_string(),
                        Ok(Err(e)) => break e.to_string(),
                        Err(_) => {
                            break format!("no ping for {} ms", SILENCE_LIMIT.as_millis());
                        }
                    }
                };
                if since.elapsed() >= STABLE_AFTER {
                    failures = 0;
                }
                failures += 1;
                let delay = backoff(failures, 100, 1_000);
                tracing::warn!(reason = %why, retry_in_ms = delay.as_millis() as u64, "session stream lost; reconnecting");
                delay
            }
            Err(e) if matches!(e.status(), Some(401 | 404 | 410)) && e.code() != Some("http") => {
                tracing::warn!(error = %e, "the server no longer knows this agent session; registering again");
                reregister(&agent, &reg.session_id).await;
                failures += 1;
                backoff(failures, 100, 1_000)
            }
            Err(e) if e.status() == Some(404) => {
                if !missing_endpoint_logged {
                    tracing::warn!(error = %e, "the server has no session stream endpoint; relying on heartbeats alone");
                    missing_endpoint_logged = true;
                }
                Duration::from_secs(30)
            }
            Err(e) => {
                failures += 1;
                let delay = backoff(failures, 100, 1_000);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot open the session stream; retrying");
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn beat_all_reaches_registered_attempts_until_they_end() {
        let beats = Beats::default();
        let a = beats.register();
        let b = beats.register();
        assert_eq!(beats.beat_all(), 2);
        // The permit is stored: a loop that was busy beats right after.
        tokio::time::timeout(Duration::from_secs(5), a.notify.notified()).await.unwrap();
        drop(b);
        assert_eq!(beats.beat_all(), 1);
        drop(a);
        assert_eq!(beats.beat_all(), 0);
    }
}
