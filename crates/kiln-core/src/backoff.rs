//! Retry policy: bounded exponential backoff with full jitter (spec 000 §8).
//! Retry budgets are counted in the database; this only computes delays.

use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base_ms: u64,
    pub max_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_ms: 500, max_ms: 60_000 }
    }
}

impl Backoff {
    /// Upper bound of the delay before attempt number `attempt` (1 = first retry).
    pub fn ceiling_ms(&self, attempt: u32) -> u64 {
        let exp = attempt.saturating_sub(1).min(30);
        self.base_ms.saturating_mul(1u64 << exp).min(self.max_ms)
    }

    /// Delay with jitter: uniform in [ceiling/2, ceiling].
    pub fn delay_ms(&self, attempt: u32, rng: &mut impl Rng) -> u64 {
        let c = self.ceiling_ms(attempt);
        if c == 0 {
            return 0;
        }
        rng.random_range(c / 2..=c)
    }
}

/// Infrastructure failures (`agent_lost`, `infra`) are retried up to this
/// many extra attempts by default (spec 004); the job's own failures only
/// per `retry:`.
pub const DEFAULT_INFRA_RETRIES: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn delay_is_bounded(attempt in 1u32..100, seed in any::<u64>()) {
            use rand::SeedableRng;
            let b = Backoff::default();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let d = b.delay_ms(attempt, &mut rng);
            prop_assert!(d <= b.max_ms);
            prop_assert!(d >= b.ceiling_ms(attempt) / 2);
        }
    }

    #[test]
    fn grows_then_caps() {
        let b = Backoff { base_ms: 100, max_ms: 1000 };
        assert_eq!(b.ceiling_ms(1), 100);
        assert_eq!(b.ceiling_ms(2), 200);
        assert_eq!(b.ceiling_ms(4), 800);
        assert_eq!(b.ceiling_ms(5), 1000);
        assert_eq!(b.ceiling_ms(64), 1000);
    }
}
