//! Calls of a running attempt (invariant 3: each names `(job, epoch)` and
//! is refused with 409 unless that epoch is current and its lease live —
//! the store checks that inside each transaction): heartbeat (spec 000 §8),
//! log chunks (§13, invariant 7), completion (§9), and the digest of an
//! image the attempt built (§5).

use crate::error::{ApiErr, ApiResult};
use crate::services::notices;
use crate::state::AppState;
use axum::http::StatusCode;
use kiln_api as api;
use kiln_core::AttemptOutcome;
use kiln_core::failure::FailureClass;
use kiln_store::{CompletionInput, NewLogChunk, StoreError};

/// Largest log chunk accepted.
pub(crate) const MAX_CHUNK: usize = 1024 * 1024;
/// Completion messages are cut to this many characters.
const MAX_MESSAGE: usize = 2000;

/// How long a heartbeat waits for the database before answering 503.
const HEARTBEAT_DB_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) async fn heartbeat(state: &AppState, job: &str, epoch: i64) -> ApiResult<api::HeartbeatResponse> {
    let ttl = state.lease_ttl_ms();
    // Bounded below the agent's 10 s heartbeat timeout: with the database
    // down the pool waits up to its 30 s acquire timeout, the agent's call
    // timed out unanswered (silence: it killed its live job), whereas a 503
    // `unavailable` tells it the database, not its lease, is the problem.
    // Dropping the call is harmless: at worst the lease is extended later.
    let out =
        tokio::time::timeout(HEARTBEAT_DB_WAIT, state.store.heartbeat(job, epoch, ttl)).await.map_err(|_| {
            ApiErr::new(
                StatusCode::SERVICE_UNAVAILABLE,
                api::codes::UNAVAILABLE,
                format!("database unavailable: no answer within {}s", HEARTBEAT_DB_WAIT.as_secs()),
            )
        })??;
    Ok(api::HeartbeatResponse { cancel_requested: out.cancel_requested, lease_ttl_ms: ttl as u64 })
}

/// Append one chunk; returns the committed offset per stream.
pub(crate) async fn append_log(
    state: &AppState,
    job: &str,
    epoch: i64,
    chunk: api::RawLogChunk,
) -> ApiResult<api::LogAck> {
    let chunk = checked_chunk(job, epoch, chunk)?;
    let bytes = chunk.data.len() as u64;
    let committed = state.store.append_log_chunk(chunk).await?;
    state.metrics.log_bytes.inc_by(bytes);
    state.job_changed(job);
    Ok(api::LogAck { committed: committed.into_iter().collect() })
}

// A batch's chunks are the store's small ones.
const _: () = assert!(api::LOG_BATCH_CHUNK_MAX <= kiln_store::SMALL_LOG_CHUNK);

/// Append a short job's few small chunks in one transaction (see
/// [`api::LogChunkBatch`]). Every chunk is checked before any is stored: a
/// malformed one refuses the whole batch.
pub(crate) async fn append_log_batch(
    state: &AppState,
    job: &str,
    epoch: i64,
    chunks: Vec<api::RawLogChunk>,
) -> ApiResult<api::LogBatchAck> {
    if chunks.is_empty() || chunks.len() > api::LOG_BATCH_MAX_CHUNKS {
        return Err(ApiErr::bad_request(format!(
            "a log batch carries 1 to {} chunks (got {})",
            api::LOG_BATCH_MAX_CHUNKS,
            chunks.len()
        )));
    }
    let mut checked = Vec::with_capacity(chunks.len());
    for c in chunks {
        if c.data.len() > api::LOG_BATCH_CHUNK_MAX {
            return Err(ApiErr::bad_request(format!(
                "a chunk of a log batch carries at most {} bytes; send larger ones alone",
                api::LOG_BATCH_CHUNK_MAX
            )));
        }
        checked.push(checked_chunk(job, epoch, c)?);
    }
    let sizes: Vec<u64> = checked.iter().map(|c| c.data.len() as u64).collect();
    let (accepted, committed) = state.store.append_log_batch(checked).await?;
    state.metrics.log_bytes.inc_by(sizes[..accepted].iter().sum());
    state.job_changed(job);
    Ok(api::LogBatchAck { accepted, committed: committed.into_iter().collect() })
}

/// A chunk as the store takes it, once its stream, size and transport
/// check are right.
fn checked_chunk(job: &str, epoch: i64, chunk: api::RawLogChunk) -> ApiResult<NewLogChunk> {
    if !kiln_core::logs::stream::AGENT_STREAMS.contains(&chunk.stream.as_str()) {
        return Err(ApiErr::bad_request("stream must be stdout, stderr or system"));
    }
    if chunk.data.len() > MAX_CHUNK {
        return Err(ApiErr::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            api::codes::TOO_LARGE,
            "a log chunk carries at most 1 MiB",
        ));
    }
    let api::RawLogChunk { stream, seq, offset, sha256, crc32c, data, in_order } = chunk;
    // The agent's check of the bytes: a CRC-32C (its default) or a
    // SHA-256 (which the store compares with the digest it computes).
    // The chunk's identity is the server's own digest either way.
    match (&sha256, &crc32c) {
        (None, None) => {
            return Err(ApiErr::bad_request(format!(
                "a log chunk needs its sha256 or crc32c ({} or {} header)",
                api::log_headers::SHA256,
                api::log_headers::CRC32C
            )));
        }
        (_, Some(crc)) if !crc.eq_ignore_ascii_case(&api::log_crc32c(&data)) => {
            return Err(ApiErr::bad_request("chunk crc32c does not match its bytes"));
        }
        _ => {}
    }
    // The body's buffer when it is the only owner (no copy of a 1 MiB chunk).
    let data = Vec::from(data);
    Ok(NewLogChunk { job_id: job.to_string(), epoch, stream, seq, offset, sha256, data, in_order })
}

/// The completion transaction; returns the job's status after it.
pub(crate) async fn complete(state: &AppState, job: &str, epoch: i64, c: api::Completion) -> ApiResult<String> {
    let outcome = AttemptOutcome::try_from(c.outcome).map_err(ApiErr::bad_request)?;
    if outcome == AttemptOutcome::Running || outcome == AttemptOutcome::Lost {
        return Err(ApiErr::bad_request("outcome must be success, failed or cancelled"));
    }
    let failure_class = match c.failure_class.as_deref() {
        None => c.infra_failure.then_some(FailureClass::Infra),
        // `agent_lost` from an agent: it handed the job back (drain, preemption).
        Some(s) => Some(FailureClass::parse(s).ok_or_else(|| {
            ApiErr::bad_request(format!(
                "unknown failure_class `{}`: expected step_failed, timeout, hang, agent_lost, infra or cancelled",
                s.chars().take(40).collect::<String>()
            ))
        })?),
    };
    let telemetry = c.telemetry;
    let reports_staged = c.reports_staged.unwrap_or(0) > 0;
    let started = std::time::Instant::now();
    let res = state
        .store
        .complete_held(
            job,
            epoch,
            CompletionInput {
                outcome,
                exit_code: c.exit_code,
                message: c.message.map(|m| m.chars().take(MAX_MESSAGE).collect()),
                failure_class,
                outputs: c.outputs,
                steps: step_results(c.steps),
                sandbox: c.sandbox.map(sandbox_end),
                quarantined: c.quarantined,
            },
        )
        .await;
    // Even a refused completion may have raced a change worth showing.
    state.job_changed(job);
    state.relay_wake.notify_one();
    if matches!(&res, Ok(c) if c.status == "failed") {
        notices::stopped_siblings(state, job).await;
    }
    match res {
        Ok(kiln_store::Completed { status, team, held_ms }) => {
            let m = &state.metrics;
            if let Some(t) = &telemetry {
                m.attempt_telemetry(t, started.elapsed());
            }
            m.attempts_finished.with_label_values(&[outcome.as_str()]).inc();
            if outcome != AttemptOutcome::Success || status != "success" {
                let class = match failure_class {
                    Some(c) => c,
                    None if outcome == AttemptOutcome::Cancelled || status == "cancelled" => FailureClass::Cancelled,
                    None => FailureClass::StepFailed,
                };
                m.failed_attempt(class, &status);
            }
            m.job_finished(&status);
            // Fair share (issue 44): the team's slot is free now (its jobs
            // waiting on its quota are woken), and what it cost.
            // (Both returned by the completion's own transaction.)
            state.dispatcher.finished(&team);
            if let Some(ms) = held_ms {
                m.job_seconds.with_label_values(&[&team]).inc_by(ms.max(0) as f64 / 1000.0);
            }
            // Issue 43: the tests of the reports this completion bound.
            if reports_staged && let Ok(Some(t)) = state.store.attempt_tests(job, epoch).await {
                m.tests_bound(&t);
            }
            tracing::info!(job, epoch, status, "completed");
            Ok(status)
        }
        // A completion the store refuses is a stale epoch to the agent.
        Err(StoreError::Conflict(m)) => Err(ApiErr::new(StatusCode::CONFLICT, api::codes::STALE_EPOCH, m)),
        Err(e) => Err(e.into()),
    }
}

/// Commit the digest of the image the attempt built: the first committed
/// digest wins; returns the digest every attempt must run.
/// `local`: the image stays in the committing agent's engine (not pushed
/// to a registry), so the job's retries are pinned to that agent.
pub(crate) async fn commit_image(
    state: &AppState,
    job: &str,
    epoch: i64,
    digest: &str,
    local: bool,
) -> ApiResult<String> {
    let ok = digest.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
    if !ok {
        return Err(ApiErr::invalid("digest must be sha256:<64 hex digits>"));
    }
    Ok(state.store.commit_image_digest(job, epoch, digest, local).await?)
}

/// Longest release evidence or cleanup error recorded, in characters.
const MAX_RELEASE_TEXT: usize = 1000;

/// What an agent says of its sandbox, bounded as stored.
fn sandbox_end(e: api::SandboxEnd) -> kiln_store::SandboxEnd {
    let cut = |t: String| t.chars().take(MAX_RELEASE_TEXT).collect::<String>();
    kiln_store::SandboxEnd { evidence: cut(e.evidence), cleanup_error: e.cleanup_error.map(cut) }
}

/// Issue 40, item 5: the agent of `(job, epoch)` (the caller holds its
/// attempt token) says the attempt's sandbox is gone; a cancel waiting for
/// it can end.
pub(crate) async fn release(state: &AppState, job: &str, epoch: i64, end: api::SandboxEnd) -> ApiResult<bool> {
    if end.evidence.trim().is_empty() {
        return Err(ApiErr::bad_request("a release says how the agent knows its sandbox is gone (`evidence`)"));
    }
    let released = state.store.release_attempt(job, epoch, sandbox_end(end)).await?;
    if released {
        tracing::info!(job_id = %job, epoch, "sandbox of a fenced attempt confirmed gone");
        state.job_changed(job);
    }
    Ok(released)
}

/// Most steps recorded per attempt (a workflow has at most 256).
const MAX_STEP_RESULTS: usize = 256;
/// Longest step name or message recorded, in characters.
const MAX_STEP_TEXT: usize = 500;

/// The reported steps as stored on the attempt (bounded; `None` when the
/// agent reported none, so an older agent's completion changes nothing).
fn step_results(steps: Vec<api::StepResult>) -> Option<String> {
    if steps.is_empty() {
        return None;
    }
    let cut = |t: String| if t.chars().count() > MAX_STEP_TEXT { t.chars().take(MAX_STEP_TEXT).collect() } else { t };
    let steps: Vec<api::StepResult> = steps
        .into_iter()
        .take(MAX_STEP_RESULTS)
        .map(|s| api::StepResult {
            name: cut(s.name),
            outcome: match s.outcome.as_str() {
                "success" | "failure" | "continued" | "skipped" => s.outcome,
                _ => "unknown".into(),
            },
            duration_ms: s.duration_ms,
            message: s.message.map(cut),
        })
        .collect();
    serde_json::to_string(&steps).ok()
}
