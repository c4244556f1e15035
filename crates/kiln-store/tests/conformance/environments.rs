//! Deployment environments (issue 46): one approval per run covers every
//! expansion of a deploy matrix; a rejection cancels them; deploy jobs of
//! one environment run one run at a time, in acceptance order, and nothing
//! waiting is superseded unless the job says `queue: supersede-pending`.

use super::*;
use kiln_core::RunStatus;
use std::collections::BTreeSet;

fn wf(yaml: &str) -> Workflow {
    kiln_workflow::parse(yaml).unwrap_or_else(|d| panic!("workflow does not parse:\n{d}"))
}

fn env(name: &str, approvers: &[&str], min: u32) -> EnvironmentRecord {
    EnvironmentRecord {
        name: name.into(),
        approvers: approvers.iter().map(|a| a.to_string()).collect(),
        min_approvals: min,
        approval_ttl_ms: 30 * 86_400_000,
        ..Default::default()
    }
}

fn decision(run: &str, env: &str, actor: &str, decision: &str) -> ApprovalRecord {
    ApprovalRecord {
        run_id: run.into(),
        environment: env.into(),
        actor: actor.into(),
        decision: decision.into(),
        comment: Some("looks good".into()),
        created_at: 0,
        expires_at: 0,
    }
}

const MATRIX_DEPLOY: &str = "version: 1\njobs:\n  - name: deploy\n    environment: {name: production, url: https://shop.example}\n    matrix: {region: [r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, r16, r17, r18, r19, r20]}\n    steps: [x]\n";

async fn statuses<S: Store>(s: &S, run: &str) -> Vec<JobStatus> {
    view(s, run).await.jobs.iter().map(|j| j.job.status).collect()
}

pub async fn one_approval_covers_every_expansion_and_a_rejection_cancels_them<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    s.put_environment(&env("production", &["alice", "bob"], 2), true).await.unwrap();
    assert!(matches!(s.put_environment(&env("production", &[], 0), true).await, Err(StoreError::Conflict(_))));
    assert!(matches!(s.put_environment(&env("bad name", &[], 0), true).await, Err(StoreError::Invalid(_))));
    assert!(
        matches!(s.put_environment(&env("x", &["alice"], 2), true).await, Err(StoreError::Invalid(_))),
        "2 approvals from 1 approver can never be met"
    );
    let run = s.accept_run(new_run(&r.id, wf(MATRIX_DEPLOY))).await.unwrap().run_id;
    let v = view(s, &run).await;
    assert_eq!(v.jobs.len(), 20);
    assert!(v.jobs.iter().all(|j| j.job.status == JobStatus::Pending), "all 20 wait for approval");
    let msg = v.jobs[0].job.message.clone().unwrap_or_default();
    assert!(msg.contains("waiting for approval to deploy to `production`: 0 of 2"), "{msg}");
    s.decide_deployment(&decision(&run, "production", "alice", "approved")).await.unwrap();
    assert!(
        matches!(
            s.decide_deployment(&decision(&run, "production", "alice", "approved")).await,
            Err(StoreError::Conflict(_))
        ),
        "one approver counts once"
    );
    assert!(statuses(s, &run).await.iter().all(|st| *st == JobStatus::Pending), "1 of 2 is not enough");
    let msg = view(s, &run).await.jobs[0].job.message.clone().unwrap_or_default();
    assert!(msg.contains("1 of 2"), "{msg}");
    s.decide_deployment(&decision(&run, "production", "bob", "approved")).await.unwrap();
    assert!(statuses(s, &run).await.iter().all(|st| *st == JobStatus::Ready), "one approval (of 2) for all 20");
    assert_eq!(s.run_approvals(&run).await.unwrap().len(), 2);
    // An environment the run does not deploy to.
    s.put_environment(&env("staging", &[], 1), true).await.unwrap();
    assert!(matches!(
        s.decide_deployment(&decision(&run, "staging", "alice", "approved")).await,
        Err(StoreError::Invalid(_))
    ));

    // A retry is a new run: it needs its own approvals.
    let again = s.accept_run(new_run(&r.id, wf(MATRIX_DEPLOY))).await.unwrap().run_id;
    assert!(statuses(s, &again).await.iter().all(|st| *st == JobStatus::Pending));
    // A rejection cancels every expansion; the run ends failed.
    s.decide_deployment(&ApprovalRecord {
        comment: Some("not today".into()),
        ..decision(&again, "production", "bob", "rejected")
    })
    .await
    .unwrap();
    let v = view(s, &again).await;
    assert!(v.jobs.iter().all(|j| j.job.status == JobStatus::Cancelled));
    assert_eq!(
        v.jobs[0].job.message.as_deref(),
        Some("cancelled: deployment to `production` rejected by bob: not today")
    );
    assert_eq!(v.run.status, RunStatus::Failed);
    assert!(
        matches!(
            s.decide_deployment(&decision(&again, "production", "alice", "approved")).await,
            Err(StoreError::Conflict(_))
        ),
        "an ended run takes no decision"
    );
    // A live deploy keeps its environment.
    assert!(matches!(s.delete_environment("production").await, Err(StoreError::Conflict(_))));
    assert_eq!(s.delete_environment("staging").await.unwrap().name, "staging");
    assert!(matches!(s.get_environment("staging").await, Err(StoreError::NotFound(_))));
}

fn two_wave(queue: &str) -> Workflow {
    wf(&format!(
        "version: 1\njobs:\n  - name: deploy\n    environment: production\n    concurrency: {{queue: {queue}}}\n    matrix: {{wave: [a, b]}}\n    steps: [x]\n"
    ))
}

pub async fn an_environments_deploys_run_one_run_at_a_time_in_order<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 64).await;
    s.put_environment(&env("production", &[], 0), true).await.unwrap();
    let mut runs = Vec::new();
    for _ in 0..10 {
        runs.push(s.accept_run(new_run(&r.id, two_wave("ordered"))).await.unwrap().run_id);
    }
    // The first run's two deploy jobs share its place; the others wait, none superseded.
    assert_eq!(statuses(s, &runs[0]).await, vec![JobStatus::Ready, JobStatus::Ready]);
    for run in &runs[1..] {
        assert_eq!(statuses(s, run).await, vec![JobStatus::Pending, JobStatus::Pending], "{run}");
        let msg = view(s, run).await.jobs[0].job.message.clone().unwrap_or_default();
        assert!(msg.contains("waiting for environment `production`"), "{msg}");
    }
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(statuses(s, run).await, vec![JobStatus::Ready, JobStatus::Ready], "run {i} is next");
        if let Some(next) = runs.get(i + 1) {
            assert_eq!(statuses(s, next).await, vec![JobStatus::Pending, JobStatus::Pending]);
        }
        for job in view(s, run).await.jobs.iter().map(|j| j.job.id.clone()).collect::<Vec<_>>() {
            let c = claim(s, &ag, &job, LONG_TTL).await;
            s.complete(&job, c.epoch, success()).await.unwrap();
        }
        assert_eq!(view(s, run).await.run.status, RunStatus::Success, "run {i} deployed, none cancelled");
    }
    // Each deploy job that ended is a deployment row, newest first.
    let deployed = s.deployments("production", 100).await.unwrap();
    assert_eq!(deployed.len(), 20);
    assert!(deployed.iter().all(|d| d.status == "success" && d.environment == "production"));
    assert_eq!(deployed[0].run_id, runs[9], "newest first");
    assert_eq!(deployed.last().unwrap().run_id, runs[0]);
    assert_eq!(s.deployments("production", 3).await.unwrap().len(), 3);

    // supersede-pending: said on the superseded run.
    let a = s.accept_run(new_run(&r.id, two_wave("supersede-pending"))).await.unwrap().run_id;
    let b = s.accept_run(new_run(&r.id, two_wave("supersede-pending"))).await.unwrap().run_id;
    let c = s.accept_run(new_run(&r.id, two_wave("supersede-pending"))).await.unwrap().run_id;
    assert_eq!(statuses(s, &a).await, vec![JobStatus::Ready, JobStatus::Ready]);
    let vb = view(s, &b).await;
    assert!(vb.jobs.iter().all(|j| j.job.status == JobStatus::Cancelled), "b waited and was superseded by c");
    assert!(vb.jobs[0].job.message.as_deref().unwrap_or("").contains("superseded"));
    assert_eq!(statuses(s, &c).await, vec![JobStatus::Pending, JobStatus::Pending]);
}

/// `kiln env create --wait`: an approved (here: unprotected) deploy job is
/// ready but not claimable, and not relayed, until the wait is over.
pub async fn an_environments_wait_delays_its_deploy_jobs<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 4).await;
    s.put_environment(&EnvironmentRecord { wait_ms: 600_000, ..env("production", &[], 0) }, true).await.unwrap();
    let run = s.accept_run(new_run(&r.id, two_wave("ordered"))).await.unwrap().run_id;
    let v = view(s, &run).await;
    let job = &v.jobs[0].job;
    assert_eq!(job.status, JobStatus::Ready);
    let at = job.next_attempt_at.expect("a ready time after the wait");
    assert!(at >= v.run.created_at + 600_000, "ready at {at}, accepted at {}", v.run.created_at);
    assert!(
        try_claim(s, &ag, &job.id, job.dispatch_generation, LONG_TTL).await.is_none(),
        "not claimable before its environment's wait is over"
    );
}

/// `build` publishes `app` (restored by `deploy`) and `log`, both with
/// `expire-in: 0`; `lint` fails on its own; `deploy` deploys `app` to
/// production.
fn build_and_deploy() -> Workflow {
    let mut w = wf(
        "version: 1\njobs:\n  - name: build\n    steps: [x]\n    artifacts:\n      publish:\n        - {name: app, path: out/app, expire-in: 1s}\n        - {name: log, path: out/log, expire-in: 1s}\n  - name: lint\n    steps: [x]\n  - name: deploy\n    needs: [build]\n    environment: production\n    steps: [x]\n    artifacts:\n      restore: [{name: app, from_job: build, path: app}]\n",
    );
    // Due as soon as the run ends.
    for p in &mut w.jobs[0].artifacts.publish {
        p.expire_in_secs = Some(0);
    }
    w
}

/// One run of [`build_and_deploy`] to its end; `app` has the bytes `sha`.
/// Returns the run and its `app` generation.
async fn deploy_once<S: Store>(s: &S, repo_id: &str, ag: &AgentRecord, sha: &str) -> (String, String) {
    let run = s.accept_run(new_run(repo_id, build_and_deploy())).await.unwrap().run_id;
    let build = job_id(s, &run, "build").await;
    claim(s, ag, &build, LONG_TTL).await;
    let mut app = String::new();
    for (name, sha) in [("app", sha), ("log", "f".repeat(64).as_str())] {
        let g = NewGeneration { name, size: 10, sha256: sha, part_size: 1 << 20, kind: "file" };
        let g = s.open_generation(&build, 1, g).await.unwrap();
        s.seal_generation(&g.id, &build, 1).await.unwrap();
        if name == "app" {
            app = g.id;
        }
    }
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    let lint = job_id(s, &run, "lint").await;
    claim(s, ag, &lint, LONG_TTL).await;
    s.complete(&lint, 1, failure(1)).await.unwrap();
    let deploy = job_id(s, &run, "deploy").await;
    claim(s, ag, &deploy, LONG_TTL).await;
    assert_eq!(s.complete(&deploy, 1, success()).await.unwrap(), "success");
    (run, app)
}

/// Rollback as a pointer flip (issue 46): the generations a deployment
/// restored are pinned against expiry while it is the environment's
/// current one or among its `keep_deployments` newest; a rollback is a
/// new run of the deployment's frozen run in which only the deploy job
/// runs — `build` pinned to the same generation (no attempt), `lint`
/// skipped — ready at once (no `--wait`), approved by whoever rolled back;
/// its deployment deploys the same sha256 and says what it returned to.
/// Bytes no longer pinned expire, and a rollback to them is refused with
/// nothing accepted.
pub async fn deployed_generations_are_pinned_and_a_rollback_deploys_them_again<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 8).await;
    let prod = EnvironmentRecord { keep_deployments: 2, ..env("production", &[], 0) };
    s.put_environment(&prod, true).await.unwrap();
    assert!(
        matches!(s.rollback_target("production", None).await, Err(StoreError::Conflict(_))),
        "nothing deployed yet"
    );
    let (sha1, sha2, sha4) = ("1".repeat(64), "2".repeat(64), "4".repeat(64));
    let (run1, app1) = deploy_once(s, &r.id, &ag, &sha1).await;
    let due = |v: Vec<BoundArtifact>| v.into_iter().map(|b| b.generation.id).collect::<BTreeSet<_>>();
    let expirable = due(s.expirable_artifacts(100).await.unwrap());
    assert!(!expirable.contains(&app1), "the deployed generation is pinned");
    assert!(!s.expire_artifact(&app1).await.unwrap(), "never expired while pinned");
    assert_eq!(expirable.len(), 1, "the build's `log`, not deployed, expires: {expirable:?}");
    assert!(
        matches!(s.rollback_target("production", None).await, Err(StoreError::Conflict(_))),
        "one deployment: nothing earlier to return to"
    );

    let (run2, app2) = deploy_once(s, &r.id, &ag, &sha2).await;
    let deploys = s.deployments("production", 10).await.unwrap();
    assert_eq!(deploys.len(), 2);
    let d1 = deploys[1].clone();
    assert_eq!(d1.run_id, run1);
    assert_eq!(s.rollback_target("production", None).await.unwrap().id, d1.id, "the one before the current");

    // The environment waits 10 minutes before a deploy; a rollback does not.
    s.put_environment(&EnvironmentRecord { wait_ms: 600_000, ..prod.clone() }, false).await.unwrap();
    let rb = NewRollback {
        deployment_id: d1.id.clone(),
        environment: "production".into(),
        approver: Some("alice".into()),
        comment: None,
    };
    let rollback = |rb: NewRollback, parent: &str| NewRun {
        parent_run_id: Some(parent.to_string()),
        event: "rollback".into(),
        rollback: Some(rb),
        ..new_run(&r.id, build_and_deploy())
    };
    let back = s.accept_run(rollback(rb.clone(), &run1)).await.unwrap().run_id;
    let v = view(s, &back).await;
    assert_eq!(v.run.rollback_of.as_deref(), Some(d1.id.as_str()));
    assert_eq!(jv(&v, "build").job.status, JobStatus::Success, "pinned: no build");
    assert!(jv(&v, "build").attempts.is_empty(), "no attempt of the build");
    assert_eq!(jv(&v, "lint").job.status, JobStatus::Skipped, "a rollback runs only the deploy jobs");
    let deploy = jv(&v, "deploy").job.clone();
    assert_eq!(deploy.status, JobStatus::Ready);
    assert!(
        try_claim(s, &ag, &deploy.id, deploy.dispatch_generation, LONG_TTL).await.is_some(),
        "claimable at once: no wait, the rollback is its approval"
    );
    let approvals = s.run_approvals(&back).await.unwrap();
    assert_eq!(approvals.len(), 1);
    assert_eq!((approvals[0].actor.as_str(), approvals[0].decision.as_str()), ("alice", "approved"));
    assert_eq!(s.resolve_binding(&back, "build", "app").await.unwrap().generation.id, app1, "the same bytes");
    assert_eq!(s.complete(&deploy.id, 1, success()).await.unwrap(), "success");
    let d3 = s.deployments("production", 1).await.unwrap().remove(0);
    assert_eq!(d3.rollback_of.as_deref(), Some(d1.id.as_str()));
    assert_eq!(d3.artifacts.len(), 1);
    assert_eq!((d3.artifacts[0].generation.as_str(), d3.artifacts[0].sha256.as_str()), (app1.as_str(), sha1.as_str()));
    // A wrong pairing of run and deployment is refused.
    assert!(matches!(s.accept_run(rollback(rb, &back)).await, Err(StoreError::Invalid(_))));

    // A newer deployment: keep 2 (it and the rollback's) — the second
    // deployment's bytes are no longer pinned and expire; a rollback to it
    // is refused and accepts nothing.
    s.put_environment(&prod, false).await.unwrap();
    let (_run4, _) = deploy_once(s, &r.id, &ag, &sha4).await;
    assert!(due(s.expirable_artifacts(100).await.unwrap()).contains(&app2));
    assert!(!due(s.expirable_artifacts(100).await.unwrap()).contains(&app1), "still pinned by the rollback's");
    assert!(s.expire_artifact(&app2).await.unwrap());
    let d2 = s.deployments("production", 10).await.unwrap().into_iter().find(|d| d.run_id == run2).unwrap();
    let target = s.rollback_target("production", Some(&d2.id)).await.unwrap();
    let runs_before = s.list_runs(&r.id, None, 500).await.unwrap().len();
    let refused = s
        .accept_run(rollback(
            NewRollback {
                deployment_id: target.id.clone(),
                environment: "production".into(),
                approver: None,
                comment: None,
            },
            &target.run_id,
        ))
        .await;
    assert!(matches!(&refused, Err(StoreError::Conflict(m)) if m.contains("expired")), "{refused:?}");
    assert_eq!(s.list_runs(&r.id, None, 500).await.unwrap().len(), runs_before, "nothing accepted");
    assert!(matches!(s.rollback_target("production", Some("no-such-deployment")).await, Err(StoreError::NotFound(_))));
}

const RINGS: &str = "version: 1\njobs:\n  - name: deploy\n    environment: production\n    rings:\n      - {name: canary, bake: 1h}\n      - name: early\n        gate: {prometheus: {query: errors, success: result < 0.05}}\n      - {name: all}\n    steps: [x]\n";

/// Rings (issue 46): a ring after the first waits for its promotion (bake,
/// then the gate) while its rollout keeps the environment's queue from
/// other runs; `pause`/`promote` act on the next promotion; a gate step is
/// written only once (conditional on what was read); a failed gate cancels
/// the rest, fails the run, frees the queue, and its rollback is claimed
/// once.
pub async fn a_rollout_holds_its_queue_between_rings_and_a_failed_gate_cancels_the_rest<S: Store + 'static>(
    o: &Opener<S>,
) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let ag = agent(s, "a", 8).await;
    s.put_environment(&env("production", &[], 0), true).await.unwrap();
    let a = s.accept_run(new_run(&r.id, wf(RINGS))).await.unwrap().run_id;
    let canary = job_id(s, &a, "deploy (canary)").await;
    claim(s, &ag, &canary, LONG_TTL).await;
    let b = s.accept_run(new_run(&r.id, wf(RINGS))).await.unwrap().run_id;
    assert_eq!(s.complete(&canary, 1, success()).await.unwrap(), "success");

    // Baking: the next ring waits and says so; nothing is due for an hour.
    let early = jv(&view(s, &a).await, "deploy (early)").job.clone();
    assert_eq!(early.status, JobStatus::Pending);
    let msg = early.message.unwrap_or_default();
    assert!(msg.contains("baking ring `canary` for 1h before promoting to `early`"), "{msg}");
    let gates = s.run_ring_gates(&a).await.unwrap();
    assert_eq!(gates.len(), 1, "{gates:?}");
    assert_eq!((gates[0].state.as_str(), gates[0].from_ring.as_str()), ("baking", "canary"));
    assert!(s.due_ring_gates().await.unwrap().is_empty(), "not baked yet");
    // The rollout holds the queue: the other run's canary waits.
    let other = jv(&view(s, &b).await, "deploy (canary)").job.clone();
    assert_eq!(other.status, JobStatus::Pending, "run A's rollout holds `production` between its rings");
    assert!(other.message.unwrap_or_default().contains("waiting for environment `production`"));

    // Pause, then promote: the bake is skipped, the ring deploys.
    let paused = s.manual_promotion(&a, "alice", Manual::Pause).await.unwrap();
    assert_eq!(paused.state, "paused");
    assert!(paused.message.contains("paused by alice before promoting to `early`"), "{}", paused.message);
    let held = jv(&view(s, &a).await, "deploy (early)").job.clone();
    assert_eq!(held.status, JobStatus::Pending);
    assert!(held.message.unwrap_or_default().contains("paused by alice"), "the waiting job says who paused it");
    assert!(s.due_ring_gates().await.unwrap().is_empty(), "a paused promotion is not due");
    let promoted = s.manual_promotion(&a, "alice", Manual::Promote).await.unwrap();
    assert_eq!(promoted.state, "promoted");
    assert_eq!(job_status(s, &early.id).await, JobStatus::Ready, "promoted: the bake is skipped");
    claim(s, &ag, &early.id, LONG_TTL).await;
    assert_eq!(s.complete(&early.id, 1, success()).await.unwrap(), "success");

    // The Prometheus gate after `early`: measuring at once (no bake).
    let all = job_id(s, &a, "deploy (all)").await;
    let due = s.due_ring_gates().await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!((due[0].job_id.as_str(), due[0].state.as_str()), (all.as_str(), "measuring"));
    assert!(due[0].gate.as_deref().unwrap_or_default().contains("errors"));
    let step = RingGateStep {
        job_id: all.clone(),
        from_state: "measuring".into(),
        from_measured: 0,
        state: "failed".into(),
        message: "result = 0.5 does not meet `result < 0.05`".into(),
        measured: 1,
        failures: 1,
        interval_ms: 0,
    };
    assert!(s.settle_ring_gate(&step).await.unwrap());
    assert!(!s.settle_ring_gate(&step).await.unwrap(), "a step read before is written once");
    let v = view(s, &a).await;
    let all_job = jv(&v, "deploy (all)").job.clone();
    assert_eq!(all_job.status, JobStatus::Cancelled);
    let msg = all_job.message.unwrap_or_default();
    assert!(msg.contains("not promoted to `all`: the gate after ring `early` failed: result = 0.5"), "{msg}");
    assert_eq!(v.run.status, RunStatus::Failed);
    // The queue is free again: the other run's canary may deploy.
    assert_eq!(job_status(s, &other.id).await, JobStatus::Ready);
    // The rollback after it is claimed once.
    let due = s.due_ring_gates().await.unwrap();
    assert_eq!(due.iter().map(|g| g.state.as_str()).collect::<Vec<_>>(), vec!["failed"]);
    assert!(s.claim_ring_rollback(&all, "asked").await.unwrap());
    assert!(!s.claim_ring_rollback(&all, "asked").await.unwrap());
    s.record_ring_rollback(&all, "run-x").await.unwrap();
    assert!(s.due_ring_gates().await.unwrap().is_empty());
    assert_eq!(s.run_ring_gates(&a).await.unwrap()[1].rollback.as_deref(), Some("run-x"));
    assert_conflict(s.manual_promotion(&a, "alice", Manual::Promote).await);
}

/// An untrusted run's Prometheus gate (issue 46) fails unmeasured when its
/// ring is reached: the query and its answers are the server's, and the
/// gate's messages would show them to a fork's pull request. The run's
/// next ring is cancelled saying so; nothing is due for the gate runner
/// but the rollback.
pub async fn an_untrusted_runs_prometheus_gate_fails_unmeasured<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    // A fork's work: a container agent of the `forks` pool.
    let ag = s.register_agent_in("forks-box", r#"{"os":"linux"}"#, 4, "forks", None).await.unwrap();
    s.set_agent_executor(&ag.id, kiln_core::claim::Executor::Container).await.unwrap();
    s.put_environment(&env("production", &[], 0), true).await.unwrap();
    let wf = wf(
        "version: 1\njobs:\n  - name: deploy\n    environment: production\n    rings:\n      - name: canary\n        gate: {prometheus: {query: errors, success: result < 0.05}}\n      - {name: all}\n    steps: [x]\n",
    );
    let run = s.accept_run(NewRun { trust: "untrusted".into(), ..new_run(&r.id, wf) }).await.unwrap().run_id;
    let canary = job_id(s, &run, "deploy (canary)").await;
    let g = s.get_job(&canary).await.unwrap().dispatch_generation;
    let input = ClaimInput {
        untrusted: kiln_core::claim::UntrustedPolicy::default(),
        ..claim_input(&ag, &canary, g, LONG_TTL)
    };
    s.claim(input).await.unwrap().expect("the forks container agent claims");
    assert_eq!(s.complete(&canary, 1, success()).await.unwrap(), "success");
    let v = view(s, &run).await;
    let all = jv(&v, "deploy (all)").job.clone();
    assert_eq!(all.status, JobStatus::Cancelled);
    let msg = all.message.unwrap_or_default();
    assert!(msg.contains("not measured: the run is untrusted"), "{msg}");
    let gates = s.run_ring_gates(&run).await.unwrap();
    assert_eq!((gates[0].state.as_str(), gates[0].measured), ("failed", 0));
    let due = s.due_ring_gates().await.unwrap();
    assert_eq!(due.len(), 1, "only its rollback is due: {due:?}");
    assert_eq!(due[0].state, "failed");
}
