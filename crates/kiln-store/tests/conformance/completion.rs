//! The completion transaction: success, failure, retry budgets (spec 000 §8,
//! §9; invariants 3, 5, 6).

use super::*;
use kiln_core::RunStatus;
use kiln_core::backoff::DEFAULT_INFRA_RETRIES;

pub async fn success_readies_successor_and_finishes_run<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    assert!(pending_for(s, &test).await.is_empty());

    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    // Committed together with the success: the successor is ready and its
    // dispatch event is in the outbox.
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Success);
    assert!(b.job.finished_at.is_some());
    assert_eq!(outcomes(b), [AttemptOutcome::Success]);
    assert_eq!(b.attempts[0].exit_code, Some(0));
    assert!(b.attempts[0].finished_at.is_some());
    let t = jv(&v, "test");
    assert_eq!(t.job.status, JobStatus::Ready);
    let events = pending_for(s, &test).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].dispatch_generation, t.job.dispatch_generation);
    assert_eq!(v.run.status, RunStatus::Running, "a job is left");
    assert_eq!(v.run.finished_at, None);

    // The relay delivers the event; the last job succeeds; so does the run.
    let c = try_claim(s, &a, &test, events[0].dispatch_generation, LONG_TTL).await.expect("claim successor");
    assert_eq!(c.epoch, 1);
    // With the team whose slot the attempt held, and for how long.
    let done = s.complete_held(&test, 1, success()).await.unwrap();
    let v = view(s, &run_id).await;
    let att = &jv(&v, "test").attempts[0];
    let held = att.finished_at.unwrap() - att.started_at;
    assert_eq!(done, Completed { status: "success".into(), team: v.run.team.clone(), held_ms: Some(held) });
    assert_eq!(v.run.status, RunStatus::Success);
    assert!(v.run.finished_at.is_some());
    assert!(v.jobs.iter().all(|j| j.job.status == JobStatus::Success));
}

pub async fn successor_waits_for_every_need<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![job("build", &[], 0), job("lint", &[], 0), job("deploy", &["build", "lint"], 0)]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let [build, lint, deploy] =
        [job_id(s, &run_id, "build").await, job_id(s, &run_id, "lint").await, job_id(s, &run_id, "deploy").await];
    claim(s, &a, &build, LONG_TTL).await;
    claim(s, &a, &lint, LONG_TTL).await;
    s.complete(&build, 1, success()).await.unwrap();
    assert_eq!(job_status(s, &deploy).await, JobStatus::Pending);
    assert!(pending_for(s, &deploy).await.is_empty());
    assert!(try_claim(s, &a, &deploy, 1, LONG_TTL).await.is_none());
    s.complete(&lint, 1, success()).await.unwrap();
    assert_eq!(job_status(s, &deploy).await, JobStatus::Ready);
    assert_eq!(pending_for(s, &deploy).await.len(), 1);
}

pub async fn stale_completion_changes_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;

    let before = snapshot(s, &run_id).await;
    assert_stale(s.complete(&build, 0, success()).await);
    assert_stale(s.complete(&build, 2, success()).await);
    assert_stale(s.complete(&build, 2, failure(1)).await);
    assert_eq!(snapshot(s, &run_id).await, before);

    s.complete(&build, 1, success()).await.unwrap();
    // A duplicate or contradicting report for the finished epoch is stale too.
    let after = snapshot(s, &run_id).await;
    assert_stale(s.complete(&build, 1, success()).await);
    assert_stale(s.complete(&build, 1, failure(1)).await);
    assert_stale(s.heartbeat(&build, 1, LONG_TTL).await);
    assert_eq!(snapshot(s, &run_id).await, after);
    assert!(s.complete("no-such-job", 1, success()).await.is_err());
}

pub async fn failure_without_retry_fails_and_skips_downstream<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![
        job("build", &[], 0),
        job("docs", &[], 0),
        job("test", &["build"], 0),
        job("package", &["test"], 0),
    ]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let [build, docs, test, package] = [
        job_id(s, &run_id, "build").await,
        job_id(s, &run_id, "docs").await,
        job_id(s, &run_id, "test").await,
        job_id(s, &run_id, "package").await,
    ];
    claim(s, &a, &docs, LONG_TTL).await;
    claim(s, &a, &build, LONG_TTL).await;

    assert_eq!(s.complete(&build, 1, failure(2)).await.unwrap(), "failed");
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Failed);
    assert_eq!(outcomes(b), [AttemptOutcome::Failed]);
    assert_eq!(b.attempts[0].exit_code, Some(2));
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(jv(&v, "package").job.status, JobStatus::Skipped, "skips propagate transitively");
    assert_eq!(jv(&v, "docs").job.status, JobStatus::Running);
    assert_eq!(v.run.status, RunStatus::Running, "the run waits for running jobs");
    assert_eq!(b.job.current_epoch, 1, "no retry was authorized");

    s.complete(&docs, 1, success()).await.unwrap();
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Failed);
    assert!(v.run.finished_at.is_some());
    // The successors never became ready.
    for j in [&test, &package] {
        assert!(pending_for(s, j).await.is_empty());
        assert!(!s.ready_jobs().await.unwrap().iter().any(|e| &e.job_id == j));
        let jv = v.jobs.iter().find(|x| &x.job.id == j).unwrap();
        assert!(jv.attempts.is_empty());
        assert!(try_claim(s, &a, j, 1, LONG_TTL).await.is_none());
    }
}

pub async fn failure_with_retry_is_claimable_after_backoff<S: Store + 'static>(o: &Opener<S>) {
    const BACKOFF_MS: u64 = 400;
    let fx = o.open(Backoff { base_ms: BACKOFF_MS, max_ms: BACKOFF_MS }).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 1), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let c1 = claim(s, &a, &build, LONG_TTL).await;

    assert_eq!(s.complete(&build, 1, failure(1)).await.unwrap(), "ready");
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Ready);
    assert_eq!(outcomes(b), [AttemptOutcome::Failed]);
    assert!(b.job.dispatch_generation > c1.job.dispatch_generation);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Pending);
    assert_eq!(v.run.status, RunStatus::Running);
    // The retry waits for its backoff (jitter within [ceiling/2, ceiling]).
    let finished = b.attempts[0].finished_at.unwrap();
    let at = b.job.next_attempt_at.expect("next_attempt_at is set");
    assert!(at >= finished + BACKOFF_MS as i64 / 2, "retry at {at}, failed at {finished}");
    assert!(at <= finished + BACKOFF_MS as i64 + 1000);
    let generation = b.job.dispatch_generation;
    if wall_ms() < at - 50 {
        assert!(try_claim(s, &a, &build, generation, LONG_TTL).await.is_none(), "claimed before next_attempt_at");
        assert!(
            !pending_for(s, &build).await.iter().any(|e| e.dispatch_generation == generation),
            "the retry event is not yet available"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis((at - wall_ms()).max(0) as u64 + 50)).await;
    let events = pending_for(s, &build).await;
    assert!(events.iter().any(|e| e.dispatch_generation == generation), "the retry event is available");
    let c2 = try_claim(s, &a, &build, generation, LONG_TTL).await.expect("claim after next_attempt_at");
    assert_eq!(c2.epoch, 2);

    // The budget (retry: 1) is spent: the second failure is final.
    assert_eq!(s.complete(&build, 2, failure(1)).await.unwrap(), "failed");
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Failed);
    assert_eq!(outcomes(b), [AttemptOutcome::Failed, AttemptOutcome::Failed]);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Failed);
}

pub async fn retried_job_that_succeeds_unblocks_successor<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 1), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    assert_eq!(s.complete(&build, 1, failure(1)).await.unwrap(), "ready");
    assert_eq!(job_status(s, &test).await, JobStatus::Pending);
    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    let v = view(s, &run_id).await;
    assert_eq!(outcomes(jv(&v, "build")), [AttemptOutcome::Failed, AttemptOutcome::Success]);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Ready);
}

pub async fn infra_failures_retry_up_to_the_default_budget<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    // retry: 0 — deterministic failures are not retried, infrastructure ones are.
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let total = DEFAULT_INFRA_RETRIES as i64 + 1;
    for epoch in 1..=total {
        assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, epoch);
        let want = if epoch < total { "ready" } else { "failed" };
        assert_eq!(s.complete(&build, epoch, infra_failure()).await.unwrap(), want, "epoch {epoch}");
    }
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Failed);
    assert_eq!(outcomes(b), vec![AttemptOutcome::Failed; total as usize]);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Failed);
    assert!(try_claim(s, &a, &build, b.job.dispatch_generation, LONG_TTL).await.is_none());
}

/// `retry: {max, on, exit_codes}` (issue 18): each failed attempt records
/// its class; only the listed classes (and exit codes) are retried, up to
/// `max` shared by the job's own classes; infrastructure keeps its default
/// allowance; `cancelled` is never retried.
pub async fn retry_policy_follows_failure_classes<S: Store + 'static>(o: &Opener<S>) {
    use kiln_core::failure::FailureClass::{self, *};
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let policy = |name: &str, max: u32, on: &[&str], codes: &[i32]| Job {
        retry_on: on.iter().map(|c| c.to_string()).collect(),
        retry_exit_codes: codes.to_vec(),
        needs: vec![],
        ..job(name, &[], max)
    };
    let jobs = vec![
        // Timeouts retried; a plain step failure is final.
        policy("timeouts", 2, &["timeout"], &[]),
        // Only exit code 75 of a step failure.
        policy("codes", 3, &["step_failed"], &[75]),
        // `retry: 1`: the job's own classes share one retry.
        job("shared", &[], 1),
        // A lost agent is retried even if `on` does not name it.
        policy("lost", 1, &["hang"], &[]),
    ];
    let mut wf = workflow(jobs);
    for j in &mut wf.jobs {
        j.needs.clear();
    }
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 8).await;
    let fail = |class: Option<FailureClass>, code: Option<i32>| CompletionInput {
        exit_code: code,
        failure_class: class,
        ..failure(code.unwrap_or(1))
    };
    let step = |code: i32| fail(None, Some(code));
    // (job, [(what its attempt reports, the job's status after, the class recorded)])
    type Step<'a> = (CompletionInput, &'a str, FailureClass);
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "timeouts",
            vec![
                (fail(Some(Timeout), Some(124)), "ready", Timeout),
                (fail(Some(Timeout), Some(124)), "ready", Timeout),
                (fail(Some(Timeout), Some(124)), "failed", Timeout),
            ],
        ),
        (
            "codes",
            vec![(step(75), "ready", StepFailed), (step(75), "ready", StepFailed), (step(1), "failed", StepFailed)],
        ),
        ("shared", vec![(fail(Some(Hang), Some(124)), "ready", Hang), (step(2), "failed", StepFailed)]),
        (
            "lost",
            vec![
                (fail(Some(Infra), None), "ready", Infra),
                (fail(Some(Hang), Some(124)), "ready", Hang),
                (fail(Some(Infra), None), "ready", Infra),
                (fail(Some(Infra), None), "failed", Infra),
            ],
        ),
    ];
    for (name, steps) in cases {
        let id = job_id(s, &run_id, name).await;
        let mut want_classes = vec![];
        for (epoch, (input, want, class)) in (1..).zip(steps) {
            assert_eq!(claim(s, &a, &id, LONG_TTL).await.epoch, epoch, "{name}");
            assert_eq!(s.complete(&id, epoch, input).await.unwrap(), want, "{name}: epoch {epoch}");
            want_classes.push(Some(class));
        }
        let v = view(s, &run_id).await;
        let classes: Vec<_> = jv(&v, name).attempts.iter().map(|a| a.failure_class).collect();
        assert_eq!(classes, want_classes, "{name}: the classes recorded on the attempts");
    }
    // A success records no class; a lost lease records `agent_lost`.
    let (_, run2) = start(s, workflow(vec![job("once", &[], 0)])).await;
    let once = job_id(s, &run2, "once").await;
    claim(s, &a, &once, 50).await;
    expire(50).await;
    s.fence_expired().await.unwrap();
    assert_eq!(claim(s, &a, &once, LONG_TTL).await.epoch, 2);
    assert_eq!(s.complete(&once, 2, success()).await.unwrap(), "success");
    let v = view(s, &run2).await;
    let classes: Vec<_> = jv(&v, "once").attempts.iter().map(|a| a.failure_class).collect();
    assert_eq!(classes, [Some(AgentLost), None]);
}

/// The queue timeout's store side: only ready jobs claimable for longer
/// than the wait are overdue; failing one skips its dependents and ends
/// the run; a job claimed meanwhile is not failed.
pub async fn overdue_ready_jobs_fail_and_their_runs_end<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let (_, other) = start(s, workflow(vec![job("solo", &[], 0)])).await;
    let build = job_id(s, &run_id, "build").await;
    let solo = job_id(s, &other, "solo").await;
    assert!(s.overdue_jobs(60_000, 10).await.unwrap().is_empty(), "nothing waited a minute");
    expire(50).await;
    let overdue: Vec<String> = s.overdue_jobs(20, 10).await.unwrap().into_iter().map(|(id, _)| id).collect();
    assert!(overdue.contains(&build) && overdue.contains(&solo), "{overdue:?}");
    let a = agent(s, "a", 4).await;
    claim(s, &a, &solo, LONG_TTL).await;
    assert!(!s.fail_overdue_job(&solo, 20, "queue timeout").await.unwrap(), "claimed meanwhile");
    assert!(!s.fail_overdue_job(&build, 60_000, "queue timeout").await.unwrap(), "not overdue for that wait");
    assert!(s.fail_overdue_job(&build, 20, "queue timeout: nobody came").await.unwrap());
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "build").job.status, JobStatus::Failed);
    assert_eq!(jv(&v, "build").job.message.as_deref(), Some("queue timeout: nobody came"));
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Failed);
    assert!(!s.fail_overdue_job(&build, 20, "again").await.unwrap());
    assert_eq!(job_status(s, &solo).await, JobStatus::Running);
}

/// The last needs of a fan-in complete at the same moment: whichever commits
/// last sees every other one, so the joining job becomes ready exactly once
/// and the run finishes. (On PostgreSQL completions of a run without
/// concurrency groups run at READ COMMITTED, ordered by the run lock.)
pub async fn concurrent_completions_ready_a_fan_in_once<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let names: Vec<String> = (0..12).map(|i| format!("part{i}")).collect();
    let needs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut jobs: Vec<Job> = names.iter().map(|n| job(n, &[], 0)).collect();
    jobs.push(job("join", &needs, 0));
    let (_, run_id) = start(&**s, workflow(jobs)).await;
    let a = agent(&**s, "a", 16).await;
    let mut ids = vec![];
    for n in &names {
        let id = job_id(&**s, &run_id, n).await;
        claim(&**s, &a, &id, LONG_TTL).await;
        ids.push(id);
    }
    let tasks: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let s = s.clone();
            tokio::spawn(async move { s.complete(&id, 1, success()).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().expect("every sibling completes"), "success");
    }
    let join = job_id(&**s, &run_id, "join").await;
    let v = view(&**s, &run_id).await;
    assert_eq!((jv(&v, "join").job.status, jv(&v, "join").job.dispatch_generation), (JobStatus::Ready, 1));
    assert_eq!(pending_for(&**s, &join).await.len(), 1, "one dispatch event for the join");
    claim(&**s, &a, &join, LONG_TTL).await;
    assert_eq!(s.complete(&join, 1, success()).await.unwrap(), "success");
    assert_eq!(view(&**s, &run_id).await.run.status, RunStatus::Success);
}

/// A completion racing the run's cancellation: one of them commits first
/// and the other sees it. Either the job succeeded (and the cancellation
/// found nothing left to stop) or the completion is refused and the job is
/// cancelled; never a success recorded inside a cancelled run's running job.
pub async fn completion_racing_cancellation_is_one_or_the_other<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let a = agent(&**s, "a", 64).await;
    let mut runs = vec![];
    for _ in 0..16 {
        let (_, run_id) = start(&**s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
        let build = job_id(&**s, &run_id, "build").await;
        claim(&**s, &a, &build, LONG_TTL).await;
        runs.push((run_id, build));
    }
    let tasks: Vec<_> = runs
        .iter()
        .map(|(run_id, build)| {
            let (s1, s2, run_id, build) = (s.clone(), s.clone(), run_id.clone(), build.clone());
            let done = tokio::spawn(async move { s1.complete(&build, 1, success()).await });
            let cancel = tokio::spawn(async move { s2.cancel_run(&run_id).await });
            (done, cancel)
        })
        .collect();
    for ((run_id, _), (done, cancel)) in runs.iter().zip(tasks) {
        let done = done.await.unwrap();
        cancel.await.unwrap().expect("cancellation is accepted");
        let v = view(&**s, run_id).await;
        let (b, t) = (jv(&v, "build"), jv(&v, "test"));
        match done {
            Ok(st) => {
                assert_eq!(st, "success");
                assert_eq!(b.job.status, JobStatus::Success);
                assert_eq!(outcomes(b), [AttemptOutcome::Success]);
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Conflict(_)), "{e:?}");
                assert_eq!(b.job.status, JobStatus::Cancelled, "{v:#?}");
                assert_eq!(outcomes(b), [AttemptOutcome::Cancelled]);
            }
        }
        // Either way nothing is left to run: the successor is decided and the
        // run is cancelled.
        assert!(t.job.status.is_terminal(), "{v:#?}");
        assert_ne!(t.job.status, JobStatus::Success);
        assert_eq!(v.run.status, RunStatus::Cancelled, "{v:#?}");
    }
}

/// The run timeout's store side: only unfinished runs past their frozen
/// `timeout` are overdue; timing one out cancels its waiting jobs, asks its
/// running attempt to stop (the run stays cancelling until it ends), says
/// why, and happens once; a run that finished in time is never overdue.
pub async fn runs_past_their_deadline_are_cancelled_once<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let timed = |mut w: Workflow| {
        w.timeout_secs = Some(1);
        w
    };
    let (_, late) = start(s, timed(workflow(vec![job("build", &[], 0), job("test", &["build"], 0)]))).await;
    let (_, quick) = start(s, timed(workflow(vec![job("solo", &[], 0)]))).await;
    let (_, unbounded) = start(s, workflow(vec![job("free", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &late, "build").await;
    let solo = job_id(s, &quick, "solo").await;
    claim(s, &a, &build, LONG_TTL).await;
    claim(s, &a, &solo, LONG_TTL).await;
    s.complete(&solo, 1, success()).await.unwrap();
    assert!(s.overdue_runs(10).await.unwrap().is_empty(), "nothing is a second old");
    assert!(!s.time_out_run(&late).await.unwrap(), "not yet");
    expire(1100).await;
    assert_eq!(s.overdue_runs(10).await.unwrap(), vec![late.clone()], "finished and unbounded runs are not overdue");
    assert!(s.time_out_run(&late).await.unwrap());
    assert!(!s.time_out_run(&late).await.unwrap(), "once");
    assert!(s.overdue_runs(10).await.unwrap().is_empty());
    let v = view(s, &late).await;
    assert_eq!(v.run.status, RunStatus::Cancelling, "its attempt still runs");
    assert!(v.run.message.as_deref().unwrap_or_default().contains("timed out after 1s"), "{:?}", v.run.message);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Cancelled);
    assert_eq!(jv(&v, "build").job.status, JobStatus::Running);
    assert_eq!(view(s, &quick).await.run.status, RunStatus::Success);
    assert_ne!(view(s, &unbounded).await.run.status, RunStatus::Cancelled);
}
