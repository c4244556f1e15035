//! Access records: join and API tokens (hashes only, revocation), agent
//! pools and removal, secret pools, and the audit log.

use super::*;

pub async fn join_tokens_are_stored_hashed_and_revocable<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let t = s.create_join_token("j1", "builders", "gpu", "hash-1").await.unwrap();
    assert_eq!((t.pool.as_str(), t.revoked_at), ("gpu", None));
    assert!(matches!(s.create_join_token("j1", "again", "gpu", "hash-2").await, Err(StoreError::Conflict(_))));
    assert_eq!(s.get_join_token("j1").await.unwrap().token_hash, "hash-1");
    assert!(s.revoke_join_token("j1").await.unwrap());
    let revoked = s.get_join_token("j1").await.unwrap().revoked_at.expect("revoked");
    assert!(s.revoke_join_token("j1").await.unwrap(), "revoking twice is fine");
    assert_eq!(s.get_join_token("j1").await.unwrap().revoked_at, Some(revoked), "the first revocation stands");
    assert!(!s.revoke_join_token("nope").await.unwrap());
    assert!(matches!(s.get_join_token("nope").await, Err(StoreError::NotFound(_))));
    assert_eq!(s.list_join_tokens().await.unwrap().len(), 1);
}

pub async fn api_tokens_carry_scope_repo_and_trust<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    let t = ApiTokenRecord {
        id: "t1".into(),
        name: "ci".into(),
        scope: "trigger".into(),
        repo_id: Some(r.id.clone()),
        trusted: true,
        token_hash: "h".into(),
        created_at: 0,
        revoked_at: None,
        last_used_at: None,
    };
    let made = s.create_api_token(&t).await.unwrap();
    assert!(made.created_at > 0);
    let got = s.get_api_token("t1").await.unwrap();
    assert_eq!(got, made);
    s.touch_api_token("t1").await.unwrap();
    assert!(s.get_api_token("t1").await.unwrap().last_used_at.is_some());
    assert!(s.revoke_api_token("t1").await.unwrap());
    assert!(s.get_api_token("t1").await.unwrap().revoked_at.is_some());
    assert_eq!(s.list_api_tokens().await.unwrap().len(), 1);
}

pub async fn agents_register_in_pools_and_removal_ends_their_leases<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let a = s.register_agent_in("a", r#"{"os":"linux"}"#, 2, "gpu", Some("j1")).await.unwrap();
    assert_eq!(s.get_agent(&a.id).await.unwrap().pool, "gpu");
    let plain = agent(s, "b", 1).await;
    assert_eq!(plain.pool, "default");
    let build = job_id(s, &run_id, "build").await;
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    s.claim(claim_input(&a, &build, g, LONG_TTL)).await.unwrap().expect("claimed");
    assert!(s.fence_expired().await.unwrap().is_empty(), "a live lease is not fenced");

    assert!(s.remove_agent(&a.id).await.unwrap());
    assert!(!s.remove_agent(&a.id).await.unwrap());
    assert!(matches!(s.get_agent(&a.id).await, Err(StoreError::NotFound(_))));
    assert_eq!(
        s.list_agents().await.unwrap().iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
        vec![plain.id.as_str()]
    );
    // Its attempt can no longer act, and the reconciler fences it at once.
    assert!(s.heartbeat(&build, 1, LONG_TTL).await.is_err(), "a removed agent's lease is over");
    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);
}

/// Issue 42 (agents): an agent's `last_seen_at` moves when it is touched;
/// offline agents expire after the idle time unless they hold a running
/// attempt or are connected to the caller.
pub async fn idle_agents_expire_unless_running_or_connected<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, workflow(vec![job("build", &[], 0)])).await;
    let busy = agent(s, "busy", 1).await;
    let idle = agent(s, "idle", 1).await;
    let here = agent(s, "here", 1).await;
    let fresh = agent(s, "fresh", 1).await;
    let build = job_id(s, &run_id, "build").await;
    let g = s.get_job(&build).await.unwrap().dispatch_generation;
    s.claim(claim_input(&busy, &build, g, LONG_TTL)).await.unwrap().expect("claimed");
    let seen = |id: String| async move { s.get_agent(&id).await.unwrap().last_seen_at };
    let before = seen(fresh.id.clone()).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    s.touch_agents(std::slice::from_ref(&fresh.id)).await.unwrap();
    let after = seen(fresh.id.clone()).await;
    assert!(after > before, "touched: last seen moves ({before} -> {after})");
    assert_eq!(seen(idle.id.clone()).await, idle.last_seen_at, "untouched: unchanged");

    // Idle for more than 50 ms: `idle` goes; `busy` runs a job, `here` is
    // connected to the caller and `fresh` was just seen, so they stay.
    let gone = s.expire_agents(50, std::slice::from_ref(&here.id)).await.unwrap();
    assert_eq!(gone, vec![(idle.id.clone(), "idle".to_string())]);
    let mut left: Vec<String> = s.list_agents().await.unwrap().into_iter().map(|a| a.name).collect();
    left.sort();
    assert_eq!(left, ["busy", "fresh", "here"]);
    assert!(s.expire_agents(50, &[]).await.unwrap().iter().all(|(id, _)| *id != busy.id), "a running agent stays");
    assert!(s.heartbeat(&build, 1, LONG_TTL).await.is_ok(), "its lease is untouched");
}

pub async fn secret_pools_and_audit_log<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    assert_eq!(r.secret_pools, vec!["default".to_string()], "the default pool only, by default");
    s.set_secret_pools(&r.id, &["gpu".into(), "default".into()]).await.unwrap();
    assert_eq!(s.get_repo(&r.id).await.unwrap().secret_pools, vec!["gpu".to_string(), "default".to_string()]);
    assert!(matches!(s.set_secret_pools("nope", &[]).await, Err(StoreError::NotFound(_))));

    for i in 0..5 {
        let e = NewAudit {
            actor: "admin.token".into(),
            action: "run.submit".into(),
            target: format!("run-{i}"),
            detail: String::new(),
        };
        s.audit(&e).await.unwrap();
    }
    let page = s.list_audit(None, 3).await.unwrap();
    assert_eq!(page.iter().map(|e| e.target.as_str()).collect::<Vec<_>>(), vec!["run-4", "run-3", "run-2"]);
    let rest = s.list_audit(Some(page[2].id), 10).await.unwrap();
    assert_eq!(rest.iter().map(|e| e.target.as_str()).collect::<Vec<_>>(), vec!["run-1", "run-0"]);
    assert!(page[0].at > 0);
}

pub async fn secrets_are_replaced_all_or_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let r = repo(s).await;
    s.put_secret(&r.id, "A", "a1").await.unwrap();
    s.put_secret(&r.id, "B", "b1").await.unwrap();
    let all = s.all_secrets().await.unwrap();
    assert_eq!(all, vec![(r.id.clone(), "A".into(), "a1".into()), (r.id.clone(), "B".into(), "b1".into())]);
    // One of the two moved since it was read: nothing changes.
    let stale = vec![
        (r.id.clone(), "A".to_string(), "a1".to_string(), "a2".to_string()),
        (r.id.clone(), "B".to_string(), "b0".to_string(), "b2".to_string()),
    ];
    assert!(matches!(s.replace_secrets(&stale).await, Err(StoreError::Conflict(_))));
    assert_eq!(s.all_secrets().await.unwrap(), all);
    let fresh = vec![
        (r.id.clone(), "A".to_string(), "a1".to_string(), "a2".to_string()),
        (r.id.clone(), "B".to_string(), "b1".to_string(), "b2".to_string()),
    ];
    assert_eq!(s.replace_secrets(&fresh).await.unwrap(), 2);
    let names = vec!["A".to_string(), "B".to_string()];
    let got = s.secret_values(&r.id, &names).await.unwrap();
    assert_eq!((got["A"].as_str(), got["B"].as_str()), ("a2", "b2"));
}

/// `GET /v1/agents` shows each agent's version and whether it drains; only
/// the agent's current session may say it drains.
pub async fn agents_record_their_version_and_draining<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let a = agent(s, "a", 1).await;
    assert_eq!((a.version.as_deref(), a.draining), (None, false));
    s.describe_agent(&a.id, "1.2.3").await.unwrap();
    assert!(!s.mark_draining(&a.id, "another-session").await.unwrap());
    assert!(!s.get_agent(&a.id).await.unwrap().draining);
    assert!(s.mark_draining(&a.id, &a.session_id).await.unwrap());
    let got = s.list_agents().await.unwrap().into_iter().find(|x| x.id == a.id).unwrap();
    assert_eq!((got.version.as_deref(), got.draining), (Some("1.2.3"), true));
}
