//! PostgreSQL (several server replicas, large installations): what only
//! PostgreSQL has — connecting, the batched heartbeat function
//! `kiln_extend_leases` (migration 0011) and LISTEN/NOTIFY for ready jobs.
//! The transactions themselves are shared (`tx/`); the SQL fragments that
//! differ are in `dialect.rs`.
//!
//! Concurrency: where SQLite has one writer, PostgreSQL runs transactions
//! concurrently. Mutating transactions run at SERIALIZABLE isolation, so
//! their outcome is the outcome of some serial order, exactly as on SQLite;
//! a serialization failure or deadlock reruns the whole transaction (bounded,
//! with jitter). On top of that, transactions take row locks in the spec's
//! order — the run row (`SELECT … FOR UPDATE`) first, then job rows — so
//! transactions on one run queue behind each other instead of aborting late.
//! The claim and a completion outside concurrency groups decide only on
//! rows they locked first and run at READ COMMITTED (see `tx/claim.rs` and
//! `tx/complete.rs`); a heartbeat is one statement (see [`Heartbeats`]). The reconciler's fencing takes
//! the run with `SKIP LOCKED` instead: a run held elsewhere waits for the
//! next round. A transaction changes one run, except where concurrency
//! groups make runs of one repository depend on each other (a group's
//! queued, superseded or cancelled runs and jobs). Times are unix
//! milliseconds from the database clock (`clock_timestamp()`).

use crate::dialect::POSTGRES;
use crate::error::{Result, StoreError, pg_err};
use crate::rows::LeaseExtended;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Connect to `url` (`postgres://user:pass@host:port/db`) and run migrations.
pub(crate) async fn connect_pool(url: &str) -> Result<PgPool> {
    let mut opts = PgConnectOptions::from_str(url).map_err(|e| StoreError::Invalid(format!("database url: {e}")))?;
    // A name of this process's own (under the URL's, if it sets one): the
    // ready notifications its commits send carry it (migration 0047), and
    // its listener skips them (`ready_wakeups`).
    let base = opts.get_application_name().unwrap_or("kiln").to_string();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let name: String = format!("{}/{}", base.chars().take(40).collect::<String>(), &tag[..12]);
    opts = opts.application_name(&name);
    if !url.contains("lock_timeout") {
        // Like SQLite's busy timeout: a lock held elsewhere for this long
        // is an outage (503), not a hang. A URL may set its own
        // (`?options=-c%20lock_timeout%3D2s`).
        opts = opts.options([("lock_timeout", "10s")]);
    }
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(30))
        // sqlx pings every connection it hands out (a round trip before
        // each transaction and read: ~25 per no-op run), and again when it
        // takes one back. A connection in use moments ago was just pinged
        // on its return: only one idle for a while (its server may have
        // restarted since) is pinged before use.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > IDLE_PING_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .connect_with(opts)
        .await
        .map_err(pg_err)?;
    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
    Ok(pool)
}

/// A pooled connection idle for longer than this is pinged before use.
const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// The channel the outbox trigger notifies (migration 0009).
const READY_CHANNEL: &str = "kiln_ready";

/// `LISTEN kiln_ready` on a connection of its own; each notification of
/// another store's commit (another replica's: this store's own name its
/// pool, see `connect_pool`), and each reconnection (after which
/// notifications may have been lost), notifies the returned `Notify`. The
/// listener ends when every holder of the `Notify` has dropped it.
pub(crate) async fn ready_wakeups(pool: &PgPool) -> Result<Arc<crate::ReadyWakeups>> {
    use std::sync::Weak;
    let own = pool.connect_options().get_application_name().unwrap_or_default().to_string();
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await.map_err(pg_err)?;
    listener.listen(READY_CHANNEL).await.map_err(pg_err)?;
    let wake = Arc::new(crate::ReadyWakeups::default());
    let weak: Weak<crate::ReadyWakeups> = Arc::downgrade(&wake);
    tokio::spawn(async move {
        loop {
            // Wake up now and then to notice that nobody listens any more.
            let got = tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await;
            let Some(wake) = weak.upgrade() else { return };
            match got {
                Err(_elapsed) => {}
                Ok(Ok(Some(n))) => match ready_payload(n.payload(), &own) {
                    // This store's own commit: its relay queued the jobs.
                    Ready::Own => {}
                    Ready::Jobs(jobs) => wake.wake(Some(jobs)),
                    Ready::All => wake.wake(None),
                },
                // The connection was lost; the next `try_recv` reconnects
                // and listens again. Sweep: notifications may have been lost.
                Ok(Ok(None)) => wake.wake(None),
                Ok(Err(e)) => {
                    tracing::warn!("ready notifications paused: {e}");
                    wake.wake(None);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(wake)
}

/// What a ready notification asks of the listener named `own`.
#[derive(Debug, PartialEq, Eq)]
enum Ready {
    Own,
    Jobs(Vec<String>),
    All,
}

/// A ready notification's payload (migration 0047): `SENDER JOB,JOB,…`, or
/// `SENDER *` for too many jobs; anything else (an older replica's empty
/// payload) is all jobs from another sender.
fn ready_payload(payload: &str, own: &str) -> Ready {
    let Some((sender, jobs)) = payload.split_once(' ') else { return Ready::All };
    if !own.is_empty() && sender == own {
        return Ready::Own;
    }
    let jobs: Vec<String> = jobs.split(',').map(str::trim).filter(|j| !j.is_empty()).map(String::from).collect();
    if jobs.is_empty() || jobs.iter().any(|j| j == "*") { Ready::All } else { Ready::Jobs(jobs) }
}

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

/// The heartbeat batcher's queue (see [`Heartbeats::extend`]).
#[derive(Clone)]
pub(crate) struct Heartbeats(tokio::sync::mpsc::UnboundedSender<Beat>);

impl Heartbeats {
    pub(crate) fn spawn(pool: PgPool) -> Heartbeats {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Beat>();
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(HEARTBEAT_STATEMENTS));
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
        Heartbeats(tx)
    }

    /// The heartbeat fast path (see `tx/lease.rs`): the lease is extended by
    /// a statement shared with every other heartbeat that arrived meanwhile.
    ///
    /// At the spec's peak a replica receives thousands of heartbeats a
    /// second, each one row. One statement and one commit per heartbeat
    /// spends most of the database on per-statement and per-commit work; one
    /// call of `kiln_extend_leases` (migration 0011) extends many leases in
    /// one round trip and one commit. There is no timer: a heartbeat that
    /// finds a statement slot free goes at once (alone, when the database
    /// keeps up); while every slot is busy, arriving heartbeats gather for
    /// the next statement. (Waiting 5 ms for company made batches of ~8
    /// instead of ~2 and halved the median claim latency of `kiln bench
    /// control-plane`, but doubled its p99.)
    ///
    /// Each row is updated under the same conditions as a single heartbeat
    /// (running, unexpired, the job's current epoch), rechecked by PostgreSQL
    /// on the newest row version if a completion or fence changed it
    /// meanwhile. `None`: no live lease of that epoch; the full transaction
    /// says why.
    pub(crate) async fn extend(&self, job_id: &str, epoch: i64, ttl_ms: i64) -> Result<Option<LeaseExtended>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let beat = Beat { job_id: job_id.to_string(), epoch, ttl_ms, reply };
        self.0.send(beat).map_err(|_| StoreError::Unavailable("the heartbeat batcher stopped".into()))?;
        rx.await.map_err(|_| StoreError::Unavailable("the heartbeat batcher stopped".into()))?
    }
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
        match r.map_err(pg_err) {
            Err(StoreError::Retryable(_)) if tries < POSTGRES.max_tx_retries => {
                tries += 1;
                POSTGRES.retry_pause(tries).await;
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
            // Nothing was decided for any of them: each waiter gets the
            // same kind of error (a lost race stays retryable).
            let (retryable, msg) = match e {
                StoreError::Retryable(m) => (true, m),
                StoreError::Unavailable(m) => (false, m),
                other => (false, other.to_string()),
            };
            for b in batch {
                let e =
                    if retryable { StoreError::Retryable(msg.clone()) } else { StoreError::Unavailable(msg.clone()) };
                let _ = b.reply.send(Err(e));
            }
        }
    }
}

#[cfg(test)]
mod ready_payload_tests {
    use super::{Ready, ready_payload};

    #[test]
    fn a_payload_names_its_sender_and_jobs() {
        assert_eq!(ready_payload("kiln/ab12 j1,j2", "kiln/ff00"), Ready::Jobs(vec!["j1".into(), "j2".into()]));
        assert_eq!(ready_payload("kiln/ab12 j1,j2", "kiln/ab12"), Ready::Own);
        assert_eq!(ready_payload("kiln/ab12 *", "kiln/ff00"), Ready::All);
        // An older replica's empty payload, or one without jobs: read all.
        assert_eq!(ready_payload("", "kiln/ff00"), Ready::All);
        assert_eq!(ready_payload("kiln/ab12 ", "kiln/ff00"), Ready::All);
        // No name of its own: nothing is taken for its own.
        assert_eq!(ready_payload(" j1", ""), Ready::Jobs(vec!["j1".into()]));
    }
}
