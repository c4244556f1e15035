//! Building an archive from local directories.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::paths::normalise_symlink_target;
use crate::{CacheError, EntryKind, FORMAT_VERSION, MANIFEST_NAME, Manifest, ManifestEntry, io_err};

/// Result of [`pack`].
#[derive(Debug, Clone)]
pub struct Packed {
    pub manifest: Manifest,
    /// Lowercase hex sha256 of the compressed bytes written to `out`.
    pub archive_sha256: String,
    /// Number of compressed bytes written to `out`.
    pub archive_bytes: u64,
    /// Entries left out: devices, fifos, sockets, symlinks leaving their
    /// root (or absolute), names that are not UTF-8.
    pub skipped: u64,
}

/// Archive each source directory (`sources[i] = (declared path as written,
/// directory on disk)`; a missing directory has no entries in the manifest)
/// as a zstd-compressed tar stream written to `out`.
///
/// Regular files (hardlinks are stored as independent files), directories
/// and symlinks whose target stays inside the same root are kept; other
/// symlinks, devices, fifos and sockets are skipped and counted in
/// [`Packed::skipped`]. Files are hashed in a first (parallel) pass, so the
/// manifest can be the first member; the second pass streams them into the
/// (multithreaded) zstd encoder and fails if a file changed in between.
pub fn pack(sources: &[(String, PathBuf)], out: impl Write, level: i32) -> Result<Packed, CacheError> {
    let (mut entries, disk, skipped) = scan(sources)?;
    let prints = hash_files(&mut entries, &disk)?;
    let total_bytes = entries.iter().map(|e| e.size).sum();
    let manifest = Manifest {
        format: FORMAT_VERSION,
        roots: sources.iter().map(|(d, _)| d.clone()).collect(),
        entries,
        total_bytes,
    };
    write_archive(manifest, &disk, &prints, out, level, skipped)
}

/// Whether the trees `sources` (as for [`pack`]) hold exactly what
/// `expected` lists (kinds, modes, sizes, digests, link targets, and nothing
/// else): a prepared copy of an archive is checked this way before use.
pub fn verify_tree(sources: &[(String, PathBuf)], expected: &Manifest) -> Result<(), CacheError> {
    let (mut entries, disk, skipped) = scan(sources)?;
    if skipped > 0 {
        return Err(CacheError::Corrupt(format!("{skipped} entries the manifest cannot list")));
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
    hash_files(&mut entries, &disk)?;
    match entries == expected.entries {
        true => Ok(()),
        false => Err(CacheError::Corrupt("file contents differ from the manifest".into())),
    }
}

type Scanned = (Vec<ManifestEntry>, Vec<PathBuf>, u64);

/// The entries of `sources` (unhashed), their paths on disk, and how many
/// were skipped.
fn scan(sources: &[(String, PathBuf)]) -> Result<Scanned, CacheError> {
    let mut entries = Vec::new();
    let mut disk = Vec::new();
    let mut skipped = 0u64;
    for (i, (declared, dir)) in sources.iter().enumerate() {
        let root = u32::try_from(i).map_err(|_| CacheError::Refused("too many roots".into()))?;
        let meta = match fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(format_args!("stat {}", dir.display()), e)),
        };
        if !meta.is_dir() {
            return Err(CacheError::Refused(format!("cache path {declared:?} ({}) is not a directory", dir.display())));
        }
        entries.push(ManifestEntry {
            root,
            path: String::new(),
            kind: EntryKind::Dir,
            mode: meta.permissions().mode() & 0o777,
            size: 0,
            sha256: None,
            target: None,
        });
        disk.push(dir.clone());
        walk(root, dir, "", &mut entries, &mut disk, &mut skipped)?;
    }
    Ok((entries, disk, skipped))
}

fn write_archive(
    manifest: Manifest,
    disk: &[PathBuf],
    prints: &[Fingerprint],
    out: impl Write,
    level: i32,
    skipped: u64,
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

    for ((e, path), print) in manifest.entries.iter().zip(disk).zip(prints) {
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
                let f = open_nofollow(path)?;
                let stat =
                    |f: &File| Fingerprint::of(f).map_err(|err| io_err(format_args!("stat {}", path.display()), err));
                if stat(&f)? != *print {
                    return Err(changed(path));
                }
                let mut r = CountingReader { inner: (&f).take(e.size), bytes: 0 };
                let mut h = header(tar::EntryType::Regular, e.mode, e.size);
                tb.append_data(&mut h, &name, &mut r)
                    .map_err(|err| io_err(format_args!("archiving {}", path.display()), err))?;
                if r.bytes != e.size || stat(&f)? != *print {
                    return Err(changed(path));
                }
            }
        }
    }
    let enc = tb.into_inner().map_err(wctx)?;
    let mut counting = enc.finish().map_err(wctx)?;
    counting.flush().map_err(wctx)?;
    Ok(Packed {
        manifest,
        archive_sha256: hex::encode(counting.hasher.finalize()),
        archive_bytes: counting.bytes,
        skipped,
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

fn open_nofollow(path: &Path) -> Result<File, CacheError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_err(format_args!("opening {}", path.display()), e))
}

/// Depth-first, names sorted bytewise, parents before children.
fn walk(
    root: u32,
    dir: &Path,
    rel: &str,
    entries: &mut Vec<ManifestEntry>,
    disk: &mut Vec<PathBuf>,
    skipped: &mut u64,
) -> Result<(), CacheError> {
    let rd = fs::read_dir(dir).map_err(|e| io_err(format_args!("listing {}", dir.display()), e))?;
    let mut children = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| io_err(format_args!("listing {}", dir.display()), e))?;
        children.push(ent.file_name());
    }
    children.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in children {
        let path = dir.join(&name);
        let Some(name) = name.to_str() else {
            *skipped += 1;
            continue;
        };
        let child_rel = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
        let meta = fs::symlink_metadata(&path).map_err(|e| io_err(format_args!("stat {}", path.display()), e))?;
        let ft = meta.file_type();
        let mode = meta.permissions().mode() & 0o777;
        if ft.is_dir() {
            entries.push(entry(root, &child_rel, EntryKind::Dir, mode, None));
            disk.push(path.clone());
            walk(root, &path, &child_rel, entries, disk, skipped)?;
        } else if ft.is_file() {
            let mut e = entry(root, &child_rel, EntryKind::File, mode, None);
            e.size = meta.len();
            entries.push(e);
            disk.push(path);
        } else if ft.is_symlink() {
            let target =
                fs::read_link(&path).map_err(|e| io_err(format_args!("reading link {}", path.display()), e))?;
            match target.to_str().and_then(|t| normalise_symlink_target(&child_rel, t)) {
                Some(t) => {
                    entries.push(entry(root, &child_rel, EntryKind::Symlink, 0o777, Some(t)));
                    disk.push(path);
                }
                None => *skipped += 1,
            }
        } else {
            // Devices, fifos, sockets.
            *skipped += 1;
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
fn hash_files(entries: &mut [ManifestEntry], disk: &[PathBuf]) -> Result<Vec<Fingerprint>, CacheError> {
    let files: Vec<usize> =
        entries.iter().enumerate().filter(|(_, e)| e.kind == EntryKind::File).map(|(i, _)| i).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, HashResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers().min(files.len().max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = files.get(k) else { break };
                    let r = hash_file(&disk[i], &mut buf);
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
        return Err(CacheError::Io(io::Error::other(format!("{} was not hashed", disk[i].display()))));
    }
    Ok(prints)
}

fn changed(path: &Path) -> CacheError {
    CacheError::Corrupt(format!("{} changed while it was being archived", path.display()))
}

fn hash_file(path: &Path, buf: &mut [u8]) -> HashResult {
    let mut f = open_nofollow(path)?;
    let stat = |f: &File| Fingerprint::of(f).map_err(|e| io_err(format_args!("stat {}", path.display()), e));
    let before = stat(&f)?;
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    loop {
        let k = match f.read(buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(format_args!("reading {}", path.display()), e)),
        };
        hasher.update(&buf[..k]);
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

    #[test]
    fn a_rewrite_of_the_same_size_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"aaaa").unwrap();
        let (_, _, fp) = hash_file(&p, &mut [0u8; 64]).unwrap();
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
        let (_, _, fp) = hash_file(&p, &mut [0u8; 64]).unwrap();
        let q = dir.path().join("g");
        fs::write(&q, b"aaaa").unwrap();
        fs::rename(&q, &p).unwrap();
        assert_ne!(Fingerprint::of(&File::open(&p).unwrap()).unwrap(), fp);
    }
}
