//! The agent-wide upload rate limit (`AgentConfig::upload_rate_limit`).
//!
//! One token bucket is shared by every part upload of every attempt, so the
//! agent as a whole stays under the limit however many jobs upload at once.
//! Senders *reserve* bytes before sending them: the bucket may go into debt,
//! and a reservation waits until the debt it created is paid back. That
//! keeps reservations first-come first-served and makes one large
//! reservation as fair as many small ones. At most [`Bucket::burst`] bytes
//! go out without waiting after an idle period.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The smallest burst, whatever the rate (one read of a part body).
const MIN_BURST: u64 = 64 * 1024;

/// The bucket's arithmetic; time is passed in, so tests inject the clock.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// Bytes per second.
    rate: f64,
    /// Most tokens an idle bucket accumulates: a quarter second of rate.
    burst: f64,
    /// Negative while reservations are waiting (debt).
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket for `rate` bytes per second (`rate` > 0).
    pub(crate) fn new(rate: u64, now: Instant) -> Self {
        let burst = (rate / 4).max(MIN_BURST) as f64;
        Bucket { rate: rate as f64, burst, tokens: burst, last: now }
    }

    #[cfg(test)]
    pub(crate) fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// Reserves `n` bytes at `now`; returns how long the caller must wait
    /// before sending them.
    pub(crate) fn reserve(&mut self, n: u64, now: Instant) -> Duration {
        if now > self.last {
            let elapsed = (now - self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
            self.last = now;
        }
        self.tokens -= n as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

/// A cheap handle on the shared bucket; unlimited when built from `None`.
#[derive(Clone, Default)]
pub(crate) struct RateLimiter {
    bucket: Option<Arc<Mutex<Bucket>>>,
}

impl RateLimiter {
    /// `limit` in bytes per second; `None` means unlimited (0 is refused by `run`).
    pub(crate) fn new(limit: Option<u64>) -> Self {
        RateLimiter { bucket: limit.filter(|l| *l > 0).map(|l| Arc::new(Mutex::new(Bucket::new(l, Instant::now())))) }
    }

    /// Waits until `n` more bytes may be sent.
    pub(crate) async fn acquire(&self, n: u64) {
        let Some(bucket) = &self.bucket else { return };
        let wait = bucket.lock().expect("rate limiter").reserve(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn a_full_bucket_sends_its_burst_at_once_then_waits_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(4 * MIB, t0);
        assert_eq!(b.burst(), MIB, "a quarter second of rate");
        assert_eq!(b.reserve(MIB, t0), Duration::ZERO);
        // 1 MiB more at 4 MiB/s: 250 ms.
        assert!((ms(b.reserve(MIB, t0)) - 250.0).abs() < 0.01);
        // A second reservation queues behind the first: its wait includes the debt.
        assert!((ms(b.reserve(MIB, t0)) - 500.0).abs() < 0.01);
        // 500 ms later the debt is paid; the next MiB waits 250 ms.
        let t1 = t0 + Duration::from_millis(500);
        assert!((ms(b.reserve(MIB, t1)) - 250.0).abs() < 0.01);
    }

    #[test]
    fn idle_time_accumulates_no_more_than_the_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(2 * MIB, t0);
        let _ = b.reserve(10 * MIB, t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.reserve(b.burst(), later), Duration::ZERO);
        assert!((ms(b.reserve(2 * MIB, later)) - 1000.0).abs() < 0.01);
    }

    #[test]
    fn a_clock_going_backwards_never_adds_tokens() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = Bucket::new(MIB, t0);
        let _ = b.reserve(b.burst(), t0);
        let w = b.reserve(MIB, t0 - Duration::from_secs(5));
        assert!((ms(w) - 1000.0).abs() < 0.01);
    }

    /// Senders that each wait what they are told, in 64 KiB pieces, on a
    /// simulated clock: the long-run throughput is the rate, shared or not.
    #[test]
    fn concurrent_senders_share_the_rate() {
        let t0 = Instant::now();
        let rate = 2 * MIB;
        let mut b = Bucket::new(rate, t0);
        let burst = b.burst();
        let piece = 64 * 1024;
        // Two senders of 3 MiB each; each sender's clock is when it may send next.
        let mut clocks = [t0, t0];
        let mut sent = [0u64, 0u64];
        while sent.iter().any(|s| *s < 3 * MIB) {
            // The sender whose turn comes first reserves next.
            let i = if sent[0] >= 3 * MIB {
                1
            } else if sent[1] >= 3 * MIB || clocks[0] <= clocks[1] {
                0
            } else {
                1
            };
            let wait = b.reserve(piece, clocks[i]);
            clocks[i] += wait;
            sent[i] += piece;
        }
        let end = clocks.iter().max().unwrap().duration_since(t0);
        let expected = (6 * MIB - burst) as f64 / rate as f64;
        assert!((end.as_secs_f64() - expected).abs() < 0.01, "took {end:?}, expected {expected}s");
        // Both made progress: neither finished before the other started waiting.
        let first = clocks.iter().min().unwrap().duration_since(t0);
        assert!(first.as_secs_f64() > expected * 0.8, "{first:?}");
    }

    #[test]
    fn a_small_rate_still_has_a_usable_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000, t0);
        assert_eq!(b.burst(), MIN_BURST);
        assert_eq!(b.reserve(MIN_BURST, t0), Duration::ZERO);
        assert!((ms(b.reserve(500, t0)) - 500.0).abs() < 0.01);
    }

    #[test]
    fn no_limit_or_zero_means_no_bucket() {
        assert!(RateLimiter::new(None).bucket.is_none());
        assert!(RateLimiter::new(Some(0)).bucket.is_none());
        assert!(RateLimiter::new(Some(1)).bucket.is_some());
    }
}
