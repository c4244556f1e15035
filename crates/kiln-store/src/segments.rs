//! Log bytes of the embedded SQLite store (issue 20): append-only segment
//! files beside the database, with only the index of each chunk (segment,
//! position, length, digest) in `log_chunks`. Writing the bytes through the
//! SQLite journal cost them twice (WAL, then checkpoint) plus the journal's
//! page overhead; here each byte is written once.
//!
//! Durability: a chunk's bytes are written and `fdatasync`ed before its
//! index row is committed (and so before it is acknowledged). Concurrent
//! chunks share their fsyncs (group commit): a writer whose bytes are down
//! waits for the first sync that *starts* after its write, and whoever
//! finds no sync running starts one for everybody.
//!
//! Two lanes (issue 20, write-to-browser latency under load): chunks of at
//! most [`SMALL_CHUNK`] bytes — live output a timer flushed — go to a
//! segment of their own, so their sync carries only other small chunks'
//! bytes, never the megabytes of bulk output written meanwhile (on ext4 an
//! `fdatasync` of one file waits for that file's dirty pages only: a 40-byte
//! sync beside a 16 MiB-per-sync writer took ~50 ms at p50 and up to
//! ~360 ms in the same file, ~2–7 ms at p50 in a file of its own). Each lane
//! does its own group commit; durability is the same in both.
//!
//! Each store that opens the directory appends to segments of its own
//! (new numbers, created exclusively), so two processes never write one
//! file. A segment is rotated at [`MAX_SEGMENT`] bytes and deleted once no
//! index row refers to it (after archival trimmed the journal).
//!
//! PostgreSQL keeps the bytes in the database: with several replicas a
//! local file would be on one replica only.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// A segment is closed for appends once it holds this many bytes.
pub(crate) const MAX_SEGMENT: u64 = 256 * 1024 * 1024;
/// Chunks up to this size go to the small lane: live output a timer
/// flushed (a stream below ~160 KB/s at the agent's 100 ms flush). The
/// agent cuts 64 KiB chunks from busier output, 1 MiB ones from a backlog:
/// those are bulk.
pub const SMALL_CHUNK: usize = 16 * 1024;

/// Which segment a chunk's bytes go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Chunks of at most [`SMALL_CHUNK`] bytes.
    Small = 0,
    Bulk = 1,
}

impl Lane {
    pub(crate) fn of(len: usize) -> Lane {
        if len <= SMALL_CHUNK { Lane::Small } else { Lane::Bulk }
    }
}

pub(crate) struct Segments {
    dir: PathBuf,
    /// The segment each lane appends to (indexed by `Lane as usize`).
    current: Mutex<[Option<Arc<Segment>>; 2]>,
    /// Held while the next segment is created.
    creating: tokio::sync::Mutex<()>,
    /// Read handles by segment number.
    readers: Mutex<HashMap<i64, Arc<File>>>,
    /// Numbers of the segments this store created.
    mine: Mutex<HashSet<i64>>,
}

/// The small lane writes zeros ahead of its appends, this many bytes at a
/// time: an append then overwrites blocks that are allocated and written,
/// so its `fdatasync` carries no metadata and needs no journal commit (on
/// ext4's default `data=ordered`, a journal commit also waits for the data
/// of blocks other files allocated meanwhile: the bulk lane's megabytes).
const ZERO_STEP: u64 = 1024 * 1024;

/// One segment open for appends.
struct Segment {
    no: i64,
    file: File,
    /// The small lane: bytes written with zeros ahead of the appends.
    zeroed: Option<tokio::sync::Mutex<u64>>,
    /// Bytes reserved (the next append's position).
    len: Mutex<u64>,
    sync: Mutex<SyncState>,
    synced: Notify,
}

#[derive(Default)]
struct SyncState {
    /// Syncs started; the one numbered `started` may be running.
    started: u64,
    /// The latest sync that completed.
    done: u64,
    running: bool,
}

fn io_err(e: io::Error) -> crate::error::StoreError {
    crate::error::StoreError::Unavailable(format!("log segment: {e}"))
}

impl Segments {
    /// The segment directory `dir` (created on first append).
    pub(crate) fn new(dir: PathBuf) -> Segments {
        Segments {
            dir,
            current: Mutex::new([None, None]),
            creating: tokio::sync::Mutex::new(()),
            readers: Mutex::new(HashMap::new()),
            mine: Mutex::new(HashSet::new()),
        }
    }

    fn path(dir: &Path, no: i64) -> PathBuf {
        dir.join(format!("{no:012}.seg"))
    }

    fn numbers(dir: &Path) -> io::Result<Vec<i64>> {
        let mut out = vec![];
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let name = e.file_name();
                    if let Some(n) = name.to_str().and_then(|s| s.strip_suffix(".seg")).and_then(|s| s.parse().ok()) {
                        out.push(n);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(out)
    }

    /// A new segment: the next free number, created exclusively, its
    /// directory entry synced.
    fn create(dir: &Path, lane: Lane) -> io::Result<Segment> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        // Log bytes can hold what a step printed: readable by the server's
        // user only, like the database.
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let mut no = Self::numbers(dir)?.into_iter().max().unwrap_or(0) + 1;
        let file = loop {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(Self::path(dir, no))
            {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => no += 1,
                Err(e) => return Err(e),
            }
        };
        File::open(dir)?.sync_all()?;
        Ok(Segment {
            no,
            file,
            zeroed: (lane == Lane::Small).then(|| tokio::sync::Mutex::new(0)),
            len: Mutex::new(0),
            sync: Mutex::new(SyncState::default()),
            synced: Notify::new(),
        })
    }

    /// Room for `len` bytes in the lane's current segment, if it has it.
    fn try_reserve(&self, lane: Lane, len: u64) -> Option<(Arc<Segment>, u64)> {
        let cur = self.current.lock().expect("segments");
        let seg = cur[lane as usize].as_ref()?;
        let mut l = seg.len.lock().expect("segment");
        if *l > 0 && *l + len > MAX_SEGMENT {
            return None;
        }
        let pos = *l;
        *l += len;
        Some((seg.clone(), pos))
    }

    /// The segment of `lane` to append `len` bytes to, and where.
    async fn reserve(&self, lane: Lane, len: u64) -> crate::Result<(Arc<Segment>, u64)> {
        if let Some(r) = self.try_reserve(lane, len) {
            return Ok(r);
        }
        // None yet, or the current one is full: one append opens the next.
        let _creating = self.creating.lock().await;
        if let Some(r) = self.try_reserve(lane, len) {
            return Ok(r);
        }
        let dir = self.dir.clone();
        let seg = tokio::task::spawn_blocking(move || Self::create(&dir, lane))
            .await
            .map_err(|e| io_err(io::Error::other(e)))?
            .map_err(io_err)?;
        let seg = Arc::new(seg);
        self.mine.lock().expect("segments").insert(seg.no);
        *seg.len.lock().expect("segment") = len;
        self.current.lock().expect("segments")[lane as usize] = Some(seg.clone());
        Ok((seg, 0))
    }

    /// Writes `data` to the current segment of its lane ([`Lane::of`]) and
    /// waits until it is durable; returns (segment, position), and the
    /// buffer back (whatever happened).
    pub(crate) async fn append(&self, data: Vec<u8>) -> (Vec<u8>, crate::Result<(i64, i64)>) {
        let (seg, pos) = match self.reserve(Lane::of(data.len()), data.len() as u64).await {
            Ok(r) => r,
            Err(e) => return (data, Err(e)),
        };
        if let Err(e) = seg.zero_ahead(pos + data.len() as u64).await {
            return (data, Err(io_err(e)));
        }
        let s = seg.clone();
        let (data, written) = match tokio::task::spawn_blocking(move || {
            let r = s.file.write_all_at(&data, pos);
            (data, r)
        })
        .await
        {
            Ok(r) => r,
            // The blocking pool is gone (runtime shutdown): the buffer with it.
            Err(e) => return (Vec::new(), Err(io_err(io::Error::other(e)))),
        };
        if let Err(e) = written {
            return (data, Err(io_err(e)));
        }
        let r = seg.sync().await.map_err(io_err).map(|()| (seg.no, pos as i64));
        (data, r)
    }

    /// `len` bytes of segment `no` at `pos`.
    pub(crate) async fn read(&self, no: i64, pos: i64, len: i64) -> io::Result<Vec<u8>> {
        let file = {
            let cached = self.readers.lock().expect("segments").get(&no).cloned();
            match cached {
                Some(f) => f,
                None => {
                    let f = Arc::new(File::open(Self::path(&self.dir, no))?);
                    self.readers.lock().expect("segments").insert(no, f.clone());
                    f
                }
            }
        };
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, pos as u64)?;
            Ok(buf)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// Deletes every segment but the current ones that no index row refers to.
    pub(crate) fn remove_unreferenced(&self, referenced: &HashSet<i64>) -> io::Result<usize> {
        let current: Vec<i64> = self.current.lock().expect("segments").iter().flatten().map(|s| s.no).collect();
        let mut removed = 0;
        for no in Self::numbers(&self.dir)? {
            if current.contains(&no) || referenced.contains(&no) {
                continue;
            }
            // Another process's current segment may be new and still
            // unreferenced: only segments this store created, and those
            // below the first of them, are ours to judge.
            let judge = {
                let mine = self.mine.lock().expect("segments");
                mine.contains(&no) || mine.iter().min().is_none_or(|&first| no < first)
            };
            if !judge {
                continue;
            }
            self.readers.lock().expect("segments").remove(&no);
            match std::fs::remove_file(Self::path(&self.dir, no)) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }
}

impl Segment {
    /// Small lane: makes sure the bytes before `end` were written (with
    /// zeros) before an append writes there. Each region is zeroed once,
    /// before any append in it: appends below the zeroed end go ahead.
    async fn zero_ahead(self: &Arc<Self>, end: u64) -> io::Result<()> {
        let Some(zeroed) = &self.zeroed else { return Ok(()) };
        let mut z = zeroed.lock().await;
        if *z >= end {
            return Ok(());
        }
        let (from, to) = (*z, end + ZERO_STEP);
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.file.write_all_at(&vec![0u8; (to - from) as usize], from))
            .await
            .map_err(io::Error::other)??;
        *z = to;
        Ok(())
    }

    /// Returns once a sync that started after this call began has completed
    /// (group commit: one `fdatasync` for every write finished before it).
    async fn sync(self: &Arc<Self>) -> io::Result<()> {
        let need = self.sync.lock().expect("sync state").started + 1;
        loop {
            let notified = self.synced.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let start = {
                let mut s = self.sync.lock().expect("sync state");
                if s.done >= need {
                    return Ok(());
                }
                if s.running {
                    None
                } else {
                    s.running = true;
                    s.started += 1;
                    Some(s.started)
                }
            };
            let Some(no) = start else {
                notified.await;
                continue;
            };
            let me = self.clone();
            let r = tokio::task::spawn_blocking(move || me.file.sync_data()).await.map_err(io::Error::other);
            let r = r.and_then(|r| r);
            {
                let mut s = self.sync.lock().expect("sync state");
                s.running = false;
                if r.is_ok() {
                    s.done = s.done.max(no);
                }
            }
            self.synced.notify_waiters();
            r?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appends_read_back_and_concurrent_appends_share_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let segs = Arc::new(Segments::new(dir.path().join("segs")));
        let mut tasks = vec![];
        for i in 0..32u8 {
            let segs = segs.clone();
            tasks.push(tokio::spawn(async move { (i, segs.append(vec![i; 1000 + i as usize]).await.1.unwrap()) }));
        }
        let mut placed = vec![];
        for t in tasks {
            placed.push(t.await.unwrap());
        }
        for (i, (no, pos)) in placed {
            assert_eq!(segs.read(no, pos, 1000 + i as i64).await.unwrap(), vec![i; 1000 + i as usize]);
        }
        let cur = segs.current.lock().unwrap()[Lane::Small as usize].clone().unwrap();
        assert!(segs.current.lock().unwrap()[Lane::Bulk as usize].is_none(), "small chunks only");
        let syncs = cur.sync.lock().unwrap().started;
        assert!((1..=32).contains(&syncs), "{syncs}");
        // Everything but the current segment, unreferenced, is removed.
        let empty = Segments::create(&dir.path().join("segs"), Lane::Bulk).unwrap();
        assert_eq!(segs.remove_unreferenced(&HashSet::new()).unwrap(), 0, "a later segment is another store's");
        drop(empty);
        let old = dir.path().join("segs").join(format!("{:012}.seg", cur.no - 1));
        std::fs::write(&old, b"").unwrap();
        assert_eq!(segs.remove_unreferenced(&HashSet::new()).unwrap(), 1);
        assert!(!old.exists());
        assert!(segs.read(cur.no, 0, 1).await.is_ok(), "the current segment stays");
    }

    /// A small chunk does not wait for (nor share) the sync of the bulk
    /// lane, and is still synced before its append returns.
    #[tokio::test]
    async fn a_small_chunk_is_synced_in_its_own_lane_while_a_bulk_sync_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let segs = Arc::new(Segments::new(dir.path().join("segs")));
        let big = vec![7u8; SMALL_CHUNK + 1];
        let (bulk_no, _) = segs.append(big.clone()).await.1.unwrap();
        let bulk = segs.current.lock().unwrap()[Lane::Bulk as usize].clone().unwrap();
        assert_eq!(bulk.no, bulk_no);
        // A bulk sync is running (it takes as long as the test wants).
        bulk.sync.lock().unwrap().running = true;
        let pending = tokio::spawn({
            let segs = segs.clone();
            let big = big.clone();
            async move { segs.append(big).await.1.unwrap() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!pending.is_finished(), "a bulk chunk waits for a sync that starts after its write");
        let (small_no, pos) = tokio::time::timeout(std::time::Duration::from_secs(10), segs.append(b"tick\n".to_vec()))
            .await
            .expect("the small chunk does not wait for the bulk lane's sync")
            .1
            .unwrap();
        assert_ne!(small_no, bulk_no, "a segment of its own");
        let small = segs.current.lock().unwrap()[Lane::Small as usize].clone().unwrap();
        let (done, running) = {
            let st = small.sync.lock().unwrap();
            (st.done, st.running)
        };
        assert!(done >= 1 && !running, "its own segment was synced after its write");
        assert_eq!(segs.read(small_no, pos, 5).await.unwrap(), b"tick\n");
        assert!(!pending.is_finished(), "the bulk chunk still waits");
        // The running bulk sync ends: the waiting chunk starts its own.
        bulk.sync.lock().unwrap().running = false;
        bulk.synced.notify_waiters();
        let (no, pos) = tokio::time::timeout(std::time::Duration::from_secs(10), pending).await.unwrap().unwrap();
        assert_eq!((no, segs.read(no, pos, big.len() as i64).await.unwrap()), (bulk_no, big));
        assert_eq!(bulk.sync.lock().unwrap().done, 2, "one sync for each bulk append");
        // Neither current segment is removed; an older one of ours is.
        assert_eq!(segs.remove_unreferenced(&HashSet::new()).unwrap(), 0);
    }
}
