//! Where an agent keeps what (issue 13, finding 3): two separate roots.
//!
//! - `work_dir` (0700, the agent's alone): `agent.lock`, `pgids/` (running
//!   step groups, SIGKILLed on restart), `mirrors/` (bare git mirrors), and
//!   `attempts/<job>-<epoch>/log-spool`. No step ever runs under it, so a
//!   step cannot walk from its workspace to it, and (root agent, steps as
//!   another user) cannot open it at all.
//! - the sandbox root (`--sandbox-dir`, by default a directory of the system
//!   temp dir named after the agent's uid and work dir): the sandbox of an
//!   attempt holding `ws/`, `home/`, `tmp/`, `shm/`, `outputs/` (handed to the step
//!   user when there is one) — for host jobs with PID namespaces one
//!   `slot-<n>-<random>/` per job slot, kept from one attempt to the next
//!   (renamed in between) and put back in place ([`crate::slots`]);
//!   otherwise one
//!   `<job>-<epoch>/` per attempt — and beside it the agent's
//!   `<job>-<epoch>.spool/` (0700, the agent's, made on first use) into
//!   which published artifacts are moved (same filesystem: a rename), and
//!   `.trash-*` entries being deleted in the background. The root is 0711
//!   when steps run as another user (they traverse to their own sandbox but
//!   cannot list the others), else 0700.
//!
//! Under `kiln up` the data directory (tokens, keys, database) is 0700 and
//! holds the agents' work dirs, never a workspace.

use anyhow::Context;
use sha2::{Digest, Sha256};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` (and parents) 0700 and tightens it to 0700 if it existed.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.is_dir() && meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Creates the missing directories of `dir` 0755 whatever the umask (the
/// process's is 077): they lead to a sandbox a step user must reach.
/// Existing ones are left as they are.
fn open_dirs(dir: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        open_dirs(parent)?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => return Ok(()),
        Ok(()) => {}
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// The default sandbox root of an agent whose work dir is `work_dir`.
pub(crate) fn default_sandbox_dir(work_dir: &Path) -> PathBuf {
    let abs = std::path::absolute(work_dir).unwrap_or_else(|_| work_dir.to_path_buf());
    let digest = hex::encode(Sha256::digest(abs.as_os_str().as_encoded_bytes()));
    let uid = nix::unistd::geteuid().as_raw();
    std::env::temp_dir().join(format!("kiln-sandbox-{uid}-{}", &digest[..16]))
}

/// Mode of the sandbox root: traversable by a separate step user, else private.
pub(crate) fn sandbox_root_mode(separate_step_user: bool) -> u32 {
    if separate_step_user { 0o711 } else { 0o700 }
}

/// Makes `root` the agent's sandbox root, empty: created if missing; an
/// existing one must be a real directory of the agent's own user (in a
/// shared temp dir another user could have made it first, or put a
/// symbolic link there). Stale workspaces of an earlier agent process are
/// removed.
pub(crate) fn prepare_sandbox_root(root: &Path, separate_step_user: bool) -> anyhow::Result<()> {
    let parent = root.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    open_dirs(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create the sandbox dir {}", root.display())),
    }
    let meta = std::fs::symlink_metadata(root).with_context(|| format!("cannot inspect {}", root.display()))?;
    let euid = nix::unistd::geteuid().as_raw();
    anyhow::ensure!(
        meta.is_dir() && meta.uid() == euid,
        "the sandbox dir {} is not a directory of this agent's user (uid {euid}); remove it or pass another \
         --sandbox-dir",
        root.display()
    );
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(sandbox_root_mode(separate_step_user)))
        .with_context(|| format!("cannot set the mode of {}", root.display()))?;
    if separate_step_user && let Some(closed) = closed_ancestor(root) {
        anyhow::bail!(
            "the step user cannot reach the sandbox dir {}: {} is mode {:o}, closed to other users; give it o+x \
             (`chmod o+x {}`) or pass a --sandbox-dir outside it",
            root.display(),
            closed.0.display(),
            closed.1,
            closed.0.display()
        );
    }
    for e in std::fs::read_dir(root).with_context(|| format!("cannot list {}", root.display()))? {
        let e = e?;
        let p = e.path();
        let removed = if e.file_type()?.is_dir() { kiln_sandbox::remove_tree(&p) } else { std::fs::remove_file(&p) };
        removed.with_context(|| format!("cannot remove the stale workspace {}", p.display()))?;
    }
    Ok(())
}

/// The first ancestor of `dir` (from `/` down) that a user other than its
/// owner cannot traverse, with its mode: a step running as a separate user
/// could not reach a workspace under it.
fn closed_ancestor(dir: &Path) -> Option<(PathBuf, u32)> {
    let abs = std::path::absolute(dir).ok()?;
    let mut ancestors: Vec<&Path> = abs.ancestors().skip(1).collect();
    ancestors.reverse();
    ancestors.into_iter().find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.mode() & 0o777;
        (mode & 0o001 == 0).then(|| (a.to_path_buf(), mode))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn the_sandbox_root_is_outside_the_work_dir_and_per_agent() {
        let a = default_sandbox_dir(Path::new("/data/agents/local-1"));
        let b = default_sandbox_dir(Path::new("/data/agents/local-2"));
        assert_ne!(a, b);
        assert!(!a.starts_with("/data"), "{}", a.display());
        assert!(a.starts_with(std::env::temp_dir()));
    }

    #[test]
    fn the_sandbox_root_is_emptied_and_gets_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        // Reachable by a step user (a temp dir is 0700).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let root = dir.path().join("sandbox");
        prepare_sandbox_root(&root, false).unwrap();
        assert_eq!(mode(&root), 0o700);
        std::fs::create_dir_all(root.join("old-1/ws")).unwrap();
        std::fs::write(root.join("old-1.spool"), b"x").unwrap();
        prepare_sandbox_root(&root, true).unwrap();
        assert_eq!(mode(&root), 0o711, "a separate step user may traverse, not list");
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0, "stale workspaces removed");
    }

    #[test]
    fn a_sandbox_root_that_is_a_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("keep"), b"x").unwrap();
        let root = dir.path().join("sandbox");
        std::os::unix::fs::symlink(&target, &root).unwrap();
        let e = prepare_sandbox_root(&root, false).unwrap_err().to_string();
        assert!(e.contains("not a directory of this agent's user"), "{e}");
        assert!(target.join("keep").exists());
    }

    #[test]
    fn private_dirs_are_0700_even_when_they_existed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("work");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
    }

    /// `kiln bench cache` as root (issue 47): `--work-dir X/agents/a
    /// --sandbox-dir X/agents/a-sandbox` put the sandbox under the 0700
    /// `X/agents`, and every step failed with "cannot start the step's
    /// shell: Permission denied". Such a sandbox is now refused at start,
    /// naming the closed directory.
    #[test]
    fn a_sandbox_the_step_user_cannot_reach_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // The work dir and its new parents are private (nothing under a
        // data dir is open to other users)...
        let work = dir.path().join("agents/a");
        private_dir(&work).unwrap();
        assert_eq!(mode(&work), 0o700);
        assert_eq!(mode(&dir.path().join("agents")), 0o700);
        // ...so a sandbox beside it is out of a step user's reach: refused
        // at start, naming the closed directory, not at the first step.
        let e = prepare_sandbox_root(&dir.path().join("agents/a-sandbox"), true).unwrap_err().to_string();
        assert!(e.contains("the step user cannot reach the sandbox dir") && e.contains("is mode 700"), "{e}");
        assert!(e.contains(&dir.path().join("agents").display().to_string()), "{e}");
        // Steps as the agent's own user reach it; a sandbox elsewhere, with
        // its missing parents made traversable whatever the umask, too.
        prepare_sandbox_root(&dir.path().join("agents/a-sandbox"), false).unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let made = prepare_sandbox_root(&dir.path().join("sandboxes/a"), true);
        nix::sys::stat::umask(old);
        made.unwrap();
        assert_eq!(mode(&dir.path().join("sandboxes")), 0o755);
    }
}
