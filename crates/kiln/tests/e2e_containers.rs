//! Execution images end to end (spec 000 §5, §11): real `kiln server` and
//! `kiln agent --executor container` processes, Podman's Docker API, the
//! loopback registry of `scripts/container-env`, real git.
//!
//! Without an engine these tests skip with a message, unless
//! `KILN_REQUIRE_CONTAINERS=1` (set by `scripts/test`): then they fail.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnAgent, KilnServer, TestRepo, until, wait_for, wait_run};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn engine_url() -> String {
    std::env::var("KILN_ENGINE").unwrap_or_else(|_| "unix:///run/podman/podman.sock".into())
}

fn registry() -> String {
    std::env::var("KILN_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into())
}

/// True when the engine and the registry answer; otherwise skip (or fail
/// under KILN_REQUIRE_CONTAINERS=1).
fn containers_available() -> bool {
    let sock = engine_url().trim_start_matches("unix://").to_string();
    let engine = Command::new("curl")
        .args(["-fsS", "--max-time", "3", "--unix-socket", &sock, "http://d/_ping"])
        .output()
        .is_ok_and(|o| o.status.success());
    let reg = Command::new("curl")
        .args(["-fsS", "--max-time", "3", &format!("http://{}/v2/", registry())])
        .output()
        .is_ok_and(|o| o.status.success());
    if engine && reg {
        return true;
    }
    let what = format!("engine at {} answers: {engine}, registry {} answers: {reg}", engine_url(), registry());
    if std::env::var("KILN_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_CONTAINERS=1 but containers are not available ({what}); run scripts/container-env");
    }
    eprintln!("SKIPPED: containers are not available ({what}); run scripts/container-env");
    false
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman").args(args).output().expect("podman");
    assert!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Copy the test image `from` (e.g. `kiln-test/base`) to a tag of its own,
/// `kiln-test/<name>:latest`, so tests may re-tag without disturbing others.
fn push_as(from: &str, name: &str) {
    let reg = registry();
    podman(&["pull", "-q", "--tls-verify=false", &format!("{reg}/{from}:latest")]);
    podman(&[
        "push",
        "-q",
        "--tls-verify=false",
        &format!("{reg}/{from}:latest"),
        &format!("docker://{reg}/{name}:latest"),
    ]);
}

/// The registry's current digest of `name:latest`.
fn registry_digest(name: &str) -> String {
    registry_digest_of(name, "latest")
}

/// Containers of a job (any state).
fn containers_of_job(job: &str) -> Vec<String> {
    let out = podman(&["ps", "-a", "-q", "--filter", &format!("label=kiln.job={job}")]);
    out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

fn server() -> KilnServer {
    KilnServer::start(BIN.as_ref(), &["--insecure-registry", &registry(), "--retry-base", "100ms"]).unwrap()
}

/// Agent names are unique per test process (containers are labelled, and
/// reaped, by agent name).
fn agent_name(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn container_agent(s: &KilnServer, name: &str, extra: &[&str]) -> KilnAgent {
    let engine = engine_url();
    let mut args = vec!["--executor", "container", "--engine", engine.as_str()];
    args.extend_from_slice(extra);
    s.agent(&agent_name(name), &args).unwrap()
}

/// Removes whatever containers the named agents left (their processes are
/// SIGKILLed when a test ends, possibly before a background removal ran).
struct ReapOnDrop(&'static [&'static str]);

impl Drop for ReapOnDrop {
    fn drop(&mut self) {
        for name in self.0 {
            let label = format!("label=kiln.agent={}", agent_name(name));
            let Ok(out) = Command::new("podman").args(["ps", "-a", "-q", "--filter", &label]).output() else {
                continue;
            };
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("podman").args(["rm", "-f", "-t", "0", id]).output();
            }
        }
    }
}

fn logs(s: &KilnServer, run: &str, job: &str) -> String {
    let out = s.cli().args(["logs", run, job]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Two jobs in two images (B has a tool A lacks) connected by an artifact;
/// each job's digest is the registry's at acceptance; moving tag A after
/// acceptance changes neither the job's retry attempt nor a retried run.
#[tokio::test(flavor = "multi_thread")]
async fn two_images_pinned_at_acceptance_survive_a_retag() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-images"]);
    let (a, b) = (format!("kiln-test/{}", unique("e2e-jdk17")), format!("kiln-test/{}", unique("e2e-jdk21")));
    push_as("kiln-test/base", &a);
    push_as("kiln-test/tool", &b);
    let (digest_a, digest_b) = (registry_digest(&a), registry_digest(&b));
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: compile
    image: {{ref: "{reg}/{a}:latest"}}
    retry: 1
    steps:
      - if command -v kiln-tool; then echo "image A must not have kiln-tool"; exit 9; fi
      - mkdir -p target && echo "app built by epoch $KILN_EPOCH" > target/app.jar
      - if [ "$KILN_EPOCH" = 1 ]; then sleep 4; exit 1; fi
    artifacts:
      publish:
        - name: app
          path: target/app.jar
  - name: integration-test
    image: "{reg}/{b}:latest"
    artifacts:
      restore:
        - from_job: compile
          name: app
          path: inputs/app.jar
    steps:
      - cat inputs/app.jar
      - kiln-tool inputs/app.jar
"#
    );
    let s = server();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    s.add_repo("images", &repo);
    let _agent = container_agent(&s, "ctr-images", &[]);
    let c = Client::new(&s.url, &s.token);
    let run =
        c.submit_run("images", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = c.get_run(&run.run_id).await.unwrap();
    assert_eq!(r.jobs[0].image_digest.as_deref(), Some(digest_a.as_str()), "pinned at acceptance");
    assert_eq!(r.jobs[1].image_digest.as_deref(), Some(digest_b.as_str()));

    // While epoch 1 of compile runs, tag A moves to image B (which has the tool).
    until(&c, &run.run_id, 120, "compile epoch 1 running", |r| r.jobs[0].current_epoch == 1).await;
    push_as("kiln-test/tool", &a);
    assert_ne!(registry_digest(&a), digest_a, "the tag moved");

    let done = wait_run(&c, &run.run_id, 180).await;
    assert_eq!(
        done.status,
        "success",
        "{done:#?}\ncompile:\n{}\nagent:\n{}",
        logs(&s, &run.run_id, "compile"),
        _agent.log()
    );
    assert_eq!(done.jobs[0].attempts.len(), 2, "compile failed once and was retried");
    assert_eq!(done.jobs[0].image_digest.as_deref(), Some(digest_a.as_str()));
    let it = logs(&s, &run.run_id, "integration-test");
    assert!(it.contains("app built by epoch 2"), "{it}");
    assert!(it.contains("kiln-tool: "), "{it}");

    // A retried run keeps the pinned digests: compile still lacks kiln-tool.
    let retry = c.retry_run(&run.run_id).await.unwrap();
    let r2 = c.get_run(&retry.run_id).await.unwrap();
    assert_eq!(r2.jobs[0].image_digest.as_deref(), Some(digest_a.as_str()));
    let done2 = wait_run(&c, &retry.run_id, 180).await;
    assert_eq!(done2.status, "success", "{done2:#?}\n{}", logs(&s, &retry.run_id, "compile"));

    // A new run resolves the moved tag; an unknown tag is refused with 422 and nothing stored.
    let run3 =
        c.submit_run("images", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r3 = c.get_run(&run3.run_id).await.unwrap();
    assert_eq!(r3.jobs[0].image_digest.as_deref(), Some(registry_digest(&a).as_str()));
    c.cancel_run(&run3.run_id).await.unwrap();
    let before = c.list_runs("images", None, None).await.unwrap().runs.len();
    repo.commit(
        &[(".kiln/pipeline.yaml", &wf.replace(&format!("{a}:latest"), "kiln-test/no-such-image:latest"))],
        "bad image",
    )
    .unwrap();
    let err =
        c.submit_run("images", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
    assert!(err.to_string().contains("no-such-image"), "{err}");
    assert_eq!(c.list_runs("images", None, None).await.unwrap().runs.len(), before, "nothing stored");
}

/// A job cannot see the host filesystem outside its workspace, the engine
/// socket, or the agent's token.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_cannot_see_the_host_the_engine_or_the_agent_token() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-isolation"]);
    let s = server();
    let agent = container_agent(&s, "ctr-isolation", &[]);
    let token_file = s.data_dir().join("agent.token");
    let work = agent.work_dir();
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: probe
    image: {reg}/kiln-test/base:latest
    steps:
      - test ! -e "{token}" && echo "no agent.token"
      - test ! -e "{work}" && echo "no agent work dir"
      - test ! -e /run/podman/podman.sock && test ! -e /var/run/docker.sock && echo "no engine socket"
      - if env | grep -q "{agent_token}"; then echo "token leaked"; exit 1; fi; echo "no token in env"
      - if grep -rqs "{agent_token}" /proc/1/environ /etc /root /tmp; then exit 1; fi; echo "no token in files"
      - test "$PWD" = /workspace && test -f .kiln/pipeline.yaml && echo "checkout at /workspace"
      - mount | grep -v -E ' / | /proc| /sys| /dev| /run| /etc/(hosts|hostname|resolv.conf)|/workspace| /kiln/outputs ' | grep -v -E 'cgroup|mqueue|shm|devpts|tmpfs' || echo "no other host mounts"
      - test "$(ls -A /kiln/outputs)" = output && test "$KILN_OUTPUT" = /kiln/outputs/output && echo "only the attempt's output file"
"#,
        token = token_file.display(),
        work = work.display(),
        agent_token = s.agent_token,
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    s.add_repo("iso", &repo);
    let c = Client::new(&s.url, &s.token);
    let run = c.submit_run("iso", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    let log = logs(&s, &run.run_id, "probe");
    assert_eq!(done.status, "success", "{log}\nagent:\n{}", agent.log());
    for expected in [
        "no agent.token",
        "no agent work dir",
        "no engine socket",
        "no token in env",
        "no token in files",
        "checkout at /workspace",
        "no other host mounts",
        "only the attempt's output file",
    ] {
        assert!(log.contains(expected), "missing `{expected}` in:\n{log}");
    }
}

/// A Dockerfile job builds its image from the pinned checkout, commits the
/// digest, and runs its steps in it; a broken Dockerfile fails the job with
/// the build log visible and skips its successor.
#[tokio::test(flavor = "multi_thread")]
async fn dockerfile_jobs_build_then_run_and_broken_builds_fail_visibly() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-build"]);
    let reg = registry();
    let repo = TestRepo::new(&[
        ("ci/image/greeting.txt", "hello from the built image\n"),
        ("ci/image/Dockerfile", &format!("FROM {reg}/kiln-test/base:latest\nCOPY greeting.txt /etc/greeting\nRUN echo build-step-ran\n")),
        ("ci/broken/Dockerfile", &format!("FROM {reg}/kiln-test/base:latest\nRUN echo about-to-fail && exit 7\n")),
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: custom\n    image: {dockerfile: ci/image/Dockerfile, context: ci/image}\n    retry: 1\n    steps:\n      - cat /etc/greeting\n      - test \"$KILN_EPOCH\" != 1\n",
        ),
        (
            ".kiln/broken.yaml",
            "version: 1\njobs:\n  - name: custom\n    image: {dockerfile: ci/broken/Dockerfile, context: ci/broken}\n    steps:\n      - echo never\n  - name: after\n    image: {dockerfile: ci/image/Dockerfile, context: ci/image}\n    steps:\n      - echo never either\n",
        ),
    ])
    .unwrap();
    let s = server();
    s.add_repo("build", &repo);
    let agent = container_agent(&s, "ctr-build", &[]);
    let c = Client::new(&s.url, &s.token);

    let run =
        c.submit_run("build", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    assert_eq!(c.get_run(&run.run_id).await.unwrap().jobs[0].image_digest, None, "built, not resolved");
    let done = wait_run(&c, &run.run_id, 180).await;
    let log = logs(&s, &run.run_id, "custom");
    assert_eq!(done.status, "success", "{log}\nagent:\n{}", agent.log());
    assert!(log.contains("build-step-ran"), "build output streamed:\n{log}");
    assert!(log.contains("hello from the built image"), "{log}");
    assert_eq!(done.jobs[0].attempts.len(), 2, "epoch 1 failed on purpose");
    assert_eq!(log.matches("▶ building image").count(), 1, "built once, reused by the retry:\n{log}");
    assert!(log.contains("using the image an earlier attempt built"), "{log}");
    let digest = done.jobs[0].image_digest.clone().expect("built digest committed");
    assert!(digest.starts_with("sha256:"), "{digest}");
    let id = podman(&["image", "inspect", "--format", "{{.Id}}", &digest]);
    assert_eq!(format!("sha256:{id}"), digest, "the committed digest is the built image");

    let body =
        SubmitRun { commit_sha: "main".into(), workflow_path: Some(".kiln/broken.yaml".into()), ..Default::default() };
    let run = c.submit_run("build", &body, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 180).await;
    assert_eq!(done.status, "failed");
    assert_eq!(done.jobs[0].status, "failed");
    assert_eq!(done.jobs[0].attempts.len(), 1, "a build failure is the job's, not retried as infrastructure");
    assert_eq!(done.jobs[1].status, "skipped", "never unblocks successors");
    let log = logs(&s, &run.run_id, "custom");
    assert!(log.contains("about-to-fail"), "{log}");
    assert!(log.contains("image build failed"), "{log}");
    assert!(!log.contains("never"), "{log}");
}

/// Issue 40, item 7: with `--build-registry`, the agent that builds a
/// Dockerfile job's image pushes it and commits its manifest digest; the
/// job's replacement on a second agent, whose engine no longer holds the
/// image, pulls exactly those bytes from the registry.
#[tokio::test(flavor = "multi_thread")]
async fn a_built_image_is_pulled_from_the_build_registry_by_a_retry_on_another_agent() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-push-a", "ctr-push-b"]);
    let reg = registry();
    let dir = unique("builds");
    let repo = TestRepo::new(&[
        ("ci/image/greeting.txt", "hello from the pushed image\n"),
        ("ci/image/Dockerfile", &format!("FROM {reg}/kiln-test/base:latest\nCOPY greeting.txt /etc/greeting\n")),
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: custom\n    image: {dockerfile: ci/image/Dockerfile, context: ci/image}\n    steps:\n      - 'if [ \"$KILN_EPOCH\" = 1 ]; then echo waiting; sleep 600; fi'\n      - cat /etc/greeting\n",
        ),
    ])
    .unwrap();
    let build_registry = format!("{reg}/{dir}");
    let s = KilnServer::start(
        BIN.as_ref(),
        &["--insecure-registry", &reg, "--retry-base", "100ms", "--build-registry", &build_registry],
    )
    .unwrap();
    s.add_repo("push", &repo);
    let c = Client::new(&s.url, &s.token);
    let a = container_agent(&s, "ctr-push-a", &[]);
    let run = c.submit_run("push", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let waiting =
        wait_for(Duration::from_secs(180), || logs(&s, &run.run_id, "custom").contains("waiting").then_some(()));
    assert!(waiting.is_some(), "{}\nagent:\n{}", logs(&s, &run.run_id, "custom"), a.log());
    let r = c.get_run(&run.run_id).await.unwrap();
    let job = r.jobs[0].id.to_ascii_lowercase();
    let digest = r.jobs[0].image_digest.clone().expect("the pushed digest is committed");
    let repository = format!("{build_registry}/{job}");
    assert_eq!(registry_digest_of(&format!("{dir}/{job}"), "epoch-1"), digest, "the registry holds what was committed");

    // Agent A is lost; the engine forgets the image (as another machine's would).
    a.signal("KILL");
    drop(a);
    let id = podman(&["image", "inspect", "--format", "{{.Id}}", &format!("{repository}@{digest}")]);
    podman(&["rmi", "-f", &id]);
    let b = container_agent(&s, "ctr-push-b", &[]);
    let done = wait_run(&c, &run.run_id, 180).await;
    let log = logs(&s, &run.run_id, "custom");
    assert_eq!(done.status, "success", "{log}\nagent b:\n{}", b.log());
    assert_eq!(done.jobs[0].current_epoch, 2, "{done:#?}");
    assert!(log.contains(&format!("pulling {repository}@{digest}")), "epoch 2 pulled the pushed image:\n{log}");
    assert!(log.contains("hello from the pushed image"), "{log}");
    assert_eq!(log.matches("▶ building image").count(), 1, "built once:\n{log}");
}

/// Issue 40, item 7, without a build registry: the image stays in the
/// engine of the agent that built it, so the job's next attempt goes only
/// to that agent. It is lost mid-job; another agent is idle, but the job
/// waits for the builder, saying so, and runs there once it is back.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_build_registry_a_retry_waits_for_the_agent_holding_the_image() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-pin-a", "ctr-pin-b"]);
    let reg = registry();
    let repo = TestRepo::new(&[
        ("ci/image/greeting.txt", "hello from the local image\n"),
        ("ci/image/Dockerfile", &format!("FROM {reg}/kiln-test/base:latest\nCOPY greeting.txt /etc/greeting\n")),
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: custom\n    image: {dockerfile: ci/image/Dockerfile, context: ci/image}\n    steps:\n      - 'if [ \"$KILN_EPOCH\" = 1 ]; then echo waiting; sleep 600; fi'\n      - cat /etc/greeting\n",
        ),
    ])
    .unwrap();
    let s = server();
    s.add_repo("pin", &repo);
    let c = Client::new(&s.url, &s.token);
    let a = container_agent(&s, "ctr-pin-a", &[]);
    let run = c.submit_run("pin", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let waiting =
        wait_for(Duration::from_secs(180), || logs(&s, &run.run_id, "custom").contains("waiting").then_some(()));
    assert!(waiting.is_some(), "{}\nagent:\n{}", logs(&s, &run.run_id, "custom"), a.log());
    let b = container_agent(&s, "ctr-pin-b", &[]);
    a.signal("KILL");
    drop(a);
    // The idle agent b does not take the retry; the job says what it waits for.
    let a_name = agent_name("ctr-pin-a");
    let mut why = String::new();
    for _ in 0..300 {
        let r = c.get_run(&run.run_id).await.unwrap();
        why = r.jobs[0].message.clone().unwrap_or_default();
        if why.contains("whose engine alone holds the image") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(why.contains(&format!("is {a_name}, whose engine alone holds the image")), "{why}\n{}", b.log());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.get_run(&run.run_id).await.unwrap().jobs[0].attempts.len(), 1, "b never claimed it");

    // a starts again on its machine (its engine still holds the image).
    let a = container_agent(&s, "ctr-pin-a", &[]);
    let done = wait_run(&c, &run.run_id, 180).await;
    let log = logs(&s, &run.run_id, "custom");
    assert_eq!(done.status, "success", "{log}\na:\n{}\nb:\n{}", a.log(), b.log());
    let second = &done.jobs[0].attempts[1];
    assert_eq!((second.epoch, second.runner.as_str()), (2, a_name.as_str()), "the retry ran where the image is");
    assert!(log.contains("hello from the local image"), "{log}");
}

/// The registry's digest of `name:tag`.
fn registry_digest_of(name: &str, tag: &str) -> String {
    let out = Command::new("curl")
        .args(["-fsSI", "-H"])
        .arg("Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
        .arg(format!("http://{}/v2/{name}/manifests/{tag}", registry()))
        .output()
        .expect("curl");
    assert!(out.status.success(), "no manifest for {name}:{tag}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("docker-content-digest:").map(|d| d.trim().to_string()))
        .expect("Docker-Content-Digest header")
}

/// Spec 004's operation timeout for an image build: a Dockerfile that
/// builds longer than the agent's `--build-timeout` fails the job as
/// `timeout` (exit 124, not retried by default), naming the flag; no step
/// runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_build_longer_than_the_build_timeout_fails_as_timeout() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-build-slow"]);
    let reg = registry();
    let repo = TestRepo::new(&[
        ("ci/slow/Dockerfile", &format!("FROM {reg}/kiln-test/base:latest\nRUN echo building-slowly && sleep 20\n")),
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: slow\n    image: {dockerfile: ci/slow/Dockerfile, context: ci/slow}\n    steps:\n      - echo must-not-run\n",
        ),
    ])
    .unwrap();
    let s = server();
    s.add_repo("slowbuild", &repo);
    let _agent = container_agent(&s, "ctr-build-slow", &["--build-timeout", "2s"]);
    let c = Client::new(&s.url, &s.token);
    let run =
        c.submit_run("slowbuild", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    let log = logs(&s, &run.run_id, "slow");
    assert_eq!(done.status, "failed", "{log}");
    let job = &done.jobs[0];
    assert_eq!(job.attempts.len(), 1, "a timeout is not retried by default: {:?}", job.attempts);
    let a = &job.attempts[0];
    assert_eq!(a.failure_class.as_deref(), Some("timeout"), "{a:?}");
    assert_eq!(a.exit_code, Some(124), "{a:?}");
    let message = a.message.clone().unwrap_or_default();
    assert!(message.contains("the image build took longer than 2s (kiln agent --build-timeout)"), "{message}");
    assert!(log.contains("building-slowly") && log.contains("--build-timeout"), "{log}");
    assert!(!log.contains("must-not-run"), "{log}");
    assert_eq!(job.image_digest, None, "nothing was committed");
}

/// A registry front for the pull-timeout test: plain HTTP is passed
/// through to the test registry (the server, with `--insecure-registry`,
/// resolves digests through it), while a TLS handshake — the engine's pull,
/// this address not being marked insecure for it — is held open unanswered.
struct StallingRegistry {
    child: std::process::Child,
    addr: String,
}

impl Drop for StallingRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stalling_registry() -> StallingRegistry {
    use std::io::{BufRead, BufReader};
    let (host, port) = registry().rsplit_once(':').map(|(h, p)| (h.to_string(), p.to_string())).unwrap();
    let script = format!(
        r#"
import socket, threading, time
up = ("{host}", {port})
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
def serve(c):
    first = c.recv(1, socket.MSG_PEEK)
    if first == b"\x16":
        time.sleep(3600)
        return
    u = socket.create_connection(up)
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    pipe(c, u)
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(64)
print(l.getsockname()[1], flush=True)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#
    );
    let mut child =
        Command::new("python3").arg("-c").arg(script).stdout(std::process::Stdio::piped()).spawn().expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    StallingRegistry { child, addr: format!("127.0.0.1:{}", line.trim()) }
}

/// Spec 004's operation timeout for an image pull: the engine's pull of
/// the job's pinned image never gets an answer; past the agent's
/// `--pull-timeout` the attempt fails as `timeout` (exit 124) naming the
/// flag, and no step runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_longer_than_the_pull_timeout_fails_as_timeout() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-pull-slow"]);
    let reg = registry();
    // An image the engine does not hold, so that it must be pulled.
    let name = unique("kiln-test/stall").to_ascii_lowercase();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("unique"), &name).unwrap();
    std::fs::write(dir.path().join("Dockerfile"), format!("FROM {reg}/kiln-test/base:latest\nCOPY unique /unique\n"))
        .unwrap();
    let tag = format!("{reg}/{name}:latest");
    podman(&["build", "-q", "--tls-verify=false", "-t", &tag, &dir.path().display().to_string()]);
    podman(&["push", "-q", "--tls-verify=false", &tag]);
    podman(&["rmi", &tag]);
    let front = stalling_registry();
    let wf = format!(
        "version: 1\njobs:\n  - name: pull\n    image: {}/{name}:latest\n    steps:\n      - echo must-not-run\n",
        front.addr
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = KilnServer::start(BIN.as_ref(), &["--insecure-registry", &front.addr, "--retry-base", "100ms"]).unwrap();
    s.add_repo("slowpull", &repo);
    let _agent = container_agent(&s, "ctr-pull-slow", &["--pull-timeout", "2s"]);
    let c = Client::new(&s.url, &s.token);
    let run =
        c.submit_run("slowpull", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    let log = logs(&s, &run.run_id, "pull");
    assert_eq!(done.status, "failed", "{log}");
    let job = &done.jobs[0];
    assert!(job.image_digest.as_deref().is_some_and(|d| d.starts_with("sha256:")), "resolved through the front");
    assert_eq!(job.attempts.len(), 1, "a timeout is not retried by default: {:?}", job.attempts);
    let a = &job.attempts[0];
    assert_eq!(a.failure_class.as_deref(), Some("timeout"), "{a:?}\n{log}");
    assert_eq!(a.exit_code, Some(124), "{a:?}");
    let message = a.message.clone().unwrap_or_default();
    assert!(message.contains("pulling the job's image took longer than 2s (kiln agent --pull-timeout)"), "{message}");
    assert!(!log.contains("must-not-run"), "{log}");
}

/// Cancelling kills the job's container within the grace period, as does
/// fencing (an agent paused past its lease); SIGKILL the agent and start it
/// again: the orphaned container is removed.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_fencing_and_agent_restart_remove_containers() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-kill", "ctr-fence", "ctr-crash"]);
    let reg = registry();
    let wf = format!(
        "version: 1\njobs:\n  - name: stubborn\n    image: {reg}/kiln-test/base:latest\n    steps:\n      - trap '' TERM; echo started; while :; do sleep 1; done\n"
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = KilnServer::start(
        BIN.as_ref(),
        &["--insecure-registry", &reg, "--lease-ttl", "3s", "--loss-grace", "30s", "--retry-base", "100ms"],
    )
    .unwrap();
    s.add_repo("kill", &repo);
    let c = Client::new(&s.url, &s.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let grace = Duration::from_secs(2);

    // Cancel: SIGTERM is ignored, SIGKILL follows after the grace.
    let agent = container_agent(&s, "ctr-kill", &["--kill-grace", "2s"]);
    let run = c.submit_run("kill", &body, None).await.unwrap();
    let r = until(&c, &run.run_id, 120, "job running", |r| r.jobs[0].status == "running").await;
    let job = r.jobs[0].id.clone();
    assert!(wait_for(Duration::from_secs(60), || (!containers_of_job(&job).is_empty()).then_some(())).is_some());
    wait_for(Duration::from_secs(60), || logs(&s, &run.run_id, "stubborn").contains("started").then_some(()));
    let t = Instant::now();
    c.cancel_run(&run.run_id).await.unwrap();
    let gone = wait_for(Duration::from_secs(30), || containers_of_job(&job).is_empty().then_some(()));
    let took = t.elapsed();
    assert!(gone.is_some(), "container of a cancelled job still there\n{}", agent.log());
    assert!(took < grace + Duration::from_secs(3), "cancel removed the container in {took:?}");
    assert_eq!(wait_run(&c, &run.run_id, 30).await.status, "cancelled");
    drop(agent);

    // Fencing: the agent is paused past its lease; once it runs again it
    // learns it was fenced and kills its container.
    let agent = container_agent(&s, "ctr-fence", &["--kill-grace", "2s"]);
    let run = c.submit_run("kill", &body, None).await.unwrap();
    let r = until(&c, &run.run_id, 120, "job running", |r| r.jobs[0].status == "running").await;
    let job = r.jobs[0].id.clone();
    assert!(wait_for(Duration::from_secs(60), || (!containers_of_job(&job).is_empty()).then_some(())).is_some());
    agent.signal("STOP");
    until(&c, &run.run_id, 30, "epoch 1 fenced", |r| r.jobs[0].attempts.first().is_some_and(|a| a.outcome == "lost"))
        .await;
    c.cancel_run(&run.run_id).await.unwrap(); // no replacement attempt
    assert_eq!(containers_of_job(&job).len(), 1, "the paused agent's container still runs");
    let t = Instant::now();
    agent.signal("CONT");
    let gone = wait_for(Duration::from_secs(30), || containers_of_job(&job).is_empty().then_some(()));
    let took = t.elapsed();
    assert!(gone.is_some(), "fenced container still there\n{}", agent.log());
    assert!(took < grace + Duration::from_secs(3), "fencing removed the container in {took:?}");
    drop(agent);

    // SIGKILL the agent: its container is orphaned; the restarted agent reaps it.
    let agent = container_agent(&s, "ctr-crash", &[]);
    let run = c.submit_run("kill", &body, None).await.unwrap();
    let r = until(&c, &run.run_id, 120, "job running", |r| r.jobs[0].status == "running").await;
    let job = r.jobs[0].id.clone();
    assert!(wait_for(Duration::from_secs(60), || (!containers_of_job(&job).is_empty()).then_some(())).is_some());
    agent.signal("KILL");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(containers_of_job(&job).len(), 1, "orphaned by the SIGKILL");
    c.cancel_run(&run.run_id).await.unwrap();
    let restarted = container_agent(&s, "ctr-crash", &[]);
    let gone = wait_for(Duration::from_secs(30), || containers_of_job(&job).is_empty().then_some(()));
    assert!(gone.is_some(), "orphan not reaped\n{}", restarted.log());
    // Said once every container of the agent is removed (the orphaned warm
    // container too), possibly after the job's is gone.
    let said = wait_for(Duration::from_secs(30), || {
        restarted.log().contains("removed containers left by a previous agent process").then_some(())
    });
    assert!(said.is_some(), "{}", restarted.log());
}

/// Caches in container jobs: a workspace-relative path and an absolute one
/// (mounted into the container) are saved by a cold run and restored by the
/// next; moving the image's tag to other bytes changes the digest pinned at
/// acceptance, hence the key: a miss, and a cold build.
#[tokio::test(flavor = "multi_thread")]
async fn container_jobs_cache_relative_and_absolute_paths_keyed_by_image_digest() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-cache"]);
    let name = format!("kiln-test/{}", unique("e2e-cache"));
    push_as("kiln-test/base", &name);
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: build
    image: "{reg}/{name}:latest"
    cache: {{kind: dependencies, version: "1", paths: [/cache/deps, target]}}
    steps:
      - |
        for d in /cache/deps target; do
          if [ -f "$d/built" ]; then echo "restored $d: $(cat "$d/built")"; else mkdir -p "$d" && echo "$KILN_RUN_ID" > "$d/built" && echo "cold $d"; fi
        done
"#
    );
    let s = server();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    s.add_repo("ccache", &repo);
    let agent = container_agent(&s, "ctr-cache", &[]);
    let c = Client::new(&s.url, &s.token);
    let go = || async {
        let r =
            c.submit_run("ccache", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let done = wait_run(&c, &r.run_id, 180).await;
        let log = logs(&s, &r.run_id, "build");
        assert_eq!(done.status, "success", "{log}\n{}", agent.log());
        let cache = done.jobs[0].cache.clone().expect("cache reported");
        (done, log, cache)
    };
    let (r1, log1, c1) = go().await;
    assert!(log1.contains("cold /cache/deps") && log1.contains("cold target"), "{log1}");
    assert_eq!((c1.result.as_str(), c1.saved.as_deref()), ("miss", Some("saved")), "{c1:?}");
    let (_, log2, c2) = go().await;
    assert!(log2.contains(&format!("restored /cache/deps: {}", r1.id)), "{log2}");
    assert!(log2.contains(&format!("restored target: {}", r1.id)), "{log2}");
    assert_eq!((c2.result.as_str(), c2.key.as_str()), ("hit", c1.key.as_str()), "{c2:?}");

    // The tag moves to other bytes: another digest, another key.
    let before = registry_digest(&name);
    push_as("kiln-test/tool", &name);
    assert_ne!(registry_digest(&name), before);
    let (r3, log3, c3) = go().await;
    assert_ne!(r3.jobs[0].image_digest.as_deref(), Some(before.as_str()));
    assert!(log3.contains("cold /cache/deps") && log3.contains("cold target"), "{log3}");
    assert_eq!(c3.result, "miss", "{c3:?}");
    assert_ne!(c3.key, c1.key, "the image digest is part of the key");
}

/// The bytes of one log stream of a job (every attempt, in order), as the
/// server's SSE feed has them now.
async fn stream_of(c: &Client, job: &str, stream: &str) -> String {
    use base64::Engine;
    use futures::StreamExt;
    let b64 = base64::engine::general_purpose::STANDARD;
    let events = c.log_events_with(job, None, false).await.unwrap();
    tokio::pin!(events);
    let mut out = Vec::new();
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(Duration::from_secs(30), events.next()).await {
        match ev.event.as_str() {
            kiln_api::logs::event::CHUNK => {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data).unwrap();
                if le.stream == stream {
                    out.extend(b64.decode(le.data.as_bytes()).unwrap());
                }
            }
            kiln_api::logs::event::END => break,
            _ => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn networks_named(name: &str) -> usize {
    podman(&["network", "ls", "-q", "--filter", &format!("name=^{name}$")]).lines().filter(|l| !l.is_empty()).count()
}

/// `services:` (issue 16): a container job reaches its service by name on
/// a network of the attempt's own once the service's health check passed,
/// the service's output is the job log's `services` stream, and everything
/// is removed afterwards; a host job gets the service's loopback port; a
/// service that never gets healthy fails the job as infrastructure with its
/// log attached.
#[tokio::test(flavor = "multi_thread")]
async fn services_start_healthy_answer_by_name_and_are_removed() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["svc-ctr", "svc-host"]);
    let reg = registry();
    let serve = r#"[sh, -c, "echo service-starting; mkdir -p /srv && echo \"$GREETING\" > /srv/index.html && exec httpd -f -p 8080 -h /srv"]"#;
    let wf = format!(
        r#"version: 1
jobs:
  - name: in-container
    needs: []
    image: {reg}/kiln-test/base:latest
    runs-on: {{kind: container}}
    services:
      web:
        image: {reg}/kiln-test/base:latest
        env: {{GREETING: hello-from-service}}
        command: {serve}
        ports: [8080]
        health: {{cmd: "wget -qO- http://127.0.0.1:8080/index.html", interval: 200ms, retries: 50}}
    steps:
      - echo "got $(wget -qO- http://web:8080/index.html)"
  - name: on-host
    needs: []
    runs-on: {{kind: host}}
    services:
      web:
        image: {reg}/kiln-test/base:latest
        env: {{GREETING: hello-host}}
        command: {serve}
        ports: [8080]
        health: {{cmd: "wget -qO- http://127.0.0.1:8080/index.html", interval: 200ms, retries: 50}}
    steps:
      - echo "host got $(curl -fsS http://127.0.0.1:$KILN_SERVICE_WEB_PORT/index.html)"
"#
    );
    let broken = format!(
        r#"version: 1
jobs:
  - name: never-healthy
    image: {reg}/kiln-test/base:latest
    runs-on: {{kind: container}}
    services:
      bad:
        image: {reg}/kiln-test/base:latest
        command: [sh, -c, "echo broken-service-log; sleep 600"]
        health: {{cmd: "false", interval: 100ms, retries: 3}}
    steps:
      - echo must-not-run
"#
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf), (".kiln/broken.yaml", &broken)]).unwrap();
    let s = server();
    s.add_repo("svc", &repo);
    let _ctr = container_agent(&s, "svc-ctr", &["--labels", "kind=container"]);
    let engine = engine_url();
    let _host = s.agent(&agent_name("svc-host"), &["--labels", "kind=host", "--engine", &engine]).unwrap();
    let c = Client::new(&s.url, &s.token);

    let run = c.submit_run("svc", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 240).await;
    let ctr_log = logs(&s, &run.run_id, "in-container");
    let host_log = logs(&s, &run.run_id, "on-host");
    assert_eq!(done.status, "success", "{ctr_log}\n---\n{host_log}\n{}", s.log());
    assert!(ctr_log.contains("got hello-from-service"), "reached by name: {ctr_log}");
    assert!(ctr_log.contains("[web] service-starting"), "the service's output is in the log: {ctr_log}");
    // … as a stream of its own, apart from the steps' output.
    let ctr_job = &done.jobs.iter().find(|j| j.name == "in-container").unwrap().id;
    let services = stream_of(&c, ctr_job, kiln_api::logs::stream::SERVICES).await;
    assert!(services.contains("[web] service-starting"), "services stream: {services}");
    assert!(!services.contains("got hello-from-service"), "services stream: {services}");
    let stdout = stream_of(&c, ctr_job, kiln_api::logs::stream::STDOUT).await;
    assert!(stdout.contains("got hello-from-service") && !stdout.contains("service-starting"), "stdout: {stdout}");
    assert!(host_log.contains("host got hello-host"), "reached on its loopback port: {host_log}");
    // The service runs the image pinned at acceptance, by digest.
    let digest = registry_digest("kiln-test/base");
    assert!(ctr_log.contains(&format!("kiln-test/base@{digest}")), "{ctr_log}");
    for job in &done.jobs {
        let gone = wait_for(Duration::from_secs(30), || containers_of_job(&job.id).is_empty().then_some(()));
        assert!(gone.is_some(), "service containers of {} removed", job.name);
        let net = format!("kiln-{}-1", job.id);
        assert!(
            wait_for(Duration::from_secs(30), || (networks_named(&net) == 0).then_some(())).is_some(),
            "{net} removed"
        );
    }

    // Never healthy: the job fails as infrastructure, with the service's log.
    let body =
        SubmitRun { commit_sha: "main".into(), workflow_path: Some(".kiln/broken.yaml".into()), ..Default::default() };
    let run = c.submit_run("svc", &body, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 240).await;
    let log = logs(&s, &run.run_id, "never-healthy");
    assert_eq!(done.status, "failed", "{log}");
    let job = &done.jobs[0];
    let message = job.attempts[0].message.clone().unwrap_or_default();
    assert!(message.contains("service `bad` did not become healthy"), "{message}");
    assert!(job.attempts.len() > 1, "an infrastructure failure is retried: {:?}", job.attempts);
    assert!(
        job.attempts.iter().all(|a| a.failure_class.as_deref() == Some("infra")),
        "every attempt fails as `infra`: {:?}",
        job.attempts
    );
    assert!(log.contains("[bad] broken-service-log"), "{log}");
    assert!(!log.contains("must-not-run"), "{log}");
    assert!(wait_for(Duration::from_secs(30), || containers_of_job(&job.id).is_empty().then_some(())).is_some());
}

/// A SIGKILLed agent leaves its job's services behind; the restarted agent
/// removes them (containers and network) by their labels.
#[tokio::test(flavor = "multi_thread")]
async fn services_of_a_killed_agent_are_reaped_when_it_restarts() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["svc-crash"]);
    let reg = registry();
    let wf = format!(
        "version: 1\njobs:\n  - name: long\n    services:\n      idle:\n        image: {reg}/kiln-test/base:latest\n        command: [sleep, \"600\"]\n    steps:\n      - echo running; sleep 600\n"
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = server();
    s.add_repo("svccrash", &repo);
    let engine = engine_url();
    let agent = s.agent(&agent_name("svc-crash"), &["--engine", &engine]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let run =
        c.submit_run("svccrash", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = until(&c, &run.run_id, 120, "job running", |r| r.jobs[0].status == "running").await;
    let job = r.jobs[0].id.clone();
    wait_for(Duration::from_secs(60), || logs(&s, &run.run_id, "long").contains("running").then_some(()))
        .expect("the step runs once its service started");
    assert_eq!(containers_of_job(&job).len(), 1, "the service's container");
    agent.signal("KILL");
    drop(agent);
    c.cancel_run(&run.run_id).await.unwrap();
    assert_eq!(containers_of_job(&job).len(), 1, "orphaned by the SIGKILL");
    let restarted = s.agent(&agent_name("svc-crash"), &["--engine", &engine]).unwrap();
    let gone = wait_for(Duration::from_secs(30), || containers_of_job(&job).is_empty().then_some(()));
    assert!(gone.is_some(), "orphaned service not reaped\n{}", restarted.log());
    let net = format!("kiln-{job}-1");
    assert!(wait_for(Duration::from_secs(30), || (networks_named(&net) == 0).then_some(())).is_some(), "{net} reaped");
}

/// `${{ }}` in a job's `image`, `runs-on` and `timeout` (issue 16): from
/// the run's inputs they are evaluated when the run is accepted (the image
/// pinned like a literal one, a bad value refused with 422 and nothing
/// stored); from `needs.<job>.outputs.*` the image is evaluated at claim
/// and must name a digest, or the job fails saying so without running.
#[tokio::test(flavor = "multi_thread")]
async fn image_runs_on_and_timeout_from_inputs_and_outputs() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-exprs"]);
    let reg = registry();
    let base_digest = registry_digest("kiln-test/base");
    let tool_digest = registry_digest("kiln-test/tool");
    let wf = format!(
        r#"version: 1
on: {{manual: {{}}}}
inputs:
  img: {{type: string, default: "{reg}/kiln-test/base:latest"}}
  os: {{type: string, default: linux}}
  limit: {{type: string, default: 10m}}
jobs:
  - name: pick
    image: "${{{{ inputs.img }}}}"
    runs-on: {{os: "${{{{ inputs.os }}}}"}}
    timeout: ${{{{ inputs.limit }}}}
    outputs: [image, tagged]
    steps:
      - if command -v kiln-tool; then exit 9; fi
      - echo "image={reg}/kiln-test/tool@{tool_digest}" >> "$KILN_OUTPUT"
      - echo "tagged={reg}/kiln-test/tool:latest" >> "$KILN_OUTPUT"
  - name: use
    needs: [pick]
    runs-on: {{os: linux}}
    image: "${{{{ needs.pick.outputs.image }}}}"
    steps:
      - command -v kiln-tool && echo "has the tool"
  - name: unpinned
    needs: [pick]
    runs-on: {{os: linux}}
    image: "${{{{ needs.pick.outputs.tagged }}}}"
    steps:
      - echo "must not run"
"#
    );
    let s = server();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    s.add_repo("exprs", &repo);
    let c = Client::new(&s.url, &s.token);
    let submit = |inputs: &[(&str, &str)]| SubmitRun {
        commit_sha: "main".into(),
        inputs: inputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };

    // A value that is no duration (or an empty label) is refused at acceptance.
    for (inputs, want) in [
        (vec![("limit", "soon")], "`timeout` of job `pick` is `soon`"),
        (vec![("os", "")], "label `os` in `runs-on` of job `pick` is empty"),
    ] {
        let err = c.submit_run("exprs", &submit(&inputs), None).await.unwrap_err();
        assert_eq!(err.status(), Some(422), "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }
    assert!(c.list_runs("exprs", None, None).await.unwrap().runs.is_empty(), "nothing stored");

    // `runs-on` from an input: no agent has `os: plan9`, and the job says so.
    let waiting = c.submit_run("exprs", &submit(&[("os", "plan9")]), None).await.unwrap();
    let _agent = container_agent(&s, "ctr-exprs", &["--labels", "os=linux"]);
    let w = until(&c, &waiting.run_id, 30, "the waiting job's message", |r| {
        r.jobs[0].message.as_deref().is_some_and(|m| m.contains("os: plan9"))
    })
    .await;
    assert_eq!(w.jobs[0].status, "ready", "{w:#?}");
    c.cancel_run(&waiting.run_id).await.unwrap();

    let run = c.submit_run("exprs", &submit(&[]), None).await.unwrap();
    let r = c.get_run(&run.run_id).await.unwrap();
    assert_eq!(r.jobs[0].image_digest.as_deref(), Some(base_digest.as_str()), "the input's image pinned at acceptance");
    let done = wait_run(&c, &run.run_id, 180).await;
    assert_eq!(done.status, "failed", "{done:#?}");
    let job = |n: &str| done.jobs.iter().find(|j| j.name == n).unwrap();
    assert_eq!(job("pick").status, "success", "{}", logs(&s, &run.run_id, "pick"));
    assert_eq!(job("use").status, "success", "{}", logs(&s, &run.run_id, "use"));
    assert!(logs(&s, &run.run_id, "use").contains("has the tool"));
    let unpinned = job("unpinned");
    assert_eq!(unpinned.status, "failed");
    let m = unpinned.message.clone().unwrap_or_default();
    assert!(m.contains("does not name an image by digest"), "{m}");
    assert!(!logs(&s, &run.run_id, "unpinned").contains("must not run"));
    assert_eq!(unpinned.attempts.len(), 1, "a refused image is the job's own failure, not retried as infra");
}

/// Spec 004's stage timeout for preparing: a job whose service never gets
/// healthy within the agent's `--prepare-timeout` fails as `timeout` (exit
/// 124, not retried by default), saying which stage and which flag, and its
/// service is removed.
#[tokio::test(flavor = "multi_thread")]
async fn preparing_longer_than_the_prepare_timeout_fails_as_timeout() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["prep-slow"]);
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: slow-start
    services:
      slow:
        image: {reg}/kiln-test/base:latest
        command: [sleep, "600"]
        health: {{cmd: "false", interval: 1s, retries: 1000}}
    steps:
      - echo must-not-run
"#
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = server();
    s.add_repo("prep", &repo);
    let engine = engine_url();
    let _agent = s.agent(&agent_name("prep-slow"), &["--engine", &engine, "--prepare-timeout", "3s"]).unwrap();
    let c = Client::new(&s.url, &s.token);
    let run = c.submit_run("prep", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    let log = logs(&s, &run.run_id, "slow-start");
    assert_eq!(done.status, "failed", "{log}");
    let job = &done.jobs[0];
    assert_eq!(job.attempts.len(), 1, "a timeout is not retried by default: {:?}", job.attempts);
    let a = &job.attempts[0];
    assert_eq!(a.failure_class.as_deref(), Some("timeout"), "{a:?}");
    assert_eq!(a.exit_code, Some(124), "{a:?}");
    let message = a.message.clone().unwrap_or_default();
    assert!(message.contains("preparing the job") && message.contains("took longer than 3s"), "{message}");
    assert!(message.contains("--prepare-timeout"), "{message}");
    assert!(!log.contains("must-not-run"), "{log}");
    assert!(wait_for(Duration::from_secs(30), || containers_of_job(&job.id).is_empty().then_some(())).is_some());
}

/// The 64-hex container id in the agent's log line saying `job` took a
/// warm container.
fn warm_container_of(agent_log: &str, job: &str) -> Option<String> {
    let line = agent_log.lines().find(|l| l.contains("takes a warm container") && l.contains(job))?;
    line.split(|c: char| !c.is_ascii_hexdigit()).find(|w| w.len() == 64).map(str::to_string)
}

/// Warm containers (spec 003's warm pool on one agent): after a job of an
/// image the agent starts the next container of that shape, and the next
/// job takes it without creating one. Each serves one job only and is
/// removed after it: a job finds none of the previous job's files (in the
/// workspace, /tmp or the outputs directory), processes or environment.
#[tokio::test(flavor = "multi_thread")]
async fn warm_containers_serve_one_job_each_and_leak_nothing() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-warm"]);
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: probe
    image: {reg}/kiln-test/base:latest
    outputs: [mark]
    steps:
      - test ! -e leak && test ! -e /tmp/leak && test ! -e /kiln/outputs/leak && echo "no files left"
      - test ! -s "$KILN_OUTPUT" && echo "empty output file"
      - if ps | grep -q "sleep 424[2]"; then echo "process left"; exit 1; fi; echo "no process left"
      - if tr '\0' '\n' < /proc/1/environ | grep -q KILN_; then echo "job env in the container"; exit 1; fi; echo "no job env"
      - echo "$KILN_JOB_ID" > leak; echo x > /tmp/leak; echo x > /kiln/outputs/leak; echo mark=1 >> "$KILN_OUTPUT"
      - sleep 4242 >/dev/null 2>&1 &
"#
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let s = server();
    s.add_repo("warm", &repo);
    let agent = container_agent(&s, "ctr-warm", &[]);
    let c = Client::new(&s.url, &s.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let mut used = vec![];
    for i in 0..3 {
        let run = c.submit_run("warm", &body, None).await.unwrap();
        let done = wait_run(&c, &run.run_id, 120).await;
        let log = logs(&s, &run.run_id, "probe");
        assert_eq!(done.status, "success", "run {i}:\n{log}\nagent:\n{}", agent.log());
        for expected in ["no files left", "empty output file", "no process left", "no job env"] {
            assert!(log.contains(expected), "run {i}: missing `{expected}` in:\n{log}");
        }
        let job = &done.jobs[0].id;
        if i == 0 {
            // The first job of the image creates its container (with the job's labels).
            assert!(!log.contains("using a warm container"), "{log}");
            continue;
        }
        // Later ones take the container started after the previous job.
        assert!(log.contains("using a warm container of"), "run {i}:\n{log}\nagent:\n{}", agent.log());
        let id = wait_for(Duration::from_secs(10), || warm_container_of(&agent.log(), job))
            .unwrap_or_else(|| panic!("no warm container logged for {job}:\n{}", agent.log()));
        assert!(!used.contains(&id), "a warm container served two jobs: {id}");
        // Removed after its job (off the completion's path, but removed).
        let gone = wait_for(Duration::from_secs(30), || {
            podman(&["ps", "-a", "-q", "--no-trunc", "--filter", &format!("id={id}")]).trim().is_empty().then_some(())
        });
        assert!(gone.is_some(), "the warm container {id} of {job} outlived its job\n{}", agent.log());
        used.push(id);
    }
    // What is left is at most the next warm container, labelled for reaping.
    let left = podman(&["ps", "-a", "-q", "--filter", &format!("label=kiln.agent={}", agent_name("ctr-warm"))]);
    assert!(left.lines().filter(|l| !l.is_empty()).count() <= 1, "{left}");
}

/// Issue 43 in a container job: the steps read `$KILN_QUARANTINE` at
/// `/kiln/outputs`, a failure of only quarantined tests lets the job
/// through, and a report linked to a file of the container's is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_jobs_reports_and_quarantine() {
    if !containers_available() {
        return;
    }
    let _reap = ReapOnDrop(&["ctr-reports"]);
    let s = server();
    let agent = container_agent(&s, "ctr-reports", &[]);
    let reg = registry();
    let wf = format!(
        r#"version: 1
jobs:
  - name: test
    image: {reg}/kiln-test/base:latest
    reports: {{junit: ["*.xml"]}}
    steps:
      - echo "quarantined=$(cat "$KILN_QUARANTINE")"
      - ln -s /etc/passwd evil.xml
      - printf '%s' '<testsuite name="c"><testcase name="ok"/><testcase name="q"><failure message="known"/></testcase></testsuite>' > r.xml; exit 1
"#
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    s.add_repo("ctr-reports", &repo);
    let q = s
        .cli()
        .args(["tests", "quarantine", "ctr-reports", "c :: q", "--owner", "ops", "--reason", "known failure"])
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let c = Client::new(&s.url, &s.token);
    let run = c
        .submit_run("ctr-reports", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None)
        .await
        .unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    let log = logs(&s, &run.run_id, "test");
    assert!(log.contains("quarantined=c :: q"), "{log}\nagent:\n{}", agent.log());
    assert!(log.contains("`evil.xml` is a symbolic link"), "{log}");
    // The symlinked report is refused, so the reports are not complete:
    // the quarantine does not excuse the failure.
    assert_eq!(done.status, "failed", "{log}");
    let t = c.run_tests(&run.run_id, false).await.unwrap();
    assert_eq!(t.attempts[0].state, "truncated", "{t:?}");
    assert!(t.tests.iter().any(|r| r.test.id == "c :: q" && r.quarantined), "{t:?}");
    assert!(!log.contains("root:x:0:0"), "nothing of /etc/passwd reaches the log: {log}");
}
