//! SQLite (embedded default): what only SQLite has. WAL mode; one writer
//! connection serializes every mutating transaction (the run lock of spec
//! 000 §9 is implied by SQLite's single writer), several read-only
//! connections serve queries. The transactions themselves are shared
//! (`tx/`); the SQL fragments that differ are in `dialect.rs`.

use crate::dialect::{SQLITE, Sql, lit};
use crate::error::{Result, StoreError, db_err};
use crate::lanes::Lanes;
use crate::rows::LeaseExtended;
use kiln_core::AttemptOutcome;
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The writer and reader connections of the database at `path` (created
/// if needed), migrated.
pub(crate) async fn open_pools(path: &Path) -> Result<(Arc<Lanes>, Arc<Lanes>)> {
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
    let mut first = opts.connect().await.map_err(db_err)?;
    sqlx::migrate!("./migrations/sqlite")
        .run(&mut first)
        .await
        .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
    Ok((Lanes::new(opts.clone(), 1, Some(first)), Lanes::new(opts.read_only(true), 4, None)))
}

/// The heartbeat fast path (see `tx/lease.rs`): one statement on the writer.
/// `None`: no live lease of that epoch; the full transaction says why.
pub(crate) async fn extend_lease(
    writer: &Arc<Lanes>,
    job_id: &str,
    epoch: i64,
    lease_ttl_ms: i64,
) -> Result<Option<LeaseExtended>> {
    static EXTEND: Sql = Sql::new(|d| {
        format!(
            "UPDATE attempts SET lease_deadline = {now} + $1 \
             WHERE job_id = $2 AND epoch = $3 AND outcome = {running} AND lease_deadline > {now} \
               AND epoch = (SELECT current_epoch FROM jobs WHERE id = $2) \
             RETURNING lease_deadline, (SELECT cancel_requested FROM jobs WHERE id = $2), \
               (SELECT r.status FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = $2)",
            now = d.now_ms,
            running = lit(AttemptOutcome::Running),
        )
    });
    sqlx::query_as(EXTEND.text(&SQLITE))
        .bind(lease_ttl_ms)
        .bind(job_id)
        .bind(epoch)
        .fetch_optional(&mut *writer.acquire().await?)
        .await
        .map_err(db_err)
}
