//! Progress of long transfers in the job's log (issue 42): an artifact or
//! cache upload or download that takes longer than [`FIRST_AFTER`] says how
//! far it got every [`EVERY`] (`uploading artifact `dist`: 48.0 MiB of
//! 120.0 MiB (40%), 9.6 MiB/s`), so a big transfer is not mistaken for a
//! hang. Short transfers stay quiet: their start and end lines say enough.

use crate::logs::LogStreamer;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No progress line for a transfer that ends sooner.
pub(crate) const FIRST_AFTER: Duration = Duration::from_secs(2);
/// Then one line this often.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// Run `work` (which moves `total` bytes, counting them in `done`), writing
/// a progress line to `logs`' system stream while it runs long.
pub(crate) async fn reported<T>(
    logs: &LogStreamer,
    what: &str,
    total: u64,
    done: &AtomicU64,
    work: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    tokio::pin!(work);
    let mut next = tokio::time::Instant::now() + FIRST_AFTER;
    loop {
        tokio::select! {
            out = &mut work => return out,
            () = tokio::time::sleep_until(next) => {
                logs.system(&line(what, done.load(Ordering::Relaxed), total, started.elapsed()));
                next += EVERY;
            }
        }
    }
}

/// `what: 48.0 MiB of 120.0 MiB (40%), 9.6 MiB/s`.
pub(crate) fn line(what: &str, done: u64, total: u64, elapsed: Duration) -> String {
    let done = done.min(total);
    let pct = (done * 100).checked_div(total).unwrap_or(100);
    let secs = elapsed.as_secs_f64().max(0.001);
    let rate = (done as f64 / secs) as u64;
    format!("{what}: {} of {} ({pct}%), {}/s", size(done), size(total), size(rate))
}

/// Bytes for people: `512 B`, `1.5 KiB`, `48.0 MiB`, `2.1 GiB`.
pub(crate) fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_say_how_far_of_how_much_and_how_fast() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(48 * 1024 * 1024), "48.0 MiB");
        assert_eq!(
            line("uploading artifact `dist`", 48 << 20, 120 << 20, Duration::from_secs(5)),
            "uploading artifact `dist`: 48.0 MiB of 120.0 MiB (40%), 9.6 MiB/s"
        );
        assert_eq!(line("x", 10, 0, Duration::ZERO), "x: 0 B of 0 B (100%), 0 B/s", "an empty transfer");
        assert_eq!(
            line("x", 20, 10, Duration::from_secs(1)),
            "x: 10 B of 10 B (100%), 10 B/s",
            "a retry never shows >100%"
        );
    }
}
