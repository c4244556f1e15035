//! Pinned image digests (spec 000 §5, §11): resolved digests are stored on
//! the jobs at acceptance; a digest an attempt built is committed once.

use super::*;

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

pub async fn accept_stores_the_resolved_image_digests<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let repo = repo(s).await;
    let mut req = new_run(&repo.id, workflow(vec![job("compile", &[], 0), job("test", &["compile"], 0)]));
    req.image_digests.insert("compile".into(), D1.into());
    let acc = s.accept_run(req).await.unwrap();
    let v = view(s, &acc.run_id).await;
    assert_eq!(jv(&v, "compile").job.image_digest.as_deref(), Some(D1));
    assert_eq!(jv(&v, "test").job.image_digest, None);
}

pub async fn built_image_digest_is_committed_once_by_the_live_epoch<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_repo, run) = start(s, workflow(vec![job("image", &[], 1)])).await;
    let a = agent(s, "builder", 1).await;
    let jid = job_id(s, &run, "image").await;
    let c = claim(s, &a, &jid, 30_000).await;
    assert!(matches!(s.commit_image_digest(&jid, c.epoch + 1, D1, false).await, Err(StoreError::StaleEpoch(_))));
    assert_eq!(s.commit_image_digest(&jid, c.epoch, D1, false).await.unwrap(), D1);
    // First wins: a second build's digest does not replace it.
    assert_eq!(s.commit_image_digest(&jid, c.epoch, D2, false).await.unwrap(), D1);
    assert_eq!(s.get_job(&jid).await.unwrap().image_digest.as_deref(), Some(D1));
    // A retry still sees it; an ended epoch may not commit.
    s.complete(&jid, c.epoch, failure(1)).await.unwrap();
    assert!(matches!(s.commit_image_digest(&jid, c.epoch, D2, false).await, Err(StoreError::StaleEpoch(_))));
    assert_eq!(s.get_job(&jid).await.unwrap().image_digest.as_deref(), Some(D1));
}
