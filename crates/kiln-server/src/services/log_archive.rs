//! Archival of finished logs (spec 000 §13): the hot journal (the store's
//! log chunks) is copied to the object store as one immutable segment (the
//! chunks' bytes in event-id order) plus an index, and only then — in the
//! transaction that records the archive — trimmed. Nothing is trimmed that
//! is not stored; `log_feed` merges archives and journal so event ids mean
//! the same before and after.
//!
//! The archive is what stays: a value of any secret of the repository that
//! a trusted run could see is masked in it (`*` for each byte, so offsets
//! and lengths keep their meaning), even if the job never declared it and
//! so the agent could not mask it. A value split across two chunks is not
//! caught here.

use crate::log_index::{Index, IndexEntry};
use crate::state::AppState;
use kiln_store::LogArchive;
use sha2::{Digest, Sha256};

/// The object store as the PostgreSQL store's home for log bytes (issue 47,
/// item 6): the journal's index stays in the database, the bytes do not.
pub(crate) struct LogObjectsIn(pub(crate) kiln_blob::BlobStore);

#[async_trait::async_trait]
impl kiln_store::LogObjects for LogObjectsIn {
    async fn put(&self, key: &str, parts: Vec<Vec<u8>>) -> Result<(), kiln_store::LogObjectError> {
        self.0.put_parts(key, parts).await.map_err(blob_err)
    }

    async fn read_range(&self, key: &str, offset: u64, len: usize) -> Result<Vec<u8>, kiln_store::LogObjectError> {
        self.0.read_range(key, offset, len).await.map_err(blob_err)
    }

    async fn delete(&self, key: &str) -> Result<(), kiln_store::LogObjectError> {
        self.0.delete(key).await.map_err(blob_err)
    }
}

fn blob_err(e: kiln_blob::BlobError) -> kiln_store::LogObjectError {
    match e {
        kiln_blob::BlobError::NotFound(k) => kiln_store::LogObjectError::NotFound(k),
        e => kiln_store::LogObjectError::Other(e.to_string()),
    }
}

/// Chunks read from the journal per archival page.
const PAGE: u32 = 512;
/// Largest segment: a longer log is archived as several.
const MAX_SEGMENT: usize = 256 * 1024 * 1024;

/// Archive what the journal holds of `job`'s log, segment by segment.
/// Returns the archives written. Nothing is trimmed unless its segment and
/// index are stored.
pub(crate) async fn archive_job(state: &AppState, job: &str) -> anyhow::Result<Vec<LogArchive>> {
    let secrets = visible_secrets(state, job).await?;
    let mut done = vec![];
    let mut cursor = 0;
    loop {
        let mut segment = Vec::new();
        let mut entries = Vec::new();
        loop {
            let rows = state.store.log_chunks_after(job, cursor, PAGE).await?;
            let more = rows.len() == PAGE as usize;
            for mut c in rows {
                cursor = c.id;
                mask(&mut c.data, &secrets);
                entries.push(IndexEntry {
                    id: c.id,
                    epoch: c.epoch,
                    stream: c.stream,
                    offset: c.offset,
                    pos: segment.len() as u64,
                    length: c.data.len() as u64,
                    sha256: hex::encode(Sha256::digest(&c.data)),
                    at_ms: c.at_ms,
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

/// Secret values shorter than this are not masked (they would mask ordinary
/// text).
const MIN_MASKED: usize = 4;

/// The values of every secret of the job's repository if its run was
/// trusted (an untrusted run could see none).
async fn visible_secrets(state: &AppState, job: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let job = state.store.get_job(job).await?;
    let run = state.store.get_run(&job.run_id).await?.run;
    if !run.trust.parse::<kiln_core::Trust>().is_ok_and(kiln_core::Trust::may_read_secrets) {
        return Ok(vec![]);
    }
    // A deploy job also saw its environment's secrets (issue 46).
    let env_scope = usize::try_from(job.index)
        .ok()
        .and_then(|i| run.definition.jobs.get(i))
        .and_then(|d| d.environment.as_ref())
        .map(|e| kiln_store::env_secret_scope(&e.name));
    let job = job.id;
    let job = job.as_str();
    let mut out = Vec::new();
    for (repo_id, name, stored) in state.store.all_secrets().await? {
        if repo_id != run.repo_id && Some(&repo_id) != env_scope.as_ref() {
            continue;
        }
        match state.secrets.open(&repo_id, &name, &stored) {
            Ok(v) if v.len() >= MIN_MASKED => out.push(v.into_bytes()),
            Ok(_) => {}
            Err(e) => tracing::warn!(job, secret = %name, "cannot open a secret to mask it in the archive: {e}"),
        }
    }
    Ok(out)
}

/// Overwrite every occurrence of each value in `data` with `*`s.
pub(crate) fn mask(data: &mut [u8], values: &[Vec<u8>]) {
    for v in values {
        if v.is_empty() || v.len() > data.len() {
            continue;
        }
        let mut i = 0;
        while i + v.len() <= data.len() {
            if data[i..i + v.len()] == v[..] {
                data[i..i + v.len()].fill(b'*');
                i += v.len();
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mask_overwrites_every_occurrence_keeping_the_length() {
        let mut data = b"a hunter2 b hunter2hunter2 c".to_vec();
        super::mask(&mut data, &[b"hunter2".to_vec(), b"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz".to_vec()]);
        assert_eq!(data, b"a ******* b ************** c");
        let mut short = b"abc".to_vec();
        super::mask(&mut short, &[b"abcd".to_vec(), vec![]]);
        assert_eq!(short, b"abc");
    }
}
