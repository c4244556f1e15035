//! Degradation levels from resource samples (spec 004, "Graceful
//! Degradation"): storage use of the data directory and available memory
//! decide `normal`, `warning`, `degraded` or `critical`, each the worse of
//! the two. The server refuses new runs at `critical` (503 with
//! `Retry-After`) and runs with large jobs at `degraded`; an agent stops
//! claiming at `critical`. Pure: the samples come from the caller.

use serde::{Deserialize, Serialize};

/// A degradation level, worst last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    #[default]
    Normal,
    Warning,
    Degraded,
    Critical,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::Warning => "warning",
            Level::Degraded => "degraded",
            Level::Critical => "critical",
        }
    }

    /// For a gauge: 0 normal … 3 critical.
    pub fn as_number(self) -> u8 {
        self as u8
    }

    pub fn from_number(n: u8) -> Level {
        match n {
            0 => Level::Normal,
            1 => Level::Warning,
            2 => Level::Degraded,
            _ => Level::Critical,
        }
    }

    pub const ALL: [Level; 4] = [Level::Normal, Level::Warning, Level::Degraded, Level::Critical];
}

const MIB: u64 = 1024 * 1024;

/// Where the levels start (spec 004's table): storage used 80 / 90 / 95 %,
/// memory available below 2 GiB / 1 GiB / 500 MiB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Storage used, in percent, at which warning, degraded and critical start.
    pub storage_pct: [f64; 3],
    /// Memory available, in bytes, below which warning, degraded and critical start.
    pub memory_bytes: [u64; 3],
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { storage_pct: [80.0, 90.0, 95.0], memory_bytes: [2048 * MIB, 1024 * MIB, 500 * MIB] }
    }
}

/// Storage levels that never start: `--storage-levels off`.
pub const STORAGE_OFF: [f64; 3] = [f64::INFINITY; 3];

/// `--storage-levels`: `off`, or three ascending percentages of the disk
/// used at which warning, degraded and critical start (`80,90,95`).
pub fn parse_storage_levels(s: &str) -> Result<[f64; 3], String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(STORAGE_OFF);
    }
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let expected = || format!("`{s}`: expected `off` or WARNING,DEGRADED,CRITICAL percentages, e.g. 80,90,95");
    let [a, b, c] = parts.as_slice() else { return Err(expected()) };
    let mut out = [0.0; 3];
    for (slot, text) in out.iter_mut().zip([a, b, c]) {
        let v: f64 = text.trim_end_matches('%').parse().map_err(|_| expected())?;
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("`{s}`: {v} is not a percentage (0-100)"));
        }
        *slot = v;
    }
    if !(out[0] <= out[1] && out[1] <= out[2]) {
        return Err(format!("`{s}`: the levels must not decrease (warning <= degraded <= critical)"));
    }
    Ok(out)
}

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Bytes used and total of the filesystem holding the data directory
    /// (as `df` counts: blocks reserved for root count as used).
    pub storage_used_bytes: u64,
    pub storage_total_bytes: u64,
    /// `MemAvailable`; `None` where the system does not say.
    pub memory_available_bytes: Option<u64>,
}

impl Sample {
    pub fn storage_used_pct(&self) -> f64 {
        if self.storage_total_bytes == 0 {
            return 0.0;
        }
        self.storage_used_bytes as f64 * 100.0 / self.storage_total_bytes as f64
    }
}

/// The level of `s`, and why (empty at `normal`).
pub fn classify(s: &Sample, t: &Thresholds) -> (Level, String) {
    let pct = s.storage_used_pct();
    let storage = match t.storage_pct.iter().rposition(|limit| pct >= *limit) {
        Some(i) => Level::from_number(i as u8 + 1),
        None => Level::Normal,
    };
    let memory = match s.memory_available_bytes {
        None => Level::Normal,
        Some(avail) => match t.memory_bytes.iter().rposition(|limit| avail < *limit) {
            Some(i) => Level::from_number(i as u8 + 1),
            None => Level::Normal,
        },
    };
    let level = storage.max(memory);
    let mut why = Vec::new();
    if storage > Level::Normal && storage == level {
        why.push(format!(
            "the data directory's filesystem is {pct:.1}% full ({} MiB free)",
            s.storage_total_bytes.saturating_sub(s.storage_used_bytes) / MIB
        ));
    }
    if memory > Level::Normal && memory == level {
        why.push(format!("{} MiB of memory available", s.memory_available_bytes.unwrap_or(0) / MIB));
    }
    (level, why.join("; "))
}

/// `MemAvailable` from the text of `/proc/meminfo`.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * MIB;

    fn sample(pct: f64, mem_mib: Option<u64>) -> Sample {
        Sample {
            storage_used_bytes: (pct * 10.0) as u64 * GIB / 10,
            storage_total_bytes: 100 * GIB,
            memory_available_bytes: mem_mib.map(|m| m * MIB),
        }
    }

    #[test]
    fn levels_follow_the_spec_table() {
        let t = Thresholds::default();
        let cases = [
            (50.0, Some(8192), Level::Normal),
            (80.0, Some(8192), Level::Warning),
            (89.9, Some(8192), Level::Warning),
            (90.0, Some(8192), Level::Degraded),
            (95.0, Some(8192), Level::Critical),
            (99.0, None, Level::Critical),
            (10.0, Some(1500), Level::Warning),
            (10.0, Some(800), Level::Degraded),
            (10.0, Some(400), Level::Critical),
            (85.0, Some(400), Level::Critical),
        ];
        for (pct, mem, want) in cases {
            assert_eq!(classify(&sample(pct, mem), &t).0, want, "{pct}% {mem:?} MiB");
        }
    }

    #[test]
    fn the_reason_names_what_is_short() {
        let t = Thresholds::default();
        let (l, why) = classify(&sample(96.0, Some(8192)), &t);
        assert_eq!(l, Level::Critical);
        assert!(why.contains("96.0% full"), "{why}");
        let (_, why) = classify(&sample(10.0, Some(300)), &t);
        assert!(why.contains("300 MiB of memory"), "{why}");
        assert!(classify(&sample(10.0, Some(8192)), &t).1.is_empty());
    }

    #[test]
    fn storage_levels_parse_or_say_why() {
        assert_eq!(parse_storage_levels("80,90,95"), Ok([80.0, 90.0, 95.0]));
        assert_eq!(parse_storage_levels(" 70%, 85 ,99.5"), Ok([70.0, 85.0, 99.5]));
        let off = Thresholds { storage_pct: parse_storage_levels("off").unwrap(), ..Thresholds::default() };
        assert_eq!(classify(&sample(100.0, Some(8192)), &off).0, Level::Normal);
        for bad in ["", "80,90", "80,90,95,99", "a,b,c", "90,80,95", "80,90,101", "-1,2,3"] {
            assert!(parse_storage_levels(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_storage_levels("90,80,95").unwrap_err().contains("must not decrease"));
    }

    #[test]
    fn meminfo_is_read() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }
}
