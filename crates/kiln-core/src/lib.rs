//! Kiln's pure core: statuses and the state machines of run, job and attempt,
//! and the protocol's decisions as functions over plain data that return
//! verdicts the store executes inside its transactions. No IO, no async.
//!
//! Where each rule lives (spec 000 unless noted):
//!
//! | rule | module |
//! |---|---|
//! | statuses and their transitions | [`run`], [`job`], [`attempt`] |
//! | readiness, `if:`, quorum, `max-parallel`, skips, the run's final status (§2, §9; spec 003) | [`advance`] |
//! | job concurrency groups (spec 003) | [`groups`] |
//! | retry budget, backoff, fail-fast (§8) | [`failure`], [`backoff`] |
//! | live epoch, heartbeat, fencing (§8) | [`lease`] |
//! | claim eligibility (§7) | [`claim`] |
//! | why a job has not started, in words (invariant 12) | [`waiting`] |
//! | cancellation (§9) | [`cancel`] |
//! | completion and its ordering with cancellation (§9) | [`complete`] |
//! | which jobs a retry of the failed jobs pins (§9, retry from job) | [`retry`] |
//! | what a run end is for a notification subscriber (issue 42) | [`notify`] |
//! | the reference model built from all of the above | [`protocol`] |
//!
//! Modules depend one way: the decision modules use only the status
//! modules (`failure` also the backoff, `complete` the failure classes);
//! `protocol` uses them all; nothing uses `protocol`.

pub mod acceptance;
pub mod advance;
pub mod attempt;
pub mod backoff;
pub mod cancel;
pub mod claim;
pub mod complete;
pub mod degradation;
pub mod failure;
pub mod fair;
pub mod groups;
pub mod job;
pub mod lease;
pub mod logs;
pub mod notify;
pub mod protocol;
pub mod retry;
pub mod run;
#[cfg(test)]
mod test_lang;
pub mod trust;
pub mod waiting;

pub use attempt::AttemptOutcome;
pub use backoff::Backoff;
pub use job::JobStatus;
pub use run::RunStatus;
pub use trust::Trust;

/// Error for a transition the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid transition: {from} --{event}-->")]
pub struct InvalidTransition {
    pub from: &'static str,
    pub event: &'static str,
}

macro_rules! string_enum {
    ($name:ident { $($variant:ident => $s:literal),* $(,)? }) => {
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),* }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s { $($s => Ok($name::$variant),)* other => Err(format!("unknown {} `{other}`", stringify!($name))) }
            }
        }
    };
}
pub(crate) use string_enum;
