//! The agent's side of degradation (spec 004): a slot does not claim while
//! the filesystem of the agent's workspaces is critically full (95 %), so a
//! job is not started where its checkout or outputs cannot fit; it claims
//! again by itself once space returns.

use kiln_core::degradation::{Level, Sample, Thresholds, classify};
use std::path::Path;

/// The degradation level of `dir`'s filesystem (memory is the server's
/// and the engine's concern), with why.
pub(crate) fn level(dir: &Path, t: &Thresholds) -> (Level, String) {
    let Ok(st) = nix::sys::statvfs::statvfs(dir) else { return (Level::Normal, String::new()) };
    let frag = st.fragment_size();
    let total = st.blocks() * frag;
    let used = total.saturating_sub(st.blocks_available() * frag);
    classify(&Sample { storage_used_bytes: used, storage_total_bytes: total, memory_available_bytes: None }, t)
}

/// Whether a slot may claim now: not at `critical`.
pub(crate) fn may_claim(dir: &Path, t: &Thresholds) -> Result<(), String> {
    match level(dir, t) {
        (Level::Critical, why) => Err(why),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_critically_full_disk_stops_claims() {
        let dir = tempfile::tempdir().unwrap();
        let full = Thresholds { storage_pct: [0.0, 0.0, 0.0], ..Thresholds::default() };
        let why = may_claim(dir.path(), &full).unwrap_err();
        assert!(why.contains("full"), "{why}");
    }
}
