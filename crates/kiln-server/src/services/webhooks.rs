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
use kiln_forge::{Forge, ForgeEvent};
use kiln_store::{DeliveryRecord, NewDelivery, RepoForge, RepoRecord};
use sha2::{Digest, Sha256};
use std::sync::atomic::Ordering;

/// Who may start trusted work from a forge event (invariant 10), decided
/// once, at acceptance, from the payload and the repository's policy:
/// - a push to a tag, the default branch or a `protected_refs` branch
///   pattern is trusted; other pushes are not;
/// - a pull request from a fork is never trusted; one from the repository
///   itself is trusted under `pull_request_trust`: `write-access` (the
///   default) when the payload states the author has write access (GitHub's
///   `author_association` OWNER, MEMBER or COLLABORATOR; GitLab's and
///   Gitea's payloads do not say, so their pull requests are untrusted),
///   `same-repo` always, `never` never.
pub(crate) fn decide_trust(repo: &RepoForge, event: &ForgeEvent) -> Trust {
    match event {
        ForgeEvent::Push(p) => {
            if p.git_ref.starts_with("refs/tags/") {
                return Trust::Trusted;
            }
            match p.git_ref.strip_prefix("refs/heads/") {
                Some(b) if b == repo.default_branch => Trust::Trusted,
                Some(b) if repo.protected_refs.iter().any(|pat| kiln_workflow::glob_match(pat, b)) => Trust::Trusted,
                _ => Trust::Untrusted,
            }
        }
        ForgeEvent::PullRequest(pr) if !pr.fork => match repo.pull_request_trust.as_str() {
            "same-repo" => Trust::Trusted,
            "write-access" if pr.author_write_access == Some(true) => Trust::Trusted,
            _ => Trust::Untrusted,
        },
        _ => Trust::Untrusted,
    }
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
    let repo = state.store.get_repo(repo).await?;
    let counts = &state.webhooks;
    let Some(secret) = webhook_secret(state, &repo)? else {
        counts.rejected_signature.fetch_add(1, Ordering::Relaxed);
        return Err(ApiErr::new(
            StatusCode::UNAUTHORIZED,
            api::codes::UNAUTHORIZED,
            format!(
                "repository {} has no webhook secret, so no delivery can be verified; set one with \
                 `kiln repo set {} --webhook-secret-file FILE`",
                repo.name, repo.name
            ),
        ));
    };
    if let Err(e) = kiln_forge::verify(forge, headers, body, secret.as_bytes()) {
        counts.rejected_signature.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(repo = %repo.name, forge = %forge, "webhook refused: {e}");
        return Err(ApiErr::new(
            StatusCode::UNAUTHORIZED,
            api::codes::UNAUTHORIZED,
            format!("the delivery's signature does not verify: {e}"),
        ));
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
    // A full disk (spec 004: critical) takes no new work: the forge
    // redelivers after `Retry-After`, nothing is stored now.
    if matches!(event, ForgeEvent::Push(_) | ForgeEvent::PullRequest(_))
        && let Err(r) = state.resources.admit_run(false)
    {
        return Err(ApiErr::unavailable_for(r.retry_after_secs, r.message));
    }
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

pub(crate) fn delivery_view(d: &DeliveryRecord) -> api::Delivery {
    api::Delivery {
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
