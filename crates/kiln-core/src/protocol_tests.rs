//! The protocol's safety rules, checked on the reference model over random
//! interleavings (two agents, a diamond, leases ending in between), plus the
//! classic races as literal scenarios.

use super::*;
use crate::advance::MatrixRule;
use crate::test_lang::Lang;
use proptest::prelude::*;

fn linux() -> BTreeMap<String, String> {
    BTreeMap::from([("os".to_string(), "linux".to_string())])
}

fn spec(name: &str, needs: &[&str], retry: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        needs: needs.iter().map(|n| n.to_string()).collect(),
        retry,
        runs_on: linux(),
        ..JobSpec::default()
    }
}

fn agents(n: usize) -> Vec<ModelAgent> {
    (0..n).map(|_| ModelAgent { labels: linux(), max_jobs: 2 }).collect()
}

fn model(jobs: Vec<JobSpec>) -> RunModel<Lang> {
    RunModel::accept(jobs, agents(2), Lang, Backoff { base_ms: 0, max_ms: 0 }, 0)
}

fn report(outcome: AttemptOutcome, exit_code: Option<i32>) -> Report {
    Report { outcome, exit_code, message: None, class: None }
}

fn ok() -> Report {
    report(AttemptOutcome::Success, Some(0))
}

fn claim(m: &mut RunModel<Lang>, agent: usize, job: usize) -> i64 {
    let g = m.jobs[job].dispatch_generation;
    m.claim(agent, job, g).expect("claimable")
}

fn statuses(m: &RunModel<Lang>) -> Vec<JobStatus> {
    m.jobs.iter().map(|j| j.status).collect()
}

#[test]
fn stale_epoch_cannot_publish_after_replacement() {
    let mut m = model(vec![JobSpec { outputs: vec!["app".into()], ..spec("a", &[], 0) }]);
    let e1 = claim(&mut m, 0, 0);
    m.expire_lease(0, e1);
    assert_eq!(m.fence(), vec![(0, 1)]);
    assert_eq!(m.jobs[0].attempts[0].outcome, AttemptOutcome::Lost);
    assert_eq!(m.jobs[0].message.as_deref(), Some("retrying: agent lost (lease expired)"));
    let e2 = claim(&mut m, 1, 0);
    assert_eq!(e2, 2);
    let replaced = Err(Refusal::Stale(Stale::Replaced { current: 2 }));
    assert_eq!(m.heartbeat(0, e1), replaced.clone().map(|_: JobStatus| false));
    assert_eq!(m.seal(0, e1, "app"), replaced.clone().map(|_: JobStatus| ()));
    assert_eq!(m.complete(0, e1, &ok()), replaced);
    m.seal(0, e2, "app").unwrap();
    assert_eq!(m.complete(0, e2, &ok()), Ok(JobStatus::Success));
    assert_eq!((m.jobs[0].bound, m.run), (Some(2), RunStatus::Success));
}

#[test]
fn success_without_sealed_output_fails_explicitly() {
    let mut m = model(vec![JobSpec { outputs: vec!["app".into()], ..spec("a", &[], 0) }]);
    let e = claim(&mut m, 0, 0);
    assert_eq!(m.complete(0, e, &ok()), Ok(JobStatus::Failed));
    let j = &m.jobs[0];
    assert_eq!(j.message.as_deref(), Some("required artifact `app` was not sealed by attempt 1"));
    assert_eq!((j.attempts[0].outcome, j.bound, m.run), (AttemptOutcome::Failed, None, RunStatus::Failed));
}

#[test]
fn cancel_races_success_both_orders() {
    let mut m = model(vec![spec("a", &[], 0)]);
    let e = claim(&mut m, 0, 0);
    assert_eq!(m.complete(0, e, &ok()), Ok(JobStatus::Success));
    assert_eq!(m.cancel(), RunStatus::Success, "completion committed first: cancel observes it");

    let mut m = model(vec![spec("a", &[], 0)]);
    let e = claim(&mut m, 0, 0);
    assert_eq!(m.cancel(), RunStatus::Cancelling);
    assert_eq!(m.heartbeat(0, e), Ok(true), "the agent is asked to stop");
    assert_eq!(m.complete(0, e, &ok()), Err(Refusal::CancelledFirst));
    let j = &m.jobs[0];
    assert_eq!((m.run, j.status, j.bound), (RunStatus::Cancelled, JobStatus::Cancelled, None));
    assert_eq!(j.attempts[0].outcome, AttemptOutcome::Cancelled);
}

/// Issue 40, item 5 (spec 000 §9, §15): a cancelling run whose agent went
/// silent is fenced at the lapse (nothing it sends is accepted) but stays
/// cancelling until the agent confirms its sandbox is gone.
#[test]
fn a_lapsed_lease_does_not_end_a_cancel() {
    let mut m = model(vec![spec("a", &[], 3)]);
    let e = claim(&mut m, 0, 0);
    assert_eq!(m.cancel(), RunStatus::Cancelling);
    m.expire_lease(0, e);
    assert_eq!(m.fence(), vec![(0, 1)]);
    let j = &m.jobs[0];
    assert_eq!((j.status, j.attempts[0].outcome), (JobStatus::Cancelled, AttemptOutcome::Lost));
    assert_eq!(m.run, RunStatus::Cancelling, "fenced, not confirmed");
    assert!(matches!(m.complete(0, e, &ok()), Err(Refusal::Stale(_))), "nothing it sends is accepted");
    assert_eq!(m.cancel(), RunStatus::Cancelling, "cancelling again changes nothing");
    assert_eq!(m.release(0, e), Ok(true));
    assert_eq!(m.run, RunStatus::Cancelled);
    assert_eq!(m.release(0, e), Ok(false), "a second confirmation changes nothing");

    // A run whose attempt was lost before the cancel waits too, though
    // nothing runs when it is cancelled.
    let mut m = model(vec![spec("a", &[], 3)]);
    let e = claim(&mut m, 0, 0);
    m.expire_lease(0, e);
    m.fence();
    assert_eq!(m.jobs[0].status, JobStatus::Ready, "retried");
    assert_eq!(m.cancel(), RunStatus::Cancelling);
    assert_eq!(m.jobs[0].status, JobStatus::Cancelled);
    assert_eq!(m.release(0, e), Ok(true));
    assert_eq!(m.run, RunStatus::Cancelled);
}

#[test]
fn diamond_failure_skips_downstream_and_fails_the_run() {
    let mut m = model(vec![spec("a", &[], 0), spec("b", &["a"], 0), spec("c", &["a"], 0), spec("d", &["b", "c"], 0)]);
    let a = claim(&mut m, 0, 0);
    m.complete(0, a, &ok()).unwrap();
    let (b, c) = (claim(&mut m, 0, 1), claim(&mut m, 1, 2));
    assert_eq!(m.complete(1, b, &report(AttemptOutcome::Failed, Some(3))), Ok(JobStatus::Failed));
    use JobStatus::*;
    assert_eq!(statuses(&m), vec![Success, Failed, Running, Skipped], "d is hopeless while c runs");
    assert_eq!(m.jobs[3].message.as_deref(), Some("skipped: a job it needs did not succeed"));
    assert_eq!(m.run, RunStatus::Running);
    m.complete(2, c, &ok()).unwrap();
    assert_eq!(m.run, RunStatus::Failed);
}

#[test]
fn fail_fast_stops_running_siblings_which_end_cancelled() {
    let shard = |n: &str| JobSpec {
        rules: JobRules {
            matrix: Some(MatrixRule { group: "test".into(), max_parallel: None, fail_fast: true }),
            ..JobRules::default()
        },
        ..spec(n, &[], 0)
    };
    let mut m = model(vec![shard("t1"), shard("t2"), shard("t3")]);
    let (e1, e2) = (claim(&mut m, 0, 0), claim(&mut m, 0, 1));
    assert_eq!(m.complete(0, e1, &report(AttemptOutcome::Failed, Some(1))), Ok(JobStatus::Failed));
    assert_eq!(m.jobs[2].status, JobStatus::Cancelled);
    assert_eq!(m.jobs[2].message.as_deref(), Some("cancelled: fail-fast after `t1` failed"));
    assert_eq!(m.heartbeat(1, e2), Ok(true));
    assert_eq!(m.complete(1, e2, &ok()), Err(Refusal::CancelledFirst));
    assert_eq!(m.jobs[1].message.as_deref(), Some("cancelled: fail-fast (a matrix sibling failed)"));
    assert_eq!(m.run, RunStatus::Failed);
}

#[derive(Debug, Clone)]
enum Op {
    Claim(usize, usize),
    Heartbeat(usize, usize),
    Seal(usize, usize),
    Complete(usize, usize, u8),
    Expire(usize, usize),
    LoseSession(usize),
    Fence,
    Cancel,
    Release(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let (a, j) = (0usize..2, 0usize..4);
    prop_oneof![
        6 => (a.clone(), j.clone()).prop_map(|(a, j)| Op::Claim(a, j)),
        2 => (a.clone(), j.clone()).prop_map(|(a, j)| Op::Heartbeat(a, j)),
        3 => (a.clone(), j.clone()).prop_map(|(a, j)| Op::Seal(a, j)),
        6 => (a.clone(), j.clone(), 0u8..4).prop_map(|(a, j, k)| Op::Complete(a, j, k)),
        2 => (a.clone(), j.clone()).prop_map(|(a, j)| Op::Expire(a, j)),
        1 => (a.clone(), j).prop_map(|(a, j)| Op::Release(a, j)),
        1 => a.prop_map(Op::LoseSession),
        2 => Just(Op::Fence),
        1 => Just(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    /// Two agents, each remembering the last epoch it was granted per job,
    /// act in random interleavings with leases ending in between.
    #[test]
    fn ownership_invariants_hold(retries in prop::collection::vec(0u32..2, 4), ops in prop::collection::vec(op(), 1..80)) {
        let jobs = vec![
            JobSpec { outputs: vec!["out".into()], ..spec("a", &[], retries[0]) },
            spec("b", &["a"], retries[1]),
            spec("c", &["a"], retries[2]),
            spec("d", &["b", "c"], retries[3]),
        ];
        let mut m = model(jobs);
        let mut held: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        let mut terminal_jobs: BTreeMap<usize, JobStatus> = BTreeMap::new();
        let mut terminal_run: Option<RunStatus> = None;
        for op in ops {
            match op {
                Op::Claim(a, j) => {
                    let g = m.jobs[j].dispatch_generation;
                    if let Ok(e) = m.claim(a, j, g) { held.insert((a, j), e); }
                }
                Op::Heartbeat(a, j) => if let Some(&e) = held.get(&(a, j)) { let _ = m.heartbeat(j, e); },
                Op::Seal(a, j) => if let Some(&e) = held.get(&(a, j)) { let _ = m.seal(j, e, "out"); },
                Op::Complete(a, j, k) => if let Some(&e) = held.get(&(a, j)) {
                    let outcome = [AttemptOutcome::Success, AttemptOutcome::Failed, AttemptOutcome::Cancelled, AttemptOutcome::Success][k as usize];
                    let before = m.jobs[j].bound;
                    let r = m.complete(j, e, &Report { class: (k == 3).then_some(crate::failure::FailureClass::Infra), ..report(outcome, None) });
                    // A refused completion never changes the bound output.
                    if r.is_err() { prop_assert_eq!(m.jobs[j].bound, before); }
                },
                Op::Expire(a, j) => if let Some(&e) = held.get(&(a, j)) { m.expire_lease(j, e); },
                Op::LoseSession(a) => { m.lose_session(a); m.fence(); }
                Op::Fence => { m.fence(); }
                Op::Cancel => { m.cancel(); }
                Op::Release(a, j) => if let Some(&e) = held.get(&(a, j)) { let _ = m.release(j, e); },
            }
            for (i, j) in m.jobs.iter().enumerate() {
                // At most one success per job, the bound epoch, sealed.
                let wins: Vec<&ModelAttempt> = j.attempts.iter().filter(|a| a.outcome == AttemptOutcome::Success).collect();
                prop_assert!(wins.len() <= 1);
                prop_assert_eq!(j.bound, wins.first().map(|a| a.epoch));
                prop_assert_eq!(j.status == JobStatus::Success, j.bound.is_some());
                if i == 0 && let Some(w) = wins.first() { prop_assert!(w.sealed.iter().any(|s| s == "out")); }
                // At most one running attempt: the current epoch of a running job.
                let running: Vec<&ModelAttempt> = j.attempts.iter().filter(|a| a.outcome == AttemptOutcome::Running).collect();
                prop_assert!(running.len() <= 1);
                prop_assert_eq!(running.len() == 1, j.status == JobStatus::Running);
                if let Some(r) = running.first() { prop_assert_eq!(r.epoch, j.current_epoch); }
                // Budgets are never overdrawn.
                prop_assert!(j.budget.failure_used <= j.budget.max_failure_retries);
                prop_assert!(j.budget.infra_used <= j.budget.max_infra_retries);
                // Terminal jobs never change again.
                if let Some(t) = terminal_jobs.get(&i) { prop_assert_eq!(j.status, *t); }
                if j.status.is_terminal() { terminal_jobs.insert(i, j.status); }
                // Attempts only after every need succeeded.
                if !j.attempts.is_empty() {
                    for n in &j.spec.needs {
                        prop_assert!(m.jobs.iter().any(|o| &o.spec.name == n && o.status == JobStatus::Success));
                    }
                }
            }
            if let Some(t) = terminal_run { prop_assert_eq!(m.run, t); }
            if m.run.is_terminal() {
                prop_assert!(m.jobs.iter().all(|j| j.status.is_terminal()));
                terminal_run = Some(m.run);
            } else {
                // Work left, or a cancel waiting for a fenced sandbox to be
                // confirmed gone (issue 40, item 5).
                let waits = m.run == RunStatus::Cancelling && m.awaiting_release();
                prop_assert!(waits || m.jobs.iter().any(|j| !j.status.is_terminal()), "an active run has work left");
            }
            // A lapsed lease never certifies a cancel.
            if m.run == RunStatus::Cancelled { prop_assert!(!m.awaiting_release()); }
        }
    }
}
