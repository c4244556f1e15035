//! Records as the store returns them. Rows are mapped inside this crate.

use kiln_core::{AttemptOutcome, JobStatus, RunStatus};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct RepoRecord {
    pub id: String,
    pub name: String,
    pub clone_url: String,
    pub webhook_secret: Option<String>,
    pub created_at: i64,
    /// Pools whose agents may receive the repository's secrets.
    pub secret_pools: Vec<String>,
    /// How the repository is connected to its forge (issue 14).
    pub forge: RepoForge,
    /// Its badge is served without a token (issue 42).
    pub public: bool,
    /// The team it belongs to (issue 44; `default` until moved).
    pub team: String,
    /// Its clone credential (`@clone-credential`), sealed as stored: read
    /// with the repository, as the server fetches from it for every run.
    pub clone_credential: Option<String>,
    /// Its team's cap on queued jobs (`max_queued`, issue 44), read with
    /// it: every run's admission checks it.
    pub team_max_queued: Option<u32>,
}

/// A repository's forge connection and trigger policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoForge {
    /// `github`, `gitlab` or `gitea`; None: not connected.
    pub forge: Option<String>,
    /// The forge's API base URL.
    pub forge_url: Option<String>,
    /// The repository on the forge (`owner/name`).
    pub forge_repo: Option<String>,
    /// The status API token, sealed.
    pub forge_token: Option<String>,
    pub default_branch: String,
    /// Branch patterns whose pushes are trusted besides the default branch and tags.
    pub protected_refs: Vec<String>,
    /// `write-access`, `same-repo` or `never`.
    pub pull_request_trust: String,
    /// Reconciliation by `git ls-remote` every this many ms; None: off.
    pub poll_interval_ms: Option<i64>,
}

impl Default for RepoForge {
    fn default() -> Self {
        RepoForge {
            forge: None,
            forge_url: None,
            forge_repo: None,
            forge_token: None,
            default_branch: "main".into(),
            protected_refs: Vec::new(),
            pull_request_trust: "write-access".into(),
            poll_interval_ms: None,
        }
    }
}

/// A frozen run to accept.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Its priority lane (issue 44): `urgent`, `normal` or `background`.
    pub priority: String,
    pub repo_id: String,
    pub commit_sha: String,
    pub git_ref: Option<String>,
    pub event: String,
    pub trust: String,
    pub workflow_path: String,
    pub workflow: kiln_workflow::Workflow,
    pub inputs: BTreeMap<String, String>,
    pub parent_run_id: Option<String>,
    pub idempotency: Option<Idempotency>,
    /// The run's concurrency group, rendered at acceptance.
    pub concurrency: Option<RunConcurrency>,
    /// Pinned image digest (`sha256:…`) per job name, resolved at planning
    /// (spec 000 §5): stored on the jobs in the acceptance transaction.
    pub image_digests: BTreeMap<String, String>,
    /// Who caused the run (a forge's pusher or author, or the token's actor).
    pub actor: Option<String>,
    /// Report the run's status to the forge under this context (issue 14).
    pub report_context: Option<String>,
    /// A retry of the failed jobs (spec 000 §9, retry from job; needs
    /// `parent_run_id`): the parent's successful prefix
    /// ([`kiln_core::retry::pinned_jobs`]) is pinned — `success` at once,
    /// bound to the same artifact generations — and the rest runs again.
    pub pin_succeeded: bool,
    /// A retry of these jobs (issue 42, `kiln retry RUN --job NAME`; needs
    /// `parent_run_id`): they and everything downstream of them run again,
    /// the rest of the parent's successes is pinned
    /// ([`kiln_core::retry::pinned_for_rerun`]). Empty: not such a retry.
    pub rerun_jobs: Vec<String>,
    /// The run's W3C trace context (issue 19), set by the server when it
    /// accepts the run; handed to each attempt through its claim.
    pub traceparent: Option<String>,
    /// The commit's title (first line of its message) and author name, read
    /// from git at acceptance: `commit.title` / `commit.author` (issue 41).
    pub commit_title: Option<String>,
    pub commit_author: Option<String>,
    /// A pull request run's title, from the forge's payload (issue 42).
    pub pull_request_title: Option<String>,
    /// A rollback (issue 46; needs `parent_run_id`, the run that made the
    /// deployment returned to): its deploy jobs run again with the
    /// parent's pinned bytes ([`kiln_core::retry::rollback_plan`]).
    pub rollback: Option<NewRollback>,
    /// An audit entry written in the acceptance's transaction when it
    /// creates the run (its `target` is replaced by the new run's id):
    /// one commit fewer per submission than an entry of its own.
    pub audit: Option<NewAudit>,
}

/// What a rollback run returns to, and who asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRollback {
    /// The deployment whose artifact generations are deployed again.
    pub deployment_id: String,
    pub environment: String,
    /// Recorded as an approval of the rollback run for the environment
    /// (the rollback is the approver's own decision); `None`: the run waits
    /// for approval as any other.
    pub approver: Option<String>,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConcurrency {
    pub group: String,
    pub cancel_in_progress: bool,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    /// Caller and repository the key is scoped to.
    pub scope: String,
    pub key: String,
    /// sha256 of the canonical request.
    pub request_digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub run_id: String,
    /// False when an idempotency record returned an existing run.
    pub created: bool,
}

/// A run as listed: everything but its frozen definition and inputs, which
/// a list never needs (a definition may be hundreds of KiB).
#[derive(Debug, Clone)]
pub struct RunSummaryRecord {
    pub id: String,
    pub repo_id: String,
    pub repo_name: String,
    pub status: RunStatus,
    pub commit_sha: String,
    pub git_ref: Option<String>,
    pub event: String,
    pub trust: String,
    pub workflow_path: String,
    pub workflow_hash: String,
    pub actor: Option<String>,
    pub parent_run_id: Option<String>,
    pub message: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// The run's number in its repository (`hello#123`), from 1, never reused.
    pub number: i64,
    /// The commit's title frozen at acceptance (absent for older runs).
    pub commit_title: Option<String>,
    /// A pull request run's title, from the forge's payload.
    pub pull_request_title: Option<String>,
    /// The team its repository belongs to (issue 44), as read now.
    pub team: String,
    /// Its priority lane: `urgent`, `normal` or `background` (issue 44).
    pub priority: String,
}

#[derive(Debug, Clone)]
pub struct RunRecord {
    pub id: String,
    pub repo_id: String,
    pub repo_name: String,
    pub status: RunStatus,
    pub commit_sha: String,
    pub git_ref: Option<String>,
    pub event: String,
    pub trust: String,
    pub workflow_path: String,
    pub workflow_hash: String,
    pub definition: kiln_workflow::Workflow,
    pub inputs: BTreeMap<String, String>,
    pub actor: Option<String>,
    pub parent_run_id: Option<String>,
    pub cancel_version: i64,
    pub message: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// The W3C traceparent made at acceptance (absent for older runs).
    pub traceparent: Option<String>,
    /// The commit's title and author name, frozen at acceptance (absent for
    /// older runs): `commit.title` and `commit.author` in expressions.
    pub commit_title: Option<String>,
    pub commit_author: Option<String>,
    /// Waiting for its run-level concurrency group (its `message` says
    /// which): no job of it becomes ready.
    pub held: bool,
    /// The run's number in its repository (`hello#123`), from 1, never reused.
    pub number: i64,
    /// A pull request run's title, from the forge's payload.
    pub pull_request_title: Option<String>,
    /// The team its repository belongs to (issue 44), as read now.
    pub team: String,
    /// Its priority lane: `urgent`, `normal` or `background` (issue 44).
    pub priority: String,
    /// A rollback run: the deployment it returns to (issue 46).
    pub rollback_of: Option<String>,
}

impl RunRecord {
    /// `commit.*` of the run's expressions (spec 000 §5: frozen data only).
    pub fn commit_context(&self) -> kiln_workflow::CommitContext {
        kiln_workflow::CommitContext {
            sha: self.commit_sha.clone(),
            title: self.commit_title.clone().unwrap_or_default(),
            author: self.commit_author.clone().unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct JobRecord {
    pub id: String,
    pub run_id: String,
    pub index: i64,
    pub name: String,
    pub status: JobStatus,
    pub needs: Vec<String>,
    pub class_key: String,
    pub dispatch_generation: i64,
    pub current_epoch: i64,
    pub next_attempt_at: Option<i64>,
    pub image_digest: Option<String>,
    /// The agent (by name) whose engine alone holds the job's built image:
    /// set when an image built without `--build-registry` is committed; the
    /// job's retries go only to that agent (issue 40, item 7).
    pub image_agent: Option<String>,
    pub message: Option<String>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// This job alone was asked to stop (fail-fast of a matrix sibling).
    pub cancel_requested: bool,
    /// The live attempt's cache report (JSON), if any.
    pub cache_result: Option<String>,
    /// Pending until its job-level concurrency group frees up (its
    /// `message` says which).
    pub group_waiting: bool,
}

#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub job_id: String,
    pub epoch: i64,
    pub agent_id: String,
    pub session_id: String,
    pub runner: String,
    pub lease_deadline: i64,
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// The steps' outcomes and durations its completion reported (JSON of
    /// the API's `StepResult` list), if any.
    pub steps: Option<String>,
    /// Why it did not succeed (none for a success or a running attempt).
    pub failure_class: Option<kiln_core::failure::FailureClass>,
    /// When its sandbox was confirmed gone (issue 40, item 5): by its
    /// completion, by its agent's report after it was fenced, by the
    /// agent's restart or removal. None while it runs, and for a fenced
    /// attempt nothing has confirmed yet.
    pub released_at: Option<i64>,
    /// How it was confirmed (the agent's evidence, or why the server
    /// counts it confirmed).
    pub release_evidence: Option<String>,
    /// What the agent's cleanup of the sandbox could not do.
    pub cleanup_error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct JobView {
    pub job: JobRecord,
    pub attempts: Vec<AttemptRecord>,
}

#[derive(Debug, Clone)]
pub struct RunView {
    pub run: RunRecord,
    pub jobs: Vec<JobView>,
}

/// Which runs `RunStore::find_runs` returns (every field optional but `limit`).
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub repo_id: Option<String>,
    pub status: Option<String>,
    /// A branch name: runs whose ref is `BRANCH` or `refs/heads/BRANCH`.
    pub branch: Option<String>,
    /// The trigger: `push`, `pull_request`, `manual`, `schedule`, ….
    pub event: Option<String>,
    /// Who caused the run, exactly as recorded.
    pub actor: Option<String>,
    /// Keyset pagination: only runs older than this run (by creation time,
    /// then id), so pages do not shift while new runs arrive.
    pub before: Option<String>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub max_jobs: u32,
    pub session_id: String,
    /// The pool of the join token it registered with.
    pub pool: String,
    pub created_at: i64,
    pub last_seen_at: i64,
    /// The Kiln version the agent said it runs, if it said.
    pub version: Option<String>,
    /// The agent said it drains: it claims nothing more.
    pub draining: bool,
    /// The executor it said it runs (`host` unless it said `container`).
    pub executor: kiln_core::claim::Executor,
}

#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub agent_id: String,
    pub session_id: String,
    pub claim_request_id: String,
    pub job_id: String,
    pub dispatch_generation: i64,
    pub lease_ttl_ms: i64,
    /// When another transaction holds the job's run (most often another
    /// replica claiming the same job), fail at once with
    /// [`StoreError::Busy`](crate::StoreError::Busy) instead of waiting for
    /// it: the caller may try another job and come back to this one.
    pub skip_locked: bool,
    /// Which agents take untrusted work (invariant 12; the server's
    /// `--untrusted-pools`).
    pub untrusted: kiln_core::claim::UntrustedPolicy,
}

/// What a claim transaction did.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per claim, moved once
pub enum ClaimOutcome {
    Claimed(ClaimedAttempt),
    /// Stale, duplicate, not yet due, labels or capacity: nothing changed.
    Declined,
    /// The agent may not run the job (invariant 12): what the job needs,
    /// and the rule the agent broke. Nothing changed.
    Misplaced(kiln_core::claim::JobPlacement, kiln_core::claim::PlacementRefusal),
    /// The job's team holds its `max_running` jobs (reservations count):
    /// the team, and how many it holds. Nothing changed.
    AtQuota(String, u32),
}

/// What `job` of `run` asks of its agent (invariant 12), with the
/// repository's secret pools: its run's trust, its `image:` or absolute
/// cache paths, whether it is handed secrets or an identity token, and the
/// agent that alone holds its built image.
pub fn job_placement(run: &RunRecord, job: &JobRecord, secret_pools: &[String]) -> kiln_core::claim::JobPlacement {
    let trusted = run.trust.parse::<kiln_core::Trust>().is_ok_and(kiln_core::Trust::may_read_secrets);
    let Some(def) = usize::try_from(job.index).ok().and_then(|i| run.definition.jobs.get(i)) else {
        return kiln_core::claim::JobPlacement::of(trusted, false, false, secret_pools);
    };
    let credentials = !def.secrets.is_empty() || def.id_token.is_some();
    // A cache path outside the workspace is a directory a container mounts
    // (issue 40, item 9); `/workspace/…` is the container's workspace.
    let absolute = def.cache.as_ref().is_some_and(|c| c.paths.iter().any(|p| p.starts_with('/')));
    kiln_core::claim::JobPlacement::of(trusted, def.image.is_some(), credentials, secret_pools)
        .with_absolute_cache(absolute)
        .pinned_to(job.image_agent.clone())
}

/// What a completion did, as [`AttemptStore::complete_held`](crate::AttemptStore::complete_held) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The job's status after it (`success`, `failed`, `ready` for a retry,
    /// `cancelled`).
    pub status: String,
    /// The team of the run's repository (issue 44: its slot is free now).
    pub team: String,
    /// How long the attempt held its slot, claim to end (ms), if this
    /// completion ended it.
    pub held_ms: Option<i64>,
}

/// A durable attempt ticket: everything needed to build the assignment.
#[derive(Debug, Clone)]
pub struct ClaimedAttempt {
    pub run: RunRecord,
    pub job: JobRecord,
    pub epoch: i64,
    pub lease_deadline: i64,
    /// How long the job was eligible (ready and due) before this claim
    /// took it, in milliseconds on the database clock; `None` when the
    /// attempt was claimed earlier (a claim request answered again).
    pub eligible_wait_ms: Option<i64>,
    /// This claim made a new start, to be charged to its team's virtual
    /// time ([`TeamStore::charge_teams`](crate::TeamStore::charge_teams));
    /// `false`: a claim request answered again.
    pub started: bool,
    /// The run's repository as the claim read it, with the run; `None`
    /// for a claim request answered again (read it then).
    pub repo: Option<RepoRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    pub cancel_requested: bool,
    pub lease_deadline: i64,
}

#[derive(Debug, Clone)]
pub struct CompletionInput {
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    /// What kind of failure the agent reports (`timeout`, `hang`, `infra`,
    /// …); none: `step_failed`. Recorded on the attempt, matched by the
    /// job's `retry: on`.
    pub failure_class: Option<kiln_core::failure::FailureClass>,
    /// The job's outputs (`$KILN_OUTPUT`), bound only if the completion
    /// succeeds the job (see `tx::outputs`).
    pub outputs: BTreeMap<String, String>,
    /// The steps' outcomes and durations (JSON), recorded on the attempt
    /// whatever the outcome, if the completion is the live epoch's.
    pub steps: Option<String>,
    /// How the agent knows the sandbox is gone, and what its cleanup could
    /// not do (issue 40, item 5); none from an older agent (the completion
    /// itself then confirms it).
    pub sandbox: Option<SandboxEnd>,
    /// Test ids whose failures the agent let through as quarantined (issue
    /// 43): a successful completion with these is checked against the bound
    /// reports and the repository's quarantine, and fails the job if they
    /// do not hold.
    pub quarantined: Vec<String>,
}

/// An agent's word that an attempt's sandbox is gone (issue 40, item 5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxEnd {
    /// How it knows: e.g. `every process of the job exited and was reaped`.
    pub evidence: String,
    /// What its cleanup could not do, if anything.
    pub cleanup_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub id: i64,
    pub job_id: String,
    pub dispatch_generation: i64,
    pub class_key: String,
    /// The team of the job's repository, its run's lane and when it became
    /// ready (database clock, ms): what fair share orders by (issue 44).
    pub team: String,
    pub lane: String,
    pub ready_at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct NewLogChunk {
    pub job_id: String,
    pub epoch: i64,
    pub stream: String,
    pub seq: i64,
    pub offset: i64,
    /// The sender's hex SHA-256 of `data`, if it sent one: the store
    /// digests the bytes itself (the chunk's identity) and refuses a chunk
    /// whose given digest differs.
    pub sha256: Option<String>,
    pub data: Vec<u8>,
    /// Commit only directly after the stream's bytes before this chunk
    /// (offset 0, or a committed chunk ending at `offset`); otherwise
    /// [`crate::StoreError::Busy`] and nothing is committed. Not part of
    /// the chunk's identity.
    pub in_order: bool,
}

#[derive(Debug, Clone)]
pub struct LogChunkRecord {
    pub id: i64,
    pub epoch: i64,
    pub stream: String,
    pub offset: i64,
    pub data: Vec<u8>,
    /// When the server committed the chunk (ms since the epoch; none for
    /// chunks committed before migration 0018).
    pub at_ms: Option<i64>,
}

/// One archived stretch of a job's log: chunks `first_id..=last_id` (event
/// ids) live in the object store as `segment_key` (their bytes, in id order)
/// and `index_key` (where each chunk is in the segment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogArchive {
    pub job_id: String,
    pub first_id: i64,
    pub last_id: i64,
    pub segment_key: String,
    pub index_key: String,
    pub chunks: i64,
    pub bytes: i64,
}

/// The dispatch class of a job: the canonical JSON of its `runs-on` labels.
pub fn class_key(runs_on: &BTreeMap<String, String>) -> String {
    serde_json::to_string(runs_on).expect("labels serialise")
}

/// A candidate artifact generation of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationRecord {
    pub id: String,
    pub run_id: String,
    pub job_id: String,
    pub epoch: i64,
    pub name: String,
    /// Where its bytes are read: its content object once they moved there
    /// (issue 45), else its session key.
    pub object_key: String,
    pub expected_size: i64,
    pub expected_sha256: String,
    pub part_size: i64,
    /// `uploading`, `sealed`, `failed`, `deleted` or `expired` (bound, bytes expired).
    pub state: String,
    pub created_at: i64,
    /// The S3 multipart upload holding the bytes ("" if none yet / local).
    pub upload_id: String,
    /// What the bytes are: `file` (one published file) or `archive` (a
    /// directory or glob packed by the agent as one tar+zstd archive).
    pub kind: String,
    /// The key its bytes were uploaded under (its own, unique; the same as
    /// `object_key` until they move to their content object).
    pub session_key: String,
}

impl GenerationRecord {
    /// Its bytes are the content object of their sha256 (shared with every
    /// generation of the same bytes; never deleted with this generation).
    pub fn content_addressed(&self) -> bool {
        self.object_key.starts_with(CONTENT_PREFIX)
    }
}

/// Where content objects live in the object store.
pub const CONTENT_PREFIX: &str = "cas/sha256/";

/// The object key of the bytes whose sha256 is `sha256` (lowercase hex).
pub fn content_key(sha256: &str) -> String {
    format!("{CONTENT_PREFIX}{sha256}")
}

/// The kinds of a generation's bytes ([`GenerationRecord::kind`]).
pub const GENERATION_KINDS: &[&str] = &["file", "archive"];

/// What [`ArtifactStore::open_generation`](crate::ArtifactStore::open_generation) opens.
#[derive(Debug, Clone, Copy)]
pub struct NewGeneration<'a> {
    pub name: &'a str,
    pub size: i64,
    /// "" when named at seal time.
    pub sha256: &'a str,
    pub part_size: i64,
    /// One of [`GENERATION_KINDS`].
    pub kind: &'a str,
}

/// A bound artifact as consumers and the API see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundArtifact {
    pub job_id: String,
    pub job_name: String,
    pub name: String,
    pub generation: GenerationRecord,
    /// When the bytes expire (ms; None: never), fixed by the completion
    /// transaction that bound them.
    pub expires_at: Option<i64>,
    /// When the collector expired them (the bytes are gone; the row stays).
    pub expired_at: Option<i64>,
}

/// A join token an agent registers with (beyond `DATA_DIR/agent.token`);
/// only the sha256 of its secret part is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenRecord {
    pub id: String,
    pub name: String,
    pub pool: String,
    pub token_hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A scoped API token (beyond `DATA_DIR/admin.token`); only the sha256 of
/// its secret part is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokenRecord {
    pub id: String,
    pub name: String,
    /// `admin`, `read` or `trigger`.
    pub scope: String,
    /// The one repository a `trigger` token may start runs of.
    pub repo_id: Option<String>,
    /// Whether runs it starts may be trusted.
    pub trusted: bool,
    pub token_hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

/// A web UI session (issue 39): the sha256 of the random id its cookie
/// holds, and the credential it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiSessionRecord {
    pub id_hash: String,
    /// `admin.token`, or the id of the API token it was made from.
    pub actor: String,
    /// The sha256 of that credential's secret when the session was made.
    pub token_hash: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// One audit log entry to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAudit {
    /// Who: `admin.token`, `token:ID`, `agent:ID`, `forge:REPO`, `server`.
    pub actor: String,
    /// What: `run.submit`, `run.cancel`, `run.retry`, `secret.read`, …
    pub action: String,
    /// On what: a run id, `REPO/SECRET`, a token id.
    pub target: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub id: i64,
    pub at: i64,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

/// A webhook delivery to persist before answering the forge.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub repo_id: String,
    pub forge: String,
    /// The forge's delivery id (redeliveries repeat it).
    pub delivery_key: String,
    pub event: String,
    /// sha256 of the verified body.
    pub payload_digest: String,
    /// The normalized event, JSON.
    pub trigger_event: String,
    /// Decided at acceptance from the payload and the repository's policy.
    pub trust: String,
    /// `pending` (to plan) or `ignored`.
    pub status: String,
    pub message: Option<String>,
}

#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    pub id: String,
    pub repo_id: String,
    pub forge: String,
    pub delivery_key: String,
    pub event: String,
    pub payload_digest: String,
    pub trigger_event: String,
    pub trust: String,
    /// `pending`, `planned`, `ignored` or `failed`.
    pub status: String,
    pub message: Option<String>,
    pub run_ids: Vec<String>,
    pub attempts: i64,
    pub created_at: i64,
    pub planned_at: Option<i64>,
}

/// The deliveries not yet planned (`ForgeStore::delivery_backlog`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryBacklog {
    pub pending: u64,
    /// Pending longer than the bound asked for.
    pub delayed: u64,
    /// The oldest pending delivery's age (0: none).
    pub oldest_ms: i64,
}

/// A commit status whose wanted state differs from the one sent.
#[derive(Debug, Clone)]
pub struct ReportTodo {
    pub id: String,
    pub repo_id: String,
    pub commit_sha: String,
    pub context: String,
    pub run_id: Option<String>,
    /// `pending`, `running`, `success`, `failure`, `cancelled` (or a fixed state).
    pub state: String,
    pub description: String,
    pub sent_state: Option<String>,
    pub attempts: i64,
    pub run_message: Option<String>,
    pub run_created_at: Option<i64>,
    pub run_finished_at: Option<i64>,
    /// The run's tests when it ended (issue 43), if it had reports.
    pub test_summary: Option<TestSummary>,
}

/// The answer to binding a cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheBinding {
    /// The key now names this upload (first writer).
    pub bound: bool,
    /// Another upload with other bytes already held the key.
    pub conflict: bool,
}

/// A cache lookup's hit: which namespace and key, and the sealed bytes.
#[derive(Debug, Clone)]
pub struct CacheHit {
    pub namespace: String,
    pub key: String,
    pub generation: GenerationRecord,
    /// How long the saving attempt's steps took, if it said.
    pub build_ms: Option<i64>,
}

/// What [`CacheStore::bind_cache`](crate::CacheStore::bind_cache) binds.
#[derive(Debug, Clone, Copy)]
pub struct NewCacheEntry<'a> {
    pub generation_id: &'a str,
    pub namespace: &'a str,
    pub key: &'a str,
    pub kind: &'a str,
    /// The key without the input fingerprints (dependency caches).
    pub prefix: Option<&'a str>,
    /// How long the saving attempt's steps took.
    pub build_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub repo_id: String,
    pub namespace: String,
    pub key: String,
    pub kind: String,
    pub generation_id: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub created_at: i64,
    pub last_used_at: i64,
    pub hits: i64,
    pub conflicts: i64,
    pub prefix: Option<String>,
    pub build_ms: Option<i64>,
}

/// One compatibility class of the eligible queue (`AgentStore::queue_classes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClass {
    /// The jobs' `runs-on` labels as their `class_key` (JSON, `{}` for none).
    pub class_key: String,
    /// Jobs of the class that are ready and due, not claimed.
    pub eligible: u64,
    /// How long the oldest of them has been eligible, in milliseconds.
    pub oldest_ms: i64,
}

/// A running attempt as `kiln top` shows it (`AgentStore::running_attempts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningAttempt {
    pub run_id: String,
    pub repo: String,
    /// The run's number in its repository (`repo#N`).
    pub run_number: i64,
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub agent_id: String,
    /// The agent's name as it claimed (`attempts.runner`).
    pub runner: String,
    pub started_at: i64,
    /// Database now − `started_at`.
    pub elapsed_ms: i64,
    /// The last line the agent wrote to the attempt's `system` log stream
    /// (its step headers, "checking out …", "uploading artifact …"), if
    /// that is still in the hot journal.
    pub last_system_line: Option<String>,
}

/// What `/metrics` reads from the store at each scrape (spec 000 §15),
/// each through an index and bounded (`AgentStore::operating_gauges`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatingGauges {
    /// Runs not yet finished, by status (`queued`, `running`,
    /// `cancelling`; each present, 0 when none).
    pub active_runs: std::collections::BTreeMap<String, u64>,
    /// The oldest eligible jobs' ages in milliseconds (ready, due, not
    /// claimed) per compatibility class (`class_key`): the oldest classes
    /// first, at most the limit asked for.
    pub oldest_eligible_ms: Vec<(String, i64)>,
    /// How long the oldest lease past its deadline has waited to be fenced
    /// (0 when none): the reconciler's lag.
    pub reconciler_lag_ms: i64,
    /// How long ago the longest-finished job whose log is still in the hot
    /// journal finished (0 when none).
    pub oldest_unarchived_log_ms: i64,
}

/// An outgoing notification of a repository's run ends (issue 42). Its
/// signing secret is a sealed secret row `@notify:ID`, never part of this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationRecord {
    pub id: String,
    pub repo_id: String,
    pub url: String,
    /// `failure`, `fixed`, `success`, `cancelled`, `always`.
    pub events: Vec<String>,
    /// `kiln` or `slack`.
    pub format: String,
    pub created_at: i64,
}

/// The name of a notification's sealed signing secret among its
/// repository's secrets (`@`: never listed, never given to a job).
pub fn notification_secret_name(notification_id: &str) -> String {
    format!("@notify:{notification_id}")
}

/// One (notification, run end): the outbox row and its delivery log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationDelivery {
    /// Stable per (notification, run end): the `X-Kiln-Delivery` header.
    pub id: String,
    pub notification_id: String,
    pub repo_id: String,
    pub run_id: String,
    pub run_number: i64,
    /// `failure`, `fixed`, `success` or `cancelled`.
    pub event: String,
    /// `pending`, `delivered` or `failed`.
    pub status: String,
    /// Sends tried (each claim is one).
    pub attempts: i64,
    pub last_status_code: Option<i64>,
    pub last_error: Option<String>,
    pub next_at: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
}

/// A due notification delivery with where it goes (`None`: the
/// notification was removed since the run ended).
#[derive(Debug, Clone)]
pub struct DueNotification {
    pub delivery: NotificationDelivery,
    pub target: Option<NotificationRecord>,
}

/// One report file an attempt's agent read (issue 43), staged under the
/// attempt's epoch until its completion binds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StagedReport {
    /// The file, relative to the workspace.
    pub path: String,
    /// `junit` or `tap`.
    pub format: String,
    pub truncated: bool,
    /// The parser's annotations (JSON list of `{kind, message}`).
    pub annotations: String,
    pub tests: Vec<StagedTest>,
}

/// One test of a staged report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StagedTest {
    pub test_id: String,
    pub suite: String,
    pub class: Option<String>,
    pub name: String,
    pub file: Option<String>,
    /// `passed`, `failed`, `error` or `skipped`.
    pub outcome: String,
    pub duration_ms: Option<i64>,
    pub message: Option<String>,
    pub excerpt: Option<String>,
    /// The runner's own retry records (JSON list), if any.
    pub retries: Option<String>,
}

/// What one attempt's bound reports add up to. `state`: `complete`,
/// `truncated` or `missing`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestAttemptRecord {
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub state: String,
    pub total: i64,
    pub passed: i64,
    pub failed: i64,
    pub errored: i64,
    pub skipped: i64,
    /// Failed or errored tests that were quarantined at the completion.
    pub quarantined: i64,
    pub created_at: i64,
}

/// A bound report file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestReportRecord {
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub path: String,
    pub format: String,
    pub truncated: bool,
    pub annotations: String,
    pub tests: i64,
}

/// One test's result in a bound report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestResultRecord {
    pub run_id: String,
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub test: StagedTest,
    pub created_at: i64,
}

/// A run's tests: each job's last bound attempt's results, and what was
/// decided when the run ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunTestsRecord {
    pub repo_id: String,
    /// Every bound attempt of the run's jobs, oldest first.
    pub attempts: Vec<TestAttemptRecord>,
    /// The report files of each job's last bound attempt.
    pub reports: Vec<TestReportRecord>,
    /// The tests of each job's last bound attempt, in report order.
    pub tests: Vec<TestResultRecord>,
    /// Tests flagged flaky when the run ended: (id, passes, failures).
    pub flaky: Vec<(String, i64, i64)>,
    /// The repository's quarantined tests now.
    pub quarantined: Vec<String>,
    /// Whether the run has ended (flakiness is decided then).
    pub decided: bool,
}

/// A run's tests summed up when it ended (`runs.test_summary`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TestSummary {
    pub total: i64,
    pub passed: i64,
    pub failed: i64,
    pub errored: i64,
    pub skipped: i64,
    pub flaky: i64,
    pub quarantined: i64,
}

/// One run of a test in a repository's history, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestHistoryRecord {
    pub run_id: String,
    pub run_number: i64,
    pub commit_sha: String,
    pub git_ref: Option<String>,
    pub job_name: String,
    pub epoch: i64,
    pub outcome: String,
    pub duration_ms: Option<i64>,
    pub message: Option<String>,
    pub created_at: i64,
    /// The test was flagged flaky when this run ended.
    pub flaky: bool,
}

/// A quarantined test (issue 43). Open until removed or expired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuarantineRecord {
    pub id: String,
    pub repo_id: String,
    pub test_id: String,
    pub owner: String,
    pub reason: String,
    pub link: Option<String>,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    /// When it stopped muting the test (removed, or its expiry noticed).
    pub ended_at: Option<i64>,
    /// Who removed it, or `expiry`.
    pub ended_by: Option<String>,
}

/// What a new quarantine asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewQuarantine {
    pub repo_id: String,
    pub test_id: String,
    pub owner: String,
    pub reason: String,
    pub link: Option<String>,
    pub created_by: String,
    pub expires_in_ms: i64,
    /// The cap: quarantined tests at most this percentage of the suite
    /// (the tests of the repository's latest run with reports; at least one
    /// test may always be quarantined).
    pub max_percent: f64,
}

/// A batch handed to a shard by `kiln tests next` (issue 43).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardBatch {
    /// `None`: nothing left to hand out.
    pub batch: Option<i64>,
    pub tests: Vec<String>,
    /// Batches not handed out yet.
    pub pending: i64,
    /// Batches leased to other live attempts (they may come back).
    pub leased: i64,
    pub total: i64,
}

/// A team (issue 44): its share of the slots and its quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamRecord {
    pub name: String,
    /// Its share relative to the other teams' (at least 1).
    pub weight: u32,
    /// Jobs it may hold at once, reservations included (`None`: no quota).
    pub max_running: Option<u32>,
    /// Queued jobs (ready or waiting on their needs) it may have before
    /// new API runs are refused and webhook runs wait (429).
    pub max_queued: Option<u32>,
    pub created_at: i64,
    /// Repositories in it.
    pub repos: i64,
    /// Its virtual time (kiln-core `fair`), moved by the starts the
    /// dispatchers charge ([`TeamStore::charge_teams`](crate::TeamStore::charge_teams)).
    pub pass: u64,
}

/// Starts one dispatcher made for a team since it last wrote them
/// (issue 44): the team's virtual time moves by `starts` strides from at
/// least one stride behind `clock` (the dispatcher's clock at the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamCharge {
    pub team: String,
    pub starts: u64,
    pub clock: u64,
}

/// Jobs of one team × lane × compatibility class, by status (issue 44):
/// what the dispatcher refreshes its quotas from and the queue view shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueGroup {
    pub team: String,
    pub lane: String,
    pub class_key: String,
    /// Ready: waiting for a slot.
    pub ready: i64,
    /// Waiting on their needs (or a concurrency group).
    pub pending: i64,
    /// Running, claimed-but-not-started included.
    pub running: i64,
    /// When its oldest ready job became ready (database clock, ms).
    pub oldest_ready_at: Option<i64>,
}

/// A change to a team: each `Some` replaces the value (`Some(None)`: no quota).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamUpdate {
    pub weight: Option<u32>,
    pub max_running: Option<Option<u32>>,
    pub max_queued: Option<Option<u32>>,
}

/// Signs provenance statements (issue 45): the server's attestation key,
/// out of every step's reach. The completion transaction builds each bound
/// artifact's statement from the facts it holds and asks this to sign it;
/// a statement that cannot be signed fails the transaction (no binding
/// without provenance).
pub trait Attester: Send + Sync {
    /// The DSSE envelope (JSON) of an in-toto statement's bytes, and the
    /// signing key's id.
    fn sign(&self, statement: &[u8]) -> std::result::Result<(String, String), String>;
    /// The builder id of agents of `pool`: `<public-url>/builders/<pool>`.
    fn builder_id(&self, pool: &str) -> String;
    /// Kiln's version, for `runDetails.builder.version`.
    fn version(&self) -> String;
    /// The public keys its statements verify with (every key still
    /// served): an environment's `--require-provenance` checks them.
    fn verifying_keys(&self) -> Vec<kiln_provenance::dsse::PublicKey>;
}

/// A bound artifact's provenance.
/// A job's signed Test Result statement (issue 45).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestAttestationRecord {
    pub job_id: String,
    pub epoch: i64,
    pub run_id: String,
    /// `PASSED`, `WARNED` or `FAILED`.
    pub result: String,
    pub keyid: String,
    /// The DSSE envelope, JSON.
    pub envelope: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenanceRecord {
    pub generation_id: String,
    pub run_id: String,
    pub job_id: String,
    pub epoch: i64,
    pub keyid: String,
    /// The DSSE envelope, JSON.
    pub envelope: String,
    pub created_at: i64,
}

/// A deployment environment (issue 46): the protection rules its deploy
/// jobs wait on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvironmentRecord {
    pub name: String,
    /// API token names that may approve (`admin`: DATA_DIR/admin.token);
    /// empty: any admin.
    pub approvers: Vec<String>,
    /// Distinct approvers a run needs (0 with no approvers: no approval;
    /// with approvers listed, at least 1).
    pub min_approvals: u32,
    /// Whoever started a run may not approve it.
    pub prevent_self_review: bool,
    /// Refs allowed to deploy (branch names or full refs with `*`/`**`);
    /// empty: any.
    pub refs: Vec<String>,
    /// How long an approved deploy job waits before it may start (ms).
    pub wait_ms: i64,
    /// How long an approval stands (ms; default 30 days).
    pub approval_ttl_ms: i64,
    /// How many of its newest deployments keep their artifact generations
    /// pinned against expiry (besides the current one; default 10).
    pub keep_deployments: u32,
    /// The provenance policy every artifact a deploy job restores must
    /// satisfy (`kiln_provenance::deploy::DeployPolicy`, canonical form);
    /// `None`: none.
    pub require_provenance: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl EnvironmentRecord {
    /// Approvals a run needs before its deploy jobs start.
    pub fn approvals_needed(&self) -> u32 {
        if self.approvers.is_empty() { self.min_approvals } else { self.min_approvals.max(1) }
    }
}

/// One approver's decision on a run's deployment to an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    pub run_id: String,
    pub environment: String,
    /// `admin.token` or `token:ID` (as a run's actor).
    pub actor: String,
    /// `approved` or `rejected`.
    pub decision: String,
    pub comment: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A job's promotion between two rings (issue 46): the row the gate
/// runner, `kiln promote` and `kiln pause` keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingGateRecord {
    /// The job that waits for it (the next ring, or a command gate's job).
    pub job_id: String,
    pub run_id: String,
    pub job_name: String,
    pub environment: String,
    pub from_ring: String,
    pub to_ring: String,
    /// `baking`, `measuring`, `paused`, `passed`, `promoted` or `failed`.
    pub state: String,
    pub message: String,
    /// The Prometheus gate (canonical JSON), if any.
    pub gate: Option<String>,
    /// When the ring before deployed (`None`: paused or promoted before).
    pub started_at: Option<i64>,
    pub bake_until: Option<i64>,
    /// The next measurement is due (`measuring`).
    pub next_at: Option<i64>,
    pub measured: i64,
    pub failures: i64,
    /// Who paused or promoted it.
    pub actor: Option<String>,
    /// After a failed gate: the rollback run's id, or why there was none.
    pub rollback: Option<String>,
    pub updated_at: i64,
}

/// One step of the gate runner, applied only if the row is still in
/// `from_state` with `from_measured` measurements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingGateStep {
    pub job_id: String,
    pub from_state: String,
    pub from_measured: i64,
    pub state: String,
    pub message: String,
    pub measured: i64,
    pub failures: i64,
    /// The next measurement is due this long after the one just due (on
    /// schedule however long the query took; now if that has passed).
    pub interval_ms: i64,
}

/// What `kiln promote` and `kiln pause` do to a run's next promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manual {
    Promote,
    Pause,
}

/// What one deploy job deployed (issue 46).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentRecord {
    pub id: String,
    pub environment: String,
    pub repo_id: String,
    pub repo_name: String,
    pub run_id: String,
    pub run_number: i64,
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub commit_sha: String,
    pub url: Option<String>,
    /// `success` or `failed`.
    pub status: String,
    /// The run's actor (`admin.token`, `token:ID`, a forge user).
    pub triggered_by: Option<String>,
    /// Names of the approvers whose approvals the run held.
    pub approvals: Vec<String>,
    pub artifacts: Vec<DeployedArtifact>,
    pub created_at: i64,
    /// A rollback's deployment: the deployment it returned to.
    pub rollback_of: Option<String>,
    /// The ring deployed (`rings:`), if any.
    pub ring: Option<String>,
}

/// An artifact generation a deploy job restored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeployedArtifact {
    pub name: String,
    pub from_job: String,
    pub run_id: String,
    pub generation: String,
    pub sha256: String,
}

/// Wakeups of a replica's dispatch sweep by jobs other replicas made ready
/// (PostgreSQL `LISTEN kiln_ready`; see `OutboxStore::ready_wakeups`):
/// `notify` fires, and [`Self::take`] says which jobs to read — those the
/// notifications named, or all ready jobs (a notification naming none, too
/// many, or a listener that reconnected and may have missed some).
#[derive(Debug, Default)]
pub struct ReadyWakeups {
    pub notify: tokio::sync::Notify,
    pending: std::sync::Mutex<ReadyPending>,
}

#[derive(Debug, Default)]
struct ReadyPending {
    all: bool,
    jobs: std::collections::BTreeSet<String>,
}

/// What a sweep woken by [`ReadyWakeups`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyWake {
    /// Every ready job.
    All,
    /// These jobs (the ready ones among them).
    Jobs(Vec<String>),
    /// Nothing pending (another sweep took it).
    Nothing,
}

impl ReadyWakeups {
    /// Note the jobs of one notification (`None`: read all) and wake.
    pub fn wake(&self, jobs: Option<Vec<String>>) {
        {
            let mut p = self.pending.lock().expect("ready wakeups");
            match jobs {
                Some(j) if !p.all => p.jobs.extend(j),
                Some(_) => {}
                None => {
                    p.all = true;
                    p.jobs.clear();
                }
            }
        }
        self.notify.notify_one();
    }

    /// What was noted since the last take, cleared.
    pub fn take(&self) -> ReadyWake {
        let mut p = self.pending.lock().expect("ready wakeups");
        let p = std::mem::take(&mut *p);
        if p.all {
            ReadyWake::All
        } else if p.jobs.is_empty() {
            ReadyWake::Nothing
        } else {
            ReadyWake::Jobs(p.jobs.into_iter().collect())
        }
    }
}
