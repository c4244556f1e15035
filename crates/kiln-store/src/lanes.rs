//! SQLite connections handed out without sqlx's pool ([`Lanes`]), and
//! transactions on them ([`SqliteTx`]): issue 20.

use crate::error::{Result, StoreError, db_err};
use sqlx::ConnectOptions;
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteConnectOptions;
use std::sync::Arc;
use std::time::Duration;

/// How long a statement waits for a free connection before the store
/// reports itself unavailable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// SQLite connections handed out one caller at a time (issue 20), instead
/// of sqlx's pool. Each sqlx SQLite connection is a thread of its own that
/// every statement is a round trip to; sqlx's pool adds two more per use
/// (a ping when a connection is returned, and one in `after_release`), and
/// its `BEGIN` and `COMMIT` wait for the caller to acknowledge them (four
/// thread hand-offs instead of two). Here a connection goes back to the
/// idle list when its [`Lease`] drops, with no statement; transactions
/// ([`SqliteTx`]) are plain `BEGIN` / `COMMIT` statements.
///
/// What the pool's checks were for holds: a connection whose state is not
/// known to be clean — a transaction dropped before its end (a cancelled
/// request), or a `COMMIT` or `ROLLBACK` that failed (a full disk:
/// SQLITE_FULL can leave it inside a transaction, and every later write
/// would then vanish with it) — is closed, so SQLite rolls back whatever it
/// held, and a fresh one is opened for the next caller.
pub(crate) struct Lanes {
    opts: SqliteConnectOptions,
    idle: std::sync::Mutex<Vec<SqliteConnection>>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl Lanes {
    /// At most `max` connections to `opts`, `first` among them.
    pub(crate) fn new(opts: SqliteConnectOptions, max: usize, first: Option<SqliteConnection>) -> Arc<Lanes> {
        Arc::new(Lanes {
            opts,
            idle: std::sync::Mutex::new(first.into_iter().collect()),
            permits: Arc::new(tokio::sync::Semaphore::new(max)),
        })
    }

    /// A connection of its own until the lease drops (an idle one, or a
    /// new one while fewer than the maximum are open).
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<Lease> {
        let permit = tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| StoreError::Unavailable("timed out waiting for a database connection".into()))?
            .map_err(|_| StoreError::Unavailable("the database is closed".into()))?;
        let idle = self.idle.lock().expect("lanes").pop();
        let conn = match idle {
            Some(c) => c,
            None => self.opts.connect().await.map_err(db_err)?,
        };
        Ok(Lease { conn: Some(conn), lanes: self.clone(), discard: false, _permit: permit })
    }
}

/// One connection of [`Lanes`], back to the idle list when dropped (or
/// closed, after [`Lease::discard`]).
pub(crate) struct Lease {
    conn: Option<SqliteConnection>,
    lanes: Arc<Lanes>,
    discard: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Lease {
    /// Close this connection instead of reusing it: its state is not known.
    pub(crate) fn discard(&mut self) {
        self.discard = true;
    }
}

impl std::ops::Deref for Lease {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.conn.as_ref().expect("a live lease")
    }
}

impl std::ops::DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("a live lease")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.discard {
            // Dropping it ends its thread, which closes the database handle:
            // SQLite rolls back an open transaction.
            tracing::warn!("closing a database connection whose transaction did not end cleanly");
            drop(conn);
        } else {
            self.lanes.idle.lock().expect("lanes").push(conn);
        }
    }
}

/// A transaction on a [`Lease`]: `BEGIN` and `COMMIT` are plain
/// statements (see [`Lanes`]). Dropped before [`SqliteTx::commit`] or
/// [`SqliteTx::rollback`], its connection is discarded.
pub(crate) struct SqliteTx {
    lease: Lease,
    open: bool,
}

impl SqliteTx {
    pub(crate) async fn begin(lanes: &Arc<Lanes>) -> Result<SqliteTx> {
        let mut lease = lanes.acquire().await?;
        if let Err(e) = sqlx::query("BEGIN").execute(&mut *lease).await {
            lease.discard();
            return Err(db_err(e));
        }
        Ok(SqliteTx { lease, open: true })
    }

    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.lease
    }

    pub(crate) async fn commit(mut self) -> Result<()> {
        self.end("COMMIT").await
    }

    pub(crate) async fn rollback(mut self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, sql: &'static str) -> Result<()> {
        let r = sqlx::query(sql).execute(&mut *self.lease).await;
        self.open = false;
        if r.is_err() {
            self.lease.discard();
        }
        r.map(drop).map_err(db_err)
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if self.open {
            self.lease.discard();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::open_pools;

    async fn rows(lanes: &Arc<Lanes>) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT x FROM scratch ORDER BY x")
            .fetch_all(&mut *lanes.acquire().await.unwrap())
            .await
            .unwrap();
        rows.into_iter().map(|(x,)| x).collect()
    }

    /// A transaction dropped before its end (a cancelled request) leaves
    /// neither its writes nor an open transaction behind: the next one on
    /// the single writer begins, commits, and is what readers see.
    #[tokio::test]
    async fn a_transaction_dropped_midway_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = open_pools(&dir.path().join("kiln.db")).await.unwrap();
        sqlx::query("CREATE TABLE scratch (x INTEGER)").execute(&mut *writer.acquire().await.unwrap()).await.unwrap();
        {
            let mut tx = SqliteTx::begin(&writer).await.unwrap();
            sqlx::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.unwrap();
        }
        let mut tx = SqliteTx::begin(&writer).await.unwrap();
        sqlx::query("INSERT INTO scratch VALUES (2)").execute(tx.conn()).await.unwrap();
        assert_eq!(rows(&reader).await, Vec::<i64>::new(), "nothing before the commit");
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2]);

        // Rolled back: nothing; the connection is clean for the next one.
        let mut tx = SqliteTx::begin(&writer).await.unwrap();
        sqlx::query("INSERT INTO scratch VALUES (3)").execute(tx.conn()).await.unwrap();
        tx.rollback().await.unwrap();
        let tx = SqliteTx::begin(&writer).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2]);
    }

    /// A failed `COMMIT` discards its connection: the next transaction does
    /// not run inside the one that could not end (its writes would vanish).
    #[tokio::test]
    async fn a_failed_commit_does_not_leave_the_next_transaction_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = open_pools(&dir.path().join("kiln.db")).await.unwrap();
        let mut w = writer.acquire().await.unwrap();
        sqlx::query("CREATE TABLE scratch (x INTEGER)").execute(&mut *w).await.unwrap();
        sqlx::query("CREATE TABLE parent (id INTEGER PRIMARY KEY)").execute(&mut *w).await.unwrap();
        sqlx::query("CREATE TABLE child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
            .execute(&mut *w)
            .await
            .unwrap();
        drop(w);
        // A deferred foreign key fails at COMMIT and leaves the
        // transaction open.
        let mut tx = SqliteTx::begin(&writer).await.unwrap();
        sqlx::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.unwrap();
        sqlx::query("INSERT INTO child VALUES (42)").execute(tx.conn()).await.unwrap();
        assert!(tx.commit().await.is_err());
        let mut tx = SqliteTx::begin(&writer).await.unwrap();
        sqlx::query("INSERT INTO scratch VALUES (2)").execute(tx.conn()).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2], "the failed transaction's row is gone, the next one's committed");
    }
}
