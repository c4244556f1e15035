//! Who may do what, administered through the API (admin scope): API tokens
//! (`admin`, `read`, `trigger` of one repository), agent join tokens and
//! their pools, registered agents, and the audit log of it all.
//!
//! A token's secret is shown once, at creation; the store keeps its sha256.

use crate::auth::Principal;
use crate::credentials::{self, API_PREFIX, JOIN_PREFIX};
use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use kiln_api as api;
use kiln_store::{ApiTokenRecord, NewAudit};

/// Write one audit entry; an audit that cannot be written fails the call
/// (an action nobody can account for is not taken).
pub(crate) async fn audit(
    state: &AppState,
    actor: &str,
    action: &str,
    target: &str,
    detail: impl Into<String>,
) -> ApiResult<()> {
    let e = NewAudit { actor: actor.into(), action: action.into(), target: target.into(), detail: detail.into() };
    Ok(state.store.audit(&e).await?)
}

/// A name for a token, pool or agent: 1-100 characters of `[A-Za-z0-9._-]`.
fn check_name(what: &str, name: &str) -> ApiResult<String> {
    let name = name.trim();
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiErr::invalid(format!("{what} must be 1-100 characters of [A-Za-z0-9._-]")));
    }
    Ok(name.to_string())
}

/// A repository's secret pools: valid names, no duplicates, at most 32.
pub(crate) fn check_pools(pools: &[String]) -> ApiResult<Vec<String>> {
    if pools.len() > 32 {
        return Err(ApiErr::invalid("at most 32 secret pools"));
    }
    let mut out: Vec<String> = Vec::new();
    for p in pools {
        let p = check_name("a pool name", p)?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

fn token_info(t: ApiTokenRecord) -> api::TokenInfo {
    api::TokenInfo {
        id: t.id,
        name: t.name,
        scope: t.scope,
        repo_id: t.repo_id,
        trusted: t.trusted,
        created_at_ms: t.created_at,
        revoked_at_ms: t.revoked_at,
        last_used_at_ms: t.last_used_at,
    }
}

pub(crate) async fn create_token(
    state: &AppState,
    by: &Principal,
    req: api::CreateToken,
) -> ApiResult<api::CreatedToken> {
    let name = check_name("a token name", &req.name)?;
    let (repo_id, trusted) = match req.scope.as_str() {
        "admin" if req.repo.is_none() => (None, req.trusted.unwrap_or(true)),
        "read" if req.repo.is_none() && req.trusted != Some(true) => (None, false),
        "trigger" => match &req.repo {
            Some(r) => (Some(state.store.get_repo(r).await?.id), req.trusted.unwrap_or(false)),
            None => return Err(ApiErr::invalid("a trigger token names its repository (`repo`)")),
        },
        "admin" | "read" => {
            return Err(ApiErr::invalid(format!(
                "a {} token is not bound to a repository{}",
                req.scope,
                if req.scope == "read" { " and starts no runs (no `trusted`)" } else { "" }
            )));
        }
        other => return Err(ApiErr::invalid(format!("unknown scope `{other}`: use admin, read or trigger"))),
    };
    let trusted = within_grant(by, trusted, req.trusted)?;
    let (id, token, hash) = credentials::mint(API_PREFIX);
    let record = ApiTokenRecord {
        id,
        name,
        scope: req.scope.clone(),
        repo_id,
        trusted,
        token_hash: hash,
        created_at: 0,
        revoked_at: None,
        last_used_at: None,
    };
    let made = state.store.create_api_token(&record).await?;
    audit(state, &by.actor, "token.create", &made.id, format!("{} {}", made.scope, made.name)).await?;
    Ok(api::CreatedToken { token, info: token_info(made) })
}

/// A token never makes a token with more than it has (issue 39, item 12):
/// only an admin token makes tokens (the policy table), and an untrusted
/// one (`--trusted false`) makes only untrusted ones — asked for `trusted`,
/// it is refused; by default its tokens are untrusted.
fn within_grant(by: &Principal, trusted: bool, asked: Option<bool>) -> ApiResult<bool> {
    if by.scope != crate::auth::Scope::Admin {
        return Err(ApiErr::new(
            axum::http::StatusCode::FORBIDDEN,
            api::codes::FORBIDDEN,
            "only an admin token makes tokens",
        ));
    }
    if trusted && !by.may_start_trusted {
        if asked == Some(true) {
            return Err(ApiErr::new(
                axum::http::StatusCode::FORBIDDEN,
                api::codes::FORBIDDEN,
                "this token is untrusted (`--trusted false`): it cannot make a trusted token",
            ));
        }
        return Ok(false);
    }
    Ok(trusted)
}

pub(crate) async fn list_tokens(state: &AppState) -> ApiResult<Vec<api::TokenInfo>> {
    Ok(state.store.list_api_tokens().await?.into_iter().map(token_info).collect())
}

pub(crate) async fn revoke_token(state: &AppState, by: &Principal, id: &str) -> ApiResult<()> {
    if !state.store.revoke_api_token(id).await? {
        return Err(ApiErr::not_found(format!("token {id}")));
    }
    state.tokens.forget(id);
    audit(state, &by.actor, "token.revoke", id, "").await
}

fn join_info(t: kiln_store::JoinTokenRecord) -> api::JoinTokenInfo {
    api::JoinTokenInfo {
        id: t.id,
        name: t.name,
        pool: t.pool,
        created_at_ms: t.created_at,
        revoked_at_ms: t.revoked_at,
    }
}

pub(crate) async fn create_join_token(
    state: &AppState,
    by: &Principal,
    req: api::CreateJoinToken,
) -> ApiResult<api::CreatedJoinToken> {
    let name = check_name("a token name", &req.name)?;
    let pool = check_name("a pool name", req.pool.as_deref().unwrap_or("default"))?;
    let (id, token, hash) = credentials::mint(JOIN_PREFIX);
    let made = state.store.create_join_token(&id, &name, &pool, &hash).await?;
    audit(state, &by.actor, "agent-token.create", &made.id, format!("pool {pool} {name}")).await?;
    Ok(api::CreatedJoinToken { token, info: join_info(made) })
}

pub(crate) async fn list_join_tokens(state: &AppState) -> ApiResult<Vec<api::JoinTokenInfo>> {
    Ok(state.store.list_join_tokens().await?.into_iter().map(join_info).collect())
}

pub(crate) async fn revoke_join_token(state: &AppState, by: &Principal, id: &str) -> ApiResult<()> {
    if !state.store.revoke_join_token(id).await? {
        return Err(ApiErr::not_found(format!("agent token {id}")));
    }
    audit(state, &by.actor, "agent-token.revoke", id, "").await
}

pub(crate) async fn list_agents(state: &AppState) -> ApiResult<Vec<api::AgentInfo>> {
    let running = state.store.running_per_agent().await?;
    let mut jobs: std::collections::HashMap<String, Vec<api::AgentJob>> = Default::default();
    for a in state.store.running_attempts(1000).await? {
        jobs.entry(a.agent_id).or_default().push(api::AgentJob {
            run_id: a.run_id,
            run_number: a.run_number,
            repo: a.repo,
            job_id: a.job_id,
            job: a.job_name,
            epoch: a.epoch,
            started_at_ms: a.started_at,
        });
    }
    Ok(state
        .store
        .list_agents()
        .await?
        .into_iter()
        .map(|a| api::AgentInfo {
            connected: state.live_agents.is_connected(&a.id),
            executor: Some(a.executor.to_string()),
            takes_untrusted: Some(state.config.untrusted.takes_untrusted(&a.pool, a.executor)),
            running_jobs: running.get(&a.id).copied().unwrap_or(0),
            jobs: jobs.remove(&a.id).unwrap_or_default(),
            id: a.id,
            name: a.name,
            pool: a.pool,
            labels: a.labels,
            max_jobs: a.max_jobs,
            created_at_ms: a.created_at,
            last_seen_at_ms: a.last_seen_at,
            version: a.version,
            draining: a.draining,
        })
        .collect())
}

/// Forget an agent: its session credential names no agent any more, and
/// its running attempts' leases end now (the reconciler fences them).
pub(crate) async fn remove_agent(state: &AppState, by: &Principal, id: &str) -> ApiResult<()> {
    if !state.store.remove_agent(id).await? {
        return Err(ApiErr::not_found(format!("agent {id}")));
    }
    audit(state, &by.actor, "agent.remove", id, "").await
}

pub(crate) async fn list_audit(
    state: &AppState,
    before: Option<i64>,
    limit: Option<u32>,
) -> ApiResult<Vec<api::AuditEntry>> {
    let limit = limit.unwrap_or(100).clamp(1, 1000);
    Ok(state
        .store
        .list_audit(before, limit)
        .await?
        .into_iter()
        .map(|e| api::AuditEntry {
            id: e.id,
            at_ms: e.at,
            actor: e.actor,
            action: e.action,
            target: e.target,
            detail: e.detail,
        })
        .collect())
}
