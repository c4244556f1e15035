//! Webhook payloads, normalized across the forges.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Forge, ParseError};

/// What a delivery asks of Kiln.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForgeEvent {
    Push(PushEvent),
    PullRequest(PullRequestEvent),
    /// GitHub's `ping`, sent when a hook is created.
    Ping,
    /// A well-formed delivery that needs no build (a deleted ref, a closed
    /// pull request, an event Kiln does not handle).
    Ignored {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushEvent {
    /// The full ref: `refs/heads/main`, `refs/tags/v1`.
    pub git_ref: String,
    /// The ref's previous commit; `None` when the ref is new.
    pub before: Option<String>,
    /// The commit to build (lowercase hex, 40 or 64 digits).
    pub after: String,
    /// Who pushed (login / username).
    pub actor: String,
    /// The paths added, modified or removed by the pushed commits, when the
    /// payload lists them all; `None` when it does not (no commit list, a
    /// truncated list, a new ref or a forced push), meaning "unknown".
    pub changed: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequestEvent {
    pub number: u64,
    /// `opened`, `synchronize` or `reopened`.
    pub action: String,
    pub head_sha: String,
    /// The source branch name.
    pub head_ref: String,
    /// The target branch name (without `refs/heads/`).
    pub base_ref: String,
    pub base_sha: Option<String>,
    /// The head repository differs from the base repository (or is gone).
    pub fork: bool,
    /// GitHub only: whether the author is an owner, member or collaborator.
    pub author_write_access: Option<bool>,
    pub actor: String,
    /// Where the head commit can be fetched from the base repository.
    pub fetch_ref: String,
    pub title: String,
}

/// Parse a verified payload for an event name as [`crate::delivery_meta`]
/// read it. Deleted refs, pull request actions other than opened, synchronize
/// and reopened, and unknown events are [`ForgeEvent::Ignored`]; malformed
/// JSON or a supported event missing a required field is an error naming it.
pub fn parse(forge: Forge, event: &str, body: &[u8]) -> Result<ForgeEvent, ParseError> {
    match (forge, event) {
        (Forge::Github, "ping") => {
            json(body)?;
            Ok(ForgeEvent::Ping)
        }
        (Forge::Github, "push") => github_push(&json(body)?),
        (Forge::Github, "pull_request") => github_pull_request(&json(body)?),
        (Forge::Gitlab, "Push Hook" | "Tag Push Hook") => gitlab_push(&json(body)?),
        (Forge::Gitlab, "Merge Request Hook") => gitlab_merge_request(&json(body)?),
        (Forge::Gitea, "push") => gitea_push(&json(body)?),
        // X-Gitea-Event is `pull_request` for every pull request delivery;
        // the finer X-Gitea-Event-Type (`pull_request_sync` for new commits)
        // is accepted too, in case a server passes that instead.
        (Forge::Gitea, "pull_request" | "pull_request_sync") => gitea_pull_request(&json(body)?),
        // Gitea/Forgejo announce branch and tag deletions as their own event.
        (Forge::Gitea, "delete") => {
            json(body)?;
            Ok(ignored("ref deleted"))
        }
        (_, other) => Ok(ignored(format!("event {other} is not supported"))),
    }
}

fn ignored(reason: impl Into<String>) -> ForgeEvent {
    ForgeEvent::Ignored { reason: reason.into() }
}

fn json(body: &[u8]) -> Result<Value, ParseError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ParseError::new(format!("payload is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ParseError::new("payload is not a JSON object"));
    }
    Ok(v)
}

/// The repository a delivery names: the forge's numeric id and its full
/// name (`owner/name`; GitLab: the project's path with namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoIdentity {
    pub id: Option<u64>,
    pub full_name: Option<String>,
}

impl RepoIdentity {
    /// Whether this is the repository configured as `forge_repo`: by id when
    /// `forge_repo` is a number (GitLab's project id), else by full name,
    /// compared without regard to ASCII case (the forges treat names so).
    pub fn matches(&self, forge_repo: &str) -> bool {
        let configured = forge_repo.trim().trim_matches('/');
        if !configured.is_empty() && configured.bytes().all(|b| b.is_ascii_digit()) {
            return self.id.is_some_and(|id| id.to_string() == configured);
        }
        self.full_name.as_deref().is_some_and(|n| !configured.is_empty() && n.eq_ignore_ascii_case(configured))
    }

    /// How the delivery named it, for messages.
    pub fn describe(&self) -> String {
        match (&self.full_name, self.id) {
            (Some(n), Some(id)) => format!("{n} (id {id})"),
            (Some(n), None) => n.clone(),
            (None, Some(id)) => format!("id {id}"),
            (None, None) => "no repository".into(),
        }
    }
}

/// The repository a delivery's payload names (GitHub and Gitea:
/// `repository.id` and `repository.full_name`; GitLab: `project.id` or
/// `project_id`, and `project.path_with_namespace`). `None` when the payload
/// names none or is not a JSON object.
pub fn repository(forge: Forge, body: &[u8]) -> Option<RepoIdentity> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let (id, name) = match forge {
        Forge::Github | Forge::Gitea => {
            (field(&v, "repository.id").and_then(Value::as_u64), field(&v, "repository.full_name"))
        }
        Forge::Gitlab => (
            field(&v, "project.id").or_else(|| field(&v, "project_id")).and_then(Value::as_u64),
            field(&v, "project.path_with_namespace"),
        ),
    };
    let full_name = name.and_then(Value::as_str).filter(|s| !s.is_empty() && s.len() <= MAX_TEXT).map(str::to_owned);
    (id.is_some() || full_name.is_some()).then_some(RepoIdentity { id, full_name })
}

// ---- field access, each error naming the field by its dotted path ----

fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for key in path.split('.') {
        cur = cur.get(key)?;
    }
    if cur.is_null() { None } else { Some(cur) }
}

fn missing(path: &str) -> ParseError {
    ParseError::new(format!("field {path} is missing"))
}

fn invalid(path: &str, what: &str) -> ParseError {
    ParseError::new(format!("field {path} {what}"))
}

const MAX_TEXT: usize = 4096;

fn text(v: &Value, path: &str) -> Result<String, ParseError> {
    let s = field(v, path).ok_or_else(|| missing(path))?.as_str().ok_or_else(|| invalid(path, "is not a string"))?;
    if s.is_empty() {
        return Err(invalid(path, "is empty"));
    }
    if s.len() > MAX_TEXT {
        return Err(invalid(path, "is too long"));
    }
    Ok(s.to_owned())
}

/// The first of several fields that is present.
fn text_any(v: &Value, paths: &[&str]) -> Result<String, ParseError> {
    for p in paths {
        if field(v, p).is_some() {
            return text(v, p);
        }
    }
    Err(missing(&paths.join(" or ")))
}

fn opt_text(v: &Value, path: &str) -> Result<Option<String>, ParseError> {
    match field(v, path) {
        None => Ok(None),
        Some(_) => text(v, path).map(Some),
    }
}

fn int(v: &Value, path: &str) -> Result<u64, ParseError> {
    field(v, path).ok_or_else(|| missing(path))?.as_u64().ok_or_else(|| invalid(path, "is not a non-negative integer"))
}

fn flag(v: &Value, path: &str) -> Result<bool, ParseError> {
    match field(v, path) {
        None => Ok(false),
        Some(b) => b.as_bool().ok_or_else(|| invalid(path, "is not a boolean")),
    }
}

/// A ref or branch name: no control characters, no NUL.
fn git_name(v: &Value, path: &str) -> Result<String, ParseError> {
    let s = text(v, path)?;
    if s.chars().any(char::is_control) {
        return Err(invalid(path, "contains control characters"));
    }
    Ok(s)
}

fn full_ref(v: &Value, path: &str) -> Result<String, ParseError> {
    let s = git_name(v, path)?;
    if !s.starts_with("refs/") {
        return Err(invalid(path, "is not a full ref (refs/...)"));
    }
    Ok(s)
}

fn branch(v: &Value, path: &str) -> Result<String, ParseError> {
    let s = git_name(v, path)?;
    let s = s.strip_prefix("refs/heads/").unwrap_or(&s);
    if s.is_empty() {
        return Err(invalid(path, "is empty"));
    }
    Ok(s.to_owned())
}

fn is_zero_sha(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == b'0')
}

fn valid_sha(path: &str, s: &str) -> Result<String, ParseError> {
    if (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(invalid(path, "is not a 40 or 64 digit hex commit id"))
    }
}

fn sha(v: &Value, path: &str) -> Result<String, ParseError> {
    valid_sha(path, &text(v, path)?)
}

/// `None` when absent or all zeros (a new ref).
fn before_sha(v: &Value, path: &str) -> Result<Option<String>, ParseError> {
    match opt_text(v, path)? {
        None => Ok(None),
        Some(s) if is_zero_sha(&s) => Ok(None),
        Some(s) => valid_sha(path, &s).map(Some),
    }
}

/// GitHub lists at most this many commits in a push payload.
const GITHUB_MAX_COMMITS: usize = 2048;

/// The union of `added`, `modified` and `removed` over `commits`, or `None`
/// when there is no (non-empty) list, `total` says it was truncated, or it is
/// as long as GitHub's cap (so possibly truncated).
fn changed_paths(v: &Value, total_field: Option<&str>) -> Result<Option<Vec<String>>, ParseError> {
    let Some(commits) = field(v, "commits") else {
        return Ok(None);
    };
    let commits = commits.as_array().ok_or_else(|| invalid("commits", "is not an array"))?;
    if commits.is_empty() || commits.len() >= GITHUB_MAX_COMMITS {
        return Ok(None);
    }
    if let Some(total_field) = total_field
        && let Some(total) = field(v, total_field)
    {
        let total = total.as_u64().ok_or_else(|| invalid(total_field, "is not a non-negative integer"))?;
        if total > commits.len() as u64 {
            return Ok(None);
        }
    }
    let mut set = BTreeSet::new();
    for (i, c) in commits.iter().enumerate() {
        for kind in ["added", "modified", "removed"] {
            let Some(list) = c.get(kind).filter(|l| !l.is_null()) else {
                // A commit without file lists: the union is unknown.
                return Ok(None);
            };
            let list = list.as_array().ok_or_else(|| invalid(&format!("commits.{i}.{kind}"), "is not an array"))?;
            for p in list {
                let p = p.as_str().ok_or_else(|| invalid(&format!("commits.{i}.{kind}"), "holds a non-string"))?;
                set.insert(p.to_owned());
            }
        }
    }
    Ok(Some(set.into_iter().collect()))
}

/// The common push shape (all three forges follow GitHub's field names).
fn push(
    v: &Value,
    actor_fields: &[&str],
    deleted_field: Option<&str>,
    total_field: Option<&str>,
) -> Result<ForgeEvent, ParseError> {
    let git_ref = full_ref(v, "ref")?;
    let after_raw = text(v, "after")?;
    let deleted = match deleted_field {
        Some(f) => flag(v, f)?,
        None => false,
    };
    if deleted || is_zero_sha(&after_raw) {
        return Ok(ignored("ref deleted"));
    }
    let after = valid_sha("after", &after_raw)?;
    let before = before_sha(v, "before")?;
    let actor = text_any(v, actor_fields)?;
    let forced = flag(v, "forced")?;
    let changed = if before.is_none() || forced { None } else { changed_paths(v, total_field)? };
    Ok(ForgeEvent::Push(PushEvent { git_ref, before, after, actor, changed }))
}

// ---- GitHub ----

fn github_push(v: &Value) -> Result<ForgeEvent, ParseError> {
    push(v, &["sender.login", "pusher.name"], Some("deleted"), None)
}

fn github_pull_request(v: &Value) -> Result<ForgeEvent, ParseError> {
    let action = text(v, "action")?;
    if !matches!(action.as_str(), "opened" | "synchronize" | "reopened") {
        return Ok(ignored(format!("pull_request action {action} is ignored")));
    }
    let number = int(v, "number").or_else(|_| int(v, "pull_request.number"))?;
    let pr = field(v, "pull_request").ok_or_else(|| missing("pull_request"))?;
    let base_repo =
        repo_identity(pr, "base.repo", "pull_request.base.repo")?.ok_or_else(|| missing("pull_request.base.repo"))?;
    // The head repository is null when the fork was deleted.
    let head_repo = repo_identity(pr, "head.repo", "pull_request.head.repo")?;
    let author_write_access =
        opt_text(pr, "author_association")?.map(|a| matches!(a.as_str(), "OWNER" | "MEMBER" | "COLLABORATOR"));
    Ok(ForgeEvent::PullRequest(PullRequestEvent {
        number,
        head_sha: sha(pr, "head.sha").map_err(|e| prefixed(e, "pull_request."))?,
        head_ref: branch(pr, "head.ref").map_err(|e| prefixed(e, "pull_request."))?,
        base_ref: branch(pr, "base.ref").map_err(|e| prefixed(e, "pull_request."))?,
        base_sha: opt_sha(pr, "base.sha").map_err(|e| prefixed(e, "pull_request."))?,
        fork: head_repo.as_ref() != Some(&base_repo),
        author_write_access,
        actor: text_any(v, &["sender.login", "pull_request.user.login"])?,
        fetch_ref: format!("refs/pull/{number}/head"),
        title: text(pr, "title").map_err(|e| prefixed(e, "pull_request."))?,
        action,
    }))
}

fn opt_sha(v: &Value, path: &str) -> Result<Option<String>, ParseError> {
    match opt_text(v, path)? {
        None => Ok(None),
        Some(s) => valid_sha(path, &s).map(Some),
    }
}

/// Name a nested field by its full path in errors.
fn prefixed(e: ParseError, prefix: &str) -> ParseError {
    ParseError::new(e.message.replacen("field ", &format!("field {prefix}"), 1))
}

/// A repository's identity: its numeric id, else its full name.
fn repo_identity(pr: &Value, rel: &str, full: &str) -> Result<Option<String>, ParseError> {
    let Some(repo) = field(pr, rel) else {
        return Ok(None);
    };
    if let Some(id) = repo.get("id").and_then(Value::as_u64) {
        return Ok(Some(format!("id:{id}")));
    }
    match repo.get("full_name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => Ok(Some(format!("name:{name}"))),
        _ => Err(missing(&format!("{full}.id"))),
    }
}

// ---- GitLab ----

fn gitlab_push(v: &Value) -> Result<ForgeEvent, ParseError> {
    push(v, &["user_username"], None, Some("total_commits_count"))
}

fn gitlab_merge_request(v: &Value) -> Result<ForgeEvent, ParseError> {
    let attrs = field(v, "object_attributes").ok_or_else(|| missing("object_attributes"))?;
    let p = |e: ParseError| prefixed(e, "object_attributes.");
    let gl_action = text(attrs, "action").map_err(p)?;
    let action = match gl_action.as_str() {
        "open" => "opened",
        "reopen" => "reopened",
        "update" if field(attrs, "oldrev").is_some() => "synchronize",
        "update" => {
            return Ok(ignored("merge request updated without new commits"));
        }
        other => return Ok(ignored(format!("merge request action {other} is ignored"))),
    };
    let number = int(attrs, "iid").map_err(p)?;
    let source = int(attrs, "source_project_id").map_err(p)?;
    let target = int(attrs, "target_project_id").map_err(p)?;
    Ok(ForgeEvent::PullRequest(PullRequestEvent {
        number,
        action: action.to_owned(),
        head_sha: sha(attrs, "last_commit.id").map_err(p)?,
        head_ref: branch(attrs, "source_branch").map_err(p)?,
        base_ref: branch(attrs, "target_branch").map_err(p)?,
        // The hook carries no base commit (diff_refs only in some versions).
        base_sha: opt_sha(attrs, "diff_refs.base_sha").map_err(p)?,
        fork: source != target,
        author_write_access: None,
        actor: text(v, "user.username")?,
        fetch_ref: format!("refs/merge-requests/{number}/head"),
        title: text(attrs, "title").map_err(p)?,
    }))
}

// ---- Gitea / Forgejo ----

fn gitea_push(v: &Value) -> Result<ForgeEvent, ParseError> {
    push(v, &["pusher.login", "pusher.username", "sender.login"], None, Some("total_commits"))
}

fn gitea_pull_request(v: &Value) -> Result<ForgeEvent, ParseError> {
    let gitea_action = text(v, "action")?;
    let action = match gitea_action.as_str() {
        "opened" => "opened",
        "reopened" => "reopened",
        "synchronized" => "synchronize",
        other => return Ok(ignored(format!("pull_request action {other} is ignored"))),
    };
    let number = int(v, "number").or_else(|_| int(v, "pull_request.number"))?;
    let pr = field(v, "pull_request").ok_or_else(|| missing("pull_request"))?;
    let p = |e: ParseError| prefixed(e, "pull_request.");
    let base_repo =
        repo_identity(pr, "base.repo", "pull_request.base.repo")?.ok_or_else(|| missing("pull_request.base.repo"))?;
    let head_repo = repo_identity(pr, "head.repo", "pull_request.head.repo")?;
    Ok(ForgeEvent::PullRequest(PullRequestEvent {
        number,
        action: action.to_owned(),
        head_sha: sha(pr, "head.sha").map_err(p)?,
        head_ref: branch(pr, "head.ref").map_err(p)?,
        base_ref: branch(pr, "base.ref").map_err(p)?,
        base_sha: opt_sha(pr, "base.sha").map_err(p)?,
        fork: head_repo.as_ref() != Some(&base_repo),
        author_write_access: None,
        actor: text_any(v, &["sender.login", "sender.username", "pull_request.user.login"])?,
        fetch_ref: format!("refs/pull/{number}/head"),
        title: text(pr, "title").map_err(p)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_errors_name_the_full_path() {
        let body = br#"{"action":"opened","number":1,"pull_request":{"base":{"repo":{"id":1}}}}"#;
        let err = parse(Forge::Github, "pull_request", body).unwrap_err();
        assert_eq!(err.message, "field pull_request.head.sha is missing");
    }
}
