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
//! Each store that opens the directory appends to a segment of its own
//! (a new number, created exclusively), so two processes never write one
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

pub(crate) struct Segments {
    dir: PathBuf,
    current: Mutex<Option<Arc<Segment>>>,
    /// Held while the next segment is created.
    creating: tokio::sync::Mutex<()>,
    /// Read handles by segment number.
    readers: Mutex<HashMap<i64, Arc<File>>>,
}

/// One segment open for appends.
struct Segment {
    no: i64,
    file: File,
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
            current: Mutex::new(None),
            creating: tokio::sync::Mutex::new(()),
            readers: Mutex::new(HashMap::new()),
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
    fn create(dir: &Path) -> io::Result<Segment> {
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
        Ok(Segment { no, file, len: Mutex::new(0), sync: Mutex::new(SyncState::default()), synced: Notify::new() })
    }

    /// Room for `len` bytes in the current segment, if it has it.
    fn try_reserve(&self, len: u64) -> Option<(Arc<Segment>, u64)> {
        let cur = self.current.lock().expect("segments");
        let seg = cur.as_ref()?;
        let mut l = seg.len.lock().expect("segment");
        if *l > 0 && *l + len > MAX_SEGMENT {
            return None;
        }
        let pos = *l;
        *l += len;
        Some((seg.clone(), pos))
    }

    /// The segment to append `len` bytes to, and where.
    async fn reserve(&self, len: u64) -> crate::Result<(Arc<Segment>, u64)> {
        if let Some(r) = self.try_reserve(len) {
            return Ok(r);
        }
        // None yet, or the current one is full: one append opens the next.
        let _creating = self.creating.lock().await;
        if let Some(r) = self.try_reserve(len) {
            return Ok(r);
        }
        let dir = self.dir.clone();
        let seg = tokio::task::spawn_blocking(move || Self::create(&dir))
            .await
            .map_err(|e| io_err(io::Error::other(e)))?
            .map_err(io_err)?;
        let seg = Arc::new(seg);
        *seg.len.lock().expect("segment") = len;
        *self.current.lock().expect("segments") = Some(seg.clone());
        Ok((seg, 0))
    }

    /// Writes `data` to the current segment and waits until it is durable;
    /// returns (segment, position).
    pub(crate) async fn append(&self, data: Vec<u8>) -> crate::Result<(i64, i64)> {
        let (seg, pos) = self.reserve(data.len() as u64).await?;
        let s = seg.clone();
        tokio::task::spawn_blocking(move || s.file.write_all_at(&data, pos))
            .await
            .map_err(|e| io_err(io::Error::other(e)))?
            .map_err(io_err)?;
        seg.sync().await.map_err(io_err)?;
        Ok((seg.no, pos as i64))
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

    /// Deletes every segment but the current one that no index row refers to.
    pub(crate) fn remove_unreferenced(&self, referenced: &HashSet<i64>) -> io::Result<usize> {
        let current = self.current.lock().expect("segments").as_ref().map(|s| s.no);
        let mut removed = 0;
        for no in Self::numbers(&self.dir)? {
            if Some(no) == current || referenced.contains(&no) {
                continue;
            }
            // Another process's current segment may be new and still
            // unreferenced: only segments below ours are ours to judge.
            if current.is_some_and(|c| no > c) {
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
            tasks.push(tokio::spawn(async move { (i, segs.append(vec![i; 1000 + i as usize]).await.unwrap()) }));
        }
        let mut placed = vec![];
        for t in tasks {
            placed.push(t.await.unwrap());
        }
        for (i, (no, pos)) in placed {
            assert_eq!(segs.read(no, pos, 1000 + i as i64).await.unwrap(), vec![i; 1000 + i as usize]);
        }
        let cur = segs.current.lock().unwrap().clone().unwrap();
        let syncs = cur.sync.lock().unwrap().started;
        assert!((1..=32).contains(&syncs), "{syncs}");
        // Everything but the current segment, unreferenced, is removed.
        let empty = Segments::create(&dir.path().join("segs")).unwrap();
        assert_eq!(segs.remove_unreferenced(&HashSet::new()).unwrap(), 0, "a later segment is another store's");
        drop(empty);
        let old = dir.path().join("segs").join(format!("{:012}.seg", cur.no - 1));
        std::fs::write(&old, b"").unwrap();
        assert_eq!(segs.remove_unreferenced(&HashSet::new()).unwrap(), 1);
        assert!(!old.exists());
        assert!(segs.read(cur.no, 0, 1).await.is_ok(), "the current segment stays");
    }
}
