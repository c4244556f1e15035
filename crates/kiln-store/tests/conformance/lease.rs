//! Leases, heartbeats and fencing in database time (spec 000 §8, §15;
//! invariants 3 and 6).

use super::*;
use kiln_core::RunStatus;
use kiln_core::backoff::DEFAULT_INFRA_RETRIES;
use std::collections::HashMap;

pub async fn heartbeat_extends_the_lease<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let c = claim(s, &a, &build, 300).await;

    let hb = s.heartbeat(&build, 1, 2_000).await.unwrap();
    assert!(!hb.cancel_requested);
    assert!(hb.lease_deadline > c.lease_deadline, "{hb:?} vs {}", c.lease_deadline);
    assert_eq!(jv(&view(s, &run_id).await, "build").attempts[0].lease_deadline, hb.lease_deadline);

    // Past the original lease, the extended one still holds.
    expire(300).await;
    assert!(s.fence_expired().await.unwrap().is_empty());
    let hb2 = s.heartbeat(&build, 1, 2_000).await.expect("extended lease is live");
    assert!(hb2.lease_deadline >= hb.lease_deadline);
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
}

pub async fn heartbeat_with_wrong_epoch_is_stale<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let before = snapshot(s, &run_id).await;
    for epoch in [0, 2, 7] {
        assert_stale(s.heartbeat(&build, epoch, LONG_TTL).await);
    }
    assert_eq!(snapshot(s, &run_id).await, before, "a stale heartbeat extends nothing");
    assert!(s.heartbeat("no-such-job", 1, LONG_TTL).await.is_err());
}

pub async fn expired_lease_is_stale_before_the_reconciler_runs<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, SHORT_TTL).await;
    expire(SHORT_TTL).await;

    // No reconciler ran: the attempt is still recorded as running...
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "build").job.status, JobStatus::Running);
    assert_eq!(outcomes(jv(&v, "build")), [AttemptOutcome::Running]);
    // ...but its lease is over in database time, so it can no longer act.
    let before = snapshot(s, &run_id).await;
    assert_stale(s.heartbeat(&build, 1, LONG_TTL).await);
    assert_stale(s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, b"late\n")).await);
    assert_stale(s.complete(&build, 1, success()).await);
    assert_eq!(snapshot(s, &run_id).await, before);
    // An expired job is not claimable until it is fenced.
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    let b = agent(s, "b", 4).await;
    assert!(try_claim(s, &b, &build, g, LONG_TTL).await.is_none());
    assert!(try_claim(s, &b, &build, g + 1, LONG_TTL).await.is_none());

    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);
}

pub async fn fencing_rejects_the_replaced_epoch<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let old = agent(s, "old", 4).await;
    let new = agent(s, "new", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let c1 = claim(s, &old, &build, SHORT_TTL).await;
    assert_eq!(c1.epoch, 1);
    s.append_log_chunk(chunk(&build, 1, "stdout", 0, 0, b"compiling\n")).await.unwrap();

    expire(SHORT_TTL).await;
    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);
    assert!(s.fence_expired().await.unwrap().is_empty(), "fencing is done once");

    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(outcomes(b), [AttemptOutcome::Lost]);
    assert!(b.attempts[0].finished_at.is_some());
    assert_eq!(b.job.status, JobStatus::Ready);
    assert!(b.job.dispatch_generation > c1.job.dispatch_generation, "a new dispatch generation");
    let events = pending_for(s, &build).await;
    assert!(events.iter().any(|e| e.dispatch_generation == b.job.dispatch_generation));
    assert_eq!(jv(&v, "test").job.status, JobStatus::Pending);

    // The old delivery is stale; the new one is claimed by another agent.
    assert!(try_claim(s, &old, &build, c1.job.dispatch_generation, LONG_TTL).await.is_none());
    let c2 = claim(s, &new, &build, LONG_TTL).await;
    assert_eq!(c2.epoch, 2);

    // The old agent wakes up: every state change it attempts is refused.
    let before = snapshot(s, &run_id).await;
    assert_stale(s.heartbeat(&build, 1, LONG_TTL).await);
    assert_stale(s.append_log_chunk(chunk(&build, 1, "stdout", 1, 10, b"done\n")).await);
    assert_stale(s.complete(&build, 1, success()).await);
    assert_stale(s.complete(&build, 1, failure(1)).await);
    assert_eq!(snapshot(s, &run_id).await, before, "the fenced epoch published nothing");

    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(outcomes(b), [AttemptOutcome::Lost, AttemptOutcome::Success]);
    assert_eq!(b.attempts[1].agent_id, new.id);
    assert_eq!((b.job.status, b.job.current_epoch), (JobStatus::Success, 2));
    assert_eq!(jv(&v, "test").job.status, JobStatus::Ready);
    // And even now the old epoch cannot publish.
    assert_stale(s.complete(&build, 1, success()).await);
}

pub async fn lost_attempts_use_the_infra_budget<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0), job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let total = DEFAULT_INFRA_RETRIES as i64 + 1;
    for epoch in 1..=total {
        assert_eq!(claim(s, &a, &build, 50).await.epoch, epoch);
        expire(50).await;
        assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), epoch)]);
        let want = if epoch < total { JobStatus::Ready } else { JobStatus::Failed };
        assert_eq!(job_status(s, &build).await, want, "after losing epoch {epoch}");
    }
    let v = view(s, &run_id).await;
    assert_eq!(outcomes(jv(&v, "build")), vec![AttemptOutcome::Lost; total as usize]);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert_eq!(v.run.status, RunStatus::Failed);
}

pub async fn shorten_session_leases_only_touches_that_session<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("x", &[], 0), job("y", &[], 0), job("z", &[], 0)])).await;
    let gone = agent(s, "gone", 4).await;
    let alive = agent(s, "alive", 4).await;
    let [x, y, z] = [job_id(s, &run_id, "x").await, job_id(s, &run_id, "y").await, job_id(s, &run_id, "z").await];
    claim(s, &gone, &x, LONG_TTL).await;
    claim(s, &gone, &y, LONG_TTL).await;
    let cz = claim(s, &alive, &z, LONG_TTL).await;

    // The agent's connection dropped: its session gets a short grace.
    const GRACE: i64 = 200;
    assert_eq!(s.shorten_session_leases(&gone.session_id, GRACE).await.unwrap(), 2);
    let v = view(s, &run_id).await;
    for name in ["x", "y"] {
        let at = &jv(&v, name).attempts[0];
        assert!(at.lease_deadline <= at.started_at + GRACE + 1000, "{name} lease shortened");
    }
    assert_eq!(jv(&v, "z").attempts[0].lease_deadline, cz.lease_deadline, "other sessions untouched");
    // Shortening never extends a lease.
    let deadline_x = jv(&v, "x").attempts[0].lease_deadline;
    s.shorten_session_leases(&gone.session_id, LONG_TTL).await.unwrap();
    assert_eq!(jv(&view(s, &run_id).await, "x").attempts[0].lease_deadline, deadline_x);

    // Still live within the grace...
    assert!(s.fence_expired().await.unwrap().is_empty());
    // ...fenced after it.
    expire(GRACE).await;
    let mut fenced = s.fence_expired().await.unwrap();
    fenced.sort();
    let mut want = vec![(x.clone(), 1), (y.clone(), 1)];
    want.sort();
    assert_eq!(fenced, want);
    let v = view(s, &run_id).await;
    assert_eq!(outcomes(jv(&v, "x")), [AttemptOutcome::Lost]);
    assert_eq!(outcomes(jv(&v, "y")), [AttemptOutcome::Lost]);
    assert_eq!(outcomes(jv(&v, "z")), [AttemptOutcome::Running]);
    s.heartbeat(&z, 1, LONG_TTL).await.expect("the live session keeps its lease");
    assert_eq!(s.shorten_session_leases("no-such-session", 0).await.unwrap(), 0);
}

/// Many heartbeats at once (PostgreSQL extends concurrent heartbeats in one
/// shared statement): each gets the answer for its own lease — live ones
/// are extended, ended or wrong epochs are stale, a cancelled run's lease
/// says so — and nothing else changes.
pub async fn concurrent_heartbeats_each_get_their_own_answer<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let names: Vec<String> = (0..10).map(|i| format!("j{i}")).collect();
    let (_, run_id) = start(&**s, workflow(names.iter().map(|n| job(n, &[], 0)).collect())).await;
    let (_, cancelled_run) = start(&**s, workflow(vec![job("c", &[], 0)])).await;
    let a = agent(&**s, "a", 16).await;
    let mut live = vec![];
    for n in &names {
        let id = job_id(&**s, &run_id, n).await;
        let c = claim(&**s, &a, &id, LONG_TTL).await;
        live.push((id, c.lease_deadline));
    }
    let c_job = job_id(&**s, &cancelled_run, "c").await;
    claim(&**s, &a, &c_job, LONG_TTL).await;
    // Three leases end by completion; the second run is cancelled.
    let ended: Vec<_> = live.split_off(7);
    for (id, _) in &ended {
        assert_eq!(s.complete(id, 1, success()).await.unwrap(), "success");
    }
    s.cancel_run(&cancelled_run).await.unwrap();
    let before_cancelled = snapshot(&**s, &cancelled_run).await;

    // Wrong epochs and ended leases, interleaved with live ones, all at once.
    let mut tasks = vec![];
    for round in 0..6 {
        for (id, _) in live.iter().chain(&ended) {
            for epoch in [1, 2] {
                let (s, id) = (s.clone(), id.clone());
                tasks.push(tokio::spawn(
                    async move { (id.clone(), epoch, round, s.heartbeat(&id, epoch, LONG_TTL).await) },
                ));
            }
        }
        let (s, id) = (s.clone(), c_job.clone());
        tasks.push(tokio::spawn(async move { (id.clone(), 1, round, s.heartbeat(&id, 1, LONG_TTL).await) }));
    }
    let mut latest: HashMap<String, i64> = HashMap::new();
    for t in tasks {
        let (id, epoch, _, r) = t.await.unwrap();
        if id == c_job {
            assert!(r.expect("the cancelled run's lease is still live").cancel_requested);
        } else if epoch == 1 && live.iter().any(|(l, _)| *l == id) {
            let hb = r.unwrap_or_else(|e| panic!("live lease {id} refused: {e}"));
            assert!(!hb.cancel_requested);
            let claimed_deadline = live.iter().find(|(l, _)| *l == id).unwrap().1;
            assert!(hb.lease_deadline >= claimed_deadline);
            let e = latest.entry(id).or_default();
            *e = (*e).max(hb.lease_deadline);
        } else {
            assert_stale(r);
        }
    }
    let v = view(&**s, &run_id).await;
    for (id, _) in &live {
        let j = v.jobs.iter().find(|j| j.job.id == *id).unwrap();
        assert_eq!(j.attempts.len(), 1);
        assert_eq!(j.attempts[0].lease_deadline, latest[id], "the lease kept the newest extension");
        assert_eq!(j.attempts[0].outcome, AttemptOutcome::Running);
    }
    for (id, _) in &ended {
        let j = v.jobs.iter().find(|j| j.job.id == *id).unwrap();
        assert_eq!(outcomes(j), [AttemptOutcome::Success], "a stale heartbeat revived nothing");
    }
    // The cancelled run's heartbeats extended its lease and changed nothing else.
    let without_leases = |s: String| s.lines().filter(|l| !l.contains("lease_deadline")).collect::<Vec<_>>().join("\n");
    assert_eq!(without_leases(snapshot(&**s, &cancelled_run).await), without_leases(before_cancelled));
}

/// After a database outage the reconciler extends only the leases that
/// were live when the outage began (nobody could renew them since); a
/// lease that had already expired before it stays expired and is fenced,
/// a longer lease is never shortened, and a fenced epoch is not revived.
pub async fn an_outage_extends_only_leases_live_when_it_began<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("x", &[], 0), job("y", &[], 0), job("z", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let [x, y, z] = [job_id(s, &run_id, "x").await, job_id(s, &run_id, "y").await, job_id(s, &run_id, "z").await];
    // x's lease ends long before the outage.
    claim(s, &a, &x, SHORT_TTL).await;
    expire(3_000).await;
    // y's ends during it; z's outlasts it.
    claim(s, &a, &y, SHORT_TTL).await;
    let cz = claim(s, &a, &z, LONG_TTL).await;
    expire(SHORT_TTL + 100).await;

    // Generous against a slow machine: y's lease ended at most 1.5 s ago.
    const OUTAGE: i64 = 1_500;
    const MARGIN: i64 = 10_000;
    assert_eq!(s.extend_running_leases(OUTAGE, MARGIN).await.unwrap(), 1, "only y's lease");
    let v = view(s, &run_id).await;
    let y_deadline = jv(&v, "y").attempts[0].lease_deadline;
    assert!(y_deadline >= jv(&v, "y").attempts[0].started_at + MARGIN, "y extended by the margin");
    assert_eq!(jv(&v, "z").attempts[0].lease_deadline, cz.lease_deadline, "a longer lease is kept as it is");

    let fenced = s.fence_expired().await.unwrap();
    assert_eq!(fenced, vec![(x.clone(), 1)], "the lease that expired before the outage is fenced");
    s.heartbeat(&y, 1, LONG_TTL).await.expect("y's agent renews its extended lease");
    s.heartbeat(&z, 1, LONG_TTL).await.expect("z untouched and live");
    // However long the outage, a fenced epoch stays fenced.
    s.extend_running_leases(i64::MAX / 4, MARGIN).await.unwrap();
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "x").attempts[0].outcome, AttemptOutcome::Lost);
    assert_stale(s.heartbeat(&x, 1, LONG_TTL).await);
}
