//! Wire types shared by server, agent and CLI, CLI exit codes, and a typed
//! HTTP client with a retry classifier.
//!
//! Compatibility rule: fields are only ever added (with `#[serde(default)]`),
//! never renamed or removed, so agents and servers upgrade separately.

pub mod client;
pub mod exit;
pub mod giturl;
pub mod types;

pub use client::{ApiError, Client};
pub use types::*;
