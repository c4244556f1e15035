//! Deployment environments and approvals (issue 46): `kiln env`, `kiln
//! approve`, `kiln reject`. Environment writes are an admin's (the
//! route's policy); a decision on a run's deployment is taken by the
//! environment's approvers (API token names; any admin when none are
//! listed), never by whoever started the run when the environment says
//! `--prevent-self-review`, and is an audit entry.

use crate::auth::{ADMIN_ACTOR, Principal, Scope};
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_store::{ApprovalRecord, EnvironmentRecord};

/// An approval stands 30 days unless the environment says otherwise
/// (GitHub's limit for a pending deployment).
const DEFAULT_APPROVAL_TTL_SECS: u64 = 30 * 86_400;

pub(crate) fn view(e: EnvironmentRecord) -> api::Environment {
    api::Environment {
        name: e.name,
        approvers: e.approvers,
        min_approvals: e.min_approvals,
        prevent_self_review: e.prevent_self_review,
        refs: e.refs,
        wait_secs: u64::try_from(e.wait_ms / 1000).unwrap_or(0),
        approval_ttl_secs: u64::try_from(e.approval_ttl_ms / 1000).unwrap_or(0),
        keep_deployments: e.keep_deployments,
        require_provenance: e.require_provenance,
        created_at_ms: e.created_at,
        updated_at_ms: e.updated_at,
    }
}

fn describe(e: &EnvironmentRecord) -> String {
    format!(
        "approvers [{}] min-approvals {} prevent-self-review {} refs [{}] wait {}s keep-deployments {}",
        e.approvers.join(","),
        e.min_approvals,
        e.prevent_self_review,
        e.refs.join(","),
        e.wait_ms / 1000,
        e.keep_deployments
    ) + &e.require_provenance.as_ref().map(|p| format!(" require-provenance {p}")).unwrap_or_default()
}

/// A provenance policy as given (`none` or empty: none), in its canonical
/// form; 422 naming what is wrong.
fn provenance_policy(text: &str) -> ApiResult<Option<String>> {
    kiln_provenance::deploy::DeployPolicy::parse(text)
        .map(|p| p.map(|p| p.to_string()))
        .map_err(|e| ApiErr::invalid(format!("--require-provenance: {e}")))
}

/// Trimmed, non-empty, deduplicated names or patterns.
fn clean(list: Vec<String>, what: &str) -> ApiResult<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for v in list {
        let v = v.trim().to_string();
        if v.is_empty() || v.len() > 200 || v.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(ApiErr::invalid(format!("{what} `{v}`: 1 to 200 characters, no spaces")));
        }
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

fn secs_ms(secs: u64, what: &str) -> ApiResult<i64> {
    i64::try_from(secs)
        .ok()
        .and_then(|s| s.checked_mul(1000))
        .ok_or_else(|| ApiErr::invalid(format!("{what}: too large")))
}

pub(crate) async fn list(state: &AppState) -> ApiResult<api::EnvironmentList> {
    Ok(api::EnvironmentList { environments: state.store.list_environments().await?.into_iter().map(view).collect() })
}

pub(crate) async fn get(state: &AppState, name: &str) -> ApiResult<api::Environment> {
    Ok(view(state.store.get_environment(name).await?))
}

pub(crate) async fn create(
    state: &AppState,
    by: &Principal,
    req: api::CreateEnvironment,
) -> ApiResult<api::Environment> {
    let e = EnvironmentRecord {
        name: req.name.trim().to_string(),
        approvers: clean(req.approvers, "approver")?,
        min_approvals: req.min_approvals.unwrap_or(0),
        prevent_self_review: req.prevent_self_review,
        refs: clean(req.refs, "ref pattern")?,
        wait_ms: secs_ms(req.wait_secs.unwrap_or(0), "wait")?,
        approval_ttl_ms: secs_ms(req.approval_ttl_secs.unwrap_or(DEFAULT_APPROVAL_TTL_SECS), "approval lifetime")?,
        keep_deployments: req.keep_deployments.unwrap_or(api::DEFAULT_KEEP_DEPLOYMENTS),
        require_provenance: provenance_policy(req.require_provenance.as_deref().unwrap_or(""))?,
        ..Default::default()
    };
    let e = state.store.put_environment(&e, true).await?;
    access::audit(state, &by.actor, "environment.create", &e.name, describe(&e)).await?;
    Ok(view(e))
}

pub(crate) async fn update(
    state: &AppState,
    by: &Principal,
    name: &str,
    req: api::UpdateEnvironment,
) -> ApiResult<api::Environment> {
    let mut e = state.store.get_environment(name).await?;
    if let Some(a) = req.approvers {
        e.approvers = clean(a, "approver")?;
    }
    if let Some(n) = req.min_approvals {
        e.min_approvals = n;
    }
    if let Some(p) = req.prevent_self_review {
        e.prevent_self_review = p;
    }
    if let Some(r) = req.refs {
        e.refs = clean(r, "ref pattern")?;
    }
    if let Some(w) = req.wait_secs {
        e.wait_ms = secs_ms(w, "wait")?;
    }
    if let Some(t) = req.approval_ttl_secs {
        e.approval_ttl_ms = secs_ms(t, "approval lifetime")?;
    }
    if let Some(k) = req.keep_deployments {
        e.keep_deployments = k;
    }
    if let Some(p) = &req.require_provenance {
        e.require_provenance = provenance_policy(p)?;
    }
    let e = state.store.put_environment(&e, false).await?;
    access::audit(state, &by.actor, "environment.update", &e.name, describe(&e)).await?;
    Ok(view(e))
}

pub(crate) async fn delete(state: &AppState, by: &Principal, name: &str) -> ApiResult<api::Environment> {
    let e = state.store.delete_environment(name).await?;
    access::audit(state, &by.actor, "environment.delete", &e.name, "").await?;
    Ok(view(e))
}

/// The name a principal approves as: `admin` for admin.token, else its
/// API token's name.
pub(crate) async fn approver_name(state: &AppState, by: &Principal) -> ApiResult<String> {
    if by.actor == ADMIN_ACTOR {
        return Ok("admin".into());
    }
    let id = by.actor.strip_prefix("token:").unwrap_or(&by.actor);
    Ok(state.store.get_api_token(id).await?.name)
}

pub(crate) fn forbidden(message: String) -> ApiErr {
    ApiErr::new(StatusCode::FORBIDDEN, kiln_api::codes::FORBIDDEN, message)
}

/// Approve or reject `run`'s deployment to an environment.
pub(crate) async fn decide(
    state: &AppState,
    by: &Principal,
    run_id: &str,
    req: api::DecideDeployment,
) -> ApiResult<api::Approval> {
    let decision = match req.decision.trim() {
        "approve" | "approved" => "approved",
        "reject" | "rejected" => "rejected",
        other => return Err(ApiErr::invalid(format!("decision `{other}`: expected `approve` or `reject`"))),
    };
    let comment = req.comment.map(|c| c.trim().to_string()).filter(|c| !c.is_empty());
    if comment.as_ref().is_some_and(|c| c.chars().count() > 1000) {
        return Err(ApiErr::invalid("a comment is at most 1,000 characters"));
    }
    let run = state.store.get_run(run_id).await?.run;
    let mut envs: Vec<&str> =
        run.definition.jobs.iter().filter_map(|j| j.environment.as_ref().map(|e| e.name.as_str())).collect();
    envs.sort_unstable();
    envs.dedup();
    let env_name = match (req.environment.as_deref().map(str::trim), envs.as_slice()) {
        (Some(e), _) => e.to_string(),
        (None, [one]) => one.to_string(),
        (None, []) => return Err(ApiErr::invalid(format!("run {run_id} deploys to no environment"))),
        (None, many) => {
            return Err(ApiErr::invalid(format!(
                "run {run_id} deploys to {}: say which with --env",
                many.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ")
            )));
        }
    };
    let env = state.store.get_environment(&env_name).await?;
    let name = approver_name(state, by).await?;
    let allowed = if env.approvers.is_empty() { by.scope == Scope::Admin } else { env.approvers.contains(&name) };
    if !allowed {
        let who = if env.approvers.is_empty() { "an admin".to_string() } else { env.approvers.join(", ") };
        return Err(forbidden(format!("`{name}` may not decide deployments to `{env_name}`: its approvers are {who}")));
    }
    // Who started the run, by identity or by name (another token of the
    // same name, or a forge user of that name, is the same person).
    let starter = crate::services::runs::actor_name(state, run.actor.clone()).await;
    if env.prevent_self_review && (run.actor.as_deref() == Some(by.actor.as_str()) || starter.as_deref() == Some(&name))
    {
        return Err(forbidden(format!(
            "`{name}` started run {run_id}; environment `{env_name}` does not let anyone approve their own run \
             (--prevent-self-review): ask another approver"
        )));
    }
    let a = ApprovalRecord {
        run_id: run.id.clone(),
        environment: env_name.clone(),
        actor: name.clone(),
        decision: decision.into(),
        comment: comment.clone(),
        created_at: 0,
        expires_at: 0,
    };
    let a = state.store.decide_deployment(&a).await?;
    access::audit(
        state,
        &by.actor,
        if decision == "approved" { "deployment.approve" } else { "deployment.reject" },
        &run.id,
        format!("environment {env_name}{}", comment.map(|c| format!(": {c}")).unwrap_or_default()),
    )
    .await?;
    state.relay_wake.notify_one();
    state.job_changed(&run.id);
    Ok(approval_view(a))
}

fn approval_view(a: ApprovalRecord) -> api::Approval {
    api::Approval {
        run_id: a.run_id,
        environment: a.environment,
        by: a.actor,
        decision: a.decision,
        comment: a.comment,
        at_ms: a.created_at,
        expires_at_ms: a.expires_at,
    }
}

pub(crate) async fn approvals(state: &AppState, run_id: &str) -> ApiResult<api::ApprovalList> {
    Ok(api::ApprovalList {
        approvals: state.store.run_approvals(run_id).await?.into_iter().map(approval_view).collect(),
    })
}

/// An environment's deployments, newest first; actors by name.
pub(crate) async fn deployments(state: &AppState, env: &str, limit: Option<u32>) -> ApiResult<api::DeploymentList> {
    state.store.get_environment(env).await?;
    let rows = state.store.deployments(env, limit.unwrap_or(50)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for d in rows {
        out.push(deployment_view(state, d).await);
    }
    Ok(api::DeploymentList { deployments: out })
}

async fn deployment_view(state: &AppState, d: kiln_store::DeploymentRecord) -> api::Deployment {
    api::Deployment {
        id: d.id,
        environment: d.environment,
        repo: d.repo_name,
        run_id: d.run_id,
        run_number: d.run_number,
        job_id: d.job_id,
        job: d.job_name,
        epoch: d.epoch,
        commit_sha: d.commit_sha,
        url: d.url,
        status: d.status,
        triggered_by: crate::services::runs::actor_name(state, d.triggered_by).await,
        approvals: d.approvals,
        artifacts: d
            .artifacts
            .into_iter()
            .map(|a| api::DeployedArtifact {
                name: a.name,
                from_job: a.from_job,
                run_id: a.run_id,
                generation: a.generation,
                sha256: a.sha256,
            })
            .collect(),
        at_ms: d.created_at,
        rollback_of: d.rollback_of,
        ring: d.ring,
    }
}

/// Who may roll an environment back: its approvers (any admin when it
/// lists none). The rollback is their approval of the rollback run (the
/// bytes were approved when they were first deployed; with
/// `--min-approvals` above 1 the run waits for the others).
pub(crate) async fn rollback(
    state: &AppState,
    by: &Principal,
    env_name: &str,
    req: api::RollbackRequest,
) -> ApiResult<api::RollbackAccepted> {
    let comment = req.comment.map(|c| c.trim().to_string()).filter(|c| !c.is_empty());
    if comment.as_ref().is_some_and(|c| c.chars().count() > 1000) {
        return Err(ApiErr::invalid("a comment is at most 1,000 characters"));
    }
    let env = state.store.get_environment(env_name).await?;
    let name = approver_name(state, by).await?;
    let allowed = if env.approvers.is_empty() { by.scope == Scope::Admin } else { env.approvers.contains(&name) };
    if !allowed {
        let who = if env.approvers.is_empty() { "an admin".to_string() } else { env.approvers.join(", ") };
        return Err(forbidden(format!("`{name}` may not roll `{env_name}` back: its approvers are {who}")));
    }
    let to = req.to.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let target = state.store.rollback_target(env_name, to).await?;
    // The environment's provenance policy as it stands now: bytes deployed
    // under an older policy are not promoted again past a newer one.
    if let Some(refused) = state.store.provenance_refusal(env_name, &target.artifacts).await? {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            kiln_api::codes::CONFLICT,
            format!("not rolling `{env_name}` back to deployment {}: {refused}", target.id),
        ));
    }
    let rb = kiln_store::NewRollback {
        deployment_id: target.id.clone(),
        environment: env_name.to_string(),
        approver: Some(name),
        comment: comment.clone(),
    };
    let run_id = crate::services::acceptance::rollback(state, by, &target.run_id, rb).await?;
    let number = state.store.get_run(&run_id).await.map(|v| v.run.number).unwrap_or_default();
    access::audit(
        state,
        &by.actor,
        "deployment.rollback",
        &run_id,
        format!(
            "environment {env_name} to deployment {} (run {}){}",
            target.id,
            target.run_id,
            comment.map(|c| format!(": {c}")).unwrap_or_default()
        ),
    )
    .await?;
    state.job_changed(&run_id);
    Ok(api::RollbackAccepted { run_id, run_number: number, to: deployment_view(state, target).await })
}
