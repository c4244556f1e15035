//! One round of each background job of the server, returning how much it
//! did. The timers in `loops` only call these; tests call them directly
//! (`App::run_pending_work`) instead of sleeping.
//!
//! Every round is idempotent by construction: re-running one after a crash
//! republishes events (absorbed by the claim, spec 000 §7, §15), re-fences
//! nothing (spec 000 §8), re-archives nothing already trimmed (§13).

use crate::services::log_archive;
use crate::state::AppState;
use kiln_store::StoreError;

/// Outbox events delivered per round.
pub(crate) const RELAY_BATCH: u32 = 500;
/// Generations collected per round.
const COLLECT_BATCH: u32 = 100;
/// Jobs whose logs are archived per round.
const ARCHIVE_BATCH: u32 = 50;

/// Deliver committed outbox events to dispatch queues, then mark them
/// published. A crash between the two republishes: the claim absorbs it.
pub(crate) async fn relay_once(state: &AppState) -> Result<usize, StoreError> {
    let events = state.store.pending_outbox(RELAY_BATCH).await?;
    if events.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    for ev in events {
        state.dispatcher.push(ev);
    }
    state.store.mark_published(&ids).await?;
    Ok(ids.len())
}

/// Fence expired leases before authorizing replacements (spec 000 §8); the
/// store decides expiry on the database clock.
pub(crate) async fn fence_once(state: &AppState) -> Result<usize, StoreError> {
    let fenced = state.store.fence_expired().await?;
    let m = &state.metrics;
    m.attempts_finished.with_label_values(&["lost"]).inc_by(fenced.len() as u64);
    // Each fenced epoch's log ends with a gap marker (spec 000 §13).
    m.log_gaps.with_label_values(&["agent_lost"]).inc_by(fenced.len() as u64);
    for (job, epoch) in &fenced {
        tracing::warn!(job, epoch, "lease expired: epoch fenced");
        state.job_changed(job);
        // Fencing is rare: one read tells whether the job retries or ended.
        let status = state.store.get_job(job).await.map(|j| j.status.as_str().to_string()).unwrap_or_default();
        m.failed_attempt(kiln_core::failure::FailureClass::AgentLost, &status);
        m.job_finished(&status);
    }
    if !fenced.is_empty() {
        // A fenced job may be ready again: its event is in the outbox.
        state.relay_wake.notify_one();
    }
    Ok(fenced.len())
}

/// How long a ready job another replica offers waits before this replica's
/// idle agents may try it (its owner's agents are busy or cannot run it, or
/// the owner died and its offer lease has not lapsed yet).
pub(crate) const SPARE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Queue every job that is ready now that this replica offers (a replica's
/// sweep, and the rebuild of the queues at start); the others are noted and
/// become spare after [`SPARE_AFTER`]. A (job, generation) already queued
/// adds nothing.
pub(crate) async fn sweep_once(state: &AppState) -> Result<usize, StoreError> {
    let events = state.store.ready_jobs().await?;
    Ok(state.dispatcher.sweep(events, SPARE_AFTER))
}

/// [`sweep_once`] for the jobs a ready notification named (the ready ones
/// among them), leaving the rest of what the dispatcher knows as it is.
pub(crate) async fn sweep_jobs(state: &AppState, job_ids: &[String]) -> Result<usize, StoreError> {
    let events = state.store.ready_jobs_of(job_ids).await?;
    Ok(state.dispatcher.sweep_some(events))
}

/// A grace period measured on the server clock, in the database clock's
/// frame (the store compares against its own "now").
fn grace_ms(state: &AppState, grace: std::time::Duration) -> i64 {
    grace.as_millis() as i64 - state.clock.ahead_of_database_ms()
}

/// Garbage collection: unbound generations of ended attempts (fenced,
/// failed, or superseded) are deleted after the grace period; bound
/// generations are never touched (invariant 4). A generation whose bytes
/// cannot be deleted now is left for a later round.
pub(crate) async fn collect_once(state: &AppState) -> Result<usize, StoreError> {
    let grace = grace_ms(state, state.config.gc_grace);
    // Evicted cache entries leave their bytes unbound: collected below.
    let mut collected = crate::services::caches::evict_once(state).await?;
    for g in state.store.collectable_generations(grace, COLLECT_BATCH).await? {
        // An unfinished S3 multipart upload keeps its parts until aborted.
        if let (kiln_blob::BlobStore::S3(s3), false) = (&state.blob, g.upload_id.is_empty())
            && let Err(e) = s3.abort_upload(&g.session_key, &g.upload_id).await
        {
            tracing::warn!(generation = %g.id, "cannot abort the artifact's multipart upload: {e}");
            continue;
        }
        // Its own bytes only: a content object it referenced is shared, and
        // goes once nothing references it (below).
        if let Err(e) = state.blob.delete(&g.session_key).await {
            tracing::warn!(generation = %g.id, "cannot delete artifact bytes: {e}");
            continue;
        }
        match state.store.mark_generation_deleted(&g.id).await {
            Ok(()) => {
                collected += 1;
                tracing::info!(generation = %g.id, job = %g.job_id, epoch = g.epoch, name = %g.name, "collected unbound artifact generation")
            }
            Err(e) => tracing::warn!(generation = %g.id, "cannot mark generation deleted: {e}"),
        }
    }
    collected += expire_once(state).await?;
    collected += collect_content_once(state, grace).await?;
    collected += retire_sessions_once(state).await?;
    collected += migrate_content_once(state).await?;
    // Issue 43: reports staged by attempts that never bound them.
    let reports = state.store.collect_staged_reports(grace, COLLECT_BATCH).await?;
    if reports > 0 {
        tracing::info!(reports, "collected test reports of attempts that never bound them");
    }
    Ok(collected + reports as usize)
}

/// Retention (issue 16): bound artifacts of ended runs past their
/// `expires_at` are first marked expired (readers get 410 from then on,
/// never a capability for bytes being deleted), then their bytes are
/// deleted and the generation marked so; the binding row stays. Bytes that
/// cannot be deleted now are retried on a later round.
pub(crate) async fn expire_once(state: &AppState) -> Result<usize, StoreError> {
    let mut expired = 0;
    for b in state.store.expirable_artifacts(COLLECT_BATCH).await? {
        let g = &b.generation;
        if !state.store.expire_artifact(&g.id).await? {
            continue;
        }
        // A content object is shared: it goes once nothing references it.
        let own = if g.content_addressed() { Ok(()) } else { state.blob.delete(&g.object_key).await };
        match own {
            Ok(()) | Err(kiln_blob::BlobError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(generation = %g.id, "cannot delete expired artifact bytes (will retry): {e}");
                continue;
            }
        }
        state.store.mark_expired_deleted(&g.id).await?;
        expired += 1;
        tracing::info!(generation = %g.id, job = %b.job_name, name = %b.name, run = %g.run_id, "expired artifact");
    }
    Ok(expired)
}

/// Log archival: finished jobs' logs move from the hot journal to the
/// object store (segment + index), trimmed only once stored. A job that
/// fails keeps its journal and is retried on a later round.
pub(crate) async fn archive_once(state: &AppState) -> Result<usize, StoreError> {
    let grace = grace_ms(state, state.config.log_archive_after);
    let mut archived = 0;
    for job in state.store.logs_to_archive(grace, ARCHIVE_BATCH).await? {
        match log_archive::archive_job(state, &job).await {
            Ok(done) => {
                let bytes: i64 = done.iter().map(|a| a.bytes).sum();
                state.metrics.log_archived_bytes.inc_by(bytes.max(0) as u64);
                archived += 1;
            }
            Err(e) => tracing::warn!(job, "cannot archive log (kept in the journal; will retry): {e:#}"),
        }
    }
    // Log objects (PostgreSQL) whose chunks are all archived now.
    if let Err(e) = state.store.collect_log_objects(kiln_store::LOG_OBJECT_ORPHAN_AGE_MS, ARCHIVE_BATCH).await {
        tracing::warn!("cannot collect log objects (will retry): {e}");
    }
    Ok(archived)
}

/// Content objects (issue 45) that no generation references any more:
/// marked `deleting` (a seal meeting it waits), their bytes deleted, their
/// row removed. One whose bytes cannot be deleted now stays `deleting` and
/// is retried on a later round.
async fn collect_content_once(state: &AppState, grace: i64) -> Result<usize, StoreError> {
    let mut collected = 0;
    for sha in state.store.collectable_content(grace, COLLECT_BATCH).await? {
        if !state.store.begin_content_delete(&sha, grace).await? {
            continue;
        }
        if let Err(e) = state.blob.delete(&kiln_store::content_key(&sha)).await {
            tracing::warn!(sha256 = %sha, "cannot delete unreferenced artifact bytes (will retry): {e}");
            continue;
        }
        state.store.content_deleted(&sha).await?;
        collected += 1;
        tracing::info!(sha256 = %sha, "collected artifact bytes nothing references");
    }
    Ok(collected)
}

/// The old bytes of generations moved to their content object, once no
/// download handed out before the move can read them any more.
async fn retire_sessions_once(state: &AppState) -> Result<usize, StoreError> {
    let mut retired = 0;
    for g in state.store.retirable_sessions(COLLECT_BATCH).await? {
        if g.session_key != g.object_key
            && let Err(e) = state.blob.delete(&g.session_key).await
        {
            tracing::warn!(generation = %g.id, "cannot delete an artifact's old bytes (will retry): {e}");
            continue;
        }
        state.store.session_retired(&g.id).await?;
        retired += 1;
    }
    Ok(retired)
}

/// Generations sealed before content addressing: their bytes are checked
/// against their sha256 and copied to their content object, which they
/// then read; the old bytes are deleted once every download capability
/// handed out before could have been used. A generation whose bytes do not
/// verify is left as it is (and said).
async fn migrate_content_once(state: &AppState) -> Result<usize, StoreError> {
    const MIGRATE_BATCH: u32 = 20;
    let mut moved = 0;
    for g in state.store.migratable_generations(MIGRATE_BATCH).await? {
        let size = g.expected_size.max(0) as u64;
        if !state.blob.content_addressable(size) {
            continue;
        }
        let key = kiln_store::content_key(&g.expected_sha256);
        let expected = kiln_blob::ObjectInfo { size, sha256: g.expected_sha256.clone() };
        state.store.touch_content(&g.expected_sha256, g.expected_size).await?;
        if let Err(e) = state.blob.copy_to_content(&g.object_key, &key, &expected).await {
            tracing::warn!(generation = %g.id, "cannot move artifact bytes to their content key: {e}");
            continue;
        }
        let retire_after = crate::services::artifacts::DOWNLOAD_CAP_MS + 60_000;
        if state.store.move_to_content(&g.id, &g.object_key, retire_after).await? {
            moved += 1;
            tracing::info!(generation = %g.id, sha256 = %g.expected_sha256, "artifact bytes moved to their content key");
        }
    }
    Ok(moved)
}
