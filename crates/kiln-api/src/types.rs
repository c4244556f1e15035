//! JSON bodies of the public and agent APIs.

use crate::status::{AttemptOutcome, GenerationState, JobStatus, RunStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default workflow path inside a repository.
pub const DEFAULT_WORKFLOW_PATH: &str = ".kiln/pipeline.yaml";

/// `{"error": {"code": "...", "message": "..."}}`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

// ---------- public API ----------

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateRepo {
    pub name: String,
    pub clone_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
    /// Agent pools that may receive the repository's secrets (default: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_pools: Option<Vec<String>>,
    /// The team it belongs to (issue 44; default: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The forge connection and trigger policy (all optional).
    #[serde(default, flatten)]
    pub forge: ForgeSettings,
}

/// How a repository is connected to its forge. In an update, an absent
/// field keeps its value; an empty string clears an optional one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForgeSettings {
    /// `github`, `gitlab` or `gitea` (Forgejo: `gitea`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<String>,
    /// The forge's API base URL (GitHub Enterprise: `https://HOST/api/v3`;
    /// GitLab and Gitea: the instance URL). Default: github.com's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge_url: Option<String>,
    /// The repository on the forge: `owner/name` (GitLab: the project path or id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge_repo: Option<String>,
    /// Token for the forge's commit status API; never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_branch: Option<String>,
    /// Branch patterns whose pushes are trusted besides the default branch and tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_refs: Option<Vec<String>>,
    /// `write-access` (default), `same-repo` or `never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request_trust: Option<String>,
    /// Poll the remote's heads every this many seconds (0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_secs: Option<u64>,
    /// A token (password) for cloning an `http(s)` URL; stored sealed, never
    /// returned, given to git only through its environment. Sent with the
    /// URL's username, else `x-access-token`. In an update, empty removes it.
    /// (A credential written into the clone URL is taken out of it and
    /// stored the same way.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_token: Option<String>,
}

/// `PATCH /v1/repos/{repo}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateRepo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_url: Option<String>,
    /// A new webhook secret (empty: remove it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_pools: Option<Vec<String>>,
    /// Serve the badge (`GET /v1/repos/{repo}/badge.svg`) without a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    /// Move it to this team (issue 44).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, flatten)]
    pub forge: ForgeSettings,
}

/// What to paste into the forge's webhook settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HookInfo {
    pub repo: String,
    pub forge: String,
    /// The payload URL.
    pub url: String,
    pub content_type: String,
    /// Events to send.
    pub events: Vec<String>,
    /// Whether a webhook secret is set (deliveries are refused without one).
    pub secret_configured: bool,
    /// Whether commit statuses can be reported (forge repository and token set).
    pub statuses_configured: bool,
}

/// The answer to a webhook delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookAck {
    /// Kiln's id of the delivery.
    pub delivery: String,
    /// The forge's delivery id.
    pub forge_delivery: String,
    /// `pending` (accepted, planning), `planned`, `ignored` or `failed`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Runs created by the delivery (once planned).
    #[serde(default)]
    pub runs: Vec<String>,
    /// Whether this answer repeats the first one for a redelivery.
    #[serde(default)]
    pub duplicate: bool,
}

/// A delivery as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    pub id: String,
    pub forge: String,
    pub forge_delivery: String,
    pub event: String,
    pub trust: String,
    pub status: String,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub runs: Vec<String>,
    pub created_at_ms: i64,
    #[serde(default)]
    pub planned_at_ms: Option<i64>,
    /// Planning attempts so far.
    #[serde(default)]
    pub attempts: i64,
    /// Pending longer than the server's `--delivery-alert-after`: planning
    /// keeps meeting trouble (`message` says which) and keeps retrying.
    #[serde(default)]
    pub delayed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Repo {
    pub id: String,
    pub name: String,
    pub clone_url: String,
    pub created_at_ms: i64,
    /// Agent pools that may receive the repository's secrets.
    #[serde(default)]
    pub secret_pools: Vec<String>,
    /// The forge connection (its token is never shown).
    #[serde(default)]
    pub forge: Option<String>,
    #[serde(default)]
    pub forge_url: Option<String>,
    #[serde(default)]
    pub forge_repo: Option<String>,
    #[serde(default)]
    pub default_branch: Option<String>,
    #[serde(default)]
    pub protected_refs: Vec<String>,
    #[serde(default)]
    pub pull_request_trust: Option<String>,
    #[serde(default)]
    pub poll_interval_secs: Option<u64>,
    #[serde(default)]
    pub webhook_secret_set: bool,
    #[serde(default)]
    pub forge_token_set: bool,
    /// Whether a clone credential is stored (never shown).
    #[serde(default)]
    pub clone_token_set: bool,
    /// Its badge is served without a token (`kiln repo set --public`).
    #[serde(default)]
    pub public: bool,
    /// The team it belongs to (issue 44): whose share its jobs run in.
    #[serde(default)]
    pub team: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitRun {
    /// A full commit SHA or a ref (branch, tag, `HEAD`); resolved to a SHA once, at acceptance.
    pub commit_sha: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_path: Option<String>,
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// `manual` (default), `push`, `pull_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The run's priority lane, `urgent`, `normal` or `background`, over
    /// what its workflow and trigger say (issue 44; admin tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

/// `GET /v1/repos/{repo}/workflow-inputs?ref=…&workflow=…`: what a run of
/// that workflow at that commit may be given (the UI's run form is made
/// from it). Nothing is stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowInputs {
    pub workflow_path: String,
    /// The commit the ref resolved to.
    pub commit_sha: String,
    /// Whether the workflow may be started by hand (its `on:` allows `manual`).
    pub manual: bool,
    /// False when the workflow declares no `inputs:` (any string inputs are accepted).
    pub declared: bool,
    /// By name.
    pub inputs: Vec<InputInfo>,
}

/// `GET /v1/repos/{repo}/workflows?ref=…`: the workflow files at a commit
/// (`.kiln/*.yaml`, `.kiln/*.yml`) and which of them a run started without
/// a workflow path starts (issue 41, item 6). Nothing is stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowList {
    /// The commit the ref resolved to.
    pub commit_sha: String,
    /// By path.
    pub workflows: Vec<WorkflowFile>,
    /// What `kiln run` without `--workflow` starts, in order: `.kiln/pipeline.yaml` when it
    /// exists, else the only workflow, else every workflow whose `on:` declares `manual`.
    /// Empty: the caller must pick one (`workflow_path`).
    pub selected: Vec<String>,
}

/// One workflow file at a commit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowFile {
    pub path: String,
    /// Whether a run may be started by hand (`on:` absent, or declaring `manual`).
    pub manual: bool,
    /// The events its `on:` declares (`push`, `pull_request`, `schedule`, `manual`); empty when
    /// it has no `on:` (started by hand only).
    pub triggers: Vec<String>,
    /// Why it is not a valid workflow (first lines of the diagnostics), if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One declared input.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InputInfo {
    pub name: String,
    /// `string`, `boolean`, `number` or `choice`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default)]
    pub required: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// `POST /v1/workflow-runs/{run}/retry` (the body is optional; `?failed=true` works too).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryRun {
    /// Retry from the failed jobs (spec 000 §9): the parent's successful
    /// jobs are pinned (`success`, same bound artifacts, not run again); its
    /// failed, cancelled and skipped jobs and their descendants run again.
    /// Refused (409) while the parent runs, or when none of its jobs failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitRunResponse {
    pub run_id: String,
    /// What the run was accepted despite (issue 41, item 3): e.g. a job
    /// whose `runs-on` labels no registered agent has (it waits until one
    /// registers). Empty when there is nothing to say; absent from older
    /// servers.
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// A full page was returned: pass this as `before` for the next
    /// (older) page. Absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunSummary {
    pub id: String,
    /// The shortest prefix of `id` (8 characters or more) that no other run
    /// shares when listed: accepted wherever a run id is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_id: Option<String>,
    pub repo: String,
    /// The run's number in its repository (issue 42): 1, 2, 3… in the order
    /// runs were accepted, never reused; `REPO#NUMBER` (`hello#123`) names
    /// the run wherever a run id is accepted. 0 from servers before it.
    #[serde(default)]
    pub number: i64,
    /// The workflow's name: its file name without `.yml`/`.yaml` (`ci` for
    /// `.kiln/workflows/ci.yml`).
    #[serde(default)]
    pub workflow: String,
    /// The commit's title (first line of its message), frozen at acceptance
    /// (absent for runs accepted before issue 41).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_title: Option<String>,
    /// A pull request run's number and title (`event` `pull_request`; the
    /// number is the one in `ref`, `refs/pull/N/head`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<PullRequestRef>,
    /// The file the workflow was read from (`.kiln/workflows/ci.yml`).
    #[serde(default)]
    pub workflow_path: String,
    pub status: RunStatus,
    pub commit_sha: String,
    pub event: String,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    pub trust: String,
    /// Who caused the run, by name: the forge's pusher or pull request
    /// author, `schedule`, the API token's name, or `admin` (the bootstrap
    /// `admin.token`).
    #[serde(default)]
    pub actor: Option<String>,
    pub created_at_ms: i64,
    #[serde(default)]
    pub finished_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Run {
    pub id: String,
    pub repo: String,
    /// The run's number in its repository (issue 42): 1, 2, 3… in the order
    /// runs were accepted, never reused; `REPO#NUMBER` (`hello#123`) names
    /// the run wherever a run id is accepted. 0 from servers before it.
    #[serde(default)]
    pub number: i64,
    /// The workflow's name: its file name without `.yml`/`.yaml` (`ci` for
    /// `.kiln/workflows/ci.yml`).
    #[serde(default)]
    pub workflow: String,
    /// The commit's title (first line of its message), frozen at acceptance
    /// (absent for runs accepted before issue 41).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_title: Option<String>,
    /// A pull request run's number and title (`event` `pull_request`; the
    /// number is the one in `ref`, `refs/pull/N/head`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<PullRequestRef>,
    pub status: RunStatus,
    pub commit_sha: String,
    pub event: String,
    /// The ref the submitter named, if any: descriptive only, never reread.
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    pub trust: String,
    /// Who caused the run, by name: the forge's pusher or pull request
    /// author, `schedule`, the API token's name, or `admin` (the bootstrap
    /// `admin.token`).
    #[serde(default)]
    pub actor: Option<String>,
    pub workflow_path: String,
    pub workflow_hash: String,
    pub inputs: BTreeMap<String, String>,
    pub parent_run_id: Option<String>,
    pub cancel_version: i64,
    pub created_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    /// The commit on the forge's web UI, when the repository is connected to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_url: Option<String>,
    /// The commit's message and author, read from the server's mirror of
    /// the repository (absent when the mirror does not have it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<CommitInfo>,
    /// The run's trace id (32 hex digits, issue 19): in the server's and
    /// agents' JSON log lines and exported spans for the run (the submitter's
    /// when it sent a `traceparent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Its priority lane (issue 44): `urgent`, `normal` or `background`.
    #[serde(default = "normal_lane")]
    pub priority: String,
    /// The team its repository belongs to (issue 44).
    #[serde(default)]
    pub team: String,
    pub jobs: Vec<Job>,
}

fn normal_lane() -> String {
    "normal".into()
}

// ---------- teams, lanes and the queue (issue 44) ----------

/// A team: the unit slots are shared between (by weight), with its quotas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Team {
    pub name: String,
    /// Its share relative to the other teams' (1–1000).
    pub weight: u32,
    /// Jobs it may hold at once, claimed-but-not-started ones included (none: no quota).
    pub max_running: Option<u32>,
    /// Queued jobs (ready or waiting on their needs) past which its new API runs are refused
    /// (429) and its webhook and schedule runs wait (none: no cap).
    pub max_queued: Option<u32>,
    /// Repositories in it.
    pub repos: i64,
    pub created_at_ms: i64,
}

/// `POST /v1/teams`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateTeam {
    pub name: String,
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u32>,
}

/// `PATCH /v1/teams/{team}`: what is absent is kept; `null` removes a quota.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpdateTeam {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>))]
    pub max_running: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>))]
    pub max_queued: Option<Option<u32>>,
}

/// A field that is present (`null` included) is `Some`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `GET /v1/teams`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TeamList {
    pub teams: Vec<Team>,
}

/// `POST /v1/workflow-runs/{run}/priority`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetPriority {
    /// `urgent`, `normal` or `background`.
    pub priority: String,
}

/// `GET /v1/queue`: the work waiting and running, per team × lane × class,
/// and each team's share (issue 44).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueView {
    /// Job slots of the connected agents.
    pub slots: u32,
    /// How long a ready job waits before it moves up a lane.
    pub aging_step_secs: u64,
    /// By name; teams with no live job are listed too.
    pub teams: Vec<TeamQueue>,
}

/// One team in [`QueueView`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TeamQueue {
    pub team: String,
    pub weight: u32,
    pub max_running: Option<u32>,
    pub max_queued: Option<u32>,
    /// Ready jobs (waiting for a slot).
    pub ready: i64,
    /// Jobs waiting on their needs or a concurrency group.
    pub pending: i64,
    /// Running jobs, claimed-but-not-started ones included.
    pub running: i64,
    /// The slots its weight entitles it to now: the connected slots shared by weight among
    /// the teams with work (ready or running), at most what it has work for.
    pub entitled_slots: f64,
    /// The slots it holds now (= `running`).
    pub received_slots: f64,
    /// Per lane and compatibility class, urgent first.
    pub lanes: Vec<LaneQueue>,
}

/// One lane × class of a team in [`QueueView`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LaneQueue {
    /// `urgent`, `normal` or `background`.
    pub priority: String,
    /// The `runs-on` labels the jobs need.
    pub labels: BTreeMap<String, String>,
    pub ready: i64,
    pub pending: i64,
    pub running: i64,
    /// How long its oldest ready job has waited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_ready_secs: Option<f64>,
}

/// The pull request a run was started for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullRequestRef {
    pub number: u64,
    #[serde(default)]
    pub title: String,
}

/// What the repository says about a run's commit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommitInfo {
    /// The full message (subject, blank line, body).
    pub message: String,
    pub author_name: String,
    #[serde(default)]
    pub author_email: String,
    /// Author date, milliseconds since the epoch.
    #[serde(default)]
    pub authored_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    pub id: String,
    pub name: String,
    pub index: i64,
    pub status: JobStatus,
    pub current_epoch: i64,
    pub image_digest: Option<String>,
    pub needs: Vec<String>,
    pub attempts: Vec<Attempt>,
    pub artifacts: Vec<Artifact>,
    pub cache: Option<CacheInfo>,
    #[serde(default)]
    pub message: Option<String>,
    /// Why the job has not started, while it is `pending` or `ready`
    /// (issue 41, item 3): `waiting: no connected agent has labels …`,
    /// `waiting for needs: build (running)`, `waiting for concurrency group
    /// …`, `waiting: every agent that can run it is busy (…)`, placement
    /// (`waiting for an agent that takes untrusted work …`). Decided when
    /// read, against the agents connected now; absent when nothing holds it
    /// (an agent is about to claim it) and once it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    /// The outputs the job bound (`outputs:` written to `$KILN_OUTPUT`),
    /// set once its successful attempt completed; never a fenced attempt's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
    /// The deployment environment the job deploys to (`environment:`, issue 46).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub epoch: i64,
    pub runner: String,
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    /// Each step's outcome and duration, once the attempt completed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepResult>,
    /// Why it did not succeed: `step_failed`, `timeout`, `hang`,
    /// `agent_lost`, `infra` or `cancelled` (absent while it runs and on success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    /// When its sandbox was confirmed gone (issue 40, item 5): by its
    /// completion, or after it was fenced by its agent's report, the
    /// agent's restart or its removal. Absent while it runs and while a
    /// fenced attempt is unconfirmed (a cancelling run waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at_ms: Option<i64>,
    /// How it was confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// What the agent's cleanup of the sandbox could not do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Artifact {
    pub name: String,
    /// Size and sha256 of the stored object (for an archive: of the archive).
    pub size: i64,
    pub sha256: String,
    pub epoch: i64,
    /// `file` or `archive` (a directory or glob, restored by unpacking).
    #[serde(default = "artifact_file")]
    pub kind: String,
    /// When the bytes expire (ms since the epoch; absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// The collector deleted the bytes: a download answers 410 `expired`.
    #[serde(default)]
    pub expired: bool,
}

/// `GET /v1/workflow-runs/{run}/artifacts` (issue 42): every artifact the
/// run's jobs bound, in job order.
#[derive(Default, Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunArtifacts {
    pub run_id: String,
    pub artifacts: Vec<RunArtifact>,
}

/// One artifact of a run: its job, and the artifact as the run's
/// `jobs[].artifacts[]` give it (`name`, `size`, `sha256`, `epoch`, `kind`,
/// `expires_at`, `expired`). Download it with `GET
/// /v1/workflow-runs/{run}/artifacts/{job_id}/{name}` (`?format=tar.gz|zip`
/// for a directory or glob as a normal archive).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunArtifact {
    pub job: String,
    pub job_id: String,
    #[serde(flatten)]
    pub artifact: Artifact,
}

#[derive(Default, Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheInfo {
    pub key: String,
    /// `hit`, `partial` (a hit of an entry that left things out when it
    /// was saved: sockets, fifos, devices, names that are not UTF-8; see
    /// `left_out`), `prefix` (restore-prefix: an entry saved for other
    /// inputs was restored; the exact key is saved after success), `miss`,
    /// `partial-refused` (an archive was refused and cleaned up: the job ran
    /// cold) or `error`.
    pub result: String,
    /// What the entry restored (or this attempt's save) left out, e.g.
    /// `3 entries (2 sockets, 1 fifo); first: venv/run/a.sock`; absent:
    /// nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_out: Option<String>,
    /// Where the hit came from (`protected`, `untrusted/…`), or the namespace saved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Bytes restored (a hit) or saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Seconds spent restoring (and saving).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// `saved`, `exists`, `conflict` or why nothing was saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How long the job's steps took with this cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_seconds: Option<f64>,
    /// A hit's estimate (set by the server): the saving attempt's steps'
    /// time minus this attempt's steps and restore, at least 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_saved: Option<f64>,
}

/// The job's cache as handed to the attempt: what to key and archive, and
/// the namespaces this run may write and read (from its trust).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheSpec {
    pub kind: String,
    pub version: String,
    #[serde(default)]
    pub inputs: Vec<String>,
    pub paths: Vec<String>,
    /// On an exact miss, restore the newest entry with the same key but
    /// other inputs (dependency caches).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restore_prefix: bool,
    /// `protected` for trusted runs; `untrusted/<ref or run>` otherwise.
    pub write_namespace: String,
    /// In the order to look them up.
    pub read_namespaces: Vec<String>,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/lookup`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheLookup {
    /// (namespace, key) in the order to try.
    pub candidates: Vec<CacheCandidate>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheCandidate {
    pub namespace: String,
    pub key: String,
    /// With `restore-prefix`: the key without the input fingerprints, tried
    /// (in every candidate's namespace, in order) when no exact key is found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheLookupResult {
    #[serde(default)]
    pub hit: Option<CacheHitInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheHitInfo {
    pub namespace: String,
    pub key: String,
    pub download: ArtifactDownload,
    /// Found by prefix: the entry was saved for other inputs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_prefix: bool,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/cache/save`: bind a sealed upload
/// (artifact name `@cache`) to the key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheSave {
    pub generation_id: String,
    pub namespace: String,
    pub key: String,
    /// The key without the input fingerprints (for `restore-prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// How long the steps took (the cold build), for the time-saved estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheSaved {
    /// The key names this upload now.
    pub bound: bool,
    /// The key already named other bytes (a second writer); nothing changed.
    pub conflict: bool,
}

// ---------- log events (SSE) ----------

/// Payload of an SSE `chunk` event ([`crate::logs::event::CHUNK`]). `data` is base64 of the raw bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogEvent {
    pub epoch: i64,
    pub stream: String,
    pub offset: i64,
    pub data: String,
    /// When the server committed these bytes (ms since the epoch); agents
    /// ship output every 100 ms or 64 KiB, so it is within about that of
    /// when it was written. Absent from older servers and older chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
}

/// Payload of an SSE `sealed` event: attempt `epoch` ended through its agent
/// (`outcome`), and its log is complete: `committed` gives each stream's
/// final length in bytes. Distinct from a dropped connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogSealed {
    pub epoch: i64,
    pub outcome: AttemptOutcome,
    #[serde(default)]
    pub committed: BTreeMap<String, i64>,
}

/// Payload of an SSE `gap` event: the agent of attempt `epoch` was lost;
/// output it had not delivered past `committed` is missing, and this
/// attempt's log has no clean end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogGap {
    pub epoch: i64,
    pub reason: String,
    #[serde(default)]
    pub committed: BTreeMap<String, i64>,
}

/// Payload of an SSE `end` event: the job reached a terminal status and every
/// committed chunk has been sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogEnd {
    pub status: JobStatus,
}

// ---------- agent API ----------

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegisterAgent {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub max_jobs: u32,
    /// The Kiln version the agent runs (shown in `GET /v1/agents`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The executor it runs jobs with: `host` or `container` (placement,
    /// invariant 12: only a container executor takes a job with `image:`
    /// or, by default, untrusted work). Absent: `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// The agent process has just started and, before registering, killed
    /// every step process and removed every sandbox its previous process
    /// left in its work directory: the server counts the fenced attempts of
    /// earlier agents of the same name and pool as confirmed gone (issue
    /// 40, item 5). False when it registers again while it runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_start: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentRegistration {
    pub agent_id: String,
    /// A fresh session per agent process start; attempts record it as `runner`.
    pub session_id: String,
    pub lease_ttl_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// The credential of this session: claims and the session stream send
    /// it instead of the join token.
    #[serde(default)]
    pub credential: String,
    /// The pool of the join token the agent registered with.
    #[serde(default)]
    pub pool: String,
    /// Whether the server hands this agent untrusted work (fork pull
    /// requests, untrusted trigger-token runs): its pool is one of the
    /// server's `--untrusted-pools` and it runs a container executor (or
    /// the server allows host executors, unsafe). Absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takes_untrusted: Option<bool>,
    /// Which agents take untrusted work, e.g. `pools: forks, container executor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted_agents: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimRequest {
    pub session_id: String,
    /// Unique per claim call; retrying with the same id after a lost response
    /// returns the attempt that call created (spec 000 §7).
    pub claim_request_id: String,
    /// How long the server may hold the request open waiting for work.
    pub wait_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimResponse {
    pub assignment: Option<Assignment>,
}

/// Everything an agent needs to run one attempt. Immutable for the attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Assignment {
    pub run_id: String,
    pub job_id: String,
    pub job_name: String,
    pub epoch: i64,
    pub repo: String,
    pub clone_url: String,
    /// The clone URL's credential, for the agent's git only (never a step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_credential: Option<crate::giturl::CloneCredential>,
    pub commit_sha: String,
    pub steps: Vec<StepSpec>,
    pub env: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    /// Seconds without output after which the log gets a hang warning, and
    /// after which the job is killed (class `hang`). Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_after_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_kill_after_secs: Option<u64>,
    /// `image.ref` as written in the workflow.
    #[serde(default)]
    pub image: Option<String>,
    /// The pinned digest (`sha256:…`): of `image`'s manifest, resolved at
    /// acceptance; or of the image a previous attempt built from `image_build`.
    #[serde(default)]
    pub image_digest: Option<String>,
    /// Why the job's `image` cannot be used (an image read from
    /// `needs.<job>.outputs.*` that does not name a digest): the agent fails
    /// the attempt with this message instead of running anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_error: Option<String>,
    /// `image.dockerfile` (+ `context`): built on the agent before any step.
    #[serde(default)]
    pub image_build: Option<ImageBuild>,
    /// Where a built image goes (the server's `--build-registry`, e.g.
    /// `registry.example.com/kiln-builds`): the agent pushes it to
    /// `REGISTRY/JOB_ID` and commits the manifest digest, so a retry on any
    /// agent pulls the same bytes (issue 40, item 7). Absent: the image
    /// stays in the building agent's engine and `image_digest` is its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_registry: Option<String>,
    /// The job's size class (`runs-on: {size: …}`), for sandbox limits.
    #[serde(default)]
    pub size: Option<String>,
    #[serde(default)]
    pub publish: Vec<PublishSpec>,
    #[serde(default)]
    pub restore: Vec<RestoreSpec>,
    pub lease_ttl_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Secrets the job asked for (`secrets:`), set as environment variables;
    /// the agent masks their values (and base64 forms) in the job's output.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// The credential of this attempt alone: every call on it (heartbeat,
    /// logs, uploads, seal, restore, completion) sends it as the bearer.
    #[serde(default)]
    pub attempt_token: String,
    /// The job's build cache, if it declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// Service containers to start (healthy) before the first step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSpec>,
    /// The job's declared `outputs`: the names read from `$KILN_OUTPUT`
    /// after the steps and sent with the completion.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// The job's `reports:`: read after the steps and staged with
    /// `POST /v1/jobs/{job}/attempts/{epoch}/reports` (issue 43).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reports: Option<ReportsSpec>,
    /// The repository's quarantined test ids at the claim: written to the
    /// file `$KILN_QUARANTINE` names, and a step whose only failures are
    /// these (with a complete report) does not fail the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<String>,
    /// The shard capability of this attempt (issue 43): its steps get it as
    /// `$KILN_SHARD_TOKEN` for `kiln tests next`; it allows nothing else.
    /// Empty unless the job declares `reports:`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shard_token: String,
    /// The W3C trace context of the claim (issue 19): the agent's spans and
    /// log lines for the attempt join the run's trace, and its calls on the
    /// attempt send it back as the `traceparent` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The job's `checkout:` (issue 47). Absent: a fresh full checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout: Option<CheckoutSpec>,
    /// Whether the run is trusted: a workspace the agent keeps for the
    /// next job is only ever handed to a job of the same trust (absent,
    /// from an older server: untrusted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trusted: bool,
}

/// How the agent checks out a job's workspace (`checkout:`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckoutSpec {
    /// Bring a workspace this agent kept from an earlier job of the same
    /// repository to the commit, cleaned, instead of checking out afresh.
    /// Only ever set for a trusted run's job (the server decides).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse: bool,
    /// Generations of history the job's `git log` sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// `blob:none`: the agent's mirror holds commits and trees; only the
    /// blobs of the checked-out paths are fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Cone-mode directories: only these (and top-level files) are checked out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sparse: Vec<String>,
}

/// One service of a job (`services:`), its image pinned at acceptance.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceSpec {
    /// The name the job reaches it by (a DNS label).
    pub name: String,
    /// The image reference as written.
    pub image: String,
    /// The manifest digest pinned at acceptance.
    #[serde(default)]
    pub digest: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub command: Vec<String>,
    /// `sh -c` command run inside the service until it exits 0.
    #[serde(default)]
    pub health_cmd: Option<String>,
    #[serde(default)]
    pub health_interval_ms: u64,
    #[serde(default)]
    pub health_retries: u32,
}

/// `PUT /v1/repos/{repo}/secrets/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PutSecret {
    pub value: String,
}

/// `POST /v1/repos/{repo}/notifications`: POST a signed JSON body to `url`
/// when a run of the repository ends with one of `events`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateNotification {
    /// `http://` or `https://`.
    pub url: String,
    /// The HMAC-SHA256 signing key (16 to 1024 printable characters); never returned.
    pub secret: String,
    /// `failure`, `fixed`, `success`, `cancelled`, `always`.
    pub events: Vec<String>,
    /// `kiln` (default) or `slack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// A notification as the API shows it: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Notification {
    pub id: String,
    pub repo: String,
    pub url: String,
    pub events: Vec<String>,
    pub format: String,
    pub created_at_ms: i64,
}

/// One (notification, run end) in the delivery log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotificationDelivery {
    /// Stable per (notification, run end): the `X-Kiln-Delivery` header.
    pub id: String,
    pub notification: String,
    pub run_id: String,
    /// `REPO#NUMBER`.
    pub run: String,
    /// `failure`, `fixed`, `success` or `cancelled` (the `X-Kiln-Event` header).
    pub event: String,
    /// `pending`, `delivered` or `failed`.
    pub status: String,
    pub attempts: i64,
    #[serde(default)]
    pub last_status_code: Option<i64>,
    #[serde(default)]
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    #[serde(default)]
    pub delivered_at_ms: Option<i64>,
    /// When a pending delivery is tried next.
    #[serde(default)]
    pub next_attempt_at_ms: Option<i64>,
}

/// A secret as the API shows it: never its value.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretInfo {
    pub name: String,
    pub updated_at_ms: i64,
}

/// `image: {dockerfile, context}`: paths relative to the checkout.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageBuild {
    pub dockerfile: String,
    pub context: String,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/image`: the digest of the image
/// the attempt built; the answer names the job's committed digest (the
/// first one committed wins).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageCommit {
    pub digest: String,
    /// Where the agent pushed the image (the server's `--build-registry`
    /// path for the job), so any agent pulls it. Absent: it stays in this
    /// agent's engine and the job's retries go only to this agent (issue
    /// 40, item 7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
}

/// One step as the agent runs it: everything evaluated from the run's
/// frozen data by the server (`${{ }}` in `run` already turned into
/// environment references, see `kiln_workflow::render_run`). The fields
/// after `run` were added with step options (workflow-lang): an agent that
/// predates them ignores them, so agents are upgraded with the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepSpec {
    pub name: Option<String>,
    pub run: String,
    /// The step's own variables (its `env` and the values of its `${{ }}`
    /// expressions), over the job's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Whether the step runs when every earlier step succeeded (its `if:`,
    /// with `success()` true). Default true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub run_after_success: bool,
    /// Whether the step runs after an earlier step failed (its `if:` with
    /// `failure()` true). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_after_failure: bool,
    /// The `if:` as written, for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// Relative to the checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continue_on_error: bool,
    /// The program and arguments the script is appended to; empty is
    /// `sh -e -c`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shell: Vec<String>,
}

/// A step that runs `sh -e -c` in the checkout after successful steps only.
impl Default for StepSpec {
    fn default() -> Self {
        StepSpec {
            name: None,
            run: String::new(),
            env: BTreeMap::new(),
            run_after_success: true,
            run_after_failure: false,
            condition: None,
            working_directory: None,
            timeout_secs: None,
            continue_on_error: false,
            shell: Vec::new(),
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishSpec {
    pub name: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RestoreSpec {
    pub from_job: String,
    pub name: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    /// The run was cancelled: stop the sandbox and complete with `cancelled`.
    pub cancel_requested: bool,
    pub lease_ttl_ms: u64,
}

/// One log chunk. Identity: (job, epoch, stream, seq, offset, length, sha256
/// of the bytes, computed by the server).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogChunk {
    /// `stdout`, `stderr` or `system` (agent-side messages such as step headers).
    pub stream: String,
    pub seq: i64,
    pub offset: i64,
    /// base64 of the raw bytes.
    pub data: String,
    /// hex sha256 of the raw bytes. This or `crc32c` (or both) is required;
    /// the server checks the bytes against each one given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// [`log_crc32c`] of the raw bytes: a transport check that costs the
    /// sender almost nothing. The server digests the bytes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    /// Commit this chunk only right after the stream's bytes before it (see
    /// [`RawLogChunk::in_order`]). Not part of the chunk's identity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_order: bool,
}

/// A log chunk sent as the raw request body (`Content-Type:
/// application/octet-stream`), its identity in the [`log_headers`]. The
/// agent's default: no base64 on either side and a third fewer bytes.
#[derive(Debug, Clone)]
pub struct RawLogChunk {
    pub stream: String,
    pub seq: i64,
    pub offset: i64,
    /// hex sha256 of `data`, as the sender computed it (header
    /// [`log_headers::SHA256`]). Optional since 2026-12-05: the chunk's
    /// identity digest is the one the server computes from the bytes; a
    /// digest given here must match it.
    pub sha256: Option<String>,
    /// [`log_crc32c`] of `data` (header [`log_headers::CRC32C`]): the
    /// agent's transport check, in place of a SHA-256 of every chunk on
    /// both sides (issue 20). At least one of `sha256` and `crc32c`.
    pub crc32c: Option<String>,
    pub data: bytes::Bytes,
    /// The server commits this chunk only directly after the stream's bytes
    /// before it: at offset 0, or once a committed chunk of the stream ends
    /// at this chunk's offset. Until then it answers 503 (retryable) and
    /// commits nothing, so chunks sent several at a time commit in offset
    /// order even when one is refused and retried later. An agent that gave
    /// up a chunk (refused for good) sends the chunk after it without this
    /// flag: the hole is then explicit. Not part of the chunk's identity
    /// (an identical retry is one whatever its flag). Header
    /// [`log_headers::IN_ORDER`] `1`.
    pub in_order: bool,
}

/// CRC-32C (Castagnoli) of a log chunk's bytes as 8 lowercase hex digits:
/// the transport check a [`RawLogChunk`] carries. Hardware-accelerated
/// (tens of GB/s), where a SHA-256 runs at about 1.8 GB/s on this
/// project's machines with SHA extensions.
pub fn log_crc32c(data: &[u8]) -> String {
    format!("{:08x}", crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32)
}

/// Headers naming a [`RawLogChunk`].
pub mod log_headers {
    pub const STREAM: &str = "kiln-log-stream";
    pub const SEQ: &str = "kiln-log-seq";
    pub const OFFSET: &str = "kiln-log-offset";
    pub const SHA256: &str = "kiln-log-sha256";
    /// [`super::log_crc32c`] of the body.
    pub const CRC32C: &str = "kiln-log-crc32c";
    /// `1`: [`super::RawLogChunk::in_order`].
    pub const IN_ORDER: &str = "kiln-log-in-order";
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogAck {
    /// Highest contiguous committed byte offset per stream.
    pub committed: BTreeMap<String, i64>,
}

/// Several small chunks of one attempt in one request (`POST
/// /v1/jobs/{job}/attempts/{epoch}/logs/batch`): what a short job's log is
/// (its `system` lines and its output), committed in one transaction: each
/// at most [`LOG_BATCH_CHUNK_MAX`] bytes, [`LOG_BATCH_MAX_CHUNKS`] in all,
/// in the order they were cut; each is judged as it would be alone, in
/// that order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogChunkBatch {
    pub chunks: Vec<LogChunk>,
}

/// Largest chunk a [`LogChunkBatch`] carries (larger ones go alone).
pub const LOG_BATCH_CHUNK_MAX: usize = 16 * 1024;
/// Most chunks in a [`LogChunkBatch`].
pub const LOG_BATCH_MAX_CHUNKS: usize = 8;

/// The answer to a [`LogChunkBatch`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogBatchAck {
    /// How many of the batch's chunks, from the first, are committed (or
    /// were identical retries). The chunks after them were refused or not
    /// tried: send them alone, which gives each its own answer.
    pub accepted: usize,
    /// Highest contiguous committed byte offset per stream.
    pub committed: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Completion {
    /// `success`, `failed` or `cancelled`.
    pub outcome: AttemptOutcome,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub message: Option<String>,
    /// True when the failure is the infrastructure's (checkout, upload, agent
    /// error) rather than the job's commands: retried within the budget.
    #[serde(default)]
    pub infra_failure: bool,
    /// Why the attempt failed: `step_failed`, `timeout`, `hang`, `infra`,
    /// `cancelled`, or `agent_lost` for a job the agent hands back (drain,
    /// preemption; the server also records it for a lost lease). Absent: `infra`
    /// when `infra_failure`, else `step_failed`. Matched by the job's
    /// `retry: {on: [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    /// The job's outputs (`name=value` lines its steps wrote to
    /// `$KILN_OUTPUT`), only the declared ones. Bound only when this
    /// completion succeeds the job of the live epoch; refused (422) when
    /// one is not declared or they exceed 1 MiB.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
    /// Each step's outcome and duration, in order (steps never reached are
    /// left out); recorded on the attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepResult>,
    /// Where the attempt's time went and what its log lost, as the agent
    /// measured them; exported on the server's `/metrics`. Absent from an
    /// older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<AttemptTelemetry>,
    /// How the agent knows the attempt's sandbox is gone, and what its
    /// cleanup could not do (issue 40, item 5). Absent from an older agent:
    /// the completion itself then confirms it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxEnd>,
    /// Test ids whose failures the agent let through because they are
    /// quarantined (issue 43: a step whose only failures were quarantined
    /// tests, with a complete report). The server checks them against the
    /// bound reports and the quarantine, and fails the job if they do not hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// How many test report files the attempt staged (issue 43): the server
    /// reads what the completion bound only when there are some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reports_staged: Option<u32>,
}

/// An agent's word that an attempt's sandbox is gone: in its completion, or
/// alone (`POST /v1/jobs/{job}/attempts/{epoch}/release`) once the attempt
/// was fenced, so a cancel waiting for it can end (spec 000 §9).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxEnd {
    /// How it knows, e.g. `every process of the job was killed and reaped`.
    pub evidence: String,
    /// What its cleanup could not do, if anything (shown on the attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_error: Option<String>,
}

/// The answer to a release: whether this report confirmed it (false: it
/// was already confirmed).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseAck {
    pub released: bool,
}

/// An attempt's phases and log losses as its agent measured them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptTelemetry {
    /// From the claim to the first step: checkout, image, restores,
    /// caches, services. None if no step started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepare_ms: Option<u64>,
    /// Pulling or building the job's image (container executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ms: Option<u64>,
    /// The steps' commands, first start to last end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_ms: Option<u64>,
    /// From the last step's end to sending the completion: outputs, cache
    /// save, artifact uploads and seals, the last log chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_ms: Option<u64>,
    /// Output bytes dropped over the attempt's log limit (a truncation).
    #[serde(default)]
    pub log_truncated_bytes: u64,
    /// Output bytes dropped over the log rate limit (marked as gaps).
    #[serde(default)]
    pub log_rate_dropped_bytes: u64,
    /// Output bytes dropped because the buffer and spool were full.
    #[serde(default)]
    pub log_buffer_dropped_bytes: u64,
}

impl Completion {
    /// A successful completion without outputs or step results (exit 0).
    pub fn success() -> Completion {
        Completion {
            outcome: AttemptOutcome::Success,
            exit_code: Some(0),
            message: None,
            infra_failure: false,
            failure_class: None,
            outputs: BTreeMap::new(),
            steps: Vec::new(),
            telemetry: None,
            sandbox: None,
            quarantined: Vec::new(),
            reports_staged: None,
        }
    }
}

/// How one step of an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepResult {
    pub name: String,
    /// `success`, `failure`, `continued` (failed with `continue-on-error`)
    /// or `skipped`.
    pub outcome: String,
    /// How long it ran; none for a skipped step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why it failed (or was skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompletionAck {
    pub job_status: JobStatus,
}

/// Error codes the server uses in `ErrorBody.error.code`.
pub mod codes {
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// A valid credential that may not make this call (another agent's
    /// attempt, a read-only token writing, …).
    pub const FORBIDDEN: &str = "forbidden";
    pub const NOT_FOUND: &str = "not_found";
    pub const INVALID: &str = "invalid";
    pub const CONFLICT: &str = "conflict";
    /// The epoch named is not the job's current live attempt (fenced).
    pub const STALE_EPOCH: &str = "stale_epoch";
    pub const IDEMPOTENCY_MISMATCH: &str = "idempotency_key_reused";
    pub const UNAVAILABLE: &str = "unavailable";
    pub const INTERNAL: &str = "internal";
    pub const TOO_LARGE: &str = "too_large";
    /// A run id prefix that more than one run starts with (409; the
    /// message lists them).
    pub const AMBIGUOUS: &str = "ambiguous";
    /// An artifact whose retention ran out (410 Gone): its bytes were
    /// deleted by the collector; the run still lists it with `expired: true`.
    pub const EXPIRED: &str = "expired";
    /// A team over its queued-job cap, or the server saturated for the
    /// run's lane (429 with `Retry-After`; issue 44).
    pub const OVER_QUOTA: &str = "over_quota";
}

// ---------- artifacts (spec 000 §12) ----------

/// Open an attempt-scoped upload session for one declared output.
/// `POST /v1/jobs/{job}/attempts/{epoch}/artifacts`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateUpload {
    pub name: String,
    pub size: u64,
    /// hex sha256 of the frozen bytes, if known up front. Otherwise the agent
    /// hashes while uploading and names it when sealing ([`SealRequest`]):
    /// the frozen bytes are then read once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// What the bytes are: `file` (the default, left out) or `archive` (a
    /// directory or glob the agent packed as one tar+zstd archive with a
    /// manifest; a restore unpacks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// [`CreateUpload::kind`] / [`Artifact::kind`] of one published file.
pub const ARTIFACT_FILE: &str = "file";
/// [`CreateUpload::kind`] / [`Artifact::kind`] of a directory or glob packed as one archive.
pub const ARTIFACT_ARCHIVE: &str = "archive";

fn artifact_file() -> String {
    ARTIFACT_FILE.to_string()
}

/// Body of a seal: the sha256 of the uploaded bytes when the session was
/// opened without one. The server compares it with its own hash of what it
/// stored, and with the session's, before sealing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SealRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Presigned sessions: every part's ETag as the object store returned
    /// it, in part order (the server assembles the object from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<UploadedPart>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadedPart {
    pub part: u64,
    pub etag: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadSession {
    /// The candidate generation this session fills.
    pub generation_id: String,
    /// Upload part N with `PUT` to this URL after replacing `{part}` with N
    /// (0-based). The URL carries a short-lived capability; no other
    /// credential is needed or accepted. Retry a failed part with identical bytes.
    /// Empty when `presigned` is true.
    pub part_url: String,
    /// Every part but the last has exactly this many bytes.
    pub part_size: u64,
    pub expires_at_ms: i64,
    /// The object store is reached directly (S3): for each part ask
    /// `POST /v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/parts/{part}`
    /// ([`PartUrlRequest`]) for a short-lived presigned request, send the
    /// bytes with exactly its headers, keep the `ETag` of the response and
    /// name every part's ETag when sealing ([`SealRequest::parts`]).
    #[serde(default)]
    pub presigned: bool,
}

/// Ask for a presigned part upload: the part's size and the base64 MD5 of
/// its bytes (the store refuses other bytes).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartUrlRequest {
    pub size: u64,
    pub content_md5: String,
}

/// `PUT` the part to `url` with exactly `headers`; nothing else is needed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PresignedPart {
    pub part: u64,
    pub url: String,
    pub headers: std::collections::BTreeMap<String, String>,
    pub expires_at_ms: i64,
}

/// Response of a part upload. Integrity is verified over the whole object
/// when the session is sealed; `sha256` of the part is given only when the
/// server computed it (parts that arrived out of order).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartReceipt {
    pub part: u64,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal`: the
/// server verifies size and sha256 of the stored object before sealing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SealedGeneration {
    pub generation_id: String,
    pub name: String,
    pub size: u64,
    pub sha256: String,
    pub state: GenerationState,
}

/// Ask for a producer's bound artifact.
/// `POST /v1/jobs/{job}/attempts/{epoch}/restore` (agent, for the consuming attempt)
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RestoreRequest {
    pub from_job: String,
    pub name: String,
}

/// Where and what to download. Also `GET /v1/workflow-runs/{run}/artifacts/{job}/{name}` (public API).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArtifactDownload {
    pub name: String,
    pub job: String,
    pub epoch: i64,
    pub size: u64,
    pub sha256: String,
    /// Short-lived capability URL for `GET`.
    pub url: String,
    pub expires_at_ms: i64,
    /// `file` or `archive` (unpack into the restore path).
    #[serde(default = "artifact_file")]
    pub kind: String,
    /// An archive (a directory or glob) as people download it (issue 41,
    /// item 5): the same tree as a `.tar.gz` and as a `.zip`, short-lived
    /// capability URLs like `url` (whose bytes are Kiln's internal format,
    /// which `size` and `sha256` describe). Absent for a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tar_gz_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zip_url: Option<String>,
}

/// Agent session stream: `GET /v1/agents/{agent}/session?session_id=…` is
/// held open for the agent's lifetime; the server sends a `ping` event every
/// second. When the connection drops, the server shortens the session's
/// leases to the loss grace (fast loss detection).
/// It also sends a `cancel` event ([`CancelNotice`]) when a run with an
/// attempt of this session is cancelled: stop that sandbox now and complete
/// with `cancelled` (the heartbeat's `cancel_requested` remains the fallback).
pub const SESSION_PING_MS: u64 = 1000;

/// Payload of a session stream `cancel` event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CancelNotice {
    pub job_id: String,
    pub epoch: i64,
}

/// A job's `reports:`: workspace-relative paths or globs by format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportsSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub junit: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tap: Vec<String>,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/reports`: one report file an
/// attempt's agent read, staged until the attempt's completion binds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportUpload {
    /// The file, relative to the workspace.
    pub path: String,
    /// `junit` or `tap`.
    pub format: String,
    /// A cap was hit or the file was broken: outcomes past it are unknown.
    #[serde(default)]
    pub truncated: bool,
    /// What the parser refused, cut or repaired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<ReportAnnotation>,
    pub tests: Vec<TestCaseResult>,
}

/// The answer to a report upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportAck {
    /// False when that path was staged already (a retried upload).
    pub staged: bool,
}

/// Something a report parser refused, cut or repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportAnnotation {
    /// e.g. `doctype_refused`, `too_large`, `text_cut`, `invalid_utf8`.
    pub kind: String,
    pub message: String,
}

/// One test as a report says it ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestCaseResult {
    /// `suite :: class :: name` (see docs/tests.md).
    pub id: String,
    pub suite: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `passed`, `failed`, `error` or `skipped`.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A bounded excerpt of its output (tests that did not pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excerpt: Option<String>,
    /// The runner's own earlier tries (JUnit `flakyFailure`/`rerunFailure`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<TestRetry>,
}

/// One of a runner's own tries of a test.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestRetry {
    /// `flaky_failure`, `flaky_error`, `rerun_failure` or `rerun_error`.
    pub kind: String,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// A run's tests summed up (each job's last attempt) and flagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestSummary {
    pub total: u64,
    pub passed: u64,
    pub failed: u64,
    /// Tests that ended in an error (not an assertion).
    pub errored: u64,
    pub skipped: u64,
    /// Tests flagged flaky when the run ended.
    pub flaky: u64,
    /// Failed tests that were quarantined.
    pub quarantined: u64,
}

/// `GET /v1/workflow-runs/{run}/tests`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunTests {
    pub run_id: String,
    pub summary: TestSummary,
    /// Whether the run has ended: flakiness is decided then.
    pub decided: bool,
    /// Each job's attempts whose reports were bound.
    pub attempts: Vec<TestAttemptInfo>,
    /// The report files of each job's last bound attempt.
    pub reports: Vec<TestReportInfo>,
    /// Each job's last bound attempt's tests: failed and errored first,
    /// then in report order.
    pub tests: Vec<TestRow>,
}

/// One bound attempt's reports, summed up.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestAttemptInfo {
    pub job: String,
    pub job_id: String,
    pub epoch: i64,
    /// `complete`, `truncated` or `missing`.
    pub state: String,
    pub total: u64,
    pub passed: u64,
    pub failed: u64,
    pub errored: u64,
    pub skipped: u64,
    pub quarantined: u64,
}

/// A bound report file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestReportInfo {
    pub job: String,
    pub job_id: String,
    pub epoch: i64,
    pub path: String,
    pub format: String,
    pub truncated: bool,
    pub tests: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<ReportAnnotation>,
}

/// One test of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestRow {
    pub job: String,
    pub job_id: String,
    pub epoch: i64,
    #[serde(flatten)]
    pub test: TestCaseResult,
    /// Flagged flaky when the run ended.
    pub flaky: bool,
    /// Quarantined now.
    pub quarantined: bool,
}

/// `GET /v1/repos/{repo}/tests/history?id=TEST_ID`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestHistory {
    pub repo: String,
    pub test_id: String,
    /// Over default-branch runs: flaky runs / runs that decided the test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flake_rate: Option<FlakeRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
    /// Newest first.
    pub entries: Vec<TestHistoryEntry>,
}

/// A test's flake rate over default-branch history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FlakeRate {
    pub runs: u32,
    pub flaky: u32,
    pub failed: u32,
    pub rate: f64,
}

/// One result of a test in its history.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestHistoryEntry {
    pub run_id: String,
    pub run_number: i64,
    pub commit_sha: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    pub job: String,
    pub epoch: i64,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub flaky: bool,
    pub created_at_ms: i64,
}

/// `GET /v1/repos/{repo}/tests/timings?ref=REF`: recorded durations for
/// `kiln tests split`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestTimings {
    /// The ref the durations come from: the one asked for, else the
    /// default branch (`None`: neither has any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<String>,
    pub durations_ms: BTreeMap<String, u64>,
}

/// `POST /v1/repos/{repo}/quarantine`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateQuarantine {
    pub test_id: String,
    /// Who fixes it (required).
    pub owner: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Seconds until it expires (default 14 days, at most 90).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

/// A quarantined test.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Quarantine {
    pub id: String,
    pub test_id: String,
    pub owner: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    pub created_by: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// `active`, `expired` (the test blocks again) or `removed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/shards/next` (`kiln tests next`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardNext {
    /// The queue's name within the run (shards of one suite share it).
    pub group: String,
    /// Every test id of the suite: the first call seeds the queue with
    /// them (in batches by recorded duration); later calls' are ignored.
    #[serde(default)]
    pub tests: Vec<String>,
    /// Tests per batch (default: about a fortieth of the suite's time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
}

/// The answer to `shards/next`: a batch, or none left.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardBatch {
    /// `None`: no batch left to hand out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i64>,
    pub tests: Vec<String>,
    /// Batches not handed out yet.
    pub pending: u64,
    /// Batches other live attempts hold (they come back if those are lost).
    pub leased: u64,
    pub total: u64,
}

// ---------- deployment environments (issue 46) ----------

/// A deployment environment: the rules its deploy jobs (`environment:`) wait on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Environment {
    pub name: String,
    /// API token names that may approve a run's deployment (`admin`: the server's
    /// admin.token); empty: any admin.
    pub approvers: Vec<String>,
    /// Distinct approvers a run needs (at least 1 when approvers are listed; 0 and none
    /// listed: no approval).
    pub min_approvals: u32,
    /// Whoever started a run may not approve it.
    pub prevent_self_review: bool,
    /// Refs allowed to deploy (branch names, or full refs starting `refs/`; `*` within a
    /// segment, `**` across); empty: any. Checked when a run is accepted (422).
    pub refs: Vec<String>,
    /// Seconds an approved deploy job waits before it may start.
    pub wait_secs: u64,
    /// Seconds an approval stands (default 30 days).
    pub approval_ttl_secs: u64,
    /// How many of its newest deployments keep their artifacts pinned against expiry
    /// (besides the current one), so a rollback to them deploys the same bytes.
    #[serde(default = "default_keep_deployments")]
    pub keep_deployments: u32,
    /// The provenance policy every artifact a deploy job restores must satisfy (canonical
    /// form, e.g. `trusted,ref=refs/heads/main`); absent: none. See docs/deployments.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_provenance: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// `POST /v1/environments`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_approvals: Option<u32>,
    #[serde(default)]
    pub prevent_self_review: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_ttl_secs: Option<u64>,
    /// Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_deployments: Option<u32>,
    /// A provenance policy (`trusted,repo=NAME,ref=REF,workflow=PATH,builder=ID`; `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_provenance: Option<String>,
}

/// What `keep_deployments` is unless set.
pub const DEFAULT_KEEP_DEPLOYMENTS: u32 = 10;

fn default_keep_deployments() -> u32 {
    DEFAULT_KEEP_DEPLOYMENTS
}

/// `PATCH /v1/environments/{env}`: what is absent is kept.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateEnvironment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_approvals: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prevent_self_review: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_ttl_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_deployments: Option<u32>,
    /// A provenance policy; `none` (or empty) removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_provenance: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvironmentList {
    pub environments: Vec<Environment>,
}

/// `POST /v1/workflow-runs/{run}/approvals`: approve or reject the run's deployment to
/// an environment (one decision per approver; one approval covers every deploy job of
/// the run in that environment).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DecideDeployment {
    /// The environment; may be left out when the run deploys to exactly one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// `approve` or `reject`.
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// One approver's decision on a run's deployment to an environment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Approval {
    pub run_id: String,
    pub environment: String,
    /// The approver: an API token's name, or `admin`.
    pub by: String,
    /// `approved` or `rejected`.
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    pub at_ms: i64,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalList {
    pub approvals: Vec<Approval>,
}

/// One deploy job that ended (issue 46): what it deployed, from which run, approved by whom.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deployment {
    pub id: String,
    pub environment: String,
    pub repo: String,
    pub run_id: String,
    pub run_number: i64,
    pub job_id: String,
    pub job: String,
    pub epoch: i64,
    pub commit_sha: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `success` or `failed`.
    pub status: String,
    /// Who started the run (an API token's name, `admin`, a forge user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggered_by: Option<String>,
    /// The approvers whose approvals the run held.
    pub approvals: Vec<String>,
    /// The artifact generations the job restored: what it deployed.
    pub artifacts: Vec<DeployedArtifact>,
    pub at_ms: i64,
    /// A rollback's deployment: the deployment whose bytes it deployed again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<String>,
    /// The ring it deployed (`rings:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<String>,
}

/// `POST /v1/environments/{env}/rollback`: return the environment to an earlier
/// deployment's artifact generations (the newest successful one by another run than the
/// current deployment's, unless `to` names one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// A rollback accepted: the run that deploys the earlier bytes again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RollbackAccepted {
    pub run_id: String,
    pub run_number: i64,
    /// The deployment returned to.
    pub to: Deployment,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployedArtifact {
    pub name: String,
    pub from_job: String,
    pub run_id: String,
    /// The bound artifact generation.
    pub generation: String,
    pub sha256: String,
}

/// A run's promotion between two rings (issue 46): the bake and gate after ring
/// `from_ring`, which the job `job` (the next ring, or a command gate's job) waits for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RingPromotion {
    pub job: String,
    pub environment: String,
    pub from_ring: String,
    pub to_ring: String,
    /// `baking`, `measuring`, `paused`, `passed`, `promoted` or `failed`.
    pub state: String,
    /// Where it stands, in words (also the waiting job's message).
    pub message: String,
    /// The Prometheus gate as written in the workflow (JSON text), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<String>,
    /// When the ring before deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_until_ms: Option<i64>,
    /// Measurements taken, and how many failed.
    pub measured: i64,
    pub failures: i64,
    /// Who paused or promoted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// After a failed gate: the automatic rollback's run id, or why there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<String>,
    pub updated_at_ms: i64,
}

/// `GET /v1/workflow-runs/{run}/rings`: the run's promotions, in file order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RingPromotionList {
    pub promotions: Vec<RingPromotion>,
}

/// `GET /v1/environments/{env}/deployments`: newest first; the first successful one is
/// what the environment runs now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeploymentList {
    pub deployments: Vec<Deployment>,
}
