//! The dispatch outbox (spec 000 §9, invariant 5): events written in the
//! transaction that made a job ready, relayed to the dispatch queues, and
//! the ready jobs a restarted relay rebuilds its queues from.

use crate::db::Exec;
use crate::dialect::{Sql, lit};
use crate::error::Result;
use crate::model::OutboxEvent;
use crate::store::SqlStore;
use kiln_core::JobStatus;

/// `OutboxStore::pending_outbox`.
pub(crate) async fn pending_outbox(store: &SqlStore, limit: u32) -> Result<Vec<OutboxEvent>> {
    static PENDING: Sql = Sql::new(|d| {
        format!(
            "SELECT id, job_id, dispatch_generation, class_key FROM outbox \
             WHERE published_at IS NULL AND available_at <= {now} ORDER BY id LIMIT $1",
            now = d.now_ms
        )
    });
    let rows: Vec<(i64, String, i64, String)> = store.reader().await?.sql(&PENDING).bind(limit as i64).all().await?;
    Ok(rows
        .into_iter()
        .map(|(id, job_id, dispatch_generation, class_key)| OutboxEvent { id, job_id, dispatch_generation, class_key })
        .collect())
}

/// `OutboxStore::mark_published`.
pub(crate) async fn mark_published(store: &SqlStore, ids: &[i64]) -> Result<()> {
    static PUBLISHED: Sql = Sql::new(|d| {
        format!(
            "UPDATE outbox SET published_at = {now} WHERE id IN (SELECT CAST(value AS BIGINT) FROM {ids})",
            now = d.now_ms,
            ids = d.json_texts(1),
        )
    });
    if ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).expect("ids");
    store.writer().await?.sql(&PUBLISHED).bind(list).execute().await?;
    Ok(())
}

/// `OutboxStore::ready_jobs`.
pub(crate) async fn ready_jobs(store: &SqlStore) -> Result<Vec<OutboxEvent>> {
    static READY: Sql = Sql::new(|d| {
        format!(
            "SELECT id, dispatch_generation, class_key FROM jobs WHERE status = {ready} \
             AND COALESCE(next_attempt_at, 0) <= {now}",
            ready = lit(JobStatus::Ready),
            now = d.now_ms,
        )
    });
    let rows: Vec<(String, i64, String)> = store.reader().await?.sql(&READY).all().await?;
    Ok(rows
        .into_iter()
        .map(|(job_id, dispatch_generation, class_key)| OutboxEvent { id: 0, job_id, dispatch_generation, class_key })
        .collect())
}
