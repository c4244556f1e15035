//! Build caches for CI jobs: the archive format, `pack`, `unpack`, input
//! hashing and the cache key.
//!
//! An archive is a zstd-compressed tar stream. Its first member is
//! `.kiln-cache/manifest.json` (a [`Manifest`]); every following member is
//! `"<root index>/<relative path>"` (the root directory itself is the member
//! `"<root index>"`) and must match, in order, the manifest entry at the same
//! position. `unpack` verifies every member against the manifest while it
//! streams, writes into staging directories and only moves them into place
//! once the whole archive has been verified.

use serde::{Deserialize, Serialize};

mod beneath;
#[doc(hidden)]
pub mod corpus;
mod export;
mod inputs;
mod key;
mod pack;
mod paths;
mod unpack;

pub use beneath::{Target, count_names, target_within};
pub use export::{ExportFormat, Exported, export};
pub use inputs::{ABSENT, hash_inputs};
pub use key::{KeyParts, cache_key, prefix_key};
pub use pack::{Packed, Scan, Source, pack, pack_sources, verify_tree};
pub use unpack::{Unpacked, install, manifest_digest, read_manifest, unpack};

/// Version of the archive format (also part of the cache key). Format 2
/// (issue 41, item 4) keeps every symbolic link as a link, whatever its
/// target (format 1 left out absolute ones and those leaving their root),
/// and records what was left out; a format-1 archive is a valid format-2
/// one, so both are read.
pub const FORMAT_VERSION: u32 = 2;

/// Name of the first tar member.
pub const MANIFEST_NAME: &str = ".kiln-cache/manifest.json";

/// Limits enforced by [`unpack`] (zip-bomb defence).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most entries (files, directories, symlinks) an archive may hold.
    pub max_entries: u64,
    /// Most bytes of file contents an archive may expand to.
    pub max_expanded_bytes: u64,
    /// Longest member name (`"<root>/<path>"`) or symlink target, in bytes.
    pub max_path_bytes: usize,
    /// Give up (a [`CacheError::Timeout`], nothing left behind) once past
    /// this instant; checked between entries and before anything is moved
    /// into place.
    pub deadline: Option<std::time::Instant>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 1_000_000,
            max_expanded_bytes: 20 * 1024 * 1024 * 1024,
            max_path_bytes: 4096,
            deadline: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A local I/O failure; the message says what was being done.
    #[error("cache i/o error: {0}")]
    Io(std::io::Error),
    /// A hostile or invalid archive, entry or input (the message names it).
    #[error("cache archive refused: {0}")]
    Refused(String),
    /// Digest or manifest mismatch, truncated or undecodable stream.
    #[error("cache archive corrupt: {0}")]
    Corrupt(String),
    /// The archive exceeds a [`Limits`] bound.
    #[error("cache archive too large: {0}")]
    TooLarge(String),
    /// [`Limits::deadline`] passed.
    #[error("cache operation timed out: {0}")]
    Timeout(String),
    /// A file's contents were refused by the [`Scan`] given to
    /// [`pack_sources`]: `path` below the root declared as `root` holds
    /// `what` (as the scan names it: never the matched bytes).
    #[error("`{}` holds {what}", shown_path(root, path))]
    Secret { root: String, path: String, what: String },
}

/// A file of a root as a user wrote the root.
fn shown_path(root: &str, path: &str) -> String {
    match path.is_empty() {
        true => root.to_string(),
        false => format!("{}/{path}", root.trim_end_matches('/')),
    }
}

impl Limits {
    /// Err once the deadline has passed.
    pub fn check_deadline(&self, what: &str) -> Result<(), CacheError> {
        match self.deadline {
            Some(d) if std::time::Instant::now() >= d => Err(CacheError::Timeout(format!("{what}: out of time"))),
            _ => Ok(()),
        }
    }
}

/// Wraps an I/O error with what was being done, keeping its kind.
pub(crate) fn io_err(context: impl std::fmt::Display, e: std::io::Error) -> CacheError {
    CacheError::Io(std::io::Error::new(e.kind(), format!("{context}: {e}")))
}

/// What was archived: one entry per file, directory and symlink, in archive order.
///
/// Each present root has a `Dir` entry with the empty path (the root
/// directory itself), before any other entry of that root; a root that was
/// missing when packing has no entries at all. Every entry's parent
/// directory is listed before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The declared paths, as written.
    pub roots: Vec<String>,
    pub entries: Vec<ManifestEntry>,
    /// Sum of the sizes of all files.
    pub total_bytes: u64,
    /// What pack found and could not archive (absent: nothing).
    #[serde(default, skip_serializing_if = "LeftOut::is_empty")]
    pub left_out: LeftOut,
}

/// Entries of the packed trees that an archive cannot hold, by kind, and
/// the first one met (shown in the job's log: a cache that left something
/// out is not a plain hit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOut {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sockets: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fifos: u64,
    /// Character and block devices.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub devices: u64,
    /// Names (or symbolic link targets) that are not UTF-8.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_utf8: u64,
    /// The first entry left out, as `<declared root>/<path>` (lossy UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LeftOut {
    /// How many entries were left out.
    pub fn total(&self) -> u64 {
        self.sockets + self.fifos + self.devices + self.not_utf8
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// `3 entries (2 sockets, 1 device); first: venv/run/x.sock`.
    pub fn summary(&self) -> String {
        let n = self.total();
        let plural = |k: u64, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
        let kinds: Vec<String> = [
            (self.sockets, "socket", "sockets"),
            (self.fifos, "fifo", "fifos"),
            (self.devices, "device", "devices"),
            (self.not_utf8, "name that is not UTF-8", "names that are not UTF-8"),
        ]
        .into_iter()
        .filter(|(k, ..)| *k > 0)
        .map(|(k, one, many)| plural(k, one, many))
        .collect();
        let mut s = format!("{} ({})", plural(n, "entry", "entries"), kinds.join(", "));
        if let Some(f) = &self.first {
            s.push_str(&format!("; first: {f}"));
        }
        s
    }

    /// Counts an entry of `kind` (None: its name or link target is not
    /// UTF-8) shown as `shown`.
    pub(crate) fn add(&mut self, kind: Option<rustix::fs::FileType>, shown: impl FnOnce() -> String) {
        use rustix::fs::FileType as T;
        match kind {
            Some(T::Socket) => self.sockets += 1,
            Some(T::Fifo) => self.fifos += 1,
            Some(T::CharacterDevice | T::BlockDevice) => self.devices += 1,
            _ => self.not_utf8 += 1,
        }
        if self.first.is_none() {
            self.first = Some(shown());
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Index into `roots`.
    pub root: u32,
    /// Relative, '/'-separated ("" for the root directory itself).
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (`0o777` at most).
    pub mode: u32,
    /// Content length for files, 0 otherwise.
    pub size: u64,
    /// Lowercase hex sha256 of the contents (files only).
    pub sha256: Option<String>,
    /// Symlinks only: the link's target as it was on disk (absolute, or
    /// leaving the root: a restore makes the link and never follows it).
    pub target: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
}

impl ManifestEntry {
    /// The tar member name of this entry.
    pub(crate) fn member_name(&self) -> String {
        if self.path.is_empty() { self.root.to_string() } else { format!("{}/{}", self.root, self.path) }
    }
}
