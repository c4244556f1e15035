//! Fair share at the server's edges (issue 44; `docs/scheduling.md`): the
//! dispatcher's view of the teams, refreshed from the database every
//! second; admission of new runs against a team's queued-job cap and the
//! server's saturation; the queue as `GET /v1/queue` shows it; and the
//! fair-share part of a waiting job's `waiting` text.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_core::fair::{Lane, Team};
use kiln_store::StoreError;
use std::collections::BTreeMap;

/// The `Retry-After` of a run refused for a cap: about how long a few jobs
/// take to leave the queue.
const RETRY_AFTER_SECS: u64 = 30;

/// Read the teams and their live jobs and hand them to the dispatcher (and
/// the gauges); a change of weight or quota applies from here.
pub(crate) async fn refresh_once(state: &AppState) -> Result<usize, StoreError> {
    // This replica's starts of the last second, written to their teams'
    // virtual times first (one transaction, not one write per claim).
    let charges = state.dispatcher.take_charges();
    if !charges.is_empty()
        && let Err(e) = state.store.charge_teams(&charges).await
    {
        state.dispatcher.restore_charges(charges);
        return Err(e);
    }
    let teams = state.store.list_teams().await?;
    let groups = state.store.queue_groups().await?;
    let mut running: BTreeMap<&str, i64> = BTreeMap::new();
    for g in &groups {
        *running.entry(g.team.as_str()).or_default() += g.running;
    }
    state.dispatcher.set_teams(teams.iter().map(|t| {
        let held = running.get(t.name.as_str()).copied().unwrap_or(0);
        (
            t.name.clone(),
            Team {
                weight: t.weight,
                max_running: t.max_running,
                running: u32::try_from(held).unwrap_or(u32::MAX),
                pass: t.pass,
            },
        )
    }));
    state.metrics.queue_groups(&groups);
    let n = groups.len();
    let slots = connected_slots(state).await.unwrap_or(0);
    let demand: Vec<(u32, i64, Option<u32>)> = teams
        .iter()
        .map(|t| {
            let work: i64 = groups.iter().filter(|g| g.team == t.name).map(|g| g.ready + g.running).sum();
            (t.weight, work, t.max_running)
        })
        .collect();
    let entitled = entitlements(slots, &demand);
    state.metrics.team_slots(
        &teams
            .iter()
            .zip(entitled)
            .map(|(t, e)| (t.name.clone(), e, running.get(t.name.as_str()).copied().unwrap_or(0) as f64))
            .collect::<Vec<_>>(),
    );
    state.dispatcher.set_groups(groups, slots);
    Ok(n)
}

/// The lane a run named `lane` is in (`None`: not a lane), for callers
/// that take one from a user.
pub(crate) fn parse_lane(lane: &str) -> ApiResult<Lane> {
    Lane::parse(lane.trim())
        .ok_or_else(|| ApiErr::invalid(format!("priority `{lane}`: expected `urgent`, `normal` or `background`")))
}

/// Admission of a new run of `team` in `lane` (acceptance's
/// `Check::Quota`): refused with 429 when the team holds its queued-job
/// cap, or when the server is saturated for the lane (the lowest lane
/// first). An API caller gets the refusal; a forge delivery or a schedule
/// tick waits and is planned again (never refused for a cap).
pub(crate) async fn admit(state: &AppState, repo: &kiln_store::RepoRecord, lane: Lane) -> ApiResult<()> {
    let team = repo.team.as_str();
    // The team's cap, read with the repository.
    if let Some(cap) = repo.team_max_queued {
        let queued = state.store.queued_jobs(Some(team)).await?;
        if queued >= i64::from(cap) {
            return Err(over_quota(format!(
                "team `{team}` has {queued} queued jobs, at its cap of {cap} (--max-queued); try again when some \
                 have run"
            )));
        }
    }
    if let Some(limit) = state.config.max_queued_jobs {
        let queued = u64::try_from(state.store.queued_jobs(None).await?).unwrap_or(0);
        if kiln_core::fair::saturated(lane, queued, limit) {
            return Err(over_quota(format!(
                "the server is saturated: {queued} jobs queued (--max-queued-jobs {limit}); `{}` runs are refused \
                 from {} queued jobs, `urgent` ones only by their team's cap",
                lane.as_str(),
                if lane == Lane::Background { limit * 4 / 5 } else { limit },
            )));
        }
    }
    Ok(())
}

fn over_quota(message: String) -> ApiErr {
    ApiErr {
        retry_after: Some(RETRY_AFTER_SECS),
        ..ApiErr::new(StatusCode::TOO_MANY_REQUESTS, api::codes::OVER_QUOTA, message)
    }
}

/// `GET /v1/queue`.
pub(crate) async fn view(state: &AppState) -> ApiResult<api::QueueView> {
    let teams = state.store.list_teams().await?;
    let groups = state.store.queue_groups().await?;
    let slots = connected_slots(state).await?;
    let now = state.clock.now_ms();
    let mut out: Vec<api::TeamQueue> = teams
        .iter()
        .map(|t| api::TeamQueue {
            team: t.name.clone(),
            weight: t.weight,
            max_running: t.max_running,
            max_queued: t.max_queued,
            ready: 0,
            pending: 0,
            running: 0,
            entitled_slots: 0.0,
            received_slots: 0.0,
            lanes: Vec::new(),
        })
        .collect();
    for g in &groups {
        let Some(t) = out.iter_mut().find(|t| t.team == g.team) else { continue };
        t.ready += g.ready;
        t.pending += g.pending;
        t.running += g.running;
        t.lanes.push(api::LaneQueue {
            priority: g.lane.clone(),
            labels: serde_json::from_str(&g.class_key).unwrap_or_default(),
            ready: g.ready,
            pending: g.pending,
            running: g.running,
            oldest_ready_secs: g.oldest_ready_at.map(|at| (now - at).max(0) as f64 / 1000.0),
        });
    }
    let shares =
        entitlements(slots, &out.iter().map(|t| (t.weight, t.ready + t.running, t.max_running)).collect::<Vec<_>>());
    for (t, e) in out.iter_mut().zip(shares) {
        t.entitled_slots = e;
        t.received_slots = t.running as f64;
        t.lanes.sort_by_key(|l| (Lane::parse(&l.priority).unwrap_or(Lane::Normal), l.labels.clone()));
    }
    Ok(api::QueueView { slots, aging_step_secs: state.config.aging_step.as_secs(), teams: out })
}

/// Job slots of the connected agents (draining ones not counted).
async fn connected_slots(state: &AppState) -> Result<u32, StoreError> {
    Ok(state
        .store
        .list_agents()
        .await?
        .iter()
        .filter(|a| state.live_agents.is_connected(&a.id) && !a.draining)
        .map(|a| a.max_jobs)
        .sum())
}

/// The slots each team is entitled to now: `slots` shared by weight among
/// the teams with work (`demand`: ready + running jobs), none more than its
/// demand or quota; what one cannot use goes to the others (water-filling).
pub(crate) fn entitlements(slots: u32, teams: &[(u32, i64, Option<u32>)]) -> Vec<f64> {
    let cap = |(_, demand, quota): &(u32, i64, Option<u32>)| {
        let d = (*demand).max(0) as f64;
        quota.map_or(d, |q| d.min(f64::from(q)))
    };
    let mut out = vec![0.0; teams.len()];
    let mut open: Vec<usize> = (0..teams.len()).filter(|i| cap(&teams[*i]) > 0.0).collect();
    let mut left = f64::from(slots);
    while !open.is_empty() && left > 1e-9 {
        let weight: f64 = open.iter().map(|i| f64::from(teams[*i].0.max(1))).sum();
        let mut next = Vec::new();
        let mut given = 0.0;
        for &i in &open {
            let share = left * f64::from(teams[i].0.max(1)) / weight;
            let room = cap(&teams[i]) - out[i];
            if share >= room {
                out[i] += room;
                given += room;
            } else {
                next.push(i);
            }
        }
        if next.len() == open.len() {
            for &i in &open {
                out[i] += left * f64::from(teams[i].0.max(1)) / weight;
            }
            break;
        }
        left -= given;
        open = next;
    }
    out
}

/// The fair-share part of a ready job's `waiting` (like Slurm's `sprio`):
/// its team at its quota, or where the team stands against its share and
/// how many jobs compete in its lane or above for its class. From the
/// dispatcher's last refresh (at most a second old).
/// `(true, …)`: the team is at its running quota (the job waits even with
/// agents free).
pub(crate) fn waiting_text(state: &AppState, team: &str, lane: Lane, class_key: &str) -> Option<(bool, String)> {
    let (groups, slots) = state.dispatcher.groups();
    let shares = state.dispatcher.shares();
    let t = shares.teams.get(team)?;
    // What the team holds as the dispatcher counts it now (claims and ends
    // through this replica counted at once, the others' at each refresh).
    let held = i64::from(t.running);
    if let Some(max) = t.max_running
        && held >= i64::from(max)
    {
        return Some((true, format!("team {team} holds {held} of the {max} jobs it may run at once (--max-running)")));
    }
    // Not in the last snapshot (it is at most a second old): nothing to say.
    if !groups.iter().any(|g| g.team == team && g.class_key == class_key && g.lane == lane.as_str() && g.ready > 0) {
        return None;
    }
    let competing: i64 = groups
        .iter()
        .filter(|g| g.class_key == class_key && Lane::parse(&g.lane).unwrap_or(Lane::Normal) <= lane)
        .map(|g| g.ready)
        .sum::<i64>()
        .saturating_sub(1)
        .max(0);
    let labels = crate::metrics::class_label(class_key);
    let behind = format!("{competing} other jobs ready in lane {} or higher for {{{labels}}}", lane.as_str());
    let teams_with_work: std::collections::BTreeSet<&str> =
        groups.iter().filter(|g| g.ready + g.running > 0).map(|g| g.team.as_str()).collect();
    if teams_with_work.len() < 2 {
        // One team: its share is every slot; only the queue says anything.
        return (competing > 0).then_some((false, behind));
    }
    let mut by_team: BTreeMap<&str, (u32, i64, Option<u32>)> = BTreeMap::new();
    for (name, tm) in &shares.teams {
        by_team.insert(name, (tm.weight, 0, tm.max_running));
    }
    for g in groups.iter() {
        if let Some(e) = by_team.get_mut(g.team.as_str()) {
            e.1 += g.ready + g.running;
        }
    }
    let names: Vec<&str> = by_team.keys().copied().collect();
    let entitled = entitlements(slots, &by_team.values().copied().collect::<Vec<_>>());
    let mine = names.iter().position(|n| *n == team).map_or(0.0, |i| entitled[i]);
    Some((false, format!("team {team} holds {held} of its {mine:.1} entitled slots; {behind}")))
}

#[cfg(test)]
mod tests {
    use super::entitlements;

    #[test]
    fn entitlements_share_slots_by_weight_within_demand_and_quota() {
        let e = entitlements(4, &[(1, 500, None), (1, 1, None)]);
        assert_eq!(e, vec![3.0, 1.0], "the one-job team needs one slot; the rest goes to the other");
        let e = entitlements(8, &[(3, 100, None), (1, 100, None)]);
        assert_eq!(e, vec![6.0, 2.0]);
        let e = entitlements(8, &[(1, 100, Some(2)), (1, 100, None)]);
        assert_eq!(e, vec![2.0, 6.0], "a quota caps a team's entitlement");
        let e = entitlements(8, &[(1, 0, None), (1, 3, None)]);
        assert_eq!(e, vec![0.0, 3.0], "no work, no entitlement");
    }
}
