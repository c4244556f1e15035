//! Commit order of log chunks that arrive together (issue 20): an agent may
//! have several chunks of one stream in flight. Their bytes are made
//! durable concurrently, but a chunk's index row commits only after every
//! earlier chunk (lower offset) of the same (job, epoch, stream) that this
//! process is handling has finished, so event ids — the SSE cursor and the
//! order a reader sees — follow the byte offsets as they did with one chunk
//! in flight. A chunk waits while an earlier chunk of its stream is in
//! flight in this process, and — since concurrent requests may arrive in
//! either order — for at most [`ARRIVAL_WAIT`] while the end of the last
//! chunk of the stream this process committed is short of the chunk's offset.
//! A chunk whose predecessor never comes (skipped by the agent, or sent to
//! another replica) so commits after that short wait, as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

type Key = (String, i64, String);

/// Longest a chunk waits for a predecessor that is not (yet) in flight here.
pub(crate) const ARRIVAL_WAIT: Duration = Duration::from_millis(200);
/// Streams whose committed end is remembered; beyond, the memory is cleared.
const REMEMBERED: usize = 10_000;

#[derive(Default)]
pub(crate) struct Sequencer {
    /// In-flight chunks per stream: (offset, ticket id).
    inflight: Mutex<HashMap<Key, Vec<(i64, u64)>>>,
    /// The end of the furthest chunk of each stream this process committed.
    committed: Mutex<HashMap<Key, i64>>,
    next_id: std::sync::atomic::AtomicU64,
    left: Notify,
}

/// A chunk in flight; leaves (waking its successors) when dropped.
pub(crate) struct Ticket<'a> {
    seq: &'a Sequencer,
    key: Key,
    offset: i64,
    id: u64,
}

impl Sequencer {
    pub(crate) fn enter(&self, job: &str, epoch: i64, stream: &str, offset: i64) -> Ticket<'_> {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = (job.to_string(), epoch, stream.to_string());
        self.inflight.lock().expect("sequencer").entry(key.clone()).or_default().push((offset, id));
        Ticket { seq: self, key, offset, id }
    }

    /// Whether this process committed the stream's bytes up to `offset`.
    pub(crate) fn covers(&self, job: &str, epoch: i64, stream: &str, offset: i64) -> bool {
        let key = (job.to_string(), epoch, stream.to_string());
        self.committed.lock().expect("sequencer").get(&key).is_some_and(|&end| end >= offset)
    }

    /// Whether this process committed chunks of the stream, none of them
    /// ending past `offset` (a chunk at `offset` is then new, not a retry,
    /// unless another process committed it).
    pub(crate) fn fresh(&self, job: &str, epoch: i64, stream: &str, offset: i64) -> bool {
        let key = (job.to_string(), epoch, stream.to_string());
        self.committed.lock().expect("sequencer").get(&key).is_some_and(|&end| end <= offset)
    }

    /// Records a committed chunk of a stream ending at `end`.
    pub(crate) fn committed(&self, job: &str, epoch: i64, stream: &str, end: i64) {
        {
            let mut map = self.committed.lock().expect("sequencer");
            if map.len() >= REMEMBERED {
                map.clear();
            }
            let e = map.entry((job.to_string(), epoch, stream.to_string())).or_insert(end);
            *e = (*e).max(end);
        }
        self.left.notify_waiters();
    }
}

impl Ticket<'_> {
    /// Waits until no earlier chunk of the stream is in flight here, and
    /// (for at most [`ARRIVAL_WAIT`]) until the bytes before this chunk
    /// are committed.
    pub(crate) async fn wait_turn(&self) {
        let until = tokio::time::Instant::now() + ARRIVAL_WAIT;
        loop {
            let left = self.seq.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            let earlier = self
                .seq
                .inflight
                .lock()
                .expect("sequencer")
                .get(&self.key)
                .is_some_and(|v| v.iter().any(|&(o, id)| o < self.offset && id != self.id));
            if earlier {
                left.await;
                continue;
            }
            let short =
                self.seq.committed.lock().expect("sequencer").get(&self.key).is_some_and(|&end| end < self.offset);
            if !short || tokio::time::Instant::now() >= until {
                return;
            }
            let _ = tokio::time::timeout_at(until, left).await;
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        {
            let mut map = self.seq.inflight.lock().expect("sequencer");
            if let Some(v) = map.get_mut(&self.key) {
                v.retain(|&(_, id)| id != self.id);
                if v.is_empty() {
                    map.remove(&self.key);
                }
            }
        }
        self.seq.left.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_chunk_waits_for_earlier_ones_of_its_stream_only() {
        let s = Arc::new(Sequencer::default());
        let first = s.enter("j", 1, "stdout", 0);
        let other = s.enter("j", 1, "stderr", 0);
        let second = s.enter("j", 1, "stdout", 10);
        tokio::time::timeout(Duration::from_millis(50), other.wait_turn()).await.expect("another stream: no wait");
        tokio::time::timeout(Duration::from_millis(50), first.wait_turn()).await.expect("the first: no wait");
        assert!(tokio::time::timeout(Duration::from_millis(50), second.wait_turn()).await.is_err(), "waits");
        drop(first);
        tokio::time::timeout(Duration::from_millis(50), second.wait_turn()).await.expect("its turn");
        drop((second, other));
        assert!(s.inflight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_chunk_that_arrived_early_waits_briefly_for_its_predecessor() {
        let s = Sequencer::default();
        s.committed("j", 1, "stdout", 10);
        let early = s.enter("j", 1, "stdout", 20);
        let t = tokio::time::Instant::now();
        {
            let wait = early.wait_turn();
            tokio::pin!(wait);
            assert!(tokio::time::timeout(Duration::from_millis(20), &mut wait).await.is_err(), "waits for 10..20");
            s.committed("j", 1, "stdout", 20);
            tokio::time::timeout(Duration::from_millis(50), &mut wait).await.expect("the gap closed");
        }
        drop(early);
        // A predecessor that never comes: at most ARRIVAL_WAIT.
        let lonely = s.enter("j", 1, "stdout", 99);
        lonely.wait_turn().await;
        assert!(t.elapsed() >= ARRIVAL_WAIT && t.elapsed() < ARRIVAL_WAIT * 5);
    }
}
