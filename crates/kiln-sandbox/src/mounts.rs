//! What a host step's mount namespace hides and replaces (issue 39, items
//! 8 and 9), planned by the agent before each spawn; the step's PID 1
//! makes the mounts (`spawn::make_mounts`) after `/proc`, before it drops
//! to the step user, and the step never runs if one of them fails.
//!
//! - **Hidden paths** (the agent's work dir and token file, `kiln up`'s data
//!   directory): a directory is covered by an empty read-only tmpfs, a file
//!   by `/dev/null`. A step running as the agent's own user (a non-root
//!   agent) then finds nothing there, whatever the files' modes.
//! - **A private `/tmp` and `/dev/shm` per job**: the attempt's own `tmp/`
//!   and `shm/` directories are bound over them. The steps of one job share
//!   them (as on one machine); no other job sees them, and they go with the
//!   attempt's sandbox.
//! - **The job's own directories stay where they are**: a sandbox under
//!   `/tmp` or `/dev/shm` (the default sandbox root is in the system temp
//!   dir) is bound again at its own path inside the private directory,
//!   through descriptors opened before the cover, with each directory on
//!   the way made without following a link (a step cannot redirect the
//!   mount through a link it left in its `/tmp`).
//!
//! Every source is opened without following a link in its last component
//! (a step's `tmp/` replaced by a link stops its next step), before
//! anything is covered, and then bound through its descriptor.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// One mount of a step's namespace, with every path prepared as a C string
/// (the child may not allocate).
pub(crate) enum MountOp {
    /// An empty read-only tmpfs over this directory.
    HideDir(CString),
    /// `/dev/null` over this file.
    HideFile(CString),
    /// The directory `source` bound over `target`.
    Bind { source: CString, target: CString },
    /// The directory `source` bound again at `under` followed by
    /// `components`, each made if missing and never followed if a link.
    Reexpose { source: CString, under: CString, components: Vec<CString> },
}

/// Most sources (binds and re-exposed directories) of one step.
pub(crate) const MAX_SOURCES: usize = 8;

/// The mounts of one step. Sources are opened by the child itself, in its
/// new mount namespace (a bind's source must be a mount of the caller's
/// namespace), before anything is covered, never following a link in
/// their last component; the agent opened each once the same way to refuse
/// a bad one with a clear message.
#[derive(Default)]
pub(crate) struct StepMounts {
    pub(crate) ops: Vec<MountOp>,
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("a NUL byte in {}", p.display())))
}

/// A directory as a mount source, checked as the child will open it: no
/// link followed in its last component (the agent made every other one).
fn source(dir: &Path) -> io::Result<CString> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", dir.display())))?;
    c_path(dir)
}

/// The path with links resolved when it exists (the mounts land where the
/// kernel resolves it), else as given, absolute.
fn resolved(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
}

impl StepMounts {
    /// The mounts for a step: `hide` covered (missing ones skipped), each
    /// `(source, target)` of `private` bound over its target (skipped when
    /// the target does not exist here), and each of `keep` (the job's own
    /// directories) bound again at its path when a private mount covers it.
    /// Err when a source cannot be opened, or a kept directory lies under a
    /// hidden path (it would vanish with it).
    pub(crate) fn plan(hide: &[PathBuf], private: &[(PathBuf, &str)], keep: &[PathBuf]) -> io::Result<StepMounts> {
        let mut m = StepMounts::default();
        let keep: Vec<PathBuf> = keep.iter().map(|k| resolved(k)).collect();
        for h in hide {
            let meta = match std::fs::metadata(h) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", h.display()))),
            };
            let at = resolved(h);
            if let Some(k) = keep.iter().find(|k| k.starts_with(&at)) {
                return Err(io::Error::other(format!(
                    "the job's directory {} is under {}, which steps must not see",
                    k.display(),
                    at.display()
                )));
            }
            m.ops.push(if meta.is_dir() { MountOp::HideDir(c_path(&at)?) } else { MountOp::HideFile(c_path(&at)?) });
        }
        let mut covered = vec![];
        for (source, target) in private {
            let target = Path::new(target);
            if !target.is_dir() {
                continue;
            }
            let path = self::source(source)?;
            let target = resolved(target);
            m.ops.push(MountOp::Bind { source: path, target: c_path(&target)? });
            covered.push(target);
        }
        let mut kept: Vec<&PathBuf> = vec![];
        for k in &keep {
            // One bind for a directory and what lies under it.
            if kept.iter().any(|o| k.starts_with(o)) {
                continue;
            }
            let Some(under) =
                covered.iter().filter(|c| k.starts_with(c) && k != *c).max_by_key(|c| c.as_os_str().len())
            else {
                continue;
            };
            let components = k
                .strip_prefix(under)
                .expect("checked")
                .components()
                .map(|c| match c {
                    Component::Normal(name) => c_path(Path::new(name)),
                    _ => Err(io::Error::other(format!("{}: not a plain path", k.display()))),
                })
                .collect::<io::Result<Vec<_>>>()?;
            let source = source(k)?;
            m.ops.push(MountOp::Reexpose { source, under: c_path(under)?, components });
            kept.push(k);
        }
        let sources = m.ops.iter().filter(|op| matches!(op, MountOp::Bind { .. } | MountOp::Reexpose { .. })).count();
        if sources > MAX_SOURCES {
            return Err(io::Error::other(format!("{sources} directories to bind into a step; at most {MAX_SOURCES}")));
        }
        Ok(m)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe(m: &StepMounts) -> Vec<String> {
        let s = |c: &CString| c.to_str().unwrap().to_string();
        m.ops
            .iter()
            .map(|op| match op {
                MountOp::HideDir(t) => format!("hide-dir {}", s(t)),
                MountOp::HideFile(t) => format!("hide-file {}", s(t)),
                MountOp::Bind { target, .. } => format!("bind {}", s(target)),
                MountOp::Reexpose { under, components, .. } => {
                    format!("again {} {}", s(under), components.iter().map(s).collect::<Vec<_>>().join("/"))
                }
            })
            .collect()
    }

    #[test]
    fn hidden_paths_come_first_then_the_private_dirs_then_the_jobs_own_dirs_again() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        let (data, token, sandbox) = (root.join("data"), root.join("agent.token"), root.join("sb/slot"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(&token, "t").unwrap();
        std::fs::create_dir_all(sandbox.join("tmp")).unwrap();
        std::fs::create_dir_all(sandbox.join("ws")).unwrap();
        let cover = root.to_str().unwrap().to_string();
        let m = StepMounts::plan(
            &[data.clone(), token.clone(), root.join("missing")],
            &[(sandbox.join("tmp"), cover.as_str()), (sandbox.join("tmp"), "/no/such/dir")],
            &[sandbox.clone(), sandbox.join("ws")],
        )
        .unwrap();
        assert_eq!(
            describe(&m),
            [
                format!("hide-dir {}", data.display()),
                format!("hide-file {}", token.display()),
                format!("bind {cover}"),
                format!("again {cover} sb/slot"),
            ]
        );
        // A job directory under a hidden one is refused, not silently hidden.
        let e = StepMounts::plan(&[root.join("sb")], &[], std::slice::from_ref(&sandbox)).err().unwrap();
        assert!(e.to_string().contains("must not see"), "{e}");
        // A link in place of a private dir's source is not followed.
        std::fs::remove_dir(sandbox.join("tmp")).unwrap();
        std::os::unix::fs::symlink(&data, sandbox.join("tmp")).unwrap();
        assert!(StepMounts::plan(&[], &[(sandbox.join("tmp"), cover.as_str())], &[]).is_err());
    }
}
