//! Background loops: the outbox relay and the reconciler. Both are
//! idempotent by construction: re-running them after a crash republishes
//! events (absorbed by the claim) or re-fences nothing.

use crate::State;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

pub async fn spawn(state: State, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    // Rebuild dispatch queues: ready jobs whose events were published before a restart.
    for ev in state.store.ready_jobs().await? {
        state.dispatcher.push(ev);
    }
    tokio::spawn(relay(state.clone(), shutdown.clone()));
    tokio::spawn(reconciler(state.clone(), shutdown.clone()));
    tokio::spawn(collector(state.clone(), shutdown.clone()));
    if state.config.dispatch_sweep > Duration::ZERO {
        // Listening before the server answers: a job made ready by another
        // replica from now on wakes this one's sweep at once.
        let wake = state.store.ready_wakeups().await?;
        tokio::spawn(sweeper(state.clone(), wake, shutdown.clone()));
    }
    tokio::spawn(archiver(state, shutdown));
    Ok(())
}

/// With several replicas: a job relayed by another replica (or by one that
/// died with it in its queue) reaches this replica's agents too. Claims stay
/// safe: the claim transaction decides, duplicates are absorbed.
///
/// The sweep runs when the store says another replica made jobs ready
/// (PostgreSQL `LISTEN/NOTIFY`; a burst of notifications while a sweep runs
/// folds into one more sweep), and every `dispatch_sweep` regardless: the
/// safety net for lost notifications and jobs whose backoff just passed.
async fn sweeper(state: State, wake: Option<Arc<Notify>>, mut shutdown: watch::Receiver<bool>) {
    async fn woken(wake: &Option<Arc<Notify>>) {
        match wake {
            Some(w) => w.notified().await,
            None => std::future::pending().await,
        }
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(state.config.dispatch_sweep) => {}
            _ = woken(&wake) => {}
            _ = shutdown.changed() => return,
        }
        match state.store.ready_jobs().await {
            Ok(events) => {
                let added = events.into_iter().filter(|ev| state.dispatcher.push(ev.clone())).count();
                if added > 0 {
                    tracing::debug!(added, "dispatch sweep queued ready jobs");
                }
            }
            Err(e) => tracing::warn!("dispatch sweep paused: {e}"),
        }
    }
}

/// Deliver committed outbox events to dispatch queues, then mark them
/// published. A crash between the two republishes: the claim absorbs it.
async fn relay(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        let notified = state.relay_wake.notified();
        match state.store.pending_outbox(500).await {
            Ok(events) if !events.is_empty() => {
                let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
                for ev in events {
                    state.dispatcher.push(ev);
                }
                if let Err(e) = state.store.mark_published(&ids).await {
                    tracing::warn!("outbox relay: cannot mark events published: {e}");
                }
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("outbox relay paused: {e}"),
        }
        // Poll now and then for events whose backoff (`available_at`) passed.
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Fence expired leases before authorizing replacements (spec 000 §8).
async fn reconciler(state: State, mut shutdown: watch::Receiver<bool>) {
    // A lease is fenced at most ~1/30 of its TTL late. Each round reads
    // every running attempt's deadline (PostgreSQL keeps no index on it, so
    // that heartbeats stay HOT updates; about 16 ms for 82,800 live leases),
    // so rounds are no more frequent than a second needs.
    let period = (state.config.lease_ttl / 30).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match state.store.fence_expired().await {
            Ok(fenced) if !fenced.is_empty() => {
                for (job, epoch) in &fenced {
                    tracing::warn!(job, epoch, "lease expired: epoch fenced");
                    let _ = state.job_events.send(job.clone());
                }
                state.relay_wake.notify_one();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("reconciler paused: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Garbage collection: unbound generations of ended attempts (fenced,
/// failed, or superseded) are deleted after the grace period; bound
/// generations are never touched here.
async fn collector(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(state.config.gc_interval) => {}
            _ = shutdown.changed() => return,
        }
        let grace = state.config.gc_grace.as_millis() as i64;
        match state.store.collectable_generations(grace, 100).await {
            Ok(gens) => {
                for g in gens {
                    // An unfinished S3 multipart upload keeps its parts until aborted.
                    if let (kiln_blob::BlobStore::S3(s3), false) = (&state.blob, g.upload_id.is_empty())
                        && let Err(e) = s3.abort_upload(&g.object_key, &g.upload_id).await
                    {
                        tracing::warn!(generation = %g.id, "cannot abort the artifact's multipart upload: {e}");
                        continue;
                    }
                    if let Err(e) = state.blob.delete(&g.object_key).await {
                        tracing::warn!(generation = %g.id, "cannot delete artifact bytes: {e}");
                        continue;
                    }
                    match state.store.mark_generation_deleted(&g.id).await {
                        Ok(()) => {
                            tracing::info!(generation = %g.id, job = %g.job_id, epoch = g.epoch, name = %g.name, "collected unbound artifact generation")
                        }
                        Err(e) => tracing::warn!(generation = %g.id, "cannot mark generation deleted: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("garbage collector paused: {e}"),
        }
    }
}

/// Log archival: finished jobs' logs move from the hot journal to the
/// object store (segment + index), trimmed only once stored. A failure
/// leaves the journal as it was and is retried on the next round.
async fn archiver(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(state.config.log_archive_interval) => {}
            _ = shutdown.changed() => return,
        }
        let after = state.config.log_archive_after.as_millis() as i64;
        let jobs = match state.store.logs_to_archive(after, 50).await {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!("log archiver paused: {e}");
                continue;
            }
        };
        for job in jobs {
            if let Err(e) = crate::logarchive::archive_job(&state, &job).await {
                tracing::warn!(job, "cannot archive log (kept in the journal; will retry): {e:#}");
            }
        }
    }
}
