//! Placement follows trust and isolation (issue 39 items 2 and 3,
//! ARCHITECTURE invariant 12), against a real server and real agents: a
//! fork's job aimed at a trusted host agent never runs there, a job with
//! `image:` never runs on a host executor, a job handed secrets or an
//! identity token runs only on an agent of the repository's secret pools.
//! Each waits, and says why, until an agent that may run it connects.

use crate::{BIN, containers_available, engine_url, registry};
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_run};
use std::time::{Duration, Instant};

fn base_image() -> String {
    format!("{}/kiln-test/base:latest", registry())
}

/// Agent names unique per test process (containers are labelled by agent).
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// The flags of a container agent (jobs without `image:` run in the base image).
fn container_flags(labels: &str) -> Vec<String> {
    ["--labels", labels, "--executor", "container", "--engine", &engine_url(), "--default-image", &base_image()]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn server() -> KilnServer {
    KilnServer::start(BIN.as_ref(), &["--insecure-registry", &registry()]).unwrap()
}

/// Waits until the job's status message contains `needle` (the job must
/// stay unclaimed meanwhile); returns the message.
async fn waits_saying(c: &Client, run: &str, job: &str, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let r = c.get_run(run).await.unwrap();
        let j = r.jobs.iter().find(|j| j.name == job).expect("job");
        assert!(j.attempts.is_empty(), "job `{job}` was claimed: {:#?}", j.attempts);
        assert_eq!(j.status, "ready", "{r:#?}");
        if let Some(m) = j.message.as_deref().filter(|m| m.contains(needle)) {
            return m.to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "job `{job}` never said `{needle}`: {r:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lets the connected agents poll for a while, then checks nobody claimed
/// the job (an agent that could would have within this time).
async fn still_unclaimed(c: &Client, run: &str, job: &str) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = c.get_run(run).await.unwrap();
    let j = r.jobs.iter().find(|j| j.name == job).expect("job");
    assert_eq!((j.status.as_str(), j.attempts.len()), ("ready", 0), "{r:#?}");
}

fn runner(r: &kiln_api::Run, job: &str) -> String {
    let j = r.jobs.iter().find(|j| j.name == job).expect("job");
    j.attempts.iter().map(|a| a.runner.clone()).collect::<Vec<_>>().join(",")
}

/// A fork's pull request names the trusted host agent's labels in its own
/// `runs-on`: it never runs there; `kiln status` says what it waits for;
/// it runs on the `forks` container agent once that connects.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_job_aimed_at_the_trusted_host_agent_waits_for_an_untrusted_agent() {
    let server = server();
    let wf = "version: 1\njobs:\n  - name: pr\n    runs-on: {os: linux, tier: deploy}\n    steps:\n      \
              - echo fork code ran here\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    let host = unique("trusted-host");
    let host_agent = server.agent(&host, &["--labels", "os=linux,tier=deploy"]).unwrap();
    let pr = SubmitRun { commit_sha: "HEAD".into(), event: Some("pull_request".into()), ..Default::default() };
    let run = c.submit_run("app", &pr, None).await.unwrap().run_id;
    assert_eq!(c.get_run(&run).await.unwrap().trust, "untrusted");

    let why = waits_saying(&c, &run, "pr", "takes untrusted work").await;
    assert!(
        why.contains(
            "waiting for an agent that takes untrusted work (pools: forks, container executor); none connected"
        ),
        "{why}"
    );
    assert!(why.contains(&format!("{host} (pool default, host executor)")), "{why}");
    still_unclaimed(&c, &run, "pr").await;
    let out = server.cli().args(["status", &run]).output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("waiting for an agent that takes untrusted work"), "{status}");
    // The agent said at start-up that it takes none.
    assert!(host_agent.log().contains("takes no untrusted work"), "{}", host_agent.log());

    // A trusted run of the same workflow runs on the trusted agent at once.
    let trusted = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await;
    let done = wait_run(&c, &trusted.unwrap().run_id, 60).await;
    assert_eq!((done.status.as_str(), runner(&done, "pr")), ("success", host.clone()), "{done:#?}");

    if !containers_available() {
        return;
    }
    let pr_box = unique("pr-box");
    let flags = container_flags("os=linux,tier=deploy");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let box_agent = server.pool_agent("forks", &pr_box, &flags).unwrap();
    let r = wait_run(&c, &run, 120).await;
    assert_eq!(r.status, "success", "{r:#?}\n{}", box_agent.log());
    assert_eq!(runner(&r, "pr"), pr_box, "only the forks container agent ran it");
    assert!(box_agent.log().contains("takes untrusted work (pools: forks, container executor)"), "{}", box_agent.log());
}

/// The same with a trigger token not made trusted (its runs are untrusted).
#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_trigger_token_run_never_runs_on_a_host_agent() {
    let server = server();
    let repo =
        TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: build\n    steps:\n      - echo hi\n")])
            .unwrap();
    server.add_repo("app", &repo);
    let out =
        server.cli().args(["token", "create", "--name", "ci-trigger", "--scope", "trigger", "--repo", "app"]).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trigger = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let _host = server.agent(&unique("host"), &[]).unwrap();
    let c = Client::new(&server.url, &trigger);
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await;
    let run = run.unwrap().run_id;
    let admin = Client::new(&server.url, &server.token);
    assert_eq!(admin.get_run(&run).await.unwrap().trust, "untrusted");
    waits_saying(&admin, &run, "build", "takes untrusted work").await;
    still_unclaimed(&admin, &run, "build").await;
}

/// A job with `image:` and only a host agent connected waits (it used to
/// run on the host, ignoring its image, with a log note); a container agent
/// runs it.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_job_never_runs_on_a_host_agent() {
    if !containers_available() {
        return;
    }
    let server = server();
    let wf =
        format!("version: 1\njobs:\n  - name: boxed\n    image: {}\n    steps:\n      - echo in a box\n", base_image());
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf.as_str())]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    let _host = server.agent(&unique("host"), &[]).unwrap();
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await;
    let run = run.unwrap().run_id;
    let why = waits_saying(&c, &run, "boxed", "container executor").await;
    assert!(why.contains("runs a container executor (the job has `image:`)"), "{why}");
    still_unclaimed(&c, &run, "boxed").await;
    let name = unique("boxer");
    let flags = container_flags("os=linux");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _box = server.agent(&name, &flags).unwrap();
    let r = wait_run(&c, &run, 120).await;
    assert_eq!((r.status.as_str(), runner(&r, "boxed")), ("success", name), "{r:#?}");
}

/// Secrets (`deploy`) and an identity token (`oidc`) of a trusted run:
/// an agent of pool `forks` gets neither (before: the job failed there, and
/// the identity token was handed out); the jobs wait, saying why, and run
/// on an agent of the repository's secret pools (`default`) with them.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_wait_for_an_agent_of_the_secret_pools() {
    let server = server();
    let wf = "version: 1\njobs:\n  - name: deploy\n    secrets: [CLOUD_KEY]\n    needs: []\n    steps:\n      \
              - printf %s \"${CLOUD_KEY:-none}\" | rev > key.txt\n    artifacts:\n      publish:\n        \
              - {name: key, path: key.txt}\n  - name: oidc\n    needs: []\n    id-token: {audience: sts.example.com}\n    \
              steps:\n      - printf %s \"${KILN_ID_TOKEN:-none}\" | rev > token.txt\n    artifacts:\n      publish:\n        \
              - {name: token, path: token.txt}\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    c.put_secret("app", "CLOUD_KEY", "ck-5150").await.unwrap();
    // A forks-pool agent that takes untrusted work: the container executor
    // when podman is here, else the unsafe host opt-in is not needed (the
    // runs are trusted): a host agent of pool `forks`.
    let forks = unique("forks-box");
    let flags = if containers_available() { container_flags("os=linux") } else { vec![] };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let forks_agent = server.pool_agent("forks", &forks, &flags).unwrap();
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await;
    let run = run.unwrap().run_id;
    for job in ["deploy", "oidc"] {
        let why = waits_saying(&c, &run, job, "hands secrets and identity tokens to (default)").await;
        assert!(why.contains(&format!("{forks} (pool forks,")), "{why}");
    }
    still_unclaimed(&c, &run, "oidc").await;
    still_unclaimed(&c, &run, "deploy").await;
    let audit = c.audit(None, 100).await.unwrap();
    assert!(audit.iter().all(|e| e.action != "id-token.issue" && e.action != "secret.read"), "{audit:#?}");

    let trusted = unique("trusted-host");
    let _host = server.agent(&trusted, &[]).unwrap();
    let r = wait_run(&c, &run, 120).await;
    assert_eq!(r.status, "success", "{r:#?}\n{}", forks_agent.log());
    assert_eq!((runner(&r, "deploy"), runner(&r, "oidc")), (trusted.clone(), trusted));
    let get = |name: &'static str, job: &'static str| {
        let c = c.clone();
        let run = run.clone();
        async move {
            let d = c.artifact(&run, job, name).await.unwrap();
            // Reversed back: an artifact holding a secret is refused.
            let text = c.download(&d.url).await.unwrap().text().await.unwrap();
            text.trim_end().chars().rev().collect::<String>()
        }
    };
    assert_eq!(get("key", "deploy").await, "ck-5150");
    let token = get("token", "oidc").await;
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
}
