//! The forge loop's records (issue 14): webhook deliveries (accepted before
//! the 2xx, planned from here after it), commit statuses to report (an
//! outbox whose state follows the run), ref heads for reconciliation,
//! schedule cursors, and the leader lease of loops that run on one replica.

use crate::db::{Exec, Row, Tx, now};
use crate::dialect::{Isolation, Sql, lit};
use crate::error::{Result, StoreError};
use crate::model::{DeliveryRecord, NewDelivery, RepoForge, ReportTodo};
use crate::rows::new_id;
use crate::store::SqlStore;
use kiln_core::RunStatus;

const DELIVERY_COLS: &str = "id, repo_id, forge, delivery_key, event, payload_digest, trigger_event, trust, status, \
    message, run_ids, attempts, created_at, planned_at";

fn delivery_from_row(row: &Row) -> Result<DeliveryRecord> {
    Ok(DeliveryRecord {
        id: row.get("id")?,
        repo_id: row.get("repo_id")?,
        forge: row.get("forge")?,
        delivery_key: row.get("delivery_key")?,
        event: row.get("event")?,
        payload_digest: row.get("payload_digest")?,
        trigger_event: row.get("trigger_event")?,
        trust: row.get("trust")?,
        status: row.get("status")?,
        message: row.get("message")?,
        run_ids: serde_json::from_str(row.str("run_ids")?).unwrap_or_default(),
        attempts: row.get("attempts")?,
        created_at: row.get("created_at")?,
        planned_at: row.get("planned_at")?,
    })
}

/// `ForgeStore::record_delivery`: one statement under the write lock (the
/// acknowledgement waits for it); a redelivery is answered from a read.
pub(crate) async fn record_delivery(store: &SqlStore, d: &NewDelivery) -> Result<(DeliveryRecord, bool)> {
    static EXISTING: Sql = Sql::new(|_| {
        format!("SELECT {DELIVERY_COLS} FROM deliveries WHERE repo_id = $1 AND forge = $2 AND delivery_key = $3")
    });
    static INSERT: Sql = Sql::new(|dl| {
        format!(
            "INSERT INTO deliveries (id, repo_id, forge, delivery_key, event, payload_digest, trigger_event, \
             trust, status, message, next_at, created_at, planned_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, {now}, {now}, \
             CASE WHEN $9 = 'pending' THEN NULL ELSE {now} END) \
             ON CONFLICT (repo_id, forge, delivery_key) DO NOTHING",
            now = dl.now_ms
        )
    });
    let existing =
        |row: Option<Row>| -> Result<Option<DeliveryRecord>> { row.as_ref().map(delivery_from_row).transpose() };
    let found = store
        .reader()
        .await?
        .sql(&EXISTING)
        .bind(&d.repo_id)
        .bind(&d.forge)
        .bind(&d.delivery_key)
        .fetch_optional()
        .await?;
    if let Some(rec) = existing(found)? {
        return Ok((rec, false));
    }
    let inserted = store
        .writer()
        .await?
        .sql(&INSERT)
        .bind(new_id())
        .bind(&d.repo_id)
        .bind(&d.forge)
        .bind(&d.delivery_key)
        .bind(&d.event)
        .bind(&d.payload_digest)
        .bind(&d.trigger_event)
        .bind(&d.trust)
        .bind(&d.status)
        .bind(&d.message)
        .execute()
        .await?;
    let found = store
        .reader()
        .await?
        .sql(&EXISTING)
        .bind(&d.repo_id)
        .bind(&d.forge)
        .bind(&d.delivery_key)
        .fetch_optional()
        .await?;
    let rec = existing(found)?.ok_or_else(|| StoreError::Invalid("a recorded delivery is not readable".into()))?;
    Ok((rec, inserted == 1))
}

/// `ForgeStore::get_delivery`.
pub(crate) async fn get_delivery(store: &SqlStore, id: &str) -> Result<DeliveryRecord> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {DELIVERY_COLS} FROM deliveries WHERE id = $1"));
    let row = store.reader().await?.sql(&SQL).bind(id).fetch_optional().await?;
    delivery_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("delivery {id}")))?)
}

/// `ForgeStore::list_deliveries`.
pub(crate) async fn list_deliveries(store: &SqlStore, repo_id: &str, limit: u32) -> Result<Vec<DeliveryRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!("SELECT {DELIVERY_COLS} FROM deliveries WHERE repo_id = $1 ORDER BY created_at DESC, id LIMIT $2")
    });
    let rows = store.reader().await?.sql(&SQL).bind(repo_id).bind(limit as i64).fetch_all().await?;
    rows.iter().map(delivery_from_row).collect()
}

/// `ForgeStore::due_deliveries`.
pub(crate) async fn due_deliveries(store: &SqlStore, limit: u32) -> Result<Vec<DeliveryRecord>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT {DELIVERY_COLS} FROM deliveries WHERE status = 'pending' AND next_at <= {now} \
             AND (claimed_until IS NULL OR claimed_until < {now}) ORDER BY created_at LIMIT $1",
            now = d.now_ms
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(limit as i64).fetch_all().await?;
    rows.iter().map(delivery_from_row).collect()
}

/// `ForgeStore::delivery_backlog` (through the `deliveries_pending` index).
pub(crate) async fn delivery_backlog(store: &SqlStore, delayed_after_ms: i64) -> Result<crate::model::DeliveryBacklog> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN created_at < {now} - $1 THEN 1 ELSE 0 END), 0), \
             COALESCE({now} - MIN(created_at), 0) FROM deliveries WHERE status = 'pending'",
            now = d.now_ms
        )
    });
    let (pending, delayed, oldest): (i64, i64, i64) =
        store.reader().await?.sql(&SQL).bind(delayed_after_ms).one().await?;
    Ok(crate::model::DeliveryBacklog {
        pending: u64::try_from(pending).unwrap_or(0),
        delayed: u64::try_from(delayed).unwrap_or(0),
        oldest_ms: oldest.max(0),
    })
}

/// `ForgeStore::claim_delivery`.
pub(crate) async fn claim_delivery(store: &SqlStore, id: &str, ttl_ms: i64) -> Result<bool> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE deliveries SET claimed_until = {now} + $2, attempts = attempts + 1 \
             WHERE id = $1 AND status = 'pending' AND (claimed_until IS NULL OR claimed_until < {now})",
            now = d.now_ms
        )
    });
    Ok(store.writer().await?.sql(&SQL).bind(id).bind(ttl_ms).execute().await? == 1)
}

/// `ForgeStore::finish_delivery`.
pub(crate) async fn finish_delivery(
    store: &SqlStore,
    id: &str,
    status: &str,
    message: Option<&str>,
    run_ids: &[String],
) -> Result<()> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE deliveries SET status = $2, message = $3, run_ids = $4, planned_at = {now}, claimed_until = NULL \
             WHERE id = $1",
            now = d.now_ms
        )
    });
    let runs = serde_json::to_string(run_ids).expect("ids");
    store.writer().await?.sql(&SQL).bind(id).bind(status).bind(message).bind(runs).execute().await?;
    Ok(())
}

/// `ForgeStore::defer_delivery`.
pub(crate) async fn defer_delivery(store: &SqlStore, id: &str, delay_ms: i64, message: &str) -> Result<()> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE deliveries SET next_at = {now} + $2, message = $3, claimed_until = NULL WHERE id = $1",
            now = d.now_ms
        )
    });
    store.writer().await?.sql(&SQL).bind(id).bind(delay_ms).bind(message).execute().await?;
    Ok(())
}

/// A report row, inside the transaction that accepted its run (or alone
/// for a fixed state). Older reports of the same commit and context are
/// superseded: never sent after this one.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn insert_report(
    tx: &mut Tx,
    repo_id: &str,
    commit_sha: &str,
    context: &str,
    run_id: Option<&str>,
    fixed_state: Option<&str>,
    description: &str,
    now: i64,
) -> Result<String> {
    tx.sql("UPDATE forge_reports SET done = 1 WHERE repo_id = $1 AND commit_sha = $2 AND context = $3 AND done = 0")
        .bind(repo_id)
        .bind(commit_sha)
        .bind(context)
        .execute()
        .await?;
    let id = new_id();
    tx.sql(
        "INSERT INTO forge_reports (id, repo_id, commit_sha, context, run_id, fixed_state, description, next_at, \
         created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
    )
    .bind(&id)
    .bind(repo_id)
    .bind(commit_sha)
    .bind(context)
    .bind(run_id)
    .bind(fixed_state)
    .bind(description)
    .bind(now)
    .execute()
    .await?;
    Ok(id)
}

/// `ForgeStore::create_report`.
pub(crate) async fn create_report(
    store: &SqlStore,
    repo_id: &str,
    commit_sha: &str,
    context: &str,
    fixed_state: &str,
    description: &str,
) -> Result<String> {
    let args = (repo_id, commit_sha, context, fixed_state, description);
    store
        .transaction(Isolation::Serializable, &args, |tx, &(repo_id, commit_sha, context, fixed_state, description)| {
            Box::pin(async move {
                let now = now(tx).await?;
                insert_report(tx, repo_id, commit_sha, context, None, Some(fixed_state), description, now).await
            })
        })
        .await
}

/// The commit state a run's status maps to.
fn run_state_sql() -> String {
    format!(
        "CASE u.status WHEN {queued} THEN 'pending' WHEN {running} THEN 'running' WHEN {cancelling} THEN 'running' \
         WHEN {success} THEN 'success' WHEN {failed} THEN 'failure' WHEN {cancelled} THEN 'cancelled' END",
        queued = lit(RunStatus::Queued),
        running = lit(RunStatus::Running),
        cancelling = lit(RunStatus::Cancelling),
        success = lit(RunStatus::Success),
        failed = lit(RunStatus::Failed),
        cancelled = lit(RunStatus::Cancelled),
    )
}

/// `ForgeStore::due_reports`: open reports whose wanted state differs from
/// the one sent, not claimed, and with no older report of the same commit
/// and context still being sent.
pub(crate) async fn due_reports(store: &SqlStore, limit: u32) -> Result<Vec<ReportTodo>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT * FROM (SELECT f.id, f.repo_id, f.commit_sha, f.context, f.run_id, f.description, f.sent_state, \
             f.attempts, f.created_at, COALESCE(f.fixed_state, {state}) AS state, u.message AS run_message, \
             u.created_at AS run_created_at, u.finished_at AS run_finished_at, u.test_summary \
             FROM forge_reports f LEFT JOIN runs u ON u.id = f.run_id \
             WHERE f.done = 0 AND f.next_at <= {now} AND (f.claimed_until IS NULL OR f.claimed_until < {now}) \
             AND NOT EXISTS (SELECT 1 FROM forge_reports o WHERE o.repo_id = f.repo_id \
               AND o.commit_sha = f.commit_sha AND o.context = f.context AND o.created_at < f.created_at \
               AND o.claimed_until IS NOT NULL AND o.claimed_until >= {now})) q \
             WHERE q.state IS NOT NULL AND q.state <> COALESCE(q.sent_state, '') ORDER BY q.created_at LIMIT $1",
            state = run_state_sql(),
            now = d.now_ms,
        )
    });
    let rows = store.reader().await?.sql(&SQL).bind(limit as i64).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok(ReportTodo {
                id: r.get("id")?,
                repo_id: r.get("repo_id")?,
                commit_sha: r.get("commit_sha")?,
                context: r.get("context")?,
                run_id: r.get("run_id")?,
                state: r.get("state")?,
                description: r.get("description")?,
                sent_state: r.get("sent_state")?,
                attempts: r.get("attempts")?,
                run_message: r.get("run_message")?,
                run_created_at: r.get("run_created_at")?,
                run_finished_at: r.get("run_finished_at")?,
                test_summary: r.get::<Option<String>>("test_summary")?.and_then(|s| serde_json::from_str(&s).ok()),
            })
        })
        .collect()
}

/// `ForgeStore::claim_report`.
pub(crate) async fn claim_report(store: &SqlStore, id: &str, ttl_ms: i64) -> Result<bool> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE forge_reports SET claimed_until = {now} + $2 \
             WHERE id = $1 AND done = 0 AND (claimed_until IS NULL OR claimed_until < {now})",
            now = d.now_ms
        )
    });
    Ok(store.writer().await?.sql(&SQL).bind(id).bind(ttl_ms).execute().await? == 1)
}

/// `ForgeStore::report_sent`.
pub(crate) async fn report_sent(
    store: &SqlStore,
    id: &str,
    state: &str,
    done: bool,
    error: Option<&str>,
) -> Result<()> {
    store
        .writer()
        .await?
        .sql(
            "UPDATE forge_reports SET sent_state = $2, done = CASE WHEN done = 1 THEN 1 ELSE $3 END, attempts = 0, \
             claimed_until = NULL, last_error = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(state)
        .bind(done as i64)
        .bind(error)
        .execute()
        .await?;
    Ok(())
}

/// `ForgeStore::report_retry`.
pub(crate) async fn report_retry(store: &SqlStore, id: &str, delay_ms: i64, error: &str) -> Result<()> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "UPDATE forge_reports SET attempts = attempts + 1, next_at = {now} + $2, claimed_until = NULL, \
             last_error = $3 WHERE id = $1",
            now = d.now_ms
        )
    });
    store.writer().await?.sql(&SQL).bind(id).bind(delay_ms).bind(error).execute().await?;
    Ok(())
}

/// `ForgeStore::reports_of_commit`: (context, run id, sent state, done) in creation order.
pub(crate) async fn reports_of_commit(
    store: &SqlStore,
    repo_id: &str,
    commit_sha: &str,
) -> Result<Vec<(String, Option<String>, Option<String>, bool)>> {
    let rows: Vec<(String, Option<String>, Option<String>, i64)> = store
        .reader()
        .await?
        .sql(
            "SELECT context, run_id, sent_state, done FROM forge_reports WHERE repo_id = $1 AND commit_sha = $2 \
             ORDER BY created_at, id",
        )
        .bind(repo_id)
        .bind(commit_sha)
        .all()
        .await?;
    Ok(rows.into_iter().map(|(c, r, s, d)| (c, r, s, d != 0)).collect())
}

/// `ForgeStore::record_ref_head`.
pub(crate) async fn record_ref_head(store: &SqlStore, repo_id: &str, git_ref: &str, sha: &str) -> Result<()> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "INSERT INTO ref_heads (repo_id, git_ref, sha, updated_at) VALUES ($1, $2, $3, {now}) \
             ON CONFLICT (repo_id, git_ref) DO UPDATE SET sha = excluded.sha, updated_at = excluded.updated_at",
            now = d.now_ms
        )
    });
    store.writer().await?.sql(&SQL).bind(repo_id).bind(git_ref).bind(sha).execute().await?;
    Ok(())
}

/// `ForgeStore::ref_heads`.
pub(crate) async fn ref_heads(store: &SqlStore, repo_id: &str) -> Result<Vec<(String, String)>> {
    store
        .reader()
        .await?
        .sql("SELECT git_ref, sha FROM ref_heads WHERE repo_id = $1 ORDER BY git_ref")
        .bind(repo_id)
        .all()
        .await
}

/// `ForgeStore::schedule_cursor`.
pub(crate) async fn schedule_cursor(store: &SqlStore, repo_id: &str, path: &str) -> Result<Option<i64>> {
    store
        .reader()
        .await?
        .sql("SELECT last_tick FROM schedule_cursors WHERE repo_id = $1 AND workflow_path = $2")
        .bind(repo_id)
        .bind(path)
        .scalar_optional()
        .await
}

/// `ForgeStore::advance_schedule_cursor`: compare-and-set.
pub(crate) async fn advance_schedule_cursor(
    store: &SqlStore,
    repo_id: &str,
    path: &str,
    from: Option<i64>,
    to: i64,
) -> Result<bool> {
    let mut w = store.writer().await?;
    let n = match from {
        None => {
            w.sql(
                "INSERT INTO schedule_cursors (repo_id, workflow_path, last_tick) VALUES ($1, $2, $3) \
                 ON CONFLICT (repo_id, workflow_path) DO NOTHING",
            )
            .bind(repo_id)
            .bind(path)
            .bind(to)
            .execute()
            .await?
        }
        Some(from) => {
            w.sql(
                "UPDATE schedule_cursors SET last_tick = $4 WHERE repo_id = $1 AND workflow_path = $2 \
                 AND last_tick = $3",
            )
            .bind(repo_id)
            .bind(path)
            .bind(from)
            .bind(to)
            .execute()
            .await?
        }
    };
    Ok(n == 1)
}

/// `ForgeStore::acquire_lease`: take or renew the lease `name` for `holder`.
pub(crate) async fn acquire_lease(store: &SqlStore, name: &str, holder: &str, ttl_ms: i64) -> Result<bool> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "INSERT INTO leader_leases (name, holder, expires_at) VALUES ($1, $2, {now} + $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leader_leases.holder = excluded.holder OR leader_leases.expires_at < {now}",
            now = d.now_ms
        )
    });
    Ok(store.writer().await?.sql(&SQL).bind(name).bind(holder).bind(ttl_ms).execute().await? == 1)
}

/// `ForgeStore::release_lease`.
pub(crate) async fn release_lease(store: &SqlStore, name: &str, holder: &str) -> Result<()> {
    store
        .writer()
        .await?
        .sql("DELETE FROM leader_leases WHERE name = $1 AND holder = $2")
        .bind(name)
        .bind(holder)
        .execute()
        .await?;
    Ok(())
}

/// `ForgeStore::lease_holders`.
pub(crate) async fn lease_holders(store: &SqlStore, prefix: &str) -> Result<Vec<String>> {
    static SQL: Sql = Sql::new(|d| {
        format!(
            "SELECT holder FROM leader_leases WHERE name LIKE $1 ESCAPE '\\' AND expires_at >= {now} ORDER BY holder",
            now = d.now_ms
        )
    });
    let pattern: String = prefix
        .chars()
        .flat_map(|c| match c {
            '\\' | '%' | '_' => vec!['\\', c],
            c => vec![c],
        })
        .chain(['%'])
        .collect();
    let rows: Vec<(String,)> = store.reader().await?.sql(&SQL).bind(pattern).all().await?;
    Ok(rows.into_iter().map(|(h,)| h).collect())
}

/// `ForgeStore::set_repo_forge`.
pub(crate) async fn set_repo_forge(store: &SqlStore, repo_id: &str, f: &RepoForge) -> Result<()> {
    let n = store
        .writer()
        .await?
        .sql(
            "UPDATE repos SET forge = $2, forge_url = $3, forge_repo = $4, forge_token = $5, default_branch = $6, \
             protected_refs = $7, pull_request_trust = $8, poll_interval_ms = $9 WHERE id = $1",
        )
        .bind(repo_id)
        .bind(&f.forge)
        .bind(&f.forge_url)
        .bind(&f.forge_repo)
        .bind(&f.forge_token)
        .bind(&f.default_branch)
        .bind(serde_json::to_string(&f.protected_refs).expect("patterns"))
        .bind(&f.pull_request_trust)
        .bind(f.poll_interval_ms)
        .execute()
        .await?;
    if n == 0 {
        return Err(StoreError::NotFound(format!("repository {repo_id}")));
    }
    Ok(())
}

/// `ForgeStore::set_webhook_secret`.
pub(crate) async fn set_webhook_secret(store: &SqlStore, repo_id: &str, secret: Option<&str>) -> Result<()> {
    store
        .writer()
        .await?
        .sql("UPDATE repos SET webhook_secret = $2 WHERE id = $1")
        .bind(repo_id)
        .bind(secret)
        .execute()
        .await?;
    Ok(())
}

/// `ForgeStore::repos_to_poll`: repositories with polling on whose interval
/// passed; each is marked polled now, so one replica polls it per interval.
pub(crate) async fn repos_to_poll(store: &SqlStore) -> Result<Vec<String>> {
    static DUE: Sql = Sql::new(|d| {
        format!(
            "SELECT id FROM repos WHERE poll_interval_ms IS NOT NULL \
             AND (polled_at IS NULL OR polled_at + poll_interval_ms <= {now}) ORDER BY name",
            now = d.now_ms
        )
    });
    static MARK: Sql = Sql::new(|d| {
        format!(
            "UPDATE repos SET polled_at = {now} WHERE id = $1 \
             AND (polled_at IS NULL OR polled_at + poll_interval_ms <= {now})",
            now = d.now_ms
        )
    });
    let due: Vec<String> = store.reader().await?.sql(&DUE).scalars().await?;
    let mut out = Vec::new();
    let mut w = store.writer().await?;
    for id in due {
        if w.sql(&MARK).bind(&id).execute().await? == 1 {
            out.push(id);
        }
    }
    Ok(out)
}

/// `ForgeStore::report_context_of_run`.
pub(crate) async fn report_context_of_run(store: &SqlStore, run_id: &str) -> Result<Option<String>> {
    store
        .reader()
        .await?
        .sql("SELECT context FROM forge_reports WHERE run_id = $1 ORDER BY created_at LIMIT 1")
        .bind(run_id)
        .scalar_optional()
        .await
}
