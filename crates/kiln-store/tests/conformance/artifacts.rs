//! Artifact generations, sealing, binding in the completion transaction and
//! garbage collection (spec 000 §9, §12; invariant 4).
//!
//! An upload session is a fresh generation of one attempt. Only the
//! completion transaction of the current live epoch binds a generation, and
//! only a SEALED generation of that very epoch; nothing is ever inherited from
//! a fenced epoch. Unbound generations of ended attempts are garbage.

use super::*;
use kiln_core::RunStatus;
use kiln_workflow::{Artifacts, Publish};
use std::collections::BTreeSet;

/// A well-formed sha256 (64 lowercase hex digits).
const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const SIZE: i64 = 3 << 20;
const PART: i64 = 1 << 20;

/// A job that declares `outputs` under `artifacts.publish`.
fn publishing(name: &str, needs: &[&str], outputs: &[&str]) -> Job {
    Job {
        artifacts: Artifacts {
            publish: outputs
                .iter()
                .map(|o| Publish { name: o.to_string(), path: format!("out/{o}"), expire_in_secs: None })
                .collect(),
            restore: Vec::new(),
        },
        ..job(name, needs, 0)
    }
}

/// `build` publishes `jar`; `test` needs `build`.
fn build_and_test() -> Workflow {
    workflow(vec![publishing("build", &[], &["jar"]), job("test", &["build"], 0)])
}

/// Let the live lease of `(job, epoch)` run out: the runner stops
/// heartbeating. Tests claim with a long lease and shorten it right before
/// they need it expired, so the work before it cannot race the lease.
async fn vanish<S: Store>(s: &S, job_id: &str, epoch: i64) {
    s.heartbeat(job_id, epoch, SHORT_TTL).await.expect("heartbeat of the live epoch");
    expire(SHORT_TTL).await;
}

/// Open an upload session; it must succeed.
async fn open_gen<S: Store>(s: &S, job_id: &str, epoch: i64, name: &str) -> GenerationRecord {
    s.create_generation(job_id, epoch, name, SIZE, SHA, PART)
        .await
        .unwrap_or_else(|e| panic!("create generation `{name}` for {job_id}/{epoch}: {e}"))
}

#[track_caller]
fn assert_invalid<T: Debug>(r: Result<T>) {
    match r {
        Err(StoreError::Invalid(_)) => {}
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[track_caller]
fn assert_not_found<T: Debug>(r: Result<T>) {
    match r {
        Err(StoreError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

async fn state<S: Store>(s: &S, id: &str) -> String {
    s.get_generation(id).await.expect("get generation").state
}

/// Ids of the generations GC would collect now with `grace_ms`.
async fn collectable<S: Store>(s: &S, grace_ms: i64) -> Vec<String> {
    let mut ids: Vec<String> =
        s.collectable_generations(grace_ms, 10_000).await.expect("collectable").into_iter().map(|g| g.id).collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&GenerationRecord]) -> Vec<String> {
    let mut v: Vec<String> = ids.iter().map(|g| g.id.clone()).collect();
    v.sort();
    v
}

// ---------- 1. create_generation ----------

pub async fn create_generation_requires_live_epoch_and_declared_name<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![publishing("build", &[], &["jar", "docs"]), publishing("lint", &[], &["report"])]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let lint = job_id(s, &run_id, "lint").await;

    // Not claimed yet: there is no live epoch at all.
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
    assert_stale(s.create_generation(&build, 0, "jar", SIZE, SHA, PART).await);

    claim(s, &a, &build, LONG_TTL).await;
    claim(s, &a, &lint, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    assert_eq!((g.job_id.as_str(), g.run_id.as_str(), g.epoch), (build.as_str(), run_id.as_str(), 1));
    assert_eq!((g.name.as_str(), g.state.as_str()), ("jar", "uploading"));
    assert_eq!((g.expected_size, g.expected_sha256.as_str(), g.part_size), (SIZE, SHA, PART));
    assert_eq!(s.get_generation(&g.id).await.unwrap(), g);

    // Wrong epochs are stale.
    assert_stale(s.create_generation(&build, 0, "jar", SIZE, SHA, PART).await);
    assert_stale(s.create_generation(&build, 2, "jar", SIZE, SHA, PART).await);
    // Only names the job itself declares under `artifacts.publish`.
    assert_invalid(s.create_generation(&build, 1, "undeclared", SIZE, SHA, PART).await);
    assert_invalid(s.create_generation(&build, 1, "report", SIZE, SHA, PART).await);
    assert_invalid(s.create_generation(&lint, 1, "jar", SIZE, SHA, PART).await);
    open_gen(s, &lint, 1, "report").await;
    open_gen(s, &build, 1, "docs").await;
    // Malformed metadata.
    let upper = SHA.to_uppercase();
    let bad_shas = [&SHA[..63], &format!("{SHA}0"), &format!("{}g", &SHA[..63]), upper.as_str(), &"Ab".repeat(32)];
    for bad in bad_shas {
        assert_invalid(s.create_generation(&build, 1, "jar", SIZE, bad, PART).await);
    }
    assert_invalid(s.create_generation(&build, 1, "jar", -1, SHA, PART).await);
    assert_invalid(s.create_generation(&build, 1, "jar", SIZE, SHA, 0).await);
    s.create_generation(&build, 1, "jar", 0, SHA, PART).await.expect("an empty artifact is valid");
    assert_not_found(s.create_generation("no-such-job", 1, "jar", SIZE, SHA, PART).await);

    // An expired lease is stale in database time, before any reconciler runs...
    vanish(s, &build, 1).await;
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
    // ...and after fencing; the replacement's sessions are its own.
    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
    let g2 = open_gen(s, &build, 2, "jar").await;
    assert_eq!(g2.epoch, 2);
    assert_ne!(g2.object_key, g.object_key);
}

pub async fn every_session_gets_a_fresh_generation_and_key<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;

    // Identical requests in the same epoch: two sessions, never one key.
    let g1 = open_gen(s, &build, 1, "jar").await;
    let g2 = open_gen(s, &build, 1, "jar").await;
    assert_ne!(g1.id, g2.id);
    assert_ne!(g1.object_key, g2.object_key);
    s.seal_generation(&g1.id, &build, 1).await.unwrap();
    let g3 = open_gen(s, &build, 1, "jar").await;
    assert_ne!(g3.object_key, g1.object_key, "a sealed object is never handed out again");

    // The replacement epoch of the same job gets fresh keys too.
    vanish(s, &build, 1).await;
    s.fence_expired().await.unwrap();
    claim(s, &a, &build, LONG_TTL).await;
    let g4 = open_gen(s, &build, 2, "jar").await;
    // And so does the same job name in another run.
    let (_, run2) = start(s, build_and_test()).await;
    let build2 = job_id(s, &run2, "build").await;
    claim(s, &a, &build2, LONG_TTL).await;
    let g5 = open_gen(s, &build2, 1, "jar").await;

    let all = [&g1, &g2, &g3, &g4, &g5];
    let mut keys: Vec<&str> = all.iter().map(|g| g.object_key.as_str()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), all.len(), "object keys are unique: {keys:?}");
    let mut ids: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), all.len());
    assert_eq!(state(s, &g1.id).await, "sealed");
    assert_eq!(state(s, &g2.id).await, "uploading", "opening a session leaves other sessions alone");
}

// ---------- 2. uploadable_generation ----------

/// The object store's multipart upload of a generation is recorded once:
/// the first id wins (a racing server aborts its own), and a generation that
/// stopped uploading (sealed, failed, collected) takes none.
pub async fn first_upload_id_wins_while_uploading<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    assert_eq!(g.upload_id, "", "no upload before the first part");
    assert_eq!(s.set_generation_upload(&g.id, "up-1").await.unwrap(), "up-1");
    assert_eq!(s.set_generation_upload(&g.id, "up-2").await.unwrap(), "up-1", "the first id stays");
    assert_eq!(s.get_generation(&g.id).await.unwrap().upload_id, "up-1");
    assert_invalid(s.set_generation_upload(&g.id, "").await);
    assert_not_found(s.set_generation_upload("no-such-generation", "up-3").await);
    let sealed = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&sealed.id, &build, 1).await.unwrap();
    assert_conflict(s.set_generation_upload(&sealed.id, "up-4").await);
    let collected = open_gen(s, &build, 1, "jar").await;
    s.mark_generation_deleted(&collected.id).await.unwrap();
    assert_conflict(s.set_generation_upload(&collected.id, "up-5").await);
    assert_eq!(s.get_generation(&collected.id).await.unwrap().upload_id, "");
}

pub async fn uploadable_only_while_live_and_uploading<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    let sealed = open_gen(s, &build, 1, "jar").await;
    let failed = open_gen(s, &build, 1, "jar").await;

    assert_eq!(s.uploadable_generation(&g.id).await.unwrap(), g);
    s.seal_generation(&sealed.id, &build, 1).await.unwrap();
    assert_conflict(s.uploadable_generation(&sealed.id).await);
    s.fail_generation(&failed.id, "sha256 mismatch").await.unwrap();
    assert_eq!(state(s, &failed.id).await, "failed");
    assert_conflict(s.uploadable_generation(&failed.id).await);
    assert_not_found(s.uploadable_generation("no-such-generation").await);

    // The lease expired in database time: the session is closed at once.
    vanish(s, &build, 1).await;
    assert_stale(s.uploadable_generation(&g.id).await);
    assert_stale(s.uploadable_generation(&sealed.id).await);
    // Fenced: still closed, and it stays closed for the replacement.
    s.fence_expired().await.unwrap();
    assert_stale(s.uploadable_generation(&g.id).await);
    claim(s, &a, &build, LONG_TTL).await;
    assert_stale(s.uploadable_generation(&g.id).await);
    let g2 = open_gen(s, &build, 2, "jar").await;
    assert_eq!(s.uploadable_generation(&g2.id).await.unwrap(), g2);
    assert_eq!(state(s, &g.id).await, "uploading", "a read changes nothing");
}

pub async fn uploadable_closes_when_the_attempt_ends<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![publishing("build", &[], &["jar", "docs"])]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let jar = open_gen(s, &build, 1, "jar").await;
    let docs = open_gen(s, &build, 1, "docs").await;
    let extra = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&jar.id, &build, 1).await.unwrap();
    s.seal_generation(&docs.id, &build, 1).await.unwrap();
    s.uploadable_generation(&extra.id).await.unwrap();
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    // The lease is long, but the attempt ended: the open session is closed.
    assert_stale(s.uploadable_generation(&extra.id).await);
    assert_stale(s.seal_generation(&extra.id, &build, 1).await);
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
}

// ---------- 3. seal_generation ----------

pub async fn seal_requires_the_generations_live_epoch<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![publishing("build", &[], &["jar"]), publishing("lint", &[], &["jar"])]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let lint = job_id(s, &run_id, "lint").await;
    claim(s, &a, &build, LONG_TTL).await;
    claim(s, &a, &lint, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;

    // Another job's live epoch (same epoch number) cannot seal it...
    assert_not_found(s.seal_generation(&g.id, &lint, 1).await);
    // ...nor can a wrong epoch of its own job, nor an unknown job.
    assert_stale(s.seal_generation(&g.id, &build, 2).await);
    assert_stale(s.seal_generation(&g.id, &build, 0).await);
    assert!(s.seal_generation(&g.id, "no-such-job", 1).await.is_err());
    assert!(s.seal_generation("no-such-generation", &build, 1).await.is_err());
    assert_eq!(state(s, &g.id).await, "uploading", "refused seals changed nothing");

    // The right epoch seals; sealing again is idempotent.
    let sealed = s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!(sealed.state, "sealed");
    assert_eq!(GenerationRecord { state: "uploading".into(), ..sealed.clone() }, g, "only the state changed");
    assert_eq!(s.seal_generation(&g.id, &build, 1).await.unwrap(), sealed);
    assert_eq!(s.get_generation(&g.id).await.unwrap(), sealed);

    // A failed generation cannot be sealed.
    let bad = open_gen(s, &build, 1, "jar").await;
    s.fail_generation(&bad.id, "size mismatch").await.unwrap();
    assert!(s.seal_generation(&bad.id, &build, 1).await.is_err());
    assert_eq!(state(s, &bad.id).await, "failed");
    // Failing is only for uploading sessions: a sealed one stays sealed.
    s.fail_generation(&g.id, "late mismatch").await.unwrap();
    assert_eq!(state(s, &g.id).await, "sealed");

    // Expired lease (not fenced yet): stale, even to re-seal.
    let open = open_gen(s, &build, 1, "jar").await;
    vanish(s, &build, 1).await;
    assert_stale(s.seal_generation(&open.id, &build, 1).await);
    assert_stale(s.seal_generation(&g.id, &build, 1).await);
    // Fenced: stale.
    s.fence_expired().await.unwrap();
    assert_stale(s.seal_generation(&open.id, &build, 1).await);
    assert_eq!(state(s, &open.id).await, "uploading");
    // The replacement epoch cannot adopt the old epoch's session either.
    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);
    assert_not_found(s.seal_generation(&open.id, &build, 2).await);
    assert_stale(s.seal_generation(&open.id, &build, 1).await);
    assert_eq!(state(s, &open.id).await, "uploading");
}

// ---------- 4. binding in the completion transaction ----------

pub async fn completion_binds_the_sealed_output<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    let sealed = s.seal_generation(&g.id, &build, 1).await.unwrap();

    // Sealing publishes nothing: bindings are made only by completion.
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    assert_not_found(s.resolve_binding(&run_id, "build", "jar").await);
    assert_eq!(job_status(s, &test).await, JobStatus::Pending);

    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    let want = BoundArtifact {
        job_id: build.clone(),
        job_name: "build".into(),
        name: "jar".into(),
        generation: sealed,
        expires_at: None,
        expired_at: None,
    };
    assert_eq!(s.run_bindings(&run_id).await.unwrap(), vec![want.clone()]);
    let got = s.resolve_binding(&run_id, "build", "jar").await.unwrap();
    assert_eq!(got, want);
    assert_eq!((got.generation.id.as_str(), got.generation.epoch), (g.id.as_str(), 1));
    assert_eq!(job_status(s, &test).await, JobStatus::Ready);

    // The binding is immutable: nothing later re-binds or deletes it.
    assert_stale(s.complete(&build, 1, success()).await);
    s.mark_generation_deleted(&g.id).await.unwrap();
    assert_eq!(s.resolve_binding(&run_id, "build", "jar").await.unwrap(), want);
    claim(s, &a, &test, LONG_TTL).await;
    assert_eq!(s.complete(&test, 1, success()).await.unwrap(), "success");
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Success);
    assert_eq!(s.run_bindings(&run_id).await.unwrap(), vec![want]);
}

pub async fn completion_binds_every_declared_output_of_the_epoch<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![publishing("build", &[], &["jar", "docs"]), publishing("lint", &[], &["report"])]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let lint = job_id(s, &run_id, "lint").await;
    claim(s, &a, &build, LONG_TTL).await;
    claim(s, &a, &lint, LONG_TTL).await;
    let jar = open_gen(s, &build, 1, "jar").await;
    let docs = open_gen(s, &build, 1, "docs").await;
    let abandoned = open_gen(s, &build, 1, "jar").await; // never sealed
    let report = open_gen(s, &lint, 1, "report").await;
    let jar = s.seal_generation(&jar.id, &build, 1).await.unwrap();
    let docs = s.seal_generation(&docs.id, &build, 1).await.unwrap();
    s.seal_generation(&report.id, &lint, 1).await.unwrap();

    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
    let bound = s.run_bindings(&run_id).await.unwrap();
    let mut got: Vec<(String, String, String)> =
        bound.iter().map(|b| (b.job_name.clone(), b.name.clone(), b.generation.id.clone())).collect();
    got.sort();
    let mut want = vec![
        ("build".to_string(), "docs".to_string(), docs.id.clone()),
        ("build".to_string(), "jar".to_string(), jar.id.clone()),
    ];
    want.sort();
    assert_eq!(got, want, "only the completing job's outputs, and only sealed ones");
    assert!(bound.iter().all(|b| b.generation.state == "sealed" && b.generation.epoch == 1));
    assert!(bound.iter().all(|b| b.generation.id != abandoned.id));
    assert_not_found(s.resolve_binding(&run_id, "lint", "report").await);
}

/// Success reported while a declared output is not sealed: the job fails.
async fn unsealed_output_fails_the_job<S: Store + 'static>(o: &Opener<S>, prepare: &str) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![publishing("build", &[], &["jar", "docs"]), job("test", &["build"], 0)]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    // `docs` is always sealed; `jar` is not.
    let docs = open_gen(s, &build, 1, "docs").await;
    s.seal_generation(&docs.id, &build, 1).await.unwrap();
    match prepare {
        "uploading" => {
            open_gen(s, &build, 1, "jar").await;
        }
        "failed" => {
            let g = open_gen(s, &build, 1, "jar").await;
            s.fail_generation(&g.id, "sha256 mismatch").await.unwrap();
        }
        "missing" => {}
        other => unreachable!("{other}"),
    }

    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "failed", "jar {prepare}");
    let v = view(s, &run_id).await;
    let b = jv(&v, "build");
    assert_eq!(b.job.status, JobStatus::Failed);
    let msg = b.job.message.clone().unwrap_or_default();
    assert!(msg.contains("jar"), "the failure names the artifact: {msg:?}");
    assert_eq!(outcomes(b), [AttemptOutcome::Failed]);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
    assert!(pending_for(s, &test).await.is_empty(), "no successor dispatch");
    assert_eq!(v.run.status, RunStatus::Failed);
    // No binding at all, not even for the sealed `docs`.
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    assert_not_found(s.resolve_binding(&run_id, "build", "docs").await);
    assert_not_found(s.resolve_binding(&run_id, "build", "jar").await);
}

pub async fn success_with_uploading_output_fails_the_job<S: Store + 'static>(o: &Opener<S>) {
    unsealed_output_fails_the_job(o, "uploading").await;
}

pub async fn success_with_failed_output_fails_the_job<S: Store + 'static>(o: &Opener<S>) {
    unsealed_output_fails_the_job(o, "failed").await;
}

pub async fn success_without_output_fails_the_job<S: Store + 'static>(o: &Opener<S>) {
    unsealed_output_fails_the_job(o, "missing").await;
}

pub async fn failed_completion_binds_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!(s.complete(&build, 1, failure(1)).await.unwrap(), "failed");
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty(), "a sealed output of a failed attempt is not bound");
    assert_eq!(collectable(s, 0).await, vec![g.id]);
}

pub async fn retried_job_binds_only_the_succeeding_epochs_outputs<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![Job { retry: 1, ..publishing("build", &[], &["jar", "docs"]) }, job("test", &["build"], 0)]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    // Epoch 1 seals `docs` but not `jar`: its success is refused and retried.
    let docs1 = open_gen(s, &build, 1, "docs").await;
    s.seal_generation(&docs1.id, &build, 1).await.unwrap();
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "ready");
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());

    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);
    // Epoch 2 seals only `jar`: epoch 1's sealed `docs` does not complete it.
    let jar2 = open_gen(s, &build, 2, "jar").await;
    let jar2 = s.seal_generation(&jar2.id, &build, 2).await.unwrap();
    assert_not_found(s.seal_generation(&docs1.id, &build, 2).await);
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "failed");
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    assert_eq!(collectable(s, 0).await, sorted(&[&docs1, &jar2]));
}

pub async fn retried_job_binds_the_succeeding_epoch<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![Job { retry: 1, ..publishing("build", &[], &["jar"]) }, job("test", &["build"], 0)]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let jar1 = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&jar1.id, &build, 1).await.unwrap();
    // The tests of epoch 1 failed after it sealed its JAR.
    assert_eq!(s.complete(&build, 1, failure(1)).await.unwrap(), "ready");
    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);
    let jar2 = open_gen(s, &build, 2, "jar").await;
    let jar2 = s.seal_generation(&jar2.id, &build, 2).await.unwrap();
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    let bound = s.resolve_binding(&run_id, "build", "jar").await.unwrap();
    assert_eq!((bound.generation, bound.job_id), (jar2, build.clone()));
    assert_eq!(collectable(s, 0).await, vec![jar1.id]);
}

pub async fn cancelled_run_binds_nothing<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!(s.cancel_run(&run_id).await.unwrap().status, RunStatus::Cancelling);
    // Cancellation committed first: the late success is rejected and binds nothing.
    assert_conflict(s.complete(&build, 1, success()).await);
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    assert_not_found(s.resolve_binding(&run_id, "build", "jar").await);
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Cancelled);
    assert_eq!(collectable(s, 0).await, vec![g.id]);
}

/// The opening story of spec 000: the runner disappears, a replacement runs,
/// the original reconnects and reports success.
pub async fn vanished_runner_never_wins_the_binding<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let old = agent(s, "old", 4).await;
    let new = agent(s, "new", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;

    // Epoch 1 uploads and even seals its JAR, then vanishes.
    assert_eq!(claim(s, &old, &build, LONG_TTL).await.epoch, 1);
    let g1 = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g1.id, &build, 1).await.unwrap();
    let g1_open = open_gen(s, &build, 1, "jar").await;
    vanish(s, &build, 1).await;
    // Before the reconciler runs its late success is already refused.
    assert_stale(s.complete(&build, 1, success()).await);
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    assert_eq!(s.fence_expired().await.unwrap(), vec![(build.clone(), 1)]);

    // Epoch 2 runs on another agent and seals its own JAR.
    assert_eq!(claim(s, &new, &build, LONG_TTL).await.epoch, 2);
    let g2 = open_gen(s, &build, 2, "jar").await;
    // The old runner reconnects mid-way: it can neither seal nor publish.
    let before = snapshot(s, &run_id).await;
    assert_stale(s.seal_generation(&g1_open.id, &build, 1).await);
    assert_stale(s.seal_generation(&g1.id, &build, 1).await);
    assert_stale(s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await);
    assert_stale(s.complete(&build, 1, success()).await);
    assert_eq!(snapshot(s, &run_id).await, before);
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    let g2 = s.seal_generation(&g2.id, &build, 2).await.unwrap();

    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    let bound = s.resolve_binding(&run_id, "build", "jar").await.unwrap();
    assert_eq!(bound.generation, g2);
    assert_eq!(bound.generation.epoch, 2);
    assert_ne!(bound.generation.object_key, g1.object_key);
    assert_eq!(job_status(s, &test).await, JobStatus::Ready);

    // The late completion of epoch 1 after the winner committed: still stale,
    // and the binding is unchanged.
    let after = snapshot(s, &run_id).await;
    assert_stale(s.complete(&build, 1, success()).await);
    assert_stale(s.complete(&build, 1, failure(1)).await);
    assert_eq!(snapshot(s, &run_id).await, after);
    assert_eq!(s.run_bindings(&run_id).await.unwrap(), vec![bound]);
    // Epoch 1's sealed generation is garbage now, never an input.
    assert_eq!(collectable(s, 0).await, sorted(&[&g1, &g1_open]));
}

pub async fn replacement_never_inherits_a_fenced_epochs_output<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g1 = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g1.id, &build, 1).await.unwrap();
    vanish(s, &build, 1).await;
    s.fence_expired().await.unwrap();
    assert_eq!(claim(s, &a, &build, LONG_TTL).await.epoch, 2);

    // Epoch 2 reports success without sealing anything: epoch 1's sealed JAR
    // is not substituted.
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "failed");
    assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "build").job.status, JobStatus::Failed);
    assert_eq!(jv(&v, "test").job.status, JobStatus::Skipped);
}

// ---------- 5. resolve_binding ----------

pub async fn resolve_binding_by_name_and_id_within_its_run<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let a = agent(s, "a", 4).await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (_, run_id) = start(s, build_and_test()).await;
        let build = job_id(s, &run_id, "build").await;
        claim(s, &a, &build, LONG_TTL).await;
        let g = open_gen(s, &build, 1, "jar").await;
        let g = s.seal_generation(&g.id, &build, 1).await.unwrap();
        s.complete(&build, 1, success()).await.unwrap();
        runs.push((run_id, build, g));
    }
    // A third run whose build is still running.
    let (_, run3) = start(s, build_and_test()).await;
    let build3 = job_id(s, &run3, "build").await;
    claim(s, &a, &build3, LONG_TTL).await;
    let g3 = open_gen(s, &build3, 1, "jar").await;
    s.seal_generation(&g3.id, &build3, 1).await.unwrap();

    for (i, (run_id, build, g)) in runs.iter().enumerate() {
        let by_name = s.resolve_binding(run_id, "build", "jar").await.unwrap();
        let by_id = s.resolve_binding(run_id, build, "jar").await.unwrap();
        assert_eq!(by_name, by_id);
        assert_eq!(&by_name.generation, g);
        assert_eq!((by_name.job_id.as_str(), by_name.job_name.as_str()), (build.as_str(), "build"));
        assert_eq!(by_name.generation.run_id, *run_id);
        assert_eq!(s.run_bindings(run_id).await.unwrap(), vec![by_name]);

        // Unknown job, name or run.
        assert_not_found(s.resolve_binding(run_id, "build", "docs").await);
        assert_not_found(s.resolve_binding(run_id, "test", "jar").await);
        assert_not_found(s.resolve_binding(run_id, "nope", "jar").await);
        assert_not_found(s.resolve_binding("no-such-run", "build", "jar").await);
        // Another run's producer job id never resolves here.
        let (other_run, other_build, _) = &runs[1 - i];
        assert_not_found(s.resolve_binding(run_id, other_build, "jar").await);
        assert_ne!(other_run, run_id);
    }
    assert_not_found(s.resolve_binding(&run3, "build", "jar").await);
    assert_not_found(s.resolve_binding(&run3, &build3, "jar").await);
    assert!(s.run_bindings(&run3).await.unwrap().is_empty());
    assert!(s.run_bindings("no-such-run").await.unwrap().is_empty());
}

// ---------- 6. garbage collection ----------

pub async fn gc_collects_only_unbound_generations_of_ended_attempts<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(vec![
        publishing("build", &[], &["jar"]),
        publishing("lint", &[], &["report"]),
        publishing("docs", &[], &["site"]),
    ]);
    let (_, run_id) = start(s, wf).await;
    let a = agent(s, "a", 8).await;
    let [build, lint, docs] =
        [job_id(s, &run_id, "build").await, job_id(s, &run_id, "lint").await, job_id(s, &run_id, "docs").await];

    // build epoch 1: sealed and open sessions, then lost.
    claim(s, &a, &build, LONG_TTL).await;
    let lost_sealed = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&lost_sealed.id, &build, 1).await.unwrap();
    let lost_open = open_gen(s, &build, 1, "jar").await;
    claim(s, &a, &lint, LONG_TTL).await;
    claim(s, &a, &docs, LONG_TTL).await;
    let running_sealed = open_gen(s, &docs, 1, "site").await;
    s.seal_generation(&running_sealed.id, &docs, 1).await.unwrap();
    let running_open = open_gen(s, &docs, 1, "site").await;
    assert!(collectable(s, 0).await.is_empty(), "every attempt is still running");

    vanish(s, &build, 1).await;
    // Expired but not fenced: the attempt is not recorded as ended yet.
    assert!(collectable(s, 0).await.is_empty());
    s.fence_expired().await.unwrap();
    assert_eq!(collectable(s, 0).await, sorted(&[&lost_sealed, &lost_open]));
    assert!(collectable(s, LONG_TTL).await.is_empty(), "younger than the grace");

    // build epoch 2 succeeds: its bound output is never garbage, its
    // superseded and failed sessions are.
    claim(s, &a, &build, LONG_TTL).await;
    let winner = open_gen(s, &build, 2, "jar").await;
    let superseded = open_gen(s, &build, 2, "jar").await;
    let failed = open_gen(s, &build, 2, "jar").await;
    s.fail_generation(&failed.id, "sha256 mismatch").await.unwrap();
    let winner = s.seal_generation(&winner.id, &build, 2).await.unwrap();
    assert_eq!(collectable(s, 0).await, sorted(&[&lost_sealed, &lost_open]), "epoch 2 is running");
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    assert_eq!(s.resolve_binding(&run_id, "build", "jar").await.unwrap().generation, winner);

    // lint fails with a sealed report.
    let report = open_gen(s, &lint, 1, "report").await;
    s.seal_generation(&report.id, &lint, 1).await.unwrap();
    assert_eq!(s.complete(&lint, 1, failure(1)).await.unwrap(), "failed");

    let garbage = sorted(&[&lost_sealed, &lost_open, &superseded, &failed, &report]);
    assert_eq!(collectable(s, 0).await, garbage);
    assert!(collectable(s, LONG_TTL).await.is_empty());
    let page = s.collectable_generations(0, 2).await.unwrap();
    assert_eq!(page.len(), 2, "the limit is honoured");
    assert!(page.iter().all(|g| garbage.contains(&g.id)));

    // A bound generation is never deleted, whatever the caller asks.
    s.mark_generation_deleted(&winner.id).await.unwrap();
    assert_eq!(state(s, &winner.id).await, "sealed");
    assert_eq!(s.resolve_binding(&run_id, "build", "jar").await.unwrap().generation, winner);

    // Deleted garbage is not returned again.
    for id in [&lost_sealed.id, &superseded.id] {
        s.mark_generation_deleted(id).await.unwrap();
        assert_eq!(state(s, id).await, "deleted");
    }
    s.mark_generation_deleted(&lost_sealed.id).await.expect("deleting twice is harmless");
    assert_eq!(collectable(s, 0).await, sorted(&[&lost_open, &failed, &report]));
    // The running docs attempt's generations were never offered.
    let all = collectable(s, 0).await;
    assert!(!all.contains(&running_sealed.id) && !all.contains(&running_open.id));
    assert!(!all.contains(&winner.id));
    for g in s.collectable_generations(0, 10_000).await.unwrap() {
        assert_ne!(g.state, "deleted");
    }
}

pub async fn deleted_generation_is_never_bound<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g.id, &build, 1).await.unwrap();
    // Whatever a GC does to a running attempt's generation, completion never
    // binds bytes that may be gone.
    s.mark_generation_deleted(&g.id).await.unwrap();
    if state(s, &g.id).await == "deleted" {
        assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "failed");
        assert!(s.run_bindings(&run_id).await.unwrap().is_empty());
    } else {
        assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
        assert_eq!(s.resolve_binding(&run_id, "build", "jar").await.unwrap().generation.id, g.id);
    }
}

/// A session opened without a digest (the agent hashes while uploading) can
/// be sealed only once the digest is named, by the live epoch, and never
/// changed afterwards.
pub async fn digest_named_at_seal_time<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, build_and_test()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let g = s.create_generation(&build, 1, "jar", SIZE, "", PART).await.expect("a deferred digest is valid");
    assert_eq!(g.expected_sha256, "");
    assert!(s.seal_generation(&g.id, &build, 1).await.is_err(), "sealed without a digest");
    assert_invalid(s.set_generation_digest(&g.id, &build, 1, "nope").await);
    assert_stale(s.set_generation_digest(&g.id, &build, 2, SHA).await);
    let named = s.set_generation_digest(&g.id, &build, 1, SHA).await.unwrap();
    assert_eq!(named.expected_sha256, SHA);
    s.set_generation_digest(&g.id, &build, 1, SHA).await.expect("naming the same digest again is idempotent");
    let other = "b".repeat(64);
    assert_conflict(s.set_generation_digest(&g.id, &build, 1, &other).await);
    let sealed = s.seal_generation(&g.id, &build, 1).await.unwrap();
    assert_eq!((sealed.state.as_str(), sealed.expected_sha256.as_str()), ("sealed", SHA));
    assert!(s.set_generation_digest(&g.id, &build, 1, &other).await.is_err(), "a sealed digest changed");
}

// ---------- 6. retention: expiry fixed at binding (issue 16) ----------

async fn bound<S: Store>(s: &S, run_id: &str, name: &str) -> BoundArtifact {
    s.resolve_binding(run_id, "build", name).await.unwrap()
}

/// `expire-in` is frozen into the definition; the completion transaction
/// fixes each binding's `expires_at`. Only bindings of ended runs expire;
/// an expired binding's row stays, its generation becomes `expired` and
/// is never collected as garbage or handed out as sealed bytes.
pub async fn bound_artifacts_expire_only_after_their_run_ended<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let mut build = publishing("build", &[], &["jar", "keep", "long", "tree"]);
    for p in &mut build.artifacts.publish {
        p.expire_in_secs = match p.name.as_str() {
            "jar" | "tree" => Some(0),
            "long" => Some(3650 * 86400),
            _ => None,
        };
    }
    let (_, run_id) = start(s, workflow(vec![build, job("test", &["build"], 0)])).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    let test = job_id(s, &run_id, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    let mut ids = BTreeMap::new();
    for name in ["jar", "keep", "long", "tree"] {
        let kind = if name == "tree" { "archive" } else { "file" };
        let g = NewGeneration { name, size: SIZE, sha256: SHA, part_size: PART, kind };
        let g = s.open_generation(&build, 1, g).await.unwrap();
        assert_eq!(g.kind, kind);
        s.seal_generation(&g.id, &build, 1).await.unwrap();
        ids.insert(name, g.id);
    }
    let bad = NewGeneration { name: "jar", size: SIZE, sha256: SHA, part_size: PART, kind: "tarball" };
    assert_invalid(s.open_generation(&build, 1, bad).await);
    assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");

    let run = run_id.as_str();
    let (jar, keep, long, tree) = (
        bound(s, run, "jar").await,
        bound(s, run, "keep").await,
        bound(s, run, "long").await,
        bound(s, run, "tree").await,
    );
    assert!(jar.expires_at.is_some() && tree.expires_at.is_some());
    assert!(long.expires_at.unwrap() > jar.expires_at.unwrap());
    assert_eq!(keep.expires_at, None, "no expire-in: never expires");
    assert_eq!(tree.generation.kind, "archive");
    assert!([&jar, &keep, &long, &tree].iter().all(|b| b.expired_at.is_none()));

    // The run is live: its artifacts are held, whatever their expiry.
    assert!(s.expirable_artifacts(100).await.unwrap().is_empty());
    assert!(!s.expire_artifact(&ids["jar"]).await.unwrap());
    assert_eq!(state(s, &ids["jar"]).await, "sealed");

    claim(s, &a, &test, LONG_TTL).await;
    assert_eq!(s.complete(&test, 1, success()).await.unwrap(), "success");
    let names = |v: Vec<BoundArtifact>| v.into_iter().map(|b| b.name).collect::<BTreeSet<_>>();
    let due = names(s.expirable_artifacts(100).await.unwrap());
    assert_eq!(due, BTreeSet::from(["jar".to_string(), "tree".to_string()]));

    assert!(s.expire_artifact(&ids["jar"]).await.unwrap());
    let jar = bound(s, run, "jar").await;
    let at = jar.expired_at.expect("expired_at set");
    assert_eq!(jar.generation.state, "expired");
    assert!(s.expire_artifact(&ids["jar"]).await.unwrap(), "idempotent");
    assert_eq!(bound(s, run, "jar").await.expired_at, Some(at), "the first expiry time stays");
    // Until its bytes are marked deleted it is offered again (a crash
    // between the two steps is finished by the next round).
    assert!(names(s.expirable_artifacts(100).await.unwrap()).contains("jar"));
    s.mark_expired_deleted(&ids["jar"]).await.unwrap();
    assert_eq!(names(s.expirable_artifacts(100).await.unwrap()), BTreeSet::from(["tree".to_string()]));

    // Never expired: the others; never garbage: the expired one.
    assert!(!s.expire_artifact(&ids["keep"]).await.unwrap());
    assert!(!s.expire_artifact(&ids["long"]).await.unwrap());
    assert_eq!(state(s, &ids["keep"]).await, "sealed");
    assert!(!collectable(s, 0).await.contains(&ids["jar"]));
    s.mark_generation_deleted(&ids["jar"]).await.unwrap();
    assert_eq!(state(s, &ids["jar"]).await, "expired");
    // The rows stay.
    assert_eq!(s.run_bindings(&run_id).await.unwrap().len(), 4);
}

/// Retry from the failed jobs (spec 000 §9, retry from job; `kiln retry RUN
/// --failed`): the successful prefix is pinned in the acceptance
/// transaction — `success` without an attempt, bound to the very
/// generation its parent job bound — and the failed job and its
/// descendants run again. Refused while the parent runs or when nothing
/// in it failed.
pub async fn retry_of_failed_jobs_pins_the_successful_prefix<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let wf = || {
        let mut build = publishing("build", &[], &["jar"]);
        build.outputs = vec!["version".into()];
        workflow(vec![build, job("test", &["build"], 0), job("deploy", &["test"], 0)])
    };
    let (repo, parent) = start(s, wf()).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &parent, "build").await;
    let test = job_id(s, &parent, "test").await;
    claim(s, &a, &build, LONG_TTL).await;
    let jar = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&jar.id, &build, 1).await.unwrap();

    // While the parent runs, there is no final result to pin.
    let retry_failed = |p: &str| NewRun {
        parent_run_id: Some(p.to_string()),
        pin_succeeded: true,
        rerun_jobs: Vec::new(),
        event: "retry".into(),
        ..new_run(&repo.id, wf())
    };
    assert_conflict(s.accept_run(retry_failed(&parent)).await);

    let with_version = CompletionInput { outputs: BTreeMap::from([("version".into(), "1.2.3".into())]), ..success() };
    assert_eq!(s.complete(&build, 1, with_version).await.unwrap(), "success");
    claim(s, &a, &test, LONG_TTL).await;
    s.complete(&test, 1, failure(1)).await.unwrap();
    let before = view(s, &parent).await;
    assert_eq!(before.run.status, RunStatus::Failed);
    assert_eq!(jv(&before, "deploy").job.status, JobStatus::Skipped);

    let child = s.accept_run(retry_failed(&parent)).await.unwrap().run_id;
    let v = view(s, &child).await;
    assert_eq!(v.run.parent_run_id.as_deref(), Some(parent.as_str()));
    assert_eq!(
        statuses(&v),
        [
            ("build".into(), JobStatus::Success),
            ("test".into(), JobStatus::Ready),
            ("deploy".into(), JobStatus::Pending)
        ]
    );
    let pinned = jv(&v, "build");
    assert!(pinned.attempts.is_empty(), "a pinned job does not run: {:?}", pinned.attempts);
    assert_eq!(pinned.job.current_epoch, 0);
    assert!(pinned.job.message.as_deref().is_some_and(|m| m.contains("pinned") && m.contains(&parent)));
    assert_eq!(pinned.job.finished_at, jv(&before, "build").job.finished_at);
    // The same generation, bound to the retry's own job.
    let bound = s.resolve_binding(&child, "build", "jar").await.unwrap();
    assert_eq!((bound.generation.id.as_str(), bound.job_id.as_str()), (jar.id.as_str(), pinned.job.id.as_str()));
    assert_eq!(bound.generation.expected_sha256, SHA);
    let all = s.run_bindings(&child).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].job_id, pinned.job.id);
    // And the same outputs (issue 16), for the jobs that run again.
    let outputs = s.run_outputs(&child).await.unwrap();
    assert_eq!(outputs["build"], BTreeMap::from([("version".to_string(), "1.2.3".to_string())]));
    // The parent's binding is untouched, and a generation bound twice is no garbage.
    assert_eq!(s.resolve_binding(&parent, "build", "jar").await.unwrap().job_id, build);
    assert!(!collectable(s, 0).await.contains(&jar.id));

    // The failed job runs again (epoch 1 of the new job), then its descendants.
    let test2 = jv(&v, "test").job.id.clone();
    assert!(!pending_for(s, &test2).await.is_empty(), "the re-run job has its dispatch event");
    claim(s, &a, &test2, LONG_TTL).await;
    assert_eq!(s.complete(&test2, 1, success()).await.unwrap(), "success");
    let deploy2 = job_id(s, &child, "deploy").await;
    assert_eq!(job_status(s, &deploy2).await, JobStatus::Ready);
    claim(s, &a, &deploy2, LONG_TTL).await;
    assert_eq!(s.complete(&deploy2, 1, success()).await.unwrap(), "success");
    assert_eq!(view(s, &child).await.run.status, RunStatus::Success);

    // Nothing failed in the retry: nothing to retry from. A plain retry still works.
    assert_conflict(s.accept_run(retry_failed(&child)).await);
    let plain = NewRun { parent_run_id: Some(child.clone()), event: "retry".into(), ..new_run(&repo.id, wf()) };
    let plain = s.accept_run(plain).await.unwrap().run_id;
    assert_eq!(jv(&view(s, &plain).await, "build").job.status, JobStatus::Ready);
    assert!(s.run_bindings(&plain).await.unwrap().is_empty());
}

/// Issue 45: the completion that binds an artifact writes its signed
/// provenance in the same transaction — the winning epoch's, never a
/// fenced epoch's — from the frozen facts; the statement verifies with the
/// server's key and names the repository, commit, workflow, the epoch and
/// the artifact a downstream job restored. Without a signer no artifact
/// is bound at all.
pub async fn bindings_carry_signed_provenance_of_the_winning_epoch_only<S: Store + 'static>(o: &Opener<S>) {
    use kiln_provenance::verify::{Policy, verify};
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let mut test = publishing("test", &["build"], &["report"]);
    test.artifacts.restore =
        vec![kiln_workflow::Restore { from_job: "build".into(), name: "jar".into(), path: "in/jar".into() }];
    let service = kiln_workflow::Service {
        image: "127.0.0.1:5000/postgres:16".into(),
        digest: Some(format!("sha256:{}", "d".repeat(64))),
        env: Default::default(),
        ports: vec![],
        command: vec![],
        health: None,
    };
    test.services.insert("db".into(), service);
    let wf = workflow(vec![publishing("build", &[], &["jar"]), test]);
    let (repo, run_id) = start(s, wf).await;
    let (old, new) = (agent(s, "old", 4).await, agent(s, "new", 4).await);
    let build = job_id(s, &run_id, "build").await;
    claim(s, &old, &build, LONG_TTL).await;
    let g1 = open_gen(s, &build, 1, "jar").await;
    s.seal_generation(&g1.id, &build, 1).await.unwrap();
    vanish(s, &build, 1).await;
    s.fence_expired().await.unwrap();
    claim(s, &new, &build, LONG_TTL).await;
    let g2 = open_gen(s, &build, 2, "jar").await;
    s.seal_generation(&g2.id, &build, 2).await.unwrap();
    assert!(s.artifact_provenance(&g2.id).await.unwrap().is_none(), "sealed is not bound: no provenance yet");
    assert_eq!(s.complete(&build, 2, success()).await.unwrap(), "success");
    assert!(s.artifact_provenance(&g1.id).await.unwrap().is_none(), "a fenced epoch's bytes have none");
    let p = s.artifact_provenance(&g2.id).await.unwrap().expect("the binding's provenance");
    assert_eq!((p.run_id.as_str(), p.job_id.as_str(), p.epoch), (run_id.as_str(), build.as_str(), 2));
    let policy = Policy { repository: repo.name.clone(), ..Policy::default() };
    let v = verify(p.envelope.as_bytes(), "jar", SHA, &test_keys(), &policy).unwrap_or_else(|e| panic!("{e}"));
    let pred = &v.statement.predicate;
    let ext = &pred["buildDefinition"]["externalParameters"];
    let run = view(s, &run_id).await.run;
    assert_eq!(ext["commit"], run.commit_sha.as_str());
    assert_eq!(ext["workflow"]["sha256"], run.workflow_hash.as_str());
    assert_eq!(pred["buildDefinition"]["internalParameters"]["epoch"], 2);
    assert_eq!(pred["runDetails"]["builder"]["id"], "https://kiln.test/builders/default");
    assert!(verify(p.envelope.as_bytes(), "jar", &"f".repeat(64), &test_keys(), &policy).is_err());

    // The downstream job's statement names the generation it restored.
    let testj = job_id(s, &run_id, "test").await;
    claim(s, &new, &testj, LONG_TTL).await;
    let r = s.create_generation(&testj, 1, "report", SIZE, SHA, PART).await.unwrap();
    s.seal_generation(&r.id, &testj, 1).await.unwrap();
    s.report_cache(&testj, 1, r#"{"key":"deps-abc","result":"hit","namespace":"protected"}"#).await.unwrap();
    // A statement that cannot be signed: no binding, nothing changed (the
    // agent's completion is retried and succeeds once signing works).
    struct Broken;
    impl Attester for Broken {
        fn sign(&self, _: &[u8]) -> std::result::Result<(String, String), String> {
            Err("the key is unreachable".into())
        }
        fn builder_id(&self, pool: &str) -> String {
            pool.into()
        }
        fn version(&self) -> String {
            "broken".into()
        }
        fn verifying_keys(&self) -> Vec<kiln_provenance::dsse::PublicKey> {
            Vec::new()
        }
    }
    s.set_attester(std::sync::Arc::new(Broken));
    let before = snapshot(s, &run_id).await;
    assert!(matches!(s.complete(&testj, 1, success()).await, Err(StoreError::Unavailable(_))));
    assert_eq!(snapshot(s, &run_id).await, before, "no binding without provenance");
    assert!(s.artifact_provenance(&r.id).await.unwrap().is_none());
    s.set_attester(test_attester());
    assert_eq!(s.complete(&testj, 1, success()).await.unwrap(), "success");
    let p = s.artifact_provenance(&r.id).await.unwrap().expect("provenance");
    let v = verify(p.envelope.as_bytes(), "report", SHA, &test_keys(), &policy).unwrap();
    let deps = v.statement.predicate["buildDefinition"]["resolvedDependencies"].as_array().unwrap().clone();
    let jar = deps.iter().find(|d| d["name"] == "jar").expect("the restored jar is a dependency");
    assert_eq!(jar["digest"]["sha256"], SHA);
    assert_eq!(jar["annotations"]["generation"], g2.id.as_str());
    assert!(deps.iter().any(|d| d["digest"]["gitCommit"] == run.commit_sha.as_str()));
    // Its service by the pinned digest, and the cache it restored by key.
    let db = deps.iter().find(|d| d["name"] == "service:db").expect("the service is a dependency");
    assert_eq!(
        (db["uri"].as_str(), db["digest"]["sha256"].as_str()),
        (Some("oci://127.0.0.1:5000/postgres:16"), Some("d".repeat(64).as_str()))
    );
    let cache = deps.iter().find(|d| d["name"] == "cache").expect("the restored cache is a dependency");
    assert_eq!(
        (cache["uri"].as_str(), cache["annotations"]["result"].as_str()),
        (Some("kiln:caches/protected/deps-abc"), Some("hit"))
    );
}

/// Content-addressed bytes (issue 45): generations of the same bytes share
/// one content object, referenced until no generation that is not deleted
/// names it; the collector's delete and a new reference never both win
/// (SERIALIZABLE); a `deleting` object makes a seal wait, never join it;
/// a generation sealed before content addressing moves to its object and
/// its old bytes retire later.
pub async fn content_objects_live_while_any_generation_references_them<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let key = kiln_store::content_key(SHA);
    let a = agent(s, "a", 64).await;
    // Two runs publish the same bytes: one object, referenced by both.
    let mut bound = Vec::new();
    for _ in 0..2 {
        let (_, run_id) = start(s, build_and_test()).await;
        let build = job_id(s, &run_id, "build").await;
        claim(s, &a, &build, LONG_TTL).await;
        let g = open_gen(s, &build, 1, "jar").await;
        assert!(!g.content_addressed() && g.session_key == g.object_key, "uploaded under its own key");
        assert_eq!(s.reference_content(&g.id, &build, 1).await.unwrap(), key);
        let sealed = s.seal_generation(&g.id, &build, 1).await.unwrap();
        assert!(sealed.content_addressed() && sealed.session_key == g.session_key);
        assert_eq!(s.complete(&build, 1, success()).await.unwrap(), "success");
        bound.push((run_id, sealed));
    }
    assert_eq!(s.content_usage().await.unwrap(), (1, SIZE), "stored once");
    let resolved = s.resolve_binding(&bound[0].0, "build", "jar").await.unwrap();
    assert_eq!(resolved.generation.object_key, key, "readers read the content object");
    let far = -3_600_000; // a grace in the future: the touch protects nothing
    assert!(s.collectable_content(far, 100).await.unwrap().is_empty(), "bound generations reference it");
    assert!(!s.begin_content_delete(SHA, far).await.unwrap(), "never while referenced");

    // A fenced attempt's generation references other bytes; once the
    // collector deleted it, nothing does.
    let (_, run_id) = start(s, build_and_test()).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    let other = "f".repeat(64);
    let lost = s.create_generation(&build, 1, "jar", 5, &other, PART).await.unwrap();
    s.reference_content(&lost.id, &build, 1).await.unwrap();
    assert_eq!(s.content_usage().await.unwrap(), (2, SIZE + 5));
    assert!(s.collectable_content(far, 100).await.unwrap().is_empty());
    s.mark_generation_deleted(&lost.id).await.unwrap();
    assert!(s.collectable_content(LONG_TTL, 100).await.unwrap().is_empty(), "touched within the grace");
    assert_eq!(s.collectable_content(far, 100).await.unwrap(), vec![other.clone()]);
    // Its deletion begun, a seal of the same bytes waits (Busy) rather than
    // joining bytes about to go; after it, it stores them afresh.
    assert!(s.begin_content_delete(&other, far).await.unwrap());
    assert!(s.begin_content_delete(&other, far).await.unwrap(), "begun already: go on");
    let again = s.create_generation(&build, 1, "jar", 5, &other, PART).await.unwrap();
    match s.reference_content(&again.id, &build, 1).await {
        Err(StoreError::Busy(_)) => {}
        other => panic!("a deleting object is not joined: {other:?}"),
    }
    assert!(!s.get_generation(&again.id).await.unwrap().content_addressed(), "nothing changed");
    s.content_deleted(&other).await.unwrap();
    assert_eq!(s.content_usage().await.unwrap(), (1, SIZE));
    s.reference_content(&again.id, &build, 1).await.unwrap();
    assert_eq!(s.content_usage().await.unwrap(), (2, SIZE + 5));

    // A new reference and the collector at the same moment: never both.
    for i in 0..12 {
        let sha = format!("{:064x}", 0xc0ffee + i);
        let first = s.create_generation(&build, 1, "jar", 7, &sha, PART).await.unwrap();
        s.reference_content(&first.id, &build, 1).await.unwrap();
        s.mark_generation_deleted(&first.id).await.unwrap();
        let next = s.create_generation(&build, 1, "jar", 7, &sha, PART).await.unwrap();
        let (referenced, deleting) =
            tokio::join!(s.reference_content(&next.id, &build, 1), s.begin_content_delete(&sha, far));
        match (referenced, deleting.unwrap()) {
            (Ok(_), false) | (Err(StoreError::Busy(_)), true) => {}
            (r, d) => panic!("round {i}: reference {r:?} while the collector's delete began: {d}"),
        }
    }

    // A generation sealed before content addressing moves to its object;
    // its old bytes retire after the given delay.
    let legacy = s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await.unwrap();
    s.seal_generation(&legacy.id, &build, 1).await.unwrap();
    let old = s.migratable_generations(100).await.unwrap();
    assert_eq!(old.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(), vec![legacy.id.as_str()]);
    s.touch_content(SHA, SIZE).await.unwrap();
    assert!(s.move_to_content(&legacy.id, &legacy.object_key, LONG_TTL).await.unwrap());
    assert!(!s.move_to_content(&legacy.id, &legacy.object_key, 0).await.unwrap(), "moved once");
    let moved = s.get_generation(&legacy.id).await.unwrap();
    assert_eq!((moved.object_key.as_str(), moved.session_key.as_str()), (key.as_str(), legacy.object_key.as_str()));
    assert!(s.migratable_generations(100).await.unwrap().is_empty());
    assert!(s.retirable_sessions(100).await.unwrap().is_empty(), "not before its time");
    let soon = s.create_generation(&build, 1, "jar", SIZE, SHA, PART).await.unwrap();
    s.seal_generation(&soon.id, &build, 1).await.unwrap();
    assert!(s.move_to_content(&soon.id, &soon.object_key, -1).await.unwrap());
    let due = s.retirable_sessions(100).await.unwrap();
    assert_eq!(due.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(), vec![soon.id.as_str()]);
    s.session_retired(&soon.id).await.unwrap();
    assert!(s.retirable_sessions(100).await.unwrap().is_empty());
    assert_eq!(s.content_usage().await.unwrap().0, 2 + 12 - 12 + 12, "every object counted once");
}
