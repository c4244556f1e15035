//! Webhook ingress (spec 000 §5–6; issue 14): a delivery is authenticated
//! by the forge's signature or token only, parsed, given its trust, and
//! persisted before the forge gets its 2xx. Planning (reading `.kiln/` at
//! the event's SHA, creating runs) happens after, from the stored delivery
//! (`planning`), so a crash between the two finishes planning on restart.
//! The same delivery id answers with the first result and never creates a
//! second run.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use axum::http::{HeaderMap, StatusCode};
use kiln_api as api;
use kiln_core::Trust;
use kiln_core::trust::{PullRequestTrust, TrustTrigger};
use kiln_forge::{Forge, ForgeEvent};
use kiln_store::{DeliveryRecord, NewDelivery, RepoForge, RepoRecord};
use sha2::{Digest, Sha256};
use std::sync::atomic::Ordering;

/// The facts of a forge event that its trust is decided from (invariant
/// 10; the rules are kiln-core's [`kiln_core::trust::decide`]): a push's
/// ref, whether its branch is one of the repository's `protected_refs`
/// patterns; a pull request's fork flag, what the payload says of its
/// author's write access (GitHub's `author_association` OWNER, MEMBER or
/// COLLABORATOR; GitLab's and Gitea's payloads do not say) and the
/// repository's `pull_request_trust`. Anything else is untrusted.
pub(crate) fn trust_trigger<'a>(repo: &'a RepoForge, event: &'a ForgeEvent) -> Option<TrustTrigger<'a>> {
    match event {
        ForgeEvent::Push(p) => Some(TrustTrigger::Push {
            git_ref: &p.git_ref,
            default_branch: &repo.default_branch,
            protected: p
                .git_ref
                .strip_prefix("refs/heads/")
                .is_some_and(|b| repo.protected_refs.iter().any(|pat| kiln_workflow::glob_match(pat, b))),
        }),
        ForgeEvent::PullRequest(pr) => Some(TrustTrigger::PullRequest {
            fork: pr.fork,
            author_write_access: pr.author_write_access,
            // An unknown stored policy trusts nothing.
            policy: repo.pull_request_trust.parse().unwrap_or(PullRequestTrust::Never),
        }),
        ForgeEvent::Ping | ForgeEvent::Ignored { .. } => None,
    }
}

/// The trust of a forge event under the repository's policy.
pub(crate) fn decide_trust(repo: &RepoForge, event: &ForgeEvent) -> Trust {
    trust_trigger(repo, event).map_or(Trust::Untrusted, kiln_core::trust::decide)
}

/// The repository's webhook secret, opened.
fn webhook_secret(state: &AppState, repo: &RepoRecord) -> ApiResult<Option<String>> {
    match &repo.webhook_secret {
        None => Ok(None),
        Some(stored) => state
            .secrets
            .open(&repo.id, kiln_store::WEBHOOK_SECRET, stored)
            .map(Some)
            .map_err(|e| ApiErr::internal(format!("the webhook secret of {} cannot be opened: {e}", repo.name))),
    }
}

/// Receive one delivery; the status code and the answer.
pub(crate) async fn receive(
    state: &AppState,
    repo: &str,
    forge: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<(StatusCode, api::WebhookAck)> {
    let forge: Forge = forge
        .parse()
        .map_err(|_| ApiErr::not_found(format!("no webhook endpoint for `{forge}`; use github, gitlab or gitea")))?;
    let counts = &state.webhooks;
    // No existence oracle (issue 39): an unknown repository and one without
    // a webhook secret answer exactly as a known one does to a delivery that
    // does not verify — the same status and the same words, computed the
    // same way (the headers checked against a secret nobody holds).
    let repo = match state.store.get_repo(repo).await {
        Ok(r) => Some(r),
        Err(kiln_store::StoreError::NotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let secret = match &repo {
        Some(r) => webhook_secret(state, r)?,
        None => None,
    };
    let (Some(repo), Some(secret)) = (repo, secret) else {
        counts.rejected_signature.fetch_add(1, Ordering::Relaxed);
        let decoy: [u8; 32] = rand::random();
        let e =
            kiln_forge::verify(forge, headers, body, &decoy).expect_err("a random secret nobody holds never verifies");
        tracing::warn!(forge = %forge, "webhook refused: no such repository, or it has no webhook secret");
        return Err(not_verified(&e));
    };
    if let Err(e) = kiln_forge::verify(forge, headers, body, secret.as_bytes()) {
        counts.rejected_signature.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(repo = %repo.name, forge = %forge, "webhook refused: {e}");
        return Err(not_verified(&e));
    }
    if let Some(configured) = &repo.forge.forge
        && configured != forge.as_str()
    {
        counts.rejected_payload.fetch_add(1, Ordering::Relaxed);
        return Err(ApiErr::bad_request(format!(
            "repository {} is connected to {configured}; this delivery came to the {forge} endpoint",
            repo.name
        )));
    }
    let meta = kiln_forge::delivery_meta(forge, headers, body).map_err(|e| {
        counts.rejected_payload.fetch_add(1, Ordering::Relaxed);
        ApiErr::bad_request(e.to_string())
    })?;
    let event = kiln_forge::parse(forge, &meta.event, body).map_err(|e| {
        counts.rejected_payload.fetch_add(1, Ordering::Relaxed);
        ApiErr::bad_request(format!("the {} payload is not usable: {e}", meta.event))
    })?;
    if matches!(event, ForgeEvent::Push(_) | ForgeEvent::PullRequest(_))
        && let Err(message) = check_bound(&repo, forge, body)
    {
        counts.rejected_payload.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(repo = %repo.name, forge = %forge, "webhook refused: {message}");
        return Err(ApiErr::bad_request(message));
    }
    // At critical degradation (a full disk, spec 004) the delivery is still
    // recorded and answered 202: forges do not redeliver by themselves, so a
    // 503 would lose the push. Planning waits until the level drops
    // (`planning`, issue 40).
    let trust = decide_trust(&repo.forge, &event);
    let (status, message) = match &event {
        ForgeEvent::Push(_) | ForgeEvent::PullRequest(_) => ("pending", None),
        ForgeEvent::Ping => ("ignored", Some("ping".to_string())),
        ForgeEvent::Ignored { reason } => ("ignored", Some(reason.clone())),
    };
    let new = NewDelivery {
        repo_id: repo.id.clone(),
        forge: forge.as_str().to_string(),
        delivery_key: meta.id.clone(),
        event: meta.event.clone(),
        payload_digest: hex::encode(Sha256::digest(body)),
        trigger_event: serde_json::to_string(&event).map_err(|e| ApiErr::internal(e.to_string()))?,
        trust: trust.as_str().to_string(),
        status: status.to_string(),
        message,
    };
    let (stored, created) = state.store.record_delivery(&new).await?;
    if !created {
        if stored.payload_digest != new.payload_digest {
            return Err(ApiErr::new(
                StatusCode::CONFLICT,
                api::codes::CONFLICT,
                format!("delivery {} was received before with a different body", meta.id),
            ));
        }
        counts.duplicate.fetch_add(1, Ordering::Relaxed);
        return Ok((StatusCode::OK, ack(&stored, true)));
    }
    if stored.status == "pending" {
        counts.accepted.fetch_add(1, Ordering::Relaxed);
        state.planner_wake.notify_one();
    } else {
        counts.ignored.fetch_add(1, Ordering::Relaxed);
    }
    Ok((StatusCode::ACCEPTED, ack(&stored, false)))
}

/// The answer to a delivery that does not verify (or names no repository
/// that could verify it): the same for every cause but the header at fault.
fn not_verified(e: &kiln_forge::VerifyError) -> ApiErr {
    let e = match e {
        // Never "no secret is configured": that would tell a stranger the
        // repository exists.
        kiln_forge::VerifyError::EmptySecret => "the signature does not match".to_string(),
        e => e.to_string(),
    };
    ApiErr::new(
        StatusCode::UNAUTHORIZED,
        api::codes::UNAUTHORIZED,
        format!("the delivery's signature does not verify: {e}"),
    )
}

/// A push or pull request delivery must name the repository it was sent
/// for (issue 39): one secret may be shared by many repositories (GitHub
/// organisation hooks, GitLab group and system hooks), so a signature alone
/// does not say which repository the event happened in. The payload's
/// repository (GitHub and Gitea `repository`, GitLab `project`) must be the
/// repository's `forge_repo` — by id when `forge_repo` is GitLab's numeric
/// project id, else by full name (Kiln is told names, not ids). Without a
/// `forge_repo` nothing can be bound, and the delivery is refused.
fn check_bound(repo: &RepoRecord, forge: Forge, body: &[u8]) -> Result<(), String> {
    let Some(configured) = repo.forge.forge_repo.as_deref() else {
        return Err(format!(
            "repository {} has no forge repository, so a delivery cannot be bound to it (a webhook secret may be \
             shared by many repositories); set it with `kiln repo set {} --forge-repo OWNER/NAME`",
            repo.name, repo.name
        ));
    };
    match kiln_forge::repository(forge, body) {
        Some(named) if named.matches(configured) => Ok(()),
        Some(named) => Err(format!(
            "the delivery is for repository {}, not {configured} (repository {}'s --forge-repo); nothing was stored",
            named.describe(),
            repo.name
        )),
        None => Err(format!(
            "the delivery names no repository ({}), so it cannot be bound to {configured}; nothing was stored",
            match forge {
                Forge::Gitlab => "project.path_with_namespace or project.id",
                _ => "repository.full_name or repository.id",
            }
        )),
    }
}

pub(crate) fn ack(d: &DeliveryRecord, duplicate: bool) -> api::WebhookAck {
    api::WebhookAck {
        delivery: d.id.clone(),
        forge_delivery: d.delivery_key.clone(),
        status: d.status.clone(),
        message: d.message.clone(),
        runs: d.run_ids.clone(),
        duplicate,
    }
}

pub(crate) fn delivery_view(state: &AppState, d: &DeliveryRecord) -> api::Delivery {
    let delayed = d.status == "pending"
        && state.clock.now_ms() - d.created_at >= state.config.delivery_alert_after.as_millis() as i64;
    api::Delivery {
        attempts: d.attempts,
        delayed,
        id: d.id.clone(),
        forge: d.forge.clone(),
        forge_delivery: d.delivery_key.clone(),
        event: d.event.clone(),
        trust: d.trust.clone(),
        status: d.status.clone(),
        message: d.message.clone(),
        runs: d.run_ids.clone(),
        created_at_ms: d.created_at,
        planned_at_ms: d.planned_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_forge::{PullRequestEvent, PushEvent};

    fn push(git_ref: &str) -> ForgeEvent {
        ForgeEvent::Push(PushEvent {
            git_ref: git_ref.into(),
            before: None,
            after: "a".repeat(40),
            actor: "dev".into(),
            changed: None,
        })
    }

    fn pr(fork: bool, write: Option<bool>) -> ForgeEvent {
        ForgeEvent::PullRequest(PullRequestEvent {
            number: 7,
            action: "opened".into(),
            head_sha: "b".repeat(40),
            head_ref: "feature".into(),
            base_ref: "main".into(),
            base_sha: None,
            fork,
            author_write_access: write,
            actor: "dev".into(),
            fetch_ref: "refs/pull/7/head".into(),
            title: "t".into(),
        })
    }

    #[test]
    fn pushes_are_trusted_only_on_protected_refs() {
        let mut repo = RepoForge { protected_refs: vec!["release/*".into()], ..Default::default() };
        assert_eq!(decide_trust(&repo, &push("refs/heads/main")), Trust::Trusted);
        assert_eq!(decide_trust(&repo, &push("refs/tags/v1.0")), Trust::Trusted);
        assert_eq!(decide_trust(&repo, &push("refs/heads/release/1.x")), Trust::Trusted);
        assert_eq!(decide_trust(&repo, &push("refs/heads/release/1.x/sub")), Trust::Untrusted);
        assert_eq!(decide_trust(&repo, &push("refs/heads/feature")), Trust::Untrusted);
        assert_eq!(decide_trust(&repo, &push("refs/notes/x")), Trust::Untrusted);
        repo.default_branch = "trunk".into();
        assert_eq!(decide_trust(&repo, &push("refs/heads/main")), Trust::Untrusted);
        assert_eq!(decide_trust(&repo, &push("refs/heads/trunk")), Trust::Trusted);
    }

    #[test]
    fn fork_pull_requests_are_never_trusted() {
        for policy in ["write-access", "same-repo", "never"] {
            let repo = RepoForge { pull_request_trust: policy.into(), ..Default::default() };
            assert_eq!(decide_trust(&repo, &pr(true, Some(true))), Trust::Untrusted, "{policy}");
        }
        let default = RepoForge::default();
        assert_eq!(decide_trust(&default, &pr(false, Some(true))), Trust::Trusted);
        assert_eq!(decide_trust(&default, &pr(false, Some(false))), Trust::Untrusted);
        assert_eq!(decide_trust(&default, &pr(false, None)), Trust::Untrusted);
        let same = RepoForge { pull_request_trust: "same-repo".into(), ..Default::default() };
        assert_eq!(decide_trust(&same, &pr(false, None)), Trust::Trusted);
        let never = RepoForge { pull_request_trust: "never".into(), ..Default::default() };
        assert_eq!(decide_trust(&never, &pr(false, Some(true))), Trust::Untrusted);
        assert_eq!(decide_trust(&default, &ForgeEvent::Ping), Trust::Untrusted);
    }
}
