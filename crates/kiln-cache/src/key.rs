//! The cache key.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::FORMAT_VERSION;

/// Everything a cache key depends on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyParts {
    pub namespace: String,
    pub os: String,
    pub arch: String,
    /// Image digest, or "host".
    pub image: String,
    pub kind: String,
    /// The user's `version`.
    pub version: String,
    /// The declared paths, as written.
    pub paths: Vec<String>,
    /// `(input path, digest)` as returned by [`hash_inputs`](crate::hash_inputs).
    pub inputs: Vec<(String, String)>,
}

/// Lowercase hex sha256 over a canonical encoding of the parts: a domain
/// tag, then every string as its length (u64, big endian) and bytes, every
/// list as its length then its items, in the order namespace,
/// FORMAT_VERSION (u32 big endian), os, arch, image, kind, version, paths,
/// inputs.
pub fn cache_key(parts: &KeyParts) -> String {
    digest("kiln-cache-key", parts, true)
}

/// The key without the input fingerprints (a different domain tag, so it
/// never equals a [`cache_key`]): entries of a dependency cache that differ
/// only in their inputs share it, and `restore-prefix` falls back to them.
pub fn prefix_key(parts: &KeyParts) -> String {
    digest("kiln-cache-prefix", parts, false)
}

/// The canonical encoding both keys hash: `tag`, then the parts in order;
/// each input as its path, and its digest when `with_digests`.
fn digest(tag: &str, parts: &KeyParts, with_digests: bool) -> String {
    let mut h = Sha256::new();
    let put = |h: &mut Sha256, s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    put(&mut h, tag);
    put(&mut h, &parts.namespace);
    h.update(FORMAT_VERSION.to_be_bytes());
    put(&mut h, &parts.os);
    put(&mut h, &parts.arch);
    put(&mut h, &parts.image);
    put(&mut h, &parts.kind);
    put(&mut h, &parts.version);
    h.update((parts.paths.len() as u64).to_be_bytes());
    for p in &parts.paths {
        put(&mut h, p);
    }
    h.update((parts.inputs.len() as u64).to_be_bytes());
    for (path, digest) in &parts.inputs {
        put(&mut h, path);
        if with_digests {
            put(&mut h, digest);
        }
    }
    hex::encode(h.finalize())
}
