//! The store's transactions, one file per family; each trait method of
//! `traits.rs` is one function here (`impls.rs` is the table from method to
//! function).
//!
//! Layers (imports point downwards only):
//! - `accept`, `claim`, `lease`, `logs` (and `log_objects`), `outbox`, `repos`, `agents`,
//!   `artifacts`, `images`: the verbs; `lease` (fencing) ends attempts
//!   through `complete`'s failure path.
//! - `cancel`, `complete`, `release`: cancellation, completion and the
//!   confirmation that a fenced attempt's sandbox is gone, which finish
//!   jobs or runs and let the run advance.
//! - `advance`: the shared steps — make a job ready (with its outbox event),
//!   decide pending jobs, job and run concurrency groups, finish a run.
//! - `attempt`: the live-epoch check (invariant 3) and ending an attempt with
//!   its log marker.
//! - `notify`: badges, notifications and their outbox; `advance` enqueues a
//!   run end's notifications through it (it imports no other family).
//! - below all: `store.rs` (runner, locks), `rows.rs`, `db.rs`, `dialect.rs`.

pub(crate) mod accept;
pub(crate) mod access;
pub(crate) mod advance;
pub(crate) mod agents;
pub(crate) mod artifacts;
pub(crate) mod attempt;
pub(crate) mod caches;
pub(crate) mod cancel;
pub(crate) mod claim;
pub(crate) mod complete;
pub(crate) mod content;
pub(crate) mod deploy_gate;
pub(crate) mod env_secrets;
pub(crate) mod environments;
pub(crate) mod forge;
pub(crate) mod gates;
pub(crate) mod images;
pub(crate) mod lease;
pub(crate) mod log_objects;
pub(crate) mod logs;
pub(crate) mod notify;
pub(crate) mod outbox;
pub(crate) mod outputs;
pub(crate) mod promotions;
pub(crate) mod provenance;
pub(crate) mod queue;
pub(crate) mod release;
pub(crate) mod repos;
pub(crate) mod rings;
pub(crate) mod rollback;
pub(crate) mod teams;
pub(crate) mod test_reports;
