//! Teams (issue 44): the fair-share unit repositories belong to, with a
//! weight and quotas that change at runtime (the dispatcher reads them).

use crate::db::{Exec, Row, now};
use crate::dialect::lit;
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{QueueGroup, TeamCharge, TeamRecord, TeamUpdate};
use crate::store::SqlStore;
use kiln_core::JobStatus;

/// The team every repository starts in; never removed.
pub const DEFAULT_TEAM: &str = "default";

const TEAM_COLS: &str = "t.name, t.weight, t.max_running, t.max_queued, t.created_at, t.pass, \
    (SELECT COUNT(*) FROM repos r WHERE r.team = t.name) AS repos";

fn team_from_row(row: &Row) -> Result<TeamRecord> {
    let quota = |v: Option<i64>| v.and_then(|n| u32::try_from(n).ok());
    Ok(TeamRecord {
        name: row.get("name")?,
        weight: u32::try_from(row.get::<i64>("weight")?).unwrap_or(1).max(1),
        max_running: quota(row.get("max_running")?),
        max_queued: quota(row.get("max_queued")?),
        created_at: row.get("created_at")?,
        repos: row.get("repos")?,
        pass: u64::try_from(row.get::<i64>("pass")?).unwrap_or(0),
    })
}

/// A team name: 1 to 64 of letters, digits, `-`, `_` and `.`.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok =
        !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!("team name `{name}`: 1 to 64 letters, digits, `-`, `_` or `.`")))
    }
}

fn check_weight(w: u32) -> Result<()> {
    if (1..=1000).contains(&w) { Ok(()) } else { Err(StoreError::Invalid(format!("team weight {w}: from 1 to 1000"))) }
}

/// `TeamStore::get_team`.
pub(crate) async fn get_team(store: &SqlStore, name: &str) -> Result<TeamRecord> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {TEAM_COLS} FROM teams t WHERE t.name = $1"));
    let row = store.reader().await?.sql(&SQL).bind(name).fetch_optional().await?;
    team_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("team `{name}`")))?)
}

/// `TeamStore::list_teams`, by name.
pub(crate) async fn list_teams(store: &SqlStore) -> Result<Vec<TeamRecord>> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {TEAM_COLS} FROM teams t ORDER BY t.name"));
    store.reader().await?.sql(&SQL).fetch_all().await?.iter().map(team_from_row).collect()
}

/// `TeamStore::create_team`.
pub(crate) async fn create_team(
    store: &SqlStore,
    name: &str,
    weight: u32,
    max_running: Option<u32>,
    max_queued: Option<u32>,
) -> Result<TeamRecord> {
    check_name(name)?;
    check_weight(weight)?;
    store
        .transaction(
            Isolation::Serializable,
            &(name, weight, max_running, max_queued),
            |tx, &(name, weight, max_running, max_queued)| {
                Box::pin(async move {
                    let now = now(tx).await?;
                    let res = tx
                        .sql(
                            "INSERT INTO teams (name, weight, max_running, max_queued, created_at) \
                             VALUES ($1, $2, $3, $4, $5)",
                        )
                        .bind(name)
                        .bind(i64::from(weight))
                        .bind(max_running.map(i64::from))
                        .bind(max_queued.map(i64::from))
                        .bind(now)
                        .execute()
                        .await;
                    match res {
                        Err(StoreError::Conflict(_)) => {
                            Err(StoreError::Conflict(format!("team `{name}` already exists")))
                        }
                        Err(e) => Err(e),
                        Ok(_) => Ok(()),
                    }
                })
            },
        )
        .await?;
    get_team(store, name).await
}

/// `TeamStore::update_team`: takes effect at the next dispatch decision.
pub(crate) async fn update_team(store: &SqlStore, name: &str, u: &TeamUpdate) -> Result<TeamRecord> {
    if let Some(w) = u.weight {
        check_weight(w)?;
    }
    store
        .transaction(Isolation::Serializable, &(name, u), |tx, &(name, u)| {
            Box::pin(async move {
                let found: Option<String> =
                    tx.sql("SELECT name FROM teams WHERE name = $1").bind(name).scalar_optional().await?;
                if found.is_none() {
                    return Err(StoreError::NotFound(format!("team `{name}`")));
                }
                if let Some(w) = u.weight {
                    tx.sql("UPDATE teams SET weight = $1 WHERE name = $2")
                        .bind(i64::from(w))
                        .bind(name)
                        .execute()
                        .await?;
                }
                if let Some(m) = u.max_running {
                    tx.sql("UPDATE teams SET max_running = $1 WHERE name = $2")
                        .bind(m.map(i64::from))
                        .bind(name)
                        .execute()
                        .await?;
                }
                if let Some(m) = u.max_queued {
                    tx.sql("UPDATE teams SET max_queued = $1 WHERE name = $2")
                        .bind(m.map(i64::from))
                        .bind(name)
                        .execute()
                        .await?;
                }
                Ok(())
            })
        })
        .await?;
    get_team(store, name).await
}

/// `TeamStore::delete_team`: only an empty team, never `default`.
pub(crate) async fn delete_team(store: &SqlStore, name: &str) -> Result<TeamRecord> {
    let team = get_team(store, name).await?;
    if name == DEFAULT_TEAM {
        return Err(StoreError::Conflict("the `default` team stays (repositories start in it)".into()));
    }
    store
        .transaction(Isolation::Serializable, &name, |tx, &name| {
            Box::pin(async move {
                let repos: i64 = tx.sql("SELECT COUNT(*) FROM repos WHERE team = $1").bind(name).scalar().await?;
                if repos > 0 {
                    return Err(StoreError::Conflict(format!(
                        "team `{name}` still has {repos} repositor{}; move them first (`kiln repo set REPO --team OTHER`)",
                        if repos == 1 { "y" } else { "ies" }
                    )));
                }
                tx.sql("DELETE FROM teams WHERE name = $1").bind(name).execute().await?;
                Ok(())
            })
        })
        .await?;
    Ok(team)
}

/// `TeamStore::set_repo_team`.
pub(crate) async fn set_repo_team(store: &SqlStore, repo_id: &str, team: &str) -> Result<()> {
    store
        .transaction(Isolation::Serializable, &(repo_id, team), |tx, &(repo_id, team)| {
            Box::pin(async move {
                let found: Option<String> =
                    tx.sql("SELECT name FROM teams WHERE name = $1").bind(team).scalar_optional().await?;
                if found.is_none() {
                    return Err(StoreError::NotFound(format!("team `{team}` (create it with `kiln team add {team}`)")));
                }
                let n = tx.sql("UPDATE repos SET team = $1 WHERE id = $2").bind(team).bind(repo_id).execute().await?;
                if n == 0 {
                    return Err(StoreError::NotFound(format!("repository {repo_id}")));
                }
                Ok(())
            })
        })
        .await
}

/// `TeamStore::queue_groups`: ready, pending and running jobs by team,
/// lane and class (one grouped read over the live jobs).
pub(crate) async fn queue_groups(store: &SqlStore) -> Result<Vec<QueueGroup>> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT p.team, r.priority, j.class_key, \
               SUM(CASE WHEN j.status = {ready} THEN 1 ELSE 0 END), \
               SUM(CASE WHEN j.status = {pending} THEN 1 ELSE 0 END), \
               SUM(CASE WHEN j.status = {running} THEN 1 ELSE 0 END), \
               MIN(CASE WHEN j.status = {ready} THEN COALESCE(j.next_attempt_at, 0) END) \
             FROM jobs j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
             WHERE j.status IN ({ready}, {pending}, {running}) \
             GROUP BY p.team, r.priority, j.class_key ORDER BY p.team, r.priority, j.class_key",
            ready = lit(JobStatus::Ready),
            pending = lit(JobStatus::Pending),
            running = lit(JobStatus::Running),
        )
    });
    type Group = (String, String, String, i64, i64, i64, Option<i64>);
    let rows: Vec<Group> = store.reader().await?.sql(&SQL).all().await?;
    Ok(rows
        .into_iter()
        .map(|(team, lane, class_key, ready, pending, running, oldest_ready_at)| QueueGroup {
            team,
            lane,
            class_key,
            ready,
            pending,
            running,
            oldest_ready_at,
        })
        .collect())
}

/// `TeamStore::queued_jobs`: jobs waiting (ready, or pending on their
/// needs) of `team`'s repositories, or of every team (`None`).
pub(crate) async fn queued_jobs(store: &SqlStore, team: Option<&str>) -> Result<i64> {
    static TEAM: Sql = Sql::new(|_| {
        format!(
            "SELECT COUNT(*) FROM jobs j JOIN runs r ON r.id = j.run_id JOIN repos p ON p.id = r.repo_id \
             WHERE j.status IN ({ready}, {pending}) AND p.team = $1",
            ready = lit(JobStatus::Ready),
            pending = lit(JobStatus::Pending),
        )
    });
    static ALL: Sql = Sql::new(|_| {
        format!(
            "SELECT COUNT(*) FROM jobs WHERE status IN ({ready}, {pending})",
            ready = lit(JobStatus::Ready),
            pending = lit(JobStatus::Pending),
        )
    });
    let mut r = store.reader().await?;
    match team {
        Some(t) => r.sql(&TEAM).bind(t).scalar().await,
        None => r.sql(&ALL).scalar().await,
    }
}

/// `TeamStore::set_run_priority`: the run's lane; its ready jobs are made
/// ready again (a new dispatch generation and outbox event carrying the
/// lane, their ready time kept so aging goes on). `Conflict` once the run
/// ended.
pub(crate) async fn set_run_priority(store: &SqlStore, run_id: &str, lane: &str) -> Result<u32> {
    static RUN: Sql = Sql::new(|d| format!("SELECT status FROM runs WHERE id = $1{}", d.for_update));
    static READY: Sql = Sql::new(|_| {
        format!(
            "SELECT id, next_attempt_at FROM jobs WHERE run_id = $1 AND status = {} ORDER BY job_index",
            lit(JobStatus::Ready)
        )
    });
    store
        .transaction(Isolation::Serializable, &(run_id, lane), |tx, &(run_id, lane)| {
            Box::pin(async move {
                let status: Option<String> = tx.sql(&RUN).bind(run_id).scalar_optional().await?;
                let Some(status) = status else { return Err(StoreError::NotFound(format!("run {run_id}"))) };
                let status: kiln_core::RunStatus = crate::error::parse_enum(&status)?;
                if status.is_terminal() {
                    return Err(StoreError::Conflict(format!(
                        "run {run_id} is {}: only a queued or running run's priority can change",
                        status.as_str()
                    )));
                }
                tx.sql("UPDATE runs SET priority = $1 WHERE id = $2").bind(lane).bind(run_id).execute().await?;
                let ready: Vec<(String, Option<i64>)> = tx.sql(&READY).bind(run_id).all().await?;
                let now = now(tx).await?;
                for (job_id, at) in &ready {
                    crate::tx::advance::make_ready(tx, job_id, at.unwrap_or(now).min(now), now).await?;
                }
                Ok(u32::try_from(ready.len()).unwrap_or(u32::MAX))
            })
        })
        .await
}

/// `TeamStore::charge_teams`: each team's row locked (in name order, so
/// two replicas' batches never deadlock), its virtual time moved by
/// kiln-core's [`charged_pass`](kiln_core::fair::charged_pass). Charges add
/// up: two replicas writing a team's starts at the same moment lose none.
pub(crate) async fn charge_teams(
    store: &SqlStore,
    charges: &[TeamCharge],
) -> Result<std::collections::BTreeMap<String, u64>> {
    static TEAM: Sql = Sql::new(|d| format!("SELECT weight, pass FROM teams WHERE name = $1{}", d.for_update));
    static SET: Sql = Sql::new(|_| "UPDATE teams SET pass = $1 WHERE name = $2".to_string());
    let mut merged: std::collections::BTreeMap<&str, (u64, u64)> = std::collections::BTreeMap::new();
    for c in charges.iter().filter(|c| c.starts > 0) {
        let e = merged.entry(c.team.as_str()).or_insert((0, c.clock));
        e.0 = e.0.saturating_add(c.starts);
        e.1 = e.1.min(c.clock);
    }
    if merged.is_empty() {
        return Ok(std::collections::BTreeMap::new());
    }
    store
        .transaction(Isolation::LockedReadCommitted, &merged, |tx, merged| {
            Box::pin(async move {
                let mut out = std::collections::BTreeMap::new();
                for (team, &(starts, clock)) in merged {
                    let row: Option<(i64, i64)> = tx.sql(&TEAM).bind(*team).optional().await?;
                    let Some((weight, pass)) = row else { continue };
                    let weight = u32::try_from(weight).unwrap_or(1).max(1);
                    let pass = kiln_core::fair::charged_pass(u64::try_from(pass).unwrap_or(0), weight, clock, starts);
                    tx.sql(&SET).bind(i64::try_from(pass).unwrap_or(i64::MAX)).bind(*team).execute().await?;
                    out.insert((*team).to_string(), pass);
                }
                Ok(out)
            })
        })
        .await
}
