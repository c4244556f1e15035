//! in-toto Statement v1 with the SLSA Provenance v1 predicate (and the
//! Test Result predicate), built from facts the server decided and froze —
//! never from what a step reported.
//!
//! `buildType` [`BUILD_TYPE`] is Kiln's (its schema: `docs/supply-chain.md`):
//!
//! - `externalParameters` (what a user of the build controls; a verifier
//!   checks every one): `repository`, `ref`, `commit`, `workflow` {`path`,
//!   `sha256`}, `event`, `inputs`;
//! - `internalParameters` (Kiln's own, informational): `run`, `run_number`,
//!   `job`, `matrix`, `epoch`, `trust`, `executor`, `pool`;
//! - `resolvedDependencies`: the git commit, every image and service by
//!   digest, every restored artifact by sha256 (with the run and job that
//!   produced it) and every cache used by key.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";
pub const SLSA_PROVENANCE_V1: &str = "https://slsa.dev/provenance/v1";
pub const TEST_RESULT_V01: &str = "https://in-toto.io/attestation/test-result/v0.1";
/// A directory artifact's second subject is `<name>/` this: the manifest at
/// the head of its archive (every file's path, mode, size and sha256).
pub const MANIFEST_SUBJECT: &str = ".kiln-cache/manifest.json";
/// Kiln's build type: one job of a frozen workflow run.
pub const BUILD_TYPE: &str = "https://kiln.dev/build-types/workflow-job/v1";
/// The external parameters [`BUILD_TYPE`] defines; a statement with any
/// other is refused by the verifier (SLSA's verification guide: an
/// unrecognised external parameter fails).
pub const EXTERNAL_PARAMETERS: &[&str] = &["repository", "ref", "commit", "workflow", "event", "inputs"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

impl Subject {
    pub fn sha256(name: &str, hex: &str) -> Subject {
        Subject { name: name.to_string(), digest: BTreeMap::from([("sha256".to_string(), hex.to_string())]) }
    }
}

/// A resolved dependency (SLSA ResourceDescriptor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub uri: String,
    pub digest: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Everything a job's provenance says, as the server froze and decided it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildFacts {
    pub repository: String,
    pub git_ref: Option<String>,
    pub commit: String,
    pub workflow_path: String,
    pub workflow_sha256: String,
    pub event: String,
    pub inputs: BTreeMap<String, String>,
    pub run: String,
    pub run_number: i64,
    pub job: String,
    pub matrix: BTreeMap<String, String>,
    pub epoch: i64,
    pub trust: String,
    /// `container` or `host`.
    pub executor: String,
    pub pool: String,
    pub dependencies: Vec<Dependency>,
    /// `<public-url>/builders/<pool>`.
    pub builder_id: String,
    pub kiln_version: String,
    /// The attempt: `<run>/<job id>/<epoch>`.
    pub invocation_id: String,
    /// RFC 3339.
    pub started_on: String,
    pub finished_on: String,
}

/// The SLSA Provenance v1 statement of `subjects` built as `facts` say.
pub fn provenance(subjects: Vec<Subject>, facts: &BuildFacts) -> Statement {
    let predicate = serde_json::json!({
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "repository": facts.repository,
                "ref": facts.git_ref,
                "commit": facts.commit,
                "workflow": { "path": facts.workflow_path, "sha256": facts.workflow_sha256 },
                "event": facts.event,
                "inputs": facts.inputs,
            },
            "internalParameters": {
                "run": facts.run,
                "run_number": facts.run_number,
                "job": facts.job,
                "matrix": facts.matrix,
                "epoch": facts.epoch,
                "trust": facts.trust,
                "executor": facts.executor,
                "pool": facts.pool,
            },
            "resolvedDependencies": facts.dependencies,
        },
        "runDetails": {
            "builder": {
                "id": facts.builder_id,
                "version": { "kiln": facts.kiln_version, "executor": facts.executor },
            },
            "metadata": {
                "invocationId": facts.invocation_id,
                "startedOn": facts.started_on,
                "finishedOn": facts.finished_on,
            },
        },
    });
    Statement {
        statement_type: STATEMENT_V1.into(),
        subject: subjects,
        predicate_type: SLSA_PROVENANCE_V1.into(),
        predicate,
    }
}

/// The Test Result statement of a job with test reports: over the
/// artifacts it restored (`subjects`), which tests passed and failed.
pub fn test_result(
    subjects: Vec<Subject>,
    facts: &BuildFacts,
    passed: Vec<String>,
    warned: Vec<String>,
    failed: Vec<String>,
) -> Statement {
    let result = if !failed.is_empty() {
        "FAILED"
    } else if !warned.is_empty() {
        "WARNED"
    } else {
        "PASSED"
    };
    let predicate = serde_json::json!({
        "result": result,
        "configuration": [{
            "name": facts.workflow_path,
            "uri": format!("git+{}@{}", facts.repository, facts.commit),
            "digest": { "sha256": facts.workflow_sha256 },
        }],
        "url": facts.invocation_id,
        "passedTests": passed,
        "warnedTests": warned,
        "failedTests": failed,
    });
    Statement {
        statement_type: STATEMENT_V1.into(),
        subject: subjects,
        predicate_type: TEST_RESULT_V01.into(),
        predicate,
    }
}

/// The statement as the bytes that are signed (compact JSON).
pub fn to_bytes(s: &Statement) -> Vec<u8> {
    serde_json::to_vec(s).expect("a statement serializes")
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC
/// (`2026-12-06T10:00:00.123Z`).
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms.rem_euclid(1000))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        assert_eq!(super::rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339_ms(1_796_578_652_825), "2026-12-06T17:37:32.825Z");
        assert_eq!(super::rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
