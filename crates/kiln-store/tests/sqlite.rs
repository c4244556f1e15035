//! The store conformance suite against SQLite (a fresh database file per test).

mod conformance;

use kiln_core::Backoff;
use kiln_store::SqliteStore;

async fn open(backoff: Backoff) -> conformance::Fixture<SqliteStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store =
        SqliteStore::open(&dir.path().join("db.sqlite")).await.expect("open sqlite store").with_backoff(backoff);
    conformance::Fixture::new(store, dir)
}

conformance::suite!(open);

/// SQLite keeps log bytes in segment files beside the database (issue 20):
/// the index row's `data` is empty, the bytes read back (also after the
/// store is reopened), the small `system` stream stays in the database, and
/// a segment is deleted once archival trimmed every row referring to it.
#[tokio::test]
async fn log_bytes_live_in_segment_files_until_archived() {
    use conformance::*;
    use kiln_store::*;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    let segs = dir.path().join("db.sqlite.logs");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let job = {
        let s = SqliteStore::open(&db).await.unwrap().with_backoff(FAST);
        let (_, run_id) = start(&s, workflow(vec![job("build", &[], 0)])).await;
        let a = agent(&s, "a", 4).await;
        let build = job_id(&s, &run_id, "build").await;
        claim(&s, &a, &build, LONG_TTL).await;
        s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, &big)).await.unwrap();
        s.append_log_chunk(chunk(&build, 1, "system", 0, 0, b"step 1\n")).await.unwrap();
        // An identical retry writes no bytes again.
        s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, &big)).await.unwrap();
        build
    };
    let files: Vec<_> = std::fs::read_dir(&segs).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one segment");
    assert_eq!(files[0].metadata().unwrap().len(), big.len() as u64, "the bytes once, outside the database");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    let rows: Vec<(String, i64, Option<i64>)> =
        sqlx::query_as("SELECT stream, length(data), seg FROM log_chunks ORDER BY id").fetch_all(&pool).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].0.as_str(), rows[0].1), ("stdout", 0));
    assert!(rows[0].2.is_some());
    assert_eq!((rows[1].0.as_str(), rows[1].1, rows[1].2), ("system", 7, None));
    pool.close().await;

    let s = SqliteStore::open(&db).await.unwrap().with_backoff(FAST);
    let got = s.log_chunks_after(&job, 0, 10).await.unwrap();
    assert_eq!(got[0].data, big, "read back from the segment after a restart");
    assert_eq!(got[1].data, b"step 1\n");
    s.append_log_chunk(chunk(&job, 1, "stdout", 1, big.len() as i64, b"tail\n")).await.unwrap();
    assert_eq!(std::fs::read_dir(&segs).unwrap().count(), 2, "a reopened store appends to a segment of its own");
    s.complete(&job, 1, success()).await.unwrap();
    let rows = s.log_chunks_after(&job, 0, 10).await.unwrap();
    let archive = LogArchive {
        job_id: job.clone(),
        first_id: rows[0].id,
        last_id: rows.last().unwrap().id,
        segment_key: "logs/x.seg".into(),
        index_key: "logs/x.idx.json".into(),
        chunks: rows.len() as i64,
        bytes: 0,
    };
    s.record_log_archive(&archive).await.unwrap();
    assert_eq!(std::fs::read_dir(&segs).unwrap().count(), 1, "the old segment is deleted, the current one stays");
}
