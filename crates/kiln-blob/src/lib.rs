//! Bulk bytes: attempt-scoped staging objects written in parts, verified and
//! made immutable at completion, read back for restores (spec 000 §12).
//!
//! Contract of [`LocalBlobStore`] (the embedded default; S3 arrives later
//! behind the same operations):
//! - `write_part` is idempotent per (key, part): a retry with identical bytes
//!   succeeds, parts may arrive in any order and concurrently.
//! - `complete` reads the staged bytes, verifies size and sha256 against the
//!   expectation, and atomically publishes an immutable object under the key;
//!   after that the staging bytes are gone and no part can change it.
//! - Objects are never overwritten: fresh sessions use fresh keys.
//! - `delete` removes staged and completed bytes of a key; it is safe to call
//!   on keys that never existed.

use sha2::{Digest, Sha256};
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
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
    #[error("object store I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, BlobError>;

#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    root: PathBuf,
}

/// Size and content identity of stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    pub sha256: String,
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
        LocalBlobStore { root: root.into() }
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
    ) -> Result<ObjectInfo> {
        check_key(key)?;
        let offset = part.checked_mul(part_size).filter(|o| *o < expected_total.max(1)).ok_or(BlobError::BadPart {
            part,
            size: 0,
            part_size,
        })?;
        let want = part_size.min(expected_total - offset.min(expected_total));
        let path = self.staging(key);
        fs::create_dir_all(path.parent().expect("parent")).await?;
        let mut f = fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path).await?;
        f.seek(SeekFrom::Start(offset)).await?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
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
            hasher.update(&buf[..r]);
            f.write_all(&buf[..r]).await?;
        }
        if n != want {
            return Err(BlobError::BadPart { part, size: n, part_size });
        }
        f.flush().await?;
        Ok(ObjectInfo { size: n, sha256: hex::encode(hasher.finalize()) })
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
        let got = hash_reader(&mut f).await?;
        if &got != expected {
            return Err(BlobError::Mismatch {
                expected_size: expected.size,
                expected_sha256: expected.sha256.clone(),
                size: got.size,
                sha256: got.sha256,
            });
        }
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

    /// Remove staged and completed bytes of `key`.
    pub async fn delete(&self, key: &str) -> Result<()> {
        check_key(key)?;
        for p in [self.staging(key), self.object(key)] {
            match fs::remove_file(&p).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
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
    async fn delete_removes_staged_and_completed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::new(dir.path());
        s.write_part("x/1", 0, 8, 3, &b"abc"[..]).await.unwrap();
        assert!(s.exists("x/1").await);
        s.delete("x/1").await.unwrap();
        assert!(!s.exists("x/1").await);
        s.delete("never").await.unwrap();
    }
}
