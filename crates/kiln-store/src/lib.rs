//! The authoritative metadata store.
//!
//! Where to look:
//! - `traits.rs` — the traits per aggregate and their contracts (what every
//!   backend must guarantee); `error.rs` — the error type; `model.rs` — the
//!   records.
//! - `impls.rs` — which function implements each trait method; `tx/` — the
//!   transactions, one file per family (accept, advance, claim, lease,
//!   complete, cancel, logs, outbox, repos, agents, artifacts, images).
//! - `store.rs` — the store type, the transaction runner and row locks;
//!   `rows.rs` — row mapping; `db.rs` — running a statement on either
//!   backend; `dialect.rs` — what differs between SQLite and PostgreSQL;
//!   `sqlite.rs`, `postgres.rs` — what only one backend has; `segments.rs`
//!   — SQLite's log segment files; `sequencer.rs` — commit order of log
//!   chunks in flight together.

mod db;
mod dialect;
mod error;
mod impls;
mod lanes;
mod log_groups;
mod log_objects;
mod model;
mod postgres;
mod rows;
mod segments;
mod sequencer;
mod sqlite;
mod store;
mod traits;
mod tx;

pub use error::{Result, StoreError};
pub use log_objects::{LogObjectError, LogObjects, ORPHAN_AGE_MS as LOG_OBJECT_ORPHAN_AGE_MS};
pub use model::*;
pub use segments::SMALL_CHUNK as SMALL_LOG_CHUNK;
pub use store::{PgStore, SqlStore, SqliteStore};
pub use traits::*;
pub use tx::caches::CACHE_ARTIFACT;
pub use tx::env_secrets::{ENV_SECRET_PREFIX, env_secret_scope};
pub use tx::outputs::RunOutputs;
pub use tx::repos::{CLONE_CREDENTIAL, FORGE_TOKEN, WEBHOOK_SECRET};
pub use tx::teams::DEFAULT_TEAM;
pub use tx::test_reports::{MAX_REPORTS_PER_ATTEMPT, MAX_TESTS_PER_ATTEMPT, quarantine_cap, verdicts_per_run};
