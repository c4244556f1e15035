//! Agents: registration (a fresh session per agent process), the session
//! check every agent call makes (invariant 11: only the session that holds
//! an attempt may act on it), and the session's live connection, whose loss
//! shortens the session's leases to the loss grace (spec 004, fast loss
//! detection; the lease TTL still catches a paused agent).

use crate::auth::JoinGrant;
use crate::error::{ApiErr, ApiResult};
use crate::state::{AppState, State};
use axum::http::StatusCode;
use futures::{Stream, StreamExt};
use kiln_api as api;
use kiln_core::claim::Executor;
use kiln_store::AgentRecord;
use std::time::Duration;

pub(crate) async fn register(
    state: &AppState,
    grant: &JoinGrant,
    req: api::RegisterAgent,
) -> ApiResult<api::AgentRegistration> {
    if req.name.trim().is_empty() || req.name.len() > 100 {
        return Err(ApiErr::invalid("agent name must be 1-100 characters"));
    }
    if req.max_jobs == 0 || req.max_jobs > 256 {
        return Err(ApiErr::invalid("max_jobs must be 1-256"));
    }
    // Placement (invariant 12): what the agent runs jobs with. An agent that
    // does not say counts as a host executor (stored so by default).
    let executor = match req.executor.as_deref().map(str::trim) {
        None | Some("") | Some("host") => Executor::Host,
        Some("container") => Executor::Container,
        Some(other) => return Err(ApiErr::invalid(format!("unknown executor `{other}` (host or container)"))),
    };
    let labels = serde_json::to_string(&req.labels).expect("labels");
    claim_name(state, grant, req.name.trim()).await?;
    let agent = state
        .store
        .register_agent_in(req.name.trim(), &labels, req.max_jobs, &grant.pool, grant.token_id.as_deref())
        .await?;
    if let Some(v) = req.version.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
        if v.len() > 64 {
            return Err(ApiErr::invalid("agent version must be at most 64 characters"));
        }
        state.store.describe_agent(&agent.id, v).await?;
    }
    if executor != Executor::Host {
        state.store.set_agent_executor(&agent.id, executor).await?;
    }
    if req.fresh_start {
        let released = state.store.release_predecessors(&agent.id).await?;
        if released > 0 {
            tracing::info!(agent = %agent.name, released, "fenced attempts of the agent's previous process confirmed gone");
        }
    }
    let policy = &state.config.untrusted;
    let takes_untrusted = policy.takes_untrusted(&agent.pool, executor);
    let ttl = state.config.lease_ttl.as_millis() as u64;
    tracing::info!(agent = %agent.id, name = %agent.name, pool = %agent.pool, %executor, takes_untrusted,
        "agent registered");
    Ok(api::AgentRegistration {
        credential: state.agent_keys.session_credential(&agent.id, &agent.session_id),
        agent_id: agent.id,
        session_id: agent.session_id,
        lease_ttl_ms: ttl,
        heartbeat_interval_ms: (ttl / 3).max(50),
        pool: agent.pool,
        takes_untrusted: Some(takes_untrusted),
        untrusted_agents: Some(policy.describe()),
    })
}

/// An agent's name is its own (issue 39, item 12): a name held by an agent
/// whose session stream is open is refused (409, naming it); one held by an
/// agent of the same pool with no live session — the same machine started
/// again — is taken over: that record is removed (its leases end at once,
/// as `DELETE /v1/agents/{id}` does) and the new registration gets the
/// name. One held by an offline agent of another pool is refused too: a
/// join token of one pool never takes another pool's agent's name. (Live
/// means connected to this server process; with replicas an agent streaming
/// to another replica is not seen as live here.)
async fn claim_name(state: &AppState, grant: &JoinGrant, name: &str) -> ApiResult<()> {
    let conflict = |m: String| ApiErr::new(StatusCode::CONFLICT, api::codes::CONFLICT, m);
    for other in state.store.list_agents().await?.into_iter().filter(|a| a.name == name) {
        if state.live_agents.is_connected(&other.id) {
            return Err(conflict(format!(
                "an agent named `{name}` is already connected (agent {}, pool {}); give this one another --name, \
                 or stop that one first",
                other.id, other.pool
            )));
        }
        if other.pool != grant.pool {
            return Err(conflict(format!(
                "the name `{name}` belongs to agent {} of pool {} (offline); this join token's pool is {}: give \
                 this agent another --name, or remove that one (`DELETE /v1/agents/{}`)",
                other.id, other.pool, grant.pool, other.id
            )));
        }
        state.store.remove_agent(&other.id).await?;
        tracing::info!(agent = %other.id, name, "an offline agent's name taken over by a new registration");
    }
    Ok(())
}

/// The agent, if `session_id` is its current session; a replaced session
/// (the agent process restarted) is refused with 409 `stale_epoch`.
pub(crate) async fn current_session(state: &AppState, agent_id: &str, session_id: &str) -> ApiResult<AgentRecord> {
    let agent = state.store.get_agent(agent_id).await?;
    same_session(&agent, session_id)?;
    Ok(agent)
}

/// Refuses a call of an agent session that was replaced.
pub(crate) fn same_session(agent: &AgentRecord, session_id: &str) -> ApiResult<()> {
    if agent.session_id != session_id {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            api::codes::STALE_EPOCH,
            "agent session was replaced; register again",
        ));
    }
    Ok(())
}

/// The agent's current session drains (spec 004): it claims nothing more.
pub(crate) async fn drain(state: &AppState, agent_id: &str, session_id: &str) -> ApiResult<()> {
    current_session(state, agent_id, session_id).await?;
    state.store.mark_draining(agent_id, session_id).await?;
    tracing::info!(agent = %agent_id, "agent draining");
    Ok(())
}

/// One round of agent bookkeeping: the agents whose session stream is open
/// here were seen now (their `last_seen_at` moves: what "last seen" shows),
/// and offline agents idle past `--agent-expiry` that run nothing are
/// forgotten (audit `agent.expire`). Returns how many expired.
pub(crate) async fn seen_once(state: &AppState) -> Result<usize, kiln_store::StoreError> {
    let here = state.live_agents.connected_ids();
    state.store.touch_agents(&here).await?;
    let expiry = state.config.agent_expiry;
    if expiry.is_zero() {
        return Ok(0);
    }
    let idle_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
    let gone = state.store.expire_agents(idle_ms, &here).await?;
    for (id, name) in &gone {
        tracing::info!(agent = %id, name, expiry = ?expiry, "offline agent expired (not seen within --agent-expiry)");
        let e = kiln_store::NewAudit {
            actor: "kiln".into(),
            action: "agent.expire".into(),
            target: id.clone(),
            detail: format!("{name}: not seen for {}s", expiry.as_secs()),
        };
        state.store.audit(&e).await?;
    }
    Ok(gone.len())
}

/// What the session stream tells its agent.
#[derive(Debug, Clone)]
pub(crate) enum SessionEvent {
    /// Every `SESSION_PING_MS`: the connection is alive.
    Ping,
    /// Stop this attempt now.
    Cancel(api::CancelNotice),
}

/// How long after the loss grace the reconciler is woken: the lease
/// deadline is in database time, a few milliseconds off this clock.
const FENCE_SLACK: Duration = Duration::from_millis(20);

/// Shortens a session's leases when its stream is dropped.
struct SessionGuard {
    state: State,
    agent: String,
    session: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let state = self.state.clone();
        let session = std::mem::take(&mut self.session);
        state.live_agents.disconnect(&self.agent, &session);
        if state.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            // This server closed the stream: the agent is fine and
            // reconnects to a replica or to this server once restarted.
            return;
        }
        let grace = state.config.loss_grace;
        tokio::spawn(async move {
            match state.store.shorten_session_leases(&session, grace.as_millis() as i64).await {
                Ok(n) if n > 0 => {
                    tracing::warn!(session, leases = n, "agent connection lost: leases shortened to the loss grace");
                    // Fence them the moment the grace runs out (unless a
                    // reconnected agent's heartbeat restored them first),
                    // not at the reconciler's next round.
                    tokio::time::sleep(grace + FENCE_SLACK).await;
                    state.reconcile_wake.notify_one();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot shorten leases of session {session}: {e}"),
            }
        });
    }
}

/// The agent's long-lived connection: pings every second and the cancel
/// notices of this session's attempts. When the stream is dropped (the
/// connection broke), the session's leases are shortened to the loss grace
/// so a dead agent's jobs are re-dispatched within seconds.
pub(crate) async fn session(
    state: &State,
    agent_id: &str,
    session_id: &str,
) -> ApiResult<impl Stream<Item = SessionEvent> + use<>> {
    current_session(state, agent_id, session_id).await?;
    state.live_agents.connect(agent_id, session_id);
    let guard = SessionGuard { state: state.clone(), agent: agent_id.to_string(), session: session_id.to_string() };
    let ticks =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(Duration::from_millis(api::SESSION_PING_MS)))
            .map(|_| SessionEvent::Ping);
    let session = session_id.to_string();
    let cancels = tokio_stream::wrappers::BroadcastStream::new(state.cancel_events.subscribe()).filter_map(move |m| {
        let ev = match m {
            Ok(n) if n.session == session => {
                Some(SessionEvent::Cancel(api::CancelNotice { job_id: n.job_id, epoch: n.epoch }))
            }
            _ => None,
        };
        futures::future::ready(ev)
    });
    Ok(futures::stream::select(ticks, cancels).map(move |ev| {
        let _keep = &guard;
        ev
    }))
}
