//! Runs nobody pushed (issue 14): schedules and reconciliation, on one
//! replica at a time (the `triggers` lease in the database; see `loops`).
//!
//! Schedules: every workflow on the default branch's tip with `on.schedule`
//! fires at most once per tick, even across replicas and restarts — its
//! run is accepted with the idempotency key (workflow, tick) before the
//! workflow's cursor moves past the tick. A new workflow starts at "now"
//! (no backfill); ticks missed while the server was down run once, as the
//! latest missed tick, on recovery.
//!
//! Reconciliation: for repositories with polling on, `git ls-remote`
//! compares the remote's heads with the last head recorded per ref (by
//! webhooks and earlier polls); a moved or new ref gets a synthetic push
//! delivery for its tip, planned like a webhook's — tip only: intermediate
//! pushes between two polls are not recovered. The first poll of a
//! repository only records its heads.

use crate::git::WorkflowFileError;
use crate::services::acceptance::Freeze;
use crate::services::webhooks::decide_trust;
use crate::state::AppState;
use kiln_core::acceptance::TriggerKind;
use kiln_core::trust::TrustTrigger;
use kiln_forge::{ForgeEvent, PushEvent};
use kiln_store::{Idempotency, NewDelivery, RepoRecord, StoreError};
use kiln_workflow::Workflow;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::Instrument;

use crate::state::ScheduleIndex;

/// The scheduled workflows of `repo`, re-read from its default branch once
/// per `schedule_refresh`.
async fn index(state: &AppState, repo: &RepoRecord, now: i64) -> Result<ScheduleIndex, String> {
    let refresh = state.config.schedule_refresh.as_millis() as i64;
    if let Some(i) = state.schedule_indexes.lock().expect("index").get(&repo.id)
        && now - i.read_at_ms < refresh
        && now >= i.read_at_ms
    {
        return Ok(i.clone());
    }
    let branch = format!("refs/heads/{}", repo.forge.default_branch);
    let remote = crate::services::repos::remote(state, repo).await.map_err(|e| e.message)?;
    let sha = state.mirrors.resolve(&repo.id, &remote, &branch).await.map_err(|e| e.to_string())?;
    let files = state.mirrors.list_workflows(&repo.id, &sha).await.map_err(|e| e.to_string())?;
    let mut workflows = Vec::new();
    for path in files {
        let parsed = state.mirrors.parse_workflow(&repo.id, &sha, &path).await;
        if let Err(WorkflowFileError::Internal(e)) = &parsed {
            return Err(e.clone());
        }
        if let Ok(wf) = parsed
            && !wf.on.schedule.is_empty()
        {
            workflows.push((path, Arc::new(wf)));
        }
    }
    let i = ScheduleIndex { read_at_ms: now, sha, workflows };
    state.schedule_indexes.lock().expect("index").insert(repo.id.clone(), i.clone());
    Ok(i)
}

/// Fire the schedule ticks that are due; how many runs were started.
pub(crate) async fn schedule_once(state: &AppState) -> Result<usize, StoreError> {
    let now = state.clock.now_ms();
    let mut fired = 0;
    for repo in state.store.list_repos().await? {
        let idx = match index(state, &repo, now).await {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(repo = %repo.name, "schedules not read: {e}");
                continue;
            }
        };
        for (path, wf) in &idx.workflows {
            let Some(last) = state.store.schedule_cursor(&repo.id, path).await? else {
                // A workflow seen for the first time starts now: no backfill.
                state.store.advance_schedule_cursor(&repo.id, path, None, now).await?;
                tracing::info!(repo = %repo.name, workflow = %path, "schedule: first seen, its ticks count from now");
                continue;
            };
            let Some(tick) = wf.on.schedule.iter().filter_map(|s| s.due_tick(last, now)).max() else { continue };
            // The scheduled run's trace starts with this trigger (issue 19).
            let span = tracing::info_span!("trigger", trigger = "schedule", path = %path);
            match fire(state, &repo, &idx.sha, path, wf, tick).instrument(span).await {
                Ok(true) => fired += 1,
                Ok(false) => {}
                // Refused for now (degradation, a registry down): the tick
                // stays due and fires once when it can, like a missed one
                // (issue 40); the cursor does not move.
                Err(Refusal::ForNow(e)) => {
                    tracing::info!(repo = %repo.name, workflow = %path, tick, "scheduled run waits: {e}");
                    continue;
                }
                Err(Refusal::Never(e)) => {
                    tracing::warn!(repo = %repo.name, workflow = %path, tick, "scheduled run refused: {e}");
                }
            }
            // Only after the run exists: a crash in between fires the same
            // tick again, which the idempotency record answers with that run.
            state.store.advance_schedule_cursor(&repo.id, path, Some(last), tick).await?;
        }
    }
    Ok(fired)
}

/// Why a tick did not fire.
enum Refusal {
    /// It may fire later (degradation, a registry or the store down): the
    /// tick stays due.
    ForNow(String),
    /// It never will (the workflow cannot run as scheduled): the tick passes.
    Never(String),
}

/// Accept the run of `path` for `tick`; whether it was new.
async fn fire(
    state: &AppState,
    repo: &RepoRecord,
    sha: &str,
    path: &str,
    wf: &Workflow,
    tick: i64,
) -> Result<bool, Refusal> {
    let git_ref = format!("refs/heads/{}", repo.forge.default_branch);
    // The one door (issue 40, item 8): a scheduled run gets the declared
    // inputs' defaults (a required input without one refuses the run).
    let frozen = crate::services::acceptance::freeze(
        state,
        Freeze {
            kind: TriggerKind::Schedule,
            trust: TrustTrigger::Schedule,
            repo,
            commit_sha: sha.to_string(),
            git_ref: Some(git_ref),
            event: "schedule".into(),
            workflow_path: path.to_string(),
            workflow: wf.clone(),
            inputs: BTreeMap::new(),
            image_digests: BTreeMap::new(),
            idempotency: Some(Idempotency {
                scope: format!("schedule:{}", repo.id),
                key: format!("{path}@{tick}"),
                request_digest: "schedule".into(),
            }),
            parent_run_id: None,
            actor: "schedule".into(),
            report_context: None,
            pin_succeeded: false,
            rerun_jobs: Vec::new(),
            trace: None,
            pull_request_title: None,
            priority: None,
            rollback: None,
            audit: None,
        },
    )
    .await;
    let accepted = match frozen {
        Ok(f) => f.accepted,
        // Degraded, a registry or the store down, or the team over its
        // queued-job cap (issue 44: never refused for a cap): the tick stays
        // due and fires once when it can (the cursor does not move).
        Err(e) if e.status.is_server_error() || e.status == axum::http::StatusCode::TOO_MANY_REQUESTS => {
            return Err(Refusal::ForNow(e.message));
        }
        // The workflow cannot run as scheduled: the tick passes.
        Err(e) => return Err(Refusal::Never(e.message)),
    };
    if accepted.created {
        let detail = format!("schedule tick {tick} of {path}");
        let _ = crate::services::access::audit(state, "schedule", "run.submit", &accepted.run_id, detail).await;
    }
    Ok(accepted.created)
}

/// Poll the repositories whose interval passed; how many deliveries were made.
pub(crate) async fn poll_once(state: &AppState) -> Result<usize, StoreError> {
    let mut made = 0;
    for repo_id in state.store.repos_to_poll().await? {
        let repo = state.store.get_repo(&repo_id).await?;
        let source = match crate::services::repos::remote(state, &repo).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(repo = %repo.name, "poll failed: {}", e.message);
                continue;
            }
        };
        let remote = match state.mirrors.ls_remote(&repo.id, &source).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(repo = %repo.name, "poll failed: {e}");
                continue;
            }
        };
        let recorded: BTreeMap<String, String> = state.store.ref_heads(&repo.id).await?.into_iter().collect();
        let first = recorded.is_empty();
        for (git_ref, sha) in remote {
            if !(git_ref.starts_with("refs/heads/") || git_ref.starts_with("refs/tags/"))
                || recorded.get(&git_ref) == Some(&sha)
            {
                continue;
            }
            if !first {
                let event = ForgeEvent::Push(PushEvent {
                    git_ref: git_ref.clone(),
                    before: recorded.get(&git_ref).cloned(),
                    after: sha.clone(),
                    actor: "poll".into(),
                    changed: None,
                });
                let trigger_event = serde_json::to_string(&event).expect("event");
                let (_, created) = state
                    .store
                    .record_delivery(&NewDelivery {
                        repo_id: repo.id.clone(),
                        forge: "poll".into(),
                        delivery_key: format!("{git_ref}@{sha}"),
                        event: "push".into(),
                        payload_digest: hex::encode(Sha256::digest(trigger_event.as_bytes())),
                        trust: decide_trust(&repo.forge, &event).as_str().into(),
                        trigger_event,
                        status: "pending".into(),
                        message: Some("found by polling".into()),
                    })
                    .await?;
                made += usize::from(created);
            }
            state.store.record_ref_head(&repo.id, &git_ref, &sha).await?;
        }
        if first {
            tracing::info!(repo = %repo.name, "first poll: the remote's heads are recorded (nothing runs)");
        }
    }
    if made > 0 {
        state.planner_wake.notify_one();
    }
    Ok(made)
}
