//! The operating signals read from the store (spec 000 §15): what
//! `/metrics` sets its gauges from and what `kiln top` shows. Known ready
//! jobs of distinct `runs-on` label sets, agents holding reservations, an
//! expired lease not yet fenced, and the exact values each read returns.

use super::*;
use std::time::Instant;

fn on(name: &str, needs: &[&str], labels: &[(&str, &str)]) -> Job {
    Job { runs_on: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..job(name, needs, 0) }
}

const LINUX: &str = r#"{"os":"linux"}"#;
const GPU: &str = r#"{"gpu":"yes","os":"linux"}"#;
const ANY: &str = "{}";

pub async fn operating_gauges_count_live_rows_by_class_and_agent<S: Store + 'static>(o: &Opener<S>) {
    let fx = o.open(FAST).await;
    let s = &*fx.store;
    let t0 = Instant::now();
    let within = |ms: i64| ms >= 0 && ms <= t0.elapsed().as_millis() as i64 + 5;
    // Three runs accepted apart, so that their classes' ages differ: run A
    // ({os: linux}, oldest), run B ({gpu: yes, os: linux}), run C (no labels).
    let linux = [("os", "linux")];
    let (_, run_a) = start(
        s,
        workflow(vec![
            on("l1", &[], &linux),
            on("l2", &[], &linux),
            on("l3", &[], &linux),
            on("after", &["l1"], &linux),
        ]),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let gpu = [("os", "linux"), ("gpu", "yes")];
    let (_, run_b) = start(s, workflow(vec![on("g1", &[], &gpu), on("g2", &[], &gpu)])).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let (_, _run_c) = start(s, workflow(vec![on("n1", &[], &[])])).await;

    // Reservations: linux-1 holds l1 (a long lease), linux-2 holds l2 with a
    // lease that expires; gpu-1 holds nothing.
    let a1 = s.register_agent("linux-1", LINUX, 2).await.unwrap();
    let a2 = s.register_agent("linux-2", LINUX, 1).await.unwrap();
    let a3 = s.register_agent("gpu-1", GPU, 3).await.unwrap();
    let (l1, l2) = (job_id(s, &run_a, "l1").await, job_id(s, &run_a, "l2").await);
    claim(s, &a1, &l1, LONG_TTL).await;
    claim(s, &a2, &l2, SHORT_TTL).await;
    let claimed = Instant::now();
    s.append_log_chunk(chunk(&l1, 1, "system", 0, 0, b"checking out r at 0123\n\xe2\x96\xb6 step 1/2: build\n"))
        .await
        .unwrap();
    expire(SHORT_TTL).await;

    let g = s.operating_gauges(20).await.unwrap();
    let runs: BTreeMap<String, u64> =
        [("queued", 2), ("running", 1), ("cancelling", 0)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    assert_eq!(g.active_runs, runs, "{g:?}");
    let classes: Vec<&str> = g.oldest_eligible_ms.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(classes, vec![LINUX, GPU, ANY], "the oldest class first: {g:?}");
    let ages: Vec<i64> = g.oldest_eligible_ms.iter().map(|(_, ms)| *ms).collect();
    assert!(ages.windows(2).all(|w| w[0] > w[1]), "runs accepted 30 ms apart: {ages:?}");
    assert!(ages.iter().all(|ms| within(*ms)), "{ages:?}");
    // Expired but not fenced: the lag is how long ago linux-2's lease ended.
    assert!(g.reconciler_lag_ms > 0, "{g:?}");
    assert!(g.reconciler_lag_ms <= claimed.elapsed().as_millis() as i64, "{g:?}");
    assert_eq!(g.oldest_unarchived_log_ms, 0, "no finished job has a log yet: {g:?}");
    // The limit keeps the oldest classes.
    let two = s.operating_gauges(2).await.unwrap();
    assert_eq!(two.oldest_eligible_ms.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(), vec![LINUX, GPU]);

    let counts: BTreeMap<String, u64> =
        [("pending", 1), ("ready", 4), ("running", 2)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    assert_eq!(s.active_job_counts().await.unwrap(), counts);
    let held = s.running_per_agent().await.unwrap();
    assert_eq!(held, BTreeMap::from([(a1.id.clone(), 1), (a2.id.clone(), 1)]), "gpu-1 holds nothing");
    assert!(!held.contains_key(&a3.id));

    // `kiln top`'s reads: the same classes with their counts, and the
    // running attempts with what their agents last said.
    let q = s.queue_classes(10).await.unwrap();
    let shape: Vec<(&str, u64)> = q.iter().map(|c| (c.class_key.as_str(), c.eligible)).collect();
    assert_eq!(shape, vec![(LINUX, 1), (GPU, 2), (ANY, 1)]);
    for (c, (_, gauge)) in q.iter().zip(&g.oldest_eligible_ms) {
        assert!(c.oldest_ms >= *gauge && within(c.oldest_ms), "{q:?} {g:?}");
    }
    assert_eq!(s.queue_classes(1).await.unwrap().len(), 1);
    let running = s.running_attempts(10).await.unwrap();
    type Shape<'a> = (&'a str, &'a str, i64, &'a str, &'a str, Option<&'a str>);
    let shape: Vec<Shape> = running
        .iter()
        .map(|r| {
            (
                r.job_name.as_str(),
                r.run_id.as_str(),
                r.epoch,
                r.agent_id.as_str(),
                r.runner.as_str(),
                r.last_system_line.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("l1", run_a.as_str(), 1, a1.id.as_str(), "linux-1", Some("▶ step 1/2: build")),
            ("l2", run_a.as_str(), 1, a2.id.as_str(), "linux-2", None),
        ],
        "longest-running first"
    );
    assert!(running.iter().all(|r| r.repo.starts_with("repo-") && within(r.elapsed_ms) && r.elapsed_ms > 0));
    assert_eq!(running[0].job_id, l1);
    assert_eq!(s.running_attempts(1).await.unwrap().len(), 1);

    // Fencing ends the lag and puts l2 back in its class (its infra
    // budget retries it at once under FAST); l1's success readies `after`
    // and leaves its log in the journal, unarchived.
    assert_eq!(s.fence_expired().await.unwrap(), vec![(l2.clone(), 1)]);
    s.complete(&l1, 1, success()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let g = s.operating_gauges(20).await.unwrap();
    assert_eq!(g.reconciler_lag_ms, 0, "{g:?}");
    assert!(g.oldest_unarchived_log_ms >= 20 && within(g.oldest_unarchived_log_ms), "{g:?}");
    let q = s.queue_classes(10).await.unwrap();
    let shape: Vec<(&str, u64)> = q.iter().map(|c| (c.class_key.as_str(), c.eligible)).collect();
    assert_eq!(shape, vec![(LINUX, 3), (GPU, 2), (ANY, 1)], "l2 again, l3, after");
    let counts: BTreeMap<String, u64> =
        [("pending", 0), ("ready", 6), ("running", 0)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    assert_eq!(s.active_job_counts().await.unwrap(), counts);
    assert!(s.running_per_agent().await.unwrap().is_empty());
    assert!(s.running_attempts(10).await.unwrap().is_empty());
    let _ = run_b;
}
