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
    /// Connections opened so far (each a thread and its `PRAGMA`s).
    opened: std::sync::atomic::AtomicU64,
}

impl Lanes {
    /// At most `max` connections to `opts`, `first` among them.
    pub(crate) fn new(opts: SqliteConnectOptions, max: usize, first: Option<SqliteConnection>) -> Arc<Lanes> {
        Arc::new(Lanes {
            opts,
            idle: std::sync::Mutex::new(first.into_iter().collect()),
            permits: Arc::new(tokio::sync::Semaphore::new(max)),
            opened: Default::default(),
        })
    }

    /// How many connections were opened after the first (tests: a read
    /// that leaves its transaction open costs a new one).
    #[cfg(test)]
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
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
            None => {
                self.opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.opts.connect().await.map_err(db_err)?
            }
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
            // SQLite rolls back an open transaction. Usually a cancelled
            // request or a server shutting down; a failed COMMIT is the
            // caller's error already.
            tracing::debug!("closing a database connection whose transaction did not end cleanly");
            drop(conn);
        } else {
            self.lanes.idle.lock().expect("lanes").push(conn);
        }
    }
}

/// A transaction on a [`Lease`]: `BEGIN` and `COMMIT` are plain
/// statements (see [`Lanes`]), and `BEGIN` is not a round trip of its own:
/// it is sent in front of the transaction's first statement
/// ([`SqliteTx::parts`], [`with_begin`]). A transaction that ran nothing
/// sends nothing. Dropped before [`SqliteTx::commit`] or
/// [`SqliteTx::rollback`] after a statement was sent, its connection is
/// discarded.
pub(crate) struct SqliteTx {
    lease: Lease,
    /// `BEGIN` not sent yet: no statement ran.
    pending_begin: bool,
    open: bool,
}

impl SqliteTx {
    pub(crate) async fn begin(lanes: &Arc<Lanes>) -> Result<SqliteTx> {
        Ok(SqliteTx { lease: lanes.acquire().await?, pending_begin: true, open: true })
    }

    /// The connection, and the flag the next statement must clear when it
    /// runs with `BEGIN` in front (none once `BEGIN` was sent).
    pub(crate) fn parts(&mut self) -> (&mut SqliteConnection, Option<&mut bool>) {
        let SqliteTx { lease, pending_begin, .. } = self;
        let pending = if *pending_begin { Some(pending_begin) } else { None };
        (&mut **lease, pending)
    }

    pub(crate) async fn commit(mut self) -> Result<()> {
        self.end("COMMIT").await
    }

    pub(crate) async fn rollback(mut self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, sql: &'static str) -> Result<()> {
        if self.pending_begin {
            // Nothing ran: there is nothing to end.
            self.open = false;
            return Ok(());
        }
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
        if self.open && !self.pending_begin {
            self.lease.discard();
        }
    }
}

/// `text` with `BEGIN;` in front, made once per statement text. The texts
/// are the store's own statements (`&'static str` literals and built
/// [`crate::dialect::Sql`]s), a bounded set, so each prefixed copy is kept
/// for the life of the process.
pub(crate) fn with_begin(text: &'static str) -> &'static str {
    use std::collections::HashMap;
    static PREFIXED: std::sync::LazyLock<std::sync::Mutex<HashMap<(usize, usize), &'static str>>> =
        std::sync::LazyLock::new(Default::default);
    let key = (text.as_ptr() as usize, text.len());
    let mut prefixed = PREFIXED.lock().expect("prefixed statements");
    prefixed.entry(key).or_insert_with(|| Box::leak(format!("BEGIN;\n{text}").into_boxed_str()))
}
