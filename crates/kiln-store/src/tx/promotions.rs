//! The rows of promotions between rings (issue 46) and what the advance
//! pass reads from them (see `tx::rings` for the writers that advance the
//! run). Below `advance`, which asks for the promotions.

use crate::db::{Exec, Row, Tx};
use crate::dialect::Sql;
use crate::error::Result;
use crate::model::{RingGateRecord, RunRecord};
use kiln_core::JobStatus;
use kiln_core::advance::{AdvanceJob, PromotionGate};
use std::collections::HashMap;

pub(crate) const COLS: &str = "g.job_id, g.run_id, j.name AS job_name, g.environment, g.from_ring, g.to_ring, g.state, g.message, \
     g.gate, g.started_at, g.bake_until, g.next_at, g.measured, g.failures, g.actor, g.rollback, g.updated_at";
pub(crate) const FROM: &str = "ring_gates g JOIN jobs j ON j.id = g.job_id";

pub(crate) fn from_row(row: &Row) -> Result<RingGateRecord> {
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

pub(crate) async fn rows_of_run(tx: &mut impl Exec, run_id: &str) -> Result<Vec<RingGateRecord>> {
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
                // A query and its answers are the server's: an untrusted
                // run (a fork's pull request) does not read the metrics
                // through its gate's messages. Its gate fails unmeasured.
                let untrusted = run.trust.parse::<kiln_core::Trust>().is_ok_and(|t| !t.may_read_secrets());
                let (state, message) = if p.prometheus.is_some() && untrusted {
                    (
                        "failed",
                        "not measured: the run is untrusted (a fork's pull request, or started by a token that may \
                         not start trusted runs), and only trusted runs' gates ask Prometheus"
                            .to_string(),
                    )
                } else if p.bake_secs == 0 && p.prometheus.is_none() {
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
