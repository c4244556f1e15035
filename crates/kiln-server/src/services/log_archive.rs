//! Archival of finished logs (spec 000 §13): the hot journal (the store's
//! log chunks) is copied to the object store as one immutable segment (the
//! chunks' bytes in event-id order) plus an index, and only then — in the
//! transaction that records the archive — trimmed. Nothing is trimmed that
//! is not stored; `log_feed` merges archives and journal so event ids mean
//! the same before and after.

use crate::log_index::{Index, IndexEntry};
use crate::state::AppState;
use kiln_store::LogArchive;
use sha2::{Digest, Sha256};

/// Chunks read from the journal per archival page.
const PAGE: u32 = 512;
/// Largest segment: a longer log is archived as several.
const MAX_SEGMENT: usize = 256 * 1024 * 1024;

/// Archive what the journal holds of `job`'s log, segment by segment.
/// Returns the archives written. Nothing is trimmed unless its segment and
/// index are stored.
pub(crate) async fn archive_job(state: &AppState, job: &str) -> anyhow::Result<Vec<LogArchive>> {
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
