//! Who a host step runs as, and in which namespaces (issue 13, finding 3).
//!
//! Decided once per agent from its effective uid and what the kernel allows:
//! - **root agent**: every step in its own PID and mount namespaces with
//!   `/proc` remounted (it sees only its own processes; the kernel kills the
//!   whole namespace when the step's shell ends or the agent dies), as a
//!   separate unprivileged user ([`StepUser`], `nobody` by default) without
//!   supplementary groups and with `no_new_privs`: the agent's 0700 data and
//!   state directories are closed to it.
//! - **non-root agent**: the same PID and mount namespaces inside a user
//!   namespace that maps the agent's uid to itself (no capabilities inside).
//!   The step keeps the agent's uid: it can read whatever that user can but
//!   what its mount namespace hides (issue 39, item 8: the agent's work dir
//!   and token file, `kiln up`'s data directory; see `crate::mounts`), so
//!   the host executor is for trusted code.
//! - either way, with namespaces, each job has a private `/tmp` and
//!   `/dev/shm` (issue 39, item 9), shared by its steps only.
//! - **no namespaces** (a kernel or container that refuses them): own
//!   session and a parent-death signal only; a root agent still switches to
//!   the step user.
//!
//! A root agent makes the namespaces itself (no helper program to load per
//! step): a thread kept for spawning steps points its next child at a new
//! PID namespace, and the step's shell is cloned straight into it as its
//! PID 1, with the agent's death as its own (`spawn::PidNsSpawner`; where
//! that cannot work, the forked child makes the namespaces and a keeper
//! process outside forks the shell into them). A non-root agent's forked
//! child makes a user namespace as well (mapping its ids as util-linux's
//! `unshare --user --map-user --map-group` did) and goes the keeper's way.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Defined beside the fork-time code that switches to it (`spawn.rs`).
pub use crate::spawn::StepUser;

impl StepUser {
    /// `nobody` (and its primary group) from the user database, else 65534:65534.
    pub fn nobody() -> StepUser {
        Self::lookup("nobody").unwrap_or(StepUser { uid: 65534, gid: 65534 })
    }

    /// A user name or numeric uid (`name`, `1234` or `1234:1234`); a name's
    /// primary group, or the uid as gid, unless given.
    pub fn lookup(spec: &str) -> Option<StepUser> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let by_name = || nix::unistd::User::from_name(user).ok().flatten();
        let (uid, default_gid) = match user.parse::<u32>() {
            Ok(uid) => {
                let gid = nix::unistd::User::from_uid(uid.into()).ok().flatten().map_or(uid, |u| u.gid.as_raw());
                (uid, gid)
            }
            Err(_) => {
                let u = by_name()?;
                (u.uid.as_raw(), u.gid.as_raw())
            }
        };
        let gid = match group {
            None => default_gid,
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => nix::unistd::Group::from_name(g).ok().flatten()?.gid.as_raw(),
            },
        };
        Some(StepUser { uid, gid })
    }
}

/// Which namespaces a step gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespaces {
    /// Root agent: PID + mount namespaces, `/proc` remounted.
    Pid,
    /// Non-root agent: user (the agent's uid and gid mapped to themselves,
    /// no capabilities once the step runs) + PID + mount, `/proc` remounted.
    UserPid { uid: u32, gid: u32 },
    /// None available: own session and parent-death signal only.
    None,
}

/// How steps are isolated on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolation {
    pub namespaces: Namespaces,
    /// Steps run as this user (root agents only); `None`: the agent's uid.
    pub user: Option<StepUser>,
}

impl Isolation {
    /// The decision, from the agent's effective uid/gid, the step user asked
    /// for (`None`: the agent's own), and which namespaces the kernel lets
    /// this process make (`root_ns`: PID + mount as root; `user_ns`: user +
    /// PID + mount unprivileged). Err when a non-root agent is asked to run
    /// steps as another user.
    pub fn decide(
        euid: u32,
        egid: u32,
        user: Option<StepUser>,
        root_ns: bool,
        user_ns: bool,
    ) -> Result<Isolation, String> {
        if euid == 0 {
            let user = user.filter(|u| u.uid != 0);
            let namespaces = if root_ns { Namespaces::Pid } else { Namespaces::None };
            return Ok(Isolation { namespaces, user });
        }
        if let Some(u) = user.filter(|u| u.uid != euid) {
            return Err(format!(
                "running steps as uid {} needs an agent running as root (this agent runs as uid {euid})",
                u.uid
            ));
        }
        let namespaces = if user_ns { Namespaces::UserPid { uid: euid, gid: egid } } else { Namespaces::None };
        Ok(Isolation { namespaces, user: None })
    }

    /// Decides for this process, probing (once per process) which
    /// namespaces `unshare` can make here.
    pub fn detect(user: Option<StepUser>) -> Result<Isolation, String> {
        let euid = nix::unistd::geteuid().as_raw();
        let egid = nix::unistd::getegid().as_raw();
        let (root_ns, user_ns) = if euid == 0 {
            // Made in the step's forked child (see `crate::spawn`): neither
            // `unshare` nor `setpriv` is needed.
            (probe(Probe::Root), false)
        } else {
            (false, probe(Probe::User))
        };
        let iso = Isolation::decide(euid, egid, user, root_ns, user_ns)?;
        if iso.namespaces == Namespaces::None {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                tracing::warn!(
                    "cannot create PID namespaces here: host steps run in their own session only, share /tmp, \
                     and a step's daemons may outlive it until the agent restarts; a step that would run as the \
                     agent's own user does not run (the agent's files cannot be hidden from it)"
                )
            });
        }
        Ok(iso)
    }

    /// The util-linux command line of the same namespaces (`unshare`'s
    /// arguments up to the shell, ending with `--`, or with a `setpriv …
    /// --` that switches to the step user), or None without namespaces: what
    /// the step's forked child does itself (see `crate::spawn`), which also
    /// makes the step's mounts (`crate::mounts`) that `unshare` cannot.
    pub fn launcher_args(&self) -> Option<Vec<String>> {
        let mut args: Vec<String> = match self.namespaces {
            Namespaces::None => return None,
            Namespaces::Pid => vec![],
            Namespaces::UserPid { uid, gid } => {
                vec!["--user".into(), format!("--map-user={uid}"), format!("--map-group={gid}")]
            }
        };
        args.extend(["--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--"].map(String::from));
        if let (Namespaces::Pid, Some(u)) = (self.namespaces, self.user) {
            // Not unshare's own --setuid: changing the uid clears the
            // parent-death signal its --kill-child set, and the namespace
            // would outlive a killed agent. setpriv sets it again after.
            let setpriv = setpriv_path().map_or_else(|| "setpriv".into(), |p| p.display().to_string());
            args.extend([
                setpriv,
                "--reuid".into(),
                u.uid.to_string(),
                "--regid".into(),
                u.gid.to_string(),
                "--clear-groups".into(),
                "--pdeathsig".into(),
                "SIGKILL".into(),
                "--".into(),
            ]);
        }
        Some(args)
    }

    /// One line for the agent's log.
    pub fn describe(&self) -> String {
        let who = match self.user {
            Some(u) => format!("as uid {} gid {} (no supplementary groups, no_new_privs)", u.uid, u.gid),
            None => "as the agent's own user".into(),
        };
        let ns = match self.namespaces {
            Namespaces::Pid => {
                "in their own PID and mount namespaces (/proc remounted, a private /tmp and /dev/shm per job, the \
                 agent's files hidden)"
            }
            Namespaces::UserPid { .. } => {
                "in their own user, PID and mount namespaces (/proc remounted, a private /tmp and /dev/shm per \
                 job, the agent's files hidden)"
            }
            Namespaces::None => "in their own session only (no namespaces available: /tmp is shared)",
        };
        format!("host steps run {who}, {ns}")
    }
}

#[derive(Clone, Copy)]
enum Probe {
    Root,
    User,
}

/// `setpriv` of util-linux, if installed.
fn setpriv_path() -> Option<&'static Path> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| ["/usr/bin/setpriv", "/bin/setpriv"].iter().map(PathBuf::from).find(|p| p.exists())).as_deref()
}

/// Whether steps' namespaces of `kind` can be made here (checked once, by
/// starting `/bin/true` in them: see `crate::spawn`).
fn probe(kind: Probe) -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    static USER: OnceLock<bool> = OnceLock::new();
    match kind {
        Probe::Root => *ROOT.get_or_init(crate::spawn::namespaces_work),
        Probe::User => *USER.get_or_init(crate::spawn::user_namespaces_work),
    }
}

/// Hands `path` and everything under it to `user`, without following
/// symbolic links (`lchown`) and leaving files with more than one link
/// alone (their other names may be outside the tree: issue 13, finding 8).
pub(crate) fn chown_tree(path: &Path, user: StepUser) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() && meta.nlink() > 1 {
        return Ok(());
    }
    // What is the user's already (most of a kept job slot, issue 20) is
    // left alone: no syscall, no inode change.
    if meta.uid() != user.uid || meta.gid() != user.gid {
        std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))?;
    }
    if meta.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), user)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOBODY: StepUser = StepUser { uid: 65534, gid: 65534 };

    #[test]
    fn a_root_agent_runs_steps_as_the_step_user_in_pid_and_mount_namespaces() {
        let iso = Isolation::decide(0, 0, Some(NOBODY), true, false).unwrap();
        assert_eq!(iso, Isolation { namespaces: Namespaces::Pid, user: Some(NOBODY) });
        let args = iso.launcher_args().unwrap();
        assert_eq!(args[..5], ["--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--"]);
        assert!(args[5].ends_with("setpriv"), "{args:?}");
        // The parent-death signal is set again after the uid changed.
        assert_eq!(
            args[6..],
            ["--reuid", "65534", "--regid", "65534", "--clear-groups", "--pdeathsig", "SIGKILL", "--"]
        );
        // Without namespaces the user switch still happens (in the child).
        let iso = Isolation::decide(0, 0, Some(NOBODY), false, false).unwrap();
        assert_eq!(iso, Isolation { namespaces: Namespaces::None, user: Some(NOBODY) });
        assert_eq!(iso.launcher_args(), None);
        // `--step-user root` is the explicit opt-out.
        let iso = Isolation::decide(0, 0, Some(StepUser { uid: 0, gid: 0 }), true, false).unwrap();
        assert_eq!(iso.user, None);
        assert_eq!(iso.launcher_args().unwrap().last().unwrap(), "--");
        assert!(!iso.launcher_args().unwrap().contains(&"--reuid".to_string()));
    }

    #[test]
    fn a_non_root_agent_gets_a_user_namespace_and_keeps_its_uid() {
        let iso = Isolation::decide(1000, 1001, None, false, true).unwrap();
        assert_eq!(iso, Isolation { namespaces: Namespaces::UserPid { uid: 1000, gid: 1001 }, user: None });
        assert_eq!(
            iso.launcher_args().unwrap(),
            [
                "--user",
                "--map-user=1000",
                "--map-group=1001",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount-proc",
                "--"
            ]
        );
        assert!(iso.describe().contains("agent's own user"), "{}", iso.describe());
        // Its own uid as step user is the same thing; another uid is refused.
        assert_eq!(Isolation::decide(1000, 1001, Some(StepUser { uid: 1000, gid: 1 }), false, true).unwrap(), iso);
        let e = Isolation::decide(1000, 1001, Some(NOBODY), false, true).unwrap_err();
        assert!(e.contains("needs an agent running as root"), "{e}");
        // No user namespaces (e.g. disabled by sysctl): session only.
        let iso = Isolation::decide(1000, 1001, None, false, false).unwrap();
        assert_eq!(iso, Isolation { namespaces: Namespaces::None, user: None });
    }

    #[test]
    fn step_users_are_looked_up_by_name_or_number() {
        assert_eq!(StepUser::lookup("4242:4343"), Some(StepUser { uid: 4242, gid: 4343 }));
        assert_eq!(StepUser::lookup("root"), Some(StepUser { uid: 0, gid: 0 }));
        assert_eq!(StepUser::lookup("no-such-user-kiln"), None);
        assert_ne!(StepUser::nobody().uid, 0);
    }

    #[test]
    fn chown_tree_does_not_follow_links_out_of_the_tree() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            return; // chown to another uid needs root
        }
        let dir = tempfile::tempdir().unwrap();
        let (tree, outside) = (dir.path().join("tree"), dir.path().join("outside"));
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(&outside, b"x").unwrap();
        std::fs::write(tree.join("sub/own"), b"y").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        std::fs::hard_link(&outside, tree.join("hard")).unwrap();
        chown_tree(&tree, NOBODY).unwrap();
        assert_eq!(std::fs::metadata(tree.join("sub/own")).unwrap().uid(), 65534);
        assert_eq!(std::fs::symlink_metadata(tree.join("link")).unwrap().uid(), 65534, "the link itself");
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0, "neither the symlink's nor the hard link's target");

        // Owned already: untouched (its change time stays); a group that
        // differs is still set.
        std::fs::write(tree.join("mine"), b"z").unwrap();
        std::fs::write(tree.join("group"), b"z").unwrap();
        std::os::unix::fs::lchown(tree.join("mine"), Some(NOBODY.uid), Some(NOBODY.gid)).unwrap();
        std::os::unix::fs::lchown(tree.join("group"), Some(NOBODY.uid), Some(0)).unwrap();
        let ctime = |p: &str| {
            let m = std::fs::symlink_metadata(tree.join(p)).unwrap();
            (m.ctime(), m.ctime_nsec())
        };
        let before = ctime("mine");
        std::thread::sleep(std::time::Duration::from_millis(20));
        chown_tree(&tree, NOBODY).unwrap();
        assert_eq!(ctime("mine"), before, "an entry the user owns is not chowned again");
        assert_eq!(std::fs::metadata(tree.join("group")).unwrap().gid(), NOBODY.gid);
    }
}
