//! Archival of finished logs (spec 000 §13): the hot journal (the store's
//! log chunks) is copied to the object store as one immutable segment (the
//! chunks' bytes in event-id order) plus an index, and only then — in the
//! transaction that records the archive — trimmed. Readers merge archives
//! and the journal, so event ids and replay from `Last-Event-ID` mean the
//! same before and after archival.

use crate::State;
use kiln_store::{LogArchive, LogChunkRecord};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Chunks read from the journal per archival page.
const PAGE: u32 = 512;
/// Largest segment: a longer log is archived as several.
const MAX_SEGMENT: usize = 256 * 1024 * 1024;
/// Parsed indexes kept in memory for replays.
const INDEX_CACHE: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Index {
    pub job_id: String,
    pub chunks: Vec<IndexEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct IndexEntry {
    pub id: i64,
    pub epoch: i64,
    pub stream: String,
    pub offset: i64,
    /// Where the chunk's bytes are in the segment.
    pub pos: u64,
    pub length: u64,
    pub sha256: String,
}

/// Archive what the journal holds of `job`'s log, segment by segment.
/// Returns the archives written. Nothing is trimmed unless its segment and
/// index are stored.
pub(crate) async fn archive_job(state: &State, job: &str) -> anyhow::Result<Vec<LogArchive>> {
    let mut done = vec![];
    let mut cursor = 0;
    loop {
        let mut segment = Vec::new();
        let mut entries = Vec::new();
        loop {
            let rows = state.store.log_chunks_after(job, cursor, PAGE).await?;
            let more = rows.len() == PAGE as usize;
            for c in rows {
                cursor = c.id;
                entries.push(IndexEntry {
                    id: c.id,
                    epoch: c.epoch,
                    stream: c.stream,
                    offset: c.offset,
                    pos: segment.len() as u64,
                    length: c.data.len() as u64,
                    sha256: hex::encode(Sha256::digest(&c.data)),
                });
                segment.extend_from_slice(&c.data);
            }
            if !more || segment.len() >= MAX_SEGMENT {
                break;
            }
        }
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(done);
        };
        let (first_id, last_id, chunks) = (first.id, last.id, entries.len() as i64);
        let base = format!("logs/{job}/{first_id:012}-{last_id:012}");
        let index = Index { job_id: job.to_string(), chunks: entries };
        let archive = LogArchive {
            job_id: job.to_string(),
            first_id,
            last_id,
            segment_key: format!("{base}.seg"),
            index_key: format!("{base}.idx.json"),
            chunks,
            bytes: segment.len() as i64,
        };
        state.blob.put_object(&archive.segment_key, &segment).await?;
        state.blob.put_object(&archive.index_key, &serde_json::to_vec(&index)?).await?;
        state.store.record_log_archive(&archive).await?;
        tracing::info!(job, first_id, last_id, chunks, bytes = archive.bytes, "archived log segment");
        done.push(archive);
    }
}

async fn load_index(state: &State, a: &LogArchive) -> anyhow::Result<Arc<Index>> {
    if let Some(ix) = state.log_indexes.lock().expect("index cache").get(&a.index_key) {
        return Ok(ix.clone());
    }
    let buf = state.blob.read_all(&a.index_key).await?;
    let ix: Arc<Index> = Arc::new(serde_json::from_slice(&buf)?);
    let mut cache = state.log_indexes.lock().expect("index cache");
    if cache.len() >= INDEX_CACHE {
        cache.clear();
    }
    cache.insert(a.index_key.clone(), ix.clone());
    Ok(ix)
}

/// Up to `limit` log events of `job` with id greater than `after`, from
/// the archives and the journal, in id order.
pub(crate) async fn chunks_after(
    state: &State,
    job: &str,
    after: i64,
    limit: u32,
) -> anyhow::Result<Vec<LogChunkRecord>> {
    // The journal first, then the archive list: chunks trimmed between the
    // two reads are in an archive we then see, and journal rows that were
    // archived meanwhile are dropped as duplicates below.
    let journal = state.store.log_chunks_after(job, after, limit).await?;
    let archives = state.store.log_archives(job).await?;
    let mut out = Vec::new();
    let mut archived_to = after;
    for a in archives.iter().filter(|a| a.last_id > after) {
        archived_to = archived_to.max(a.last_id);
        if out.len() >= limit as usize {
            continue;
        }
        let ix = load_index(state, a).await?;
        for e in ix.chunks.iter().filter(|e| e.id > after).take(limit as usize - out.len()) {
            let data = state.blob.read_range(&a.segment_key, e.pos, e.length as usize).await?;
            if hex::encode(Sha256::digest(&data)) != e.sha256 {
                anyhow::bail!("archived log segment {} is corrupt at chunk {}", a.segment_key, e.id);
            }
            out.push(LogChunkRecord { id: e.id, epoch: e.epoch, stream: e.stream.clone(), offset: e.offset, data });
        }
    }
    if out.len() < limit as usize {
        let room = limit as usize - out.len();
        out.extend(journal.into_iter().filter(|c| c.id > archived_to).take(room));
    }
    Ok(out)
}
