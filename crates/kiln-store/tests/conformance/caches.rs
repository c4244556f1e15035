//! Build cache entries (spec 000 §10, §14; issue 15): a sealed `@cache`
//! upload of the live epoch is bound to (repository, namespace, key), first
//! writer wins; a fenced attempt binds nothing; lookups see only the
//! namespaces asked for; eviction frees entries and their bytes become
//! garbage.

use super::*;
use kiln_workflow::Cache;

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn caching(name: &str) -> Job {
    Job {
        cache: Some(Cache {
            kind: "deps".into(),
            version: "1".into(),
            inputs: vec![],
            paths: vec!["deps".into()],
            restore_prefix: false,
        }),
        ..job(name, &[], 0)
    }
}

fn entry<'a>(generation_id: &'a str, namespace: &'a str, key: &'a str, prefix: Option<&'a str>) -> NewCacheEntry<'a> {
    NewCacheEntry { generation_id, namespace, key, kind: "deps", prefix, build_ms: None }
}

/// A sealed `@cache` upload of `(job, epoch)` with digest `sha`.
async fn sealed<S: Store>(s: &S, job_id: &str, epoch: i64, sha: &str) -> String {
    let g = s.create_generation(job_id, epoch, CACHE_ARTIFACT, 10, sha, 1 << 20).await.expect("cache upload");
    s.seal_generation(&g.id, job_id, epoch).await.expect("seal");
    g.id
}

pub async fn cache_keys_bind_first_writer_wins_and_fenced_attempts_bind_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let ag = agent(s, "a", 8).await;
    // Two runs (two writers) of a caching job.
    let (repo, run1) = start(s, workflow(vec![caching("build")])).await;
    let run2 = s.accept_run(new_run(&repo.id, workflow(vec![caching("build")]))).await.unwrap().run_id;
    let (j1, j2) = (job_id(s, &run1, "build").await, job_id(s, &run2, "build").await);
    let c1 = claim(s, &ag, &j1, LONG_TTL).await;
    let c2 = claim(s, &ag, &j2, LONG_TTL).await;
    let g1 = sealed(s, &j1, c1.epoch, SHA_A).await;
    let g2 = sealed(s, &j2, c2.epoch, SHA_B).await;
    let first = s.bind_cache(&j1, c1.epoch, entry(&g1, "protected", "k", None)).await.unwrap();
    assert_eq!(first, CacheBinding { bound: true, conflict: false });
    let second = s.bind_cache(&j2, c2.epoch, entry(&g2, "protected", "k", None)).await.unwrap();
    assert_eq!(second, CacheBinding { bound: false, conflict: true }, "other bytes: a conflict, not an overwrite");
    let again = s.bind_cache(&j1, c1.epoch, entry(&g1, "protected", "k", None)).await.unwrap();
    assert_eq!(again, CacheBinding { bound: true, conflict: false }, "a retried save is idempotent");
    let hit = s.lookup_cache(&repo.id, &[("protected".into(), "k".into())]).await.unwrap().expect("hit");
    assert_eq!(hit.generation.id, g1);
    let listed = s.list_caches(&repo.id).await.unwrap();
    assert_eq!((listed.len(), listed[0].conflicts, listed[0].hits), (1, 1, 1));
    // Namespaces are separate, and looked up in the order given.
    assert!(s.lookup_cache(&repo.id, &[("untrusted/x".into(), "k".into())]).await.unwrap().is_none());
    let h = s
        .lookup_cache(&repo.id, &[("untrusted/x".into(), "k".into()), ("protected".into(), "k".into())])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h.namespace, "protected");
    // A generation that is not a cache upload of that attempt is refused.
    assert!(s.bind_cache(&j2, c2.epoch, entry(&g1, "protected", "k2", None)).await.is_err());
    // A fenced attempt binds nothing.
    s.heartbeat(&j2, c2.epoch, SHORT_TTL).await.unwrap();
    expire(SHORT_TTL).await;
    s.fence_expired().await.unwrap();
    let stale = s.bind_cache(&j2, c2.epoch, entry(&g2, "protected", "k3", None)).await;
    assert!(matches!(stale, Err(StoreError::StaleEpoch(_))), "{stale:?}");
    assert!(s.lookup_cache(&repo.id, &[("protected".into(), "k3".into())]).await.unwrap().is_none());
}

pub async fn concurrent_saves_of_one_key_leave_one_binding<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &fx.store;
    let ag = agent(&**s, "a", 16).await;
    let (repo, first_run) = start(&**s, workflow(vec![caching("build")])).await;
    let mut runs = vec![first_run];
    for _ in 0..5 {
        runs.push(s.accept_run(new_run(&repo.id, workflow(vec![caching("build")]))).await.unwrap().run_id);
    }
    let mut uploads = vec![];
    for (i, run) in runs.iter().enumerate() {
        let j = job_id(&**s, run, "build").await;
        let c = claim(&**s, &ag, &j, LONG_TTL).await;
        let sha = if i % 2 == 0 { SHA_A } else { SHA_B };
        uploads.push((j.clone(), c.epoch, sealed(&**s, &j, c.epoch, sha).await));
    }
    let mut set = tokio::task::JoinSet::new();
    for (j, e, g) in uploads {
        let s = s.clone();
        set.spawn(async move { s.bind_cache(&j, e, entry(&g, "protected", "same", None)).await.unwrap() });
    }
    let mut bound = 0;
    while let Some(b) = set.join_next().await {
        bound += usize::from(b.unwrap().bound);
    }
    assert_eq!(bound, 1, "exactly one writer binds the key");
    assert_eq!(s.list_caches(&repo.id).await.unwrap().len(), 1);
}

pub async fn eviction_frees_entries_and_their_bytes_become_garbage<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let ag = agent(s, "a", 8).await;
    let (repo, run) = start(s, workflow(vec![caching("build")])).await;
    let j = job_id(s, &run, "build").await;
    let c = claim(s, &ag, &j, LONG_TTL).await;
    let g = sealed(s, &j, c.epoch, SHA_A).await;
    s.bind_cache(&j, c.epoch, entry(&g, "protected", "k", None)).await.unwrap();
    s.complete(&j, c.epoch, success()).await.unwrap();
    assert!(
        s.collectable_generations(0, 100).await.unwrap().iter().all(|x| x.id != g),
        "a cache entry's bytes are not garbage"
    );
    assert!(s.evict_caches(60_000, 1 << 30, 1 << 40).await.unwrap().is_empty(), "within TTL and quota");
    let gone = s.evict_caches(60_000, 5, 1 << 40).await.unwrap();
    assert_eq!(gone.len(), 1, "over the repository quota");
    assert!(s.lookup_cache(&repo.id, &[("protected".into(), "k".into())]).await.unwrap().is_none());
    assert!(s.collectable_generations(0, 100).await.unwrap().iter().any(|x| x.id == g), "now garbage");
    assert!(s.remove_cache(&repo.id, "protected", "k", &g).await.is_ok());
}

pub async fn prefix_lookups_find_the_most_recently_used_entry_of_a_namespace<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let ag = agent(s, "a", 8).await;
    let (repo, run1) = start(s, workflow(vec![caching("build")])).await;
    let run2 = s.accept_run(new_run(&repo.id, workflow(vec![caching("build")]))).await.unwrap().run_id;
    let (j1, j2) = (job_id(s, &run1, "build").await, job_id(s, &run2, "build").await);
    let c1 = claim(s, &ag, &j1, LONG_TTL).await;
    let c2 = claim(s, &ag, &j2, LONG_TTL).await;
    let g1 = sealed(s, &j1, c1.epoch, SHA_A).await;
    let g2 = sealed(s, &j2, c2.epoch, SHA_B).await;
    let old = NewCacheEntry { build_ms: Some(42_000), ..entry(&g1, "protected", "k-old", Some("p")) };
    s.bind_cache(&j1, c1.epoch, old).await.unwrap();
    s.bind_cache(&j2, c2.epoch, entry(&g2, "protected", "k-new", Some("p"))).await.unwrap();
    // Used last: k-old (a lookup marks it used).
    expire(5).await;
    s.lookup_cache(&repo.id, &[("protected".into(), "k-old".into())]).await.unwrap().expect("hit");
    let by_prefix = s.lookup_cache_prefix(&repo.id, &[("protected".into(), "p".into())]).await.unwrap().expect("found");
    assert_eq!((by_prefix.key.as_str(), by_prefix.build_ms), ("k-old", Some(42_000)));
    assert_eq!(s.get_cache(&repo.id, "protected", "k-old").await.unwrap().unwrap().build_ms, Some(42_000));
    // Another prefix, or another namespace: nothing.
    assert!(s.lookup_cache_prefix(&repo.id, &[("protected".into(), "q".into())]).await.unwrap().is_none());
    assert!(s.lookup_cache_prefix(&repo.id, &[("untrusted/x".into(), "p".into())]).await.unwrap().is_none());
    // Namespaces in order: the first with an entry answers.
    let h = s
        .lookup_cache_prefix(&repo.id, &[("untrusted/x".into(), "p".into()), ("protected".into(), "p".into())])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h.namespace, "protected");
    assert!(s.get_cache(&repo.id, "protected", "nope").await.unwrap().is_none());
}
