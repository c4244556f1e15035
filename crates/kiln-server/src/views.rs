//! Store records → wire types of the contract.

use kiln_api as api;
use kiln_store::{BoundArtifact, RunSummaryRecord, RunView};

pub fn run(v: &RunView, bindings: &[BoundArtifact]) -> api::Run {
    let r = &v.run;
    api::Run {
        id: r.id.clone(),
        repo: r.repo_name.clone(),
        number: r.number,
        workflow: workflow_name(&r.workflow_path),
        commit_title: r.commit_title.clone(),
        pull_request: pull_request(r.git_ref.as_deref(), &r.event, r.pull_request_title.as_deref()),
        status: r.status.into(),
        commit_sha: r.commit_sha.clone(),
        event: r.event.clone(),
        git_ref: r.git_ref.clone(),
        trust: r.trust.clone(),
        actor: r.actor.clone(),
        workflow_path: r.workflow_path.clone(),
        workflow_hash: r.workflow_hash.clone(),
        inputs: r.inputs.clone(),
        parent_run_id: r.parent_run_id.clone(),
        cancel_version: r.cancel_version,
        created_at_ms: r.created_at,
        finished_at_ms: r.finished_at,
        message: waiting_for_release(v).or_else(|| r.message.clone()),
        commit_url: None,
        commit: None,
        trace_id: r.traceparent.as_deref().and_then(kiln_api::trace::TraceParent::parse).map(|t| t.trace_id_hex()),
        priority: r.priority.clone(),
        team: r.team.clone(),
        jobs: v
            .jobs
            .iter()
            .map(|j| api::Job {
                id: j.job.id.clone(),
                name: j.job.name.clone(),
                index: j.job.index,
                status: j.job.status.into(),
                current_epoch: j.job.current_epoch,
                image_digest: j.job.image_digest.clone(),
                needs: j.job.needs.clone(),
                attempts: j
                    .attempts
                    .iter()
                    .map(|a| api::Attempt {
                        epoch: a.epoch,
                        runner: a.runner.clone(),
                        outcome: a.outcome.into(),
                        exit_code: a.exit_code,
                        message: a.message.clone(),
                        started_at_ms: a.started_at,
                        finished_at_ms: a.finished_at,
                        steps: a.steps.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default(),
                        failure_class: a.failure_class.map(|c| c.as_str().to_string()),
                        released_at_ms: a.released_at,
                        release: a.release_evidence.clone(),
                        cleanup_error: a.cleanup_error.clone(),
                    })
                    .collect(),
                artifacts: bindings
                    .iter()
                    .filter(|b| b.job_id == j.job.id)
                    .map(|b| api::Artifact {
                        name: b.name.clone(),
                        size: b.generation.expected_size,
                        sha256: b.generation.expected_sha256.clone(),
                        epoch: b.generation.epoch,
                        kind: b.generation.kind.clone(),
                        expires_at: b.expires_at,
                        expired: b.expired_at.is_some(),
                    })
                    .collect(),
                cache: j.job.cache_result.as_deref().and_then(|t| serde_json::from_str(t).ok()),
                message: j.job.message.clone(),
                waiting: None,
                started_at_ms: j.job.started_at,
                finished_at_ms: j.job.finished_at,
                outputs: Default::default(),
                environment: usize::try_from(j.job.index)
                    .ok()
                    .and_then(|i| r.definition.jobs.get(i))
                    .and_then(|d| d.environment.as_ref())
                    .map(|e| e.name.clone()),
            })
            .collect(),
    }
}

/// A cancelling run with nothing left running waits for a fenced
/// attempt's agent to confirm its sandbox is gone (issue 40, item 5): say
/// which agent, and how the wait ends.
fn waiting_for_release(v: &RunView) -> Option<String> {
    if v.run.status != kiln_core::RunStatus::Cancelling || v.jobs.iter().any(|j| !j.job.status.is_terminal()) {
        return None;
    }
    let a = v
        .jobs
        .iter()
        .flat_map(|j| &j.attempts)
        .find(|a| a.outcome == kiln_core::AttemptOutcome::Lost && a.released_at.is_none())?;
    Some(format!(
        "cancelling: waiting for agent {} to confirm its sandbox is gone (its lease lapsed, so nothing it sends is \
         accepted; `kiln agent remove` of a machine that is gone for good ends the wait)",
        a.runner
    ))
}

pub fn summary(r: &RunSummaryRecord) -> api::RunSummary {
    api::RunSummary {
        id: r.id.clone(),
        short_id: None,
        repo: r.repo_name.clone(),
        number: r.number,
        workflow: workflow_name(&r.workflow_path),
        commit_title: r.commit_title.clone(),
        pull_request: pull_request(r.git_ref.as_deref(), &r.event, r.pull_request_title.as_deref()),
        workflow_path: r.workflow_path.clone(),
        status: r.status.into(),
        commit_sha: r.commit_sha.clone(),
        event: r.event.clone(),
        git_ref: r.git_ref.clone(),
        trust: r.trust.clone(),
        actor: r.actor.clone(),
        created_at_ms: r.created_at,
        finished_at_ms: r.finished_at,
    }
}

/// A workflow's name as lists show it: its file name without
/// `.yml`/`.yaml` (`ci` for `.kiln/workflows/ci.yml`).
pub fn workflow_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".yml").or_else(|| file.strip_suffix(".yaml")).unwrap_or(file).to_string()
}

/// The name an actor is shown by: `admin` for the bootstrap `admin.token`;
/// anything else as stored (a forge user, `schedule`). An API token's
/// `token:ID` is named by [`crate::services::runs`], which reads the
/// token's name.
pub fn actor_shown(stored: &str) -> Option<&'static str> {
    (stored == crate::auth::ADMIN_ACTOR).then_some("admin")
}

/// A pull request run's number (from its ref, `refs/pull/N/…`) and title;
/// a retry of one keeps both.
pub fn pull_request(git_ref: Option<&str>, event: &str, title: Option<&str>) -> Option<api::PullRequestRef> {
    let number = git_ref?.strip_prefix("refs/pull/")?.split('/').next()?.parse().ok()?;
    (event == "pull_request" || title.is_some())
        .then(|| api::PullRequestRef { number, title: title.unwrap_or_default().to_string() })
}
