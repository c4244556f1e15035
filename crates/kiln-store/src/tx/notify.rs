//! Badges and notifications (issue 42): the repository's public flag, the
//! notifications of run ends and their outbox.
//!
//! A run end is enqueued in the transaction that ends the run
//! ([`enqueue_on_end`], from `advance::finish_run`): a crash cannot lose
//! the intent, and the unique key (notification, run) makes it exactly one
//! row however often the end is replayed. Senders claim a row for a lease
//! (`claimed_until`, database time), as the forge outbox does, so two
//! replicas never send one row at once; a row is `delivered` at most once.

use crate::db::{Exec, Row, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError, parse_enum};
use crate::model::{DueNotification, NotificationDelivery, NotificationRecord, notification_secret_name};
use crate::rows::new_id;
use crate::store::SqlStore;
use kiln_core::RunStatus;
use kiln_core::notify::{classify, wants};

const NOTIFICATION_COLS: &str = "n.id, n.repo_id, n.url, n.events, n.format, n.created_at";
const DELIVERY_COLS: &str = "d.id, d.notification_id, d.repo_id, d.run_id, d.event, d.status, d.attempts, \
    d.last_status_code, d.last_error, d.next_at, d.created_at, d.delivered_at, r.run_number";

fn notification_from_row(row: &Row) -> Result<NotificationRecord> {
    Ok(NotificationRecord {
        id: row.get("id")?,
        repo_id: row.get("repo_id")?,
        url: row.get("url")?,
        events: serde_json::from_str(row.str("events")?).unwrap_or_default(),
        format: row.get("format")?,
        created_at: row.get("created_at")?,
    })
}

fn delivery_from_row(row: &Row) -> Result<NotificationDelivery> {
    Ok(NotificationDelivery {
        id: row.get("id")?,
        notification_id: row.get("notification_id")?,
        repo_id: row.get("repo_id")?,
        run_id: row.get("run_id")?,
        run_number: row.get("run_number")?,
        event: row.get("event")?,
        status: row.get("status")?,
        attempts: row.get("attempts")?,
        last_status_code: row.get("last_status_code")?,
        last_error: row.get("last_error")?,
        next_at: row.get("next_at")?,
        created_at: row.get("created_at")?,
        delivered_at: row.get("delivered_at")?,
    })
}

/// Inside the transaction that ended `run_id` with `status`: one pending
/// delivery per notification of its repository that wants this end.
pub(crate) async fn enqueue_on_end(tx: &mut Tx, run_id: &str, status: RunStatus, now: i64) -> Result<()> {
    static PREVIOUS: Sql = Sql::new(|_| {
        format!(
            "SELECT status FROM runs WHERE repo_id = $1 AND workflow_path = $2 AND COALESCE(git_ref, '') = $3 \
             AND run_number < $4 AND status IN ({success}, {failed}) ORDER BY run_number DESC LIMIT 1",
            success = lit(RunStatus::Success),
            failed = lit(RunStatus::Failed),
        )
    });
    let subs: Vec<(String, String)> = tx
        .sql("SELECT n.id, n.events FROM notifications n JOIN runs r ON r.repo_id = n.repo_id WHERE r.id = $1 ORDER BY n.id")
        .bind(run_id)
        .all()
        .await?;
    if subs.is_empty() {
        return Ok(());
    }
    let (repo_id, workflow_path, git_ref, number): (String, String, Option<String>, i64) =
        tx.sql("SELECT repo_id, workflow_path, git_ref, run_number FROM runs WHERE id = $1").bind(run_id).one().await?;
    let previous = if status == RunStatus::Success {
        let s: Option<String> = tx
            .sql(&PREVIOUS)
            .bind(&repo_id)
            .bind(&workflow_path)
            .bind(git_ref.unwrap_or_default())
            .bind(number)
            .scalar_optional()
            .await?;
        s.as_deref().map(parse_enum::<RunStatus>).transpose()?
    } else {
        None
    };
    let Some(event) = classify(status, previous) else { return Ok(()) };
    for (id, events) in subs {
        let events: Vec<String> = serde_json::from_str(&events).unwrap_or_default();
        if !wants(&events, event) {
            continue;
        }
        tx.sql(
            "INSERT INTO notification_deliveries (id, notification_id, repo_id, run_id, event, status, next_at, \
             created_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $6) \
             ON CONFLICT (notification_id, run_id) DO NOTHING",
        )
        .bind(new_id())
        .bind(&id)
        .bind(&repo_id)
        .bind(run_id)
        .bind(event.as_str())
        .bind(now)
        .execute()
        .await?;
    }
    Ok(())
}

/// `NotifyStore::create_notification`: the notification and its sealed
/// secret in one transaction.
pub(crate) async fn create_notification(
    store: &SqlStore,
    n: &NotificationRecord,
    sealed_secret: &str,
) -> Result<NotificationRecord> {
    let created_at = store
        .transaction(Isolation::Serializable, &(n, sealed_secret), |tx, &(n, sealed)| {
            Box::pin(async move {
                let now = now(tx).await?;
                tx.sql(
                    "INSERT INTO notifications (id, repo_id, url, events, format, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(&n.id)
                .bind(&n.repo_id)
                .bind(&n.url)
                .bind(serde_json::to_string(&n.events).expect("events"))
                .bind(&n.format)
                .bind(now)
                .execute()
                .await?;
                tx.sql("INSERT INTO secrets (repo_id, name, value, updated_at) VALUES ($1, $2, $3, $4)")
                    .bind(&n.repo_id)
                    .bind(notification_secret_name(&n.id))
                    .bind(sealed)
                    .bind(now)
                    .execute()
                    .await?;
                Ok(now)
            })
        })
        .await?;
    Ok(NotificationRecord { created_at, ..n.clone() })
}

/// `NotifyStore::list_notifications`.
pub(crate) async fn list_notifications(store: &SqlStore, repo_id: &str) -> Result<Vec<NotificationRecord>> {
    static SQL: Sql =
        Sql::new(|_| format!("SELECT {NOTIFICATION_COLS} FROM notifications n WHERE n.repo_id = $1 ORDER BY n.id"));
    let rows = store.reader().await?.sql(&SQL).bind(repo_id).fetch_all().await?;
    rows.iter().map(notification_from_row).collect()
}

/// `NotifyStore::delete_notification`: the notification and its secret go;
/// its deliveries stay in the log, those still pending marked failed.
pub(crate) async fn delete_notification(store: &SqlStore, repo_id: &str, id: &str) -> Result<NotificationRecord> {
    static GET: Sql =
        Sql::new(|_| format!("SELECT {NOTIFICATION_COLS} FROM notifications n WHERE n.repo_id = $1 AND n.id = $2"));
    store
        .transaction(Isolation::Serializable, &(repo_id, id), |tx, &(repo_id, id)| {
            Box::pin(async move {
                let row = tx.sql(&GET).bind(repo_id).bind(id).fetch_optional().await?;
                let n = notification_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("notification {id}")))?)?;
                tx.sql("DELETE FROM notifications WHERE id = $1").bind(id).execute().await?;
                tx.sql("DELETE FROM secrets WHERE repo_id = $1 AND name = $2")
                    .bind(repo_id)
                    .bind(notification_secret_name(id))
                    .execute()
                    .await?;
                tx.sql(
                    "UPDATE notification_deliveries SET status = 'failed', last_error = 'the notification was removed', \
                     claimed_until = NULL WHERE notification_id = $1 AND status = 'pending'",
                )
                .bind(id)
                .execute()
                .await?;
                Ok(n)
            })
        })
        .await
}

/// `NotifyStore::due_notifications`: pending, due and unclaimed, oldest first.
pub(crate) async fn due_notifications(store: &SqlStore, limit: u32) -> Result<Vec<DueNotification>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT {DELIVERY_COLS}, n.url AS n_url, n.events AS n_events, n.format AS n_format, \
             n.created_at AS n_created_at FROM notification_deliveries d JOIN runs r ON r.id = d.run_id \
             LEFT JOIN notifications n ON n.id = d.notification_id \
             WHERE d.status = 'pending' AND d.next_at <= {now} \
             AND (d.claimed_until IS NULL OR d.claimed_until < {now}) ORDER BY d.created_at, d.id LIMIT $1",
            now = d.now_ms
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(limit as i64).fetch_all().await?;
    rows.iter()
        .map(|row| {
            let delivery = delivery_from_row(row)?;
            let url: Option<String> = row.get("n_url")?;
            let target = match url {
                None => None,
                Some(url) => Some(NotificationRecord {
                    id: delivery.notification_id.clone(),
                    repo_id: delivery.repo_id.clone(),
                    url,
                    events: serde_json::from_str(row.str("n_events")?).unwrap_or_default(),
                    format: row.get("n_format")?,
                    created_at: row.get("n_created_at")?,
                }),
            };
            Ok(DueNotification { delivery, target })
        })
        .collect()
}

/// `NotifyStore::claim_notification`: one sender holds a pending row for
/// `ttl_ms`; each claim counts one attempt.
pub(crate) async fn claim_notification(store: &SqlStore, id: &str, ttl_ms: i64) -> Result<bool> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE notification_deliveries SET claimed_until = {now} + $2, attempts = attempts + 1 \
             WHERE id = $1 AND status = 'pending' AND (claimed_until IS NULL OR claimed_until < {now})",
            now = d.now_ms
        )
    });
    Ok(store.writer().await?.sql(&SQL).bind(id).bind(ttl_ms).execute().await? == 1)
}

/// `NotifyStore::notification_delivered`.
pub(crate) async fn notification_delivered(store: &SqlStore, id: &str, status_code: i64) -> Result<bool> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE notification_deliveries SET status = 'delivered', last_status_code = $2, last_error = NULL, \
             delivered_at = {now}, claimed_until = NULL WHERE id = $1 AND status = 'pending'",
            now = d.now_ms
        )
    });
    Ok(store.writer().await?.sql(&SQL).bind(id).bind(status_code).execute().await? == 1)
}

/// `NotifyStore::notification_retry`.
pub(crate) async fn notification_retry(
    store: &SqlStore,
    id: &str,
    delay_ms: i64,
    status_code: Option<i64>,
    error: &str,
) -> Result<()> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE notification_deliveries SET next_at = {now} + $2, last_status_code = $3, last_error = $4, \
             claimed_until = NULL WHERE id = $1 AND status = 'pending'",
            now = d.now_ms
        )
    });
    store.writer().await?.sql(&SQL).bind(id).bind(delay_ms).bind(status_code).bind(error).execute().await?;
    Ok(())
}

/// `NotifyStore::notification_failed`.
pub(crate) async fn notification_failed(
    store: &SqlStore,
    id: &str,
    status_code: Option<i64>,
    error: &str,
) -> Result<()> {
    store
        .writer()
        .await?
        .sql(
            "UPDATE notification_deliveries SET status = 'failed', last_status_code = $2, last_error = $3, \
             claimed_until = NULL WHERE id = $1 AND status = 'pending'",
        )
        .bind(id)
        .bind(status_code)
        .bind(error)
        .execute()
        .await?;
    Ok(())
}

/// `NotifyStore::notification_deliveries`: newest first.
pub(crate) async fn notification_deliveries(
    store: &SqlStore,
    repo_id: &str,
    limit: u32,
) -> Result<Vec<NotificationDelivery>> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT {DELIVERY_COLS} FROM notification_deliveries d JOIN runs r ON r.id = d.run_id \
             WHERE d.repo_id = $1 ORDER BY d.created_at DESC, d.id DESC LIMIT $2"
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(repo_id).bind(limit as i64).fetch_all().await?;
    rows.iter().map(delivery_from_row).collect()
}

/// `NotifyStore::set_repo_public`.
pub(crate) async fn set_repo_public(store: &SqlStore, repo_id: &str, public: bool) -> Result<()> {
    let n = store
        .writer()
        .await?
        .sql("UPDATE repos SET is_public = $2 WHERE id = $1")
        .bind(repo_id)
        .bind(public as i64)
        .execute()
        .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("repository {repo_id}")));
    }
    Ok(())
}

/// `NotifyStore::badge_status`: the status of the newest run of the
/// repository on `branch` (its ref `refs/heads/BRANCH` or `BRANCH`) whose
/// workflow is one of `workflow_paths` (empty: any).
pub(crate) async fn badge_status(
    store: &SqlStore,
    repo_id: &str,
    branch: &str,
    workflow_paths: &[String],
) -> Result<Option<RunStatus>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT status FROM runs WHERE repo_id = $1 AND (git_ref = $2 OR git_ref = $3) \
             AND ($4 = 0 OR workflow_path IN (SELECT value FROM {paths})) ORDER BY run_number DESC LIMIT 1",
            paths = d.json_texts(5)
        )
    });
    let status: Option<String> = store
        .reader()
        .await?
        .sql(&SQL)
        .bind(repo_id)
        .bind(format!("refs/heads/{branch}"))
        .bind(branch)
        .bind(workflow_paths.len() as i64)
        .bind(serde_json::to_string(workflow_paths).expect("paths"))
        .scalar_optional()
        .await?;
    status.as_deref().map(parse_enum::<RunStatus>).transpose()
}
