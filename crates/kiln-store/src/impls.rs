//! The store traits on [`SqlStore`]: which transaction (in `tx/`) each
//! method is. Read this file as the table of contents of the store.

use crate::error::Result;
use crate::model::*;
use crate::store::SqlStore;
use crate::traits::*;
use crate::tx::outputs::RunOutputs;
use crate::tx::{
    accept, access, agents, artifacts, caches, cancel, claim, complete, content, deploy_gate, env_secrets,
    environments, forge, images, lease, logs, notify, outbox, repos, teams, test_reports,
};
use async_trait::async_trait;
use std::collections::BTreeMap;

#[async_trait]
impl RepoStore for SqlStore {
    async fn create_repo(&self, name: &str, clone_url: &str, webhook_secret: Option<&str>) -> Result<RepoRecord> {
        repos::create_repo(self, name, clone_url, webhook_secret).await
    }

    async fn get_repo(&self, name_or_id: &str) -> Result<RepoRecord> {
        repos::get_repo(self, name_or_id).await
    }

    async fn list_repos(&self) -> Result<Vec<RepoRecord>> {
        repos::list_repos(self).await
    }

    async fn delete_repo(&self, name_or_id: &str) -> Result<RepoRecord> {
        repos::delete_repo(self, name_or_id).await
    }

    async fn put_secret(&self, repo_id: &str, name: &str, value: &str) -> Result<()> {
        repos::put_secret(self, repo_id, name, value).await
    }

    async fn delete_secret(&self, repo_id: &str, name: &str) -> Result<bool> {
        repos::delete_secret(self, repo_id, name).await
    }

    async fn list_secrets(&self, repo_id: &str) -> Result<Vec<(String, i64)>> {
        repos::list_secrets(self, repo_id).await
    }

    async fn secret_values(&self, repo_id: &str, names: &[String]) -> Result<BTreeMap<String, String>> {
        repos::secret_values(self, repo_id, names).await
    }

    async fn all_secrets(&self) -> Result<Vec<(String, String, String)>> {
        repos::all_secrets(self).await
    }

    async fn replace_secrets(&self, changes: &[(String, String, String, String)]) -> Result<u64> {
        repos::replace_secrets(self, changes).await
    }
}

#[async_trait]
impl RunStore for SqlStore {
    async fn accept_run(&self, run: NewRun) -> Result<Accepted> {
        accept::accept_run(self, &run).await
    }

    async fn get_run(&self, run_id: &str) -> Result<RunView> {
        accept::get_run(self, run_id).await
    }

    async fn list_runs(&self, repo_id: &str, status: Option<&str>, limit: u32) -> Result<Vec<RunSummaryRecord>> {
        accept::list_runs(self, repo_id, status, limit).await
    }

    async fn find_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummaryRecord>> {
        accept::find_runs(self, filter).await
    }

    async fn find_runs_by_prefix(&self, prefix: &str, limit: u32) -> Result<Vec<String>> {
        accept::find_runs_by_prefix(self, prefix, limit).await
    }

    async fn find_run_by_number(&self, repo_id: &str, number: i64) -> Result<String> {
        accept::find_run_by_number(self, repo_id, number).await
    }

    async fn run_id_neighbours(&self, id: &str) -> Result<(Option<String>, Option<String>)> {
        accept::run_id_neighbours(self, id).await
    }

    async fn run_id_neighbours_of(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, (Option<String>, Option<String>)>> {
        accept::run_id_neighbours_of(self, ids).await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<RunRecord> {
        cancel::cancel_run(self, run_id).await
    }

    async fn cancel_job(&self, job_id: &str) -> Result<JobRecord> {
        cancel::cancel_job(self, job_id).await
    }

    async fn get_job(&self, job_id: &str) -> Result<JobRecord> {
        accept::get_job(self, job_id).await
    }

    async fn overdue_jobs(&self, max_wait_ms: i64, limit: u32) -> Result<Vec<(String, String)>> {
        crate::tx::queue::overdue(self, max_wait_ms, limit).await
    }

    async fn fail_overdue_job(&self, job_id: &str, max_wait_ms: i64, message: &str) -> Result<bool> {
        crate::tx::queue::fail_overdue(self, job_id, max_wait_ms, message).await
    }

    async fn overdue_runs(&self, limit: u32) -> Result<Vec<String>> {
        crate::tx::queue::overdue_runs(self, limit).await
    }

    async fn time_out_run(&self, run_id: &str) -> Result<bool> {
        crate::tx::queue::time_out_run(self, run_id).await
    }
}

#[async_trait]
impl AgentStore for SqlStore {
    async fn register_agent_in(
        &self,
        name: &str,
        labels: &str,
        max_jobs: u32,
        pool: &str,
        join_token_id: Option<&str>,
    ) -> Result<AgentRecord> {
        agents::register_agent(self, name, labels, max_jobs, pool, join_token_id).await
    }

    async fn get_agent(&self, agent_id: &str) -> Result<AgentRecord> {
        agents::get_agent(self, agent_id).await
    }

    async fn get_agent_for_claim(&self, agent_id: &str, claim_request_id: &str) -> Result<(AgentRecord, bool)> {
        agents::get_agent_for_claim(self, agent_id, claim_request_id).await
    }

    async fn list_agents(&self) -> Result<Vec<AgentRecord>> {
        agents::list_agents(self).await
    }

    async fn describe_agent(&self, agent_id: &str, version: &str) -> Result<()> {
        agents::describe_agent(self, agent_id, version).await
    }

    async fn set_agent_executor(&self, agent_id: &str, executor: kiln_core::claim::Executor) -> Result<()> {
        agents::set_agent_executor(self, agent_id, executor).await
    }

    async fn mark_draining(&self, agent_id: &str, session_id: &str) -> Result<bool> {
        agents::mark_draining(self, agent_id, session_id).await
    }

    async fn remove_agent(&self, agent_id: &str) -> Result<bool> {
        agents::remove_agent(self, agent_id).await
    }
    async fn touch_agents(&self, agent_ids: &[String]) -> Result<()> {
        agents::touch_agents(self, agent_ids).await
    }
    async fn expire_agents(&self, idle_ms: i64, keep: &[String]) -> Result<Vec<(String, String)>> {
        agents::expire_agents(self, idle_ms, keep).await
    }

    async fn release_predecessors(&self, agent_id: &str) -> Result<u64> {
        crate::tx::release::release_predecessors(self, agent_id).await
    }

    async fn running_per_agent(&self) -> Result<std::collections::BTreeMap<String, u32>> {
        agents::running_per_agent(self).await
    }

    async fn active_job_counts(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        agents::active_job_counts(self).await
    }

    async fn operating_gauges(&self, classes: u32) -> Result<OperatingGauges> {
        agents::operating_gauges(self, classes).await
    }

    fn transaction_retries(&self) -> u64 {
        self.retries.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn queue_classes(&self, limit: u32) -> Result<Vec<QueueClass>> {
        agents::queue_classes(self, limit).await
    }

    async fn running_attempts(&self, limit: u32) -> Result<Vec<RunningAttempt>> {
        agents::running_attempts(self, limit).await
    }
}

#[async_trait]
impl AccessStore for SqlStore {
    async fn create_join_token(&self, id: &str, name: &str, pool: &str, token_hash: &str) -> Result<JoinTokenRecord> {
        access::create_join_token(self, id, name, pool, token_hash).await
    }

    async fn get_join_token(&self, id: &str) -> Result<JoinTokenRecord> {
        access::get_join_token(self, id).await
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRecord>> {
        access::list_join_tokens(self).await
    }

    async fn revoke_join_token(&self, id: &str) -> Result<bool> {
        access::revoke_join_token(self, id).await
    }

    async fn create_api_token(&self, token: &ApiTokenRecord) -> Result<ApiTokenRecord> {
        access::create_api_token(self, token).await
    }

    async fn get_api_token(&self, id: &str) -> Result<ApiTokenRecord> {
        access::get_api_token(self, id).await
    }

    async fn list_api_tokens(&self) -> Result<Vec<ApiTokenRecord>> {
        access::list_api_tokens(self).await
    }

    async fn revoke_api_token(&self, id: &str) -> Result<bool> {
        access::revoke_api_token(self, id).await
    }

    async fn touch_api_token(&self, id: &str) -> Result<()> {
        access::touch_api_token(self, id).await
    }

    async fn create_ui_session(
        &self,
        id_hash: &str,
        actor: &str,
        token_hash: &str,
        ttl_ms: i64,
    ) -> Result<UiSessionRecord> {
        access::create_ui_session(self, id_hash, actor, token_hash, ttl_ms).await
    }

    async fn get_ui_session(&self, id_hash: &str) -> Result<UiSessionRecord> {
        access::get_ui_session(self, id_hash).await
    }

    async fn delete_ui_session(&self, id_hash: &str) -> Result<bool> {
        access::delete_ui_session(self, id_hash).await
    }

    async fn set_secret_pools(&self, repo_id: &str, pools: &[String]) -> Result<()> {
        access::set_secret_pools(self, repo_id, pools).await
    }

    async fn audit(&self, entry: &NewAudit) -> Result<()> {
        access::audit(self, entry).await
    }

    async fn list_audit(&self, before: Option<i64>, limit: u32) -> Result<Vec<AuditEntry>> {
        access::list_audit(self, before, limit).await
    }
}

#[async_trait]
impl AttemptStore for SqlStore {
    async fn claim_placed(&self, req: ClaimInput) -> Result<ClaimOutcome> {
        claim::claim(self, &req).await
    }

    async fn claimed_by_request(&self, claim_request_id: &str, session_id: &str) -> Result<Option<ClaimedAttempt>> {
        claim::claimed_by_request(self, claim_request_id, session_id).await
    }

    async fn heartbeat(&self, job_id: &str, epoch: i64, lease_ttl_ms: i64) -> Result<HeartbeatOutcome> {
        lease::heartbeat(self, job_id, epoch, lease_ttl_ms).await
    }

    async fn complete_held(&self, job_id: &str, epoch: i64, completion: CompletionInput) -> Result<Completed> {
        complete::complete(self, job_id, epoch, &completion).await
    }

    async fn release_attempt(&self, job_id: &str, epoch: i64, end: SandboxEnd) -> Result<bool> {
        crate::tx::release::release_attempt(self, job_id, epoch, &end).await
    }

    async fn run_outputs(&self, run_id: &str) -> Result<RunOutputs> {
        crate::tx::outputs::of_run(&mut self.reader().await?, run_id).await
    }

    async fn fence_expired(&self) -> Result<Vec<(String, i64)>> {
        lease::fence_expired(self).await
    }

    async fn extend_running_leases(&self, outage_ms: i64, margin_ms: i64) -> Result<u64> {
        lease::extend_running_leases(self, outage_ms, margin_ms).await
    }

    async fn commit_image_digest(&self, job_id: &str, epoch: i64, digest: &str, local: bool) -> Result<String> {
        images::commit_image_digest(self, job_id, epoch, digest, local).await
    }

    async fn shorten_session_leases(&self, session_id: &str, grace_ms: i64) -> Result<u64> {
        lease::shorten_session_leases(self, session_id, grace_ms).await
    }
}

#[async_trait]
impl OutboxStore for SqlStore {
    async fn pending_outbox(&self, limit: u32) -> Result<Vec<OutboxEvent>> {
        outbox::pending_outbox(self, limit).await
    }

    async fn mark_published(&self, ids: &[i64]) -> Result<()> {
        outbox::mark_published(self, ids).await
    }

    async fn ready_jobs(&self) -> Result<Vec<OutboxEvent>> {
        outbox::ready_jobs(self).await
    }

    async fn ready_jobs_of(&self, job_ids: &[String]) -> Result<Vec<OutboxEvent>> {
        outbox::ready_jobs_of(self, job_ids).await
    }

    async fn ready_wakeups(&self) -> Result<Option<std::sync::Arc<crate::ReadyWakeups>>> {
        self.listen_ready().await
    }
}

#[async_trait]
impl LogStore for SqlStore {
    fn set_log_objects(&self, objects: std::sync::Arc<dyn crate::LogObjects>) {
        self.put_log_objects(objects);
    }

    async fn collect_log_objects(&self, min_age_ms: i64, limit: u32) -> Result<usize> {
        logs::collect_log_objects(self, min_age_ms, limit).await
    }

    async fn append_log_chunk(&self, chunk: NewLogChunk) -> Result<Vec<(String, i64)>> {
        logs::append_log_chunk(self, chunk).await
    }

    async fn append_log_batch(&self, chunks: Vec<NewLogChunk>) -> Result<(usize, Vec<(String, i64)>)> {
        logs::append_log_batch(self, chunks).await
    }

    async fn log_chunks_after(&self, job_id: &str, after_id: i64, limit: u32) -> Result<Vec<LogChunkRecord>> {
        logs::log_chunks_after(self, job_id, after_id, limit).await
    }

    async fn logs_to_archive(&self, grace_ms: i64, limit: u32) -> Result<Vec<String>> {
        logs::logs_to_archive(self, grace_ms, limit).await
    }

    async fn record_log_archive(&self, archive: &LogArchive) -> Result<()> {
        logs::record_log_archive(self, archive).await
    }

    async fn log_archives(&self, job_id: &str) -> Result<Vec<LogArchive>> {
        logs::log_archives(self, job_id).await
    }
}

#[async_trait]
impl ArtifactStore for SqlStore {
    fn set_attester(&self, attester: std::sync::Arc<dyn Attester>) {
        self.put_attester(attester);
    }

    async fn artifact_provenance(&self, generation_id: &str) -> Result<Option<ProvenanceRecord>> {
        crate::tx::provenance::get(self, generation_id).await
    }

    async fn create_generation(
        &self,
        job_id: &str,
        epoch: i64,
        name: &str,
        size: i64,
        sha256: &str,
        part_size: i64,
    ) -> Result<GenerationRecord> {
        let g = NewGeneration { name, size, sha256, part_size, kind: "file" };
        artifacts::create_generation(self, job_id, epoch, g).await
    }

    async fn open_generation(&self, job_id: &str, epoch: i64, g: NewGeneration<'_>) -> Result<GenerationRecord> {
        artifacts::create_generation(self, job_id, epoch, g).await
    }

    async fn get_generation(&self, id: &str) -> Result<GenerationRecord> {
        artifacts::get_generation(self, id).await
    }

    async fn set_generation_digest(
        &self,
        id: &str,
        job_id: &str,
        epoch: i64,
        sha256: &str,
    ) -> Result<GenerationRecord> {
        artifacts::set_generation_digest(self, id, job_id, epoch, sha256).await
    }

    async fn uploadable_generation(&self, id: &str) -> Result<GenerationRecord> {
        artifacts::uploadable_generation(self, id).await
    }

    async fn set_generation_upload(&self, id: &str, upload_id: &str) -> Result<String> {
        artifacts::set_generation_upload(self, id, upload_id).await
    }

    async fn seal_generation(&self, id: &str, job_id: &str, epoch: i64) -> Result<GenerationRecord> {
        artifacts::seal_generation(self, id, job_id, epoch).await
    }

    async fn fail_generation(&self, id: &str, message: &str) -> Result<()> {
        artifacts::fail_generation(self, id, message).await
    }

    async fn resolve_binding(&self, run_id: &str, job_name: &str, name: &str) -> Result<BoundArtifact> {
        artifacts::resolve_binding(self, run_id, job_name, name).await
    }

    async fn run_bindings(&self, run_id: &str) -> Result<Vec<BoundArtifact>> {
        artifacts::run_bindings(self, run_id).await
    }

    async fn collectable_generations(&self, grace_ms: i64, limit: u32) -> Result<Vec<GenerationRecord>> {
        artifacts::collectable_generations(self, grace_ms, limit).await
    }

    async fn mark_generation_deleted(&self, id: &str) -> Result<()> {
        artifacts::mark_generation_deleted(self, id).await
    }

    async fn expirable_artifacts(&self, limit: u32) -> Result<Vec<BoundArtifact>> {
        artifacts::expirable_artifacts(self, limit).await
    }

    async fn expire_artifact(&self, generation_id: &str) -> Result<bool> {
        artifacts::expire_artifact(self, generation_id).await
    }

    async fn mark_expired_deleted(&self, generation_id: &str) -> Result<()> {
        artifacts::mark_expired_deleted(self, generation_id).await
    }

    async fn reference_content(&self, id: &str, job_id: &str, epoch: i64) -> Result<String> {
        content::reference_content(self, id, job_id, epoch).await
    }

    async fn migratable_generations(&self, limit: u32) -> Result<Vec<GenerationRecord>> {
        content::migratable_generations(self, limit).await
    }

    async fn touch_content(&self, sha256: &str, size: i64) -> Result<()> {
        content::touch_content(self, sha256, size).await
    }

    async fn move_to_content(&self, id: &str, from: &str, retire_after_ms: i64) -> Result<bool> {
        content::move_to_content(self, id, from, retire_after_ms).await
    }

    async fn retirable_sessions(&self, limit: u32) -> Result<Vec<GenerationRecord>> {
        content::retirable_sessions(self, limit).await
    }

    async fn session_retired(&self, id: &str) -> Result<()> {
        content::session_retired(self, id).await
    }

    async fn collectable_content(&self, grace_ms: i64, limit: u32) -> Result<Vec<String>> {
        content::collectable_content(self, grace_ms, limit).await
    }

    async fn begin_content_delete(&self, sha256: &str, grace_ms: i64) -> Result<bool> {
        content::begin_content_delete(self, sha256, grace_ms).await
    }

    async fn content_deleted(&self, sha256: &str) -> Result<()> {
        content::content_deleted(self, sha256).await
    }

    async fn content_usage(&self) -> Result<(i64, i64)> {
        content::content_usage(self).await
    }

    async fn note_manifest(&self, id: &str, job_id: &str, epoch: i64, sha256: &str) -> Result<()> {
        content::note_manifest(self, id, job_id, epoch, sha256).await
    }
}

#[async_trait]
impl ForgeStore for SqlStore {
    async fn record_delivery(&self, d: &NewDelivery) -> Result<(DeliveryRecord, bool)> {
        forge::record_delivery(self, d).await
    }

    async fn get_delivery(&self, id: &str) -> Result<DeliveryRecord> {
        forge::get_delivery(self, id).await
    }

    async fn list_deliveries(&self, repo_id: &str, limit: u32) -> Result<Vec<DeliveryRecord>> {
        forge::list_deliveries(self, repo_id, limit).await
    }

    async fn due_deliveries(&self, limit: u32) -> Result<Vec<DeliveryRecord>> {
        forge::due_deliveries(self, limit).await
    }

    async fn delivery_backlog(&self, delayed_after_ms: i64) -> Result<crate::model::DeliveryBacklog> {
        forge::delivery_backlog(self, delayed_after_ms).await
    }

    async fn claim_delivery(&self, id: &str, ttl_ms: i64) -> Result<bool> {
        forge::claim_delivery(self, id, ttl_ms).await
    }

    async fn finish_delivery(&self, id: &str, status: &str, message: Option<&str>, run_ids: &[String]) -> Result<()> {
        forge::finish_delivery(self, id, status, message, run_ids).await
    }

    async fn defer_delivery(&self, id: &str, delay_ms: i64, message: &str) -> Result<()> {
        forge::defer_delivery(self, id, delay_ms, message).await
    }

    async fn create_report(
        &self,
        repo_id: &str,
        commit_sha: &str,
        context: &str,
        fixed_state: &str,
        description: &str,
    ) -> Result<String> {
        forge::create_report(self, repo_id, commit_sha, context, fixed_state, description).await
    }

    async fn due_reports(&self, limit: u32) -> Result<Vec<ReportTodo>> {
        forge::due_reports(self, limit).await
    }

    async fn claim_report(&self, id: &str, ttl_ms: i64) -> Result<bool> {
        forge::claim_report(self, id, ttl_ms).await
    }

    async fn report_sent(&self, id: &str, state: &str, done: bool, error: Option<&str>) -> Result<()> {
        forge::report_sent(self, id, state, done, error).await
    }

    async fn report_retry(&self, id: &str, delay_ms: i64, error: &str) -> Result<()> {
        forge::report_retry(self, id, delay_ms, error).await
    }

    async fn reports_of_commit(
        &self,
        repo_id: &str,
        commit_sha: &str,
    ) -> Result<Vec<(String, Option<String>, Option<String>, bool)>> {
        forge::reports_of_commit(self, repo_id, commit_sha).await
    }

    async fn report_context_of_run(&self, run_id: &str) -> Result<Option<String>> {
        forge::report_context_of_run(self, run_id).await
    }

    async fn record_ref_head(&self, repo_id: &str, git_ref: &str, sha: &str) -> Result<()> {
        forge::record_ref_head(self, repo_id, git_ref, sha).await
    }

    async fn ref_heads(&self, repo_id: &str) -> Result<Vec<(String, String)>> {
        forge::ref_heads(self, repo_id).await
    }

    async fn schedule_cursor(&self, repo_id: &str, path: &str) -> Result<Option<i64>> {
        forge::schedule_cursor(self, repo_id, path).await
    }

    async fn advance_schedule_cursor(&self, repo_id: &str, path: &str, from: Option<i64>, to: i64) -> Result<bool> {
        forge::advance_schedule_cursor(self, repo_id, path, from, to).await
    }

    async fn acquire_lease(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<bool> {
        forge::acquire_lease(self, name, holder, ttl_ms).await
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        forge::release_lease(self, name, holder).await
    }

    async fn lease_holders(&self, prefix: &str) -> Result<Vec<String>> {
        forge::lease_holders(self, prefix).await
    }

    async fn set_repo_forge(&self, repo_id: &str, forge: &RepoForge) -> Result<()> {
        forge::set_repo_forge(self, repo_id, forge).await
    }

    async fn set_webhook_secret(&self, repo_id: &str, secret: Option<&str>) -> Result<()> {
        forge::set_webhook_secret(self, repo_id, secret).await
    }

    async fn repos_to_poll(&self) -> Result<Vec<String>> {
        forge::repos_to_poll(self).await
    }
}

#[async_trait]
impl CacheStore for SqlStore {
    async fn bind_cache(&self, job_id: &str, epoch: i64, entry: NewCacheEntry<'_>) -> Result<CacheBinding> {
        caches::bind_cache(self, job_id, epoch, entry).await
    }

    async fn lookup_cache(&self, repo_id: &str, candidates: &[(String, String)]) -> Result<Option<CacheHit>> {
        caches::lookup_cache(self, repo_id, candidates).await
    }

    async fn lookup_cache_prefix(&self, repo_id: &str, prefixes: &[(String, String)]) -> Result<Option<CacheHit>> {
        caches::lookup_cache_prefix(self, repo_id, prefixes).await
    }

    async fn evict_caches(&self, ttl_ms: i64, repo_quota: i64, global_budget: i64) -> Result<Vec<CacheEntry>> {
        caches::evict_caches(self, ttl_ms, repo_quota, global_budget).await
    }

    async fn get_cache(&self, repo_id: &str, namespace: &str, key: &str) -> Result<Option<CacheEntry>> {
        caches::get_cache(self, repo_id, namespace, key).await
    }

    async fn list_caches(&self, repo_id: &str) -> Result<Vec<CacheEntry>> {
        caches::list_caches(self, repo_id).await
    }

    async fn remove_cache(&self, repo_id: &str, namespace: &str, key: &str, generation_id: &str) -> Result<bool> {
        caches::remove_cache(self, repo_id, namespace, key, generation_id).await
    }

    async fn report_cache(&self, job_id: &str, epoch: i64, report: &str) -> Result<()> {
        caches::report_cache(self, job_id, epoch, report).await
    }
}

#[async_trait]
impl NotifyStore for SqlStore {
    async fn create_notification(&self, n: &NotificationRecord, sealed_secret: &str) -> Result<NotificationRecord> {
        notify::create_notification(self, n, sealed_secret).await
    }

    async fn list_notifications(&self, repo_id: &str) -> Result<Vec<NotificationRecord>> {
        notify::list_notifications(self, repo_id).await
    }

    async fn delete_notification(&self, repo_id: &str, id: &str) -> Result<NotificationRecord> {
        notify::delete_notification(self, repo_id, id).await
    }

    async fn due_notifications(&self, limit: u32) -> Result<Vec<DueNotification>> {
        notify::due_notifications(self, limit).await
    }

    async fn claim_notification(&self, id: &str, ttl_ms: i64) -> Result<bool> {
        notify::claim_notification(self, id, ttl_ms).await
    }

    async fn notification_delivered(&self, id: &str, status_code: i64) -> Result<bool> {
        notify::notification_delivered(self, id, status_code).await
    }

    async fn notification_retry(&self, id: &str, delay_ms: i64, status_code: Option<i64>, error: &str) -> Result<()> {
        notify::notification_retry(self, id, delay_ms, status_code, error).await
    }

    async fn notification_failed(&self, id: &str, status_code: Option<i64>, error: &str) -> Result<()> {
        notify::notification_failed(self, id, status_code, error).await
    }

    async fn notification_deliveries(&self, repo_id: &str, limit: u32) -> Result<Vec<NotificationDelivery>> {
        notify::notification_deliveries(self, repo_id, limit).await
    }

    async fn set_repo_public(&self, repo_id: &str, public: bool) -> Result<()> {
        notify::set_repo_public(self, repo_id, public).await
    }

    async fn badge_status(
        &self,
        repo_id: &str,
        branch: &str,
        workflow_paths: &[String],
    ) -> Result<Option<kiln_core::RunStatus>> {
        notify::badge_status(self, repo_id, branch, workflow_paths).await
    }
}

#[async_trait]
impl TestStore for SqlStore {
    async fn stage_report(&self, job_id: &str, epoch: i64, report: &StagedReport) -> Result<bool> {
        test_reports::stage_report(self, job_id, epoch, report).await
    }

    async fn run_tests(&self, run_id: &str, failed_only: bool) -> Result<RunTestsRecord> {
        test_reports::run_tests(self, run_id, failed_only).await
    }

    async fn test_attestation(&self, job_id: &str) -> Result<Option<TestAttestationRecord>> {
        crate::tx::provenance::test_attestation(self, job_id).await
    }

    async fn attempt_tests(&self, job_id: &str, epoch: i64) -> Result<Option<TestAttemptRecord>> {
        test_reports::attempt_tests(self, job_id, epoch).await
    }

    async fn test_history(&self, repo_id: &str, test_id: &str, limit: u32) -> Result<Vec<TestHistoryRecord>> {
        test_reports::test_history(self, repo_id, test_id, limit).await
    }

    async fn test_durations(&self, repo_id: &str, git_ref: &str) -> Result<BTreeMap<String, i64>> {
        test_reports::test_durations(self, repo_id, git_ref).await
    }

    async fn quarantine_test(&self, q: &NewQuarantine) -> Result<QuarantineRecord> {
        test_reports::quarantine_test(self, q).await
    }

    async fn end_quarantine(&self, repo_id: &str, test_id: &str, by: &str) -> Result<Option<QuarantineRecord>> {
        test_reports::end_quarantine(self, repo_id, test_id, by).await
    }

    async fn list_quarantine(&self, repo_id: &str, ended_within_ms: i64) -> Result<Vec<QuarantineRecord>> {
        test_reports::list_quarantine(self, repo_id, ended_within_ms).await
    }

    async fn quarantined_ids(&self, repo_id: &str) -> Result<Vec<String>> {
        test_reports::quarantined_ids(self, repo_id).await
    }

    async fn expire_quarantines(&self) -> Result<Vec<QuarantineRecord>> {
        test_reports::expire_quarantines(self).await
    }

    async fn test_gauges(&self, window_ms: i64) -> Result<BTreeMap<String, (i64, i64)>> {
        test_reports::test_gauges(self, window_ms).await
    }

    async fn shard_next(&self, job_id: &str, epoch: i64, group: &str, batches: &[Vec<String>]) -> Result<ShardBatch> {
        test_reports::shard_next(self, job_id, epoch, group, batches).await
    }

    async fn collect_staged_reports(&self, grace_ms: i64, limit: u32) -> Result<u64> {
        test_reports::collect_staged_reports(self, grace_ms, limit).await
    }
}

#[async_trait]
impl TeamStore for SqlStore {
    async fn create_team(
        &self,
        name: &str,
        weight: u32,
        max_running: Option<u32>,
        max_queued: Option<u32>,
    ) -> Result<TeamRecord> {
        teams::create_team(self, name, weight, max_running, max_queued).await
    }

    async fn get_team(&self, name: &str) -> Result<TeamRecord> {
        teams::get_team(self, name).await
    }

    async fn list_teams(&self) -> Result<Vec<TeamRecord>> {
        teams::list_teams(self).await
    }

    async fn update_team(&self, name: &str, update: &TeamUpdate) -> Result<TeamRecord> {
        teams::update_team(self, name, update).await
    }

    async fn delete_team(&self, name: &str) -> Result<TeamRecord> {
        teams::delete_team(self, name).await
    }

    async fn set_repo_team(&self, repo_id: &str, team: &str) -> Result<()> {
        teams::set_repo_team(self, repo_id, team).await
    }

    async fn queue_groups(&self) -> Result<Vec<QueueGroup>> {
        teams::queue_groups(self).await
    }

    async fn queued_jobs(&self, team: Option<&str>) -> Result<i64> {
        teams::queued_jobs(self, team).await
    }

    async fn set_run_priority(&self, run_id: &str, lane: &str) -> Result<u32> {
        teams::set_run_priority(self, run_id, lane).await
    }

    async fn charge_teams(&self, charges: &[TeamCharge]) -> Result<std::collections::BTreeMap<String, u64>> {
        teams::charge_teams(self, charges).await
    }
}

#[async_trait]
impl EnvSecretStore for SqlStore {
    async fn put_env_secret(&self, environment: &str, name: &str, sealed: &str) -> Result<()> {
        env_secrets::put_env_secret(self, environment, name, sealed).await
    }

    async fn delete_env_secret(&self, environment: &str, name: &str) -> Result<bool> {
        env_secrets::delete_env_secret(self, environment, name).await
    }

    async fn list_env_secrets(&self, environment: &str) -> Result<Vec<(String, i64)>> {
        env_secrets::list_env_secrets(self, environment).await
    }

    async fn env_secret_values(&self, environment: &str, names: &[String]) -> Result<BTreeMap<String, String>> {
        env_secrets::env_secret_values(self, environment, names).await
    }

    async fn provenance_refusal(
        &self,
        environment: &str,
        artifacts: &[DeployedArtifact],
    ) -> Result<Option<kiln_provenance::deploy::Refusal>> {
        deploy_gate::provenance_refusal(self, environment, artifacts).await
    }
}

#[async_trait]
impl RingStore for SqlStore {
    async fn due_ring_gates(&self) -> Result<Vec<RingGateRecord>> {
        crate::tx::rings::due(self).await
    }

    async fn run_ring_gates(&self, run_id: &str) -> Result<Vec<RingGateRecord>> {
        crate::tx::rings::of_run(self, run_id).await
    }

    async fn settle_ring_gate(&self, step: &RingGateStep) -> Result<bool> {
        crate::tx::rings::settle(self, step).await
    }

    async fn claim_ring_rollback(&self, job_id: &str, note: &str) -> Result<bool> {
        crate::tx::rings::claim_rollback(self, job_id, note).await
    }

    async fn record_ring_rollback(&self, job_id: &str, outcome: &str) -> Result<()> {
        crate::tx::rings::record_rollback(self, job_id, outcome).await
    }

    async fn manual_promotion(&self, run_id: &str, actor: &str, what: Manual) -> Result<RingGateRecord> {
        crate::tx::rings::manual(self, run_id, actor, what).await
    }
}

#[async_trait]
impl EnvironmentStore for SqlStore {
    async fn put_environment(&self, env: &EnvironmentRecord, create: bool) -> Result<EnvironmentRecord> {
        environments::put_environment(self, env, create).await
    }

    async fn get_environment(&self, name: &str) -> Result<EnvironmentRecord> {
        environments::get_environment(self, name).await
    }

    async fn list_environments(&self) -> Result<Vec<EnvironmentRecord>> {
        environments::list_environments(self).await
    }

    async fn delete_environment(&self, name: &str) -> Result<EnvironmentRecord> {
        environments::delete_environment(self, name).await
    }

    async fn decide_deployment(&self, approval: &ApprovalRecord) -> Result<ApprovalRecord> {
        environments::decide_deployment(self, approval).await
    }

    async fn run_approvals(&self, run_id: &str) -> Result<Vec<ApprovalRecord>> {
        environments::run_approvals(self, run_id).await
    }

    async fn deployments(&self, environment: &str, limit: u32) -> Result<Vec<DeploymentRecord>> {
        environments::deployments(self, environment, limit).await
    }

    async fn rollback_target(&self, environment: &str, to: Option<&str>) -> Result<DeploymentRecord> {
        crate::tx::rollback::rollback_target(self, environment, to).await
    }
}
