//! Planning a webhook delivery (issue 14), after the forge got its 2xx:
//! read every `.kiln/*.yaml` at the event's SHA, keep the workflows whose
//! `on:` matches the event (branch, tag and path filters), and accept one
//! frozen run per workflow with the trust decided at acceptance.
//!
//! Exactly once: a delivery is claimed for planning (a lease in the
//! database; an expired claim is planned again, e.g. after a crash), and
//! every run is accepted with an idempotency record — a push's by
//! (ref, SHA, workflow), so a redelivery, a second delivery of the same
//! push or the poller's reconciliation all find the same run; a pull
//! request's by delivery id. A workflow that fails validation at that SHA
//! gets a failed status on the commit naming the file and line, and no run.
//!
//! Never dropped (issue 40): trouble that may pass (the remote or a
//! registry cannot be reached, the server is degraded, the store is busy) is
//! retried with capped backoff for as long as it lasts; only what cannot
//! change ends a delivery `failed` — the remote answered and does not have
//! the commit on the ref (after a few tries: a forge's replica may lag), or
//! the stored event is unreadable. A delivery pending longer than
//! `--delivery-alert-after` is delayed: the `kiln_deliveries_delayed`
//! gauge counts it, its listing says so, and its commit gets a pending
//! status `kiln/delivery (EVENT)` saying why, settled when planning ends.

use crate::error::ApiErr;
use crate::git::{GitError, WorkflowFileError};
use crate::services::acceptance::Freeze;
use crate::services::access;
use crate::services::forge_status::reports_statuses;
use crate::services::webhooks::{decide_trust, trust_trigger};
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_core::acceptance::TriggerKind;
use kiln_forge::ForgeEvent;
use kiln_store::{DeliveryRecord, Idempotency, RepoRecord, StoreError};
use std::collections::BTreeMap;
use tracing::Instrument;

/// How long a planner holds a delivery before another may take it over.
const CLAIM_MS: i64 = 120_000;
/// Attempts before a delivery whose commit the remote proves absent (not on
/// the pushed ref, not behind the pull request's ref) is given up as
/// `failed`: a forge's replica may lag, for seconds, not for ever.
const ABSENT_ATTEMPTS: i64 = 8;
/// The wait before planning again while the server refuses new runs
/// (degradation): short, so planning resumes soon after the level drops.
const DEGRADED_RETRY_MS: i64 = 5_000;
/// How soon a delivery whose team holds its queued-job cap is planned again.
const OVER_CAP_RETRY_MS: i64 = 1_000;
/// The prefix of a delivery's message once its delayed status was posted.
const DELAYED: &str = "delayed: ";
/// Deliveries planned at once.
const PARALLEL: usize = 4;

enum PlanError {
    /// Worth trying again later (a fetch or registry failed).
    Transient(String),
    /// The server refuses new runs now (degradation): planned when it recovers.
    Degraded(String),
    /// The repository's team holds its queued-job cap (issue 44): planned
    /// again every [`OVER_CAP_RETRY_MS`] until it is under it.
    OverCap(String),
    /// The remote answered and does not hold the commit where the event says.
    Absent(String),
    /// Will not change by trying again.
    Permanent(String),
    Store(StoreError),
}

impl From<StoreError> for PlanError {
    fn from(e: StoreError) -> Self {
        PlanError::Store(e)
    }
}

/// What planning one delivery produced.
struct Planned {
    runs: Vec<String>,
    /// Workflows that were refused (file: problem).
    problems: Vec<String>,
    considered: usize,
}

/// Plan the deliveries that are due; how many were planned.
pub(crate) async fn plan_once(state: &AppState) -> Result<usize, StoreError> {
    let due = state.store.due_deliveries(64).await?;
    let mut done = 0;
    for chunk in due.chunks(PARALLEL) {
        let results = futures::future::join_all(chunk.iter().map(|d| plan_claimed(state, d))).await;
        for r in results {
            done += usize::from(r?);
        }
    }
    Ok(done)
}

/// Claim `d` and plan it; whether this call planned it.
async fn plan_claimed(state: &AppState, d: &DeliveryRecord) -> Result<bool, StoreError> {
    if !state.store.claim_delivery(&d.id, CLAIM_MS).await? {
        return Ok(false);
    }
    // The runs of a forge delivery start their traces with this trigger (issue 19).
    let span = tracing::info_span!("trigger", trigger = "forge", delivery = %d.id);
    // `attempts` counts this one already (the claim added it).
    let attempts = d.attempts + 1;
    let outcome = match state.resources.admit_run(false) {
        // Critical degradation: recorded, not planned (issue 40); the
        // forge got its 202 and will not send it again.
        Err(r) => Err(PlanError::Degraded(r.message)),
        Ok(()) => plan(state, d).instrument(span).await,
    };
    let over_cap = matches!(outcome, Err(PlanError::OverCap(_)));
    match outcome {
        Ok(p) => {
            let message = if p.problems.is_empty() {
                format!("{} run(s) from {} workflow file(s)", p.runs.len(), p.considered)
            } else {
                format!("{} run(s); refused: {}", p.runs.len(), p.problems.join("; "))
            };
            if was_delayed(d) {
                settle_delayed(state, d, "success", &format!("planned after {attempts} attempts: {message}")).await?;
            }
            state.store.finish_delivery(&d.id, "planned", Some(&message), &p.runs).await?;
            Ok(true)
        }
        Err(PlanError::Permanent(m)) => give_up(state, d, &m).await,
        Err(PlanError::Absent(m)) if attempts >= ABSENT_ATTEMPTS => {
            give_up(state, d, &format!("given up after {attempts} attempts: {m}")).await
        }
        Err(PlanError::Store(e)) if !matches!(e, StoreError::Unavailable(_)) => {
            let _ = state.store.defer_delivery(&d.id, 5_000, &e.to_string()).await;
            Err(e)
        }
        Err(PlanError::Transient(m) | PlanError::Absent(m) | PlanError::Degraded(m) | PlanError::OverCap(m))
        | Err(PlanError::Store(StoreError::Unavailable(m))) => {
            let degraded = state.resources.admit_run(false).is_err();
            let delay = if over_cap {
                OVER_CAP_RETRY_MS
            } else if degraded {
                DEGRADED_RETRY_MS
            } else {
                let backoff = kiln_core::backoff::Backoff {
                    base_ms: (2 * state.config.retry_base.as_millis() as u64).max(1),
                    max_ms: state.config.delivery_retry_max.as_millis() as u64,
                };
                backoff.delay_ms(u32::try_from(attempts).unwrap_or(u32::MAX), &mut rand::rng()) as i64
            };
            tracing::info!(delivery = %d.id, attempts, delay_ms = delay, "planning deferred: {m}");
            let age = state.clock.now_ms() - d.created_at;
            let message = if was_delayed(d) {
                format!("{DELAYED}{m}")
            } else if age >= state.config.delivery_alert_after.as_millis() as i64 {
                tracing::warn!(delivery = %d.id, attempts, age_ms = age, "delivery delayed: {m}");
                let waited = age / 60_000;
                let why = format!("delayed {waited} min, still retrying: {m}");
                settle_delayed(state, d, "pending", &why).await?;
                format!("{DELAYED}{m}")
            } else {
                m
            };
            state.store.defer_delivery(&d.id, delay, &message).await?;
            Ok(false)
        }
        Err(PlanError::Store(e)) => Err(e),
    }
}

/// A delivery that cannot be planned, ever: `failed`, saying why.
async fn give_up(state: &AppState, d: &DeliveryRecord, m: &str) -> Result<bool, StoreError> {
    tracing::warn!(delivery = %d.id, "delivery not planned: {m}");
    if was_delayed(d) {
        settle_delayed(state, d, "failure", m).await?;
    }
    state.store.finish_delivery(&d.id, "failed", Some(m), &[]).await?;
    Ok(true)
}

fn was_delayed(d: &DeliveryRecord) -> bool {
    d.message.as_deref().is_some_and(|m| m.starts_with(DELAYED))
}

/// The delivery's own commit status, `kiln/delivery (EVENT)`: pending while
/// it is delayed, then how planning ended (the workflows' statuses follow
/// from their runs).
async fn settle_delayed(state: &AppState, d: &DeliveryRecord, status: &str, why: &str) -> Result<(), StoreError> {
    let Ok(event) = serde_json::from_str::<ForgeEvent>(&d.trigger_event) else { return Ok(()) };
    let (sha, kind) = match event {
        ForgeEvent::Push(p) => (p.after, "push"),
        ForgeEvent::PullRequest(pr) => (pr.head_sha, "pull_request"),
        ForgeEvent::Ping | ForgeEvent::Ignored { .. } => return Ok(()),
    };
    let repo = state.store.get_repo(&d.repo_id).await?;
    if !reports_statuses(&repo) {
        return Ok(());
    }
    // Forges cap descriptions (GitHub: 140 characters).
    let why: String = why.chars().take(138).collect();
    state.store.create_report(&repo.id, &sha, &format!("kiln/delivery ({kind})"), status, &why).await?;
    Ok(())
}

/// The status context of a workflow file for an event: `kiln/ci (push)`.
pub(crate) fn context(path: &str, event: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.strip_suffix(".yaml").or_else(|| file.strip_suffix(".yml")).unwrap_or(file);
    format!("kiln/{stem} ({event})")
}

async fn plan(state: &AppState, d: &DeliveryRecord) -> Result<Planned, PlanError> {
    let repo = state.store.get_repo(&d.repo_id).await?;
    let event: ForgeEvent = serde_json::from_str(&d.trigger_event)
        .map_err(|e| PlanError::Permanent(format!("stored event is unreadable: {e}")))?;
    // Decided now, under the repository's policy as it stands (the same
    // rules as when the delivery was recorded: one decider).
    let trust = decide_trust(&repo.forge, &event);
    let (kind, want_sha, git_ref, base_branch, diff_from, fetch_ref, actor) = match event.clone() {
        ForgeEvent::Push(p) => ("push", p.after, p.git_ref, None, p.before.map(|b| (b, false)), None, p.actor),
        ForgeEvent::PullRequest(pr) => (
            "pull_request",
            pr.head_sha,
            pr.fetch_ref.clone(),
            Some(pr.base_ref),
            pr.base_sha.map(|b| (b, true)),
            Some(pr.fetch_ref),
            pr.actor,
        ),
        ForgeEvent::Ping | ForgeEvent::Ignored { .. } => {
            return Ok(Planned { runs: vec![], problems: vec![], considered: 0 });
        }
    };
    let sha = if kind == "push" {
        on_pushed_ref(state, &repo, &git_ref, &want_sha).await?
    } else {
        resolve(state, &repo, &want_sha, fetch_ref.as_deref()).await?
    };
    let files = state.mirrors.list_workflows(&repo.id, &sha).await.map_err(|e| PlanError::Transient(e.to_string()))?;
    let changed = match &diff_from {
        Some((from, three_dot)) => state.mirrors.changed_files(&repo.id, from, &sha, *three_dot).await.ok().flatten(),
        None => None,
    };
    let mut planned = Planned { runs: vec![], problems: vec![], considered: files.len() };
    for path in &files {
        let ctx = context(path, kind);
        let wf = match read(state, &repo, &sha, path).await {
            Ok(wf) => wf,
            Err(problem) => {
                refuse(state, &repo, &sha, &ctx, path, &problem, &mut planned).await?;
                continue;
            }
        };
        let runs = match (kind, &base_branch) {
            ("push", _) => wf.on.matches_push(&git_ref, changed.as_deref()),
            (_, Some(base)) => wf.on.matches_pull_request(base, changed.as_deref()),
            _ => false,
        };
        if !runs {
            continue;
        }
        let idempotency = if kind == "push" {
            Idempotency {
                scope: format!("push:{}", repo.id),
                key: format!("{git_ref}@{sha}:{path}"),
                request_digest: "push".into(),
            }
        } else {
            // By what runs, not by delivery id (issue 39): a captured
            // delivery replayed under a new id, a redelivery, and an
            // `opened`, `synchronize` or `reopened` of the same head commit
            // all find the same run. Trust is part of the key: the same
            // commit as a fork's and as a collaborator's branch are two runs.
            Idempotency {
                scope: format!("pull_request:{}", repo.id),
                key: format!("{git_ref}@{sha}:{}:{path}", trust.as_str()),
                request_digest: "pull_request".into(),
            }
        };
        // The one door (issue 40, item 8). Forge events carry no inputs:
        // the declared defaults apply.
        let frozen = crate::services::acceptance::freeze(
            state,
            Freeze {
                kind: if kind == "push" { TriggerKind::Push } else { TriggerKind::PullRequest },
                trust: trust_trigger(&repo.forge, &event).ok_or_else(|| PlanError::Permanent("no trust".into()))?,
                repo: &repo,
                commit_sha: sha.clone(),
                git_ref: Some(git_ref.clone()),
                event: kind.into(),
                workflow_path: path.clone(),
                workflow: wf,
                inputs: BTreeMap::new(),
                image_digests: BTreeMap::new(),
                idempotency: Some(idempotency),
                parent_run_id: None,
                actor: actor.clone(),
                report_context: reports_statuses(&repo).then(|| ctx.clone()),
                pin_succeeded: false,
                rerun_jobs: Vec::new(),
                trace: None,
                pull_request_title: match &event {
                    ForgeEvent::PullRequest(pr) => Some(pr.title.clone()),
                    _ => None,
                },
                priority: None,
                rollback: None,
                audit: None,
            },
        )
        .await;
        let accepted = match frozen {
            Ok(f) => f.accepted,
            // Degraded: the delivery stays pending and is planned again later.
            Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => return Err(PlanError::Degraded(e.message)),
            // The team over its queued-job cap (issue 44): the delivery is
            // kept and planned again shortly; its runs are created once the
            // team is under the cap (never refused for a cap).
            Err(e) if e.status == StatusCode::TOO_MANY_REQUESTS => return Err(PlanError::OverCap(e.message)),
            // A registry or the store did not answer: retried.
            Err(e) if e.status.is_server_error() => return Err(PlanError::Transient(e.message)),
            // This workflow cannot run as pushed: its commit status says why.
            Err(e) => {
                refuse(state, &repo, &sha, &ctx, path, &e.message, &mut planned).await?;
                continue;
            }
        };
        if accepted.created {
            let detail = format!("{kind} {git_ref} at {sha} trust {} delivery {}", trust.as_str(), d.delivery_key);
            let who = format!("{}:{actor}", d.forge);
            access::audit(state, &who, "run.submit", &accepted.run_id, detail).await.map_err(api_store)?;
        }
        planned.runs.push(accepted.run_id);
    }
    if kind == "push" {
        state.store.record_ref_head(&repo.id, &git_ref, &sha).await?;
    }
    Ok(planned)
}

fn api_store(e: ApiErr) -> PlanError {
    PlanError::Transient(e.message)
}

/// The event's commit in the mirror: fetched when missing, a pull
/// request's head by its ref (a fork's commit is reachable only from it).
async fn resolve(state: &AppState, repo: &RepoRecord, sha: &str, fetch_ref: Option<&str>) -> Result<String, PlanError> {
    let remote = crate::services::repos::remote(state, repo).await.map_err(|e| PlanError::Transient(e.message))?;
    match state.mirrors.resolve(&repo.id, &remote, sha).await {
        Ok(s) => Ok(s),
        Err(GitError::UnknownRevision(_)) if fetch_ref.is_some() => {
            let r = fetch_ref.expect("checked");
            state.mirrors.fetch_ref(&repo.id, &remote, r).await.map_err(|e| PlanError::Transient(e.to_string()))?;
            // Fetched, and the commit is not behind the pull request's ref.
            state.mirrors.resolve(&repo.id, &remote, sha).await.map_err(|e| match e {
                GitError::UnknownRevision(_) => PlanError::Absent(e.to_string()),
                e => PlanError::Transient(e.to_string()),
            })
        }
        // A commit not there yet may be replication lag on the forge's side.
        Err(e) => Err(PlanError::Transient(e.to_string())),
    }
}

/// A push's commit, proven to be on the pushed ref (issue 39): the ref
/// itself is fetched from the remote and the commit must be its tip or an
/// ancestor of it. Never the mirror's say-so alone: a fork's commit fetched
/// for a pull request (`refs/pull/N/head`) is in the mirror too, and a push
/// payload naming it must not run it as a trusted push to `main`. Not on the
/// ref (yet: a forge's replica may lag) is retried, then given up.
async fn on_pushed_ref(state: &AppState, repo: &RepoRecord, git_ref: &str, sha: &str) -> Result<String, PlanError> {
    let remote = crate::services::repos::remote(state, repo).await.map_err(|e| PlanError::Transient(e.message))?;
    match state.mirrors.commit_on_remote_ref(&repo.id, &remote, git_ref, sha).await {
        Ok(sha) => Ok(sha),
        Err(GitError::UnknownRevision(_)) => Err(PlanError::Absent(format!(
            "commit {sha} is not on {git_ref} of the remote (neither its tip nor an ancestor of it); a push runs \
             only what the pushed ref holds"
        ))),
        Err(e) => Err(PlanError::Transient(e.to_string())),
    }
}

/// A workflow file at `sha`, parsed; the problem (`line:col: message`) if not.
async fn read(state: &AppState, repo: &RepoRecord, sha: &str, path: &str) -> Result<kiln_workflow::Workflow, String> {
    state.mirrors.parse_workflow(&repo.id, sha, path).await.map_err(|e| match e {
        WorkflowFileError::Read(e) => e.to_string(),
        WorkflowFileError::Invalid(d) => d.0.first().map(|x| x.to_string()).unwrap_or_else(|| d.to_string()),
        WorkflowFileError::Internal(e) => e,
    })
}

/// A workflow refused at this commit: a failed status naming the file and
/// the problem (no run), and a note in the delivery.
async fn refuse(
    state: &AppState,
    repo: &RepoRecord,
    sha: &str,
    ctx: &str,
    path: &str,
    problem: &str,
    planned: &mut Planned,
) -> Result<(), PlanError> {
    let first = problem.lines().next().unwrap_or(problem);
    let description = format!("{path}:{first}");
    if reports_statuses(repo) {
        state.store.create_report(&repo.id, sha, ctx, "failure", &description).await?;
    }
    planned.problems.push(description);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn contexts_name_the_workflow_and_event() {
        assert_eq!(super::context(".kiln/ci.yaml", "push"), "kiln/ci (push)");
        assert_eq!(super::context(".kiln/deploy.yml", "pull_request"), "kiln/deploy (pull_request)");
    }
}
