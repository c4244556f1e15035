//! Lease heartbeats of one attempt (spec 000 §8).
//!
//! Every `heartbeat_interval_ms` the agent renews the lease of (job, epoch).
//! 409 stale_epoch fences the attempt at once. Transient errors are retried
//! on the next tick, but once no heartbeat has succeeded for a whole lease
//! TTL the server has fenced us (it fences expired leases before authorizing
//! a replacement), so the attempt is treated as fenced. A 503
//! `unavailable` answer (the server's database is down) is no silence:
//! nobody can fence meanwhile, and the reconciler extends the leases it
//! could not see renewed before it fences again.
//!
//! `beat_now` (see [`crate::session::Beats`]) triggers a heartbeat at once:
//! the session stream does that after a reconnect, because the server
//! shortened this attempt's lease while the stream was down.

use crate::control::{Control, Stop};
use kiln_api::client::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

#[allow(clippy::too_many_arguments)]
pub(crate) async fn heartbeat_loop(
    client: Client,
    job_id: String,
    epoch: i64,
    interval: Duration,
    lease_ttl: Duration,
    ctl: Control,
    beat_now: Arc<Notify>,
    metrics: Arc<crate::metrics::AgentMetrics>,
) {
    let interval = interval.max(Duration::from_millis(50));
    let mut lease_ttl = lease_ttl;
    let mut last_ok = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = beat_now.notified() => tracing::debug!("heartbeat requested now"),
            _ = ctl.fenced() => return,
        }
        match client.heartbeat(&job_id, epoch).await {
            Ok(resp) => {
                metrics.heartbeats.with_label_values(&["ok"]).inc();
                last_ok = Instant::now();
                if resp.lease_ttl_ms > 0 {
                    lease_ttl = Duration::from_millis(resp.lease_ttl_ms);
                }
                if resp.cancel_requested && ctl.reason().is_none() {
                    tracing::info!("cancellation requested by the server; stopping the job");
                    ctl.stop(Stop::Cancelled);
                }
            }
            Err(e) if e.is_stale_epoch() => {
                metrics.heartbeats.with_label_values(&["stale"]).inc();
                tracing::warn!(error = %e, "heartbeat refused: this attempt was fenced; killing it without completing");
                ctl.stop(Stop::Fenced);
                return;
            }
            // The server answered that its database is unavailable: nobody
            // can fence this attempt meanwhile (fencing is a database
            // transaction, and a reconciler that could not reach the
            // database extends the running leases before it fences again),
            // so this is no silence; the job keeps running and its log
            // keeps spooling until the database is back.
            Err(e) if e.status() == Some(503) && e.code() == Some(kiln_api::codes::UNAVAILABLE) => {
                last_ok = Instant::now();
                tracing::warn!(error = %e, "heartbeat not recorded: the server's database is unavailable; retrying");
            }
            Err(e) => {
                metrics.heartbeats.with_label_values(&["failed"]).inc();
                let silent = last_ok.elapsed();
                if silent >= lease_ttl {
                    tracing::error!(error = %e, silent_ms = silent.as_millis() as u64,
                        "no heartbeat succeeded for a whole lease; assuming the attempt was fenced and killing it");
                    ctl.stop(Stop::Fenced);
                    return;
                }
                tracing::warn!(error = %e, "heartbeat failed; retrying");
            }
        }
    }
}
