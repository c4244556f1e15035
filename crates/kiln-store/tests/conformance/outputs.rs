//! Job outputs (issue 16): bound like artifacts, only by the completion of
//! the live epoch that succeeds the job (spec 000 §9, invariant 4); read by
//! the `if:` of the jobs that need it.

use super::*;
use kiln_core::RunStatus;

fn wf(yaml: &str) -> Workflow {
    kiln_workflow::parse(yaml).unwrap_or_else(|d| panic!("workflow does not parse:\n{d}"))
}

fn with(outputs: &[(&str, &str)]) -> CompletionInput {
    CompletionInput { outputs: outputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..success() }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

const PIPELINE: &str = r#"version: 1
jobs:
  - {name: build, outputs: [version, channel], steps: [x]}
  - {name: release, needs: build, if: "needs.build.outputs.channel == 'stable'", steps: [x]}
  - {name: nightly, needs: build, if: "needs.build.outputs.channel != 'stable'", steps: [x]}
"#;

pub async fn outputs_bind_only_with_the_live_epochs_success<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, wf(PIPELINE)).await;
    let old = agent(s, "old", 4).await;
    let new = agent(s, "new", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &old, &build, LONG_TTL).await;

    // Refused outright, nothing changed: an undeclared name, too many bytes.
    let before = snapshot(s, &run_id).await;
    let undeclared = s.complete(&build, 1, with(&[("version", "1"), ("secret", "x")])).await;
    assert!(matches!(undeclared, Err(StoreError::Invalid(ref m)) if m.contains("`secret`")), "{undeclared:?}");
    let big = "x".repeat(kiln_workflow::MAX_OUTPUT_BYTES);
    let too_big = s.complete(&build, 1, with(&[("version", &big)])).await;
    assert!(matches!(too_big, Err(StoreError::Invalid(ref m)) if m.contains("at most")), "{too_big:?}");
    assert_eq!(snapshot(s, &run_id).await, before);
    assert!(s.run_outputs(&run_id).await.unwrap().is_empty());

    // Epoch 1 vanishes; epoch 2 replaces it. The stale success with its
    // outputs is refused and binds nothing.
    s.heartbeat(&build, 1, SHORT_TTL).await.unwrap();
    expire(SHORT_TTL).await;
    s.fence_expired().await.unwrap();
    assert_eq!(claim(s, &new, &build, LONG_TTL).await.epoch, 2);
    assert_stale(s.complete(&build, 1, with(&[("version", "1.0-stale"), ("channel", "stable")])).await);
    assert!(s.run_outputs(&run_id).await.unwrap().is_empty(), "a fenced attempt's outputs reach no one");

    // A failed completion of the live epoch binds nothing either.
    let failed = CompletionInput { outputs: map(&[("version", "2.0-failed")]), ..failure(1) };
    s.complete(&build, 2, failed).await.unwrap();
    assert!(s.run_outputs(&run_id).await.unwrap().is_empty());
}

pub async fn bound_outputs_decide_conditions_downstream<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let (_, run_id) = start(s, wf(PIPELINE)).await;
    let a = agent(s, "a", 4).await;
    let build = job_id(s, &run_id, "build").await;
    claim(s, &a, &build, LONG_TTL).await;
    // `channel` written, `version` declared but not written: absent.
    assert_eq!(s.complete(&build, 1, with(&[("channel", "nightly")])).await.unwrap(), "success");
    let outputs = s.run_outputs(&run_id).await.unwrap();
    assert_eq!(outputs, BTreeMap::from([("build".to_string(), map(&[("channel", "nightly")]))]));
    let v = view(s, &run_id).await;
    assert_eq!(jv(&v, "release").job.status, JobStatus::Skipped);
    assert!(jv(&v, "release").job.message.as_deref().unwrap_or("").contains("needs.build.outputs.channel"));
    assert_eq!(jv(&v, "nightly").job.status, JobStatus::Ready);
    let nightly = job_id(s, &run_id, "nightly").await;
    claim(s, &a, &nightly, LONG_TTL).await;
    s.complete(&nightly, 1, success()).await.unwrap();
    assert_eq!(view(s, &run_id).await.run.status, RunStatus::Success);
    // Bound outputs do not change after the job ended.
    assert_stale(s.complete(&build, 1, with(&[("channel", "stable")])).await);
    assert_eq!(s.run_outputs(&run_id).await.unwrap()["build"], map(&[("channel", "nightly")]));
}
