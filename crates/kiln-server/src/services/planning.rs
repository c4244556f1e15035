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

use crate::error::ApiErr;
use crate::git::{GitError, WorkflowFileError};
use crate::images::ResolveError;
use crate::services::acceptance::{check_secrets, run_concurrency};
use crate::services::forge_status::reports_statuses;
use crate::services::{access, limits};
use crate::state::AppState;
use kiln_core::Trust;
use kiln_forge::ForgeEvent;
use kiln_store::{DeliveryRecord, Idempotency, NewRun, RepoRecord, StoreError};
use tracing::Instrument;

/// How long a planner holds a delivery before another may take it over.
const CLAIM_MS: i64 = 120_000;
/// Attempts before a delivery that keeps failing (the repository cannot be
/// fetched, a registry is down) is given up as `failed`.
const MAX_ATTEMPTS: i64 = 8;
/// Deliveries planned at once.
const PARALLEL: usize = 4;

enum PlanError {
    /// Worth trying again later (a fetch or registry failed).
    Transient(String),
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
    match plan(state, d).instrument(span).await {
        Ok(p) => {
            let message = if p.problems.is_empty() {
                format!("{} run(s) from {} workflow file(s)", p.runs.len(), p.considered)
            } else {
                format!("{} run(s); refused: {}", p.runs.len(), p.problems.join("; "))
            };
            state.store.finish_delivery(&d.id, "planned", Some(&message), &p.runs).await?;
            Ok(true)
        }
        Err(PlanError::Permanent(m)) => {
            tracing::warn!(delivery = %d.id, "delivery not planned: {m}");
            state.store.finish_delivery(&d.id, "failed", Some(&m), &[]).await?;
            Ok(true)
        }
        Err(PlanError::Transient(m)) | Err(PlanError::Store(StoreError::Unavailable(m))) => {
            // `attempts` counts this one already (the claim added it).
            if d.attempts + 1 >= MAX_ATTEMPTS {
                let m = format!("given up after {} attempts: {m}", d.attempts + 1);
                state.store.finish_delivery(&d.id, "failed", Some(&m), &[]).await?;
            } else {
                let backoff = kiln_core::backoff::Backoff { base_ms: 1_000, max_ms: 300_000 };
                let delay = backoff.delay_ms((d.attempts + 1) as u32, &mut rand::rng()) as i64;
                tracing::info!(delivery = %d.id, delay_ms = delay, "planning deferred: {m}");
                state.store.defer_delivery(&d.id, delay, &m).await?;
            }
            Ok(false)
        }
        Err(PlanError::Store(e)) => {
            let _ = state.store.defer_delivery(&d.id, 5_000, &e.to_string()).await;
            Err(e)
        }
    }
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
    let trust: Trust = d.trust.parse().map_err(|e| PlanError::Permanent(format!("stored trust: {e}")))?;
    let (kind, want_sha, git_ref, base_branch, diff_from, fetch_ref, actor) = match event {
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
        let mut wf = match read(state, &repo, &sha, path).await {
            Ok(wf) => wf,
            Err(problem) => {
                refuse(state, &repo, &sha, &ctx, path, &problem, &mut planned).await?;
                continue;
            }
        };
        // Degraded: the delivery stays pending and is planned again later.
        crate::services::acceptance::admit(state, &wf).map_err(|e| PlanError::Transient(e.message))?;
        let runs = match (kind, &base_branch) {
            ("push", _) => wf.on.matches_push(&git_ref, changed.as_deref()),
            (_, Some(base)) => wf.on.matches_pull_request(base, changed.as_deref()),
            _ => false,
        };
        if !runs {
            continue;
        }
        if let Err(e) = limits::check_definition(&wf, path).await {
            refuse(state, &repo, &sha, &ctx, path, &e.message, &mut planned).await?;
            continue;
        }
        if trust == Trust::Trusted
            && let Err(e) = check_secrets(state, &repo, &wf, path).await
        {
            refuse(state, &repo, &sha, &ctx, path, &e.message, &mut planned).await?;
            continue;
        }
        // Forge events carry no inputs: the declared defaults apply.
        let inputs = match wf.check_inputs(&Default::default()) {
            Ok(i) => i,
            Err(e) => {
                refuse(state, &repo, &sha, &ctx, path, &format!("{path}: {e}"), &mut planned).await?;
                continue;
            }
        };
        let concurrency = match run_concurrency(&wf, kind, Some(&git_ref), &inputs) {
            Ok(c) => c,
            Err(e) => {
                refuse(state, &repo, &sha, &ctx, path, &e, &mut planned).await?;
                continue;
            }
        };
        if let Err(e) = crate::services::acceptance::render_accepted(&mut wf, kind, Some(&git_ref), &inputs) {
            refuse(state, &repo, &sha, &ctx, path, &format!("{path}: {e}"), &mut planned).await?;
            continue;
        }
        limits::artifact_expiry(&mut wf, state.config.artifact_expire_in);
        limits::run_timeout(&mut wf, state.config.run_timeout);
        if let Err(e) = limits::job_timeouts(&mut wf, state.config.job_timeout, state.config.max_job_timeout) {
            refuse(state, &repo, &sha, &ctx, path, &format!("{path}: {e}"), &mut planned).await?;
            continue;
        }
        let image_digests = match state.resolver.resolve_workflow(&mut wf).await {
            Ok(d) => d,
            Err(ResolveError::Refused(m)) => {
                refuse(state, &repo, &sha, &ctx, path, &m, &mut planned).await?;
                continue;
            }
            Err(ResolveError::Unavailable(m)) => return Err(PlanError::Transient(m)),
        };
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
        let accepted = crate::services::acceptance::accept_timed(
            state,
            "forge",
            NewRun {
                repo_id: repo.id.clone(),
                commit_sha: sha.clone(),
                git_ref: Some(git_ref.clone()),
                event: kind.into(),
                trust: trust.as_str().into(),
                workflow_path: path.clone(),
                workflow: wf,
                inputs,
                parent_run_id: None,
                idempotency: Some(idempotency),
                concurrency,
                image_digests,
                actor: Some(actor.clone()),
                report_context: reports_statuses(&repo).then(|| ctx.clone()),
                pin_succeeded: false,
                traceparent: None,
            },
            None,
        )
        .await?;
        state.relay_wake.notify_one();
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
            state.mirrors.resolve(&repo.id, &remote, sha).await.map_err(|e| PlanError::Transient(e.to_string()))
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
        Err(GitError::UnknownRevision(_)) => Err(PlanError::Transient(format!(
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
