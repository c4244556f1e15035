//! Log chunks (spec 000 §13, invariant 7): chunks are identified by (job,
//! epoch, stream, offset) with a digest; an identical retry is accepted, a
//! conflicting or overlapping one refused, a stale epoch refused. The hot
//! journal is archived to the object store and trimmed in one transaction.

use crate::db::{Exec, Tx};
use crate::dialect::{Isolation, Sql, terminal_jobs};
use crate::error::parse_enum;
use crate::error::{Result, StoreError};
use crate::log_groups::{Answer, MAX_GROUP};
use crate::model::{LogArchive, LogChunkRecord, NewLogChunk};
use crate::store::{SqlStore, lock_job};
use kiln_core::lease::{AttemptLease, check_live};

/// Where a chunk lands: an existing chunk at its offset (length, digest),
/// the end of the closest chunk before, the start of the closest after.
struct Landing {
    existing: Option<(i64, Option<String>)>,
    prev_end: Option<i64>,
    next_start: Option<i64>,
}

/// What a chunk's transaction reads once, with its first chunk: the job's
/// current epoch, the attempt's outcome and lease deadline, the database
/// clock, and for each agent stream (in [`PROGRESS_STREAMS`] order) its
/// committed offset (`log_progress`) and its last chunk (offset, end).
struct Attempt {
    current_epoch: Option<i64>,
    outcome: Option<String>,
    lease_deadline: Option<i64>,
    now: i64,
    progress: [Option<i64>; 4],
    /// `None`: not read (a transaction of one chunk has no later chunk to
    /// place).
    tails: Option<[Option<(i64, i64)>; 4]>,
}

impl Attempt {
    /// Where `chunk` lands, known without a statement: at or past the end
    /// of its stream's last chunk (and past its offset), nothing is at or
    /// after it and the chunk before is that last one. `None`: read it.
    fn landing(&self, chunk: &NewLogChunk) -> Option<Landing> {
        let i = PROGRESS_STREAMS.iter().position(|s| *s == chunk.stream)?;
        match self.tails.as_ref()?[i] {
            None => Some(Landing { existing: None, prev_end: None, next_start: None }),
            Some((offset, end)) if chunk.offset >= end && chunk.offset > offset => {
                Some(Landing { existing: None, prev_end: Some(end), next_start: None })
            }
            Some(_) => None,
        }
    }

    /// `chunk` was written: it is its stream's last chunk now.
    fn wrote(&mut self, chunk: &NewLogChunk, len: i64) {
        if let Some(i) = PROGRESS_STREAMS.iter().position(|s| *s == chunk.stream)
            && let Some(tails) = self.tails.as_mut()
            && tails[i].is_none_or(|(offset, _)| offset < chunk.offset)
        {
            tails[i] = Some((chunk.offset, chunk.offset + len));
        }
    }
}

/// The streams whose committed offsets [`PLACEMENT`] reads, in the order of
/// their names (the order a chunk's acknowledgement lists them in).
pub(crate) const PROGRESS_STREAMS: [&str; 4] = {
    use kiln_core::logs::stream::{SERVICES, STDERR, STDOUT, SYSTEM};
    [SERVICES, STDERR, STDOUT, SYSTEM]
};

/// The [`Landing`] of a chunk `($1 job, $2 epoch, $3 stream, $4 offset)`
/// and its [`Attempt`], in one statement: each statement is a round trip
/// (to SQLite's worker thread, issue 20; to PostgreSQL), and a short job's
/// few chunks are each a transaction of their own. The chunks after the
/// first of a transaction mostly land past their stream's last chunk
/// ([`Attempt::landing`]) and read nothing.
static PLACEMENT: Sql = Sql::new(|d| placement(d, true));

/// [`PLACEMENT`] without the streams' last chunks, for a transaction of
/// one chunk (most of a loud job's).
static PLACEMENT_ALONE: Sql = Sql::new(|d| placement(d, false));

fn placement(d: &crate::dialect::Dialect, tails: bool) -> String {
    let progress: Vec<String> = PROGRESS_STREAMS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let progress = format!(
                "(SELECT committed FROM log_progress WHERE job_id = $1 AND epoch = $2 AND stream = '{s}') AS p{i}"
            );
            if !tails {
                return progress;
            }
            format!(
                "{progress}, \
                 (SELECT byte_offset FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = '{s}' \
                  ORDER BY byte_offset DESC LIMIT 1) AS t{i}, \
                 (SELECT byte_offset + length FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = '{s}' \
                  ORDER BY byte_offset DESC LIMIT 1) AS e{i}"
            )
        })
        .collect();
    format!("SELECT {LANDING}, {attempt}, {progress}", attempt = attempt_cols(d), progress = progress.join(", "))
}

/// A chunk's [`Landing`] alone (`$1 job, $2 epoch, $3 stream, $4 offset`).
static LANDING_ONLY: Sql = Sql::new(|_| format!("SELECT {LANDING}"));

const LANDING: &str = "\
    (SELECT length FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = $3 AND byte_offset = $4) AS ex_len, \
    (SELECT sha256 FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = $3 AND byte_offset = $4) AS ex_sha, \
    (SELECT byte_offset + length FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = $3 \
     AND byte_offset < $4 ORDER BY byte_offset DESC LIMIT 1) AS prev_end, \
    (SELECT byte_offset FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = $3 \
     AND byte_offset > $4 ORDER BY byte_offset LIMIT 1) AS next_start";

/// [`PLACEMENT`]'s attempt columns.
fn attempt_cols(d: &crate::dialect::Dialect) -> String {
    format!(
        "(SELECT current_epoch FROM jobs WHERE id = $1) AS current_epoch, \
         (SELECT outcome FROM attempts WHERE job_id = $1 AND epoch = $2) AS outcome, \
         (SELECT lease_deadline FROM attempts WHERE job_id = $1 AND epoch = $2) AS lease_deadline, \
         {now} AS now",
        now = d.now_ms
    )
}

/// A chunk's index row.
const INSERT_CHUNK: &str = "INSERT INTO log_chunks (job_id, epoch, stream, seq, byte_offset, length, sha256, data, \
     created_at, seg, seg_pos) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// The committed offsets of `n` streams (1 to 4) of an attempt (`$1` job,
/// `$2` epoch, then stream and offset of each).
fn upsert_progress(n: usize) -> &'static str {
    static TEXTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    progress_text(&TEXTS, n, 3, String::new)
}

/// PostgreSQL: a chunk's index row and the committed offsets of `n`
/// streams (its own among them; stream and offset of each from `$12`) in
/// one statement.
fn insert_chunk_and_progress(n: usize) -> &'static str {
    static TEXTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    progress_text(&TEXTS, n, 12, || format!("WITH chunk AS ({INSERT_CHUNK}) "))
}

/// An upsert of `n` streams' offsets (`$1` job, `$2` epoch, stream and
/// offset of each from `$first`) after `prefix`, built once per `n`.
fn progress_text(
    texts: &'static std::sync::OnceLock<Vec<String>>,
    n: usize,
    first: usize,
    prefix: fn() -> String,
) -> &'static str {
    let texts = texts.get_or_init(|| {
        let prefix = prefix();
        (1..=PROGRESS_STREAMS.len())
            .map(|n| {
                let rows: Vec<String> =
                    (0..n).map(|i| format!("($1, $2, ${}, ${})", first + 2 * i, first + 1 + 2 * i)).collect();
                format!(
                    "{prefix}INSERT INTO log_progress (job_id, epoch, stream, committed) VALUES {} \
                     ON CONFLICT (job_id, epoch, stream) DO UPDATE SET committed = excluded.committed",
                    rows.join(", ")
                )
            })
            .collect()
    });
    &texts[n.clamp(1, texts.len()) - 1]
}

/// Checks a chunk as it arrives (its digest, if given, against its bytes;
/// its position; an agent's stream) and gives it its identity: the one
/// digest of the bytes on this side.
fn identify(chunk: &mut NewLogChunk) -> Result<()> {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(&chunk.data));
    if chunk.sha256.as_ref().is_some_and(|given| !given.eq_ignore_ascii_case(&digest)) {
        return Err(StoreError::Invalid("chunk sha256 does not match its bytes".into()));
    }
    chunk.sha256 = Some(digest);
    if chunk.offset < 0 || chunk.seq < 0 {
        return Err(StoreError::Invalid("negative offset or seq".into()));
    }
    // An agent's streams only: their committed offsets are what a chunk's
    // placement reads (`PROGRESS_STREAMS`).
    if !PROGRESS_STREAMS.contains(&chunk.stream.as_str()) {
        return Err(StoreError::Invalid(format!(
            "unknown log stream `{}`: expected {}",
            chunk.stream.chars().take(40).collect::<String>(),
            PROGRESS_STREAMS.join(", ")
        )));
    }
    Ok(())
}

/// `LogStore::append_log_chunk`.
///
/// On SQLite the bytes (except the small `system` stream's, which the
/// running-attempts view reads in SQL) go to a segment file and are synced
/// before the index row commits; the row's `data` is then empty. Chunks of
/// one stream in flight together commit in offset order (`sequencer.rs`);
/// on PostgreSQL those waiting for their turn commit in the transaction of
/// the chunk whose turn it is, each judged alone (`log_groups.rs`).
pub(crate) async fn append_log_chunk(store: &SqlStore, mut chunk: NewLogChunk) -> Result<Vec<(String, i64)>> {
    identify(&mut chunk)?;
    let len = chunk.data.len() as i64;
    let files = store.log_files();
    let ticket = files.sequencer.enter(&chunk.job_id, chunk.epoch, &chunk.stream, chunk.offset);
    let mut placed: Option<(i64, i64)> = None;
    let bulk = crate::segments::Lane::of(chunk.data.len()) == crate::segments::Lane::Bulk;
    if let Some(segments) = &files.segments
        && !files.bytes_in_db
        && len > 0
        && chunk.stream != kiln_core::logs::stream::SYSTEM
    {
        // An identical retry's bytes are not written again. Whether it is
        // one is read first only where it may be: a bulk chunk this process
        // has not committed past. A small chunk, and a bulk one beyond what
        // this process committed of its stream, is written at once (a rare
        // retry then leaves a few unreferenced bytes in the segment) — under
        // load those reads queued for the read connections the live feeds
        // need (issue 20). The transaction decides either way.
        let maybe_retry = bulk && !files.sequencer.fresh(&chunk.job_id, chunk.epoch, &chunk.stream, chunk.offset);
        let identical = maybe_retry && committed_identically(store, &chunk, len).await?;
        if !identical {
            // Ordered after `enter`: a chunk waiting here is in flight for
            // the chunks after it, which wait for it rather than time out.
            let _turn = match &files.bulk_admission {
                Some(a) if bulk => Some(a.acquire().await.expect("never closed")),
                _ => None,
            };
            let (data, r) = segments.append(std::mem::take(&mut chunk.data)).await;
            chunk.data = data;
            match r {
                Ok(p) => placed = Some(p),
                // Cannot write (a full disk): an identical retry is still
                // accepted (the bytes stay in hand: the transaction stores
                // them in the row should it find no chunk there after all).
                Err(e) => {
                    if maybe_retry || !committed_identically(store, &chunk, len).await? {
                        return Err(e);
                    }
                }
            }
        }
    }
    if let Some(objects) = files.objects.get()
        && bulk
        && chunk.stream != kiln_core::logs::stream::SYSTEM
    {
        // PostgreSQL: the bytes go to the object store, as above to a
        // segment file (an identical retry's bytes are not written again).
        // A small chunk (at most `SMALL_CHUNK`, 16 KiB: live output a
        // timer flushed, a short job's whole output) keeps its bytes in its
        // row, as the `system` stream's do: an object of its own cost two
        // syncs and a transaction more on the way to the acknowledgement
        // (a no-op job's completion 4–5 ms later, the server 1.5 ms more
        // CPU; `kiln bench dispatch --database-url postgres`), for bytes
        // that are few (a stream over a few KiB/s leaves in full-size
        // chunks) and leave the database with the job's archive.
        let maybe_retry = bulk && !files.sequencer.fresh(&chunk.job_id, chunk.epoch, &chunk.stream, chunk.offset);
        let identical = maybe_retry && committed_identically(store, &chunk, len).await?;
        if !identical {
            match crate::tx::log_objects::append(store, objects, std::mem::take(&mut chunk.data)).await {
                Ok(p) => placed = Some(p),
                // Cannot write: only an identical retry is still accepted
                // (its row holds the bytes' place already).
                Err(e) => {
                    if maybe_retry || !committed_identically(store, &chunk, len).await? {
                        return Err(e);
                    }
                }
            }
        }
    }
    // PostgreSQL: while this chunk waits for its turn, the chunk whose turn
    // it is may take it into its own transaction (`log_groups.rs`).
    let key: crate::log_groups::Key = (chunk.job_id.clone(), chunk.epoch, chunk.stream.clone());
    let grouped = files.objects.get().is_some() && len > 0;
    loop {
        if !grouped {
            ticket.wait_turn().await;
            break;
        }
        // The entry holds a copy: the bytes are in the object store by
        // now (the copy is empty but for a chunk whose bytes stay in the row).
        let mut posted = files.groups.post(&key, chunk.offset, len, Waiting { chunk: chunk.clone(), len, placed });
        let taken = tokio::select! {
            biased;
            a = posted.answer() => Some(a),
            () = ticket.wait_turn() => None,
        };
        let answer = match taken {
            Some(a) => a,
            // Its turn, and no leader took it: it leads.
            None if posted.withdraw() => break,
            None => posted.answer().await,
        };
        match answer {
            Answer::Done(r) => return r,
            // Not committed: wait for the turn again (the chunk before
            // this one was refused, or the transaction failed).
            Answer::Alone => continue,
        }
    }
    if (files.segments.is_none() || chunk.in_order) && chunk.offset > 0 {
        // PostgreSQL may have replicas: the chunk before this one can be in
        // flight on another replica, which this process's sequencer does not
        // see (and after a restart this process knows no stream): wait as
        // briefly as for one in flight here until the database says the
        // bytes before this chunk are committed.
        wait_for_predecessor(store, &chunk).await?;
    }
    // SQLite has one writer: a bulk chunk queues for it behind at most one
    // other bulk chunk, so a small one (and every other write: heartbeats,
    // claims) is never behind the index rows of a whole burst of megabytes.
    let _gate = match &files.bulk_gate {
        Some(g) if bulk => Some(g.lock().await),
        _ => None,
    };
    // This chunk's turn: the chunks of its stream waiting right after it
    // commit with it.
    let followers = if grouped { files.groups.take_after(&key, chunk.offset + len, MAX_GROUP - 1) } else { vec![] };
    let mut group: Vec<Member> = vec![(&chunk, len, placed)];
    group.extend(followers.iter().map(|t| (&t.item.chunk, t.item.len, t.item.placed)));
    let r = store.transaction(Isolation::Serializable, &group[..], |tx, group| Box::pin(commit_group(tx, group))).await;
    let (committed, stop, progress) = match r {
        Ok(done) => done,
        Err(e) => {
            // The followers were not committed: each waits for its turn again.
            drop(followers);
            return Err(e);
        }
    };
    let (last, last_len, _) = group[committed - 1];
    files.sequencer.committed(&chunk.job_id, chunk.epoch, &chunk.stream, last.offset + last_len);
    let mut stop = stop;
    for (i, t) in followers.into_iter().enumerate() {
        match i + 1 {
            n if n < committed => t.answer(Answer::Done(Ok(progress.clone()))),
            n if n == committed => match stop.take() {
                Some(refused) => t.answer(Answer::Done(Err(refused))),
                None => t.answer(Answer::Alone),
            },
            _ => t.answer(Answer::Alone),
        }
    }
    Ok(progress)
}

use crate::log_groups::Waiting;

/// `LogStore::append_log_batch`: a short job's few small chunks (its
/// `system` lines and its output) in one transaction instead of one each.
/// Each chunk is placed and judged as [`append_log_chunk`] does it; being
/// small, none is a retry candidate whose bytes are checked before they
/// are written, and none waits for the bulk gate.
pub(crate) async fn append_log_batch(
    store: &SqlStore,
    mut chunks: Vec<NewLogChunk>,
) -> Result<(usize, Vec<(String, i64)>)> {
    let Some(first) = chunks.first() else {
        return Err(StoreError::Invalid("a log batch needs at least one chunk".into()));
    };
    let (job, epoch) = (first.job_id.clone(), first.epoch);
    for chunk in chunks.iter_mut() {
        if chunk.job_id != job || chunk.epoch != epoch {
            return Err(StoreError::Invalid("the chunks of a log batch are of one attempt".into()));
        }
        if crate::segments::Lane::of(chunk.data.len()) != crate::segments::Lane::Small {
            return Err(StoreError::Invalid(format!(
                "a chunk of a log batch carries at most {} bytes",
                crate::segments::SMALL_CHUNK
            )));
        }
        identify(chunk)?;
    }
    // A stream's first chunk of the batch waits for its turn (the chunks
    // of its stream before it, in flight here, commit first); the stream's
    // later chunks of the batch commit right after it, in this transaction.
    let firsts: Vec<bool> =
        chunks.iter().enumerate().map(|(i, c)| !chunks[..i].iter().any(|b| b.stream == c.stream)).collect();
    let files = store.log_files();
    let tickets: Vec<_> = chunks
        .iter()
        .enumerate()
        .filter(|(i, _)| firsts[*i])
        .map(|(i, c)| (i, files.sequencer.enter(&c.job_id, c.epoch, &c.stream, c.offset)))
        .collect();
    let mut placed: Vec<Option<(i64, i64)>> = vec![None; chunks.len()];
    if let Some(segments) = &files.segments
        && !files.bytes_in_db
    {
        // SQLite: output bytes go to the small lane's segment (a `system`
        // chunk's stay in its row), as alone.
        for (i, chunk) in chunks.iter_mut().enumerate() {
            if chunk.data.is_empty() || chunk.stream == kiln_core::logs::stream::SYSTEM {
                continue;
            }
            let (data, r) = segments.append(std::mem::take(&mut chunk.data)).await;
            chunk.data = data;
            placed[i] = Some(r?);
        }
    }
    for (i, ticket) in &tickets {
        let chunk = &chunks[*i];
        ticket.wait_turn().await;
        if (files.segments.is_none() || chunk.in_order) && chunk.offset > 0 {
            wait_for_predecessor(store, chunk).await?;
        }
    }
    let group: Vec<Member> = chunks.iter().zip(&placed).map(|(c, p)| (c, c.data.len() as i64, *p)).collect();
    let (committed, _stop, progress) =
        store.transaction(Isolation::Serializable, &group[..], |tx, group| Box::pin(commit_group(tx, group))).await?;
    for &(chunk, len, _) in &group[..committed] {
        files.sequencer.committed(&chunk.job_id, chunk.epoch, &chunk.stream, chunk.offset + len);
    }
    drop(tickets);
    Ok((committed, progress))
}

/// A chunk of a group: the chunk, its length, and where its bytes are
/// (segment, position), if not in the row.
type Member<'a> = (&'a NewLogChunk, i64, Option<(i64, i64)>);

/// The index rows of `group` (one stream's chunks, each starting where the
/// one before ends, the first the one whose turn it is), in offset order:
/// how many committed, the refusal of the one after them if one was
/// refused, and the attempt's progress. The first chunk refused: the
/// transaction's error (nothing commits). Every chunk is judged as it
/// would be alone, after the ones before it.
async fn commit_group(tx: &mut Tx, group: &[Member<'_>]) -> Result<(usize, Option<StoreError>, Vec<(String, i64)>)> {
    let first = group[0].0;
    // Chunks of a job commit one at a time, so their ids (the SSE cursor)
    // become visible in order.
    lock_job(tx, &first.job_id).await?;
    // The progress as the first chunk's placement read it: what the end
    // would read but for this transaction's own writes (kept here as they
    // are made). Every chunk of a group is of one stream.
    let mut progress: Option<Vec<(String, i64)>> = None;
    let mut was = Vec::new();
    let mut attempt = None;
    let mut committed = 0;
    let mut stop = None;
    let mut written = false;
    for (i, &(chunk, len, placed)) in group.iter().enumerate() {
        let last = i + 1 == group.len();
        let alone = group.len() == 1;
        match commit_one(tx, chunk, len, placed, alone, &mut attempt, &mut progress, &mut was, last).await {
            Ok(w) => {
                committed += 1;
                written = w;
            }
            // Judged before anything of it was written: the ones before commit.
            Err(e) if committed > 0 && is_refusal(&e) => {
                stop = Some(e);
                written = false;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let progress = progress.unwrap_or_default();
    // Each stream's offset that moved, unless the last chunk's own
    // statement wrote them.
    let moved = moved(&progress, &was);
    if !written && !moved.is_empty() {
        // In one statement: a batch moves several streams.
        let mut stmt = tx.sql(upsert_progress(moved.len())).bind(&first.job_id).bind(first.epoch);
        for (stream, end) in moved {
            stmt = stmt.bind(stream).bind(end);
        }
        stmt.execute().await?;
    }
    Ok((committed, stop, progress))
}

/// The streams whose offset in `progress` is not what was read (`was`).
fn moved<'p>(progress: &'p [(String, i64)], was: &[(String, i64)]) -> Vec<&'p (String, i64)> {
    progress.iter().filter(|(stream, end)| !was.iter().any(|(s, e)| s == stream && e == end)).collect()
}

/// A chunk's refusal by [`commit_one`], made before it wrote anything (a
/// database error is not one: the transaction is lost).
fn is_refusal(e: &StoreError) -> bool {
    matches!(e, StoreError::Conflict(_) | StoreError::StaleEpoch(_) | StoreError::Busy(_) | StoreError::NotFound(_))
}

/// One chunk's index row (or nothing: an identical retry), `progress`
/// advanced past it (read by the first chunk's placement, `was` a copy of
/// it as read); a refusal before anything of it is written. `Ok(true)`:
/// the chunk's row and its stream's new offset were written in one
/// statement (PostgreSQL, the group's `last` chunk). `attempt`: what the
/// transaction's first chunk read ([`PLACEMENT`]), kept up to date with
/// what it writes; `alone`: the transaction's only chunk.
#[allow(clippy::too_many_arguments)]
async fn commit_one(
    tx: &mut Tx,
    chunk: &NewLogChunk,
    len: i64,
    placed: Option<(i64, i64)>,
    alone: bool,
    attempt: &mut Option<Attempt>,
    progress: &mut Option<Vec<(String, i64)>>,
    was: &mut Vec<(String, i64)>,
    last: bool,
) -> Result<bool> {
    let (seg, seg_pos) = (placed.map(|p| p.0), placed.map(|p| p.1));
    // Where the chunk lands; with the first chunk, whether its attempt is
    // live, the clock and the streams' progress and last chunks, in one
    // statement, after the job lock.
    let landing = match attempt.as_ref().map(|a| a.landing(chunk)) {
        Some(Some(landing)) => landing,
        Some(None) => {
            let (ex_len, ex_sha, prev_end, next_start): (Option<i64>, Option<String>, Option<i64>, Option<i64>) = tx
                .sql(&LANDING_ONLY)
                .bind(&chunk.job_id)
                .bind(chunk.epoch)
                .bind(&chunk.stream)
                .bind(chunk.offset)
                .one()
                .await?;
            Landing { existing: ex_len.map(|l| (l, ex_sha)), prev_end, next_start }
        }
        None => {
            let row = tx
                .sql(if alone { &PLACEMENT_ALONE } else { &PLACEMENT })
                .bind(&chunk.job_id)
                .bind(chunk.epoch)
                .bind(&chunk.stream)
                .bind(chunk.offset)
                .fetch_optional()
                .await?
                .ok_or_else(|| StoreError::NotFound("row".into()))?;
            let col = |c: &str| row.get::<Option<i64>>(c);
            let tail =
                |i: usize| -> Result<Option<(i64, i64)>> { Ok(col(&format!("t{i}"))?.zip(col(&format!("e{i}"))?)) };
            *attempt = Some(Attempt {
                current_epoch: col("current_epoch")?,
                outcome: row.get("outcome")?,
                lease_deadline: col("lease_deadline")?,
                now: row.get("now")?,
                progress: [col("p0")?, col("p1")?, col("p2")?, col("p3")?],
                tails: if alone { None } else { Some([tail(0)?, tail(1)?, tail(2)?, tail(3)?]) },
            });
            Landing {
                existing: col("ex_len")?.map(|l| row.get::<Option<String>>("ex_sha").map(|s| (l, s))).transpose()?,
                prev_end: col("prev_end")?,
                next_start: col("next_start")?,
            }
        }
    };
    let a = attempt.as_mut().expect("read above");
    let Landing { existing, prev_end, next_start } = landing;
    let (current_epoch, now) = (a.current_epoch, a.now);
    let progress = progress.get_or_insert_with(|| {
        let read: Vec<(String, i64)> =
            PROGRESS_STREAMS.iter().zip(a.progress).filter_map(|(s, c)| c.map(|c| (s.to_string(), c))).collect();
        was.clone_from(&read);
        read
    });
    match existing {
        // An identical retry is accepted even after the attempt ended.
        Some((l, Some(s))) if l == len && chunk.sha256.as_ref() == Some(&s) => return Ok(false),
        Some(_) => {
            return Err(StoreError::Conflict(format!(
                "different bytes were already committed at {} offset {}",
                chunk.stream, chunk.offset
            )));
        }
        None => {}
    }
    let current_epoch = current_epoch.ok_or_else(|| StoreError::NotFound(format!("job {}", chunk.job_id)))?;
    let lease = match (&a.outcome, a.lease_deadline) {
        (Some(o), Some(d)) => Some(AttemptLease { outcome: parse_enum(o)?, lease_deadline: d }),
        _ => None,
    };
    check_live(chunk.epoch, current_epoch, lease, now)
        .map_err(|stale| StoreError::StaleEpoch(stale.message(&chunk.job_id, chunk.epoch)))?;
    // Overlap with a neighbour: only the closest chunks before and after
    // can overlap (index seeks, not a scan of the stream).
    let overlap = prev_end.is_some_and(|e| e > chunk.offset) || next_start.is_some_and(|n| n < chunk.offset + len);
    if overlap && len > 0 {
        return Err(StoreError::Conflict(format!(
            "chunk at {} offset {} overlaps bytes already committed",
            chunk.stream, chunk.offset
        )));
    }
    // In order: never past a hole the agent has not declared (the chunk
    // before may be refused now and retried later). Nothing is committed;
    // the agent retries (503) once its predecessor got through.
    if chunk.in_order && chunk.offset > 0 && prev_end != Some(chunk.offset) {
        return Err(StoreError::Busy(format!(
            "the {} bytes before offset {} are not committed yet: send them first, then retry",
            chunk.stream, chunk.offset
        )));
    }
    // Advance the contiguous committed offset of this stream. It is the
    // end of the contiguous run from 0 after every commit, so only a chunk
    // right at it moves it: past this chunk, and past the chunks that
    // follow without a gap (there are some only if the closest one after
    // starts where this one ends; this chunk's own row is not among them).
    let row = progress.iter().position(|(s, _)| *s == chunk.stream);
    let before = row.map(|i| progress[i].1);
    let mut committed = before.unwrap_or(0);
    if committed == chunk.offset && len > 0 {
        committed += len;
        while next_start.is_some_and(|n| n <= committed) {
            let next: Option<i64> = tx
                .sql(
                    "SELECT length FROM log_chunks WHERE job_id = $1 AND epoch = $2 \
                     AND stream = $3 AND byte_offset = $4 AND length > 0",
                )
                .bind(&chunk.job_id)
                .bind(chunk.epoch)
                .bind(&chunk.stream)
                .bind(committed)
                .scalar_optional()
                .await?;
            match next {
                Some(l) => committed += l,
                None => break,
            }
        }
    }
    match row {
        Some(i) => progress[i].1 = committed,
        None => {
            progress.push((chunk.stream.clone(), committed));
            progress.sort();
        }
    }
    // On PostgreSQL the last chunk writes, with its row, the final offset of
    // every stream the group moved (its own among them; `was`: the offsets
    // as read).
    let changed = !was.iter().any(|(s, e)| *s == chunk.stream && *e == committed);
    let together = last && changed && tx.dialect().backend == crate::dialect::Backend::Postgres;
    let moved = if together { moved(progress, was) } else { vec![] };
    let data = if seg.is_some() { &[][..] } else { &chunk.data[..] };
    let stmt = if together { tx.sql(insert_chunk_and_progress(moved.len())) } else { tx.sql(INSERT_CHUNK) };
    let stmt = stmt
        .bind(&chunk.job_id)
        .bind(chunk.epoch)
        .bind(&chunk.stream)
        .bind(chunk.seq)
        .bind(chunk.offset)
        .bind(len)
        .bind(&chunk.sha256)
        // The bytes are in a segment, or in the row.
        .bind(data)
        .bind(now)
        .bind(seg)
        .bind(seg_pos);
    let mut stmt = stmt;
    for (stream, end) in moved {
        stmt = stmt.bind(stream).bind(end);
    }
    stmt.execute().await?;
    a.wrote(chunk, len);
    Ok(together)
}

/// Waits at most [`crate::sequencer::ARRIVAL_WAIT`] until the bytes of the
/// stream just before the chunk's offset are committed: known here when
/// this process committed the predecessor, else read from the database.
async fn wait_for_predecessor(store: &SqlStore, chunk: &NewLogChunk) -> Result<()> {
    let files = store.log_files();
    if files.sequencer.covers(&chunk.job_id, chunk.epoch, &chunk.stream, chunk.offset) {
        return Ok(());
    }
    let until = tokio::time::Instant::now() + crate::sequencer::ARRIVAL_WAIT;
    loop {
        // The end of the closest chunk before (an explicit hole earlier in
        // the stream does not hold this one up, as `log_progress` would).
        let prev_end = end_before(&mut store.reader().await?, chunk).await?.unwrap_or(0);
        if prev_end >= chunk.offset || tokio::time::Instant::now() >= until {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The end of the committed chunk closest before `chunk`'s offset in its
/// stream (an index seek, not a scan), if any.
async fn end_before(ex: &mut impl Exec, chunk: &NewLogChunk) -> Result<Option<i64>> {
    ex.sql(
        "SELECT byte_offset + length FROM log_chunks WHERE job_id = $1 AND epoch = $2 \
         AND stream = $3 AND byte_offset < $4 ORDER BY byte_offset DESC LIMIT 1",
    )
    .bind(&chunk.job_id)
    .bind(chunk.epoch)
    .bind(&chunk.stream)
    .bind(chunk.offset)
    .scalar_optional()
    .await
}

/// Whether a chunk with these bytes is committed at this position already
/// (an identical retry: its bytes are not written again).
async fn committed_identically(store: &SqlStore, chunk: &NewLogChunk, len: i64) -> Result<bool> {
    let existing: Option<(i64, String)> = store
        .reader()
        .await?
        .sql("SELECT length, sha256 FROM log_chunks WHERE job_id = $1 AND epoch = $2 AND stream = $3 AND byte_offset = $4")
        .bind(&chunk.job_id)
        .bind(chunk.epoch)
        .bind(&chunk.stream)
        .bind(chunk.offset)
        .optional()
        .await?;
    Ok(existing.is_some_and(|(l, s)| l == len && chunk.sha256.as_ref() == Some(&s)))
}

/// `LogStore::log_chunks_after`.
pub(crate) async fn log_chunks_after(
    store: &SqlStore,
    job_id: &str,
    after_id: i64,
    limit: u32,
) -> Result<Vec<LogChunkRecord>> {
    /// (id, epoch, stream, byte_offset, length, data, created_at, seg, seg_pos)
    type Row = (i64, i64, String, i64, i64, Vec<u8>, Option<i64>, Option<i64>, Option<i64>);
    let mut tries = 0;
    'again: loop {
        let rows: Vec<Row> = store
            .reader()
            .await?
            .sql(
                "SELECT id, epoch, stream, byte_offset, length, data, created_at, seg, seg_pos FROM log_chunks \
                 WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            )
            .bind(job_id)
            .bind(after_id)
            .bind(limit as i64)
            .all()
            .await?;
        let files = store.log_files();
        let mut out = Vec::with_capacity(rows.len());
        // Chunks whose bytes are in the object store: (index in `out`, seg, pos, len).
        let mut in_objects: Vec<(usize, i64, i64, i64)> = vec![];
        for (id, epoch, stream, offset, length, mut data, at_ms, seg, seg_pos) in rows {
            if let (Some(seg), Some(pos)) = (seg, seg_pos) {
                if let Some(segments) = &files.segments {
                    data = match segments.read(seg, pos, length).await {
                        Ok(d) => d,
                        // Archived and trimmed (its segment deleted) since the
                        // query: ask again (it is now in an archive).
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => {
                            tries += 1;
                            continue 'again;
                        }
                        Err(e) => return Err(StoreError::Unavailable(format!("log segment {seg}: {e}"))),
                    };
                } else {
                    in_objects.push((out.len(), seg, pos, length));
                }
            }
            out.push(LogChunkRecord { id, epoch, stream, offset, data, at_ms });
        }
        if in_objects.is_empty() {
            return Ok(out);
        }
        let Some(objects) = files.objects.get() else {
            return Err(StoreError::Unavailable(
                "these log bytes are in the object store, which this process has not opened".into(),
            ));
        };
        // Neighbours in one object are read with one request.
        let mut i = 0;
        while i < in_objects.len() {
            let (_, seg, start, _) = in_objects[i];
            let mut end = i + 1;
            let mut stop = start + in_objects[i].3;
            while end < in_objects.len() && in_objects[end].1 == seg && in_objects[end].2 == stop {
                stop += in_objects[end].3;
                end += 1;
            }
            let bytes = match objects.read(seg, start as u64, (stop - start) as usize).await {
                Ok(b) => b,
                Err(crate::LogObjectError::NotFound(_)) if tries < 3 => {
                    tries += 1;
                    continue 'again;
                }
                Err(e) => return Err(StoreError::Unavailable(format!("log segment {seg}: {e}"))),
            };
            if bytes.len() as i64 != stop - start {
                return Err(StoreError::Unavailable(format!(
                    "log segment {seg}: {} bytes where {} were asked for",
                    bytes.len(),
                    stop - start
                )));
            }
            for &(at, _, pos, len) in &in_objects[i..end] {
                let from = (pos - start) as usize;
                out[at].data = bytes[from..from + len as usize].to_vec();
            }
            i = end;
        }
        return Ok(out);
    }
}

/// `LogStore::logs_to_archive`.
pub(crate) async fn logs_to_archive(store: &SqlStore, grace_ms: i64, limit: u32) -> Result<Vec<String>> {
    static FINISHED: Sql = Sql::new(|d| {
        format!(
            "SELECT j.id FROM (SELECT DISTINCT job_id FROM log_chunks) c JOIN jobs j ON j.id = c.job_id \
             WHERE j.status IN {terminal} AND j.finished_at IS NOT NULL AND j.finished_at <= {now} - $1 \
             LIMIT $2",
            terminal = terminal_jobs(),
            now = d.now_ms,
        )
    });
    store.reader().await?.sql(&FINISHED).bind(grace_ms).bind(limit as i64).scalars().await
}

/// `LogStore::record_log_archive`.
pub(crate) async fn record_log_archive(store: &SqlStore, a: &LogArchive) -> Result<()> {
    static RECORD: Sql = Sql::new(|d| {
        format!(
            "INSERT INTO log_archives (job_id, first_id, last_id, segment_key, index_key, chunks, bytes, archived_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, {now})",
            now = d.now_ms
        )
    });
    store
        .transaction(Isolation::Serializable, a, |tx, a| {
            Box::pin(async move {
                // The job row first: chunk appends (which lock it) wait for the trim.
                lock_job(tx, &a.job_id).await?;
                let held: i64 = tx
                    .sql("SELECT COUNT(*) FROM log_chunks WHERE job_id = $1 AND id BETWEEN $2 AND $3")
                    .bind(&a.job_id)
                    .bind(a.first_id)
                    .bind(a.last_id)
                    .scalar()
                    .await?;
                if held != a.chunks {
                    return Err(StoreError::Conflict(format!(
                        "log of job {} changed while it was archived: {held} chunks in {}..={}, archive holds {}",
                        a.job_id, a.first_id, a.last_id, a.chunks
                    )));
                }
                tx.sql(&RECORD)
                    .bind(&a.job_id)
                    .bind(a.first_id)
                    .bind(a.last_id)
                    .bind(&a.segment_key)
                    .bind(&a.index_key)
                    .bind(a.chunks)
                    .bind(a.bytes)
                    .execute()
                    .await?;
                tx.sql("DELETE FROM log_chunks WHERE job_id = $1 AND id BETWEEN $2 AND $3")
                    .bind(&a.job_id)
                    .bind(a.first_id)
                    .bind(a.last_id)
                    .execute()
                    .await?;
                Ok(())
            })
        })
        .await?;
    if let Some(segments) = &store.log_files().segments {
        // Segments no row refers to any more are deleted.
        let referenced: Vec<i64> =
            store.reader().await?.sql("SELECT DISTINCT seg FROM log_chunks WHERE seg IS NOT NULL").scalars().await?;
        if let Err(e) = segments.remove_unreferenced(&referenced.into_iter().collect()) {
            tracing::warn!(error = %e, "cannot delete archived log segments");
        }
    }
    Ok(())
}

/// `LogStore::log_archives`.
pub(crate) async fn log_archives(store: &SqlStore, job_id: &str) -> Result<Vec<LogArchive>> {
    let rows: Vec<(String, i64, i64, String, String, i64, i64)> = store
        .reader()
        .await?
        .sql(
            "SELECT job_id, first_id, last_id, segment_key, index_key, chunks, bytes FROM log_archives \
             WHERE job_id = $1 ORDER BY first_id",
        )
        .bind(job_id)
        .all()
        .await?;
    Ok(rows
        .into_iter()
        .map(|(job_id, first_id, last_id, segment_key, index_key, chunks, bytes)| LogArchive {
            job_id,
            first_id,
            last_id,
            segment_key,
            index_key,
            chunks,
            bytes,
        })
        .collect())
}

/// `LogStore::collect_log_objects`.
pub(crate) async fn collect_log_objects(store: &SqlStore, min_age_ms: i64, limit: u32) -> Result<usize> {
    match store.log_files().objects.get() {
        Some(objects) => {
            crate::tx::log_objects::remove_unreferenced(store, objects, min_age_ms, i64::from(limit)).await
        }
        None => Ok(0),
    }
}
