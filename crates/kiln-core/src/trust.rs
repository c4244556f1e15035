//! The trust context of a run (ARCHITECTURE invariant 10; spec 000 §5, §14):
//! decided once at acceptance from the trigger, frozen with the run and
//! never raised later. An untrusted run gets no secrets, no protected cache
//! writes and no identity tokens.

use crate::string_enum;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Submitted by a holder of the admin token, or by the repository's own
    /// branches: may read the repository's secrets.
    Trusted,
    /// Code from outside the repository's writers (e.g. a fork's pull request).
    Untrusted,
}

string_enum!(Trust { Trusted => "trusted", Untrusted => "untrusted" });

/// Events whose code comes from outside the repository's writers: a pull
/// request runs its author's code, whoever forwards it.
pub const OUTSIDE_CODE_EVENTS: &[&str] = &["pull_request"];

impl Trust {
    /// The trust of a run submitted through the API: trusted only when the
    /// caller may start trusted runs (the admin token, or an API token made
    /// `trusted`) *and* the event runs the repository's own code.
    pub fn for_submission(event: &str, caller_may_start_trusted: bool) -> Trust {
        if caller_may_start_trusted && !OUTSIDE_CODE_EVENTS.contains(&event) {
            Trust::Trusted
        } else {
            Trust::Untrusted
        }
    }

    /// Whether a job of such a run may be handed the secrets it asks for.
    pub fn may_read_secrets(self) -> bool {
        self == Trust::Trusted
    }
}

#[cfg(test)]
mod tests {
    use super::Trust;

    #[test]
    fn wire_names_round_trip() {
        for (t, s) in [(Trust::Trusted, "trusted"), (Trust::Untrusted, "untrusted")] {
            assert_eq!(t.as_str(), s);
            assert_eq!(s.parse::<Trust>(), Ok(t));
        }
        assert!("TRUSTED".parse::<Trust>().is_err());
        assert!(Trust::Trusted.may_read_secrets());
        assert!(!Trust::Untrusted.may_read_secrets());
    }

    #[test]
    fn submissions_are_trusted_only_from_trusted_callers_with_own_code() {
        use Trust::*;
        for (event, caller, want) in [
            ("manual", true, Trusted),
            ("push", true, Trusted),
            ("schedule", true, Trusted),
            ("pull_request", true, Untrusted),
            ("manual", false, Untrusted),
            ("push", false, Untrusted),
            ("pull_request", false, Untrusted),
        ] {
            assert_eq!(Trust::for_submission(event, caller), want, "{event} by trusted caller: {caller}");
        }
    }
}
