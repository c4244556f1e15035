//! An environment's provenance policy (issue 46, `kiln env set NAME
//! --require-provenance POLICY`): what every artifact a deploy job of the
//! environment restores must have been built by, checked against its signed
//! statement before the job may start.
//!
//! POLICY is a comma-separated list of checks, each at most once except
//! `builder`:
//!
//! - `trusted`: built by a trusted run (not a fork's pull request);
//! - `repo=NAME`: built from repository NAME (Kiln's name for it);
//! - `ref=REF`: built from the full ref REF (`refs/heads/main`);
//! - `workflow=PATH`: built by the workflow file PATH (`.kiln/ci.yaml`);
//! - `builder=ID`: built by builder ID (`<public-url>/builders/<pool>`);
//!   repeated: any of them.
//!
//! `none` (or nothing) is no policy. Whatever the list, the statement's
//! signature (the server's keys), its subject and sha256 (the restored
//! generation's bytes) and its build type are checked too.

use crate::dsse::PublicKey;
use crate::verify::{Failure, Policy, verify};
use std::fmt;

/// A parsed provenance policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeployPolicy {
    pub trusted: bool,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    pub workflow: Option<String>,
    /// Any of these; empty: any builder the server's keys sign for.
    pub builders: Vec<String>,
}

/// The checks a policy may list, as written.
pub const CHECKS: &[&str] = &["trusted", "repo=NAME", "ref=REF", "workflow=PATH", "builder=ID"];

impl DeployPolicy {
    /// Parse POLICY; `Ok(None)` for `none` or an empty one. The error says
    /// which item is wrong and why.
    pub fn parse(text: &str) -> Result<Option<DeployPolicy>, String> {
        let text = text.trim();
        if text.is_empty() || text == "none" {
            return Ok(None);
        }
        if text.len() > 4096 {
            return Err("a provenance policy is at most 4096 characters".into());
        }
        let mut p = DeployPolicy::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(format!("provenance policy `{text}`: an empty item (two commas, or a trailing one)"));
            }
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            };
            let key = if key == "repository" { "repo" } else { key };
            if key != "builder" && seen.contains(&key) {
                return Err(format!("provenance policy `{text}`: `{key}` is given twice"));
            }
            seen.push(key);
            let value = match (key, value) {
                ("trusted", None) => {
                    p.trusted = true;
                    continue;
                }
                ("trusted", Some(_)) => return Err("provenance check `trusted` takes no value".into()),
                ("repo" | "ref" | "workflow" | "builder", Some(v)) if !v.is_empty() => v,
                ("repo" | "ref" | "workflow" | "builder", _) => {
                    return Err(format!("provenance check `{key}` needs a value: `{key}=...`"));
                }
                _ => {
                    return Err(format!(
                        "unknown provenance check `{item}`; a policy is a comma-separated list of {} (or `none`)",
                        CHECKS.join(", ")
                    ));
                }
            };
            if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!("provenance check `{key}={value}`: no spaces in a value"));
            }
            match key {
                "repo" => p.repository = Some(value.to_string()),
                "ref" => {
                    if !value.starts_with("refs/") {
                        return Err(format!(
                            "provenance check `ref={value}`: give a full ref, e.g. `ref=refs/heads/{value}`"
                        ));
                    }
                    p.git_ref = Some(value.to_string());
                }
                "workflow" => p.workflow = Some(value.to_string()),
                _ => {
                    if !p.builders.iter().any(|b| b == value) {
                        p.builders.push(value.to_string());
                    }
                }
            }
        }
        Ok(Some(p))
    }
}

/// The canonical form (what is stored and shown): the checks in the
/// order of [`CHECKS`].
impl fmt::Display for DeployPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<String> = Vec::new();
        if self.trusted {
            items.push("trusted".into());
        }
        if let Some(r) = &self.repository {
            items.push(format!("repo={r}"));
        }
        if let Some(r) = &self.git_ref {
            items.push(format!("ref={r}"));
        }
        if let Some(w) = &self.workflow {
            items.push(format!("workflow={w}"));
        }
        for b in &self.builders {
            items.push(format!("builder={b}"));
        }
        write!(f, "{}", items.join(","))
    }
}

/// An artifact a deploy job would restore, refused by the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The failed check: a policy item's key (`trusted`, `repo`, `ref`,
    /// `workflow`, `builder`), or `provenance` (no statement), `signature`,
    /// `key`, `envelope`, `subject`, `digest`, `build type`, `external
    /// parameters`.
    pub check: &'static str,
    pub artifact: String,
    pub generation: String,
    pub detail: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "provenance check `{}` failed for artifact `{}` (generation {}): {}",
            self.check, self.artifact, self.generation, self.detail
        )
    }
}

/// Check the artifact `artifact` (generation `generation`, whose bytes hash
/// to `sha256`) against `policy`: its signed statement `envelope` (`None`:
/// it has none) must verify with `keys` and say what the policy requires.
pub fn check_artifact(
    policy: &DeployPolicy,
    artifact: &str,
    generation: &str,
    sha256: &str,
    envelope: Option<&[u8]>,
    keys: &[PublicKey],
) -> Result<(), Refusal> {
    let refusal = |check: &'static str, detail: String| Refusal {
        check,
        artifact: artifact.to_string(),
        generation: generation.to_string(),
        detail,
    };
    let Some(envelope) = envelope else {
        return Err(refusal("provenance", "it has no signed provenance statement".into()));
    };
    // The repository is checked only when the policy names one: take the
    // statement's own (once its signature holds) otherwise.
    let repository = match &policy.repository {
        Some(r) => r.clone(),
        None => match crate::verify::signed_statement(envelope, keys) {
            Ok(st) => st.predicate["buildDefinition"]["externalParameters"]["repository"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Err(e) => return Err(refusal(check_name(e.failure), e.message)),
        },
    };
    let verifier = Policy {
        repository,
        git_ref: policy.git_ref.clone(),
        workflow: policy.workflow.clone(),
        builders: policy.builders.clone(),
        allow_untrusted: !policy.trusted,
    };
    match verify(envelope, artifact, sha256, keys, &verifier) {
        Ok(_) => Ok(()),
        Err(e) if e.failure == Failure::Untrusted => {
            let trust = e.message.split('`').nth(1).unwrap_or("untrusted").to_string();
            Err(refusal("trusted", format!("built by a run with trust `{trust}`; the policy requires a trusted run")))
        }
        Err(e) => Err(refusal(check_name(e.failure), e.message)),
    }
}

/// A verifier failure named as the policy names its checks.
fn check_name(f: Failure) -> &'static str {
    match f {
        Failure::Repository => "repo",
        Failure::Ref => "ref",
        Failure::Workflow => "workflow",
        Failure::Untrusted => "trusted",
        Failure::Builder => "builder",
        other => other.check(),
    }
}

#[cfg(test)]
#[path = "deploy_tests.rs"]
mod tests;
