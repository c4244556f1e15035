//! Secrets at rest (issue 13, finding 4): every secret value is stored
//! sealed with XChaCha20-Poly1305 under a key kept apart from the database
//! (`DATA_DIR/secrets.key`, or `--secrets-key-file`), the repository id and
//! secret name as associated data (a sealed value moved to another row does
//! not open). The key's id is stored with each value, so after
//! `kiln secret rotate-key` a running server notices the new key and
//! re-reads its key file.
//!
//! Stored form: `kiln-sealed:v1:KEYID:BASE64(nonce ‖ ciphertext)`. A value
//! without the prefix is a plaintext row from before sealing; the server
//! seals those at start.

use anyhow::Context;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

const PREFIX: &str = "kiln-sealed:v1:";

/// One key and its id (first 8 bytes of its sha256, hex).
#[derive(Clone)]
struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn from_hex(text: &str) -> anyhow::Result<Key> {
        let bytes = hex::decode(text.trim()).context("the secrets key is not hex")?;
        anyhow::ensure!(bytes.len() == 32, "the secrets key must be 32 bytes (64 hex digits)");
        let id = hex::encode(&Sha256::digest(&bytes)[..8]);
        Ok(Key { id, cipher: XChaCha20Poly1305::new_from_slice(&bytes).expect("32-byte key") })
    }
}

/// Seals and opens secret values.
pub struct SecretBox {
    key: RwLock<Key>,
    path: PathBuf,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the secret was sealed with key {0}, which is not this server's key (see `kiln secret rotate-key`)")]
    UnknownKey(String),
    #[error("the sealed secret does not open (corrupted, or moved from another repository or name)")]
    Corrupt,
}

/// The associated data of a secret: which row it belongs to.
fn aad(repo_id: &str, name: &str) -> String {
    format!("{repo_id}\0{name}")
}

/// A fresh random key as hex.
pub fn new_key_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Write `text` to `path` (mode 0600) through a temporary file and a rename.
pub fn write_key_file(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    writeln!(f, "{text}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}

impl SecretBox {
    /// The key in `path`, created (0600) with a random key if missing.
    pub fn load_or_create(path: &Path) -> anyhow::Result<SecretBox> {
        if !path.exists() {
            // Replicas starting at once: only one creates it.
            let tmp = path.with_extension(format!("new.{}", std::process::id()));
            write_key_file(&tmp, &new_key_hex())?;
            if std::fs::hard_link(&tmp, path).is_err() && !path.exists() {
                anyhow::bail!("cannot create {}", path.display());
            }
            let _ = std::fs::remove_file(&tmp);
        }
        let key = Self::read(path)?;
        Ok(SecretBox { key: RwLock::new(key), path: path.to_path_buf() })
    }

    fn read(path: &Path) -> anyhow::Result<Key> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Key::from_hex(&text).with_context(|| format!("in {}", path.display()))
    }

    /// A box for a key given as hex (tests, rotation).
    pub fn from_hex(text: &str) -> anyhow::Result<SecretBox> {
        Ok(SecretBox { key: RwLock::new(Key::from_hex(text)?), path: PathBuf::new() })
    }

    pub fn key_id(&self) -> String {
        self.key.read().expect("key").id.clone()
    }

    pub fn seal(&self, repo_id: &str, name: &str, value: &str) -> String {
        let key = self.key.read().expect("key").clone();
        let nonce_bytes = rand::random::<[u8; 24]>();
        let nonce = &XNonce::from(nonce_bytes);
        let aad = aad(repo_id, name);
        let ct = key
            .cipher
            .encrypt(nonce, Payload { msg: value.as_bytes(), aad: aad.as_bytes() })
            .expect("encryption does not fail");
        let mut blob = nonce_bytes.to_vec();
        blob.extend_from_slice(&ct);
        format!("{PREFIX}{}:{}", key.id, base64::engine::general_purpose::STANDARD.encode(blob))
    }

    /// Whether a stored value is sealed (rather than a legacy plaintext row).
    pub fn is_sealed(stored: &str) -> bool {
        stored.starts_with(PREFIX)
    }

    /// The value of a stored secret. A value sealed under another key makes
    /// the box re-read its key file once (the key was rotated meanwhile).
    pub fn open(&self, repo_id: &str, name: &str, stored: &str) -> Result<String, SealError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let (id, b64) = rest.split_once(':').ok_or(SealError::Corrupt)?;
        let mut key = self.key.read().expect("key").clone();
        if key.id != id
            && !self.path.as_os_str().is_empty()
            && let Ok(fresh) = Self::read(&self.path)
        {
            *self.key.write().expect("key") = fresh.clone();
            key = fresh;
        }
        if key.id != id {
            return Err(SealError::UnknownKey(id.to_string()));
        }
        let blob = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| SealError::Corrupt)?;
        if blob.len() < 24 {
            return Err(SealError::Corrupt);
        }
        let (nonce, ct) = blob.split_at(24);
        let nonce: [u8; 24] = nonce.try_into().expect("24 bytes");
        let aad = aad(repo_id, name);
        let plain = key
            .cipher
            .decrypt(&XNonce::from(nonce), Payload { msg: ct, aad: aad.as_bytes() })
            .map_err(|_| SealError::Corrupt)?;
        String::from_utf8(plain).map_err(|_| SealError::Corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_in_their_row_and_under_their_key() {
        let b = SecretBox::from_hex(&new_key_hex()).unwrap();
        let sealed = b.seal("repo-1", "TOKEN", "s3cret");
        assert!(SecretBox::is_sealed(&sealed) && !sealed.contains("s3cret"), "{sealed}");
        assert_ne!(sealed, b.seal("repo-1", "TOKEN", "s3cret"), "a fresh nonce each time");
        assert_eq!(b.open("repo-1", "TOKEN", &sealed).unwrap(), "s3cret");
        assert_eq!(b.open("repo-2", "TOKEN", &sealed), Err(SealError::Corrupt), "moved to another repository");
        assert_eq!(b.open("repo-1", "OTHER", &sealed), Err(SealError::Corrupt), "moved to another name");
        let other = SecretBox::from_hex(&new_key_hex()).unwrap();
        assert!(matches!(other.open("repo-1", "TOKEN", &sealed), Err(SealError::UnknownKey(_))));
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 3;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(b.open("repo-1", "TOKEN", &String::from_utf8(flipped).unwrap()), Err(SealError::Corrupt));
        // A legacy plaintext row reads as itself.
        assert_eq!(b.open("repo-1", "TOKEN", "plain").unwrap(), "plain");
    }

    #[test]
    fn a_rotated_key_file_is_picked_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let b = SecretBox::load_or_create(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = SecretBox::load_or_create(&path).unwrap();
        assert_eq!(b.key_id(), again.key_id(), "the key is kept");
        // Another process rotates the key and reseals the value.
        let new = new_key_hex();
        let rotated = SecretBox::from_hex(&new).unwrap();
        let sealed = rotated.seal("r", "N", "v");
        write_key_file(&path, &new).unwrap();
        assert_eq!(b.open("r", "N", &sealed).unwrap(), "v");
        assert_eq!(b.key_id(), rotated.key_id());
    }
}
