//! Verifying and restoring an archive.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::paths::{check_rel_path, check_symlink_target, parent};
use crate::{CacheError, EntryKind, FORMAT_VERSION, Limits, MANIFEST_NAME, Manifest, io_err};

/// Result of [`unpack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries restored (files, directories, symlinks, root directories).
    pub entries: u64,
    /// Bytes of file contents restored.
    pub bytes: u64,
    /// What the archive's pack left out (from its manifest).
    pub left_out: crate::LeftOut,
}

/// Bytes of zeros tolerated after the end of the tar stream (record padding).
pub(crate) const MAX_TRAILER: u64 = 64 * 1024;
/// The manifest is held in memory: never more than this.
const MANIFEST_HARD_CAP: u64 = 1 << 30;

/// Unpack an archive made by [`pack`](crate::pack) into `targets`
/// (`targets[i]` = directory on disk for root i; the archive's roots must
/// equal `declared`, else `Refused`).
///
/// Everything is first written into a staging directory next to each target
/// (same filesystem), verified entry by entry against the manifest, and only
/// then moved into place, replacing what the target held. A root that was
/// missing when packing (no entries) leaves its target untouched. On any
/// error the staging directories are removed and the targets are left as
/// they were.
pub fn unpack(
    archive: impl Read + Send,
    targets: &[PathBuf],
    declared: &[String],
    limits: &Limits,
) -> Result<Unpacked, CacheError> {
    if targets.len() != declared.len() {
        return Err(CacheError::Refused(format!("{} targets for {} declared paths", targets.len(), declared.len())));
    }
    for (i, t) in targets.iter().enumerate() {
        if targets[..i].contains(t) {
            return Err(CacheError::Refused(format!("target {} is listed twice", t.display())));
        }
    }
    let mut staging = Vec::with_capacity(targets.len());
    for t in targets {
        let parent = target_parent(t);
        fs::create_dir_all(parent).map_err(|e| io_err(format_args!("creating {}", parent.display()), e))?;
        let dir = tempfile::Builder::new()
            .prefix(".kiln-cache-staging-")
            .tempdir_in(parent)
            .map_err(|e| io_err(format_args!("creating a staging dir in {}", parent.display()), e))?;
        staging.push(dir);
    }
    let dirs: Vec<PathBuf> = staging.iter().map(|d| d.path().to_path_buf()).collect();
    // On error `staging` is dropped here, which removes the staging dirs.
    let (present, unpacked) = extract(archive, &dirs, declared, limits)?;

    // Last moment to give up: nothing is in place yet (staging is dropped).
    limits.check_deadline("restoring the cache")?;
    // Once a staging dir is kept it is our job to clean it.
    let kept: Vec<Option<PathBuf>> =
        staging.into_iter().enumerate().map(|(i, d)| present[i].then(|| d.keep())).collect();
    install(kept, targets)?;
    Ok(unpacked)
}

/// Reads and validates the manifest at the head of an archive (only the
/// first member is decoded).
pub fn read_manifest(archive: impl Read, declared: &[String], limits: &Limits) -> Result<Manifest, CacheError> {
    at_head(archive, limits, |entries| manifest_member(entries, declared, limits))
}

/// The sha256 (hex) of the manifest member's bytes at the head of an
/// archive, as stored (issue 45: a directory artifact's provenance names
/// it beside the archive's digest, so an extracted tree can be checked
/// file by file). Only the first member is decoded; it must be the
/// manifest, within the manifest cap.
pub fn manifest_digest(archive: impl Read, limits: &Limits) -> Result<String, CacheError> {
    at_head(archive, limits, |entries| Ok(hex::encode(Sha256::digest(manifest_bytes(entries, limits)?))))
}

/// `f` over the archive's members, decoding no more than a manifest's
/// worth of it.
fn at_head<T>(
    archive: impl Read,
    limits: &Limits,
    f: impl FnOnce(&mut tar::Entries<'_, &mut dyn Read>) -> Result<T, CacheError>,
) -> Result<T, CacheError> {
    let mut dec =
        zstd::stream::read::Decoder::new(SourceReader(archive)).map_err(|e| io_err("starting the zstd decoder", e))?;
    dec.window_log_max(27).map_err(|e| io_err("configuring the zstd decoder", e))?;
    let budget = manifest_cap(limits).saturating_add(4 * 512 + 2 * limits.max_path_bytes as u64);
    let mut limited = LimitReader { inner: dec, read: 0, budget };
    let mut ar = tar::Archive::new(&mut limited as &mut dyn Read);
    let mut entries = ar.entries().map_err(|e| read_err("reading the archive", e))?.raw(true);
    f(&mut entries)
}

/// The first member's bytes: it must be the manifest, within its cap.
fn manifest_bytes<R: Read>(entries: &mut tar::Entries<'_, R>, limits: &Limits) -> Result<Vec<u8>, CacheError> {
    let Some(mut first) = next_member(entries, limits)? else {
        return Err(CacheError::Refused("archive is empty (no manifest)".into()));
    };
    if first.name != MANIFEST_NAME.as_bytes() || first.entry.header().entry_type() != tar::EntryType::Regular {
        return Err(CacheError::Refused(format!(
            "first member {:?} is not the manifest",
            String::from_utf8_lossy(&first.name)
        )));
    }
    let size = first.entry.header().entry_size().map_err(|e| CacheError::Corrupt(format!("manifest header: {e}")))?;
    let cap = manifest_cap(limits);
    if size > cap {
        return Err(CacheError::TooLarge(format!("manifest of {size} bytes exceeds {cap} bytes")));
    }
    let mut json = Vec::with_capacity(size as usize);
    first.entry.read_to_end(&mut json).map_err(|e| read_err("reading the manifest", e))?;
    Ok(json)
}

pub(crate) fn manifest_member<R: Read>(
    entries: &mut tar::Entries<'_, R>,
    declared: &[String],
    limits: &Limits,
) -> Result<Manifest, CacheError> {
    let json = manifest_bytes(entries, limits)?;
    let manifest: Manifest =
        serde_json::from_slice(&json).map_err(|e| CacheError::Corrupt(format!("manifest does not parse: {e}")))?;
    validate_manifest(&manifest, declared, limits)?;
    Ok(manifest)
}

/// Moves `staged[i]` (a directory on the same filesystem, or None to leave
/// target i alone) to `targets[i]`, replacing what is there; all or
/// nothing: on error every target is as it was and the staged directories
/// are removed.
pub fn install(staged: Vec<Option<PathBuf>>, targets: &[PathBuf]) -> Result<(), CacheError> {
    let mut kept = staged;
    let mut moved: Vec<(usize, Option<PathBuf>)> = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let Some(src) = kept[i].clone() else { continue };
        match replace(&src, target, i) {
            Ok(old) => moved.push((i, old)),
            Err(e) => {
                // Roll back what was already moved, drop the rest.
                for (j, old) in moved.into_iter().rev() {
                    remove_any(&targets[j]);
                    if let Some(old) = old {
                        let _ = fs::rename(&old, &targets[j]);
                    }
                }
                for k in kept.iter_mut().skip(i).flatten() {
                    let _ = fs::remove_dir_all(k);
                }
                return Err(e);
            }
        }
        kept[i] = None;
    }
    for (_, old) in moved {
        if let Some(old) = old {
            remove_any(&old);
        }
    }
    Ok(())
}

/// Removes a directory tree, file or symlink (best effort, never follows links).
fn remove_any(p: &Path) {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = fs::remove_file(p);
        }
        Err(_) => {}
    }
}

fn target_parent(t: &Path) -> &Path {
    match t.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Moves `src` to `target`; what `target` held is renamed aside and its new
/// name returned (the caller removes it once every root is in place).
fn replace(src: &Path, target: &Path, i: usize) -> Result<Option<PathBuf>, CacheError> {
    let old = match fs::symlink_metadata(target) {
        Ok(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            let aside = target_parent(target).join(format!(".kiln-cache-old-{}-{nanos}-{i}", std::process::id()));
            fs::rename(target, &aside).map_err(|e| {
                let _ = fs::remove_dir_all(src);
                io_err(format_args!("moving {} aside", target.display()), e)
            })?;
            Some(aside)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            let _ = fs::remove_dir_all(src);
            return Err(io_err(format_args!("stat {}", target.display()), e));
        }
    };
    if let Err(e) = fs::rename(src, target) {
        let _ = fs::remove_dir_all(src);
        if let Some(old) = &old {
            let _ = fs::rename(old, target);
        }
        return Err(io_err(format_args!("moving the restored cache to {}", target.display()), e));
    }
    Ok(old)
}

/// Marks errors of the caller's reader (as opposed to decoding errors).
#[derive(Debug)]
struct SourceError(io::Error);
impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
impl std::error::Error for SourceError {}

pub(crate) struct SourceReader<R>(pub(crate) R);
impl<R: Read> Read for SourceReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| io::Error::new(e.kind(), SourceError(e)))
    }
}

/// Marks the decompressed stream exceeding its budget.
#[derive(Debug)]
struct LimitExceeded(u64);
impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "decompressed stream exceeds {} bytes", self.0)
    }
}
impl std::error::Error for LimitExceeded {}

/// Counts decompressed bytes and fails once past `budget`: a backstop so a
/// hostile stream is never decoded without bound, whatever the tar layer does.
pub(crate) struct LimitReader<R> {
    pub(crate) inner: R,
    pub(crate) read: u64,
    pub(crate) budget: u64,
}
impl<R: Read> Read for LimitReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read > self.budget {
            return Err(io::Error::other(LimitExceeded(self.budget)));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.budget {
            return Err(io::Error::other(LimitExceeded(self.budget)));
        }
        Ok(n)
    }
}

/// Classifies an error raised while reading the archive stream.
/// The end of an archive read member by member: every entry of the
/// manifest was there, only zero padding follows the tar end marker, and
/// the zstd stream ends cleanly (the decoder reports an incomplete frame
/// otherwise). Shared by restore and export.
pub(crate) fn check_end(rest: impl Read, count: usize, expected: usize) -> Result<(), CacheError> {
    if count != expected {
        return Err(CacheError::Corrupt(format!("archive is truncated: {count} of {expected} entries")));
    }
    let mut trailer = Vec::new();
    rest.take(MAX_TRAILER + 1).read_to_end(&mut trailer).map_err(|e| read_err("reading the end of the archive", e))?;
    if trailer.len() as u64 > MAX_TRAILER || trailer.iter().any(|&b| b != 0) {
        return Err(CacheError::Corrupt("unexpected data after the end of the archive".into()));
    }
    Ok(())
}

pub(crate) fn read_err(what: &str, e: io::Error) -> CacheError {
    if let Some(inner) = e.get_ref() {
        if inner.is::<LimitExceeded>() {
            return CacheError::TooLarge(format!("{what}: {e}"));
        }
        if inner.is::<SourceError>() {
            return io_err(format_args!("{what}: reading the archive"), e);
        }
    }
    CacheError::Corrupt(format!("{what}: {e}"))
}

pub(crate) fn manifest_cap(limits: &Limits) -> u64 {
    limits.max_entries.saturating_mul(1024).saturating_add(1 << 20).min(MANIFEST_HARD_CAP)
}

/// A tar member with GNU long names folded in.
pub(crate) struct Member<'a, R: Read> {
    pub(crate) entry: tar::Entry<'a, R>,
    pub(crate) name: Vec<u8>,
    pub(crate) link: Option<Vec<u8>>,
}

pub(crate) fn next_member<'a, R: Read>(
    entries: &mut tar::Entries<'a, R>,
    limits: &Limits,
) -> Result<Option<Member<'a, R>>, CacheError> {
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    loop {
        let Some(entry) = entries.next() else {
            if long_name.is_some() || long_link.is_some() {
                return Err(CacheError::Corrupt("archive ends after a long-name header".into()));
            }
            return Ok(None);
        };
        let mut entry = entry.map_err(|e| read_err("reading a tar header", e))?;
        let kind = entry.header().entry_type();
        if kind.is_gnu_longname() || kind.is_gnu_longlink() {
            let slot = if kind.is_gnu_longname() { &mut long_name } else { &mut long_link };
            if slot.is_some() {
                return Err(CacheError::Refused("two long-name headers in a row".into()));
            }
            let size =
                entry.header().entry_size().map_err(|e| CacheError::Corrupt(format!("long-name header: {e}")))?;
            if size > limits.max_path_bytes as u64 + 1 {
                return Err(CacheError::Refused(format!(
                    "long name of {size} bytes exceeds {} bytes",
                    limits.max_path_bytes
                )));
            }
            let mut buf = Vec::with_capacity(size as usize);
            entry.read_to_end(&mut buf).map_err(|e| read_err("reading a long name", e))?;
            while buf.last() == Some(&0) {
                buf.pop();
            }
            *slot = Some(buf);
            continue;
        }
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            return Err(CacheError::Refused("pax extension headers are not produced by pack".into()));
        }
        let name = long_name.take().unwrap_or_else(|| entry.header().path_bytes().into_owned());
        let link = long_link.take().or_else(|| entry.header().link_name_bytes().map(|l| l.into_owned()));
        return Ok(Some(Member { entry, name, link }));
    }
}

fn validate_manifest(m: &Manifest, declared: &[String], limits: &Limits) -> Result<(), CacheError> {
    // Format 1 is format 2 with fewer links and nothing recorded as left out.
    if m.format != FORMAT_VERSION && m.format != 1 {
        return Err(CacheError::Refused(format!("archive format {} is not {FORMAT_VERSION}", m.format)));
    }
    if m.roots != declared {
        return Err(CacheError::Refused(format!(
            "archive roots {:?} differ from the declared paths {declared:?}",
            m.roots
        )));
    }
    if m.entries.len() as u64 > limits.max_entries {
        return Err(CacheError::TooLarge(format!(
            "{} entries exceed the limit of {}",
            m.entries.len(),
            limits.max_entries
        )));
    }
    if m.total_bytes > limits.max_expanded_bytes {
        return Err(CacheError::TooLarge(format!(
            "{} bytes exceed the limit of {}",
            m.total_bytes, limits.max_expanded_bytes
        )));
    }
    let mut sum = 0u64;
    let mut seen: HashMap<(u32, &str), EntryKind> = HashMap::with_capacity(m.entries.len());
    for e in &m.entries {
        let name = e.member_name();
        if e.root as usize >= m.roots.len() {
            return Err(CacheError::Refused(format!("entry {name:?}: root index out of range")));
        }
        if name.len() > limits.max_path_bytes {
            return Err(CacheError::Refused(format!(
                "entry {:.64?}…: path longer than {} bytes",
                name, limits.max_path_bytes
            )));
        }
        if e.mode & !0o777 != 0 {
            return Err(CacheError::Refused(format!("entry {name:?}: mode {:o} has special bits", e.mode)));
        }
        if e.path.is_empty() {
            if e.kind != EntryKind::Dir {
                return Err(CacheError::Refused(format!("entry {name:?}: a root must be a directory")));
            }
        } else {
            check_rel_path(&e.path).map_err(|m| CacheError::Refused(format!("entry {name:?}: {m}")))?;
            match seen.get(&(e.root, parent(&e.path))) {
                Some(EntryKind::Dir) => {}
                _ => {
                    return Err(CacheError::Refused(format!(
                        "entry {name:?}: parent is not a directory listed before it"
                    )));
                }
            }
        }
        if seen.insert((e.root, &e.path), e.kind).is_some() {
            return Err(CacheError::Refused(format!("entry {name:?} is listed twice")));
        }
        let ok = match e.kind {
            EntryKind::File => {
                e.target.is_none()
                    && e.sha256
                        .as_ref()
                        .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            }
            EntryKind::Dir => e.size == 0 && e.sha256.is_none() && e.target.is_none(),
            EntryKind::Symlink => {
                if let Some(t) = &e.target {
                    if t.len() > limits.max_path_bytes {
                        return Err(CacheError::Refused(format!(
                            "entry {name:?}: symlink target longer than {} bytes",
                            limits.max_path_bytes
                        )));
                    }
                    check_symlink_target(&e.path, t).map_err(CacheError::Refused)?;
                }
                e.size == 0 && e.sha256.is_none() && e.target.is_some()
            }
        };
        if !ok {
            return Err(CacheError::Refused(format!("entry {name:?}: fields do not fit its kind")));
        }
        sum = sum.checked_add(e.size).ok_or_else(|| CacheError::Corrupt("manifest sizes overflow".into()))?;
    }
    if sum != m.total_bytes {
        return Err(CacheError::Corrupt(format!(
            "manifest total {} differs from the sum of its sizes {sum}",
            m.total_bytes
        )));
    }
    Ok(())
}

/// Checks the member `m` against `exp`, the manifest's entry at its
/// position: name, kind, size, mode and link target must match (the
/// contents are checked against the digest as they are read).
pub(crate) fn check_member<R: Read>(
    m: &Member<'_, R>,
    exp: &crate::ManifestEntry,
    limits: &Limits,
) -> Result<(EntryKind, u64), CacheError> {
    let shown = String::from_utf8_lossy(&m.name).into_owned();
    if m.name.len() > limits.max_path_bytes {
        return Err(CacheError::Refused(format!(
            "member {:.64?}…: path longer than {} bytes",
            shown, limits.max_path_bytes
        )));
    }
    let header = m.entry.header();
    let kind = kind_of(header.entry_type()).map_err(|k| CacheError::Refused(format!("member {shown:?} is a {k}")))?;
    let mut name = m.name.as_slice();
    if kind == EntryKind::Dir && name.len() > 1 && name.ends_with(b"/") {
        name = &name[..name.len() - 1];
    }
    if name != exp.member_name().as_bytes() {
        return Err(CacheError::Refused(format!(
            "member {shown:?} is not the manifest's next entry {:?}",
            exp.member_name()
        )));
    }
    let size = header.entry_size().map_err(|e| CacheError::Corrupt(format!("member {shown:?}: {e}")))?;
    let mode = header.mode().map_err(|e| CacheError::Corrupt(format!("member {shown:?}: {e}")))?;
    if kind != exp.kind || size != exp.size || mode != exp.mode {
        return Err(CacheError::Corrupt(format!(
            "member {shown:?} (kind {kind:?}, size {size}, mode {mode:o}) differs from the manifest"
        )));
    }
    if kind == EntryKind::Symlink && m.link.as_deref() != exp.target.as_deref().map(str::as_bytes) {
        return Err(CacheError::Corrupt(format!("symlink {shown:?} target differs from the manifest")));
    }
    Ok((kind, size))
}

fn kind_of(t: tar::EntryType) -> Result<EntryKind, String> {
    match t {
        tar::EntryType::Regular => Ok(EntryKind::File),
        tar::EntryType::Directory => Ok(EntryKind::Dir),
        tar::EntryType::Symlink => Ok(EntryKind::Symlink),
        tar::EntryType::Link => Err("hardlink".into()),
        tar::EntryType::Char => Err("character device".into()),
        tar::EntryType::Block => Err("block device".into()),
        tar::EntryType::Fifo => Err("fifo".into()),
        other => Err(format!("unsupported entry type {:?}", other.as_byte() as char)),
    }
}

/// Files up to this size are handed whole to a writer thread; larger ones
/// are streamed by the reading thread.
const HANDOFF_MAX: u64 = 16 << 20;
/// File contents read but not yet written, at most.
const IN_FLIGHT_MAX: u64 = 96 << 20;
/// Decompressed chunks the decoding thread may run ahead.
const READ_AHEAD: usize = 8;
const CHUNK: usize = 1 << 20;

/// A reader fed by a decoding thread over a bounded channel.
struct ChanReader {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}
impl Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(v)) if v.is_empty() => self.done = true,
                Ok(Ok(v)) => (self.cur, self.pos) = (v, 0),
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other("the decoding thread stopped"));
                }
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Decodes `r` into chunks until the end, an error, or the reader is gone.
fn decode_into(mut r: impl Read, tx: std::sync::mpsc::SyncSender<io::Result<Vec<u8>>>) {
    loop {
        let mut v = vec![0u8; CHUNK];
        let mut n = 0;
        while n < CHUNK {
            match r.read(&mut v[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if n > 0 {
                        v.truncate(n);
                        let _ = tx.send(Ok(v));
                    }
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
        v.truncate(n);
        let end = n == 0;
        if tx.send(Ok(v)).is_err() || end {
            return;
        }
    }
}

/// A whole file for a writer thread.
struct WriteJob {
    dest: PathBuf,
    data: Vec<u8>,
    sha256: String,
    mode: u32,
    shown: String,
}

/// What the writer threads share with the reading thread.
struct Writers {
    failed: std::sync::atomic::AtomicBool,
    error: std::sync::Mutex<Option<CacheError>>,
    in_flight: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
}

impl Writers {
    fn fail(&self, e: CacheError) {
        let mut slot = self.error.lock().expect("writer error lock");
        slot.get_or_insert(e);
        self.failed.store(true, std::sync::atomic::Ordering::Release);
        self.freed.notify_all();
    }
    fn take_error(&self) -> Option<CacheError> {
        self.error.lock().expect("writer error lock").take()
    }
    /// Waits until `n` more bytes fit in flight (or a writer failed).
    fn reserve(&self, n: u64) {
        let mut g = self.in_flight.lock().expect("in-flight lock");
        while *g > 0 && *g + n > IN_FLIGHT_MAX && !self.failed.load(std::sync::atomic::Ordering::Acquire) {
            g = self.freed.wait(g).expect("in-flight lock");
        }
        *g += n;
    }
    fn release(&self, n: u64) {
        *self.in_flight.lock().expect("in-flight lock") -= n;
        self.freed.notify_all();
    }
}

fn create_file(dest: &Path) -> io::Result<fs::File> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(dest)
}

fn write_job(j: &WriteJob) -> Result<(), CacheError> {
    let wctx = |e| io_err(format_args!("restoring {}", j.dest.display()), e);
    let digest = hex::encode(Sha256::digest(&j.data));
    if digest != j.sha256 {
        return Err(CacheError::Corrupt(format!("member {:?}: sha256 {digest} differs from the manifest", j.shown)));
    }
    let mut f = create_file(&j.dest).map_err(wctx)?;
    f.write_all(&j.data).map_err(wctx)?;
    f.set_permissions(fs::Permissions::from_mode(j.mode)).map_err(wctx)
}

fn writer_loop(rx: &std::sync::Mutex<std::sync::mpsc::Receiver<WriteJob>>, w: &Writers) {
    loop {
        let job = match rx.lock().expect("job queue lock").recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        let n = job.data.len() as u64;
        if !w.failed.load(std::sync::atomic::Ordering::Acquire)
            && let Err(e) = write_job(&job)
        {
            w.fail(e);
        }
        drop(job);
        w.release(n);
    }
}

/// Streams the archive into `dirs` (one staging dir per root), verifying as
/// it goes. Returns which roots are present in the archive.
///
/// Three stages overlap: a thread decodes zstd, this thread parses the tar
/// stream against the manifest (directories and links are made here, in
/// order), and writer threads hash and write whole files; a file larger than
/// [`HANDOFF_MAX`] is hashed and written here.
fn extract(
    archive: impl Read + Send,
    dirs: &[PathBuf],
    declared: &[String],
    limits: &Limits,
) -> Result<(Vec<bool>, Unpacked), CacheError> {
    let mut dec =
        zstd::stream::read::Decoder::new(SourceReader(archive)).map_err(|e| io_err("starting the zstd decoder", e))?;
    dec.window_log_max(27).map_err(|e| io_err("configuring the zstd decoder", e))?;
    let writers = Writers {
        failed: false.into(),
        error: std::sync::Mutex::new(None),
        in_flight: std::sync::Mutex::new(0),
        freed: std::sync::Condvar::new(),
    };
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel::<WriteJob>(64);
    let jobs_rx = std::sync::Mutex::new(jobs_rx);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
        s.spawn(move || decode_into(dec, tx));
        let n_writers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(2, 4);
        let mut handles = Vec::new();
        for _ in 0..n_writers {
            handles.push(s.spawn(|| writer_loop(&jobs_rx, &writers)));
        }
        let reader = ChanReader { rx, cur: Vec::new(), pos: 0, done: false };
        let r = extract_stream(reader, dirs, declared, limits, &jobs_tx, &writers);
        drop(jobs_tx);
        for h in handles {
            let _ = h.join();
        }
        if let Some(e) = writers.take_error() {
            return Err(e);
        }
        let x = r?;
        // Directory modes last (children were written into 0700 dirs, and
        // every writer is done), deepest first.
        for (dir, mode) in x.dir_modes.iter().rev() {
            fs::set_permissions(dir, fs::Permissions::from_mode(*mode))
                .map_err(|e| io_err(format_args!("chmod {}", dir.display()), e))?;
        }
        Ok((x.present, x.unpacked))
    })
}

fn extract_stream(
    reader: ChanReader,
    dirs: &[PathBuf],
    declared: &[String],
    limits: &Limits,
    jobs: &std::sync::mpsc::SyncSender<WriteJob>,
    writers: &Writers,
) -> Result<Extracted, CacheError> {
    let per_entry = 3 * 512 + 2 * limits.max_path_bytes as u64;
    let budget = limits
        .max_expanded_bytes
        .saturating_add(manifest_cap(limits))
        .saturating_add(limits.max_entries.saturating_add(2).saturating_mul(per_entry))
        .saturating_add(MAX_TRAILER);
    let mut ar = tar::Archive::new(LimitReader { inner: reader, read: 0, budget });
    let mut entries = ar.entries().map_err(|e| read_err("reading the archive", e))?.raw(true);

    let manifest = manifest_member(&mut entries, declared, limits)?;

    let mut present = vec![false; dirs.len()];
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut bytes = 0u64;
    let mut count = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    while let Some(mut m) = next_member(&mut entries, limits)? {
        limits.check_deadline("unpacking the cache")?;
        if writers.failed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(writers.take_error().unwrap_or_else(|| CacheError::Io(io::Error::other("a writer failed"))));
        }
        let shown = String::from_utf8_lossy(&m.name).into_owned();
        let Some(exp) = manifest.entries.get(count) else {
            return Err(CacheError::Refused(format!("member {shown:?} is not in the manifest")));
        };
        let (kind, size) = check_member(&m, exp, limits)?;
        let root_dir = &dirs[exp.root as usize];
        let dest = if exp.path.is_empty() { root_dir.clone() } else { root_dir.join(&exp.path) };
        let wctx = |e| io_err(format_args!("restoring {}", dest.display()), e);
        match kind {
            EntryKind::Dir => {
                if exp.path.is_empty() {
                    present[exp.root as usize] = true;
                } else {
                    DirBuilder::new().mode(0o700).create(&dest).map_err(wctx)?;
                }
                dir_modes.push((dest.clone(), exp.mode));
            }
            EntryKind::Symlink => {
                let target = exp.target.as_deref().unwrap_or_default();
                std::os::unix::fs::symlink(target, &dest).map_err(wctx)?;
            }
            EntryKind::File => {
                if bytes.saturating_add(size) > limits.max_expanded_bytes {
                    return Err(CacheError::TooLarge(format!(
                        "member {shown:?} takes the archive past {} bytes",
                        limits.max_expanded_bytes
                    )));
                }
                let sha256 = exp.sha256.clone().unwrap_or_default();
                if size <= HANDOFF_MAX {
                    let mut data = Vec::with_capacity(size as usize);
                    (&mut m.entry)
                        .take(size + 1)
                        .read_to_end(&mut data)
                        .map_err(|e| read_err(&format!("member {shown:?}"), e))?;
                    if data.len() as u64 > size {
                        return Err(CacheError::Corrupt(format!("member {shown:?} is longer than its header")));
                    }
                    if (data.len() as u64) != size {
                        return Err(CacheError::Corrupt(format!(
                            "member {shown:?} is truncated ({} of {size} bytes)",
                            data.len()
                        )));
                    }
                    writers.reserve(size);
                    let job = WriteJob { dest, data, sha256, mode: exp.mode, shown };
                    if jobs.send(job).is_err() {
                        writers.release(size);
                        return Err(CacheError::Io(io::Error::other("the writer threads stopped")));
                    }
                    bytes += size;
                } else {
                    let mut f = create_file(&dest).map_err(wctx)?;
                    let mut hasher = Sha256::new();
                    let mut n = 0u64;
                    loop {
                        let k = match m.entry.read(&mut buf) {
                            Ok(0) => break,
                            Ok(k) => k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(read_err(&format!("member {shown:?}"), e)),
                        };
                        n += k as u64;
                        if n > size {
                            return Err(CacheError::Corrupt(format!("member {shown:?} is longer than its header")));
                        }
                        hasher.update(&buf[..k]);
                        f.write_all(&buf[..k]).map_err(wctx)?;
                    }
                    if n != size {
                        return Err(CacheError::Corrupt(format!(
                            "member {shown:?} is truncated ({n} of {size} bytes)"
                        )));
                    }
                    let digest = hex::encode(hasher.finalize());
                    if digest != sha256 {
                        return Err(CacheError::Corrupt(format!(
                            "member {shown:?}: sha256 {digest} differs from the manifest"
                        )));
                    }
                    f.set_permissions(fs::Permissions::from_mode(exp.mode)).map_err(wctx)?;
                    bytes += n;
                }
            }
        }
        count += 1;
    }
    check_end(ar.into_inner(), count, manifest.entries.len())?;
    let left_out = manifest.left_out;
    Ok(Extracted { present, unpacked: Unpacked { entries: count as u64, bytes, left_out }, dir_modes })
}

struct Extracted {
    present: Vec<bool>,
    unpacked: Unpacked,
    /// Directories and their modes, parents first.
    dir_modes: Vec<(PathBuf, u32)>,
}
