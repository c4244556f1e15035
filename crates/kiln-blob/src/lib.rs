//! Bulk bytes: attempt-scoped staging objects written in parts, verified and
//! made immutable at completion, read back for restores (spec 000 §12).
//!
//! [`BlobStore`] is either the local directory (the embedded default) or an
//! S3-compatible bucket ([`s3`]); with S3 the agents move bytes straight to
//! and from the bucket through presigned URLs.
//!
//! Contract of [`LocalBlobStore`]:
//! - `write_part` is idempotent per (key, part): a retry with identical bytes
//!   succeeds, parts may arrive in any order and concurrently.
//! - `complete` reads the staged bytes, verifies size and sha256 against the
//!   expectation, and atomically publishes an immutable object under the key;
//!   after that the staging bytes are gone and no part can change it.
//! - Objects are never overwritten: fresh sessions use fresh keys.
//! - `delete` removes staged and completed bytes of a key; it is safe to call
//!   on keys that never existed.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::fs;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("object key `{0}` is not valid")]
    BadKey(String),
    #[error("part {part} is {size} bytes; parts are {part_size} bytes except the last")]
    BadPart { part: u64, size: u64, part_size: u64 },
    #[error(
        "stored bytes do not match: expected {expected_size} bytes sha256 {expected_sha256}, got {size} bytes sha256 {sha256}"
    )]
    Mismatch { expected_size: u64, expected_sha256: String, size: u64, sha256: String },
    #[error("object `{0}` not found")]
    NotFound(String),
    #[error("object `{0}` already exists")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("object store I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, BlobError>;

pub mod s3;
pub use s3::{PresignedRequest, S3BlobStore, S3Config};

/// The configured object store.
#[derive(Debug, Clone)]
pub enum BlobStore {
    Local(LocalBlobStore),
    S3(S3BlobStore),
}

impl BlobStore {
    /// `url`: empty or `file://` for the local directory `default_dir`,
    /// `s3://BUCKET[/PREFIX]?endpoint=…&region=…` for S3.
    pub fn open_url(url: &str, default_dir: &Path) -> std::result::Result<BlobStore, String> {
        if url.is_empty() {
            return Ok(BlobStore::Local(LocalBlobStore::new(default_dir)));
        }
        if let Some(dir) = url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(format!("object store URL `{url}`: file:// needs an absolute path"));
            }
            return Ok(BlobStore::Local(LocalBlobStore::new(dir)));
        }
        if url.starts_with("s3://") {
            let cfg = S3Config::parse(url)?;
            return S3BlobStore::new(cfg).map(BlobStore::S3).map_err(|e| e.to_string());
        }
        Err(format!("object store URL `{url}`: use s3://BUCKET?endpoint=…&region=… or file:///DIR"))
    }

    /// A short description for logs (no credentials).
    pub fn describe(&self) -> String {
        match self {
            BlobStore::Local(l) => format!("local directory {}", l.root().display()),
            BlobStore::S3(s) => {
                let c = s.config();
                format!(
                    "S3 bucket {}{}{} at {}",
                    c.bucket,
                    if c.prefix.is_empty() { "" } else { "/" },
                    c.prefix,
                    c.endpoint.as_deref().unwrap_or("AWS")
                )
            }
        }
    }

    pub async fn put_object(&self, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        match self {
            BlobStore::Local(l) => l.put_object(key, data).await,
            BlobStore::S3(s) => s.put_object(key, data).await,
        }
    }

    /// Publish the concatenation of `parts` as the immutable object `key`,
    /// durably, computing no digest (see [`LocalBlobStore::put_parts`]). The
    /// same bytes again are a no-op; different bytes are refused.
    pub async fn put_parts(&self, key: &str, parts: Vec<Vec<u8>>) -> Result<()> {
        match self {
            BlobStore::Local(l) => l.put_parts(key, parts).await,
            BlobStore::S3(s) => s.put_object(key, &parts.concat()).await.map(|_| ()),
        }
    }

    pub async fn read_all(&self, key: &str) -> Result<Vec<u8>> {
        match self {
            BlobStore::Local(l) => {
                let (mut f, _) = l.open(key).await?;
                let mut v = vec![];
                f.read_to_end(&mut v).await?;
                Ok(v)
            }
            BlobStore::S3(s) => s.read_all(key).await,
        }
    }

    pub async fn read_range(&self, key: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        match self {
            BlobStore::Local(l) => l.read_range(key, offset, len).await,
            BlobStore::S3(s) => s.read_range(key, offset, len).await,
        }
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        match self {
            BlobStore::Local(l) => l.delete(key).await,
            BlobStore::S3(s) => s.delete(key).await,
        }
    }

    /// Whether completed (or, locally, staged) bytes exist under `key`.
    pub async fn exists(&self, key: &str) -> Result<bool> {
        match self {
            BlobStore::Local(l) => Ok(l.exists(key).await),
            BlobStore::S3(s) => Ok(s.head(key).await?.is_some()),
        }
    }

    /// Whether an object of `size` bytes can move to its content key: S3
    /// copies one object in one request only up to 5 GiB (larger ones keep
    /// their session key: stored per upload, as before issue 45).
    pub fn content_addressable(&self, size: u64) -> bool {
        match self {
            BlobStore::Local(_) => true,
            BlobStore::S3(_) => size <= 5 << 30,
        }
    }

    /// Move the completed object `from` (bytes `expected`) to the content
    /// key `to` (issue 45): when `to` holds them already, `from` is just
    /// deleted. S3 reads `from` back and refuses bytes that are not
    /// `expected` (the agent named the sha256; the key must be the truth).
    /// Idempotent: `from` gone and `to` present is done.
    pub async fn promote(&self, from: &str, to: &str, expected: &ObjectInfo) -> Result<()> {
        match self {
            BlobStore::Local(l) => l.promote(from, to).await,
            BlobStore::S3(s) => s.promote(from, to, expected).await,
        }
    }

    /// Copy the completed object `from` to the content key `to` unless it
    /// holds the bytes already, after checking they are `expected` (a
    /// generation written before content addressing; `from` stays, being
    /// perhaps read right now).
    pub async fn copy_to_content(&self, from: &str, to: &str, expected: &ObjectInfo) -> Result<()> {
        match self {
            BlobStore::Local(l) => l.copy_to_content(from, to, expected).await,
            BlobStore::S3(s) => s.copy_to_content(from, to, expected).await,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    root: PathBuf,
    /// Per staged key: a lock serializing its part writes, and the sha256 of
    /// the bytes written so far when parts arrived in order. `complete` then
    /// verifies without reading the object back; any out-of-order or
    /// repeated write drops the running hash and `complete` reads instead.
    uploads: Arc<std::sync::Mutex<HashMap<String, UploadState>>>,
}

/// The running hash of one staged key, behind the lock serializing its writes.
type UploadState = Arc<tokio::sync::Mutex<Option<Running>>>;

#[derive(Debug)]
struct Running {
    next_offset: u64,
    hasher: Sha256,
}

/// What a part write stored: its size, and its sha256 when it was computed
/// (parts written out of order; in-order parts only feed the object's
/// running hash, so each byte is hashed once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    pub size: u64,
    pub sha256: Option<String>,
}

/// Size and content identity of stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    pub sha256: String,
}

impl ObjectInfo {
    /// These bytes, if they are `expected`; else [`BlobError::Mismatch`].
    pub fn matching(self, expected: &ObjectInfo) -> Result<ObjectInfo> {
        if &self == expected {
            return Ok(self);
        }
        Err(BlobError::Mismatch {
            expected_size: expected.size,
            expected_sha256: expected.sha256.clone(),
            size: self.size,
            sha256: self.sha256,
        })
    }
}

fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 512
        && key.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    if ok { Ok(()) } else { Err(BlobError::BadKey(key.into())) }
}

impl LocalBlobStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalBlobStore { root: root.into(), uploads: Default::default() }
    }

    fn upload_state(&self, key: &str) -> UploadState {
        self.uploads.lock().expect("uploads").entry(key.to_string()).or_default().clone()
    }

    fn staging(&self, key: &str) -> PathBuf {
        self.root.join("staging").join(key)
    }

    fn object(&self, key: &str) -> PathBuf {
        self.root.join("objects").join(key)
    }

    /// Write part `part` (0-based) of the staged object `key`. Every part but
    /// the last must be exactly `part_size` bytes; the bytes are written at
    /// `part * part_size`. Returns the part's size and sha256.
    pub async fn write_part<R: tokio::io::AsyncRead + Unpin>(
        &self,
        key: &str,
        part: u64,
        part_size: u64,
        expected_total: u64,
        mut body: R,
    ) -> Result<PartInfo> {
        check_key(key)?;
        let offset = part.checked_mul(part_size).filter(|o| *o < expected_total.max(1)).ok_or(BlobError::BadPart {
            part,
            size: 0,
            part_size,
        })?;
        let want = part_size.min(expected_total - offset.min(expected_total));
        let state = self.upload_state(key);
        let mut state = state.lock().await;
        // Extend the running hash only for the next part in order (or a
        // restart at part 0); anything else falls back to a full read.
        let mut running = match state.take() {
            Some(r) if r.next_offset == offset => Some(r),
            _ if offset == 0 => Some(Running { next_offset: 0, hasher: Sha256::new() }),
            _ => None,
        };
        let path = self.staging(key);
        fs::create_dir_all(path.parent().expect("parent")).await?;
        let mut f = fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path).await?;
        f.seek(SeekFrom::Start(offset)).await?;
        let mut part_hasher = running.is_none().then(Sha256::new);
        let mut buf = vec![0u8; 1024 * 1024];
        let mut n: u64 = 0;
        loop {
            let r = body.read(&mut buf).await?;
            if r == 0 {
                break;
            }
            n += r as u64;
            if n > want {
                return Err(BlobError::BadPart { part, size: n, part_size });
            }
            match (running.as_mut(), part_hasher.as_mut()) {
                (Some(run), _) => run.hasher.update(&buf[..r]),
                (None, Some(h)) => h.update(&buf[..r]),
                (None, None) => {}
            }
            f.write_all(&buf[..r]).await?;
        }
        if n != want {
            return Err(BlobError::BadPart { part, size: n, part_size });
        }
        f.flush().await?;
        *state = running.map(|mut r| {
            r.next_offset = offset + n;
            r
        });
        Ok(PartInfo { size: n, sha256: part_hasher.map(|h| hex::encode(h.finalize())) })
    }

    /// Verify the staged bytes of `key` and publish them as an immutable object.
    pub async fn complete(&self, key: &str, expected: &ObjectInfo) -> Result<ObjectInfo> {
        check_key(key)?;
        let staging = self.staging(key);
        let object = self.object(key);
        if fs::try_exists(&object).await? {
            // A lost response to an earlier complete: verify what is there.
            let got = hash_file(&object).await?;
            return if &got == expected { Ok(got) } else { Err(BlobError::Exists(key.into())) };
        }
        let mut f = match fs::File::open(&staging).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && expected.size == 0 => {
                fs::create_dir_all(staging.parent().expect("parent")).await?;
                fs::File::create(&staging).await?;
                fs::File::open(&staging).await?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(BlobError::NotFound(key.into())),
            Err(e) => return Err(e.into()),
        };
        f.sync_all().await?;
        let running = {
            let state = self.upload_state(key);
            let mut state = state.lock().await;
            state.take()
        };
        self.uploads.lock().expect("uploads").remove(key);
        let got = match running {
            // Every byte was hashed as it was written, in order, and nothing
            // rewrote it since: no need to read the object back.
            Some(r) if r.next_offset == f.metadata().await?.len() => {
                ObjectInfo { size: r.next_offset, sha256: hex::encode(r.hasher.finalize()) }
            }
            _ => hash_reader(&mut f).await?,
        };
        let got = got.matching(expected)?;
        fs::create_dir_all(object.parent().expect("parent")).await?;
        let mut perms = fs::metadata(&staging).await?.permissions();
        perms.set_readonly(true);
        fs::set_permissions(&staging, perms).await?;
        fs::rename(&staging, &object).await?;
        Ok(got)
    }

    /// Open a completed object for reading.
    pub async fn open(&self, key: &str) -> Result<(fs::File, u64)> {
        check_key(key)?;
        match fs::File::open(self.object(key)).await {
            Ok(f) => {
                let len = f.metadata().await?.len();
                Ok((f, len))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(BlobError::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Publish `data` as the immutable object `key` in one step (small,
    /// server-written objects such as log archives): written to staging,
    /// synced, then renamed into place. Writing the same bytes again is a
    /// no-op; different bytes under an existing key are refused. Returns
    /// the bytes' size and sha256.
    pub async fn put_object(&self, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        check_key(key)?;
        let info = ObjectInfo { size: data.len() as u64, sha256: hex::encode(Sha256::digest(data)) };
        self.put_parts(key, vec![data.to_vec()]).await?;
        Ok(info)
    }

    /// [`Self::put_object`] of the concatenation of `parts`, taking them
    /// (no copy), and computing no digest: the log objects of the
    /// PostgreSQL store (issue 47, item 6), whose chunks the store hashed
    /// already. Per 200 MB of log, `put_object` of the concatenated chunks
    /// (a copy for the write task, a second sha256, the write) took ~400 ms
    /// of the server's CPU, where SQLite's write of the same bytes to its
    /// segment file took ~50 ms (`perf record` of `kiln bench logs
    /// --database-url postgres`). An object already there is compared
    /// byte for byte.
    ///
    /// The file work is one blocking task (as a dozen `tokio::fs` calls,
    /// each a hop to the blocking pool, a 1 MiB log object took 5–15 ms on
    /// a loaded two-core host; the disk's share was about 1 ms).
    pub async fn put_parts(&self, key: &str, parts: Vec<Vec<u8>>) -> Result<()> {
        check_key(key)?;
        let object = self.object(key);
        // A private staging name: two writers of the same key (replicas
        // archiving the same log) never write into one file.
        let staging = self.staging(key).with_extension(format!("put-{}", rand_suffix()));
        let put = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Vec<Vec<u8>>>> {
            use std::io::Write;
            if object.exists() {
                return Ok(Some(parts));
            }
            for p in [&staging, &object] {
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir)?;
                }
            }
            let mut f = std::fs::File::create(&staging)?;
            for part in &parts {
                f.write_all(part)?;
            }
            f.sync_all()?;
            let mut perms = f.metadata()?.permissions();
            perms.set_readonly(true);
            f.set_permissions(perms)?;
            drop(f);
            std::fs::rename(&staging, &object)?;
            // The rename itself survives a crash (log bytes are
            // acknowledged once their object is put).
            if let Some(dir) = object.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(None)
        });
        let there = put.await.map_err(|e| std::io::Error::other(format!("object write task: {e}")))??;
        match there {
            None => Ok(()),
            // There already: the same bytes are a no-op, others refused.
            // Read a MiB at a time (an archive is up to 256 MiB).
            Some(parts) => {
                let (mut f, size) = self.open(key).await?;
                if size != parts.iter().map(|p| p.len() as u64).sum::<u64>() {
                    return Err(BlobError::Exists(key.into()));
                }
                let mut buf = vec![0u8; 1024 * 1024];
                for p in &parts {
                    for want in p.chunks(buf.len()) {
                        let have = &mut buf[..want.len()];
                        f.read_exact(have).await?;
                        if have != want {
                            return Err(BlobError::Exists(key.into()));
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// `len` bytes of the completed object `key` from `offset`.
    pub async fn read_range(&self, key: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let (mut f, size) = self.open(key).await?;
        if offset + len as u64 > size {
            return Err(BlobError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("object `{key}` has {size} bytes; asked for {len} at {offset}"),
            )));
        }
        f.seek(SeekFrom::Start(offset)).await?;
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf).await?;
        Ok(buf)
    }

    /// Remove staged and completed bytes of `key`.
    pub async fn delete(&self, key: &str) -> Result<()> {
        check_key(key)?;
        self.uploads.lock().expect("uploads").remove(key);
        for p in [self.staging(key), self.object(key)] {
            match fs::remove_file(&p).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// [`BlobStore::promote`]: a rename within the store's directory.
    pub async fn promote(&self, from: &str, to: &str) -> Result<()> {
        check_key(from)?;
        check_key(to)?;
        let (src, dst) = (self.object(from), self.object(to));
        if fs::try_exists(&dst).await? {
            // Stored once: this upload's copy goes.
            return match fs::remove_file(&src).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        fs::create_dir_all(dst.parent().expect("parent")).await?;
        match fs::rename(&src, &dst).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if fs::try_exists(&dst).await? {
                    Ok(())
                } else {
                    Err(BlobError::NotFound(from.into()))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`BlobStore::copy_to_content`]: verified, copied to a temporary file
    /// and renamed into place.
    pub async fn copy_to_content(&self, from: &str, to: &str, expected: &ObjectInfo) -> Result<()> {
        check_key(from)?;
        check_key(to)?;
        let dst = self.object(to);
        if fs::try_exists(&dst).await? {
            return Ok(());
        }
        hash_file(&self.object(from)).await?.matching(expected)?;
        fs::create_dir_all(dst.parent().expect("parent")).await?;
        let tmp = dst.with_extension(format!("tmp-{}", rand_suffix()));
        fs::copy(self.object(from), &tmp).await?;
        let f = fs::File::open(&tmp).await?;
        f.sync_all().await?;
        let mut perms = f.metadata().await?.permissions();
        perms.set_readonly(true);
        fs::set_permissions(&tmp, perms).await?;
        fs::rename(&tmp, &dst).await?;
        Ok(())
    }

    /// True when staged or completed bytes exist for `key`.
    pub async fn exists(&self, key: &str) -> bool {
        check_key(key).is_ok()
            && (fs::try_exists(self.staging(key)).await.unwrap_or(false)
                || fs::try_exists(self.object(key)).await.unwrap_or(false))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

fn rand_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

async fn hash_reader<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Result<ObjectInfo> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf).await?;
        if k == 0 {
            break;
        }
        n += k as u64;
        hasher.update(&buf[..k]);
    }
    Ok(ObjectInfo { size: n, sha256: hex::encode(hasher.finalize()) })
}

async fn hash_file(p: &Path) -> Result<ObjectInfo> {
    let mut f = fs::File::open(p).await?;
    hash_reader(&mut f).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(b: &[u8]) -> ObjectInfo {
        ObjectInfo { size: b.len() as u64, sha256: hex::encode(Sha256::digest(b)) }
    }

    #[tokio::test]
    async fn parts_in_any_order_with_identical_retries() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let ps = 16_384u64;
        let total = data.len() as u64;
        for part in [2u64, 0, 1, 0] {
            let lo = (part * ps) as usize;
            let hi = ((part + 1) * ps).min(total) as usize;
            s.write_part("a/b/1", part, ps, total, &data[lo..hi]).await.unwrap();
        }
        let got = s.complete("a/b/1", &info(&data)).await.unwrap();
        assert_eq!(got, info(&data));
        let (mut f, len) = s.open("a/b/1").await.unwrap();
        assert_eq!(len, total);
        let mut back = vec![];
        f.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, data);
        // Completing again (lost response) verifies instead of failing.
        assert_eq!(s.complete("a/b/1", &info(&data)).await.unwrap(), info(&data));
    }

    #[tokio::test]
    async fn in_order_and_out_of_order_uploads_verify_the_same() {
        let data: Vec<u8> = (0..50_000u32).flat_map(|i| i.to_be_bytes()).collect();
        let ps = 65_536u64;
        let total = data.len() as u64;
        let parts = total.div_ceil(ps);
        for order in [vec![0, 1, 2, 3], vec![3, 2, 1, 0], vec![0, 1, 0, 1, 2, 3], vec![0, 2, 1, 3]] {
            let dir = tempfile::tempdir().unwrap();
            let s = LocalBlobStore::new(dir.path());
            assert_eq!(parts, 4);
            for part in order {
                let lo = (part * ps) as usize;
                let hi = ((part + 1) * ps).min(total) as usize;
                s.write_part("k", part, ps, total, &data[lo..hi]).await.unwrap();
            }
            assert_eq!(s.complete("k", &info(&data)).await.unwrap(), info(&data));
        }
    }

    #[tokio::test]
    async fn a_rewritten_part_with_other_bytes_is_caught() {
        // In-order hashing must not vouch for bytes that were overwritten later.
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        s.write_part("k", 0, 4, 8, &b"abcd"[..]).await.unwrap();
        s.write_part("k", 1, 4, 8, &b"efgh"[..]).await.unwrap();
        s.write_part("k", 0, 4, 8, &b"ABCD"[..]).await.unwrap();
        assert!(matches!(s.complete("k", &info(b"abcdefgh")).await, Err(BlobError::Mismatch { .. })));
    }

    #[tokio::test]
    async fn mismatch_is_refused_and_nothing_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        s.write_part("k", 0, 1024, 5, &b"hello"[..]).await.unwrap();
        let err = s.complete("k", &info(b"HELLO")).await.unwrap_err();
        assert!(matches!(err, BlobError::Mismatch { .. }));
        assert!(matches!(s.open("k").await.unwrap_err(), BlobError::NotFound(_)));
    }

    #[tokio::test]
    async fn wrong_part_sizes_and_bad_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        assert!(matches!(s.write_part("k", 0, 4, 10, &b"abc"[..]).await, Err(BlobError::BadPart { .. })));
        assert!(matches!(s.write_part("k", 0, 4, 10, &b"abcde"[..]).await, Err(BlobError::BadPart { .. })));
        assert!(matches!(s.write_part("k", 3, 4, 10, &b"ab"[..]).await, Err(BlobError::BadPart { .. })));
        for key in ["../x", "a/../b", "/abs", "a//b", "sp ace", ""] {
            assert!(matches!(s.write_part(key, 0, 4, 4, &b"abcd"[..]).await, Err(BlobError::BadKey(_))), "{key}");
        }
    }

    #[tokio::test]
    async fn identical_bytes_are_stored_once_under_their_content_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::Local(LocalBlobStore::new(dir.path()));
        let BlobStore::Local(local) = &store else { unreachable!() };
        let data = b"the same bytes";
        let want = info(data);
        let cas = format!("cas/sha256/{}", want.sha256);
        for key in ["a/1", "b/2"] {
            local.write_part(key, 0, 1024, data.len() as u64, &data[..]).await.unwrap();
            local.complete(key, &want).await.unwrap();
            store.promote(key, &cas, &want).await.unwrap();
            assert!(!local.exists(key).await, "{key}: the upload's own copy is gone");
            // Promoting again (a lost response) is done already.
            store.promote(key, &cas, &want).await.unwrap();
        }
        assert_eq!(store.read_all(&cas).await.unwrap(), data);
        assert!(matches!(
            store.promote("c/3", &format!("cas/sha256/{}", "0".repeat(64)), &want).await,
            Err(BlobError::NotFound(_))
        ));
        // An object written before: copied (checked), the old key kept.
        local.put_object("old/1", b"older bytes").await.unwrap();
        let old = info(b"older bytes");
        let to = format!("cas/sha256/{}", old.sha256);
        let wrong = ObjectInfo { size: old.size, sha256: want.sha256.clone() };
        assert!(matches!(store.copy_to_content("old/1", &to, &wrong).await, Err(BlobError::Mismatch { .. })));
        assert!(!local.exists(&to).await, "nothing copied under a key that is not its digest");
        store.copy_to_content("old/1", &to, &old).await.unwrap();
        assert_eq!(store.read_all(&to).await.unwrap(), b"older bytes");
        assert_eq!(store.read_all("old/1").await.unwrap(), b"older bytes");
    }

    #[tokio::test]
    async fn delete_removes_staged_and_completed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        s.write_part("x/1", 0, 8, 3, &b"abc"[..]).await.unwrap();
        assert!(s.exists("x/1").await);
        s.delete("x/1").await.unwrap();
        assert!(!s.exists("x/1").await);
        s.delete("never").await.unwrap();
    }

    #[tokio::test]
    async fn put_object_is_immutable_and_read_by_range() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        let info = store.put_object("logs/j/1-3.seg", b"hello world").await.unwrap();
        assert_eq!(info.size, 11);
        assert_eq!(store.put_object("logs/j/1-3.seg", b"hello world").await.unwrap(), info, "same bytes: a no-op");
        assert!(matches!(store.put_object("logs/j/1-3.seg", b"HELLO world").await, Err(BlobError::Exists(_))));
        assert_eq!(store.read_range("logs/j/1-3.seg", 6, 5).await.unwrap(), b"world");
        assert!(store.read_range("logs/j/1-3.seg", 8, 5).await.is_err(), "past the end");
        assert!(matches!(store.put_object("../escape", b"x").await, Err(BlobError::BadKey(_))));
        assert!(!store.exists("logs/j/1-3.seg.tmp").await);
    }

    #[tokio::test]
    async fn put_parts_publishes_the_concatenation_and_refuses_other_bytes_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::new(dir.path());
        let parts = || vec![b"hello".to_vec(), vec![], b" world".to_vec()];
        store.put_parts("logs/segments/000000000001", parts()).await.unwrap();
        let (mut f, size) = store.open("logs/segments/000000000001").await.unwrap();
        let mut all = vec![];
        f.read_to_end(&mut all).await.unwrap();
        assert_eq!((size, &all[..]), (11, &b"hello world"[..]));
        store.put_parts("logs/segments/000000000001", parts()).await.expect("the same bytes again: a no-op");
        store
            .put_parts("logs/segments/000000000001", vec![b"hello world".to_vec()])
            .await
            .expect("the same bytes, cut elsewhere: a no-op");
        for other in [
            vec![b"hello".to_vec(), b" World".to_vec()],
            vec![b"hello".to_vec()],
            vec![b"hello world!".to_vec()],
            vec![b"hello world".to_vec(), b"!".to_vec()],
        ] {
            let e = store.put_parts("logs/segments/000000000001", other.clone()).await;
            assert!(matches!(e, Err(BlobError::Exists(_))), "{other:?}: {e:?}");
        }
        assert_eq!(store.read_range("logs/segments/000000000001", 0, 11).await.unwrap(), b"hello world");
        // Compared a MiB at a time: a difference past the first MiB is found.
        let big = vec![7u8; 1024 * 1024 + 10];
        store.put_parts("logs/segments/000000000002", vec![big.clone()]).await.unwrap();
        let cut = vec![big[..5].to_vec(), big[5..].to_vec()];
        store.put_parts("logs/segments/000000000002", cut).await.expect("the same bytes: a no-op");
        let mut other = big.clone();
        *other.last_mut().unwrap() = 8;
        let e = store.put_parts("logs/segments/000000000002", vec![other]).await;
        assert!(matches!(e, Err(BlobError::Exists(_))), "{e:?}");
        assert!(matches!(store.put_parts("../escape", parts()).await, Err(BlobError::BadKey(_))));
        let staged = std::fs::read_dir(dir.path().join("staging/logs/segments")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(staged, 0, "nothing left in staging");
    }
}
