//! Kiln's side of the three forges it builds for: GitHub, GitLab and
//! Gitea/Forgejo.
//!
//! * [`verify`] checks that a webhook delivery came from the forge (an HMAC
//!   signature, or GitLab's shared token), always in constant time;
//! * [`delivery_meta`] reads the delivery id and the event name from the
//!   headers;
//! * [`parse`] turns a verified payload into a [`ForgeEvent`] (a push, a pull
//!   request that needs a build, a ping, or something to ignore);
//! * [`post_status`] reports a commit status back to the forge.
//!
//! With the `fake` feature, [`fake::FakeForge`] is a real HTTP server speaking
//! the three forges' commit-status APIs, for tests.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod parse;
mod status;
mod verify;

#[cfg(feature = "fake")]
pub mod fake;

pub use parse::{ForgeEvent, PullRequestEvent, PushEvent, RepoIdentity, parse, repository};
pub use status::{CommitState, PostError, StatusTarget, api_url, post_status};
pub use verify::{DeliveryMeta, VerifyError, delivery_meta, sign, verify};

/// The largest webhook body the server should read. GitHub caps payloads at
/// 25 MB; GitLab and Gitea deliveries are far smaller in practice.
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

/// A kind of forge. Forgejo speaks Gitea's protocol and is the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forge {
    Github,
    Gitlab,
    Gitea,
}

impl Forge {
    pub const ALL: [Forge; 3] = [Forge::Github, Forge::Gitlab, Forge::Gitea];

    pub fn as_str(self) -> &'static str {
        match self {
            Forge::Github => "github",
            Forge::Gitlab => "gitlab",
            Forge::Gitea => "gitea",
        }
    }
}

impl fmt::Display for Forge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Forge {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "github" => Ok(Forge::Github),
            "gitlab" => Ok(Forge::Gitlab),
            "gitea" | "forgejo" => Ok(Forge::Gitea),
            other => Err(format!("unknown forge {other:?} (expected github, gitlab, gitea or forgejo)")),
        }
    }
}

/// A delivery whose headers or payload cannot be understood (the server
/// answers 400). The message names the header or field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ParseError { message: message.into() }
    }
}
