//! Job slots that keep their sandbox (host executor, issue 20).
//!
//! Creating and deleting an attempt's directories was most of a no-op
//! job's cost on ext4: about twenty inodes made and freed per attempt, and
//! every new inode searched past the recently freed ones. Each of an
//! agent's `max_jobs` slots therefore keeps one sandbox,
//! `<sandbox root>/slot-<n>-<random>/` (`ws/`, `home/`, `tmp/`,
//! `outputs/output`), from one attempt to the next (renamed to a new random
//! name in between), and puts it back in place instead:
//!
//! - **after an attempt** (once every process of the job is gone: PID
//!   namespaces, and the sandbox's cleanup succeeded) the workspace is
//!   brought back to its commit's pristine tree ([`sync_tree`]), `home/` and
//!   `tmp/` are emptied, the output file is emptied, and anything else is
//!   moved out. What a job leaves (its `$HOME`, build outputs, a token in
//!   a file) does not wait for the next job to be removed.
//! - **before the next** the workspace is brought to that job's commit the
//!   same way.
//!
//! The rules of a reset: every entry is checked with `lstat` and opened
//! without following links; a file is kept only if it is a regular file
//! with one link (no other name anywhere, so nothing outside can change it
//! later), with the pristine file's bytes, extended attributes and inode
//! flags; a directory only if it is a real directory with the pristine
//! one's extended attributes and flags; a link only if it names the same
//! target. Anything else is renamed out of the tree at once and deleted in
//! the background ([`Doomed`]), and the pristine entry copied in its place;
//! modes are set back. When anything cannot be checked or fixed, the whole
//! sandbox is dropped and the next attempt makes a fresh one.
//!
//! A slot whose job could have left a process running (no PID namespaces,
//! or a failed cleanup) is never reused. The slot's directory name is
//! random and changes after every job, so a step of another slot (the same
//! step user) can neither guess it under the sandbox root it may traverse
//! but not list, nor reuse a path an earlier job's log showed.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The kept sandboxes of an agent's host job slots.
pub(crate) struct Slots {
    root: PathBuf,
    kept: Mutex<HashMap<u32, Kept>>,
}

/// A slot's kept sandbox, and the tree its workspace was brought to when
/// the last job ended (nothing ran in it since): the next job of that tree
/// needs no checkout.
struct Kept {
    dir: PathBuf,
    tree: Option<String>,
    /// Its workspace's entries are the step user's already, but for `.git`
    /// (brought back in place by [`crate::kept`]).
    owned: bool,
}

impl Slots {
    pub(crate) fn new(root: PathBuf) -> Self {
        Slots { root, kept: Mutex::default() }
    }

    /// The slot's kept sandbox (`true`: it exists and was reset) with the
    /// tree its workspace is at, if known, else a new random name for one
    /// (not made yet).
    pub(crate) fn take(&self, slot: u32) -> (PathBuf, bool, Option<String>, bool) {
        match self.kept.lock().expect("slots").remove(&slot) {
            Some(k) => (k.dir, true, k.tree, k.owned),
            None => (self.fresh_name(slot), false, None, false),
        }
    }

    fn fresh_name(&self, slot: u32) -> PathBuf {
        self.root.join(format!("slot-{slot}-{}", uuid::Uuid::new_v4().simple()))
    }

    /// Keeps `dir` (reset) for the slot's next attempt, under a new random
    /// name: the path a job saw (its log may show it to anyone who reads
    /// the run) leads nowhere once it ended. A rename, not a new inode.
    /// `tree`: what its workspace is at (see [`Slots::take`]).
    pub(crate) fn keep(&self, slot: u32, dir: &Path, tree: Option<String>, owned: bool) -> io::Result<()> {
        let next = self.fresh_name(slot);
        std::fs::rename(dir, &next)?;
        self.kept.lock().expect("slots").insert(slot, Kept { dir: next, tree, owned });
        Ok(())
    }

    /// Every kept sandbox, forgotten (for removal when the agent stops).
    pub(crate) fn drain(&self) -> Vec<PathBuf> {
        self.kept.lock().expect("slots").drain().map(|(_, k)| k.dir).collect()
    }
}

/// Paths renamed out of their tree, to be deleted in the background.
pub(crate) struct Doomed {
    root: PathBuf,
    paths: Vec<PathBuf>,
}

impl Doomed {
    /// Doomed entries are renamed to `<root>/.trash-<random>` (the root must
    /// be on the same file system, and is emptied when the agent starts).
    pub(crate) fn new(root: &Path) -> Self {
        Doomed { root: root.to_path_buf(), paths: vec![] }
    }

    /// Moves `path` (of any type) out of its tree at once.
    pub(crate) fn take(&mut self, path: &Path) -> io::Result<()> {
        let to = self.root.join(format!(".trash-{}", uuid::Uuid::new_v4().simple()));
        std::fs::rename(path, &to)?;
        self.paths.push(to);
        Ok(())
    }

    /// Deletes what was taken on a blocking thread; nothing waits for it.
    pub(crate) fn bury(self) {
        if self.paths.is_empty() {
            return;
        }
        let paths = self.paths;
        let delete = move || {
            for p in paths {
                let r = match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.is_dir() => kiln_sandbox::remove_tree(&p),
                    Ok(_) => std::fs::remove_file(&p),
                    Err(_) => Ok(()),
                };
                if let Err(e) = r {
                    tracing::warn!(path = %p.display(), error = %e, "cannot delete what a job left");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(delete)),
            Err(_) => drop(std::thread::spawn(delete)),
        }
    }
}

/// Extended attributes (names and values, sorted) and inode flags
/// (`chattr`) of an open file or directory: what it carries besides bytes
/// and mode (ACLs and file capabilities are extended attributes).
type Extras = (Vec<(OsString, Vec<u8>)>, u32);

/// The inode flags a user may set (ext4's `EXT4_FL_USER_MODIFIABLE`); the
/// others are the file system's own (a directory that once held many
/// entries keeps its hash index, `I`, after they are gone).
const USER_FLAGS: u32 = 0x604B_C0FF;

fn extras_of(f: &File) -> io::Result<Extras> {
    use xattr::FileExt;
    let mut attrs = vec![];
    for name in f.list_xattr()? {
        let value = f.get_xattr(&name)?.unwrap_or_default();
        attrs.push((name, value));
    }
    attrs.sort();
    let flags = match rustix::fs::ioctl_getflags(f) {
        Ok(fl) => fl.bits() & USER_FLAGS,
        // A file system without inode flags.
        Err(e) if e == rustix::io::Errno::NOTTY || e == rustix::io::Errno::OPNOTSUPP => 0,
        Err(e) => return Err(e.into()),
    };
    Ok((attrs, flags))
}

/// Extended attributes of a symbolic link itself.
fn link_xattrs(p: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut attrs = vec![];
    for name in xattr::list(p)? {
        let value = xattr::get(p, &name)?.unwrap_or_default();
        attrs.push((name, value));
    }
    attrs.sort();
    Ok(attrs)
}

/// Opens a regular file without following a link (nor blocking on a fifo).
fn open_file(p: &Path) -> io::Result<File> {
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC;
    OpenOptions::new().read(true).custom_flags(flags.bits()).open(p)
}

/// [`open_file`] for writing.
fn open_file_rw(p: &Path) -> io::Result<File> {
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC;
    OpenOptions::new().write(true).custom_flags(flags.bits()).open(p)
}

/// Opens a directory without following a link.
pub(crate) fn open_dir(p: &Path) -> io::Result<File> {
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
    OpenOptions::new().read(true).custom_flags(flags.bits()).open(p)
}

fn mode(m: &std::fs::Metadata) -> u32 {
    m.mode() & 0o7777
}

fn same_bytes(a: &mut File, b: &mut File) -> io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(a, &mut x)?;
        let m = read_full(b, &mut y)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Makes the existing directory `dst` hold exactly the tree `src`
/// (directories, regular files and symbolic links; see the module docs
/// for what is kept). `skip`: a path under `dst` left as it is (neither
/// checked, removed nor filled). Err when `dst` itself is not a directory
/// like `src` or something could not be fixed: the caller drops `dst`.
pub(crate) fn sync_tree(src: &Path, dst: &Path, skip: Option<&Path>, doomed: &mut Doomed) -> io::Result<()> {
    let sm = std::fs::symlink_metadata(src)?;
    if !sync_entry(src, &sm, dst, skip, doomed)? {
        return Err(io::Error::other(format!("{} is not a directory like {}", dst.display(), src.display())));
    }
    Ok(())
}

/// Brings `dst` to `src` (`sm`: its metadata) in place; false when `dst`
/// must be replaced instead (another type, a second link, other attributes
/// or flags, a file that cannot be opened).
fn sync_entry(
    src: &Path,
    sm: &std::fs::Metadata,
    dst: &Path,
    skip: Option<&Path>,
    doomed: &mut Doomed,
) -> io::Result<bool> {
    let dm = std::fs::symlink_metadata(dst)?;
    let st = sm.file_type();
    if st.is_symlink() {
        return Ok(dm.file_type().is_symlink()
            && std::fs::read_link(dst)? == std::fs::read_link(src)?
            && link_xattrs(dst)? == link_xattrs(src)?);
    }
    if st.is_file() {
        if !dm.is_file() || dm.nlink() != 1 || dm.len() != sm.len() {
            return Ok(false);
        }
        let Ok(mut d) = open_file(dst) else { return Ok(false) };
        let odm = d.metadata()?;
        if !odm.is_file() || odm.ino() != dm.ino() || odm.nlink() != 1 {
            return Ok(false);
        }
        let mut s = open_file(src)?;
        if extras_of(&d)? != extras_of(&s)? || !same_bytes(&mut s, &mut d)? {
            return Ok(false);
        }
        if mode(&odm) != mode(sm) {
            d.set_permissions(std::fs::Permissions::from_mode(mode(sm)))?;
        }
        return Ok(true);
    }
    if !st.is_dir() || !dm.is_dir() {
        return Ok(false);
    }
    let Ok(d) = open_dir(dst) else { return Ok(false) };
    let odm = d.metadata()?;
    if !odm.is_dir() || odm.ino() != dm.ino() || extras_of(&d)? != extras_of(&open_dir(src)?)? {
        return Ok(false);
    }
    if mode(&odm) & 0o700 != 0o700 {
        // Entries are renamed out and copied in: the agent needs all rights.
        d.set_permissions(std::fs::Permissions::from_mode(mode(&odm) | 0o700))?;
    }
    let mut want: HashMap<OsString, std::fs::Metadata> = HashMap::new();
    for e in std::fs::read_dir(src)? {
        let e = e?;
        want.insert(e.file_name(), e.metadata()?);
    }
    for e in std::fs::read_dir(dst)? {
        let e = e?;
        let (name, path) = (e.file_name(), e.path());
        if skip == Some(path.as_path()) {
            want.remove(&name);
            continue;
        }
        match want.remove(&name) {
            None => doomed.take(&path)?,
            Some(sm) => {
                let from = src.join(&name);
                let kept = match sync_entry(&from, &sm, &path, skip, doomed) {
                    Ok(k) => k,
                    // Unreadable for the agent (a non-root agent, a mode 000 file).
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => false,
                    Err(e) => return Err(e),
                };
                if !kept {
                    doomed.take(&path)?;
                    copy_tree(&from, &path, &mut Budget::unlimited())?;
                }
            }
        }
    }
    for name in want.into_keys() {
        let path = dst.join(&name);
        if skip != Some(path.as_path()) {
            copy_tree(&src.join(&name), &path, &mut Budget::unlimited())?;
        }
    }
    if mode(&d.metadata()?) != mode(sm) {
        d.set_permissions(std::fs::Permissions::from_mode(mode(sm)))?;
    }
    Ok(true)
}

/// Keeps in `ws_objects` (a workspace's own object store, whose files are
/// hard links to the mirror's, see `checkout`) only what is still the
/// mirror's: a file that is the very inode of the mirror's file at the same
/// path, a real directory where the mirror has one (with its mode, and the
/// mirror's directory's attributes and flags). Everything else is doomed.
pub(crate) fn prune_objects(ws_objects: &Path, mirror_objects: &Path, doomed: &mut Doomed) -> io::Result<()> {
    for e in std::fs::read_dir(ws_objects)? {
        let e = e?;
        let (path, theirs) = (e.path(), mirror_objects.join(e.file_name()));
        let ours = std::fs::symlink_metadata(&path)?;
        let keep = match std::fs::symlink_metadata(&theirs) {
            Ok(m) if m.is_file() => ours.is_file() && (ours.dev(), ours.ino()) == (m.dev(), m.ino()),
            Ok(m) if m.is_dir() && ours.is_dir() => {
                let d = open_dir(&path)?;
                if extras_of(&d)? == extras_of(&open_dir(&theirs)?)? {
                    if mode(&d.metadata()?) != mode(&m) {
                        d.set_permissions(std::fs::Permissions::from_mode(mode(&m) | 0o700))?;
                    }
                    prune_objects(&path, &theirs, doomed)?;
                    true
                } else {
                    false
                }
            }
            _ => false,
        };
        if !keep {
            doomed.take(&path)?;
        }
    }
    Ok(())
}

/// Puts a slot's sandbox (see the module docs) back to its skeleton,
/// except `ws/` (the caller syncs it): `home/`, `tmp/` and `shm/` emptied, the
/// output file kept but emptied, anything else doomed; the directory itself
/// and the kept ones get their mode back and must carry what a directory
/// the agent makes under `root` carries (attributes, flags), else they are
/// doomed too (the executor makes them again). Err: drop the whole sandbox.
pub(crate) fn reset_skeleton(slot: &Path, root: &Path, doomed: &mut Doomed) -> io::Result<()> {
    let plain = extras_of(&open_dir(root)?)?;
    let dir = open_dir(slot)?;
    if extras_of(&dir)? != plain {
        return Err(io::Error::other(format!("{} carries attributes or flags a job set", slot.display())));
    }
    dir.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    for e in std::fs::read_dir(slot)? {
        let e = e?;
        let (name, path) = (e.file_name(), e.path());
        let kept = match name.to_str() {
            Some("ws") => continue,
            Some("home" | "tmp" | "shm") => emptied(&path, 0o755, &plain, &[], doomed)?,
            Some("outputs") => emptied(&path, 0o700, &plain, &[crate::outputs::FILE], doomed)?,
            _ => false,
        };
        if !kept {
            doomed.take(&path)?;
        }
    }
    Ok(())
}

/// Empties the directory `dir` but for `keep` (regular files with one link
/// and the attributes `plain` lists, truncated) and gives it `dir_mode`;
/// false when `dir` is not a plain directory.
fn emptied(dir: &Path, dir_mode: u32, plain: &Extras, keep: &[&str], doomed: &mut Doomed) -> io::Result<bool> {
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Ok(false);
    }
    let d = open_dir(dir)?;
    if extras_of(&d)? != *plain {
        return Ok(false);
    }
    d.set_permissions(std::fs::Permissions::from_mode(dir_mode))?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let named = e.file_name().to_str().is_some_and(|n| keep.contains(&n));
        let m = std::fs::symlink_metadata(&path)?;
        let kept = named
            && m.is_file()
            && m.nlink() == 1
            && match open_file_rw(&path) {
                Ok(f) if f.metadata()?.ino() == m.ino() && extras_of(&f)?.0 == plain.0 => {
                    f.set_len(0)?;
                    true
                }
                _ => false,
            };
        if !kept {
            doomed.take(&path)?;
        }
    }
    Ok(true)
}

/// What a [`copy_tree`] may still copy.
pub(crate) struct Budget {
    files: u64,
    bytes: u64,
}

impl Budget {
    pub(crate) fn new(files: u64, bytes: u64) -> Self {
        Budget { files, bytes }
    }

    pub(crate) fn unlimited() -> Self {
        Budget { files: u64::MAX, bytes: u64::MAX }
    }

    fn take(&mut self, bytes: u64) -> std::io::Result<()> {
        if self.files == 0 || self.bytes < bytes {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        self.files -= 1;
        self.bytes -= bytes;
        Ok(())
    }
}

/// Copies the tree `src` to `dst` (which must not exist): directories,
/// regular files (content and mode) and symbolic links (never followed);
/// anything else is left out. New files everywhere, no hard links, so
/// nothing written under `dst` reaches `src`. Fails with `FileTooLarge`
/// past the budget.
pub(crate) fn copy_tree(src: &Path, dst: &Path, budget: &mut Budget) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(src)?;
    budget.take(if meta.is_file() { meta.len() } else { 0 })?;
    let ft = meta.file_type();
    if ft.is_dir() {
        match std::fs::DirBuilder::new().mode(0o700).create(dst) {
            Ok(()) => {}
            // An empty workspace made beforehand (a warm container has it bound).
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && std::fs::symlink_metadata(dst).is_ok_and(|m| m.is_dir())
                    && std::fs::read_dir(dst)?.next().is_none() => {}
            Err(e) => return Err(e),
        }
        for e in std::fs::read_dir(src)? {
            let e = e?;
            copy_tree(&e.path(), &dst.join(e.file_name()), budget)?;
        }
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777))?;
    } else if ft.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(src)?, dst)?;
    } else if ft.is_file() {
        std::fs::copy(src, dst)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
