//! The PostgreSQL store's log objects (issue 47, item 6; see
//! `crate::log_objects`): the writer of each lane's objects, the numbers
//! they take from `log_objects`, and the collection of objects no chunk
//! refers to.

use crate::db::Exec;
use crate::error::{Result, StoreError};
use crate::log_objects::{ObjectSegments, Reply};
use crate::segments::Lane;
use crate::store::SqlStore;

/// Stores `data` in the next object of its lane and returns (segment,
/// position) once that object is durable.
pub(crate) async fn append(store: &SqlStore, segs: &ObjectSegments, data: Vec<u8>) -> Result<(i64, i64)> {
    let (rx, start) = segs.enqueue(data);
    if let Some(lane) = start {
        // A task of its own: a request that gives up waiting does not stop
        // the write the others wait for.
        let store = store.clone();
        tokio::spawn(async move { write_lane(store, lane).await });
    }
    rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the log object writer stopped".into())))
}

/// Writes the lane's waiting chunks, one object at a time, until none wait.
async fn write_lane(store: SqlStore, lane: Lane) {
    let Some(segs) = store.log_files().objects.get() else { return };
    // Bulk lane: while more chunks wait, the number of the next object is
    // taken while this one is written (issue 47, item 6: taking it cost a
    // writer 2–6 ms per object under load, a third of its time). A number
    // left unused (another writer took the chunks) is collected like an
    // orphan: its row refers to no object.
    let mut next: Option<tokio::task::JoinHandle<Result<i64>>> = None;
    while let Some(batch) = segs.next_batch(lane) {
        let batch: Vec<(Vec<u8>, Reply)> = batch;
        // The chunks go to the object store as they are, not concatenated
        // into one buffer first (issue 47, item 6: that buffer, up to
        // 32 MiB, copied again for the write task and hashed again, made
        // the object put a third of the server's CPU per 200 MB of log).
        let mut parts = Vec::with_capacity(batch.len());
        let mut places = Vec::with_capacity(batch.len());
        let mut size = 0;
        for (d, reply) in batch {
            places.push((size as i64, reply));
            size += d.len();
            parts.push(d);
        }
        // The live lane's objects are kept to answer the live feeds (small:
        // at most `SMALL_CHUNK` per chunk).
        let recent = (lane == Lane::Small).then(|| parts.concat());
        let written = async {
            let taken = match next.take() {
                Some(h) => h.await.ok().and_then(Result::ok),
                None => None,
            };
            let seg = match taken {
                Some(seg) => seg,
                None => new_segment(&store).await?,
            };
            if lane == Lane::Bulk && segs.more_waiting(lane) {
                let store = store.clone();
                next = Some(tokio::spawn(async move { new_segment(&store).await }));
            }
            segs.put(seg, parts).await.map_err(|e| StoreError::Unavailable(format!("cannot write log bytes: {e}")))?;
            Ok::<i64, StoreError>(seg)
        }
        .await;
        if let (Ok(seg), Some(bytes)) = (&written, recent) {
            segs.keep_recent(*seg, bytes);
        }
        for (pos, reply) in places {
            let _ = reply.send(match &written {
                Ok(seg) => Ok((*seg, pos)),
                Err(e) => Err(StoreError::Unavailable(e.to_string())),
            });
        }
    }
}

/// A new segment number, recorded with its time. The row's commit does
/// not wait for its WAL to reach the disk (`synchronous_commit = off`):
/// the commit of the chunks that refer to the object comes later and
/// flushes the WAL up to itself, this row included; only a crash before
/// any of them committed can lose it, and then the object holds nothing
/// anyone acknowledged (an orphan no collection finds — a few bytes).
async fn new_segment(store: &SqlStore) -> Result<i64> {
    store
        .transaction(crate::dialect::Isolation::LockedReadCommitted, &(), |tx, ()| {
            Box::pin(async move {
                tx.sql("SET LOCAL synchronous_commit = off").execute().await?;
                let now = crate::db::now(tx).await?;
                tx.sql("INSERT INTO log_objects (created_at) VALUES ($1) RETURNING seg").bind(now).scalar().await
            })
        })
        .await
}

/// Deletes the objects older than `min_age_ms` (the server's rounds pass
/// [`crate::log_objects::ORPHAN_AGE_MS`]) that no index row refers to
/// (their chunks were archived and trimmed, or never committed), at most
/// `limit` of them; how many.
pub(crate) async fn remove_unreferenced(
    store: &SqlStore,
    segs: &ObjectSegments,
    min_age_ms: i64,
    limit: i64,
) -> Result<usize> {
    let mut r = store.reader().await?;
    let now = crate::db::now(&mut r).await?;
    let old: Vec<i64> = r
        .sql(
            "SELECT o.seg FROM log_objects o WHERE o.created_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM log_chunks c WHERE c.seg = o.seg) ORDER BY o.seg LIMIT $2",
        )
        .bind(now - min_age_ms)
        .bind(limit)
        .scalars()
        .await?;
    drop(r);
    let mut removed = 0;
    for seg in old {
        if let Err(e) = segs.delete(seg).await {
            tracing::warn!(error = %e, seg, "cannot delete an unreferenced log object");
            continue;
        }
        store.writer().await?.sql("DELETE FROM log_objects WHERE seg = $1").bind(seg).execute().await?;
        removed += 1;
    }
    Ok(removed)
}
