//! The store's traits and their contracts: one trait per aggregate, each
//! method one protocol transaction of spec 000 (accept run §5–6, claim §7,
//! heartbeat and fencing §8, completion and cancellation §9, log chunk
//! ingestion §13, artifacts §12).
//!
//! Every implementation must:
//! - execute every method atomically, taking "now" from the database clock
//!   inside the transaction, so lease decisions never depend on a caller's
//!   clock;
//! - allow every method to be called concurrently from many tasks, with the
//!   mutations of one run serialized (run lock, then job lock);
//! - keep the idempotent methods idempotent: `accept_run` with the same
//!   idempotency record, `claim` with the same claim request id, and
//!   `append_log_chunk` with identical bytes return the original result;
//! - report "nothing was decided" as `Unavailable`, `Busy` or `Retryable`
//!   (the call may be made again) and decided refusals as the other
//!   [`StoreError`] variants.

use crate::error::Result;
#[cfg(doc)]
use crate::error::StoreError;
use crate::model::*;
use crate::tx::outputs::RunOutputs;
use async_trait::async_trait;
use std::collections::BTreeMap;

#[async_trait]
pub trait RepoStore: Send + Sync {
    async fn create_repo(&self, name: &str, clone_url: &str, webhook_secret: Option<&str>) -> Result<RepoRecord>;
    async fn get_repo(&self, name_or_id: &str) -> Result<RepoRecord>;
    async fn list_repos(&self) -> Result<Vec<RepoRecord>>;
    /// Forget a repository without runs (with its secrets, deliveries, ref
    /// heads, schedule cursors; its trigger tokens are revoked). `Conflict`
    /// if it has runs. Returns what was removed.
    async fn delete_repo(&self, name_or_id: &str) -> Result<RepoRecord>;
    /// Create or replace a repository secret.
    async fn put_secret(&self, repo_id: &str, name: &str, value: &str) -> Result<()>;
    /// False if there was no such secret.
    async fn delete_secret(&self, repo_id: &str, name: &str) -> Result<bool>;
    /// Names and last-update times (ms) of a repository's secrets; never values.
    async fn list_secrets(&self, repo_id: &str) -> Result<Vec<(String, i64)>>;
    /// Values of the named secrets that exist.
    async fn secret_values(
        &self,
        repo_id: &str,
        names: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>>;
    /// Every secret as `(repo_id, name, stored value)` (for resealing).
    async fn all_secrets(&self) -> Result<Vec<(String, String, String)>>;
    /// Replace stored values `(repo_id, name, old, new)` in one transaction,
    /// each only if it is still `old`; `Conflict` (and nothing changed) if
    /// any moved meanwhile.
    async fn replace_secrets(&self, changes: &[(String, String, String, String)]) -> Result<u64>;
}

#[async_trait]
pub trait RunStore: Send + Sync {
    /// Accept a frozen run: the run, its jobs, readiness of root jobs and their
    /// outbox events, and the idempotency record, in one transaction.
    async fn accept_run(&self, run: NewRun) -> Result<Accepted>;
    async fn get_run(&self, run_id: &str) -> Result<RunView>;
    /// Newest first, without definitions (see [`RunSummaryRecord`]).
    async fn list_runs(&self, repo_id: &str, status: Option<&str>, limit: u32) -> Result<Vec<RunSummaryRecord>>;
    /// Newest first, filtered (see [`RunFilter`]).
    async fn find_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummaryRecord>>;
    /// Ids of runs that start with `prefix`, at most `limit`, in id order.
    async fn find_runs_by_prefix(&self, prefix: &str, limit: u32) -> Result<Vec<String>>;
    /// The id of run `number` of repository `repo_id` (`hello#123`);
    /// `NotFound` when it has no such run.
    async fn find_run_by_number(&self, repo_id: &str, number: i64) -> Result<String>;
    /// The run ids just before and just after `id` in id order.
    async fn run_id_neighbours(&self, id: &str) -> Result<(Option<String>, Option<String>)>;
    /// [`Self::run_id_neighbours`] of each of `ids` (a listed page of runs),
    /// read together: in one statement when the runs between the first and
    /// the last of them are not many more than they are. An id that is no
    /// run gets its neighbours as `run_id_neighbours` gives them.
    async fn run_id_neighbours_of(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, (Option<String>, Option<String>)>>;
    /// spec 000 §9 cancellation: bump the cancel version, cancel jobs that are
    /// not running, and leave the run `cancelling` while attempts still run.
    async fn cancel_run(&self, run_id: &str) -> Result<RunRecord>;
    /// Issue 42: cancel one job of an active run (`cancel.rs`): waiting, it
    /// is cancelled at once and the run advances; running, its attempt is
    /// asked to stop and its completion binds nothing. `Conflict` when the
    /// run is not active or the job has ended.
    async fn cancel_job(&self, job_id: &str) -> Result<JobRecord>;
    async fn get_job(&self, job_id: &str) -> Result<JobRecord>;
    /// The queue timeout: ready jobs no agent claimed for `max_wait_ms`
    /// (job id, label requirements), oldest first, at most `limit`.
    async fn overdue_jobs(&self, max_wait_ms: i64, limit: u32) -> Result<Vec<(String, String)>>;
    /// Fail an overdue ready job with `message` and advance its run (its
    /// dependents skipped); false when it is no longer ready and overdue.
    async fn fail_overdue_job(&self, job_id: &str, max_wait_ms: i64, message: &str) -> Result<bool>;
    /// The run-level timeout: runs past their `deadline_at`, earliest
    /// first, at most `limit`.
    async fn overdue_runs(&self, limit: u32) -> Result<Vec<String>>;
    /// Cancel a run past its deadline (its waiting jobs cancelled, its
    /// running attempts asked to stop; never retried); false when it is not
    /// (or no longer) overdue.
    async fn time_out_run(&self, run_id: &str) -> Result<bool>;
}

#[async_trait]
pub trait AgentStore: Send + Sync {
    /// A new agent with a fresh session in `pool` (registered with the join
    /// token `join_token_id`, or with `DATA_DIR/agent.token` when `None`).
    async fn register_agent_in(
        &self,
        name: &str,
        labels: &str,
        max_jobs: u32,
        pool: &str,
        join_token_id: Option<&str>,
    ) -> Result<AgentRecord>;
    /// [`Self::register_agent_in`] the `default` pool.
    async fn register_agent(&self, name: &str, labels: &str, max_jobs: u32) -> Result<AgentRecord> {
        self.register_agent_in(name, labels, max_jobs, "default", None).await
    }
    async fn get_agent(&self, agent_id: &str) -> Result<AgentRecord>;
    /// The agent, and whether an attempt of its current session was created
    /// by the claim request `claim_request_id` (then
    /// [`AttemptStore::claimed_by_request`] recovers it): what a claim
    /// request reads first, in one round trip.
    async fn get_agent_for_claim(&self, agent_id: &str, claim_request_id: &str) -> Result<(AgentRecord, bool)>;
    async fn list_agents(&self) -> Result<Vec<AgentRecord>>;
    /// Record the Kiln version an agent runs (said at registration).
    async fn describe_agent(&self, agent_id: &str, version: &str) -> Result<()>;
    /// Record the executor an agent runs (said at registration; until
    /// then, and for agents that never say, `host`).
    async fn set_agent_executor(&self, agent_id: &str, executor: kiln_core::claim::Executor) -> Result<()>;
    /// The agent's session `session_id` drains (claims nothing more; spec
    /// 004). False if that is not the agent's current session.
    async fn mark_draining(&self, agent_id: &str, session_id: &str) -> Result<bool>;
    /// Forget an agent and end the leases of its running attempts now (the
    /// reconciler fences them). False if there was no such agent.
    async fn remove_agent(&self, agent_id: &str) -> Result<bool>;
    /// The agents `agent_ids` were seen now (their session stream is open
    /// to this server): their `last_seen_at` becomes the database's now.
    async fn touch_agents(&self, agent_ids: &[String]) -> Result<()>;
    /// Forget the agents last seen more than `idle_ms` ago that hold no
    /// running attempt (offline agents expire; their fenced attempts are
    /// released as [`Self::remove_agent`] does). Agents in `keep` (those
    /// connected to the caller) are never expired. Returns `(id, name)`.
    async fn expire_agents(&self, idle_ms: i64, keep: &[String]) -> Result<Vec<(String, String)>>;
    /// The agent `agent_id` has just started and removed what its previous
    /// process left in its work directory (it says so when it registers):
    /// the fenced attempts of earlier agents of the same name and pool are
    /// confirmed gone (issue 40, item 5). Returns how many.
    async fn release_predecessors(&self, agent_id: &str) -> Result<u64>;
    /// How many running attempts each agent holds (agents with none are absent).
    async fn running_per_agent(&self) -> Result<std::collections::BTreeMap<String, u32>>;
    /// How many jobs are `pending`, `ready` and `running` (every one of the
    /// three present, 0 when none), for `/metrics`.
    async fn active_job_counts(&self) -> Result<std::collections::BTreeMap<String, u64>>;
    /// The gauges `/metrics` reads at each scrape: unfinished runs by
    /// status, the oldest eligible job's age per compatibility class (the
    /// `classes` oldest), the reconciler's lag and the oldest finished log
    /// still in the hot journal. Every read goes through an index over live
    /// rows only.
    async fn operating_gauges(&self, classes: u32) -> Result<OperatingGauges>;
    /// Transactions this process ran again after losing a serialization
    /// race or a deadlock (PostgreSQL), since it started: for `/metrics`
    /// (`kiln_db_transaction_retries_total`).
    fn transaction_retries(&self) -> u64 {
        0
    }
    /// The eligible queue (ready, due, unclaimed jobs) by compatibility
    /// class: how many and the oldest's age, the `limit` oldest classes
    /// first (through the `jobs(status)` index, as the gauges).
    async fn queue_classes(&self, limit: u32) -> Result<Vec<QueueClass>>;
    /// The running attempts, longest-running first (at most `limit`), each
    /// with its job, run, repository, agent and the last line of its
    /// `system` log stream.
    async fn running_attempts(&self, limit: u32) -> Result<Vec<RunningAttempt>>;
}

/// Who may do what: join tokens, scoped API tokens, secret pools and the
/// audit log. Tokens are stored as a hash of their secret part.
#[async_trait]
pub trait AccessStore: Send + Sync {
    async fn create_join_token(&self, id: &str, name: &str, pool: &str, token_hash: &str) -> Result<JoinTokenRecord>;
    async fn get_join_token(&self, id: &str) -> Result<JoinTokenRecord>;
    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRecord>>;
    /// False if there is no such token (revoking twice is fine).
    async fn revoke_join_token(&self, id: &str) -> Result<bool>;
    /// Insert `token` (its `created_at` is set from the database clock).
    async fn create_api_token(&self, token: &ApiTokenRecord) -> Result<ApiTokenRecord>;
    async fn get_api_token(&self, id: &str) -> Result<ApiTokenRecord>;
    async fn list_api_tokens(&self) -> Result<Vec<ApiTokenRecord>>;
    async fn revoke_api_token(&self, id: &str) -> Result<bool>;
    /// Record that the token was used now.
    async fn touch_api_token(&self, id: &str) -> Result<()>;
    /// Store a web UI session that lasts `ttl_ms` from now (database
    /// clock); expired sessions are deleted in the same transaction.
    async fn create_ui_session(
        &self,
        id_hash: &str,
        actor: &str,
        token_hash: &str,
        ttl_ms: i64,
    ) -> Result<UiSessionRecord>;
    /// The session, unless it does not exist or has expired (`NotFound`).
    async fn get_ui_session(&self, id_hash: &str) -> Result<UiSessionRecord>;
    /// Sign-out: false if there was no such session.
    async fn delete_ui_session(&self, id_hash: &str) -> Result<bool>;
    /// The pools whose agents may receive a repository's secrets.
    async fn set_secret_pools(&self, repo_id: &str, pools: &[String]) -> Result<()>;
    async fn audit(&self, entry: &NewAudit) -> Result<()>;
    /// Newest first, entries with an id below `before`.
    async fn list_audit(&self, before: Option<i64>, limit: u32) -> Result<Vec<AuditEntry>>;
}

/// The forge loop (issue 14): deliveries, commit status reports, ref heads,
/// schedule cursors and leader leases.
#[async_trait]
pub trait ForgeStore: Send + Sync {
    /// Persist a delivery unless one with the same (repository, forge,
    /// delivery id) exists; returns the stored one and whether it is new.
    async fn record_delivery(&self, d: &NewDelivery) -> Result<(DeliveryRecord, bool)>;
    async fn get_delivery(&self, id: &str) -> Result<DeliveryRecord>;
    async fn list_deliveries(&self, repo_id: &str, limit: u32) -> Result<Vec<DeliveryRecord>>;
    /// Pending deliveries due for planning and not claimed.
    async fn due_deliveries(&self, limit: u32) -> Result<Vec<DeliveryRecord>>;
    /// The deliveries not yet planned: how many, how many of them were
    /// received more than `delayed_after_ms` ago, and the oldest's age.
    async fn delivery_backlog(&self, delayed_after_ms: i64) -> Result<DeliveryBacklog>;
    /// Claim a pending delivery for planning for `ttl_ms`; false if another holds it.
    async fn claim_delivery(&self, id: &str, ttl_ms: i64) -> Result<bool>;
    async fn finish_delivery(&self, id: &str, status: &str, message: Option<&str>, run_ids: &[String]) -> Result<()>;
    /// Release a claimed delivery to be planned again after `delay_ms`.
    async fn defer_delivery(&self, id: &str, delay_ms: i64, message: &str) -> Result<()>;
    /// A status with a fixed state (no run), superseding older ones of the commit and context.
    async fn create_report(
        &self,
        repo_id: &str,
        commit_sha: &str,
        context: &str,
        fixed_state: &str,
        description: &str,
    ) -> Result<String>;
    async fn due_reports(&self, limit: u32) -> Result<Vec<ReportTodo>>;
    async fn claim_report(&self, id: &str, ttl_ms: i64) -> Result<bool>;
    async fn report_sent(&self, id: &str, state: &str, done: bool, error: Option<&str>) -> Result<()>;
    async fn report_retry(&self, id: &str, delay_ms: i64, error: &str) -> Result<()>;
    async fn reports_of_commit(
        &self,
        repo_id: &str,
        commit_sha: &str,
    ) -> Result<Vec<(String, Option<String>, Option<String>, bool)>>;
    /// The status context a run reports under, if it reports to a forge.
    async fn report_context_of_run(&self, run_id: &str) -> Result<Option<String>>;
    async fn record_ref_head(&self, repo_id: &str, git_ref: &str, sha: &str) -> Result<()>;
    async fn ref_heads(&self, repo_id: &str) -> Result<Vec<(String, String)>>;
    async fn schedule_cursor(&self, repo_id: &str, path: &str) -> Result<Option<i64>>;
    /// Move the cursor from `from` (None: no cursor yet) to `to`; false if it moved meanwhile.
    async fn advance_schedule_cursor(&self, repo_id: &str, path: &str, from: Option<i64>, to: i64) -> Result<bool>;
    /// Take or renew the lease `name` for `holder` for `ttl_ms` (database time).
    async fn acquire_lease(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<bool>;
    async fn release_lease(&self, name: &str, holder: &str) -> Result<()>;
    /// Holders of the unexpired leases whose name starts with `prefix`,
    /// sorted (replicas announcing themselves, one lease each).
    async fn lease_holders(&self, prefix: &str) -> Result<Vec<String>>;
    async fn set_repo_forge(&self, repo_id: &str, forge: &RepoForge) -> Result<()>;
    async fn set_webhook_secret(&self, repo_id: &str, secret: Option<&str>) -> Result<()>;
    /// Repositories due for a poll, each marked polled now.
    async fn repos_to_poll(&self) -> Result<Vec<String>>;
}

/// Build caches (issue 15).
#[async_trait]
pub trait CacheStore: Send + Sync {
    /// Bind (the run's repository, `namespace`, `key`) to a sealed cache
    /// upload of the live attempt `(job, epoch)`; first writer wins.
    async fn bind_cache(&self, job_id: &str, epoch: i64, entry: NewCacheEntry<'_>) -> Result<CacheBinding>;
    /// The first candidate (namespace, key) with an entry; marks it used.
    async fn lookup_cache(&self, repo_id: &str, candidates: &[(String, String)]) -> Result<Option<CacheHit>>;
    /// For each (namespace, prefix) in order, the most recently used entry
    /// with that prefix; the first found is marked used.
    async fn lookup_cache_prefix(&self, repo_id: &str, prefixes: &[(String, String)]) -> Result<Option<CacheHit>>;
    /// Delete entries past their TTL, then over the per-repository quota and
    /// the global budget (least recently used first).
    async fn evict_caches(&self, ttl_ms: i64, repo_quota: i64, global_budget: i64) -> Result<Vec<CacheEntry>>;
    async fn list_caches(&self, repo_id: &str) -> Result<Vec<CacheEntry>>;
    /// The entry (namespace, key), without marking it used.
    async fn get_cache(&self, repo_id: &str, namespace: &str, key: &str) -> Result<Option<CacheEntry>>;
    /// Delete the entry (namespace, key) if it still names `generation_id`.
    async fn remove_cache(&self, repo_id: &str, namespace: &str, key: &str, generation_id: &str) -> Result<bool>;
    /// Record the live attempt's cache report (JSON) on its job.
    async fn report_cache(&self, job_id: &str, epoch: i64, report: &str) -> Result<()>;
}

#[async_trait]
pub trait AttemptStore: Send + Sync {
    /// spec 000 §7: one transaction — run active, job ready, dispatch
    /// generation matches, predecessors succeeded, capacity admitted → new
    /// attempt with epoch + 1 and a lease in database time. `Ok(None)` when the
    /// delivery is stale or a duplicate (absorbed) or capacity is full.
    async fn claim(&self, req: ClaimInput) -> Result<Option<ClaimedAttempt>> {
        Ok(match self.claim_placed(req).await? {
            ClaimOutcome::Claimed(c) => Some(c),
            ClaimOutcome::Declined | ClaimOutcome::Misplaced(..) | ClaimOutcome::AtQuota(..) => None,
        })
    }
    /// [`Self::claim`], saying when the agent may not run the job at all
    /// (invariant 12: trust, isolation, secret pools) and what the job needs.
    async fn claim_placed(&self, req: ClaimInput) -> Result<ClaimOutcome>;
    /// Recover the attempt a claim request created, if it is still running.
    /// Only the session that sent the claim request gets it back.
    async fn claimed_by_request(&self, claim_request_id: &str, session_id: &str) -> Result<Option<ClaimedAttempt>>;
    /// spec 000 §8: extend the lease of the current live epoch.
    async fn heartbeat(&self, job_id: &str, epoch: i64, lease_ttl_ms: i64) -> Result<HeartbeatOutcome>;
    /// spec 000 §9 completion transaction: the job's status after it.
    async fn complete(&self, job_id: &str, epoch: i64, completion: CompletionInput) -> Result<String> {
        self.complete_held(job_id, epoch, completion).await.map(|c| c.status)
    }
    /// [`Self::complete`], with the team whose slot it freed and how long
    /// the attempt held it.
    async fn complete_held(&self, job_id: &str, epoch: i64, completion: CompletionInput) -> Result<Completed>;
    /// Issue 40, item 5 (spec 000 §9): the agent of attempt `(job, epoch)`,
    /// which ended (fenced, most often), says its sandbox is gone (the
    /// caller checked the attempt's credential). `Ok(false)`: already
    /// confirmed; a running attempt is a conflict. A cancelling run with
    /// nothing else to wait for ends `cancelled`.
    async fn release_attempt(&self, job_id: &str, epoch: i64, end: SandboxEnd) -> Result<bool>;
    /// The outputs bound by the completions of a run's successful jobs, by
    /// job name then output name (issue 16; never a fenced attempt's).
    async fn run_outputs(&self, run_id: &str) -> Result<RunOutputs>;
    /// Reconciler: fence every running attempt whose lease expired (outcome
    /// `lost`) and, within the budget, make its job ready again at
    /// `next_attempt_at`. Returns the fenced (job, epoch) pairs.
    async fn fence_expired(&self) -> Result<Vec<(String, i64)>>;
    /// After the database could not be reached for `outage_ms`: extend
    /// every running attempt's lease that was live when the outage began
    /// (it expired since, or is about to, with nobody able to renew it, so
    /// its expiry says nothing about its agent) to at least `margin_ms`
    /// from now, time for a live agent's next heartbeat. A lease that had
    /// expired before the outage stays expired. Returns how many leases
    /// were extended.
    async fn extend_running_leases(&self, outage_ms: i64, margin_ms: i64) -> Result<u64>;
    /// Commit the digest of an image the attempt built (a Dockerfile job,
    /// spec 000 §5): requires the current live epoch; the first committed
    /// digest wins and is returned (later ones do not replace it).
    /// With `local` (the image was not pushed to a registry), the first
    /// commit pins the job's later attempts to the committing agent.
    async fn commit_image_digest(&self, job_id: &str, epoch: i64, digest: &str, local: bool) -> Result<String>;
    /// Fast loss detection: shorten the leases of a session's running attempts
    /// to at most `grace_ms` from now.
    async fn shorten_session_leases(&self, session_id: &str, grace_ms: i64) -> Result<u64>;
}

#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Unpublished events whose `available_at` has passed, oldest first.
    async fn pending_outbox(&self, limit: u32) -> Result<Vec<OutboxEvent>>;
    async fn mark_published(&self, ids: &[i64]) -> Result<()>;
    /// Jobs that are ready now (used to rebuild dispatch queues after a restart).
    async fn ready_jobs(&self) -> Result<Vec<OutboxEvent>>;
    /// [`Self::ready_jobs`] among `job_ids` only (a wakeup's jobs).
    async fn ready_jobs_of(&self, job_ids: &[String]) -> Result<Vec<OutboxEvent>>;
    /// Wakeups for [`Self::ready_jobs`] readers when another process (a
    /// replica on the same database) made jobs ready: the returned
    /// [`ReadyWakeups`] is notified after such a commit, naming its jobs, and
    /// after the wakeup channel reconnected (notifications may have been
    /// lost meanwhile: all jobs). A process's own commits do not wake it.
    /// Bursts fold into one pending wakeup. `None`: the backend has no such
    /// channel (SQLite: one server owns the database). Listening has begun
    /// when this returns.
    async fn ready_wakeups(&self) -> Result<Option<std::sync::Arc<crate::ReadyWakeups>>> {
        Ok(None)
    }
}

#[async_trait]
pub trait LogStore: Send + Sync {
    /// Where log bytes go on a backend that keeps no files of its own
    /// (PostgreSQL, issue 47): the server's object store. Set at boot; a
    /// backend with its own segment files (SQLite) ignores it.
    fn set_log_objects(&self, _objects: std::sync::Arc<dyn crate::LogObjects>) {}
    /// Delete log objects older than `min_age_ms` that no chunk refers to
    /// any more (archived and trimmed, or never committed), at most
    /// `limit`; how many. Backends without log objects: 0.
    async fn collect_log_objects(&self, _min_age_ms: i64, _limit: u32) -> Result<usize> {
        Ok(0)
    }
    /// spec 000 §13: identical retry accepted, conflicting bytes refused,
    /// stale epochs refused. Returns the contiguous committed offset per stream.
    async fn append_log_chunk(&self, chunk: NewLogChunk) -> Result<Vec<(String, i64)>>;
    /// Several small chunks of one attempt (each at most
    /// [`crate::SMALL_LOG_CHUNK`] bytes), judged one by one in their order
    /// as [`Self::append_log_chunk`] judges one, committed in one
    /// transaction: how many leading chunks committed (or were identical
    /// retries) and the progress after them. A refusal of the first chunk
    /// is the error (nothing committed); a later one stops the batch there
    /// (the caller sends the rest alone and gets its answer). A malformed
    /// batch (another attempt's chunk, a large chunk) is refused whole.
    async fn append_log_batch(&self, chunks: Vec<NewLogChunk>) -> Result<(usize, Vec<(String, i64)>)>;
    /// Chunks of a job with event id greater than `after_id`, in id order.
    async fn log_chunks_after(&self, job_id: &str, after_id: i64, limit: u32) -> Result<Vec<LogChunkRecord>>;
    /// Jobs finished at least `grace_ms` ago whose log still has chunks in
    /// the hot journal: candidates for archival.
    async fn logs_to_archive(&self, grace_ms: i64, limit: u32) -> Result<Vec<String>>;
    /// Record an archive whose objects were written, and trim exactly the
    /// chunks it holds from the hot journal, in one transaction. Conflict if
    /// the journal no longer holds `chunks` rows in `first_id..=last_id`.
    async fn record_log_archive(&self, archive: &LogArchive) -> Result<()>;
    /// A job's archives, by `first_id`.
    async fn log_archives(&self, job_id: &str) -> Result<Vec<LogArchive>>;
}

/// Artifact generations and bindings (spec 000 §9, §12, invariant 4).
#[async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Set the signer of provenance (the server does at boot; issue 45).
    fn set_attester(&self, attester: std::sync::Arc<dyn Attester>);
    /// The provenance written when `generation_id` was bound, if any.
    async fn artifact_provenance(&self, generation_id: &str) -> Result<Option<ProvenanceRecord>>;
    /// Open an attempt-scoped upload session: a fresh generation with a fresh
    /// object key, for a declared output of the current live epoch. `sha256`
    /// may be "" when the agent names it at seal time.
    async fn create_generation(
        &self,
        job_id: &str,
        epoch: i64,
        name: &str,
        size: i64,
        sha256: &str,
        part_size: i64,
    ) -> Result<GenerationRecord>;
    /// As [`create_generation`](Self::create_generation), for bytes of a
    /// given kind (`NewGeneration::kind`: `file` or `archive`, see
    /// [`GENERATION_KINDS`](crate::GENERATION_KINDS)); `create_generation`
    /// opens a `file`.
    async fn open_generation(&self, job_id: &str, epoch: i64, g: NewGeneration<'_>) -> Result<GenerationRecord>;
    async fn get_generation(&self, id: &str) -> Result<GenerationRecord>;
    /// Record the sha256 of a generation opened without one (`sha256` = ""
    /// at creation). Requires the live epoch; a different digest than one
    /// already recorded is a Conflict.
    async fn set_generation_digest(&self, id: &str, job_id: &str, epoch: i64, sha256: &str)
    -> Result<GenerationRecord>;
    /// The generation, if its attempt is still the current live epoch and it
    /// is still uploading (a read; used before accepting part bytes).
    async fn uploadable_generation(&self, id: &str) -> Result<GenerationRecord>;
    /// Record the object store's multipart upload holding the generation's
    /// bytes. The first id recorded wins and is returned (a caller whose id
    /// lost aborts its own upload); Conflict once the generation stopped
    /// uploading (e.g. collected).
    async fn set_generation_upload(&self, id: &str, upload_id: &str) -> Result<String>;
    /// Seal a verified generation: requires the current live epoch.
    async fn seal_generation(&self, id: &str, job_id: &str, epoch: i64) -> Result<GenerationRecord>;
    /// Mark a generation failed (verification mismatch).
    async fn fail_generation(&self, id: &str, message: &str) -> Result<()>;
    /// The canonical binding of `(run, producer job name, artifact name)`.
    async fn resolve_binding(&self, run_id: &str, job_name: &str, name: &str) -> Result<BoundArtifact>;
    async fn run_bindings(&self, run_id: &str) -> Result<Vec<BoundArtifact>>;
    /// Generations to collect: unbound ones whose attempt ended (or that
    /// were created more than `grace_ms` ago while not uploading any more),
    /// older than `grace_ms`; never a bound generation.
    async fn collectable_generations(&self, grace_ms: i64, limit: u32) -> Result<Vec<GenerationRecord>>;
    async fn mark_generation_deleted(&self, id: &str) -> Result<()>;
    /// Retention (issue 16; spec 000 §12: expiry is metadata-aware and
    /// independent of cache eviction): bound artifacts past the `expires_at`
    /// the completion transaction gave them, of runs that ended (a live run
    /// holds its inputs), not yet expired or whose bytes are not yet
    /// marked deleted; oldest expiry first.
    async fn expirable_artifacts(&self, limit: u32) -> Result<Vec<BoundArtifact>>;
    /// Mark a binding expired (`expired_at`) and its generation `expired`
    /// in one transaction, before its bytes are deleted: from then on a
    /// read answers "expired", never a capability for missing bytes. False
    /// when the binding is not (yet) expirable. Idempotent; the rows stay.
    async fn expire_artifact(&self, generation_id: &str) -> Result<bool>;
    /// The expired generation's bytes were deleted (`deleted_at`).
    async fn mark_expired_deleted(&self, generation_id: &str) -> Result<()>;

    // Content-addressed bytes (issue 45; `tx/content.rs`).
    /// The live attempt's verified upload session is made to reference the
    /// content object of its sha256 (whose key is returned) before its
    /// bytes move there; `Busy` while the collector deletes that object.
    async fn reference_content(&self, id: &str, job_id: &str, epoch: i64) -> Result<String>;
    /// Sealed generations whose bytes are still under their session key.
    async fn migratable_generations(&self, limit: u32) -> Result<Vec<GenerationRecord>>;
    /// The content object's row made live and kept from the collector for
    /// its grace period; `Busy` while it is being deleted.
    async fn touch_content(&self, sha256: &str, size: i64) -> Result<()>;
    /// A sealed generation under session key `from` now reads its content
    /// object; the old bytes are due for deletion after `retire_after_ms`.
    /// `false`: it changed meanwhile, nothing done.
    async fn move_to_content(&self, id: &str, from: &str, retire_after_ms: i64) -> Result<bool>;
    /// Generations whose old session bytes are due for deletion.
    async fn retirable_sessions(&self, limit: u32) -> Result<Vec<GenerationRecord>>;
    async fn session_retired(&self, id: &str) -> Result<()>;
    /// Content objects no generation references (untouched for
    /// `grace_ms`), and those whose deletion was begun: their sha256.
    async fn collectable_content(&self, grace_ms: i64, limit: u32) -> Result<Vec<String>>;
    /// Mark the object `deleting` if nothing references it; `true` when its
    /// bytes may be deleted now.
    async fn begin_content_delete(&self, sha256: &str, grace_ms: i64) -> Result<bool>;
    /// The object's bytes are gone: its row is removed.
    async fn content_deleted(&self, sha256: &str) -> Result<()>;
    /// Content objects and their bytes.
    async fn content_usage(&self) -> Result<(i64, i64)>;
    /// The manifest digest of a directory artifact's upload session (the
    /// live attempt's, still uploading): its provenance names it.
    async fn note_manifest(&self, id: &str, job_id: &str, epoch: i64, sha256: &str) -> Result<()>;
}

/// Badges and notifications (issue 42): the repository's public flag,
/// notifications of run ends and their outbox (see `tx/notify.rs`). The
/// run-end rows are written by the transaction that ends a run; senders
/// claim a row for a lease, so one replica sends it at a time, and a row
/// is marked delivered at most once.
#[async_trait]
pub trait NotifyStore: Send + Sync {
    /// Store `n` (its `created_at` from the database clock) with its sealed
    /// signing secret (the secret row `@notify:ID`), in one transaction.
    async fn create_notification(&self, n: &NotificationRecord, sealed_secret: &str) -> Result<NotificationRecord>;
    async fn list_notifications(&self, repo_id: &str) -> Result<Vec<NotificationRecord>>;
    /// Remove the notification and its secret; its pending deliveries are
    /// marked failed (the log keeps them). `NotFound` if the repository has
    /// no such notification.
    async fn delete_notification(&self, repo_id: &str, id: &str) -> Result<NotificationRecord>;
    /// Pending deliveries whose `next_at` passed and that nobody holds, oldest first.
    async fn due_notifications(&self, limit: u32) -> Result<Vec<DueNotification>>;
    /// Hold a pending delivery for `ttl_ms` (database time) and count an
    /// attempt; false if it is held, or no longer pending.
    async fn claim_notification(&self, id: &str, ttl_ms: i64) -> Result<bool>;
    /// The receiver acknowledged: false if the row was no longer pending.
    async fn notification_delivered(&self, id: &str, status_code: i64) -> Result<bool>;
    /// Release a claimed delivery to be sent again after `delay_ms`.
    async fn notification_retry(&self, id: &str, delay_ms: i64, status_code: Option<i64>, error: &str) -> Result<()>;
    /// Give a delivery up (refused, or out of attempts).
    async fn notification_failed(&self, id: &str, status_code: Option<i64>, error: &str) -> Result<()>;
    /// The delivery log of a repository, newest first.
    async fn notification_deliveries(&self, repo_id: &str, limit: u32) -> Result<Vec<NotificationDelivery>>;
    async fn set_repo_public(&self, repo_id: &str, public: bool) -> Result<()>;
    /// The status of the newest run on `branch` of one of `workflow_paths`
    /// (empty: any workflow); `None`: no such run.
    async fn badge_status(
        &self,
        repo_id: &str,
        branch: &str,
        workflow_paths: &[String],
    ) -> Result<Option<kiln_core::RunStatus>>;
}

/// Teams (issue 44): the fair-share unit repositories belong to.
#[async_trait]
pub trait TeamStore: Send + Sync {
    async fn create_team(
        &self,
        name: &str,
        weight: u32,
        max_running: Option<u32>,
        max_queued: Option<u32>,
    ) -> Result<TeamRecord>;
    async fn get_team(&self, name: &str) -> Result<TeamRecord>;
    /// Every team, by name, with how many repositories each has.
    async fn list_teams(&self) -> Result<Vec<TeamRecord>>;
    /// `NotFound` for an unknown team; `Invalid` for a weight outside 1–1000.
    async fn update_team(&self, name: &str, update: &TeamUpdate) -> Result<TeamRecord>;
    /// Remove an empty team (`Conflict` while it has repositories, and
    /// always for `default`); returns what was removed.
    async fn delete_team(&self, name: &str) -> Result<TeamRecord>;
    /// Move a repository to a team (`NotFound` for an unknown team).
    async fn set_repo_team(&self, repo_id: &str, team: &str) -> Result<()>;
    /// Live jobs (ready, pending, running) by team, lane and class.
    async fn queue_groups(&self) -> Result<Vec<QueueGroup>>;
    /// Jobs waiting (ready or pending) of one team, or of all (`None`).
    async fn queued_jobs(&self, team: Option<&str>) -> Result<i64>;
    /// Set a queued or running run's lane; its ready jobs are made ready
    /// again with it (returns how many). `Conflict` once it ended.
    async fn set_run_priority(&self, run_id: &str, lane: &str) -> Result<u32>;
    /// Move the teams' virtual times by the starts charged to them (one
    /// transaction, teams locked in name order; charges add up, so
    /// replicas writing theirs at the same moment lose none). Returns each
    /// charged team's new virtual time; a team gone is skipped.
    async fn charge_teams(&self, charges: &[TeamCharge]) -> Result<BTreeMap<String, u64>>;
}

/// Deployment environments and approvals (issue 46).
#[async_trait]
pub trait EnvironmentStore: Send + Sync {
    /// Create (`create`: `Conflict` if it exists) or replace (`NotFound`
    /// if it does not) an environment's rules; `Invalid` for bad ones.
    async fn put_environment(&self, env: &EnvironmentRecord, create: bool) -> Result<EnvironmentRecord>;
    async fn get_environment(&self, name: &str) -> Result<EnvironmentRecord>;
    async fn list_environments(&self) -> Result<Vec<EnvironmentRecord>>;
    /// Remove one (`Conflict` while deploy jobs to it are live).
    async fn delete_environment(&self, name: &str) -> Result<EnvironmentRecord>;
    /// Record one approver's decision on a run's deployment to an
    /// environment and advance the run with it, in one transaction
    /// (`Conflict`: the run ended, or this approver decided already;
    /// `Invalid`: no job of the run deploys there).
    async fn decide_deployment(&self, approval: &ApprovalRecord) -> Result<ApprovalRecord>;
    /// A run's approvals and rejections, oldest first.
    async fn run_approvals(&self, run_id: &str) -> Result<Vec<ApprovalRecord>>;
    /// An environment's deployments, newest first (at most `limit`, 1–500).
    async fn deployments(&self, environment: &str, limit: u32) -> Result<Vec<DeploymentRecord>>;
    /// The deployment a rollback of `environment` returns to: `to` (a
    /// successful deployment of it; `NotFound`, `Conflict` if it failed),
    /// else the newest successful one by another run than the current
    /// deployment's (`Conflict` if there is none).
    async fn rollback_target(&self, environment: &str, to: Option<&str>) -> Result<DeploymentRecord>;
}

/// Promotions between rings (issue 46): what the server's gate runner,
/// `kiln promote` and `kiln pause` read and write.
#[async_trait]
pub trait RingStore: Send + Sync {
    /// Rows the gate runner acts on now: baked, due for a measurement, or
    /// failed without a rollback asked for.
    async fn due_ring_gates(&self) -> Result<Vec<RingGateRecord>>;
    /// A run's promotions, in file order.
    async fn run_ring_gates(&self, run_id: &str) -> Result<Vec<RingGateRecord>>;
    /// Apply one step if the row is as it was read (false otherwise); the
    /// run advances in the same transaction when the gate passed or failed.
    async fn settle_ring_gate(&self, step: &RingGateStep) -> Result<bool>;
    /// Claim the rollback after a failed gate (false: claimed already).
    async fn claim_ring_rollback(&self, job_id: &str, note: &str) -> Result<bool>;
    /// Record what the rollback became.
    async fn record_ring_rollback(&self, job_id: &str, outcome: &str) -> Result<()>;
    /// Promote or pause the run's next promotion (see `Manual`); `Conflict`
    /// when the run ended, has none left, or its gate failed.
    async fn manual_promotion(&self, run_id: &str, actor: &str, what: Manual) -> Result<RingGateRecord>;
}

/// Environment secrets (issue 46): values stored as the server sealed
/// them, never listed.
#[async_trait]
pub trait EnvSecretStore: Send + Sync {
    /// Create or replace secret `name` of `environment` (`NotFound`: no
    /// such environment).
    async fn put_env_secret(&self, environment: &str, name: &str, sealed: &str) -> Result<()>;
    /// False if there was no such secret.
    async fn delete_env_secret(&self, environment: &str, name: &str) -> Result<bool>;
    /// Names and last-update times (ms) of an environment's secrets; never values.
    async fn list_env_secrets(&self, environment: &str) -> Result<Vec<(String, i64)>>;
    /// Stored values of the named secrets of `environment` that exist.
    async fn env_secret_values(&self, environment: &str, names: &[String]) -> Result<BTreeMap<String, String>>;
    /// Why a deploy job restoring these artifacts may not deploy to
    /// `environment` under its `--require-provenance` policy: the first
    /// artifact refused, naming the failed check (`None`: no policy, or
    /// every artifact passes). For requests that promote or roll back
    /// (answered 409 with the refusal).
    async fn provenance_refusal(
        &self,
        environment: &str,
        artifacts: &[DeployedArtifact],
    ) -> Result<Option<kiln_provenance::deploy::Refusal>>;
}

/// Test reports, flaky tests and quarantine (issue 43).
#[async_trait]
pub trait TestStore: Send + Sync {
    /// Stage one report file the live attempt `(job, epoch)` read;
    /// `StaleEpoch` for any other epoch. `Ok(false)`: that path was staged
    /// already (a retried upload). Counted only once the attempt's
    /// completion binds it.
    async fn stage_report(&self, job_id: &str, epoch: i64, report: &StagedReport) -> Result<bool>;
    /// A run's bound reports and tests (each job's last bound attempt);
    /// `failed_only`: only failed and errored tests.
    async fn run_tests(&self, run_id: &str, failed_only: bool) -> Result<RunTestsRecord>;
    /// The signed Test Result statement of `job_id`'s newest attempt that
    /// bound reports (issue 45).
    async fn test_attestation(&self, job_id: &str) -> Result<Option<TestAttestationRecord>>;
    /// What one bound attempt's reports add up to (`None`: none bound).
    async fn attempt_tests(&self, job_id: &str, epoch: i64) -> Result<Option<TestAttemptRecord>>;
    /// A test's bound results in a repository, newest first.
    async fn test_history(&self, repo_id: &str, test_id: &str, limit: u32) -> Result<Vec<TestHistoryRecord>>;
    /// Each test's latest recorded duration (ms) in runs of `git_ref`.
    async fn test_durations(&self, repo_id: &str, git_ref: &str) -> Result<BTreeMap<String, i64>>;
    /// Quarantine a test: `Conflict` if it is already, `Invalid` past the cap.
    async fn quarantine_test(&self, q: &NewQuarantine) -> Result<QuarantineRecord>;
    /// End a test's open quarantine (`None`: it had none).
    async fn end_quarantine(&self, repo_id: &str, test_id: &str, by: &str) -> Result<Option<QuarantineRecord>>;
    /// Open quarantines, then those ended within `ended_within_ms`.
    async fn list_quarantine(&self, repo_id: &str, ended_within_ms: i64) -> Result<Vec<QuarantineRecord>>;
    /// The test ids quarantined now.
    async fn quarantined_ids(&self, repo_id: &str) -> Result<Vec<String>>;
    /// End the quarantines whose expiry passed (`ended_by` = `expiry`) and
    /// return them, once each.
    async fn expire_quarantines(&self) -> Result<Vec<QuarantineRecord>>;
    /// Per repository name: (tests flagged flaky within `window_ms`, tests
    /// quarantined now).
    async fn test_gauges(&self, window_ms: i64) -> Result<BTreeMap<String, (i64, i64)>>;
    /// The next test batch of the run's `group` for the live attempt `(job,
    /// epoch)` (`kiln tests next`); the first call seeds the queue with
    /// `batches`. A batch stays leased to its attempt until that attempt's
    /// completion binds its reports; an attempt that ends otherwise gives
    /// its batches back.
    async fn shard_next(&self, job_id: &str, epoch: i64, group: &str, batches: &[Vec<String>]) -> Result<ShardBatch>;
    /// Delete reports staged by attempts that ended without binding them
    /// (fenced, lost) more than `grace_ms` ago: they are never read. At most
    /// `limit` files; returns how many.
    async fn collect_staged_reports(&self, grace_ms: i64, limit: u32) -> Result<u64>;
}

/// The whole authoritative store.
pub trait Store:
    RepoStore
    + RunStore
    + AgentStore
    + AccessStore
    + ForgeStore
    + CacheStore
    + AttemptStore
    + OutboxStore
    + LogStore
    + ArtifactStore
    + NotifyStore
    + TestStore
    + TeamStore
    + EnvironmentStore
    + EnvSecretStore
    + RingStore
{
}
impl<
    T: RepoStore
        + RunStore
        + AgentStore
        + AccessStore
        + ForgeStore
        + CacheStore
        + AttemptStore
        + OutboxStore
        + LogStore
        + ArtifactStore
        + NotifyStore
        + TestStore
        + TeamStore
        + EnvironmentStore
        + EnvSecretStore
        + RingStore,
> Store for T
{
}
