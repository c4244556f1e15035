//! The store conformance suite: every rule of the authoritative store that a
//! backend must keep (spec 000 §6–§9, §12, §13, §15; ARCHITECTURE.md invariants).
//!
//! The suite is generic over the backend. A test binary per backend provides
//! an async constructor `fn(Backoff) -> Fixture<S>` (a fresh, empty store
//! with the given retry backoff) and instantiates everything with
//! [`suite!`]:
//!
//! ```ignore
//! mod conformance;
//! async fn open(backoff: Backoff) -> conformance::Fixture<SqliteStore> { … }
//! conformance::suite!(open);
//! ```
//!
//! Time: leases are decided in database time. Tests sleep only to let a
//! lease expire; the store has no background work to wait for.

#![allow(dead_code)]

pub mod accept;
pub mod access;
pub mod artifacts;
pub mod bench;
pub mod caches;
pub mod cancel;
pub mod claim;
pub mod completion;
pub mod env_secrets;
pub mod environments;
pub mod forge;
pub mod gauges;
pub mod graphs;
pub mod images;
pub mod lease;
pub mod logs;
pub mod notify;
pub mod outbox;
pub mod outputs;
pub mod reports;
pub mod state_machine;
pub mod teams;

use kiln_core::{AttemptOutcome, Backoff, JobStatus};
use kiln_store::*;
use kiln_workflow::{Job, Step, Workflow};
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Instantiate the whole conformance suite for a backend. `$open` is an async
/// fn (or closure returning a future) `Fn(Backoff) -> Fixture<S>`.
macro_rules! suite {
    ($open:expr) => {
        $crate::conformance::suite!($open, available = true);
    };
    // `$available` is checked first in every test: false skips the test
    // (a backend that is not installed here).
    ($open:expr, available = $available:expr) => {
        $crate::conformance::suite!(@each $open, $available;
            accept::accept_run_freezes_definition_and_readies_roots,
            accept::idempotency_key_returns_the_same_run,
            accept::idempotency_key_with_other_body_is_refused,
            accept::concurrent_idempotent_accepts_create_one_run,
            accept::unknown_repository_is_not_unavailable,
            accept::runs_are_numbered_per_repository,
            accept::runs_are_filtered_by_event_and_actor_and_paged,
            accept::run_id_neighbours_of_a_page_are_each_runs_own,
            access::join_tokens_are_stored_hashed_and_revocable,
            access::api_tokens_carry_scope_repo_and_trust,
            access::agents_register_in_pools_and_removal_ends_their_leases,
            access::idle_agents_expire_unless_running_or_connected,
            access::secret_pools_and_audit_log,
            access::secrets_are_replaced_all_or_nothing,
            access::agents_record_their_version_and_draining,
            gauges::operating_gauges_count_live_rows_by_class_and_agent,
            caches::cache_keys_bind_first_writer_wins_and_fenced_attempts_bind_nothing,
            caches::concurrent_saves_of_one_key_leave_one_binding,
            caches::prefix_lookups_find_the_most_recently_used_entry_of_a_namespace,
            caches::eviction_frees_entries_and_their_bytes_become_garbage,
            forge::deliveries_are_recorded_once_and_planned_by_one_claimant,
            forge::reports_follow_their_run_and_newer_ones_supersede,
            forge::the_leader_lease_has_one_holder_until_it_lapses,
            forge::lease_holders_are_the_live_ones_under_a_prefix,
            forge::schedule_cursors_move_by_compare_and_set,
            forge::ref_heads_polls_and_credentials,
            images::accept_stores_the_resolved_image_digests,
            images::built_image_digest_is_committed_once_by_the_live_epoch,
            claim::claim_creates_epoch_one_and_starts_the_run,
            claim::duplicate_delivery_is_absorbed,
            claim::stale_dispatch_generation_is_refused,
            claim::claim_in_cancelled_run_is_refused,
            claim::claim_respects_agent_capacity,
            claim::claim_requires_compatible_labels,
            claim::claim_follows_trust_and_isolation,
            graphs::diamond_fans_out_and_in,
            graphs::conditions_decide_ready_or_skipped,
            graphs::quorum_needs_enough_successes,
            graphs::matrix_max_parallel_limits_ready_siblings,
            graphs::fail_fast_cancels_siblings,
            graphs::concurrency_group_runs_one_at_a_time,
            graphs::concurrency_cancel_in_progress,
            graphs::job_concurrency_group_one_at_a_time,
            graphs::job_concurrency_cancel_in_progress,
            environments::one_approval_covers_every_expansion_and_a_rejection_cancels_them,
            environments::an_environments_deploys_run_one_run_at_a_time_in_order,
            environments::an_environments_wait_delays_its_deploy_jobs,
            environments::deployed_generations_are_pinned_and_a_rollback_deploys_them_again,
            environments::a_rollout_holds_its_queue_between_rings_and_a_failed_gate_cancels_the_rest,
            environments::an_untrusted_runs_prometheus_gate_fails_unmeasured,
            env_secrets::environment_secrets_are_listed_by_name_resealed_and_removed_with_their_environment,
            env_secrets::a_deploy_job_restoring_an_artifact_its_environment_refuses_is_cancelled_naming_the_check,
            claim::claim_requires_the_current_session,
            claim::claim_request_id_is_idempotent,
            claim::concurrent_claims_of_one_job_create_one_attempt,
            claim::concurrent_claims_never_exceed_agent_capacity,
            claim::concurrent_retries_of_one_claim_request_create_one_attempt,
            lease::heartbeat_extends_the_lease,
            lease::heartbeat_with_wrong_epoch_is_stale,
            lease::concurrent_heartbeats_each_get_their_own_answer,
            lease::expired_lease_is_stale_before_the_reconciler_runs,
            lease::fencing_rejects_the_replaced_epoch,
            lease::lost_attempts_use_the_infra_budget,
            lease::shorten_session_leases_only_touches_that_session,
            lease::an_outage_extends_only_leases_live_when_it_began,
            completion::success_readies_successor_and_finishes_run,
            completion::successor_waits_for_every_need,
            completion::concurrent_completions_ready_a_fan_in_once,
            completion::completion_racing_cancellation_is_one_or_the_other,
            completion::stale_completion_changes_nothing,
            completion::failure_without_retry_fails_and_skips_downstream,
            completion::failure_with_retry_is_claimable_after_backoff,
            completion::retried_job_that_succeeds_unblocks_successor,
            completion::infra_failures_retry_up_to_the_default_budget,
            completion::retry_policy_follows_failure_classes,
            completion::overdue_ready_jobs_fail_and_their_runs_end,
            completion::runs_past_their_deadline_are_cancelled_once,
            outbox::relay_delivering_twice_is_absorbed,
            outbox::unmarked_events_are_delivered_again,
            cancel::cancel_after_success_is_a_no_op,
            cancel::cancel_before_completion_rejects_late_success,
            cancel::cancel_of_queued_run_cancels_everything,
            cancel::cancelling_one_job_lets_the_run_go_on,
            cancel::cancelling_a_running_job_stops_it_and_binds_nothing,
            cancel::cancel_with_lost_agent_waits_for_its_release,
            cancel::a_completion_records_how_the_sandbox_ended,
            cancel::removal_or_a_fresh_start_of_the_agent_ends_the_wait,
            cancel::a_cancel_waits_for_an_attempt_lost_before_it,
            logs::identical_log_retry_is_accepted,
            logs::conflicting_log_bytes_are_refused,
            logs::out_of_order_chunks_commit_contiguously,
            logs::chunks_in_flight_together_commit_in_offset_order,
            logs::bulk_chunks_beyond_the_admitted_ones_commit_in_order_beside_small_ones,
            logs::in_order_chunks_never_commit_past_a_missing_predecessor,
            logs::streams_are_tracked_separately,
            logs::bad_digest_and_stale_epoch_are_refused,
            logs::log_chunks_after_respects_the_cursor,
            logs::a_batch_of_small_chunks_is_judged_chunk_by_chunk_in_one_transaction,
            logs::completion_seals_the_log_and_fencing_marks_a_gap,
            logs::archiving_trims_exactly_what_the_archive_holds,
            artifacts::create_generation_requires_live_epoch_and_declared_name,
            artifacts::digest_named_at_seal_time,
            artifacts::every_session_gets_a_fresh_generation_and_key,
            artifacts::uploadable_only_while_live_and_uploading,
            artifacts::first_upload_id_wins_while_uploading,
            artifacts::uploadable_closes_when_the_attempt_ends,
            artifacts::seal_requires_the_generations_live_epoch,
            artifacts::completion_binds_the_sealed_output,
            artifacts::completion_binds_every_declared_output_of_the_epoch,
            artifacts::success_with_uploading_output_fails_the_job,
            artifacts::success_with_failed_output_fails_the_job,
            artifacts::success_without_output_fails_the_job,
            artifacts::failed_completion_binds_nothing,
            artifacts::retried_job_binds_only_the_succeeding_epochs_outputs,
            artifacts::retried_job_binds_the_succeeding_epoch,
            artifacts::cancelled_run_binds_nothing,
            artifacts::vanished_runner_never_wins_the_binding,
            artifacts::replacement_never_inherits_a_fenced_epochs_output,
            artifacts::resolve_binding_by_name_and_id_within_its_run,
            artifacts::gc_collects_only_unbound_generations_of_ended_attempts,
            artifacts::deleted_generation_is_never_bound,
            outputs::outputs_bind_only_with_the_live_epochs_success,
            outputs::bound_outputs_decide_conditions_downstream,
            artifacts::bound_artifacts_expire_only_after_their_run_ended,
            artifacts::retry_of_failed_jobs_pins_the_successful_prefix,
            artifacts::bindings_carry_signed_provenance_of_the_winning_epoch_only,
            artifacts::content_objects_live_while_any_generation_references_them,
            notify::run_ends_are_enqueued_once_per_wanting_notification,
            notify::badges_read_the_newest_run_of_a_branch_and_workflow,
            reports::reports_bind_with_the_live_attempt_and_flakes_are_decided_at_run_end,
            reports::quarantine_has_an_owner_a_cap_and_an_end,
            reports::quarantined_failures_pass_only_with_a_complete_covering_report,
            reports::shard_batches_are_leased_to_the_live_attempt_and_come_back_when_it_is_lost,
            reports::test_results_are_attested_over_the_restored_artifacts,
            teams::teams_hold_repositories_and_change_at_runtime,
            teams::claims_charge_their_team_and_hold_its_running_quota,
            teams::a_runs_lane_changes_with_its_ready_jobs,
            teams::fair_share_through_the_store_follows_the_reference_model,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        #[ignore = "a throughput figure, not a test"]
        async fn bench_claims() {
            if $available {
                $crate::conformance::bench::claims_per_second(&$crate::conformance::Opener::new($open)).await;
            }
        }

        #[test]
        fn state_machine_proptest() {
            if $available {
                $crate::conformance::state_machine::check($crate::conformance::Opener::new($open));
            }
        }

        #[test]
        fn random_dags_in_random_orders() {
            if $available {
                $crate::conformance::graphs::random_dags_in_random_orders($crate::conformance::Opener::new($open));
            }
        }
    };
    (@each $open:expr, $available:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                if $available {
                    $crate::conformance::$module::$name(&$crate::conformance::Opener::new($open)).await;
                }
            }
        )*
    };
}
pub(crate) use suite;

/// A fresh store plus whatever keeps it alive (a temp dir, a database).
pub struct Fixture<S> {
    pub store: Arc<S>,
    _guard: Box<dyn Any>,
}

impl<S: Store> Fixture<S> {
    pub fn new(store: S, guard: impl Any) -> Self {
        store.set_attester(test_attester());
        Fixture { store: Arc::new(store), _guard: Box::new(guard) }
    }
}

/// The signer of the suite's provenance (issue 45): one key per process.
pub struct TestAttester {
    key: p256::ecdsa::SigningKey,
    id: String,
}

impl Attester for TestAttester {
    fn sign(&self, statement: &[u8]) -> std::result::Result<(String, String), String> {
        let env = kiln_provenance::dsse::sign(kiln_provenance::dsse::IN_TOTO, statement, &self.key, &self.id);
        Ok((serde_json::to_string(&env).map_err(|e| e.to_string())?, self.id.clone()))
    }
    fn builder_id(&self, pool: &str) -> String {
        format!("https://kiln.test/builders/{pool}")
    }
    fn version(&self) -> String {
        "test".into()
    }
    fn verifying_keys(&self) -> Vec<kiln_provenance::dsse::PublicKey> {
        vec![kiln_provenance::dsse::PublicKey { keyid: self.id.clone(), key: *self.key.verifying_key() }]
    }
}

pub fn test_attester() -> Arc<TestAttester> {
    static KEY: std::sync::OnceLock<Arc<TestAttester>> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let key = loop {
            if let Ok(k) = p256::ecdsa::SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
                break k;
            }
        };
        let id = kiln_provenance::dsse::thumbprint(key.verifying_key());
        Arc::new(TestAttester { key, id })
    })
    .clone()
}

/// The public key of [`test_attester`].
pub fn test_keys() -> Vec<kiln_provenance::dsse::PublicKey> {
    let a = test_attester();
    vec![kiln_provenance::dsse::PublicKey { keyid: a.id.clone(), key: *a.key.verifying_key() }]
}

type OpenFuture<S> = Pin<Box<dyn Future<Output = Fixture<S>>>>;

/// The backend constructor the suite is instantiated with.
pub struct Opener<S>(Box<dyn Fn(Backoff) -> OpenFuture<S>>);

impl<S: Store + 'static> Opener<S> {
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(Backoff) -> Fut + 'static,
        Fut: Future<Output = Fixture<S>> + 'static,
    {
        Opener(Box::new(move |b| Box::pin(f(b))))
    }

    pub async fn open(&self, backoff: Backoff) -> Fixture<S> {
        (self.0)(backoff).await
    }
}

/// Retries become claimable at once.
pub const FAST: Backoff = Backoff { base_ms: 0, max_ms: 0 };
/// A lease that does not expire during a test.
pub const LONG_TTL: i64 = 60_000;
/// A lease a test lets expire.
pub const SHORT_TTL: i64 = 100;

/// Sleep past a lease of `ttl_ms` (database time advances with the wall clock).
pub async fn expire(ttl_ms: i64) {
    tokio::time::sleep(Duration::from_millis(ttl_ms as u64 + 60)).await;
}

pub fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

// ---------- building runs ----------

pub fn job(name: &str, needs: &[&str], retry: u32) -> Job {
    Job {
        name: name.into(),
        image: None,
        steps: vec![Step { name: None, run: format!("echo {name}"), ..Default::default() }],
        needs: needs.iter().map(|n| n.to_string()).collect(),
        cache: None,
        artifacts: Default::default(),
        env: Default::default(),
        timeout_secs: None,
        retry,
        runs_on: BTreeMap::from([("os".to_string(), "linux".to_string())]),
        ..Default::default()
    }
}

pub fn workflow(jobs: Vec<Job>) -> Workflow {
    Workflow {
        version: 1,
        concurrency: None,
        jobs,
        on: Default::default(),
        inputs: Default::default(),
        timeout_secs: None,
        priority: Default::default(),
    }
}

pub fn new_run(repo_id: &str, wf: Workflow) -> NewRun {
    NewRun {
        priority: "normal".into(),
        repo_id: repo_id.into(),
        commit_sha: "0123456789abcdef0123456789abcdef01234567".into(),
        git_ref: Some("refs/heads/main".into()),
        event: "manual".into(),
        trust: "trusted".into(),
        workflow_path: ".kiln/build.yaml".into(),
        workflow: wf,
        inputs: BTreeMap::new(),
        parent_run_id: None,
        idempotency: None,
        concurrency: None,
        image_digests: BTreeMap::new(),
        actor: None,
        report_context: None,
        pin_succeeded: false,
        rerun_jobs: Vec::new(),
        traceparent: None,
        commit_title: Some("Fix the build".into()),
        commit_author: Some("Ada Lovelace".into()),
        pull_request_title: None,
        rollback: None,
        audit: None,
    }
}

pub async fn repo<S: Store>(s: &S) -> RepoRecord {
    let name = format!("repo-{}", uuid::Uuid::new_v4().simple());
    s.create_repo(&name, "file:///tmp/nowhere", None).await.expect("create repo")
}

/// A repository and an accepted run of `wf`.
pub async fn start<S: Store>(s: &S, wf: Workflow) -> (RepoRecord, String) {
    let repo = repo(s).await;
    let acc = s.accept_run(new_run(&repo.id, wf)).await.expect("accept run");
    assert!(acc.created);
    (repo, acc.run_id)
}

pub async fn agent<S: Store>(s: &S, name: &str, max_jobs: u32) -> AgentRecord {
    s.register_agent(name, r#"{"os":"linux"}"#, max_jobs).await.expect("register agent")
}

/// A claim with a fresh claim request id.
pub fn claim_input(agent: &AgentRecord, job_id: &str, generation: i64, ttl_ms: i64) -> ClaimInput {
    ClaimInput {
        agent_id: agent.id.clone(),
        session_id: agent.session_id.clone(),
        claim_request_id: uuid::Uuid::new_v4().to_string(),
        job_id: job_id.into(),
        dispatch_generation: generation,
        lease_ttl_ms: ttl_ms,
        skip_locked: false,
        untrusted: Default::default(),
    }
}

/// Claim with an explicit generation; `None` when refused.
pub async fn try_claim<S: Store>(
    s: &S,
    agent: &AgentRecord,
    job_id: &str,
    generation: i64,
    ttl_ms: i64,
) -> Option<ClaimedAttempt> {
    s.claim(claim_input(agent, job_id, generation, ttl_ms)).await.expect("claim must not error")
}

/// Claim the job's current dispatch generation; it must succeed.
pub async fn claim<S: Store>(s: &S, agent: &AgentRecord, job_id: &str, ttl_ms: i64) -> ClaimedAttempt {
    let generation = s.get_job(job_id).await.expect("get job").dispatch_generation;
    try_claim(s, agent, job_id, generation, ttl_ms).await.unwrap_or_else(|| panic!("claim of job {job_id} refused"))
}

pub fn success() -> CompletionInput {
    CompletionInput {
        outcome: AttemptOutcome::Success,
        exit_code: Some(0),
        message: None,
        failure_class: None,
        outputs: Default::default(),
        steps: Default::default(),
        sandbox: None,
        quarantined: Vec::new(),
    }
}

pub fn failure(code: i32) -> CompletionInput {
    CompletionInput {
        outcome: AttemptOutcome::Failed,
        exit_code: Some(code),
        message: None,
        failure_class: None,
        outputs: Default::default(),
        steps: Default::default(),
        sandbox: None,
        quarantined: Vec::new(),
    }
}

pub fn infra_failure() -> CompletionInput {
    CompletionInput {
        outcome: AttemptOutcome::Failed,
        exit_code: None,
        message: Some("artifact upload failed".into()),
        failure_class: Some(kiln_core::failure::FailureClass::Infra),
        outputs: Default::default(),
        steps: Default::default(),
        sandbox: None,
        quarantined: Vec::new(),
    }
}

// ---------- reading state ----------

pub async fn view<S: Store>(s: &S, run_id: &str) -> RunView {
    s.get_run(run_id).await.expect("get run")
}

pub fn jv<'a>(v: &'a RunView, name: &str) -> &'a JobView {
    v.jobs.iter().find(|j| j.job.name == name).unwrap_or_else(|| panic!("no job {name}"))
}

pub async fn job_id<S: Store>(s: &S, run_id: &str, name: &str) -> String {
    jv(&view(s, run_id).await, name).job.id.clone()
}

pub async fn job_status<S: Store>(s: &S, job_id: &str) -> JobStatus {
    s.get_job(job_id).await.expect("get job").status
}

pub fn outcomes(j: &JobView) -> Vec<AttemptOutcome> {
    j.attempts.iter().map(|a| a.outcome).collect()
}

pub fn statuses(v: &RunView) -> Vec<(String, JobStatus)> {
    v.jobs.iter().map(|j| (j.job.name.clone(), j.job.status)).collect()
}

/// Unpublished, available outbox events of one job.
pub async fn pending_for<S: Store>(s: &S, job_id: &str) -> Vec<OutboxEvent> {
    s.pending_outbox(10_000).await.expect("pending outbox").into_iter().filter(|e| e.job_id == job_id).collect()
}

/// Everything observable about a run, to assert that a refused call changed nothing.
pub async fn snapshot<S: Store>(s: &S, run_id: &str) -> String {
    let v = view(s, run_id).await;
    let ids: Vec<&str> = v.jobs.iter().map(|j| j.job.id.as_str()).collect();
    let outbox: Vec<OutboxEvent> = s
        .pending_outbox(10_000)
        .await
        .expect("pending outbox")
        .into_iter()
        .filter(|e| ids.contains(&e.job_id.as_str()))
        .collect();
    format!("{v:#?}\n{outbox:#?}")
}

#[track_caller]
pub fn assert_stale<T: Debug>(r: Result<T>) {
    match r {
        Err(StoreError::StaleEpoch(_)) => {}
        other => panic!("expected StaleEpoch, got {other:?}"),
    }
}

#[track_caller]
pub fn assert_conflict<T: Debug>(r: Result<T>) {
    match r {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("expected Conflict, got {other:?}"),
    }
}

// ---------- logs ----------

pub fn chunk(job_id: &str, epoch: i64, stream: &str, seq: i64, offset: i64, data: &[u8]) -> NewLogChunk {
    use sha2::{Digest, Sha256};
    NewLogChunk {
        job_id: job_id.into(),
        epoch,
        stream: stream.into(),
        seq,
        offset,
        sha256: Some(hex::encode(Sha256::digest(data))),
        data: data.to_vec(),
        in_order: false,
    }
}

pub fn progress(p: Vec<(String, i64)>) -> BTreeMap<String, i64> {
    p.into_iter().collect()
}
