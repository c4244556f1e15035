//! Kiln's pure core: statuses and the state machines of run, job and attempt,
//! retry and backoff policy. No IO; property-tested.

pub mod attempt;
pub mod backoff;
pub mod job;
pub mod protocol;
pub mod run;
pub mod trust;

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
