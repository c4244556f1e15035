//! The transactional outbox and its relay (spec 000 §9, §15 "relay publishes
//! twice"; invariant 5).

use super::*;

pub async fn relay_delivering_twice_is_absorbed<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = agent(s, "a", 4).await;
    let b = agent(s, "b", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let events = pending_for(s, &build).await;
    assert_eq!(events.len(), 1);
    let ev = events[0].clone();

    // Published, then the relay crashed before marking: it publishes again.
    let first = try_claim(s, &a, &ev.job_id, ev.dispatch_generation, LONG_TTL).await.expect("first delivery");
    assert_eq!(first.epoch, 1);
    assert_eq!(pending_for(s, &build).await, vec![ev.clone()], "claiming does not publish the event");
    let before = snapshot(s, &run_id).await;
    assert!(try_claim(s, &b, &ev.job_id, ev.dispatch_generation, LONG_TTL).await.is_none(), "second delivery");
    assert_eq!(snapshot(s, &run_id).await, before);

    s.mark_published(&[ev.id]).await.unwrap();
    assert!(pending_for(s, &build).await.is_empty());
    s.mark_published(&[ev.id]).await.unwrap();
    s.mark_published(&[]).await.unwrap();
    assert!(pending_for(s, &build).await.is_empty());
    assert_eq!(outcomes(jv(&view(s, &run_id).await, "build")), [AttemptOutcome::Running]);
}

pub async fn unmarked_events_are_delivered_again<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("x", &[], 0), job("y", &[], 0), job("z", &[], 0)])).await;
    let ids: Vec<String> = view(s, &run_id).await.jobs.iter().map(|j| j.job.id.clone()).collect();
    let mine =
        |evs: Vec<OutboxEvent>| -> Vec<OutboxEvent> { evs.into_iter().filter(|e| ids.contains(&e.job_id)).collect() };

    let batch = mine(s.pending_outbox(100).await.unwrap());
    assert_eq!(batch.len(), 3);
    assert!(batch.windows(2).all(|w| w[0].id < w[1].id), "oldest first: {batch:?}");
    // A relay that crashed before marking leaves the events pending.
    assert_eq!(mine(s.pending_outbox(100).await.unwrap()), batch);
    // The limit is respected.
    assert_eq!(s.pending_outbox(2).await.unwrap().len(), 2);

    // Marking part of a batch leaves the rest pending.
    s.mark_published(&[batch[0].id, batch[2].id]).await.unwrap();
    assert_eq!(mine(s.pending_outbox(100).await.unwrap()), vec![batch[1].clone()]);
    s.mark_published(&[batch[1].id]).await.unwrap();
    assert!(mine(s.pending_outbox(100).await.unwrap()).is_empty());

    // Published events stay deliverable from `ready_jobs` after a restart.
    let ready = s.ready_jobs().await.unwrap();
    for e in &batch {
        assert!(
            ready.iter().any(|r| r.job_id == e.job_id && r.dispatch_generation == e.dispatch_generation),
            "{e:?} in ready_jobs"
        );
    }
}
