//! Repositories and their secrets. Secret values go in and, only through
//! an assignment of a trusted run, out (invariant 10); listings show names
//! and update times, never values.

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::state::AppState;
use kiln_api as api;

/// Largest secret value accepted.
const MAX_SECRET: usize = 64 * 1024;

pub(crate) async fn create(state: &AppState, by: &Principal, req: api::CreateRepo) -> ApiResult<api::Repo> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiErr::invalid("repository name must be 1-100 characters of [A-Za-z0-9._-]"));
    }
    kiln_api::giturl::check_clone_url(req.clone_url.trim()).map_err(ApiErr::invalid)?;
    let pools = match &req.secret_pools {
        Some(p) => Some(crate::services::access::check_pools(p)?),
        None => None,
    };
    let mut repo = state.store.create_repo(name, req.clone_url.trim(), req.webhook_secret.as_deref()).await?;
    if let Some(pools) = pools {
        state.store.set_secret_pools(&repo.id, &pools).await?;
        repo.secret_pools = pools;
    }
    let detail = format!("{} secret pools {}", repo.clone_url, repo.secret_pools.join(","));
    access::audit(state, &by.actor, "repo.create", &repo.name, detail).await?;
    Ok(view(repo))
}

fn view(r: kiln_store::RepoRecord) -> api::Repo {
    api::Repo {
        id: r.id,
        name: r.name,
        clone_url: r.clone_url,
        created_at_ms: r.created_at,
        secret_pools: r.secret_pools,
    }
}

pub(crate) async fn list(state: &AppState) -> ApiResult<Vec<api::Repo>> {
    Ok(state.store.list_repos().await?.into_iter().map(view).collect())
}

/// A secret name: a letter or `_`, then letters, digits and `_` (it
/// becomes an environment variable).
fn secret_name_ok(name: &str) -> bool {
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
