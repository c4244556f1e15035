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

    // `kiln agents`: name, labels, running/capacity, connected.
    let out = kiln(&up, &["agents"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = stdout(&out);
    let row = table.lines().find(|l| l.starts_with("local-1 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(&format!("arch={arch},os={os}")), "{row}");
    assert!(row.contains(" 0/1 ") && row.contains(" yes "), "{row}");
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
    assert_eq!(ids(&["runs", "--json", "--branch", "main"]), std::slice::from_ref(&on_main));
    assert_eq!(ids(&["runs", "--json", "--repo", "good", "--branch", "main"]), std::slice::from_ref(&on_main));
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
