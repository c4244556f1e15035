//! Badges and notifications (issue 42): a run end is enqueued once per
//! notification that wants it, in the transaction that ends the run;
//! `fixed` follows a failure of the same workflow and branch; one sender
//! holds a delivery at a time and a delivery is marked delivered at most
//! once; the signing secret is a sealed secret row, never listed.

use super::*;

fn notification(repo_id: &str, events: &[&str]) -> NotificationRecord {
    NotificationRecord {
        id: uuid::Uuid::new_v4().to_string(),
        repo_id: repo_id.into(),
        url: "http://127.0.0.1:9/hook".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        format: "kiln".into(),
        created_at: 0,
    }
}

/// Run one single-job run of `repo` to its end: success or failure.
async fn run_to_end<S: Store>(s: &S, repo: &RepoRecord, a: &AgentRecord, ok: bool) -> String {
    let run_id = s.accept_run(new_run(&repo.id, workflow(vec![job("build", &[], 0)]))).await.unwrap().run_id;
    let build = job_id(s, &run_id, "build").await;
    let c = claim(s, a, &build, LONG_TTL).await;
    s.complete(&build, c.epoch, if ok { success() } else { failure(1) }).await.unwrap();
    run_id
}

pub async fn run_ends_are_enqueued_once_per_wanting_notification<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let r = repo(&**s).await;
    let a = agent(&**s, "a", 4).await;
    let on_failure = s.create_notification(&notification(&r.id, &["failure", "fixed"]), "sealed-1").await.unwrap();
    let always = s.create_notification(&notification(&r.id, &["always"]), "sealed-2").await.unwrap();
    assert!(on_failure.created_at > 0);
    // The secret is a secret row of the repository, never listed.
    let secret = notification_secret_name(&on_failure.id);
    let values = s.secret_values(&r.id, std::slice::from_ref(&secret)).await.unwrap();
    assert_eq!(values.get(&secret).map(String::as_str), Some("sealed-1"));
    assert!(s.list_secrets(&r.id).await.unwrap().is_empty());
    assert_eq!(s.list_notifications(&r.id).await.unwrap().len(), 2);

    // success (first run), failure, success again (fixed), success.
    let first = run_to_end(&**s, &r, &a, true).await;
    let broken = run_to_end(&**s, &r, &a, false).await;
    let fixed = run_to_end(&**s, &r, &a, true).await;
    let fine = run_to_end(&**s, &r, &a, true).await;
    let log = s.notification_deliveries(&r.id, 50).await.unwrap();
    let mut got: Vec<(String, String, String)> =
        log.iter().map(|d| (d.run_id.clone(), d.notification_id.clone(), d.event.clone())).collect();
    got.sort();
    let mut want = vec![
        (first.clone(), always.id.clone(), "success".to_string()),
        (broken.clone(), always.id.clone(), "failure".to_string()),
        (broken.clone(), on_failure.id.clone(), "failure".to_string()),
        (fixed.clone(), always.id.clone(), "fixed".to_string()),
        (fixed.clone(), on_failure.id.clone(), "fixed".to_string()),
        (fine.clone(), always.id.clone(), "success".to_string()),
    ];
    want.sort();
    assert_eq!(got, want);
    assert!(log.iter().all(|d| d.status == "pending" && d.attempts == 0 && d.run_number > 0));

    // One sender holds a delivery; it is delivered once.
    let due = s.due_notifications(50).await.unwrap();
    assert_eq!(due.len(), 6);
    let d = due.iter().find(|d| d.delivery.run_id == broken && d.delivery.notification_id == on_failure.id).unwrap();
    assert_eq!(d.target.as_ref().map(|t| t.url.as_str()), Some("http://127.0.0.1:9/hook"));
    let id = d.delivery.id.clone();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (s, id) = (s.clone(), id.clone());
        set.spawn(async move { s.claim_notification(&id, 60_000).await.unwrap() });
    }
    let mut won = 0;
    while let Some(c) = set.join_next().await {
        won += usize::from(c.unwrap());
    }
    assert_eq!(won, 1);
    assert_eq!(s.due_notifications(50).await.unwrap().len(), 5, "a held delivery is not due");
    s.notification_retry(&id, 0, Some(500), "HTTP 500").await.unwrap();
    assert!(s.claim_notification(&id, 60_000).await.unwrap());
    assert!(s.notification_delivered(&id, 200).await.unwrap());
    assert!(!s.notification_delivered(&id, 200).await.unwrap(), "delivered at most once");
    assert!(!s.claim_notification(&id, 60_000).await.unwrap(), "a delivered row is not sent again");
    let row = s.notification_deliveries(&r.id, 50).await.unwrap().into_iter().find(|d| d.id == id).unwrap();
    assert_eq!((row.status.as_str(), row.attempts, row.last_status_code), ("delivered", 2, Some(200)));
    assert!(row.delivered_at.is_some() && row.last_error.is_none());

    // Removing a notification takes its secret and fails its pending rows.
    s.delete_notification(&r.id, &always.id).await.unwrap();
    assert!(matches!(s.delete_notification(&r.id, &always.id).await, Err(StoreError::NotFound(_))));
    let name = notification_secret_name(&always.id);
    assert!(s.secret_values(&r.id, &[name]).await.unwrap().is_empty());
    let log = s.notification_deliveries(&r.id, 50).await.unwrap();
    assert!(log.iter().filter(|d| d.notification_id == always.id).all(|d| d.status == "failed"));
    assert_eq!(s.due_notifications(50).await.unwrap().len(), 1);
}

pub async fn badges_read_the_newest_run_of_a_branch_and_workflow<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let r = repo(&**s).await;
    assert!(!r.public);
    s.set_repo_public(&r.id, true).await.unwrap();
    assert!(s.get_repo(&r.id).await.unwrap().public);
    let a = agent(&**s, "a", 4).await;
    let any: Vec<String> = vec![];
    let build = vec![".kiln/build.yaml".to_string()];
    let other = vec![".kiln/other.yaml".to_string()];
    assert_eq!(s.badge_status(&r.id, "main", &any).await.unwrap(), None);
    run_to_end(&**s, &r, &a, false).await;
    assert_eq!(s.badge_status(&r.id, "main", &build).await.unwrap(), Some(kiln_core::RunStatus::Failed));
    run_to_end(&**s, &r, &a, true).await;
    assert_eq!(s.badge_status(&r.id, "main", &any).await.unwrap(), Some(kiln_core::RunStatus::Success));
    assert_eq!(s.badge_status(&r.id, "main", &other).await.unwrap(), None);
    assert_eq!(s.badge_status(&r.id, "dev", &any).await.unwrap(), None);
    s.accept_run(new_run(&r.id, workflow(vec![job("build", &[], 0)]))).await.unwrap();
    assert_eq!(s.badge_status(&r.id, "main", &any).await.unwrap(), Some(kiln_core::RunStatus::Queued));
}
