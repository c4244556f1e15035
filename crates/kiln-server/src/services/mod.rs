//! The server's application services: the protocol's policies around the
//! store's transactions (what a handler calls after parsing and
//! authorizing). Services know nothing of HTTP requests; they return the
//! edge's error type (`ApiErr`) because each failure already has its
//! documented status.
//!
//! Layering (one-way): `handlers` → `services` → `state`/store. Within
//! services: `claim` → `agents`, `assignment`; `log_feed` → `log_index`;
//! `attempts` and `runs` → `notices`.

pub(crate) mod acceptance;
pub(crate) mod access;
pub(crate) mod agents;
pub(crate) mod artifacts;
pub(crate) mod assignment;
pub(crate) mod attempts;
pub(crate) mod caches;
pub(crate) mod claim;
pub(crate) mod env_secrets;
pub(crate) mod environments;
pub(crate) mod forge_status;
pub(crate) mod limits;
pub(crate) mod log_archive;
pub(crate) mod log_feed;
pub(crate) mod notices;
pub(crate) mod notify;
pub(crate) mod overview;
pub(crate) mod planning;
pub(crate) mod queue;
pub(crate) mod repos;
pub(crate) mod rings;
pub(crate) mod run_feed;
pub(crate) mod run_ref;
pub(crate) mod runs;
pub(crate) mod teams;
pub(crate) mod test_reports;
pub(crate) mod triggers;
pub(crate) mod webhooks;
// Unit tests of each service's policy, one file per service, over a real
// SQLite store (kept apart so that no service module refers to its tests).
#[cfg(test)]
mod tests;
