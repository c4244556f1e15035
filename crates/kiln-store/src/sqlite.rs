//! SQLite (embedded default): what only SQLite has. WAL mode; one writer
//! connection serializes every mutating transaction (the run lock of spec
//! 000 §9 is implied by SQLite's single writer), several read-only
//! connections serve queries. The transactions themselves are shared
//! (`tx/`); the SQL fragments that differ are in `dialect.rs`.

use crate::dialect::{SQLITE, Sql, lit};
use crate::error::{Result, StoreError, db_err};
use crate::rows::LeaseExtended;
use kiln_core::AttemptOutcome;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::path::Path;
use std::time::Duration;

/// The writer and reader pools of the database at `path` (created if
/// needed), migrated.
pub(crate) async fn open_pools(path: &Path) -> Result<(SqlitePool, SqlitePool)> {
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
        // A transaction whose COMMIT or ROLLBACK failed (a full disk:
        // SQLITE_FULL) can leave the connection inside a transaction, or
        // sqlx's count of it wrong; every later "transaction" would then be
        // a savepoint inside one that is never committed — acknowledged
        // writes that no reader sees and that vanish on restart. Such a
        // connection is closed (SQLite rolls back what it held) rather than
        // reused. The ping runs after any rollback queued on release.
        .after_release(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                conn.ping().await?;
                let open = conn.is_in_transaction();
                if open {
                    tracing::warn!("closing a database connection left inside a transaction");
                }
                Ok(!open)
            })
        })
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
    Ok((writer, reader))
}

/// The heartbeat fast path (see `tx/lease.rs`): one statement on the writer.
/// `None`: no live lease of that epoch; the full transaction says why.
pub(crate) async fn extend_lease(
    writer: &SqlitePool,
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
        .fetch_optional(writer)
        .await
        .map_err(db_err)
}
