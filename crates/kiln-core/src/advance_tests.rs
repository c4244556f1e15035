//! Literal tables for [`plan_advance`]: each row is a run as its rows stand
//! and the verdicts one pass must produce, messages included.

use super::*;
use crate::test_lang::Lang;
use JobStatus::{Cancelled, Failed, Pending, Ready as R, Running, Skipped, Success};

fn j(name: &str, status: JobStatus, needs: &[&str]) -> AdvanceJob {
    AdvanceJob {
        name: name.into(),
        status,
        needs: needs.iter().map(|n| n.to_string()).collect(),
        rules: Some(JobRules::default()),
    }
}

fn with(mut job: AdvanceJob, f: impl FnOnce(&mut JobRules)) -> AdvanceJob {
    f(job.rules.as_mut().unwrap());
    job
}

fn cond(job: AdvanceJob, c: &str) -> AdvanceJob {
    with(job, |r| r.condition = Some(c.into()))
}

fn quorum(job: AdvanceJob, q: u32) -> AdvanceJob {
    with(job, |r| r.quorum = Some(q))
}

fn matrix(job: AdvanceJob, max: Option<u32>) -> AdvanceJob {
    with(job, |r| r.matrix = Some(MatrixRule { group: "test".into(), max_parallel: max, fail_fast: false }))
}

fn group(job: AdvanceJob, template: &str, cancel_in_progress: bool) -> AdvanceJob {
    with(job, |r| {
        r.concurrency = Some(GroupRule { template: template.into(), cancel_in_progress, ..Default::default() })
    })
}

fn ready(job: usize) -> Verdict {
    Verdict::Ready { job, note: None }
}

fn skip(job: usize, why: &str) -> Verdict {
    Verdict::Skip { job, why: why.into() }
}

const NEED_FAILED: &str = "skipped: a job it needs did not succeed";

fn run(status: RunStatus) -> AdvanceRun {
    AdvanceRun {
        status,
        held: false,
        repo_id: "repo".into(),
        awaiting_release: false,
        environments: Default::default(),
        refused: Default::default(),
        promotions: Default::default(),
    }
}

/// Plans with every concurrency group free.
fn plan(run: AdvanceRun, jobs: Vec<AdvanceJob>) -> Vec<Verdict> {
    plan_advance(run, jobs, &Lang, |_, _, _| true)
}

fn diamond(a: JobStatus, b: JobStatus, c: JobStatus, d: JobStatus) -> Vec<AdvanceJob> {
    vec![j("a", a, &[]), j("b", b, &["a"]), j("c", c, &["a"]), j("d", d, &["b", "c"])]
}

#[test]
fn diamond_table() {
    use RunStatus::{Cancelling, Queued, Running as Active};
    let rows: Vec<(&str, RunStatus, Vec<AdvanceJob>, Vec<Verdict>)> = vec![
        ("accepted: the root is ready", Queued, diamond(Pending, Pending, Pending, Pending), vec![ready(0)]),
        ("a succeeded: b and c fan out", Active, diamond(Success, Pending, Pending, Pending), vec![ready(1), ready(2)]),
        ("d waits for every need", Active, diamond(Success, Success, Running, Pending), vec![]),
        ("both needs succeeded: d is ready", Active, diamond(Success, Success, Success, Pending), vec![ready(3)]),
        (
            "b failed while c runs: d is skipped at once (hopeless)",
            Active,
            diamond(Success, Failed, Running, Pending),
            vec![skip(3, NEED_FAILED)],
        ),
        (
            "b failed and c done: d skipped and the run fails",
            Active,
            diamond(Success, Failed, Success, Pending),
            vec![skip(3, NEED_FAILED), Verdict::Finish(RunStatus::Failed)],
        ),
        (
            "a failed: the skip cascades in one pass",
            Active,
            diamond(Failed, Pending, Pending, Pending),
            vec![skip(1, NEED_FAILED), skip(2, NEED_FAILED), skip(3, NEED_FAILED), Verdict::Finish(RunStatus::Failed)],
        ),
        (
            "a cancelled need also skips (the run still fails)",
            Active,
            diamond(Success, Cancelled, Success, Pending),
            vec![skip(3, NEED_FAILED), Verdict::Finish(RunStatus::Failed)],
        ),
        (
            "all succeeded: the run succeeds",
            Active,
            diamond(Success, Success, Success, Success),
            vec![Verdict::Finish(RunStatus::Success)],
        ),
        (
            "skipped jobs alone do not fail a run",
            Active,
            diamond(Success, Skipped, Success, Skipped),
            vec![Verdict::Finish(RunStatus::Success)],
        ),
        ("nothing decided while a job runs", Active, diamond(Success, Running, Running, Pending), vec![]),
        (
            "a cancelling run decides no job, and ends cancelled once nothing runs",
            Cancelling,
            diamond(Success, Success, Cancelled, Pending),
            vec![],
        ),
        (
            "a cancelling run with all jobs finished ends cancelled",
            Cancelling,
            diamond(Success, Success, Cancelled, Cancelled),
            vec![Verdict::Finish(RunStatus::Cancelled)],
        ),
        ("a finished run is left as is", RunStatus::Failed, diamond(Failed, Skipped, Skipped, Skipped), vec![]),
    ];
    for (what, status, jobs, want) in rows {
        assert_eq!(plan(run(status), jobs), want, "{what}");
    }
}

/// Issue 40, item 5 (spec 000 §9): a fenced attempt nobody confirmed gone
/// keeps a cancelling run cancelling once every job has finished; a run
/// that is not cancelling finishes as before.
#[test]
fn a_cancelling_run_waits_for_its_fenced_sandboxes() {
    let awaiting = |status| AdvanceRun { awaiting_release: true, ..run(status) };
    let done = diamond(Success, Success, Cancelled, Cancelled);
    assert_eq!(plan(awaiting(RunStatus::Cancelling), done.clone()), vec![]);
    assert_eq!(plan(run(RunStatus::Cancelling), done), vec![Verdict::Finish(RunStatus::Cancelled)]);
    let failed = diamond(Success, Failed, Success, Skipped);
    assert_eq!(plan(awaiting(RunStatus::Running), failed), vec![Verdict::Finish(RunStatus::Failed)]);
}

#[test]
fn a_held_run_decides_no_job() {
    let held = AdvanceRun { held: true, ..run(RunStatus::Queued) };
    assert_eq!(plan(held, diamond(Pending, Pending, Pending, Pending)), vec![]);
}

#[test]
fn quorum_table() {
    let q =
        |x, y, z| vec![j("x", x, &[]), j("y", y, &[]), j("z", z, &[]), quorum(j("j", Pending, &["x", "y", "z"]), 2)];
    let degraded = |k| Verdict::Ready { job: 3, note: Some(format!("degraded: {k} of 3 needs succeeded (quorum)")) };
    let rows: Vec<(&str, Vec<AdvanceJob>, Vec<Verdict>)> = vec![
        ("a quorum reached still waits for every need to finish", q(Success, Success, Running), vec![]),
        ("one lost: a quorum is still possible", q(Success, Failed, Running), vec![]),
        ("2 of 3 succeeded: ready, marked degraded", q(Success, Failed, Success), vec![degraded(2)]),
        ("a skipped need counts as lost", q(Skipped, Success, Success), vec![degraded(2)]),
        ("all succeeded: no note", q(Success, Success, Success), vec![ready(3)]),
        ("two lost while one runs: hopeless, skipped now", q(Failed, Cancelled, Running), vec![skip(3, NEED_FAILED)]),
    ];
    for (what, jobs, want) in rows {
        assert_eq!(plan(run(RunStatus::Running), jobs), want, "{what}");
    }
}

#[test]
fn condition_table() {
    let after = |build, c: &str| vec![j("build", build, &[]), cond(j("cleanup", Pending, &["build"]), c)];
    let rows: Vec<(&str, Vec<AdvanceJob>, Vec<Verdict>)> = vec![
        ("if: failure() runs after a failure", after(Failed, "failure()"), vec![ready(1)]),
        (
            "if: failure() is skipped after a success",
            after(Success, "failure()"),
            vec![skip(1, "skipped: condition `failure()` is false"), Verdict::Finish(RunStatus::Success)],
        ),
        ("a job with if: is never skipped early", after(Running, "failure()"), vec![]),
        ("always() runs after a cancelled need", after(Cancelled, "always()"), vec![ready(1)]),
        (
            "an expression that cannot be evaluated skips, saying why",
            after(Success, "bogus("),
            vec![
                skip(1, "skipped: its condition could not be evaluated: unknown function in `bogus(`"),
                Verdict::Finish(RunStatus::Success),
            ],
        ),
    ];
    for (what, jobs, want) in rows {
        assert_eq!(plan(run(RunStatus::Running), jobs), want, "{what}");
    }
}

#[test]
fn max_parallel_table() {
    let m = |s1, s2, s3| {
        vec![matrix(j("t1", s1, &[]), Some(2)), matrix(j("t2", s2, &[]), Some(2)), matrix(j("t3", s3, &[]), Some(2))]
    };
    let rows: Vec<(&str, Vec<AdvanceJob>, Vec<Verdict>)> = vec![
        (
            "3 siblings, max-parallel 2: the third waits (counting those made ready in this pass)",
            m(Pending, Pending, Pending),
            vec![ready(0), ready(1), Verdict::WaitMaxParallel { job: 2 }],
        ),
        (
            "a running and a ready sibling fill the slots",
            m(Running, R, Pending),
            vec![Verdict::WaitMaxParallel { job: 2 }],
        ),
        ("a finished sibling frees its slot", m(Running, Success, Pending), vec![ready(2)]),
        (
            "without max-parallel every sibling is ready",
            vec![matrix(j("t1", Pending, &[]), None), matrix(j("t2", Running, &[]), None)],
            vec![ready(0)],
        ),
    ];
    for (what, jobs, want) in rows {
        assert_eq!(plan(run(RunStatus::Running), jobs), want, "{what}");
    }
}

#[test]
fn concurrency_group_table() {
    let enter =
        |job, key: &str, cip| Verdict::EnterGroup { job, key: key.into(), cancel_in_progress: cip, ordered: false };
    let wait = |job, key: &str| Verdict::WaitGroup { job, key: key.into() };
    // (what, jobs, group free?, verdicts)
    let rows: Vec<(&str, Vec<AdvanceJob>, bool, Vec<Verdict>)> = vec![
        (
            "the group key is rendered and scoped to the repository; entered → ready",
            vec![group(j("deploy", Pending, &[]), "deploy-${{ branch }}", false)],
            true,
            vec![enter(0, "repo:deploy-main", false), ready(0)],
        ),
        (
            "refused → waits",
            vec![group(j("deploy", Pending, &[]), "deploy", true)],
            false,
            vec![enter(0, "repo:deploy", true), wait(0, "repo:deploy")],
        ),
        (
            "a template that cannot be rendered is used as written",
            vec![group(j("deploy", Pending, &[]), "d-${{ bad }}", false)],
            true,
            vec![enter(0, "repo:d-${{ bad }}", false), ready(0)],
        ),
        (
            "a quorum note survives the group question",
            vec![
                j("x", Success, &[]),
                j("y", Failed, &[]),
                group(quorum(j("deploy", Pending, &["x", "y"]), 1), "deploy", false),
            ],
            true,
            vec![
                enter(2, "repo:deploy", false),
                Verdict::Ready { job: 2, note: Some("degraded: 1 of 2 needs succeeded (quorum)".into()) },
            ],
        ),
        (
            "a matrix job waiting for its group still holds its max-parallel slot in this pass",
            vec![
                group(matrix(j("t1", Pending, &[]), Some(1)), "g", false),
                group(matrix(j("t2", Pending, &[]), Some(1)), "g", false),
            ],
            false,
            vec![enter(0, "repo:g", false), wait(0, "repo:g"), Verdict::WaitMaxParallel { job: 1 }],
        ),
    ];
    for (what, jobs, free, want) in rows {
        assert_eq!(plan_advance(run(RunStatus::Running), jobs, &Lang, |_, _, _| free), want, "{what}");
    }
}

#[test]
fn a_job_without_definition_is_never_hopeless() {
    let mut orphan = j("d", Pending, &["a", "b"]);
    orphan.rules = None;
    let jobs = vec![j("a", Failed, &[]), j("b", Running, &[]), orphan];
    assert_eq!(plan(run(RunStatus::Running), jobs), vec![]);
}

#[test]
fn needs_results_count_unfinished_needs_as_failures() {
    let rows = [
        (Some(Success), NeedResult::Success),
        (Some(Failed), NeedResult::Failure),
        (Some(Cancelled), NeedResult::Cancelled),
        (Some(Skipped), NeedResult::Skipped),
        (Some(Running), NeedResult::Failure),
        (Some(Pending), NeedResult::Failure),
        (None, NeedResult::Failure),
    ];
    for (status, want) in rows {
        assert_eq!(NeedResult::of(status), want, "{status:?}");
    }
}

#[test]
fn the_pass_can_be_driven_verdict_by_verdict() {
    let jobs = vec![group(j("deploy", Pending, &[]), "g", false), j("after", Pending, &["deploy"])];
    let mut pass = AdvancePass::new(run(RunStatus::Running), jobs);
    assert_eq!(
        pass.next_verdict(&Lang),
        Some(Verdict::EnterGroup { job: 0, key: "repo:g".into(), cancel_in_progress: false, ordered: false })
    );
    pass.resolve_group(true);
    assert_eq!(pass.next_verdict(&Lang), Some(ready(0)));
    assert_eq!(pass.next_verdict(&Lang), None);
    assert_eq!(pass.statuses().collect::<Vec<_>>(), vec![R, Pending]);
}

/// A deploy job of `env`: its gate, then its environment's ordered queue.
fn deploy(job: AdvanceJob, env: &str) -> AdvanceJob {
    with(job, |r| {
        r.environment = Some(env.into());
        r.concurrency = Some(GroupRule { ordered: true, environment: Some(env.into()), ..Default::default() });
    })
}

#[test]
fn an_environment_gate_holds_every_expansion_until_approved_then_queues_them() {
    let env_run = |gate: EnvironmentGate| AdvanceRun {
        environments: [("production".to_string(), gate)].into_iter().collect(),
        ..run(RunStatus::Running)
    };
    let wave: Vec<AdvanceJob> =
        (0..20).map(|i| deploy(matrix(j(&format!("d{i}"), Pending, &[]), None), "production")).collect();
    let waiting = "waiting for approval to deploy to `production`".to_string();
    // Waiting: every one of the 20 waits, none takes a place in the queue.
    let got = plan(env_run(EnvironmentGate::Waiting(waiting.clone())), wave.clone());
    let want: Vec<Verdict> = (0..20).map(|job| Verdict::WaitApproval { job, message: waiting.clone() }).collect();
    assert_eq!(got, want);
    // Open (one approval for the run): each enters the environment's ordered queue.
    let got = plan(env_run(EnvironmentGate::Open), wave.clone());
    let mut want = Vec::new();
    for job in 0..20 {
        want.push(Verdict::EnterGroup {
            job,
            key: "environment:production".into(),
            cancel_in_progress: false,
            ordered: true,
        });
        want.push(ready(job));
    }
    assert_eq!(got, want);
    // Rejected: every expansion is cancelled, and the run ends failed.
    let got = plan(env_run(EnvironmentGate::Rejected("rejected by alice".into())), wave[..2].to_vec());
    assert_eq!(
        got,
        vec![
            Verdict::Reject { job: 0, why: "rejected by alice".into() },
            Verdict::Reject { job: 1, why: "rejected by alice".into() },
            Verdict::Finish(RunStatus::Failed),
        ]
    );
    // A job not deploying to the gated environment is not held.
    let other = vec![j("build", Pending, &[]), deploy(j("ship", Pending, &["build"]), "staging")];
    assert_eq!(plan(env_run(EnvironmentGate::Waiting(waiting)), other)[0], ready(0));
}

#[test]
fn a_deploy_job_its_provenance_policy_refuses_is_cancelled_before_any_approval_and_fails_the_run() {
    let why = "cancelled: provenance check `ref` failed for artifact `app` (generation g1): …".to_string();
    let refused = |gate: EnvironmentGate| AdvanceRun {
        environments: [("production".to_string(), gate)].into_iter().collect(),
        refused: [("deploy".to_string(), why.clone())].into_iter().collect(),
        ..run(RunStatus::Running)
    };
    let jobs = vec![j("build", Success, &[]), deploy(j("deploy", Pending, &["build"]), "production")];
    for gate in [EnvironmentGate::Open, EnvironmentGate::Waiting("waiting".into())] {
        assert_eq!(
            plan(refused(gate), jobs.clone()),
            vec![Verdict::Reject { job: 1, why: why.clone() }, Verdict::Finish(RunStatus::Failed)]
        );
    }
    // Not refused: it queues as any approved deploy job.
    let open = AdvanceRun { refused: Default::default(), ..refused(EnvironmentGate::Open) };
    assert_eq!(
        plan(open, jobs.clone()),
        vec![
            Verdict::EnterGroup {
                job: 1,
                key: "environment:production".into(),
                cancel_in_progress: false,
                ordered: true
            },
            ready(1),
        ]
    );
    // A job that would be skipped is skipped, not refused.
    let failed = vec![j("build", Failed, &[]), deploy(j("deploy", Pending, &["build"]), "production")];
    let got = plan(refused(EnvironmentGate::Open), failed);
    assert_eq!(got[0], skip(1, "skipped: a job it needs did not succeed"));
}

/// Rings (issue 46): a ring after the first waits for its promotion once
/// the ring before deployed — before its environment's approval and queue
/// are asked — and a failed gate cancels it and fails the run.
#[test]
fn a_later_ring_waits_for_its_promotion_and_a_failed_gate_cancels_it() {
    let ring = |name: &str, status: JobStatus, needs: &[&str], promotion: bool| {
        with(deploy(j(name, status, needs), "production"), |r| r.promotion = promotion)
    };
    let jobs = |canary: JobStatus| {
        vec![
            j("build", Success, &[]),
            ring("deploy (canary)", canary, &["build"], false),
            ring("deploy (all)", Pending, &["deploy (canary)"], true),
        ]
    };
    let with_gate = |gate: Option<PromotionGate>, env: EnvironmentGate| AdvanceRun {
        environments: [("production".to_string(), env)].into_iter().collect(),
        promotions: gate.into_iter().map(|g| ("deploy (all)".to_string(), g)).collect(),
        ..run(RunStatus::Running)
    };
    let enter = |job| Verdict::EnterGroup {
        job,
        key: "environment:production".into(),
        cancel_in_progress: false,
        ordered: true,
    };
    let baking = PromotionGate::Waiting("baking".into());
    // The ring before still deploys: nothing is asked yet.
    assert_eq!(plan(with_gate(Some(baking.clone()), EnvironmentGate::Open), jobs(Running)), vec![]);
    // Deployed: the next ring waits for its gate, whatever the approval says.
    for env in [EnvironmentGate::Open, EnvironmentGate::Waiting("approve".into())] {
        assert_eq!(
            plan(with_gate(Some(baking.clone()), env), jobs(Success)),
            vec![Verdict::WaitPromotion { job: 2, message: "baking".into() }]
        );
    }
    // No gate row yet: it waits too.
    let got = plan(with_gate(None, EnvironmentGate::Open), jobs(Success));
    assert!(matches!(&got[..], [Verdict::WaitPromotion { job: 2, .. }]), "{got:?}");
    // Open: the approval and the queue decide as for any deploy job.
    assert_eq!(
        plan(with_gate(Some(PromotionGate::Open), EnvironmentGate::Open), jobs(Success)),
        vec![enter(2), ready(2)]
    );
    assert_eq!(
        plan(with_gate(Some(PromotionGate::Open), EnvironmentGate::Waiting("approve".into())), jobs(Success)),
        vec![Verdict::WaitApproval { job: 2, message: "approve".into() }]
    );
    // Failed: cancelled with the gate's message; the run fails.
    let why = "cancelled: the gate after ring `canary` failed".to_string();
    assert_eq!(
        plan(with_gate(Some(PromotionGate::Failed(why.clone())), EnvironmentGate::Open), jobs(Success)),
        vec![Verdict::Reject { job: 2, why }, Verdict::Finish(RunStatus::Failed)]
    );
    // The ring before failed: the next is skipped, its gate never asked.
    let got = plan(with_gate(Some(baking), EnvironmentGate::Open), jobs(Failed));
    assert_eq!(got, vec![skip(2, NEED_FAILED), Verdict::Finish(RunStatus::Failed)]);
}
