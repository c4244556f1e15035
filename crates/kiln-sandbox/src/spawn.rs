//! Process-tree setup of a step, run in the child between fork (or clone)
//! and exec.
//!
//! The only unsafe code of the crate: `pre_exec` runs in the forked child of
//! a multi-threaded process, where only async-signal-safe calls are allowed;
//! a root agent's [`PidNsSpawner`] clones steps that share the agent's
//! memory until they exec, where only raw system calls on values prepared
//! beforehand are.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use tokio::process::Command;

use crate::mounts::{MAX_SOURCES, MountOp, StepMounts};

/// The unprivileged user a root agent runs steps as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepUser {
    pub uid: u32,
    pub gid: u32,
}

/// The agent's CPU priority, for a step to keep across its `setsid`.
///
/// A step leads a session of its own, and on a kernel with scheduler
/// autogroups (`/proc/sys/kernel/sched_autogroup_enabled`, the default of
/// most distributions) a new session is a new scheduling group at nice 0,
/// whatever the nice value of its processes: an agent started with
/// `nice -n 10` would run every step at the weight of a whole
/// interactive session, beside the server it shares a host with (issue 20:
/// 20 such steps and their agents took the CPU from the server for about a
/// second, and its write-to-browser latency with it). So the child sets its
/// new group's nice value to the agent's own. Nothing is written when that
/// is 0 (the group's default), so an agent at the default priority makes no
/// extra system call per step.
///
/// Best effort: without autogroups there is no file to write (and the
/// step's processes keep the agent's nice value anyway); an unprivileged
/// agent may set a group's nice value at most ten times a second (the
/// kernel answers EAGAIN beyond that), and a group left at 0 is how every
/// step ran before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionNice {
    /// The value as ASCII decimal (-20 to 19).
    text: [u8; 3],
    len: usize,
    /// Above the caller's own (`--step-nice`): the step process lowers its
    /// own priority too.
    raise: Option<libc::c_int>,
}

/// The lowest priority steps run at (`kiln agent --step-nice`, issue 47): a
/// step's session and process get at least this nice value. 0: the agent's
/// own.
static STEP_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Sets the nice value (0 to 19) every step spawned from now on runs at, at
/// least: on a machine the server shares with its agents, the server's log
/// path and the agents' own work come before steps that keep every core
/// busy (issue 47: write→SSE p99 907 ms with 20 loud steps at nice 0).
pub fn set_step_nice(nice: i32) {
    STEP_NICE.store(nice.clamp(0, 19), std::sync::atomic::Ordering::Relaxed);
}

impl SessionNice {
    /// The nice value a step spawned by the calling thread gets: the
    /// thread's own (a forked child inherits the forking thread's), or
    /// [`set_step_nice`]'s when that is higher; `None` when it is 0.
    pub(crate) fn of_caller() -> Option<SessionNice> {
        // SAFETY: getpriority reads the caller's own value; PRIO_PROCESS
        // with who = 0 cannot fail.
        let own = unsafe { libc::getpriority(libc::PRIO_PROCESS as _, 0) };
        let floor = STEP_NICE.load(std::sync::atomic::Ordering::Relaxed);
        let mut n = Self::new(own.max(floor))?;
        n.raise = (floor > own).then_some(floor);
        Some(n)
    }

    fn new(nice: libc::c_int) -> Option<SessionNice> {
        if nice == 0 || !(-20..=19).contains(&nice) {
            return None;
        }
        let digits = nice.to_string();
        let mut text = [0u8; 3];
        text[..digits.len()].copy_from_slice(digits.as_bytes());
        Some(SessionNice { text, len: digits.len(), raise: None })
    }

    /// Sets the calling process's autogroup to this nice value (and the
    /// process's own, when it is above the caller's); errors are ignored
    /// (see the type's doc).
    ///
    /// # Safety
    /// Callable between fork and exec: raw syscalls on a static path and
    /// this value's bytes only.
    unsafe fn apply(&self) {
        // SAFETY: setpriority on the calling process; open, write and close
        // on a static C string and owned bytes.
        unsafe {
            if let Some(n) = self.raise {
                libc::setpriority(libc::PRIO_PROCESS as _, 0, n);
            }
            let fd = libc::open(c"/proc/self/autogroup".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, self.text.as_ptr().cast(), self.len);
                libc::close(fd);
            }
        }
    }
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
    let nice = SessionNice::of_caller();
    // SAFETY: the closure only makes raw syscalls (setsid, prctl, getppid,
    // umask, setgroups, setgid, setuid, rt_sigaction, rt_sigprocmask, and
    // open/write/close of /proc/self/autogroup), which are
    // async-signal-safe, and builds io::Errors from raw errno values
    // without allocating; it touches no locks or memory shared with other
    // threads of the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            // Before the user switch: the group's nice value is set as the
            // agent's user.
            if let Some(n) = nice {
                n.apply();
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
            default_signals();
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
///
/// With `userns` (a non-root agent: its uid and gid), the child first
/// unshares a user namespace too and maps those ids to themselves (what
/// `unshare --user --map-user --map-group` did): the namespaces' setup has
/// its capabilities there, the step none (it execs as a non-zero uid).
/// `mounts` are made by the namespace's PID 1 after `/proc`.
pub(crate) fn isolate_in_namespaces(
    cmd: &mut Command,
    user: Option<StepUser>,
    userns: Option<(u32, u32)>,
    mounts: StepMounts,
) {
    // SAFETY: see `namespace_child`: raw async-signal-safe syscalls only.
    unsafe {
        cmd.pre_exec(namespace_child(user, userns, mounts));
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
        cmd.pre_exec(namespace_child(None, None, StepMounts::default()));
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// Whether [`isolate_in_namespaces`] with a user namespace works here (a
/// non-root agent, a kernel that allows unprivileged user namespaces), with
/// the mounts every step gets (an empty tmpfs over a directory, a bind):
/// runs `/bin/true` so, once.
pub(crate) fn user_namespaces_work() -> bool {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let probe = std::env::temp_dir().join(format!("kiln-userns-probe-{}-{nanos}", std::process::id()));
    let (a, b) = (probe.join("a"), probe.join("b"));
    let works = std::fs::create_dir_all(&a).and_then(|_| std::fs::create_dir(&b)).is_ok()
        && match StepMounts::plan(&[a], &[(probe.clone(), b.to_str().unwrap_or("/nonexistent"))], &[]) {
            Ok(mounts) => {
                let mut cmd = std::process::Command::new("/bin/true");
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                // SAFETY: see `namespace_child`.
                unsafe {
                    cmd.pre_exec(namespace_child(None, Some((uid, gid)), mounts));
                }
                cmd.status().is_ok_and(|s| s.success())
            }
            Err(_) => false,
        };
    let _ = std::fs::remove_dir_all(&probe);
    works
}

/// The child-side setup of [`isolate_in_namespaces`], for any `pre_exec`
/// (tokio's or std's `Command`). It runs between fork and exec: only raw
/// syscalls (setsid, umask, prctl, getppid, sigprocmask, unshare, fork,
/// close_range, waitpid, signal, kill, _exit, mount, setgroups, setresgid,
/// setresuid, rt_sigaction, rt_sigprocmask, and open/write/close of
/// /proc/self/autogroup), no allocation, no locks.
pub(crate) fn namespace_child(
    user: Option<StepUser>,
    userns: Option<(u32, u32)>,
    mounts: StepMounts,
) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let parent = std::process::id() as libc::pid_t;
    let nice = SessionNice::of_caller();
    // Prepared here: the child may not allocate.
    let maps =
        userns.map(|(uid, gid)| (format!("{uid} {uid} 1\n").into_bytes(), format!("{gid} {gid} 1\n").into_bytes()));
    move || {
        // SAFETY: async-signal-safe syscalls on values owned by this frame.
        unsafe {
            lead_session(user.is_some(), nice)?;
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            let newuser = if maps.is_some() { libc::CLONE_NEWUSER } else { 0 };
            if libc::unshare(newuser | libc::CLONE_NEWPID | libc::CLONE_NEWNS) == -1 {
                return Err(io::Error::last_os_error());
            }
            if let Some((uid_map, gid_map)) = &maps {
                write_proc_self(c"/proc/self/setgroups", b"deny")?;
                write_proc_self(c"/proc/self/uid_map", uid_map)?;
                write_proc_self(c"/proc/self/gid_map", gid_map)?;
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
            settle_as_pid1(user, &mounts)?;
            default_signals();
            Ok(())
        }
    }
}

/// What a namespaced step's child does first: it leads its own session
/// (its whole tree is one process group) at the agent's priority
/// ([`SessionNice`]), gets umask 022, `no_new_privs` when it will run as
/// the step user, and SIGKILL when its parent dies.
///
/// # Safety
/// Only in a forked child, between fork and exec: raw syscalls only.
unsafe fn lead_session(step_user: bool, nice: Option<SessionNice>) -> io::Result<()> {
    // SAFETY: async-signal-safe syscalls on constants.
    unsafe {
        if libc::setsid() == -1 {
            return Err(io::Error::last_os_error());
        }
        if let Some(n) = nice {
            n.apply();
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

/// Writes `bytes` to a file of `/proc/self` (a user namespace's maps).
///
/// # Safety
/// Only in a forked child, between fork and exec: raw syscalls only.
unsafe fn write_proc_self(path: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: open, write and close on a C string and a slice of this frame.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd == -1 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let e = io::Error::last_os_error();
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(e);
        }
        Ok(())
    }
}

/// `/proc/self/fd/<fd>` into `buf`, NUL-terminated, without allocating.
fn fd_path(buf: &mut [u8; 32], fd: libc::c_int) -> *const libc::c_char {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.max(0) as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    buf.as_ptr().cast()
}

/// Makes a step's [`StepMounts`] in its new mount namespace, in order;
/// the first failure stops the step from running.
///
/// # Safety
/// Only in a forked (or `CLONE_VM`) child between fork and exec, in its
/// own mount namespace: raw syscalls on values prepared beforehand.
unsafe fn make_mounts(m: &StepMounts) -> io::Result<()> {
    let mut fds: [libc::c_int; MAX_SOURCES] = [-1; MAX_SOURCES];
    // SAFETY: closes only descriptors this function opened.
    let result = unsafe { mounts_with(m, &mut fds) };
    for fd in fds {
        if fd >= 0 {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }
    result
}

/// [`make_mounts`]'s work: every source opened first (in this mount
/// namespace, before anything covers it, no link followed in its last
/// component) into `fds`, then the mounts in order.
///
/// # Safety
/// As [`make_mounts`].
unsafe fn mounts_with(m: &StepMounts, fds: &mut [libc::c_int; MAX_SOURCES]) -> io::Result<()> {
    let null: *const libc::c_char = std::ptr::null();
    let err = || Err(io::Error::last_os_error());
    let walk = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: system calls on C strings the parent prepared and on
    // descriptors opened here (closed by the caller, or here at once).
    unsafe {
        let mut n = 0;
        for op in &m.ops {
            if let MountOp::Bind { source, .. } | MountOp::Reexpose { source, .. } = op {
                if n == MAX_SOURCES {
                    return Err(io::Error::from_raw_os_error(libc::E2BIG));
                }
                fds[n] = libc::open(source.as_ptr(), walk);
                if fds[n] == -1 {
                    return err();
                }
                n += 1;
            }
        }
        let mut next_source = 0;
        let mut path = [0u8; 32];
        let mut target_path = [0u8; 32];
        for op in &m.ops {
            match op {
                MountOp::HideDir(target) => {
                    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    let data = c"size=4k,mode=0555";
                    if libc::mount(
                        c"kiln-hidden".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        flags,
                        data.as_ptr().cast(),
                    ) == -1
                    {
                        return err();
                    }
                }
                MountOp::HideFile(target) => {
                    if libc::mount(c"/dev/null".as_ptr(), target.as_ptr(), null, libc::MS_BIND, std::ptr::null()) == -1
                    {
                        return err();
                    }
                }
                MountOp::Bind { target, .. } => {
                    let source = fd_path(&mut path, fds[next_source]);
                    next_source += 1;
                    if libc::mount(source, target.as_ptr(), null, libc::MS_BIND, std::ptr::null()) == -1 {
                        return err();
                    }
                }
                MountOp::Reexpose { under, components, .. } => {
                    let source = fd_path(&mut path, fds[next_source]);
                    next_source += 1;
                    let mut dir = libc::open(under.as_ptr(), walk);
                    if dir == -1 {
                        return err();
                    }
                    for name in components {
                        let mut next = libc::openat(dir, name.as_ptr(), walk);
                        if next == -1 && *libc::__errno_location() == libc::ENOENT {
                            if libc::mkdirat(dir, name.as_ptr(), 0o755) == -1
                                && *libc::__errno_location() != libc::EEXIST
                            {
                                let e = io::Error::last_os_error();
                                libc::close(dir);
                                return Err(e);
                            }
                            next = libc::openat(dir, name.as_ptr(), walk);
                        }
                        let e = io::Error::last_os_error();
                        libc::close(dir);
                        if next == -1 {
                            return Err(e);
                        }
                        dir = next;
                    }
                    let target = fd_path(&mut target_path, dir);
                    let r = libc::mount(source, target, null, libc::MS_BIND, std::ptr::null());
                    let e = io::Error::last_os_error();
                    libc::close(dir);
                    if r == -1 {
                        return Err(e);
                    }
                }
            }
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
unsafe fn settle_as_pid1(user: Option<StepUser>, mounts: &StepMounts) -> io::Result<()> {
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
        make_mounts(mounts)?;
        if let Some(u) = user {
            // Raw system calls: glibc's wrappers would also switch the other
            // threads they know of, which in a `CLONE_VM` child are the
            // agent's ([`exec_child`]).
            let empty: *const libc::gid_t = std::ptr::null();
            if libc::syscall(libc::SYS_setgroups, 0, empty) == -1
                || libc::syscall(libc::SYS_setresgid, u.gid, u.gid, u.gid) == -1
                || libc::syscall(libc::SYS_setresuid, u.uid, u.uid, u.uid) == -1
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

/// Steps spawned as PID 1 of a new PID namespace straight from the agent,
/// without copying the agent (issue 20).
///
/// `unshare(CLONE_NEWPID)` gives the *calling thread's* next child a new
/// namespace; a thread kept for this returns that to its own namespace
/// (`setns`) and asks for a new one before each spawn, and starts nothing
/// else. The child is cloned with `CLONE_VM | CLONE_VFORK`, as
/// `posix_spawn` does: it runs on a stack of its own in the agent's memory
/// while the spawner thread waits for its `execve`, so the agent's page
/// tables are neither copied for it nor torn down after it, and the agent
/// takes no copy-on-write faults on its own pages after each spawn. Such a
/// child may only make system calls on values prepared beforehand
/// ([`StepSpec`], [`exec_child`]). Root agents only (both namespace calls
/// need `CAP_SYS_ADMIN`); elsewhere, or when the probe fails, steps keep
/// the keeper ([`isolate_in_namespaces`]).
pub(crate) struct PidNsSpawner {
    jobs: std::sync::Mutex<std::sync::mpsc::Sender<SpawnJob>>,
}

type SpawnJob = (StepSpec, tokio::sync::oneshot::Sender<io::Result<StepChild>>);

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
            let probe = Cloner::new(own).and_then(|cloner| {
                let spec = StepSpec::new(
                    OsStr::new("/bin/true"),
                    [OsStr::new("/bin/true")],
                    Path::new("/"),
                    &BTreeMap::new(),
                    None,
                    StepMounts::default(),
                )?;
                let status = cloner.spawn(&spec)?.wait_blocking()?;
                if status.success() {
                    Ok(cloner)
                } else {
                    Err(io::Error::other(format!("/bin/true as PID 1: {status}")))
                }
            });
            let cloner = match probe {
                Ok(c) => {
                    let _ = ready.send(Ok(()));
                    c
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            // Lives as long as the agent: a step's parent-death signal
            // fires when the thread that started it ends.
            for (spec, reply) in queue {
                // Nobody waits for it any more (the caller was dropped): a
                // step nobody tracks must not run, so its namespace goes.
                if let Err(Ok(child)) = reply.send(cloner.spawn(&spec)) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.pid), nix::sys::signal::SIGKILL);
                    let _ = child.wait_blocking();
                }
            }
        })?;
        probed.recv().map_err(|_| io::Error::other("the spawner thread ended"))??;
        Ok(PidNsSpawner { jobs: std::sync::Mutex::new(jobs) })
    }

    /// Starts `spec` as PID 1 of a new PID namespace.
    pub(crate) async fn spawn(&self, spec: StepSpec) -> io::Result<StepChild> {
        let gone = || io::Error::other("the step spawner thread is gone");
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs.lock().expect("spawner").send((spec, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A step to start through [`PidNsSpawner`]: everything its child needs,
/// made before the clone, because the child shares the agent's memory
/// until it execs and must not allocate.
pub(crate) struct StepSpec {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    user: Option<StepUser>,
    mounts: StepMounts,
}

impl StepSpec {
    /// `program` with `argv` (its first element is `argv[0]`) in `cwd`, with
    /// exactly `env`, as `user`. A program without a slash is looked up in
    /// `env`'s `PATH` (relative entries from `cwd`), as `Command` does.
    pub(crate) fn new<A: AsRef<OsStr>>(
        program: &OsStr,
        argv: impl IntoIterator<Item = A>,
        cwd: &Path,
        env: &BTreeMap<OsString, OsString>,
        user: Option<StepUser>,
        mounts: StepMounts,
    ) -> io::Result<StepSpec> {
        use std::os::unix::ffi::OsStrExt;
        let c = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a step's command or environment")
            })
        };
        let program = resolve(program, env.get(OsStr::new("PATH")).map(OsString::as_os_str), cwd)?;
        let envp = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push("=");
                kv.push(v);
                c(&kv)
            })
            .collect::<io::Result<_>>()?;
        Ok(StepSpec {
            program: c(program.as_os_str())?,
            argv: argv.into_iter().map(|a| c(a.as_ref())).collect::<io::Result<_>>()?,
            envp,
            cwd: c(cwd.as_os_str())?,
            user,
            mounts,
        })
    }
}

/// Where `program` is: itself with a slash, else the first executable file
/// of that name in `path`.
fn resolve(program: &OsStr, path: Option<&OsStr>, cwd: &Path) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    if program.as_bytes().contains(&b'/') {
        return Ok(program.into());
    }
    for dir in std::env::split_paths(path.unwrap_or_default()) {
        let candidate = cwd.join(dir).join(program);
        if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
            return Ok(candidate);
        }
    }
    Err(io::Error::new(io::ErrorKind::NotFound, format!("{} not found in the step's PATH", program.to_string_lossy())))
}

/// A step started by [`PidNsSpawner`]: its pid (PID 1 inside its
/// namespace), a pidfd to wait on, and the read ends of its output pipes.
pub(crate) struct StepChild {
    pid: i32,
    pidfd: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl StepChild {
    /// Splits off the pidfd: the rest is read while [`ExitWaiter::wait`]
    /// waits.
    pub(crate) fn into_parts(self) -> (i32, OwnedFd, OwnedFd, ExitWaiter) {
        (self.pid, self.stdout, self.stderr, ExitWaiter { pidfd: self.pidfd })
    }

    fn wait_blocking(self) -> io::Result<std::process::ExitStatus> {
        loop {
            if let Some(st) = reap(&self.pidfd, 0)? {
                return Ok(st);
            }
        }
    }
}

/// Waits for a [`StepChild`] to end, and reaps it.
pub(crate) struct ExitWaiter {
    pidfd: OwnedFd,
}

impl ExitWaiter {
    pub(crate) async fn wait(self) -> io::Result<std::process::ExitStatus> {
        // SAFETY: an OwnedFd: open, and the same descriptor for as long as
        // the AsyncFd owns it.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(self.pidfd, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        loop {
            let mut ready = fd.readable().await?;
            match reap(fd.get_ref(), libc::WNOHANG)? {
                Some(st) => return Ok(st),
                None => ready.clear_ready(),
            }
        }
    }
}

/// `waitid` on a pidfd: the exit status, or none yet (with `WNOHANG`).
fn reap(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    loop {
        // SAFETY: a zeroed siginfo_t filled in by the kernel, on a pidfd we own.
        let (r, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED | flags);
            (r, info)
        };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: filled in by waitid for a child that changed state.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        return Ok(Some(std::process::ExitStatus::from_raw(raw)));
    }
}

/// The spawner thread's means: its own PID namespace (to return to), a
/// stack for the children, `/dev/null` for their stdin, and the
/// [`ParentAlive`] pipe (one for all spawns: they run one at a time, and
/// each child closes its copies before the next clone).
struct Cloner {
    own: std::fs::File,
    stack: Stack,
    null: OwnedFd,
    alive: ParentAlive,
}

/// Bytes of a child's stack, above one guard page. The child only runs
/// [`exec_child`]'s system calls on it.
const CHILD_STACK: usize = 256 * 1024;

struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only used by the spawner thread (and its
// children, while that thread waits for them).
unsafe impl Send for Stack {}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unused once the Cloner goes.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

impl Cloner {
    fn new(own: std::fs::File) -> io::Result<Cloner> {
        let page = 4096;
        let len = CHILD_STACK + page;
        // SAFETY: a fresh private anonymous mapping; its lowest page is made
        // inaccessible, so an overflow faults instead of writing below.
        let base = unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            if libc::mprotect(base, page, libc::PROT_NONE) == -1 {
                let e = io::Error::last_os_error();
                libc::munmap(base, len);
                return Err(e);
            }
            base
        };
        let stack = Stack { base, len };
        let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?.into();
        Ok(Cloner { own, stack, null, alive: ParentAlive::new()? })
    }

    /// Starts `spec` as PID 1 of a new PID namespace; returns once it
    /// has exec'd, or with the error that stopped it.
    fn spawn(&self, spec: &StepSpec) -> io::Result<StepChild> {
        use nix::fcntl::OFlag;
        let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let ptrs =
            |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>();
        let (argv, envp) = (ptrs(&spec.argv), ptrs(&spec.envp));
        let args = ChildArgs {
            program: spec.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: spec.cwd.as_ptr(),
            fds: [self.null.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
            alive: (self.alive.read.as_raw_fd(), self.alive.write.as_raw_fd()),
            user: spec.user,
            mounts: &spec.mounts,
            nice: SessionNice::of_caller(),
            errno: std::sync::atomic::AtomicI32::new(0),
        };
        new_pid_namespace(&self.own)?;
        let mut pidfd: libc::c_int = -1;
        // SAFETY: the child runs `child_main` on our stack mapping (its top,
        // 16-byte aligned) with `args`, which outlives it: CLONE_VFORK
        // suspends this thread until the child has exec'd or exited. All
        // signals are blocked across the clone, so no handler of the agent
        // runs in the child before `exec_child` resets them.
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let top = (self.stack.base as usize + self.stack.len) & !15;
            let pid = libc::clone(
                child_main,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                &args as *const ChildArgs as *mut libc::c_void,
                &mut pidfd as *mut libc::c_int,
            );
            let e = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid == -1 {
                return Err(e);
            }
            pid
        };
        // SAFETY: CLONE_PIDFD stored a new descriptor there, now ours.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let child = StepChild { pid, pidfd, stdout: out_r, stderr: err_r };
        match args.errno.load(std::sync::atomic::Ordering::SeqCst) {
            0 => Ok(child),
            e => {
                let _ = child.wait_blocking();
                Err(io::Error::from_raw_os_error(e))
            }
        }
    }
}

/// What [`child_main`] gets: raw pointers into the spawner thread's
/// [`StepSpec`] and its vectors, which outlive the child's `execve`.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Become stdin, stdout and stderr.
    fds: [libc::c_int; 3],
    /// [`ParentAlive`]'s read and write ends.
    alive: (libc::c_int, libc::c_int),
    user: Option<StepUser>,
    /// Made after `/proc`, before the user switch.
    mounts: *const StepMounts,
    nice: Option<SessionNice>,
    /// Set by the child when it cannot exec: the error number.
    errno: std::sync::atomic::AtomicI32,
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the spawner's `ChildArgs`, alive and unchanged until
    // this child execs or exits; `exec_child` makes system calls only.
    unsafe {
        let a = &*(arg as *const ChildArgs);
        let Err(e) = exec_child(a);
        a.errno
            .store(e.raw_os_error().filter(|n| *n != 0).unwrap_or(libc::EINVAL), std::sync::atomic::Ordering::SeqCst);
        libc::_exit(127)
    }
}

/// The child's side of [`Cloner::spawn`]: what [`namespace_child`]'s
/// grandchild does, without the keeper, then stdio, the working directory,
/// the signals and `execve`. Returns only on failure.
///
/// # Safety
/// Only in a `CLONE_VM` child: it shares the agent's memory (and glibc's
/// state), so only raw system calls on `a`'s prepared values, no
/// allocation, no locks, no glibc call that would act on other threads
/// (`settle_as_pid1` switches users with raw syscalls).
unsafe fn exec_child(a: &ChildArgs) -> io::Result<std::convert::Infallible> {
    // SAFETY: system calls on descriptors and strings prepared by the parent.
    unsafe {
        lead_session(a.user.is_some(), a.nice)?;
        libc::close(a.alive.1);
        let mut fd = libc::pollfd { fd: a.alive.0, events: libc::POLLIN, revents: 0 };
        if libc::poll(&mut fd, 1, 0) == -1 {
            return Err(io::Error::last_os_error());
        }
        if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // The agent died before the death signal was set: it will
            // never come, so refuse to run.
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        libc::close(a.alive.0);
        if libc::unshare(libc::CLONE_NEWNS) == -1 {
            return Err(io::Error::last_os_error());
        }
        settle_as_pid1(a.user, &*a.mounts)?;
        for (target, fd) in a.fds.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::chdir(a.cwd) == -1 {
            return Err(io::Error::last_os_error());
        }
        // The agent's handlers live in its memory: back to the default
        // before signals are unblocked.
        default_signals();
        libc::execve(a.program, a.argv, a.envp);
        Err(io::Error::last_os_error())
    }
}

/// Every signal's disposition back to the default and none blocked, so a
/// step starts with a clean slate whatever the agent handles, ignores
/// (Rust ignores SIGPIPE; an agent started by `nohup` ignores SIGHUP) or
/// blocks. Raw `rt_sigaction`: glibc's wrapper refuses its own reserved
/// signals, which may be ignored too.
///
/// # Safety
/// Only in a child between fork (or clone) and exec: the agent's handlers
/// must not run there.
unsafe fn default_signals() {
    /// The kernel's `struct sigaction`: the handler first; zeroes elsewhere
    /// (no flags, restorer or mask) are right for `SIG_DFL`.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    const SET_SIZE: usize = 8;
    let dfl = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: rt_sigaction and rt_sigprocmask on values of this frame.
    unsafe {
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
            let null: *const KernelSigaction = std::ptr::null();
            if libc::syscall(libc::SYS_rt_sigaction, sig, null, &mut old as *mut KernelSigaction, SET_SIZE) == 0
                && old.handler != libc::SIG_DFL
            {
                let none: *mut KernelSigaction = std::ptr::null_mut();
                libc::syscall(libc::SYS_rt_sigaction, sig, &dfl as *const KernelSigaction, none, SET_SIZE);
            }
        }
        let empty: u64 = 0;
        let none: *mut u64 = std::ptr::null_mut();
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &empty as *const u64, none, SET_SIZE);
    }
}

/// Points this thread's next child at a new PID namespace.
fn new_pid_namespace(own: &std::fs::File) -> io::Result<()> {
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

/// A close-on-exec pipe the spawner holds for the agent's life: PID 1 of
/// a new namespace cannot ask `getppid()` whether its parent is still there
/// (it says 0), so the child closes its copy of the write end and checks
/// that the read end has not hung up, i.e. that the agent (which holds the
/// other copy) has not died before the parent-death signal was set.
struct ParentAlive {
    read: OwnedFd,
    write: OwnedFd,
}

impl ParentAlive {
    fn new() -> io::Result<ParentAlive> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(ParentAlive { read, write })
    }
}

#[cfg(test)]
mod tests {
    use super::{SessionNice, isolate_in_namespaces, isolate_process_tree, namespaces_work};
    use std::process::Stdio;
    use tokio::process::Command;

    /// How a test isolates the step it spawns.
    type Isolate = fn(&mut Command);

    /// What a step prints about its priority, spawned by a thread at nice 5
    /// (the thread's own: Linux keeps nice values per thread) through
    /// `isolate`.
    fn step_priority_at_nice_5(isolate: Isolate) -> String {
        std::thread::spawn(move || {
            // SAFETY: sets this thread's own nice value (who = 0).
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, 5) }, 0);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let mut cmd = Command::new("/bin/sh");
                cmd.args(["-c", "echo \"nice $(nice)\"; cat /proc/self/autogroup 2>/dev/null || echo no-autogroups"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped());
                isolate(&mut cmd);
                String::from_utf8(cmd.output().await.unwrap().stdout).unwrap()
            })
        })
        .join()
        .unwrap()
    }

    /// Both `pre_exec` paths (a plain session, and new namespaces where
    /// they work) set the step's new session to the spawning thread's nice
    /// value; the clone path is covered end to end (`e2e_logs`).
    #[test]
    fn a_step_leads_a_session_at_its_spawners_nice_value() {
        let mut paths: Vec<(&str, Isolate)> = vec![("session", |c| isolate_process_tree(c, None, false))];
        if namespaces_work() {
            paths.push(("namespaces", |c| isolate_in_namespaces(c, None, None, Default::default())));
        }
        for (name, isolate) in paths {
            let out = step_priority_at_nice_5(isolate);
            assert!(out.starts_with("nice 5\n"), "{name}: {out}");
            if !out.contains("no-autogroups") {
                assert!(out.trim_end().ends_with(" nice 5"), "{name}: the session's group at nice 5: {out}");
                let mine = std::fs::read_to_string("/proc/self/autogroup").unwrap();
                assert_ne!(
                    out.lines().nth(1).unwrap().split_whitespace().next(),
                    mine.split_whitespace().next(),
                    "{name}"
                );
            }
        }
    }

    /// `--step-nice 12` (issue 47): a step spawned by a thread at nice 5
    /// runs at 12, its process and its session's group; one spawned at a
    /// higher value than the floor keeps its own. (nextest runs each test
    /// in a process of its own: the floor is this test's.)
    #[test]
    fn a_step_runs_at_least_at_the_step_nice_value() {
        super::set_step_nice(12);
        let mut paths: Vec<(&str, Isolate)> = vec![("session", |c| isolate_process_tree(c, None, false))];
        if namespaces_work() {
            paths.push(("namespaces", |c| isolate_in_namespaces(c, None, None, Default::default())));
        }
        for (name, isolate) in paths {
            let out = step_priority_at_nice_5(isolate);
            assert!(out.starts_with("nice 12\n"), "{name}: {out}");
            if !out.contains("no-autogroups") {
                assert!(out.trim_end().ends_with(" nice 12"), "{name}: the session's group at nice 12: {out}");
            }
        }
        super::set_step_nice(3);
        let out = step_priority_at_nice_5(|c| isolate_process_tree(c, None, false));
        assert!(out.starts_with("nice 5\n"), "a floor below the spawner's own changes nothing: {out}");
        super::set_step_nice(0);
    }

    fn text(n: libc::c_int) -> Option<String> {
        SessionNice::new(n).map(|s| String::from_utf8(s.text[..s.len].to_vec()).unwrap())
    }

    #[test]
    fn a_session_nice_value_is_written_as_the_kernel_reads_it_and_not_at_all_for_0() {
        assert_eq!(text(0), None, "0 is a new group's default: nothing to write");
        assert_eq!(text(10).as_deref(), Some("10"));
        assert_eq!(text(7).as_deref(), Some("7"));
        assert_eq!(text(19).as_deref(), Some("19"));
        assert_eq!(text(-20).as_deref(), Some("-20"));
        assert_eq!(text(-5).as_deref(), Some("-5"));
        assert_eq!(text(20), None);
        assert_eq!(text(-21), None);
    }
}
