//! Deployment environments (issue 46): one approval per run covers every
//! expansion of a deploy matrix; a rejection cancels them; deploy jobs of
//! one environment run one run at a time, in acceptance order, and nothing
//! waiting is superseded unless the job says `queue: supersede-pending`.

use super::*;
use kiln_core::RunStatus;

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
