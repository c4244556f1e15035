//! The whole server in one value, without a socket: the state, the router
//! and the background rounds. `start` serves it on a listener with timers;
//! a test (kiln-testkit's `TestApp`) calls the router directly and drives
//! the rounds itself.

use crate::state::{AppParts, AppState, State};
use crate::{router, work};
use kiln_store::StoreError;

/// How much one call of [`App::run_pending_work`] did, by round.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkDone {
    /// Outbox events delivered to the dispatch queues.
    pub relayed: usize,
    /// Expired leases fenced.
    pub fenced: usize,
    /// Ready jobs the dispatch sweep queued (replicas only).
    pub swept: usize,
    /// Unbound artifact generations deleted.
    pub collected: usize,
    /// Finished logs moved to the object store.
    pub archived: usize,
    /// Webhook deliveries planned.
    pub planned: usize,
    /// Commit statuses sent to forges.
    pub reported: usize,
}

impl WorkDone {
    pub fn total(&self) -> usize {
        self.relayed + self.fenced + self.swept + self.collected + self.archived + self.planned + self.reported
    }
}

#[derive(Clone)]
pub struct App {
    state: State,
}

impl App {
    pub fn new(parts: AppParts) -> App {
        App { state: AppState::new(parts) }
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// The HTTP API (public, agent, data plane, health, UI).
    pub fn router(&self) -> axum::Router {
        router::router(self.state.clone())
    }

    /// Rebuild the dispatch queues from the jobs that are ready now (at
    /// start: their events may have been published before a restart).
    pub async fn restore_queues(&self) -> Result<usize, StoreError> {
        work::sweep_once(&self.state).await
    }

    /// Deliver committed outbox events to the dispatch queues.
    pub async fn relay_once(&self) -> Result<usize, StoreError> {
        work::relay_once(&self.state).await
    }

    /// Fence expired leases (by the database clock).
    pub async fn fence_once(&self) -> Result<usize, StoreError> {
        work::fence_once(&self.state).await
    }

    /// Queue the jobs that are ready now (what a replica's sweep does).
    pub async fn sweep_once(&self) -> Result<usize, StoreError> {
        work::sweep_once(&self.state).await
    }

    /// Delete unbound artifact generations past the grace period.
    pub async fn collect_once(&self) -> Result<usize, StoreError> {
        work::collect_once(&self.state).await
    }

    /// Archive finished logs past the grace period.
    pub async fn archive_once(&self) -> Result<usize, StoreError> {
        work::archive_once(&self.state).await
    }

    /// Fail ready jobs no agent claimed within the queue timeout.
    pub async fn queue_timeout_once(&self) -> Result<usize, StoreError> {
        crate::services::runs::queue_timeout_once(&self.state).await
    }

    /// Plan accepted webhook deliveries into runs.
    pub async fn plan_once(&self) -> Result<usize, StoreError> {
        crate::services::planning::plan_once(&self.state).await
    }

    /// Send due commit statuses to forges.
    pub async fn report_once(&self) -> Result<usize, StoreError> {
        crate::services::forge_status::report_once(&self.state).await
    }

    /// Fire due schedule ticks (without the leader lease; see `triggers_round`).
    pub async fn schedule_once(&self) -> Result<usize, StoreError> {
        crate::services::triggers::schedule_once(&self.state).await
    }

    /// Poll repositories whose interval passed (without the leader lease).
    pub async fn poll_once(&self) -> Result<usize, StoreError> {
        crate::services::triggers::poll_once(&self.state).await
    }

    /// One round of the triggers loop as a served app runs it: take or renew
    /// the `triggers` lease for `ttl_ms`, then schedules and polls. None when
    /// another replica holds the lease.
    pub async fn triggers_round(&self, ttl_ms: i64) -> Result<Option<(usize, usize)>, StoreError> {
        if !self.state.store.acquire_lease("triggers", &self.state.instance_id, ttl_ms).await? {
            return Ok(None);
        }
        Ok(Some((self.schedule_once().await?, self.poll_once().await?)))
    }

    /// Run every background round the server runs until a pass finds
    /// nothing to do; returns what was done. The sweep runs only when
    /// configured (`dispatch_sweep`), as in a served app.
    pub async fn run_pending_work(&self) -> Result<WorkDone, StoreError> {
        let mut done = WorkDone::default();
        // Each round drains a bounded batch; a bound on passes keeps a
        // round that always finds "something" from spinning forever.
        for _ in 0..1000 {
            let pass = WorkDone {
                relayed: self.relay_once().await?,
                fenced: self.fence_once().await?,
                swept: if self.state.config.dispatch_sweep.is_zero() { 0 } else { self.sweep_once().await? },
                collected: self.collect_once().await?,
                archived: self.archive_once().await?,
                planned: self.plan_once().await?,
                reported: self.report_once().await?,
            };
            if pass.total() == 0 {
                return Ok(done);
            }
            done.relayed += pass.relayed;
            done.fenced += pass.fenced;
            done.swept += pass.swept;
            done.collected += pass.collected;
            done.archived += pass.archived;
            done.planned += pass.planned;
            done.reported += pass.reported;
        }
        Ok(done)
    }

    /// Deliveries waiting in the dispatch queues.
    pub fn dispatch_depth(&self) -> usize {
        self.state.dispatcher.depth()
    }
}
