//! Process-tree setup of a step, run in the child between fork and exec.
//!
//! The only unsafe code of the crate: `pre_exec` runs in the forked child of
//! a multi-threaded process, where only async-signal-safe calls are allowed.
#![allow(unsafe_code)]

use std::io;
use tokio::process::Command;

/// The unprivileged user a root agent runs steps as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepUser {
    pub uid: u32,
    pub gid: u32,
}

/// Makes the child a session (and process group) leader, so that the whole
/// tree of the step can be signalled as one group, and asks the kernel to
/// SIGKILL it when its parent dies, so that a crashed agent leaves no step
/// running (grandchildren are caught by [`crate::reap_orphans`] at restart).
/// The step's umask is 022 (the agent's own is 077; the sandbox's
/// directories are private already).
///
/// With `user`, the child also sets `no_new_privs` (a setuid binary gains
/// nothing) and, when `switch` is true, drops to that user itself (no
/// supplementary groups) *before* asking for the parent-death signal, which
/// a uid change clears; with namespaces, `setpriv` switches inside them
/// (`switch` false) and sets the signal again.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked exits: spawn steps
/// from async tasks (tokio worker threads live as long as the runtime), not
/// from `spawn_blocking` threads, which are retired when idle.
pub(crate) fn isolate_process_tree(cmd: &mut Command, user: Option<StepUser>, switch: bool) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes raw syscalls (setsid, prctl, getppid,
    // umask, setgroups, setgid, setuid), which are async-signal-safe, and
    // builds io::Errors from raw errno values without allocating; it touches
    // no locks or memory shared with other threads of the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            libc::umask(0o022);
            // The user switch first: changing the uid clears the
            // parent-death signal.
            if let Some(u) = user {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if switch
                    && (libc::setgroups(0, std::ptr::null()) == -1
                        || libc::setgid(u.gid) == -1
                        || libc::setuid(u.uid) == -1)
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then the
            // death signal will never come, so refuse to run.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// [`isolate_process_tree`] plus new PID and mount namespaces, made in the
/// forked child itself rather than by exec'ing util-linux's `unshare` and
/// `setpriv` (two fewer programs to load per step; issue 20). What `unshare
/// --pid --fork --kill-child=SIGKILL --mount-proc` and `setpriv --reuid
/// --regid --clear-groups --pdeathsig SIGKILL` did is done the same way:
///
/// - the child becomes a session leader with a parent-death signal (as in
///   [`isolate_process_tree`]), sets `no_new_privs` when `user` is given,
///   and unshares its PID and mount namespaces;
/// - it forks: the parent stays outside as the namespace's keeper (it
///   closes every descriptor, so neither the output pipes nor the spawn's
///   error pipe wait on it, ignores SIGINT and SIGTERM like `unshare`,
///   waits for its child and exits as it did, a signal re-raised);
/// - the grandchild, PID 1 of the namespace, gets SIGKILL when the keeper
///   dies (so the kernel kills the whole namespace with the agent), makes
///   its mounts private, mounts a fresh `/proc`, switches to `user` (no
///   supplementary groups; real, effective and saved ids), sets its
///   parent-death signal again (a uid change clears it) and execs the step.
pub(crate) fn isolate_in_namespaces(cmd: &mut Command, user: Option<StepUser>) {
    // SAFETY: see `namespace_child`: raw async-signal-safe syscalls only.
    unsafe {
        cmd.pre_exec(namespace_child(user));
    }
}

/// Sets up `cmd` to run as PID 1 of the new namespace [`PidNsSpawner`]
/// spawns it in ([`pid1_child`]).
pub(crate) fn isolate_as_pid1(cmd: &mut Command, user: Option<StepUser>, alive: &ParentAlive) {
    // SAFETY: see `pid1_child`: raw async-signal-safe syscalls only.
    unsafe {
        cmd.pre_exec(pid1_child(user, alive));
    }
}

/// Whether [`isolate_in_namespaces`] works here (it needs root, and a
/// kernel or container that allows new PID and mount namespaces): runs
/// `/bin/true` so, once.
pub(crate) fn namespaces_work() -> bool {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    // SAFETY: see `namespace_child`.
    unsafe {
        cmd.pre_exec(namespace_child(None));
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// The child-side setup of [`isolate_in_namespaces`], for any `pre_exec`
/// (tokio's or std's `Command`). It runs between fork and exec: only raw
/// syscalls (setsid, umask, prctl, getppid, sigprocmask, unshare, fork,
/// close_range, waitpid, signal, kill, _exit, mount, setgroups, setresgid,
/// setresuid), no allocation, no locks.
pub(crate) fn namespace_child(user: Option<StepUser>) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let parent = std::process::id() as libc::pid_t;
    move || {
        // SAFETY: async-signal-safe syscalls on values owned by this frame.
        unsafe {
            lead_session(user.is_some())?;
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) == -1 {
                return Err(io::Error::last_os_error());
            }
            // SIGINT and SIGTERM are blocked across the fork: the keeper
            // never dies of them (it waits for the namespace's end), the
            // step unblocks them at once.
            let mut term: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut term);
            libc::sigaddset(&mut term, libc::SIGINT);
            libc::sigaddset(&mut term, libc::SIGTERM);
            if libc::sigprocmask(libc::SIG_BLOCK, &term, &mut old) == -1 {
                return Err(io::Error::last_os_error());
            }
            let pid = libc::fork();
            if pid == -1 {
                return Err(io::Error::last_os_error());
            }
            if pid > 0 {
                keep_namespace(pid);
            }
            // PID 1 of the new namespace.
            if libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) == -1 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            settle_as_pid1(user)
        }
    }
}

/// What a namespaced step's child does first: it leads its own session
/// (its whole tree is one process group), gets umask 022, `no_new_privs`
/// when it will run as the step user, and SIGKILL when its parent dies.
///
/// # Safety
/// Only in a forked child, between fork and exec: raw syscalls only.
unsafe fn lead_session(step_user: bool) -> io::Result<()> {
    // SAFETY: async-signal-safe syscalls on constants.
    unsafe {
        if libc::setsid() == -1 {
            return Err(io::Error::last_os_error());
        }
        libc::umask(0o022);
        if step_user && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What PID 1 of a step's new namespaces does last, either way it got
/// there: its mounts private, a fresh `/proc`, the step user (no
/// supplementary groups; real, effective and saved ids) and the
/// parent-death signal again (a uid change clears it).
///
/// # Safety
/// Only in a forked child, between fork and exec: raw syscalls only.
unsafe fn settle_as_pid1(user: Option<StepUser>) -> io::Result<()> {
    // SAFETY: async-signal-safe syscalls on constants and copied values.
    unsafe {
        let none = c"none".as_ptr();
        if libc::mount(none, c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) == -1 {
            return Err(io::Error::last_os_error());
        }
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) == -1 {
            return Err(io::Error::last_os_error());
        }
        if let Some(u) = user {
            if libc::setgroups(0, std::ptr::null()) == -1
                || libc::setresgid(u.gid, u.gid, u.gid) == -1
                || libc::setresuid(u.uid, u.uid, u.uid) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // Cleared by the uid change.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The keeper of a step's namespaces (the first child, outside them):
/// waits for the step's shell and ends as it did. Never returns.
///
/// # Safety
/// Only in a forked child, between fork and exec.
unsafe fn keep_namespace(child: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe syscalls; the process ends here.
    unsafe {
        // Hold nothing open: the step's output pipes reach EOF when the
        // step's own processes close them, and the spawning parent's
        // exec-error pipe when the step execs.
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) == -1 {
            for fd in 0..1024 {
                libc::close(fd);
            }
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                break;
            }
            if r == -1 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 1 })
    }
}

/// Steps spawned as PID 1 of a new PID namespace straight from the agent
/// (issue 20: no keeper process, so the agent is forked once per step
/// instead of twice). `unshare(CLONE_NEWPID)` gives the *calling thread's*
/// next child a new namespace; a thread kept for this returns that to its
/// own namespace (`setns`) and asks for a new one before each spawn, and
/// forks nothing else. Root agents only (both calls need `CAP_SYS_ADMIN`);
/// elsewhere, or when the probe fails, steps keep the keeper
/// ([`isolate_in_namespaces`]).
pub(crate) struct PidNsSpawner {
    jobs: std::sync::Mutex<std::sync::mpsc::Sender<SpawnJob>>,
}

type SpawnJob = (Command, tokio::runtime::Handle, tokio::sync::oneshot::Sender<io::Result<tokio::process::Child>>);

impl PidNsSpawner {
    /// The agent's spawner, if steps can be started this way here (checked
    /// once, by running `/bin/true` so).
    pub(crate) fn get() -> Option<&'static PidNsSpawner> {
        static SPAWNER: std::sync::OnceLock<Option<PidNsSpawner>> = std::sync::OnceLock::new();
        SPAWNER
            .get_or_init(|| match PidNsSpawner::start() {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::info!(error = %e, "steps start through a keeper process in their PID namespace");
                    None
                }
            })
            .as_ref()
    }

    fn start() -> io::Result<PidNsSpawner> {
        if !nix::unistd::geteuid().is_root() {
            return Err(io::Error::other("not root"));
        }
        let own = std::fs::File::open("/proc/self/ns/pid")?;
        let (jobs, queue) = std::sync::mpsc::channel::<SpawnJob>();
        let (ready, probed) = std::sync::mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new().name("kiln-spawner".into()).spawn(move || {
            let probe = new_pid_namespace(&own).and_then(|()| {
                use std::os::unix::process::CommandExt;
                let alive = ParentAlive::new()?;
                let mut cmd = std::process::Command::new("/bin/true");
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                // SAFETY: see `pid1_child`.
                unsafe {
                    cmd.pre_exec(pid1_child(None, &alive));
                }
                let status = cmd.status()?;
                drop(alive);
                if status.success() { Ok(()) } else { Err(io::Error::other(format!("/bin/true as PID 1: {status}"))) }
            });
            let ok = probe.is_ok();
            let _ = ready.send(probe);
            if !ok {
                return;
            }
            // Lives as long as the agent: a step's parent-death signal
            // fires when the thread that forked it ends.
            for (mut cmd, runtime, reply) in queue {
                let _enter = runtime.enter();
                let spawned = new_pid_namespace(&own).and_then(|()| cmd.spawn());
                // Nobody waits for it any more (the caller was dropped): a
                // step nobody tracks must not run, so its namespace goes.
                if let Err(Ok(child)) = reply.send(spawned)
                    && let Some(pid) = child.id()
                {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGKILL);
                }
            }
        })?;
        probed.recv().map_err(|_| io::Error::other("the spawner thread ended"))??;
        Ok(PidNsSpawner { jobs: std::sync::Mutex::new(jobs) })
    }

    /// Spawns `cmd` (set up with [`pid1_child`]) as PID 1 of a new PID
    /// namespace.
    pub(crate) async fn spawn(&self, cmd: Command) -> io::Result<tokio::process::Child> {
        let gone = || io::Error::other("the step spawner thread is gone");
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = (cmd, tokio::runtime::Handle::current(), reply);
        self.jobs.lock().expect("spawner").send(job).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Points this thread's next child at a new PID namespace.
fn new_pid_namespace(own: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: two syscalls on a descriptor this thread holds.
    unsafe {
        // Back to our own namespace first: a second unshare from a thread
        // whose children already go elsewhere is refused.
        if libc::setns(own.as_raw_fd(), libc::CLONE_NEWPID) == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::unshare(libc::CLONE_NEWPID) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A close-on-exec pipe the agent holds while it spawns a step: PID 1 of a
/// new namespace cannot ask `getppid()` whether its parent is still there
/// (it says 0), so the child closes its copy of the write end and checks
/// that the read end has not hung up, i.e. that the agent (which holds the
/// other copy) has not died before the parent-death signal was set.
pub(crate) struct ParentAlive {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl ParentAlive {
    pub(crate) fn new() -> io::Result<ParentAlive> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(ParentAlive { read, write })
    }
}

/// The child-side setup of a step spawned by [`PidNsSpawner`], PID 1 of its
/// new PID namespace: what [`namespace_child`]'s grandchild does, without
/// the keeper. Only raw async-signal-safe syscalls (setsid, umask, prctl,
/// close, poll, unshare, mount, setgroups, setresgid, setresuid).
pub(crate) fn pid1_child(
    user: Option<StepUser>,
    alive: &ParentAlive,
) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    use std::os::fd::AsRawFd;
    let (read, write) = (alive.read.as_raw_fd(), alive.write.as_raw_fd());
    move || {
        // SAFETY: async-signal-safe syscalls on values owned by this frame.
        unsafe {
            lead_session(user.is_some())?;
            libc::close(write);
            let mut fd = libc::pollfd { fd: read, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut fd, 1, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                // The agent died before the death signal was set: it will
                // never come, so refuse to run.
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            libc::close(read);
            if libc::unshare(libc::CLONE_NEWNS) == -1 {
                return Err(io::Error::last_os_error());
            }
            settle_as_pid1(user)
        }
    }
}
