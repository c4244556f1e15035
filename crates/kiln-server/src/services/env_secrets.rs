//! Environment secrets (issue 46): `kiln secret set|ls|rm --env ENV`. An
//! admin's (the route's policy), sealed like repository secrets under the
//! associated data `env:ENV` and the name, never read back through the API.
//! Delivered by `assignment` only to the deploy jobs of trusted runs that
//! deploy to the environment (and so were approved) and list them under
//! `secrets:`; an environment secret wins over a repository secret of the
//! same name.

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::services::repos::{MAX_SECRET, secret_name_ok};
use crate::state::AppState;
use kiln_api as api;

pub(crate) async fn put(
    state: &AppState,
    by: &Principal,
    env: &str,
    name: &str,
    value: &str,
) -> ApiResult<api::SecretInfo> {
    let env = state.store.get_environment(env).await?.name;
    if !secret_name_ok(name) {
        return Err(ApiErr::bad_request(format!(
            "`{name}` is not a valid secret name; use letters, digits and `_`, not starting with a digit"
        )));
    }
    if value.is_empty() || value.len() > MAX_SECRET {
        return Err(ApiErr::bad_request(format!("a secret value is 1 to {MAX_SECRET} bytes")));
    }
    let sealed = state.secrets.seal(&kiln_store::env_secret_scope(&env), name, value);
    state.store.put_env_secret(&env, name, &sealed).await?;
    access::audit(state, &by.actor, "secret.put", &format!("env:{env}/{name}"), "").await?;
    let updated_at_ms =
        state.store.list_env_secrets(&env).await?.into_iter().find(|(n, _)| n == name).map_or(0, |(_, t)| t);
    Ok(api::SecretInfo { name: name.to_string(), updated_at_ms })
}

pub(crate) async fn list(state: &AppState, env: &str) -> ApiResult<Vec<api::SecretInfo>> {
    let env = state.store.get_environment(env).await?.name;
    Ok(state
        .store
        .list_env_secrets(&env)
        .await?
        .into_iter()
        .map(|(name, updated_at_ms)| api::SecretInfo { name, updated_at_ms })
        .collect())
}

pub(crate) async fn delete(state: &AppState, by: &Principal, env: &str, name: &str) -> ApiResult<()> {
    let env = state.store.get_environment(env).await?.name;
    if !state.store.delete_env_secret(&env, name).await? {
        return Err(ApiErr::not_found(format!("secret {name} not found in environment {env}")));
    }
    access::audit(state, &by.actor, "secret.delete", &format!("env:{env}/{name}"), "").await
}

/// The opened values of `names` among `environment`'s secrets (those that
/// exist); an error names the secret that does not open.
pub(crate) async fn values(
    state: &AppState,
    environment: &str,
    names: &[String],
) -> ApiResult<Result<Vec<(String, String)>, String>> {
    let scope = kiln_store::env_secret_scope(environment);
    let mut out = Vec::new();
    for (name, stored) in state.store.env_secret_values(environment, names).await? {
        match state.secrets.open(&scope, &name, &stored) {
            Ok(v) => out.push((name, v)),
            Err(e) => return Ok(Err(format!("secret {name} of environment `{environment}`: {e}"))),
        }
    }
    Ok(Ok(out))
}
