//! Environment secrets (issue 46): stored sealed like repository secrets
//! (the server seals them with the associated data [`env_secret_scope`] and
//! the name), delivered only to the approved deploy jobs of trusted runs
//! deploying to their environment; removed with it (`ON DELETE CASCADE`).
//! `repos::all_secrets` lists them under their scope so that resealing and
//! key rotation cover them.

use crate::db::{Exec, now};
use crate::dialect::{Isolation, Sql};
use crate::error::Result;
use crate::store::SqlStore;
use crate::tx::gates::{get_in, not_found};
use std::collections::BTreeMap;

/// What an environment's secrets are listed (`all_secrets`) and sealed
/// under: `env:` then its name (a repository id never starts so).
pub const ENV_SECRET_PREFIX: &str = "env:";

/// The scope an environment's secrets are sealed under.
pub fn env_secret_scope(environment: &str) -> String {
    format!("{ENV_SECRET_PREFIX}{environment}")
}

/// `EnvSecretStore::put_env_secret`: `NotFound` if the environment does not exist.
pub(crate) async fn put_env_secret(store: &SqlStore, environment: &str, name: &str, sealed: &str) -> Result<()> {
    store
        .transaction(Isolation::Serializable, &(environment, name, sealed), |tx, &(environment, name, sealed)| {
            Box::pin(async move {
                if get_in(tx, environment).await?.is_none() {
                    return Err(not_found(environment));
                }
                let now = now(tx).await?;
                tx.sql(
                    "INSERT INTO environment_secrets (environment, name, value, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $4) ON CONFLICT (environment, name) \
                     DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                )
                .bind(environment)
                .bind(name)
                .bind(sealed)
                .bind(now)
                .execute()
                .await?;
                Ok(())
            })
        })
        .await
}

/// `EnvSecretStore::delete_env_secret`: false if there was no such secret.
pub(crate) async fn delete_env_secret(store: &SqlStore, environment: &str, name: &str) -> Result<bool> {
    let deleted = store
        .writer()
        .await?
        .sql("DELETE FROM environment_secrets WHERE environment = $1 AND name = $2")
        .bind(environment)
        .bind(name)
        .execute()
        .await?;
    Ok(deleted > 0)
}

/// `EnvSecretStore::list_env_secrets`: names and last-update times, never values.
pub(crate) async fn list_env_secrets(store: &SqlStore, environment: &str) -> Result<Vec<(String, i64)>> {
    static SQL: Sql =
        Sql::new(|_| "SELECT name, updated_at FROM environment_secrets WHERE environment = $1 ORDER BY name".into());
    store.reader().await?.sql(&SQL).bind(environment).all().await
}

/// `EnvSecretStore::env_secret_values`: the stored (sealed) values of the
/// named secrets that exist.
pub(crate) async fn env_secret_values(
    store: &SqlStore,
    environment: &str,
    names: &[String],
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return Ok(out);
    }
    let rows: Vec<(String, String)> = store
        .reader()
        .await?
        .sql("SELECT name, value FROM environment_secrets WHERE environment = $1")
        .bind(environment)
        .all()
        .await?;
    for (name, value) in rows {
        if names.contains(&name) {
            out.insert(name, value);
        }
    }
    Ok(out)
}
