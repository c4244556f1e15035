//! Group commit of log index rows (issue 47, item 6). On PostgreSQL each
//! commit waits for a WAL flush, and the chunks of one stream commit one at
//! a time (`sequencer.rs`), so a loud stream's rate was bounded by one
//! flush per chunk. A chunk whose bytes are placed and whose turn has not
//! come yet waits here; the chunk whose turn it is (the leader) takes the
//! chunks of its stream that follow it without a gap and commits their
//! index rows with its own, in offset order, in one transaction.
//!
//! Each chunk is still judged alone, in that transaction, after the ones
//! before it (spec 000 §13: an identical retry accepted, a conflicting or
//! overlapping chunk refused, a stale epoch refused). The first follower
//! refused ends the group: the chunks before it commit, it gets its
//! refusal, and the ones after it are sent back ([`Answer::Alone`]) to wait
//! for their turn again, as if they had never been taken. A transaction
//! that fails sends every follower back. A follower keeps its own chunk, so
//! a leader that goes away (its request cancelled) leaves it to commit
//! itself (its own transaction then finds its row if the leader's
//! committed: an identical retry).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::oneshot;

/// A stream: (job, epoch, stream).
pub(crate) type Key = (String, i64, String);

/// Most chunks one leader commits at once.
pub(crate) const MAX_GROUP: usize = 32;

/// What a waiting chunk is told.
#[derive(Debug)]
pub(crate) enum Answer<R> {
    /// Committed (or refused) by a leader's transaction.
    Done(R),
    /// Not committed: wait for the turn again.
    Alone,
}

struct Entry<T, R> {
    len: i64,
    item: T,
    reply: oneshot::Sender<Answer<R>>,
}

/// One stream's waiting chunks by (offset, id).
type Queue<T, R> = BTreeMap<(i64, u64), Entry<T, R>>;

/// The chunks waiting for their turn, per stream.
pub(crate) struct Groups<T, R> {
    waiting: Mutex<HashMap<Key, Queue<T, R>>>,
    next_id: AtomicU64,
}

impl<T, R> Default for Groups<T, R> {
    fn default() -> Self {
        Groups { waiting: Mutex::default(), next_id: AtomicU64::new(0) }
    }
}

/// A chunk waiting in [`Groups`]; leaves when dropped.
pub(crate) struct Posted<'a, T, R> {
    groups: &'a Groups<T, R>,
    key: Key,
    at: (i64, u64),
    rx: oneshot::Receiver<Answer<R>>,
}

/// A chunk a leader took: answer it with [`Taken::answer`] (dropped
/// unanswered, it is sent back).
pub(crate) struct Taken<T, R> {
    pub(crate) item: T,
    reply: oneshot::Sender<Answer<R>>,
}

impl<T, R> Taken<T, R> {
    pub(crate) fn answer(self, a: Answer<R>) {
        let _ = self.reply.send(a);
    }
}

impl<T, R> Groups<T, R> {
    /// `item`, the chunk of `len` bytes at `offset` of `key`, waits to be taken.
    pub(crate) fn post(&self, key: &Key, offset: i64, len: i64, item: T) -> Posted<'_, T, R> {
        let (reply, rx) = oneshot::channel();
        let at = (offset, self.next_id.fetch_add(1, Ordering::Relaxed));
        self.waiting.lock().expect("log groups").entry(key.clone()).or_default().insert(at, Entry { len, item, reply });
        Posted { groups: self, key: key.clone(), at, rx }
    }

    /// The chunks of `key` that follow `end` without a gap (at most
    /// `max`), in offset order, taken out of the waiting ones.
    pub(crate) fn take_after(&self, key: &Key, mut end: i64, max: usize) -> Vec<Taken<T, R>> {
        let mut map = self.waiting.lock().expect("log groups");
        let Some(w) = map.get_mut(key) else { return vec![] };
        let mut out = vec![];
        while out.len() < max {
            let Some(&at) = w.range((end, 0)..=(end, u64::MAX)).next().map(|(at, _)| at) else { break };
            let e = w.remove(&at).expect("present");
            end += e.len;
            out.push(Taken { item: e.item, reply: e.reply });
        }
        if w.is_empty() {
            map.remove(key);
        }
        out
    }

    /// How many chunks wait, in all streams.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.lock().expect("log groups").values().map(BTreeMap::len).sum()
    }

    fn remove(&self, key: &Key, at: (i64, u64)) -> bool {
        let mut map = self.waiting.lock().expect("log groups");
        let Some(w) = map.get_mut(key) else { return false };
        let was = w.remove(&at).is_some();
        if w.is_empty() {
            map.remove(key);
        }
        was
    }
}

impl<T, R> Posted<'_, T, R> {
    /// The answer of the leader that took this chunk (a leader that went
    /// away unanswered: [`Answer::Alone`]).
    pub(crate) async fn answer(&mut self) -> Answer<R> {
        (&mut self.rx).await.unwrap_or(Answer::Alone)
    }

    /// Leaves, if no leader took this chunk: then true (the caller leads).
    /// Else false: a leader has it, and [`Posted::answer`] says what came of it.
    pub(crate) fn withdraw(&self) -> bool {
        self.groups.remove(&self.key, self.at)
    }
}

impl<T, R> Drop for Posted<'_, T, R> {
    fn drop(&mut self) {
        self.groups.remove(&self.key, self.at);
    }
}

/// A log chunk waiting for its turn, placed (`tx::logs`): what its
/// group's leader commits for it.
pub(crate) struct Waiting {
    pub(crate) chunk: crate::model::NewLogChunk,
    pub(crate) len: i64,
    pub(crate) placed: Option<(i64, i64)>,
}

/// Log chunks waiting for their turn (`LogFiles::groups`).
pub(crate) type ChunkGroups = Groups<Waiting, crate::error::Result<Vec<(String, i64)>>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        ("j".into(), 1, "stdout".into())
    }

    #[tokio::test]
    async fn a_leader_takes_the_chunks_that_follow_it_without_a_gap() {
        let g: Groups<&str, u32> = Groups::default();
        let mut b = g.post(&key(), 10, 10, "b");
        let mut c = g.post(&key(), 20, 5, "c");
        let _far = g.post(&key(), 30, 5, "far: after a gap");
        let _other = g.post(&("j".into(), 1, "stderr".into()), 10, 5, "another stream");
        let taken = g.take_after(&key(), 10, MAX_GROUP);
        assert_eq!(taken.iter().map(|t| t.item).collect::<Vec<_>>(), ["b", "c"]);
        assert!(!b.withdraw() && !c.withdraw(), "taken: a leader answers them");
        let mut it = taken.into_iter();
        it.next().unwrap().answer(Answer::Done(7));
        drop(it); // c unanswered: sent back
        assert!(matches!(b.answer().await, Answer::Done(7)));
        assert!(matches!(c.answer().await, Answer::Alone));
        assert!(g.take_after(&key(), 25, MAX_GROUP).is_empty(), "nothing at 25");
    }

    #[test]
    fn a_chunk_that_leads_or_goes_away_leaves_nothing_behind() {
        let g: Groups<(), ()> = Groups::default();
        let a = g.post(&key(), 0, 4, ());
        assert!(a.withdraw(), "not taken: it leads");
        drop(a);
        drop(g.post(&key(), 4, 4, ()));
        assert!(g.waiting.lock().unwrap().is_empty());
    }

    #[test]
    fn a_group_is_at_most_max_chunks_and_one_of_each_offset() {
        let g: Groups<i64, ()> = Groups::default();
        let posted: Vec<_> = (0..MAX_GROUP as i64 + 3).map(|i| g.post(&key(), i, 1, i)).collect();
        // A second chunk at offset 1 (a retry in flight with the original).
        let _dup = g.post(&key(), 1, 1, -1);
        let taken = g.take_after(&key(), 0, MAX_GROUP);
        assert_eq!(taken.len(), MAX_GROUP);
        assert_eq!(taken.iter().map(|t| t.item).collect::<Vec<_>>(), (0..MAX_GROUP as i64).collect::<Vec<_>>());
        drop(posted);
    }
}
