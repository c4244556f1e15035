//! Telling agents to stop attempts now rather than at their next heartbeat
//! (spec 000 §9): a cancel notice goes to the session holding each running
//! attempt whose job was asked to stop. Advisory only — the heartbeat's
//! `cancel_requested` remains the authority.

use crate::state::{AppState, CancelEvent};
use kiln_core::{AttemptOutcome, JobStatus};
use kiln_store::RunView;

/// Send a notice for every running attempt of `view` that `wanted` selects,
/// and wake the SSE followers of every job of the run.
fn notify(state: &AppState, view: &RunView, wanted: impl Fn(&kiln_store::JobView) -> bool) {
    for j in view.jobs.iter().filter(|j| wanted(j)) {
        if let Some(a) = j.attempts.iter().find(|a| a.outcome == AttemptOutcome::Running) {
            let _ = state.cancel_events.send(CancelEvent {
                session: a.session_id.clone(),
                job_id: j.job.id.clone(),
                epoch: a.epoch,
            });
        }
    }
}

/// After a run was cancelled: every running attempt stops; every job's
/// followers see the change.
pub(crate) fn run_cancelled(state: &AppState, view: &RunView) {
    for j in &view.jobs {
        state.job_changed(&j.job.id);
    }
    notify(state, view, |_| true);
}

/// After jobs of a run were cancelled one by one (issue 42): the running
/// ones among `jobs` stop; every job's followers see the change.
pub(crate) fn jobs_cancelled(state: &AppState, view: &RunView, jobs: &[String]) {
    for j in &view.jobs {
        state.job_changed(&j.job.id);
    }
    notify(state, view, |j| jobs.contains(&j.job.id) && j.job.cancel_requested && j.job.status == JobStatus::Running);
}

/// After a job of `job_id`'s run failed, fail-fast may have asked running
/// matrix siblings to stop: tell their agents.
pub(crate) async fn stopped_siblings(state: &AppState, job_id: &str) {
    let Ok(job) = state.store.get_job(job_id).await else { return };
    let Ok(view) = state.store.get_run(&job.run_id).await else { return };
    notify(state, &view, |j| j.job.cancel_requested && j.job.status == JobStatus::Running);
}
