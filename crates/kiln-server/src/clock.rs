//! The server's clock, injectable so tests decide what "now" is.
//!
//! Server-side time is only ever advisory: capability URL expiry, the
//! `expires_at_ms` hints handed to agents, and how old a finished log or an
//! unbound generation must be before background work touches it. Lease
//! decisions never use it: the store takes lease time from the database
//! clock inside its transactions (spec 000 §8), so a skewed server clock can
//! shorten a capability but never fence or extend a lease.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// How far this clock runs ahead of the database clock (which is the
    /// system clock). The store measures grace periods ("finished at least
    /// `grace` ago") on its own clock; the background rounds subtract this
    /// from the grace they pass, so a test that jumps the server clock sees
    /// those periods pass too.
    fn ahead_of_database_ms(&self) -> i64 {
        0
    }
}

/// The system clock: the default.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_now_ms()
    }
}

pub(crate) fn system_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

/// A clock that stands still until told to move: starts at the system time
/// of its creation, then moves only by [`ManualClock::advance`].
#[derive(Debug)]
pub struct ManualClock {
    start_ms: i64,
    offset_ms: AtomicI64,
}

impl ManualClock {
    pub fn new() -> ManualClock {
        ManualClock { start_ms: system_now_ms(), offset_ms: AtomicI64::new(0) }
    }

    /// Jump forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }

    /// Jump to `ms` since the epoch (e.g. another replica's clock).
    pub fn set_ms(&self, ms: i64) {
        self.offset_ms.store(ms - self.start_ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.start_ms + self.offset_ms.load(Ordering::SeqCst)
    }

    fn ahead_of_database_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        let t0 = c.now_ms();
        assert_eq!(c.now_ms(), t0);
        c.advance(Duration::from_secs(61));
        assert_eq!(c.now_ms(), t0 + 61_000);
        assert_eq!(c.ahead_of_database_ms(), 61_000);
        assert_eq!(SystemClock.ahead_of_database_ms(), 0);
    }
}
