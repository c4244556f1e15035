//! Repositories and their secrets. Secret values go in and, only through
//! an assignment of a trusted run, out (invariant 10); listings show names
//! and update times, never values.

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::state::AppState;
use kiln_api as api;

/// Largest secret value accepted.
pub(crate) const MAX_SECRET: usize = 64 * 1024;

pub(crate) async fn create(state: &AppState, by: &Principal, req: api::CreateRepo) -> ApiResult<api::Repo> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiErr::invalid("repository name must be 1-100 characters of [A-Za-z0-9._-]"));
    }
    // A credential in the URL (issue 39) is taken out of it: the URL is
    // stored and shown without it, the credential sealed like a secret.
    let (clone_url, inline) = kiln_api::giturl::split_credential(req.clone_url.trim());
    kiln_api::giturl::check_clone_url(&clone_url).map_err(|e| ApiErr::invalid(kiln_api::giturl::redact(&e)))?;
    let credential = clone_credential(&clone_url, inline, req.forge.clone_token.as_deref())?;
    let pools = match &req.secret_pools {
        Some(p) => Some(crate::services::access::check_pools(p)?),
        None => None,
    };
    if let Some(s) = &req.webhook_secret {
        check_webhook_secret(s)?;
    }
    let mut forge = apply_forge(kiln_store::RepoForge::default(), &req.forge)?;
    let team = match req.team.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(t) => Some(known_team(state, t).await?),
    };
    if state.store.get_repo(name).await.is_ok() {
        return Err(kiln_store::StoreError::Conflict(format!("repository `{name}` already exists")).into());
    }
    if state.config.probe_clone_urls
        && let Err(e) = crate::git::probe(&crate::git::Remote::new(&clone_url, credential.clone())).await
    {
        return Err(ApiErr::invalid(format!(
            "{e}; nothing was registered: check the URL (a local path must exist on the server's machine and be a \
             git repository)"
        )));
    }
    let mut repo = state.store.create_repo(name, &clone_url, None).await?;
    if let Some(c) = &credential {
        put_clone_credential(state, &repo.id, c).await?;
    }
    if let Some(secret) = &req.webhook_secret {
        let sealed = state.secrets.seal(&repo.id, kiln_store::WEBHOOK_SECRET, secret);
        state.store.set_webhook_secret(&repo.id, Some(&sealed)).await?;
        repo.webhook_secret = Some(sealed);
    }
    if let Some(token) = &req.forge.forge_token {
        forge.forge_token = Some(state.secrets.seal(&repo.id, kiln_store::FORGE_TOKEN, token));
    }
    if forge != kiln_store::RepoForge::default() {
        state.store.set_repo_forge(&repo.id, &forge).await?;
        repo.forge = forge;
    }
    if let Some(pools) = pools {
        state.store.set_secret_pools(&repo.id, &pools).await?;
        repo.secret_pools = pools;
    }
    if let Some(team) = team {
        state.store.set_repo_team(&repo.id, &team).await?;
        repo.team = team;
    }

    let detail = format!(
        "{} secret pools {} forge {} team {}",
        repo.clone_url,
        repo.secret_pools.join(","),
        repo.forge.forge.as_deref().unwrap_or("none"),
        repo.team
    );
    access::audit(state, &by.actor, "repo.create", &repo.name, detail).await?;
    shown(state, repo).await
}

/// `PATCH /v1/repos/{repo}`: change the forge connection, trigger policy,
/// webhook secret, secret pools or whether it is public (its badge served
/// without a token); absent fields keep their value.
pub(crate) async fn update(state: &AppState, by: &Principal, name: &str, req: api::UpdateRepo) -> ApiResult<api::Repo> {
    let repo = state.store.get_repo(name).await?;
    if req.clone_url.is_some() {
        return Err(ApiErr::invalid(
            "the clone URL of a repository cannot be changed (runs and mirrors refer to it); add a new repository",
        ));
    }
    if let Some(s) = &req.webhook_secret
        && !s.is_empty()
    {
        check_webhook_secret(s)?;
    }
    let pools = match &req.secret_pools {
        Some(p) => Some(crate::services::access::check_pools(p)?),
        None => None,
    };
    let mut forge = apply_forge(repo.forge.clone(), &req.forge)?;
    match req.forge.forge_token.as_deref() {
        Some("") => forge.forge_token = None,
        Some(token) => forge.forge_token = Some(state.secrets.seal(&repo.id, kiln_store::FORGE_TOKEN, token)),
        None => {}
    }
    let mut changed = Vec::new();
    match req.forge.clone_token.as_deref() {
        Some("") => {
            state.store.delete_secret(&repo.id, kiln_store::CLONE_CREDENTIAL).await?;
            changed.push("clone credential removed");
        }
        Some(token) => {
            // The username stays what it was (the URL's, or the default).
            let current = stored_credential(state, &repo).await?;
            let (_, inline) = kiln_api::giturl::split_credential(&repo.clone_url);
            let user = current.or(inline).map(|c| c.username);
            let c = kiln_api::giturl::CloneCredential {
                username: user.unwrap_or_else(|| kiln_api::giturl::DEFAULT_TOKEN_USER.into()),
                password: token.to_string(),
            };
            kiln_api::giturl::check_credential(&c).map_err(ApiErr::invalid)?;
            put_clone_credential(state, &repo.id, &c).await?;
            changed.push("clone credential");
        }
        None => {}
    }
    if forge != repo.forge {
        state.store.set_repo_forge(&repo.id, &forge).await?;
        changed.push("forge");
    }
    if let Some(secret) = &req.webhook_secret {
        let sealed = (!secret.is_empty()).then(|| state.secrets.seal(&repo.id, kiln_store::WEBHOOK_SECRET, secret));
        state.store.set_webhook_secret(&repo.id, sealed.as_deref()).await?;
        changed.push("webhook secret");
    }
    if let Some(pools) = pools {
        state.store.set_secret_pools(&repo.id, &pools).await?;
        state.dispatcher.forget_placements();
        changed.push("secret pools");
    }
    if let Some(team) = req.team.as_deref().map(str::trim)
        && team != repo.team
    {
        let team = known_team(state, team).await?;
        state.store.set_repo_team(&repo.id, &team).await?;
        changed.push("team");
    }
    if let Some(public) = req.public
        && public != repo.public
    {
        state.store.set_repo_public(&repo.id, public).await?;
        changed.push(if public { "public" } else { "private" });
    }
    // Schedules follow the new default branch at once.
    state.schedule_indexes.lock().expect("index").remove(&repo.id);
    access::audit(state, &by.actor, "repo.update", &repo.name, changed.join(", ")).await?;
    shown(state, state.store.get_repo(&repo.id).await?).await
}

/// A team that exists (422 naming how to create it otherwise).
async fn known_team(state: &AppState, team: &str) -> ApiResult<String> {
    match state.store.get_team(team).await {
        Ok(t) => Ok(t.name),
        Err(kiln_store::StoreError::NotFound(_)) => {
            Err(ApiErr::invalid(format!("team `{team}` does not exist; create it with `kiln team add {team}`")))
        }
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /v1/repos/{repo}`: forget a repository that has no runs (its
/// secrets, deliveries and schedules with it; its trigger tokens revoked).
pub(crate) async fn delete(state: &AppState, by: &Principal, name: &str) -> ApiResult<api::Repo> {
    let repo = state.store.delete_repo(name).await?;
    state.schedule_indexes.lock().expect("index").remove(&repo.id);
    state.tokens.forget_all();
    access::audit(state, &by.actor, "repo.delete", &repo.name, kiln_api::giturl::redact(&repo.clone_url)).await?;
    Ok(view(repo))
}

/// The credential to store for `url`: a token (`--clone-token-file`) with
/// the URL's username, else the default user; or the one written in the URL.
fn clone_credential(
    url: &str,
    inline: Option<kiln_api::giturl::CloneCredential>,
    token: Option<&str>,
) -> ApiResult<Option<kiln_api::giturl::CloneCredential>> {
    let c = match (token.filter(|t| !t.is_empty()), inline) {
        (Some(t), inline) => Some(kiln_api::giturl::CloneCredential {
            username: inline
                .map(|c| c.username)
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| kiln_api::giturl::DEFAULT_TOKEN_USER.into()),
            password: t.to_string(),
        }),
        (None, inline) => inline,
    };
    if let Some(c) = &c {
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(ApiErr::invalid("a clone token is used only with an http(s) clone URL"));
        }
        kiln_api::giturl::check_credential(c).map_err(ApiErr::invalid)?;
    }
    Ok(c)
}

async fn put_clone_credential(state: &AppState, repo_id: &str, c: &kiln_api::giturl::CloneCredential) -> ApiResult<()> {
    let json = serde_json::to_string(c).map_err(|e| ApiErr::internal(e.to_string()))?;
    let sealed = state.secrets.seal(repo_id, kiln_store::CLONE_CREDENTIAL, &json);
    state.store.put_secret(repo_id, kiln_store::CLONE_CREDENTIAL, &sealed).await?;
    Ok(())
}

/// The repository's stored clone credential, opened.
pub(crate) async fn stored_credential(
    state: &AppState,
    repo: &kiln_store::RepoRecord,
) -> ApiResult<Option<kiln_api::giturl::CloneCredential>> {
    // Read with the repository (`RepoRecord::clone_credential`).
    let Some(stored) = &repo.clone_credential else {
        return Ok(None);
    };
    let json = state
        .secrets
        .open(&repo.id, kiln_store::CLONE_CREDENTIAL, stored)
        .map_err(|e| ApiErr::internal(format!("the clone credential of {} cannot be opened: {e}", repo.name)))?;
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|_| ApiErr::internal(format!("the clone credential of {} is unreadable", repo.name)))
}

/// What the server's git fetches from: the URL and its credential.
pub(crate) async fn remote(state: &AppState, repo: &kiln_store::RepoRecord) -> ApiResult<crate::git::Remote> {
    Ok(crate::git::Remote::new(&repo.clone_url, stored_credential(state, repo).await?))
}

fn check_webhook_secret(s: &str) -> ApiResult<()> {
    if s.len() < 16 || s.len() > 1024 || s.chars().any(char::is_control) {
        return Err(ApiErr::invalid(
            "a webhook secret is 16 to 1024 printable characters (e.g. `openssl rand -hex 32`)",
        ));
    }
    Ok(())
}

/// Apply the settings of a request to `f`, validating each; an empty
/// string clears an optional setting.
fn apply_forge(mut f: kiln_store::RepoForge, s: &api::ForgeSettings) -> ApiResult<kiln_store::RepoForge> {
    fn opt(v: &str) -> Option<String> {
        (!v.trim().is_empty()).then(|| v.trim().to_string())
    }
    if let Some(forge) = &s.forge {
        f.forge = match opt(forge) {
            None => None,
            Some(name) => Some(
                name.parse::<kiln_forge::Forge>()
                    .map_err(|_| ApiErr::invalid(format!("unknown forge `{name}`; use github, gitlab or gitea")))?
                    .as_str()
                    .to_string(),
            ),
        };
    }
    if let Some(url) = &s.forge_url {
        f.forge_url = match opt(url) {
            None => None,
            Some(u) => Some(check_forge_url(&u)?),
        };
    }
    if let Some(r) = &s.forge_repo {
        f.forge_repo = match opt(r) {
            None => None,
            Some(r) => {
                let ok = r.len() <= 200
                    && !r.starts_with('/')
                    && !r.ends_with('/')
                    && !r.contains("..")
                    && r.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
                if !ok {
                    return Err(ApiErr::invalid(format!(
                        "`{r}` is not a forge repository; give it as OWNER/NAME (GitLab: the project path or id)"
                    )));
                }
                Some(r)
            }
        };
    }
    if let Some(t) = &s.forge_token
        && (t.len() > 4096 || t.chars().any(char::is_control))
    {
        return Err(ApiErr::invalid("a forge token is at most 4096 printable characters"));
    }
    if let Some(b) = &s.default_branch {
        let b = b.trim();
        let ok = !b.is_empty()
            && b.len() <= 200
            && !b.starts_with('-')
            && !b.starts_with("refs/")
            && !b.contains("..")
            && !b.chars().any(|c| c.is_control() || " ~^:?*[\\".contains(c));
        if !ok {
            return Err(ApiErr::invalid(format!("`{b}` is not a branch name (without refs/heads/)")));
        }
        f.default_branch = b.to_string();
    }
    if let Some(p) = &s.protected_refs {
        if p.len() > 100 || p.iter().any(|x| x.trim().is_empty() || x.len() > 200) {
            return Err(ApiErr::invalid("protected refs are at most 100 non-empty branch patterns of 200 characters"));
        }
        f.protected_refs = p.iter().map(|x| x.trim().to_string()).collect();
    }
    if let Some(t) = &s.pull_request_trust {
        if !["write-access", "same-repo", "never"].contains(&t.as_str()) {
            return Err(ApiErr::invalid(format!(
                "unknown pull request trust `{t}`; use write-access (default), same-repo or never"
            )));
        }
        f.pull_request_trust = t.clone();
    }
    if let Some(secs) = s.poll_interval_secs {
        if secs > 7 * 24 * 3600 {
            return Err(ApiErr::invalid("the poll interval is at most a week (0 turns polling off)"));
        }
        f.poll_interval_ms = (secs > 0).then_some(secs as i64 * 1000);
    }
    Ok(f)
}

/// A forge API URL: https, or http to a loopback address only (the token
/// would cross the network in clear).
fn check_forge_url(u: &str) -> ApiResult<String> {
    let url = reqwest::Url::parse(u).map_err(|e| ApiErr::invalid(format!("forge URL `{u}`: {e}")))?;
    let host = url.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(ApiErr::invalid(format!(
                "forge URL `{u}` is plain http to another host; the forge token would cross the network in clear: use https"
            )));
        }
        other => return Err(ApiErr::invalid(format!("forge URL `{u}`: scheme {other} is not http(s)"))),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiErr::invalid("a forge URL carries no credentials; use --forge-token-file"));
    }
    Ok(u.trim_end_matches('/').to_string())
}

/// `GET /v1/repos/{repo}/hook-info`.
pub(crate) async fn hook_info(state: &AppState, name: &str) -> ApiResult<api::HookInfo> {
    let repo = state.store.get_repo(name).await?;
    let forge = repo.forge.forge.clone().unwrap_or_else(|| "github".into());
    let events = match forge.as_str() {
        "gitlab" => vec!["Push events".into(), "Tag push events".into(), "Merge request events".into()],
        "gitea" => vec!["push".into(), "pull_request".into()],
        _ => vec!["push".into(), "pull_request".into()],
    };
    Ok(api::HookInfo {
        url: format!("{}/v1/repos/{}/webhooks/{forge}", state.config.base_url(), repo.name),
        repo: repo.name.clone(),
        content_type: "application/json".into(),
        events,
        secret_configured: repo.webhook_secret.is_some(),
        statuses_configured: crate::services::forge_status::reports_statuses(&repo),
        forge,
    })
}

/// `GET /v1/repos/{repo}/deliveries`.
pub(crate) async fn deliveries(state: &AppState, name: &str, limit: Option<u32>) -> ApiResult<Vec<api::Delivery>> {
    let repo = state.store.get_repo(name).await?;
    let list = state.store.list_deliveries(&repo.id, limit.unwrap_or(50).min(500)).await?;
    Ok(list.iter().map(|d| crate::services::webhooks::delivery_view(state, d)).collect())
}

/// The API view of a repository, with whether it has a clone credential.
pub(crate) async fn shown(state: &AppState, r: kiln_store::RepoRecord) -> ApiResult<api::Repo> {
    let names = [kiln_store::CLONE_CREDENTIAL.to_string()];
    let set = !state.store.secret_values(&r.id, &names).await?.is_empty();
    Ok(api::Repo { clone_token_set: set, ..view(r) })
}

pub(crate) fn view(r: kiln_store::RepoRecord) -> api::Repo {
    let clone_token_set = kiln_api::giturl::split_credential(&r.clone_url).1.is_some();
    let f = r.forge;
    api::Repo {
        id: r.id,
        name: r.name,
        // A URL stored with its credential by an older version is shown without it.
        clone_url: kiln_api::giturl::split_credential(&r.clone_url).0,
        created_at_ms: r.created_at,
        secret_pools: r.secret_pools,
        forge: f.forge,
        forge_url: f.forge_url,
        forge_repo: f.forge_repo,
        default_branch: Some(f.default_branch),
        protected_refs: f.protected_refs,
        pull_request_trust: Some(f.pull_request_trust),
        poll_interval_secs: f.poll_interval_ms.map(|ms| (ms / 1000) as u64),
        webhook_secret_set: r.webhook_secret.is_some(),
        forge_token_set: f.forge_token.is_some(),
        clone_token_set,
        public: r.public,
        team: r.team,
    }
}

pub(crate) async fn list(state: &AppState) -> ApiResult<Vec<api::Repo>> {
    let mut out = Vec::new();
    for r in state.store.list_repos().await? {
        out.push(shown(state, r).await?);
    }
    Ok(out)
}

/// A secret name: a letter or `_`, then letters, digits and `_` (it
/// becomes an environment variable).
pub(crate) fn secret_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(crate) async fn put_secret(
    state: &AppState,
    by: &Principal,
    repo: &str,
    name: &str,
    value: &str,
) -> ApiResult<api::SecretInfo> {
    let repo = state.store.get_repo(repo).await?;
    if !secret_name_ok(name) {
        return Err(ApiErr::bad_request(format!(
            "`{name}` is not a valid secret name; use letters, digits and `_`, not starting with a digit"
        )));
    }
    if value.is_empty() || value.len() > MAX_SECRET {
        return Err(ApiErr::bad_request(format!("a secret value is 1 to {MAX_SECRET} bytes")));
    }
    state.store.put_secret(&repo.id, name, &state.secrets.seal(&repo.id, name, value)).await?;
    access::audit(state, &by.actor, "secret.put", &format!("{}/{name}", repo.name), "").await?;
    let updated_at_ms =
        state.store.list_secrets(&repo.id).await?.into_iter().find(|(n, _)| n == name).map_or(0, |(_, t)| t);
    Ok(api::SecretInfo { name: name.to_string(), updated_at_ms })
}

pub(crate) async fn list_secrets(state: &AppState, repo: &str) -> ApiResult<Vec<api::SecretInfo>> {
    let repo = state.store.get_repo(repo).await?;
    Ok(state
        .store
        .list_secrets(&repo.id)
        .await?
        .into_iter()
        .map(|(name, updated_at_ms)| api::SecretInfo { name, updated_at_ms })
        .collect())
}

pub(crate) async fn delete_secret(state: &AppState, by: &Principal, repo: &str, name: &str) -> ApiResult<()> {
    let repo = state.store.get_repo(repo).await?;
    if !state.store.delete_secret(&repo.id, name).await? {
        return Err(ApiErr::not_found(format!("secret {name} not found in repository {}", repo.name)));
    }
    access::audit(state, &by.actor, "secret.delete", &format!("{}/{name}", repo.name), "").await
}

#[cfg(test)]
mod tests {
    use super::secret_name_ok;

    #[test]
    fn secret_names_are_environment_variable_names() {
        for ok in ["A", "_X", "DB_PASSWORD2"] {
            assert!(secret_name_ok(ok), "{ok}");
        }
        for bad in ["", "2X", "A-B", "A B", "é", &"A".repeat(129)] {
            assert!(!secret_name_ok(bad), "{bad}");
        }
    }
}
