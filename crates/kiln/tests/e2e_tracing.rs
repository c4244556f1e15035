//! Traces end to end (issue 19): a real `kiln server` and `kiln agent`
//! with `--log-format json --otlp-endpoint` against the test kit's OTLP
//! receiver. A run submitted with a W3C `traceparent` carries its trace id
//! through the claim to the agent and back with the completion: the id is
//! in the run's API view, in the JSON log lines of both processes for that
//! run, and in the exported spans, which form the tree trigger → accept →
//! claim → attempt → {prepare, steps, upload, complete} across the two
//! processes. Over OTLP/HTTP and over OTLP/gRPC.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use kiln_testkit::{KilnServer, TestRepo, wait_run};
use serde_json::Value;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - echo one > out.txt
      - echo two
    artifacts:
      publish:
        - {name: out, path: out.txt}
"#;

fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Start a server and an agent exporting to `rx` over `protocol`.
fn start(rx: &OtlpReceiver, protocol: &str) -> (KilnServer, kiln_testkit::KilnAgent) {
    let url = if protocol == "grpc" { &rx.grpc_url } else { &rx.http_url };
    let flags = ["--log-format", "json", "--otlp-endpoint", url.as_str(), "--otlp-protocol", protocol];
    let server = KilnServer::start_env(BIN.as_ref(), &flags, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]).unwrap();
    let agent = server.agent("tracer", &flags).unwrap();
    (server, agent)
}

fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span: {spans:#?}");
    found[0]
}

/// The span tree of one run, checked across server and agent.
fn check_tree(spans: &[ReceivedSpan], trace: &str, submitter_parent: &str, transport: &str) {
    let spans: Vec<ReceivedSpan> = spans.iter().filter(|s| s.trace_id == trace).cloned().collect();
    let trigger = one(&spans, "trigger");
    let accept = one(&spans, "accept");
    let claim = one(&spans, "claim");
    let attempt = one(&spans, "attempt");
    let prepare = one(&spans, "prepare");
    let upload = one(&spans, "upload");
    let complete = one(&spans, "complete");
    let steps: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "step").collect();
    assert_eq!(steps.len(), 2, "a span per step: {spans:#?}");
    assert_eq!(trigger.parent_span_id, submitter_parent, "the trigger is the submitter's child");
    for (child, parent) in [(accept, trigger), (claim, accept), (attempt, claim), (prepare, attempt), (upload, attempt)]
    {
        assert_eq!(
            child.parent_span_id, parent.span_id,
            "`{}` is a child of `{}`: {spans:#?}",
            child.name, parent.name
        );
    }
    for s in &steps {
        assert_eq!(s.parent_span_id, attempt.span_id, "steps are children of the attempt");
    }
    assert_eq!(complete.parent_span_id, attempt.span_id, "the server's completion is the agent's attempt's child");
    for s in [trigger, accept, claim, complete] {
        assert_eq!(s.service, "kiln-server", "{s:?}");
    }
    for s in [attempt, prepare, upload, steps[0], steps[1]] {
        assert_eq!(s.service, "kiln-agent", "{s:?}");
    }
    assert!(spans.iter().all(|s| s.transport == transport), "{spans:#?}");
    assert_eq!(claim.attributes.get("epoch").map(String::as_str), Some("1"), "{claim:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_submitted_trace_id_is_in_both_processes_json_logs_and_spans() {
    let rx = OtlpReceiver::start().await.unwrap();
    let (server, agent) = start(&rx, "http");
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW)]).unwrap();
    server.add_repo("traced", &repo);
    let c = Client::new(&server.url, &server.token).with_traceparent(&format!("00-{TRACE}-{PARENT}-01"));
    let run =
        c.submit_run("traced", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(done.status, "success", "{}\n{}", server.log(), agent.log());
    assert_eq!(done.trace_id.as_deref(), Some(TRACE), "the run's view names its trace");
    let job_id = done.jobs[0].id.clone();

    // The server's lines for the run: acceptance, claim and completion all
    // carry the trace id, with the run's or job's ids beside it.
    let server_lines = json_lines(&server.log());
    let traced = |lines: &[Value], message: &str| -> Value {
        lines
            .iter()
            .find(|l| l["fields"]["message"] == message && l["trace_id"] == TRACE)
            .cloned()
            .unwrap_or_else(|| panic!("no `{message}` line with trace_id {TRACE}"))
    };
    assert_eq!(traced(&server_lines, "accepted")["run_id"], run.run_id.as_str());
    let claimed = traced(&server_lines, "claimed");
    assert_eq!(
        (claimed["run_id"].as_str(), claimed["job_id"].as_str()),
        (Some(run.run_id.as_str()), Some(job_id.as_str()))
    );
    assert_eq!(claimed["epoch"], 1);
    let completed = traced(&server_lines, "completed");
    assert_eq!((completed["job_id"].as_str(), completed["epoch"].as_i64()), (Some(job_id.as_str()), Some(1)));

    // The agent's lines about the attempt carry the same ids.
    let agent_lines = json_lines(&agent.log());
    let attempt_lines: Vec<&Value> = agent_lines.iter().filter(|l| l["job_id"] == job_id.as_str()).collect();
    assert!(!attempt_lines.is_empty(), "{}", agent.log());
    for l in &attempt_lines {
        assert_eq!(
            (l["trace_id"].as_str(), l["run_id"].as_str(), l["epoch"].as_i64()),
            (Some(TRACE), Some(run.run_id.as_str()), Some(1)),
            "{l}"
        );
    }

    let spans = rx
        .wait_for(Duration::from_secs(30), |s| {
            ["trigger", "accept", "claim", "attempt", "prepare", "upload", "complete"]
                .iter()
                .all(|n| s.iter().any(|x| x.trace_id == TRACE && x.name == *n))
        })
        .await;
    check_tree(&spans, TRACE, PARENT, "http");
}

#[tokio::test(flavor = "multi_thread")]
async fn over_grpc_a_run_without_a_traceparent_starts_its_own_trace() {
    let rx = OtlpReceiver::start().await.unwrap();
    let (server, agent) = start(&rx, "grpc");
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW)]).unwrap();
    server.add_repo("traced", &repo);
    // An invalid traceparent is no error: the run gets a trace of its own.
    let c = Client::new(&server.url, &server.token).with_traceparent("00-not-a-trace-01");
    let run =
        c.submit_run("traced", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(done.status, "success", "{}\n{}", server.log(), agent.log());
    let trace = done.trace_id.clone().expect("a trace id");
    assert!(trace.len() == 32 && trace != "0".repeat(32), "{trace}");
    let spans = rx
        .wait_for(Duration::from_secs(30), |s| {
            ["trigger", "complete", "upload"].iter().all(|n| s.iter().any(|x| x.trace_id == trace && x.name == *n))
        })
        .await;
    check_tree(&spans, &trace, "", "grpc");
}

/// The flag is for the daemons: a client command does not have it (nor
/// list it in its --help), so it refuses it rather than export nothing.
#[test]
fn a_client_command_refuses_the_otlp_endpoint() {
    let out = std::process::Command::new(BIN)
        .args(["validate", "nothing.yaml", "--otlp-endpoint", "http://127.0.0.1:4318"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unexpected argument '--otlp-endpoint'"), "{err}");
}
