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

/// Who may start trusted work from a repository's own pull requests (a
/// fork's are never trusted): `write-access` (the default) when the forge
/// says the author has write access, `same-repo` always, `never` never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullRequestTrust {
    #[default]
    WriteAccess,
    SameRepo,
    Never,
}

string_enum!(PullRequestTrust { WriteAccess => "write-access", SameRepo => "same-repo", Never => "never" });

/// What asked for a run, as the trust decision sees it (issue 40, item 8:
/// one decider for every acceptance path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustTrigger<'a> {
    /// The public API or the CLI: the event named, whether the caller's
    /// token may start trusted runs, and the ref the commit was resolved
    /// through (none: a bare commit SHA).
    Api { event: &'a str, may_start_trusted: bool, git_ref: Option<&'a str> },
    /// A retry of a run accepted with `parent` trust, by a caller who may
    /// or may not start trusted runs.
    Retry { parent: Trust, may_start_trusted: bool },
    /// A rollback (issue 46) to a deployment of a run accepted with
    /// `parent` trust, asked for by one of its environment's approvers: the
    /// parent's deploy jobs run again on bytes that already ran with that
    /// trust, approved by the caller — the parent's trust, never raised
    /// (an approver's token need not start trusted runs of its own).
    Rollback { parent: Trust },
    /// A push (webhook or polling): to `git_ref`; `protected` when its
    /// branch matches one of the repository's `protected_refs` patterns.
    Push { git_ref: &'a str, default_branch: &'a str, protected: bool },
    /// A pull request: from a fork or not, whether the forge says its
    /// author has write access, under the repository's policy.
    PullRequest { fork: bool, author_write_access: Option<bool>, policy: PullRequestTrust },
    /// A schedule tick of a workflow on the default branch.
    Schedule,
}

/// The trust decision (ARCHITECTURE invariant 10), made once at acceptance:
/// - an API run is trusted only for a caller allowed to start trusted runs,
///   an event that runs the repository's own code (not a pull request),
///   and a commit reached through a branch, a tag or `HEAD` (a pull
///   request's head such as `refs/pull/N/head` holds code nobody with write
///   access put there);
/// - a retry keeps its parent's trust, and a caller who may not start
///   trusted runs cannot retry one as trusted: never raised;
/// - a push is trusted to a tag, the default branch or a protected branch;
/// - a pull request from a fork never is; one from the repository itself
///   is under its policy;
/// - a schedule tick runs the default branch's own code: trusted.
pub fn decide(trigger: TrustTrigger) -> Trust {
    use Trust::{Trusted, Untrusted};
    match trigger {
        TrustTrigger::Api { event, may_start_trusted, git_ref } => {
            let own_ref = match git_ref {
                None => true,
                Some(r) => r == "HEAD" || r.starts_with("refs/heads/") || r.starts_with("refs/tags/"),
            };
            if own_ref { Trust::for_submission(event, may_start_trusted) } else { Untrusted }
        }
        TrustTrigger::Retry { parent: Trusted, may_start_trusted: true } => Trusted,
        TrustTrigger::Retry { .. } => Untrusted,
        TrustTrigger::Rollback { parent } => parent,
        TrustTrigger::Push { git_ref, default_branch, protected } => {
            if git_ref.starts_with("refs/tags/") {
                return Trusted;
            }
            match git_ref.strip_prefix("refs/heads/") {
                Some(b) if b == default_branch || protected => Trusted,
                _ => Untrusted,
            }
        }
        TrustTrigger::PullRequest { fork: true, .. } => Untrusted,
        TrustTrigger::PullRequest { policy: PullRequestTrust::SameRepo, .. } => Trusted,
        TrustTrigger::PullRequest {
            policy: PullRequestTrust::WriteAccess, author_write_access: Some(true), ..
        } => Trusted,
        TrustTrigger::PullRequest { .. } => Untrusted,
        TrustTrigger::Schedule => Trusted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every trigger kind and every fact that decides its trust.
    #[test]
    fn the_trust_table() {
        use PullRequestTrust::*;
        use Trust::*;
        use TrustTrigger as T;
        let api = |event, may_start_trusted, git_ref| T::Api { event, may_start_trusted, git_ref };
        let push = |git_ref, protected| T::Push { git_ref, default_branch: "main", protected };
        let pr = |fork, author_write_access, policy| T::PullRequest { fork, author_write_access, policy };
        let rows = [
            (api("manual", true, Some("refs/heads/main")), Trusted),
            (api("manual", true, Some("refs/tags/v1")), Trusted),
            (api("manual", true, Some("HEAD")), Trusted),
            (api("manual", true, None), Trusted),
            (api("push", true, Some("refs/heads/feature")), Trusted),
            (api("manual", true, Some("refs/pull/7/head")), Untrusted),
            (api("manual", true, Some("refs/merge-requests/7/head")), Untrusted),
            (api("pull_request", true, Some("refs/heads/main")), Untrusted),
            (api("manual", false, Some("refs/heads/main")), Untrusted),
            (api("schedule", false, None), Untrusted),
            (T::Retry { parent: Trusted, may_start_trusted: true }, Trusted),
            (T::Retry { parent: Trusted, may_start_trusted: false }, Untrusted),
            (T::Retry { parent: Untrusted, may_start_trusted: true }, Untrusted),
            (T::Rollback { parent: Trusted }, Trusted),
            (T::Rollback { parent: Untrusted }, Untrusted),
            (push("refs/heads/main", false), Trusted),
            (push("refs/tags/v1.0", false), Trusted),
            (push("refs/heads/release/1.x", true), Trusted),
            (push("refs/heads/feature", false), Untrusted),
            (push("refs/notes/x", true), Untrusted),
            (T::Push { git_ref: "refs/heads/main", default_branch: "trunk", protected: false }, Untrusted),
            (pr(true, Some(true), SameRepo), Untrusted),
            (pr(true, Some(true), WriteAccess), Untrusted),
            (pr(false, Some(true), WriteAccess), Trusted),
            (pr(false, Some(false), WriteAccess), Untrusted),
            (pr(false, None, WriteAccess), Untrusted),
            (pr(false, None, SameRepo), Trusted),
            (pr(false, Some(true), Never), Untrusted),
            (T::Schedule, Trusted),
        ];
        for (trigger, want) in rows {
            assert_eq!(decide(trigger), want, "{trigger:?}");
        }
    }

    #[test]
    fn pull_request_policies_round_trip() {
        for p in PullRequestTrust::ALL {
            assert_eq!(p.as_str().parse::<PullRequestTrust>(), Ok(*p));
        }
        assert_eq!(PullRequestTrust::default(), PullRequestTrust::WriteAccess);
        assert!("everyone".parse::<PullRequestTrust>().is_err());
    }

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
