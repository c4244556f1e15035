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

/// Records of finished groups kept for the next ones, `(state dir, path)`:
/// rewritten and renamed, a record costs no new inode (creating and
/// deleting a file per step was measurable on ext4, issue 20). Named
/// `.spare-N`, which no pgid parses as: [`reap_orphans`] only removes them.
static SPARE: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> = std::sync::Mutex::new(Vec::new());
/// Spare records kept at most (one per step running at once is enough).
const MAX_SPARE: usize = 64;

pub(crate) fn record(state_dir: &Path, pgid: i32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let start = start_time(pgid).ok_or_else(|| io::Error::other(format!("process {pgid} is gone")))?;
    let path = record_path(state_dir, pgid);
    let content = format!("{} {start}", boot_id());
    let spare = {
        let mut spare = SPARE.lock().expect("spare records");
        spare.iter().position(|(dir, _)| dir == state_dir).map(|i| spare.swap_remove(i).1)
    };
    if let Some(spare) = spare {
        // Rewritten before it takes the group's name: a record never
        // names one group with another's start time. Overwritten in place
        // and then cut to length, never truncated to zero: ext4 flushes a
        // file truncated to zero and rewritten when it is closed (its
        // `auto_da_alloc`), a block write per step.
        use std::os::unix::fs::FileExt;
        let flags = nix::fcntl::OFlag::O_NOFOLLOW.bits();
        let reused = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(&spare)
            .and_then(|f| {
                f.write_all_at(content.as_bytes(), 0)?;
                f.set_len(content.len() as u64)
            })
            .and_then(|()| std::fs::rename(&spare, &path));
        if reused.is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_file(&spare);
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(state_dir)?;
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(content.as_bytes())
}

pub(crate) fn forget(state_dir: &Path, pgid: i32) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = record_path(state_dir, pgid);
    let mut spare = SPARE.lock().expect("spare records");
    if spare.len() < MAX_SPARE {
        let to = state_dir.join(format!(".spare-{}", N.fetch_add(1, Ordering::Relaxed)));
        if std::fs::rename(&path, &to).is_ok() {
            spare.push((state_dir.to_path_buf(), to));
            return;
        }
    }
    drop(spare);
    let _ = std::fs::remove_file(path);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A finished group's record becomes the next group's (the same
    /// inode, its content rewritten), and a spare record kills nothing.
    #[test]
    fn a_forgotten_record_is_reused_for_the_next_group_and_never_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("pgids");
        let me = nix::unistd::getpgrp().as_raw();
        let path = record_path(&state, me);
        let want = format!("{} {}", boot_id(), start_time(me).unwrap());
        record(&state, me).unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        forget(&state, me);
        assert!(!path.exists());
        let names: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1);
        assert!(names[0].to_string_lossy().starts_with(".spare-"), "{names:?}");
        // Longer than any record: the rewrite must cut it.
        std::fs::write(state.join(&names[0]), "stale content of a longer record ".repeat(8)).unwrap();
        record(&state, me).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino, "the spare became the record");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want, "rewritten whole");
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 1);
        // A spare is never a record: reaping only removes it (this test's
        // own group is alive and must not be killed).
        forget(&state, me);
        assert_eq!(reap_orphans(&state).unwrap(), 0);
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
        // A spare removed from disk meanwhile: the record is a new file.
        record(&state, me).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        forget(&state, me);
    }
}
