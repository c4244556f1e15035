//! Log bytes of the PostgreSQL store in the object store (issue 47, item 6):
//! only the index of each chunk (segment, position, length, digest) is in
//! `log_chunks`, as on SQLite; the bytes are in immutable objects
//! `logs/segments/NNNNNNNNNNNN` that every replica reads (a segment file on
//! one replica's disk would be on that replica only).
//!
//! Group commit, as the SQLite segments do it with `fdatasync`: chunks that
//! arrive while an object is being written wait together and go out as the
//! next object, each acknowledged once its object is durable (the object
//! store's put: written, synced and renamed on the local disk; a completed
//! PUT on S3) and before its index row commits. Two lanes, as on SQLite:
//! live output (chunks of at most [`crate::segments::SMALL_CHUNK`] bytes) never waits behind
//! the megabytes of bulk output in flight.
//!
//! Each object's number comes from `log_objects` (a row written when the
//! number is taken, with its time), so replicas never write one key, and an
//! object that no index row refers to — its chunks archived and trimmed, or
//! never committed (a stale epoch refused, a crash between the put and the
//! commit) — is deleted once it is older than [`ORPHAN_AGE_MS`] (a put and
//! its commit take seconds at most).

use crate::db::Exec;
use crate::error::{Result, StoreError};
use crate::segments::Lane;
use crate::store::SqlStore;
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Where the PostgreSQL store keeps log bytes: the server's object store.
/// Errors are messages; `read_range` of an object that is gone says so with
/// [`LogObjectError::NotFound`].
#[async_trait]
pub trait LogObjects: Send + Sync {
    /// Publish `data` as the immutable object `key`, durably.
    async fn put(&self, key: &str, data: &[u8]) -> std::result::Result<(), LogObjectError>;
    /// `len` bytes of object `key` from `offset`.
    async fn read_range(&self, key: &str, offset: u64, len: usize) -> std::result::Result<Vec<u8>, LogObjectError>;
    /// Remove object `key` (gone already is fine).
    async fn delete(&self, key: &str) -> std::result::Result<(), LogObjectError>;
}

/// What a [`LogObjects`] call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LogObjectError {
    #[error("log object {0} not found")]
    NotFound(String),
    #[error("log object store: {0}")]
    Other(String),
}

/// An object of more than this many bytes is not grown further: the chunks
/// that arrive meanwhile wait for the next one.
const MAX_OBJECT: usize = 32 * 1024 * 1024;
/// An unreferenced object younger than this is never deleted: its chunks
/// may still be on their way to their commit.
pub const ORPHAN_AGE_MS: i64 = 10 * 60 * 1000;

/// The object holding segment `seg`'s bytes.
pub(crate) fn key(seg: i64) -> String {
    format!("logs/segments/{seg:012}")
}

type Reply = oneshot::Sender<Result<(i64, i64)>>;

#[derive(Default)]
struct Pending {
    waiting: Vec<(Vec<u8>, Reply)>,
    /// A task is writing objects of this lane (and takes what waits when it is done).
    writing: bool,
}

/// The live lane's newest objects this process wrote, kept to answer the
/// live feeds' reads without a request to the object store, at most this
/// many bytes.
const RECENT_BYTES: usize = 4 * 1024 * 1024;

/// The batcher: one per store, two lanes.
pub(crate) struct ObjectSegments {
    objects: Arc<dyn LogObjects>,
    lanes: [Mutex<Pending>; 2],
    /// The small lane's newest objects (segment, bytes), oldest first.
    recent: Mutex<std::collections::VecDeque<(i64, Arc<Vec<u8>>)>>,
}

impl ObjectSegments {
    pub(crate) fn new(objects: Arc<dyn LogObjects>) -> ObjectSegments {
        ObjectSegments { objects, lanes: Default::default(), recent: Default::default() }
    }

    /// `len` bytes of segment `seg` from `pos`: from a live-lane object
    /// this process wrote lately, else from the object store.
    pub(crate) async fn read(&self, seg: i64, pos: u64, len: usize) -> std::result::Result<Vec<u8>, LogObjectError> {
        let kept = self.recent.lock().expect("log objects").iter().find(|(s, _)| *s == seg).map(|(_, b)| b.clone());
        if let Some(bytes) = kept
            && let Some(part) = bytes.get(pos as usize..pos as usize + len)
        {
            return Ok(part.to_vec());
        }
        self.objects.read_range(&key(seg), pos, len).await
    }

    fn keep_recent(&self, seg: i64, bytes: Vec<u8>) {
        if bytes.len() > RECENT_BYTES {
            return;
        }
        let mut r = self.recent.lock().expect("log objects");
        r.push_back((seg, Arc::new(bytes)));
        let mut total: usize = r.iter().map(|(_, b)| b.len()).sum();
        while total > RECENT_BYTES
            && let Some((_, b)) = r.pop_front()
        {
            total -= b.len();
        }
    }

    fn forget(&self, seg: i64) {
        self.recent.lock().expect("log objects").retain(|(s, _)| *s != seg);
    }

    /// Stores `data` in the next object of its lane and returns (segment,
    /// position) once that object is durable.
    pub(crate) async fn append(&self, store: &SqlStore, data: Vec<u8>) -> Result<(i64, i64)> {
        let lane = Lane::of(data.len());
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut p = self.lanes[lane as usize].lock().expect("log objects");
            p.waiting.push((data, tx));
            !std::mem::replace(&mut p.writing, true)
        };
        if start {
            // A task of its own: a request that gives up waiting does not
            // stop the write the others wait for.
            let store = store.clone();
            tokio::spawn(async move { write_lane(store, lane).await });
        }
        rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("the log object writer stopped".into())))
    }
}

/// Writes the lane's waiting chunks, one object at a time, until none wait.
async fn write_lane(store: SqlStore, lane: Lane) {
    let Some(segs) = store.log_files().objects.get() else { return };
    loop {
        let batch: Vec<(Vec<u8>, Reply)> = {
            let mut p = segs.lanes[lane as usize].lock().expect("log objects");
            let mut size = 0;
            let n = p
                .waiting
                .iter()
                .take_while(|(d, _)| {
                    let fits = size == 0 || size + d.len() <= MAX_OBJECT;
                    size += d.len();
                    fits
                })
                .count();
            if n == 0 {
                p.writing = false;
                return;
            }
            p.waiting.drain(..n).collect()
        };
        let size: usize = batch.iter().map(|(d, _)| d.len()).sum();
        let mut bytes = Vec::with_capacity(size);
        let mut places = Vec::with_capacity(batch.len());
        for (d, reply) in batch {
            places.push((bytes.len() as i64, reply));
            bytes.extend_from_slice(&d);
        }
        let written = async {
            let seg = new_segment(&store).await?;
            segs.objects
                .put(&key(seg), &bytes)
                .await
                .map_err(|e| StoreError::Unavailable(format!("cannot write log bytes: {e}")))?;
            Ok::<i64, StoreError>(seg)
        }
        .await;
        match &written {
            Ok(seg) if lane == Lane::Small => segs.keep_recent(*seg, bytes),
            _ => drop(bytes),
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

/// Deletes the objects older than `min_age_ms` ([`ORPHAN_AGE_MS`] for the
/// server's rounds) that no index row
/// refers to (their chunks were archived and trimmed, or never committed),
/// at most `limit` of them; how many.
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
        segs.forget(seg);
        match segs.objects.delete(&key(seg)).await {
            Ok(()) | Err(LogObjectError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(error = %e, seg, "cannot delete an unreferenced log object");
                continue;
            }
        }
        store.writer().await?.sql("DELETE FROM log_objects WHERE seg = $1").bind(seg).execute().await?;
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segments::SMALL_CHUNK;

    #[test]
    fn keys_are_fixed_width_and_valid_object_keys() {
        assert_eq!(key(42), "logs/segments/000000000042");
        assert!(key(i64::MAX).len() < 40);
    }

    #[test]
    fn a_small_chunk_is_in_the_small_lane() {
        assert_eq!(Lane::of(SMALL_CHUNK), Lane::Small);
        assert_eq!(Lane::of(SMALL_CHUNK + 1), Lane::Bulk);
    }
}
