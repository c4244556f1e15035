//! Artifact generations and bindings (spec 000 §12), shared by every
//! backend like `engine.rs`. Bindings are written only by the completion
//! transaction (engine.rs).

use super::engine::{load_run, now, q, require_live, sqlf, write_tx};
use super::{DbRow, StoreImpl, db_err};
use crate::new_id;
use crate::*;
use sqlx::Row;

const GEN_COLS: &str = "g.id, g.run_id, g.job_id, g.epoch, g.name, g.object_key, g.expected_size, g.expected_sha256, \
    g.part_size, g.state, g.created_at, g.upload_id";

fn gen_from_row(r: &DbRow) -> GenerationRecord {
    GenerationRecord {
        id: r.get("id"),
        run_id: r.get("run_id"),
        job_id: r.get("job_id"),
        epoch: r.get("epoch"),
        name: r.get("name"),
        object_key: r.get("object_key"),
        expected_size: r.get("expected_size"),
        expected_sha256: r.get("expected_sha256"),
        part_size: r.get("part_size"),
        state: r.get("state"),
        created_at: r.get("created_at"),
        upload_id: r.get("upload_id"),
    }
}

fn bound_from_row(r: &DbRow) -> BoundArtifact {
    BoundArtifact {
        job_id: r.get("job_id"),
        job_name: r.get("job_name"),
        name: r.get("name"),
        generation: gen_from_row(r),
    }
}

fn valid_sha(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[async_trait]
impl ArtifactStore for StoreImpl {
    async fn create_generation(
        &self,
        job_id: &str,
        epoch: i64,
        name: &str,
        size: i64,
        sha256: &str,
        part_size: i64,
    ) -> Result<GenerationRecord> {
        if !(sha256.is_empty() || valid_sha(sha256)) || size < 0 || part_size <= 0 {
            return Err(StoreError::Invalid(
                "size must be ≥ 0 and sha256 64 lowercase hex digits (or empty: named at seal)".into(),
            ));
        }
        let id = write_tx!(self, |tx| {
            super::lock_job(&mut tx, job_id).await?;
            let now = now(&mut tx).await?;
            let (job, _) = require_live(&mut tx, job_id, epoch, now).await?;
            let run = load_run(&mut *tx, &job.run_id).await?;
            let declared = run
                .definition
                .jobs
                .get(job.index as usize)
                .is_some_and(|j| j.artifacts.publish.iter().any(|p| p.name == name));
            if !declared {
                return Err(StoreError::Invalid(format!("job `{}` does not declare an artifact `{name}`", job.name)));
            }
            let id = new_id();
            // A fresh key per session: a stale attempt can never overwrite
            // another generation's bytes.
            let key = format!("artifacts/{}/{}/{epoch}/{id}", run.id, job.id);
            sqlx::query(q!(
                "INSERT INTO artifact_generations (id, run_id, job_id, epoch, name, object_key, expected_size, \
             expected_sha256, part_size, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'uploading', ?)"
            ))
            .bind(&id)
            .bind(&run.id)
            .bind(job_id)
            .bind(epoch)
            .bind(name)
            .bind(&key)
            .bind(size)
            .bind(sha256)
            .bind(part_size)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
            Ok(id)
        })?;
        self.get_generation(&id).await
    }

    async fn get_generation(&self, id: &str) -> Result<GenerationRecord> {
        let row = sqlx::query(sqlf!("SELECT {GEN_COLS} FROM artifact_generations g WHERE g.id = ?"))
            .bind(id)
            .fetch_optional(&self.writer)
            .await
            .map_err(db_err)?
            .ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?;
        Ok(gen_from_row(&row))
    }

    async fn set_generation_digest(
        &self,
        id: &str,
        job_id: &str,
        epoch: i64,
        sha256: &str,
    ) -> Result<GenerationRecord> {
        if !valid_sha(sha256) {
            return Err(StoreError::Invalid("sha256 must be 64 lowercase hex digits".into()));
        }
        write_tx!(self, |tx| {
            super::lock_job(&mut tx, job_id).await?;
            let now = now(&mut tx).await?;
            require_live(&mut tx, job_id, epoch, now).await?;
            let current: Option<String> = sqlx::query_scalar(
            q!("SELECT expected_sha256 FROM artifact_generations WHERE id = ? AND job_id = ? AND epoch = ? AND state = 'uploading'"),
        )
        .bind(id)
        .bind(job_id)
        .bind(epoch)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?;
            match current.as_deref() {
                None => return Err(StoreError::NotFound(format!("upload session {id} of job {job_id} epoch {epoch}"))),
                Some("") => {
                    sqlx::query(q!("UPDATE artifact_generations SET expected_sha256 = ? WHERE id = ?"))
                        .bind(sha256)
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                }
                Some(d) if d == sha256 => {}
                Some(d) => {
                    return Err(StoreError::Conflict(format!(
                        "upload session {id} was opened for sha256 {d}, not {sha256}"
                    )));
                }
            }
            Ok(())
        })?;
        self.get_generation(id).await
    }

    async fn uploadable_generation(&self, id: &str) -> Result<GenerationRecord> {
        let mut tx = self.reader.begin().await.map_err(db_err)?;
        let now: i64 = sqlx::query_scalar(super::NOW_SQL).fetch_one(&mut *tx).await.map_err(db_err)?;
        let row = sqlx::query(sqlf!(
            "SELECT {GEN_COLS}, j.current_epoch, a.outcome, a.lease_deadline FROM artifact_generations g \
             JOIN jobs j ON j.id = g.job_id JOIN attempts a ON a.job_id = g.job_id AND a.epoch = g.epoch WHERE g.id = ?"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?;
        let g = gen_from_row(&row);
        let current: i64 = row.get("current_epoch");
        let outcome: String = row.get("outcome");
        let deadline: i64 = row.get("lease_deadline");
        if current != g.epoch || outcome != "running" || deadline <= now {
            return Err(StoreError::StaleEpoch(format!(
                "epoch {} of job {} is no longer the live attempt: its upload session is closed",
                g.epoch, g.job_id
            )));
        }
        if g.state != "uploading" {
            return Err(StoreError::Conflict(format!("artifact generation {id} is {}", g.state)));
        }
        Ok(g)
    }

    async fn set_generation_upload(&self, id: &str, upload_id: &str) -> Result<String> {
        if upload_id.is_empty() {
            return Err(StoreError::Invalid("an upload id is not empty".into()));
        }
        sqlx::query(q!(
            "UPDATE artifact_generations SET upload_id = ? WHERE id = ? AND upload_id = '' AND state = 'uploading'"
        ))
        .bind(upload_id)
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(db_err)?;
        let row = sqlx::query(q!("SELECT upload_id, state FROM artifact_generations WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.writer)
            .await
            .map_err(db_err)?
            .ok_or_else(|| StoreError::NotFound(format!("artifact generation {id}")))?;
        let (winner, state): (String, String) = (row.get("upload_id"), row.get("state"));
        if state != "uploading" {
            return Err(StoreError::Conflict(format!("artifact generation {id} is {state}")));
        }
        Ok(winner)
    }

    async fn seal_generation(&self, id: &str, job_id: &str, epoch: i64) -> Result<GenerationRecord> {
        write_tx!(self, |tx| {
            super::lock_job(&mut tx, job_id).await?;
            let now = now(&mut tx).await?;
            require_live(&mut tx, job_id, epoch, now).await?;
            let res = sqlx::query(
                // A repeated seal (lost response) keeps the first sealing time, so
                // it never changes which generation the completion binds.
                q!("UPDATE artifact_generations SET state = 'sealed', sealed_at = COALESCE(sealed_at, ?) \
             WHERE id = ? AND job_id = ? AND epoch = ? AND state IN ('uploading', 'sealed') AND expected_sha256 != ''"),
            )
            .bind(now)
            .bind(id)
            .bind(job_id)
            .bind(epoch)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
            if res.rows_affected() == 0 {
                return Err(StoreError::NotFound(format!("upload session {id} of job {job_id} epoch {epoch}")));
            }
            Ok(())
        })?;
        self.get_generation(id).await
    }

    async fn fail_generation(&self, id: &str, message: &str) -> Result<()> {
        sqlx::query(q!(
            "UPDATE artifact_generations SET state = 'failed', message = ? WHERE id = ? AND state = 'uploading'"
        ))
        .bind(message)
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn resolve_binding(&self, run_id: &str, job_name: &str, name: &str) -> Result<BoundArtifact> {
        let row = sqlx::query(sqlf!(
            "SELECT {GEN_COLS}, j.name AS job_name FROM artifact_bindings b JOIN jobs j ON j.id = b.job_id \
             JOIN artifact_generations g ON g.id = b.generation_id \
             WHERE b.run_id = ? AND (j.name = ? OR j.id = ?) AND b.name = ?"
        ))
        .bind(run_id)
        .bind(job_name)
        .bind(job_name)
        .bind(name)
        .fetch_optional(&self.reader)
        .await
        .map_err(db_err)?
        .ok_or_else(|| StoreError::NotFound(format!("artifact `{job_name}/{name}` of run {run_id}")))?;
        Ok(bound_from_row(&row))
    }

    async fn run_bindings(&self, run_id: &str) -> Result<Vec<BoundArtifact>> {
        let rows = sqlx::query(sqlf!(
            "SELECT {GEN_COLS}, j.name AS job_name FROM artifact_bindings b JOIN jobs j ON j.id = b.job_id \
             JOIN artifact_generations g ON g.id = b.generation_id WHERE b.run_id = ? ORDER BY j.job_index, b.name"
        ))
        .bind(run_id)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)?;
        Ok(rows.iter().map(bound_from_row).collect())
    }

    async fn collectable_generations(&self, grace_ms: i64, limit: u32) -> Result<Vec<GenerationRecord>> {
        let rows = sqlx::query(sqlf!(
            "SELECT {GEN_COLS} FROM artifact_generations g JOIN attempts a ON a.job_id = g.job_id AND a.epoch = g.epoch \
             WHERE g.state != 'deleted' AND a.outcome != 'running' \
             AND NOT EXISTS (SELECT 1 FROM artifact_bindings b WHERE b.generation_id = g.id) \
             AND COALESCE(a.finished_at, g.created_at) <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? \
             ORDER BY g.created_at LIMIT ?"
        ))
        .bind(grace_ms)
        .bind(limit as i64)
        .fetch_all(&self.reader)
        .await
        .map_err(db_err)?;
        Ok(rows.iter().map(gen_from_row).collect())
    }

    async fn mark_generation_deleted(&self, id: &str) -> Result<()> {
        // Never a bound generation, whatever the caller thought.
        sqlx::query(
            q!("UPDATE artifact_generations SET state = 'deleted', deleted_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             WHERE id = ? AND NOT EXISTS (SELECT 1 FROM artifact_bindings b WHERE b.generation_id = artifact_generations.id)"),
        )
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(db_err)?;
        Ok(())
    }
}
