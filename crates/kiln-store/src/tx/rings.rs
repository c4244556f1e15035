//! Promotions between rings (issue 46): the row (`ring_gates`) of each job
//! that waits for one — a ring after the first, or a command gate's job —
//! as the gate runner, `kiln promote` and `kiln pause` write it (the advance
//! pass reads it through `tx::promotions`).
//!
//! The row is written when the job's needs succeeded (the ring before
//! deployed): `baking` until `bake_until`, or `passed` at once without bake
//! or gate. The server's gate runner moves `baking` on (`passed`, or
//! `measuring` for a Prometheus gate) and records each measurement
//! (`settle_ring_gate`, conditional on the state and count it read, so two
//! replicas never both count); `kiln pause` and `kiln promote` set `paused`
//! and `promoted` (before the job is reached, too). A command gate's job
//! that failed turns its row `failed`. A failed row cancels the job in the
//! advance pass, and the server rolls the environment back once
//! (`claim_ring_rollback`).

use crate::db::Exec;
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{Manual, RingGateRecord, RingGateStep};
use crate::store::SqlStore;
use crate::tx::promotions::{COLS, FROM, from_row, rows_of_run};
use kiln_core::JobStatus;
use std::collections::HashMap;

/// `RingStore::due_ring_gates`.
pub(crate) async fn due(store: &SqlStore) -> Result<Vec<RingGateRecord>> {
    let mut r = store.reader().await?;
    let now = crate::db::now(&mut r).await?;
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT {COLS} FROM {FROM} WHERE (g.state = 'baking' AND g.bake_until <= $1) \
             OR (g.state = 'measuring' AND g.next_at <= $1) OR (g.state = 'failed' AND g.rollback IS NULL) \
             ORDER BY g.updated_at LIMIT 100"
        )
    });
    r.sql(&SQL).bind(now).fetch_all().await?.iter().map(from_row).collect()
}

/// `RingStore::run_ring_gates`.
pub(crate) async fn of_run(store: &SqlStore, run_id: &str) -> Result<Vec<RingGateRecord>> {
    let mut r = store.reader().await?;
    rows_of_run(&mut r, run_id).await
}

/// `RingStore::settle_ring_gate`: one step of the gate runner, written only
/// if the row is still as it was read; the run advances when the gate
/// passed or failed.
pub(crate) async fn settle(store: &SqlStore, step: &RingGateStep) -> Result<bool> {
    store
        .transaction(Isolation::Serializable, step, |tx, s| {
            Box::pin(async move {
                let now = crate::db::now(tx).await?;
                let run_id: Option<String> = tx
                    .sql(
                        "UPDATE ring_gates SET state = $1, message = $2, measured = $3, failures = $4, \
                         next_at = CASE WHEN COALESCE(next_at, $6) + $5 > $6 THEN COALESCE(next_at, $6) + $5 ELSE $6 END, \
                         updated_at = $6 WHERE job_id = $7 AND state = $8 AND measured = $9 RETURNING run_id",
                    )
                    .bind(&s.state)
                    .bind(&s.message)
                    .bind(s.measured)
                    .bind(s.failures)
                    .bind(s.interval_ms)
                    .bind(now)
                    .bind(&s.job_id)
                    .bind(&s.from_state)
                    .bind(s.from_measured)
                    .scalar_optional()
                    .await?;
                let Some(run_id) = run_id else { return Ok(false) };
                if s.state == "passed" || s.state == "failed" {
                    crate::tx::advance::advance_run(tx, &run_id, now).await?;
                }
                Ok(true)
            })
        })
        .await
}

/// `RingStore::claim_ring_rollback`: the one caller that rolls back after
/// a failed gate (true), or someone did already (false).
pub(crate) async fn claim_rollback(store: &SqlStore, job_id: &str, note: &str) -> Result<bool> {
    let args = (job_id.to_string(), note.to_string());
    store
        .transaction(Isolation::Serializable, &args, |tx, (job_id, note)| {
            Box::pin(async move {
                let n = tx
                    .sql("UPDATE ring_gates SET rollback = $1 WHERE job_id = $2 AND state = 'failed' AND rollback IS NULL")
                    .bind(note)
                    .bind(job_id)
                    .execute()
                    .await?;
                Ok(n > 0)
            })
        })
        .await
}

/// `RingStore::record_ring_rollback`: what the rollback after a failed gate
/// became (the rollback run's id, or why there was none).
pub(crate) async fn record_rollback(store: &SqlStore, job_id: &str, outcome: &str) -> Result<()> {
    let args = (job_id.to_string(), outcome.to_string());
    store
        .transaction(Isolation::Serializable, &args, |tx, (job_id, outcome)| {
            Box::pin(async move {
                tx.sql("UPDATE ring_gates SET rollback = $1 WHERE job_id = $2")
                    .bind(outcome)
                    .bind(job_id)
                    .execute()
                    .await?;
                Ok(())
            })
        })
        .await
}

/// `RingStore::promote_run` / `pause_run`: the run's next promotion — its
/// first job (in file order) that waits for one and is not promoted yet —
/// is promoted now (bake and gate skipped) or paused (held until promoted),
/// also before the ring before it deployed. `Conflict` when the run ended,
/// has no promotion left, or its next gate failed already.
pub(crate) async fn manual(store: &SqlStore, run_id: &str, actor: &str, what: Manual) -> Result<RingGateRecord> {
    let args = (run_id.to_string(), actor.to_string(), what);
    store
        .transaction(Isolation::Serializable, &args, |tx, (run_id, actor, what)| {
            Box::pin(async move {
                let now = crate::db::now(tx).await?;
                let run = crate::rows::load_run(tx, run_id).await?;
                if run.status.is_terminal() {
                    return Err(StoreError::Conflict(format!("run {run_id} has ended ({})", run.status.as_str())));
                }
                let jobs: Vec<(String, i64, String)> = tx
                    .sql("SELECT id, job_index, status FROM jobs WHERE run_id = $1 ORDER BY job_index")
                    .bind(run_id)
                    .all()
                    .await?;
                let rows: HashMap<String, RingGateRecord> =
                    rows_of_run(tx, run_id).await?.into_iter().map(|r| (r.job_id.clone(), r)).collect();
                let next = jobs.iter().find_map(|(id, index, status)| {
                    let def = usize::try_from(*index).ok().and_then(|i| run.definition.jobs.get(i))?;
                    let p = def.promotion.as_ref()?;
                    let open = rows.get(id).is_some_and(|r| r.state == "passed" || r.state == "promoted");
                    (status == JobStatus::Pending.as_str() && !open).then(|| (id.clone(), p.clone()))
                });
                let Some((job_id, p)) = next else {
                    return Err(StoreError::Conflict(format!(
                        "run {run_id} has no promotion left (it has no rings, or every ring was promoted)"
                    )));
                };
                let by = if actor.is_empty() { "someone" } else { actor.as_str() };
                let (state, message) = match what {
                    Manual::Promote => ("promoted", format!("promoted to `{}` by {by}", p.to)),
                    Manual::Pause => (
                        "paused",
                        format!("paused by {by} before promoting to `{}`; `kiln promote {run_id}` goes on", p.to),
                    ),
                };
                match rows.get(&job_id) {
                    Some(r) if r.state == "failed" => {
                        return Err(StoreError::Conflict(format!(
                            "the gate after ring `{}` failed already: {}",
                            r.from_ring, r.message
                        )));
                    }
                    Some(r) if r.state == state => {}
                    Some(_) => {
                        tx.sql("UPDATE ring_gates SET state = $1, message = $2, actor = $3, updated_at = $4 WHERE job_id = $5")
                            .bind(state)
                            .bind(&message)
                            .bind(actor)
                            .bind(now)
                            .bind(&job_id)
                            .execute()
                            .await?;
                    }
                    None => {
                        tx.sql(
                            "INSERT INTO ring_gates (job_id, run_id, state, message, updated_at, environment, \
                             from_ring, to_ring, gate, actor) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                        )
                        .bind(&job_id)
                        .bind(run_id)
                        .bind(state)
                        .bind(&message)
                        .bind(now)
                        .bind(&p.environment)
                        .bind(&p.from)
                        .bind(&p.to)
                        .bind(&p.prometheus)
                        .bind(actor)
                        .execute()
                        .await?;
                    }
                }
                // A promotion lets the job go on; a pause changes what it says.
                crate::tx::advance::advance_run(tx, run_id, now).await?;
                rows_of_run(tx, run_id)
                    .await?
                    .into_iter()
                    .find(|r| r.job_id == job_id)
                    .ok_or_else(|| StoreError::Unavailable("the promotion just written is gone".into()))
            })
        })
        .await
}
