//! What `kiln verify` checks, in order, and the exit code of each failure:
//! the envelope's signature against the key set, the file's digest against
//! the statement's subject, then the policy — repository, ref, workflow,
//! trust, builder, build type and every external parameter recognised.
//! Each failure names the check and has its own exit code, so a script can
//! tell a tampered file from a wrong branch.

use crate::dsse::{self, DsseError, PublicKey};
use crate::statement::{BUILD_TYPE, EXTERNAL_PARAMETERS, SLSA_PROVENANCE_V1, STATEMENT_V1, Statement};

/// What the verifier requires.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The repository the artifact must come from (its name in Kiln).
    pub repository: String,
    /// The ref it must have been built from (`refs/heads/main`); `None`: any.
    pub git_ref: Option<String>,
    /// The workflow file that must have built it; `None`: any.
    pub workflow: Option<String>,
    /// Builder ids allowed; empty: any builder the key set signs for.
    pub builders: Vec<String>,
    /// Accept provenance of untrusted runs (fork pull requests): off by default.
    pub allow_untrusted: bool,
}

/// Which check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Not an envelope or not a statement Kiln writes.
    Malformed,
    /// Signed by no key of the key set.
    UnknownKey,
    /// A known key's signature does not match the envelope's bytes.
    BadSignature,
    /// The file's bytes are not the subject's (a changed byte).
    Digest,
    /// No subject of the statement is this artifact.
    Subject,
    Repository,
    Ref,
    Workflow,
    /// The run was untrusted (a fork's pull request).
    Untrusted,
    Builder,
    BuildType,
    /// An external parameter the verifier does not know.
    UnknownParameter,
    /// A Test Result statement that says tests failed.
    TestsFailed,
}

impl Failure {
    /// The CLI's exit code (documented in docs/supply-chain.md).
    pub fn exit_code(self) -> i32 {
        match self {
            Failure::Malformed => 10,
            Failure::UnknownKey => 11,
            Failure::BadSignature => 12,
            Failure::Digest => 13,
            Failure::Subject => 14,
            Failure::Repository => 15,
            Failure::Ref => 16,
            Failure::Workflow => 17,
            Failure::Untrusted => 18,
            Failure::Builder => 19,
            Failure::BuildType => 20,
            Failure::UnknownParameter => 21,
            Failure::TestsFailed => 22,
        }
    }

    pub fn check(self) -> &'static str {
        match self {
            Failure::Malformed => "envelope",
            Failure::UnknownKey => "key",
            Failure::BadSignature => "signature",
            Failure::Digest => "digest",
            Failure::Subject => "subject",
            Failure::Repository => "repository",
            Failure::Ref => "ref",
            Failure::Workflow => "workflow",
            Failure::Untrusted => "trust",
            Failure::Builder => "builder",
            Failure::BuildType => "build type",
            Failure::UnknownParameter => "external parameters",
            Failure::TestsFailed => "test result",
        }
    }
}

/// A failed verification: the check and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub failure: Failure,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} check failed: {}", self.failure.check(), self.message)
    }
}

fn refuse(failure: Failure, message: impl Into<String>) -> Refused {
    Refused { failure, message: message.into() }
}

/// What a verified statement says.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub statement: Statement,
    pub subject: String,
    pub builder: String,
    pub executor: String,
    pub commit: String,
    pub run: String,
}

/// The in-toto statement an envelope (its JSON bytes) carries, once its
/// signature verified with one of `keys`.
pub(crate) fn signed_statement(envelope: &[u8], keys: &[PublicKey]) -> Result<Statement, Refused> {
    let env = dsse::parse(envelope).map_err(|e| refuse(Failure::Malformed, e.to_string()))?;
    let payload = dsse::verify(&env, dsse::IN_TOTO, keys).map_err(|e| match e {
        DsseError::Malformed(_) => refuse(Failure::Malformed, e.to_string()),
        DsseError::UnknownKey(_) => {
            refuse(Failure::UnknownKey, format!("{e} (export the server's keys with `kiln keys export`)"))
        }
        DsseError::BadSignature(_) => refuse(Failure::BadSignature, e.to_string()),
    })?;
    serde_json::from_slice(&payload).map_err(|e| refuse(Failure::Malformed, format!("not an in-toto statement: {e}")))
}

/// Verify `envelope` (its JSON bytes) for an artifact named `name` whose
/// bytes hash to `sha256_hex`, with `keys`, under `policy`.
pub fn verify(
    envelope: &[u8],
    name: &str,
    sha256_hex: &str,
    keys: &[PublicKey],
    policy: &Policy,
) -> Result<Verified, Refused> {
    let st = signed_statement(envelope, keys)?;
    if st.statement_type != STATEMENT_V1 || st.predicate_type != SLSA_PROVENANCE_V1 {
        return Err(refuse(
            Failure::Malformed,
            format!("a `{}` statement of `{}`; expected SLSA provenance v1", st.statement_type, st.predicate_type),
        ));
    }
    // The subject: this artifact, these bytes.
    let named: Vec<&crate::statement::Subject> = st.subject.iter().filter(|s| s.name == name).collect();
    if named.is_empty() {
        let names: Vec<&str> = st.subject.iter().map(|s| s.name.as_str()).collect();
        return Err(refuse(Failure::Subject, format!("the statement is about {names:?}, not `{name}`")));
    }
    if !named.iter().any(|s| s.digest.get("sha256").is_some_and(|d| d.eq_ignore_ascii_case(sha256_hex))) {
        let attested = named[0].digest.get("sha256").cloned().unwrap_or_default();
        return Err(refuse(
            Failure::Digest,
            format!("the file's sha256 is {sha256_hex}, the attested `{name}` is {attested}: its bytes changed"),
        ));
    }
    let p = &st.predicate;
    let def = &p["buildDefinition"];
    let ext = &def["externalParameters"];
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    if text(&ext["repository"]) != policy.repository {
        return Err(refuse(
            Failure::Repository,
            format!("built from repository `{}`, expected `{}`", text(&ext["repository"]), policy.repository),
        ));
    }
    if let Some(want) = &policy.git_ref
        && text(&ext["ref"]) != *want
    {
        return Err(refuse(Failure::Ref, format!("built from ref `{}`, expected `{want}`", text(&ext["ref"]))));
    }
    if let Some(want) = &policy.workflow
        && text(&ext["workflow"]["path"]) != *want
    {
        return Err(refuse(
            Failure::Workflow,
            format!("built by workflow `{}`, expected `{want}`", text(&ext["workflow"]["path"])),
        ));
    }
    let internal = &def["internalParameters"];
    let trust = text(&internal["trust"]);
    if trust != "trusted" && !policy.allow_untrusted {
        return Err(refuse(
            Failure::Untrusted,
            format!(
                "built by a run with trust `{trust}` (e.g. a fork's pull request); refused unless --allow-untrusted"
            ),
        ));
    }
    let builder = text(&p["runDetails"]["builder"]["id"]);
    if !policy.builders.is_empty() && !policy.builders.contains(&builder) {
        return Err(refuse(Failure::Builder, format!("built by `{builder}`, not one of {:?}", policy.builders)));
    }
    if text(&def["buildType"]) != BUILD_TYPE {
        return Err(refuse(
            Failure::BuildType,
            format!("build type `{}` is not `{BUILD_TYPE}`", text(&def["buildType"])),
        ));
    }
    let Some(params) = ext.as_object() else {
        return Err(refuse(Failure::Malformed, "no external parameters"));
    };
    if let Some(unknown) = params.keys().find(|k| !EXTERNAL_PARAMETERS.contains(&k.as_str())) {
        return Err(refuse(
            Failure::UnknownParameter,
            format!("external parameter `{unknown}` is not one this verifier knows ({EXTERNAL_PARAMETERS:?})"),
        ));
    }
    Ok(Verified {
        subject: name.to_string(),
        builder,
        executor: text(&internal["executor"]),
        commit: text(&ext["commit"]),
        run: text(&internal["run"]),
        statement: st,
    })
}

/// What a verified Test Result statement says.
#[derive(Debug, Clone, PartialEq)]
pub struct TestVerdict {
    /// `PASSED` or `WARNED` (quarantined failures).
    pub result: String,
    pub passed: usize,
    pub warned: usize,
    /// The subject whose sha256 is the file's.
    pub subject: String,
}

/// Verify a Test Result `envelope` for bytes hashing to `sha256_hex`: the
/// signature with `keys`, the statement's type, a subject with this
/// digest, the repository (`repository`) its configuration names, and that
/// the tests passed (`PASSED`, or `WARNED`: only quarantined failures).
pub fn verify_test_result(
    envelope: &[u8],
    sha256_hex: &str,
    keys: &[PublicKey],
    repository: &str,
) -> Result<TestVerdict, Refused> {
    use crate::statement::TEST_RESULT_V01;
    let st = signed_statement(envelope, keys)?;
    if st.statement_type != STATEMENT_V1 || st.predicate_type != TEST_RESULT_V01 {
        return Err(refuse(
            Failure::Malformed,
            format!("a `{}` statement of `{}`; expected a test result", st.statement_type, st.predicate_type),
        ));
    }
    let Some(subject) =
        st.subject.iter().find(|s| s.digest.get("sha256").is_some_and(|d| d.eq_ignore_ascii_case(sha256_hex)))
    else {
        let names: Vec<&str> = st.subject.iter().map(|s| s.name.as_str()).collect();
        return Err(refuse(
            Failure::Digest,
            format!("the file's sha256 is {sha256_hex}; the tests ran on {names:?}, none with these bytes"),
        ));
    };
    let p = &st.predicate;
    let uri = p["configuration"][0]["uri"].as_str().unwrap_or_default();
    if uri.strip_prefix("git+").and_then(|r| r.rsplit_once('@')).is_none_or(|(r, _)| r != repository) {
        return Err(refuse(Failure::Repository, format!("tests of `{uri}`, expected repository `{repository}`")));
    }
    let count = |k: &str| p[k].as_array().map_or(0, Vec::len);
    let result = p["result"].as_str().unwrap_or_default().to_string();
    if result != "PASSED" && result != "WARNED" {
        let failed: Vec<&str> =
            p["failedTests"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).take(5).collect();
        return Err(refuse(
            Failure::TestsFailed,
            format!("the tests on these bytes say {result}: {} failed (first: {failed:?})", count("failedTests")),
        ));
    }
    Ok(TestVerdict {
        result,
        passed: count("passedTests"),
        warned: count("warnedTests"),
        subject: subject.name.clone(),
    })
}
