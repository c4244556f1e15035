//! Issue 41, item 3: every job not started says why in the run view's
//! `waiting`, from the real store — its concurrency group (as written, not
//! scoped by repository), its run's, its needs, and agents all busy.

use super::env::Env;
use crate::services::runs;

fn waiting(run: &kiln_api::Run, job: &str) -> Option<String> {
    run.jobs.iter().find(|j| j.name == job).unwrap_or_else(|| panic!("no job {job}")).waiting.clone()
}

#[tokio::test]
async fn groups_needs_and_busy_agents_are_said() {
    let env = Env::new().await;
    let a = env.agent(1).await;
    env.state.live_agents.connect(&a.0, &a.1);

    // A job-level group: the second run's job waits for the first's.
    let grouped =
        "version: 1\njobs:\n  - name: deploy\n    concurrency:\n      group: prod-${{ branch }}\n    steps: [echo]\n";
    let _g = env.repo("g", &[(".kiln/pipeline.yaml", grouped)]).await;
    let first = env.submit("g").await;
    let second = env.submit("g").await;
    let run = runs::get(&env.state, &first).await.unwrap();
    assert_eq!(waiting(&run, "deploy"), None, "ready, and the agent has room");
    let run = runs::get(&env.state, &second).await.unwrap();
    assert_eq!(waiting(&run, "deploy").as_deref(), Some("waiting for concurrency group `prod-main`"));
    assert_eq!(run.jobs[0].message.as_deref(), Some("waiting for concurrency group `prod-main`"));

    // The one agent takes the first run's job: it is full.
    env.relay().await;
    assert!(env.claim_now(&a, "c1").await.is_some());
    let _s = env.pipeline("s", &["build", "test"]).await;
    let seq = env.submit("s").await;
    let run = runs::get(&env.state, &seq).await.unwrap();
    assert_eq!(waiting(&run, "build").as_deref(), Some("waiting: every agent that can run it is busy (a1 1/1 jobs)"));
    assert_eq!(run.jobs[0].message, None, "busy is no news for the message");
    assert_eq!(waiting(&run, "test").as_deref(), Some("waiting for needs: build (ready)"));

    // A run-level group: the second run is held, every job says so.
    let held = "version: 1\nconcurrency: {group: release}\njobs:\n  - name: one\n    steps: [echo]\n";
    let _h = env.repo("h", &[(".kiln/pipeline.yaml", held)]).await;
    let _holder = env.submit("h").await;
    let waiter = env.submit("h").await;
    let run = runs::get(&env.state, &waiter).await.unwrap();
    assert_eq!(waiting(&run, "one").as_deref(), Some("waiting for concurrency group `release`"));
}
