//! The container executor against a real engine (Podman's Docker API) and
//! the local test registry of `scripts/container-env`.
//!
//! Without an engine these tests skip with a message, unless
//! `KILN_REQUIRE_CONTAINERS=1` (set by `scripts/test`): then they fail.

use kiln_sandbox::{
    ContainerConfig, ContainerExecutor, Engine, Executor, Limits, Network, OutputStream, PinnedImage, SandboxError,
    StepEvent, StepExit, StepHandle, StepRequest,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn engine_url() -> String {
    std::env::var("KILN_ENGINE").unwrap_or_else(|_| "unix:///run/podman/podman.sock".into())
}

fn registry() -> String {
    std::env::var("KILN_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into())
}

/// The engine, or None (skip) when there is none and it is not required.
async fn engine() -> Option<Engine> {
    let url = engine_url();
    let res = match Engine::connect(&url) {
        Ok(e) => e.ping().await.map(|()| e),
        Err(e) => Err(e),
    };
    match res {
        Ok(e) => Some(e),
        Err(e) if std::env::var("KILN_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") => {
            panic!("KILN_REQUIRE_CONTAINERS=1 but no container engine: {e} (run scripts/container-env)")
        }
        Err(e) => {
            eprintln!("SKIPPED: no container engine ({e}); run scripts/container-env");
            None
        }
    }
}

/// The registry's digest of `name:tag` (a HEAD on the manifest).
fn registry_digest(name: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-fsSI", "-H"])
        .arg("Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
        .arg(format!("http://{}/v2/{name}/manifests/latest", registry()))
        .output()
        .expect("curl");
    assert!(out.status.success(), "no manifest for {name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("docker-content-digest:").map(|d| d.trim().to_string()))
        .expect("Docker-Content-Digest header")
}

fn base() -> PinnedImage {
    PinnedImage::Registry {
        repository: format!("{}/kiln-test/base", registry()),
        digest: registry_digest("kiln-test/base"),
    }
}

fn labels(agent: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kiln.agent".to_string(), agent.to_string()),
        ("kiln.job".to_string(), "job-1".to_string()),
        ("kiln.epoch".to_string(), "1".to_string()),
    ])
}

async fn sandbox(engine: &Engine, ws: &Path, image: &PinnedImage, agent: &str, grace: Duration) -> ContainerExecutor {
    let reference = engine.ensure_image(image, &mut |_| {}).await.expect("image");
    let exec = ContainerExecutor::new(
        engine.clone(),
        ContainerConfig {
            image: reference,
            workspace: ws.to_path_buf(),
            mounts: vec![],
            labels: labels(agent),
            limits: Limits { cpus: 1.0, memory_bytes: 256 * 1024 * 1024, pids: 128 },
            network: Network::None,
            kill_grace: grace,
        },
    );
    exec.prepare().await.expect("prepare");
    exec
}

fn step(cmd: &str) -> StepRequest {
    StepRequest { name: "test".into(), command: cmd.into(), env: BTreeMap::new(), ..Default::default() }
}

#[derive(Debug, Default)]
struct Output {
    stdout: String,
    stderr: String,
    exit: Option<StepExit>,
}

async fn collect(mut h: StepHandle) -> Output {
    let mut out = Output::default();
    while let Some(ev) = h.next().await {
        match ev {
            StepEvent::Output { stream: OutputStream::Stdout, data } => out.stdout += &String::from_utf8_lossy(&data),
            StepEvent::Output { stream: OutputStream::Stderr, data } => out.stderr += &String::from_utf8_lossy(&data),
            StepEvent::Exited(e) => {
                out.exit = Some(e);
                break;
            }
        }
    }
    out
}

async fn run(exec: &ContainerExecutor, cmd: &str) -> Output {
    collect(exec.exec(&step(cmd)).await.expect("exec")).await
}

/// Waits (bounded) until the container `id` of `agent` is gone.
async fn removed(engine: &Engine, agent: &str, id: &str) -> bool {
    for _ in 0..200 {
        if !engine.containers_labelled("kiln.agent", agent).await.unwrap().iter().any(|c| c == id) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

fn agent_name(test: &str) -> String {
    format!("test-{test}-{}", std::process::id())
}

#[tokio::test]
async fn steps_run_in_the_image_with_the_workspace_mounted() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("input.txt"), "from the host\n").unwrap();
    let exec = sandbox(&engine, &ws, &base(), &agent_name("steps"), Duration::from_secs(10)).await;

    let mut req = step("echo out; echo err >&2; pwd; cat input.txt; echo $GREETING $KILN_WORKSPACE; exit 3");
    req.env.insert("GREETING".into(), "hello".into());
    req.env.insert("KILN_WORKSPACE".into(), "/host/path".into());
    let out = collect(exec.exec(&req).await.unwrap()).await;
    assert_eq!(out.stdout, "out\n/workspace\nfrom the host\nhello /workspace\n");
    assert_eq!(out.stderr, "err\n");
    assert_eq!(out.exit, Some(StepExit::Code(3)));

    // `sh -e`: the first failing command ends the step; state persists across steps.
    let out = run(&exec, "mkdir -p target; echo jar > target/app.jar; false; echo unreachable").await;
    assert_eq!(out.exit, Some(StepExit::Code(1)));
    assert!(!out.stdout.contains("unreachable"));
    let out = run(&exec, "cat target/app.jar").await;
    assert_eq!((out.stdout.as_str(), out.exit), ("jar\n", Some(StepExit::Code(0))));
    assert_eq!(std::fs::read_to_string(ws.join("target/app.jar")).unwrap(), "jar\n");

    let id = exec.container_id().unwrap();
    exec.cleanup().await.unwrap();
    exec.cleanup().await.unwrap();
    assert!(removed(&engine, &agent_name("steps"), &id).await, "container removed after cleanup");
}

#[tokio::test]
async fn a_job_sees_neither_the_host_nor_the_engine_nor_the_agents_secrets() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let secret_file = dir.path().join("agent.token");
    std::fs::write(&secret_file, "s3cr3t-token").unwrap();
    // SAFETY-free: the test process's environment, which steps must not inherit.
    let exec = sandbox(&engine, &ws, &base(), &agent_name("iso"), Duration::from_secs(10)).await;
    let probe = format!(
        "test ! -e {secret} && echo no-host-file; \
         test ! -e /run/podman/podman.sock && test ! -e /var/run/docker.sock && echo no-engine-socket; \
         ls /run /var/run 2>/dev/null | grep -c sock || true; \
         env | grep -c -i token || true; \
         test ! -e /root/.cache && echo no-host-home; \
         cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max; \
         cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; \
         ip -o link 2>/dev/null | grep -v ' lo:' | wc -l",
        secret = secret_file.display()
    );
    let out = run(&exec, &probe).await;
    assert_eq!(out.exit, Some(StepExit::Code(0)), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "no-host-file");
    assert_eq!(lines[1], "no-engine-socket");
    assert_eq!(lines[2], "0", "no socket visible in /run");
    assert_eq!(lines[3], "0", "no token in the environment");
    assert_eq!(lines[4], "no-host-home");
    assert_eq!(lines[5], "128", "pids limit");
    assert_eq!(lines[6], (256 * 1024 * 1024).to_string(), "memory limit");
    assert_eq!(lines[7], "0", "network none: only loopback");
    exec.cleanup().await.unwrap();
    engine.settle().await;
}

#[tokio::test]
async fn kill_terms_then_kills_within_the_grace_and_cleanup_removes_the_container() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_name("kill");
    let exec = sandbox(&engine, &dir.path().join("ws"), &base(), &agent, Duration::from_secs(1)).await;

    // A step that obeys SIGTERM ends at once.
    let h = exec.exec(&step("echo started; sleep 100")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    exec.kill().await;
    let out = collect(h).await;
    assert!(t.elapsed() < Duration::from_secs(1), "SIGTERM honoured: {:?}", t.elapsed());
    assert_eq!(out.stdout, "started\n");
    assert!(matches!(out.exit, Some(StepExit::Signal(15)) | Some(StepExit::Code(143))), "{:?}", out.exit);
    assert!(matches!(exec.exec(&step("true")).await, Err(SandboxError::Killed)));
    exec.cleanup().await.unwrap();

    // A step that ignores SIGTERM is SIGKILLed after the grace.
    let exec = sandbox(&engine, &dir.path().join("ws2"), &base(), &agent, Duration::from_secs(1)).await;
    let h = exec.exec(&step("trap '' TERM; echo started; while :; do sleep 1; done")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    exec.kill().await;
    let out = collect(h).await;
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "killed after the grace: {took:?}");
    assert!(out.exit.is_some_and(|e| !e.success()));
    exec.cleanup().await.unwrap();
    engine.settle().await;
    assert!(engine.containers_labelled("kiln.agent", &agent).await.unwrap().is_empty());
}

#[tokio::test]
async fn processes_a_step_left_running_die_at_cleanup() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let exec = sandbox(&engine, &ws, &base(), &agent_name("leftover"), Duration::from_secs(10)).await;
    let out = run(
        &exec,
        "(trap '' TERM HUP; i=0; while :; do i=$((i+1)); echo $i > tick; sleep 0.02; done) >/dev/null 2>&1 &",
    )
    .await;
    assert_eq!(out.exit, Some(StepExit::Code(0)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = std::fs::read_to_string(ws.join("tick")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_ne!(std::fs::read_to_string(ws.join("tick")).unwrap(), before, "the step's daemon outlives the step");
    exec.cleanup().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = std::fs::read_to_string(ws.join("tick")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(ws.join("tick")).unwrap(), after, "and not after");
    engine.settle().await;
    assert!(engine.containers_labelled("kiln.agent", &agent_name("leftover")).await.unwrap().is_empty());
}

#[tokio::test]
async fn orphans_of_a_dead_agent_are_reaped_by_label() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_name("reap");
    let exec = sandbox(&engine, &dir.path().join("ws"), &base(), &agent, Duration::from_secs(10)).await;
    let _running = exec.exec(&step("sleep 100")).await.unwrap();
    // The agent "dies": no cleanup.
    std::mem::forget(exec);
    assert_eq!(engine.containers_labelled("kiln.agent", &agent).await.unwrap().len(), 1);
    assert_eq!(engine.reap(&agent).await.unwrap(), 1);
    assert!(engine.containers_labelled("kiln.agent", &agent).await.unwrap().is_empty());
    assert_eq!(engine.reap(&agent).await.unwrap(), 0);
}

#[tokio::test]
async fn a_local_image_with_the_pinned_digest_runs_without_its_registry() {
    let Some(engine) = engine().await else { return };
    let digest = registry_digest("kiln-test/base");
    engine.ensure_image(&base(), &mut |_| {}).await.unwrap();
    // The same bytes under a repository whose registry does not answer.
    let offline = "127.0.0.1:5999/kiln-test/offline";
    let st = std::process::Command::new("podman")
        .args(["tag", &format!("{}/kiln-test/base@{digest}", registry()), &format!("{offline}:latest")])
        .status()
        .unwrap();
    assert!(st.success());
    let image = PinnedImage::Registry { repository: offline.into(), digest: digest.clone() };
    let mut log = Vec::new();
    let reference = engine.ensure_image(&image, &mut |m| log.push(m.to_string())).await.unwrap();
    assert_eq!(reference, format!("{offline}@{digest}"));
    assert!(log.iter().any(|l| l.contains("image store")), "{log:?}");

    // A digest the engine lacks, from a registry that is down: a clear error.
    let missing = PinnedImage::Registry { repository: offline.into(), digest: format!("sha256:{}", "0".repeat(64)) };
    let err = engine.ensure_image(&missing, &mut |_| {}).await.unwrap_err();
    assert!(err.to_string().contains("not available"), "{err}");
}

#[tokio::test]
async fn dockerfile_builds_run_and_broken_ones_fail_with_their_log() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("checkout");
    std::fs::create_dir_all(checkout.join("ci/image")).unwrap();
    std::fs::write(checkout.join("ci/image/greeting.txt"), "built in the image\n").unwrap();
    std::fs::write(
        checkout.join("ci/image/Dockerfile"),
        format!(
            "FROM {}/kiln-test/base:latest\nCOPY greeting.txt /etc/greeting\nRUN echo step-ran\n\
             RUN echo \"{nonce} memory limit: $(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)\"\n",
            registry(),
            // Never a cached layer: this step must run under this build's limits.
            nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos(),
        ),
    )
    .unwrap();
    std::fs::write(
        checkout.join("Broken.Dockerfile"),
        format!("FROM {}/kiln-test/base:latest\nRUN echo about-to-fail && exit 7\n", registry()),
    )
    .unwrap();

    let mut log = Vec::new();
    let tag = format!("localhost/kiln-build/test-{}:latest", std::process::id());
    let id = engine
        .build(&checkout, "ci/image/Dockerfile", "ci/image", &tag, &Network::None, &limits(), &mut |b| {
            log.extend_from_slice(b)
        })
        .await
        .unwrap();
    assert!(id.starts_with("sha256:"), "{id}");
    assert!(String::from_utf8_lossy(&log).contains("step-ran"), "{}", String::from_utf8_lossy(&log));
    // The build ran under the job's memory limit (issue 40, item 7).
    let want = format!("memory limit: {}", limits().memory_bytes);
    assert!(String::from_utf8_lossy(&log).contains(&want), "{}", String::from_utf8_lossy(&log));
    let exec = sandbox(
        &engine,
        &dir.path().join("ws"),
        &PinnedImage::Local { id },
        &agent_name("build"),
        Duration::from_secs(10),
    )
    .await;
    let out = run(&exec, "cat /etc/greeting").await;
    assert_eq!((out.stdout.as_str(), out.exit), ("built in the image\n", Some(StepExit::Code(0))));
    exec.cleanup().await.unwrap();
    engine.settle().await;

    // The Dockerfile outside its context, failing.
    let mut log = Vec::new();
    let err = engine
        .build(&checkout, "Broken.Dockerfile", "ci/image", &tag, &Network::None, &limits(), &mut |b| {
            log.extend_from_slice(b)
        })
        .await
        .unwrap_err();
    let log = String::from_utf8_lossy(&log);
    assert!(log.contains("about-to-fail"), "{log}");
    assert!(err.to_string().contains("build failed"), "{err}");
}

/// A container started before its job (a warm one) serves the workspace it
/// has bound after the directory is renamed into the job's place, is
/// removed by cleanup like any other; one that is gone by the first step is
/// replaced by a fresh one, the step running as if nothing happened.
#[tokio::test]
async fn an_adopted_container_serves_its_renamed_workspace_or_is_replaced() {
    let Some(engine) = engine().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = agent_name("adopt");
    let reference = engine.ensure_image(&base(), &mut |_| {}).await.unwrap();
    let cfg = |ws: &Path| ContainerConfig {
        image: reference.clone(),
        workspace: ws.to_path_buf(),
        mounts: vec![],
        labels: labels(&agent),
        limits: Limits { cpus: 1.0, memory_bytes: 256 * 1024 * 1024, pids: 128 },
        network: Network::None,
        kill_grace: Duration::from_secs(10),
    };

    // Started in one directory, used under another name.
    let (warm_dir, job_dir) = (dir.path().join("warm"), dir.path().join("job"));
    std::fs::create_dir_all(warm_dir.join("ws")).unwrap();
    let mut seen = None;
    let id = engine.start_idle(&cfg(&warm_dir.join("ws")), |id| seen = Some(id.to_string())).await.unwrap();
    assert_eq!(seen.as_deref(), Some(id.as_str()));
    std::fs::rename(&warm_dir, &job_dir).unwrap();
    std::fs::write(job_dir.join("ws/input.txt"), "checked out after the start\n").unwrap();
    let exec = ContainerExecutor::adopt(engine.clone(), cfg(&job_dir.join("ws")), id.clone());
    exec.prepare().await.unwrap();
    assert_eq!(exec.container_id().as_deref(), Some(id.as_str()), "prepare keeps the adopted container");
    let out = run(&exec, "cat input.txt; echo made > made.txt").await;
    assert_eq!((out.stdout.as_str(), out.exit), ("checked out after the start\n", Some(StepExit::Code(0))));
    assert_eq!(std::fs::read_to_string(job_dir.join("ws/made.txt")).unwrap(), "made\n");
    exec.cleanup().await.unwrap();
    assert!(removed(&engine, &agent, &id).await, "the adopted container is removed after cleanup");

    // Gone before the first step: a fresh container takes its place.
    let ws2 = dir.path().join("ws2");
    let gone = engine.start_idle(&cfg(&ws2), |_| {}).await.unwrap();
    engine.discard(gone.clone());
    engine.settle().await;
    assert!(removed(&engine, &agent, &gone).await);
    let exec = ContainerExecutor::adopt(engine.clone(), cfg(&ws2), gone.clone());
    exec.prepare().await.unwrap();
    let out = run(&exec, "echo still-runs > out.txt; cat out.txt").await;
    assert_eq!((out.stdout.as_str(), out.exit), ("still-runs\n", Some(StepExit::Code(0))));
    let fresh = exec.container_id().unwrap();
    assert_ne!(fresh, gone);
    exec.cleanup().await.unwrap();
    engine.settle().await;
    assert!(engine.containers_labelled("kiln.agent", &agent).await.unwrap().is_empty());
}

/// A build's limits in these tests: one CPU, 3 GiB (past what a 32-bit
/// field of the engine API could carry).
fn limits() -> Limits {
    Limits { cpus: 1.0, memory_bytes: 3 * 1024 * 1024 * 1024, pids: 128 }
}
