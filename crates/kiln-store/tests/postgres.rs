//! The store conformance suite against PostgreSQL: one throwaway server per
//! test process (kiln-testkit's `TempPostgres`), a fresh database per store.
//! Skipped when PostgreSQL is not installed, unless KILN_REQUIRE_POSTGRES=1.

mod conformance;

use kiln_core::Backoff;
use kiln_store::PgStore;
use kiln_testkit::{TempPostgres, postgres_available};

async fn open(backoff: Backoff) -> conformance::Fixture<PgStore> {
    let pg = TempPostgres::shared().expect("PostgreSQL is available");
    let url = pg.create_database().await.expect("create database");
    let store = PgStore::connect(&url).await.expect("open postgres store").with_backoff(backoff);
    conformance::Fixture::new(store, ())
}

conformance::suite!(open, available = postgres_available());
