//! Wire types shared by server, agent and CLI (statuses with an `Unknown`
//! fallback in [`status`]), CLI exit codes, and a typed HTTP client with a
//! retry classifier.
//!
//! Compatibility rule: fields are only ever added (with `#[serde(default)]`),
//! never renamed or removed, so agents and servers upgrade separately.

pub mod access;
pub mod client;
pub mod exit;
pub mod giturl;
pub mod status;
pub mod trace;
pub mod types;

pub use access::*;
pub use client::{ApiError, Client};
/// Log stream and SSE event names (`seal`, `gap`, `chunk`, `end`, …), shared with the store.
pub use kiln_core::logs;
pub use status::{AttemptOutcome, GenerationState, JobStatus, RunStatus};
pub use types::*;
