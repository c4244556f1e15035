//! Agent registration: each registration is a new session (invariant 11:
//! an attempt is accepted only from the session that holds it).

use crate::db::{Exec, now};
use crate::dialect::Isolation;
use crate::error::{Result, StoreError};
use crate::model::AgentRecord;
use crate::rows::{agent_from_row, new_id};
use crate::store::SqlStore;
use std::collections::BTreeMap;

/// `AgentStore::register_agent`.
pub(crate) async fn register_agent(store: &SqlStore, name: &str, labels: &str, max_jobs: u32) -> Result<AgentRecord> {
    let parsed: BTreeMap<String, String> =
        serde_json::from_str(labels).map_err(|e| StoreError::Invalid(format!("labels: {e}")))?;
    let (id, session) = (&new_id(), &new_id());
    store
        .transaction(
            Isolation::Serializable,
            &(id, session, name, labels, max_jobs),
            |tx, &(id, session, name, labels, max_jobs)| {
                Box::pin(async move {
                    let now = now(tx).await?;
                    tx.sql(
                        "INSERT INTO agents (id, name, labels, max_jobs, session_id, created_at, last_seen_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    )
                    .bind(id)
                    .bind(name)
                    .bind(labels)
                    .bind(max_jobs as i64)
                    .bind(session)
                    .bind(now)
                    .bind(now)
                    .execute()
                    .await?;
                    Ok(())
                })
            },
        )
        .await?;
    Ok(AgentRecord { id: id.into(), name: name.into(), labels: parsed, max_jobs, session_id: session.into() })
}

/// `AgentStore::get_agent`.
pub(crate) async fn get_agent(store: &SqlStore, agent_id: &str) -> Result<AgentRecord> {
    let row = store
        .reader()
        .await?
        .sql("SELECT id, name, labels, max_jobs, session_id FROM agents WHERE id = $1")
        .bind(agent_id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("agent {agent_id}")))?;
    agent_from_row(&row)
}
