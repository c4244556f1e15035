//! SQLite implementation (embedded default). WAL mode; one writer connection
//! serializes every mutating transaction (the run lock of spec 000 §9 is
//! implied by SQLite's single writer), several readers serve queries.
//!
//! The transactions themselves are `engine.rs` and `artifacts.rs`, shared
//! with PostgreSQL; this file is the SQLite dialect they are compiled for.

use crate::{Result, StoreError};
use kiln_core::Backoff;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};
use std::path::Path;
use std::time::Duration;

#[allow(clippy::duplicate_mod)]
#[path = "artifacts.rs"]
mod artifacts;
#[allow(clippy::duplicate_mod)]
#[path = "engine.rs"]
mod engine;

pub(crate) type Db = Sqlite;
pub(crate) type DbRow = sqlx::sqlite::SqliteRow;
pub(crate) type Tx<'a> = Transaction<'a, Sqlite>;
pub(crate) type StoreImpl = SqliteStore;

#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    backoff: Backoff,
}

pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    crate::common_db_err(e)
}

/// The engine's SQL is SQLite's dialect already.
pub(crate) fn sql(s: &'static str) -> &'static str {
    s
}

pub(crate) fn sql_owned(s: String) -> String {
    s
}

/// No row locks: the single writer serializes every transaction.
pub(crate) const FOR_UPDATE: &str = "";
pub(crate) const FOR_UPDATE_OF_RUN: &str = "";
pub(crate) const FOR_UPDATE_OF_RUN_SKIP_LOCKED: &str = "";

pub(crate) const NOW_SQL: &str = "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The single writer already serializes every transaction: nothing to lock.
pub(crate) async fn lock_run_of_job(_tx: &mut Tx<'_>, _job_id: &str) -> Result<()> {
    Ok(())
}

pub(crate) async fn try_lock_run_of_job(_tx: &mut Tx<'_>, _job_id: &str) -> Result<bool> {
    Ok(true)
}

pub(crate) async fn lock_run(_tx: &mut Tx<'_>, _run_id: &str) -> Result<()> {
    Ok(())
}

pub(crate) async fn lock_job(_tx: &mut Tx<'_>, _job_id: &str) -> Result<()> {
    Ok(())
}

/// One server owns a SQLite database: nobody else makes jobs ready.
pub(crate) async fn ready_wakeups(_store: &SqliteStore) -> Result<Option<std::sync::Arc<tokio::sync::Notify>>> {
    Ok(None)
}

/// What the heartbeat fast path returns for a live lease it extended: the new
/// deadline, the job's `cancel_requested`, the run's status.
pub(crate) type LeaseExtended = (i64, i64, String);

/// The heartbeat fast path (see `engine.rs`): one statement on the writer.
/// `None`: no live lease of that epoch; the full transaction says why.
pub(crate) async fn extend_lease(
    store: &SqliteStore,
    job_id: &str,
    epoch: i64,
    lease_ttl_ms: i64,
) -> Result<Option<LeaseExtended>> {
    sqlx::query_as(
        "UPDATE attempts SET lease_deadline = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ? \
         WHERE job_id = ? AND epoch = ? AND outcome = 'running' \
           AND lease_deadline > CAST(unixepoch('subsec') * 1000 AS INTEGER) \
           AND epoch = (SELECT current_epoch FROM jobs WHERE id = ?) \
         RETURNING lease_deadline, (SELECT cancel_requested FROM jobs WHERE id = ?), \
           (SELECT r.status FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = ?)",
    )
    .bind(lease_ttl_ms)
    .bind(job_id)
    .bind(epoch)
    .bind(job_id)
    .bind(job_id)
    .bind(job_id)
    .fetch_optional(&store.writer)
    .await
    .map_err(db_err)
}

/// Transactions never conflict under one writer; a busy database is an outage.
pub(crate) const MAX_TX_RETRIES: u32 = 0;

pub(crate) fn retryable(_e: &StoreError) -> bool {
    false
}

pub(crate) async fn retry_pause(_tries: u32) {}

impl SqliteStore {
    /// Open (creating if needed) the database at `path` and run migrations.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL: a committed transaction survives a crash of the
            // process (SIGKILL); an OS crash may lose the last few commits.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10))
            // Checkpoint the WAL every ~64 MiB rather than every 4 MiB: log
            // chunks are large, and each checkpoint waits on an fsync.
            .pragma("wal_autocheckpoint", "16384");
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await
            .map_err(db_err)?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.read_only(true))
            .await
            .map_err(db_err)?;
        Ok(SqliteStore { writer, reader, backoff: Backoff::default() })
    }

    /// Override the retry backoff (tests use a small one).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub(crate) async fn begin(&self) -> Result<Tx<'static>> {
        self.writer.begin().await.map_err(db_err)
    }

    /// The single writer serializes every transaction: the same as [`Self::begin`].
    pub(crate) async fn begin_locked(&self) -> Result<Tx<'static>> {
        self.begin().await
    }

    pub(crate) fn retry_delay(&self, n: u32) -> i64 {
        self.backoff.delay_ms(n, &mut rand::rng()) as i64
    }
}
