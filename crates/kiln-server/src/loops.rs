//! The timers of the background rounds (`work`): when each round runs in a
//! served app. The rounds themselves hold all the logic; a timer only
//! decides when, and logs a failed round (the next one retries).

use crate::state::{AppState, State};
use crate::work;
use kiln_store::StoreError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the ring gate runner looks for promotions that are due.
const RING_POLL: Duration = Duration::from_millis(250);

/// How often the relay looks for events whose backoff (`available_at`) passed.
const RELAY_POLL: Duration = Duration::from_millis(250);

pub(crate) async fn spawn(state: State, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    // Rebuild dispatch queues: ready jobs whose events were published before a restart.
    work::sweep_once(&state).await?;
    // Fair share (issue 44): the teams' weights, quotas and virtual times,
    // read before the first claim and every second after.
    state.dispatcher.set_aging_step(state.config.aging_step);
    if let Err(e) = crate::services::queue::refresh_once(&state).await {
        tracing::warn!("teams not read yet: {e}");
    }
    tokio::spawn(every(state.clone(), shutdown.clone(), Duration::from_secs(1), "fair-share refresh", |s| {
        Box::pin(crate::services::queue::refresh_once(s))
    }));
    tokio::spawn(relay(state.clone(), shutdown.clone()));
    tokio::spawn(every(state.clone(), shutdown.clone(), state.config.resource_interval, "resource monitor", |s| {
        Box::pin(async move {
            s.resources.sample_now();
            Ok(0)
        })
    }));
    tokio::spawn(reconciler(state.clone(), shutdown.clone()));
    tokio::spawn(every(state.clone(), shutdown.clone(), state.config.gc_interval, "garbage collector", |s| {
        Box::pin(work::collect_once(s))
    }));
    if state.config.dispatch_sweep > Duration::ZERO {
        // Listening before the server answers: a job made ready by another
        // replica from now on wakes this one's sweep at once.
        let wake = state.store.ready_wakeups().await?;
        tokio::spawn(sweeper(state.clone(), wake, shutdown.clone()));
        // Replicas on one database share the offering of ready jobs.
        if state.config.dispatch_offer_shared {
            tokio::spawn(offering(state.clone(), shutdown.clone()));
        }
    }
    if !state.config.queue_timeout.is_zero() {
        // A tenth of the timeout, between 1 s and 1 min.
        let every_ = (state.config.queue_timeout / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(every(state.clone(), shutdown.clone(), every_, "queue timeout", |s| {
            Box::pin(crate::services::runs::queue_timeout_once(s))
        }));
    }
    // Deadlines are indexed and few: checking each second is cheap.
    tokio::spawn(every(state.clone(), shutdown.clone(), Duration::from_secs(1), "run timeout", |s| {
        Box::pin(crate::services::runs::run_timeout_once(s))
    }));
    tokio::spawn(planner(state.clone(), shutdown.clone()));
    // Promotions between deploy rings (issue 46): bakes end and gate
    // measurements fall due on their own schedule; a quarter second keeps
    // a failed gate's rollback within its interval + 1 s.
    tokio::spawn(every(state.clone(), shutdown.clone(), RING_POLL, "ring gates", |s| {
        Box::pin(crate::services::rings::gates_once(s))
    }));
    // Agents' "last seen" and the expiry of offline ones: a third of the
    // lease TTL, between 50 ms and 10 s.
    let seen_every = (state.config.lease_ttl / 3).clamp(Duration::from_millis(50), Duration::from_secs(10));
    tokio::spawn(every(state.clone(), shutdown.clone(), seen_every, "agent bookkeeping", |s| {
        Box::pin(crate::services::agents::seen_once(s))
    }));
    // Quarantines past their expiry end (audit, metric): as often.
    tokio::spawn(every(state.clone(), shutdown.clone(), seen_every, "quarantine expiry", |s| {
        Box::pin(crate::services::test_reports::expire_once(s))
    }));
    tokio::spawn(every(state.clone(), shutdown.clone(), REPORT_POLL, "commit status reporter", |s| {
        Box::pin(crate::services::forge_status::report_once(s))
    }));
    // Never slower than the retry base, so a short base (tests) is kept.
    let notify_every = state.config.notify_retry_base.clamp(Duration::from_millis(20), NOTIFY_POLL);
    tokio::spawn(every(state.clone(), shutdown.clone(), notify_every, "notification sender", |s| {
        Box::pin(crate::services::notify::deliver_once(s))
    }));
    if state.config.trigger_interval > Duration::ZERO {
        tokio::spawn(triggers(state.clone(), shutdown.clone()));
    }
    let archive_every = state.config.log_archive_interval;
    tokio::spawn(every(state, shutdown, archive_every, "log archiver", |s| Box::pin(work::archive_once(s))));
    Ok(())
}

type Round = for<'a> fn(
    &'a AppState,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<usize, StoreError>> + Send + 'a>>;

/// Run `round` every `period` (first after one period) until shutdown.
async fn every(state: State, mut shutdown: watch::Receiver<bool>, period: Duration, what: &str, round: Round) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = round(&state).await {
            tracing::warn!("{what} paused: {e}");
        }
    }
}

/// With several replicas: a job relayed by another replica (or by one that
/// died with it in its queue) reaches this replica's agents too. Claims stay
/// safe: the claim transaction decides, duplicates are absorbed.
///
/// The sweep runs when the store says another replica made jobs ready
/// (PostgreSQL `LISTEN/NOTIFY`; a burst of notifications while a sweep runs
/// folds into one more sweep), and every `dispatch_sweep` regardless: the
/// safety net for lost notifications and jobs whose backoff just passed.
async fn sweeper(state: State, wake: Option<Arc<kiln_store::ReadyWakeups>>, mut shutdown: watch::Receiver<bool>) {
    async fn woken(wake: &Option<Arc<kiln_store::ReadyWakeups>>) -> kiln_store::ReadyWake {
        match wake {
            Some(w) => {
                w.notify.notified().await;
                w.take()
            }
            None => std::future::pending().await,
        }
    }
    loop {
        // While other replicas offer ready jobs, sweep at least every
        // second: their jobs turn spare on time, and one that another
        // replica's relay took out of the outbox after its backoff reaches
        // this one (its offerer) soon.
        let period = if state.dispatcher.offer_members() > 0 || state.dispatcher.has_unowned() {
            state.config.dispatch_sweep.min(OFFER_SWEEP)
        } else {
            state.config.dispatch_sweep
        };
        let swept = tokio::select! {
            _ = tokio::time::sleep(period) => work::sweep_once(&state).await,
            // Another replica made these jobs ready: only they are read.
            w = woken(&wake) => match w {
                kiln_store::ReadyWake::Jobs(jobs) => work::sweep_jobs(&state, &jobs).await,
                kiln_store::ReadyWake::All => work::sweep_once(&state).await,
                kiln_store::ReadyWake::Nothing => continue,
            },
            _ = shutdown.changed() => return,
        };
        match swept {
            Ok(0) => {}
            Ok(added) => tracing::debug!(added, "dispatch sweep queued ready jobs"),
            Err(e) => tracing::warn!("dispatch sweep paused: {e}"),
        }
    }
}

/// The sweep period while replicas share the offering.
const OFFER_SWEEP: Duration = Duration::from_secs(1);
/// A replica whose agents claim holds the lease `offer:<instance>` this long
/// (database time), renewed every [`OFFER_RENEW`]: a replica that died stops
/// offering after at most the TTL plus a renewal, when the others' next
/// reading of the members gives its share to them.
const OFFER_TTL_MS: i64 = 3_000;
const OFFER_RENEW: Duration = Duration::from_secs(1);
/// The lease names' prefix.
const OFFER_PREFIX: &str = "offer:";

/// Shares the offering of ready jobs among the replicas whose agents claim
/// (see `dispatch`): announces this one while it has agents, reads the live
/// members, and sweeps at once when they changed (a member that left or
/// died leaves its share to the others). When the database cannot be read,
/// this replica offers everything (claims decide ownership regardless).
async fn offering(state: State, mut shutdown: watch::Receiver<bool>) {
    let name = format!("{OFFER_PREFIX}{}", state.instance_id);
    let mut announced = false;
    loop {
        let serving = state.dispatcher.has_agents(Duration::from_millis(OFFER_TTL_MS as u64));
        let members = async {
            if serving {
                state.store.acquire_lease(&name, &state.instance_id, OFFER_TTL_MS).await?;
            } else if announced {
                state.store.release_lease(&name, &state.instance_id).await?;
            }
            announced = serving;
            state.store.lease_holders(OFFER_PREFIX).await
        };
        let members = match tokio::time::timeout(OFFER_RENEW * 2, members).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                tracing::warn!("replica offering paused: {e}");
                vec![]
            }
            Err(_) => {
                tracing::warn!("replica offering paused: the database did not answer");
                vec![]
            }
        };
        if state.dispatcher.set_members(&state.instance_id, members) {
            tracing::info!(members = state.dispatcher.offer_members(), "replicas offering ready jobs changed");
            if let Err(e) = work::sweep_once(&state).await {
                tracing::warn!("dispatch sweep paused: {e}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(OFFER_RENEW) => {}
            _ = shutdown.changed() => {
                if announced {
                    let _ = state.store.release_lease(&name, &state.instance_id).await;
                }
                return;
            }
        }
    }
}

/// How often the planner looks for deliveries whose backoff passed, and the
/// reporter for runs whose status moved.
const PLANNER_POLL: Duration = Duration::from_secs(1);
const REPORT_POLL: Duration = Duration::from_millis(500);
/// How often the notification sender looks for due deliveries.
const NOTIFY_POLL: Duration = Duration::from_millis(500);
/// The lease of the schedule and poll loop: renewed every round; another
/// replica takes over this long after its holder stopped renewing.
const TRIGGERS_LEASE_MS: i64 = 15_000;

/// Plans webhook deliveries: at once when one was accepted, and every
/// second for deferred ones and those accepted before a restart.
async fn planner(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        let notified = state.planner_wake.notified();
        match crate::services::planning::plan_once(&state).await {
            Ok(0) => {}
            Ok(_) => continue,
            Err(e) => tracing::warn!("delivery planner paused: {e}"),
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(PLANNER_POLL) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Schedules and polls, on the one replica that holds the `triggers` lease
/// (a row in the database with an expiry in database time, renewed every
/// round; another replica takes over after it expires).
async fn triggers(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(state.config.trigger_interval) => {}
            _ = shutdown.changed() => {
                let _ = state.store.release_lease("triggers", &state.instance_id).await;
                return;
            }
        }
        match state.store.acquire_lease("triggers", &state.instance_id, TRIGGERS_LEASE_MS).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!("triggers lease not taken: {e}");
                continue;
            }
        }
        if let Err(e) = crate::services::triggers::schedule_once(&state).await {
            tracing::warn!("scheduler paused: {e}");
        }
        if let Err(e) = crate::services::triggers::poll_once(&state).await {
            tracing::warn!("poller paused: {e}");
        }
    }
}

/// The relay runs at once when a transaction wrote outbox events (the
/// wakeup), again at once while it finds full batches, and polls otherwise.
/// A round that found less than a batch waits: a wakeup that came during
/// it was kept (`notify_one` stores a permit), so nothing committed since
/// waits for the poll — and a run's acceptance costs one read, not two.
async fn relay(state: State, mut shutdown: watch::Receiver<bool>) {
    loop {
        let notified = state.relay_wake.notified();
        match work::relay_once(&state).await {
            Ok(n) if n >= work::RELAY_BATCH as usize => continue,
            Ok(_) => {}
            Err(e) => tracing::warn!("outbox relay paused: {e}"),
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(RELAY_POLL) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// A lease is fenced at most ~1/30 of its TTL late. Each round reads every
/// running attempt's deadline (PostgreSQL keeps no index on it, so that
/// heartbeats stay HOT updates; about 16 ms for 82,800 live leases), so
/// rounds are no more frequent than a second needs. A lost agent's
/// shortened leases wake a round the moment their loss grace ends.
///
/// A lease that expired while the database could not be reached proves
/// nothing about its agent: nobody could renew it (the heartbeat is a
/// database write), and without this every job running through a database
/// outage longer than a lease was fenced the moment the database came back
/// (its live agent's heartbeats refused as expired). So a round that fails,
/// or cannot finish within a heartbeat interval (a third of the TTL: the
/// pool waits for an unreachable database for its whole 30 s acquire
/// timeout), makes the reconciler "blind"; before it fences again it
/// extends the running leases that were live when the last good round
/// ended to half a TTL from now, in which live agents heartbeat. Leases
/// that had expired before are fenced as usual, so an outage delays the
/// failover of a dead agent by at most half a TTL, not a whole one.
/// A round cut short is harmless: each fence is its own transaction, and
/// the relay's poll delivers what a skipped wakeup would have.
async fn reconciler(state: State, mut shutdown: watch::Receiver<bool>) {
    let period = (state.config.lease_ttl / 30).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let margin_ms = (state.config.lease_ttl / 2).as_millis() as i64;
    let patience = (state.config.lease_ttl / 3).max(Duration::from_millis(500));
    let mut blind = false;
    // When the last round that reached the database ended.
    let mut last_good = std::time::Instant::now();
    loop {
        let round = async {
            if blind {
                // The outage, measured generously: since the last good round
                // ended, plus a period (the round before it may have read
                // the leases that long before).
                let outage_ms = (last_good.elapsed() + period).as_millis() as i64;
                let n = state.store.extend_running_leases(outage_ms, margin_ms).await?;
                tracing::warn!(
                    extended = n,
                    outage_ms,
                    "the database was unreachable: leases live when it went away extended by half a lease TTL"
                );
            }
            work::fence_once(&state).await
        };
        match tokio::time::timeout(patience, round).await {
            Ok(Ok(_)) => {
                blind = false;
                last_good = std::time::Instant::now();
            }
            Ok(Err(e)) => {
                blind = true;
                tracing::warn!("reconciler paused: {e}");
            }
            Err(_) => {
                blind = true;
                tracing::warn!("reconciler paused: the database did not answer within {patience:?}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = state.reconcile_wake.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}
