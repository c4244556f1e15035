//! The host executor with real processes.

use kiln_sandbox::{
    Executor, HostConfig, HostExecutor, OutputStream, SandboxError, StepEvent, StepExit, StepHandle, StepRequest,
    process_alive, reap_orphans,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

struct Sandbox {
    dir: tempfile::TempDir,
    exec: HostExecutor,
}

impl Sandbox {
    async fn new() -> Sandbox {
        Sandbox::with_grace(Duration::from_secs(10)).await
    }

    async fn with_grace(grace: Duration) -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = HostConfig::new(dir.path().join("ws"), dir.path().join("attempt"), dir.path().join("pgids"));
        cfg.kill_grace = grace;
        let exec = HostExecutor::new(cfg);
        exec.prepare().await.unwrap();
        Sandbox { dir, exec }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// The records of running groups (named by their pgid; a finished
    /// group's record is kept as a `.spare-N` for the next one).
    fn pgids(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir.path().join("pgids"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().parse::<i32>().is_ok())
            .collect()
    }

    async fn start(&self, cmd: &str) -> StepHandle {
        self.exec.exec(&step(cmd)).await.unwrap()
    }

    async fn run(&self, cmd: &str) -> Output {
        collect(self.start(cmd).await).await
    }
}

fn step(cmd: &str) -> StepRequest {
    StepRequest { name: "test".into(), command: cmd.into(), ..Default::default() }
}

#[derive(Debug, Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<StepExit>,
}

async fn collect(mut h: StepHandle) -> Output {
    let mut out = Output::default();
    let all = async {
        while let Some(ev) = h.next().await {
            match ev {
                StepEvent::Output { stream: OutputStream::Stdout, data } => out.stdout.extend(data),
                StepEvent::Output { stream: OutputStream::Stderr, data } => out.stderr.extend(data),
                StepEvent::Exited(e) => {
                    out.exit = Some(e);
                    break;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all).await.expect("step did not finish");
    out
}

/// Waits for the next stdout bytes of a step.
async fn next_stdout(h: &mut StepHandle) -> Vec<u8> {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), h.next()).await.expect("no output").expect("ended") {
            StepEvent::Output { stream: OutputStream::Stdout, data } => return data.to_vec(),
            StepEvent::Output { .. } => {}
            StepEvent::Exited(e) => panic!("step exited early: {e}"),
        }
    }
}

/// Steps run in their own PID namespace with their own /proc, where no pid
/// is a host pid: test steps record their pid as they see it (from
/// `/proc/self/stat`), and the test finds the host pid of that process (the
/// one whose `NSpid` ends with it, working in the same directory).
fn read_pid(path: &Path) -> i32 {
    host_pid(path).expect("the process runs")
}

/// The host pid of the live process that wrote `path` (see [`read_pid`]).
fn host_pid(path: &Path) -> Option<i32> {
    let seen: i32 = std::fs::read_to_string(path).unwrap().trim().parse().unwrap();
    let cwd = path.parent().unwrap().canonicalize().unwrap();
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:")).unwrap_or("");
        let last = nspid.split_whitespace().last().and_then(|p| p.parse::<i32>().ok());
        if last == Some(seen)
            && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == cwd)
            && process_alive(pid)
        {
            found.push(pid);
        }
    }
    assert!(found.len() <= 1, "host pids of {seen} in {}: {found:?}", cwd.display());
    found.first().copied()
}

#[tokio::test]
async fn exit_codes_decide_success() {
    let sb = Sandbox::new().await;
    assert_eq!(sb.run("true").await.exit, Some(StepExit::Code(0)));
    assert_eq!(sb.run("exit 3").await.exit, Some(StepExit::Code(3)));
    // `sh -e`: the first failing command ends the step.
    let out = sb.run("echo before; false; echo after").await;
    assert_eq!(out.exit, Some(StepExit::Code(1)));
    assert_eq!(out.stdout, b"before\n");
    assert!(!StepExit::Code(1).success());
    assert_eq!(StepExit::Signal(9).code(), 137);
}

#[tokio::test]
async fn stdout_and_stderr_are_separate_and_cwd_is_the_workspace() {
    let sb = Sandbox::new().await;
    std::fs::write(sb.ws().join("hello.txt"), "from the checkout\n").unwrap();
    let out = sb.run("echo out; echo err >&2; cat hello.txt; cat hello.txt >&2; read x || echo no-stdin").await;
    assert_eq!(out.exit, Some(StepExit::Code(0)));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "out\nfrom the checkout\nno-stdin\n");
    assert_eq!(String::from_utf8(out.stderr).unwrap(), "err\nfrom the checkout\n");
}

#[tokio::test]
async fn output_arrives_while_the_step_runs() {
    let sb = Sandbox::new().await;
    let mut h = sb.start("echo first; while [ ! -f go ]; do sleep 0.02; done; echo second").await;
    // The step cannot end before `go` exists, so these bytes came incrementally.
    assert_eq!(next_stdout(&mut h).await, b"first\n");
    std::fs::write(sb.ws().join("go"), "").unwrap();
    let rest = collect(h).await;
    assert_eq!(rest.stdout, b"second\n");
    assert_eq!(rest.exit, Some(StepExit::Code(0)));
}

#[tokio::test]
async fn kill_terminates_the_whole_process_tree() {
    let sb = Sandbox::new().await;
    let mut h = sb
        .start("sh -c 'read -r p _ < /proc/self/stat; echo $p > bg.pid.tmp; mv bg.pid.tmp bg.pid; exec sleep 1000' & while [ ! -s bg.pid ]; do sleep 0.01; done; read -r p _ < /proc/self/stat; echo $p > sh.pid; echo ready; sleep 1000")
        .await;
    assert_eq!(next_stdout(&mut h).await, b"ready\n");
    let (bg, sh) = (read_pid(&sb.ws().join("bg.pid")), read_pid(&sb.ws().join("sh.pid")));
    assert!(process_alive(bg) && process_alive(sh));
    assert_eq!(sb.pgids().len(), 1, "the running group is recorded");
    // The step's shell is PID 1 of its namespace, which ignores SIGTERM: the
    // signal ends the step through its foreground `sleep`. Wait until that
    // child exists (beside the background one), or a SIGTERM landing between `echo` and the fork (easy
    // on a loaded machine) is absorbed and only the SIGKILL escalation ends it.
    let children = format!("/proc/{sh}/task/{sh}/children");
    for _ in 0..500 {
        if std::fs::read_to_string(&children).is_ok_and(|c| c.split_whitespace().count() >= 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // kill runs concurrently with the consumer and is idempotent.
    let (out, (), ()) = tokio::join!(collect(h), sb.exec.kill(), sb.exec.kill());
    // Killed by SIGTERM; through the PID-namespace launcher that surfaces as
    // the shell convention 128 + 15.
    assert!(matches!(out.exit, Some(StepExit::Signal(libc::SIGTERM)) | Some(StepExit::Code(143))), "{:?}", out.exit);
    assert!(!process_alive(bg), "background child survived");
    assert!(!process_alive(sh), "shell survived");
    assert!(sb.pgids().is_empty(), "record removed once the group is gone");
    assert!(matches!(sb.exec.exec(&step("true")).await, Err(SandboxError::Killed)));
    sb.exec.cleanup().await.unwrap();
    sb.exec.cleanup().await.unwrap();
}

#[tokio::test]
async fn kill_escalates_to_sigkill_after_the_grace() {
    let sb = Sandbox::with_grace(Duration::from_millis(200)).await;
    let mut h = sb
        .start("trap '' TERM; sh -c 'read -r p _ < /proc/self/stat; echo $p > bg.pid.tmp; mv bg.pid.tmp bg.pid; exec sleep 1000' & while [ ! -s bg.pid ]; do sleep 0.01; done; echo ready; wait")
        .await;
    assert_eq!(next_stdout(&mut h).await, b"ready\n");
    let bg = read_pid(&sb.ws().join("bg.pid"));
    let (out, ()) = tokio::join!(collect(h), sb.exec.kill());
    assert_eq!(out.exit, Some(StepExit::Signal(libc::SIGKILL)));
    assert!(!process_alive(bg));
}

#[tokio::test]
async fn leftovers_die_when_the_step_ends() {
    let sb = Sandbox::new().await;
    let out = sb
        .run("sh -c 'read -r p _ < /proc/self/stat; echo $p > bg.pid.tmp; mv bg.pid.tmp bg.pid; exec sleep 1000' >/dev/null 2>&1 & while [ ! -s bg.pid ]; do sleep 0.01; done")
        .await;
    assert_eq!(out.exit, Some(StepExit::Code(0)));
    assert_eq!(host_pid(&sb.ws().join("bg.pid")), None, "the background process survived");
    // The next step may run: the sandbox is free again.
    assert_eq!(sb.run("echo again").await.stdout, b"again\n");
}

#[tokio::test]
async fn large_output_on_both_pipes_does_not_hang() {
    let sb = Sandbox::new().await;
    let out = sb.run("head -c 3000000 /dev/zero >&2 & head -c 20000000 /dev/zero; wait").await;
    assert_eq!(out.exit, Some(StepExit::Code(0)));
    assert_eq!(out.stdout.len(), 20_000_000);
    assert_eq!(out.stderr.len(), 3_000_000);
}

/// Output reaches the consumer whole and in order, in reads that grow from
/// a small buffer to the largest one and back to quiet lines.
#[tokio::test]
async fn output_arrives_intact_through_growing_reads() {
    let sb = Sandbox::new().await;
    let out = sb.run("echo first; sleep 0.1; seq 1 300000; sleep 0.1; echo last").await;
    let mut want = String::from("first\n");
    for i in 1..=300_000 {
        want.push_str(&format!("{i}\n"));
    }
    want.push_str("last\n");
    assert_eq!(out.exit, Some(StepExit::Code(0)));
    assert!(out.stdout == want.as_bytes(), "{} bytes instead of {}", out.stdout.len(), want.len());
}

#[tokio::test]
async fn a_dropped_handle_does_not_block_the_step() {
    let sb = Sandbox::new().await;
    drop(sb.start("head -c 5000000 /dev/zero; echo done > done.txt").await);
    let done = sb.ws().join("done.txt");
    tokio::time::timeout(Duration::from_secs(30), async {
        while !done.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("step blocked on its output");
}

#[tokio::test]
async fn one_step_at_a_time_and_cleanup_after_failed_start() {
    let sb = Sandbox::new().await;
    let mut h = sb.start("echo ready; sleep 1000").await;
    assert_eq!(next_stdout(&mut h).await, b"ready\n");
    assert!(matches!(sb.exec.exec(&step("true")).await, Err(SandboxError::Busy)));
    sb.exec.cleanup().await.unwrap();
    assert!(collect(h).await.exit.is_some());

    // A workspace that does not exist: the start fails, cleanup is still safe.
    let dir = tempfile::tempdir().unwrap();
    let cfg = HostConfig::new(dir.path().join("missing"), dir.path().join("a"), dir.path().join("p"));
    let exec = HostExecutor::new(cfg);
    assert!(matches!(exec.exec(&step("true")).await, Err(SandboxError::Spawn { .. })));
    exec.cleanup().await.unwrap();
}

#[tokio::test]
async fn reap_orphans_kills_recorded_groups_that_survived() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("pgids");
    std::fs::create_dir_all(&state).unwrap();
    // A session leader like a step's shell, whose agent is gone.
    let mut orphan = std::process::Command::new("setsid").args(["sleep", "1000"]).spawn().unwrap();
    let pgid = orphan.id() as i32;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim();
    std::fs::write(state.join(pgid.to_string()), format!("{boot} {}", start_time(pgid))).unwrap();
    // A record from another boot names a pgid that may have been reused: left alone.
    let mut bystander = std::process::Command::new("setsid").args(["sleep", "1000"]).spawn().unwrap();
    std::fs::write(state.join(bystander.id().to_string()), "another-boot 1").unwrap();
    // A forged record (issue 13: a step wrote one to get a process killed)
    // names this boot but not the process's start time: left alone too, as
    // is an old-format record without a start time.
    let mut forged = std::process::Command::new("setsid").args(["sleep", "1000"]).spawn().unwrap();
    std::fs::write(state.join(forged.id().to_string()), format!("{boot} 1")).unwrap();
    let mut old = std::process::Command::new("setsid").args(["sleep", "1000"]).spawn().unwrap();
    std::fs::write(state.join(old.id().to_string()), boot).unwrap();

    // (`setsid` execs in place: our child is not a group leader, so its pid is
    // the new sid — once the child got as far as calling setsid(2), which
    // `spawn` returning does not promise.)
    for child in [&orphan, &bystander, &forged, &old] {
        let pid = child.id() as i32;
        let pid = nix::unistd::Pid::from_raw(pid);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while nix::unistd::getsid(Some(pid)) != Ok(pid) {
            assert!(std::time::Instant::now() < deadline, "setsid never ran in {pid}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(reap_orphans(&state).unwrap(), 1);
    let status = orphan.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    for other in [&mut bystander, &mut forged, &mut old] {
        assert!(process_alive(other.id() as i32));
    }
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
    for other in [&mut bystander, &mut forged, &mut old] {
        other.kill().unwrap();
        other.wait().unwrap();
    }
    assert_eq!(reap_orphans(&dir.path().join("absent")).unwrap(), 0);
}

/// Field 22 of /proc/PID/stat: what a genuine record holds besides the boot id.
fn start_time(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s[s.rfind(')').unwrap() + 1..].split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// A step's own timeout: `interrupt` ends the running step (its whole
/// group) but not the sandbox; the next step runs, with its own program and
/// working directory.
#[tokio::test]
async fn interrupt_ends_only_the_running_step() {
    let sb = Sandbox::with_grace(Duration::from_secs(2)).await;
    std::fs::create_dir_all(sb.ws().join("sub")).unwrap();
    let mut h = sb.start("echo started; sleep 600 & wait").await;
    assert_eq!(next_stdout(&mut h).await, b"started\n");
    let exec = &sb.exec;
    // It ends (whatever its status: in its own PID namespace the shell is
    // init and outlives TERM, its children do not).
    let (_, out) = tokio::join!(exec.interrupt(), collect(h));
    assert!(out.exit.is_some());
    let req = StepRequest {
        name: "after".into(),
        command: "import os; print('py in', os.path.basename(os.getcwd()))".into(),
        program: vec!["/usr/bin/env".into(), "python3".into(), "-c".into()],
        working_dir: Some("sub".into()),
        ..Default::default()
    };
    let out = collect(sb.exec.exec(&req).await.unwrap()).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "py in sub\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.exit, Some(StepExit::Code(0)));
}

/// Issue 20: a root agent starts a step as PID 1 of its new PID namespace
/// itself (one clone), not through a keeper process: the group's leader is
/// the step's shell, a child of this process, and it is PID 1 inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_agents_step_is_pid_1_of_its_namespace_without_a_keeper() {
    if !nix::unistd::geteuid().is_root() {
        return; // PID namespaces from the agent itself need root
    }
    let sb = Sandbox::with_grace(Duration::from_millis(200)).await;
    let h = sb.start("echo pid=$$; sleep 30").await;
    let pgid = loop {
        if let Some(p) = sb.pgids().first() {
            break p.file_name().unwrap().to_string_lossy().parse::<i32>().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The spawner returns once the step's exec has begun: its command line
    // is set up a moment later.
    let mut cmdline = String::new();
    for _ in 0..500 {
        cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pgid}/cmdline")).unwrap()).replace('\0', " ");
        if !cmdline.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(cmdline.starts_with("/bin/sh -e -c echo pid=$$"), "the group's leader is the step's shell: {cmdline}");
    let stat = std::fs::read_to_string(format!("/proc/{pgid}/stat")).unwrap();
    let ppid: u32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(ppid, std::process::id(), "spawned by the agent itself");
    sb.exec.kill().await;
    let out = collect(h).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pid=1\n"), "PID 1 of its namespace: {stdout}");
    assert!(!process_alive(pgid), "killed with its namespace");
}

/// A step whose start was abandoned (the caller's future dropped while the
/// spawner thread started it) does not run on untracked: the spawner kills
/// its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_start_was_abandoned_does_not_run_on() {
    if !nix::unistd::geteuid().is_root() {
        return; // the spawner thread is a root agent's
    }
    let sb = Sandbox::with_grace(Duration::from_millis(200)).await;
    let value = format!("{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    let mut req = step("sleep 30");
    req.env.insert("KILN_ABANDONED".into(), value.clone());
    // Polled once (the spawn is handed to the spawner thread), then dropped.
    if let Ok(started) = tokio::time::timeout(Duration::ZERO, sb.exec.exec(&req)).await {
        // Spawned before the first poll returned: nothing was abandoned.
        drop(started);
        sb.exec.kill().await;
        return;
    }
    let want = format!("KILN_ABANDONED={value}");
    let running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { return false };
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            env.split(|b| *b == 0).any(|v| v == want.as_bytes()) && process_alive(pid)
        })
    };
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !running() {
            return;
        }
    }
    panic!("the abandoned step still runs");
}

/// A step starts as `Command` would start it, however the agent starts it
/// (issue 20: a root agent clones it sharing its own memory until it
/// execs): no signal is blocked or ignored in it, whatever the agent
/// blocks, ignores or handles (Rust ignores SIGPIPE, the tokio runtime
/// handles others, and this test process ignores signal 32 too), a program
/// without a
/// slash is found in the step's own `PATH`, and one that cannot run is a
/// spawn error naming why, with the executor free for the next step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_starts_with_default_signals_and_its_own_path() {
    // The test process handles and ignores signals like an agent (an agent
    // started by `nohup` ignores SIGHUP): a step must not inherit any of that.
    let ignored = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(ignored.lines().any(|l| l.starts_with("SigIgn:") && l != "SigIgn:\t0000000000000000"));
    let _term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let sb = Sandbox::new().await;
    let out = sb.run("grep -E '^Sig(Blk|Ign):' /proc/self/status; yes | head -n 1").await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\ny\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.exit, Some(StepExit::Code(0)));

    // Found in the step's PATH, not the agent's.
    let bin = sb.ws().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = bin.join("kiln-test-shell");
    std::fs::write(&tool, "#!/bin/sh\necho \"own shell: $1\"\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut req = step("hello");
    req.program = vec!["kiln-test-shell".into()];
    req.env.insert("PATH".into(), format!("{}:/usr/bin:/bin", bin.display()));
    let out = collect(sb.exec.exec(&req).await.unwrap()).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own shell: hello\n");

    // Not found, and not executable: spawn errors with the reason.
    req.env.remove("PATH");
    match sb.exec.exec(&req).await {
        Err(SandboxError::Spawn { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{source}"),
        Err(e) => panic!("not a spawn error: {e}"),
        Ok(_) => panic!("a program missing from the step's PATH ran"),
    }
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    req.program = vec![tool.display().to_string()];
    match sb.exec.exec(&req).await {
        Err(SandboxError::Spawn { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied, "{source}")
        }
        Err(e) => panic!("not a spawn error: {e}"),
        Ok(_) => panic!("a file without an execute bit ran"),
    }
    let out = sb.run("echo still free").await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still free\n");
}
