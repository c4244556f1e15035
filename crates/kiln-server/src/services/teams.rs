//! Teams and run lanes (issue 44): create, change and remove teams, and
//! move a run to another lane. The dispatcher reads teams every second
//! (`queue::refresh_once`), so a change applies without a restart.

use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::{access, queue, runs};
use crate::state::AppState;
use kiln_api as api;
use kiln_store::{TeamRecord, TeamUpdate};

pub(crate) fn view(t: TeamRecord) -> api::Team {
    api::Team {
        name: t.name,
        weight: t.weight,
        max_running: t.max_running,
        max_queued: t.max_queued,
        repos: t.repos,
        created_at_ms: t.created_at,
    }
}

fn describe(t: &TeamRecord) -> String {
    let q = |v: Option<u32>| v.map_or("none".to_string(), |n| n.to_string());
    format!("weight {} max-running {} max-queued {}", t.weight, q(t.max_running), q(t.max_queued))
}

pub(crate) async fn list(state: &AppState) -> ApiResult<api::TeamList> {
    Ok(api::TeamList { teams: state.store.list_teams().await?.into_iter().map(view).collect() })
}

pub(crate) async fn create(state: &AppState, by: &Principal, req: api::CreateTeam) -> ApiResult<api::Team> {
    let t = state.store.create_team(req.name.trim(), req.weight.unwrap_or(1), req.max_running, req.max_queued).await?;
    access::audit(state, &by.actor, "team.create", &t.name, describe(&t)).await?;
    refreshed(state).await;
    Ok(view(t))
}

pub(crate) async fn update(state: &AppState, by: &Principal, name: &str, req: api::UpdateTeam) -> ApiResult<api::Team> {
    let u = TeamUpdate { weight: req.weight, max_running: req.max_running, max_queued: req.max_queued };
    let t = state.store.update_team(name, &u).await?;
    access::audit(state, &by.actor, "team.update", &t.name, describe(&t)).await?;
    refreshed(state).await;
    Ok(view(t))
}

pub(crate) async fn delete(state: &AppState, by: &Principal, name: &str) -> ApiResult<api::Team> {
    let t = state.store.delete_team(name).await?;
    access::audit(state, &by.actor, "team.delete", &t.name, "").await?;
    refreshed(state).await;
    Ok(view(t))
}

/// Move a queued or running run to another lane (an admin's; the route's
/// policy): its ready jobs are queued again in it, keeping their ready
/// time (aging goes on).
pub(crate) async fn set_priority(state: &AppState, by: &Principal, run: &str, lane: &str) -> ApiResult<api::Run> {
    let lane = queue::parse_lane(lane)?;
    let requeued = state.store.set_run_priority(run, lane.as_str()).await?;
    access::audit(state, &by.actor, "run.priority", run, format!("{} ({requeued} ready jobs requeued)", lane.as_str()))
        .await?;
    state.relay_wake.notify_one();
    state.job_changed(run);
    runs::get(state, run).await
}

/// Apply a change to this replica's dispatcher now (the others within a
/// second).
async fn refreshed(state: &AppState) {
    if let Err(e) = queue::refresh_once(state).await {
        tracing::warn!("teams not re-read: {e}");
    }
}
