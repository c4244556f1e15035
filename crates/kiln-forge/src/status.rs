//! Commit statuses: Kiln's results reported back to the forge.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Forge;

/// Where statuses go.
#[derive(Clone)]
pub struct StatusTarget {
    pub forge: Forge,
    /// From [`api_url`].
    pub api_url: String,
    /// `owner/name`; GitLab: the project path (`group/sub/name`) or its
    /// numeric id.
    pub repo: String,
    pub token: String,
}

impl fmt::Debug for StatusTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusTarget")
            .field("forge", &self.forge)
            .field("api_url", &self.api_url)
            .field("repo", &self.repo)
            .field("token", &"[redacted]")
            .finish()
    }
}

/// The API base URL for a forge:
///
/// * GitHub: `https://api.github.com` by default; a GitHub Enterprise URL
///   (`https://HOST/api/v3`) is used as given, and `https://github.com` is
///   taken to mean `https://api.github.com`;
/// * GitLab: the instance URL, `https://gitlab.com` by default;
/// * Gitea/Forgejo: the instance URL, which must be configured.
///
/// A trailing `/` is trimmed, as is a trailing `/api/v4` (GitLab) or
/// `/api/v1` (Gitea), since the paths are added by [`post_status`]. Only
/// `http://` and `https://` URLs without a query or fragment are accepted.
pub fn api_url(forge: Forge, configured: Option<&str>) -> Result<String, String> {
    let configured = configured.map(str::trim).filter(|s| !s.is_empty());
    let url = match (forge, configured) {
        (Forge::Github, None) => return Ok("https://api.github.com".to_owned()),
        (Forge::Gitlab, None) => return Ok("https://gitlab.com".to_owned()),
        (Forge::Gitea, None) => {
            return Err("a Gitea/Forgejo forge needs its instance URL".to_owned());
        }
        (_, Some(url)) => url,
    };
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{forge} URL {url:?} must start with https:// or http://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{forge} URL {url:?} has no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#') {
        return Err(format!("{forge} URL {url:?} must not contain spaces, a query or a fragment"));
    }
    let mut url = url.trim_end_matches('/');
    let suffix = match forge {
        Forge::Github => None,
        Forge::Gitlab => Some("/api/v4"),
        Forge::Gitea => Some("/api/v1"),
    };
    if let Some(s) = suffix {
        url = url.strip_suffix(s).unwrap_or(url).trim_end_matches('/');
    }
    if forge == Forge::Github && (url == "https://github.com" || url == "https://www.github.com") {
        return Ok("https://api.github.com".to_owned());
    }
    Ok(url.to_owned())
}

/// Kiln's view of a commit's state, mapped to each forge's words by
/// [`post_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitState {
    Pending,
    Running,
    Success,
    Failure,
    Cancelled,
    Error,
}

impl CommitState {
    /// The forge's word for this state.
    ///
    /// GitHub and Gitea have no "running" (→ `pending`) and no "cancelled"
    /// (→ `error`, with the description saying so; Gitea's `warning` is not
    /// used, since a cancelled build has not passed). GitLab has both, and
    /// no "error" (→ `failed`).
    pub fn forge_word(self, forge: Forge) -> &'static str {
        use CommitState::*;
        match (forge, self) {
            (Forge::Gitlab, Pending) => "pending",
            (Forge::Gitlab, Running) => "running",
            (Forge::Gitlab, Success) => "success",
            (Forge::Gitlab, Failure | Error) => "failed",
            (Forge::Gitlab, Cancelled) => "canceled",
            (_, Pending | Running) => "pending",
            (_, Success) => "success",
            (_, Failure) => "failure",
            (_, Cancelled | Error) => "error",
        }
    }
}

/// A status that was not posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PostError {
    /// Worth trying again later: a connection error, a timeout, 429, 5xx, or
    /// a rate-limited 403.
    pub retryable: bool,
    /// The forge, repository, HTTP status and a short excerpt of the answer;
    /// never the token.
    pub message: String,
}

/// GitHub's limit on a status description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 140;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const EXCERPT_CHARS: usize = 200;

/// Post one commit status (see [`CommitState::forge_word`] for the states).
/// The description is cut to 140 characters. `target_url` is omitted when
/// `None`. Each request times out after 30 seconds.
///
/// GitLab refuses to set a status to the state it already has (`400 Cannot
/// transition status via ...`); that answer counts as success, so a retried
/// post is harmless.
pub async fn post_status(
    client: &reqwest::Client,
    target: &StatusTarget,
    sha: &str,
    context: &str,
    state: CommitState,
    description: &str,
    target_url: Option<&str>,
) -> Result<(), PostError> {
    let fail = |message: String| PostError { retryable: false, message: redact(message, &target.token) };
    let forge = target.forge;
    if !((sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(fail(format!("{forge} status: {sha:?} is not a commit id")));
    }
    if context.is_empty() {
        return Err(fail(format!("{forge} status: the context is empty")));
    }
    if target.token.is_empty() {
        return Err(fail(format!("{forge} status: no token is configured")));
    }
    let base = target.api_url.trim_end_matches('/');
    let word = state.forge_word(forge);
    let description = describe(forge, state, description);
    let (url, body, auth_name, auth_value) = match forge {
        Forge::Github | Forge::Gitea => {
            let (owner, name) = owner_name(&target.repo).map_err(|m| fail(format!("{forge} status: {m}")))?;
            let mut body = json!({ "state": word, "description": description, "context": context });
            if let Some(u) = target_url {
                body["target_url"] = json!(u);
            }
            if forge == Forge::Github {
                (
                    format!("{base}/repos/{owner}/{name}/statuses/{sha}"),
                    body,
                    "authorization",
                    format!("Bearer {}", target.token),
                )
            } else {
                (
                    format!("{base}/api/v1/repos/{owner}/{name}/statuses/{sha}"),
                    body,
                    "authorization",
                    format!("token {}", target.token),
                )
            }
        }
        Forge::Gitlab => {
            let project = gitlab_project(&target.repo).map_err(|m| fail(format!("{forge} status: {m}")))?;
            let mut body = json!({ "state": word, "name": context, "description": description });
            if let Some(u) = target_url {
                body["target_url"] = json!(u);
            }
            (format!("{base}/api/v4/projects/{project}/statuses/{sha}"), body, "private-token", target.token.clone())
        }
    };
    let mut auth = http::HeaderValue::from_str(&auth_value)
        .map_err(|_| fail(format!("{forge} status: the token is not a valid header value")))?;
    auth.set_sensitive(true);
    let mut req = client
        .post(&url)
        .timeout(REQUEST_TIMEOUT)
        .header(auth_name, auth)
        .header("user-agent", concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .json(&body);
    if forge == Forge::Github {
        req = req.header("accept", "application/vnd.github+json").header("x-github-api-version", "2022-11-28");
    } else {
        req = req.header("accept", "application/json");
    }
    let what = format!("{forge} status for {}@{sha}", target.repo);
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return Err(PostError {
                retryable: true,
                message: redact(format!("{what}: request failed: {}", error_chain(&e)), &target.token),
            });
        }
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let rate_limited = resp.headers().get("x-ratelimit-remaining").is_some_and(|v| v.as_bytes() == b"0");
    let text = resp.text().await.unwrap_or_default();
    if forge == Forge::Gitlab && status.as_u16() == 400 && text.contains("Cannot transition status") {
        return Ok(());
    }
    let code = status.as_u16();
    let retryable = status.is_server_error()
        || code == 429
        || (code == 403 && (rate_limited || text.to_ascii_lowercase().contains("rate limit")));
    Err(PostError { retryable, message: redact(format!("{what}: HTTP {code}: {}", excerpt(&text)), &target.token) })
}

/// The description, saying "cancelled" where the forge's word does not, cut
/// to [`MAX_DESCRIPTION_CHARS`] on a character boundary.
fn describe(forge: Forge, state: CommitState, description: &str) -> String {
    let d = description.trim();
    let d = if state == CommitState::Cancelled && forge != Forge::Gitlab && !d.to_ascii_lowercase().contains("cancel") {
        if d.is_empty() { "Cancelled".to_owned() } else { format!("Cancelled: {d}") }
    } else {
        d.to_owned()
    };
    truncate_chars(&d, MAX_DESCRIPTION_CHARS)
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some(_) => {
            // Leave room for the ellipsis.
            let cut = s.char_indices().nth(max - 1).map_or(s.len(), |(i, _)| i);
            format!("{}…", &s[..cut])
        }
    }
}

fn excerpt(text: &str) -> String {
    let one_line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let t = one_line.trim();
    if t.is_empty() { "(empty body)".to_owned() } else { truncate_chars(t, EXCERPT_CHARS) }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

fn redact(message: String, token: &str) -> String {
    if token.is_empty() { message } else { message.replace(token, "[redacted]") }
}

fn safe_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn owner_name(repo: &str) -> Result<(&str, &str), String> {
    match repo.split_once('/') {
        Some((owner, name)) if safe_segment(owner) && safe_segment(name) => Ok((owner, name)),
        _ => Err(format!("repository {repo:?} is not owner/name")),
    }
}

/// A GitLab project id, or its path url-encoded as one path segment.
fn gitlab_project(repo: &str) -> Result<String, String> {
    if !repo.is_empty() && repo.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(repo.to_owned());
    }
    let segments: Vec<&str> = repo.split('/').collect();
    if segments.len() < 2 || !segments.iter().all(|s| safe_segment(s)) {
        return Err(format!("project {repo:?} is neither a numeric id nor a group/name path"));
    }
    // Segments hold only unreserved characters, so encoding '/' suffices.
    Ok(segments.join("%2F"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_is_on_char_boundaries() {
        let long = "é".repeat(200);
        let t = truncate_chars(&long, 140);
        assert_eq!(t.chars().count(), 140);
        assert!(t.ends_with('…'));
        assert_eq!(truncate_chars("short", 140), "short");
        let exact = "x".repeat(140);
        assert_eq!(truncate_chars(&exact, 140), exact);
    }

    #[test]
    fn cancelled_descriptions_say_so() {
        assert_eq!(describe(Forge::Github, CommitState::Cancelled, ""), "Cancelled");
        assert_eq!(describe(Forge::Gitea, CommitState::Cancelled, "by alice"), "Cancelled: by alice");
        assert_eq!(describe(Forge::Github, CommitState::Cancelled, "Build cancelled"), "Build cancelled");
        assert_eq!(describe(Forge::Gitlab, CommitState::Cancelled, "by alice"), "by alice");
    }

    #[test]
    fn repo_forms() {
        assert_eq!(owner_name("o/n"), Ok(("o", "n")));
        assert!(owner_name("o/n/x").is_err());
        assert!(owner_name("../n").is_err());
        assert!(owner_name("o").is_err());
        assert_eq!(gitlab_project("123").unwrap(), "123");
        assert_eq!(gitlab_project("g/sub/n").unwrap(), "g%2Fsub%2Fn");
        assert!(gitlab_project("g/../n").is_err());
        assert!(gitlab_project("g/n?x").is_err());
    }

    #[test]
    fn api_urls() {
        assert_eq!(api_url(Forge::Github, None).unwrap(), "https://api.github.com");
        assert_eq!(api_url(Forge::Github, Some("https://github.com/")).unwrap(), "https://api.github.com");
        assert_eq!(
            api_url(Forge::Github, Some("https://ghe.example.com/api/v3/")).unwrap(),
            "https://ghe.example.com/api/v3"
        );
        assert_eq!(api_url(Forge::Gitlab, None).unwrap(), "https://gitlab.com");
        assert_eq!(api_url(Forge::Gitlab, Some("https://git.example.com/api/v4/")).unwrap(), "https://git.example.com");
        assert!(api_url(Forge::Gitea, None).is_err());
        assert_eq!(api_url(Forge::Gitea, Some("http://gitea.local:3000/")).unwrap(), "http://gitea.local:3000");
        assert!(api_url(Forge::Gitea, Some("ftp://x")).is_err());
        assert!(api_url(Forge::Gitea, Some("https://x/?a=b")).is_err());
        assert!(api_url(Forge::Gitea, Some("https://")).is_err());
    }

    #[test]
    fn forge_words() {
        use CommitState::*;
        let all = [Pending, Running, Success, Failure, Cancelled, Error];
        let words = |f| all.map(|s| s.forge_word(f));
        assert_eq!(words(Forge::Github), ["pending", "pending", "success", "failure", "error", "error"]);
        assert_eq!(words(Forge::Gitlab), ["pending", "running", "success", "failed", "canceled", "failed"]);
        assert_eq!(words(Forge::Gitea), ["pending", "pending", "success", "failure", "error", "error"]);
    }
}
