//! [`HostExecutor`]: steps as host processes.
//!
//! Each step is `/bin/sh -e -c <command>` in the workspace, in its own
//! session (so its whole tree is one process group), with PR_SET_PDEATHSIG
//! so it dies with the agent, stdin from /dev/null, and an environment built
//! from scratch (the agent's token and environment never reach it).
//!
//! When the step's shell exits, whatever it left running in its group is
//! SIGKILLed: a step owns no processes beyond its own lifetime.

use crate::isolation::Namespaces;
use crate::isolation::{Isolation, chown_tree};
use crate::mounts::StepMounts;
use crate::procs::{group_alive, signal_group};
use crate::reap::{forget, record, remove_tree};
use crate::spawn::{PidNsSpawner, StepChild, StepSpec, isolate_in_namespaces, isolate_process_tree};
use crate::{Executor, OutputStream, SandboxError, StepEvent, StepExit, StepHandle, StepRequest};
use futures::FutureExt;
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// Time between SIGTERM and SIGKILL in [`Executor::kill`].
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// `PATH` of steps when the agent itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Bytes read from a pipe at once at most (and the largest output event).
const READ_BUF: usize = 256 * 1024;
/// Bytes read from a pipe at once at first ([`drain`]).
const FIRST_READ: usize = 16 * 1024;
/// Capacity asked for the output pipes (Linux's default unprivileged maximum).
const PIPE_SIZE: i32 = 1024 * 1024;
/// Output events buffered between the pipe readers and the consumer.
const EVENT_QUEUE: usize = 64;
/// After the group is gone, how long to wait for pipes held by processes that
/// escaped the group (their own `setsid`) before giving up on the rest.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Working directory of every step (the checkout).
    pub workspace: PathBuf,
    /// Private per-attempt directory: `HOME` is `<attempt_dir>/home`, `TMPDIR`
    /// is `<attempt_dir>/tmp`; `cleanup` moves both aside at once (to
    /// `<attempt_dir>/.removed-*`) and deletes them in the background.
    pub attempt_dir: PathBuf,
    /// Where running process groups are recorded for [`crate::reap_orphans`]
    /// (shared by all executors of one agent).
    pub state_dir: PathBuf,
    /// `PATH` of the steps (the job's env may override it).
    pub path: String,
    /// Time between SIGTERM and SIGKILL when killing.
    pub kill_grace: Duration,
    /// Who runs the steps and in which namespaces ([`Isolation::detect`]).
    /// With a separate step user, `prepare` hands it the workspace (links
    /// not followed), `HOME`, `TMPDIR` and the attempt directory.
    pub isolation: Isolation,
    /// `cleanup` leaves `HOME` and `TMPDIR` in place: the caller keeps the
    /// attempt directory for the next attempt and empties them itself.
    pub keep_dirs: bool,
    /// The workspace is the step user's already but for its `.git` (a
    /// kept workspace the agent brought back, handing over each entry it
    /// wrote): `prepare` hands over only the workspace itself and `.git`,
    /// without walking the tree.
    pub workspace_owned: bool,
    /// Paths no step may see (the agent's work dir and token file, `kiln
    /// up`'s data directory): each step's mount namespace covers them (a
    /// directory with an empty read-only tmpfs, a file with `/dev/null`).
    /// Where that cannot be done (no namespaces) a step that would run as
    /// the agent's own user does not run.
    pub hide: Vec<PathBuf>,
}

impl HostConfig {
    /// Defaults: the agent's `PATH` (or [`DEFAULT_PATH`]) and [`DEFAULT_KILL_GRACE`].
    pub fn new(workspace: PathBuf, attempt_dir: PathBuf, state_dir: PathBuf) -> Self {
        let path = std::env::var("PATH").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| DEFAULT_PATH.to_string());
        let isolation = Isolation::detect(None).expect("the agent's own user is always allowed");
        HostConfig {
            workspace,
            attempt_dir,
            state_dir,
            path,
            kill_grace: DEFAULT_KILL_GRACE,
            isolation,
            keep_dirs: false,
            workspace_owned: false,
            hide: vec![],
        }
    }

    fn home(&self) -> PathBuf {
        self.attempt_dir.join("home")
    }

    /// The job's `/tmp` (also `TMPDIR`), bound over `/tmp` in its steps'
    /// mount namespaces.
    fn tmp(&self) -> PathBuf {
        self.attempt_dir.join("tmp")
    }

    /// The job's `/dev/shm`.
    fn shm(&self) -> PathBuf {
        self.attempt_dir.join("shm")
    }

    /// The mounts of a step's namespace: the hidden paths, the job's
    /// private `/tmp` and `/dev/shm`, and its own directories where those
    /// cover them.
    fn step_mounts(&self) -> std::io::Result<StepMounts> {
        StepMounts::plan(
            &self.hide,
            &[(self.tmp(), "/tmp"), (self.shm(), "/dev/shm")],
            &[self.attempt_dir.clone(), self.workspace.clone()],
        )
    }
}

pub struct HostExecutor {
    cfg: HostConfig,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    killed: bool,
    running: Option<Running>,
}

#[derive(Clone)]
struct Running {
    pgid: i32,
    /// Set by `kill`: the exec task then leaves the group's end to `kill`'s grace.
    killing: Arc<AtomicBool>,
    /// Becomes true once the group is gone and `Exited` was queued.
    done: watch::Receiver<bool>,
}

impl HostExecutor {
    pub fn new(cfg: HostConfig) -> Self {
        HostExecutor { cfg, inner: Arc::default() }
    }

    async fn start(&self, step: &StepRequest) -> Result<StepHandle, SandboxError> {
        {
            let inner = self.inner.lock().expect("executor lock");
            if inner.killed {
                return Err(SandboxError::Killed);
            }
            if inner.running.is_some() {
                return Err(SandboxError::Busy);
            }
        }
        let iso = self.cfg.isolation;
        let spawn_err = |source| SandboxError::Spawn { step: step.name.clone(), source };
        // The step's forked child makes its namespaces (a non-root agent's
        // with a user namespace) and its mounts.
        let userns = match iso.namespaces {
            Namespaces::UserPid { uid, gid } => Some((uid, gid)),
            _ => None,
        };
        let namespaced = iso.namespaces != Namespaces::None;
        let mounts = if namespaced {
            self.cfg.step_mounts().map_err(|e| {
                spawn_err(std::io::Error::new(
                    e.kind(),
                    format!("cannot prepare its private /tmp and hidden paths: {e}"),
                ))
            })?
        } else if !self.cfg.hide.is_empty() && iso.user.is_none() {
            // Fail closed: it would see the agent's files as the agent.
            return Err(spawn_err(std::io::Error::other(
                "no mount namespace can be made here, so the agent's files (its work dir and token) cannot be \
                 hidden from a step that runs as the agent's own user: run the agent as root (steps then run as \
                 `nobody`) on a kernel that allows namespaces, or use the container executor",
            )));
        } else {
            StepMounts::default()
        };
        let mounting = !mounts.is_empty();
        let in_mounts = move |e: std::io::Error| {
            if mounting {
                std::io::Error::new(
                    e.kind(),
                    format!("{e} (while making its namespaces: private /tmp and /dev/shm, hidden agent files)"),
                )
            } else {
                e
            }
        };
        let default_program = ["/bin/sh".to_string(), "-e".into(), "-c".into()];
        let program: &[String] = if step.program.is_empty() { &default_program } else { &step.program };
        let mut argv: Vec<&OsStr> = program.iter().map(OsStr::new).collect();
        argv.push(OsStr::new(&step.command));
        let dir = match &step.working_dir {
            Some(d) => self.cfg.workspace.join(d),
            None => self.cfg.workspace.clone(),
        };
        // Built from scratch: the agent's own environment never reaches a step.
        let mut env: BTreeMap<OsString, OsString> = [
            ("PATH", OsString::from(&self.cfg.path)),
            ("HOME", self.cfg.home().into()),
            ("TMPDIR", self.cfg.tmp().into()),
            ("LANG", "C.UTF-8".into()),
            ("CI", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), v))
        .collect();
        env.extend(step.env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
        // A root agent starts the step as PID 1 of its new namespace from
        // its spawner thread (one clone sharing the agent's memory until it
        // execs), else through a keeper process.
        let spawner = if iso.namespaces == Namespaces::Pid { PidNsSpawner::get() } else { None };
        let started = match spawner {
            Some(s) => {
                let spec =
                    StepSpec::new(OsStr::new(&program[0]), &argv, &dir, &env, iso.user, mounts).map_err(spawn_err)?;
                Started::direct(s.spawn(spec).await.map_err(in_mounts).map_err(spawn_err)?).map_err(spawn_err)?
            }
            None => {
                let mut cmd = Command::new(argv[0]);
                cmd.args(&argv[1..]);
                cmd.current_dir(dir)
                    .env_clear()
                    .envs(&env)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(false);
                if namespaced {
                    // A PID namespace whose init dies with the agent: the
                    // kernel then kills every process of the step, including
                    // double-forked daemons that left the process group. Its
                    // own /proc shows only the step's processes (no agent
                    // command lines or environments).
                    isolate_in_namespaces(&mut cmd, iso.user, userns, mounts);
                } else {
                    isolate_process_tree(&mut cmd, iso.user, true);
                }
                Started::tokio(cmd.spawn().map_err(in_mounts).map_err(spawn_err)?)
            }
        };
        // setsid made the shell the leader: its pid is the group's id.
        let Started { pid: pgid, stdout, stderr, wait } = started;
        let mut inner = self.inner.lock().expect("executor lock");
        if inner.killed {
            // Killed while it was being spawned.
            drop(inner);
            signal_group(pgid, Signal::SIGKILL);
            tokio::spawn(wait);
            return Err(SandboxError::Killed);
        }
        if let Err(e) = record(&self.cfg.state_dir, pgid) {
            tracing::warn!(pgid, error = %e, "cannot record step process group; it will not be reaped after an agent crash");
        }

        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let (done_tx, done_rx) = watch::channel(false);
        let killing = Arc::new(AtomicBool::new(false));
        inner.running = Some(Running { pgid, killing: killing.clone(), done: done_rx });
        drop(inner);

        let readers = [
            tokio::spawn(drain(stdout, OutputStream::Stdout, tx.clone())),
            tokio::spawn(drain(stderr, OutputStream::Stderr, tx.clone())),
        ];
        let inner = self.inner.clone();
        let state_dir = self.cfg.state_dir.clone();
        let name = step.name.clone();
        let grace = self.cfg.kill_grace;
        tokio::spawn(async move {
            let exit = match wait.await {
                Ok(st) => match (st.code(), st.signal()) {
                    (Some(c), _) => StepExit::Code(c),
                    (None, Some(s)) => StepExit::Signal(s),
                    (None, None) => StepExit::Code(-1),
                },
                Err(e) => {
                    tracing::error!(step = %name, error = %e, "cannot wait for step process");
                    StepExit::Code(-1)
                }
            };
            if !killing.load(Ordering::SeqCst) {
                // Leftovers of a finished step (`daemon &`) die with it.
                signal_group(pgid, Signal::SIGKILL);
            }
            // While killing, `kill` escalates to SIGKILL after its grace; we
            // escalate too, in case the caller dropped `kill` midway.
            let escalate_at = tokio::time::Instant::now() + grace;
            let mut pause = Duration::from_millis(1);
            while group_alive(pgid) {
                if tokio::time::Instant::now() >= escalate_at {
                    signal_group(pgid, Signal::SIGKILL);
                }
                // Usually gone within a millisecond or two: poll fast first.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(POLL);
            }
            forget(&state_dir, pgid);
            for r in readers {
                let abort = r.abort_handle();
                if tokio::time::timeout(DRAIN_AFTER_EXIT, r).await.is_err() {
                    tracing::warn!(step = %name, "a process outside the step's group holds its output pipe; ignoring further output");
                    abort.abort();
                }
            }
            // Free the executor before reporting the exit: a caller that
            // starts the next step on `Exited` must not find it busy.
            inner.lock().expect("executor lock").running = None;
            let _ = done_tx.send(true);
            let _ = tx.send(StepEvent::Exited(exit)).await;
        });
        Ok(StepHandle::new(rx))
    }

    /// Terminates the running step; `for_good`: and every later one.
    async fn kill_running(&self, for_good: bool) {
        let running = {
            let mut inner = self.inner.lock().expect("executor lock");
            inner.killed |= for_good;
            inner.running.clone()
        };
        let Some(mut r) = running else { return };
        r.killing.store(true, Ordering::SeqCst);
        signal_group(r.pgid, Signal::SIGTERM);
        let graceful = tokio::time::timeout(self.cfg.kill_grace, wait_gone(r.pgid)).await;
        if graceful.is_err() {
            tracing::info!(pgid = r.pgid, "step ignored SIGTERM; sending SIGKILL");
            signal_group(r.pgid, Signal::SIGKILL);
        }
        let _ = r.done.wait_for(|d| *d).await;
    }
}

/// A step's process as started either way: its pid (the group's id), its
/// output pipes (made 1 MiB large: a loud step fills that before it waits
/// for us, instead of waking the reader every 64 KiB; best effort) and its
/// exit.
struct Started {
    pid: i32,
    stdout: Pipe,
    stderr: Pipe,
    wait: BoxFuture<'static, std::io::Result<std::process::ExitStatus>>,
}

type Pipe = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

impl Started {
    fn tokio(mut child: tokio::process::Child) -> Started {
        let pid = child.id().expect("a just-spawned child has a pid") as i32;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        for fd in [stdout.as_fd(), stderr.as_fd()] {
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        }
        Started {
            pid,
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            wait: async move { child.wait().await }.boxed(),
        }
    }

    fn direct(child: StepChild) -> std::io::Result<Started> {
        let (pid, stdout, stderr, waiter) = child.into_parts();
        for fd in [stdout.as_fd(), stderr.as_fd()] {
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        }
        let pipes = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout)
            .and_then(|o| Ok((o, tokio::net::unix::pipe::Receiver::from_owned_fd(stderr)?)));
        match pipes {
            Ok((stdout, stderr)) => {
                Ok(Started { pid, stdout: Box::new(stdout), stderr: Box::new(stderr), wait: waiter.wait().boxed() })
            }
            Err(e) => {
                signal_group(pid, Signal::SIGKILL);
                tokio::spawn(waiter.wait());
                Err(e)
            }
        }
    }
}

async fn wait_gone(pgid: i32) {
    let mut pause = Duration::from_millis(1);
    while group_alive(pgid) {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL);
    }
}

/// Reads a pipe to its end. If the consumer went away, keep reading and
/// discard, so the step never blocks on a full pipe.
/// A read goes into a buffer of [`FIRST_READ`] bytes at first, not zeroed,
/// twice that after a read filled it, up to [`READ_BUF`]: a quiet step (most
/// of them) costs no large allocation per stream. Each read is handed on
/// without a copy, and its buffer is read into again once the consumer has
/// dropped it (issue 20: a fresh buffer per read, and the page faults of
/// touching it, were a visible share of a loud step's cost).
async fn drain<R: tokio::io::AsyncRead + Unpin>(mut pipe: R, stream: OutputStream, tx: mpsc::Sender<StepEvent>) {
    let mut want = FIRST_READ;
    // Buffers handed on, oldest first: one the consumer has dropped is ours again.
    let mut sent: std::collections::VecDeque<bytes::Bytes> = std::collections::VecDeque::new();
    let mut consumer = true;
    loop {
        let mut buf = reuse(&mut sent, want).unwrap_or_else(|| bytes::BytesMut::with_capacity(want));
        match pipe.read_buf(&mut bytes::BufMut::limit(&mut buf, want)).await {
            Ok(0) => return,
            Ok(n) => {
                if consumer {
                    let data = buf.freeze();
                    sent.push_back(data.clone());
                    if sent.len() > KEPT_READS {
                        sent.pop_front();
                    }
                    consumer = tx.send(StepEvent::Output { stream, data }).await.is_ok();
                }
                if n >= want && want < READ_BUF {
                    want = (want * 2).min(READ_BUF);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(stream = stream.as_str(), error = %e, "error reading step output");
                return;
            }
        }
    }
}

/// Read buffers [`drain`] keeps to read into again.
const KEPT_READS: usize = 4;

/// The oldest buffer handed on that nobody else holds any more, emptied, if
/// it is large enough for `want` bytes.
fn reuse(sent: &mut std::collections::VecDeque<bytes::Bytes>, want: usize) -> Option<bytes::BytesMut> {
    while let Some(b) = sent.pop_front() {
        match b.try_into_mut() {
            Ok(mut m) if m.capacity() >= want => {
                m.clear();
                return Some(m);
            }
            // Smaller than reads are now: let it go.
            Ok(_) => {}
            Err(b) => {
                sent.push_front(b);
                return None;
            }
        }
    }
    None
}

impl Executor for HostExecutor {
    fn prepare(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        async move {
            for dir in [
                self.cfg.workspace.clone(),
                self.cfg.home(),
                self.cfg.tmp(),
                self.cfg.shm(),
                self.cfg.state_dir.clone(),
            ] {
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|source| SandboxError::Prepare { path: dir.display().to_string(), source })?;
            }
            // The job's /tmp and /dev/shm, sticky and open to all like the
            // host's (a step may start processes as other users), inside
            // the attempt's private directory.
            for dir in [self.cfg.tmp(), self.cfg.shm()] {
                use std::os::unix::fs::PermissionsExt;
                tokio::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
                    .await
                    .map_err(|source| SandboxError::Prepare { path: dir.display().to_string(), source })?;
            }
            if let Some(user) = self.cfg.isolation.user {
                // The step's own tree; the agent's state dir stays the agent's.
                let cfg = self.cfg.clone();
                let handed = tokio::task::spawn_blocking(move || {
                    for dir in [&cfg.workspace, &cfg.attempt_dir, &cfg.home(), &cfg.tmp(), &cfg.shm()] {
                        let r = if dir == &cfg.attempt_dir {
                            std::os::unix::fs::lchown(dir, Some(user.uid), Some(user.gid))
                        } else if dir == &cfg.workspace && cfg.workspace_owned {
                            std::os::unix::fs::lchown(dir, Some(user.uid), Some(user.gid)).and_then(|()| {
                                let git = dir.join(".git");
                                if std::fs::symlink_metadata(&git).is_ok() { chown_tree(&git, user) } else { Ok(()) }
                            })
                        } else {
                            chown_tree(dir, user)
                        };
                        r.map_err(|source| SandboxError::Prepare { path: dir.display().to_string(), source })?;
                    }
                    Ok(())
                })
                .await
                .expect("chown task");
                handed?;
            }
            Ok(())
        }
        .boxed()
    }

    fn exec<'a>(&'a self, step: &'a StepRequest) -> BoxFuture<'a, Result<StepHandle, SandboxError>> {
        self.start(step).boxed()
    }

    fn kill(&self) -> BoxFuture<'_, ()> {
        self.kill_running(true).boxed()
    }

    fn interrupt(&self) -> BoxFuture<'_, ()> {
        self.kill_running(false).boxed()
    }

    fn cleanup(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        async move {
            self.kill_running(true).await;
            if self.cfg.keep_dirs {
                return Ok(());
            }
            // Moved aside at once and deleted in the background: deleting a
            // directory costs milliseconds on ext4 (up to ~100 ms while a
            // database syncs the same disk), which must not delay the
            // attempt's completion.
            let mut doomed = vec![];
            for dir in [self.cfg.home(), self.cfg.tmp(), self.cfg.shm()] {
                static N: AtomicU64 = AtomicU64::new(0);
                let aside = self.cfg.attempt_dir.join(format!(".removed-{}", N.fetch_add(1, Ordering::Relaxed)));
                match std::fs::rename(&dir, &aside) {
                    Ok(()) => doomed.push(aside),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(SandboxError::Cleanup { path: dir.display().to_string(), source }),
                }
            }
            if !doomed.is_empty() {
                tokio::task::spawn_blocking(move || {
                    for d in doomed {
                        if let Err(e) = remove_tree(&d) {
                            tracing::warn!(dir = %d.display(), error = %e, "cannot remove a step's home or tmp");
                        }
                    }
                });
            }
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_buffer_is_read_into_again_only_once_its_reader_dropped_it() {
        let mut sent = std::collections::VecDeque::new();
        let mut b = bytes::BytesMut::with_capacity(64);
        b.extend_from_slice(b"abc");
        let data = b.freeze();
        let at = data.as_ptr();
        sent.push_back(data.clone());
        assert!(reuse(&mut sent, 64).is_none(), "its reader still holds it");
        assert_eq!(sent.len(), 1, "kept for later");
        drop(data);
        let again = reuse(&mut sent, 64).expect("nobody else holds it");
        assert_eq!(again.as_ptr(), at, "the same buffer");
        assert!(again.is_empty() && again.capacity() >= 64);
        sent.push_back(again.freeze());
        assert!(reuse(&mut sent, 128).is_none(), "too small for the reads now");
        assert!(sent.is_empty(), "and let go");
    }

    /// Every byte arrives intact while the consumer holds some reads and
    /// drops others: a buffer is never read into while someone holds it.
    #[tokio::test]
    async fn output_arrives_intact_while_buffers_are_reused() {
        let input: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let (mut w, r) = tokio::io::duplex(64 * 1024);
        let (tx, mut rx) = mpsc::channel(4);
        let reader = tokio::spawn(drain(r, OutputStream::Stdout, tx));
        let feed = input.clone();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in feed.chunks(70_001) {
                w.write_all(piece).await.unwrap();
            }
        });
        let (mut held, mut out, mut reads) = (vec![], 0, 0);
        while let Some(StepEvent::Output { data, .. }) = rx.recv().await {
            assert_eq!(&data[..], &input[out..out + data.len()], "read {reads} as written");
            if reads % 3 == 0 {
                held.push((out, data.clone()));
            }
            out += data.len();
            reads += 1;
        }
        writer.await.unwrap();
        reader.await.unwrap();
        assert_eq!(out, input.len(), "every byte");
        assert!(reads > 12, "many reads: {reads}");
        for (at, b) in &held {
            assert_eq!(&b[..], &input[*at..at + b.len()], "a held read changed under its holder");
        }
    }
}
