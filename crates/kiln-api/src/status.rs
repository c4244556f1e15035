//! Statuses on the wire: run, job, attempt outcome, artifact generation.
//!
//! Each serializes as exactly the string of the contract (ARCHITECTURE.md,
//! "Statuses") and is the kiln-core state machine's status seen from the
//! outside. Any other string deserializes into `Unknown(String)` and
//! serializes back unchanged: an older CLI or agent talking to a newer
//! server must not fail to parse a status it does not know yet (the
//! compatibility rule of this crate: agents and servers upgrade separately).
//!
//! Questions about a status (`is_terminal`, `is_success`) are answered here
//! so callers never re-list statuses; an `Unknown` status answers `false`
//! to each: a client waits for a status it understands.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A wire status enum: the known variants with their contract strings, an
/// `Unknown` fallback, and its serde, `Display`, `From<&str>`/`From<String>`
/// and (when a kiln-core status exists) the conversions to and from it.
macro_rules! wire_status {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$vmeta:meta])* $variant:ident => $s:literal),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A status this build does not know (sent by a newer peer); kept verbatim.
            Unknown(String),
        }

        impl $name {
            /// Every known status, in the contract's order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),*];

            /// The status named `s`; any other string is kept as `Unknown`.
            pub fn parse(s: &str) -> Self {
                match s {
                    $($s => $name::$variant,)*
                    other => $name::Unknown(other.to_string()),
                }
            }

            /// The wire string (an `Unknown` status's own string).
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $s,)*
                    $name::Unknown(s) => s,
                }
            }

            pub fn is_unknown(&self) -> bool {
                matches!(self, $name::Unknown(_))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // `pad`, not `write_str`: the CLI aligns statuses in columns (`{:<10}`).
                f.pad(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
                Ok($name::parse(&s))
            }
        }

        /// The contract's strings as an `enum` (the `Unknown` fallback is
        /// for older clients; a server sends only these).
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$($s),*]))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name::parse(s)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match $name::parse(&s) {
                    $name::Unknown(_) => $name::Unknown(s),
                    known => known,
                }
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

/// `From<kiln_core::X>` and `TryFrom<wire> for kiln_core::X`. The matches
/// are exhaustive both ways: a status added to kiln-core without its wire
/// form does not compile.
macro_rules! core_conversions {
    ($name:ident, $core:ident { $($variant:ident),* $(,)? }) => {
        impl From<kiln_core::$core> for $name {
            fn from(s: kiln_core::$core) -> Self {
                match s {
                    $(kiln_core::$core::$variant => $name::$variant,)*
                }
            }
        }

        impl TryFrom<$name> for kiln_core::$core {
            /// The message of kiln-core's `FromStr` for the same string.
            type Error = String;
            fn try_from(s: $name) -> Result<Self, String> {
                match s {
                    $($name::$variant => Ok(kiln_core::$core::$variant),)*
                    $name::Unknown(other) => Err(format!("unknown {} `{other}`", stringify!($core))),
                }
            }
        }
    };
}

wire_status!(
    /// A workflow run's status (`queued|running|cancelling|success|failed|cancelled`).
    RunStatus {
        Queued => "queued",
        Running => "running",
        Cancelling => "cancelling",
        Success => "success",
        Failed => "failed",
        Cancelled => "cancelled",
    }
);
core_conversions!(RunStatus, RunStatus { Queued, Running, Cancelling, Success, Failed, Cancelled });

impl RunStatus {
    /// The run will not change any more.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Success | Self::Failed | Self::Cancelled)
    }

    pub fn is_success(&self) -> bool {
        *self == Self::Success
    }
}

wire_status!(
    /// A job's status (`pending|ready|running|success|failed|cancelled|skipped`).
    JobStatus {
        Pending => "pending",
        Ready => "ready",
        Running => "running",
        Success => "success",
        Failed => "failed",
        Cancelled => "cancelled",
        Skipped => "skipped",
    }
);
core_conversions!(JobStatus, JobStatus { Pending, Ready, Running, Success, Failed, Cancelled, Skipped });

impl JobStatus {
    /// The job will not run (again): its log feed ends.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Success | Self::Failed | Self::Cancelled | Self::Skipped)
    }

    pub fn is_success(&self) -> bool {
        *self == Self::Success
    }
}

wire_status!(
    /// An attempt's outcome (`running|success|failed|lost|cancelled`); a
    /// completion names one of `success|failed|cancelled`.
    AttemptOutcome {
        Running => "running",
        Success => "success",
        Failed => "failed",
        Lost => "lost",
        Cancelled => "cancelled",
    }
);
core_conversions!(AttemptOutcome, AttemptOutcome { Running, Success, Failed, Lost, Cancelled });

impl AttemptOutcome {
    /// The attempt ended (its epoch can no longer publish).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Self::Running | Self::Unknown(_))
    }

    pub fn is_success(&self) -> bool {
        *self == Self::Success
    }
}

wire_status!(
    /// An artifact generation's state (spec 000 §12): candidate bytes being
    /// uploaded, sealed (verified, bindable), failed, or deleted by the
    /// collector. Only the completion transaction binds a sealed generation.
    GenerationState {
        Uploading => "uploading",
        Sealed => "sealed",
        Failed => "failed",
        Deleted => "deleted",
    }
);
