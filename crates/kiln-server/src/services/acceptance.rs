//! Run acceptance (spec 000 §5–6; ARCHITECTURE invariants 1, 9, 10): a
//! submission becomes a frozen run — commit SHA resolved once, workflow
//! read and validated at that SHA, image tags pinned to digests, the
//! concurrency group rendered, the trust context decided from the trigger —
//! and the store accepts it in one transaction with its idempotency record.
//!
//! A retry re-accepts the parent's frozen definition: same SHA, same pinned
//! registry digests (a moved tag must not change what a retry runs), same
//! trust (never raised).

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::git::{GitError, WorkflowFileError};
use crate::images::ResolveError;
use crate::services::{access, limits};
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_api::trace::TraceParent;
use kiln_core::Trust;
use kiln_core::acceptance::{Check, TriggerKind, applies};
use kiln_core::fair::Lane;
use kiln_core::trust::TrustTrigger;
use kiln_store::{Idempotency, NewRun, RepoRecord, RunConcurrency};
use kiln_workflow::Workflow;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tracing::Instrument;

/// Events a submission may name.
const EVENTS: &[&str] = &["manual", "push", "pull_request", "retry", "schedule"];

/// What every trigger brings to the one door (issue 40, item 8): the API,
/// a retry, a forge push or pull request and a schedule tick each build
/// one and call [`freeze`], which runs kiln-core's acceptance table
/// ([`kiln_core::acceptance`]) in its order and decides trust with
/// [`kiln_core::trust::decide`] — nothing else decides either.
pub(crate) struct Freeze<'a> {
    pub kind: TriggerKind,
    /// The facts trust is decided from.
    pub trust: TrustTrigger<'a>,
    pub repo: &'a RepoRecord,
    pub commit_sha: String,
    pub git_ref: Option<String>,
    pub event: String,
    pub workflow_path: String,
    pub workflow: Workflow,
    /// The inputs given (API), none (forge, schedule: the defaults apply),
    /// or a retry's parent's frozen ones.
    pub inputs: BTreeMap<String, String>,
    /// A retry's parent's pinned image digests (copied, never re-resolved).
    pub image_digests: BTreeMap<String, String>,
    pub idempotency: Option<Idempotency>,
    pub parent_run_id: Option<String>,
    pub actor: String,
    pub report_context: Option<String>,
    pub pin_succeeded: bool,
    /// A retry of these jobs and what needs them (issue 42).
    pub rerun_jobs: Vec<String>,
    /// The trigger span's context (the run's trace starts there).
    pub trace: Option<TraceParent>,
    /// A pull request's title (forge runs of one; a retry keeps its parent's).
    pub pull_request_title: Option<String>,
    /// The lane an admin asked for, or a retry's parent's (issue 44); else
    /// the workflow's `priority:` for the event, else the trigger's default.
    pub priority: Option<Lane>,
    /// A rollback (issue 46): the deployment it returns to.
    pub rollback: Option<kiln_store::NewRollback>,
    /// Audit the run's creation as this action by `actor` (with the
    /// repository, event and trust as its detail), in the acceptance's
    /// own transaction.
    pub audit: Option<&'static str>,
}

/// A frozen and accepted run.
pub(crate) struct Frozen {
    pub accepted: kiln_store::Accepted,
    pub trust: Trust,
    /// Each job's name and `runs-on` labels, as frozen (rendered).
    pub job_labels: JobLabels,
}

/// Jobs' names and `runs-on` labels (what [`warnings`] judges).
pub(crate) type JobLabels = Vec<(String, BTreeMap<String, String>)>;

/// Freeze and accept a run: every check of [`Check::ORDER`] that applies
/// to the trigger, then the store's acceptance transaction. A refusal is
/// an [`ApiErr`]: 503 (degraded: later), 502 (a registry or remote did not
/// answer: later), 4xx (never as asked), 5xx from the store.
pub(crate) async fn freeze(state: &AppState, f: Freeze<'_>) -> ApiResult<Frozen> {
    let Freeze { kind, trust, repo, workflow_path: path, mut workflow, mut inputs, mut image_digests, .. } = f;
    let trust = kiln_core::trust::decide(trust);
    // `commit.*` of the run's expressions: read from the mirror (which
    // holds the commit: its workflow was just read there) and frozen with
    // the run. A commit whose metadata cannot be read leaves them null.
    let commit = match state.mirrors.commit_info(&repo.id, &f.commit_sha).await {
        Ok(info) => kiln_workflow::CommitContext {
            sha: f.commit_sha.clone(),
            title: info.message.lines().next().unwrap_or_default().to_string(),
            author: info.author_name,
        },
        Err(e) => {
            tracing::warn!(repo = %repo.name, commit = %f.commit_sha, error = %e, "cannot read the commit's message and author; `commit.title` and `commit.author` are null");
            kiln_workflow::CommitContext { sha: f.commit_sha.clone(), ..Default::default() }
        }
    };
    let mut concurrency = None;
    let lane = lane_of(kind, repo, &f.event, f.git_ref.as_deref(), &workflow, f.priority);
    for check in Check::ORDER {
        if !applies(kind, check) {
            continue;
        }
        match check {
            Check::Admission => admit(state, &workflow)?,
            Check::Quota => crate::services::queue::admit(state, repo, lane).await?,
            Check::ManualAllowed => {
                if f.event == "manual" && !workflow.on.allows_manual() {
                    return Err(ApiErr::invalid(format!(
                        "{path} declares `on:` without `manual`, so it is not started by hand; add `manual: {{}}` \
                         under `on:` to allow it"
                    )));
                }
            }
            // Declared inputs (spec 000 §5: the accepted inputs are frozen
            // with the run): unknown, ill-typed or missing required ones
            // are refused before anything is stored; defaults filled in.
            Check::Inputs => {
                inputs = workflow.check_inputs(&inputs).map_err(|e| ApiErr::invalid(format!("{path}: {e}")))?;
            }
            Check::InputLimits => limits::check_inputs(&inputs)?,
            Check::DefinitionSize => limits::check_definition(&workflow, &path).await?,
            // Only a trusted run is given secrets, and only it is told which
            // are missing (an untrusted author learns no secret's name).
            Check::Secrets if trust == Trust::Trusted => check_secrets(state, repo, &workflow, &path).await?,
            Check::Secrets => {}
            Check::Environments => check_environments(state, &workflow, f.git_ref.as_deref(), &path).await?,
            Check::Concurrency => {
                concurrency = run_concurrency(&workflow, &f.event, f.git_ref.as_deref(), &inputs, &commit)
                    .map_err(ApiErr::invalid)?;
            }
            Check::Render => render_accepted(&mut workflow, &f.event, f.git_ref.as_deref(), &inputs, &commit)
                .map_err(|e| ApiErr::invalid(format!("{path}: {e}")))?,
            Check::Limits => {
                limits::job_timeouts(&mut workflow, state.config.job_timeout, state.config.max_job_timeout)
                    .map_err(|e| ApiErr::invalid(format!("{path}: {e}")))?;
                limits::artifact_expiry(&mut workflow, state.config.artifact_expire_in);
                limits::run_timeout(&mut workflow, state.config.run_timeout);
            }
            Check::Images => {
                image_digests = state.resolver.resolve_workflow(&mut workflow).await.map_err(resolve_err)?
            }
            // Decided above, from the trigger alone.
            Check::Trust => {}
        }
    }
    let trigger = match kind {
        TriggerKind::Api => "api",
        TriggerKind::Retry => "retry",
        TriggerKind::Push | TriggerKind::PullRequest => "forge",
        TriggerKind::Schedule => "schedule",
    };
    let job_labels = workflow.jobs.iter().map(|j| (j.name.clone(), j.runs_on.clone())).collect();
    let audit = f.audit.map(|action| kiln_store::NewAudit {
        actor: f.actor.clone(),
        action: action.into(),
        target: String::new(),
        detail: format!("repository {} event {} trust {}", repo.name, f.event, trust.as_str()),
    });
    let accepted = accept_timed(
        state,
        trigger,
        NewRun {
            priority: lane.as_str().into(),
            repo_id: repo.id.clone(),
            commit_sha: f.commit_sha,
            git_ref: f.git_ref,
            event: f.event,
            trust: trust.as_str().into(),
            workflow_path: path,
            workflow,
            inputs,
            parent_run_id: f.parent_run_id,
            idempotency: f.idempotency,
            concurrency,
            image_digests,
            actor: Some(f.actor),
            report_context: f.report_context,
            pin_succeeded: f.pin_succeeded,
            rerun_jobs: f.rerun_jobs,
            traceparent: None,
            commit_title: Some(commit.title).filter(|t| !t.is_empty()),
            commit_author: Some(commit.author).filter(|a| !a.is_empty()),
            pull_request_title: f.pull_request_title,
            rollback: f.rollback,
            audit,
        },
        f.trace,
    )
    .await?;
    state.relay_wake.notify_one();
    Ok(Frozen { accepted, trust, job_labels })
}

/// The lane of a new run (issue 44): what an admin asked for (or a
/// retry's parent's), else the workflow's `priority:` for the event, else
/// the trigger's default — a push to the default branch or a protected ref
/// `urgent`, a schedule `background`, anything else `normal`.
fn lane_of(
    kind: TriggerKind,
    repo: &RepoRecord,
    event: &str,
    git_ref: Option<&str>,
    workflow: &Workflow,
    asked: Option<Lane>,
) -> Lane {
    if let Some(l) = asked {
        return l;
    }
    if let Some(l) = workflow.priority_for(event).and_then(Lane::parse) {
        return l;
    }
    let branch = git_ref.and_then(|r| r.strip_prefix("refs/heads/"));
    let trunk = branch.is_some_and(|b| {
        b == repo.forge.default_branch || repo.forge.protected_refs.iter().any(|p| kiln_workflow::glob_match(p, b))
    });
    kiln_core::fair::default_lane(kind, trunk)
}

/// A submission through the public API.
pub(crate) struct Submission {
    /// Repository name or id.
    pub repo: String,
    pub request: api::SubmitRun,
    /// The raw `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<Vec<u8>>,
    /// Who submitted it.
    pub by: Principal,
    /// The trigger span's trace context (a child of the submitter's
    /// `traceparent`, when it sent a valid one).
    pub trace: Option<TraceParent>,
}

/// Accept a submitted run; returns the run id (the original one for a
/// redelivery with the same key and body).
#[cfg(test)]
pub(crate) async fn submit(state: &AppState, sub: Submission) -> ApiResult<String> {
    submit_labelled(state, sub).await.map(|(run_id, _)| run_id)
}

/// [`submit`], with the accepted jobs' labels for [`warnings`].
pub(crate) async fn submit_labelled(state: &AppState, sub: Submission) -> ApiResult<(String, JobLabels)> {
    let Submission { repo, request: req, idempotency_key, by, trace } = sub;
    limits::check_inputs(&req.inputs)?;
    let repo = state.store.get_repo(&repo).await?;
    let idempotency = match idempotency_key {
        None => None,
        Some(key) => Some(idempotency(&repo, &by, &key, &req)?),
    };
    let event = req.event.clone().unwrap_or_else(|| "manual".into());
    if !EVENTS.contains(&event.as_str()) {
        return Err(ApiErr::invalid(format!("unknown event `{event}`")));
    }
    let priority = match req.priority.as_deref() {
        None => None,
        Some(p) => {
            let lane = crate::services::queue::parse_lane(p)?;
            if !matches!(by.scope, crate::auth::Scope::Admin) {
                return Err(ApiErr::new(
                    StatusCode::FORBIDDEN,
                    api::codes::FORBIDDEN,
                    "only an admin token may set a run's priority (`--priority`)",
                ));
            }
            Some(lane)
        }
    };
    let remote = crate::services::repos::remote(state, &repo).await?;
    let (sha, git_ref) =
        state.mirrors.resolve_named(&repo.id, &remote, req.commit_sha.trim()).await.map_err(git_err)?;
    let workflow_path = match req.workflow_path.clone().filter(|p| !p.trim().is_empty()) {
        Some(p) => p,
        None => only_selected(state, &repo, &sha).await?,
    };
    let workflow = read_workflow(state, &repo, &sha, &workflow_path).await?;
    let frozen = freeze(
        state,
        Freeze {
            kind: TriggerKind::Api,
            trust: TrustTrigger::Api {
                event: &event,
                may_start_trusted: by.may_start_trusted,
                git_ref: git_ref.as_deref(),
            },
            repo: &repo,
            commit_sha: sha.clone(),
            git_ref: git_ref.clone(),
            event: event.clone(),
            workflow_path,
            workflow,
            inputs: req.inputs.clone(),
            image_digests: BTreeMap::new(),
            idempotency,
            parent_run_id: None,
            actor: by.actor.clone(),
            report_context: None,
            pin_succeeded: false,
            rerun_jobs: Vec::new(),
            trace,
            pull_request_title: None,
            priority,
            rollback: None,
            audit: Some("run.submit"),
        },
    )
    .await?;
    if !frozen.accepted.created {
        // An idempotent resubmission: audited as before, on its own.
        let detail = format!("repository {} event {} trust {}", repo.name, accepted_event(&req), frozen.trust.as_str());
        access::audit(state, &by.actor, "run.submit", &frozen.accepted.run_id, detail).await?;
    }
    Ok((frozen.accepted.run_id, frozen.job_labels))
}

/// What the accepted run `run_id` is accepted despite (issue 41, item 3;
/// the 202's `warnings`): jobs whose `runs-on` labels no registered agent
/// has ([`kiln_core::waiting::unmatched_labels`]). They are not refused:
/// an agent with the labels may register later. Judged from the jobs'
/// labels as frozen (rendered); jobs that ask for no label fit any agent,
/// so then no agent is read. A failure to read the agents is no warning,
/// never a failed submission.
pub(crate) async fn warnings(state: &AppState, job_labels: &JobLabels) -> Vec<String> {
    if job_labels.iter().all(|(_, labels)| labels.is_empty()) {
        return vec![];
    }
    let Ok(agents) = state.store.list_agents().await else {
        return vec![];
    };
    let jobs: Vec<(&str, &BTreeMap<String, String>)> = job_labels.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let registered: Vec<(&str, &BTreeMap<String, String>)> =
        agents.iter().map(|a| (a.name.as_str(), &a.labels)).collect();
    kiln_core::waiting::unmatched_labels(&jobs, &registered)
}

/// [`warnings`] for the accepted run `run_id`, its labels read back from
/// its frozen definition (a retry's: it froze no workflow here).
pub(crate) async fn run_warnings(state: &AppState, run_id: &str) -> Vec<String> {
    let Ok(view) = state.store.get_run(run_id).await else {
        return vec![];
    };
    let labels: JobLabels = view.run.definition.jobs.iter().map(|j| (j.name.clone(), j.runs_on.clone())).collect();
    warnings(state, &labels).await
}

fn accepted_event(req: &api::SubmitRun) -> &str {
    req.event.as_deref().unwrap_or("manual")
}

/// Accept a new run with `run_id`'s frozen definition; returns its id.
/// With `failed_only` (spec 000 §9, retry from job), the parent's
/// successful prefix is pinned in the acceptance transaction and only its
/// failed, cancelled or skipped jobs and their descendants run again.
pub(crate) async fn retry(state: &AppState, by: &Principal, run_id: &str, failed_only: bool) -> ApiResult<String> {
    retry_jobs(state, by, run_id, failed_only, None).await
}

/// A retry; with `job` (issue 42, `POST /v1/workflow-runs/{run}/jobs/{job}/retry`,
/// `kiln retry RUN --job NAME`), a retry of that job (every instance of a
/// matrix job named without its values) and everything downstream of it,
/// the rest of the run's successes pinned — a new run, as every retry
/// (spec 000 §9: retry from a job recreates its descendants and pins the
/// reused successful prefix explicitly). Refused (409) while the run goes on.
pub(crate) async fn retry_jobs(
    state: &AppState,
    by: &Principal,
    run_id: &str,
    failed_only: bool,
    job: Option<&str>,
) -> ApiResult<String> {
    let (run, what, trust) = again(state, by, run_id, failed_only, job, None).await?;
    let detail = format!("{what} {run_id} trust {}", trust.as_str());
    access::audit(state, &by.actor, "run.retry", &run, detail).await?;
    Ok(run)
}

/// A rollback (issue 46): a new run of `run_id`'s frozen definition in
/// which only the deploy jobs of `rb.environment` (and what follows them)
/// run, the rest pinned to that run's bytes; returns its id. The caller
/// audits it.
pub(crate) async fn rollback(
    state: &AppState,
    by: &Principal,
    run_id: &str,
    rb: kiln_store::NewRollback,
) -> ApiResult<String> {
    Ok(again(state, by, run_id, false, None, Some(rb)).await?.0)
}

/// A new run of `run_id`'s frozen definition: a retry or a rollback.
/// Returns its id, what it was (for the audit) and its trust.
async fn again(
    state: &AppState,
    by: &Principal,
    run_id: &str,
    failed_only: bool,
    job: Option<&str>,
    rollback: Option<kiln_store::NewRollback>,
) -> ApiResult<(String, String, Trust)> {
    let old_view = state.store.get_run(run_id).await?;
    let rerun_jobs: Vec<String> = match job {
        Some(j) => crate::services::runs::jobs_named(&old_view, j)?.into_iter().map(|j| j.name.clone()).collect(),
        None => Vec::new(),
    };
    // Same pinned definition, same pinned images: registry digests are
    // copied, never re-resolved (a moved tag must not change what a retry
    // runs). Built images are rebuilt by the new run.
    let image_digests: BTreeMap<String, String> = old_view
        .jobs
        .iter()
        .filter(|j| {
            matches!(
                old_view.run.definition.job(&j.job.name).and_then(|d| d.image.as_ref()),
                Some(kiln_workflow::Image::Ref { .. })
            )
        })
        .filter_map(|j| Some((j.job.name.clone(), j.job.image_digest.clone()?)))
        .collect();
    let old = old_view.run;
    let parent: Trust = old
        .trust
        .parse()
        .map_err(|e| ApiErr::internal(format!("run {} has an unreadable trust context: {e}", old.id)))?;
    let repo = state.store.get_repo(&old.repo_id).await?;
    // A retry of a run that reports to the forge reports under the same
    // context: the commit shows the retry's result, not the old one's.
    let report_context = match state.store.report_context_of_run(&old.id).await? {
        Some(ctx) if crate::services::forge_status::reports_statuses(&repo) => Some(ctx),
        _ => None,
    };
    let frozen = freeze(
        state,
        Freeze {
            kind: TriggerKind::Retry,
            trust: match rollback {
                Some(_) => TrustTrigger::Rollback { parent },
                None => TrustTrigger::Retry { parent, may_start_trusted: by.may_start_trusted },
            },
            repo: &repo,
            commit_sha: old.commit_sha,
            git_ref: old.git_ref,
            event: if rollback.is_some() { "rollback" } else { "retry" }.into(),
            workflow_path: old.workflow_path,
            workflow: old.definition,
            inputs: old.inputs,
            image_digests,
            idempotency: None,
            parent_run_id: Some(old.id.clone()),
            actor: by.actor.clone(),
            report_context,
            pin_succeeded: failed_only && rerun_jobs.is_empty(),
            rerun_jobs: rerun_jobs.clone(),
            trace: None,
            pull_request_title: old.pull_request_title,
            priority: Lane::parse(&old.priority),
            rollback,
            audit: None,
        },
    )
    .await?;
    let what = if !rerun_jobs.is_empty() {
        format!("retry of job {} of", rerun_jobs.join(", "))
    } else if failed_only {
        "retry of the failed jobs of".to_string()
    } else {
        "retry of".to_string()
    };
    Ok((frozen.accepted.run_id, what, frozen.trust))
}

/// The inputs a run of `workflow_path` at `git_ref` may be given (for the
/// UI's run form): the same read as acceptance, nothing stored.
pub(crate) async fn describe_inputs(
    state: &AppState,
    repo: &str,
    git_ref: &str,
    workflow_path: Option<&str>,
) -> ApiResult<api::WorkflowInputs> {
    let repo = state.store.get_repo(repo).await?;
    let workflow_path = workflow_path.filter(|p| !p.is_empty()).unwrap_or(api::DEFAULT_WORKFLOW_PATH).to_string();
    let remote = crate::services::repos::remote(state, &repo).await?;
    let sha = state.mirrors.resolve(&repo.id, &remote, git_ref.trim()).await.map_err(git_err)?;
    let workflow = read_workflow(state, &repo, &sha, &workflow_path).await?;
    let inputs = workflow
        .inputs
        .iter()
        .map(|(name, spec)| api::InputInfo {
            name: name.clone(),
            kind: spec.kind.as_str().to_string(),
            description: spec.description.clone(),
            default: spec.default.clone(),
            required: spec.required,
            options: spec.options.clone(),
        })
        .collect();
    Ok(api::WorkflowInputs {
        workflow_path,
        commit_sha: sha,
        manual: workflow.on.allows_manual(),
        declared: !workflow.inputs.is_empty(),
        inputs,
    })
}

/// Degradation (spec 004): no new run at `critical`, none with a large job
/// at `degraded` — 503 with `Retry-After`, nothing stored.
pub(crate) fn admit(state: &AppState, wf: &Workflow) -> ApiResult<()> {
    let large = wf.jobs.iter().any(|j| j.runs_on.get("size").is_some_and(|s| s == "large"));
    state.resources.admit_run(large).map_err(|r| ApiErr::unavailable_for(r.retry_after_secs, r.message))
}

/// The idempotency record of a submission (invariant 9). The digest covers
/// the request as sent (canonical JSON), so a redelivery matches even if a
/// branch moved since. A key is the caller's own (issue 39, item 12): the
/// scope names the token that sent it (`admin.token` keeps the scope it
/// always had), so the same key from another token is another request and
/// never answers with a run that token did not start.
pub(crate) fn idempotency(
    repo: &RepoRecord,
    by: &Principal,
    key: &[u8],
    req: &api::SubmitRun,
) -> ApiResult<Idempotency> {
    let key = std::str::from_utf8(key)
        .ok()
        .filter(|k| k.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)))
        .ok_or_else(|| ApiErr::bad_request("Idempotency-Key must be ASCII"))?;
    if key.is_empty() || key.len() > 200 {
        return Err(ApiErr::bad_request("Idempotency-Key must be 1-200 characters"));
    }
    let canonical = serde_json::to_vec(&serde_json::to_value(req).expect("request")).expect("json");
    Ok(Idempotency {
        scope: match by.actor.as_str() {
            "admin.token" => format!("admin:{}", repo.id),
            actor => format!("{actor}:{}", repo.id),
        },
        key: key.to_string(),
        request_digest: hex::encode(Sha256::digest(&canonical)),
    })
}

fn git_err(e: GitError) -> ApiErr {
    match e {
        GitError::UnknownRevision(_) => ApiErr::invalid(e.to_string()),
        GitError::Fetch { .. } => ApiErr::new(StatusCode::BAD_GATEWAY, api::codes::UNAVAILABLE, e.to_string()),
        _ => ApiErr::internal(e.to_string()),
    }
}

/// Pinning `image.ref`s (spec 000 §5): an unknown image or tag refuses the
/// run (422); an unreachable registry is 502.
fn resolve_err(e: ResolveError) -> ApiErr {
    match e {
        ResolveError::Refused(m) => ApiErr::invalid(m),
        ResolveError::Unavailable(m) => ApiErr::new(StatusCode::BAD_GATEWAY, api::codes::UNAVAILABLE, m),
    }
}

/// `GET /v1/repos/{repo}/workflows`: the workflow files at `git_ref`, each
/// parsed, and what a run without a workflow path starts (issue 41, item 6).
pub(crate) async fn list_workflows(state: &AppState, repo: &str, git_ref: &str) -> ApiResult<api::WorkflowList> {
    let repo = state.store.get_repo(repo).await?;
    let remote = crate::services::repos::remote(state, &repo).await?;
    let sha = state.mirrors.resolve(&repo.id, &remote, git_ref.trim()).await.map_err(git_err)?;
    workflows_at(state, &repo, sha).await
}

/// [`list_workflows`] at the resolved commit `sha` of `repo`.
async fn workflows_at(state: &AppState, repo: &RepoRecord, sha: String) -> ApiResult<api::WorkflowList> {
    let paths = state.mirrors.list_workflows(&repo.id, &sha).await.map_err(git_err)?;
    let mut workflows = Vec::with_capacity(paths.len());
    for path in paths {
        let file = match state.mirrors.parse_workflow(&repo.id, &sha, &path).await {
            Ok(wf) => {
                let on = &wf.on;
                let triggers = [
                    ("push", on.push.is_some()),
                    ("pull_request", on.pull_request.is_some()),
                    ("schedule", !on.schedule.is_empty()),
                    ("manual", on.declared && on.manual),
                ];
                api::WorkflowFile {
                    path,
                    manual: on.allows_manual(),
                    triggers: triggers.iter().filter(|(_, t)| *t).map(|(n, _)| n.to_string()).collect(),
                    error: None,
                }
            }
            Err(WorkflowFileError::Internal(e)) => return Err(ApiErr::internal(e)),
            Err(e) => {
                let why = match e {
                    WorkflowFileError::Read(e) => e.to_string(),
                    WorkflowFileError::Invalid(d) => d.to_string().lines().take(3).collect::<Vec<_>>().join("\n"),
                    WorkflowFileError::Internal(_) => unreachable!(),
                };
                api::WorkflowFile { path, manual: false, triggers: vec![], error: Some(why) }
            }
        };
        workflows.push(file);
    }
    let selected = select_default(&workflows);
    Ok(api::WorkflowList { commit_sha: sha, workflows, selected })
}

/// What a run started without a workflow path runs: `.kiln/pipeline.yaml`
/// when it exists (the documented default), else the only workflow, else
/// every workflow whose `on:` declares `manual` (GitHub's
/// `workflow_dispatch`). Empty: the caller must pick.
pub(crate) fn select_default(files: &[api::WorkflowFile]) -> Vec<String> {
    if files.iter().any(|f| f.path == api::DEFAULT_WORKFLOW_PATH) {
        return vec![api::DEFAULT_WORKFLOW_PATH.to_string()];
    }
    if let [only] = files {
        return vec![only.path.clone()];
    }
    files
        .iter()
        .filter(|f| f.error.is_none() && f.triggers.iter().any(|t| t == "manual"))
        .map(|f| f.path.clone())
        .collect()
}

/// The one workflow a submission without a workflow path runs; several or
/// none is a 422 that lists the files and says how to pick.
async fn only_selected(state: &AppState, repo: &RepoRecord, sha: &str) -> ApiResult<String> {
    let list = workflows_at(state, repo, sha.to_string()).await?;
    match list.selected.as_slice() {
        [one] => Ok(one.clone()),
        [] if list.workflows.is_empty() => Err(ApiErr::invalid(format!(
            "there is no workflow at commit {sha}: Kiln reads .kiln/*.yaml (see docs/workflow.md)"
        ))),
        [] => Err(ApiErr::invalid(format!(
            "commit {sha} has several workflows and none is the default: {}; give one (`kiln run --workflow PATH`, \
             or `workflow_path`), or declare `on: [manual]` in those that are started by hand",
            paths_of(&list.workflows)
        ))),
        several => Err(ApiErr::invalid(format!(
            "commit {sha} has several workflows started by hand: {}; give one (`workflow_path`), or use \
             `kiln run` without --workflow, which starts each",
            several.join(", ")
        ))),
    }
}

fn paths_of(files: &[api::WorkflowFile]) -> String {
    files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", ")
}

/// The workflow file at the resolved SHA, parsed and validated. A file
/// that is not there gets the list of those that are.
async fn read_workflow(state: &AppState, repo: &RepoRecord, sha: &str, path: &str) -> ApiResult<Workflow> {
    match state.mirrors.parse_workflow(&repo.id, sha, path).await {
        Err(WorkflowFileError::Read(GitError::MissingFile { .. })) => {}
        other => return read_result(other, sha, path),
    }
    let there = state.mirrors.list_workflows(&repo.id, sha).await.unwrap_or_default();
    let hint = if there.is_empty() {
        "there is no workflow file at that commit (Kiln reads .kiln/*.yaml and .kiln/*.yml)".to_string()
    } else {
        format!(
            "the workflows there are: {}; pick one with --workflow PATH (`kiln workflows {}` lists them)",
            there.join(", "),
            repo.name
        )
    };
    Err(ApiErr::invalid(format!("workflow file `{path}` does not exist at commit {sha}; {hint}")))
}

fn read_result(r: Result<Workflow, WorkflowFileError>, sha: &str, path: &str) -> ApiResult<Workflow> {
    r.map_err(|e| match e {
        WorkflowFileError::Read(e) => ApiErr::invalid(e.to_string()),
        WorkflowFileError::Invalid(d) => ApiErr::invalid(format!("{path} at {sha} is not a valid workflow:\n{d}")),
        WorkflowFileError::Internal(e) => ApiErr::internal(e),
    })
}

/// Refuse a workflow that asks for secrets the repository does not have:
/// better now than as a failed job later.
pub(crate) async fn check_secrets(state: &AppState, repo: &RepoRecord, wf: &Workflow, path: &str) -> ApiResult<()> {
    let wanted: Vec<String> = wf.jobs.iter().flat_map(|j| j.secrets.iter().cloned()).collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let have = state.store.secret_values(&repo.id, &wanted).await?;
    // A deploy job may take a secret from its environment instead (issue 46).
    let mut missing: Vec<&str> = Vec::new();
    for j in &wf.jobs {
        let absent: Vec<&String> = j.secrets.iter().filter(|n| !have.contains_key(*n)).collect();
        if absent.is_empty() {
            continue;
        }
        let from_env = match &j.environment {
            Some(e) => {
                let names: Vec<String> = absent.iter().map(|n| n.to_string()).collect();
                state.store.env_secret_values(&e.name, &names).await?
            }
            None => Default::default(),
        };
        missing.extend(absent.into_iter().filter(|n| !from_env.contains_key(*n)).map(String::as_str));
    }
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiErr::invalid(format!(
        "{path} asks for secrets that repository {} does not have: {}; add them with `kiln secret set {} NAME` \
         (or, for a deploy job, `kiln secret set NAME --env ENV`)",
        repo.name,
        missing.join(", "),
        repo.name
    )))
}

/// Refuse a run whose jobs deploy to an environment that does not exist,
/// or that this ref may not deploy to (issue 46): a typo must not deploy
/// unprotected, and a feature branch must not reach production.
pub(crate) async fn check_environments(
    state: &AppState,
    wf: &Workflow,
    git_ref: Option<&str>,
    path: &str,
) -> ApiResult<()> {
    // A Prometheus gate between rings needs a Prometheus to ask.
    if state.config.prometheus_url.is_none()
        && let Some(j) = wf.jobs.iter().find(|j| j.promotion.as_ref().is_some_and(|p| p.prometheus.is_some()))
    {
        let p = j.promotion.as_ref().expect("a promotion");
        return Err(ApiErr::invalid(format!(
            "{path}: the gate after ring `{}` (before job `{}`) asks Prometheus, but this server has no Prometheus \
             configured; start it with --prometheus-url URL (or KILN_PROMETHEUS_URL)",
            p.from, j.name
        )));
    }
    let mut names: Vec<(&str, &str)> =
        wf.jobs.iter().filter_map(|j| j.environment.as_ref().map(|e| (e.name.as_str(), j.name.as_str()))).collect();
    names.sort_unstable();
    names.dedup_by(|a, b| a.0 == b.0);
    for (name, job) in names {
        let env = match state.store.get_environment(name).await {
            Ok(e) => e,
            Err(kiln_store::StoreError::NotFound(_)) => {
                return Err(ApiErr::invalid(format!(
                    "{path}: job `{job}` deploys to environment `{name}`, which does not exist; create it with \
                     `kiln env create {name}` (an unknown environment would deploy unprotected)"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        if !ref_allowed(&env.refs, git_ref) {
            return Err(ApiErr::invalid(format!(
                "{path}: job `{job}` deploys to environment `{name}`, which only {} may deploy to (--refs {}); this \
                 run's ref is {}",
                if env.refs.len() == 1 { "this ref" } else { "these refs" },
                env.refs.join(","),
                git_ref.map_or_else(|| "none (a commit without a branch)".to_string(), |r| format!("`{r}`"))
            )));
        }
    }
    Ok(())
}

/// Whether `git_ref` matches an environment's `--refs` (empty: any ref).
/// A pattern starting with `refs/` is matched against the full ref, any
/// other against the branch name (`refs/heads/` removed); GitHub Actions
/// filter globs (`*` within a segment, `**` across).
pub(crate) fn ref_allowed(patterns: &[String], git_ref: Option<&str>) -> bool {
    if patterns.is_empty() {
        return true;
    }
    let Some(r) = git_ref else { return false };
    let branch = r.strip_prefix("refs/heads/").or_else(|| (!r.starts_with("refs/")).then_some(r));
    let full = if r.starts_with("refs/") { r.to_string() } else { format!("refs/heads/{r}") };
    patterns.iter().any(|p| {
        if p.starts_with("refs/") {
            kiln_workflow::glob_match(p, &full)
        } else {
            branch.is_some_and(|b| kiln_workflow::glob_match(p, b))
        }
    })
}

/// Evaluate the jobs' `runs-on`, `timeout` and `image` templates over the
/// run's data (spec 000 §5: the frozen definition holds their values).
pub(crate) fn render_accepted(
    wf: &mut Workflow,
    event: &str,
    git_ref: Option<&str>,
    inputs: &BTreeMap<String, String>,
    commit: &kiln_workflow::CommitContext,
) -> Result<(), String> {
    let ctx = kiln_workflow::ConditionContext { commit: commit.clone(), ..wf.expr_context(event, git_ref, inputs) };
    wf.render_accepted(&ctx)
}

/// Render the workflow's run-level concurrency group for this trigger.
pub(crate) fn run_concurrency(
    wf: &Workflow,
    event: &str,
    git_ref: Option<&str>,
    inputs: &BTreeMap<String, String>,
    commit: &kiln_workflow::CommitContext,
) -> Result<Option<RunConcurrency>, String> {
    let Some(c) = &wf.concurrency else { return Ok(None) };
    let branch = git_ref.map(|r| r.strip_prefix("refs/heads/").unwrap_or(r).to_string());
    let ctx =
        kiln_workflow::ConditionContext { branch, commit: commit.clone(), ..wf.expr_context(event, git_ref, inputs) };
    let group = kiln_workflow::render_group(&c.group, &ctx).map_err(|e| format!("concurrency group: {e}"))?;
    Ok(Some(RunConcurrency { group, cancel_in_progress: c.cancel_in_progress }))
}

/// `accept_run`, timed as the trigger's persistence (`trigger`: api,
/// retry, forge, schedule). Only decided acceptances are observed.
///
/// The run's trace (issue 19) starts here: an `accept` span, a child of
/// `parent` (the trigger's context) or of the current span, whose context
/// is frozen with the run for its attempts' claims.
pub(crate) async fn accept_timed(
    state: &AppState,
    trigger: &'static str,
    mut run: kiln_store::NewRun,
    parent: Option<TraceParent>,
) -> kiln_store::Result<kiln_store::Accepted> {
    let span = tracing::info_span!("accept", trigger, run_id = tracing::field::Empty, trace_id = tracing::field::Empty);
    run.traceparent = Some(kiln_api::trace::enter(&span, parent).to_string());
    async move {
        let started = std::time::Instant::now();
        let r = state.store.accept_run(run).await;
        if let Ok(a) = &r {
            state.metrics.trigger_persist.with_label_values(&[trigger]).observe(started.elapsed().as_secs_f64());
            tracing::Span::current().record("run_id", a.run_id.as_str());
            tracing::info!(run_id = %a.run_id, created = a.created, "accepted");
            // Run-list followers (the web UI's SSE) see the new run at once.
            state.job_changed(&a.run_id);
        }
        r
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod select_tests {
    use super::select_default;
    use kiln_api as api;

    fn wf(path: &str, triggers: &[&str], error: bool) -> api::WorkflowFile {
        api::WorkflowFile {
            path: path.into(),
            manual: triggers.is_empty() || triggers.contains(&"manual"),
            triggers: triggers.iter().map(|t| t.to_string()).collect(),
            error: error.then(|| "bad".into()),
        }
    }

    #[test]
    fn the_default_then_the_only_one_then_every_manual_one() {
        let pipeline = wf(".kiln/pipeline.yaml", &["push"], false);
        let ci = wf(".kiln/ci.yaml", &["push", "manual"], false);
        let rel = wf(".kiln/release.yaml", &["manual"], false);
        let bad = wf(".kiln/bad.yaml", &["manual"], true);
        let push = wf(".kiln/push.yaml", &["push"], false);
        let bare = wf(".kiln/bare.yaml", &[], false);
        assert_eq!(select_default(&[ci.clone(), pipeline.clone()]), vec![".kiln/pipeline.yaml"]);
        assert_eq!(select_default(std::slice::from_ref(&push)), vec![".kiln/push.yaml"], "the only one");
        assert_eq!(
            select_default(&[ci.clone(), rel.clone(), bad, push.clone()]),
            vec![".kiln/ci.yaml", ".kiln/release.yaml"]
        );
        assert!(select_default(&[push, bare]).is_empty(), "no `on:` is not a declared `manual`: pick one");
        assert!(select_default(&[]).is_empty());
    }
}
