//! Kept workspaces of big trees (issue 47, item 1).
//!
//! A job slot's workspace whose tree is too big for a pristine copy
//! ([`crate::checkout`]) is brought back to a commit in place instead of
//! being checked out afresh: for the same commit after every job (a rerun
//! then needs no checkout), and for `checkout: {reuse: true}` to the next
//! job's commit (trusted runs only).
//!
//! What the job changed is found without reading a byte of content: the
//! kernel sets an inode's change time (`ctime`) whenever its content, mode,
//! owner, links, name or extended attributes change, and no user process
//! can set it back. The slot records a *fence* just before its job's first
//! step (the kernel's own timestamp of that moment, see [`Fence::now`]);
//! afterwards every entry of the workspace is checked with `lstat`, never
//! following a link:
//!
//! - a file, link or other entry changed at or after the fence, or not in
//!   the commit's tree, is renamed out of the tree (deleted in the
//!   background);
//! - a directory not in the tree is renamed out; one changed since the
//!   fence (entries added or removed inside) is kept only with the mode a
//!   checkout gives it and no extended attributes (a default ACL), else
//!   renamed out;
//! - every file of the tree that is then missing is written again from the
//!   mirror's objects (`git cat-file --batch`): mode 0644 or 0755, links,
//!   empty directories for submodules.
//!
//! The workspace's `.git` is made again as for a fresh checkout, with a
//! copy of the index the agent kept (never the one the job could change).
//! Only the agent touches the tree meanwhile: a slot is reused only once
//! every process of its job is gone (see [`crate::slots`]).

use crate::slots::Doomed;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The agent's umask (what a fresh checkout's files and directories get:
/// git writes them under it), read once.
fn umask() -> u32 {
    static MASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_string())))
            .and_then(|v| u32::from_str_radix(&v, 8).ok())
            .unwrap_or(0o022)
    })
}

/// The mode a checkout gives a file (`exec`: git's 100755) or a directory.
fn checkout_mode(kind: Kind) -> u32 {
    let full = match kind {
        Kind::File => 0o666,
        Kind::Exec | Kind::Dir => 0o777,
    };
    full & !umask()
}

#[derive(Clone, Copy)]
enum Kind {
    File,
    Exec,
    Dir,
}

/// The moment (ns since the epoch) after which a change to the workspace
/// is the job's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fence(i128);

impl Fence {
    /// A fence nothing is after: only what differs from the tree counts.
    pub(crate) const NEVER: Fence = Fence(i128::MAX);

    /// The kernel's own timestamp of now, read from a file `marker`
    /// changed for it: every later change has a `ctime` at or after the
    /// fence (the kernel's timestamps never go back), every earlier one
    /// before it or — on a kernel whose timestamps are coarse, in the same
    /// tick — equal to it, and so counted as the job's: at worst a file the
    /// agent wrote just before the steps is taken out and written again.
    /// (It waited for the next tick before, up to one or two: a millisecond
    /// or more before every job's first step, for nothing on a kernel with
    /// fine-grained `ctime`s, Linux 6.13 on.)
    pub(crate) fn now(marker: &Path) -> io::Result<Fence> {
        std::fs::write(marker, b"")?;
        let m = std::fs::symlink_metadata(marker)?;
        Ok(Fence(i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())))
    }

    /// For tests: the system clock less a generous margin.
    #[cfg(test)]
    fn clock() -> Fence {
        let t = std::time::SystemTime::now()
            .checked_sub(std::time::Duration::from_millis(100))
            .unwrap_or(std::time::UNIX_EPOCH);
        Fence(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128))
    }

    fn changed(&self, m: &std::fs::Metadata) -> bool {
        i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()) >= self.0
    }
}

/// One entry of a commit's tree (`git ls-tree -r`): its git mode and object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) mode: u32,
    pub(crate) oid: String,
}

/// A commit's tree: every path (blobs, links, submodules) and every directory.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub(crate) files: HashMap<PathBuf, Entry>,
    pub(crate) dirs: HashSet<PathBuf>,
}

impl Tree {
    /// From `git ls-tree -r -z --full-tree` output.
    pub(crate) fn parse(out: &[u8]) -> io::Result<Tree> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected `git ls-tree` output");
        let mut t = Tree::default();
        for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let tab = rec.iter().position(|b| *b == b'\t').ok_or_else(bad)?;
            let (meta, path) = (std::str::from_utf8(&rec[..tab]).map_err(|_| bad())?, &rec[tab + 1..]);
            let mut parts = meta.split(' ');
            let mode = u32::from_str_radix(parts.next().ok_or_else(bad)?, 8).map_err(|_| bad())?;
            let _kind = parts.next().ok_or_else(bad)?;
            let oid = parts.next().ok_or_else(bad)?.to_string();
            let path = PathBuf::from(OsStr::from_bytes(path));
            // A path git would refuse to check out is refused here too.
            if path.is_absolute() || path.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
                return Err(bad());
            }
            let mut parent = path.parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                if !t.dirs.insert(p.to_path_buf()) {
                    break;
                }
                parent = p.parent();
            }
            t.files.insert(path, Entry { mode, oid });
        }
        Ok(t)
    }
}

/// Whether nothing in `ws` changed at or after `fence`: neither the
/// directory itself nor any entry under it (a name added, removed or
/// renamed changes its directory's `ctime`; content, mode, owner, links and
/// extended attributes the entry's own). Reads no content: one `lstat` per
/// entry. A slot whose workspace is still what it was when its job's steps
/// began needs no compare with its pristine tree (see [`crate::slots`]).
pub(crate) fn unchanged_since(ws: &Path, fence: Fence) -> io::Result<bool> {
    let root = std::fs::symlink_metadata(ws)?;
    if fence.changed(&root) || !root.is_dir() {
        return Ok(false);
    }
    let mut stack = vec![ws.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            // `lstat` of the entry (relative to its directory): never a link's target.
            let m = e.metadata()?;
            if fence.changed(&m) {
                return Ok(false);
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(true)
}

/// What [`sweep`] found: the tree's paths still in place.
pub(crate) struct Swept {
    pub(crate) present: HashSet<PathBuf>,
    pub(crate) doomed: usize,
}

/// Renames out of `ws` every entry changed since `fence` or not in `tree`,
/// and the paths of `stale` (files whose content the target commit
/// changes); the top-level `.git` goes too.
pub(crate) fn sweep(
    ws: &Path,
    tree: &Tree,
    stale: &HashSet<PathBuf>,
    fence: Fence,
    doomed: &mut Doomed,
) -> io::Result<Swept> {
    let mut out = Swept { present: HashSet::new(), doomed: 0 };
    // The workspace itself is the step user's: it must still be a real
    // directory as a checkout made it (never a link to follow).
    let root = std::fs::symlink_metadata(ws)?;
    if !root.is_dir() || (fence.changed(&root) && !plain_dir(ws, &root)?) {
        return Err(io::Error::other(format!("{} is not the workspace directory the checkout made", ws.display())));
    }
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = ws.join(&rel);
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name();
            let path = rel.join(&name);
            if rel.as_os_str().is_empty() && name == ".git" {
                doomed.take(&e.path())?;
                continue;
            }
            let m = std::fs::symlink_metadata(e.path())?;
            let keep = if m.is_dir() {
                tree.dirs.contains(&path) && (!fence.changed(&m) || plain_dir(&e.path(), &m)?)
            } else {
                let want = tree.files.get(&path);
                match want {
                    Some(w) if !fence.changed(&m) && !stale.contains(&path) && same_kind(w.mode, &m) => {
                        // A submodule's directory is an ordinary directory here.
                        true
                    }
                    _ => false,
                }
            };
            if !keep {
                doomed.take(&e.path())?;
                out.doomed += 1;
            } else if m.is_dir() {
                if tree.files.get(&path).is_some_and(|w| w.mode == 0o160000) {
                    out.present.insert(path.clone());
                }
                stack.push(path);
            } else {
                out.present.insert(path);
            }
        }
    }
    Ok(out)
}

/// Whether an entry of the workspace is of the kind the tree says (a
/// change of its mode moved its `ctime` past the fence).
fn same_kind(git_mode: u32, m: &std::fs::Metadata) -> bool {
    match git_mode {
        0o120000 => m.file_type().is_symlink(),
        0o100755 => m.is_file() && m.mode() & 0o100 != 0 && m.nlink() == 1,
        0o100644 => m.is_file() && m.mode() & 0o100 == 0 && m.nlink() == 1,
        _ => false,
    }
}

/// A directory changed since the fence is kept when it is as a checkout
/// makes it: its mode, no extended attributes (a default ACL).
fn plain_dir(p: &Path, m: &std::fs::Metadata) -> io::Result<bool> {
    if m.mode() & 0o7777 != checkout_mode(Kind::Dir) {
        return Ok(false);
    }
    Ok(xattr::list(p)?.next().is_none())
}

/// Brings a workspace that holds exactly one commit's tree (nothing ran in
/// it since it was brought there) to another's, from `git diff-tree -r -z
/// --no-renames` output between them: what the second commit deletes or
/// changes is renamed out (directories left empty removed), what it adds
/// or changes is written. Returns (renamed out, written).
pub(crate) fn apply_diff(
    ws: &Path,
    git_dir: &Path,
    raw: &[u8],
    doomed: &mut Doomed,
    owner: Option<(u32, u32)>,
) -> io::Result<(usize, usize)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected `git diff-tree` output");
    let mut fields = raw.split(|b| *b == 0).filter(|f| !f.is_empty());
    let mut gone: Vec<PathBuf> = vec![];
    let mut wanted = Tree::default();
    while let Some(meta) = fields.next() {
        let path = fields.next().ok_or_else(bad)?;
        let meta = std::str::from_utf8(meta).map_err(|_| bad())?;
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [_, new_mode, _, new_oid, status] = parts[..] else { return Err(bad()) };
        let path = PathBuf::from(OsStr::from_bytes(path));
        if path.is_absolute() || path.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(bad());
        }
        if status != "A" {
            gone.push(path.clone());
        }
        if status != "D" {
            let mode = u32::from_str_radix(new_mode, 8).map_err(|_| bad())?;
            wanted.files.insert(path, Entry { mode, oid: new_oid.to_string() });
        }
    }
    let mut renamed = 0;
    for p in &gone {
        let full = ws.join(p);
        match std::fs::symlink_metadata(&full) {
            Ok(_) => {
                doomed.take(&full)?;
                renamed += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // A directory the second commit no longer has files in goes too.
        let mut parent = p.parent();
        while let Some(d) = parent.filter(|d| !d.as_os_str().is_empty()) {
            if std::fs::remove_dir(ws.join(d)).is_err() {
                break;
            }
            parent = d.parent();
        }
    }
    let written = restore(ws, git_dir, &wanted, &HashSet::new(), owner)?;
    Ok((renamed, written))
}

/// `git cat-file --batch` on the repository `git_dir`, its stdin and
/// stdout piped; never fetching a missing object.
pub(crate) fn cat_file_batch(git_dir: &Path) -> io::Result<std::process::Child> {
    Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["cat-file", "--batch"])
        .env("GIT_NO_LAZY_FETCH", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
}

/// Writes every file of `tree` not in `present` from the objects of the
/// repository `git_dir` (one `git cat-file --batch`), with the modes a
/// checkout gives them; nothing existing is followed or overwritten.
/// Returns how many entries were written.
pub(crate) fn restore(
    ws: &Path,
    git_dir: &Path,
    tree: &Tree,
    present: &HashSet<PathBuf>,
    owner: Option<(u32, u32)>,
) -> io::Result<usize> {
    let give = |p: &Path| -> io::Result<()> {
        match owner {
            Some((uid, gid)) => std::os::unix::fs::lchown(p, Some(uid), Some(gid)),
            None => Ok(()),
        }
    };
    let mut missing: Vec<(&PathBuf, &Entry)> = tree.files.iter().filter(|(p, _)| !present.contains(*p)).collect();
    if missing.is_empty() {
        return Ok(0);
    }
    missing.sort_by(|a, b| a.0.cmp(b.0));
    let mut dirs_made: HashSet<PathBuf> = HashSet::new();
    let mut mkdirs = |rel: &Path| -> io::Result<()> {
        let mut todo = vec![];
        let mut p = rel;
        while !p.as_os_str().is_empty() && !dirs_made.contains(p) {
            todo.push(p.to_path_buf());
            p = p.parent().unwrap_or(Path::new(""));
        }
        for d in todo.into_iter().rev() {
            let mode = checkout_mode(Kind::Dir);
            match std::fs::DirBuilder::new().mode(mode).create(ws.join(&d)) {
                Ok(()) => {
                    std::fs::set_permissions(ws.join(&d), std::fs::Permissions::from_mode(mode))?;
                    give(&ws.join(&d))?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // Kept by the sweep: a real directory (never a link).
                    if !std::fs::symlink_metadata(ws.join(&d))?.is_dir() {
                        return Err(io::Error::other(format!("{} is not a directory", d.display())));
                    }
                }
                Err(e) => return Err(e),
            }
            dirs_made.insert(d);
        }
        Ok(())
    };
    // Blobs and links come from git; submodules are empty directories.
    let blobs: Vec<&(&PathBuf, &Entry)> = missing.iter().filter(|(_, e)| e.mode != 0o160000).collect();
    for (p, e) in &missing {
        if e.mode == 0o160000 {
            mkdirs(p)?;
        }
    }
    if blobs.is_empty() {
        return Ok(missing.len());
    }
    let mut child = cat_file_batch(git_dir)?;
    let mut stdin = child.stdin.take().expect("stdin");
    let oids: Vec<String> = blobs.iter().map(|(_, e)| e.oid.clone()).collect();
    let writer = std::thread::spawn(move || -> io::Result<()> {
        let mut w = io::BufWriter::new(&mut stdin);
        for oid in oids {
            writeln!(w, "{oid}")?;
        }
        w.flush()
    });
    let mut r = io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut header = String::new();
    let mut result = Ok(());
    for (rel, e) in &blobs {
        header.clear();
        r.read_line(&mut header)?;
        let mut parts = header.split_whitespace();
        let (oid, kind, size) = (parts.next(), parts.next(), parts.next().and_then(|s| s.parse::<usize>().ok()));
        let Some(size) = size.filter(|_| oid == Some(e.oid.as_str()) && kind == Some("blob")) else {
            result =
                Err(io::Error::other(format!("object {} of {} is missing: {}", e.oid, rel.display(), header.trim())));
            break;
        };
        let mut data = vec![0u8; size + 1];
        r.read_exact(&mut data)?;
        data.truncate(size);
        if let Some(parent) = rel.parent() {
            mkdirs(parent)?;
        }
        let path = ws.join(rel);
        if e.mode == 0o120000 {
            std::os::unix::fs::symlink(OsStr::from_bytes(&data), &path)?;
            give(&path)?;
        } else {
            let mode = checkout_mode(if e.mode == 0o100755 { Kind::Exec } else { Kind::File });
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                .open(&path)?;
            f.write_all(&data)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            give(&path)?;
        }
    }
    drop(r);
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.join();
    result.map(|()| missing.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    /// A repository with files, an executable, a link and nested directories.
    fn repo() -> (tempfile::TempDir, String) {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("r");
        std::fs::create_dir_all(r.join("src/deep")).unwrap();
        std::fs::write(r.join("README"), "hello\n").unwrap();
        std::fs::write(r.join("src/a.rs"), "fn a() {}\n").unwrap();
        std::fs::write(r.join("src/deep/b.rs"), "fn b() {}\n").unwrap();
        std::fs::write(r.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(r.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("src/a.rs", r.join("link")).unwrap();
        git(&r, &["init", "-q", "-b", "main"]);
        git(&r, &["add", "."]);
        git(&r, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"]);
        let sha = String::from_utf8(git(&r, &["rev-parse", "HEAD"])).unwrap().trim().to_string();
        (d, sha)
    }

    fn tree(d: &Path, sha: &str) -> Tree {
        Tree::parse(&git(&d.join("r"), &["ls-tree", "-r", "-z", "--full-tree", sha])).unwrap()
    }

    /// Every file below `ws` but `.git`, with its bytes (links: their target).
    fn contents(ws: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
        let mut out = vec![];
        let mut stack = vec![ws.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let m = std::fs::symlink_metadata(e.path()).unwrap();
                let rel = e.path().strip_prefix(ws).unwrap().to_path_buf();
                if rel == Path::new(".git") {
                    continue;
                }
                if m.is_dir() {
                    out.push((rel, vec![], m.mode() & 0o7777));
                    stack.push(e.path());
                } else if m.file_type().is_symlink() {
                    out.push((rel, std::fs::read_link(e.path()).unwrap().into_os_string().into_vec(), 0));
                } else {
                    out.push((rel, std::fs::read(e.path()).unwrap(), m.mode() & 0o7777));
                }
            }
        }
        out.sort();
        out
    }

    use std::os::unix::ffi::OsStringExt;

    /// The fence the agent takes before a job's first step: what changes
    /// after it is after it (content, mode, a new name), what was last
    /// changed well before it is not.
    #[test]
    fn the_fence_orders_changes_by_the_kernels_own_clock() {
        let d = tempfile::tempdir().unwrap();
        let (before, after, renamed) = (d.path().join("before"), d.path().join("after"), d.path().join("renamed"));
        for p in [&before, &after, &renamed] {
            std::fs::write(p, "x").unwrap();
        }
        // Longer than any kernel's timestamp tick.
        std::thread::sleep(Duration::from_millis(50));
        let fence = Fence::now(&d.path().join("marker")).unwrap();
        let meta = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        assert!(!fence.changed(&meta(&before)) && !fence.changed(&meta(&after)));
        std::fs::write(&after, "y").unwrap();
        std::fs::rename(&renamed, d.path().join("moved")).unwrap();
        std::fs::set_permissions(&before, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(fence.changed(&meta(&after)), "content");
        assert!(fence.changed(&meta(&d.path().join("moved"))), "a new name");
        assert!(fence.changed(&meta(&before)), "a mode");
        assert!(fence.changed(&meta(d.path())), "the directory that lost and gained a name");
    }

    /// Each way a job can change a workspace is seen, however deep; a
    /// workspace nobody touched since the fence is unchanged.
    #[test]
    fn a_change_anywhere_in_the_workspace_since_the_fence_is_seen() {
        let d = tempfile::tempdir().unwrap();
        type Change = (&'static str, fn(&Path));
        let changes: [Change; 7] = [
            ("nothing", |_| {}),
            ("content deep down", |ws| std::fs::write(ws.join("a/b/c/file"), "changed").unwrap()),
            ("a new file deep down", |ws| std::fs::write(ws.join("a/b/c/new"), "").unwrap()),
            ("a removed file", |ws| std::fs::remove_file(ws.join("a/b/c/file")).unwrap()),
            ("a directory's mode", |ws| {
                std::fs::set_permissions(ws.join("a/b"), std::fs::Permissions::from_mode(0o777)).unwrap()
            }),
            ("a link replacing a file", |ws| {
                std::fs::remove_file(ws.join("top")).unwrap();
                std::os::unix::fs::symlink("/etc", ws.join("top")).unwrap();
            }),
            ("a hard link made elsewhere", |ws| std::fs::hard_link(ws.join("top"), ws.with_extension("out")).unwrap()),
        ];
        for (i, (what, change)) in changes.iter().enumerate() {
            let ws = d.path().join(format!("ws{i}"));
            std::fs::create_dir_all(ws.join("a/b/c")).unwrap();
            std::fs::write(ws.join("a/b/c/file"), "x").unwrap();
            std::fs::write(ws.join("top"), "x").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let fence = Fence::now(&d.path().join("marker")).unwrap();
            change(&ws);
            assert_eq!(unchanged_since(&ws, fence).unwrap(), *what == "nothing", "{what}");
        }
    }

    #[test]
    fn a_workspace_the_job_changed_is_brought_back_to_its_tree() {
        let (d, sha) = repo();
        let r = d.path().join("r");
        let t = tree(d.path(), &sha);
        // The pristine tree: a fresh clone's files.
        let clean = d.path().join("clean");
        git(d.path(), &["clone", "-q", "--shared", "r", "clean"]);
        let expect = contents(&clean);
        let ws = d.path().join("ws");
        git(d.path(), &["clone", "-q", "--shared", "r", "ws"]);
        // Files written before the fence are the checkout's.
        std::thread::sleep(Duration::from_millis(200));
        let fence = Fence::clock();
        std::thread::sleep(Duration::from_millis(20));
        // What a job does.
        std::fs::write(ws.join("src/a.rs"), "changed\n").unwrap();
        std::fs::remove_file(ws.join("README")).unwrap();
        std::fs::write(ws.join("src/deep/new.rs"), "new\n").unwrap();
        std::fs::create_dir_all(ws.join("target/debug")).unwrap();
        std::fs::write(ws.join("target/debug/out"), "bin").unwrap();
        std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(ws.join("src"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::hard_link(ws.join("src/deep/b.rs"), d.path().join("outside")).unwrap();
        xattr::set(ws.join("src/deep"), "user.kiln", b"x").ok();
        std::fs::write(ws.join(".git/hooks/post-checkout"), "#!/bin/sh\ntouch /tmp/pwned\n").unwrap();
        std::fs::remove_file(ws.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("link")).unwrap();
        // Untouched by the job, same content.
        let trash = d.path().join("trash");
        std::fs::create_dir(&trash).unwrap();
        let mut doomed = Doomed::new(&trash);
        let swept = sweep(&ws, &t, &HashSet::new(), fence, &mut doomed).unwrap();
        assert!(!ws.join(".git").exists(), "the job's .git is never reused");
        let n = restore(&ws, &r.join(".git"), &t, &swept.present, None).unwrap();
        assert!(n >= 4, "README, a.rs, run.sh, link and b.rs were written again: {n}");
        assert_eq!(contents(&ws), expect, "the workspace is the commit's tree again");
        // The file linked from outside is a new inode: the outside name
        // no longer reaches the workspace.
        let outside = std::fs::metadata(d.path().join("outside")).unwrap();
        assert_ne!(outside.ino(), std::fs::metadata(ws.join("src/deep/b.rs")).unwrap().ino());
    }

    #[test]
    fn a_workspace_replaced_by_a_link_is_never_followed() {
        let (d, sha) = repo();
        let t = tree(d.path(), &sha);
        let victim = d.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("precious"), "keep me").unwrap();
        let ws = d.path().join("ws");
        std::os::unix::fs::symlink(&victim, &ws).unwrap();
        let trash = d.path().join("trash");
        std::fs::create_dir(&trash).unwrap();
        let mut doomed = Doomed::new(&trash);
        assert!(sweep(&ws, &t, &HashSet::new(), Fence::NEVER, &mut doomed).is_err());
        assert_eq!(std::fs::read_to_string(victim.join("precious")).unwrap(), "keep me");
    }

    #[test]
    fn an_untouched_workspace_is_left_as_it_is_and_a_new_commit_changes_only_its_files() {
        let (d, sha) = repo();
        let r = d.path().join("r");
        let ws = d.path().join("ws");
        git(d.path(), &["clone", "-q", "--shared", "r", "ws"]);
        std::thread::sleep(Duration::from_millis(200));
        let fence = Fence::clock();
        let t = tree(d.path(), &sha);
        let trash = d.path().join("trash");
        std::fs::create_dir(&trash).unwrap();
        let ino = std::fs::metadata(ws.join("src/deep/b.rs")).unwrap().ino();
        let mut doomed = Doomed::new(&trash);
        let swept = sweep(&ws, &t, &HashSet::new(), fence, &mut doomed).unwrap();
        assert_eq!(swept.doomed, 0);
        assert_eq!(restore(&ws, &r.join(".git"), &t, &swept.present, None).unwrap(), 0);
        // A second commit: a.rs changed, README gone, c.rs added.
        std::fs::write(r.join("src/a.rs"), "fn a2() {}\n").unwrap();
        std::fs::remove_file(r.join("README")).unwrap();
        std::fs::write(r.join("c.rs"), "c\n").unwrap();
        git(&r, &["add", "-A"]);
        git(&r, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two"]);
        let sha2 = String::from_utf8(git(&r, &["rev-parse", "HEAD"])).unwrap().trim().to_string();
        let t2 = tree(d.path(), &sha2);
        let stale: HashSet<PathBuf> = ["src/a.rs"].iter().map(PathBuf::from).collect();
        let swept = sweep(&ws, &t2, &stale, fence, &mut doomed).unwrap();
        assert_eq!(swept.doomed, 2, "README and the old a.rs");
        assert_eq!(restore(&ws, &r.join(".git"), &t2, &swept.present, None).unwrap(), 2, "a.rs and c.rs");
        let clean = d.path().join("clean");
        git(d.path(), &["clone", "-q", "--shared", "r", "clean"]);
        assert_eq!(contents(&ws), contents(&clean));
        assert_eq!(std::fs::metadata(ws.join("src/deep/b.rs")).unwrap().ino(), ino, "unchanged files stay");
        doomed.bury();
    }
}
