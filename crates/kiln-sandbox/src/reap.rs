//! Records of running step groups, and reaping of groups a dead agent left.
//!
//! Every running step's process group is recorded as `<state_dir>/<pgid>`
//! (content: the boot id and the leader's start time) and the record is
//! removed once the group is gone. PR_SET_PDEATHSIG kills a step's shell
//! when the agent dies, but not the shell's children (without PID
//! namespaces); at start the agent calls [`reap_orphans`] to SIGKILL every
//! recorded group that is still alive.
//!
//! The state dir is the agent's (0700, outside every sandbox). A record is
//! trusted only if it is a regular file of the agent's own user and names
//! the very process that was recorded (same boot, same start time, still
//! the leader of its own session): a forged or stale record kills nothing
//! (issue 13: a step that wrote records got arbitrary processes SIGKILLed).

use crate::procs::{boot_id, signal_group, start_time, step_group_alive};
use nix::sys::signal::Signal;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) fn record_path(state_dir: &Path, pgid: i32) -> PathBuf {
    state_dir.join(pgid.to_string())
}

pub(crate) fn record(state_dir: &Path, pgid: i32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(state_dir)?;
    let start = start_time(pgid).ok_or_else(|| io::Error::other(format!("process {pgid} is gone")))?;
    let path = record_path(state_dir, pgid);
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    write!(f, "{} {start}", boot_id())
}

pub(crate) fn forget(state_dir: &Path, pgid: i32) {
    let _ = std::fs::remove_file(record_path(state_dir, pgid));
}

/// Whether the record at `path` (already known to name `pgid`) is one this
/// agent wrote for a process that still runs: a regular file of our own
/// user, this boot, the leader's start time.
fn genuine(path: &Path, pgid: i32, this_boot: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.nlink() != 1 {
        return false;
    }
    let content = std::fs::read_to_string(path).unwrap_or_default();
    let mut f = content.split_whitespace();
    let (Some(boot), Some(start), None) = (f.next(), f.next(), f.next()) else { return false };
    boot == this_boot && start.parse::<u64>().ok().is_some_and(|s| Some(s) == start_time(pgid))
}

/// SIGKILLs every recorded step group that is still alive and removes all
/// records. Returns how many groups were killed. A missing `state_dir` is
/// not an error. Call it before starting any step (records of live steps of
/// this process would be killed too).
pub fn reap_orphans(state_dir: &Path) -> io::Result<usize> {
    let entries = match std::fs::read_dir(state_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let this_boot = boot_id();
    let mut killed = 0;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let pgid = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
        if let Some(pgid) = pgid.filter(|p| *p > 1) {
            if genuine(&path, pgid, &this_boot) && step_group_alive(pgid) {
                tracing::warn!(pgid, "killing orphaned step process group left by a previous agent");
                signal_group(pgid, Signal::SIGKILL);
                killed += 1;
            } else if step_group_alive(pgid) {
                tracing::warn!(pgid, record = %path.display(), "ignoring a step group record this agent did not write");
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    Ok(killed)
}

/// `remove_dir_all` that also removes read-only trees (jobs often leave
/// read-only directories, e.g. Go's module cache). A missing path is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let mut perm = meta.permissions();
        perm.set_mode(perm.mode() | 0o700);
        // On the directory opened without following a link: a step-made
        // tree never gets the agent to chmod what a link points to.
        use std::os::unix::fs::OpenOptionsExt;
        let flags = (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_DIRECTORY).bits();
        if let Ok(dir) = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path) {
            let _ = dir.set_permissions(perm);
        }
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                make_writable(&e.path());
            }
        }
    }
}
