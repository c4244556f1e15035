//! The agent's side of degradation (spec 004): a slot does not claim while
//! the filesystem of the agent's workspaces is critically full (95 %), or
//! the machine's available memory is under `--memory-levels`' critical
//! amount, so a job is not started where its checkout or outputs cannot
//! fit or its steps would be killed for memory; it claims again by itself
//! once space or memory returns.

use kiln_core::degradation::{Level, Sample, Thresholds, classify};
use std::path::Path;

/// The degradation level of `dir`'s filesystem and of the machine's
/// available memory (`MemAvailable`; none where the system does not say),
/// with why.
pub(crate) fn level(dir: &Path, t: &Thresholds) -> (Level, String) {
    let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| kiln_core::degradation::mem_available(&m));
    let Ok(st) = nix::sys::statvfs::statvfs(dir) else {
        let sample = Sample { storage_used_bytes: 0, storage_total_bytes: 0, memory_available_bytes: memory };
        return classify(&sample, t);
    };
    let frag = st.fragment_size();
    let total = st.blocks() * frag;
    let used = total.saturating_sub(st.blocks_available() * frag);
    classify(&Sample { storage_used_bytes: used, storage_total_bytes: total, memory_available_bytes: memory }, t)
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

    /// `--memory-levels` acts (issue 40, item 9): with its critical amount
    /// above what any machine has available, a slot does not claim.
    #[test]
    fn critically_low_memory_stops_claims() {
        let dir = tempfile::tempdir().unwrap();
        // Disk use never degrades here: only memory is under test.
        let no_disk = [101.0, 101.0, 101.0];
        let starved = Thresholds { memory_bytes: [u64::MAX, u64::MAX, u64::MAX], storage_pct: no_disk };
        let why = may_claim(dir.path(), &starved).unwrap_err();
        assert!(why.to_lowercase().contains("memory"), "{why}");
        let off = Thresholds { memory_bytes: [0, 0, 0], storage_pct: no_disk };
        assert!(may_claim(dir.path(), &off).is_ok());
    }
}
