//! Pipelines as graphs (spec 003 "Deep Dive 3"): fan-out/fan-in, `if:`
//! conditions, quorum, matrix `max-parallel` and `fail-fast`, and run-level
//! concurrency groups. Workflows are parsed from YAML with kiln-workflow.

use super::*;
use kiln_core::RunStatus;

fn wf(yaml: &str) -> Workflow {
    kiln_workflow::parse(yaml).unwrap_or_else(|d| panic!("workflow does not parse:\n{d}"))
}

async fn status_of<S: Store>(s: &S, run_id: &str, name: &str) -> JobStatus {
    jv(&view(s, run_id).await, name).job.status
}

/// Claim and complete `name` with `result`.
async fn run_job<S: Store>(s: &S, a: &AgentRecord, run_id: &str, name: &str, result: CompletionInput) -> String {
    let id = job_id(s, run_id, name).await;
    let c = claim(s, a, &id, LONG_TTL).await;
    s.complete(&id, c.epoch, result).await.expect("complete")
}

pub async fn diamond_fans_out_and_in<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run) = start(
        s,
        wf("version: 1\njobs:\n  - {name: a, steps: [x]}\n  - {name: b, needs: a, steps: [x]}\n  - {name: c, needs: a, steps: [x]}\n  - {name: d, needs: [b, c], steps: [x]}\n"),
    )
    .await;
    let ag = agent(s, "a", 8).await;
    assert_eq!(status_of(s, &run, "b").await, JobStatus::Pending);
    run_job(s, &ag, &run, "a", success()).await;
    assert_eq!(status_of(s, &run, "b").await, JobStatus::Ready, "fan-out");
    assert_eq!(status_of(s, &run, "c").await, JobStatus::Ready, "fan-out");
    run_job(s, &ag, &run, "c", success()).await;
    assert_eq!(status_of(s, &run, "d").await, JobStatus::Pending, "fan-in waits for every need");
    run_job(s, &ag, &run, "b", success()).await;
    assert_eq!(status_of(s, &run, "d").await, JobStatus::Ready);
    run_job(s, &ag, &run, "d", success()).await;
    assert_eq!(view(s, &run).await.run.status, RunStatus::Success);
}

pub async fn conditions_decide_ready_or_skipped<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run) = start(
        s,
        wf(r#"version: 1
jobs:
  - {name: build, steps: [x]}
  - {name: deploy, needs: build, if: "inputs.deploy == 'yes'", steps: [x]}
  - {name: test, needs: build, steps: [x]}
  - {name: report, needs: test, if: "failure()", steps: [x]}
  - {name: cleanup, needs: [test, deploy], if: "always()", steps: [x]}
  - {name: after, needs: test, steps: [x]}
"#),
    )
    .await;
    let ag = agent(s, "a", 8).await;
    run_job(s, &ag, &run, "build", success()).await;
    let v = view(s, &run).await;
    let deploy = jv(&v, "deploy");
    assert_eq!(deploy.job.status, JobStatus::Skipped, "a false condition skips");
    assert!(deploy.job.message.as_deref().unwrap_or("").contains("inputs.deploy"));
    assert!(deploy.attempts.is_empty());
    run_job(s, &ag, &run, "test", failure(1)).await;
    let v = view(s, &run).await;
    assert_eq!(jv(&v, "report").job.status, JobStatus::Ready, "failure() runs after a failure");
    assert_eq!(jv(&v, "cleanup").job.status, JobStatus::Ready, "always() runs whatever happened");
    assert_eq!(jv(&v, "after").job.status, JobStatus::Skipped, "the implicit success() skips");
    run_job(s, &ag, &run, "report", success()).await;
    run_job(s, &ag, &run, "cleanup", success()).await;
    assert_eq!(view(s, &run).await.run.status, RunStatus::Failed, "a failed job fails the run");
}

pub async fn quorum_needs_enough_successes<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let yaml = "version: 1\njobs:\n  - {name: a, needs: [], steps: [x]}\n  - {name: b, needs: [], steps: [x]}\n  - {name: c, needs: [], steps: [x]}\n  - {name: q, needs: [a, b, c], needs-policy: {quorum: 2}, steps: [x]}\n";
    let ag = agent(s, "a", 8).await;
    let (_, run) = start(s, wf(yaml)).await;
    run_job(s, &ag, &run, "a", failure(1)).await;
    run_job(s, &ag, &run, "b", success()).await;
    assert_eq!(status_of(s, &run, "q").await, JobStatus::Pending, "one success of two so far");
    run_job(s, &ag, &run, "c", success()).await;
    assert_eq!(status_of(s, &run, "q").await, JobStatus::Ready, "quorum met");
    let degraded = |v: &RunView| jv(v, "q").job.message.clone().unwrap_or_default();
    assert!(degraded(&view(s, &run).await).starts_with("degraded: 2 of 3"), "ran on a quorum: marked degraded");
    run_job(s, &ag, &run, "q", success()).await;
    assert!(degraded(&view(s, &run).await).starts_with("degraded"), "the mark stays after success");
    let (_, run2) = start(s, wf(yaml)).await;
    run_job(s, &ag, &run2, "a", failure(1)).await;
    run_job(s, &ag, &run2, "b", failure(1)).await;
    assert_eq!(status_of(s, &run2, "q").await, JobStatus::Skipped, "quorum can no longer be met");
}

pub async fn matrix_max_parallel_limits_ready_siblings<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run) = start(
        s,
        wf("version: 1\njobs:\n  - name: t\n    matrix: {shard: [1, 2, 3, 4], max-parallel: 2}\n    steps: [x]\n"),
    )
    .await;
    let ag = agent(s, "a", 8).await;
    let active =
        |v: &RunView| v.jobs.iter().filter(|j| matches!(j.job.status, JobStatus::Ready | JobStatus::Running)).count();
    let v = view(s, &run).await;
    assert_eq!(v.jobs.len(), 4);
    assert_eq!(active(&v), 2, "{:?}", statuses(&v));
    run_job(s, &ag, &run, "t (shard=1)", success()).await;
    let v = view(s, &run).await;
    assert_eq!(active(&v), 2, "a finished sibling frees a slot: {:?}", statuses(&v));
    assert_eq!(jv(&v, "t (shard=3)").job.status, JobStatus::Ready);
    assert_eq!(jv(&v, "t (shard=4)").job.status, JobStatus::Pending);
    for n in ["t (shard=2)", "t (shard=3)", "t (shard=4)"] {
        run_job(s, &ag, &run, n, success()).await;
    }
    assert_eq!(view(s, &run).await.run.status, RunStatus::Success);
}

pub async fn fail_fast_cancels_siblings<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run) = start(
        s,
        wf("version: 1\njobs:\n  - name: t\n    matrix: {shard: [1, 2, 3]}\n    steps: [x]\n  - {name: after, needs: t, steps: [x]}\n"),
    )
    .await;
    let ag = agent(s, "a", 8).await;
    let t2 = job_id(s, &run, "t (shard=2)").await;
    let c2 = claim(s, &ag, &t2, LONG_TTL).await;
    run_job(s, &ag, &run, "t (shard=1)", failure(2)).await;
    let v = view(s, &run).await;
    assert_eq!(jv(&v, "t (shard=3)").job.status, JobStatus::Cancelled, "a waiting sibling is cancelled");
    assert_eq!(jv(&v, "t (shard=2)").job.status, JobStatus::Running, "a running sibling is asked to stop");
    assert!(jv(&v, "t (shard=2)").job.cancel_requested);
    assert!(!jv(&v, "t (shard=3)").job.cancel_requested, "only running siblings carry the request");
    assert!(s.heartbeat(&t2, c2.epoch, LONG_TTL).await.unwrap().cancel_requested);
    // Its late success is refused: the cancellation committed first.
    assert_conflict(s.complete(&t2, c2.epoch, success()).await);
    let v = view(s, &run).await;
    assert_eq!(jv(&v, "t (shard=2)").job.status, JobStatus::Cancelled);
    assert_eq!(jv(&v, "after").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Failed);

    // fail-fast: false leaves siblings alone.
    let (_, run) =
        start(s, wf("version: 1\njobs:\n  - name: t\n    matrix: {shard: [1, 2], fail-fast: false}\n    steps: [x]\n"))
            .await;
    run_job(s, &ag, &run, "t (shard=1)", failure(2)).await;
    assert_eq!(status_of(s, &run, "t (shard=2)").await, JobStatus::Ready);
}

fn grouped(repo_id: &str, cancel_in_progress: bool) -> NewRun {
    let mut r = new_run(repo_id, wf("version: 1\njobs:\n  - {name: a, steps: [x]}\n"));
    r.concurrency = Some(RunConcurrency { group: "deploy-main".into(), cancel_in_progress });
    r
}

/// Three runs race in one concurrency group: exactly one is active at a
/// time; a newer queued run supersedes an older queued one, which ends
/// `cancelled` with a reason.
pub async fn concurrency_group_runs_one_at_a_time<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 8).await;
    let r1 = s.accept_run(grouped(&r.id, false)).await.unwrap().run_id;
    let r2 = s.accept_run(grouped(&r.id, false)).await.unwrap().run_id;
    assert_eq!(status_of(s, &r1, "a").await, JobStatus::Ready);
    assert_eq!(status_of(s, &r2, "a").await, JobStatus::Pending, "r2 waits for the group");
    let a1 = job_id(s, &r1, "a").await;
    let c1 = claim(s, &ag, &a1, LONG_TTL).await;
    let r3 = s.accept_run(grouped(&r.id, false)).await.unwrap().run_id;
    let v2 = view(s, &r2).await;
    assert_eq!(v2.run.status, RunStatus::Cancelled, "the queued r2 is superseded by r3");
    assert!(v2.run.message.as_deref().unwrap_or("").contains("superseded"), "{:?}", v2.run.message);
    assert_eq!(status_of(s, &r3, "a").await, JobStatus::Pending, "r3 waits while r1 runs");
    s.complete(&a1, c1.epoch, success()).await.unwrap();
    assert_eq!(view(s, &r1).await.run.status, RunStatus::Success);
    assert_eq!(status_of(s, &r3, "a").await, JobStatus::Ready, "r1 finished: r3 starts");
    run_job(s, &ag, &r3, "a", success()).await;
    assert_eq!(view(s, &r3).await.run.status, RunStatus::Success);
    // A group of another name is independent.
    let mut other = grouped(&r.id, false);
    other.concurrency.as_mut().unwrap().group = "deploy-other".into();
    let r4 = s.accept_run(other).await.unwrap().run_id;
    assert_eq!(status_of(s, &r4, "a").await, JobStatus::Ready);
}

pub async fn concurrency_cancel_in_progress<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 8).await;
    let r1 = s.accept_run(grouped(&r.id, true)).await.unwrap().run_id;
    let a1 = job_id(s, &r1, "a").await;
    let c1 = claim(s, &ag, &a1, LONG_TTL).await;
    let r2 = s.accept_run(grouped(&r.id, true)).await.unwrap().run_id;
    let v1 = view(s, &r1).await;
    assert_eq!(v1.run.status, RunStatus::Cancelling, "the running r1 is cancelled through the protocol");
    assert_eq!(status_of(s, &r2, "a").await, JobStatus::Pending, "r2 waits until r1 has stopped");
    assert!(s.heartbeat(&a1, c1.epoch, LONG_TTL).await.unwrap().cancel_requested);
    let cancelled = CompletionInput { outcome: AttemptOutcome::Cancelled, exit_code: None, ..success() };
    s.complete(&a1, c1.epoch, cancelled).await.unwrap();
    assert_eq!(view(s, &r1).await.run.status, RunStatus::Cancelled);
    assert_eq!(status_of(s, &r2, "a").await, JobStatus::Ready, "r1 stopped: r2 starts");
}

/// Random DAGs completed in random orders with random results (spec 003):
/// a job never starts before all its needs succeeded, a skipped job never
/// runs, a job is skipped exactly when a need failed or was skipped, and the
/// run fails exactly when a job failed.
pub fn random_dags_in_random_orders<S: Store + 'static>(opener: Opener<S>) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    const N: usize = 6;
    let mut runner = TestRunner::new(Config { cases: 48, failure_persistence: None, ..Config::default() });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // needs[i] ⊆ {0..i} as a bit mask; picks choose which ready job goes next; fails decide results.
    let strategy = (
        prop::collection::vec(any::<u8>(), N),
        prop::collection::vec(any::<prop::sample::Index>(), N),
        prop::collection::vec(prop::bool::weighted(0.25), N),
    );
    let result = runner.run(&strategy, |(masks, picks, fails)| {
        rt.block_on(async {
            let fx = opener.open(FAST).await;
            let s = &*fx.store;
            let names: Vec<String> = (0..N).map(|i| format!("j{i}")).collect();
            let needs: Vec<Vec<String>> = (0..N)
                .map(|i| (0..i).filter(|k| masks[i] & (1 << k) != 0).map(|k| names[k].clone()).collect())
                .collect();
            let mut yaml = String::from("version: 1\njobs:\n");
            for i in 0..N {
                yaml += &format!("  - {{name: {}, needs: [{}], steps: [x]}}\n", names[i], needs[i].join(", "));
            }
            let (_, run) = start(s, wf(&yaml)).await;
            let ag = agent(s, "a", 16).await;
            for step in 0.. {
                let v = view(s, &run).await;
                // Invariants after every transaction.
                for (i, name) in names.iter().enumerate() {
                    let j = jv(&v, name);
                    let need = |n: &String| jv(&v, n).job.clone();
                    if j.job.status == JobStatus::Skipped {
                        assert!(j.attempts.is_empty(), "skipped {name} ran");
                    }
                    if let Some(first) = j.attempts.first() {
                        for n in &needs[i] {
                            let nj = need(n);
                            assert_eq!(nj.status, JobStatus::Success, "{name} started before {n} succeeded");
                            assert!(nj.finished_at.unwrap() <= first.started_at);
                        }
                    }
                    let doomed =
                        needs[i].iter().any(|n| matches!(need(n).status, JobStatus::Failed | JobStatus::Skipped));
                    if doomed {
                        assert_eq!(j.job.status, JobStatus::Skipped, "{name} downstream of a failure is not skipped");
                    }
                    if j.job.status == JobStatus::Skipped {
                        assert!(doomed, "{name} skipped although no need failed");
                    }
                }
                let ready: Vec<&String> = names.iter().filter(|n| jv(&v, n).job.status == JobStatus::Ready).collect();
                if ready.is_empty() {
                    assert!(v.run.status.is_terminal(), "nothing ready but the run is {}", v.run.status);
                    let any_failed = v.jobs.iter().any(|j| j.job.status == JobStatus::Failed);
                    assert_eq!(v.run.status == RunStatus::Failed, any_failed);
                    break;
                }
                let pick = ready[picks[step % N].index(ready.len())].clone();
                let idx = names.iter().position(|n| *n == pick).unwrap();
                let result = if fails[idx] { failure(1) } else { success() };
                run_job(s, &ag, &run, &pick, result).await;
            }
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn deploy_run(repo_id: &str, cancel_in_progress: bool) -> NewRun {
    new_run(
        repo_id,
        wf(&format!(
            "version: 1\njobs:\n  - {{name: build, steps: [x]}}\n  - name: deploy\n    concurrency: {{group: prod, cancel-in-progress: {cancel_in_progress}}}\n    steps: [x]\n"
        )),
    )
}

/// Job-level concurrency: at most one job of a group is ready or running
/// across runs; a newer waiting job supersedes an older waiting one.
pub async fn job_concurrency_group_one_at_a_time<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 16).await;
    let r1 = s.accept_run(deploy_run(&r.id, false)).await.unwrap().run_id;
    let r2 = s.accept_run(deploy_run(&r.id, false)).await.unwrap().run_id;
    let r3 = s.accept_run(deploy_run(&r.id, false)).await.unwrap().run_id;
    for run in [&r1, &r2, &r3] {
        run_job(s, &ag, run, "build", success()).await;
    }
    let d1 = job_id(s, &r1, "deploy").await;
    assert_eq!(job_status(s, &d1).await, JobStatus::Ready, "the first deploy takes the group");
    let v2 = view(s, &r2).await;
    assert_eq!(jv(&v2, "deploy").job.status, JobStatus::Cancelled, "r2's waiting deploy is superseded by r3's");
    assert!(jv(&v2, "deploy").job.message.as_deref().unwrap_or("").contains("superseded"));
    assert_eq!(v2.run.status, RunStatus::Failed);
    assert_eq!(status_of(s, &r3, "deploy").await, JobStatus::Pending, "r3's deploy waits");
    run_job(s, &ag, &r1, "deploy", success()).await;
    assert_eq!(status_of(s, &r3, "deploy").await, JobStatus::Ready, "the group is free: r3's deploy starts");
    run_job(s, &ag, &r3, "deploy", success()).await;
    assert_eq!(view(s, &r3).await.run.status, RunStatus::Success);
}

pub async fn job_concurrency_cancel_in_progress<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 16).await;
    let r1 = s.accept_run(deploy_run(&r.id, true)).await.unwrap().run_id;
    run_job(s, &ag, &r1, "build", success()).await;
    let d1 = job_id(s, &r1, "deploy").await;
    let c1 = claim(s, &ag, &d1, LONG_TTL).await;
    let r2 = s.accept_run(deploy_run(&r.id, true)).await.unwrap().run_id;
    run_job(s, &ag, &r2, "build", success()).await;
    assert_eq!(status_of(s, &r2, "deploy").await, JobStatus::Pending, "waits until the running deploy stopped");
    assert!(
        s.heartbeat(&d1, c1.epoch, LONG_TTL).await.unwrap().cancel_requested,
        "the running deploy is asked to stop"
    );
    let cancelled = CompletionInput { outcome: AttemptOutcome::Cancelled, exit_code: None, ..success() };
    s.complete(&d1, c1.epoch, cancelled).await.unwrap();
    assert_eq!(job_status(s, &d1).await, JobStatus::Cancelled);
    assert_eq!(status_of(s, &r2, "deploy").await, JobStatus::Ready, "r1's deploy stopped: r2's starts");
}
