//! The resource monitor (spec 004, "Graceful Degradation"): samples the data
//! directory's filesystem and the available memory, keeps the degradation
//! level ([`kiln_core::degradation`]), and decides whether new runs are
//! admitted: none at `critical` (503 with `Retry-After`), none with a large
//! job (`runs-on: {size: large}`) at `degraded`. Runs already accepted keep
//! running; the level recovers by itself when space or memory returns.

use kiln_core::degradation::{Level, Sample, Thresholds, classify, mem_available};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// How long a refused client should wait before trying again.
pub const RETRY_AFTER_SECS: u64 = 30;

pub struct ResourceMonitor {
    dir: PathBuf,
    thresholds: Thresholds,
    level: AtomicU8,
    state: Mutex<(String, Option<Sample>)>,
    /// Runs refused by degradation, for `/metrics`.
    pub refused: AtomicU64,
}

/// Why a run is not admitted now.
#[derive(Debug)]
pub struct Refused {
    pub retry_after_secs: u64,
    pub message: String,
}

/// The data directory's filesystem and the memory, now.
pub fn sample(dir: &Path) -> std::io::Result<Sample> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    let frag = st.fragment_size();
    let total = st.blocks() * frag;
    // As `df` counts: blocks reserved for root are not available to us.
    let used = total.saturating_sub(st.blocks_available() * frag);
    let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| mem_available(&t));
    Ok(Sample { storage_used_bytes: used, storage_total_bytes: total, memory_available_bytes: memory })
}

impl ResourceMonitor {
    pub fn new(dir: PathBuf, thresholds: Thresholds) -> ResourceMonitor {
        ResourceMonitor {
            dir,
            thresholds,
            level: AtomicU8::new(0),
            state: Mutex::new((String::new(), None)),
            refused: AtomicU64::new(0),
        }
    }

    /// Take a sample and update the level (a change is logged).
    pub fn sample_now(&self) -> Level {
        let s = match sample(&self.dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot sample the data directory");
                return self.level();
            }
        };
        let (level, why) = classify(&s, &self.thresholds);
        let before = Level::from_number(self.level.swap(level.as_number(), Ordering::SeqCst));
        if before != level {
            if level > before {
                tracing::warn!(from = before.as_str(), to = level.as_str(), "degradation level rose: {why}");
            } else {
                tracing::info!(from = before.as_str(), to = level.as_str(), "degradation level fell");
            }
        }
        *self.state.lock().expect("resources") = (why, Some(s));
        level
    }

    pub fn level(&self) -> Level {
        Level::from_number(self.level.load(Ordering::SeqCst))
    }

    /// The level, why, and the last sample.
    pub fn status(&self) -> (Level, String, Option<Sample>) {
        let (why, s) = self.state.lock().expect("resources").clone();
        (self.level(), why, s)
    }

    /// Whether a new run may be accepted now; `large`: it has a job of
    /// size class `large`.
    pub fn admit_run(&self, large: bool) -> Result<(), Refused> {
        let (level, why, _) = self.status();
        let refuse = match level {
            Level::Critical => Some(format!(
                "the server is in critical degradation ({why}): new runs are refused until it recovers; retry later"
            )),
            Level::Degraded if large => Some(format!(
                "the server is degraded ({why}): runs with a `size: large` job are refused until it recovers; retry later"
            )),
            _ => None,
        };
        match refuse {
            None => Ok(()),
            Some(message) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Refused { retry_after_secs: RETRY_AFTER_SECS, message })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_the_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let s = sample(dir.path()).unwrap();
        assert!(s.storage_total_bytes > 0 && s.storage_used_bytes <= s.storage_total_bytes);
        assert!(s.memory_available_bytes.is_some_and(|m| m > 0));
    }

    #[test]
    fn critical_refuses_everything_and_degraded_only_large_runs() {
        let dir = tempfile::tempdir().unwrap();
        // Thresholds at 0% storage used: whatever the disk holds is critical.
        let critical = Thresholds { storage_pct: [0.0, 0.0, 0.0], ..Thresholds::default() };
        let m = ResourceMonitor::new(dir.path().into(), critical);
        assert_eq!(m.sample_now(), Level::Critical);
        let e = m.admit_run(false).unwrap_err();
        assert!(e.message.contains("critical") && e.retry_after_secs > 0, "{e:?}");
        let degraded = Thresholds { storage_pct: [0.0, 0.0, 101.0], ..Thresholds::default() };
        let m = ResourceMonitor::new(dir.path().into(), degraded);
        assert_eq!(m.sample_now(), Level::Degraded);
        assert!(m.admit_run(false).is_ok());
        assert!(m.admit_run(true).unwrap_err().message.contains("size: large"));
        assert_eq!(m.refused.load(Ordering::Relaxed), 1);
    }
}
