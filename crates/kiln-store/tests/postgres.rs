//! The store conformance suite against PostgreSQL: one throwaway server per
//! test process (kiln-testkit's `TempPostgres`), a fresh database per store.
//! Skipped when PostgreSQL is not installed, unless KILN_REQUIRE_POSTGRES=1.

mod conformance;

use kiln_core::Backoff;
use kiln_store::{
    AttemptStore, ClaimInput, LogObjectError, LogObjects, LogStore, PgStore, RepoStore, RunStore, StoreError,
};
use kiln_testkit::{TempPostgres, postgres_available};
use std::sync::Arc;
use std::sync::Mutex;

/// Databases of finished fixtures, ready to be emptied and used again.
static FREE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Gives its database back when the fixture ends.
struct Lease(String);

impl Drop for Lease {
    fn drop(&mut self) {
        FREE.lock().unwrap().push(std::mem::take(&mut self.0));
    }
}

/// A fresh, empty store. `CREATE DATABASE` costs ~0.3–0.7 s here, and the
/// property tests open a store per case: a database whose fixture ended is
/// emptied (TRUNCATE … RESTART IDENTITY, ~20 ms) and used again instead.
async fn open(backoff: Backoff) -> conformance::Fixture<PgStore> {
    let pg = TempPostgres::shared().expect("PostgreSQL is available");
    let reused = FREE.lock().unwrap().pop();
    let url = match reused {
        Some(url) => {
            empty(&url).await;
            url
        }
        None => pg.create_database().await.expect("create database"),
    };
    let store = PgStore::connect(&url).await.expect("open postgres store").with_backoff(backoff);
    // Log bytes go to an object store, as a server's do (issue 47).
    let objects = tempfile::tempdir().expect("object store dir");
    store.set_log_objects(Arc::new(Objects(kiln_blob::BlobStore::open_url("", objects.path()).unwrap())));
    conformance::Fixture::new(store, (Lease(url), objects))
}

/// The object store (the local one a server uses by default) as the home
/// of the store's log bytes.
struct Objects(kiln_blob::BlobStore);

#[async_trait::async_trait]
impl LogObjects for Objects {
    async fn put(&self, key: &str, parts: Vec<Vec<u8>>) -> Result<(), LogObjectError> {
        self.0.put_parts(key, parts).await.map_err(|e| LogObjectError::Other(e.to_string()))
    }

    async fn read_range(&self, key: &str, offset: u64, len: usize) -> Result<Vec<u8>, LogObjectError> {
        self.0.read_range(key, offset, len).await.map_err(|e| match e {
            kiln_blob::BlobError::NotFound(k) => LogObjectError::NotFound(k),
            e => LogObjectError::Other(e.to_string()),
        })
    }

    async fn delete(&self, key: &str) -> Result<(), LogObjectError> {
        self.0.delete(key).await.map_err(|e| LogObjectError::Other(e.to_string()))
    }
}

/// Remove every row of every store table (the schema and migrations stay).
async fn empty(url: &str) {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' AND tablename <> '_sqlx_migrations'",
    )
    .fetch_all(&mut c)
    .await
    .expect("list tables");
    let sql = format!("TRUNCATE {} RESTART IDENTITY CASCADE", tables.join(", "));
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await.expect("empty the database");
    // What the migrations seed comes back, as in a fresh database: the
    // `default` team (0037). Without it a test that got a reused database
    // found no default team, depending on the order tests ran in.
    sqlx::query("INSERT INTO teams (name, weight, created_at) VALUES ('default', 1, 0)")
        .execute(&mut c)
        .await
        .expect("seed the default team");
    c.close().await.expect("close");
}

conformance::suite!(open, available = postgres_available());

/// A store on a fresh database whose writes give up on a lock held elsewhere
/// after 300 ms, and the database's URL.
async fn store_with_short_lock_timeout() -> (PgStore, String) {
    let pg = TempPostgres::shared().expect("PostgreSQL is available");
    let url = pg.create_database().await.unwrap();
    let s = PgStore::connect(&format!("{url}?options=-c%20lock_timeout%3D300ms")).await.unwrap();
    (s.with_backoff(conformance::FAST), url)
}

/// Another connection holding a run's row lock (a stuck transaction,
/// another replica) until the returned transaction ends.
async fn hold_run(url: &str, run_id: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let other = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM runs WHERE id = $1 FOR UPDATE").bind(run_id).fetch_one(&mut *tx).await.unwrap();
    tx
}

/// PostgreSQL's counterpart of SQLite's "database write-locked by another
/// process": another connection (a stuck transaction, another replica) holds
/// a run's row lock. Writes to that run wait, then fail `Unavailable` (the
/// server's 503) after `lock_timeout` without deciding anything; reads still
/// answer; other runs are not held up; once the lock goes, the write lands.
/// Heartbeats do not wait for the run: they touch only their attempt.
#[tokio::test]
async fn run_locked_elsewhere_is_unavailable_then_recovers() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let (s, url) = store_with_short_lock_timeout().await;
    let (repo, run_id) = start(&s, workflow(vec![job("a", &[], 0), job("b", &["a"], 0)])).await;
    let a = agent(&s, "agent", 4).await;
    let job_a = job_id(&s, &run_id, "a").await;
    let c = claim(&s, &a, &job_a, LONG_TTL).await;

    let tx = hold_run(&url, &run_id).await;

    // A heartbeat touches only its attempt: a long transaction on the run
    // does not cost the agent its lease.
    let hb = s.heartbeat(&job_a, c.epoch, LONG_TTL).await.expect("heartbeat while the run is locked");
    assert!(!hb.cancel_requested);
    let before = snapshot(&s, &run_id).await;
    match s.complete(&job_a, c.epoch, success()).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable while the run is locked elsewhere, got {other:?}"),
    }
    // Reads answer and show nothing decided; another run is not held up.
    assert_eq!(snapshot(&s, &run_id).await, before);
    let other_run = s.accept_run(new_run(&repo.id, workflow(vec![job("x", &[], 0)]))).await.unwrap();
    assert!(other_run.created);

    tx.rollback().await.unwrap();
    assert_eq!(s.complete(&job_a, c.epoch, success()).await.unwrap(), "success");
    assert_eq!(job_status(&s, &job_id(&s, &run_id, "b").await).await, kiln_core::JobStatus::Ready);
}

/// The reconciler does not queue behind a run another transaction holds (a
/// completion racing the lease, another replica's reconciler): it skips that
/// run (`SKIP LOCKED`) and fences it on a later round.
#[tokio::test]
async fn reconciler_skips_a_run_locked_elsewhere() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let (s, url) = store_with_short_lock_timeout().await;
    let (_, run_id) = start(&s, workflow(vec![job("a", &[], 1)])).await;
    let a = agent(&s, "agent", 4).await;
    let job_a = job_id(&s, &run_id, "a").await;
    let c = claim(&s, &a, &job_a, SHORT_TTL).await;
    expire(SHORT_TTL).await;

    let tx = hold_run(&url, &run_id).await;
    // Skipped at once: neither waiting into lock_timeout nor fencing.
    assert_eq!(s.fence_expired().await.unwrap(), vec![]);
    tx.rollback().await.unwrap();

    assert_eq!(s.fence_expired().await.unwrap(), vec![(job_a.clone(), c.epoch)]);
    assert_eq!(job_status(&s, &job_a).await, kiln_core::JobStatus::Ready);
}

/// A claim that may not wait (`skip_locked`, as the server claims) does not
/// queue behind a run another transaction holds — another replica claiming
/// the same job: it is `Busy` at once and decides nothing; once the run is
/// free it claims. A claim that may wait still waits.
#[tokio::test]
async fn claim_skips_a_run_locked_elsewhere() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let (s, url) = store_with_short_lock_timeout().await;
    let (_, run_id) = start(&s, workflow(vec![job("a", &[], 0)])).await;
    let a = agent(&s, "agent", 4).await;
    let job_a = job_id(&s, &run_id, "a").await;
    let g = s.get_job(&job_a).await.unwrap().dispatch_generation;

    let tx = hold_run(&url, &run_id).await;
    let before = snapshot(&s, &run_id).await;
    let skipping = ClaimInput { skip_locked: true, ..claim_input(&a, &job_a, g, LONG_TTL) };
    match s.claim(skipping.clone()).await {
        Err(StoreError::Busy(_)) => {}
        other => panic!("expected Busy while the run is locked elsewhere, got {other:?}"),
    }
    // A job that does not exist is still no job, not busy.
    let missing = ClaimInput { job_id: "no-such-job".into(), ..skipping.clone() };
    assert!(s.claim(missing).await.unwrap().is_none());
    // Waiting claims wait (here into lock_timeout).
    match s.claim(claim_input(&a, &job_a, g, LONG_TTL)).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected a waiting claim to time out, got {other:?}"),
    }
    assert_eq!(snapshot(&s, &run_id).await, before, "a skipped claim decided nothing");
    tx.rollback().await.unwrap();

    let c = s.claim(skipping).await.unwrap().expect("claimed once the run is free");
    assert_eq!((c.job.id.as_str(), c.epoch), (job_a.as_str(), 1));
}

/// Two stores on one fresh database, as two replicas.
async fn two_replicas() -> (PgStore, PgStore) {
    let pg = TempPostgres::shared().expect("PostgreSQL is available");
    let url = pg.create_database().await.unwrap();
    let a = PgStore::connect(&url).await.unwrap().with_backoff(conformance::FAST);
    let b = PgStore::connect(&url).await.unwrap().with_backoff(conformance::FAST);
    (a, b)
}

/// Two replicas on one database (two stores): an agent with several chunks
/// in flight may send the second to one replica before the first reaches
/// the other. The second waits (briefly) for the first to commit, so event
/// ids still follow the byte offsets across replicas.
#[tokio::test]
async fn a_chunk_on_another_replica_commits_after_its_predecessor() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let (a, b) = two_replicas().await;
    let (_, run_id) = start(&a, workflow(vec![job("build", &[], 0)])).await;
    let agent_rec = agent(&a, "a", 4).await;
    let build = job_id(&a, &run_id, "build").await;
    claim(&a, &agent_rec, &build, LONG_TTL).await;

    let second = {
        let (b, build) = (b.clone(), build.clone());
        tokio::spawn(async move { b.append_log_chunk(chunk(&build, 1, "stdout", 1, 6, b"second")).await.unwrap() })
    };
    // The first chunk reaches the other replica a little later.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    a.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, b"first\n")).await.unwrap();
    second.await.unwrap();
    let rows = a.log_chunks_after(&build, 0, 10).await.unwrap();
    let got: Vec<(i64, &[u8])> = rows.iter().map(|r| (r.offset, r.data.as_slice())).collect();
    assert_eq!(got, vec![(0, &b"first\n"[..]), (6, &b"second"[..])], "ids follow the offsets across replicas");
}

/// Issue 47, item 6: on PostgreSQL a chunk's bytes are in the object store
/// and the database holds only its index; every replica reads them; an
/// identical retry writes nothing new; objects no chunk refers to (a stale
/// epoch's refused bytes, a log archived and trimmed) are collected once
/// old enough, and only those.
#[tokio::test]
async fn log_bytes_live_in_the_object_store_and_unreferenced_objects_are_collected() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let pg = TempPostgres::shared().expect("PostgreSQL is available");
    let url = pg.create_database().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let blobs = kiln_blob::BlobStore::open_url("", dir.path()).unwrap();
    let s = PgStore::connect(&url).await.unwrap().with_backoff(FAST);
    s.set_log_objects(Arc::new(Objects(blobs.clone())));
    let (_, run_id) = start(&s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(&s, "a", 4).await;
    let build = job_id(&s, &run_id, "build").await;
    claim(&s, &a, &build, LONG_TTL).await;
    let big = vec![b'x'; 100_000];
    s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, b"hello\n")).await.unwrap();
    s.append_log_chunk(chunk(&build, 1, "stdout", 1, 6, &big)).await.unwrap();
    let db = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let q = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql).fetch_one(&db);
    // The bulk chunk's bytes are in an object, not in the database; a
    // small chunk (at most 16 KiB) keeps its few bytes in its row.
    assert_eq!(
        q("SELECT COALESCE(SUM(length(data)), 0)::BIGINT FROM log_chunks WHERE stream = 'stdout'").await.unwrap(),
        6
    );
    let placed: Vec<(Option<i64>, i64)> =
        sqlx::query_as("SELECT seg, length(data)::BIGINT FROM log_chunks WHERE stream = 'stdout' ORDER BY id")
            .fetch_all(&db)
            .await
            .unwrap();
    let segs: Vec<i64> = placed.iter().filter_map(|(seg, _)| *seg).collect();
    assert_eq!(placed, vec![(None, 6), (Some(segs[0]), 0)]);
    for seg in &segs {
        assert!(blobs.exists(&format!("logs/segments/{seg:012}")).await.unwrap(), "object of segment {seg}");
    }
    let read = |rows: Vec<kiln_store::LogChunkRecord>| rows.into_iter().map(|r| r.data).collect::<Vec<_>>();
    assert_eq!(read(s.log_chunks_after(&build, 0, 10).await.unwrap()), vec![b"hello\n".to_vec(), big.clone()]);
    // Another replica (the same database and object store) reads them.
    let other = PgStore::connect(&url).await.unwrap();
    other.set_log_objects(Arc::new(Objects(blobs.clone())));
    assert_eq!(read(other.log_chunks_after(&build, 0, 10).await.unwrap()), vec![b"hello\n".to_vec(), big.clone()]);
    // An identical retry of the bulk chunk writes no object.
    let objects = q("SELECT COUNT(*) FROM log_objects").await.unwrap();
    s.append_log_chunk(chunk(&build, 1, "stdout", 1, 6, &big)).await.unwrap();
    assert_eq!(q("SELECT COUNT(*) FROM log_objects").await.unwrap(), objects);
    // A stale epoch's chunk is refused; its object is nobody's.
    assert_stale(s.append_log_chunk(chunk(&build, 2, "stdout", 0, 0, &[b's'; 20_000])).await);
    let stale = q("SELECT MAX(seg) FROM log_objects").await.unwrap();
    assert!(!segs.contains(&stale));
    assert_eq!(s.collect_log_objects(kiln_store::LOG_OBJECT_ORPHAN_AGE_MS, 100).await.unwrap(), 0, "too young");
    assert_eq!(s.collect_log_objects(0, 100).await.unwrap(), 1, "only the stale chunk's object");
    assert!(!blobs.exists(&format!("logs/segments/{stale:012}")).await.unwrap());
    assert_eq!(read(s.log_chunks_after(&build, 0, 10).await.unwrap()), vec![b"hello\n".to_vec(), big.clone()]);
    // Archived and trimmed: the objects go too.
    s.complete(&build, 1, success()).await.unwrap();
    let rows = s.log_chunks_after(&build, 0, 100).await.unwrap();
    let archive = kiln_store::LogArchive {
        job_id: build.clone(),
        first_id: rows[0].id,
        last_id: rows[rows.len() - 1].id,
        segment_key: "logs/x.seg".into(),
        index_key: "logs/x.idx.json".into(),
        chunks: rows.len() as i64,
        bytes: 100_006,
    };
    s.record_log_archive(&archive).await.unwrap();
    assert_eq!(s.collect_log_objects(0, 100).await.unwrap(), 1);
    for seg in &segs {
        assert!(!blobs.exists(&format!("logs/segments/{seg:012}")).await.unwrap(), "segment {seg} collected");
    }
    assert_eq!(q("SELECT COUNT(*) FROM log_objects").await.unwrap(), 0);
}

/// The pool does not ping a connection it hands out moments after taking
/// it back (a round trip before every transaction and read), but it does
/// ping one idle for a while: after PostgreSQL restarted, the first call
/// meets a fresh connection, never a dead one (which would fail it).
#[tokio::test]
async fn the_first_call_after_a_database_restart_succeeds() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let pg = TempPostgres::start().expect("a PostgreSQL of this test's own");
    let url = pg.create_database().await.unwrap();
    let s = PgStore::connect(&url).await.unwrap().with_backoff(FAST);
    let r = repo(&s).await;
    // Several connections in the pool, each used and returned.
    let reads: Vec<_> = (0..4).map(|_| s.get_repo(&r.id)).collect();
    for got in futures::future::join_all(reads).await {
        got.unwrap();
    }
    pg.stop().unwrap();
    pg.resume().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    for _ in 0..4 {
        assert_eq!(s.get_repo(&r.id).await.expect("a read after the restart").id, r.id);
        s.accept_run(new_run(&r.id, workflow(vec![job("build", &[], 0)]))).await.expect("a write after the restart");
    }
}

/// A replica's sweep is woken by the jobs other replicas make ready, not
/// by its own (its relay queued those already): before, every commit of
/// its own that readied a job made it re-read every ready job.
#[tokio::test]
async fn ready_notifications_wake_the_other_replicas_only() {
    use conformance::*;
    use kiln_store::OutboxStore;
    if !postgres_available() {
        return;
    }
    let (a, b) = two_replicas().await;
    let wake = a.ready_wakeups().await.unwrap().expect("PostgreSQL notifies");
    let r = repo(&a).await;
    let wf = || workflow(vec![job("build", &[], 0)]);
    let quiet = std::time::Duration::from_millis(700);
    a.accept_run(new_run(&r.id, wf())).await.unwrap();
    assert!(tokio::time::timeout(quiet, wake.notify.notified()).await.is_err(), "woken by its own commit");
    assert_eq!(wake.take(), kiln_store::ReadyWake::Nothing);
    // B's run readies its job: A is woken with that job's id, and reads it
    // alone (not every ready job: A's own run's job is ready too).
    let run = b.accept_run(new_run(&r.id, wf())).await.unwrap().run_id;
    let other = tokio::time::timeout(std::time::Duration::from_secs(10), wake.notify.notified()).await;
    assert!(other.is_ok(), "not woken by another replica's commit");
    let build = job_id(&b, &run, "build").await;
    assert_eq!(wake.take(), kiln_store::ReadyWake::Jobs(vec![build.clone()]));
    let read = a.ready_jobs_of(std::slice::from_ref(&build)).await.unwrap();
    assert_eq!(read.iter().map(|e| e.job_id.as_str()).collect::<Vec<_>>(), [build.as_str()]);
    assert_eq!(a.ready_jobs().await.unwrap().len(), 2, "both runs' jobs are ready");
}

/// A store with log objects and a running job (issue 47, item 6: group
/// commit of log index rows); `db` is another connection to its database.
struct LogJob {
    s: PgStore,
    job: String,
    db: sqlx::PgPool,
    _objects: tempfile::TempDir,
}

type Sent = tokio::task::JoinHandle<Result<Vec<(String, i64)>, StoreError>>;

impl LogJob {
    async fn new() -> LogJob {
        use conformance::*;
        let pg = TempPostgres::shared().expect("PostgreSQL is available");
        let url = pg.create_database().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = PgStore::connect(&url).await.unwrap().with_backoff(FAST);
        s.set_log_objects(Arc::new(Objects(kiln_blob::BlobStore::open_url("", dir.path()).unwrap())));
        let (_, run_id) = start(&s, workflow(vec![job("build", &[], 0)])).await;
        let a = agent(&s, "a", 4).await;
        let job = job_id(&s, &run_id, "build").await;
        claim(&s, &a, &job, LONG_TTL).await;
        let db = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&url).await.unwrap();
        LogJob { s, job, db, _objects: dir }
    }

    /// The job's row, held by another connection until the transaction ends.
    async fn hold(&self) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut held = self.db.begin().await.unwrap();
        sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(&self.job)
            .fetch_one(&mut *held)
            .await
            .unwrap();
        held
    }

    /// Sends `chunks` with the job's row held: the first until it waits
    /// for the row in its transaction (having taken no other chunk), the
    /// others until they all wait for their turn — when the row is let go,
    /// the second leads the rest as one group.
    async fn send_behind_held_row(&self, chunks: Vec<kiln_store::NewLogChunk>) -> Vec<Sent> {
        let n = chunks.len();
        let mut tasks = vec![];
        for (i, c) in chunks.into_iter().enumerate() {
            let s = self.s.clone();
            tasks.push(tokio::spawn(async move { s.append_log_chunk(c).await }));
            if i == 0 {
                let db = &self.db;
                until(|| async move {
                    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
                        .fetch_one(db)
                        .await
                        .unwrap();
                    waiting > 0
                })
                .await;
            }
        }
        until(|| async { self.s.log_chunks_waiting() == n - 1 }).await;
        tasks
    }
}

/// Polls `what` until it holds (at most 20 s).
async fn until<F: std::future::Future<Output = bool>>(what: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !what().await {
        assert!(tokio::time::Instant::now() < deadline, "not reached within 20 s");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn part(i: i64) -> Vec<u8> {
    vec![b'a' + i as u8; 1000]
}

fn at(i: i64) -> i64 {
    i * 1000
}

/// Issue 47, item 6: the index rows of chunks waiting for their turn commit
/// in one transaction with the chunk whose turn it is, each judged as it
/// would be alone (spec 000 §13). A conflicting chunk in the group is
/// refused alone: the ones before it commit, an identical retry among them
/// is accepted, and the ones after it commit in their own turn — all in
/// offset order.
#[tokio::test]
async fn a_conflicting_chunk_in_a_group_is_refused_alone() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let h = LogJob::new().await;
    // Chunk 3 came early (not in order) and is committed; so is chunk 1
    // (its acknowledgement was lost: the one in the group is a retry).
    for i in [3, 1] {
        h.s.append_log_chunk(chunk(&h.job, 1, "stdout", i, at(i), &part(i))).await.unwrap();
    }
    let ordered = |i: i64, data: Vec<u8>| kiln_store::NewLogChunk {
        in_order: true,
        ..chunk(&h.job, 1, "stdout", i, at(i), &data)
    };
    let held = h.hold().await;
    let mut chunks: Vec<_> = (0..6).map(|i| ordered(i, part(i))).collect();
    chunks[3] = ordered(3, part(9)); // different bytes where chunk 3 is
    let tasks = h.send_behind_held_row(chunks).await;
    held.commit().await.unwrap();
    let mut results = vec![];
    for t in tasks {
        results.push(t.await.unwrap());
    }
    for (i, r) in results.iter().enumerate() {
        if i == 3 {
            assert!(matches!(r, Err(StoreError::Conflict(_))), "chunk 3 is refused: {r:?}");
        } else {
            assert!(r.is_ok(), "chunk {i} commits: {r:?}");
        }
    }
    let rows = h.s.log_chunks_after(&h.job, 0, 100).await.unwrap();
    let got: Vec<(i64, Vec<u8>)> = rows.iter().map(|r| (r.offset, r.data.clone())).collect();
    let want: Vec<(i64, Vec<u8>)> = [3, 1, 0, 2, 4, 5].iter().map(|&i| (at(i), part(i))).collect();
    assert_eq!(got, want, "ids in commit order, which follows the offsets; chunk 3's bytes are the first ones");
    assert_eq!(progress(results[5].as_ref().unwrap().clone()).get("stdout"), Some(&at(6)));
}

/// Issue 47, item 6: an attempt fenced (a new epoch) while a group of its
/// chunks waits: every chunk is refused as stale, none committed.
#[tokio::test]
async fn a_group_of_a_fenced_attempt_is_refused_chunk_by_chunk() {
    use conformance::*;
    if !postgres_available() {
        return;
    }
    let h = LogJob::new().await;
    let mut held = h.hold().await;
    let chunks: Vec<_> = (0..4)
        .map(|i| kiln_store::NewLogChunk { in_order: true, ..chunk(&h.job, 1, "stdout", i, at(i), &part(i)) })
        .collect();
    let tasks = h.send_behind_held_row(chunks).await;
    // The job is reclaimed (as a new claim would), in the transaction
    // holding its row.
    sqlx::query("UPDATE jobs SET current_epoch = current_epoch + 1 WHERE id = $1")
        .bind(&h.job)
        .execute(&mut *held)
        .await
        .unwrap();
    held.commit().await.unwrap();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert!(matches!(r, Err(StoreError::StaleEpoch(_))), "chunk {i} is refused as stale: {r:?}");
    }
    assert!(h.s.log_chunks_after(&h.job, 0, 100).await.unwrap().is_empty(), "nothing committed");
}
