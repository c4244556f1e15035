//! Artifact generations and bindings (spec 000 §9, §12, invariant 4): an
//! upload is a candidate generation of one attempt, under a fresh object key;
//! only the completion transaction (`complete.rs`) binds generations as the
//! job's outputs; unbound generations are collected, never substituted.

use crate::db::{Exec, now};
use crate::dialect::{GenerationState, Isolation, Sql, Word, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::{BoundArtifact, GENERATION_KINDS, GenerationRecord, NewGeneration};
use crate::rows::{BINDING_COLS, GEN_COLS, bound_from_row, gen_from_row, load_run, new_id};
use crate::store::{SqlStore, lock_job};
use crate::tx::attempt::require_live;
use kiln_core::lease::{AttemptLease, check_live};
use kiln_core::{AttemptOutcome, RunStatus};

fn valid_sha(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// `ArtifactStore::open_generation` (and `create_generation`, of kind `file`).
pub(crate) async fn create_generation(
    store: &SqlStore,
    job_id: &str,
    epoch: i64,
    g: NewGeneration<'_>,
) -> Result<GenerationRecord> {
    static CREATE: Sql = Sql::new(|_| {
        format!(
            "INSERT INTO artifact_generations (id, run_id, job_id, epoch, name, object_key, expected_size, \
             expected_sha256, part_size, state, created_at, kind) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {uploading}, $10, $11)",
            uploading = lit(GenerationState::Uploading)
        )
    });
    let NewGeneration { name, size, sha256, part_size, kind } = g;
    if !(sha256.is_empty() || valid_sha(sha256)) || size < 0 || part_size <= 0 {
        return Err(StoreError::Invalid(
            "size must be ≥ 0 and sha256 64 lowercase hex digits (or empty: named at seal)".into(),
        ));
    }
    if !GENERATION_KINDS.contains(&kind) {
        return Err(StoreError::Invalid(format!("artifact kind `{kind}` is not one of {GENERATION_KINDS:?}")));
    }
    let id = &new_id();
    store
        .transaction(
            Isolation::Serializable,
            &(id, job_id, epoch, name, size, sha256, part_size, kind),
            |tx, &(id, job_id, epoch, name, size, sha256, part_size, kind)| {
                Box::pin(async move {
                    lock_job(tx, job_id).await?;
                    let (job, _, now) = require_live(tx, job_id, epoch).await?;
                    let run = load_run(tx, &job.run_id).await?;
                    let declared = run.definition.jobs.get(job.index as usize).is_some_and(|j| {
                        j.artifacts.publish.iter().any(|p| p.name == name)
                            || (name == crate::tx::caches::CACHE_ARTIFACT && j.cache.is_some())
                    });
                    if !declared {
                        return Err(StoreError::Invalid(format!(
                            "job `{}` does not declare an artifact `{name}`",
                            job.name
                        )));
                    }
                    // A fresh key per session: a stale attempt can never overwrite
                    // another generation's bytes.
                    let key = format!("artifacts/{}/{}/{epoch}/{id}", run.id, job.id);
                    tx.sql(&CREATE)
                        .bind(id)
                        .bind(&run.id)
                        .bind(job_id)
                        .bind(epoch)
                        .bind(name)
                        .bind(&key)
                        .bind(size)
                        .bind(sha256)
                        .bind(part_size)
                        .bind(now)
                        .bind(kind)
                        .execute()
                        .await?;
                    Ok(())
                })
            },
        )
        .await?;
    get_generation(store, id).await
}

/// `ArtifactStore::get_generation`.
pub(crate) async fn get_generation(store: &SqlStore, id: &str) -> Result<GenerationRecord> {
    static GET: Sql = Sql::new(|_| format!("SELECT {GEN_COLS} FROM artifact_generations g WHERE g.id = $1"));
    // The writer: a caller reads back what it just wrote.
    let row = store.writer().await?.sql(&GET).bind(id).fetch_optional().await?;
    gen_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?)
}

/// `ArtifactStore::set_generation_digest`.
pub(crate) async fn set_generation_digest(
    store: &SqlStore,
    id: &str,
    job_id: &str,
    epoch: i64,
    sha256: &str,
) -> Result<GenerationRecord> {
    static CURRENT: Sql = Sql::new(|_| {
        format!(
            "SELECT expected_sha256 FROM artifact_generations WHERE id = $1 AND job_id = $2 AND epoch = $3 \
             AND state = {uploading}",
            uploading = lit(GenerationState::Uploading)
        )
    });
    if !valid_sha(sha256) {
        return Err(StoreError::Invalid("sha256 must be 64 lowercase hex digits".into()));
    }
    store
        .transaction(Isolation::Serializable, &(id, job_id, epoch, sha256), |tx, &(id, job_id, epoch, sha256)| {
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                require_live(tx, job_id, epoch).await?;
                let current: Option<String> =
                    tx.sql(&CURRENT).bind(id).bind(job_id).bind(epoch).scalar_optional().await?;
                match current.as_deref() {
                    None => {
                        return Err(StoreError::NotFound(format!("upload session {id} of job {job_id} epoch {epoch}")));
                    }
                    Some("") => {
                        tx.sql("UPDATE artifact_generations SET expected_sha256 = $1 WHERE id = $2")
                            .bind(sha256)
                            .bind(id)
                            .execute()
                            .await?;
                    }
                    Some(d) if d == sha256 => {}
                    Some(d) => {
                        return Err(StoreError::Conflict(format!(
                            "upload session {id} was opened for sha256 {d}, not {sha256}"
                        )));
                    }
                }
                Ok(())
            })
        })
        .await?;
    get_generation(store, id).await
}

/// `ArtifactStore::uploadable_generation`: a read, before accepting part bytes.
pub(crate) async fn uploadable_generation(store: &SqlStore, id: &str) -> Result<GenerationRecord> {
    static GET: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS}, j.current_epoch, a.outcome, a.lease_deadline FROM artifact_generations g \
             JOIN jobs j ON j.id = g.job_id JOIN attempts a ON a.job_id = g.job_id AND a.epoch = g.epoch \
             WHERE g.id = $1"
        )
    });
    let (now, row) = store
        .read(id, |tx, id| {
            Box::pin(async move {
                let now = now(tx).await?;
                Ok((now, tx.sql(&GET).bind(id).fetch_optional().await?))
            })
        })
        .await?;
    let row = row.ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?;
    let g = gen_from_row(&row)?;
    let current: i64 = row.get("current_epoch")?;
    let lease = AttemptLease { outcome: parse_enum(row.str("outcome")?)?, lease_deadline: row.get("lease_deadline")? };
    if check_live(g.epoch, current, Some(lease), now).is_err() {
        return Err(StoreError::StaleEpoch(format!(
            "epoch {} of job {} is no longer the live attempt: its upload session is closed",
            g.epoch, g.job_id
        )));
    }
    if g.state != GenerationState::Uploading.word() {
        return Err(StoreError::Conflict(format!("artifact generation {id} is {}", g.state)));
    }
    Ok(g)
}

/// `ArtifactStore::set_generation_upload`.
pub(crate) async fn set_generation_upload(store: &SqlStore, id: &str, upload_id: &str) -> Result<String> {
    static SET: Sql = Sql::new(|_| {
        format!(
            "UPDATE artifact_generations SET upload_id = $1 WHERE id = $2 AND upload_id = '' AND state = {uploading}",
            uploading = lit(GenerationState::Uploading)
        )
    });
    if upload_id.is_empty() {
        return Err(StoreError::Invalid("an upload id is not empty".into()));
    }
    let mut conn = store.writer().await?;
    conn.sql(&SET).bind(upload_id).bind(id).execute().await?;
    let row: Option<(String, String)> =
        conn.sql("SELECT upload_id, state FROM artifact_generations WHERE id = $1").bind(id).optional().await?;
    let (winner, state) = row.ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?;
    if state != GenerationState::Uploading.word() {
        return Err(StoreError::Conflict(format!("artifact generation {id} is {state}")));
    }
    Ok(winner)
}

/// `ArtifactStore::seal_generation`: requires the current live epoch.
pub(crate) async fn seal_generation(store: &SqlStore, id: &str, job_id: &str, epoch: i64) -> Result<GenerationRecord> {
    // A repeated seal (lost response) keeps the first sealing time, so it
    // never changes which generation the completion binds.
    static SEAL: Sql = Sql::new(|_| {
        format!(
            "UPDATE artifact_generations SET state = {sealed}, sealed_at = COALESCE(sealed_at, $1) \
             WHERE id = $2 AND job_id = $3 AND epoch = $4 AND state IN ({uploading}, {sealed}) \
             AND expected_sha256 != ''",
            sealed = lit(GenerationState::Sealed),
            uploading = lit(GenerationState::Uploading),
        )
    });
    store
        .transaction(Isolation::Serializable, &(id, job_id, epoch), |tx, &(id, job_id, epoch)| {
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                let (_, _, now) = require_live(tx, job_id, epoch).await?;
                let sealed = tx.sql(&SEAL).bind(now).bind(id).bind(job_id).bind(epoch).execute().await?;
                if sealed == 0 {
                    return Err(StoreError::NotFound(format!("upload session {id} of job {job_id} epoch {epoch}")));
                }
                Ok(())
            })
        })
        .await?;
    get_generation(store, id).await
}

/// `ArtifactStore::fail_generation`.
pub(crate) async fn fail_generation(store: &SqlStore, id: &str, message: &str) -> Result<()> {
    static FAIL: Sql = Sql::new(|_| {
        format!(
            "UPDATE artifact_generations SET state = {failed}, message = $1 WHERE id = $2 AND state = {uploading}",
            failed = lit(GenerationState::Failed),
            uploading = lit(GenerationState::Uploading),
        )
    });
    store.writer().await?.sql(&FAIL).bind(message).bind(id).execute().await?;
    Ok(())
}

/// `ArtifactStore::resolve_binding`.
pub(crate) async fn resolve_binding(
    store: &SqlStore,
    run_id: &str,
    job_name: &str,
    name: &str,
) -> Result<BoundArtifact> {
    static RESOLVE: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS}, {BINDING_COLS} FROM artifact_bindings b JOIN jobs j ON j.id = b.job_id \
             JOIN artifact_generations g ON g.id = b.generation_id \
             WHERE b.run_id = $1 AND (j.name = $2 OR j.id = $2) AND b.name = $3"
        )
    });
    let row = store.reader().await?.sql(&RESOLVE).bind(run_id).bind(job_name).bind(name).fetch_optional().await?;
    bound_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("artifact `{job_name}/{name}` of run {run_id}")))?)
}

/// `ArtifactStore::run_bindings`.
pub(crate) async fn run_bindings(store: &SqlStore, run_id: &str) -> Result<Vec<BoundArtifact>> {
    static BINDINGS: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS}, {BINDING_COLS} FROM artifact_bindings b JOIN jobs j ON j.id = b.job_id \
             JOIN artifact_generations g ON g.id = b.generation_id WHERE b.run_id = $1 ORDER BY j.job_index, b.name"
        )
    });
    let rows = store.reader().await?.sql(&BINDINGS).bind(run_id).fetch_all().await?;
    rows.iter().map(bound_from_row).collect()
}

/// `ArtifactStore::collectable_generations`.
pub(crate) async fn collectable_generations(
    store: &SqlStore,
    grace_ms: i64,
    limit: u32,
) -> Result<Vec<GenerationRecord>> {
    static COLLECTABLE: Sql = Sql::new(|d| {
        format!(
            "SELECT {GEN_COLS} FROM artifact_generations g JOIN attempts a ON a.job_id = g.job_id AND a.epoch = g.epoch \
             WHERE g.state != {deleted} AND a.outcome != {running} \
             AND NOT EXISTS (SELECT 1 FROM artifact_bindings b WHERE b.generation_id = g.id) \
             AND NOT EXISTS (SELECT 1 FROM cache_entries c WHERE c.generation_id = g.id) \
             AND COALESCE(a.finished_at, g.created_at) <= {now} - $1 \
             ORDER BY g.created_at LIMIT $2",
            deleted = lit(GenerationState::Deleted),
            running = lit(AttemptOutcome::Running),
            now = d.now_ms,
        )
    });
    let rows = store.reader().await?.sql(&COLLECTABLE).bind(grace_ms).bind(limit as i64).fetch_all().await?;
    rows.iter().map(gen_from_row).collect()
}

/// `ArtifactStore::mark_generation_deleted`: never a bound generation (nor
/// one a cache entry names), whatever the caller thought.
pub(crate) async fn mark_generation_deleted(store: &SqlStore, id: &str) -> Result<()> {
    static DELETED: Sql = Sql::new(|d| {
        format!(
            "UPDATE artifact_generations SET state = {deleted}, deleted_at = {now} WHERE id = $1 \
             AND NOT EXISTS (SELECT 1 FROM artifact_bindings b WHERE b.generation_id = artifact_generations.id) \
             AND NOT EXISTS (SELECT 1 FROM cache_entries c WHERE c.generation_id = artifact_generations.id)",
            deleted = lit(GenerationState::Deleted),
            now = d.now_ms,
        )
    });
    store.writer().await?.sql(&DELETED).bind(id).execute().await?;
    Ok(())
}

/// Whether generation `generation` (an SQL expression) still has a live
/// binding: not expired, and not yet past its `expires_at` or of a run
/// that has not ended (a retry pinning it, a run whose jobs may restore
/// it), or pinned by a deployment (issue 46: a rollback restores it).
/// Such a generation is never expired (spec 000 §12).
fn live_binding(generation: &str, now: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM artifact_bindings l JOIN runs lr ON lr.id = l.run_id \
         WHERE l.generation_id = {generation} AND l.expired_at IS NULL \
         AND (l.expires_at IS NULL OR l.expires_at > {now} OR lr.status NOT IN ({success}, {failed}, {cancelled}))) \
         OR EXISTS (SELECT 1 FROM deployment_pins dp WHERE dp.generation_id = {generation}))",
        success = lit(RunStatus::Success),
        failed = lit(RunStatus::Failed),
        cancelled = lit(RunStatus::Cancelled),
    )
}

/// `ArtifactStore::expirable_artifacts`: bindings past their `expires_at`
/// whose run has ended (a live run's inputs are held: spec 000 §12), not
/// yet expired or whose bytes are not yet deleted, of generations that no
/// other binding still holds.
pub(crate) async fn expirable_artifacts(store: &SqlStore, limit: u32) -> Result<Vec<BoundArtifact>> {
    static EXPIRABLE: Sql = Sql::new(|d| {
        format!(
            "SELECT {GEN_COLS}, {BINDING_COLS} FROM artifact_bindings b JOIN jobs j ON j.id = b.job_id \
             JOIN artifact_generations g ON g.id = b.generation_id JOIN runs r ON r.id = b.run_id \
             WHERE b.expires_at IS NOT NULL AND b.expires_at <= {now} \
             AND r.status IN ({success}, {failed}, {cancelled}) \
             AND (b.expired_at IS NULL OR g.deleted_at IS NULL) AND NOT {live} \
             ORDER BY b.expires_at LIMIT $1",
            now = d.now_ms,
            success = lit(RunStatus::Success),
            failed = lit(RunStatus::Failed),
            cancelled = lit(RunStatus::Cancelled),
            live = live_binding("b.generation_id", d.now_ms),
        )
    });
    let rows = store.reader().await?.sql(&EXPIRABLE).bind(limit as i64).fetch_all().await?;
    rows.iter().map(bound_from_row).collect()
}

/// `ArtifactStore::expire_artifact`: one transaction marks the binding
/// expired and its generation `expired`, so no reader is handed a download
/// capability for bytes about to be deleted. Only a binding past its
/// `expires_at` of an ended run, and only when no other binding of the
/// generation still lives (a retry's pinned copy); idempotent.
pub(crate) async fn expire_artifact(store: &SqlStore, generation_id: &str) -> Result<bool> {
    static LIVE: Sql = Sql::new(|d| format!("SELECT CAST(1 AS BIGINT) WHERE {}", live_binding("$1", d.now_ms)));
    static BINDING: Sql = Sql::new(|d| {
        format!(
            "UPDATE artifact_bindings SET expired_at = COALESCE(expired_at, {now}) WHERE generation_id = $1 \
             AND expires_at IS NOT NULL AND expires_at <= {now} \
             AND EXISTS (SELECT 1 FROM runs r WHERE r.id = artifact_bindings.run_id \
             AND r.status IN ({success}, {failed}, {cancelled}))",
            now = d.now_ms,
            success = lit(RunStatus::Success),
            failed = lit(RunStatus::Failed),
            cancelled = lit(RunStatus::Cancelled),
        )
    });
    static GENERATION: Sql = Sql::new(|_| {
        format!(
            "UPDATE artifact_generations SET state = {expired} WHERE id = $1",
            expired = lit(GenerationState::Expired)
        )
    });
    store
        .transaction(Isolation::Serializable, &generation_id, |tx, &id| {
            Box::pin(async move {
                if tx.sql(&LIVE).bind(id).scalar_optional::<i64>().await?.is_some() {
                    return Ok(false);
                }
                if tx.sql(&BINDING).bind(id).execute().await? == 0 {
                    return Ok(false);
                }
                tx.sql(&GENERATION).bind(id).execute().await?;
                Ok(true)
            })
        })
        .await
}

/// `ArtifactStore::mark_expired_deleted`: the expired generation's bytes
/// are gone.
pub(crate) async fn mark_expired_deleted(store: &SqlStore, generation_id: &str) -> Result<()> {
    static DELETED: Sql = Sql::new(|d| {
        format!(
            "UPDATE artifact_generations SET deleted_at = COALESCE(deleted_at, {now}) WHERE id = $1 AND state = {expired}",
            now = d.now_ms,
            expired = lit(GenerationState::Expired),
        )
    });
    store.writer().await?.sql(&DELETED).bind(generation_id).execute().await?;
    Ok(())
}
