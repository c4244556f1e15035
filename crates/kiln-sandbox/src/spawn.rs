//! Process-tree setup of a step, run in the child between fork and exec.
//!
//! The only unsafe code of the crate: `pre_exec` runs in the forked child of
//! a multi-threaded process, where only async-signal-safe calls are allowed.
#![allow(unsafe_code)]

use crate::isolation::StepUser;
use std::io;
use tokio::process::Command;

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
