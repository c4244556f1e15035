//! Log chunk ingestion (spec 000 §13; invariant 7).

use super::*;

async fn running_job<S: Store>(s: &S) -> String {
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    build
}

fn at(p: &BTreeMap<String, i64>, stream: &str) -> i64 {
    p.get(stream).copied().unwrap_or(0)
}

pub async fn identical_log_retry_is_accepted<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let c0 = chunk(&job, 1, "stdout", 0, 0, b"hello ");
    let c1 = chunk(&job, 1, "stdout", 1, 6, b"world\n");
    assert_eq!(at(&progress(s.append_log_chunk(c0.clone()).await.unwrap()), "stdout"), 6);
    let p = progress(s.append_log_chunk(c1.clone()).await.unwrap());
    assert_eq!(at(&p, "stdout"), 12);
    // The ack was lost; the agent sends both again.
    assert_eq!(progress(s.append_log_chunk(c0).await.unwrap()), p);
    assert_eq!(progress(s.append_log_chunk(c1).await.unwrap()), p);
    assert_eq!(s.log_chunks_after(&job, 0, 100).await.unwrap().len(), 2, "no duplicate stored");
}

pub async fn conflicting_log_bytes_are_refused<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"0123456789")).await.unwrap();
    assert_conflict(s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"abcdefghij")).await);
    assert_conflict(s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"0123")).await);
    // Overlapping a committed range is a conflict too.
    assert_conflict(s.append_log_chunk(chunk(&job, 1, "stdout", 1, 5, b"56789ABCDE")).await);
    // ...from either side: a chunk ending inside a later committed one.
    s.append_log_chunk(chunk(&job, 1, "stdout", 2, 20, b"KLMNO")).await.unwrap();
    assert_conflict(s.append_log_chunk(chunk(&job, 1, "stdout", 3, 15, b"ABCDEFGH")).await);
    assert_conflict(s.append_log_chunk(chunk(&job, 1, "stdout", 3, 12, b"ABCDEFGHIJKLMNOPQRS")).await);
    s.append_log_chunk(chunk(&job, 1, "stdout", 3, 15, b"FGHIJ")).await.expect("an exact fit between neighbours");
    let chunks = s.log_chunks_after(&job, 0, 100).await.unwrap();
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0].data, b"0123456789");
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 1, 10, b"!")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 11);
}

pub async fn out_of_order_chunks_commit_contiguously<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 1, 10, b"second\n")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 0, "a gap: nothing is contiguous yet");
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 3, 32, b"fourth\n")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 0);
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"the first\n")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 17, "jumps over the chunk that arrived early, up to the next gap");
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 2, 17, b"the third line\n")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 39, "the gap closed: up to the end of the early chunk");
}

/// An agent sends several chunks of a stream before the first is
/// acknowledged (issue 20): however their requests interleave, even
/// arriving in reverse order, they commit in offset order, so event ids
/// (what a reader replays and sees) follow the bytes.
pub async fn chunks_in_flight_together_commit_in_offset_order<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let job = running_job(&*fx.store).await;
    fn part(i: usize) -> Vec<u8> {
        vec![b'a' + i as u8; 40_000 + i]
    }
    fn offset(i: usize) -> i64 {
        (0..i).map(|k| part(k).len() as i64).sum()
    }
    fx.store.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, &part(0))).await.unwrap();
    let mut tasks = vec![];
    for i in (1..8).rev() {
        let (s, job) = (fx.store.clone(), job.clone());
        tasks.push(tokio::spawn(async move {
            let c = NewLogChunk { in_order: true, ..chunk(&job, 1, "stdout", i as i64, offset(i), &part(i)) };
            s.append_log_chunk(c).await.unwrap()
        }));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rows = fx.store.log_chunks_after(&job, 0, 100).await.unwrap();
    let got: Vec<i64> = rows.iter().map(|r| r.offset).collect();
    assert_eq!(got, (0..8).map(offset).collect::<Vec<_>>(), "event ids follow the offsets");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.data, part(i), "the bytes of chunk {i}");
    }
    let p = progress(fx.store.append_log_chunk(chunk(&job, 1, "stdout", 7, offset(7), &part(7))).await.unwrap());
    assert_eq!(at(&p, "stdout"), offset(8), "an identical retry is still accepted");
}

/// Issue 20: more bulk chunks (over `SMALL_LOG_CHUNK` bytes) of a stream
/// in flight than the store writes at once, arriving in reverse order,
/// with small chunks of another stream between them: every one commits
/// (none refused as "later": a chunk waiting for its turn to write is in
/// flight for those after it), in offset order, every byte readable.
/// Retries of both sizes are still accepted, and different bytes at a
/// committed offset refused.
pub async fn bulk_chunks_beyond_the_admitted_ones_commit_in_order_beside_small_ones<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let job = running_job(&*fx.store).await;
    const N: usize = 20;
    fn part(i: usize) -> Vec<u8> {
        vec![b'A' + i as u8; kiln_store::SMALL_LOG_CHUNK + 1 + i]
    }
    fn offset(i: usize) -> i64 {
        (0..i).map(|k| part(k).len() as i64).sum()
    }
    let line = |i: usize| format!("tick {i}\n").into_bytes();
    fx.store.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, &part(0))).await.unwrap();
    let mut tasks = vec![];
    for i in (1..N).rev() {
        let (s, job) = (fx.store.clone(), job.clone());
        tasks.push(tokio::spawn(async move {
            let c = NewLogChunk { in_order: true, ..chunk(&job, 1, "stdout", i as i64, offset(i), &part(i)) };
            s.append_log_chunk(c).await
        }));
        tokio::task::yield_now().await;
    }
    let mut err_off = 0;
    for i in 0..N {
        let l = line(i);
        let c = NewLogChunk { in_order: true, ..chunk(&job, 1, "stderr", i as i64, err_off, &l) };
        fx.store.append_log_chunk(c).await.expect("a small chunk commits");
        err_off += l.len() as i64;
    }
    for t in tasks {
        t.await.unwrap().expect("every bulk chunk commits, none is refused");
    }
    let rows = fx.store.log_chunks_after(&job, 0, 1000).await.unwrap();
    let out: Vec<&kiln_store::LogChunkRecord> = rows.iter().filter(|r| r.stream == "stdout").collect();
    assert_eq!(out.iter().map(|r| r.offset).collect::<Vec<_>>(), (0..N).map(offset).collect::<Vec<_>>());
    for (i, r) in out.iter().enumerate() {
        assert_eq!(r.data, part(i), "the bytes of bulk chunk {i}");
    }
    let err: Vec<u8> = rows.iter().filter(|r| r.stream == "stderr").flat_map(|r| r.data.clone()).collect();
    assert_eq!(err, (0..N).flat_map(line).collect::<Vec<u8>>());
    // Identical retries (bulk and small) are accepted; different bytes refused.
    let p = progress(fx.store.append_log_chunk(chunk(&job, 1, "stdout", 3, offset(3), &part(3))).await.unwrap());
    assert_eq!(at(&p, "stdout"), offset(N));
    let p = progress(fx.store.append_log_chunk(chunk(&job, 1, "stderr", 0, 0, &line(0))).await.unwrap());
    assert_eq!(at(&p, "stderr"), err_off);
    assert_conflict(fx.store.append_log_chunk(chunk(&job, 1, "stderr", 0, 0, b"tock 0\n")).await);
    assert_conflict(fx.store.append_log_chunk(chunk(&job, 1, "stdout", 3, offset(3), &part(4)[..part(3).len()])).await);
    let rows = fx.store.log_chunks_after(&job, 0, 1000).await.unwrap();
    assert_eq!(rows.len(), 2 * N, "retries add nothing");
    assert_eq!(rows.iter().find(|r| r.stream == "stderr" && r.offset == 0).unwrap().data, line(0));
}

/// A chunk sent `in_order` commits only directly after the stream's bytes
/// before it (issue 20): a chunk refused now and retried later (a full
/// disk) still commits before the chunks sent after it, whatever the order
/// of their tries; until its predecessor is in, a successor is answered
/// `Busy` (503, retryable) and nothing of it is committed. Stale epochs,
/// identical retries and conflicts are decided as before, and a chunk sent
/// without the flag after a hole (the agent gave its predecessor up)
/// commits, so the hole is explicit and nothing waits on it.
pub async fn in_order_chunks_never_commit_past_a_missing_predecessor<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let ordered =
        |seq, offset, data: &[u8]| NewLogChunk { in_order: true, ..chunk(&job, 1, "stdout", seq, offset, data) };
    // The first chunk is refused for a while (not sent here); the second
    // is tried first, twice: refused, retryably, both times.
    for _ in 0..2 {
        match s.append_log_chunk(ordered(1, 6, b"line2\n")).await {
            Err(StoreError::Busy(_)) => {}
            other => panic!("expected Busy (retry later), got {other:?}"),
        }
    }
    assert!(s.log_chunks_after(&job, 0, 100).await.unwrap().is_empty(), "nothing committed past the hole");
    // A stale epoch is refused as stale, not as "later".
    assert_stale(
        s.append_log_chunk(NewLogChunk { in_order: true, ..chunk(&job, 2, "stdout", 1, 6, b"line2\n") }).await,
    );
    // The first chunk's retry gets through; then the second's.
    assert_eq!(at(&progress(s.append_log_chunk(ordered(0, 0, b"line1\n")).await.unwrap()), "stdout"), 6);
    assert_eq!(at(&progress(s.append_log_chunk(ordered(1, 6, b"line2\n")).await.unwrap()), "stdout"), 12);
    // Identical retries are accepted (with or without the flag); different
    // bytes at a committed position are a conflict, not a "later".
    assert_eq!(at(&progress(s.append_log_chunk(ordered(1, 6, b"line2\n")).await.unwrap()), "stdout"), 12);
    assert_eq!(
        at(&progress(s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"line1\n")).await.unwrap()), "stdout"),
        12
    );
    assert_conflict(s.append_log_chunk(ordered(1, 6, b"LINE2\n")).await);
    // The agent gave up 12..18: the chunk after it comes without the flag
    // and commits; chunks after that one are in order again.
    match s.append_log_chunk(ordered(3, 18, b"line4\n")).await {
        Err(StoreError::Busy(_)) => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    s.append_log_chunk(chunk(&job, 1, "stdout", 3, 18, b"line4\n")).await.expect("an explicit hole");
    s.append_log_chunk(ordered(4, 24, b"line5\n")).await.expect("right after the chunk after the hole");
    let rows = s.log_chunks_after(&job, 0, 100).await.unwrap();
    let got: Vec<(i64, &[u8])> = rows.iter().map(|r| (r.offset, &r.data[..])).collect();
    assert_eq!(
        got,
        [(0, &b"line1\n"[..]), (6, b"line2\n"), (18, b"line4\n"), (24, b"line5\n")],
        "committed in offset order"
    );
    assert_eq!(at(&progress(s.append_log_chunk(ordered(5, 30, b"x")).await.unwrap()), "stdout"), 12, "the hole stays");
}

pub async fn streams_are_tracked_separately<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"out out\n")).await.unwrap());
    assert_eq!(at(&p, "stdout"), 8);
    assert_eq!(at(&p, "stderr"), 0);
    // The same offset on the other stream is not a conflict.
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stderr", 0, 0, b"err\n")).await.unwrap());
    assert_eq!((at(&p, "stdout"), at(&p, "stderr")), (8, 4));
    let p = progress(s.append_log_chunk(chunk(&job, 1, "stderr", 1, 4, b"more err\n")).await.unwrap());
    assert_eq!((at(&p, "stdout"), at(&p, "stderr")), (8, 13));
}

pub async fn bad_digest_and_stale_epoch_are_refused<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let mut bad = chunk(&job, 1, "stdout", 0, 0, b"bytes");
    bad.sha256 = chunk(&job, 1, "stdout", 0, 0, b"other").sha256;
    match s.append_log_chunk(bad).await {
        Err(StoreError::Invalid(_)) => {}
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_stale(s.append_log_chunk(chunk(&job, 2, "stdout", 0, 0, b"bytes")).await);
    assert_stale(s.append_log_chunk(chunk(&job, 0, "stdout", 0, 0, b"bytes")).await);
    // Only an agent's streams (their committed offsets are what a chunk's
    // placement reads).
    match s.append_log_chunk(chunk(&job, 1, "other", 0, 0, b"bytes")).await {
        Err(StoreError::Invalid(m)) => assert!(m.contains("unknown log stream `other`"), "{m}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(s.log_chunks_after(&job, 0, 100).await.unwrap().is_empty(), "nothing stored");

    // After completion the epoch is over: new bytes are refused.
    s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"bytes")).await.unwrap();
    s.complete(&job, 1, success()).await.unwrap();
    assert_stale(s.append_log_chunk(chunk(&job, 1, "stdout", 1, 5, b"tail")).await);
    let rows = s.log_chunks_after(&job, 0, 100).await.unwrap();
    let streams: Vec<&str> = rows.iter().map(|r| r.stream.as_str()).collect();
    assert_eq!(streams, ["stdout", "seal"], "the bytes, then the seal; no tail");
}

pub async fn log_chunks_after_respects_the_cursor<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let other = running_job(s).await;
    let parts: [(&str, i64, &[u8]); 5] =
        [("stdout", 0, b"a1"), ("stderr", 0, b"e1"), ("stdout", 2, b"a2"), ("stdout", 4, b"a3"), ("stderr", 2, b"e2")];
    for (seq, (stream, offset, data)) in parts.iter().enumerate() {
        s.append_log_chunk(chunk(&job, 1, stream, seq as i64, *offset, data)).await.unwrap();
        s.append_log_chunk(chunk(&other, 1, stream, seq as i64, *offset, b"xx")).await.unwrap();
    }
    let all = s.log_chunks_after(&job, 0, 100).await.unwrap();
    assert_eq!(all.len(), 5, "only this job's chunks");
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "id order");
    let got: Vec<(&str, i64, &[u8])> = all.iter().map(|c| (c.stream.as_str(), c.offset, c.data.as_slice())).collect();
    assert_eq!(got, parts.to_vec(), "in acceptance order");
    assert!(all.iter().all(|c| c.epoch == 1));
    // Each chunk keeps when it was committed (`kiln logs --timestamps`), in order.
    let times: Vec<i64> = all.iter().map(|c| c.at_ms.expect("commit time")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]) && times[0] > 1_700_000_000_000, "{times:?}");

    // Replay from a cursor, in pages.
    let page = s.log_chunks_after(&job, all[1].id, 2).await.unwrap();
    assert_eq!(page.iter().map(|c| c.id).collect::<Vec<_>>(), [all[2].id, all[3].id]);
    let rest = s.log_chunks_after(&job, page[1].id, 100).await.unwrap();
    assert_eq!(rest.iter().map(|c| c.id).collect::<Vec<_>>(), [all[4].id]);
    assert!(s.log_chunks_after(&job, all[4].id, 100).await.unwrap().is_empty());
}

/// `log.sealed` is distinct from a dropped connection (spec 000 §13): an
/// attempt that completes through its agent gets a `seal` row naming each
/// stream's final length; a fenced one gets a `gap` row (and a system line).
pub async fn completion_seals_the_log_and_fencing_marks_a_gap<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, b"compiled\n")).await.unwrap();
    s.append_log_chunk(chunk(&build, 1, "stderr", 0, 0, b"warn\n")).await.unwrap();
    s.complete(&build, 1, success()).await.unwrap();
    let rows = s.log_chunks_after(&build, 0, 100).await.unwrap();
    let seal = rows.last().expect("rows");
    assert_eq!((seal.stream.as_str(), seal.epoch), ("seal", 1), "{rows:?}");
    let v: serde_json::Value = serde_json::from_slice(&seal.data).unwrap();
    assert_eq!(v["outcome"], "success");
    assert_eq!(v["committed"]["stdout"], 9);
    assert_eq!(v["committed"]["stderr"], 5);
    assert!(!rows.iter().any(|r| r.stream == "gap"));

    // The next job's agent vanishes: no seal, a gap.
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &test, SHORT_TTL).await;
    s.append_log_chunk(chunk(&test, 1, "stdout", 0, 0, b"running 3 tests\n")).await.unwrap();
    expire(SHORT_TTL).await;
    assert_eq!(s.fence_expired().await.unwrap(), vec![(test.clone(), 1)]);
    let rows = s.log_chunks_after(&test, 0, 100).await.unwrap();
    assert!(!rows.iter().any(|r| r.stream == "seal"), "a lost attempt is never sealed: {rows:?}");
    let gap = rows.iter().find(|r| r.stream == "gap").expect("gap row");
    let v: serde_json::Value = serde_json::from_slice(&gap.data).unwrap();
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["committed"]["stdout"], 16);
    let system: Vec<u8> = rows.iter().filter(|r| r.stream == "system").flat_map(|r| r.data.clone()).collect();
    assert!(String::from_utf8_lossy(&system).contains("gap"), "and a readable line for plain viewers");
}

/// Archival bookkeeping: only finished jobs are candidates; recording an
/// archive trims exactly the chunks it holds, in one transaction, and is
/// refused (changing nothing) when the journal no longer matches.
pub async fn archiving_trims_exactly_what_the_archive_holds<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    s.append_log_chunk(chunk(&job, 1, "stdout", 0, 0, b"one\n")).await.unwrap();
    s.append_log_chunk(chunk(&job, 1, "stdout", 1, 4, b"two\n")).await.unwrap();
    assert!(s.logs_to_archive(0, 10).await.unwrap().is_empty(), "a running job's log stays hot");
    s.complete(&job, 1, success()).await.unwrap();
    assert!(s.logs_to_archive(3_600_000, 10).await.unwrap().is_empty(), "not before the grace period");
    assert_eq!(s.logs_to_archive(0, 10).await.unwrap(), vec![job.clone()]);
    let rows = s.log_chunks_after(&job, 0, 100).await.unwrap();
    assert_eq!(rows.len(), 3, "two chunks and the seal");
    let archive = |chunks| LogArchive {
        job_id: job.clone(),
        first_id: rows[0].id,
        last_id: rows[2].id,
        segment_key: "logs/x.seg".into(),
        index_key: "logs/x.idx.json".into(),
        chunks,
        bytes: 8,
    };
    assert_conflict(s.record_log_archive(&archive(2)).await);
    assert_eq!(s.log_chunks_after(&job, 0, 100).await.unwrap().len(), 3, "a refused archive trims nothing");
    assert!(s.log_archives(&job).await.unwrap().is_empty());
    s.record_log_archive(&archive(3)).await.unwrap();
    assert!(s.log_chunks_after(&job, 0, 100).await.unwrap().is_empty());
    assert_eq!(s.log_archives(&job).await.unwrap(), [archive(3)]);
    assert!(s.logs_to_archive(0, 10).await.unwrap().is_empty(), "archived logs are not candidates again");
}

/// A short job's few small chunks in one transaction (`append_log_batch`):
/// each judged as it would be alone, in order — committed together with
/// the progress of every stream they moved; an identical retry of the
/// whole batch accepted; a refusal after the first stops the batch there
/// (the ones before commit), a refusal of the first (a stale epoch) or a
/// malformed batch commits nothing.
pub async fn a_batch_of_small_chunks_is_judged_chunk_by_chunk_in_one_transaction<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let job = running_job(s).await;
    let in_order = |mut c: NewLogChunk| {
        c.in_order = true;
        c
    };
    let batch = vec![
        in_order(chunk(&job, 1, "system", 0, 0, b"checking out\n")),
        in_order(chunk(&job, 1, "stdout", 0, 0, b"hello\n")),
        in_order(chunk(&job, 1, "system", 1, 13, b"step ok\n")),
    ];
    let (accepted, progress) = s.append_log_batch(batch.clone()).await.unwrap();
    assert_eq!(accepted, 3);
    let progress: std::collections::BTreeMap<String, i64> = progress.into_iter().collect();
    assert_eq!(progress.get("stdout"), Some(&6), "{progress:?}");
    assert_eq!(progress.get("system"), Some(&21), "both system chunks, one after the other: {progress:?}");
    let rows = s.log_chunks_after(&job, 0, 100).await.unwrap();
    let got: Vec<(&str, i64, &[u8])> = rows.iter().map(|c| (c.stream.as_str(), c.offset, c.data.as_slice())).collect();
    assert_eq!(
        got,
        [("system", 0, &b"checking out\n"[..]), ("stdout", 0, b"hello\n"), ("system", 13, b"step ok\n")],
        "in the batch's order"
    );
    // The next chunk of each stream continues where the batch left it.
    let (a, p) = s.append_log_batch(vec![in_order(chunk(&job, 1, "stdout", 1, 6, b"more\n"))]).await.unwrap();
    assert_eq!((a, p.iter().find(|(st, _)| st == "stdout").map(|(_, e)| *e)), (1, Some(11)));
    // An identical retry of the whole batch: accepted, nothing added.
    let (accepted, _) = s.append_log_batch(batch).await.unwrap();
    assert_eq!(accepted, 3);
    assert_eq!(s.log_chunks_after(&job, 0, 100).await.unwrap().len(), 4, "no row twice");

    // A conflict in the middle: the chunk before commits, the batch stops.
    let batch = vec![
        in_order(chunk(&job, 1, "stderr", 0, 0, b"warn\n")),
        in_order(chunk(&job, 1, "stdout", 2, 6, b"other bytes\n")),
        in_order(chunk(&job, 1, "system", 2, 21, b"never\n")),
    ];
    let (accepted, progress) = s.append_log_batch(batch).await.unwrap();
    assert_eq!(accepted, 1, "stopped at the conflicting chunk");
    assert!(progress.iter().any(|(st, e)| st == "stderr" && *e == 5), "{progress:?}");
    let rows = s.log_chunks_after(&job, 0, 100).await.unwrap();
    assert_eq!(rows.len(), 5, "the stderr chunk, nothing after it");
    assert!(!rows.iter().any(|c| c.data == b"never\n"));
    // A hole before an in-order chunk of the batch: Busy alone, so the
    // batch stops before it.
    let (accepted, _) = s
        .append_log_batch(vec![
            in_order(chunk(&job, 1, "stderr", 1, 5, b"w2\n")),
            in_order(chunk(&job, 1, "stdout", 3, 100, b"past a hole\n")),
        ])
        .await
        .unwrap();
    assert_eq!(accepted, 1);
    // A chunk committed ahead, out of order: a later chunk of the batch
    // that would overlap it is refused, although the batch's own chunk
    // before it ended where it starts.
    s.append_log_chunk(chunk(&job, 1, "services", 1, 20, b"ahead")).await.unwrap();
    let (accepted, _) = s
        .append_log_batch(vec![
            chunk(&job, 1, "services", 0, 0, b"abc\n"),
            chunk(&job, 1, "services", 2, 4, b"overlapping ahead\n"),
        ])
        .await
        .unwrap();
    assert_eq!(accepted, 1, "stopped at the chunk overlapping the one ahead");
    assert!(!s.log_chunks_after(&job, 0, 100).await.unwrap().iter().any(|c| c.data == b"overlapping ahead\n"));

    // Malformed batches are refused whole.
    let other = running_job(s).await;
    for (bad, why) in [
        (vec![], "empty"),
        (
            vec![chunk(&job, 1, "stdout", 4, 11, b"x"), chunk(&other, 1, "stdout", 0, 0, b"y")],
            "another attempt's chunk",
        ),
        (vec![chunk(&job, 1, "stdout", 4, 11, &vec![b'z'; kiln_store::SMALL_LOG_CHUNK + 1])], "a large chunk"),
        (vec![chunk(&job, 1, "stdout", 4, 11, b"x"), chunk(&job, 1, "other", 0, 0, b"y")], "an unknown stream"),
        (
            vec![chunk(&job, 1, "stdout", 4, 11, b"x"), {
                let mut c = chunk(&job, 1, "stderr", 2, 8, b"y");
                c.sha256 = chunk(&job, 1, "stderr", 2, 8, b"z").sha256;
                c
            }],
            "a wrong digest",
        ),
    ] {
        match s.append_log_batch(bad).await {
            Err(StoreError::Invalid(_)) => {}
            other => panic!("{why}: expected Invalid, got {other:?}"),
        }
    }
    assert_eq!(s.log_chunks_after(&job, 0, 100).await.unwrap().len(), 8, "nothing of them stored");
    assert!(s.log_chunks_after(&other, 0, 100).await.unwrap().is_empty());

    // A stale epoch: the first chunk's refusal is the batch's, nothing commits.
    assert_stale(s.append_log_batch(vec![chunk(&job, 2, "stdout", 4, 11, b"x")]).await);
    s.complete(&job, 1, success()).await.unwrap();
    assert_stale(
        s.append_log_batch(vec![chunk(&job, 1, "stdout", 4, 11, b"x"), chunk(&job, 1, "system", 2, 21, b"y")]).await,
    );
    assert!(!s.log_chunks_after(&job, 0, 100).await.unwrap().iter().any(|c| c.stream == "stdout" && c.offset == 11));
}
