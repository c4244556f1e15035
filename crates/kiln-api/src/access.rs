//! Who may do what: API tokens (`kiln token …`), agent join tokens
//! (`kiln agent-token …`), registered agents (`kiln agents …`) and the
//! audit log (`kiln audit`). Admin scope only.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: TokenInfo,
}

/// `POST /v1/agent-tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CreateJoinToken {
    pub name: String,
    /// The pool agents registering with it join (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JoinTokenInfo {
    pub id: String,
    pub name: String,
    pub pool: String,
    pub created_at_ms: i64,
    #[serde(default)]
    pub revoked_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CreatedJoinToken {
    pub token: String,
    #[serde(flatten)]
    pub info: JoinTokenInfo,
}

/// A registered agent (one per agent process start).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    /// The Kiln version it registered with (absent from older agents).
    #[serde(default)]
    pub version: Option<String>,
    /// It drains (SIGTERM): it claims nothing more and lets its running jobs finish.
    #[serde(default)]
    pub draining: bool,
}

/// One audit log entry: who did what to what.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditEntry {
    pub id: i64,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub target: String,
    #[serde(default)]
    pub detail: String,
}
