//! The command line as a user meets it: each test is a user's command and
//! its expected output or exit code, against the real `kiln` binary and a
//! real `kiln up` (server and agents running real processes).

use kiln_testkit::{KilnUp, TestRepo};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `kiln ARGS` against `up`; returns its output.
fn kiln(up: &KilnUp, args: &[&str]) -> Output {
    up.cli().args(args).output().expect("run kiln")
}

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", text(&out));
}

/// `kiln run --repo REPO` (without --follow): the run id.
fn start_run(up: &KilnUp, repo: &str) -> String {
    let out = kiln(up, &["run", "--repo", repo]);
    assert!(out.status.success(), "{}", text(&out));
    stdout(&out).trim().to_string()
}

/// A repository whose pipeline is `jobs` (YAML list items).
fn repo_with(jobs: &str) -> TestRepo {
    TestRepo::new(&[(".kiln/pipeline.yaml", &format!("version: 1\njobs:\n{jobs}"))]).unwrap()
}

const LOUD_THEN_FAIL: &str = "  - name: loud\n    steps:\n      - seq 1 30000\n  - name: fails\n    steps:\n      - echo failing now\n      - exit 3\n";

/// `kiln logs RUN | head -1`, `kiln status RUN --json | head -1`: a reader
/// that goes away is no panic (exit 101) but a quiet exit 0.
#[test]
fn a_closed_stdout_is_no_panic() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo_loud = repo_with(LOUD_THEN_FAIL);
    add_repo(&up, "loud", &repo_loud);
    let run = start_run(&up, "loud");
    let _ = kiln(&up, &["wait", &run]);

    // `kiln logs RUN | head -1`: 170 KB of log into a pipe whose reader
    // stops after one line.
    let mut child = up.cli().args(["logs", &run]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "── loud ──\n");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));

    // Every command, its standard output closed before it writes anything.
    for args in [
        vec!["status", run.as_str(), "--json"],
        vec!["status", run.as_str()],
        vec!["logs", run.as_str()],
        vec!["logs", run.as_str(), "--follow"],
        vec!["repo", "list"],
        vec!["--help"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = up.cli().args(&args).stdout(writer).output().unwrap();
        assert_ne!(out.status.code(), Some(101), "kiln {args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "kiln {args:?}: {}", stderr(&out));
    }
}

/// `kiln logs RUN nosuchjob` names the jobs there are; `kiln logs --follow`
/// and `kiln wait` exit with the run's result.
#[test]
fn logs_of_an_unknown_job_and_result_codes() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo_fails = repo_with(LOUD_THEN_FAIL);
    add_repo(&up, "fails", &repo_fails);
    let run = start_run(&up, "fails");

    let out = kiln(&up, &["wait", &run]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(stdout(&out).trim(), format!("run {run} failed"));

    let out = kiln(&up, &["logs", &run, "nosuchjob"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stdout(&out).is_empty());
    assert!(stderr(&out).contains("has no job `nosuchjob`; its jobs are: loud, fails"), "{}", stderr(&out));
    let out = kiln(&up, &["logs", &run, "nosuchjob", "--follow"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    let out = kiln(&up, &["logs", &run, "--follow"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("failing now"));
    let out = kiln(&up, &["logs", &run, "loud", "--follow"]);
    assert_eq!(out.status.code(), Some(0), "the job followed succeeded: {}", stderr(&out));
    let out = kiln(&up, &["wait", &run, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "failed");
}

/// `kiln logs RUN JOB` without `--follow` on a job that prints without
/// pause prints what is there now and exits 0 (it used to wait for a quiet
/// spell that never came); `--follow` is what keeps reading.
#[test]
fn logs_without_follow_return_while_the_job_keeps_printing() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = repo_with(
        "  - name: chatty\n    steps:\n      - i=0; while true; do i=$((i+1)); echo line $i; sleep 0.01; done\n",
    );
    add_repo(&up, "chatty", &repo);
    let run = start_run(&up, "chatty");
    // Wait until it has printed something.
    let mut seen = false;
    for _ in 0..600 {
        if stdout(&kiln(&up, &["logs", &run, "chatty"])).contains("line 5") {
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen, "the job's lines show");
    let started = std::time::Instant::now();
    let mut child =
        up.cli().args(["logs", &run, "chatty"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let status = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || child.try_wait().unwrap());
    let Some(status) = status else {
        let _ = child.kill();
        panic!("`kiln logs RUN JOB` did not return while the job kept printing");
    };
    let out = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(0), "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(printed.starts_with("── chatty ──\n") && printed.contains("line 1\n"), "{printed}");
    eprintln!("returned after {:?} with {} lines", started.elapsed(), printed.lines().count());
    let out = kiln(&up, &["cancel", &run]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `KILN_SERVER=localhost:7070 kiln …`: the message says what to write.
#[test]
fn a_server_url_without_a_scheme_says_so() {
    for args in [vec!["status", "0190aaaa"], vec!["repo", "list"]] {
        let out =
            Command::new(BIN).args(&args).env("KILN_SERVER", "localhost:7070").env("KILN_TOKEN", "x").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert_eq!(stderr(&out).trim(), "error: server URL needs a scheme: http://localhost:7070");
    }
    let out = Command::new(BIN)
        .args(["agent", "--server", "localhost:7070", "--name", "a"])
        .env("KILN_AGENT_TOKEN", "x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("server URL needs a scheme: http://localhost:7070"), "{}", text(&out));
}

/// A log knob set to something it cannot mean stops the server (or the
/// agent) with a message naming it, before it listens or registers (not
/// silently the default).
#[test]
fn a_bad_log_knob_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "kiln_not_a_real_token\n").unwrap();
    let server = |var: &str, value: &str| {
        let mut c = Command::new(BIN);
        c.args(["server", "--listen", "127.0.0.1:0", "--data-dir"]).arg(dir.path().join(var)).env(var, value);
        c
    };
    let agent = |var: &str, value: &str| {
        let mut c = Command::new(BIN);
        c.args(["agent", "--server", "http://127.0.0.1:9", "--work-dir"])
            .arg(dir.path().join("agent"))
            .arg("--token-file")
            .arg(&token)
            .env(var, value);
        c
    };
    let cases = [
        (server("KILN_LOG_BULK_IN_FLIGHT", "zero"), "KILN_LOG_BULK_IN_FLIGHT must be a positive integer, not \"zero\""),
        (server("KILN_LOG_SEGMENTS", "maybe"), "KILN_LOG_SEGMENTS must be `on` or `off`, not \"maybe\""),
        (agent("KILN_AGENT_LOG_IN_FLIGHT", "-1"), "KILN_AGENT_LOG_IN_FLIGHT must be a positive integer, not \"-1\""),
        (agent("KILN_AGENT_LOG_BATCH", "yes"), "KILN_AGENT_LOG_BATCH must be `on` or `off`, not \"yes\""),
    ];
    for (mut cmd, message) in cases {
        let mut child = cmd
            .env("KILN_STORAGE_LEVELS", "off")
            .env("KILN_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A process that took the value would run on: stop it and fail.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.code().is_some_and(|c| c != 0), "{message}: {}", text(&out));
        assert!(stderr(&out).contains(message), "{message}: {}", text(&out));
        for started in ["listening", "agent registered", "cannot register"] {
            assert!(!text(&out).contains(started), "{message}: {}", text(&out));
        }
    }
}

/// A second `kiln up` on the same data directory is refused with the
/// holder's pid; the server log, redirected to a file, has no colours.
#[test]
fn a_second_kiln_up_on_one_data_dir_is_refused() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let out = Command::new(BIN)
        .args(["up", "--listen", "127.0.0.1:0", "--agents", "1", "--data-dir"])
        .arg(up.data_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!stdout(&out).contains("Kiln is up"), "{}", text(&out));
    let want = format!("is in use by another kiln up (pid {})", up.child.id());
    assert!(stderr(&out).contains(&want), "{}", text(&out));

    // `kiln up 2> file`: plain text.
    let log = up.log();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a redirected log: {log:?}");
}

/// Poll `kiln ARGS` until its stdout satisfies `pick` (waiting for the
/// system, not timing it).
fn poll(up: &KilnUp, args: &[&str], mut pick: impl FnMut(&str) -> bool) -> String {
    let mut last = String::new();
    let found = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        last = stdout(&kiln(up, args));
        pick(&last).then_some(())
    });
    assert!(found.is_some(), "kiln {args:?} never matched; last output:\n{last}");
    last
}

/// `runs-on: {os: ubuntu-latest}` that no agent satisfies: the waiting
/// job says why, in the API and `kiln status`; `kiln agents` lists them.
#[test]
fn a_job_no_agent_can_take_says_why_and_agents_are_listed() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo_ubuntu = repo_with("  - name: build\n    runs-on: {os: ubuntu-latest}\n    steps:\n      - echo hi\n");
    add_repo(&up, "ubuntu", &repo_ubuntu);
    let run = start_run(&up, "ubuntu");
    let os = std::env::consts::OS;
    let arch = std::env::consts::ARCH;
    let want = format!(
        "waiting: no connected agent has labels {{os: ubuntu-latest}}; agents: local-1 {{arch: {arch}, os: {os}}}"
    );
    let status = poll(&up, &["status", &run], |s| s.contains(&want));
    assert!(status.contains("queued"), "{status}");
    let out = kiln(&up, &["status", &run, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"][0]["status"], "ready");
    assert_eq!(v["jobs"][0]["message"], want.as_str());

    // `kiln agents`: name, state, running/capacity, labels.
    let out = kiln(&up, &["agents"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = stdout(&out);
    let row = table.lines().find(|l| l.starts_with("local-1 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(&format!("arch={arch},os={os}")), "{row}");
    assert!(row.contains(" 0/1 ") && row.contains(" idle "), "{row}");
    let out = kiln(&up, &["agents", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], "local-1");
    assert_eq!(v[0]["connected"], true);
    assert_eq!(v[0]["running_jobs"], 0);
    assert_eq!(v[0]["max_jobs"], 1);

    // The agent token lists no agents.
    let agent_token = std::fs::read_to_string(up.data_dir().join("agent.token")).unwrap();
    let out = Command::new(BIN)
        .args(["agents"])
        .env("KILN_SERVER", &up.url)
        .env("KILN_TOKEN", agent_token.trim())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
}

/// Issue 41, item 3: a job whose `runs-on` no agent has is accepted with a
/// warning (agents may come later), and `kiln run --follow` says what it
/// waits for, naming the labels the agents have — once, not per poll —
/// instead of waiting in silence; cancelling ends the follow.
#[test]
fn run_follow_says_why_a_job_waits_and_acceptance_warns() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = repo_with("  - name: build\n    runs-on: ubuntu-latest\n    steps:\n      - echo never\n");
    add_repo(&up, "gha", &repo);
    // The acceptance warning compares with the agents registered.
    poll(&up, &["agents", "ls", "--json"], |s| s.contains("\"local-1\""));
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);

    let mut child = up
        .cli()
        .args(["run", "--repo", "gha", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err = BufReader::new(child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let waiting = format!(
        "── build: waiting: no connected agent has labels {{os: ubuntu-latest}}; agents: local-1 {{arch: {arch}, os: {os}}}"
    );
    let mut seen: Vec<String> = vec![];
    let found = kiln_testkit::wait_for(std::time::Duration::from_secs(60), || {
        while let Ok(line) = rx.try_recv() {
            seen.push(line);
        }
        seen.contains(&waiting).then_some(())
    });
    assert!(found.is_some(), "no waiting reason in:\n{}", seen.join("\n"));
    let warning = format!(
        "warning: job `build` needs an agent with labels {{os: ubuntu-latest}}, and no registered agent has them \
         (registered agents have: {{arch: {arch}, os: {os}}} (local-1)); the run waits until one connects (`kiln \
         agent --labels os=ubuntu-latest`), or change `runs-on`"
    );
    assert_eq!(seen.first(), Some(&warning), "the warning comes first:\n{}", seen.join("\n"));
    let run = seen
        .iter()
        .find_map(|l| l.strip_prefix("run ").and_then(|r| r.strip_suffix(" accepted")))
        .unwrap_or_else(|| panic!("{seen:?}"))
        .to_string();

    // The API and `kiln status` say it too.
    let v: serde_json::Value = serde_json::from_slice(&kiln(&up, &["status", &run, "--json"]).stdout).unwrap();
    assert_eq!(v["jobs"][0]["status"], "ready");
    assert_eq!(v["jobs"][0]["waiting"].as_str(), waiting.strip_prefix("── build: "));

    let out = kiln(&up, &["cancel", &run]);
    assert!(out.status.success(), "{}", text(&out));
    let status = child.wait().unwrap();
    reader.join().unwrap();
    seen.extend(rx.try_iter());
    assert_eq!(status.code(), Some(1), "a cancelled run is no success:\n{}", seen.join("\n"));
    assert_eq!(seen.iter().filter(|l| **l == waiting).count(), 1, "one line per change:\n{}", seen.join("\n"));
    assert!(seen.iter().any(|l| l.starts_with(&format!("run {run} cancelled"))), "{}", seen.join("\n"));
}

/// `kiln top --once`: a running job with its agent and phase, a job no
/// agent can take under its `runs-on` label set in the queue, the agents'
/// slots; `--json` is the API's overview; only an admin token reads it; a
/// closed standard output is no panic.
#[test]
fn top_shows_the_queue_agents_and_running_jobs() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let slow = repo_with("  - name: spin\n    steps:\n      - echo started; sleep 60\n");
    let ubuntu = repo_with("  - name: build\n    runs-on: {os: ubuntu-latest}\n    steps:\n      - echo hi\n");
    add_repo(&up, "slow", &slow);
    add_repo(&up, "ubuntu", &ubuntu);
    let running = start_run(&up, "slow");
    let waiting = start_run(&up, "ubuntu");

    let top = poll(&up, &["top", "--once"], |s| s.contains("▶ step 1/1") && s.contains("os=ubuntu-latest"));
    let section = |name: &str| -> Vec<String> {
        top.split("\n\n")
            .find(|b| b.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{top}"))
            .lines()
            .map(str::to_string)
            .collect()
    };
    let queue = section("QUEUE");
    let row = queue.iter().find(|l| l.trim_start().starts_with("os=ubuntu-latest ")).unwrap_or_else(|| panic!("{top}"));
    assert_eq!(row.split_whitespace().nth(1), Some("1"), "{row}");
    let agents = section("AGENTS");
    let row = agents.iter().find(|l| l.trim_start().starts_with("local-1 ")).unwrap_or_else(|| panic!("{top}"));
    assert!(row.contains(" 1/1 ") && row.contains(" yes "), "{row}");
    let rows = section("RUNNING");
    let row = rows.iter().find(|l| l.contains(" spin ")).unwrap_or_else(|| panic!("{top}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..5], &[&running[..13], "slow", "spin", "local-1", "command"], "{row}");
    assert_eq!(rows.len(), 3, "a title, a header and one running job:\n{top}");
    assert!(!top.contains('\u{1b}'), "no screen control codes off a terminal: {top:?}");

    let out = kiln(&up, &["top", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["queue"][0]["labels"], serde_json::json!({"os": "ubuntu-latest"}));
    assert_eq!(v["queue"][0]["eligible"], 1);
    assert_eq!(v["running"][0]["run_id"], running.as_str());
    assert_eq!(v["running"][0]["job"], "spin");
    assert_eq!(v["running"][0]["agent"], "local-1");
    assert_eq!(v["running"][0]["phase"], "command");
    assert_eq!(v["agents"][0]["running_jobs"], 1);
    assert_eq!(v["jobs"]["running"], 1);
    assert_eq!(v["running"].as_array().map(Vec::len), Some(1), "{v}");
    assert_ne!(v["running"][0]["run_id"], waiting.as_str());

    // Only an admin reads it, as `kiln agents`.
    let agent_token = std::fs::read_to_string(up.data_dir().join("agent.token")).unwrap();
    let out = up.cli().env("KILN_TOKEN", agent_token.trim()).args(["top", "--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let out = kiln(&up, &["token", "create", "--name", "reader", "--scope", "read"]);
    let reader = stdout(&out).trim().to_string();
    let out = up.cli().env("KILN_TOKEN", &reader).args(["top", "--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));

    // `kiln top | head -0`.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = up.cli().args(["top"]).stdout(writer).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));

    let out = kiln(&up, &["cancel", &running]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `kiln repo add ghost --url /nonexistent` is refused at add time;
/// `kiln repo rm` removes a repository (admin only), `kiln repo set` changes one.
#[test]
fn repositories_are_probed_at_add_and_can_be_removed() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let out = kiln(&up, &["repo", "add", "ghost", "--url", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("cannot fetch from /nonexistent") && err.contains("nothing was registered"), "{err}");
    let out = kiln(&up, &["repo", "list", "--json"]);
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(), serde_json::json!([]));

    let repo = repo_with("  - name: a\n    steps:\n      - echo a\n");
    add_repo(&up, "demo", &repo);
    add_repo(&up, "busy", &repo);
    let out = kiln(&up, &["repo", "set", "demo", "--default-branch", "trunk"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("default branch:     trunk"), "{}", text(&out));

    // Only an admin may remove one.
    let out = kiln(&up, &["token", "create", "--name", "reader", "--scope", "read"]);
    let reader = stdout(&out).trim().to_string();
    let as_reader = up.cli().env("KILN_TOKEN", &reader).args(["repo", "rm", "demo"]).output().unwrap();
    assert_eq!(as_reader.status.code(), Some(4), "{}", text(&as_reader));
    let agent_token = std::fs::read_to_string(up.data_dir().join("agent.token")).unwrap();
    let as_agent = up.cli().env("KILN_TOKEN", agent_token.trim()).args(["repo", "rm", "demo"]).output().unwrap();
    assert_eq!(as_agent.status.code(), Some(4), "{}", text(&as_agent));

    let out = kiln(&up, &["repo", "rm", "demo"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).starts_with("removed repository demo ("), "{}", text(&out));
    let out = kiln(&up, &["repo", "list"]);
    assert!(!stdout(&out).contains("demo"), "{}", text(&out));
    let out = kiln(&up, &["repo", "rm", "demo"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("repository `demo`"), "{}", text(&out));

    // A repository with runs keeps them: refused.
    let run = start_run(&up, "busy");
    let _ = kiln(&up, &["wait", &run]);
    let out = kiln(&up, &["repo", "rm", "busy"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("has 1 run(s)"), "{}", text(&out));
    assert!(stdout(&kiln(&up, &["repo", "list"])).contains("busy"));
}

/// `kiln runs [--repo] [--status] [--branch] [--limit] [--json]`; run ids
/// may be shortened to any unique prefix of 8+ characters.
#[test]
fn runs_are_listed_and_found_by_a_unique_prefix() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo_good = repo_with("  - name: ok\n    steps:\n      - echo ok\n");
    add_repo(&up, "good", &repo_good);
    let repo_bad = repo_with("  - name: no\n    steps:\n      - exit 1\n");
    add_repo(&up, "bad", &repo_bad);
    let on_main = kiln(&up, &["run", "--repo", "good", "--commit", "main"]);
    let on_main = stdout(&on_main).trim().to_string();
    let on_head = start_run(&up, "good");
    let failed = start_run(&up, "bad");
    for r in [&on_main, &on_head, &failed] {
        let _ = kiln(&up, &["wait", r]);
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let out = kiln(&up, args);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(ids(&["runs", "--json"]), [failed.clone(), on_head.clone(), on_main.clone()], "newest first");
    assert_eq!(ids(&["runs", "--json", "--repo", "good"]), [on_head.clone(), on_main.clone()]);
    assert_eq!(ids(&["runs", "--json", "--status", "failed"]), std::slice::from_ref(&failed));
    // HEAD is main (issue 41, item 8): every run is on the branch.
    assert_eq!(ids(&["runs", "--json", "--branch", "main"]), [failed.clone(), on_head.clone(), on_main.clone()]);
    assert_eq!(ids(&["runs", "--json", "--repo", "good", "--branch", "main"]), [on_head.clone(), on_main.clone()]);
    assert!(ids(&["runs", "--json", "--branch", "other"]).is_empty());
    assert_eq!(ids(&["runs", "--json", "--limit", "1"]), std::slice::from_ref(&failed));
    let out = kiln(&up, &["runs", "--status", "nonsense"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // The table: a short id that is unique, and works wherever an id does.
    let table = stdout(&kiln(&up, &["runs", "--repo", "bad"]));
    let row = table.lines().nth(1).unwrap_or_else(|| panic!("{table}"));
    let short = row.split_whitespace().next().unwrap();
    assert!(short.len() >= 8 && short.len() < failed.len() && failed.starts_with(short), "{table}");
    assert!(row.contains("failed") && row.contains("bad"), "{row}");
    let out = kiln(&up, &["status", short, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["id"], failed.as_str());
    assert_eq!(kiln(&up, &["wait", short]).status.code(), Some(1));
    let out = kiln(&up, &["logs", short, "no"]);
    assert!(stdout(&out).contains("── no ──"), "{}", text(&out));

    // A prefix two runs share is ambiguous: the error lists them. (Ids are
    // UUIDv7: runs made close together share their first 8 characters; make
    // runs until two do.)
    let mut made = vec![start_run(&up, "good")];
    let (a, b) = loop {
        let next = start_run(&up, "good");
        let prev = made.last().unwrap().clone();
        if prev[..8] == next[..8] {
            break (prev, next);
        }
        assert!(made.len() < 3, "three runs in a row with different prefixes: {made:?}");
        made.push(next);
    };
    let out = kiln(&up, &["status", &a[..8]]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("is ambiguous") && err.contains(&a) && err.contains(&b), "{err}");
    let out = kiln(&up, &["status", "ffffffff"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

/// One name per branch (issue 41, item 8): a run started at the default
/// `--commit HEAD`, with `--commit main` and with `--commit
/// refs/heads/main` all carry `refs/heads/main`, and `kiln runs --branch
/// main` (or `--branch refs/heads/main`) lists the three; a run started at
/// a SHA names no branch.
#[test]
fn runs_started_any_way_on_a_branch_carry_one_name() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = repo_with("  - name: ok\n    steps:\n      - echo ok\n");
    add_repo(&up, "named", &repo);
    let by = |commit: Option<&str>| {
        let mut args = vec!["run", "--repo", "named"];
        args.extend(commit.map(|c| ["--commit", c]).into_iter().flatten());
        let out = kiln(&up, &args);
        assert!(out.status.success(), "{}", text(&out));
        stdout(&out).trim().to_string()
    };
    let head = by(None);
    let short = by(Some("main"));
    let full = by(Some("refs/heads/main"));
    let sha = repo.head().unwrap();
    let at_sha = by(Some(&sha));
    let listed = |branch: &str| -> Vec<(String, serde_json::Value)> {
        let out = kiln(&up, &["runs", "--json", "--branch", branch]);
        assert!(out.status.success(), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().iter().map(|r| (r["id"].as_str().unwrap().to_string(), r["ref"].clone())).collect()
    };
    let main = serde_json::json!("refs/heads/main");
    let want = vec![(full.clone(), main.clone()), (short.clone(), main.clone()), (head.clone(), main.clone())];
    assert_eq!(listed("main"), want);
    assert_eq!(listed("refs/heads/main"), want);
    let out = kiln(&up, &["status", &at_sha, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ref"], serde_json::Value::Null, "a SHA names no branch: {v}");
    for r in [&head, &short, &full, &at_sha] {
        let _ = kiln(&up, &["wait", r]);
    }
}

/// Help and flags: durations and sizes in one syntax, `kiln up` takes the
/// agents' and server's flags, completions and a man page, `bench` hidden.
#[test]
fn help_flags_completions_and_man_page() {
    let help = stdout(&Command::new(BIN).arg("--help").output().unwrap());
    assert!(!help.contains("bench"), "{help}");
    assert!(help.contains("KILN_LOG"), "{help}");
    let agent_help = stdout(&Command::new(BIN).args(["agent", "--help"]).env_remove("KILN_SERVER").output().unwrap());
    let usage = agent_help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert_eq!(usage, "Usage: kiln agent [OPTIONS]", "env-backed options are not shown as required");

    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(stdout(&out).contains("runs") && stdout(&out).contains("log-limit"), "{shell}");
    }
    let man = Command::new(BIN).arg("man").output().unwrap();
    assert!(man.status.success());
    assert!(stdout(&man).starts_with(".ie") || stdout(&man).contains(".TH kiln"), "{}", stdout(&man));

    // `kiln up --log-limit 100MiB --kill-grace 1m30s --labels … --max-jobs 2`.
    let up = KilnUp::start_with(
        BIN.as_ref(),
        1,
        &["--log-limit", "100MiB", "--kill-grace", "1m30s", "--labels", "os=ubuntu-latest,gpu=none", "--max-jobs", "2"],
    )
    .unwrap();
    // The agent registers shortly after `kiln up` answers.
    let v = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        let out = kiln(&up, &["agents", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array().is_some_and(|a| !a.is_empty()).then_some(v)
    })
    .expect("the agent registered");
    assert_eq!(v[0]["labels"]["os"], "ubuntu-latest");
    assert_eq!(v[0]["labels"]["gpu"], "none");
    assert_eq!(v[0]["max_jobs"], 2);
    let repo_ubuntu = repo_with(
        "  - name: build\n    runs-on: {os: ubuntu-latest}\n    timeout: 1m30s\n    steps:\n      - echo on ubuntu\n",
    );
    add_repo(&up, "ubuntu", &repo_ubuntu);
    let out = kiln(&up, &["run", "--repo", "ubuntu", "--follow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("on ubuntu"));

    let out = Command::new(BIN).args(["up", "--log-limit", "lots"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid size `lots`"), "{}", stderr(&out));
    let out = Command::new(BIN).args(["server", "--lease-ttl", "soon"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid duration `soon`"), "{}", stderr(&out));
}

/// A `kiln` command that sees no KILN_* connection variables, with its
/// profile in `home/config`, its state in `home/state` and `home` as the
/// working directory (no `./kiln-data` there).
fn bare(home: &std::path::Path) -> Command {
    let mut c = Command::new(BIN);
    for k in ["KILN_SERVER", "KILN_TOKEN", "KILN_TOKEN_FILE", "KILN_CONTEXT", "KILN_LOG"] {
        c.env_remove(k);
    }
    c.env("HOME", home).env("XDG_CONFIG_HOME", home.join("config")).env("XDG_STATE_HOME", home.join("state"));
    c.current_dir(home);
    c
}

/// `kiln login URL` reads the token from stdin or --token-file, checks it
/// with the server and writes a 0600 profile of named contexts; the
/// environment beats the profile; `kiln logout`, `kiln context list|use`.
#[test]
fn login_writes_a_private_profile_that_the_environment_overrides() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/kiln/config.toml");
    let token_file = up.data_dir().join("admin.token");
    let login = |args: &[&str], stdin: &str| {
        let mut child = bare(home.path())
            .arg("login")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };

    // `printf wrong | kiln login URL`: refused, nothing written.
    let out = login(&[&up.url], "kiln_wrong_token\n");
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        stderr(&out).contains("refused the token") && stderr(&out).contains("nothing was written"),
        "{}",
        text(&out)
    );
    assert!(!config.exists());
    // An unreachable server: exit 5, nothing written.
    let out = login(&["http://127.0.0.1:9", "--token-file", token_file.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(stderr(&out).contains("nothing was written"), "{}", text(&out));
    assert!(!config.exists());
    // Nothing on stdin.
    assert_eq!(login(&[&up.url], "").status.code(), Some(2));

    // `kiln login URL < admin.token`.
    let out = login(&[&up.url], &up.token);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("context `default` (added, now current)"), "{}", text(&out));
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(config.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    let toml = std::fs::read_to_string(&config).unwrap();
    assert!(toml.contains("current = \"default\"") && toml.contains(&up.url), "{toml}");

    // No KILN_SERVER, no KILN_TOKEN: the profile is used.
    let out = bare(home.path()).args(["runs", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The environment beats the profile: a wrong KILN_TOKEN is refused…
    let out = bare(home.path()).args(["runs"]).env("KILN_TOKEN", "kiln_wrong").output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // …and the profile's token is never sent to another KILN_SERVER.
    let out = bare(home.path()).args(["runs"]).env("KILN_SERVER", "http://127.0.0.1:9").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("no API token for http://127.0.0.1:9"), "{}", text(&out));
    let out = bare(home.path()).args(["runs"]).env("KILN_CONTEXT", "nope").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("no context `nope`"), "{}", text(&out));

    // A second context from a token file; the same name again replaces it.
    let tf = token_file.to_str().unwrap();
    let out = login(&[&up.url, "--token-file", tf, "--context", "second"], "");
    assert!(stdout(&out).contains("context `second` (added, now current)"), "{}", text(&out));
    let out = login(&[&up.url, "--token-file", tf, "--context", "second"], "");
    assert!(stdout(&out).contains("context `second` (replaced, now current)"), "{}", text(&out));
    let list = stdout(&bare(home.path()).args(["context", "list"]).output().unwrap());
    assert!(list.lines().any(|l| l.starts_with("* second ")) && list.contains("  default "), "{list}");
    let out = bare(home.path()).args(["context", "use", "default"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value =
        serde_json::from_slice(&bare(home.path()).args(["context", "list", "--json"]).output().unwrap().stdout)
            .unwrap();
    assert_eq!(v[0], serde_json::json!({"name": "default", "server": up.url, "current": true}));
    assert!(!v.to_string().contains(&up.token), "listings never show tokens");
    let out = bare(home.path()).args(["runs", "--context", "second", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // `kiln logout` removes the current context; with none left to use and
    // no local kiln up, the CLI says how to log in.
    let out = bare(home.path()).arg("logout").output().unwrap();
    assert!(stdout(&out).contains("context `default`"), "{}", text(&out));
    let out = bare(home.path()).args(["logout", "--context", "second"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = bare(home.path()).args(["runs"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("run `kiln login http://127.0.0.1:7070`"), "{}", text(&out));
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
}

/// With no flags, environment or profile, the CLI finds a running local
/// `kiln up` (`./kiln-data`, or the one registered under
/// $XDG_STATE_HOME/kiln/up); `kiln up` prints the `kiln login` line for
/// elsewhere. A `kiln up` that is gone is not found.
#[test]
fn a_running_local_kiln_up_is_found_without_any_setup() {
    let home = tempfile::tempdir().unwrap();
    let mut up = bare(home.path())
        .args(["up", "--listen", "127.0.0.1:0", "--agents", "1", "--data-dir", "kiln-data"])
        .env("KILN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    let mut printed = vec![];
    for l in lines.by_ref() {
        let l = l.unwrap();
        let done = l.starts_with("export ");
        printed.push(l);
        if done {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let data = std::fs::canonicalize(home.path().join("kiln-data")).unwrap();
    let login = printed.iter().find(|l| l.starts_with("kiln login http://127.0.0.1:")).expect("a login line");
    assert!(login.contains(&format!("--token-file {}", data.join("admin.token").display())), "{printed:?}");

    // In the directory holding ./kiln-data.
    let out = bare(home.path()).args(["runs", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Anywhere else, through the registry in $XDG_STATE_HOME.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = bare(home.path()).current_dir(elsewhere.path()).args(["agents", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Gone (SIGKILL, so nothing was cleaned up): not found any more.
    up.kill().unwrap();
    up.wait().unwrap();
    let out = bare(home.path()).current_dir(elsewhere.path()).args(["runs"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("no API token for http://127.0.0.1:7070"), "{}", text(&out));
}

/// Whether `line` starts with an RFC 3339 UTC time with milliseconds and a space.
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 25
        && b[..24].iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
        && b[24] == b' '
}

/// `kiln status` and `kiln run --follow` show each job's duration and its
/// attempt in words (never an epoch); `--timestamps` prefixes log lines with
/// their time; `kiln run` prints the run's web UI URL.
#[test]
fn durations_timestamps_attempts_and_the_ui_url() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = repo_with("  - name: build\n    steps:\n      - echo first\n      - echo second\n");
    add_repo(&up, "times", &repo);

    let out = kiln(&up, &["run", "--repo", "times", "--follow", "--timestamps"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = stdout(&out);
    let first = log.lines().find(|l| l.ends_with(" first")).unwrap_or_else(|| panic!("{log}"));
    assert!(stamped(first), "{first:?}");
    assert!(log.lines().filter(|l| !l.starts_with("── ")).all(stamped), "every line stamped:\n{log}");
    let err = stderr(&out);
    let run = err.lines().find_map(|l| l.strip_prefix("run ")?.strip_suffix(" accepted")).map(str::to_string);
    let run = run.unwrap_or_else(|| panic!("{err}"));
    assert!(err.contains(&format!("\nweb UI: {}/#/runs/{run}\n", up.url)), "{err}");
    let job_line = err.lines().find(|l| l.starts_with("── build: success")).unwrap_or_else(|| panic!("{err}"));
    assert!(job_line.contains("attempt 1 on local-1"), "{job_line}");
    assert!(job_line.split_whitespace().nth(4).is_some_and(|d| d.ends_with('s')), "a duration: {job_line}");
    assert!(!text(&out).contains("epoch"), "{}", text(&out));

    let status = stdout(&kiln(&up, &["status", &run]));
    assert!(status.contains(&format!("web UI {}/#/runs/{run}", up.url)), "{status}");
    let row = status.lines().find(|l| l.trim_start().starts_with("build ")).unwrap_or_else(|| panic!("{status}"));
    assert!(row.contains("success") && row.contains("attempt 1 on local-1") && !row.contains("epoch"), "{row}");
    assert!(row.split_whitespace().nth(2).is_some_and(|d| d.ends_with('s')), "a duration: {row}");

    let out = kiln(&up, &["logs", &run, "--timestamps"]);
    let log = stdout(&out);
    assert!(log.lines().filter(|l| !l.starts_with("── ")).all(stamped) && log.contains(" second\n"), "{log}");
    let plain = stdout(&kiln(&up, &["logs", &run]));
    assert!(plain.lines().any(|l| l == "first") && !plain.lines().any(stamped), "{plain}");

    // Without --follow: the id on stdout, the page on stderr.
    let out = kiln(&up, &["run", "--repo", "times"]);
    let id = stdout(&out).trim().to_string();
    assert_eq!(stderr(&out).trim(), format!("web UI: {}/#/runs/{id}", up.url));
}

/// A job whose agent is lost runs again; users read "attempt 2 on a2
/// (agent a1 lost)", not epochs.
#[test]
fn a_lost_agent_reads_as_an_attempt_not_an_epoch() {
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let flag = flags.path().join("started");
    let repo = repo_with(&format!(
        "  - name: slow\n    steps:\n      - if [ -e {f} ]; then echo second try; else touch {f}; sleep 120; fi\n",
        f = flag.display()
    ));
    let cli = || server.cli();
    let out = cli().args(["repo", "add", "lost", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let mut a1 = server.agent("a1", &[]).unwrap();
    let out = cli().args(["run", "--repo", "lost"]).output().unwrap();
    let run = stdout(&out).trim().to_string();
    assert!(kiln_testkit::wait_for(std::time::Duration::from_secs(60), || flag.exists().then_some(())).is_some());
    a1.child.kill().unwrap();
    let _ = a1.child.wait();
    let _a2 = server.agent("a2", &[]).unwrap();
    let out = cli().args(["wait", &run]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let status = stdout(&cli().args(["status", &run]).output().unwrap());
    assert!(status.contains("attempt 2 on a2 (agent a1 lost)"), "{status}");
    assert!(!status.contains("epoch"), "{status}");
}

/// `kiln retry RUN --failed`: job 1 succeeded and is pinned (not run again,
/// the same artifact), job 2 failed the first time and runs again, and so
/// does job 3 after it; `--follow` streams the new run.
#[test]
fn retry_failed_pins_the_successful_jobs_and_reruns_the_rest() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let flag = flags.path().join("fixed");
    let repo = repo_with(&format!(
        "  - name: build\n    steps:\n      - mkdir -p out && head -c 4096 /dev/urandom > out/app.bin\n    artifacts:\n      publish:\n        - {{name: app, path: out/app.bin}}\n\
         \x20 - name: test\n    artifacts:\n      restore:\n        - {{from_job: build, name: app, path: in/app.bin}}\n    steps:\n      - echo \"testing $(sha256sum < in/app.bin | cut -d' ' -f1)\"\n      - test -e {f} || {{ echo 'not fixed yet'; exit 1; }}\n\
         \x20 - name: deploy\n    steps:\n      - echo deployed\n",
        f = flag.display()
    ));
    add_repo(&up, "flaky", &repo);
    let run = start_run(&up, "flaky");
    assert_eq!(kiln(&up, &["wait", &run]).status.code(), Some(1));
    let json = |args: &[&str]| -> serde_json::Value { serde_json::from_slice(&kiln(&up, args).stdout).unwrap() };
    let before = json(&["status", &run, "--json"]);
    let statuses = |v: &serde_json::Value| -> Vec<String> {
        v["jobs"].as_array().unwrap().iter().map(|j| j["status"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(statuses(&before), ["success", "failed", "skipped"]);
    let sha = before["jobs"][0]["artifacts"][0]["sha256"].as_str().unwrap().to_string();

    // Still refused for a run that succeeded entirely (checked below), and
    // the flag now makes job 2 pass.
    std::fs::write(&flag, "").unwrap();
    let out = kiln(&up, &["retry", &run, "--failed", "--follow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = stdout(&out);
    assert!(log.contains(&format!("testing {sha}")), "job 2 restored the pinned artifact:\n{log}");
    assert!(log.contains("deployed"), "{log}");
    let err = stderr(&out);
    let child = err.lines().find_map(|l| l.strip_prefix("run ")?.strip_suffix(" accepted")).unwrap().to_string();
    assert!(err.contains("── build: success in ") && err.contains("(pinned: succeeded in run "), "{err}");

    let after = json(&["status", &child, "--json"]);
    assert_eq!(after["parent_run_id"], run.as_str());
    assert_eq!(statuses(&after), ["success", "success", "success"]);
    let build = &after["jobs"][0];
    assert_eq!(build["attempts"].as_array().unwrap().len(), 0, "job 1 did not run again: {build}");
    assert_eq!(build["artifacts"][0]["sha256"], sha.as_str(), "the same bound artifact");
    assert_eq!(build["artifacts"][0]["epoch"], before["jobs"][0]["artifacts"][0]["epoch"]);
    assert!(build["message"].as_str().unwrap().contains(&format!("pinned: succeeded in run {run}")), "{build}");
    assert_eq!(after["jobs"][1]["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(after["jobs"][2]["attempts"].as_array().unwrap().len(), 1);
    // The parent is unchanged: job 1 still ran once.
    assert_eq!(json(&["status", &run, "--json"])["jobs"][0]["attempts"].as_array().unwrap().len(), 1);
    // `kiln artifact get` of the retry gives the very bytes.
    let dl = tempfile::tempdir().unwrap();
    let path = dl.path().join("app.bin");
    let out = kiln(&up, &["artifact", "get", &child, "build", "app", "-o", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let status = stdout(&kiln(&up, &["status", &child]));
    assert!(status.contains("pinned"), "{status}");

    // Nothing failed: nothing to retry from (a plain retry runs everything).
    let out = kiln(&up, &["retry", &child, "--failed"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("no failed job to retry"), "{}", text(&out));
    let out = kiln(&up, &["retry", &child]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `kiln agents` shows each agent's version, and that an agent told to
/// stop (SIGTERM) is draining while its job finishes.
#[test]
fn agents_show_their_version_and_draining() {
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let (started, release) = (flags.path().join("started"), flags.path().join("release"));
    let repo = repo_with(&format!(
        "  - name: long\n    steps:\n      - touch {s}; while [ ! -e {r} ]; do sleep 0.1; done\n",
        s = started.display(),
        r = release.display()
    ));
    let cli = || server.cli();
    let out = cli().args(["repo", "add", "long", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let a1 = server.agent("a1", &[]).unwrap();
    let agents = || -> serde_json::Value {
        serde_json::from_slice(&cli().args(["agents", "--json"]).output().unwrap().stdout).unwrap()
    };
    let v = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        let v = agents();
        (v[0]["connected"] == true).then_some(v)
    })
    .expect("a1 connected");
    assert_eq!(v[0]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v[0]["draining"], false);
    let table = stdout(&cli().arg("agents").output().unwrap());
    let header = table.lines().next().unwrap();
    assert!(header.starts_with("NAME ") && header.contains(" STATE ") && header.contains(" VERSION "), "{table}");
    let row = table.lines().find(|l| l.starts_with("a1 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" idle ") && row.contains(&format!(" {} ", env!("CARGO_PKG_VERSION"))), "{row}");

    let out = cli().args(["run", "--repo", "long"]).output().unwrap();
    let run = stdout(&out).trim().to_string();
    assert!(kiln_testkit::wait_for(std::time::Duration::from_secs(60), || started.exists().then_some(())).is_some());
    a1.signal("TERM");
    let v = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        let v = agents();
        (v[0]["draining"] == true).then_some(v)
    });
    assert!(v.is_some(), "a1 never showed as draining: {}", agents());
    let row = stdout(&cli().arg("agents").output().unwrap());
    assert!(row.lines().any(|l| l.starts_with("a1 ") && l.contains(" 1/1 ") && l.contains(" draining ")), "{row}");
    std::fs::write(&release, "").unwrap();
    assert_eq!(cli().args(["wait", &run]).output().unwrap().status.code(), Some(0), "the drained job finished");
}

/// Issue 41, item 1: a step that exits 127 (a command not found) gets a
/// hint in its log naming the step and who it ran as (under `kiln up` as
/// root: `nobody`, whose PATH has none of the agent user's tools).
#[test]
fn a_command_not_found_gets_a_hint_naming_the_step_and_its_user() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo =
        repo_with("  - name: tools\n    steps:\n      - name: cargo build\n        run: kiln-no-such-tool --version\n");
    add_repo(&up, "tools", &repo);
    let run = start_run(&up, "tools");
    let _ = kiln(&up, &["wait", &run]);
    let log = stdout(&kiln(&up, &["logs", &run]));
    assert!(
        log.contains("hint: exit 127 from `cargo build`: `kiln-no-such-tool` was not found on the step's PATH"),
        "{log}"
    );
    let who = if nix::unistd::geteuid().is_root() { "ran as nobody" } else { "ran as the agent's own user" };
    assert!(log.contains(who), "{log}");
}

/// An executable script `name` printing `says` in `dir` (created).
fn tool(dir: &std::path::Path, name: &str, says: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join(name);
    std::fs::write(&f, format!("#!/bin/sh\necho {says}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Issue 41, item 1: the agent passes environment and tools through to
/// host steps — `--env NAME=VALUE`, `--env NAME` (the agent's own value),
/// `--env-file`, `--path DIR` — and the toolchains of the step user's home
/// (here the agent's own user, whose HOME holds `.rustup` and
/// `.cargo/bin`), all below the workflow's `env:`; a `KILN_*` name is
/// refused at start.
#[test]
fn host_steps_get_the_agents_env_path_and_the_users_toolchains() {
    use std::os::unix::fs::PermissionsExt;
    let root = nix::unistd::geteuid().is_root();
    let dir = kiln_testkit::step_writable_tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".rustup")).unwrap();
    tool(&home.join(".cargo/bin"), "kiln-cargo-tool", "cargo-tool-ran");
    let opt = dir.path().join("opt/bin");
    tool(&opt, "kiln-path-tool", "path-tool-ran");
    for d in [dir.path().to_path_buf(), dir.path().join("opt"), opt.clone(), home.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let env_file = dir.path().join("agent.env");
    std::fs::write(&env_file, "# for the steps\nexport FROM_FILE=\"file value\"\n").unwrap();
    let (opt_s, env_s) = (opt.to_str().unwrap(), env_file.to_str().unwrap());
    let mut flags =
        vec!["--env", "GREETING=hello", "--env", "PASSED_IN", "--env", "OVERRIDDEN=agent", "--env-file", env_s];
    flags.extend(["--path", opt_s]);
    // As root, the steps run as root too (`--step-user root`): the HOME
    // below is then their user's, as it is for a non-root agent.
    if root {
        flags.extend(["--step-user", "root"]);
    }
    let up = KilnUp::start_env(
        BIN.as_ref(),
        1,
        &flags,
        &[("PASSED_IN", "from the agent"), ("HOME", home.to_str().unwrap()), ("RUSTUP_HOME", ""), ("CARGO_HOME", "")],
    )
    .unwrap();
    let repo = repo_with(
        "  - name: tools\n    env:\n      OVERRIDDEN: workflow\n    steps:\n      - echo \"g=$GREETING p=$PASSED_IN f=$FROM_FILE o=$OVERRIDDEN\"\n      - echo \"rustup=$RUSTUP_HOME cargo=$CARGO_HOME home-is-private=$([ \"$HOME\" != \"$CARGO_HOME/..\" ] && echo yes)\"\n      - kiln-cargo-tool\n      - kiln-path-tool\n",
    );
    add_repo(&up, "tools", &repo);
    let run = start_run(&up, "tools");
    let waited = kiln(&up, &["wait", &run]);
    let log = stdout(&kiln(&up, &["logs", &run]));
    assert!(waited.status.success(), "{log}\n{}", up.log());
    assert!(log.contains("g=hello p=from the agent f=file value o=workflow"), "{log}");
    let h = home.display();
    assert!(log.contains(&format!("rustup={h}/.rustup cargo={h}/.cargo home-is-private=yes")), "{log}");
    assert!(log.contains("cargo-tool-ran") && log.contains("path-tool-ran"), "{log}");
    assert!(up.log().contains("host steps get the toolchains in"), "{}", up.log());

    // A flag naming Kiln's own variables is refused before anything starts.
    let data = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("d"))
        .args(["--env", "KILN_AGENT_TOKEN"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("KILN_* variables are Kiln's own"), "{}", text(&out));
    assert!(!data.path().join("d").join("admin.token").exists(), "nothing started");
}

/// Issue 41, item 1: under a root agent, steps run as `nobody`, who cannot
/// search a root-only directory: a tool there exits 127, and the hint
/// names the tool, the step user and the PATH entry it cannot reach.
#[test]
fn a_tool_the_step_user_cannot_reach_is_named_in_the_hint() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (steps as nobody)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin = dir.path().join("bin");
    tool(&bin, "kiln-root-only-tool", "unreachable");
    let up = KilnUp::start_with(BIN.as_ref(), 1, &["--path", bin.to_str().unwrap()]).unwrap();
    let warned = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        up.log().contains("who cannot reach these PATH entries").then_some(())
    });
    assert!(warned.is_some(), "{}", up.log());
    let repo = repo_with("  - name: tools\n    steps:\n      - name: build\n        run: kiln-root-only-tool\n");
    add_repo(&up, "tools", &repo);
    let run = start_run(&up, "tools");
    let _ = kiln(&up, &["wait", &run]);
    let log = stdout(&kiln(&up, &["logs", &run]));
    assert!(log.contains("hint: exit 127 from `build`: `kiln-root-only-tool` was not found"), "{log}");
    assert!(log.contains("ran as nobody"), "{log}");
    assert!(log.contains(&format!("cannot reach these PATH entries of the agent: {}", bin.display())), "{log}");
}

/// Issue 41, item 6: `kiln run` without `--workflow` runs the only
/// workflow, or every workflow whose `on:` declares `manual`, or lists them
/// and says how to pick; `kiln workflows` lists them; a workflow that does
/// not exist is answered with those that do.
#[test]
fn workflows_are_found_not_guessed() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let job = |say: &str| format!("jobs:\n  - name: j\n    steps:\n      - echo {say}\n");
    // One workflow, not named pipeline.yaml: `kiln run` runs it.
    let only = TestRepo::new(&[(".kiln/build.yml", &format!("version: 1\n{}", job("only-one-ran")))]).unwrap();
    add_repo(&up, "only", &only);
    let out = kiln(&up, &["run", "--repo", "only", "--follow"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("only-one-ran"), "{}", text(&out));

    // Several: the two that declare `manual` start, each a run of its own.
    let many = TestRepo::new(&[
        (".kiln/ci.yaml", &format!("version: 1\non: [push, manual]\n{}", job("ci-ran"))),
        (".kiln/release.yaml", &format!("version: 1\non:\n  manual: {{}}\n{}", job("release-ran"))),
        (
            ".kiln/nightly.yaml",
            &format!("version: 1\non:\n  schedule:\n    - cron: '0 3 * * *'\n{}", job("nightly-ran")),
        ),
        (".kiln/broken.yaml", "version: 1\njobs: 3\n"),
    ])
    .unwrap();
    add_repo(&up, "many", &many);
    let listed = kiln(&up, &["workflows", "many"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let table = stdout(&listed);
    let row = |p: &str| table.lines().find(|l| l.starts_with(p)).unwrap_or_else(|| panic!("{p}: {table}")).to_string();
    assert!(row(".kiln/ci.yaml ").contains("yes     yes      push, manual"), "{table}");
    assert!(row(".kiln/release.yaml ").contains("yes     yes      manual"), "{table}");
    assert!(row(".kiln/nightly.yaml ").contains("no               schedule"), "{table}");
    assert!(row(".kiln/broken.yaml ").contains("invalid: "), "{table}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&kiln(&up, &["workflows", "many", "--json"]))).unwrap();
    assert_eq!(json["selected"], serde_json::json!([".kiln/ci.yaml", ".kiln/release.yaml"]), "{json}");
    let out = kiln(&up, &["run", "--repo", "many", "--follow"]);
    assert!(out.status.success(), "{}", text(&out));
    let (o, e) = (stdout(&out), stderr(&out));
    assert!(e.contains("starting 2 runs, one per workflow started by hand: .kiln/ci.yaml, .kiln/release.yaml"), "{e}");
    assert!(o.contains("ci-ran") && o.contains("release-ran") && !o.contains("nightly-ran"), "{o}");

    // A name that is not there: the error lists those that are.
    let out = kiln(&up, &["run", "--repo", "many", "--workflow", ".kiln/pipeline.yaml"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        stderr(&out).contains(
            "the workflows there are: .kiln/broken.yaml, .kiln/ci.yaml, .kiln/nightly.yaml, .kiln/release.yaml; \
             pick one with --workflow PATH (`kiln workflows many` lists them)"
        ),
        "{}",
        text(&out)
    );

    // Several and none started by hand: nothing runs, the choices are listed.
    let none = TestRepo::new(&[
        (".kiln/a.yaml", &format!("version: 1\non: push\n{}", job("a"))),
        (".kiln/b.yaml", &format!("version: 1\non: push\n{}", job("b"))),
    ])
    .unwrap();
    add_repo(&up, "none", &none);
    let out = kiln(&up, &["run", "--repo", "none"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        stderr(&out).contains("none is the default (.kiln/pipeline.yaml) or declares `on: [manual]`"),
        "{}",
        text(&out)
    );
    assert!(stderr(&out).contains("kiln run --repo none --workflow .kiln/b.yaml"), "{}", text(&out));
    let runs = stdout(&kiln(&up, &["runs", "--repo", "none", "--json"]));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&runs).unwrap(), serde_json::json!([]), "{runs}");
}

/// Run numbers (issue 42): runs are numbered per repository and named as
/// `REPO#N` (or `N --repo REPO`) by every command; `kiln runs` and `kiln
/// status` show the number, workflow, commit title, branch and who started
/// it by name (`admin`, never `admin.token`; a token's name).
#[test]
fn runs_are_numbered_per_repository_and_named_by_number() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let hello = repo_with("  - name: greet\n    steps:\n      - echo hello-from-$KILN_RUN_ID\n");
    hello.commit(&[], "Say hello to the world").unwrap();
    add_repo(&up, "hello", &hello);
    let other = repo_with("  - name: x\n    steps:\n      - echo x\n");
    add_repo(&up, "other", &other);
    let first = start_run(&up, "hello");
    let elsewhere = start_run(&up, "other");
    let out = kiln(&up, &["token", "create", "--name", "release-bot", "--scope", "admin"]);
    assert!(out.status.success(), "{}", text(&out));
    let bot = stdout(&out).trim().to_string();
    let out = up.cli().env("KILN_TOKEN", &bot).args(["run", "--repo", "hello"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let second = stdout(&out).trim().to_string();
    for r in [&first, &elsewhere, &second] {
        assert_eq!(kiln(&up, &["wait", r]).status.code(), Some(0));
    }
    let json = |args: &[&str]| -> serde_json::Value {
        let out = kiln(&up, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };

    // hello#1, hello#2 and other#1: numbered per repository.
    for (run, repo, number) in [(&first, "hello", 1), (&second, "hello", 2), (&elsewhere, "other", 1)] {
        let v = json(&["status", run, "--json"]);
        assert_eq!((v["repo"].as_str(), v["number"].as_i64()), (Some(repo), Some(number)), "{v}");
    }
    // Every command takes REPO#N, or N with --repo.
    assert_eq!(json(&["status", "hello#2", "--json"])["id"], second.as_str());
    assert_eq!(json(&["status", "1", "--repo", "other", "--json"])["id"], elsewhere.as_str());
    let status = stdout(&kiln(&up, &["status", "hello#2"]));
    assert!(status.starts_with(&format!("run hello#2  success  {second}\n")), "{status}");
    assert!(status.contains("title Say hello to the world") && status.contains("by release-bot"), "{status}");
    let logs = kiln(&up, &["logs", "2", "--repo", "hello"]);
    assert!(stdout(&logs).contains(&format!("hello-from-{second}")), "{}", text(&logs));
    assert_eq!(kiln(&up, &["wait", "hello#1"]).status.code(), Some(0));
    let v = json(&["artifact", "list", "hello#1", "--json"]);
    assert_eq!(v, serde_json::json!([]));

    // What does not name a run says what to write instead.
    let out = kiln(&up, &["status", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("write REPOSITORY#2 (e.g. hello#2), or with the CLI pass --repo"), "{}", text(&out));
    let out = kiln(&up, &["status", "hello#3"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("repository hello has no run #3"), "{}", text(&out));
    let out = kiln(&up, &["status", "nope#1"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = kiln(&up, &["status", &first[..8], "--repo", "hello"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("--repo hello goes with a run number"), "{}", text(&out));

    // The table: #, workflow, branch, who, title.
    let table = stdout(&kiln(&up, &["runs", "--repo", "hello"]));
    let header = table.lines().next().unwrap();
    for col in ["RUN", "#", "WORKFLOW", "BRANCH/PR", "ACTOR", "TITLE"] {
        assert!(header.split_whitespace().any(|c| c == col), "{col} in {header}");
    }
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    for (row, number, actor) in [(rows[0], "#2", "release-bot"), (rows[1], "#1", "admin")] {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], number, "{row}");
        assert!(cols.contains(&"pipeline") && cols.contains(&"main") && cols.contains(&actor), "{row}");
        assert!(row.ends_with("Say hello to the world"), "{row}");
    }
    assert!(!table.contains("admin.token"), "{table}");
    // And the JSON carries them (additively).
    let list = json(&["runs", "--repo", "hello", "--json"]);
    assert_eq!(list[0]["number"], 2);
    assert_eq!(list[0]["workflow"], "pipeline");
    assert_eq!(list[0]["commit_title"], "Say hello to the world");
    assert_eq!(list[0]["actor"], "release-bot");
    assert_eq!(list[1]["actor"], "admin");
}

/// Issue 42 (CLI): a client command's --help has no daemon logging flags,
/// the daemons group theirs under headings; `kiln man --dir` writes a page
/// per subcommand; `kiln --version` names the commit; a global flag before
/// a subcommand that has no such flag is refused.
#[test]
fn help_is_per_command_man_pages_per_subcommand_and_the_version_names_the_commit() {
    let help = |args: &[&str]| stdout(&Command::new(BIN).args(args).env_remove("KILN_SERVER").output().unwrap());
    let status = help(&["status", "--help"]);
    for daemon_only in ["--log-format", "--otlp-endpoint", "--otlp-protocol"] {
        assert!(!status.contains(daemon_only), "{status}");
    }
    let agent = help(&["agent", "--help"]);
    let heading = agent.find("Logging and tracing:").expect(&agent);
    assert!(agent[heading..].contains("--log-format") && agent[heading..].contains("--otlp-endpoint"), "{agent}");
    let up = help(&["up", "--help"]);
    for h in [
        "Network:",
        "Server: storage, scheduling, limits:",
        "Agent: executor, capacity, limits:",
        "Logging and tracing:",
    ] {
        assert!(up.contains(h), "{h}: {up}");
    }
    assert!(help(&["server", "--help"]).contains("Logging and tracing:"));
    // A client command refuses the daemon flag; a daemon still takes it.
    let out = Command::new(BIN).args(["status", "abc", "--log-format", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = Command::new(BIN).args(["server", "--log-format", "json", "--lease-ttl", "soon"]).output().unwrap();
    assert!(stderr(&out).contains("invalid duration `soon`"), "{}", text(&out));

    // `kiln man --dir DIR`: kiln.1 and a page per (visible) subcommand.
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = Command::new(BIN).args(["man", "--dir"]).arg(&pages).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for page in ["kiln.1", "kiln-run.1", "kiln-runs.1", "kiln-logs.1", "kiln-repo-add.1", "kiln-man.1"] {
        let roff = std::fs::read_to_string(pages.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(roff.contains(".TH"), "{page}: {roff}");
    }
    assert!(std::fs::read_to_string(pages.join("kiln-run.1")).unwrap().contains("follow"));
    assert!(!pages.join("kiln-bench.1").exists(), "the hidden bench gets no page");
    let out = Command::new(BIN).arg("man").output().unwrap();
    assert!(out.status.success() && stdout(&out).contains(".TH kiln"), "{}", text(&out));

    // `kiln --version`: `kiln 0.1.0 (abc1234 2026-12-06)`, the commit of this checkout.
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let version = stdout(&out);
    assert!(version.starts_with(&format!("kiln {} (", env!("CARGO_PKG_VERSION"))), "{version}");
    let head =
        Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output();
    if let Ok(head) = head
        && head.status.success()
    {
        let sha = stdout(&head).trim().to_string();
        assert!(version.contains(&format!("({sha} ")), "{version} names {sha}");
    }

    // A global flag before a subcommand that has no such flag of its own.
    let out = Command::new(BIN).args(["--json", "logs", "abc"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("`kiln logs` takes no --json"), "{}", text(&out));
}

/// Issue 42: `kiln validate` without FILE validates every workflow of the
/// checkout it is run in (from a subdirectory too).
#[test]
fn validate_without_a_file_checks_every_workflow_of_the_checkout() {
    let repo = TestRepo::new(&[
        (".kiln/good.yaml", "version: 1\njobs:\n  - name: ok\n    steps:\n      - echo ok\n"),
        (".kiln/bad.yml", "version: 1\njobs:\n  - name: broken\n    stepz:\n      - echo\n"),
        ("src/lib.txt", "x\n"),
    ])
    .unwrap();
    let out = Command::new(BIN).arg("validate").current_dir(repo.path().join("src")).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stdout(&out).contains("good.yaml: valid (1 jobs"), "{}", text(&out));
    assert!(stderr(&out).contains("bad.yml:"), "{}", text(&out));
    assert!(stderr(&out).contains("1 of 2 workflow(s) invalid"), "{}", text(&out));

    std::fs::remove_file(repo.path().join(".kiln/bad.yml")).unwrap();
    let out = Command::new(BIN).arg("validate").current_dir(repo.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains(".kiln/good.yaml: valid"), "{}", text(&out));

    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).arg("validate").current_dir(elsewhere.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("is not inside a git checkout"), "{}", text(&out));
}

/// Issue 42: kubectl-style global flags, `kiln runs --event`, `kiln logs
/// RUN test` for a matrix job's expansions, and empty lists that say what to do.
#[test]
fn global_flags_event_filter_matrix_logs_and_empty_lists() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    // Empty lists: a hint on stderr, nothing on stdout; --json unchanged.
    let out = kiln(&up, &["runs"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("no runs yet; start one with `kiln run"), "{}", text(&out));
    assert_eq!(stdout(&kiln(&up, &["runs", "--json"])).trim(), "[]");
    assert_eq!(stdout(&kiln(&up, &["--json", "runs"])).trim(), "[]");
    let out = kiln(&up, &["repo", "list"]);
    assert!(stderr(&out).contains("no repositories yet; register one with `kiln repo add"), "{}", text(&out));

    let repo = repo_with(
        "  - name: test\n    matrix: {py: [\"3.10\", \"3.11\"]}\n    steps:\n      - echo testing on ${{ matrix.py }}\n",
    );
    add_repo(&up, "mx", &repo);
    let out = kiln(&up, &["secret", "list", "mx"]);
    assert!(stderr(&out).contains("no secrets in mx; set one with"), "{}", text(&out));
    let run = start_run(&up, "mx");
    let out = kiln(&up, &["wait", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // `kiln logs RUN test`: both expansions, in order, each with its header.
    let out = kiln(&up, &["logs", &run, "test"]);
    assert!(out.status.success(), "{}", text(&out));
    let logs = stdout(&out);
    let order: Vec<usize> = ["── test (py=3.10) ──", "testing on 3.10", "── test (py=3.11) ──", "testing on 3.11"]
        .iter()
        .map(|s| logs.find(s).unwrap_or_else(|| panic!("{s}: {logs}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{logs}");
    let out = kiln(&up, &["logs", &run, "tset"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("its jobs are: test (py=3.10), test (py=3.11)"), "{}", text(&out));

    // Global flags before the subcommand, kubectl-style: `--server` beats KILN_SERVER.
    let out = up.cli().env("KILN_SERVER", "http://127.0.0.1:9").args(["--server", &up.url, "runs"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("mx"), "{}", text(&out));
    let out = kiln(&up, &["--json", "runs", "--event", "manual"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["event"], "manual");
    let out = kiln(&up, &["runs", "--event", "push"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("no runs match these filters"), "{}", text(&out));
    let out = kiln(&up, &["runs", "--event", "nonsense"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Agents as an operator reads them (issue 42): a `kiln up` restart with
/// fewer agents leaves no ghost; a busy agent's row names its job; "last
/// seen" moves while an agent is connected; an agent that dies is
/// forgotten after `--agent-expiry`, in the audit log.
#[test]
fn agents_leave_no_ghosts_say_their_job_and_expire_when_gone() {
    use std::time::Duration;
    let json = |cli: &mut Command| -> serde_json::Value {
        let out = cli.output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)))
    };
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> =
            v.as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    };
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let agents = |up: &KilnUp| json(up.cli().args(["agents", "--json"]));
    assert!(
        kiln_testkit::wait_for(Duration::from_secs(30), || (names(&agents(&up)) == ["local-1", "local-2"])
            .then_some(()))
        .is_some()
    );
    let up = up.restart(1, &[]).unwrap();
    let list = kiln_testkit::wait_for(Duration::from_secs(30), || {
        let v = agents(&up);
        // Not an empty list: right after the restart, before local-1
        // registered again, every agent of none is connected.
        let listed = v.as_array().unwrap();
        (!listed.is_empty() && listed.iter().all(|a| a["connected"] == true)).then_some(v)
    })
    .expect("local-1 connected again");
    assert_eq!(names(&list), ["local-1"], "no ghost local-2 after `kiln up --agents 1`: {list}");
    let audit = stdout(&kiln(&up, &["audit"]));
    assert!(audit.contains("agent.remove") && audit.contains("local-2: kiln up now runs 1 local agent(s)"), "{audit}");

    // A busy agent's row names its job, in JSON and in the table.
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let go = flags.path().join("go");
    let repo = repo_with(&format!(
        "  - name: slow\n    steps:\n      - while [ ! -e {g} ]; do sleep 0.1; done\n",
        g = go.display()
    ));
    add_repo(&up, "busy", &repo);
    let run = start_run(&up, "busy");
    let job = kiln_testkit::wait_for(Duration::from_secs(60), || {
        let v = agents(&up);
        v[0]["jobs"].as_array().and_then(|j| j.first().cloned())
    })
    .expect("the agent runs the job");
    assert_eq!(
        (job["repo"].as_str(), job["run_number"].as_i64(), job["job"].as_str()),
        (Some("busy"), Some(1), Some("slow"))
    );
    let table = stdout(&kiln(&up, &["agents"]));
    assert!(table.contains("STATE") && table.contains("RUNNING") && table.contains("LAST SEEN"), "{table}");
    let row = table.lines().find(|l| l.starts_with("local-1")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("busy") && row.contains("busy#1 slow") && row.contains(" ago"), "{table}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(kiln(&up, &["wait", &run]).status.code(), Some(0));
    drop(up);

    // "Last seen" follows a connected agent; a dead one expires.
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &["--lease-ttl", "3s", "--agent-expiry", "3s"]).unwrap();
    let mut ext = server.agent("ext", &[]).unwrap();
    let first = kiln_testkit::wait_for(Duration::from_secs(30), || {
        json(server.cli().args(["agents", "--json"])).as_array().and_then(|a| a.first().cloned())
    })
    .expect("registered");
    let registered = first["created_at_ms"].as_i64().unwrap();
    let seen = kiln_testkit::wait_for(Duration::from_secs(30), || {
        let v = json(server.cli().args(["agents", "--json"]));
        v[0]["last_seen_at_ms"].as_i64().filter(|&t| t > registered + 1000)
    });
    assert!(seen.is_some(), "last seen moves while the agent is connected");
    assert_eq!(names(&json(server.cli().args(["agents", "--json"]))), ["ext"], "a connected agent never expires");
    ext.child.kill().unwrap();
    let _ = ext.child.wait();
    let gone = kiln_testkit::wait_for(Duration::from_secs(60), || {
        json(server.cli().args(["agents", "--json"])).as_array().unwrap().is_empty().then_some(())
    });
    assert!(gone.is_some(), "the dead agent expired");
    let audit = stdout(&server.cli().args(["audit"]).output().unwrap());
    assert!(audit.contains("agent.expire") && audit.contains("ext: not seen for 3s"), "{audit}");
}

/// Progress on long work (issue 42): `kiln run --follow` streams parallel
/// jobs at once, each line prefixed with its job (not one job after the
/// other); `kiln wait` on a terminal shows where the run stands.
#[test]
fn follow_interleaves_parallel_jobs_and_wait_shows_progress_on_a_terminal() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let flags = kiln_testkit::step_writable_tempdir().unwrap();
    let b_done = flags.path().join("b-done");
    // `a` cannot end before `b` printed: followed one after the other, all
    // of a's lines would come first.
    let repo = repo_with(&format!(
        "  - name: a\n    steps:\n      - echo a-start\n      - while [ ! -e {f} ]; do sleep 0.1; done\n      - echo a-end\n\
         \x20 - name: b\n    needs: []\n    steps:\n      - echo b-line\n      - touch {f}\n",
        f = b_done.display()
    ));
    add_repo(&up, "par", &repo);
    let out = kiln(&up, &["run", "--repo", "par", "--follow"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let logs = stdout(&out);
    let at = |s: &str| logs.find(s).unwrap_or_else(|| panic!("{s}: {logs}"));
    assert!(at("b | b-line") < at("a | a-end"), "parallel jobs interleave: {logs}");
    assert!(logs.lines().filter(|l| !l.is_empty()).all(|l| l.starts_with("a | ") || l.starts_with("b | ")), "{logs}");
    assert!(stderr(&out).contains("── a: success") && stderr(&out).contains("── b: success"), "{}", text(&out));

    // `kiln wait` under a terminal (util-linux `script` gives it a pty).
    let go = flags.path().join("go");
    let repo = repo_with(&format!(
        "  - name: slow\n    steps:\n      - while [ ! -e {g} ]; do sleep 0.1; done\n  - name: after\n    needs: [slow]\n    steps:\n      - echo after\n",
        g = go.display()
    ));
    add_repo(&up, "prog", &repo);
    let run = start_run(&up, "prog");
    let mut child = Command::new("script")
        .args(["-qec", &format!("{} wait {run}", up.bin.display()), "/dev/null"])
        .env("KILN_SERVER", &up.url)
        .env("KILN_TOKEN", &up.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let mut buf = Vec::new();
    // The progress line is redrawn with \r: read up to each \r or \n.
    while !seen.contains("prog#1: 0/2 jobs done, 1 running, 1 blocked on needs") {
        buf.clear();
        if reader.read_until(b'\r', &mut buf).unwrap() == 0 {
            panic!("kiln wait ended without the progress line: {seen}");
        }
        seen.push_str(&String::from_utf8_lossy(&buf));
    }
    std::fs::write(&go, "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{seen}{rest}");
    assert!(rest.contains(&format!("run {run} success")) || rest.contains("success"), "{rest}");
}

/// A long transfer says how far it got in the job's log (issue 42): a
/// 5 MiB artifact uploaded at 1 MiB/s takes seconds, and its progress
/// lines name the artifact, the bytes and the rate.
#[test]
fn a_long_upload_reports_its_progress_in_the_job_log() {
    let up = KilnUp::start_with(BIN.as_ref(), 1, &["--upload-rate-limit", "1MiB"]).unwrap();
    let repo = repo_with(
        "  - name: build\n    steps:\n      - head -c 5242880 /dev/urandom > big.bin\n    artifacts:\n      publish:\n        - {name: big, path: big.bin}\n",
    );
    add_repo(&up, "big", &repo);
    let run = start_run(&up, "big");
    let out = kiln(&up, &["wait", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let logs = stdout(&kiln(&up, &["logs", &run, "build"]));
    let progress = logs.lines().find(|l| l.contains("uploading artifact `big`: ") && l.contains(" of 5.0 MiB ("));
    let line = progress.unwrap_or_else(|| panic!("no progress line: {logs}"));
    assert!(line.contains("%), ") && line.ends_with("/s"), "{line}");
}

/// Issue 42: `kiln retry RUN --job NAME` runs that job and the jobs that
/// need it again, in a new run whose other successes are pinned; `kiln
/// cancel RUN --job NAME` stops one job while the rest of the run goes on
/// (what needs it is skipped, the run ends failed). What cannot be done is
/// refused saying why, and neither a read token nor another repository's
/// trigger token may do either.
#[test]
fn one_job_is_retried_or_cancelled_on_its_own() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let out = kiln(&up, args);
        assert!(out.status.success(), "kiln {args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let attempts = |v: &serde_json::Value, job: &str| -> usize {
        let j = v["jobs"].as_array().unwrap().iter().find(|j| j["name"] == job).unwrap();
        j["attempts"].as_array().unwrap().len()
    };
    let status_of = |v: &serde_json::Value, job: &str| -> String {
        let j = v["jobs"].as_array().unwrap().iter().find(|j| j["name"] == job).unwrap();
        j["status"].as_str().unwrap().to_string()
    };

    // build → test; lint on its own. Everything succeeds.
    let repo = repo_with(
        "  - name: build\n    needs: []\n    steps: [echo built]\n\
         \x20 - name: test\n    needs: [build]\n    steps: [echo tested]\n\
         \x20 - name: lint\n    needs: []\n    steps: [echo linted]\n",
    );
    add_repo(&up, "shop", &repo);
    let run = start_run(&up, "shop");
    assert_eq!(kiln(&up, &["wait", &run]).status.code(), Some(0));

    // A job the run does not have is named, with the jobs it has.
    let out = kiln(&up, &["retry", &run, "--job", "nope"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stderr(&out).contains("has no job `nope` (its jobs: build, test, lint)"), "{}", text(&out));
    // --job and --failed are two different retries.
    let out = kiln(&up, &["retry", &run, "--job", "build", "--failed"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // Re-running a job that succeeded runs it and what needs it again.
    let out = kiln(&up, &["retry", &run, "--job", "build"]);
    assert!(out.status.success(), "{}", text(&out));
    let child = stdout(&out).trim().to_string();
    assert_eq!(kiln(&up, &["wait", &child]).status.code(), Some(0));
    let after = json(&["status", &child, "--json"]);
    assert_eq!(after["parent_run_id"], run.as_str());
    assert_eq!((attempts(&after, "build"), attempts(&after, "test"), attempts(&after, "lint")), (1, 1, 0));
    // Only downstream of the job named: build is pinned when test re-runs.
    let out = kiln(&up, &["retry", &run, "--job", "test", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let child = v["run_id"].as_str().unwrap().to_string();
    assert_eq!(kiln(&up, &["wait", &child]).status.code(), Some(0));
    let after = json(&["status", &child, "--json"]);
    assert_eq!((attempts(&after, "build"), attempts(&after, "test"), attempts(&after, "lint")), (0, 1, 0));

    // slow (held at a gate) → after; quick on its own.
    let gate = kiln_testkit::step_writable_tempdir().unwrap();
    let repo = repo_with(&format!(
        "  - name: slow\n    needs: []\n    steps:\n      - echo started; while [ ! -e {g}/go ]; do sleep 0.05; done\n\
         \x20 - name: after\n    needs: [slow]\n    steps: [echo never]\n\
         \x20 - name: quick\n    needs: []\n    steps: [echo quick]\n",
        g = gate.path().display()
    ));
    add_repo(&up, "gated", &repo);
    let run = start_run(&up, "gated");
    poll(&up, &["status", &run, "--json"], |s| {
        serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| status_of(&v, "slow") == "running")
    });

    // A job of a run still going is not re-run.
    let out = kiln(&up, &["retry", &run, "--job", "quick"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        stderr(&out).contains("has jobs that have not ended; re-run a job once the run has ended"),
        "{}",
        text(&out)
    );

    // Neither a read token nor a trigger token of another repository may
    // cancel or re-run a job.
    let reader = stdout(&kiln(&up, &["token", "create", "--name", "reader", "--scope", "read"])).trim().to_string();
    let out = kiln(&up, &["token", "create", "--name", "shop-bot", "--scope", "trigger", "--repo", "shop"]);
    assert!(out.status.success(), "{}", text(&out));
    let trigger = stdout(&out).trim().to_string();
    for token in [&reader, &trigger] {
        for args in [["cancel", run.as_str(), "--job", "slow"], ["retry", run.as_str(), "--job", "slow"]] {
            let out = up.cli().env("KILN_TOKEN", token).args(args).output().unwrap();
            assert_eq!(out.status.code(), Some(4), "{args:?}: {}", text(&out));
        }
    }
    assert_eq!(status_of(&json(&["status", &run, "--json"]), "slow"), "running", "the refusals changed nothing");

    // Cancelling the running job stops it; the rest of the run goes on.
    let out = kiln(&up, &["cancel", &run, "--job", "slow"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = stdout(&out);
    assert!(said.contains("job slow running — stop requested (this job only)"), "{said}");
    assert_eq!(kiln(&up, &["wait", &run]).status.code(), Some(1), "a cancelled job fails its run");
    let done = json(&["status", &run, "--json"]);
    assert_eq!(done["status"], "failed");
    assert_eq!(
        (status_of(&done, "slow"), status_of(&done, "after"), status_of(&done, "quick")),
        ("cancelled".into(), "skipped".into(), "success".into())
    );
    let slow = done["jobs"].as_array().unwrap().iter().find(|j| j["name"] == "slow").unwrap();
    assert_eq!(slow["attempts"][0]["outcome"], "cancelled", "{slow}");

    // Nothing is left to cancel in a run that has ended.
    let out = kiln(&up, &["cancel", &run, "--job", "after"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(stderr(&out).contains("is failed: there is no job of it left to cancel"), "{}", text(&out));

    // A waiting job is cancelled at once.
    let run = start_run(&up, "gated");
    poll(&up, &["status", &run, "--json"], |s| {
        serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| status_of(&v, "slow") == "running")
    });
    let out = kiln(&up, &["cancel", &run, "--job", "after"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("job after cancelled"), "{}", text(&out));
    std::fs::write(gate.path().join("go"), "").unwrap();
    assert_eq!(kiln(&up, &["wait", &run]).status.code(), Some(1));
    let done = json(&["status", &run, "--json"]);
    assert_eq!(
        (status_of(&done, "slow"), status_of(&done, "after"), status_of(&done, "quick")),
        ("success".into(), "cancelled".into(), "success".into())
    );
}
