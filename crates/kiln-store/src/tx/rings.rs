//! Promotions between rings (issue 46): the row (`ring_gates`) of each job
//! that waits for one — a ring after the first, or a command gate's job —
//! and what the advance pass reads from it.
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

use crate::db::{Exec, Row, Tx};
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{Manual, RingGateRecord, RingGateStep, RunRecord};
use crate::store::SqlStore;
use kiln_core::JobStatus;
use kiln_core::advance::{AdvanceJob, PromotionGate};
use std::collections::HashMap;

const COLS: &str = "g.job_id, g.run_id, j.name AS job_name, g.environment, g.from_ring, g.to_ring, g.state, g.message, \
     g.gate, g.started_at, g.bake_until, g.next_at, g.measured, g.failures, g.actor, g.rollback, g.updated_at";
const FROM: &str = "ring_gates g JOIN jobs j ON j.id = g.job_id";

fn from_row(row: &Row) -> Result<RingGateRecord> {
    Ok(RingGateRecord {
        job_id: row.get("job_id")?,
        run_id: row.get("run_id")?,
        job_name: row.get("job_name")?,
        environment: row.get("environment")?,
        from_ring: row.get("from_ring")?,
        to_ring: row.get("to_ring")?,
        state: row.get("state")?,
        message: row.get::<Option<String>>("message")?.unwrap_or_default(),
        gate: row.get("gate")?,
        started_at: row.get("started_at")?,
        bake_until: row.get("bake_until")?,
        next_at: row.get("next_at")?,
        measured: row.get("measured")?,
        failures: row.get("failures")?,
        actor: row.get("actor")?,
        rollback: row.get("rollback")?,
        updated_at: row.get("updated_at")?,
    })
}

async fn rows_of_run(tx: &mut impl Exec, run_id: &str) -> Result<Vec<RingGateRecord>> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {COLS} FROM {FROM} WHERE g.run_id = $1 ORDER BY j.job_index"));
    tx.sql(&SQL).bind(run_id).fetch_all().await?.iter().map(from_row).collect()
}

fn secs(s: u64) -> String {
    kiln_workflow::format_duration(std::time::Duration::from_secs(s))
}

/// The promotion of each of the run's jobs that waits for one, for the
/// advance pass: starts the gate of a job whose needs all succeeded (the
/// ring before deployed), turns a failed command gate's row `failed`, and
/// reads every row. A rollback run's promotions are open: it returns to
/// bytes that were promoted before.
pub(crate) async fn promotions(
    tx: &mut Tx,
    run: &RunRecord,
    ids: &[String],
    jobs: &[AdvanceJob],
    indices: &[i64],
    now: i64,
) -> Result<HashMap<String, PromotionGate>> {
    let with: Vec<(usize, &kiln_workflow::Promotion)> = (0..jobs.len())
        .filter_map(|i| {
            let def = usize::try_from(indices[i]).ok().and_then(|x| run.definition.jobs.get(x))?;
            def.promotion.as_ref().map(|p| (i, p))
        })
        .collect();
    let mut out = HashMap::new();
    if with.is_empty() {
        return Ok(out);
    }
    if run.rollback_of.is_some() {
        for (i, _) in &with {
            out.insert(jobs[*i].name.clone(), PromotionGate::Open);
        }
        return Ok(out);
    }
    let status_of = |name: &str| jobs.iter().find(|j| j.name == name).map(|j| j.status);
    let existing: HashMap<String, RingGateRecord> =
        rows_of_run(tx, &run.id).await?.into_iter().map(|r| (r.job_id.clone(), r)).collect();
    for (i, p) in &with {
        let job = &jobs[*i];
        let id = &ids[*i];
        // A command gate's job that failed is a failed gate.
        if p.command && job.status == JobStatus::Failed {
            if existing.get(id).is_some_and(|r| r.state == "passed" || r.state == "promoted") {
                tx.sql("UPDATE ring_gates SET state = 'failed', message = $1, updated_at = $2 WHERE job_id = $3")
                    .bind(format!("the gate command (job `{}`) failed", job.name))
                    .bind(now)
                    .bind(id)
                    .execute()
                    .await?;
            }
            continue;
        }
        let reached =
            job.status == JobStatus::Pending && job.needs.iter().all(|n| status_of(n) == Some(JobStatus::Success));
        if !reached {
            continue;
        }
        let bake_ms = i64::try_from(p.bake_secs.saturating_mul(1000)).unwrap_or(i64::MAX / 2);
        let then = if p.prometheus.is_some() { "the Prometheus gate decides" } else { "it is promoted" };
        let baking = format!(
            "baking ring `{}` for {} before promoting to `{}`; then {then} (`kiln promote {}` skips the rest, `kiln \
             pause {}` holds it)",
            p.from,
            secs(p.bake_secs),
            p.to,
            run.id,
            run.id
        );
        match existing.get(id) {
            None => {
                let (state, message) = if p.bake_secs == 0 && p.prometheus.is_none() {
                    ("passed", format!("promoted to `{}`: ring `{}` deployed (no bake, no gate)", p.to, p.from))
                } else if p.bake_secs == 0 {
                    ("measuring", format!("measuring the gate after ring `{}` before promoting to `{}`", p.from, p.to))
                } else {
                    ("baking", baking)
                };
                tx.sql(
                    "INSERT INTO ring_gates (job_id, run_id, state, message, updated_at, environment, from_ring, \
                     to_ring, gate, started_at, bake_until, next_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $5, \
                     $10, $10)",
                )
                .bind(id)
                .bind(&run.id)
                .bind(state)
                .bind(message)
                .bind(now)
                .bind(&p.environment)
                .bind(&p.from)
                .bind(&p.to)
                .bind(&p.prometheus)
                .bind(now + bake_ms)
                .execute()
                .await?;
            }
            // Paused or promoted before it was reached: the bake starts
            // now (a pause holds it; a promotion skips it).
            Some(r) if r.started_at.is_none() => {
                tx.sql(
                    "UPDATE ring_gates SET started_at = $1, bake_until = $2, next_at = $2, environment = $3, \
                     from_ring = $4, to_ring = $5, gate = $6, updated_at = $1 WHERE job_id = $7",
                )
                .bind(now)
                .bind(now + bake_ms)
                .bind(&p.environment)
                .bind(&p.from)
                .bind(&p.to)
                .bind(&p.prometheus)
                .bind(id)
                .execute()
                .await?;
            }
            Some(_) => {}
        }
    }
    for r in rows_of_run(tx, &run.id).await? {
        let gate = match r.state.as_str() {
            "passed" | "promoted" => PromotionGate::Open,
            "failed" => PromotionGate::Failed(format!(
                "cancelled: not promoted to `{}`: the gate after ring `{}` failed: {}",
                r.to_ring, r.from_ring, r.message
            )),
            _ => PromotionGate::Waiting(r.message.clone()),
        };
        out.insert(r.job_name.clone(), gate);
    }
    Ok(out)
}

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
                let jobs: Vec<(String, String, i64, String)> = tx
                    .sql("SELECT id, name, job_index, status FROM jobs WHERE run_id = $1 ORDER BY job_index")
                    .bind(run_id)
                    .all()
                    .await?;
                let rows: HashMap<String, RingGateRecord> =
                    rows_of_run(tx, run_id).await?.into_iter().map(|r| (r.job_id.clone(), r)).collect();
                let next = jobs.iter().find_map(|(id, name, index, status)| {
                    let def = usize::try_from(*index).ok().and_then(|i| run.definition.jobs.get(i))?;
                    let p = def.promotion.as_ref()?;
                    let open = rows.get(id).is_some_and(|r| r.state == "passed" || r.state == "promoted");
                    (status == JobStatus::Pending.as_str() && !open).then(|| (id.clone(), name.clone(), p.clone()))
                });
                let Some((job_id, job_name, p)) = next else {
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
                if *what == Manual::Promote {
                    crate::tx::advance::advance_run(tx, run_id, now).await?;
                }
                let _ = job_name;
                rows_of_run(tx, run_id)
                    .await?
                    .into_iter()
                    .find(|r| r.job_id == job_id)
                    .ok_or_else(|| StoreError::Unavailable("the promotion just written is gone".into()))
            })
        })
        .await
}
