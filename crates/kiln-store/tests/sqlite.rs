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
