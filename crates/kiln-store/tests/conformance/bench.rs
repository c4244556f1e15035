//! A throughput figure, not a test: claims per second through the store
//! (accept is outside the timed part). Run with
//! `cargo nextest run -p kiln-store --run-ignored only -E 'test(bench_)' --no-capture`.
//! Nothing asserts on time.

use super::*;
use std::time::Instant;

pub async fn claims_per_second<S: Store + 'static>(opener: &Opener<S>) {
    const RUNS: usize = 300;
    let fx = opener.open(FAST).await;
    let s = fx.store.clone();
    let repo = repo(&*s).await;
    let mut jobs = Vec::new();
    for _ in 0..RUNS {
        let acc = s.accept_run(new_run(&repo.id, workflow(vec![job("only", &[], 0)]))).await.unwrap();
        jobs.push(job_id(&*s, &acc.run_id, "only").await);
    }
    let a = agent(&*s, "bench", 100_000).await;
    // Sequential: one claim after another.
    let t = Instant::now();
    for j in &jobs[..RUNS / 2] {
        claim(&*s, &a, j, LONG_TTL).await;
    }
    let seq = (RUNS / 2) as f64 / t.elapsed().as_secs_f64();
    // Concurrent: 8 agents claiming distinct jobs of distinct runs.
    let mut agents = Vec::new();
    for i in 0..8 {
        agents.push(agent(&*s, &format!("bench-{i}"), 100_000).await);
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (chunk, a) in jobs[RUNS / 2..].chunks(RUNS / 16).zip(agents) {
        let (s, chunk) = (s.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for j in &chunk {
                let g = s.get_job(j).await.unwrap().dispatch_generation;
                s.claim(claim_input(&a, j, g, LONG_TTL)).await.unwrap().expect("claimed");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let conc = (RUNS / 2) as f64 / t.elapsed().as_secs_f64();
    // A complete + successor readiness, sequential.
    let t = Instant::now();
    for j in &jobs[..RUNS / 2] {
        s.complete(j, 1, success()).await.unwrap();
    }
    let comp = (RUNS / 2) as f64 / t.elapsed().as_secs_f64();
    eprintln!("BENCH claims/s sequential {seq:.0}, 8 concurrent {conc:.0}; completions/s sequential {comp:.0}");
}
