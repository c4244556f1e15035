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

impl Trust {
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
}
