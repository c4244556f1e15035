//! Teams (issue 44): the fair-share unit repositories belong to, with a
//! weight and quotas that change at runtime (the dispatcher reads them).

use crate::db::{Exec, Row, now};
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{TeamRecord, TeamUpdate};
use crate::store::SqlStore;

/// The team every repository starts in; never removed.
pub const DEFAULT_TEAM: &str = "default";

const TEAM_COLS: &str = "t.name, t.weight, t.max_running, t.max_queued, t.created_at, \
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
