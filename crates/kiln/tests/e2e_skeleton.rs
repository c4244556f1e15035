//! End-to-end tests of the walking skeleton: the real `kiln` binary (`kiln
//! up` with real agents running real processes), real git repositories.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo, wait_for};
use std::process::Output;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

async fn wait_run(c: &Client, run: &str) -> kiln_api::Run {
    kiln_testkit::wait_run(c, run, 60).await
}

fn two_job_repo() -> TestRepo {
    TestRepo::new(&[
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: compile\n    steps:\n      - ./ci/build.sh\n  - name: test\n    steps:\n      - ./ci/test.sh\n",
        ),
        (
            "ci/build.sh",
            "#!/bin/sh\necho \"compiling $KILN_JOB at $KILN_COMMIT in $KILN_WORKSPACE\"\necho \"git-head=$(git rev-parse HEAD) dirty=$(git status --porcelain | wc -l)\"\n",
        ),
        ("ci/test.sh", "#!/bin/sh\necho \"testing run $KILN_RUN_ID\"\ncat version.txt\n"),
        ("version.txt", "v1\n"),
    ])
    .unwrap()
}

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_job_run_follows_to_success() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = two_job_repo();
    add_repo(&up, "demo", &repo);
    let out = up.cli().args(["run", "--repo", "demo", "--commit", "main", "--follow"]).output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}\n{}", up.log());
    let head = repo.head().unwrap();
    assert!(all.contains(&format!("compiling compile at {head}")), "{all}");
    // The workspace is a real git checkout of the frozen commit, clean.
    assert!(all.contains(&format!("git-head={head} dirty=0")), "{all}");
    assert!(all.contains("v1"), "{all}");

    let run_id = all.lines().find_map(|l| l.strip_prefix("run ").and_then(|r| r.strip_suffix(" accepted"))).unwrap();
    let st = up.cli().args(["status", run_id, "--json"]).output().unwrap();
    assert!(st.status.success());
    let run: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(run["status"], "success");
    assert_eq!(run["commit_sha"], head);
    assert_eq!(run["ref"], "refs/heads/main", "an API run names the branch it ran in full");
    assert_eq!(run["workflow_path"], ".kiln/pipeline.yaml");
    assert_eq!(run["workflow_hash"].as_str().unwrap().len(), 64);
    let jobs = run["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        assert_eq!(j["status"], "success", "{j}");
        assert_eq!(j["current_epoch"], 1);
        let attempts = j["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{j}");
        assert_eq!(attempts[0]["outcome"], "success");
        assert_eq!(attempts[0]["epoch"], 1);
    }
    // The successor started only after its predecessor finished.
    let compile_done = jobs[0]["finished_at_ms"].as_i64().unwrap();
    let test_start = jobs[1]["attempts"][0]["started_at_ms"].as_i64().unwrap();
    assert!(test_start >= compile_done);
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_step_fails_run_and_successor_never_starts() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: a\n    steps:\n      - echo first\n      - exit 3\n      - echo never-printed\n  - name: b\n    steps:\n      - echo b-ran\n",
    )])
    .unwrap();
    add_repo(&up, "fails", &repo);
    let out = up.cli().args(["run", "--repo", "fails", "--follow", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("first"), "{logs}");
    // The step is listed as skipped, but its output never appears.
    // (Two jobs are followed at once: each line is prefixed `a | `.)
    assert!(!logs.lines().any(|l| l.trim_start_matches("a | ").trim() == "never-printed"), "{logs}");
    assert!(logs.lines().any(|l| l == "a | first"), "{logs}");
    assert!(!logs.contains("b-ran"));
    // With --json, stdout is exactly the final run object.
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["status"], "failed");
    assert_eq!(run["jobs"][0]["status"], "failed");
    assert_eq!(run["jobs"][0]["attempts"][0]["exit_code"], 3);
    assert_eq!(run["jobs"][0]["attempts"].as_array().unwrap().len(), 1, "deterministic failures are not retried");
    assert_eq!(run["jobs"][1]["status"], "skipped");
    assert_eq!(run["jobs"][1]["attempts"].as_array().unwrap().len(), 0);

    // Retry creates a new run with the same pinned definition.
    let run_id = run["id"].as_str().unwrap();
    let r = up.cli().args(["retry", run_id]).output().unwrap();
    assert!(r.status.success(), "{}", text(&r));
    let new_id = String::from_utf8_lossy(&r.stdout).trim().to_string();
    assert_ne!(new_id, run_id);
    let c = Client::new(&up.url, &up.token);
    let child = wait_run(&c, &new_id).await;
    assert_eq!(child.parent_run_id.as_deref(), Some(run_id));
    assert_eq!(child.commit_sha, run["commit_sha"].as_str().unwrap());
    assert_eq!(child.workflow_hash, run["workflow_hash"].as_str().unwrap());
    assert_eq!(child.status, "failed");
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_keys_and_authentication() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = two_job_repo();
    add_repo(&up, "idem", &repo);
    let c = Client::new(&up.url, &up.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let a = c.submit_run("idem", &body, Some("key-1")).await.unwrap();
    let b = c.submit_run("idem", &body, Some("key-1")).await.unwrap();
    assert_eq!(a.run_id, b.run_id, "same key, same body: same run");
    let other =
        SubmitRun { commit_sha: "main".into(), inputs: [("x".into(), "1".into())].into(), ..Default::default() };
    let e = c.submit_run("idem", &other, Some("key-1")).await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    assert_eq!(e.code(), Some("idempotency_key_reused"));
    let fresh = c.submit_run("idem", &body, Some("key-2")).await.unwrap();
    assert_ne!(fresh.run_id, a.run_id);
    assert_eq!(c.list_runs("idem", None, None).await.unwrap().runs.len(), 2);

    // Every API call needs the right bearer token.
    let http = reqwest::Client::new();
    for (method, path) in [
        ("GET", format!("/v1/workflow-runs/{}", a.run_id)),
        ("POST", "/v1/repos".to_string()),
        ("POST", "/v1/repos/idem/workflow-runs".to_string()),
        ("POST", "/v1/agents/register".to_string()),
        ("GET", "/v1/repos/idem/workflow-runs".to_string()),
    ] {
        let m: reqwest::Method = method.parse().unwrap();
        let r = http.request(m.clone(), format!("{}{path}", up.url)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{method} {path} without token");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        let r = http.request(m, format!("{}{path}", up.url)).bearer_auth("wrong").send().await.unwrap();
        assert_eq!(r.status(), 401, "{method} {path} with a wrong token");
    }
    // Scopes: the agent token cannot use the public API, the admin token cannot act as an agent.
    let agent_token = std::fs::read_to_string(up.data_dir().join("agent.token")).unwrap();
    let agent = Client::new(&up.url, agent_token.trim());
    assert_eq!(agent.get_run(&a.run_id).await.unwrap_err().status(), Some(401));
    let reg = kiln_api::RegisterAgent {
        name: "x".into(),
        labels: Default::default(),
        max_jobs: 1,
        version: None,
        executor: None,
        fresh_start: false,
    };
    assert_eq!(c.register_agent(&reg).await.unwrap_err().status(), Some(401));
    // Token files are private to the server's user.
    use std::os::unix::fs::PermissionsExt;
    for f in ["admin.token", "agent.token"] {
        let mode = std::fs::metadata(up.data_dir().join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // Health endpoints and the UI's page need no token (the page asks for one).
    let page = http.get(format!("{}/", up.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("<title>") && html.contains("/v1/"), "the embedded UI is served");
    assert_eq!(http.get(format!("{}/healthz", up.url)).send().await.unwrap().status(), 200);
    assert_eq!(http.get(format!("{}/readyz", up.url)).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_invalid_workflows_are_refused_and_nothing_is_stored() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[
        ("README", "no workflow here\n"),
        (".kiln/broken.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo]\n  - name: a\n    steps: {x: 1}\n"),
    ])
    .unwrap();
    add_repo(&up, "bad", &repo);
    let c = Client::new(&up.url, &up.token);

    let e =
        c.submit_run("bad", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    // No workflow path: the commit's only workflow is the one (issue 41, item 6).
    assert!(e.to_string().contains(".kiln/broken.yaml at "), "{e}");
    let missing = SubmitRun {
        commit_sha: "main".into(),
        workflow_path: Some(".kiln/pipeline.yaml".into()),
        ..Default::default()
    };
    let e = c.submit_run("bad", &missing, None).await.unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    assert!(e.to_string().contains("the workflows there are: .kiln/broken.yaml"), "{e}");

    let body =
        SubmitRun { commit_sha: "main".into(), workflow_path: Some(".kiln/broken.yaml".into()), ..Default::default() };
    let e = c.submit_run("bad", &body, Some("k")).await.unwrap_err();
    assert_eq!(e.status(), Some(422));
    assert!(e.to_string().contains("5:"), "diagnostics name the line: {e}");

    let e = c.submit_run("bad", &SubmitRun { commit_sha: "no-such-branch".into(), ..Default::default() }, None).await;
    assert_eq!(e.unwrap_err().status(), Some(422));
    let e = c.submit_run("nope", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await;
    assert_eq!(e.unwrap_err().status(), Some(404));
    // Malformed JSON is a clear 400.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/repos/bad/workflow-runs", up.url))
        .bearer_auth(&up.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    assert!(c.list_runs("bad", None, None).await.unwrap().runs.is_empty(), "nothing stored");
    // The refused idempotency key was not consumed.
    let fixed = repo
        .commit(&[(".kiln/broken.yaml", "version: 1\njobs:\n  - name: a\n    steps: [\"true\"]\n")], "fix")
        .unwrap();
    let ok = c.submit_run("bad", &body, Some("k")).await.unwrap();
    let run = wait_run(&c, &ok.run_id).await;
    assert_eq!(run.commit_sha, fixed);
    assert_eq!(run.status, "success");
}

#[tokio::test(flavor = "multi_thread")]
async fn run_is_frozen_at_acceptance() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let gate = tempfile::tempdir().unwrap();
    let gate_file = gate.path().join("go");
    let wf = format!(
        "version: 1\njobs:\n  - name: wait\n    steps:\n      - while [ ! -e {} ]; do sleep 0.05; done\n  - name: read\n    steps:\n      - cat version.txt\n",
        gate_file.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf), ("version.txt", "first-version\n")]).unwrap();
    let first = repo.head().unwrap();
    add_repo(&up, "frozen", &repo);
    let c = Client::new(&up.url, &up.token);
    let r = c.submit_run("frozen", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    // The branch moves while the run is in flight.
    repo.commit(&[("version.txt", "second-version\n")], "move main").unwrap();
    std::fs::write(&gate_file, "").unwrap();
    let run = wait_run(&c, &r.run_id).await;
    assert_eq!(run.status, "success");
    assert_eq!(run.commit_sha, first);
    let logs = up.cli().args(["logs", &r.run_id, "read"]).output().unwrap();
    let out = String::from_utf8_lossy(&logs.stdout);
    assert!(out.contains("first-version"), "{out}");
    assert!(!out.contains("second-version"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_running_job_and_the_run_ends_cancelled() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let tmp = kiln_testkit::step_writable_tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let wf = format!(
        "version: 1\njobs:\n  - name: long\n    steps:\n      - echo $$ > {}; sleep 600\n  - name: after\n    steps:\n      - echo after\n",
        pidfile.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    add_repo(&up, "cancel", &repo);
    let c = Client::new(&up.url, &up.token);
    let r = c.submit_run("cancel", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let _: i32 = wait_for(Duration::from_secs(30), || std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok())
        .expect("step started");
    // The step's pids are its own namespace's: find its host processes.
    let running = kiln_testkit::step_processes(&r.run_id);
    assert!(!running.is_empty(), "the step's processes are visible from the host");
    let out = up.cli().args(["cancel", &r.run_id]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let run = wait_run(&c, &r.run_id).await;
    assert_eq!(run.status, "cancelled");
    assert_eq!(run.jobs[0].status, "cancelled");
    assert_eq!(run.jobs[0].attempts[0].outcome, "cancelled");
    assert_eq!(run.jobs[1].status, "cancelled");
    assert!(run.jobs[1].attempts.is_empty());
    let gone = wait_for(Duration::from_secs(20), || kiln_testkit::step_processes(&r.run_id).is_empty().then_some(()));
    assert!(gone.is_some(), "the step's processes {running:?} survived cancellation");
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_log_events_resume_from_last_event_id() {
    use futures::StreamExt;
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: loud\n    steps:\n      - seq 1 15000\n      - seq 15001 30000\n      - seq 30001 45000\n      - seq 45001 60000\n      - echo to-stderr >&2\n",
    )])
    .unwrap();
    add_repo(&up, "loud", &repo);
    let c = Client::new(&up.url, &up.token);
    let r = c.submit_run("loud", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id).await;
    assert_eq!(run.status, "success");
    let job = &run.jobs[0].id;
    let collect = |last: Option<String>| {
        let c = c.clone();
        let job = job.clone();
        async move {
            let s = c.log_events(&job, last.as_deref()).await.unwrap();
            let evs: Vec<_> = s.map(|e| e.unwrap()).collect().await;
            evs
        }
    };
    let all = collect(None).await;
    let chunks: Vec<_> = all.iter().filter(|e| e.event == "chunk").collect();
    assert!(chunks.len() >= 4, "several chunks expected, got {}", chunks.len());
    assert_eq!(all.last().unwrap().event, "end");
    // Reassemble stdout: exactly `seq 1 60000` (four steps, so at least four
    // chunks whatever the shipper coalesces).
    use base64::Engine;
    let mut stdout = Vec::new();
    for e in &chunks {
        let le: kiln_api::LogEvent = serde_json::from_str(&e.data).unwrap();
        if le.stream == "stdout" {
            assert_eq!(le.offset as usize, stdout.len(), "contiguous offsets");
            stdout.extend(base64::engine::general_purpose::STANDARD.decode(le.data).unwrap());
        }
    }
    let expected: String = (1..=60000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8(stdout).unwrap(), expected);
    // Reconnecting after the second event replays exactly the rest.
    let resumed = collect(Some(chunks[1].id.clone())).await;
    let ids: Vec<_> = resumed.iter().filter(|e| e.event == "chunk").map(|e| e.id.clone()).collect();
    let want: Vec<_> = chunks[2..].iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, want);
}

#[test]
fn validate_reports_every_problem_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, include_str!("../../kiln-workflow/tests/fixtures/valid/spec-example.yaml")).unwrap();
    let out = std::process::Command::new(BIN).arg("validate").arg(&good).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "version: 1\njobs:\n  - name: a\n    steps: [x]\n    needs: [later]\n  - name: later\n    step: [y]\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN).arg("validate").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let prefix = format!("{}:", bad.display());
    let diag_lines: Vec<_> = err.lines().filter(|l| l.starts_with(&prefix) && !l.ends_with("problem(s)")).collect();
    assert!(diag_lines.len() >= 2, "{err}");
    for l in diag_lines {
        let rest = &l[prefix.len()..];
        let mut parts = rest.splitn(3, ':');
        let line: usize = parts.next().unwrap().parse().unwrap();
        let col: usize = parts.next().unwrap().parse().unwrap();
        assert!(line >= 1 && col >= 1, "{l}");
    }
}

/// The bundled example (examples/hello): compile publishes target/app.jar,
/// integration-test restores it and runs it.
#[tokio::test(flavor = "multi_thread")]
async fn bundled_example_pipeline_hands_off_its_artifact() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("hello");
    let example =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")).join("../../examples/hello");
    assert!(std::process::Command::new("cp").arg("-r").arg(&example).arg(&repo).status().unwrap().success());
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &["-c", "user.name=t", "-c", "user.email=t@kiln.invalid", "commit", "-q", "-m", "example"],
    ] {
        assert!(std::process::Command::new("git").arg("-C").arg(&repo).args(args).status().unwrap().success());
    }
    let out = up.cli().args(["repo", "add", "hello", "--url"]).arg(&repo).output().unwrap();
    assert!(out.status.success());
    let out = up.cli().args(["run", "--repo", "hello", "--commit", "main", "--follow", "--json"]).output().unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{logs}\n{}", up.log());
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let art = &run["jobs"][0]["artifacts"][0];
    assert_eq!(art["name"], "app");
    assert_eq!(art["epoch"], 1);
    let sha = art["sha256"].as_str().unwrap();
    assert!(logs.contains(&format!("testing {sha}  inputs/app.jar")), "{logs}");
    assert!(logs.contains("ok - the published app greets"), "{logs}");
}

/// `--log-format json` (issue 19): every line the server and its agents
/// write to stderr is one JSON object with a level and a message, and the
/// lines about a job carry its id and epoch as fields.
#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line() {
    let repo = two_job_repo();
    let up = KilnUp::start_with(BIN.as_ref(), 1, &["--log-format", "json"]).unwrap();
    add_repo(&up, "json", &repo);
    let c = Client::new(&up.url, &up.token);
    let run = c.submit_run("json", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    assert_eq!(wait_run(&c, &run.run_id).await.status, "success");
    let log = up.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() > 3, "{log}");
    for l in &lines {
        assert!(l["level"].is_string() && l["fields"]["message"].is_string(), "{l}");
    }
    let completed = lines.iter().find(|l| l["fields"]["message"] == "completed").unwrap_or_else(|| panic!("{log}"));
    assert!(completed["fields"]["job"].is_string() && completed["fields"]["epoch"] == 1, "{completed}");
    // Nothing but JSON on stderr besides what the CLI prints for people.
    let text: Vec<&str> = log.lines().filter(|l| l.contains(" INFO ") || l.contains(" WARN ")).collect();
    assert!(text.is_empty(), "text log lines: {text:?}");
}
