//! Badges and notifications (issue 42).
//!
//! Notifications: a repository's admins subscribe a URL to run ends
//! (`failure`, `fixed`, `success`, `cancelled`, `always`). The transaction
//! that ends a run writes one outbox row per subscription that wants the end
//! (store `tx/notify.rs`: exactly once, or not at all if the transaction
//! rolls back); [`deliver_once`] claims due rows for a lease (one replica
//! sends a row at a time), POSTs the payload signed with HMAC-SHA256 under
//! the subscription's secret, and records the outcome in the delivery log.
//! A receiver that fails (5xx, 408, 429, no answer) is tried again with
//! exponential backoff and jitter (`--notify-retry-base`) up to
//! `--notify-max-attempts`; a refusal (other 4xx, a redirect) is final. A
//! row is marked delivered once; the only way a receiver sees one delivery
//! twice is a server dying between the receiver's 2xx and that mark, which
//! is why every request carries the same `X-Kiln-Delivery` id to dedupe on.
//!
//! The signing secret is sealed like repository secrets (the secret row
//! `@notify:ID`), never listed, never returned, never given to a job.
//!
//! Badges: `GET /v1/repos/{repo}/badge.svg` shows the status of the newest
//! run of a workflow on a branch; see [`badge`].

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::state::{AppState, NOTIFY_TIMEOUT};
use hmac::{Hmac, KeyInit, Mac};
use kiln_api as api;
use kiln_core::RunStatus;
use kiln_store::{DueNotification, NotificationRecord, RunRecord, StoreError, notification_secret_name};
use sha2::Sha256;

/// How long a sender holds a delivery (longer than a request may take).
const CLAIM_MS: i64 = 60_000;
/// The signature header: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "X-Kiln-Signature-256";
/// The run end: `failure`, `fixed`, `success` or `cancelled`.
pub const EVENT_HEADER: &str = "X-Kiln-Event";
/// Stable per (notification, run end): the same on every retry.
pub const DELIVERY_HEADER: &str = "X-Kiln-Delivery";
const FORMATS: &[&str] = &["kiln", "slack"];

// ---------- managing notifications ----------

/// `POST /v1/repos/{repo}/notifications`.
pub(crate) async fn add(
    state: &AppState,
    by: &Principal,
    repo: &str,
    req: api::CreateNotification,
) -> ApiResult<api::Notification> {
    let repo = state.store.get_repo(repo).await?;
    let url = check_url(req.url.trim())?;
    let secret = &req.secret;
    if secret.len() < 16 || secret.len() > 1024 || secret.chars().any(char::is_control) {
        return Err(ApiErr::invalid(
            "a notification secret is 16 to 1024 printable characters (e.g. `openssl rand -hex 32 > notify.secret`)",
        ));
    }
    let events = kiln_core::notify::parse_events(&req.events).map_err(ApiErr::invalid)?;
    let format = req.format.as_deref().map(str::trim).filter(|f| !f.is_empty()).unwrap_or("kiln");
    if !FORMATS.contains(&format) {
        return Err(ApiErr::invalid(format!("unknown format `{format}`; use kiln (default) or slack")));
    }
    let id = uuid::Uuid::now_v7().to_string();
    let sealed = state.secrets.seal(&repo.id, &notification_secret_name(&id), secret);
    let n = NotificationRecord { id, repo_id: repo.id.clone(), url, events, format: format.into(), created_at: 0 };
    let n = state.store.create_notification(&n, &sealed).await?;
    let host = reqwest::Url::parse(&n.url).ok().and_then(|u| u.host_str().map(str::to_string)).unwrap_or_default();
    let detail = format!("{} to {host} on {} ({})", n.id, n.events.join(","), n.format);
    access::audit(state, &by.actor, "notification.add", &repo.name, detail).await?;
    Ok(view(&repo.name, n))
}

/// A receiver URL: http or https, with a host and no credentials (the
/// receiver checks the signature; a password in the URL would be shown).
fn check_url(u: &str) -> ApiResult<String> {
    let url = reqwest::Url::parse(u).map_err(|e| {
        ApiErr::invalid(format!("`{u}` is not a URL ({e}); give the receiver as http://HOST/PATH or https://HOST/PATH"))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ApiErr::invalid(format!(
            "`{u}`: a notification URL is http:// or https://, not {}:",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ApiErr::invalid(format!("`{u}`: a notification URL needs a host")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiErr::invalid(
            "a notification URL carries no credentials; the receiver verifies the X-Kiln-Signature-256 header instead",
        ));
    }
    if u.len() > 2048 {
        return Err(ApiErr::invalid("a notification URL is at most 2048 characters"));
    }
    Ok(u.to_string())
}

fn view(repo: &str, n: NotificationRecord) -> api::Notification {
    api::Notification {
        id: n.id,
        repo: repo.to_string(),
        url: n.url,
        events: n.events,
        format: n.format,
        created_at_ms: n.created_at,
    }
}

/// `GET /v1/repos/{repo}/notifications`.
pub(crate) async fn list(state: &AppState, repo: &str) -> ApiResult<Vec<api::Notification>> {
    let repo = state.store.get_repo(repo).await?;
    Ok(state.store.list_notifications(&repo.id).await?.into_iter().map(|n| view(&repo.name, n)).collect())
}

/// `DELETE /v1/repos/{repo}/notifications/{id}`.
pub(crate) async fn remove(state: &AppState, by: &Principal, repo: &str, id: &str) -> ApiResult<api::Notification> {
    let repo = state.store.get_repo(repo).await?;
    let n = match state.store.delete_notification(&repo.id, id).await {
        Err(StoreError::NotFound(_)) => {
            return Err(ApiErr::not_found(format!(
                "repository {} has no notification {id}; see `kiln notify ls {}`",
                repo.name, repo.name
            )));
        }
        r => r?,
    };
    access::audit(state, &by.actor, "notification.remove", &repo.name, n.id.clone()).await?;
    Ok(view(&repo.name, n))
}

/// `GET /v1/repos/{repo}/notifications/deliveries`.
pub(crate) async fn deliveries(
    state: &AppState,
    repo: &str,
    limit: Option<u32>,
) -> ApiResult<Vec<api::NotificationDelivery>> {
    let repo = state.store.get_repo(repo).await?;
    let list = state.store.notification_deliveries(&repo.id, limit.unwrap_or(50).clamp(1, 500)).await?;
    Ok(list
        .into_iter()
        .map(|d| api::NotificationDelivery {
            run: format!("{}#{}", repo.name, d.run_number),
            next_attempt_at_ms: (d.status == "pending").then_some(d.next_at),
            id: d.id,
            notification: d.notification_id,
            run_id: d.run_id,
            event: d.event,
            status: d.status,
            attempts: d.attempts,
            last_status_code: d.last_status_code,
            last_error: d.last_error,
            created_at_ms: d.created_at,
            delivered_at_ms: d.delivered_at,
        })
        .collect())
}

// ---------- delivering ----------

/// Send the deliveries that are due; how many were delivered.
pub(crate) async fn deliver_once(state: &AppState) -> Result<usize, StoreError> {
    let due = state.store.due_notifications(32).await?;
    let mut delivered = 0;
    for d in due {
        if !state.store.claim_notification(&d.delivery.id, CLAIM_MS).await? {
            continue;
        }
        delivered += usize::from(send(state, &d).await?);
    }
    Ok(delivered)
}

/// `sha256=<hex>` of HMAC-SHA256(`secret`, `body`).
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

async fn send(state: &AppState, due: &DueNotification) -> Result<bool, StoreError> {
    let d = &due.delivery;
    let Some(target) = &due.target else {
        state.store.notification_failed(&d.id, None, "the notification was removed").await?;
        return Ok(false);
    };
    let name = notification_secret_name(&target.id);
    let stored = state.store.secret_values(&d.repo_id, std::slice::from_ref(&name)).await?.remove(&name);
    let secret = match stored.map(|s| state.secrets.open(&d.repo_id, &name, &s)) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            // A key rotation in progress: the next round reads the new key.
            let why = format!("the signing secret cannot be opened: {e}");
            return retry_or_fail(state, d, None, &why, true).await;
        }
        None => {
            state.store.notification_failed(&d.id, None, "the notification has no signing secret").await?;
            return Ok(false);
        }
    };
    let repo = state.store.get_repo(&d.repo_id).await?;
    let run = state.store.get_run(&d.run_id).await?.run;
    let body = payload(&state.config.base_url(), &repo.name, &run, &d.id, &d.event, &target.format);
    let body = serde_json::to_vec(&body).expect("json");
    let sent = state
        .notify_http
        .post(&target.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature(secret.as_bytes(), &body))
        .header(EVENT_HEADER, &d.event)
        .header(DELIVERY_HEADER, &d.id)
        .body(body)
        .send()
        .await;
    match sent {
        Ok(res) if res.status().is_success() => {
            let code = i64::from(res.status().as_u16());
            tracing::info!(repo = %repo.name, run = run.number, event = %d.event, delivery = %d.id, "notification delivered");
            Ok(state.store.notification_delivered(&d.id, code).await?)
        }
        Ok(res) => {
            let status = res.status();
            let code = i64::from(status.as_u16());
            let retryable = status.is_server_error()
                || status == reqwest::StatusCode::REQUEST_TIMEOUT
                || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            let why = if status.is_redirection() {
                format!("HTTP {code}: the receiver redirects, and redirects are not followed; give its final URL")
            } else {
                format!("HTTP {code}")
            };
            retry_or_fail(state, d, Some(code), &why, retryable).await
        }
        Err(e) => {
            let why = if e.is_timeout() {
                format!("no answer within {}s", NOTIFY_TIMEOUT.as_secs())
            } else {
                // Without the URL: it may hold a token (Slack's do).
                format!("cannot reach the receiver: {}", error_chain(&e.without_url()))
            };
            retry_or_fail(state, d, None, &why, true).await
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Try again after a backoff while attempts remain and the failure may
/// pass; else give the delivery up. Never counts as delivered.
async fn retry_or_fail(
    state: &AppState,
    d: &kiln_store::NotificationDelivery,
    code: Option<i64>,
    why: &str,
    retryable: bool,
) -> Result<bool, StoreError> {
    // The claim counted this attempt.
    let attempt = d.attempts + 1;
    let max = i64::from(state.config.notify_max_attempts.max(1));
    if retryable && attempt < max {
        let backoff = kiln_core::Backoff {
            base_ms: state.config.notify_retry_base.as_millis() as u64,
            max_ms: state.config.notify_retry_max.as_millis() as u64,
        };
        let delay = backoff.delay_ms(attempt as u32, &mut rand::rng()) as i64;
        tracing::info!(delivery = %d.id, attempt, delay_ms = delay, "notification deferred: {why}");
        state.store.notification_retry(&d.id, delay, code, why).await?;
    } else {
        let why = if retryable { format!("{why} (gave up after {attempt} attempts)") } else { why.to_string() };
        tracing::warn!(delivery = %d.id, attempt, "notification not delivered: {why}");
        state.store.notification_failed(&d.id, code, &why).await?;
    }
    Ok(false)
}

/// The branch of a run's ref (`refs/heads/B` or a bare name), if it has one.
fn branch_of(git_ref: Option<&str>) -> Option<String> {
    let r = git_ref?;
    match r.strip_prefix("refs/heads/") {
        Some(b) => Some(b.to_string()),
        None if r.starts_with("refs/") || (r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())) => None,
        None => Some(r.to_string()),
    }
}

/// A workflow's short name: `.kiln/ci.yaml` → `ci`.
fn workflow_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".yaml").or_else(|| file.strip_suffix(".yml")).unwrap_or(file)
}

/// The body of a delivery: Kiln's JSON, or a Slack-compatible `{"text"}`.
fn payload(
    base_url: &str,
    repo: &str,
    run: &RunRecord,
    delivery: &str,
    event: &str,
    format: &str,
) -> serde_json::Value {
    let url = format!("{base_url}/#/runs/{}", run.id);
    let branch = branch_of(run.git_ref.as_deref());
    let name = format!("{repo}#{}", run.number);
    if format == "slack" {
        let (icon, verb) = match event {
            "failure" => (":x:", "failed"),
            "fixed" => (":white_check_mark:", "is fixed"),
            "success" => (":white_check_mark:", "succeeded"),
            _ => (":white_circle:", "was cancelled"),
        };
        let on = branch.as_deref().map(|b| format!(" on {}", slack_escape(b))).unwrap_or_default();
        let short = &run.commit_sha[..run.commit_sha.len().min(7)];
        let title = run.commit_title.as_deref().map(|t| format!(": {}", slack_escape(t))).unwrap_or_default();
        let text = format!(
            "{icon} *{}* {verb} — {}{on} ({short}{title}) <{url}|View run>",
            slack_escape(&name),
            slack_escape(workflow_name(&run.workflow_path)),
        );
        return serde_json::json!({ "text": text });
    }
    serde_json::json!({
        "event": event,
        "delivery": delivery,
        "repo": repo,
        "run": name,
        "run_id": run.id,
        "run_number": run.number,
        "status": run.status.as_str(),
        "workflow": run.workflow_path,
        "branch": branch,
        "ref": run.git_ref,
        "commit": run.commit_sha,
        "commit_title": run.commit_title,
        "trigger": run.event,
        "actor": run.actor,
        "message": run.message,
        "url": url,
        "created_at_ms": run.created_at,
        "finished_at_ms": run.finished_at,
    })
}

/// Slack's mrkdwn escapes: `&`, `<`, `>`.
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

// ---------- badges ----------

/// What a badge says of a repository's newest run on a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadgeState {
    Passing,
    Failing,
    Running,
    Cancelled,
    None,
}

impl BadgeState {
    fn of(status: Option<RunStatus>) -> BadgeState {
        match status {
            None => BadgeState::None,
            Some(RunStatus::Success) => BadgeState::Passing,
            Some(RunStatus::Failed) => BadgeState::Failing,
            Some(RunStatus::Cancelled) => BadgeState::Cancelled,
            Some(RunStatus::Queued | RunStatus::Running | RunStatus::Cancelling) => BadgeState::Running,
        }
    }

    fn text(self) -> &'static str {
        match self {
            BadgeState::Passing => "passing",
            BadgeState::Failing => "failing",
            BadgeState::Running => "running",
            BadgeState::Cancelled => "cancelled",
            BadgeState::None => "none",
        }
    }

    fn color(self) -> &'static str {
        match self {
            BadgeState::Passing => "#1a7f37",
            BadgeState::Failing => "#cf222e",
            BadgeState::Running => "#0969da",
            BadgeState::Cancelled | BadgeState::None => "#6e7781",
        }
    }
}

/// The workflow paths a badge's `workflow=` names: a path
/// (`.kiln/ci.yaml`), a file name (`ci.yaml`) or a bare name (`ci`).
fn workflow_paths(w: &str) -> ApiResult<Vec<String>> {
    let w = w.trim();
    let ok = !w.is_empty()
        && w.len() <= 200
        && !w.contains("..")
        && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !ok {
        return Err(ApiErr::bad_request(format!(
            "`{w}` is not a workflow; give its name (ci), file (ci.yaml) or path (.kiln/ci.yaml)"
        )));
    }
    Ok(if w.contains('/') {
        vec![w.to_string()]
    } else if w.ends_with(".yaml") || w.ends_with(".yml") {
        vec![format!(".kiln/{w}")]
    } else {
        vec![format!(".kiln/{w}.yaml"), format!(".kiln/{w}.yml")]
    })
}

/// `GET /v1/repos/{repo}/badge.svg?workflow=&branch=`: the SVG of the
/// newest run of `workflow` (default: any) on `branch` (default: the
/// repository's default branch). `reader`: whether the caller's token may
/// read the repository; without it only a public repository's badge is
/// served, and a private one reads as not found (its existence does not
/// leak).
pub(crate) async fn badge(
    state: &AppState,
    repo: &str,
    workflow: Option<&str>,
    branch: Option<&str>,
    reader: impl FnOnce(&str) -> bool,
) -> ApiResult<String> {
    let hidden = || ApiErr::not_found(format!("no repository `{repo}` (or its badge is not public)"));
    let repo = match state.store.get_repo(repo).await {
        Ok(r) => r,
        Err(StoreError::NotFound(_)) => return Err(hidden()),
        Err(e) => return Err(e.into()),
    };
    if !repo.public && !reader(&repo.id) {
        return Err(hidden());
    }
    let paths = workflow.filter(|w| !w.is_empty()).map(workflow_paths).transpose()?.unwrap_or_default();
    let branch = branch.map(str::trim).filter(|b| !b.is_empty()).unwrap_or(&repo.forge.default_branch);
    let status = state.store.badge_status(&repo.id, branch, &paths).await?;
    Ok(svg("kiln", BadgeState::of(status)))
}

/// A flat badge, `label | state`, with its text for assistive technology.
fn svg(label: &str, state: BadgeState) -> String {
    // Verdana 11px averages about 7px a character; 6px padding each side.
    let width = |s: &str| 12 + 7 * s.chars().count();
    let value = state.text();
    let (lw, vw) = (width(label), width(value));
    let total = lw + vw;
    format!(
        concat!(
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="20" role="img" aria-label="{label}: {value}">"##,
            r##"<title>{label}: {value}</title>"##,
            r##"<rect width="{lw}" height="20" fill="#555"/>"##,
            r##"<rect x="{lw}" width="{vw}" height="20" fill="{color}"/>"##,
            r##"<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">"##,
            r##"<text x="{lx}" y="14">{label}</text><text x="{vx}" y="14">{value}</text></g></svg>"##,
        ),
        total = total,
        lw = lw,
        vw = vw,
        lx = lw / 2,
        vx = lw + vw / 2,
        label = label,
        value = value,
        color = state.color(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_the_body_in_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn badge_workflows_are_names_files_or_paths() {
        assert_eq!(workflow_paths("ci").unwrap(), vec![".kiln/ci.yaml", ".kiln/ci.yml"]);
        assert_eq!(workflow_paths("ci.yml").unwrap(), vec![".kiln/ci.yml"]);
        assert_eq!(workflow_paths(".kiln/release.yaml").unwrap(), vec![".kiln/release.yaml"]);
        for bad in ["../x", "a b", "<svg>", ""] {
            assert!(workflow_paths(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn badges_are_labelled_svg() {
        let s = svg("kiln", BadgeState::of(Some(RunStatus::Failed)));
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{s}");
        assert!(s.contains(r#"role="img" aria-label="kiln: failing""#), "{s}");
        assert!(s.contains("<title>kiln: failing</title>"), "{s}");
        assert!(s.contains("#cf222e"), "{s}");
        assert_eq!(BadgeState::of(None).text(), "none");
        assert_eq!(BadgeState::of(Some(RunStatus::Cancelling)).text(), "running");
        assert_eq!(BadgeState::of(Some(RunStatus::Success)).text(), "passing");
    }

    #[test]
    fn urls_are_http_or_https_without_credentials() {
        assert!(check_url("https://hooks.example.com/kiln?x=1").is_ok());
        assert!(check_url("http://127.0.0.1:8080/").is_ok());
        let msg = |u: &str| check_url(u).unwrap_err().message;
        assert_eq!(
            msg("ftp://example.com/x"),
            "`ftp://example.com/x`: a notification URL is http:// or https://, not ftp:"
        );
        assert!(msg("https://user:pw@example.com/").contains("carries no credentials"));
        assert!(msg("example.com/hook").contains("is not a URL"));
    }

    #[test]
    fn slack_text_is_escaped() {
        assert_eq!(slack_escape("a<b>&c"), "a&lt;b&gt;&amp;c");
        assert_eq!(workflow_name(".kiln/ci.yaml"), "ci");
        assert_eq!(branch_of(Some("refs/heads/main")).as_deref(), Some("main"));
        assert_eq!(branch_of(Some("refs/tags/v1")), None);
    }
}
