//! Agent registration: each registration is a new session (invariant 11:
//! an attempt is accepted only from the session that holds it).

use crate::db::{Exec, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::AgentRecord;
use crate::rows::{agent_from_row, new_id};
use crate::store::SqlStore;
use kiln_core::AttemptOutcome;
use std::collections::BTreeMap;

/// `AgentStore::register_agent_in`.
pub(crate) async fn register_agent(
    store: &SqlStore,
    name: &str,
    labels: &str,
    max_jobs: u32,
    pool: &str,
    join_token_id: Option<&str>,
) -> Result<AgentRecord> {
    let parsed: BTreeMap<String, String> =
        serde_json::from_str(labels).map_err(|e| StoreError::Invalid(format!("labels: {e}")))?;
    let (id, session) = (&new_id(), &new_id());
    let now = store
        .transaction(
            Isolation::Serializable,
            &(id, session, name, labels, max_jobs, pool, join_token_id),
            |tx, &(id, session, name, labels, max_jobs, pool, join_token_id)| {
                Box::pin(async move {
                    let now = now(tx).await?;
                    tx.sql(
                        "INSERT INTO agents (id, name, labels, max_jobs, session_id, created_at, last_seen_at, \
                         pool, join_token_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    )
                    .bind(id)
                    .bind(name)
                    .bind(labels)
                    .bind(max_jobs as i64)
                    .bind(session)
                    .bind(now)
                    .bind(now)
                    .bind(pool)
                    .bind(join_token_id)
                    .execute()
                    .await?;
                    Ok(now)
                })
            },
        )
        .await?;
    Ok(AgentRecord {
        id: id.into(),
        name: name.into(),
        labels: parsed,
        max_jobs,
        session_id: session.into(),
        pool: pool.into(),
        created_at: now,
        last_seen_at: now,
        version: None,
        draining: false,
        executor: kiln_core::claim::Executor::Host,
    })
}

/// `AgentStore::describe_agent`.
pub(crate) async fn describe_agent(store: &SqlStore, agent_id: &str, version: &str) -> Result<()> {
    store
        .writer()
        .await?
        .sql("UPDATE agents SET version = $1 WHERE id = $2")
        .bind(version)
        .bind(agent_id)
        .execute()
        .await?;
    Ok(())
}

/// `AgentStore::set_agent_executor`.
pub(crate) async fn set_agent_executor(
    store: &SqlStore,
    agent_id: &str,
    executor: kiln_core::claim::Executor,
) -> Result<()> {
    store
        .writer()
        .await?
        .sql("UPDATE agents SET executor = $1 WHERE id = $2")
        .bind(executor.as_str())
        .bind(agent_id)
        .execute()
        .await?;
    Ok(())
}

/// `AgentStore::mark_draining`: only the agent's current session may say so.
pub(crate) async fn mark_draining(store: &SqlStore, agent_id: &str, session_id: &str) -> Result<bool> {
    let n = store
        .writer()
        .await?
        .sql("UPDATE agents SET draining = 1 WHERE id = $1 AND session_id = $2")
        .bind(agent_id)
        .bind(session_id)
        .execute()
        .await?;
    Ok(n > 0)
}

/// `AgentStore::get_agent`.
pub(crate) async fn get_agent(store: &SqlStore, agent_id: &str) -> Result<AgentRecord> {
    let row = store
        .reader()
        .await?
        .sql("SELECT * FROM agents WHERE id = $1")
        .bind(agent_id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("agent {agent_id}")))?;
    agent_from_row(&row)
}

/// `AgentStore::get_agent_for_claim`: the agent, and whether an attempt of
/// its current session was created by the claim request
/// `claim_request_id` (a retried request), in one statement.
pub(crate) async fn get_agent_for_claim(
    store: &SqlStore,
    agent_id: &str,
    claim_request_id: &str,
) -> Result<(AgentRecord, bool)> {
    let row = store
        .reader()
        .await?
        .sql(
            "SELECT a.*, CAST(CASE WHEN EXISTS (SELECT 1 FROM attempts t WHERE t.claim_request_id = $2 \
             AND t.session_id = a.session_id) THEN 1 ELSE 0 END AS BIGINT) AS prior_claim FROM agents a WHERE a.id = $1",
        )
        .bind(agent_id)
        .bind(claim_request_id)
        .fetch_optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("agent {agent_id}")))?;
    let prior: i64 = row.get("prior_claim")?;
    Ok((agent_from_row(&row)?, prior != 0))
}

/// `AgentStore::list_agents`.
pub(crate) async fn list_agents(store: &SqlStore) -> Result<Vec<AgentRecord>> {
    let rows = store.reader().await?.sql("SELECT * FROM agents ORDER BY created_at, id").fetch_all().await?;
    rows.iter().map(agent_from_row).collect()
}

/// `AgentStore::running_per_agent`: how many running attempts each agent
/// holds (agents holding none are absent).
pub(crate) async fn running_per_agent(store: &SqlStore) -> Result<BTreeMap<String, u32>> {
    static RUNNING: Sql = Sql::new(|_| {
        format!(
            "SELECT agent_id, COUNT(*) FROM attempts WHERE outcome = {running} GROUP BY agent_id",
            running = lit(AttemptOutcome::Running)
        )
    });
    let rows: Vec<(String, i64)> = store.reader().await?.sql(&RUNNING).all().await?;
    Ok(rows.into_iter().map(|(a, n)| (a, u32::try_from(n).unwrap_or(u32::MAX))).collect())
}

/// `AgentStore::active_job_counts` (through the `jobs(status)` index).
pub(crate) async fn active_job_counts(store: &SqlStore) -> Result<BTreeMap<String, u64>> {
    use kiln_core::JobStatus;
    static ACTIVE: Sql = Sql::new(|_| {
        format!(
            "SELECT status, COUNT(*) FROM jobs WHERE status IN ({}, {}, {}) GROUP BY status",
            lit(JobStatus::Pending),
            lit(JobStatus::Ready),
            lit(JobStatus::Running)
        )
    });
    let rows: Vec<(String, i64)> = store.reader().await?.sql(&ACTIVE).all().await?;
    let mut out: BTreeMap<String, u64> = [JobStatus::Pending, JobStatus::Ready, JobStatus::Running]
        .iter()
        .map(|s| (s.as_str().to_string(), 0))
        .collect();
    for (status, n) in rows {
        out.insert(status, u64::try_from(n).unwrap_or(0));
    }
    Ok(out)
}

/// `AgentStore::remove_agent`: forget the agent, end the leases of its
/// running attempts now (the reconciler fences them at once) and confirm
/// its fenced attempts' sandboxes gone (the operator says the machine is),
/// in one transaction. Its credentials then name no agent.
pub(crate) async fn remove_agent(store: &SqlStore, agent_id: &str) -> Result<bool> {
    static END_LEASES: Sql = Sql::new(|_| {
        format!(
            "UPDATE attempts SET lease_deadline = $1 WHERE agent_id = $2 AND outcome = {running} \
             AND lease_deadline > $1",
            running = lit(AttemptOutcome::Running)
        )
    });
    store
        .transaction(Isolation::Serializable, &agent_id, |tx, &agent_id| {
            Box::pin(async move {
                let now = now(tx).await?;
                let gone = tx.sql("DELETE FROM agents WHERE id = $1").bind(agent_id).execute().await?;
                tx.sql(&END_LEASES).bind(now).bind(agent_id).execute().await?;
                // Its fenced attempts are no longer waited for (issue 40,
                // item 5): a cancel they held ends now.
                crate::tx::release::release_removed(tx, agent_id, now).await?;
                Ok(gone > 0)
            })
        })
        .await
}

/// `AgentStore::touch_agents`: one transaction, one statement per agent.
pub(crate) async fn touch_agents(store: &SqlStore, agent_ids: &[String]) -> Result<()> {
    if agent_ids.is_empty() {
        return Ok(());
    }
    store
        .transaction(Isolation::LockedReadCommitted, &agent_ids, |tx, &agent_ids| {
            Box::pin(async move {
                let now = now(tx).await?;
                for id in agent_ids.iter() {
                    tx.sql("UPDATE agents SET last_seen_at = $1 WHERE id = $2 AND last_seen_at < $1")
                        .bind(now)
                        .bind(id)
                        .execute()
                        .await?;
                }
                Ok(())
            })
        })
        .await
}

/// `AgentStore::expire_agents`: the idle agents without a running attempt,
/// removed in one transaction (the running-attempt check is in the same
/// statement, so an agent that claimed meanwhile stays).
pub(crate) async fn expire_agents(store: &SqlStore, idle_ms: i64, keep: &[String]) -> Result<Vec<(String, String)>> {
    static IDLE: Sql = Sql::new(|_| {
        format!(
            "SELECT id, name FROM agents WHERE last_seen_at < $1 AND NOT EXISTS \
             (SELECT 1 FROM attempts a WHERE a.agent_id = agents.id AND a.outcome = {running}) ORDER BY id",
            running = lit(AttemptOutcome::Running)
        )
    });
    static DELETE: Sql = Sql::new(|_| {
        format!(
            "DELETE FROM agents WHERE id = $1 AND last_seen_at < $2 AND NOT EXISTS \
             (SELECT 1 FROM attempts a WHERE a.agent_id = agents.id AND a.outcome = {running})",
            running = lit(AttemptOutcome::Running)
        )
    });
    store
        .transaction(Isolation::Serializable, &(idle_ms, keep), |tx, &(idle_ms, keep)| {
            Box::pin(async move {
                let now = now(tx).await?;
                let cutoff = now - idle_ms;
                let idle: Vec<(String, String)> = tx.sql(&IDLE).bind(cutoff).all().await?;
                let mut gone = vec![];
                for (id, name) in idle.into_iter().filter(|(id, _)| !keep.contains(id)) {
                    if tx.sql(&DELETE).bind(&id).bind(cutoff).execute().await? > 0 {
                        crate::tx::release::release_removed(tx, &id, now).await?;
                        gone.push((id, name));
                    }
                }
                Ok(gone)
            })
        })
        .await
}

/// `AgentStore::operating_gauges`: four reads, each through an index
/// (`runs(status)`, `jobs(status)`, `attempts(outcome, lease_deadline)`,
/// `log_chunks(job_id, id)`) over rows that are live by nature: unfinished
/// runs, ready jobs, running attempts, the hot log journal.
pub(crate) async fn operating_gauges(store: &SqlStore, classes: u32) -> Result<crate::model::OperatingGauges> {
    use crate::dialect::{active_runs, terminal_jobs};
    use kiln_core::{JobStatus, RunStatus};
    static RUNS: Sql =
        Sql::new(|_| format!("SELECT status, COUNT(*) FROM runs WHERE status IN {} GROUP BY status", active_runs()));
    static ELIGIBLE: Sql = Sql::new(|d| {
        format!(
            "SELECT class_key, {now} - MIN(next_attempt_at) FROM jobs WHERE status = {ready} \
             AND next_attempt_at <= {now} GROUP BY class_key ORDER BY 2 DESC LIMIT $1",
            ready = lit(JobStatus::Ready),
            now = d.now_ms,
        )
    });
    static LAG: Sql = Sql::new(|d| {
        format!(
            "SELECT {now} - MIN(lease_deadline) FROM attempts WHERE outcome = {running} AND lease_deadline < {now}",
            running = lit(AttemptOutcome::Running),
            now = d.now_ms,
        )
    });
    static UNARCHIVED: Sql = Sql::new(|d| {
        format!(
            "SELECT {now} - MIN(j.finished_at) FROM (SELECT DISTINCT job_id FROM log_chunks) c \
             JOIN jobs j ON j.id = c.job_id WHERE j.status IN {terminal} AND j.finished_at IS NOT NULL",
            terminal = terminal_jobs(),
            now = d.now_ms,
        )
    });
    let mut r = store.reader().await?;
    let runs: Vec<(String, i64)> = r.sql(&RUNS).all().await?;
    let mut active_runs: BTreeMap<String, u64> =
        RunStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| (s.as_str().to_string(), 0)).collect();
    for (status, n) in runs {
        active_runs.insert(status, u64::try_from(n).unwrap_or(0));
    }
    let oldest_eligible_ms: Vec<(String, i64)> = r.sql(&ELIGIBLE).bind(i64::from(classes)).all().await?;
    let lag: Option<i64> = r.sql(&LAG).scalar().await?;
    let unarchived: Option<i64> = r.sql(&UNARCHIVED).scalar().await?;
    Ok(crate::model::OperatingGauges {
        active_runs,
        oldest_eligible_ms,
        reconciler_lag_ms: lag.unwrap_or(0).max(0),
        oldest_unarchived_log_ms: unarchived.unwrap_or(0).max(0),
    })
}

/// `AgentStore::queue_classes`: the gauges' eligible read, with counts.
pub(crate) async fn queue_classes(store: &SqlStore, limit: u32) -> Result<Vec<crate::model::QueueClass>> {
    use kiln_core::JobStatus;
    static QUEUE: Sql = Sql::new(|d| {
        format!(
            "SELECT class_key, COUNT(*), {now} - MIN(next_attempt_at) FROM jobs WHERE status = {ready} \
             AND next_attempt_at <= {now} GROUP BY class_key ORDER BY 3 DESC, 1 LIMIT $1",
            ready = lit(JobStatus::Ready),
            now = d.now_ms,
        )
    });
    let rows: Vec<(String, i64, i64)> = store.reader().await?.sql(&QUEUE).bind(i64::from(limit)).all().await?;
    Ok(rows
        .into_iter()
        .map(|(class_key, n, age)| crate::model::QueueClass {
            class_key,
            eligible: u64::try_from(n).unwrap_or(0),
            oldest_ms: age.max(0),
        })
        .collect())
}

/// `AgentStore::running_attempts`: through `attempts(outcome, …)`; the
/// last `system` line through the log journal's unique
/// `(job_id, epoch, stream, byte_offset)` index.
pub(crate) async fn running_attempts(store: &SqlStore, limit: u32) -> Result<Vec<crate::model::RunningAttempt>> {
    static RUNNING: Sql = Sql::new(|d| {
        format!(
            "SELECT a.run_id, p.name, r.run_number, a.job_id, j.name, a.epoch, a.agent_id, a.runner, a.started_at, \
             {now} - a.started_at, \
             (SELECT c.data FROM log_chunks c WHERE c.job_id = a.job_id AND c.epoch = a.epoch \
              AND c.stream = 'system' ORDER BY c.byte_offset DESC LIMIT 1) \
             FROM attempts a JOIN jobs j ON j.id = a.job_id JOIN runs r ON r.id = a.run_id \
             JOIN repos p ON p.id = r.repo_id \
             WHERE a.outcome = {running} ORDER BY a.started_at, a.job_id LIMIT $1",
            running = lit(AttemptOutcome::Running),
            now = d.now_ms,
        )
    });
    type Row = (String, String, i64, String, String, i64, String, String, i64, i64, Option<Vec<u8>>);
    let rows: Vec<Row> = store.reader().await?.sql(&RUNNING).bind(i64::from(limit)).all().await?;
    Ok(rows
        .into_iter()
        .map(|(run_id, repo, run_number, job_id, job_name, epoch, agent_id, runner, started_at, elapsed, data)| {
            crate::model::RunningAttempt {
                run_id,
                repo,
                run_number,
                job_id,
                job_name,
                epoch,
                agent_id,
                runner,
                started_at,
                elapsed_ms: elapsed.max(0),
                last_system_line: data.as_deref().and_then(last_line),
            }
        })
        .collect())
}

/// The last non-empty line of a log chunk, at most 200 characters.
fn last_line(data: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(data);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}
