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
    /// A stage (preparing or finalizing) outlived its `--prepare-timeout` /
    /// `--finalize-timeout` (spec 004's stage timeouts).
    StageTimedOut(Stage),
}

/// Where an attempt is (spec 004's stages): preparing (checkout, image,
/// artifact and cache restore, services), running (the steps; the job's
/// `timeout` bounds the whole attempt), finalizing (cache save, artifact
/// upload). Each of preparing and finalizing has its own timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Preparing,
    Running,
    Finalizing,
}

impl Stage {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Stage::Preparing => "preparing the job (checkout, image, artifacts, caches, services)",
            Stage::Running => "running the steps",
            Stage::Finalizing => "finalizing the job (cache save, artifact upload)",
        }
    }
}

#[derive(Clone)]
pub(crate) struct Control {
    tx: watch::Sender<Option<Stop>>,
    stage: watch::Sender<Stage>,
}

impl Control {
    pub(crate) fn new() -> Self {
        Control { tx: watch::Sender::new(None), stage: watch::Sender::new(Stage::Preparing) }
    }

    /// The attempt enters `stage`.
    pub(crate) fn enter(&self, stage: Stage) {
        self.stage.send_replace(stage);
    }

    /// Follows the attempt's stage.
    pub(crate) fn stages(&self) -> watch::Receiver<Stage> {
        self.stage.subscribe()
    }

    /// Stops the attempt with [`Stop::StageTimedOut`] when preparing or
    /// finalizing lasts longer than its limit (`None`: unlimited). Each
    /// stage's clock starts when the attempt enters it. Never returns.
    pub(crate) async fn enforce_stage_timeouts(&self, prepare: Option<Duration>, finalize: Option<Duration>) {
        let mut rx = self.stages();
        loop {
            let stage = *rx.borrow_and_update();
            let limit = match stage {
                Stage::Preparing => prepare,
                Stage::Running => None,
                Stage::Finalizing => finalize,
            };
            let timer = async {
                match limit {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = timer => {
                    tracing::warn!(?stage, limit_ms = limit.unwrap_or_default().as_millis() as u64, "stage timed out: stopping the attempt");
                    self.stop(Stop::StageTimedOut(stage));
                    return std::future::pending().await;
                }
                changed = rx.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
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

    #[tokio::test(start_paused = true)]
    async fn each_stage_has_its_own_clock() {
        let c = Control::new();
        let enforcer = tokio::spawn({
            let c = c.clone();
            async move { c.enforce_stage_timeouts(Some(Duration::from_secs(10)), Some(Duration::from_secs(5))).await }
        });
        tokio::time::sleep(Duration::from_secs(9)).await;
        c.enter(Stage::Running);
        // Running is bounded by the job's timeout only.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(c.reason(), None);
        c.enter(Stage::Finalizing);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(c.reason(), None);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(c.reason(), Some(Stop::StageTimedOut(Stage::Finalizing)));
        enforcer.abort();

        let c = Control::new();
        let enforcer = tokio::spawn({
            let c = c.clone();
            async move { c.enforce_stage_timeouts(Some(Duration::from_secs(10)), None).await }
        });
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(c.reason(), Some(Stop::StageTimedOut(Stage::Preparing)));
        enforcer.abort();
    }
}
