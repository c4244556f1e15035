//! PostgreSQL implementation (for several server replicas and large
//! installations). The transactions are `engine.rs` and `artifacts.rs`,
//! shared with SQLite; this file is the PostgreSQL dialect they are compiled
//! for.
//!
//! Concurrency: where SQLite has one writer, PostgreSQL runs transactions
//! concurrently. Every mutating transaction runs at SERIALIZABLE isolation,
//! so its outcome is the outcome of some serial order, exactly as on SQLite;
//! a serialization failure or deadlock reruns the whole transaction (bounded,
//! with jitter). On top of that, transactions take row locks in the spec's
//! order — the run row (`SELECT … FOR UPDATE`) first, then job rows — so
//! transactions on one run queue behind each other instead of aborting late.
//! The reconciler's fencing takes the run with `SKIP LOCKED` instead: a run
//! held elsewhere waits for the next round. A transaction changes one run,
//! except where concurrency groups make runs of one repository depend on
//! each other (a group's queued, superseded or cancelled runs and jobs).
//! Times are unix milliseconds from the database clock (`clock_timestamp()`).

use crate::{Result, StoreError};
use kiln_core::Backoff;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

#[allow(clippy::duplicate_mod)]
#[path = "artifacts.rs"]
mod artifacts;
#[allow(clippy::duplicate_mod)]
#[path = "engine.rs"]
mod engine;

pub(crate) type Db = Postgres;
pub(crate) type DbRow = sqlx::postgres::PgRow;
pub(crate) type Tx<'a> = Transaction<'a, Postgres>;
pub(crate) type StoreImpl = PgStore;

/// Marks a transaction that lost a serialization race: nothing was decided,
/// and the whole transaction may be run again.
const RETRY_MARK: &str = "serialization failure, retry: ";

#[derive(Clone)]
pub struct PgStore {
    pub(crate) writer: PgPool,
    /// The same pool: PostgreSQL has no single-writer restriction.
    pub(crate) reader: PgPool,
    backoff: Backoff,
    /// The heartbeat batcher's queue (see [`extend_lease`]).
    beats: tokio::sync::mpsc::UnboundedSender<Beat>,
}

pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(d) = &e {
        // serialization_failure, deadlock_detected
        if matches!(d.code().as_deref(), Some("40001" | "40P01")) {
            return StoreError::Unavailable(format!("{RETRY_MARK}{}", d.message()));
        }
    }
    crate::common_db_err(e)
}

pub(crate) fn retryable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.starts_with(RETRY_MARK))
}

/// Enough for dozens of transactions racing on one run (a test's worst case);
/// after that the caller sees `Unavailable` (HTTP 503) and may retry.
pub(crate) const MAX_TX_RETRIES: u32 = 30;

pub(crate) async fn retry_pause(tries: u32) {
    use rand::Rng;
    let cap = (1u64 << tries.min(6)).min(50);
    let ms = rand::rng().random_range(0..=cap);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Appended to a `SELECT` of one table to lock the rows it returns.
pub(crate) const FOR_UPDATE: &str = " FOR UPDATE";
/// Appended to a `SELECT` over `runs r` joined with other tables: lock the run row.
pub(crate) const FOR_UPDATE_OF_RUN: &str = " FOR UPDATE OF r";
/// [`FOR_UPDATE_OF_RUN`], skipping a run row another transaction holds.
pub(crate) const FOR_UPDATE_OF_RUN_SKIP_LOCKED: &str = " FOR UPDATE OF r SKIP LOCKED";

pub(crate) const NOW_SQL: &str = "SELECT CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT)";

/// Rewrites the engine's SQL (SQLite's dialect) for PostgreSQL: its clock,
/// `json_each` over a bound JSON array, and numbered placeholders.
fn rewrite(s: &str) -> String {
    let s = s
        .replace(
            "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
            "CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT)",
        )
        .replace("json_each(?)", "json_array_elements_text(CAST(? AS json))");
    let mut out = String::with_capacity(s.len() + 16);
    let (mut n, mut quoted) = (0, false);
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

/// The rewritten form of each SQL literal, computed once.
pub(crate) fn sql(s: &'static str) -> &'static str {
    static CACHE: LazyLock<RwLock<HashMap<&'static str, &'static str>>> = LazyLock::new(Default::default);
    if let Some(r) = CACHE.read().expect("sql cache").get(s) {
        return r;
    }
    let r: &'static str = Box::leak(rewrite(s).into_boxed_str());
    CACHE.write().expect("sql cache").insert(s, r);
    r
}

pub(crate) fn sql_owned(s: String) -> String {
    rewrite(&s)
}

/// The run row of a job, locked first (spec 000 §9: mutations of one run are
/// serialized on the run).
pub(crate) async fn lock_run_of_job(tx: &mut Tx<'_>, job_id: &str) -> Result<()> {
    sqlx::query("SELECT r.id FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = $1 FOR UPDATE OF r")
        .bind(job_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// [`lock_run_of_job`] unless another transaction holds the run: then
/// `false` at once (`SKIP LOCKED`), for work that can wait for its next round.
pub(crate) async fn try_lock_run_of_job(tx: &mut Tx<'_>, job_id: &str) -> Result<bool> {
    let locked: Option<String> = sqlx::query_scalar(
        "SELECT r.id FROM runs r JOIN jobs j ON j.run_id = r.id WHERE j.id = $1 FOR UPDATE OF r SKIP LOCKED",
    )
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db_err)?;
    Ok(locked.is_some())
}

pub(crate) async fn lock_run(tx: &mut Tx<'_>, run_id: &str) -> Result<()> {
    sqlx::query("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

pub(crate) async fn lock_job(tx: &mut Tx<'_>, job_id: &str) -> Result<()> {
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(job_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// The channel the outbox trigger notifies (migration 0009).
const READY_CHANNEL: &str = "kiln_ready";

/// `LISTEN kiln_ready` on a connection of its own; each notification (and
/// each reconnection, after which notifications may have been lost) notifies
/// the returned `Notify`. The listener ends when every holder of the
/// `Notify` has dropped it.
pub(crate) async fn ready_wakeups(store: &PgStore) -> Result<Option<std::sync::Arc<tokio::sync::Notify>>> {
    use std::sync::{Arc, Weak};
    let mut listener = sqlx::postgres::PgListener::connect_with(&store.writer).await.map_err(db_err)?;
    listener.listen(READY_CHANNEL).await.map_err(db_err)?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let weak: Weak<tokio::sync::Notify> = Arc::downgrade(&wake);
    tokio::spawn(async move {
        loop {
            // Wake up now and then to notice that nobody listens any more.
            let got = tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await;
            let Some(wake) = weak.upgrade() else { return };
            match got {
                Err(_elapsed) => {}
                Ok(Ok(Some(_))) => wake.notify_one(),
                // The connection was lost; the next `try_recv` reconnects
                // and listens again. Sweep: notifications may have been lost.
                Ok(Ok(None)) => wake.notify_one(),
                Ok(Err(e)) => {
                    tracing::warn!("ready notifications paused: {e}");
                    wake.notify_one();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(Some(wake))
}

/// What the heartbeat fast path returns for a live lease it extended: the new
/// deadline, the job's `cancel_requested`, the run's status.
pub(crate) type LeaseExtended = (i64, i64, String);

/// A row of `kiln_extend_leases`: job, epoch, then [`LeaseExtended`].
type ExtendedRow = (String, i64, i64, i64, String);

/// One heartbeat waiting for its batch.
struct Beat {
    job_id: String,
    epoch: i64,
    ttl_ms: i64,
    reply: tokio::sync::oneshot::Sender<Result<Option<LeaseExtended>>>,
}

/// Statements of heartbeats in flight at once; while all are busy, arriving
/// heartbeats queue and the next statement takes them all.
const HEARTBEAT_STATEMENTS: usize = 4;
/// The most leases one statement extends.
const HEARTBEAT_BATCH: usize = 512;

/// The heartbeat fast path (see `engine.rs`): the lease is extended by a
/// statement shared with every other heartbeat that arrived meanwhile.
///
/// At the spec's peak a replica receives thousands of heartbeats a second,
/// each one row. One statement and one commit per heartbeat spends most of
/// the database on per-statement and per-commit work; one call of
/// `kiln_extend_leases` (migration 0011) extends many leases in one round
/// trip and one commit. There is no timer: a heartbeat that finds a statement
/// slot free goes at once (alone, when the database keeps up); while every
/// slot is busy, arriving heartbeats gather for the next statement. (Waiting
/// 5 ms for company made batches of ~8 instead of ~2 and halved the median
/// claim latency of `kiln bench control-plane`, but doubled its p99.)
///
/// Each row is updated under the same conditions as a single heartbeat
/// (running, unexpired, the job's current epoch), rechecked by PostgreSQL on
/// the newest row version if a completion or fence changed it meanwhile.
/// `None`: no live lease of that epoch; the full transaction says why.
pub(crate) async fn extend_lease(
    store: &PgStore,
    job_id: &str,
    epoch: i64,
    lease_ttl_ms: i64,
) -> Result<Option<LeaseExtended>> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let beat = Beat { job_id: job_id.to_string(), epoch, ttl_ms: lease_ttl_ms, reply };
    store.beats.send(beat).map_err(|_| StoreError::Unavailable("the heartbeat batcher stopped".into()))?;
    rx.await.map_err(|_| StoreError::Unavailable("the heartbeat batcher stopped".into()))?
}

fn spawn_heartbeat_batcher(pool: PgPool) -> tokio::sync::mpsc::UnboundedSender<Beat> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Beat>();
    tokio::spawn(async move {
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(HEARTBEAT_STATEMENTS));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            // Ends when every clone of the store is gone.
            let Some(first) = rx.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < HEARTBEAT_BATCH {
                match rx.try_recv() {
                    Ok(b) => batch.push(b),
                    Err(_) => break,
                }
            }
            let pool = pool.clone();
            tokio::spawn(async move {
                let _slot = slot;
                extend_leases(&pool, batch).await;
            });
        }
    });
    tx
}

/// One statement for a batch of heartbeats; every waiter gets its row's
/// result (or the statement's error).
async fn extend_leases(pool: &PgPool, mut batch: Vec<Beat>) {
    // One row per lease, in key order: concurrent batches lock the rows
    // they share in the same order.
    batch.sort_by(|a, b| (&a.job_id, a.epoch).cmp(&(&b.job_id, b.epoch)));
    let (mut jobs, mut epochs, mut ttls) = (Vec::new(), Vec::new(), Vec::new());
    for b in &batch {
        if jobs.last() != Some(&b.job_id) || epochs.last() != Some(&b.epoch) {
            jobs.push(b.job_id.clone());
            epochs.push(b.epoch);
            ttls.push(b.ttl_ms);
        }
    }
    let mut tries = 0;
    let rows = loop {
        let r: std::result::Result<Vec<ExtendedRow>, _> =
            sqlx::query_as("SELECT * FROM kiln_extend_leases($1, $2, $3)")
                .bind(&jobs)
                .bind(&epochs)
                .bind(&ttls)
                .fetch_all(pool)
                .await;
        match r.map_err(db_err) {
            Err(e) if retryable(&e) && tries < MAX_TX_RETRIES => {
                tries += 1;
                retry_pause(tries).await;
            }
            r => break r,
        }
    };
    match rows {
        Ok(rows) => {
            let live: HashMap<(String, i64), LeaseExtended> =
                rows.into_iter().map(|(j, e, d, c, s)| ((j, e), (d, c, s))).collect();
            for b in batch {
                let r = live.get(&(b.job_id, b.epoch)).cloned();
                let _ = b.reply.send(Ok(r));
            }
        }
        Err(e) => {
            let msg = match e {
                StoreError::Unavailable(m) => m,
                other => other.to_string(),
            };
            for b in batch {
                let _ = b.reply.send(Err(StoreError::Unavailable(msg.clone())));
            }
        }
    }
}

impl PgStore {
    /// Connect to `url` (`postgres://user:pass@host:port/db`) and run migrations.
    pub async fn connect(url: &str) -> Result<PgStore> {
        let mut opts =
            PgConnectOptions::from_str(url).map_err(|e| StoreError::Invalid(format!("database url: {e}")))?;
        if !url.contains("lock_timeout") {
            // Like SQLite's busy timeout: a lock held elsewhere for this long
            // is an outage (503), not a hang. A URL may set its own
            // (`?options=-c%20lock_timeout%3D2s`).
            opts = opts.options([("lock_timeout", "10s")]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts)
            .await
            .map_err(db_err)?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
        let beats = spawn_heartbeat_batcher(pool.clone());
        Ok(PgStore { writer: pool.clone(), reader: pool, backoff: Backoff::default(), beats })
    }

    /// Override the retry backoff (tests use a small one).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub(crate) async fn begin(&self) -> Result<Tx<'static>> {
        self.writer.begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE").await.map_err(db_err)
    }

    /// A transaction that decides only on rows it locked first (run, then
    /// job, then agent, `FOR UPDATE`) or on conditions rechecked in the
    /// `WHERE` of its own `UPDATE`s: READ COMMITTED, where every statement
    /// after a lock reads the newest committed rows. See `engine.rs` for the
    /// transactions that use it and why each is safe.
    pub(crate) async fn begin_locked(&self) -> Result<Tx<'static>> {
        self.writer.begin_with("BEGIN ISOLATION LEVEL READ COMMITTED").await.map_err(db_err)
    }

    pub(crate) fn retry_delay(&self, n: u32) -> i64 {
        self.backoff.delay_ms(n, &mut rand::rng()) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn placeholders_are_numbered_outside_literals() {
        assert_eq!(
            rewrite("SELECT a FROM t WHERE b = ? AND c = '?' AND d IN (SELECT value FROM json_each(?))"),
            "SELECT a FROM t WHERE b = $1 AND c = '?' AND d IN (SELECT value FROM json_array_elements_text(CAST($2 AS json)))"
        );
    }
}
