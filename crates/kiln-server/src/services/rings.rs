//! Rings (issue 46): the gate runner that moves each promotion between two
//! deploy rings on — the bake, then a Prometheus gate measured against
//! `--prometheus-url` (kiln-deploy's rules) — and rolls the environment
//! back when a gate failed; `kiln promote` / `kiln pause` and the run's
//! promotions for readers.
//!
//! Every step is written conditionally on the row as it was read
//! (`settle_ring_gate`), so replicas running the same round never count a
//! measurement twice, and a restart resumes from the stored count: the
//! k-th measurement is due `k × interval` after the first.

use crate::auth::{Principal, Scope};
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::services::environments::{approver_name, forbidden};
use crate::state::AppState;
use kiln_api as api;
use kiln_deploy::PrometheusGate;
use kiln_store::{Manual, RingGateRecord, RingGateStep, StoreError};

/// Who asks for the automatic rollback after a failed gate (the audit's
/// actor, the rollback's recorded approval).
pub(crate) const GATE_ACTOR: &str = "kiln (ring gate)";

/// One round: every promotion that is due moves one step. Returns how many
/// moved.
pub(crate) async fn gates_once(state: &AppState) -> Result<usize, StoreError> {
    let due = state.store.due_ring_gates().await?;
    let mut moved = 0;
    for g in due {
        let done = match g.state.as_str() {
            "failed" => {
                roll_back(state, &g).await;
                true
            }
            "baking" => {
                let (to, message) = if g.gate.is_some() {
                    (
                        "measuring",
                        format!("measuring the gate after ring `{}` before promoting to `{}`", g.from_ring, g.to_ring),
                    )
                } else {
                    ("passed", format!("promoted to `{}`: ring `{}` baked", g.to_ring, g.from_ring))
                };
                settle(state, &g, to, message, 0, 0, 0).await?
            }
            "measuring" => measure(state, &g).await?,
            _ => false,
        };
        if done {
            moved += 1;
            state.job_changed(&g.job_id);
        }
    }
    Ok(moved)
}

async fn settle(
    state: &AppState,
    g: &RingGateRecord,
    to: &str,
    message: String,
    measured: i64,
    failures: i64,
    interval_ms: i64,
) -> Result<bool, StoreError> {
    let step = RingGateStep {
        job_id: g.job_id.clone(),
        from_state: g.state.clone(),
        from_measured: g.measured,
        state: to.to_string(),
        message,
        measured,
        failures,
        interval_ms,
    };
    let applied = state.store.settle_ring_gate(&step).await?;
    if applied && (to == "passed" || to == "failed") {
        let action = if to == "passed" { "deployment.promote" } else { "deployment.gate_failed" };
        let detail = format!("{}: ring {} → {}: {}", g.environment, g.from_ring, g.to_ring, step.message);
        if let Err(e) = access::audit(state, GATE_ACTOR, action, &g.run_id, detail).await {
            tracing::warn!("audit of a ring gate not written: {}", e.message);
        }
    }
    Ok(applied)
}

/// Take one measurement of a Prometheus gate and count it.
async fn measure(state: &AppState, g: &RingGateRecord) -> Result<bool, StoreError> {
    let Some(url) = state.config.prometheus_url.clone() else {
        let why = "this server has no --prometheus-url to ask".to_string();
        return settle(state, g, "failed", why, g.measured, g.failures, 0).await;
    };
    let gate = match g
        .gate
        .as_deref()
        .ok_or_else(|| "no gate".to_string())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).map_err(|e| e.to_string()))
        .and_then(|v| PrometheusGate::from_value(&v))
    {
        Ok(gate) => gate,
        Err(e) => {
            return settle(state, g, "failed", format!("the gate cannot be read: {e}"), g.measured, g.failures, 0)
                .await;
        }
    };
    let m = kiln_deploy::measure(&state.forge_http, &url, &gate).await;
    let measured = g.measured + 1;
    let failures = g.failures + i64::from(!m.ok);
    let count = i64::from(gate.measurement_count());
    let limit = i64::from(gate.failure_limit);
    let (to, message) = if failures > limit {
        (
            "failed",
            format!(
                "{failures} of {measured} measurement{} failed (failure-limit {limit}); last: {}",
                if measured == 1 { "" } else { "s" },
                m.message
            ),
        )
    } else if measured >= count {
        (
            "passed",
            format!(
                "promoted to `{}`: {measured} measurement{} of `{}`, {failures} failed (failure-limit {limit}); last: {}",
                g.to_ring,
                if measured == 1 { "" } else { "s" },
                gate.query,
                m.message
            ),
        )
    } else {
        (
            "measuring",
            format!(
                "measuring the gate after ring `{}` before promoting to `{}`: {measured} of {count} measurements, \
                 {failures} failed (failure-limit {limit}); last: {}",
                g.from_ring, g.to_ring, m.message
            ),
        )
    };
    let interval_ms = i64::try_from(gate.interval.as_millis()).unwrap_or(i64::MAX / 4);
    settle(state, g, to, message, measured, failures, interval_ms).await
}

/// After a failed gate: return the environment to its deployment before
/// this rollout, once (claimed, so replicas do not both ask). What became
/// of it is recorded on the gate's row (the rollback run, or why not).
async fn roll_back(state: &AppState, g: &RingGateRecord) {
    match state.store.claim_ring_rollback(&g.job_id, "asked").await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!("the rollback after a failed gate was not claimed: {e}");
            return;
        }
    }
    let outcome = match rollback_run(state, g).await {
        Ok(run_id) => run_id,
        Err(why) => format!("none: {why}"),
    };
    if let Err(e) = state.store.record_ring_rollback(&g.job_id, &outcome).await {
        tracing::warn!("the rollback after a failed gate was not recorded: {e}");
    }
}

async fn rollback_run(state: &AppState, g: &RingGateRecord) -> Result<String, String> {
    let target = state.store.rollback_target(&g.environment, None).await.map_err(|e| e.to_string())?;
    if let Some(refused) =
        state.store.provenance_refusal(&g.environment, &target.artifacts).await.map_err(|e| e.to_string())?
    {
        return Err(format!("deployment {} is refused by the environment's provenance policy: {refused}", target.id));
    }
    let by = Principal { actor: GATE_ACTOR.into(), scope: Scope::Admin, may_start_trusted: false };
    let rb = kiln_store::NewRollback {
        deployment_id: target.id.clone(),
        environment: g.environment.clone(),
        approver: Some(GATE_ACTOR.into()),
        comment: Some(format!("the gate after ring `{}` failed: {}", g.from_ring, g.message)),
    };
    let run_id = crate::services::acceptance::rollback(state, &by, &target.run_id, rb).await.map_err(|e| e.message)?;
    let detail = format!(
        "environment {} to deployment {} (run {}): the gate after ring `{}` of run {} failed",
        g.environment, target.id, target.run_id, g.from_ring, g.run_id
    );
    if let Err(e) = access::audit(state, GATE_ACTOR, "deployment.rollback", &run_id, detail).await {
        tracing::warn!("audit of an automatic rollback not written: {}", e.message);
    }
    state.job_changed(&run_id);
    Ok(run_id)
}

pub(crate) fn view(r: RingGateRecord) -> api::RingPromotion {
    api::RingPromotion {
        job: r.job_name,
        environment: r.environment,
        from_ring: r.from_ring,
        to_ring: r.to_ring,
        state: r.state,
        message: r.message,
        prometheus: r.gate,
        started_at_ms: r.started_at,
        bake_until_ms: r.bake_until,
        measured: r.measured,
        failures: r.failures,
        by: r.actor,
        rollback: r.rollback,
        updated_at_ms: r.updated_at,
    }
}

/// `GET /v1/workflow-runs/{run}/rings`.
pub(crate) async fn promotions(state: &AppState, run_id: &str) -> ApiResult<api::RingPromotionList> {
    let rows = state.store.run_ring_gates(run_id).await?;
    Ok(api::RingPromotionList { promotions: rows.into_iter().map(view).collect() })
}

/// `POST /v1/workflow-runs/{run}/promote` and `/pause`: the environment's
/// approvers (any admin when it lists none) act on the run's next
/// promotion.
pub(crate) async fn manual(
    state: &AppState,
    by: &Principal,
    run_id: &str,
    what: Manual,
) -> ApiResult<api::RingPromotion> {
    let run = state.store.get_run(run_id).await?.run;
    let env_name =
        run.definition.jobs.iter().find_map(|j| j.promotion.as_ref().map(|p| p.environment.clone())).ok_or_else(
            || {
                ApiErr::new(
                    axum::http::StatusCode::CONFLICT,
                    kiln_api::codes::CONFLICT,
                    format!("run {run_id} deploys no rings: it has nothing to promote or pause"),
                )
            },
        )?;
    let env = state.store.get_environment(&env_name).await?;
    let name = approver_name(state, by).await?;
    let allowed = if env.approvers.is_empty() { by.scope == Scope::Admin } else { env.approvers.contains(&name) };
    let verb = if what == Manual::Promote { "promote" } else { "pause" };
    if !allowed {
        let who = if env.approvers.is_empty() { "an admin".to_string() } else { env.approvers.join(", ") };
        return Err(forbidden(format!("`{name}` may not {verb} deployments to `{env_name}`: its approvers are {who}")));
    }
    let row = state.store.manual_promotion(run_id, &name, what).await?;
    access::audit(
        state,
        &by.actor,
        if what == Manual::Promote { "deployment.promote" } else { "deployment.pause" },
        run_id,
        format!("{env_name}: ring {} → {}", row.from_ring, row.to_ring),
    )
    .await?;
    state.job_changed(&row.job_id);
    Ok(view(row))
}
