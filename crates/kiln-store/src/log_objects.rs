//! Log bytes of the PostgreSQL store in the object store (issue 47, item 6):
//! only the index of each chunk (segment, position, length, digest) is in
//! `log_chunks`, as on SQLite; the bytes are in immutable objects
//! `logs/segments/NNNNNNNNNNNN` that every replica reads (a segment file on
//! one replica's disk would be on that replica only).
//!
//! Group commit, as the SQLite segments do it with `fdatasync`: chunks that
//! arrive while the lane's objects are being written wait together and go
//! out as the next object, each acknowledged once its object is durable (the object
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

use crate::error::Result;
use crate::segments::Lane;
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Where the PostgreSQL store keeps log bytes: the server's object store.
/// Errors are messages; `read_range` of an object that is gone says so with
/// [`LogObjectError::NotFound`].
#[async_trait]
pub trait LogObjects: Send + Sync {
    /// Publish the concatenation of `parts` (the chunks of one object, in
    /// order) as the immutable object `key`, durably. The parts are given,
    /// not lent: a local store writes them as they are, with no copy of the
    /// whole object (issue 47, item 6).
    async fn put(&self, key: &str, parts: Vec<Vec<u8>>) -> std::result::Result<(), LogObjectError>;
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

pub(crate) type Reply = oneshot::Sender<Result<(i64, i64)>>;

#[derive(Default)]
struct Pending {
    waiting: Vec<(Vec<u8>, Reply)>,
    /// Tasks writing objects of this lane (each takes what waits when it
    /// is done).
    writers: usize,
}

/// Objects of a lane written at once: the bulk lane's second writer takes
/// the chunks that arrive while the first one's object is being written and
/// synced, so a loud stream's bytes are not held up by one sync at a time
/// (issue 47, item 6: with one writer, a stream's chunks waited ~80 ms for
/// it). The live lane keeps one (its objects are small).
fn max_writers(lane: Lane) -> usize {
    match lane {
        Lane::Small => 1,
        Lane::Bulk => 2,
    }
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

    pub(crate) fn keep_recent(&self, seg: i64, bytes: Vec<u8>) {
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

    /// Queues `data` in its lane: the receiver of its (segment, position),
    /// and whether the caller must start a writer of the lane (fewer than
    /// [`max_writers`] run).
    pub(crate) fn enqueue(&self, data: Vec<u8>) -> (oneshot::Receiver<Result<(i64, i64)>>, Option<Lane>) {
        let lane = Lane::of(data.len());
        let (tx, rx) = oneshot::channel();
        let mut p = self.lanes[lane as usize].lock().expect("log objects");
        p.waiting.push((data, tx));
        // A writer that is not writing takes what waits already: another
        // one starts only while every one of them is busy.
        let start = p.writers < max_writers(lane);
        if start {
            p.writers += 1;
        }
        (rx, start.then_some(lane))
    }

    /// The next object's chunks of `lane` (at least one, up to
    /// [`MAX_OBJECT`] bytes), or None — and the lane's writer ends — when
    /// none wait.
    pub(crate) fn next_batch(&self, lane: Lane) -> Option<Vec<(Vec<u8>, Reply)>> {
        let mut p = self.lanes[lane as usize].lock().expect("log objects");
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
            p.writers -= 1;
            return None;
        }
        Some(p.waiting.drain(..n).collect())
    }

    /// Whether chunks of `lane` wait for an object.
    pub(crate) fn more_waiting(&self, lane: Lane) -> bool {
        !self.lanes[lane as usize].lock().expect("log objects").waiting.is_empty()
    }

    /// Publishes segment `seg`'s bytes, the concatenation of `parts`
    /// (durable when this returns).
    pub(crate) async fn put(&self, seg: i64, parts: Vec<Vec<u8>>) -> std::result::Result<(), LogObjectError> {
        self.objects.put(&key(seg), parts).await
    }

    /// Deletes segment `seg`'s object (gone already is fine).
    pub(crate) async fn delete(&self, seg: i64) -> std::result::Result<(), LogObjectError> {
        self.forget(seg);
        match self.objects.delete(&key(seg)).await {
            Ok(()) | Err(LogObjectError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
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
