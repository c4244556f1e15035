//! Who may do what: API tokens (`kiln token …`), agent join tokens
//! (`kiln agent-token …`), registered agents (`kiln agents …`) and the
//! audit log (`kiln audit`). Admin scope only.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateToken {
    pub name: String,
    /// `admin`, `read` or `trigger`.
    pub scope: String,
    /// The repository (name or id) of a `trigger` token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Runs this token starts may be trusted (read secrets). Default: true
    /// for `admin`, false for `trigger`; `read` starts no runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted: Option<bool>,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub scope: String,
    #[serde(default)]
    pub repo_id: Option<String>,
    pub trusted: bool,
    pub created_at_ms: i64,
    #[serde(default)]
    pub revoked_at_ms: Option<i64>,
    #[serde(default)]
    pub last_used_at_ms: Option<i64>,
}

/// The answer to a token creation: the only time its secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// `POST /v1/agent-tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateJoinToken {
    pub name: String,
    /// The pool agents registering with it join (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JoinTokenInfo {
    pub id: String,
    pub name: String,
    pub pool: String,
    pub created_at_ms: i64,
    #[serde(default)]
    pub revoked_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedJoinToken {
    pub token: String,
    #[serde(flatten)]
    pub info: JoinTokenInfo,
}

/// A registered agent (one per agent process start).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentInfo {
    pub id: String,
    pub name: String,
    pub pool: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Capacity: jobs it runs at once.
    pub max_jobs: u32,
    pub created_at_ms: i64,
    pub last_seen_at_ms: i64,
    /// Its session stream is open to the server that answered.
    #[serde(default)]
    pub connected: bool,
    /// Attempts it is running now.
    #[serde(default)]
    pub running_jobs: u32,
    /// The jobs it is running now (its running attempts), longest-running first.
    #[serde(default)]
    pub jobs: Vec<AgentJob>,
    /// The Kiln version it registered with (absent from older agents).
    #[serde(default)]
    pub version: Option<String>,
    /// It drains (SIGTERM): it claims nothing more and lets its running jobs finish.
    #[serde(default)]
    pub draining: bool,
    /// The executor it runs jobs with (`host` or `container`; absent from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// It takes untrusted work (its pool is one of the server's `--untrusted-pools` and it runs
    /// a container executor, or host agents are allowed to); absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takes_untrusted: Option<bool>,
}

/// A job an agent is running (`AgentInfo::jobs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentJob {
    pub run_id: String,
    /// The run's number in its repository (`repo#N`).
    pub run_number: i64,
    pub repo: String,
    pub job_id: String,
    /// The job's name (a matrix expansion's full name).
    pub job: String,
    /// The attempt's epoch.
    pub epoch: i64,
    pub started_at_ms: i64,
}

/// One audit log entry: who did what to what.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    pub id: i64,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub target: String,
    #[serde(default)]
    pub detail: String,
}

/// `GET /v1/overview` (admin scope): what `kiln top` shows, one read of
/// the store's live rows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overview {
    /// When the server answered (ms since the epoch).
    pub at_ms: i64,
    /// How many jobs are `pending`, `ready` and `running`.
    #[serde(default)]
    pub jobs: BTreeMap<String, u64>,
    /// Eligible jobs (ready, due, unclaimed) by `runs-on` label set, the
    /// longest-waiting set first (at most 50 sets).
    #[serde(default)]
    pub queue: Vec<QueueEntry>,
    #[serde(default)]
    pub agents: Vec<AgentInfo>,
    /// Running attempts, longest-running first (at most 200).
    #[serde(default)]
    pub running: Vec<RunningJob>,
}

/// One `runs-on` label set of the eligible queue.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueEntry {
    /// The jobs' `runs-on` labels (empty: any agent).
    pub labels: BTreeMap<String, String>,
    /// Jobs with these labels that are ready and due, not claimed.
    pub eligible: u64,
    /// How long the oldest of them has waited, in milliseconds.
    pub oldest_age_ms: i64,
}

/// A running attempt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunningJob {
    pub run_id: String,
    pub repo: String,
    pub job_id: String,
    /// The job's name.
    pub job: String,
    pub epoch: i64,
    pub agent_id: String,
    /// The agent's name.
    pub agent: String,
    pub started_at_ms: i64,
    pub elapsed_ms: i64,
    /// `prepare`, `image`, `command` or `publication`, as far as the
    /// attempt's log tells (absent when it does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The last line of the attempt's `system` log stream (`▶ step 2/3:
    /// cargo test`, `uploading artifact …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<String>,
}
