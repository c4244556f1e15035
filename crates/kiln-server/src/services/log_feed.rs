//! The log feed of a job (spec 000 §13; invariant 7): every event after a
//! cursor (the SSE `Last-Event-ID`), from the archives in the object store
//! and the hot journal merged in event-id order, then live events as they
//! are committed, then `end` with the job's final status once the job is
//! terminal and nothing more is left. Event ids are the journal's chunk ids,
//! so a replay from any id means the same before and after archival.

use crate::log_index::Index;
use crate::state::{AppState, State};
use base64::Engine;
use futures::Stream;
use kiln_api as api;
use kiln_store::{LogArchive, LogChunkRecord};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// Events read per page.
const PAGE: u32 = 256;
/// A follower re-reads this often even without news (a lost wakeup, or a
/// change committed by another replica).
const POLL: Duration = Duration::from_secs(1);

/// One event of the feed, with its id.
#[derive(Debug, Clone)]
pub(crate) enum FeedEvent {
    /// Output bytes of an attempt.
    Chunk { id: i64, chunk: api::LogEvent },
    /// An attempt's stream was sealed (its end is known).
    Sealed { id: i64, data: String },
    /// Bytes of an attempt were lost (reported, never a clean end).
    Gap { id: i64, data: String },
    /// The job is terminal and every event was sent.
    End { id: i64, end: api::LogEnd },
}

impl FeedEvent {
    fn from_record(c: LogChunkRecord) -> FeedEvent {
        // `seal` and `gap` rows are events of the attempt, not bytes.
        match c.stream.as_str() {
            kiln_core::logs::stream::SEAL => {
                FeedEvent::Sealed { id: c.id, data: String::from_utf8_lossy(&c.data).into_owned() }
            }
            kiln_core::logs::stream::GAP => {
                FeedEvent::Gap { id: c.id, data: String::from_utf8_lossy(&c.data).into_owned() }
            }
            _ => FeedEvent::Chunk {
                id: c.id,
                chunk: api::LogEvent {
                    epoch: c.epoch,
                    stream: c.stream,
                    offset: c.offset,
                    data: base64::engine::general_purpose::STANDARD.encode(&c.data),
                    at_ms: c.at_ms,
                },
            },
        }
    }
}

async fn load_index(state: &AppState, a: &LogArchive) -> anyhow::Result<Arc<Index>> {
    if let Some(ix) = state.log_indexes.get(&a.index_key) {
        return Ok(ix);
    }
    let buf = state.blob.read_all(&a.index_key).await?;
    let ix: Arc<Index> = Arc::new(serde_json::from_slice(&buf)?);
    state.log_indexes.insert(&a.index_key, ix.clone());
    Ok(ix)
}

/// Up to `limit` log events of `job` with id greater than `after`, from
/// the archives and the journal, in id order.
pub(crate) async fn chunks_after(
    state: &AppState,
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
            out.push(LogChunkRecord {
                id: e.id,
                epoch: e.epoch,
                stream: e.stream.clone(),
                offset: e.offset,
                data,
                at_ms: e.at_ms,
            });
        }
    }
    if out.len() < limit as usize {
        let room = limit as usize - out.len();
        out.extend(journal.into_iter().filter(|c| c.id > archived_to).take(room));
    }
    Ok(out)
}

/// The feed of `job` after event `cursor`: 404 for an unknown job; the
/// stream ends after `End`, or when the reader goes away.
pub(crate) async fn follow(
    state: &State,
    job: &str,
    cursor: i64,
) -> crate::error::ApiResult<impl Stream<Item = FeedEvent> + use<>> {
    start(state, job, cursor, true).await
}

/// The feed of `job` after event `cursor` as far as it is written now
/// (`?follow=false`, `kiln logs` without `-f`): like [`follow`], but the
/// stream also ends, without `End`, once it has caught up with a job
/// that is still running (a job printing continuously never idles).
pub(crate) async fn snapshot(
    state: &State,
    job: &str,
    cursor: i64,
) -> crate::error::ApiResult<impl Stream<Item = FeedEvent> + use<>> {
    start(state, job, cursor, false).await
}

async fn start(
    state: &State,
    job: &str,
    cursor: i64,
    live: bool,
) -> crate::error::ApiResult<impl Stream<Item = FeedEvent> + use<>> {
    state.store.get_job(job).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<FeedEvent>(64);
    tokio::spawn(feed(state.clone(), job.to_string(), cursor, live, tx));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn feed(state: State, job: String, mut cursor: i64, live: bool, tx: tokio::sync::mpsc::Sender<FeedEvent>) {
    let mut events = state.job_events.subscribe();
    loop {
        let chunks = match chunks_after(&state, &job, cursor, PAGE).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(job, "cannot read log: {e:#}");
                return;
            }
        };
        let got = !chunks.is_empty();
        for c in chunks {
            cursor = c.id;
            if tx.send(FeedEvent::from_record(c)).await.is_err() {
                return;
            }
        }
        if got {
            continue;
        }
        let Ok(j) = state.store.get_job(&job).await else { return };
        if j.status.is_terminal() {
            // Chunks are acknowledged before completion: re-read once, then end.
            let rest = chunks_after(&state, &job, cursor, 1).await.unwrap_or_default();
            if rest.is_empty() {
                let end = api::LogEnd { status: j.status.into() };
                let _ = tx.send(FeedEvent::End { id: cursor, end }).await;
                return;
            }
            continue;
        }
        if !live {
            return;
        }
        // Wait for news about this job (or poll now and then).
        let deadline = tokio::time::sleep(POLL);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                m = events.recv() => match m {
                    Ok(id) if id == job => break,
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(_) => return,
                },
                _ = tx.closed() => return,
            }
        }
    }
}
