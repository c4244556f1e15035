//! Why an attempt must stop, shared by its heartbeat, log shipper, timer,
//! and step loop. The first reason wins, except that `Fenced` overrides any
//! other: once fenced, nothing of the attempt may be published (invariant 3).

use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The server refused our epoch (409 stale_epoch), or no heartbeat
    /// succeeded for a whole lease: another attempt may own the job.
    Fenced,
    /// The run was cancelled (heartbeat `cancel_requested`).
    Cancelled,
    /// The job's `timeout_secs` elapsed.
    TimedOut,
    /// The job printed nothing for its `hang-kill-after` (spec 004's hang detector).
    Hung,
    /// The agent is shutting down.
    Shutdown,
}

#[derive(Clone)]
pub(crate) struct Control {
    tx: watch::Sender<Option<Stop>>,
}

impl Control {
    pub(crate) fn new() -> Self {
        Control { tx: watch::Sender::new(None) }
    }

    pub(crate) fn stop(&self, reason: Stop) {
        self.tx.send_if_modified(|cur| match cur {
            None => {
                *cur = Some(reason);
                true
            }
            Some(c) if reason == Stop::Fenced && *c != Stop::Fenced => {
                *cur = Some(reason);
                true
            }
            _ => false,
        });
    }

    pub(crate) fn reason(&self) -> Option<Stop> {
        *self.tx.borrow()
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.reason() == Some(Stop::Fenced)
    }

    /// Resolves once any stop reason is set.
    pub(crate) async fn stopped(&self) -> Stop {
        let mut rx = self.tx.subscribe();
        let r = rx.wait_for(|s| s.is_some()).await.expect("sender lives in self");
        r.expect("checked by wait_for")
    }

    /// Resolves once the attempt is fenced.
    pub(crate) async fn fenced(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|s| *s == Some(Stop::Fenced)).await;
    }
}

/// Jittered exponential backoff (kiln-core's policy) for retry number `n` (1-based).
pub(crate) fn backoff(n: u32, base_ms: u64, max_ms: u64) -> Duration {
    let b = kiln_core::backoff::Backoff { base_ms, max_ms };
    Duration::from_millis(b.delay_ms(n, &mut rand::rng()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins_but_fenced_overrides() {
        let c = Control::new();
        c.stop(Stop::Cancelled);
        c.stop(Stop::TimedOut);
        assert_eq!(c.reason(), Some(Stop::Cancelled));
        c.stop(Stop::Fenced);
        c.stop(Stop::Shutdown);
        assert_eq!(c.reason(), Some(Stop::Fenced));
    }
}
