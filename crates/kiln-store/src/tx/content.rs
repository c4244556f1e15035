//! Content-addressed artifact bytes (issue 45; `docs/supply-chain.md`).
//!
//! A generation is uploaded under its own session key; once the server has
//! verified the bytes, the generation is made to reference the content
//! object `cas/sha256/<hex>` ([`reference_content`]) *before* its bytes are
//! moved there, and it is sealed only after the move. A content object's
//! references are the generations whose `content_key` names it and that are
//! not deleted; bindings, cache entries, provenance and pins hold
//! generations, so they hold its bytes.
//!
//! The collector deletes a content object in three steps: the row is
//! marked `deleting` in a transaction that checks, under SERIALIZABLE,
//! that no generation references it (and that none was made to reference
//! it within the grace period); the bytes are deleted; the row is removed.
//! A seal that meets a `deleting` row gets `Busy` and tries again, then
//! finds no row and writes the bytes anew: no generation is ever sealed
//! over bytes being deleted. Every transaction that makes a generation
//! reference an object also writes the object's row (`touched_at`), so a
//! collector that decided on an older state loses the serialization race.

use crate::db::{Exec, Tx, now};
use crate::dialect::{GenerationState, Isolation, Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::{GenerationRecord, content_key};
use crate::rows::{GEN_COLS, gen_from_row};
use crate::store::{SqlStore, lock_job};
use crate::tx::attempt::require_live;

const LIVE: &str = "live";
const DELETING: &str = "deleting";

/// The object's row made live and touched, inserted if missing; `Busy`
/// while the collector deletes its bytes.
async fn touch(tx: &mut Tx, sha256: &str, size: i64, now: i64) -> Result<()> {
    static TOUCH: Sql =
        Sql::new(|_| format!("UPDATE content_objects SET touched_at = $1 WHERE sha256 = $2 AND state = '{LIVE}'"));
    static INSERT: Sql = Sql::new(|_| {
        format!(
            "INSERT INTO content_objects (sha256, size, state, created_at, touched_at) \
             VALUES ($1, $2, '{LIVE}', $3, $3) ON CONFLICT (sha256) DO NOTHING"
        )
    });
    if tx.sql(&TOUCH).bind(now).bind(sha256).execute().await? == 1 {
        return Ok(());
    }
    if tx.sql(&INSERT).bind(sha256).bind(size).bind(now).execute().await? == 1 {
        return Ok(());
    }
    Err(StoreError::Busy(format!("the bytes of sha256 {sha256} are being deleted by the collector; try again")))
}

/// `ArtifactStore::reference_content`: the live attempt's verified upload
/// session `id` is made to reference the content object of its sha256
/// (returned key); its bytes are moved there next, then it is sealed.
pub(crate) async fn reference_content(store: &SqlStore, id: &str, job_id: &str, epoch: i64) -> Result<String> {
    static GEN: Sql = Sql::new(|_| {
        "SELECT expected_sha256, expected_size, state FROM artifact_generations \
         WHERE id = $1 AND job_id = $2 AND epoch = $3"
            .to_string()
    });
    static POINT: Sql = Sql::new(|_| "UPDATE artifact_generations SET content_key = $1 WHERE id = $2".to_string());
    store
        .transaction(Isolation::Serializable, &(id, job_id, epoch), |tx, &(id, job_id, epoch)| {
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                let (_, _, now) = require_live(tx, job_id, epoch).await?;
                let row: Option<(String, i64, String)> =
                    tx.sql(&GEN).bind(id).bind(job_id).bind(epoch).optional().await?;
                let Some((sha, size, state)) = row else {
                    return Err(StoreError::NotFound(format!("upload session {id} of job {job_id} epoch {epoch}")));
                };
                if state != "uploading" && state != "sealed" {
                    return Err(StoreError::Conflict(format!("artifact generation {id} is {state}")));
                }
                if sha.is_empty() {
                    return Err(StoreError::Invalid(format!("upload session {id} has no sha256 yet")));
                }
                touch(tx, &sha, size, now).await?;
                let key = content_key(&sha);
                tx.sql(&POINT).bind(&key).bind(id).execute().await?;
                Ok(key)
            })
        })
        .await
}

/// `ArtifactStore::migratable_generations`: sealed generations whose bytes
/// are still under their session key (written before issue 45).
pub(crate) async fn migratable_generations(store: &SqlStore, limit: u32) -> Result<Vec<GenerationRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS} FROM artifact_generations g WHERE g.state = {sealed} AND g.deleted_at IS NULL \
             AND g.content_key IS NULL AND g.expected_sha256 != '' ORDER BY g.created_at LIMIT $1",
            sealed = lit(GenerationState::Sealed),
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(i64::from(limit)).fetch_all().await?;
    rows.iter().map(gen_from_row).collect()
}

/// `ArtifactStore::touch_content`: the content object's row made live (and
/// kept from the collector for its grace period) before bytes are copied
/// to it; `Busy` while it is being deleted.
pub(crate) async fn touch_content(store: &SqlStore, sha256: &str, size: i64) -> Result<()> {
    store
        .transaction(Isolation::Serializable, &(sha256, size), |tx, &(sha, size)| {
            Box::pin(async move {
                let now = now(tx).await?;
                touch(tx, sha, size, now).await
            })
        })
        .await
}

/// `ArtifactStore::move_to_content`: a sealed generation still under its
/// session key `from` now reads the content object of its sha256 (whose
/// bytes the caller copied there); the old bytes are deleted after
/// `retire_after_ms` (a download handed out before may still read them).
/// `false`: the generation changed meanwhile (nothing done).
pub(crate) async fn move_to_content(store: &SqlStore, id: &str, from: &str, retire_after_ms: i64) -> Result<bool> {
    static GEN: Sql = Sql::new(|_| {
        format!(
            "SELECT expected_sha256, expected_size FROM artifact_generations WHERE id = $1 AND object_key = $2 \
             AND content_key IS NULL AND state = {sealed} AND deleted_at IS NULL",
            sealed = lit(GenerationState::Sealed),
        )
    });
    static MOVE: Sql = Sql::new(|_| {
        "UPDATE artifact_generations SET content_key = $1, retire_session_at = $2 WHERE id = $3".to_string()
    });
    store
        .transaction(Isolation::Serializable, &(id, from, retire_after_ms), |tx, &(id, from, after)| {
            Box::pin(async move {
                let now = now(tx).await?;
                let row: Option<(String, i64)> = tx.sql(&GEN).bind(id).bind(from).optional().await?;
                let Some((sha, size)) = row else { return Ok(false) };
                touch(tx, &sha, size, now).await?;
                tx.sql(&MOVE).bind(content_key(&sha)).bind(now + after).bind(id).execute().await?;
                Ok(true)
            })
        })
        .await
}

/// `ArtifactStore::retirable_sessions`: generations whose old session
/// bytes are due for deletion.
pub(crate) async fn retirable_sessions(store: &SqlStore, limit: u32) -> Result<Vec<GenerationRecord>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT {GEN_COLS} FROM artifact_generations g WHERE g.retire_session_at IS NOT NULL \
             AND g.retire_session_at <= {now} ORDER BY g.retire_session_at LIMIT $1",
            now = d.now_ms
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(i64::from(limit)).fetch_all().await?;
    rows.iter().map(gen_from_row).collect()
}

/// `ArtifactStore::session_retired`.
pub(crate) async fn session_retired(store: &SqlStore, id: &str) -> Result<()> {
    store
        .writer()
        .await?
        .sql("UPDATE artifact_generations SET retire_session_at = NULL WHERE id = $1")
        .bind(id)
        .execute()
        .await?;
    Ok(())
}

/// Whether a generation references the object named by `key` (SQL).
fn referenced(key: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM artifact_generations g WHERE g.content_key = {key} \
         AND g.deleted_at IS NULL AND g.state != {deleted})",
        deleted = lit(GenerationState::Deleted),
    )
}

/// `ArtifactStore::collectable_content`: content objects nothing references
/// (untouched for `grace_ms`), and those whose deletion was begun.
pub(crate) async fn collectable_content(store: &SqlStore, grace_ms: i64, limit: u32) -> Result<Vec<String>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT c.sha256 FROM content_objects c WHERE c.state = '{DELETING}' \
             OR (c.touched_at <= {now} - $1 AND NOT {refs}) ORDER BY c.touched_at LIMIT $2",
            now = d.now_ms,
            refs = referenced("('cas/sha256/' || c.sha256)"),
        )
    });
    store.reader().await?.sql(&SQL).bind(grace_ms).bind(i64::from(limit)).scalars().await
}

/// `ArtifactStore::begin_content_delete`: `true` when the object may be
/// deleted now (marked `deleting`, or already so).
pub(crate) async fn begin_content_delete(store: &SqlStore, sha256: &str, grace_ms: i64) -> Result<bool> {
    static MARK: Sql = Sql::new(|d| {
        format!(
            "UPDATE content_objects SET state = '{DELETING}' WHERE sha256 = $1 AND state = '{LIVE}' \
             AND touched_at <= {now} - $2 AND NOT {refs}",
            now = d.now_ms,
            refs = referenced("$3"),
        )
    });
    static STATE: Sql = Sql::new(|_| "SELECT state FROM content_objects WHERE sha256 = $1".to_string());
    store
        .transaction(Isolation::Serializable, &(sha256, grace_ms), |tx, &(sha, grace)| {
            Box::pin(async move {
                tx.sql(&MARK).bind(sha).bind(grace).bind(content_key(sha)).execute().await?;
                let state: Option<String> = tx.sql(&STATE).bind(sha).scalar_optional().await?;
                Ok(state.as_deref() == Some(DELETING))
            })
        })
        .await
}

/// `ArtifactStore::content_deleted`: the object's bytes are gone.
pub(crate) async fn content_deleted(store: &SqlStore, sha256: &str) -> Result<()> {
    static SQL: Sql = Sql::new(|_| format!("DELETE FROM content_objects WHERE sha256 = $1 AND state = '{DELETING}'"));
    store.writer().await?.sql(&SQL).bind(sha256).execute().await?;
    Ok(())
}

/// `ArtifactStore::content_usage`: content objects and their bytes.
pub(crate) async fn content_usage(store: &SqlStore) -> Result<(i64, i64)> {
    store
        .reader()
        .await?
        .sql("SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM content_objects")
        .one()
        .await
}

/// `ArtifactStore::note_manifest`: the manifest digest of an upload session
/// of the live attempt that is still uploading (read by the server).
pub(crate) async fn note_manifest(store: &SqlStore, id: &str, job_id: &str, epoch: i64, sha256: &str) -> Result<()> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "UPDATE artifact_generations SET manifest_sha256 = $1 WHERE id = $2 AND job_id = $3 AND epoch = $4 \
             AND state = {uploading}",
            uploading = lit(GenerationState::Uploading)
        )
    });
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(StoreError::Invalid("a manifest digest is 64 hex digits".into()));
    }
    store.writer().await?.sql(&SQL).bind(sha256).bind(id).bind(job_id).bind(epoch).execute().await?;
    Ok(())
}
