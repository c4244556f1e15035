//! Access records: join tokens, scoped API tokens, secret pools of a
//! repository, and the audit log. Tokens are stored as the sha256 of their
//! secret part only; the caller compares hashes.

use crate::db::Row;
use crate::db::{Exec, now};
use crate::dialect::Isolation;
use crate::error::{Result, StoreError};
use crate::model::{ApiTokenRecord, AuditEntry, JoinTokenRecord, NewAudit, UiSessionRecord};
use crate::store::SqlStore;

fn join_from_row(row: &Row) -> Result<JoinTokenRecord> {
    Ok(JoinTokenRecord {
        id: row.get("id")?,
        name: row.get("name")?,
        pool: row.get("pool")?,
        token_hash: row.get("token_hash")?,
        created_at: row.get("created_at")?,
        revoked_at: row.get("revoked_at")?,
    })
}

fn api_from_row(row: &Row) -> Result<ApiTokenRecord> {
    Ok(ApiTokenRecord {
        id: row.get("id")?,
        name: row.get("name")?,
        scope: row.get("scope")?,
        repo_id: row.get("repo_id")?,
        trusted: row.get::<i64>("trusted")? != 0,
        token_hash: row.get("token_hash")?,
        created_at: row.get("created_at")?,
        revoked_at: row.get("revoked_at")?,
        last_used_at: row.get("last_used_at")?,
    })
}

/// `AccessStore::create_join_token`.
pub(crate) async fn create_join_token(
    store: &SqlStore,
    id: &str,
    name: &str,
    pool: &str,
    token_hash: &str,
) -> Result<JoinTokenRecord> {
    let created_at = store
        .transaction(Isolation::Serializable, &(id, name, pool, token_hash), |tx, &(id, name, pool, token_hash)| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql("INSERT INTO join_tokens (id, name, pool, token_hash, created_at) VALUES ($1, $2, $3, $4, $5)")
                    .bind(id)
                    .bind(name)
                    .bind(pool)
                    .bind(token_hash)
                    .bind(now)
                    .execute()
                    .await?;
                Ok(now)
            })
        })
        .await?;
    Ok(JoinTokenRecord {
        id: id.into(),
        name: name.into(),
        pool: pool.into(),
        token_hash: token_hash.into(),
        created_at,
        revoked_at: None,
    })
}

/// `AccessStore::get_join_token`.
pub(crate) async fn get_join_token(store: &SqlStore, id: &str) -> Result<JoinTokenRecord> {
    let row = store
        .reader()
        .await?
        .sql("SELECT * FROM join_tokens WHERE id = $1")
        .bind(id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("join token {id}")))?;
    join_from_row(&row)
}

/// `AccessStore::list_join_tokens`.
pub(crate) async fn list_join_tokens(store: &SqlStore) -> Result<Vec<JoinTokenRecord>> {
    let rows = store.reader().await?.sql("SELECT * FROM join_tokens ORDER BY created_at, id").fetch_all().await?;
    rows.iter().map(join_from_row).collect()
}

/// Which token table a revocation is for.
#[derive(Clone, Copy)]
enum Tokens {
    Join,
    Api,
}

/// Set `revoked_at` of a token once; false if there is no such token.
async fn revoke(store: &SqlStore, table: Tokens, id: &str) -> Result<bool> {
    store
        .transaction(Isolation::Serializable, &(table, id), |tx, &(table, id)| {
            Box::pin(async move {
                let now = now(tx).await?;
                let (select, update) = match table {
                    Tokens::Join => (
                        "SELECT id FROM join_tokens WHERE id = $1",
                        "UPDATE join_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                    ),
                    Tokens::Api => (
                        "SELECT id FROM api_tokens WHERE id = $1",
                        "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                    ),
                };
                let exists = tx.sql(select).bind(id).optional::<(String,)>().await?.is_some();
                tx.sql(update).bind(now).bind(id).execute().await?;
                Ok(exists)
            })
        })
        .await
}

/// `AccessStore::revoke_join_token`.
pub(crate) async fn revoke_join_token(store: &SqlStore, id: &str) -> Result<bool> {
    revoke(store, Tokens::Join, id).await
}

/// `AccessStore::create_api_token`.
pub(crate) async fn create_api_token(store: &SqlStore, t: &ApiTokenRecord) -> Result<ApiTokenRecord> {
    let created_at = store
        .transaction(Isolation::Serializable, t, |tx, t| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql(
                    "INSERT INTO api_tokens (id, name, scope, repo_id, trusted, token_hash, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&t.id)
                .bind(&t.name)
                .bind(&t.scope)
                .bind(&t.repo_id)
                .bind(t.trusted as i64)
                .bind(&t.token_hash)
                .bind(now)
                .execute()
                .await?;
                Ok(now)
            })
        })
        .await?;
    Ok(ApiTokenRecord { created_at, revoked_at: None, last_used_at: None, ..t.clone() })
}

/// `AccessStore::get_api_token`.
pub(crate) async fn get_api_token(store: &SqlStore, id: &str) -> Result<ApiTokenRecord> {
    let row = store
        .reader()
        .await?
        .sql("SELECT * FROM api_tokens WHERE id = $1")
        .bind(id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("token {id}")))?;
    api_from_row(&row)
}

/// `AccessStore::list_api_tokens`.
pub(crate) async fn list_api_tokens(store: &SqlStore) -> Result<Vec<ApiTokenRecord>> {
    let rows = store.reader().await?.sql("SELECT * FROM api_tokens ORDER BY created_at, id").fetch_all().await?;
    rows.iter().map(api_from_row).collect()
}

/// `AccessStore::revoke_api_token`.
pub(crate) async fn revoke_api_token(store: &SqlStore, id: &str) -> Result<bool> {
    revoke(store, Tokens::Api, id).await
}

/// `AccessStore::touch_api_token`: record a use (at most the caller's pace).
pub(crate) async fn touch_api_token(store: &SqlStore, id: &str) -> Result<()> {
    store
        .transaction(Isolation::Serializable, &id, |tx, &id| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql("UPDATE api_tokens SET last_used_at = $1 WHERE id = $2").bind(now).bind(id).execute().await?;
                Ok(())
            })
        })
        .await
}

/// `AccessStore::set_secret_pools`.
pub(crate) async fn set_secret_pools(store: &SqlStore, repo_id: &str, pools: &[String]) -> Result<()> {
    let json = serde_json::to_string(pools).expect("pools");
    let n = store
        .writer()
        .await?
        .sql("UPDATE repos SET secret_pools = $1 WHERE id = $2")
        .bind(&json)
        .bind(repo_id)
        .execute()
        .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("repository {repo_id}")));
    }
    Ok(())
}

/// `AccessStore::audit`.
pub(crate) async fn audit(store: &SqlStore, e: &NewAudit) -> Result<()> {
    store
        .transaction(Isolation::Serializable, e, |tx, e| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql("INSERT INTO audit_log (at, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)")
                    .bind(now)
                    .bind(&e.actor)
                    .bind(&e.action)
                    .bind(&e.target)
                    .bind(&e.detail)
                    .execute()
                    .await?;
                Ok(())
            })
        })
        .await
}

/// `AccessStore::list_audit`: newest first, entries with `id < before`.
pub(crate) async fn list_audit(store: &SqlStore, before: Option<i64>, limit: u32) -> Result<Vec<AuditEntry>> {
    let rows: Vec<(i64, i64, String, String, String, String)> = store
        .reader()
        .await?
        .sql("SELECT id, at, actor, action, target, detail FROM audit_log WHERE id < $1 ORDER BY id DESC LIMIT $2")
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit as i64)
        .all()
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, at, actor, action, target, detail)| AuditEntry { id, at, actor, action, target, detail })
        .collect())
}

/// `AccessStore::create_ui_session`.
pub(crate) async fn create_ui_session(
    store: &SqlStore,
    id_hash: &str,
    actor: &str,
    token_hash: &str,
    ttl_ms: i64,
) -> Result<UiSessionRecord> {
    let args = (id_hash, actor, token_hash, ttl_ms);
    let created_at = store
        .transaction(Isolation::Serializable, &args, |tx, &(id_hash, actor, token_hash, ttl_ms)| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql("DELETE FROM ui_sessions WHERE expires_at <= $1").bind(now).execute().await?;
                tx.sql(
                    "INSERT INTO ui_sessions (id_hash, actor, token_hash, created_at, expires_at) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(id_hash)
                .bind(actor)
                .bind(token_hash)
                .bind(now)
                .bind(now + ttl_ms)
                .execute()
                .await?;
                Ok(now)
            })
        })
        .await?;
    Ok(UiSessionRecord {
        id_hash: id_hash.into(),
        actor: actor.into(),
        token_hash: token_hash.into(),
        created_at,
        expires_at: created_at + ttl_ms,
    })
}

/// `AccessStore::get_ui_session`.
pub(crate) async fn get_ui_session(store: &SqlStore, id_hash: &str) -> Result<UiSessionRecord> {
    store
        .transaction(Isolation::Serializable, &id_hash, |tx, &id_hash| {
            Box::pin(async move {
                let now = now(tx).await?;
                let row = tx
                    .sql("SELECT * FROM ui_sessions WHERE id_hash = $1 AND expires_at > $2")
                    .bind(id_hash)
                    .bind(now)
                    .fetch_optional()
                    .await?
                    .ok_or_else(|| StoreError::NotFound("UI session".into()))?;
                Ok(UiSessionRecord {
                    id_hash: row.get("id_hash")?,
                    actor: row.get("actor")?,
                    token_hash: row.get("token_hash")?,
                    created_at: row.get("created_at")?,
                    expires_at: row.get("expires_at")?,
                })
            })
        })
        .await
}

/// `AccessStore::delete_ui_session`.
pub(crate) async fn delete_ui_session(store: &SqlStore, id_hash: &str) -> Result<bool> {
    let gone = store.writer().await?.sql("DELETE FROM ui_sessions WHERE id_hash = $1").bind(id_hash).execute().await?;
    Ok(gone > 0)
}
