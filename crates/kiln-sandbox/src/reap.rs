//! Records of running step groups, and reaping of groups a dead agent left.
//!
//! Every running step's process group is recorded as `<state_dir>/<pgid>`
//! (content: the boot id) and the record is removed once the group is gone.
//! PR_SET_PDEATHSIG kills a step's shell when the agent dies, but not the
//! shell's children; at start the agent calls [`reap_orphans`] to SIGKILL
//! every recorded group that is still alive.

use crate::procs::{boot_id, signal_group, step_group_alive};
use nix::sys::signal::Signal;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) fn record_path(state_dir: &Path, pgid: i32) -> PathBuf {
    state_dir.join(pgid.to_string())
}

pub(crate) fn record(state_dir: &Path, pgid: i32) -> io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    std::fs::write(record_path(state_dir, pgid), boot_id())
}

pub(crate) fn forget(state_dir: &Path, pgid: i32) {
    let _ = std::fs::remove_file(record_path(state_dir, pgid));
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
            let recorded_boot = std::fs::read_to_string(&path).unwrap_or_default();
            // A record from before a reboot names a pgid that may be reused.
            if recorded_boot.trim() == this_boot && step_group_alive(pgid) {
                tracing::warn!(pgid, "killing orphaned step process group left by a previous agent");
                signal_group(pgid, Signal::SIGKILL);
                killed += 1;
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
        let _ = std::fs::set_permissions(path, perm);
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                make_writable(&e.path());
            }
        }
    }
}
