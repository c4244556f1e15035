//! Building an archive from local directories.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, OFlags};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::beneath::{is_link_error, open_beneath, open_dir};
use crate::{CacheError, EntryKind, FORMAT_VERSION, LeftOut, MANIFEST_NAME, Manifest, ManifestEntry, io_err};

/// Result of [`pack`].
#[derive(Debug, Clone)]
pub struct Packed {
    pub manifest: Manifest,
    /// Lowercase hex sha256 of the compressed bytes written to `out`.
    pub archive_sha256: String,
    /// Number of compressed bytes written to `out`.
    pub archive_bytes: u64,
    /// Entries left out: devices, fifos, sockets, names (or link targets)
    /// that are not UTF-8 (`left_out.total()`).
    pub skipped: u64,
    /// The same, by kind, with the first one (also in the manifest).
    pub left_out: LeftOut,
}

/// One directory to archive: `rel` below `base`, reached without following
/// a symbolic link (issue 39: a step that made its cache path a link to
/// `/etc` had the agent pack `/etc`).
#[derive(Debug, Clone)]
pub struct Source {
    /// The declared path, as written (the manifest's root).
    pub declared: String,
    /// A directory the caller trusts as it is named (the workspace).
    pub base: PathBuf,
    /// The root below `base` ("" for `base` itself): names only, no `..`,
    /// not absolute; no component may be a symbolic link.
    pub rel: PathBuf,
}

impl Source {
    /// `rel` below `base` (see the fields).
    pub fn within(declared: impl Into<String>, base: impl Into<PathBuf>, rel: impl Into<PathBuf>) -> Source {
        Source { declared: declared.into(), base: base.into(), rel: rel.into() }
    }

    /// The directory `dir` itself, trusted as named.
    pub fn at(declared: impl Into<String>, dir: impl Into<PathBuf>) -> Source {
        Source { declared: declared.into(), base: dir.into(), rel: PathBuf::new() }
    }

    fn shown(&self) -> String {
        self.base.join(&self.rel).display().to_string()
    }
}

/// Looks at the contents of every archived file while it is read (once, in
/// the hashing pass): a file it names is refused, and nothing is archived.
pub trait Scan: Sync {
    /// `chunk` is the next piece of one file; `carry` starts empty for each
    /// file and is the implementation's to keep what a match across pieces
    /// needs. `Some(what)` refuses the file ([`CacheError::Secret`]).
    fn feed(&self, carry: &mut Vec<u8>, chunk: &[u8]) -> Option<String>;
}

/// Archive each source directory (`sources[i] = (declared path as written,
/// directory on disk)`; a missing directory has no entries in the manifest)
/// as a zstd-compressed tar stream written to `out`.
///
/// Regular files (hardlinks are stored as independent files), directories
/// and symbolic links (as links, whatever their target: never followed)
/// are kept; devices, fifos, sockets and names that are not UTF-8 are left
/// out and counted in [`Packed::left_out`] (and the manifest). Files are hashed in a first (parallel) pass, so the
/// manifest can be the first member; the second pass streams them into the
/// (multithreaded) zstd encoder and fails if a file changed in between.
/// The directory itself may not be a symbolic link; nothing below it is
/// followed (see [`pack_sources`]).
pub fn pack(sources: &[(String, PathBuf)], out: impl Write, level: i32) -> Result<Packed, CacheError> {
    let sources: Vec<Source> = sources.iter().map(|(d, p)| Source::at(d.clone(), p.clone())).collect();
    pack_sources(&sources, out, level, None)
}

/// [`pack`] of roots given below a trusted directory: every root is opened
/// component by component from its `base` and every entry from its root's
/// open directory, never following a symbolic link (a link on the way is
/// [`CacheError::Refused`], naming the declared path; a root that is
/// missing has no entries). Symbolic links inside a root are archived as
/// links, never followed (a venv's `bin/python -> /usr/bin/python3` comes
/// back as that link).
/// `scan` sees every file's bytes as they are hashed.
pub fn pack_sources(
    sources: &[Source],
    out: impl Write,
    level: i32,
    scan: Option<&dyn Scan>,
) -> Result<Packed, CacheError> {
    let (mut entries, disk, left_out) = scan_tree(sources)?;
    let prints = hash_files(&mut entries, &disk, sources, scan)?;
    let total_bytes = entries.iter().map(|e| e.size).sum();
    let manifest = Manifest {
        format: FORMAT_VERSION,
        roots: sources.iter().map(|s| s.declared.clone()).collect(),
        entries,
        total_bytes,
        left_out,
    };
    write_archive(manifest, &disk, &prints, out, level)
}

/// Whether the trees `sources` (as for [`pack`]) hold exactly what
/// `expected` lists (kinds, modes, sizes, digests, link targets, and nothing
/// else): a prepared copy of an archive is checked this way before use.
pub fn verify_tree(sources: &[(String, PathBuf)], expected: &Manifest) -> Result<(), CacheError> {
    let sources: Vec<Source> = sources.iter().map(|(d, p)| Source::at(d.clone(), p.clone())).collect();
    let (mut entries, disk, left_out) = scan_tree(&sources)?;
    if !left_out.is_empty() {
        return Err(CacheError::Corrupt(format!("{} the manifest cannot list", left_out.summary())));
    }
    if entries.len() != expected.entries.len() {
        return Err(CacheError::Corrupt(format!(
            "{} entries instead of the manifest's {}",
            entries.len(),
            expected.entries.len()
        )));
    }
    for (e, x) in entries.iter().zip(&expected.entries) {
        let same_shape =
            e.root == x.root && e.path == x.path && e.kind == x.kind && e.mode == x.mode && e.target == x.target;
        if !same_shape || (e.kind == EntryKind::File && e.size != x.size) {
            return Err(CacheError::Corrupt(format!("entry {:?} differs from the manifest", x.member_name())));
        }
    }
    hash_files(&mut entries, &disk, &sources, None)?;
    match entries == expected.entries {
        true => Ok(()),
        false => Err(CacheError::Corrupt("file contents differ from the manifest".into())),
    }
}

/// The open root directories (None: missing) and each entry's path below
/// its root.
pub(crate) struct Disk {
    roots: Vec<Option<OwnedFd>>,
    /// Per entry: its root's index and its path below the root.
    paths: Vec<(usize, PathBuf)>,
    /// Per root, how it is shown in messages.
    shown: Vec<String>,
}

impl Disk {
    fn open(&self, i: usize, flags: OFlags) -> Result<File, CacheError> {
        let (root, rel) = &self.paths[i];
        let shown = self.show(i);
        let Some(fd) = &self.roots[*root] else {
            return Err(CacheError::Io(io::Error::other(format!("{shown}: its root is not open"))));
        };
        match open_beneath(fd, rel, flags) {
            Ok(fd) => Ok(File::from(fd)),
            Err(e) if is_link_error(&e) => {
                Err(CacheError::Refused(format!("{shown} became a symbolic link while it was being archived")))
            }
            Err(e) => Err(io_err(format_args!("opening {shown}"), e)),
        }
    }

    fn show(&self, i: usize) -> String {
        let (root, rel) = &self.paths[i];
        Path::new(&self.shown[*root]).join(rel).display().to_string()
    }
}

type Scanned = (Vec<ManifestEntry>, Disk, LeftOut);

/// Opens the root of `s` (None: it does not exist), refusing a path that
/// leaves its base or passes a symbolic link, and anything not a directory.
fn open_root(s: &Source) -> Result<Option<OwnedFd>, CacheError> {
    let declared = &s.declared;
    if s.rel.is_absolute() || crate::beneath::components(&s.rel).is_none() {
        return Err(CacheError::Refused(format!("path {declared:?} leaves the workspace")));
    }
    let base = match open_dir(&s.base) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(CacheError::Refused(format!("path {declared:?} ({}) is not a directory", s.base.display())));
        }
        Err(e) => return Err(io_err(format_args!("opening {}", s.base.display()), e)),
    };
    let fd = match open_beneath(&base, &s.rel, OFlags::RDONLY | OFlags::DIRECTORY) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if is_link_error(&e) || (e.raw_os_error() == Some(libc::ENOTDIR) && is_link(&base, &s.rel)) => {
            return Err(CacheError::Refused(format!(
                "path {declared:?} is, or is reached through, a symbolic link ({}): links are never followed out of the workspace",
                s.shown()
            )));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(CacheError::Refused(format!(
                "path {declared:?} ({}) is not a directory, or is reached through something that is not one",
                s.shown()
            )));
        }
        Err(e) => return Err(io_err(format_args!("opening {}", s.shown()), e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err(format_args!("stat {}", s.shown()), e.into()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Err(CacheError::Refused(format!("cache path {declared:?} ({}) is not a directory", s.shown())));
    }
    Ok(Some(fd))
}

/// Whether `rel` below `base` is itself a symbolic link (opening a link
/// with `O_DIRECTORY | O_NOFOLLOW` says `ENOTDIR`).
fn is_link(base: &OwnedFd, rel: &Path) -> bool {
    match open_beneath(base, rel, OFlags::PATH) {
        Ok(fd) => rustix::fs::fstat(&fd)
            .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink),
        Err(e) => is_link_error(&e),
    }
}

/// The entries of `sources` (unhashed), where they are, and what was left
/// out.
fn scan_tree(sources: &[Source]) -> Result<Scanned, CacheError> {
    let mut entries = Vec::new();
    let mut disk = Disk { roots: vec![], paths: vec![], shown: sources.iter().map(Source::shown).collect() };
    let mut skipped = LeftOut::default();
    for (i, s) in sources.iter().enumerate() {
        let root = u32::try_from(i).map_err(|_| CacheError::Refused("too many roots".into()))?;
        let Some(fd) = open_root(s)? else {
            disk.roots.push(None);
            continue;
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(format_args!("stat {}", s.shown()), e.into()))?;
        entries.push(ManifestEntry {
            root,
            path: String::new(),
            kind: EntryKind::Dir,
            mode: st.st_mode & 0o777,
            size: 0,
            sha256: None,
            target: None,
        });
        disk.paths.push((i, PathBuf::new()));
        walk(root, &fd, Path::new(""), "", &mut entries, &mut disk, &mut skipped, &s.declared)?;
        disk.roots.push(Some(fd));
    }
    Ok((entries, disk, skipped))
}

fn write_archive(
    manifest: Manifest,
    disk: &Disk,
    prints: &[Fingerprint],
    out: impl Write,
    level: i32,
) -> Result<Packed, CacheError> {
    let json = serde_json::to_vec(&manifest)
        .map_err(|e| CacheError::Io(io::Error::other(format!("encoding the manifest: {e}"))))?;

    let counting = HashingWriter { inner: out, hasher: Sha256::new(), bytes: 0 };
    let wctx = |e| io_err("writing the archive", e);
    let mut enc = zstd::stream::write::Encoder::new(counting, level).map_err(wctx)?;
    enc.include_checksum(true).map_err(wctx)?;
    let workers = workers();
    if workers > 1 {
        enc.multithread(workers as u32).map_err(wctx)?;
    }
    let mut tb = tar::Builder::new(enc);

    let mut h = header(tar::EntryType::Regular, 0o644, json.len() as u64);
    tb.append_data(&mut h, MANIFEST_NAME, &json[..]).map_err(wctx)?;

    for (i, (e, print)) in manifest.entries.iter().zip(prints).enumerate() {
        let name = e.member_name();
        match e.kind {
            EntryKind::Dir => {
                let mut h = header(tar::EntryType::Directory, e.mode, 0);
                tb.append_data(&mut h, &name, io::empty()).map_err(wctx)?;
            }
            EntryKind::Symlink => {
                let mut h = header(tar::EntryType::Symlink, e.mode, 0);
                let target = e.target.as_deref().unwrap_or_default();
                tb.append_link(&mut h, &name, target).map_err(wctx)?;
            }
            EntryKind::File => {
                // Hashed once: the fingerprint taken then must still hold
                // before and after the bytes are archived.
                let path = disk.show(i);
                let f = disk.open(i, OFlags::RDONLY | OFlags::NONBLOCK)?;
                let stat = |f: &File| Fingerprint::of(f).map_err(|err| io_err(format_args!("stat {path}"), err));
                if stat(&f)? != *print {
                    return Err(changed(&path));
                }
                let mut r = CountingReader { inner: (&f).take(e.size), bytes: 0 };
                let mut h = header(tar::EntryType::Regular, e.mode, e.size);
                tb.append_data(&mut h, &name, &mut r).map_err(|err| io_err(format_args!("archiving {path}"), err))?;
                if r.bytes != e.size || stat(&f)? != *print {
                    return Err(changed(&path));
                }
            }
        }
    }
    let enc = tb.into_inner().map_err(wctx)?;
    let mut counting = enc.finish().map_err(wctx)?;
    counting.flush().map_err(wctx)?;
    Ok(Packed {
        skipped: manifest.left_out.total(),
        left_out: manifest.left_out.clone(),
        manifest,
        archive_sha256: hex::encode(counting.hasher.finalize()),
        archive_bytes: counting.bytes,
    })
}

fn workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8)
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Depth-first, names sorted bytewise, parents before children; `dir` is
/// the open directory at `rel_path` below the root. Only one directory is
/// open per level, and each is opened from its parent without following a
/// link. What cannot be archived is counted in `skipped` (shown below
/// `declared`).
#[allow(clippy::too_many_arguments)]
fn walk(
    root: u32,
    dir: &OwnedFd,
    rel_path: &Path,
    rel: &str,
    entries: &mut Vec<ManifestEntry>,
    disk: &mut Disk,
    skipped: &mut LeftOut,
    declared: &str,
) -> Result<(), CacheError> {
    let left = |child: &Path| Path::new(declared).join(child).to_string_lossy().into_owned();
    let shown = || Path::new(&disk.shown[root as usize]).join(rel_path).display().to_string();
    let listing = |e: rustix::io::Errno| io_err(format_args!("listing {}", shown()), e.into());
    let mut children = Vec::new();
    for ent in Dir::read_from(dir).map_err(listing)? {
        let ent = ent.map_err(listing)?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            children.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    children.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in children {
        let child_path = rel_path.join(&name);
        let Some(name_str) = name.to_str() else {
            skipped.add(None, || left(&child_path));
            continue;
        };
        let child_rel = if rel.is_empty() { name_str.to_string() } else { format!("{rel}/{name_str}") };
        let shown_child = || Path::new(&disk.shown[root as usize]).join(&child_path).display().to_string();
        let st = rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_err(format_args!("stat {}", shown_child()), e.into()))?;
        let ft = rustix::fs::FileType::from_raw_mode(st.st_mode);
        let mode = st.st_mode & 0o777;
        match ft {
            rustix::fs::FileType::Directory => {
                let sub = match open_beneath(dir, Path::new(&name), OFlags::RDONLY | OFlags::DIRECTORY) {
                    Ok(fd) => fd,
                    Err(e) if is_link_error(&e) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                        return Err(CacheError::Refused(format!(
                            "{} became a symbolic link while it was being archived",
                            shown_child()
                        )));
                    }
                    Err(e) => return Err(io_err(format_args!("opening {}", shown_child()), e)),
                };
                entries.push(entry(root, &child_rel, EntryKind::Dir, mode, None));
                disk.paths.push((root as usize, child_path.clone()));
                walk(root, &sub, &child_path, &child_rel, entries, disk, skipped, declared)?;
            }
            rustix::fs::FileType::RegularFile => {
                let mut e = entry(root, &child_rel, EntryKind::File, mode, None);
                e.size = st.st_size as u64;
                entries.push(e);
                disk.paths.push((root as usize, child_path));
            }
            rustix::fs::FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name.as_os_str(), Vec::new())
                    .map_err(|e| io_err(format_args!("reading link {}", shown_child()), e.into()))?;
                // Kept as it is, never followed (issue 41, item 4): a
                // restore makes the same link; nothing is ever written
                // below it.
                match target.to_str() {
                    Ok(t) if !t.is_empty() => {
                        entries.push(entry(root, &child_rel, EntryKind::Symlink, 0o777, Some(t.to_string())));
                        disk.paths.push((root as usize, child_path));
                    }
                    _ => skipped.add(None, || left(&child_path)),
                }
            }
            // Devices, fifos, sockets.
            other => skipped.add(Some(other), || left(&child_path)),
        }
    }
    Ok(())
}

fn entry(root: u32, path: &str, kind: EntryKind, mode: u32, target: Option<String>) -> ManifestEntry {
    ManifestEntry { root, path: path.to_string(), kind, mode, size: 0, sha256: None, target }
}

/// What identifies a file's contents without reading them again: a write
/// changes its size or its modification or change time (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Fingerprint {
    fn of(f: &File) -> io::Result<Fingerprint> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        Ok(Fingerprint {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

type HashResult = Result<(u64, String, Fingerprint), CacheError>;

/// Fills `sha256` and `size` of every file entry, on several threads, and
/// returns each entry's fingerprint (default for non-files).
fn hash_files(
    entries: &mut [ManifestEntry],
    disk: &Disk,
    sources: &[Source],
    scan: Option<&dyn Scan>,
) -> Result<Vec<Fingerprint>, CacheError> {
    let files: Vec<usize> =
        entries.iter().enumerate().filter(|(_, e)| e.kind == EntryKind::File).map(|(i, _)| i).collect();
    let next = AtomicUsize::new(0);
    let entries_ro: &[ManifestEntry] = entries;
    let results: Mutex<Vec<(usize, HashResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers().min(files.len().max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = files.get(k) else { break };
                    let r = disk.open(i, OFlags::RDONLY | OFlags::NONBLOCK).and_then(|f| {
                        let found = |what: String| {
                            let e = &entries_ro[i];
                            CacheError::Secret {
                                root: sources[e.root as usize].declared.clone(),
                                path: e.path.clone(),
                                what,
                            }
                        };
                        hash_file(f, &disk.show(i), &mut buf, scan, found)
                    });
                    let failed = r.is_err();
                    results.lock().expect("hash results lock").push((i, r));
                    if failed {
                        break;
                    }
                }
            });
        }
    });
    let mut prints = vec![Fingerprint::default(); entries.len()];
    for (i, r) in results.into_inner().expect("hash results lock") {
        let (size, digest, fp) = r?;
        entries[i].size = size;
        entries[i].sha256 = Some(digest);
        prints[i] = fp;
    }
    if let Some(&i) = files.iter().find(|&&i| entries[i].sha256.is_none()) {
        return Err(CacheError::Io(io::Error::other(format!("{} was not hashed", disk.show(i)))));
    }
    Ok(prints)
}

fn changed(path: &str) -> CacheError {
    CacheError::Corrupt(format!("{path} changed while it was being archived"))
}

/// Hashes (and scans) the open file `f`, shown as `path`; `found` makes the
/// error for what `scan` finds.
fn hash_file(
    mut f: File,
    path: &str,
    buf: &mut [u8],
    scan: Option<&dyn Scan>,
    found: impl Fn(String) -> CacheError,
) -> HashResult {
    let stat = |f: &File| Fingerprint::of(f).map_err(|e| io_err(format_args!("stat {path}"), e));
    let before = stat(&f)?;
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    let mut carry = Vec::new();
    loop {
        let k = match f.read(buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(format_args!("reading {path}"), e)),
        };
        hasher.update(&buf[..k]);
        if let Some(what) = scan.and_then(|s| s.feed(&mut carry, &buf[..k])) {
            return Err(found(what));
        }
        n += k as u64;
    }
    if stat(&f)? != before || n != before.size {
        return Err(changed(path));
    }
    Ok((n, hex::encode(hasher.finalize()), before))
}

pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    pub(crate) hasher: Sha256,
    pub(crate) bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

struct CountingReader<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn hash_path(p: &Path) -> HashResult {
        hash_file(File::open(p).unwrap(), "f", &mut [0u8; 64], None, |_| unreachable!())
    }

    #[test]
    fn a_rewrite_of_the_same_size_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"aaaa").unwrap();
        let (_, _, fp) = hash_path(&p).unwrap();
        assert_eq!(Fingerprint::of(&File::open(&p).unwrap()).unwrap(), fp);
        // Same size, same second: only the nanoseconds (or ctime) differ.
        fs::write(&p, b"bbbb").unwrap();
        assert_ne!(Fingerprint::of(&File::open(&p).unwrap()).unwrap(), fp);
    }

    #[test]
    fn a_file_replaced_by_another_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"aaaa").unwrap();
        let (_, _, fp) = hash_path(&p).unwrap();
        let q = dir.path().join("g");
        fs::write(&q, b"aaaa").unwrap();
        fs::rename(&q, &p).unwrap();
        assert_ne!(Fingerprint::of(&File::open(&p).unwrap()).unwrap(), fp);
    }
}
