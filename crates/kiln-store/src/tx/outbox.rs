//! The dispatch outbox (spec 000 §9, invariant 5): events written in the
//! transaction that made a job ready, relayed to the dispatch queues, and
//! the ready jobs a restarted relay rebuilds its queues from.

use crate::db::Exec;
use crate::dialect::{Sql, lit};
use crate::error::Result;
use crate::model::OutboxEvent;
use crate::store::SqlStore;
use kiln_core::JobStatus;

type EventRow = (i64, String, i64, String, String, String, i64);

fn event((id, job_id, dispatch_generation, class_key, team, lane, ready_at_ms): EventRow) -> OutboxEvent {
    OutboxEvent { id, job_id, dispatch_generation, class_key, team, lane, ready_at_ms }
}

/// `OutboxStore::pending_outbox`.
pub(crate) async fn pending_outbox(store: &SqlStore, limit: u32) -> Result<Vec<OutboxEvent>> {
    static PENDING: Sql = Sql::new(|d| {
        format!(
            "SELECT o.id, o.job_id, o.dispatch_generation, o.class_key, p.team, r.priority, o.available_at \
             FROM outbox o JOIN jobs j ON j.id = o.job_id JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
             WHERE o.published_at IS NULL AND o.available_at <= {now} ORDER BY o.id LIMIT $1",
            now = d.now_ms
        )
    });
    let rows: Vec<EventRow> = store.reader().await?.sql(&PENDING).bind(limit as i64).all().await?;
    Ok(rows.into_iter().map(event).collect())
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
            "SELECT CAST(0 AS BIGINT), j.id, j.dispatch_generation, j.class_key, p.team, r.priority, COALESCE(j.next_attempt_at, 0) \
             FROM jobs j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
             WHERE j.status = {ready} AND COALESCE(j.next_attempt_at, 0) <= {now}",
            ready = lit(JobStatus::Ready),
            now = d.now_ms,
        )
    });
    let rows: Vec<EventRow> = store.reader().await?.sql(&READY).all().await?;
    Ok(rows.into_iter().map(event).collect())
}

/// `OutboxStore::ready_jobs_of`.
pub(crate) async fn ready_jobs_of(store: &SqlStore, job_ids: &[String]) -> Result<Vec<OutboxEvent>> {
    static READY_OF: Sql = Sql::new(|d| {
        format!(
            "SELECT CAST(0 AS BIGINT), j.id, j.dispatch_generation, j.class_key, p.team, r.priority, COALESCE(j.next_attempt_at, 0) \
             FROM jobs j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
             WHERE j.id IN (SELECT value FROM {ids}) AND j.status = {ready} AND COALESCE(j.next_attempt_at, 0) <= {now}",
            ids = d.json_texts(1),
            ready = lit(JobStatus::Ready),
            now = d.now_ms,
        )
    });
    if job_ids.is_empty() {
        return Ok(vec![]);
    }
    let list = serde_json::to_string(job_ids).expect("ids");
    let rows: Vec<EventRow> = store.reader().await?.sql(&READY_OF).bind(list).all().await?;
    Ok(rows.into_iter().map(event).collect())
}
