//! Store records → wire types of the contract.

use kiln_api as api;
use kiln_store::{BoundArtifact, RunSummaryRecord, RunView};

pub fn run(v: &RunView, bindings: &[BoundArtifact]) -> api::Run {
    let r = &v.run;
    api::Run {
        id: r.id.clone(),
        repo: r.repo_name.clone(),
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
