//! Commit statuses out (issue 14): every run accepted from a forge event
//! reports to the forge as it moves — pending on acceptance, running, then
//! success, failure or cancelled — through the `forge_reports` outbox.
//!
//! A report row's wanted state is derived from its run's status at send
//! time, so a state superseded by a newer one is never sent after it: one
//! sender holds a row at a time (a claim in the database), it sends the
//! current state, and intermediate states a run passed through quickly may
//! be skipped but never reordered. A newer run for the same commit and
//! context supersedes the older one's row. A forge that is down delays
//! statuses (retries with backoff and jitter), never runs.

use crate::state::AppState;
use kiln_forge::{CommitState, Forge, StatusTarget};
use kiln_store::{RepoRecord, ReportTodo, StoreError};

/// How long a sender holds a report row.
const CLAIM_MS: i64 = 30_000;
/// Retries of one state before it is given up (the next state tries again).
const MAX_ATTEMPTS: i64 = 12;

fn state_of(s: &str) -> Option<CommitState> {
    Some(match s {
        "pending" => CommitState::Pending,
        "running" => CommitState::Running,
        "success" => CommitState::Success,
        "failure" => CommitState::Failure,
        "cancelled" => CommitState::Cancelled,
        "error" => CommitState::Error,
        _ => return None,
    })
}

fn is_final(s: &str) -> bool {
    matches!(s, "success" | "failure" | "cancelled" | "error")
}

/// Whether commit statuses can be sent for the repository.
pub(crate) fn reports_statuses(repo: &RepoRecord) -> bool {
    repo.forge.forge.is_some() && repo.forge.forge_repo.is_some() && repo.forge.forge_token.is_some()
}

/// The forge a repository's statuses go to, with its token opened.
pub(crate) fn target(state: &AppState, repo: &RepoRecord) -> Result<StatusTarget, String> {
    let f = &repo.forge;
    let forge: Forge = f.forge.as_deref().ok_or("no forge configured")?.parse().map_err(|_| "unknown forge")?;
    let repo_path = f.forge_repo.clone().ok_or("no forge repository configured (--forge-repo)")?;
    let sealed = f.forge_token.as_deref().ok_or("no forge token configured (--forge-token-file)")?;
    let token = state
        .secrets
        .open(&repo.id, kiln_store::FORGE_TOKEN, sealed)
        .map_err(|e| format!("the forge token cannot be opened: {e}"))?;
    let api_url = kiln_forge::api_url(forge, f.forge_url.as_deref())?;
    Ok(StatusTarget { forge, api_url, repo: repo_path, token })
}

fn describe(r: &ReportTodo) -> String {
    if !r.description.is_empty() {
        return r.description.clone();
    }
    let took = match (r.run_created_at, r.run_finished_at) {
        (Some(a), Some(b)) => format!(" in {}", human_ms(b - a)),
        _ => String::new(),
    };
    let base: String = match r.state.as_str() {
        "pending" => "Queued".into(),
        "running" => "Running".into(),
        "success" => format!("Succeeded{took}"),
        "failure" => match &r.run_message {
            Some(m) => format!("Failed{took}: {m}"),
            None => format!("Failed{took}"),
        },
        "cancelled" => format!("Cancelled{took}"),
        other => other.to_string(),
    };
    match r.test_summary.filter(|s| s.total > 0 && is_final(&r.state)) {
        // Issue 43: "3 failed, 2 flaky of 1,204" first: the forge cuts long
        // descriptions (GitHub at 140 characters).
        Some(s) => format!("{} · {base}", tests_line(&s)),
        None => base,
    }
}

/// A run's tests in a few words: `3 failed, 2 flaky of 1,204 tests`.
pub(crate) fn tests_line(s: &kiln_store::TestSummary) -> String {
    let mut parts = Vec::new();
    let failed = s.failed + s.errored - s.quarantined;
    if failed > 0 {
        parts.push(format!("{} failed", thousands(failed)));
    }
    if s.flaky > 0 {
        parts.push(format!("{} flaky", thousands(s.flaky)));
    }
    if s.quarantined > 0 {
        parts.push(format!("{} quarantined", thousands(s.quarantined)));
    }
    if parts.is_empty() {
        return format!("{} tests passed", thousands(s.total - s.skipped));
    }
    format!("{} of {} tests", parts.join(", "), thousands(s.total))
}

/// `1204` → `1,204`.
fn thousands(n: i64) -> String {
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn human_ms(ms: i64) -> String {
    let s = (ms.max(0) + 500) / 1000;
    if s < 60 { format!("{s}s") } else { format!("{}m {}s", s / 60, s % 60) }
}

/// Send the statuses that are due; how many were sent.
pub(crate) async fn report_once(state: &AppState) -> Result<usize, StoreError> {
    let due = state.store.due_reports(64).await?;
    let mut sent = 0;
    for r in due {
        if !state.store.claim_report(&r.id, CLAIM_MS).await? {
            continue;
        }
        sent += usize::from(send(state, &r).await?);
    }
    Ok(sent)
}

async fn send(state: &AppState, r: &ReportTodo) -> Result<bool, StoreError> {
    let repo = state.store.get_repo(&r.repo_id).await?;
    let done = is_final(&r.state);
    let Some(commit_state) = state_of(&r.state) else {
        state.store.report_sent(&r.id, &r.state, true, Some("unknown state")).await?;
        return Ok(false);
    };
    let target = match target(state, &repo) {
        Ok(t) => t,
        Err(why) => {
            // The connection was removed meanwhile: nothing to send to.
            state.store.report_sent(&r.id, &r.state, true, Some(&why)).await?;
            return Ok(false);
        }
    };
    let link = r.run_id.as_ref().map(|id| format!("{}/#/runs/{id}", state.config.base_url()));
    let description = describe(r);
    let result = kiln_forge::post_status(
        &state.forge_http,
        &target,
        &r.commit_sha,
        &r.context,
        commit_state,
        &description,
        link.as_deref(),
    )
    .await;
    match result {
        Ok(()) => {
            state.store.report_sent(&r.id, &r.state, done, None).await?;
            Ok(true)
        }
        Err(e) if e.retryable && r.attempts + 1 < MAX_ATTEMPTS => {
            let backoff = kiln_core::backoff::Backoff { base_ms: 1_000, max_ms: 300_000 };
            let delay = backoff.delay_ms((r.attempts + 1) as u32, &mut rand::rng()) as i64;
            tracing::info!(repo = %repo.name, sha = %r.commit_sha, delay_ms = delay, "commit status deferred: {}", e.message);
            state.store.report_retry(&r.id, delay, &e.message).await?;
            Ok(false)
        }
        Err(e) => {
            // Refused (a bad token, an unknown repository) or out of
            // retries: this state is given up; the next one tries again.
            tracing::warn!(repo = %repo.name, sha = %r.commit_sha, "commit status not sent: {}", e.message);
            state.store.report_sent(&r.id, &r.state, done, Some(&e.message)).await?;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_like_a_person_wrote_them() {
        assert_eq!(super::human_ms(400), "0s");
        assert_eq!(super::human_ms(12_400), "12s");
        assert_eq!(super::human_ms(125_000), "2m 5s");
    }
}
