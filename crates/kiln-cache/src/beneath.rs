//! Opening paths below a directory without ever following a symbolic link
//! (issue 39, item 1): every component of a relative path is resolved from
//! an open directory, and a link anywhere on the way is refused by the
//! kernel, so a step that swaps a directory for a link between a check and
//! an open cannot lead the (root) agent out of the tree.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The relative path's normal components; `None` if it has a root, a `..`
/// or anything else than names and `.`.
pub(crate) fn components(rel: &Path) -> Option<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Opens the directory `path` (trusted as given: the caller's own).
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
}

/// Opens `rel` (normal components only; empty for `dir` itself) below
/// `dir` with `flags` (read-only unless given), following no symbolic link
/// on the way or at the end: a link is `ELOOP` (or `ENOTDIR`).
pub(crate) fn open_beneath(dir: impl AsFd, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let Some(parts) = components(rel) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path leaves its directory"));
    };
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let joined: Vec<u8> = match parts.is_empty() {
        true => b".".to_vec(),
        false => parts.iter().map(|p| p.as_bytes()).collect::<Vec<_>>().join(&b'/'),
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir.as_fd(), OsStr::from_bytes(&joined), flags, Mode::empty(), resolve) {
        Ok(fd) => return Ok(fd),
        // Kernels before 5.6 (or a filter refusing the call): one
        // component at a time.
        Err(e) if e == rustix::io::Errno::NOSYS || e == rustix::io::Errno::PERM => {}
        // openat2 asks for a retry when a rename raced the lookup.
        Err(e) if e == rustix::io::Errno::AGAIN => {}
        Err(e) => return Err(e.into()),
    }
    let dflags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Some((last, path)) = parts.split_last() else {
        return Ok(rustix::fs::openat(dir.as_fd(), ".", flags, Mode::empty())?);
    };
    let mut cur: Option<OwnedFd> = None;
    for p in path {
        let next = match &cur {
            Some(fd) => rustix::fs::openat(fd, *p, dflags, Mode::empty())?,
            None => rustix::fs::openat(dir.as_fd(), *p, dflags, Mode::empty())?,
        };
        cur = Some(next);
    }
    Ok(match &cur {
        Some(fd) => rustix::fs::openat(fd, *last, flags, Mode::empty())?,
        None => rustix::fs::openat(dir.as_fd(), *last, flags, Mode::empty())?,
    })
}

/// A restore target below a trusted directory: `path` names it through an
/// open descriptor of its parent (`/proc/self/fd/N/<name>`), so restoring
/// there never follows a symbolic link on the way to it, whatever the
/// names on the way become meanwhile. Keep it alive while `path` is used.
#[derive(Debug)]
pub struct Target {
    _parent: OwnedFd,
    /// The target through its parent's descriptor.
    pub path: std::path::PathBuf,
}

/// The restore target `rel` below `base` (names only: no `..`, not
/// absolute, not empty): its missing parent directories are made one at a
/// time, none followed if it is a symbolic link ([`crate::CacheError::Refused`]).
/// The target itself may be anything: a restore replaces it without
/// following it.
pub fn target_within(declared: &str, base: &Path, rel: &Path) -> Result<Target, crate::CacheError> {
    let refused = |why: &str| crate::CacheError::Refused(format!("path {declared:?} {why}"));
    let parts = match components(rel) {
        Some(p) if !rel.is_absolute() && !p.is_empty() => p,
        _ => return Err(refused("leaves the workspace")),
    };
    let (last, dirs) = parts.split_last().expect("not empty");
    let mut cur = open_dir(base).map_err(|e| crate::io_err(format_args!("opening {}", base.display()), e))?;
    let dflags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for d in dirs {
        let next = match rustix::fs::openat(&cur, *d, dflags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if e == rustix::io::Errno::NOENT => {
                match rustix::fs::mkdirat(&cur, *d, Mode::from_raw_mode(0o755)) {
                    Ok(()) => {}
                    Err(e) if e == rustix::io::Errno::EXIST => {}
                    Err(e) => {
                        return Err(crate::io_err(format_args!("creating the parents of {declared:?}"), e.into()));
                    }
                }
                rustix::fs::openat(&cur, *d, dflags, Mode::empty()).map_err(|e| match e {
                    rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                        refused("is reached through a symbolic link (or a file): links are never followed")
                    }
                    e => crate::io_err(format_args!("opening the parents of {declared:?}"), e.into()),
                })?
            }
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(refused("is reached through a symbolic link (or a file): links are never followed"));
            }
            Err(e) => return Err(crate::io_err(format_args!("opening the parents of {declared:?}"), e.into())),
        };
        cur = next;
    }
    let path = Path::new(&format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&cur))).join(last);
    Ok(Target { _parent: cur, path })
}

/// How many names each of the files `wanted` (`(st_dev, st_ino)` →
/// `st_nlink`) has below the directories `roots` (trusted as named), for
/// the hard-link rule of artifacts (issue 41, item 4): a file whose every
/// link is in the workspace may be published, one with a name elsewhere
/// may not. Every directory is opened from its parent without following a
/// symbolic link (a directory swapped for a link meanwhile is not
/// entered), only directories on the files' filesystems are entered (a
/// hard link never crosses one), and the walk stops once every file's
/// names are all found. A root that does not exist counts nothing.
pub fn count_names(
    roots: &[&Path],
    wanted: &std::collections::HashMap<(u64, u64), u64>,
) -> io::Result<std::collections::HashMap<(u64, u64), u64>> {
    use std::collections::HashMap;
    let mut found: HashMap<(u64, u64), u64> = HashMap::new();
    let devs: std::collections::HashSet<u64> = wanted.keys().map(|k| k.0).collect();
    let done = |found: &HashMap<(u64, u64), u64>| wanted.iter().all(|(k, n)| found.get(k).copied().unwrap_or(0) >= *n);
    if wanted.is_empty() {
        return Ok(found);
    }
    for root in roots {
        let fd = match open_dir(root) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut stack = vec![fd];
        while let Some(dir) = stack.pop() {
            for ent in rustix::fs::Dir::read_from(&dir)? {
                let ent = ent?;
                let name = ent.file_name();
                if name.to_bytes() == b"." || name.to_bytes() == b".." {
                    continue;
                }
                let st = match rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    // Gone meanwhile.
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                };
                let dev = st.st_dev as u64;
                match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                    rustix::fs::FileType::Directory if devs.contains(&dev) => {
                        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                        match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
                            Ok(sub) => stack.push(sub),
                            Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    rustix::fs::FileType::RegularFile if st.st_nlink > 1 => {
                        let key = (dev, st.st_ino as u64);
                        if wanted.contains_key(&key) {
                            *found.entry(key).or_default() += 1;
                            if done(&found) {
                                return Ok(found);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(found)
}

/// Whether an error of [`open_beneath`] means a symbolic link was in the way.
pub(crate) fn is_link_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_hard_links_are_counted_below_the_roots_only() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (ws, out) = (dir.path().join("ws"), dir.path().join("out"));
        std::fs::create_dir_all(ws.join("target/release/deps")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        // Cargo's shape: two names, both in the workspace.
        std::fs::write(ws.join("target/release/deps/app-1234"), b"elf").unwrap();
        std::fs::hard_link(ws.join("target/release/deps/app-1234"), ws.join("target/release/app")).unwrap();
        // One name in, one out; and a link to a directory holding the other name.
        std::fs::write(out.join("secret"), b"s").unwrap();
        std::fs::hard_link(out.join("secret"), ws.join("stolen")).unwrap();
        std::os::unix::fs::symlink(&out, ws.join("up")).unwrap();
        let key = |p: &Path| {
            let m = std::fs::symlink_metadata(p).unwrap();
            ((m.dev(), m.ino()), m.nlink())
        };
        let (app, stolen) = (key(&ws.join("target/release/app")), key(&ws.join("stolen")));
        let wanted = std::collections::HashMap::from([app, stolen]);
        let found = count_names(&[&ws], &wanted).unwrap();
        assert_eq!(found.get(&app.0), Some(&2));
        assert_eq!(found.get(&stolen.0), Some(&1), "the link `up` is not followed");
        let found = count_names(&[&ws, &out], &wanted).unwrap();
        assert_eq!(found.get(&stolen.0), Some(&2));
        assert!(count_names(&[&dir.path().join("missing")], &wanted).unwrap().is_empty());
    }

    #[test]
    fn links_on_the_way_and_at_the_end_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"x").unwrap();
        std::fs::write(out.path().join("f"), b"outside").unwrap();
        std::os::unix::fs::symlink(out.path(), dir.path().join("a/up")).unwrap();
        std::os::unix::fs::symlink(out.path().join("f"), dir.path().join("a/lf")).unwrap();
        let root = open_dir(dir.path()).unwrap();
        assert!(open_beneath(&root, Path::new("a/b/f"), OFlags::RDONLY).is_ok());
        assert!(open_beneath(&root, Path::new(""), OFlags::DIRECTORY).is_ok());
        for p in ["a/up/f", "a/up", "a/lf"] {
            let e = open_beneath(&root, Path::new(p), OFlags::RDONLY).unwrap_err();
            assert!(is_link_error(&e), "{p}: {e}");
        }
        assert!(open_beneath(&root, Path::new("../x"), OFlags::RDONLY).is_err());
        assert!(open_beneath(&root, Path::new("/etc"), OFlags::RDONLY).is_err());
    }
}
