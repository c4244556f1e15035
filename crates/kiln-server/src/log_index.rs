//! The index of an archived log segment (spec 000 §13): where each chunk's
//! bytes are in the segment, with their digest, so a replay from any event
//! id reads only what it needs and detects a corrupt segment. Parsed indexes
//! are cached per object key (archives are immutable, so never stale).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Parsed indexes kept in memory for replays.
const INDEX_CACHE: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Index {
    pub job_id: String,
    pub chunks: Vec<IndexEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct IndexEntry {
    pub id: i64,
    pub epoch: i64,
    pub stream: String,
    pub offset: i64,
    /// Where the chunk's bytes are in the segment.
    pub pos: u64,
    pub length: u64,
    pub sha256: String,
    /// When the chunk was committed (absent in indexes written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
}

/// Parsed indexes by object key; cleared whole when full (replays of a few
/// recent jobs dominate, and re-reading an index is cheap).
#[derive(Default)]
pub(crate) struct IndexCache(Mutex<HashMap<String, Arc<Index>>>);

impl IndexCache {
    pub fn get(&self, key: &str) -> Option<Arc<Index>> {
        self.0.lock().expect("index cache").get(key).cloned()
    }

    pub fn insert(&self, key: &str, ix: Arc<Index>) {
        let mut cache = self.0.lock().expect("index cache");
        if cache.len() >= INDEX_CACHE {
            cache.clear();
        }
        cache.insert(key.to_string(), ix);
    }
}
