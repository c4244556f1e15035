//! The JSON shapes of the public and agent APIs, pinned as snapshots
//! (`tests/snapshots/*.snap`): a renamed field, a changed status string or
//! a field that stops being skipped when empty fails here. Agents, CLIs and
//! servers of different versions talk to each other (ARCHITECTURE.md: wire
//! types change compatibly), so a snapshot changes only deliberately, with
//! the contract.
//!
//! Each value is built from representative data: every status-like field
//! set, optional fields both present and absent.

use kiln_api::logs::{event, stream};
use kiln_api::*;
use std::collections::BTreeMap;

fn committed() -> BTreeMap<String, i64> {
    BTreeMap::from([(stream::STDOUT.to_string(), 1024), (stream::STDERR.to_string(), 12)])
}

fn run() -> Run {
    Run {
        id: "run-0192".into(),
        repo: "demo".into(),
        number: 7,
        workflow: "ci".into(),
        commit_title: Some("Fix the build".into()),
        pull_request: None,
        status: RunStatus::Running,
        commit_sha: "3f2c1e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e".into(),
        event: "push".into(),
        git_ref: Some("refs/heads/main".into()),
        trust: "trusted".into(),
        actor: Some("dev".into()),
        commit_url: None,
        commit: None,
        trace_id: None,
        priority: "normal".into(),
        team: "default".into(),
        workflow_path: DEFAULT_WORKFLOW_PATH.into(),
        workflow_hash: "sha256:0c5e".into(),
        inputs: BTreeMap::from([("target".to_string(), "release".to_string())]),
        parent_run_id: None,
        cancel_version: 0,
        created_at_ms: 1_764_590_000_000,
        finished_at_ms: None,
        message: None,
        jobs: vec![
            Job {
                id: "job-1".into(),
                name: "build".into(),
                index: 0,
                status: JobStatus::Success,
                current_epoch: 2,
                image_digest: Some("sha256:aa11".into()),
                needs: vec![],
                attempts: vec![
                    Attempt {
                        epoch: 1,
                        runner: "session-a".into(),
                        outcome: AttemptOutcome::Lost,
                        exit_code: None,
                        message: Some("lease expired".into()),
                        started_at_ms: 1_764_590_000_100,
                        finished_at_ms: Some(1_764_590_030_100),
                        steps: vec![],
                        failure_class: Some("agent_lost".into()),
                        released_at_ms: Some(1_764_590_090_000),
                        release: Some("its agent started again and removed what its previous process left".into()),
                        cleanup_error: None,
                    },
                    Attempt {
                        epoch: 2,
                        runner: "session-b".into(),
                        outcome: AttemptOutcome::Success,
                        exit_code: Some(0),
                        message: None,
                        started_at_ms: 1_764_590_030_200,
                        finished_at_ms: Some(1_764_590_031_000),
                        failure_class: None,
                        released_at_ms: Some(1_764_590_031_000),
                        release: Some("every process group of the job's steps was killed".into()),
                        cleanup_error: None,
                        steps: vec![
                            StepResult {
                                name: "compile".into(),
                                outcome: "success".into(),
                                duration_ms: Some(640),
                                message: None,
                            },
                            StepResult {
                                name: "upload docs".into(),
                                outcome: "skipped".into(),
                                duration_ms: None,
                                message: Some("`if: branch == 'main'` is false".into()),
                            },
                        ],
                    },
                ],
                artifacts: vec![Artifact {
                    name: "app".into(),
                    size: 4096,
                    sha256: "9f86d0".into(),
                    epoch: 2,
                    kind: "archive".into(),
                    expires_at: Some(1_700_000_000_000),
                    expired: false,
                }],
                cache: Some(CacheInfo {
                    key: "cargo-linux-x86_64-v1".into(),
                    result: "hit".into(),
                    ..Default::default()
                }),
                message: None,
                waiting: None,
                started_at_ms: Some(1_764_590_000_100),
                finished_at_ms: Some(1_764_590_031_000),
                outputs: BTreeMap::from([("version".into(), "1.2.3".into())]),
                environment: None,
            },
            Job {
                id: "job-2".into(),
                name: "test".into(),
                index: 1,
                status: JobStatus::Running,
                current_epoch: 1,
                image_digest: None,
                needs: vec!["build".into()],
                attempts: vec![Attempt {
                    epoch: 1,
                    runner: "session-b".into(),
                    outcome: AttemptOutcome::Running,
                    exit_code: None,
                    message: None,
                    started_at_ms: 1_764_590_031_100,
                    finished_at_ms: None,
                    steps: vec![],
                    failure_class: None,
                    released_at_ms: None,
                    release: None,
                    cleanup_error: None,
                }],
                artifacts: vec![],
                cache: None,
                message: None,
                waiting: None,
                started_at_ms: Some(1_764_590_031_100),
                finished_at_ms: None,
                outputs: BTreeMap::new(),
                environment: Some("production".into()),
            },
        ],
    }
}

#[test]
fn run_with_jobs_attempts_and_artifacts() {
    insta::assert_json_snapshot!("run", run());
}

#[test]
fn run_summary_list() {
    let list = RunList {
        runs: vec![
            RunSummary {
                id: "run-0193".into(),
                short_id: None,
                repo: "demo".into(),
                number: 8,
                workflow: "ci".into(),
                commit_title: Some("Fix the build".into()),
                pull_request: None,
                workflow_path: ".kiln/workflows/ci.yml".into(),
                status: RunStatus::Cancelling,
                commit_sha: "3f2c1e0d".into(),
                event: "manual".into(),
                git_ref: None,
                trust: "trusted".into(),
                actor: Some("dev".into()),
                created_at_ms: 1_764_590_100_000,
                finished_at_ms: None,
            },
            RunSummary {
                id: "run-0192".into(),
                short_id: None,
                repo: "demo".into(),
                number: 7,
                workflow: "ci".into(),
                commit_title: None,
                pull_request: Some(PullRequestRef { number: 7, title: "Add caching".into() }),
                workflow_path: ".kiln/workflows/ci.yml".into(),
                status: RunStatus::Failed,
                commit_sha: "3f2c1e0d".into(),
                event: "pull_request".into(),
                git_ref: Some("refs/pull/7/head".into()),
                trust: "untrusted".into(),
                actor: Some("dev".into()),
                created_at_ms: 1_764_590_000_000,
                finished_at_ms: Some(1_764_590_060_000),
            },
        ],
        next_before: None,
    };
    insta::assert_json_snapshot!("run_list", list);
}

#[test]
fn job() {
    insta::assert_json_snapshot!("job", run().jobs.remove(0));
}

/// Issue 41, item 3: a job not started says why (`waiting`); a submission's
/// 202 carries what it was accepted despite (`warnings`).
#[test]
fn a_waiting_job_and_acceptance_warnings() {
    let mut waiting = run().jobs.remove(1);
    waiting.status = JobStatus::Ready;
    waiting.current_epoch = 0;
    waiting.attempts = vec![];
    waiting.started_at_ms = None;
    waiting.waiting =
        Some("waiting: no connected agent has labels {os: ubuntu-latest}; agents: local-1 {os: linux}".into());
    insta::assert_json_snapshot!("waiting_job", waiting);
    let accepted = SubmitRunResponse {
        run_id: "run-0192".into(),
        warnings: vec![
            "job `build` needs an agent with labels {os: ubuntu-latest}, and no registered agent has them \
                        (registered agents have: {os: linux} (local-1)); the run waits until one connects (`kiln \
                        agent --labels os=ubuntu-latest`), or change `runs-on`"
                .into(),
        ],
    };
    insta::assert_json_snapshot!("submit_response", accepted);
    let older: SubmitRunResponse = serde_json::from_str(r#"{"run_id": "run-0192"}"#).unwrap();
    assert!(older.warnings.is_empty(), "an older server's 202 has no warnings");
}

#[test]
fn attempt() {
    insta::assert_json_snapshot!("attempt", run().jobs[0].attempts[0].clone());
}

fn assignment() -> Assignment {
    Assignment {
        run_id: "run-0192".into(),
        job_id: "job-2".into(),
        job_name: "test".into(),
        epoch: 1,
        repo: "demo".into(),
        clone_url: "https://git.example/demo.git".into(),
        clone_credential: None,
        commit_sha: "3f2c1e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e".into(),
        steps: vec![
            StepSpec { name: Some("unit".into()), run: "cargo test".into(), ..Default::default() },
            StepSpec { name: None, run: "./smoke.sh".into(), ..Default::default() },
        ],
        env: BTreeMap::from([("RUST_LOG".to_string(), "info".to_string())]),
        timeout_secs: Some(600),
        hang_after_secs: Some(1800),
        hang_kill_after_secs: Some(7200),
        image: Some("rust:1.94".into()),
        image_digest: Some("sha256:bb22".into()),
        image_error: None,
        image_build: Some(ImageBuild { dockerfile: "ci/Dockerfile".into(), context: "ci".into() }),
        build_registry: None,
        size: Some("large".into()),
        publish: vec![PublishSpec { name: "report".into(), path: "target/report.xml".into() }],
        restore: vec![RestoreSpec { from_job: "build".into(), name: "app".into(), path: "bin/app".into() }],
        lease_ttl_ms: 30_000,
        heartbeat_interval_ms: 10_000,
        secrets: BTreeMap::from([("DEPLOY_KEY".to_string(), "s3cr3t".to_string())]),
        attempt_token: "kiln_a1.6b1f".into(),
        cache: None,
        services: vec![],
        outputs: vec![],
        reports: None,
        quarantine: vec![],
        shard_token: String::new(),
        traceparent: None,
        checkout: None,
        trusted: false,
    }
}

#[test]
fn assignment_and_claim_response() {
    insta::assert_json_snapshot!("assignment", assignment());
    // Secrets are skipped when there are none (untrusted runs get none).
    let mut bare = assignment();
    bare.secrets.clear();
    insta::assert_json_snapshot!("claim_response", ClaimResponse { assignment: Some(bare) });
    insta::assert_json_snapshot!("claim_response_empty", ClaimResponse { assignment: None });
}

#[test]
fn heartbeat_completion_and_ack() {
    insta::assert_json_snapshot!(
        "heartbeat_response",
        HeartbeatResponse { cancel_requested: true, lease_ttl_ms: 30_000 }
    );
    let completion = Completion {
        outcome: AttemptOutcome::Failed,
        exit_code: Some(101),
        message: Some("step `unit` exited with 101".into()),
        infra_failure: false,
        failure_class: None,
        outputs: Default::default(),
        steps: Default::default(),
        telemetry: None,
        sandbox: None,
        quarantined: Vec::new(),
        reports_staged: None,
    };
    insta::assert_json_snapshot!("completion", completion);
    insta::assert_json_snapshot!("completion_ack", CompletionAck { job_status: JobStatus::Ready });
}

#[test]
fn log_chunk_and_ack() {
    let chunk = LogChunk {
        stream: stream::STDOUT.into(),
        seq: 3,
        offset: 1024,
        data: "aGVsbG8K".into(),
        sha256: Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03".into()),
        crc32c: None,
        in_order: false,
    };
    insta::assert_json_snapshot!("log_chunk", chunk);
    // Since 2026-12-05 a chunk may carry a CRC-32C instead: the field is
    // added, the digest left out, nothing else changes.
    let crc_only = LogChunk { sha256: None, crc32c: Some(kiln_api::log_crc32c(b"hello\n")), ..chunk };
    let v = serde_json::to_value(&crc_only).unwrap();
    assert_eq!(v["crc32c"], "353dd8be");
    assert!(v.get("sha256").is_none(), "{v}");
    let back: LogChunk = serde_json::from_value(v).unwrap();
    assert_eq!((back.sha256, back.crc32c.as_deref()), (None, Some("353dd8be")));
}

/// CRC-32C, not the zlib CRC-32: the standard check value of "123456789".
#[test]
fn log_crc32c_is_castagnoli() {
    assert_eq!(kiln_api::log_crc32c(b"123456789"), "e3069283");
    assert_eq!(kiln_api::log_crc32c(b""), "00000000");
    insta::assert_json_snapshot!("log_ack", LogAck { committed: committed() });
}

/// The SSE feed's payloads, by event name (`chunk`, `sealed`, `gap`, `end`).
#[test]
fn log_events() {
    let events: Vec<(&str, serde_json::Value)> = vec![
        (
            event::CHUNK,
            serde_json::to_value(LogEvent {
                epoch: 2,
                stream: stream::STDERR.into(),
                offset: 0,
                data: "d2Fybgo=".into(),
                at_ms: None,
            })
            .unwrap(),
        ),
        (
            event::SEALED,
            serde_json::to_value(LogSealed { epoch: 2, outcome: AttemptOutcome::Success, committed: committed() })
                .unwrap(),
        ),
        (
            event::GAP,
            serde_json::to_value(LogGap { epoch: 1, reason: "agent lost".into(), committed: committed() }).unwrap(),
        ),
        (event::END, serde_json::to_value(LogEnd { status: JobStatus::Success }).unwrap()),
    ];
    let by_name: BTreeMap<&str, serde_json::Value> = events.into_iter().collect();
    insta::assert_json_snapshot!("log_events", by_name);
}

#[test]
fn artifacts_and_errors() {
    insta::assert_json_snapshot!(
        "sealed_generation",
        SealedGeneration {
            generation_id: "gen-7".into(),
            name: "app".into(),
            size: 4096,
            sha256: "9f86d0".into(),
            state: GenerationState::Sealed,
        }
    );
    insta::assert_json_snapshot!(
        "error",
        ErrorBody {
            error: ErrorDetail {
                code: codes::STALE_EPOCH.into(),
                message: "job job-2 epoch 1 is not the current live attempt".into(),
            },
        }
    );
}

/// Forward compatibility: a status this build does not know (a newer
/// server's) parses as `Unknown` and is written back unchanged, in every
/// status-carrying type.
#[test]
fn unknown_statuses_round_trip() {
    let mut v = serde_json::to_value(run()).unwrap();
    v["status"] = "paused".into();
    v["jobs"][0]["status"] = "waiting_for_approval".into();
    v["jobs"][0]["attempts"][0]["outcome"] = "preempted".into();
    let parsed: Run = serde_json::from_value(v.clone()).expect("an older client parses a newer server's run");
    assert_eq!(parsed.status, RunStatus::Unknown("paused".into()));
    assert_eq!(parsed.jobs[0].status, JobStatus::Unknown("waiting_for_approval".into()));
    assert_eq!(parsed.jobs[0].attempts[0].outcome, AttemptOutcome::Unknown("preempted".into()));
    assert!(!parsed.status.is_terminal() && !parsed.jobs[0].status.is_terminal());
    assert_eq!(serde_json::to_value(&parsed).unwrap(), v, "written back unchanged");

    let end: LogEnd = serde_json::from_str(r#"{"status":"archived"}"#).unwrap();
    assert_eq!(end.status.as_str(), "archived");
    assert_eq!(serde_json::to_string(&end).unwrap(), r#"{"status":"archived"}"#);
    let g: GenerationState = serde_json::from_str(r#""quarantined""#).unwrap();
    assert_eq!(g, GenerationState::Unknown("quarantined".into()));
    assert_eq!(serde_json::to_string(&g).unwrap(), r#""quarantined""#);
}

/// Each wire status is the kiln-core status of the same name, string for
/// string, both ways; `Unknown` has no core status.
#[test]
fn wire_statuses_match_the_core_state_machines() {
    for s in kiln_core::RunStatus::ALL {
        let w = RunStatus::from(*s);
        assert_eq!(w.as_str(), s.as_str());
        assert_eq!(RunStatus::parse(s.as_str()), w);
        assert_eq!(kiln_core::RunStatus::try_from(w), Ok(*s));
    }
    for s in kiln_core::JobStatus::ALL {
        let w = JobStatus::from(*s);
        assert_eq!(w.as_str(), s.as_str());
        assert_eq!(w.is_terminal(), s.is_terminal(), "{s}");
        assert_eq!(kiln_core::JobStatus::try_from(w), Ok(*s));
    }
    for s in kiln_core::AttemptOutcome::ALL {
        let w = AttemptOutcome::from(*s);
        assert_eq!(w.as_str(), s.as_str());
        assert_eq!(w.is_terminal(), s.is_terminal(), "{s}");
        assert_eq!(kiln_core::AttemptOutcome::try_from(w), Ok(*s));
    }
    for s in kiln_core::RunStatus::ALL {
        assert_eq!(RunStatus::from(*s).is_terminal(), s.is_terminal(), "{s}");
    }
    assert_eq!(RunStatus::KNOWN.len(), kiln_core::RunStatus::ALL.len());
    assert_eq!(JobStatus::KNOWN.len(), kiln_core::JobStatus::ALL.len());
    assert_eq!(AttemptOutcome::KNOWN.len(), kiln_core::AttemptOutcome::ALL.len());
    // The server refuses an unknown completion outcome with kiln-core's message.
    assert_eq!(
        kiln_core::AttemptOutcome::try_from(AttemptOutcome::parse("done")),
        Err("unknown AttemptOutcome `done`".to_string())
    );
    assert_eq!("done".parse::<kiln_core::AttemptOutcome>().unwrap_err(), "unknown AttemptOutcome `done`");
}

/// The CLI prints statuses in aligned columns.
#[test]
fn display_pads() {
    assert_eq!(format!("[{:<10}]", JobStatus::Running), "[running   ]");
    assert_eq!(format!("[{:<10}]", JobStatus::Unknown("new".into())), "[new       ]");
}

/// Issue 16, changed compatibly: what an older server or agent sends
/// (no `kind`, no expiry) reads as a file that never expires, and a file's
/// upload session is sent exactly as before (no `kind` key).
#[test]
fn artifact_kind_and_expiry_default_for_older_peers() {
    let a: Artifact = serde_json::from_str(r#"{"name":"app","size":1,"sha256":"ab","epoch":1}"#).unwrap();
    assert_eq!((a.kind.as_str(), a.expires_at, a.expired), ("file", None, false));
    let d: kiln_api::ArtifactDownload = serde_json::from_str(
        r#"{"name":"app","job":"build","epoch":1,"size":1,"sha256":"ab","url":"u","expires_at_ms":0}"#,
    )
    .unwrap();
    assert_eq!(d.kind, "file");
    let up = kiln_api::CreateUpload { name: "app".into(), size: 1, sha256: None, kind: None };
    assert_eq!(serde_json::to_string(&up).unwrap(), r#"{"name":"app","size":1}"#);
    assert_eq!(kiln_api::codes::EXPIRED, "expired");
}
