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
    let Scope { run, readable, .. } = scope(state, job, epoch).await?;
    let repo_id = run.repo_id;
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
        if c.key.len() > MAX_KEY || c.key.is_empty() {
            return Err(ApiErr::bad_request("a cache key is 1-512 characters"));
        }
    }
    let candidates: Vec<(String, String)> =
        req.candidates.iter().map(|c| (c.namespace.clone(), c.key.clone())).collect();
    let Some(hit) = state.store.lookup_cache(&repo_id, &candidates).await? else {
        state.cache_counts.misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(api::CacheLookupResult { hit: None });
    };
    state.cache_counts.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let download = download_of(state, base_url, &hit.generation, kiln_store::CACHE_ARTIFACT, "cache").await?;
    Ok(api::CacheLookupResult { hit: Some(api::CacheHitInfo { namespace: hit.namespace, key: hit.key, download }) })
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
    let kind = run
        .definition
        .job(&j.name)
        .and_then(|d| d.cache.as_ref())
        .map(|c| c.kind.clone())
        .ok_or_else(|| ApiErr::invalid(format!("job `{}` declares no cache", j.name)))?;
    let b = state.store.bind_cache(job, epoch, &req.generation_id, &req.namespace, &req.key, &kind).await?;
    let counts = &state.cache_counts;
    if b.bound {
        counts.saves.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if b.conflict {
        counts.conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(job, epoch, key = %req.key, "cache conflict: the key already holds other bytes");
    }
    Ok(api::CacheSaved { bound: b.bound, conflict: b.conflict })
}

/// Record what the live attempt says happened to its cache.
pub(crate) async fn report(state: &AppState, (job, epoch): (&str, i64), info: api::CacheInfo) -> ApiResult<()> {
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
        && info.result == "hit"
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
    let kiln_blob::BlobStore::Local(local) = &state.blob else { return Ok(()) };
    let intact = match local.open(&hit.generation.object_key).await {
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
            total == len
                && len == hit.generation.expected_size as u64
                && hex::encode(h.finalize()) == hit.generation.expected_sha256
        }
        Err(_) => false,
    };
    if !intact {
        tracing::warn!(namespace, key, generation = %hit.generation.id, "cache entry's bytes are damaged: dropped");
        state.store.remove_cache(&repo_id, namespace, key, &hit.generation.id).await?;
        state.cache_counts.evictions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}
