//! Accepting a run (spec 000 §5–§6; invariants 1, 5, 9).

use super::*;
use kiln_core::RunStatus;

pub async fn accept_run_freezes_definition_and_readies_roots<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let repo = repo(s).await;
    let wf = workflow(vec![
        job("build", &[], 0),
        job("lint", &[], 2),
        job("test", &["build"], 0),
        job("deploy", &["test", "lint"], 0),
    ]);
    let mut req = new_run(&repo.id, wf.clone());
    req.inputs.insert("test_suite".into(), "integration".into());
    let acc = s.accept_run(req.clone()).await.unwrap();
    assert!(acc.created);

    let v = view(s, &acc.run_id).await;
    let r = &v.run;
    assert_eq!(r.id, acc.run_id);
    assert_eq!(r.status, RunStatus::Queued);
    assert_eq!(r.repo_id, repo.id);
    assert_eq!(r.repo_name, repo.name);
    assert_eq!(r.definition, wf, "the frozen definition is stored as accepted");
    assert_eq!(r.workflow_hash, wf.canonical_hash());
    assert_eq!(r.commit_sha, req.commit_sha);
    // The commit's title and author are frozen with the run (`commit.*`).
    let commit = r.commit_context();
    assert_eq!(
        (commit.sha.as_str(), commit.title.as_str(), commit.author.as_str()),
        (req.commit_sha.as_str(), "Fix the build", "Ada Lovelace")
    );
    assert_eq!(r.git_ref, req.git_ref);
    assert_eq!(r.workflow_path, req.workflow_path);
    assert_eq!(r.event, req.event);
    assert_eq!(r.trust, req.trust);
    assert_eq!(r.inputs, req.inputs);
    assert_eq!(r.parent_run_id, None);
    assert_eq!(r.finished_at, None);

    // Jobs in index order, with their needs.
    let names: Vec<&str> = v.jobs.iter().map(|j| j.job.name.as_str()).collect();
    assert_eq!(names, ["build", "lint", "test", "deploy"]);
    for (i, j) in v.jobs.iter().enumerate() {
        assert_eq!(j.job.index, i as i64);
        assert_eq!(j.job.run_id, acc.run_id);
        assert_eq!(j.job.needs, wf.jobs[i].needs);
        assert_eq!(j.job.current_epoch, 0);
        assert!(j.attempts.is_empty());
        assert_eq!(j.job.class_key, class_key(&wf.jobs[i].runs_on));
    }
    assert_eq!(
        statuses(&v).into_iter().map(|(_, s)| s).collect::<Vec<_>>(),
        [JobStatus::Ready, JobStatus::Ready, JobStatus::Pending, JobStatus::Pending]
    );

    // Exactly one committed outbox event per root job, none for the others.
    for j in &v.jobs {
        let events = pending_for(s, &j.job.id).await;
        if j.job.status == JobStatus::Ready {
            assert_eq!(events.len(), 1, "root job {} has one outbox event", j.job.name);
            assert_eq!(events[0].dispatch_generation, j.job.dispatch_generation);
            assert_eq!(events[0].class_key, j.job.class_key);
            assert!(j.job.dispatch_generation > 0);
        } else {
            assert!(events.is_empty(), "pending job {} has no outbox event", j.job.name);
        }
    }
    let ready: Vec<String> = s.ready_jobs().await.unwrap().into_iter().map(|e| e.job_id).collect();
    assert!(ready.contains(&jv(&v, "build").job.id));
    assert!(ready.contains(&jv(&v, "lint").job.id));
    assert!(!ready.contains(&jv(&v, "test").job.id));

    // get_job agrees with get_run.
    let b = s.get_job(&jv(&v, "build").job.id).await.unwrap();
    assert_eq!(b.status, JobStatus::Ready);
    assert_eq!(b.name, "build");

    let listed = s.list_runs(&repo.id, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, acc.run_id);
    assert_eq!(s.list_runs(&repo.id, Some("queued"), 10).await.unwrap().len(), 1);
    assert!(s.list_runs(&repo.id, Some("running"), 10).await.unwrap().is_empty());

    // Filtered listing across repositories, by branch (`main` matches
    // `refs/heads/main`), id prefixes and neighbours.
    let find = |repo_id: Option<&str>, status: Option<&str>, branch: Option<&str>| RunFilter {
        repo_id: repo_id.map(Into::into),
        status: status.map(Into::into),
        branch: branch.map(Into::into),
        limit: 10,
        ..Default::default()
    };
    let ids = |list: Vec<RunSummaryRecord>| list.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(s.find_runs(&find(None, None, None)).await.unwrap()), std::slice::from_ref(&acc.run_id));
    assert_eq!(
        ids(s.find_runs(&find(Some(&repo.id), Some("queued"), Some("main"))).await.unwrap()),
        std::slice::from_ref(&acc.run_id)
    );
    assert!(s.find_runs(&find(None, None, Some("dev"))).await.unwrap().is_empty());
    assert!(s.find_runs(&find(None, Some("failed"), None)).await.unwrap().is_empty());
    assert_eq!(s.find_runs_by_prefix(&acc.run_id[..8], 5).await.unwrap(), std::slice::from_ref(&acc.run_id));
    assert!(s.find_runs_by_prefix("ffffffff", 5).await.unwrap().is_empty());
    assert_eq!(s.run_id_neighbours(&acc.run_id).await.unwrap(), (None, None));

    // A repository with runs cannot be removed; one without can, once.
    assert!(matches!(s.delete_repo(&repo.name).await, Err(StoreError::Conflict(_))));
    let empty = s.create_repo("empty", "/srv/empty", None).await.unwrap();
    s.put_secret(&empty.id, "TOKEN", "sealed").await.unwrap();
    assert_eq!(s.delete_repo("empty").await.unwrap().id, empty.id);
    assert!(matches!(s.get_repo("empty").await, Err(StoreError::NotFound(_))));
    assert!(matches!(s.delete_repo("empty").await, Err(StoreError::NotFound(_))));

    assert!(matches!(s.get_run("no-such-run").await, Err(StoreError::NotFound(_))));
}

/// The run list filtered by event and actor, and paged with `before`
/// (keyset on creation time, then id): pages neither repeat nor skip runs,
/// even when runs share a creation millisecond.
pub async fn runs_are_filtered_by_event_and_actor_and_paged<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let repo = repo(s).await;
    let mut made = Vec::new();
    for i in 0..5 {
        let mut req = new_run(&repo.id, workflow(vec![job("build", &[], 0)]));
        req.event = if i % 2 == 0 { "push".into() } else { "manual".into() };
        req.actor = Some(if i < 3 { "alice".into() } else { "bob".into() });
        made.push(s.accept_run(req).await.unwrap().run_id);
    }
    let f = |event: Option<&str>, actor: Option<&str>, before: Option<&str>, limit: u32| RunFilter {
        repo_id: Some(repo.id.clone()),
        event: event.map(Into::into),
        actor: actor.map(Into::into),
        before: before.map(Into::into),
        limit,
        ..Default::default()
    };
    let ids = |list: Vec<RunSummaryRecord>| list.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    assert_eq!(ids(s.find_runs(&f(None, None, None, 10)).await.unwrap()), newest_first);
    assert_eq!(
        ids(s.find_runs(&f(Some("push"), None, None, 10)).await.unwrap()),
        [made[4].clone(), made[2].clone(), made[0].clone()]
    );
    assert_eq!(ids(s.find_runs(&f(None, Some("bob"), None, 10)).await.unwrap()), [made[4].clone(), made[3].clone()]);
    assert_eq!(ids(s.find_runs(&f(Some("manual"), Some("alice"), None, 10)).await.unwrap()), [made[1].clone()]);
    // Pages of two: 4 3 | 2 1 | 0, then nothing.
    let mut paged = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = ids(s.find_runs(&f(None, None, before.as_deref(), 2)).await.unwrap());
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        before = page.last().cloned();
        paged.extend(page);
    }
    assert_eq!(paged, newest_first);
    // Paging composes with the filters.
    assert_eq!(ids(s.find_runs(&f(Some("push"), None, Some(&made[4]), 1)).await.unwrap()), [made[2].clone()]);
}

fn idem(scope: &str, key: &str, digest: &str) -> Option<Idempotency> {
    Some(Idempotency { scope: scope.into(), key: key.into(), request_digest: digest.into() })
}

async fn count_runs<S: Store>(s: &S, repo_id: &str) -> usize {
    s.list_runs(repo_id, None, 1000).await.unwrap().len()
}

pub async fn idempotency_key_returns_the_same_run<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let repo = repo(s).await;
    let wf = workflow(vec![job("build", &[], 0)]);
    let mut req = new_run(&repo.id, wf.clone());
    req.idempotency = idem("user:alice/repo:x", "key-1", "digest-1");
    // The acceptance writes its audit entry with the run it creates (its
    // target the new run), and none for a replay.
    req.audit = Some(NewAudit {
        actor: "token:t1".into(),
        action: "run.submit".into(),
        target: String::new(),
        detail: "repository x event manual trust trusted".into(),
    });

    let first = s.accept_run(req.clone()).await.unwrap();
    assert!(first.created);
    let again = s.accept_run(req.clone()).await.unwrap();
    assert_eq!(again, Accepted { run_id: first.run_id.clone(), created: false });
    assert_eq!(count_runs(s, &repo.id).await, 1);
    let audit = s.list_audit(None, 10).await.unwrap();
    let entries: Vec<_> = audit.iter().map(|e| (e.actor.as_str(), e.action.as_str(), e.target.as_str())).collect();
    assert_eq!(entries, [("token:t1", "run.submit", first.run_id.as_str())]);
    assert_eq!(audit[0].detail, "repository x event manual trust trusted");
    req.audit = None;
    // The replay did not add jobs or outbox events to the run.
    let v = view(s, &first.run_id).await;
    assert_eq!(v.jobs.len(), 1);
    assert_eq!(pending_for(s, &v.jobs[0].job.id).await.len(), 1);

    // Another caller's scope with the same key is a different request.
    let mut other_scope = req.clone();
    other_scope.idempotency = idem("user:bob/repo:x", "key-1", "digest-1");
    let other = s.accept_run(other_scope).await.unwrap();
    assert!(other.created);
    assert_ne!(other.run_id, first.run_id);
    // A different key in the same scope too.
    let mut other_key = req.clone();
    other_key.idempotency = idem("user:alice/repo:x", "key-2", "digest-1");
    let third = s.accept_run(other_key).await.unwrap();
    assert!(third.created);
    assert_ne!(third.run_id, first.run_id);
    assert_ne!(third.run_id, other.run_id);
    assert_eq!(count_runs(s, &repo.id).await, 3);

    // Runs without a key are never deduplicated.
    s.accept_run(new_run(&repo.id, wf.clone())).await.unwrap();
    s.accept_run(new_run(&repo.id, wf)).await.unwrap();
    assert_eq!(count_runs(s, &repo.id).await, 5);
}

pub async fn idempotency_key_with_other_body_is_refused<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let repo = repo(s).await;
    let mut req = new_run(&repo.id, workflow(vec![job("build", &[], 0)]));
    req.idempotency = idem("user:alice/repo:x", "key-1", "digest-1");
    let first = s.accept_run(req.clone()).await.unwrap();
    let outbox_before = s.pending_outbox(10_000).await.unwrap();

    let mut changed = req.clone();
    changed.commit_sha = "fedcba9876543210fedcba9876543210fedcba98".into();
    changed.workflow = workflow(vec![job("build", &[], 0), job("test", &["build"], 0)]);
    changed.idempotency = idem("user:alice/repo:x", "key-1", "digest-2");
    match s.accept_run(changed).await {
        Err(StoreError::IdempotencyMismatch) => {}
        other => panic!("expected IdempotencyMismatch, got {other:?}"),
    }
    // Nothing new was stored.
    let runs = s.list_runs(&repo.id, None, 100).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].id, first.run_id);
    assert_eq!(runs[0].commit_sha, req.commit_sha);
    assert_eq!(s.pending_outbox(10_000).await.unwrap(), outbox_before);

    // The original binding still holds.
    let again = s.accept_run(req).await.unwrap();
    assert_eq!(again, Accepted { run_id: first.run_id, created: false });
}

pub async fn concurrent_idempotent_accepts_create_one_run<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let repo = repo(&*fx.store).await;
    let mut req = new_run(&repo.id, workflow(vec![job("build", &[], 0)]));
    req.idempotency = idem("webhook", "delivery-42", "digest-1");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = fx.store.clone();
        let req = req.clone();
        tasks.push(tokio::spawn(async move { s.accept_run(req).await }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap().expect("concurrent accept"));
    }
    assert_eq!(results.iter().filter(|a| a.created).count(), 1, "{results:?}");
    assert!(results.iter().all(|a| a.run_id == results[0].run_id));
    assert_eq!(count_runs(&*fx.store, &repo.id).await, 1);
}

/// A run for a repository that does not exist is the caller's mistake, not an
/// outage: it must not be reported as `Unavailable` (which means "nothing was
/// decided, retry").
pub async fn unknown_repository_is_not_unavailable<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    match s.accept_run(new_run("no-such-repo", workflow(vec![job("build", &[], 0)]))).await {
        Err(StoreError::NotFound(_) | StoreError::Invalid(_)) => {}
        other => panic!("expected NotFound or Invalid, got {other:?}"),
    }
    assert!(s.pending_outbox(100).await.unwrap().is_empty());
}

/// Run numbers (issue 42): 1, 2, 3… per repository in acceptance order,
/// independent across repositories, found by (repository, number), never
/// taken by an idempotent replay, and distinct under concurrent acceptance.
pub async fn runs_are_numbered_per_repository<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (a, b) = (repo(s).await, repo(s).await);
    let wf = || workflow(vec![job("build", &[], 0)]);
    let mut numbers = vec![];
    for repo in [&a, &a, &b, &a, &b] {
        let acc = s.accept_run(new_run(&repo.id, wf())).await.unwrap();
        let n = view(s, &acc.run_id).await.run.number;
        assert_eq!(s.find_run_by_number(&repo.id, n).await.unwrap(), acc.run_id);
        numbers.push(n);
    }
    assert_eq!(numbers, [1, 2, 1, 3, 2], "numbered per repository, in order");
    let listed: Vec<i64> = s.list_runs(&a.id, None, 10).await.unwrap().into_iter().map(|r| r.number).collect();
    assert_eq!(listed, [3, 2, 1], "the list carries the numbers, newest first");
    assert!(matches!(s.find_run_by_number(&a.id, 4).await, Err(StoreError::NotFound(_))));
    assert!(matches!(s.find_run_by_number(&b.id, 3).await, Err(StoreError::NotFound(_))));

    // An idempotent replay returns the same run and takes no number.
    let mut req = new_run(&a.id, wf());
    req.idempotency = idem("webhook", "delivery-n", "digest-n");
    let first = s.accept_run(req.clone()).await.unwrap();
    let again = s.accept_run(req).await.unwrap();
    assert_eq!((first.run_id.as_str(), again.created), (again.run_id.as_str(), false));
    assert_eq!(view(s, &first.run_id).await.run.number, 4);
    // A refused acceptance (its transaction rolled back) takes no number.
    let mut bad = new_run(&a.id, wf());
    bad.pin_succeeded = true;
    assert!(s.accept_run(bad).await.is_err());
    let pr = NewRun { pull_request_title: Some("Add caching".into()), ..new_run(&a.id, wf()) };
    let next = s.accept_run(pr).await.unwrap();
    let run = view(s, &next.run_id).await.run;
    assert_eq!((run.number, run.pull_request_title.as_deref()), (5, Some("Add caching")));
    let listed = &s.list_runs(&a.id, None, 1).await.unwrap()[0];
    assert_eq!(listed.pull_request_title.as_deref(), Some("Add caching"));
    assert_eq!(listed.commit_title.as_deref(), Some("Fix the build"));

    // Concurrent acceptances in one repository get distinct numbers, the
    // next ones in a row.
    let retries_before = s.transaction_retries();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = fx.store.clone();
        let req = new_run(&b.id, wf());
        tasks.push(tokio::spawn(async move { store.accept_run(req).await }));
    }
    let mut got = vec![];
    for t in tasks {
        let acc = t.await.unwrap().expect("concurrent accept");
        got.push(view(s, &acc.run_id).await.run.number);
    }
    got.sort();
    assert_eq!(got, (3..=10).collect::<Vec<i64>>(), "distinct and consecutive");
    // ... without running any acceptance again: on PostgreSQL the counter
    // row made all but one of those running together lose a serialization
    // race, again and again (9–15 retries for these 8; 83 for 50 runs
    // submitted at once; `kiln_db_transaction_retries_total`), and then
    // SSI's page-level conflicts between their new rows did (0–4 here, 57
    // for 50 at once). A plain acceptance reads only its own rows and runs
    // at READ COMMITTED.
    let retried = s.transaction_retries() - retries_before;
    assert_eq!(retried, 0, "{retried} retries of 8 plain acceptances running together");
}

/// The neighbours of a page of runs read together are, for each run, what
/// `run_id_neighbours` says of it alone: for every run, for one
/// repository's runs between another's (whose ids lie in between), for a
/// run at either end, for a page whose span holds many more runs than it
/// (read one by one), and for an id that is no run.
pub async fn run_id_neighbours_of_a_page_are_each_runs_own<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (a, b) = (repo(s).await, repo(s).await);
    let mut mine = vec![];
    let mut all = vec![];
    for i in 0..30 {
        let r = if i % 5 == 0 { &a } else { &b };
        let id = s.accept_run(new_run(&r.id, workflow(vec![job("j", &[], 0)]))).await.unwrap().run_id;
        if i % 5 == 0 {
            mine.push(id.clone());
        }
        all.push(id);
    }
    let check = async |ids: &[String]| {
        let got = s.run_id_neighbours_of(ids).await.unwrap();
        assert_eq!(got.len(), ids.len());
        for id in ids {
            assert_eq!(got[id], s.run_id_neighbours(id).await.unwrap(), "{id}");
        }
    };
    check(&all).await;
    check(&mine).await;
    check(&all[..1]).await;
    check(&all[all.len() - 1..]).await;
    check(&[all[0].clone(), all[all.len() - 1].clone()]).await;
    check(&[mine[2].clone(), "no-such-run".to_string()]).await;
    assert!(s.run_id_neighbours_of(&[]).await.unwrap().is_empty());
}
