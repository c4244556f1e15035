//! Build cache entries (spec 000 §10, §14; issue 15): an entry binds
//! (repository, namespace, key) to a sealed generation saved by a live
//! attempt, first writer wins. Lookups name the namespaces the caller may
//! read (the server decides them from the run's trust); eviction deletes
//! entries, and the garbage collector then deletes their unbound bytes.

use crate::db::{Exec, Row, now};
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{CacheBinding, CacheEntry, CacheHit, NewCacheEntry};
use crate::rows::{GEN_COLS, gen_from_row};
use crate::store::{SqlStore, lock_job};
use crate::tx::attempt::require_live;

/// The artifact name a cache archive is uploaded under (never a declared
/// artifact's: `@` is not allowed in those).
pub const CACHE_ARTIFACT: &str = "@cache";

/// The columns of [`entry_from_row`].
const ENTRY_COLS: &str = "repo_id, namespace, cache_key, kind, generation_id, size_bytes, sha256, created_at, \
    last_used_at, hits, conflicts, prefix, build_ms";

fn entry_from_row(row: &Row) -> Result<CacheEntry> {
    Ok(CacheEntry {
        repo_id: row.get("repo_id")?,
        namespace: row.get("namespace")?,
        key: row.get("cache_key")?,
        kind: row.get("kind")?,
        generation_id: row.get("generation_id")?,
        size_bytes: row.get("size_bytes")?,
        sha256: row.get("sha256")?,
        created_at: row.get("created_at")?,
        last_used_at: row.get("last_used_at")?,
        hits: row.get("hits")?,
        conflicts: row.get("conflicts")?,
        prefix: row.get("prefix")?,
        build_ms: row.get("build_ms")?,
    })
}

/// `CacheStore::bind_cache`.
pub(crate) async fn bind_cache(
    store: &SqlStore,
    job_id: &str,
    epoch: i64,
    entry: NewCacheEntry<'_>,
) -> Result<CacheBinding> {
    static GEN: Sql = Sql::new(|_| format!("SELECT {GEN_COLS} FROM artifact_generations g WHERE g.id = $1"));
    let args = (job_id, epoch, entry);
    store
        .transaction(Isolation::Serializable, &args, |tx, &(job_id, epoch, entry)| {
            let NewCacheEntry { generation_id, namespace, key, kind, prefix, build_ms } = entry;
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                // A fenced attempt publishes nothing, caches included.
                let (job, _, now) = require_live(tx, job_id, epoch).await?;
                let row = tx.sql(&GEN).bind(generation_id).fetch_optional().await?;
                let g =
                    gen_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("upload session {generation_id}")))?)?;
                if g.job_id != job_id || g.epoch != epoch || g.name != CACHE_ARTIFACT {
                    return Err(StoreError::NotFound(format!(
                        "cache upload {generation_id} of job {job_id} epoch {epoch}"
                    )));
                }
                if g.state != "sealed" {
                    return Err(StoreError::Conflict(format!(
                        "cache upload {generation_id} is {}, not sealed",
                        g.state
                    )));
                }
                let repo_id: String =
                    tx.sql("SELECT repo_id FROM runs WHERE id = $1").bind(&job.run_id).scalar().await?;
                let inserted = tx
                    .sql(
                        "INSERT INTO cache_entries (repo_id, namespace, cache_key, kind, generation_id, size_bytes, \
                             sha256, created_at, last_used_at, prefix, build_ms) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10) \
                             ON CONFLICT (repo_id, namespace, cache_key) DO NOTHING",
                    )
                    .bind(&repo_id)
                    .bind(namespace)
                    .bind(key)
                    .bind(kind)
                    .bind(generation_id)
                    .bind(g.expected_size)
                    .bind(&g.expected_sha256)
                    .bind(now)
                    .bind(prefix)
                    .bind(build_ms)
                    .execute()
                    .await?;
                if inserted == 1 {
                    return Ok(CacheBinding { bound: true, conflict: false });
                }
                let (existing_gen, existing_sha): (String, String) = tx
                    .sql(
                        "SELECT generation_id, sha256 FROM cache_entries WHERE repo_id = $1 AND namespace = $2 \
                             AND cache_key = $3",
                    )
                    .bind(&repo_id)
                    .bind(namespace)
                    .bind(key)
                    .one()
                    .await?;
                let conflict = existing_gen != generation_id && existing_sha != g.expected_sha256;
                if conflict {
                    tx.sql(
                        "UPDATE cache_entries SET conflicts = conflicts + 1 WHERE repo_id = $1 AND namespace = $2 \
                             AND cache_key = $3",
                    )
                    .bind(&repo_id)
                    .bind(namespace)
                    .bind(key)
                    .execute()
                    .await?;
                }
                Ok(CacheBinding { bound: existing_gen == generation_id, conflict })
            })
        })
        .await
}

/// `CacheStore::lookup_cache`: the first of `candidates` (namespace, key)
/// with an entry whose bytes are still sealed; its last use is now.
pub(crate) async fn lookup_cache(
    store: &SqlStore,
    repo_id: &str,
    candidates: &[(String, String)],
) -> Result<Option<CacheHit>> {
    static FIND: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS}, c.namespace, c.cache_key, c.build_ms FROM cache_entries c \
             JOIN artifact_generations g ON g.id = c.generation_id \
             WHERE c.repo_id = $1 AND c.namespace = $2 AND c.cache_key = $3 AND g.state = 'sealed'"
        )
    });
    static TOUCH: Sql = Sql::new(|d| {
        format!(
            "UPDATE cache_entries SET last_used_at = {now}, hits = hits + 1 \
             WHERE repo_id = $1 AND namespace = $2 AND cache_key = $3",
            now = d.now_ms
        )
    });
    for (namespace, key) in candidates {
        let row = store.reader().await?.sql(&FIND).bind(repo_id).bind(namespace).bind(key).fetch_optional().await?;
        if let Some(row) = row {
            let generation = gen_from_row(&row)?;
            let build_ms = row.get("build_ms")?;
            store.writer().await?.sql(&TOUCH).bind(repo_id).bind(namespace).bind(key).execute().await?;
            return Ok(Some(CacheHit { namespace: namespace.clone(), key: key.clone(), generation, build_ms }));
        }
    }
    Ok(None)
}

/// `CacheStore::lookup_cache_prefix`.
pub(crate) async fn lookup_cache_prefix(
    store: &SqlStore,
    repo_id: &str,
    prefixes: &[(String, String)],
) -> Result<Option<CacheHit>> {
    static FIND: Sql = Sql::new(|_| {
        format!(
            "SELECT {GEN_COLS}, c.namespace, c.cache_key, c.build_ms FROM cache_entries c \
             JOIN artifact_generations g ON g.id = c.generation_id \
             WHERE c.repo_id = $1 AND c.namespace = $2 AND c.prefix = $3 AND g.state = 'sealed' \
             ORDER BY c.last_used_at DESC, c.created_at DESC LIMIT 1"
        )
    });
    let mut exact = Vec::new();
    for (namespace, prefix) in prefixes {
        let row = store.reader().await?.sql(&FIND).bind(repo_id).bind(namespace).bind(prefix).fetch_optional().await?;
        if let Some(row) = row {
            exact.push((namespace.clone(), row.get::<String>("cache_key")?));
            break;
        }
    }
    // Marked used like an exact hit (and gone if evicted meanwhile).
    lookup_cache(store, repo_id, &exact).await
}

/// `CacheStore::evict_caches`: entries unused for `ttl_ms`, then the least
/// recently used of each repository over `repo_quota`, then of all over
/// `global_budget` (bytes). Returns the evicted entries.
pub(crate) async fn evict_caches(
    store: &SqlStore,
    ttl_ms: i64,
    repo_quota: i64,
    global_budget: i64,
) -> Result<Vec<CacheEntry>> {
    static ALL: Sql = Sql::new(|_| format!("SELECT {ENTRY_COLS} FROM cache_entries ORDER BY last_used_at DESC"));
    let now = now(&mut store.reader().await?).await?;
    let rows = store.reader().await?.sql(&ALL).fetch_all().await?;
    let entries = rows.iter().map(entry_from_row).collect::<Result<Vec<_>>>()?;
    // Newest use first: walk and keep while within the budgets.
    let mut per_repo: std::collections::HashMap<&str, i64> = Default::default();
    let mut global = 0i64;
    let mut evict = Vec::new();
    for e in &entries {
        let repo = per_repo.entry(e.repo_id.as_str()).or_default();
        let expired = e.last_used_at < now - ttl_ms;
        if expired || *repo + e.size_bytes > repo_quota || global + e.size_bytes > global_budget {
            evict.push(e.clone());
            continue;
        }
        *repo += e.size_bytes;
        global += e.size_bytes;
    }
    let mut w = store.writer().await?;
    let mut done = Vec::new();
    for e in evict {
        // Only if unused since it was read: a restore that just touched it wins.
        let n = w
            .sql(
                "DELETE FROM cache_entries WHERE repo_id = $1 AND namespace = $2 AND cache_key = $3 \
                 AND last_used_at = $4",
            )
            .bind(&e.repo_id)
            .bind(&e.namespace)
            .bind(&e.key)
            .bind(e.last_used_at)
            .execute()
            .await?;
        if n == 1 {
            done.push(e);
        }
    }
    Ok(done)
}

/// `CacheStore::list_caches`.
pub(crate) async fn list_caches(store: &SqlStore, repo_id: &str) -> Result<Vec<CacheEntry>> {
    static LIST: Sql =
        Sql::new(|_| format!("SELECT {ENTRY_COLS} FROM cache_entries WHERE repo_id = $1 ORDER BY last_used_at DESC"));
    let rows = store.reader().await?.sql(&LIST).bind(repo_id).fetch_all().await?;
    rows.iter().map(entry_from_row).collect()
}

/// `CacheStore::get_cache`.
pub(crate) async fn get_cache(
    store: &SqlStore,
    repo_id: &str,
    namespace: &str,
    key: &str,
) -> Result<Option<CacheEntry>> {
    static GET: Sql = Sql::new(|_| {
        format!("SELECT {ENTRY_COLS} FROM cache_entries WHERE repo_id = $1 AND namespace = $2 AND cache_key = $3")
    });
    let row = store.reader().await?.sql(&GET).bind(repo_id).bind(namespace).bind(key).fetch_optional().await?;
    row.as_ref().map(entry_from_row).transpose()
}

/// `CacheStore::report_cache`: what the live attempt says about its cache.
pub(crate) async fn report_cache(store: &SqlStore, job_id: &str, epoch: i64, report: &str) -> Result<()> {
    store
        .transaction(Isolation::Serializable, &(job_id, epoch, report), |tx, &(job_id, epoch, report)| {
            Box::pin(async move {
                require_live(tx, job_id, epoch).await?;
                tx.sql("UPDATE jobs SET cache_result = $1 WHERE id = $2").bind(report).bind(job_id).execute().await?;
                Ok(())
            })
        })
        .await
}

/// `CacheStore::remove_cache`: delete the entry if it still names `generation_id`.
pub(crate) async fn remove_cache(
    store: &SqlStore,
    repo_id: &str,
    namespace: &str,
    key: &str,
    generation_id: &str,
) -> Result<bool> {
    let n = store
        .writer()
        .await?
        .sql(
            "DELETE FROM cache_entries WHERE repo_id = $1 AND namespace = $2 AND cache_key = $3 AND generation_id = $4",
        )
        .bind(repo_id)
        .bind(namespace)
        .bind(key)
        .bind(generation_id)
        .execute()
        .await?;
    Ok(n == 1)
}
