//! Cancellation serialized with completion (spec 000 §9, §15 "cancel races
//! with success"; invariant 5).

use super::*;
use kiln_core::RunStatus;

/// Completion commits first: cancellation observes the committed result.
pub async fn cancel_after_success_is_a_no_op<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    let before = view(s, &run_id).await;
    assert_eq!(before.run.status, RunStatus::Success);

    let r = s.cancel_run(&run_id).await.unwrap();
    assert_eq!(r.status, RunStatus::Success);
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Success);
    assert_eq!(v.run.finished_at, before.run.finished_at);
    assert_eq!(jv(&v, "build").job.status, JobStatus::Success);
    assert_eq!(outcomes(jv(&v, "build")), [AttemptOutcome::Success]);
}

/// Cancellation commits first: the late completion is rejected.
pub async fn cancel_before_completion_rejects_late_success<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;

    let r = s.cancel_run(&run_id).await.unwrap();
    assert_eq!(r.status, RunStatus::Cancelling, "an attempt is still running");
    assert!(r.cancel_version > 0);
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Cancelling);
    assert_eq!(v.run.finished_at, None);
    assert_eq!(jv(&v, "build").job.status, JobStatus::Running);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Cancelled);
    // Cancelling again changes nothing.
    let again = s.cancel_run(&run_id).await.unwrap();
    assert_eq!((again.status, again.cancel_version), (RunStatus::Cancelling, r.cancel_version));

    // The agent learns about it on its next heartbeat.
    let hb = s.heartbeat(&build, 1, LONG_TTL).await.unwrap();
    assert!(hb.cancel_requested);

    assert_conflict(s.complete(&build, 1, success()).await);
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(outcomes(b), [AttemptOutcome::Cancelled]);
    assert_eq!(b.job.status, JobStatus::Cancelled);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Cancelled);
    assert!(jv(&v, "test").attempts.is_empty());
    assert_eq!(v.run.status, RunStatus::Cancelled);
    assert!(v.run.finished_at.is_some());
    // No successor became ready.
    assert!(pending_for(s, &test).await.is_empty());
    assert!(!s.ready_jobs().await.unwrap().iter().any(|e| e.job_id == test));
    // Late reports of the cancelled attempt are stale now.
    assert_stale(s.complete(&build, 1, success()).await);
    assert_stale(s.heartbeat(&build, 1, LONG_TTL).await);
}

pub async fn cancel_of_queued_run_cancels_everything<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let r = s.cancel_run(&run_id).await.unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    assert!(r.cancel_version > 0);
    assert!(r.finished_at.is_some());
    let v = view(s, &run_id).await;
    assert!(v.jobs.iter().all(|j| j.job.status == JobStatus::Cancelled), "{:?}", statuses(&v));
    assert!(s.ready_jobs().await.unwrap().iter().all(|e| v.jobs.iter().all(|j| j.job.id != e.job_id)));
    assert!(matches!(s.cancel_run("no-such-run").await, Err(StoreError::NotFound(_))));
}

pub async fn cancel_with_lost_agent_resolves_on_fence<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 3)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, SHORT_TTL).await;
    assert_eq!(s.cancel_run(&run_id).await.unwrap().status, RunStatus::Cancelling);
    expire(SHORT_TTL).await;
    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(outcomes(b), [AttemptOutcome::Lost]);
    // No replacement is authorized in a cancelled run, whatever the budget.
    assert_eq!(b.job.status, JobStatus::Cancelled);
    assert_eq!(b.job.current_epoch, 1);
    assert_eq!(v.run.status, RunStatus::Cancelled);
}
