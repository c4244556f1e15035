//! Teams (issue 44): created, changed at runtime, removed only when empty;
//! repositories start in `default` and move between teams.

use super::*;

pub async fn teams_hold_repositories_and_change_at_runtime<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    assert_eq!(r.team, DEFAULT_TEAM, "a new repository is in the default team");
    let default = s.get_team(DEFAULT_TEAM).await.unwrap();
    assert_eq!((default.weight, default.max_running), (1, None));

    let web = s.create_team("web", 3, Some(4), Some(100)).await.unwrap();
    assert_eq!((web.weight, web.max_running, web.max_queued, web.repos), (3, Some(4), Some(100), 0));
    assert!(matches!(s.create_team("web", 1, None, None).await, Err(StoreError::Conflict(_))));
    assert!(matches!(s.create_team("bad name", 1, None, None).await, Err(StoreError::Invalid(_))));
    assert!(matches!(s.create_team("zero", 0, None, None).await, Err(StoreError::Invalid(_))));

    s.set_repo_team(&r.id, "web").await.unwrap();
    assert_eq!(s.get_repo(&r.id).await.unwrap().team, "web");
    assert!(matches!(s.set_repo_team(&r.id, "nope").await, Err(StoreError::NotFound(_))));
    assert_eq!(s.get_team("web").await.unwrap().repos, 1);

    // Weight and quotas change in place; `Some(None)` lifts a quota.
    let changed =
        s.update_team("web", &TeamUpdate { weight: Some(5), max_running: Some(None), max_queued: None }).await.unwrap();
    assert_eq!((changed.weight, changed.max_running, changed.max_queued), (5, None, Some(100)));
    assert!(matches!(s.update_team("nope", &TeamUpdate::default()).await, Err(StoreError::NotFound(_))));

    // Only an empty team goes, never `default`.
    assert!(matches!(s.delete_team("web").await, Err(StoreError::Conflict(ref m)) if m.contains("1 repository")));
    s.set_repo_team(&r.id, DEFAULT_TEAM).await.unwrap();
    assert_eq!(s.delete_team("web").await.unwrap().name, "web");
    assert!(matches!(s.delete_team(DEFAULT_TEAM).await, Err(StoreError::Conflict(_))));
    let names: Vec<String> = s.list_teams().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, [DEFAULT_TEAM]);
}
