//! The SQL store: its connections, the transaction runner and row locks.
//!
//! One type serves both backends ([`SqliteStore`] and [`PgStore`] name it);
//! the backend is chosen when the store is opened and shows in [`Pools`].
//! Every trait method is one transaction run by [`SqlStore::transaction`]
//! (or a single statement): begin at the isolation the transaction needs,
//! run its body, commit; a lost serialization race
//! ([`StoreError::Retryable`]) reruns the whole body, a bounded number of
//! times (spec 000 §9: completion, cancellation and readiness are serialized
//! on the run).
//!
//! Lock order (PostgreSQL; SQLite's single writer serializes everything):
//! the run row, then job rows, then the agent row, `FOR UPDATE`. The
//! reconciler takes the run with `SKIP LOCKED` instead: a run held elsewhere
//! waits for its next round.

use crate::db::{Conn, Exec, Tx};
use crate::dialect::{Dialect, Isolation, POSTGRES, SQLITE};
use crate::error::{Result, StoreError, pg_err};
use crate::rows::LeaseExtended;
use crate::{postgres, sqlite};
use kiln_core::Backoff;
use sqlx::PgPool;
use std::path::Path;

/// The authoritative store on SQLite or PostgreSQL.
#[derive(Clone)]
pub struct SqlStore {
    pools: Pools,
    backoff: Backoff,
    logs: std::sync::Arc<LogFiles>,
    /// Signs the provenance a completion writes with each binding (issue
    /// 45); none set: a completion that would bind an artifact is refused.
    attester: std::sync::Arc<std::sync::RwLock<Option<std::sync::Arc<dyn crate::Attester>>>>,
    /// Transactions run again after a lost serialization race or deadlock.
    pub(crate) retries: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// What the store keeps beside the database for log chunks.
#[derive(Default)]
pub(crate) struct LogFiles {
    /// SQLite: the segment files holding the log bytes (`None`: the bytes
    /// stay in the database, as on PostgreSQL).
    pub(crate) segments: Option<crate::segments::Segments>,
    /// New chunks keep their bytes in the database even with `segments`.
    pub(crate) bytes_in_db: bool,
    /// PostgreSQL: the object store holding the log bytes, once the server
    /// set it (`LogStore::set_log_objects`); unset, the bytes stay in the
    /// database.
    pub(crate) objects: std::sync::OnceLock<crate::log_objects::ObjectSegments>,
    /// Commit order of chunks in flight together.
    pub(crate) sequencer: crate::sequencer::Sequencer,
    /// PostgreSQL: chunks waiting for their turn, which the chunk whose
    /// turn it is commits with its own (`log_groups.rs`).
    pub(crate) groups: crate::log_groups::ChunkGroups,
    /// SQLite: held by a bulk chunk (more than
    /// [`crate::segments::SMALL_CHUNK`] bytes) from before it asks for the
    /// writer until it committed, so small chunks wait behind one bulk
    /// chunk at most.
    pub(crate) bulk_gate: Option<tokio::sync::Mutex<()>>,
    /// SQLite: bulk chunks whose bytes are written and synced at once
    /// ([`BULK_IN_FLIGHT`]); the others wait for a turn, in arrival order.
    pub(crate) bulk_admission: Option<tokio::sync::Semaphore>,
}

/// Bulk log chunks (over [`crate::segments::SMALL_CHUNK`] bytes) a SQLite
/// store writes and syncs at once (`KILN_LOG_BULK_IN_FLIGHT` overrides).
/// One stream's window of eight 1 MiB chunks still makes one sync group;
/// with many busy streams a sync carries at most this many megabytes and
/// the writer's queue stays short, so small chunks of live output are not
/// behind a burst of many streams' megabytes (issue 20: with 20 streams'
/// ~160 MiB all admitted, a ticker's write-to-browser p99 was over a
/// second). A chunk holds its turn only while its bytes are written and
/// synced, never while it waits for the chunks before it, so turns cannot
/// deadlock with the commit order.
pub(crate) const BULK_IN_FLIGHT: usize = 8;

/// The SQLite store (embedded default): [`SqlStore::open`].
pub type SqliteStore = SqlStore;
/// The PostgreSQL store (several replicas, large installations): [`SqlStore::connect`].
pub type PgStore = SqlStore;

#[derive(Clone)]
enum Pools {
    /// WAL mode; one writer connection serializes every mutating
    /// transaction (the run lock of spec 000 §9 is implied by SQLite's
    /// single writer), several read-only connections serve queries.
    Sqlite { writer: std::sync::Arc<crate::lanes::Lanes>, reader: std::sync::Arc<crate::lanes::Lanes> },
    /// One pool; concurrent heartbeats share statements (see `postgres.rs`).
    Pg { pool: PgPool, beats: postgres::Heartbeats },
}

/// A transaction body's future (see [`SqlStore::transaction`]).
pub(crate) type Body<'t, T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 't>>;

/// [`BULK_IN_FLIGHT`], or `KILN_LOG_BULK_IN_FLIGHT` when set: a positive
/// integer, else the store refuses to open (a measurement knob that is
/// accepted must do what it says).
fn bulk_in_flight() -> Result<usize> {
    match std::env::var("KILN_LOG_BULK_IN_FLIGHT") {
        Err(_) => Ok(BULK_IN_FLIGHT),
        Ok(v) => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            crate::StoreError::Invalid(format!("KILN_LOG_BULK_IN_FLIGHT must be a positive integer, not {v:?}"))
        }),
    }
}

/// `KILN_LOG_SEGMENTS=off`: new log chunks keep their bytes in the
/// database (for comparison; chunks already in segments or objects stay
/// readable either way). Unset or `on`: segment files beside a SQLite
/// database, the object store on PostgreSQL. Any other value is refused.
fn log_bytes_in_db() -> Result<bool> {
    match std::env::var("KILN_LOG_SEGMENTS").as_deref() {
        Err(_) | Ok("on") => Ok(false),
        Ok("off") => Ok(true),
        Ok(v) => Err(crate::StoreError::Invalid(format!("KILN_LOG_SEGMENTS must be `on` or `off`, not {v:?}"))),
    }
}

impl SqlStore {
    /// Open (creating if needed) the SQLite database at `path` and run migrations.
    pub async fn open(path: &Path) -> Result<SqlStore> {
        let (writer, reader) = sqlite::open_pools(path).await?;
        // `kiln.db` keeps its log bytes in `kiln.db.logs/`, unless
        // KILN_LOG_SEGMENTS=off keeps them in the database (for comparison;
        // chunks already in segments stay readable either way). Any other
        // value than `on` or `off` is refused.
        let mut dir = path.as_os_str().to_owned();
        dir.push(".logs");
        let segments = crate::segments::Segments::new(dir.into());
        let logs = LogFiles {
            segments: Some(segments),
            bytes_in_db: log_bytes_in_db()?,
            bulk_gate: Some(tokio::sync::Mutex::new(())),
            bulk_admission: Some(tokio::sync::Semaphore::new(bulk_in_flight()?)),
            ..LogFiles::default()
        };
        Ok(SqlStore {
            pools: Pools::Sqlite { writer, reader },
            backoff: Backoff::default(),
            logs: logs.into(),
            attester: Default::default(),
            retries: Default::default(),
        })
    }

    /// Connect to PostgreSQL at `url` (`postgres://user:pass@host:port/db`)
    /// and run migrations.
    pub async fn connect(url: &str) -> Result<SqlStore> {
        let pool = postgres::connect_pool(url).await?;
        let beats = postgres::Heartbeats::spawn(pool.clone());
        let logs = LogFiles { bytes_in_db: log_bytes_in_db()?, ..LogFiles::default() };
        Ok(SqlStore {
            pools: Pools::Pg { pool, beats },
            backoff: Backoff::default(),
            logs: logs.into(),
            attester: Default::default(),
            retries: Default::default(),
        })
    }

    /// Override the retry backoff (tests use a small one).
    /// The attester that signs provenance, if one was set.
    pub(crate) fn attester(&self) -> Option<std::sync::Arc<dyn crate::Attester>> {
        self.attester.read().expect("attester").clone()
    }

    pub(crate) fn put_attester(&self, a: std::sync::Arc<dyn crate::Attester>) {
        *self.attester.write().expect("attester") = Some(a);
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Log chunks waiting for their turn to commit, for tests (issue 47,
    /// item 6: a test holds a group together and lets it go).
    #[doc(hidden)]
    pub fn log_chunks_waiting(&self) -> usize {
        self.logs.groups.waiting()
    }

    pub(crate) fn log_files(&self) -> &LogFiles {
        &self.logs
    }

    /// PostgreSQL: new log chunks keep their bytes in `objects` (unless
    /// `KILN_LOG_SEGMENTS=off`); set once. SQLite keeps its segment files.
    pub(crate) fn put_log_objects(&self, objects: std::sync::Arc<dyn crate::LogObjects>) {
        if matches!(self.pools, Pools::Pg { .. }) && !self.logs.bytes_in_db {
            let _ = self.logs.objects.set(crate::log_objects::ObjectSegments::new(objects));
        }
    }

    pub(crate) fn dialect(&self) -> &'static Dialect {
        match self.pools {
            Pools::Sqlite { .. } => &SQLITE,
            Pools::Pg { .. } => &POSTGRES,
        }
    }

    /// The backoff between retries of a job (kiln-core's failure rule draws
    /// the delay).
    pub(crate) fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// A connection for reads outside a transaction (SQLite: a read-only one).
    pub(crate) async fn reader(&self) -> Result<Conn> {
        match &self.pools {
            Pools::Sqlite { reader, .. } => reader.acquire().await.map(Conn::Sqlite),
            Pools::Pg { pool, .. } => pool.acquire().await.map(Conn::Pg).map_err(pg_err),
        }
    }

    /// A connection for a single-statement write outside a transaction.
    pub(crate) async fn writer(&self) -> Result<Conn> {
        match &self.pools {
            Pools::Sqlite { writer, .. } => writer.acquire().await.map(Conn::Sqlite),
            Pools::Pg { pool, .. } => pool.acquire().await.map(Conn::Pg).map_err(pg_err),
        }
    }

    /// Several reads that see one snapshot ([`Self::read_tx`]): `body`
    /// runs inside it, and the transaction is ended whatever it returns.
    /// Ended, not dropped: a SQLite transaction dropped open closes its
    /// connection (see [`crate::lanes::Lanes`]), and the next reader would
    /// open a new one (a thread and its `PRAGMA`s) for every such read.
    /// Called like [`Self::transaction`].
    pub(crate) async fn read<A, T, F>(&self, args: &A, body: F) -> Result<T>
    where
        A: Sync + ?Sized,
        T: Send,
        F: for<'t> Fn(&'t mut Tx, &'t A) -> Body<'t, T> + Send,
    {
        let mut tx = self.read_tx().await?;
        let r = body(&mut tx, args).await;
        // It wrote nothing: ending it either way only releases the snapshot.
        tx.rollback().await;
        r
    }

    /// A read-only transaction: several reads that see one snapshot (a
    /// deferred transaction on SQLite's reader; REPEATABLE READ on
    /// PostgreSQL, whose default would give each statement its own moment:
    /// a run's jobs read before a commit and its attempts after it).
    /// Use it through [`Self::read`], which ends it.
    async fn read_tx(&self) -> Result<Tx> {
        match &self.pools {
            Pools::Sqlite { reader, .. } => crate::lanes::SqliteTx::begin(reader).await.map(Tx::Sqlite),
            Pools::Pg { pool, .. } => {
                pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await.map(Tx::Pg).map_err(pg_err)
            }
        }
    }

    async fn begin(&self, isolation: Isolation) -> Result<Tx> {
        match &self.pools {
            Pools::Sqlite { writer, .. } => crate::lanes::SqliteTx::begin(writer).await.map(Tx::Sqlite),
            Pools::Pg { pool, .. } => match POSTGRES.begin(isolation) {
                Some(begin) => pool.begin_with(begin).await.map(Tx::Pg).map_err(pg_err),
                None => pool.begin().await.map(Tx::Pg).map_err(pg_err),
            },
        }
    }

    /// One protocol transaction: `body` runs with the transaction open and
    /// its `Ok` is committed; an error rolls back. A lost serialization race
    /// or deadlock (PostgreSQL) reruns the whole body, a bounded number of
    /// times (the dialect's `max_tx_retries`), with a short random pause.
    ///
    /// The body is usually a named `async fn(&mut Tx, …)`, called as
    /// `|tx, &(a, b)| Box::pin(body_tx(tx, a, b))` with its arguments in
    /// `args`: handing the arguments in (rather than capturing them in an
    /// async closure) keeps the future provably `Send` for `async_trait`,
    /// and the box is one small allocation per transaction.
    pub(crate) async fn transaction<A, T, F>(&self, isolation: Isolation, args: &A, body: F) -> Result<T>
    where
        A: Sync + ?Sized,
        T: Send,
        F: for<'t> Fn(&'t mut Tx, &'t A) -> Body<'t, T> + Send,
    {
        let dialect = self.dialect();
        let mut tries = 0u32;
        loop {
            let mut tx = self.begin(isolation).await?;
            // The attester is in scope for the body: the advance pass
            // checks deploy jobs' provenance with its keys (`tx::deploy_gate`).
            let r = match ATTESTER.scope(self.attester(), body(&mut tx, args)).await {
                Ok(v) => tx.commit().await.map(|()| v),
                Err(e) => {
                    tx.rollback().await;
                    Err(e)
                }
            };
            match r {
                Err(StoreError::Retryable(_)) if tries < dialect.max_tx_retries => {
                    tries += 1;
                    self.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    dialect.retry_pause(tries).await;
                }
                r => return r,
            }
        }
    }

    /// The heartbeat fast path: extend the live lease of `(job, epoch)` in
    /// one statement (SQLite) or in a statement shared with concurrent
    /// heartbeats (PostgreSQL). `None`: no live lease of that epoch.
    pub(crate) async fn extend_lease(&self, job_id: &str, epoch: i64, ttl_ms: i64) -> Result<Option<LeaseExtended>> {
        match &self.pools {
            Pools::Sqlite { writer, .. } => sqlite::extend_lease(writer, job_id, epoch, ttl_ms).await,
            Pools::Pg { beats, .. } => beats.extend(job_id, epoch, ttl_ms).await,
        }
    }

    /// See [`OutboxStore::ready_wakeups`](crate::OutboxStore::ready_wakeups):
    /// PostgreSQL listens for other replicas' commits; one server owns a
    /// SQLite database, so nobody else makes jobs ready.
    pub(crate) async fn listen_ready(&self) -> Result<Option<std::sync::Arc<crate::ReadyWakeups>>> {
        match &self.pools {
            Pools::Sqlite { .. } => Ok(None),
            Pools::Pg { pool, .. } => postgres::ready_wakeups(pool).await.map(Some),
        }
    }
}

/// The run row of a job, locked first (spec 000 §9: mutations of one run are
/// serialized on the run).
pub(crate) async fn lock_run_of_job(tx: &mut Tx, job_id: &str) -> Result<()> {
    if tx.dialect().row_locks {
        tx.sql("SELECT r.id FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = $1 FOR UPDATE OF r")
            .bind(job_id)
            .fetch_optional()
            .await?;
    }
    Ok(())
}

/// [`lock_run_of_job`] unless another transaction holds the run: then
/// `false` at once (`SKIP LOCKED`), for work that can wait for its next round.
pub(crate) async fn try_lock_run_of_job(tx: &mut Tx, job_id: &str) -> Result<bool> {
    if !tx.dialect().row_locks {
        return Ok(true);
    }
    let locked = tx
        .sql("SELECT r.id FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = $1 FOR UPDATE OF r SKIP LOCKED")
        .bind(job_id)
        .fetch_optional()
        .await?;
    Ok(locked.is_some())
}

pub(crate) async fn lock_run(tx: &mut Tx, run_id: &str) -> Result<()> {
    if tx.dialect().row_locks {
        tx.sql("SELECT id FROM runs WHERE id = $1 FOR UPDATE").bind(run_id).fetch_optional().await?;
    }
    Ok(())
}

pub(crate) async fn lock_job(tx: &mut Tx, job_id: &str) -> Result<()> {
    if tx.dialect().row_locks {
        tx.sql("SELECT id FROM jobs WHERE id = $1 FOR UPDATE").bind(job_id).fetch_optional().await?;
    }
    Ok(())
}

tokio::task_local! {
    /// The attester of the store whose transaction is running.
    static ATTESTER: Option<std::sync::Arc<dyn crate::Attester>>;
}

/// The attester of the store whose transaction (`SqlStore::transaction`)
/// is running, if it has one.
pub(crate) fn scoped_attester() -> Option<std::sync::Arc<dyn crate::Attester>> {
    ATTESTER.try_with(Clone::clone).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::Exec;

    /// A snapshot read ([`SqlStore::read`]) ends its transaction: its
    /// connection goes back to the idle list and serves the next read (a
    /// transaction left open would close it, and every such read would open
    /// a new connection), and that next read sees what was committed in
    /// between (a snapshot left open would not), also after a read whose
    /// body failed.
    #[tokio::test]
    async fn snapshot_reads_end_and_keep_their_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open(&dir.path().join("kiln.db")).await.unwrap();
        let Pools::Sqlite { writer, reader } = &store.pools else { unreachable!() };
        let write = async |sql: &'static str| {
            sqlx::query(sql).execute(&mut *writer.acquire().await.unwrap()).await.unwrap();
        };
        write("CREATE TABLE scratch (x INTEGER)").await;
        let count = async || -> i64 {
            store
                .read(&(), |tx, ()| Box::pin(async move { tx.sql("SELECT COUNT(*) FROM scratch").scalar().await }))
                .await
                .unwrap()
        };
        assert_eq!(count().await, 0);
        let opened = reader.opened();
        for n in 1..=3 {
            write("INSERT INTO scratch VALUES (1)").await;
            assert_eq!(count().await, n, "each read sees the commits before it");
        }
        let failed: Result<i64> = store
            .read(&(), |tx, ()| Box::pin(async move { tx.sql("SELECT nothing FROM nowhere").scalar().await }))
            .await;
        assert!(failed.is_err());
        write("INSERT INTO scratch VALUES (1)").await;
        assert_eq!(count().await, 4, "a failed read leaves no snapshot behind");
        assert_eq!(reader.opened(), opened, "no connection was opened for these reads");
    }
}
