//! The claim transaction (spec 000 §7; invariant 2).

use super::*;
use kiln_core::RunStatus;

pub async fn claim_creates_epoch_one_and_starts_the_run<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (repo, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    s.put_secret(&repo.id, kiln_store::CLONE_CREDENTIAL, "sealed clone credential").await.unwrap();
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let generation = s.get_job(&build).await.unwrap().dispatch_generation;

    let c = try_claim(s, &a, &build, generation, LONG_TTL).await.expect("claim of a ready job");
    // With the repository as it is read alone (its credential included),
    // for the assignment.
    let read = s.get_repo(&repo.id).await.unwrap();
    assert_eq!(read.clone_credential.as_deref(), Some("sealed clone credential"));
    assert_eq!(format!("{:?}", c.repo), format!("{:?}", Some(read)));
    assert_eq!(c.epoch, 1);
    assert_eq!(c.job.id, build);
    assert_eq!(c.job.status, JobStatus::Running);
    assert_eq!(c.job.current_epoch, 1);
    assert_eq!(c.run.id, run_id);
    assert_eq!(c.run.status, RunStatus::Running);

    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Running);
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Running);
    assert_eq!(b.job.current_epoch, 1);
    assert!(b.job.started_at.is_some());
    assert_eq!(b.attempts.len(), 1);
    let at = &b.attempts[0];
    assert_eq!((at.epoch, at.outcome), (1, AttemptOutcome::Running));
    assert_eq!(at.agent_id, a.id);
    assert_eq!(at.session_id, a.session_id);
    assert_eq!(at.lease_deadline, c.lease_deadline);
    // The lease is `ttl` from the claim, in database time.
    let lease = at.lease_deadline - at.started_at;
    assert!((LONG_TTL - 1000..=LONG_TTL + 1000).contains(&lease), "lease of {lease} ms");
    assert_eq!(jv(&v, "test").job.status, JobStatus::Pending);
}

pub async fn duplicate_delivery_is_absorbed<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let b = agent(s, "b", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let generation = s.get_job(&build).await.unwrap().dispatch_generation;
    try_claim(s, &a, &build, generation, LONG_TTL).await.expect("first claim");
    let before = snapshot(s, &run_id).await;

    // The same (job, generation) delivered again, to another agent or the same one.
    assert!(try_claim(s, &b, &build, generation, LONG_TTL).await.is_none());
    assert!(try_claim(s, &a, &build, generation, LONG_TTL).await.is_none());
    assert_eq!(snapshot(s, &run_id).await, before, "an absorbed duplicate changes nothing");

    // A job whose needs have not succeeded cannot be claimed whatever the generation.
    let test = job_id(s, &run_id, "test").await;
    for g in 0..3 {
        assert!(try_claim(s, &b, &test, g, LONG_TTL).await.is_none());
    }
    // Neither can a job that does not exist.
    assert!(try_claim(s, &b, "no-such-job", 1, LONG_TTL).await.is_none());
    assert_eq!(snapshot(s, &run_id).await, before);
}

pub async fn stale_dispatch_generation_is_refused<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let g1 = s.get_job(&build).await.unwrap().dispatch_generation;
    let before = snapshot(s, &run_id).await;
    assert!(try_claim(s, &a, &build, g1 - 1, LONG_TTL).await.is_none());
    assert!(try_claim(s, &a, &build, g1 + 1, LONG_TTL).await.is_none());
    assert_eq!(snapshot(s, &run_id).await, before);

    // An infrastructure failure makes the job ready under a new generation:
    // the old delivery is stale from then on.
    let c1 = try_claim(s, &a, &build, g1, LONG_TTL).await.unwrap();
    assert_eq!(s.complete(&build, c1.epoch, infra_failure()).await.unwrap(), "ready");
    let g2 = s.get_job(&build).await.unwrap().dispatch_generation;
    assert!(g2 > g1);
    assert!(try_claim(s, &a, &build, g1, LONG_TTL).await.is_none());
    let c2 = try_claim(s, &a, &build, g2, LONG_TTL).await.expect("current generation");
    assert_eq!(c2.epoch, 2);
}

pub async fn claim_in_cancelled_run_is_refused<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let a = agent(s, "a", 4).await;

    // Cancelled while queued.
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let build = job_id(s, &run_id, "build").await;
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    s.cancel_run(&run_id).await.unwrap();
    assert!(try_claim(s, &a, &build, g, LONG_TTL).await.is_none());
    let v = view(s, &run_id).await;
    assert_eq!(v.run.status, RunStatus::Cancelled);
    assert!(v.jobs[0].attempts.is_empty());

    // Cancelled while another job runs: the run is cancelling, not active.
    let (_, run_id) = start(s, workflow(vec![job("x", &[], 0), job("y", &[], 0)])).await;
    let x = job_id(s, &run_id, "x").await;
    let y = job_id(s, &run_id, "y").await;
    let gy = s.get_job(&y).await.unwrap().dispatch_generation;
    claim(s, &a, &x, LONG_TTL).await;
    assert_eq!(s.cancel_run(&run_id).await.unwrap().status, RunStatus::Cancelling);
    assert!(try_claim(s, &a, &y, gy, LONG_TTL).await.is_none());
    assert!(jv(&view(s, &run_id).await, "y").attempts.is_empty());
}

pub async fn claim_respects_agent_capacity<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("x", &[], 0), job("y", &[], 0), job("z", &[], 0)])).await;
    let one = agent(s, "one", 1).await;
    let other = agent(s, "other", 1).await;
    let x = job_id(s, &run_id, "x").await;
    let y = job_id(s, &run_id, "y").await;
    let z = job_id(s, &run_id, "z").await;
    let gy = s.get_job(&y).await.unwrap().dispatch_generation;
    claim(s, &one, &x, LONG_TTL).await;

    // Full: declined, and the job stays ready under the same generation.
    assert!(try_claim(s, &one, &y, gy, LONG_TTL).await.is_none());
    let yj = s.get_job(&y).await.unwrap();
    assert_eq!((yj.status, yj.dispatch_generation, yj.current_epoch), (JobStatus::Ready, gy, 0));
    // The same delivery remains claimable by an agent with room.
    assert_eq!(try_claim(s, &other, &y, gy, LONG_TTL).await.expect("other agent has room").epoch, 1);

    // Completion releases the slot.
    s.complete(&x, 1, success()).await.unwrap();
    assert_eq!(claim(s, &one, &z, LONG_TTL).await.epoch, 1);
}

pub async fn claim_requires_the_current_session<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let b = agent(s, "b", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    let before = snapshot(s, &run_id).await;

    let mut replaced = claim_input(&a, &build, g, LONG_TTL);
    replaced.session_id = uuid::Uuid::new_v4().to_string();
    let mut foreign = claim_input(&a, &build, g, LONG_TTL);
    foreign.session_id = b.session_id.clone();
    let mut unknown = claim_input(&a, &build, g, LONG_TTL);
    unknown.agent_id = "no-such-agent".into();
    for req in [replaced, foreign, unknown] {
        match s.claim(req.clone()).await {
            Err(StoreError::Unavailable(e)) => panic!("a bad session is not an outage: {e}"),
            Err(_) => {}
            Ok(c) => panic!("claim with session {} of agent {} accepted: {c:?}", req.session_id, req.agent_id),
        }
    }
    assert_eq!(snapshot(s, &run_id).await, before, "a refused claim changes nothing");
    assert_eq!(try_claim(s, &a, &build, g, LONG_TTL).await.expect("the real session").epoch, 1);
}

pub async fn claim_request_id_is_idempotent<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    let req = claim_input(&a, &build, g, LONG_TTL);

    let first = s.claim(req.clone()).await.unwrap().expect("first claim");
    assert_eq!(first.epoch, 1);
    // The acknowledgement was lost; the agent retries the same request.
    let retried = s.claim(req.clone()).await.unwrap().expect("retried claim returns the attempt");
    assert_eq!(retried.epoch, 1, "a retried claim must not create epoch 2");
    assert_eq!(retried.job.id, build);
    assert_eq!(retried.lease_deadline, first.lease_deadline);
    let recovered =
        s.claimed_by_request(&req.claim_request_id, &req.session_id).await.unwrap().expect("recover by request id");
    assert_eq!((recovered.epoch, recovered.job.id.as_str()), (1, build.as_str()));
    assert_eq!(recovered.run.id, run_id);
    let v = view(s, &run_id).await;
    assert_eq!(v.jobs[0].attempts.len(), 1);
    assert_eq!(v.jobs[0].job.current_epoch, 1);

    assert!(s.claimed_by_request("never-sent", &req.session_id).await.unwrap().is_none());
    // Another session (another agent that learned the request id) recovers
    // nothing: the assignment is the claiming session's alone.
    let other = agent(s, "b", 4).await;
    assert!(s.claimed_by_request(&req.claim_request_id, &other.session_id).await.unwrap().is_none());

    // Once the attempt ended it is no longer a live ticket.
    s.complete(&build, 1, success()).await.unwrap();
    assert!(s.claimed_by_request(&req.claim_request_id, &req.session_id).await.unwrap().is_none());
    assert!(s.claim(req).await.unwrap().is_none());
    assert_eq!(view(s, &run_id).await.jobs[0].attempts.len(), 1);
}

/// Compatibility is checked by the claim itself, not only by queue routing:
/// an agent without the labels a job's `runs-on` requires cannot claim it.
pub async fn claim_requires_compatible_labels<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let mut big = job("big", &[], 0);
    big.runs_on = [("size".to_string(), "large".to_string())].into();
    let (_, run_id) = start(s, workflow(vec![big])).await;
    let small = agent(s, "small", 4).await;
    let large = s.register_agent("large", r#"{"os":"linux","size":"large"}"#, 4).await.unwrap();
    let id = job_id(s, &run_id, "big").await;
    let generation = s.get_job(&id).await.unwrap().dispatch_generation;
    assert!(try_claim(s, &small, &id, generation, LONG_TTL).await.is_none(), "an incompatible agent claimed");
    assert_eq!(job_status(s, &id).await, JobStatus::Ready, "the job stays eligible");
    let c = try_claim(s, &large, &id, generation, LONG_TTL).await.expect("a compatible agent claims");
    assert_eq!(c.epoch, 1);
}

/// Many agents claim one job at once (the same delivery seen by several
/// replicas): exactly one attempt is created, epoch 1, and every other claim
/// is declined without error.
pub async fn concurrent_claims_of_one_job_create_one_attempt<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let (_, run_id) = start(&*fx.store, workflow(vec![job("build", &[], 0)])).await;
    let build = job_id(&*fx.store, &run_id, "build").await;
    let g = fx.store.get_job(&build).await.unwrap().dispatch_generation;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let s = fx.store.clone();
        let a = agent(&*s, &format!("racer-{i}"), 4).await;
        let build = build.clone();
        tasks.push(tokio::spawn(async move { s.claim(claim_input(&a, &build, g, LONG_TTL)).await }));
    }
    let mut won = Vec::new();
    for t in tasks {
        if let Some(c) = t.await.unwrap().expect("a racing claim is declined, not an error") {
            won.push(c);
        }
    }
    assert_eq!(won.len(), 1, "exactly one claim wins: {won:?}");
    assert_eq!(won[0].epoch, 1);
    let v = view(&*fx.store, &run_id).await;
    assert_eq!(jv(&v, "build").attempts.len(), 1);
    assert_eq!((jv(&v, "build").job.status, jv(&v, "build").job.current_epoch), (JobStatus::Running, 1));
}

/// One agent claims many jobs at once: its capacity is never exceeded, and
/// the claims it declined leave their jobs ready.
pub async fn concurrent_claims_never_exceed_agent_capacity<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    // One job per run: no run lock puts these claims in a line.
    let mut jobs = Vec::new();
    for _ in 0..10 {
        let (_, run_id) = start(&*fx.store, workflow(vec![job("j", &[], 0)])).await;
        jobs.push(job_id(&*fx.store, &run_id, "j").await);
    }
    let a = agent(&*fx.store, "small", 3).await;
    let mut tasks = Vec::new();
    for id in &jobs {
        let s = fx.store.clone();
        let g = s.get_job(id).await.unwrap().dispatch_generation;
        let (a, id) = (a.clone(), id.clone());
        tasks.push(tokio::spawn(async move { s.claim(claim_input(&a, &id, g, LONG_TTL)).await }));
    }
    let mut won = 0;
    for t in tasks {
        won += usize::from(t.await.unwrap().expect("a declined claim is not an error").is_some());
    }
    assert_eq!(won, 3, "the agent gets exactly its 3 slots");
    let mut running = 0;
    for id in &jobs {
        match fx.store.get_job(id).await.unwrap().status {
            JobStatus::Running => running += 1,
            JobStatus::Ready => {}
            other => panic!("job {id} is {other:?}"),
        }
    }
    assert_eq!(running, 3);
}

/// The same claim request sent twice at once (a retry racing the original)
/// for two different jobs: one attempt, and whichever answers gets that one.
pub async fn concurrent_retries_of_one_claim_request_create_one_attempt<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let (_, run_id) = start(&*fx.store, workflow(vec![job("x", &[], 0), job("y", &[], 0)])).await;
    let a = agent(&*fx.store, "a", 4).await;
    let mut reqs = Vec::new();
    for n in ["x", "y", "x", "y"] {
        let id = job_id(&*fx.store, &run_id, n).await;
        let g = fx.store.get_job(&id).await.unwrap().dispatch_generation;
        let mut r = claim_input(&a, &id, g, LONG_TTL);
        r.claim_request_id = "one-request".into();
        reqs.push(r);
    }
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let s = fx.store.clone();
            tokio::spawn(async move { s.claim(r).await })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        if let Some(c) = t.await.unwrap().expect("claim must not error") {
            got.push((c.job.id, c.epoch));
        }
    }
    let v = view(&*fx.store, &run_id).await;
    let attempts: usize = v.jobs.iter().map(|j| j.attempts.len()).sum();
    assert_eq!(attempts, 1, "one claim request creates one attempt: {v:#?}");
    assert!(!got.is_empty());
    assert!(got.iter().all(|g| *g == got[0]), "every answer is that attempt: {got:?}");
}

/// Placement is part of the claim (invariant 12): an untrusted job is
/// claimed only by a container agent of a pool that takes untrusted work, a
/// job with `image:` only by a container executor, and a trusted job handed
/// secrets or an identity token only by an agent of the repository's secret
/// pools. A refused claim changes nothing and says what the job needs.
pub async fn claim_follows_trust_and_isolation<S: Store + 'static>(o: &Opener<S>) {
    use kiln_core::claim::{Executor, JobPlacement, PlacementRefusal as P, UntrustedPolicy};
    use kiln_workflow::{IdToken, Image};
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let linux = r#"{"os":"linux"}"#;
    let host = s.register_agent("trusted-host", linux, 4).await.unwrap();
    let forks_host = s.register_agent_in("forks-host", linux, 4, "forks", None).await.unwrap();
    let forks_box = s.register_agent_in("forks-box", linux, 4, "forks", None).await.unwrap();
    s.set_agent_executor(&forks_box.id, Executor::Container).await.unwrap();
    let default_box = s.register_agent("default-box", linux, 4).await.unwrap();
    s.set_agent_executor(&default_box.id, Executor::Container).await.unwrap();
    assert_eq!(s.get_agent(&forks_box.id).await.unwrap().executor, Executor::Container);
    assert_eq!(s.get_agent(&host.id).await.unwrap().executor, Executor::Host, "unsaid: a host executor");
    let policy = UntrustedPolicy::default();
    let placed = |a: &AgentRecord, job: &str, g: i64| ClaimInput {
        untrusted: policy.clone(),
        ..claim_input(a, job, g, LONG_TTL)
    };
    let misplaced = |o: ClaimOutcome| match o {
        ClaimOutcome::Misplaced(needs, why) => (needs, why),
        other => panic!("expected a placement refusal, got {other:?}"),
    };

    // A fork's job, its `runs-on` naming the trusted host agent's labels.
    let repo = repo(s).await;
    let fork = s
        .accept_run(NewRun { trust: "untrusted".into(), ..new_run(&repo.id, workflow(vec![job("pr", &[], 0)])) })
        .await
        .unwrap()
        .run_id;
    let pr = job_id(s, &fork, "pr").await;
    let g = s.get_job(&pr).await.unwrap().dispatch_generation;
    let before = snapshot(s, &fork).await;
    for a in [&host, &forks_host, &default_box] {
        let (needs, why) = misplaced(s.claim_placed(placed(a, &pr, g)).await.unwrap());
        assert_eq!((needs.untrusted, why), (true, P::Untrusted), "{}", a.name);
    }
    assert!(s.claim(placed(&host, &pr, g)).await.unwrap().is_none());
    assert_eq!(snapshot(s, &fork).await, before, "a refused placement changes nothing");
    assert_eq!(job_status(s, &pr).await, JobStatus::Ready);
    let c = s.claim(placed(&forks_box, &pr, g)).await.unwrap().expect("the forks container agent claims");
    assert_eq!(c.epoch, 1);

    // `image:`: never a host executor, whatever the trust.
    let mut boxed = job("boxed", &[], 0);
    boxed.image = Some(Image::Ref { reference: "127.0.0.1:5000/kiln-test/base:latest".into() });
    let (_, run) = start(s, workflow(vec![boxed])).await;
    let id = job_id(s, &run, "boxed").await;
    let g = s.get_job(&id).await.unwrap().dispatch_generation;
    let (needs, why) = misplaced(s.claim_placed(placed(&host, &id, g)).await.unwrap());
    assert_eq!(
        needs,
        JobPlacement {
            untrusted: false,
            container: true,
            credential_pools: None,
            absolute_cache: false,
            pinned_agent: None
        }
    );
    assert_eq!(why, P::Container);
    s.claim(placed(&default_box, &id, g)).await.unwrap().expect("a container agent claims");

    // Secrets, or an identity token: only the repository's secret pools
    // (`default` unless set), read at the claim.
    for (name, secrets, id_token) in
        [("deploy", vec!["TOKEN".to_string()], None), ("oidc", vec![], Some(IdToken::default()))]
    {
        let mut j = job(name, &[], 0);
        (j.secrets, j.id_token) = (secrets, id_token);
        let (repo, run) = start(s, workflow(vec![j])).await;
        let id = job_id(s, &run, name).await;
        let g = s.get_job(&id).await.unwrap().dispatch_generation;
        let (needs, why) = misplaced(s.claim_placed(placed(&forks_box, &id, g)).await.unwrap());
        assert_eq!((needs.credential_pools, why), (Some(vec!["default".to_string()]), P::CredentialPool), "{name}");
        s.set_secret_pools(&repo.id, &["forks".to_string()]).await.unwrap();
        assert!(matches!(s.claim_placed(placed(&host, &id, g)).await.unwrap(), ClaimOutcome::Misplaced(..)), "{name}");
        s.claim(placed(&forks_box, &id, g)).await.unwrap().expect("an agent of the allowed pool claims");
    }
}
