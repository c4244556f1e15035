//! The forge loop's records (issue 14): deliveries recorded once and planned
//! by one claimant, commit status reports that follow their run and are
//! superseded, the leader lease, schedule cursors, ref heads and polls, and
//! the repository credentials among the sealed values.

use super::*;

fn delivery(repo_id: &str, key: &str) -> NewDelivery {
    NewDelivery {
        repo_id: repo_id.into(),
        forge: "github".into(),
        delivery_key: key.into(),
        event: "push".into(),
        payload_digest: "d1".into(),
        trigger_event: "{}".into(),
        trust: "trusted".into(),
        status: "pending".into(),
        message: None,
    }
}

pub async fn deliveries_are_recorded_once_and_planned_by_one_claimant<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let r = repo(&**s).await;
    let (first, created) = s.record_delivery(&delivery(&r.id, "k1")).await.unwrap();
    assert!(created);
    let (again, created) = s.record_delivery(&delivery(&r.id, "k1")).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    // Concurrent recordings of one id: one delivery.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (s, id) = (s.clone(), r.id.clone());
        set.spawn(async move { s.record_delivery(&delivery(&id, "k2")).await.unwrap().1 });
    }
    let mut made = 0;
    while let Some(c) = set.join_next().await {
        made += usize::from(c.unwrap());
    }
    assert_eq!(made, 1);
    assert_eq!(s.due_deliveries(10).await.unwrap().len(), 2);
    // Concurrent claims: one planner.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (s, id) = (s.clone(), first.id.clone());
        set.spawn(async move { s.claim_delivery(&id, 60_000).await.unwrap() });
    }
    let mut won = 0;
    while let Some(c) = set.join_next().await {
        won += usize::from(c.unwrap());
    }
    assert_eq!(won, 1);
    assert_eq!(s.due_deliveries(10).await.unwrap().len(), 1, "a claimed delivery is not due");
    s.finish_delivery(&first.id, "planned", Some("1 run"), &["run-1".to_string()]).await.unwrap();
    let done = s.get_delivery(&first.id).await.unwrap();
    assert_eq!((done.status.as_str(), done.run_ids.clone()), ("planned", vec!["run-1".to_string()]));
    assert!(done.planned_at.is_some());
    assert!(!s.claim_delivery(&first.id, 60_000).await.unwrap(), "a planned delivery is not claimed again");
    // A deferred delivery is due again after its delay; an expired claim too.
    let other = s.due_deliveries(10).await.unwrap().remove(0);
    assert!(s.claim_delivery(&other.id, 1).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(s.claim_delivery(&other.id, 60_000).await.unwrap(), "an expired claim is taken over");
    s.defer_delivery(&other.id, 0, "fetch failed").await.unwrap();
    let due = s.due_deliveries(10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].attempts, 2);
    assert_eq!(s.list_deliveries(&r.id, 10).await.unwrap().len(), 2);
}

pub async fn reports_follow_their_run_and_newer_ones_supersede<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let wf = workflow(vec![job("a", &[], 0)]);
    let mut nr = new_run(&r.id, wf.clone());
    nr.report_context = Some("kiln/ci (push)".into());
    let run1 = s.accept_run(nr.clone()).await.unwrap().run_id;
    let due = s.due_reports(10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].state.as_str(), due[0].run_id.as_deref()), ("pending", Some(run1.as_str())));
    assert!(s.claim_report(&due[0].id, 60_000).await.unwrap());
    assert!(!s.claim_report(&due[0].id, 60_000).await.unwrap(), "one sender at a time");
    assert!(s.due_reports(10).await.unwrap().is_empty(), "claimed");
    s.report_sent(&due[0].id, "pending", false, None).await.unwrap();
    assert!(s.due_reports(10).await.unwrap().is_empty(), "nothing new to say");
    s.cancel_run(&run1).await.unwrap();
    let due = s.due_reports(10).await.unwrap();
    assert_eq!(due[0].state, "cancelled", "the wanted state follows the run");
    assert_eq!(s.report_context_of_run(&run1).await.unwrap().as_deref(), Some("kiln/ci (push)"));
    // A newer run for the same commit and context supersedes the older row.
    let run2 = s.accept_run(nr).await.unwrap().run_id;
    let due = s.due_reports(10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].run_id.as_deref(), Some(run2.as_str()));
    // A retry with backoff is not due before its time.
    assert!(s.claim_report(&due[0].id, 60_000).await.unwrap());
    s.report_retry(&due[0].id, 60_000, "503").await.unwrap();
    assert!(s.due_reports(10).await.unwrap().is_empty());
    // A fixed state (a workflow that failed validation).
    s.create_report(&r.id, "abc", "kiln/bad (push)", "failure", ".kiln/bad.yaml:3:1: x").await.unwrap();
    let due = s.due_reports(10).await.unwrap();
    assert_eq!((due[0].state.as_str(), due[0].description.as_str()), ("failure", ".kiln/bad.yaml:3:1: x"));
    s.report_sent(&due[0].id, "failure", true, None).await.unwrap();
    assert!(s.due_reports(10).await.unwrap().is_empty());
    let all = s.reports_of_commit(&r.id, "abc").await.unwrap();
    assert_eq!(all, vec![("kiln/bad (push)".to_string(), None, Some("failure".to_string()), true)]);
}

pub async fn the_leader_lease_has_one_holder_until_it_lapses<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let s = s.clone();
        set.spawn(async move { s.acquire_lease("triggers", &format!("r{i}"), 60_000).await.unwrap() });
    }
    let mut holders = 0;
    while let Some(h) = set.join_next().await {
        holders += usize::from(h.unwrap());
    }
    assert_eq!(holders, 1, "one replica holds the lease");
    assert!(s.acquire_lease("other", "a", 60_000).await.unwrap(), "leases are per name");
    assert!(s.acquire_lease("other", "a", 60_000).await.unwrap(), "the holder renews");
    assert!(!s.acquire_lease("other", "b", 60_000).await.unwrap());
    s.release_lease("other", "b").await.unwrap();
    assert!(!s.acquire_lease("other", "b", 60_000).await.unwrap(), "only the holder releases");
    s.release_lease("other", "a").await.unwrap();
    assert!(s.acquire_lease("other", "b", 1).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(s.acquire_lease("other", "a", 60_000).await.unwrap(), "a lapsed lease is taken over");
}

/// Replicas announce themselves with one lease each (`offer:<id>`): the
/// live holders under a prefix, sorted; a lapsed or released one is gone.
pub async fn lease_holders_are_the_live_ones_under_a_prefix<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    assert!(s.lease_holders("offer:").await.unwrap().is_empty());
    for id in ["r2", "r1", "r3"] {
        assert!(s.acquire_lease(&format!("offer:{id}"), id, 60_000).await.unwrap());
    }
    s.acquire_lease("triggers", "r9", 60_000).await.unwrap();
    s.acquire_lease("offerx", "r8", 60_000).await.unwrap();
    s.acquire_lease("offer%x", "r7", 60_000).await.unwrap();
    assert_eq!(s.lease_holders("offer:").await.unwrap(), vec!["r1", "r2", "r3"]);
    assert_eq!(s.lease_holders("offer%").await.unwrap(), vec!["r7"], "the prefix is literal");
    s.release_lease("offer:r2", "r2").await.unwrap();
    assert!(s.acquire_lease("offer:r3", "r3", 1).await.unwrap(), "renewed with a short TTL");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(s.lease_holders("offer:").await.unwrap(), vec!["r1"], "released and lapsed ones are gone");
}

pub async fn schedule_cursors_move_by_compare_and_set<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    assert_eq!(s.schedule_cursor(&r.id, ".kiln/n.yaml").await.unwrap(), None);
    assert!(s.advance_schedule_cursor(&r.id, ".kiln/n.yaml", None, 10).await.unwrap());
    assert!(!s.advance_schedule_cursor(&r.id, ".kiln/n.yaml", None, 20).await.unwrap(), "it exists now");
    assert!(!s.advance_schedule_cursor(&r.id, ".kiln/n.yaml", Some(5), 20).await.unwrap(), "moved meanwhile");
    assert!(s.advance_schedule_cursor(&r.id, ".kiln/n.yaml", Some(10), 20).await.unwrap());
    assert_eq!(s.schedule_cursor(&r.id, ".kiln/n.yaml").await.unwrap(), Some(20));
}

pub async fn ref_heads_polls_and_credentials<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    s.record_ref_head(&r.id, "refs/heads/main", "a").await.unwrap();
    s.record_ref_head(&r.id, "refs/heads/main", "b").await.unwrap();
    s.record_ref_head(&r.id, "refs/tags/v1", "c").await.unwrap();
    assert_eq!(
        s.ref_heads(&r.id).await.unwrap(),
        vec![("refs/heads/main".to_string(), "b".to_string()), ("refs/tags/v1".to_string(), "c".to_string())]
    );
    assert!(s.repos_to_poll().await.unwrap().is_empty(), "polling is off by default");
    let settings = RepoForge {
        forge: Some("gitea".into()),
        forge_repo: Some("o/n".into()),
        forge_token: Some("sealed-token".into()),
        poll_interval_ms: Some(60_000),
        protected_refs: vec!["release/*".into()],
        ..Default::default()
    };
    s.set_repo_forge(&r.id, &settings).await.unwrap();
    assert_eq!(s.get_repo(&r.id).await.unwrap().forge, settings);
    assert_eq!(s.repos_to_poll().await.unwrap(), vec![r.id.clone()]);
    assert!(s.repos_to_poll().await.unwrap().is_empty(), "once per interval");
    // The credentials are listed (and resealed) with the secrets.
    s.set_webhook_secret(&r.id, Some("sealed-hook")).await.unwrap();
    let all: Vec<(String, String)> =
        s.all_secrets().await.unwrap().into_iter().filter(|x| x.0 == r.id).map(|x| (x.1, x.2)).collect();
    assert_eq!(
        all,
        vec![
            (FORGE_TOKEN.to_string(), "sealed-token".to_string()),
            (WEBHOOK_SECRET.to_string(), "sealed-hook".to_string())
        ]
    );
    let changes = vec![(r.id.clone(), WEBHOOK_SECRET.to_string(), "sealed-hook".to_string(), "resealed".to_string())];
    assert_eq!(s.replace_secrets(&changes).await.unwrap(), 1);
    assert_eq!(s.get_repo(&r.id).await.unwrap().webhook_secret.as_deref(), Some("resealed"));
    assert!(s.replace_secrets(&changes).await.is_err(), "a stale old value changes nothing");
}
