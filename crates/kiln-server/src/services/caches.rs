//! Build caches, server side (spec 000 §10, §14; issue 15). The agent keys
//! and archives; the server decides who may read and write which namespace
//! (from the run's trust, frozen at acceptance), binds a saved archive to
//! its key first-writer-wins, and hands out download capabilities. A digest
//! grants nothing: lookups are authorized by the attempt token and the
//! run's namespaces, and an archive is uploaded through the live epoch's
//! upload session like any other publication.

use crate::error::{ApiErr, ApiResult};
use crate::services::artifacts::download_of;
use crate::services::assignment::namespaces_of;
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_store::StoreError;

/// Longest cache key or namespace accepted.
const MAX_KEY: usize = 512;

/// The live attempt's job and run, and the run's namespaces.
struct Scope {
    job: kiln_store::JobRecord,
    run: kiln_store::RunRecord,
    writable: String,
    readable: Vec<String>,
}

async fn scope(state: &AppState, job: &str, epoch: i64) -> ApiResult<Scope> {
    let j = state.store.get_job(job).await?;
    if j.current_epoch != epoch || j.status != kiln_core::JobStatus::Running {
        return Err(StoreError::StaleEpoch(format!("epoch {epoch} of job {job} is not the live attempt")).into());
    }
    let run = state.store.get_run(&j.run_id).await?.run;
    let (writable, readable) = namespaces_of(&run.trust, run.git_ref.as_deref(), &run.id);
    Ok(Scope { job: j, run, writable, readable })
}

fn forbidden(message: String) -> ApiErr {
    ApiErr::new(StatusCode::FORBIDDEN, api::codes::FORBIDDEN, message)
}

/// Look the candidates up, each only in a namespace this run may read.
pub(crate) async fn lookup(
    state: &AppState,
    base_url: &str,
    (job, epoch): (&str, i64),
    req: api::CacheLookup,
) -> ApiResult<api::CacheLookupResult> {
    let Scope { job: j, run, readable, .. } = scope(state, job, epoch).await?;
    let repo_id = run.repo_id.clone();
    let by_prefix = declared_cache(&run, &j)?.restore_prefix;
    if req.candidates.len() > 8 {
        return Err(ApiErr::bad_request("at most 8 cache candidates per lookup"));
    }
    for c in &req.candidates {
        if !readable.contains(&c.namespace) {
            return Err(forbidden(format!(
                "this run may read the cache namespaces {readable:?}, not `{}`",
                c.namespace
            )));
        }
        if c.key.len() > MAX_KEY || c.key.is_empty() || c.prefix.as_ref().is_some_and(|p| p.len() > MAX_KEY) {
            return Err(ApiErr::bad_request("a cache key is 1-512 characters"));
        }
        if c.prefix.is_some() && !by_prefix {
            return Err(ApiErr::invalid(format!(
                "job `{}` does not declare `restore-prefix`: no prefix lookups",
                j.name
            )));
        }
    }
    let candidates: Vec<(String, String)> =
        req.candidates.iter().map(|c| (c.namespace.clone(), c.key.clone())).collect();
    let mut found = state.store.lookup_cache(&repo_id, &candidates).await?.map(|h| (h, false));
    if found.is_none() && by_prefix {
        let prefixes: Vec<(String, String)> =
            req.candidates.iter().filter_map(|c| Some((c.namespace.clone(), c.prefix.clone()?))).collect();
        if !prefixes.is_empty() {
            found = state.store.lookup_cache_prefix(&repo_id, &prefixes).await?.map(|h| (h, true));
        }
    }
    let counts = &state.cache_counts;
    let Some((hit, by_prefix)) = found else {
        counts.misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(api::CacheLookupResult { hit: None });
    };
    match by_prefix {
        true => counts.prefix_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        false => counts.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let download = download_of(state, base_url, &hit.generation, kiln_store::CACHE_ARTIFACT, "cache").await?;
    Ok(api::CacheLookupResult {
        hit: Some(api::CacheHitInfo { namespace: hit.namespace, key: hit.key, download, by_prefix }),
    })
}

/// The job's `cache` block as frozen in the run.
fn declared_cache(run: &kiln_store::RunRecord, j: &kiln_store::JobRecord) -> ApiResult<kiln_workflow::Cache> {
    run.definition
        .job(&j.name)
        .and_then(|d| d.cache.clone())
        .ok_or_else(|| ApiErr::invalid(format!("job `{}` declares no cache", j.name)))
}

/// Bind a sealed `@cache` upload of the live attempt to its key, in the one
/// namespace this run may write.
pub(crate) async fn save(
    state: &AppState,
    (job, epoch): (&str, i64),
    req: api::CacheSave,
) -> ApiResult<api::CacheSaved> {
    let Scope { job: j, run, writable, .. } = scope(state, job, epoch).await?;
    if req.namespace != writable {
        return Err(forbidden(format!(
            "this run may write only the cache namespace `{writable}`, not `{}`",
            req.namespace
        )));
    }
    if req.key.len() > MAX_KEY || req.key.is_empty() {
        return Err(ApiErr::bad_request("a cache key is 1-512 characters"));
    }
    if req.prefix.as_ref().is_some_and(|p| p.len() > MAX_KEY || p.is_empty()) {
        return Err(ApiErr::bad_request("a cache prefix is 1-512 characters"));
    }
    let kind = declared_cache(&run, &j)?.kind;
    // Only dependency caches may be found by prefix (spec 000 §10).
    let prefix = req.prefix.as_deref().filter(|_| kind == "dependencies");
    let build_ms = req.build_seconds.filter(|s| s.is_finite() && *s >= 0.0).map(|s| (s.min(1e7) * 1000.0) as i64);
    let entry = kiln_store::NewCacheEntry {
        generation_id: &req.generation_id,
        namespace: &req.namespace,
        key: &req.key,
        kind: &kind,
        prefix,
        build_ms,
    };
    let b = state.store.bind_cache(job, epoch, entry).await?;
    let counts = &state.cache_counts;
    if b.bound {
        counts.saves.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(Some(e)) = state.store.get_cache(&run.repo_id, &req.namespace, &req.key).await {
            counts.bytes_saved.fetch_add(e.size_bytes.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
    if b.conflict {
        counts.conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(job, epoch, key = %req.key, "cache conflict: the key already holds other bytes");
    }
    Ok(api::CacheSaved { bound: b.bound, conflict: b.conflict })
}

/// Record what the live attempt says happened to its cache.
pub(crate) async fn report(state: &AppState, (job, epoch): (&str, i64), mut info: api::CacheInfo) -> ApiResult<()> {
    // The estimate is the server's: the entry's cold build time (recorded
    // when it was saved) minus this attempt's steps and restore.
    info.seconds_saved = None;
    // A `partial` hit (the entry left things out) is a hit all the same.
    let hit = info.result == "hit" || info.result == "partial";
    if hit && let (Some(ns), Some(steps)) = (&info.namespace, info.steps_seconds) {
        let Scope { run, readable, .. } = scope(state, job, epoch).await?;
        if readable.contains(ns)
            && let Some(build_ms) = state.store.get_cache(&run.repo_id, ns, &info.key).await?.and_then(|e| e.build_ms)
        {
            let spent = steps.max(0.0) + info.seconds.unwrap_or(0.0).max(0.0);
            let saved = (build_ms as f64 / 1000.0 - spent).max(0.0);
            info.seconds_saved = Some((saved * 1000.0).round() / 1000.0);
            state.cache_counts.ms_saved.fetch_add((saved * 1000.0) as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let text = serde_json::to_string(&info).map_err(|e| ApiErr::internal(e.to_string()))?;
    if text.len() > 4096 {
        return Err(ApiErr::bad_request("a cache report is at most 4 KiB"));
    }
    // A failed restore of a found entry names where it came from: counted,
    // and the stored bytes are checked.
    if (info.result == "partial-refused" || info.result == "error")
        && let Some(ns) = &info.namespace
    {
        state.cache_counts.integrity_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        verify_entry(state, job, epoch, ns, &info.key).await?;
    }
    if let Some(b) = info.bytes
        && hit
    {
        state.cache_counts.bytes_restored.fetch_add(b, std::sync::atomic::Ordering::Relaxed);
    }
    state.store.report_cache(job, epoch, &text).await?;
    Ok(())
}

/// The eviction round: TTL since last use, per-repository quota, global budget.
pub(crate) async fn evict_once(state: &AppState) -> Result<usize, StoreError> {
    let c = &state.config;
    let gone = state
        .store
        .evict_caches(c.cache_ttl.as_millis() as i64, c.cache_repo_quota as i64, c.cache_global_budget as i64)
        .await?;
    if !gone.is_empty() {
        state.cache_counts.evictions.fetch_add(gone.len() as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(evicted = gone.len(), "cache entries evicted");
    }
    Ok(gone.len())
}

/// A restore from `namespace`/`key` failed: check the stored bytes against
/// the entry's digest ourselves (a report alone proves nothing) and drop an
/// entry whose bytes are damaged, so the next save can bind fresh ones.
async fn verify_entry(state: &AppState, job: &str, epoch: i64, namespace: &str, key: &str) -> ApiResult<()> {
    let Scope { run, readable, .. } = scope(state, job, epoch).await?;
    let repo_id = run.repo_id;
    if !readable.iter().any(|n| n == namespace) {
        return Ok(());
    }
    let candidates = [(namespace.to_string(), key.to_string())];
    let Some(hit) = state.store.lookup_cache(&repo_id, &candidates).await? else { return Ok(()) };
    let (size, sha256) = (hit.generation.expected_size as u64, hit.generation.expected_sha256.as_str());
    let intact = match &state.blob {
        kiln_blob::BlobStore::Local(local) => match local.open(&hit.generation.object_key).await {
            Ok((mut file, len)) => {
                use sha2::Digest;
                use tokio::io::AsyncReadExt;
                let mut h = sha2::Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut total = 0u64;
                loop {
                    let n = file.read(&mut buf).await.map_err(|e| ApiErr::internal(e.to_string()))?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    h.update(&buf[..n]);
                }
                total == len && len == size && hex::encode(h.finalize()) == sha256
            }
            Err(_) => false,
        },
        // The same check on S3 (issue 40, item 9), streamed from the bucket:
        // an object gone or different is damaged; a bucket that does not
        // answer proves nothing, and the entry is kept.
        kiln_blob::BlobStore::S3(s3) => match s3.hash(&hit.generation.object_key).await {
            Ok(info) => info.size == size && info.sha256 == sha256,
            Err(kiln_blob::BlobError::NotFound(_)) => false,
            Err(e) => {
                tracing::warn!(namespace, key, error = %e, "cannot verify a cache entry reported damaged; kept");
                return Ok(());
            }
        },
    };
    if !intact {
        tracing::warn!(namespace, key, generation = %hit.generation.id, "cache entry's bytes are damaged: dropped");
        state.store.remove_cache(&repo_id, namespace, key, &hit.generation.id).await?;
        // Shared bytes (issue 45): the damaged copy goes too, so the next
        // upload of these bytes stores them afresh instead of joining it.
        if hit.generation.content_addressed()
            && let Err(e) = state.blob.delete(&hit.generation.object_key).await
        {
            tracing::warn!(generation = %hit.generation.id, "cannot delete damaged content bytes: {e}");
        }
        state.cache_counts.evictions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}
