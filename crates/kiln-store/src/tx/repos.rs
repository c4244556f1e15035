//! Repositories and their secrets.

use crate::db::{Exec, now};
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::RepoRecord;
use crate::rows::{new_id, repo_from_row};
use crate::store::SqlStore;
use std::collections::BTreeMap;

/// `RepoStore::create_repo`.
pub(crate) async fn create_repo(
    store: &SqlStore,
    name: &str,
    clone_url: &str,
    webhook_secret: Option<&str>,
) -> Result<RepoRecord> {
    let id = &new_id();
    let created_at = store
        .transaction(
            Isolation::Serializable,
            &(id, name, clone_url, webhook_secret),
            |tx, &(id, name, clone_url, webhook_secret)| {
                Box::pin(async move {
                    let now = now(tx).await?;
                    let res = tx
                .sql("INSERT INTO repos (id, name, clone_url, webhook_secret, created_at) VALUES ($1, $2, $3, $4, $5)")
                .bind(id)
                .bind(name)
                .bind(clone_url)
                .bind(webhook_secret)
                .bind(now)
                .execute()
                .await;
                    match res {
                        Err(StoreError::Conflict(_)) => {
                            Err(StoreError::Conflict(format!("repository `{name}` already exists")))
                        }
                        Err(e) => Err(e),
                        Ok(_) => Ok(now),
                    }
                })
            },
        )
        .await?;
    Ok(RepoRecord {
        id: id.into(),
        name: name.into(),
        clone_url: clone_url.into(),
        webhook_secret: webhook_secret.map(Into::into),
        created_at,
        secret_pools: vec!["default".into()],
        forge: Default::default(),
        public: false,
        team: "default".into(),
        clone_credential: None,
        team_max_queued: None,
    })
}

/// `RepoStore::get_repo`.
static REPO_BY_NAME: Sql = Sql::new(|_| {
    format!("SELECT {} FROM repos WHERE name = $1 OR id = $1 LIMIT 1", crate::rows::repo_cols("repos", ""))
});

pub(crate) async fn get_repo(store: &SqlStore, name_or_id: &str) -> Result<RepoRecord> {
    let row = store
        .reader()
        .await?
        .sql(&REPO_BY_NAME)
        .bind(name_or_id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("repository `{name_or_id}`")))?;
    repo_from_row(&row)
}

/// `RepoStore::delete_repo`: forget a repository that has no runs, with
/// its secrets, webhook deliveries, ref heads and schedule cursors, and
/// revoke its trigger tokens, in one transaction. A repository with runs is
/// refused (`Conflict`): their history, artifacts and caches refer to it.
pub(crate) async fn delete_repo(store: &SqlStore, name_or_id: &str) -> Result<RepoRecord> {
    let repo = get_repo(store, name_or_id).await?;
    store
        .transaction(Isolation::Serializable, &repo, |tx, repo| {
            Box::pin(async move {
                let now = now(tx).await?;
                let runs: i64 = tx.sql("SELECT COUNT(*) FROM runs WHERE repo_id = $1").bind(&repo.id).scalar().await?;
                if runs > 0 {
                    return Err(StoreError::Conflict(format!(
                        "repository `{}` has {runs} run(s): their history, logs and artifacts refer to it, so it \
                         cannot be removed",
                        repo.name
                    )));
                }
                for delete in [
                    "DELETE FROM secrets WHERE repo_id = $1",
                    "DELETE FROM deliveries WHERE repo_id = $1",
                    "DELETE FROM forge_reports WHERE repo_id = $1",
                    "DELETE FROM ref_heads WHERE repo_id = $1",
                    "DELETE FROM schedule_cursors WHERE repo_id = $1",
                    "DELETE FROM cache_entries WHERE repo_id = $1",
                    "DELETE FROM notification_deliveries WHERE repo_id = $1",
                    "DELETE FROM notifications WHERE repo_id = $1",
                ] {
                    tx.sql(delete).bind(&repo.id).execute().await?;
                }
                tx.sql("UPDATE api_tokens SET revoked_at = $1 WHERE repo_id = $2 AND revoked_at IS NULL")
                    .bind(now)
                    .bind(&repo.id)
                    .execute()
                    .await?;
                if tx.sql("DELETE FROM repos WHERE id = $1").bind(&repo.id).execute().await? == 0 {
                    return Err(StoreError::NotFound(format!("repository `{}`", repo.name)));
                }
                Ok(())
            })
        })
        .await?;
    Ok(repo)
}

/// `RepoStore::list_repos`.
pub(crate) async fn list_repos(store: &SqlStore) -> Result<Vec<RepoRecord>> {
    static ALL: Sql = Sql::new(|_| format!("SELECT {} FROM repos ORDER BY name", crate::rows::repo_cols("repos", "")));
    let rows = store.reader().await?.sql(&ALL).fetch_all().await?;
    rows.iter().map(repo_from_row).collect()
}

/// `RepoStore::put_secret`.
pub(crate) async fn put_secret(store: &SqlStore, repo_id: &str, name: &str, value: &str) -> Result<()> {
    static PUT: Sql = Sql::new(|d| {
        format!(
            "INSERT INTO secrets (repo_id, name, value, updated_at) VALUES ($1, $2, $3, {now}) \
             ON CONFLICT (repo_id, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            now = d.now_ms
        )
    });
    store.writer().await?.sql(&PUT).bind(repo_id).bind(name).bind(value).execute().await?;
    Ok(())
}

/// `RepoStore::delete_secret`.
pub(crate) async fn delete_secret(store: &SqlStore, repo_id: &str, name: &str) -> Result<bool> {
    let deleted = store
        .writer()
        .await?
        .sql("DELETE FROM secrets WHERE repo_id = $1 AND name = $2")
        .bind(repo_id)
        .bind(name)
        .execute()
        .await?;
    Ok(deleted > 0)
}

/// `RepoStore::list_secrets`.
pub(crate) async fn list_secrets(store: &SqlStore, repo_id: &str) -> Result<Vec<(String, i64)>> {
    store
        .reader()
        .await?
        // `@…` rows are the server's own credentials (the clone URL's), never a listed secret.
        .sql("SELECT name, updated_at FROM secrets WHERE repo_id = $1 AND name NOT LIKE '@%' ORDER BY name")
        .bind(repo_id)
        .all()
        .await
}

/// `RepoStore::secret_values`.
pub(crate) async fn secret_values(
    store: &SqlStore,
    repo_id: &str,
    names: &[String],
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut conn = store.reader().await?;
    for name in names {
        let value: Option<String> = conn
            .sql("SELECT value FROM secrets WHERE repo_id = $1 AND name = $2")
            .bind(repo_id)
            .bind(name)
            .scalar_optional()
            .await?;
        if let Some(v) = value {
            out.insert(name.clone(), v);
        }
    }
    Ok(out)
}

/// `RepoStore::all_secrets`: repositories' secrets and credentials, and
/// environments' secrets under `env:NAME` (`tx::env_secrets`).
pub(crate) async fn all_secrets(store: &SqlStore) -> Result<Vec<(String, String, String)>> {
    store
        .reader()
        .await?
        .sql(
            "SELECT repo_id, name, value FROM secrets \
             UNION ALL SELECT id, '@webhook', webhook_secret FROM repos WHERE webhook_secret IS NOT NULL \
             UNION ALL SELECT id, '@forge-token', forge_token FROM repos WHERE forge_token IS NOT NULL \
             UNION ALL SELECT 'env:' || environment, name, value FROM environment_secrets \
             ORDER BY 1, 2",
        )
        .all()
        .await
}

/// The repository column holding a credential listed by `all_secrets` under
/// a reserved name (`@…` is never a secret's name).
fn credential_column(name: &str) -> Option<&'static str> {
    match name {
        WEBHOOK_SECRET => Some("UPDATE repos SET webhook_secret = $1 WHERE id = $2 AND webhook_secret = $3"),
        FORGE_TOKEN => Some("UPDATE repos SET forge_token = $1 WHERE id = $2 AND forge_token = $3"),
        _ => None,
    }
}

/// The name `all_secrets` lists a repository's webhook secret under (and
/// the associated data it is sealed with).
pub const WEBHOOK_SECRET: &str = "@webhook";
/// Likewise for the forge status token.
pub const FORGE_TOKEN: &str = "@forge-token";
pub use crate::rows::CLONE_CREDENTIAL;

/// `RepoStore::replace_secrets`: every `(repo, name, old, new)` in one
/// transaction, each only if the stored value is still `old`.
pub(crate) async fn replace_secrets(store: &SqlStore, changes: &[(String, String, String, String)]) -> Result<u64> {
    store
        .transaction(Isolation::Serializable, &changes, |tx, &changes| {
            Box::pin(async move {
                let mut n = 0;
                for (repo_id, name, old, new) in changes {
                    let env = repo_id.strip_prefix(crate::tx::env_secrets::ENV_SECRET_PREFIX);
                    n += match (credential_column(name), env) {
                        (Some(update), _) => tx.sql(update).bind(new).bind(repo_id).bind(old).execute().await?,
                        // An environment's secret (`env:NAME`, see `tx::env_secrets`).
                        (None, Some(env)) => {
                            tx.sql(
                                "UPDATE environment_secrets SET value = $1 \
                                 WHERE environment = $2 AND name = $3 AND value = $4",
                            )
                            .bind(new)
                            .bind(env)
                            .bind(name)
                            .bind(old)
                            .execute()
                            .await?
                        }
                        (None, None) => {
                            tx.sql("UPDATE secrets SET value = $1 WHERE repo_id = $2 AND name = $3 AND value = $4")
                                .bind(new)
                                .bind(repo_id)
                                .bind(name)
                                .bind(old)
                                .execute()
                                .await?
                        }
                    };
                }
                if n != changes.len() as u64 {
                    return Err(StoreError::Conflict(format!(
                        "{} of {} secrets changed while being resealed; nothing was changed, try again",
                        changes.len() as u64 - n,
                        changes.len()
                    )));
                }
                Ok(n)
            })
        })
        .await
}
