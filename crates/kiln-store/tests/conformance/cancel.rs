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

/// Issue 40, item 5 (spec 000 §9, §15: a timeout alone cannot certify that
/// execution ended): the lapsed lease fences the attempt (nothing it sends
/// is accepted, no replacement in a cancelled run), but the run stays
/// `cancelling` until the agent confirms its sandbox is gone.
pub async fn cancel_with_lost_agent_waits_for_its_release<S: Store + 'static>(o: &Opener<S>) {
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
    assert_eq!(b.attempts[0].released_at, None, "a lapsed lease confirms nothing");
    // No replacement is authorized in a cancelled run, whatever the budget.
    assert_eq!(b.job.status, JobStatus::Cancelled);
    assert_eq!(b.job.current_epoch, 1);
    assert_eq!(v.run.status, RunStatus::Cancelling, "waiting for the agent to confirm");
    assert_eq!(v.run.finished_at, None);
    // Fenced: nothing it sends is accepted; cancelling again changes nothing.
    assert_stale(s.complete(&build, 1, success()).await);
    assert_stale(s.heartbeat(&build, 1, LONG_TTL).await);
    assert_eq!(s.cancel_run(&run_id).await.unwrap().status, RunStatus::Cancelling);

    let end = SandboxEnd { evidence: "every process group was killed".into(), cleanup_error: Some("rm: busy".into()) };
    assert!(s.release_attempt(&build, 1, end.clone()).await.unwrap());
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Cancelled);
    assert!(v.run.finished_at.is_some());
    let att = &jv(&v, "build").attempts[0];
    assert!(att.released_at.is_some());
    assert_eq!(att.release_evidence.as_deref(), Some("every process group was killed"));
    assert_eq!(att.cleanup_error.as_deref(), Some("rm: busy"), "a failed cleanup is visible on the attempt");
    // A second report changes nothing; an unknown attempt is not found.
    assert!(!s.release_attempt(&build, 1, end.clone()).await.unwrap());
    assert!(matches!(s.release_attempt(&build, 7, end).await, Err(StoreError::NotFound(_))));
}

/// A running attempt is confirmed by its completion, not by a release; the
/// completion records the agent's evidence and cleanup trouble.
pub async fn a_completion_records_how_the_sandbox_ended<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let end = SandboxEnd { evidence: "the job's container was killed and removed".into(), cleanup_error: None };
    assert!(matches!(s.release_attempt(&build, 1, end.clone()).await, Err(StoreError::Conflict(_))));
    assert_eq!(s.complete(&build, 1, CompletionInput { sandbox: Some(end), ..success() }).await.unwrap(), "success");
    let v = view(s, &run_id).await;
    let att = &jv(&v, "build").attempts[0];
    assert!(att.released_at.is_some());
    assert_eq!(att.release_evidence.as_deref(), Some("the job's container was killed and removed"));
    assert_eq!(att.cleanup_error, None);
}

/// The agent's removal (the operator says the machine is gone), or the same
/// agent starting again after removing what its previous process left,
/// ends the wait; a restart of another agent does not.
pub async fn removal_or_a_fresh_start_of_the_agent_ends_the_wait<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, r1) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let (_, r2) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let b = agent(s, "b", 4).await;
    let (j1, j2) = (job_id(s, &r1, "build").await, job_id(s, &r2, "build").await);
    claim(s, &a, &j1, SHORT_TTL).await;
    claim(s, &b, &j2, SHORT_TTL).await;
    s.cancel_run(&r1).await.unwrap();
    s.cancel_run(&r2).await.unwrap();
    expire(SHORT_TTL).await;
    assert_eq!(s.fence_expired().await.unwrap().len(), 2);
    assert_eq!(view(s, &r1).await.run.status, RunStatus::Cancelling);
    assert_eq!(view(s, &r2).await.run.status, RunStatus::Cancelling);

    // Another agent named `c` starting fresh confirms nothing of `a`'s.
    let c = agent(s, "c", 4).await;
    assert_eq!(s.release_predecessors(&c.id).await.unwrap(), 0);
    assert_eq!(view(s, &r1).await.run.status, RunStatus::Cancelling);
    // `a` started again (a new registration of the same name and pool).
    let a2 = agent(s, "a", 4).await;
    assert_eq!(s.release_predecessors(&a2.id).await.unwrap(), 1);
    let v = view(s, &r1).await;
    assert_eq!(v.run.status, RunStatus::Cancelled);
    let why = jv(&v, "build").attempts[0].release_evidence.clone().unwrap_or_default();
    assert!(why.contains("started again"), "{why}");
    assert_eq!(s.release_predecessors(&a2.id).await.unwrap(), 0, "once");

    // `b` is removed: its run is cancelled now.
    assert!(s.remove_agent(&b.id).await.unwrap());
    let v = view(s, &r2).await;
    assert_eq!(v.run.status, RunStatus::Cancelled);
    assert_eq!(jv(&v, "build").attempts[0].release_evidence.as_deref(), Some("its agent was removed"));
}

/// An attempt lost before the cancel (its job retried and waiting) keeps a
/// cancelled-with-nothing-running run cancelling too; one removed while it
/// ran is not waited for once fenced.
pub async fn a_cancel_waits_for_an_attempt_lost_before_it<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 3)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, SHORT_TTL).await;
    expire(SHORT_TTL).await;
    assert_eq!(s.fence_expired().await.unwrap().len(), 1);
    assert_eq!(s.get_job(&build).await.unwrap().status, JobStatus::Ready, "retried");
    assert_eq!(s.cancel_run(&run_id).await.unwrap().status, RunStatus::Cancelling, "nothing runs, one unconfirmed");
    assert_eq!(jv(&view(s, &run_id).await, "build").job.status, JobStatus::Cancelled);
    let end = SandboxEnd { evidence: "gone".into(), cleanup_error: None };
    assert!(s.release_attempt(&build, 1, end).await.unwrap());
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Cancelled);

    // Removed while running: fenced and not waited for.
    let (_, r2) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let b = agent(s, "b", 4).await;
    let j2 = job_id(s, &r2, "build").await;
    claim(s, &b, &j2, LONG_TTL).await;
    s.cancel_run(&r2).await.unwrap();
    assert!(s.remove_agent(&b.id).await.unwrap());
    assert_eq!(s.fence_expired().await.unwrap().len(), 1);
    let v = view(s, &r2).await;
    assert_eq!(v.run.status, RunStatus::Cancelled);
    assert_eq!(jv(&v, "build").attempts[0].release_evidence.as_deref(), Some("its agent was removed"));
}

/// Issue 42: cancelling one waiting job cancels it at once; what needs it
/// is skipped, the other jobs go on, and the run ends failed. An ended job,
/// or a job of an ended run, is a conflict.
pub async fn cancelling_one_job_lets_the_run_go_on<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) =
        start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0), job("docs", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    let docs = job_id(s, &run_id, "docs").await;
    let j = s.cancel_job(&test).await.unwrap();
    assert_eq!(j.status, JobStatus::Cancelled, "a pending job is cancelled at once");
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Queued, "the run goes on");
    // Cancelling it again is refused: it has ended.
    assert_conflict(s.cancel_job(&test).await);
    claim(s, &a, &build, LONG_TTL).await;
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "docs").job.status, JobStatus::Ready, "the other dependent runs");
    assert!(jv(&v, "test").attempts.is_empty());
    claim(s, &a, &docs, LONG_TTL).await;
    assert_eq!(s.complete(&docs, 1, success()).await.unwrap(), "success");
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Failed, "a cancelled job fails its run: {:?}", statuses(&v));
    assert_conflict(s.cancel_job(&docs).await);
}

/// Issue 42: cancelling a running job asks its attempt to stop (the
/// heartbeat says so); its completion, even a success, binds nothing and
/// ends the job cancelled; its dependents are skipped.
pub async fn cancelling_a_running_job_stops_it_and_binds_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) =
        start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0), job("lint", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let lint = job_id(s, &run_id, "lint").await;
    claim(s, &a, &build, LONG_TTL).await;
    let j = s.cancel_job(&build).await.unwrap();
    assert_eq!(j.status, JobStatus::Running, "running until its attempt ends");
    assert!(j.cancel_requested);
    // Asking again changes nothing.
    assert_eq!(s.cancel_job(&build).await.unwrap().status, JobStatus::Running);
    assert!(s.heartbeat(&build, 1, LONG_TTL).await.unwrap().cancel_requested, "the agent is told to stop");
    assert_conflict(s.complete(&build, 1, success()).await);
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(outcomes(b), [AttemptOutcome::Cancelled]);
    assert_eq!(b.job.status, JobStatus::Cancelled);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Running, "lint still to run");
    claim(s, &a, &lint, LONG_TTL).await;
    assert_eq!(s.complete(&lint, 1, success()).await.unwrap(), "success");
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Failed);
}
