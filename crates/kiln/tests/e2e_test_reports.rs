//! Test reports end to end (issue 43) with the real `kiln` binary, real
//! agents and real test runners: pytest's `--junitxml`, cargo-nextest's
//! JUnit (with its own retries) and Node's TAP reporter produce the
//! reports; `kiln tests` shows the per-test rows; flaky tests are flagged
//! when the run ends; quarantine lets exactly the right jobs through (the
//! six gate cases); a hostile report never changes a job's own outcome.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo, wait_run};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kiln-reports/tests/fixtures");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn cli(up: &KilnUp, args: &[&str]) -> (bool, String, String) {
    let o = up.cli().args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn logs(up: &KilnUp, run: &str) -> String {
    let (_, out, err) = cli(up, &["logs", run]);
    format!("{out}{err}")
}

async fn run_to_end(up: &KilnUp, c: &Client, repo: &str, sha: &str) -> (kiln_api::Run, String) {
    let body = SubmitRun { commit_sha: sha.into(), ..Default::default() };
    let id = c.submit_run(repo, &body, None).await.unwrap().run_id;
    let run = wait_run(c, &id, 600).await;
    let log = logs(up, &id);
    (run, log)
}

fn tests_json(up: &KilnUp, run: &str) -> kiln_api::RunTests {
    let (ok, out, err) = cli(up, &["tests", run, "--json"]);
    assert!(ok, "kiln tests: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn row<'a>(t: &'a kiln_api::RunTests, id: &str) -> &'a kiln_api::TestRow {
    t.tests
        .iter()
        .find(|r| r.test.id == id)
        .unwrap_or_else(|| panic!("no test `{id}` in {:#?}", t.tests.iter().map(|r| &r.test.id).collect::<Vec<_>>()))
}

const RUNNERS: &str = r#"version: 1
jobs:
  - name: pytest
    needs: []
    reports: {junit: ["reports/*.xml"]}
    steps:
      - /usr/bin/python3 -m pytest -p no:cacheprovider --junitxml=reports/pytest.xml tests
  - name: node
    needs: []
    reports: {tap: [out.tap]}
    steps:
      - node --test --test-reporter=tap sample.test.mjs > out.tap
  - name: nextest
    needs: []
    reports:
      junit: [target/nextest/ci/junit.xml]
    steps:
      - cargo nextest run --offline --profile ci --no-fail-fast
"#;

/// Real runners' reports become per-test rows: outcomes, messages, runner
/// retries; nextest's own retries flag its flaky test when the run ends.
#[tokio::test(flavor = "multi_thread")]
async fn pytest_nextest_and_tap_reports_become_per_test_rows() {
    let home = std::env::var("HOME").unwrap_or_default();
    let has_cargo = std::path::Path::new(&home).join(".cargo/bin/cargo").exists();
    let nextest =
        std::process::Command::new("cargo-nextest").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_cargo || !nextest {
        panic!("this test needs rustup's cargo in ~/.cargo and cargo-nextest (scripts/test installs it)");
    }
    // A root agent's steps run as nobody, who cannot read root's rustup:
    // the toolchain is usable by steps run as its owner (docs/deploy.md).
    let flags: &[&str] = if nix::unistd::geteuid().is_root() { &["--step-user", "root"] } else { &[] };
    let up = KilnUp::start_env(BIN.as_ref(), 3, flags, &[("RUSTUP_HOME", ""), ("CARGO_HOME", "")]).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/pipeline.yaml", RUNNERS),
        ("tests/__init__.py", ""),
        ("tests/test_sample.py", &fixture("pytest_source_test_sample.py.txt")),
        ("sample.test.mjs", &fixture("node_source_sample.test.mjs.txt")),
        ("Cargo.toml", "[package]\nname = \"sample\"\nversion = \"0.1.0\"\nedition = \"2021\"\n"),
        ("src/lib.rs", &fixture("nextest_source_lib.rs.txt")),
        (".config/nextest.toml", &fixture("nextest_source_config.toml.txt")),
    ])
    .unwrap();
    add_repo(&up, "suite", &repo);
    let c = Client::new(&up.url, &up.token);
    let (run, log) = run_to_end(&up, &c, "suite", "HEAD").await;
    assert_eq!(run.status, "failed", "each runner has a failing test: {log}\n{}", up.log());
    for j in &run.jobs {
        assert_eq!(j.status, "failed", "{}: {log}", j.name);
    }
    assert!(log.contains("reports: junit `reports/pytest.xml`: 6 tests, 1 failed, 1 errors, 1 skipped"), "{log}");

    let t = tests_json(&up, &format!("suite#{}", run.number));
    assert!(t.decided);
    // pytest: outcomes and messages as pytest wrote them.
    let fails = row(&t, "pytest :: tests.test_sample :: test_fails");
    assert_eq!((fails.job.as_str(), fails.test.outcome.as_str()), ("pytest", "failed"));
    assert!(fails.test.message.as_deref().unwrap_or("").contains("lists differ"), "{fails:?}");
    assert_eq!(row(&t, "pytest :: tests.test_sample :: test_errors").test.outcome, "error");
    assert_eq!(row(&t, "pytest :: tests.test_sample :: test_skipped").test.outcome, "skipped");
    assert_eq!(row(&t, "pytest :: tests.test_sample :: test_passes").test.outcome, "passed");
    // Node's TAP 13: nested subtests, a failure with its diagnostics.
    let node: Vec<&kiln_api::TestRow> = t.tests.iter().filter(|r| r.job == "node").collect();
    let multiplies = node.iter().find(|r| r.test.id.ends_with("multiplies")).expect("node's failing test");
    assert_eq!(multiplies.test.outcome, "failed", "{multiplies:?}");
    assert!(node.iter().any(|r| r.test.id.ends_with("divides") && r.test.outcome == "passed"), "{node:?}");
    // nextest: its retries are recorded; the flaky test passed on its third
    // try, so it both passed and failed for this commit: flaky.
    let flaky = row(&t, "sample :: tests::flaky");
    assert_eq!(flaky.test.outcome, "passed");
    assert_eq!(flaky.test.retries.len(), 2, "{flaky:?}");
    assert!(flaky.flaky, "nextest's flaky test is flagged when the run ends: {flaky:?}");
    let failed = row(&t, "sample :: tests::fails");
    assert_eq!(failed.test.outcome, "failed");
    assert!(!failed.flaky, "failed on every try: not flaky");
    assert!(t.summary.flaky >= 1 && t.summary.failed >= 3, "{:?}", t.summary);
    // Failed first.
    let first_pass = t.tests.iter().position(|r| !matches!(r.test.outcome.as_str(), "failed" | "error")).unwrap();
    assert!(
        t.tests[..first_pass].len() >= 4
            && t.tests[first_pass..].iter().all(|r| !matches!(r.test.outcome.as_str(), "failed" | "error"))
    );

    // What a user reads.
    let (ok, out, err) = cli(&up, &["tests", &run.id, "--failed"]);
    assert!(ok, "{err}");
    assert!(out.contains("FAILED  pytest  pytest :: tests.test_sample :: test_fails"), "{out}");
    assert!(out.contains("lists differ"), "{out}");
    assert!(!out.contains("test_passes"), "--failed shows failures only: {out}");
    let (ok, out, err) = cli(&up, &["tests", "history", "suite", "pytest :: tests.test_sample :: test_fails"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("suite#{}", run.number)) && out.contains("failed"), "{out}");
    // A run without reports says how to get them.
    let (ok, _, err) = cli(&up, &["tests", "nosuchrun"]);
    assert!(!ok && err.contains("nosuchrun"), "{err}");

    // pytest's own node ids split by the durations its report recorded.
    let shards = format!(
        r#"version: 1
jobs:
  - name: pytest
    matrix: {{shard: [0, 1]}}
    reports: {{junit: ["reports/*.xml"]}}
    steps:
      - |
        /usr/bin/python3 -m pytest -p no:cacheprovider --collect-only -q tests | grep '::' > all.txt
        {BIN} tests split --total 2 --index ${{{{ matrix.shard }}}} < all.txt > mine.txt
        echo "shard ${{{{ matrix.shard }}}}: $(tr '\n' ',' < mine.txt)"
        /usr/bin/python3 -m pytest -p no:cacheprovider --junitxml=reports/p.xml $(cat mine.txt) || true
"#
    );
    repo.commit(&[(".kiln/pipeline.yaml", &shards)], "shards").unwrap();
    let (run, log) = run_to_end(&up, &c, "suite", "HEAD").await;
    assert_eq!(run.status, "success", "{log}");
    // pytest's node ids found the report's durations, all but the skipped
    // test's (a skipped test records none).
    assert!(log.contains("1 of 6 tests have no recorded timing"), "{log}");
    assert!(log.contains("shard 0: tests/test_sample.py::"), "{log}");
    let t = tests_json(&up, &run.id);
    let mut ids: Vec<&str> = t.tests.iter().map(|r| r.test.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    let per_job: Vec<(&str, &str)> = t.tests.iter().map(|r| (r.job.as_str(), r.test.id.as_str())).collect();
    assert_eq!((ids.len(), t.tests.len()), (6, 6), "each test in one shard: {per_job:?}\n{log}");
}

/// A JUnit report with one test per (name, outcome).
fn junit(cases: &[(&str, &str)]) -> String {
    let mut x = String::from("<testsuite name=\"gate\">");
    for (name, outcome) in cases {
        match *outcome {
            "failed" => {
                x.push_str(&format!("<testcase name=\"{name}\"><failure message=\"{name} broke\"/></testcase>"))
            }
            _ => x.push_str(&format!("<testcase name=\"{name}\"/>")),
        }
    }
    x.push_str("</testsuite>");
    x
}

/// A job that writes `report` (if any) to r.xml, then runs `then`.
fn gate_job(name: &str, report: Option<&str>, then: &str) -> String {
    let write = match report {
        Some(r) => format!("      - printf '%s' '{r}' > r.xml\n"),
        None => String::new(),
    };
    format!(
        "  - name: {name}\n    needs: []\n    reports: {{junit: [r.xml]}}\n    steps:\n      - echo \"quarantine file=$(cat \"$KILN_QUARANTINE\")\"\n{write}      - {then}\n"
    )
}

/// The six gate cases of a quarantine, and a hostile report that leaves the
/// job's own success alone.
#[tokio::test(flavor = "multi_thread")]
async fn quarantine_lets_through_only_failures_it_covers() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    // A first run gives the repository a suite (50 tests) for the cap.
    let many: Vec<(String, &str)> = (0..50).map(|i| (format!("t{i}"), "passed")).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, o)| (n.as_str(), *o)).collect();
    let first = format!("version: 1\njobs:\n{}", gate_job("suite", Some(&junit(&many)), "true"));
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &first)]).unwrap();
    add_repo(&up, "gates", &repo);
    let c = Client::new(&up.url, &up.token);
    let (run, log) = run_to_end(&up, &c, "gates", "HEAD").await;
    assert_eq!(run.status, "success", "{log}");

    // Quarantine: owner required, the cap (2% of 50 = 1) names itself.
    let (ok, _, err) = cli(&up, &["tests", "quarantine", "gates", "gate :: q", "--reason", "flaky on CI"]);
    assert!(!ok && err.contains("--owner"), "{err}");
    let (ok, out, err) =
        cli(&up, &["tests", "quarantine", "gates", "gate :: q", "--owner", "alice", "--reason", "races the clock"]);
    assert!(ok, "{err}");
    assert!(out.contains("quarantined `gate :: q`") && out.contains("owner alice"), "{out}");
    let (ok, _, err) = cli(&up, &["tests", "quarantine", "gates", "gate :: other", "--owner", "bob", "--reason", "x"]);
    assert!(!ok && err.contains("quarantine cap") && err.contains("at most 1"), "{err}");
    let (ok, out, _) = cli(&up, &["tests", "ls", "gates"]);
    assert!(ok && out.contains("active") && out.contains("gate :: q") && out.contains("alice"), "{out}");
    let (ok, out, _) = cli(&up, &["audit"]);
    assert!(ok && out.contains("test.quarantine"), "{out}");

    let q_fails = junit(&[("q", "failed"), ("ok", "passed")]);
    let q_and_other = junit(&[("q", "failed"), ("other", "failed"), ("ok", "passed")]);
    let all_pass = junit(&[("q", "passed"), ("ok", "passed")]);
    let truncated = "<testsuite name=\"gate\"><testcase name=\"q\"><failure message=\"x\"/></testcase><testcase name=";
    let laughs = "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;\">]><testsuite name=\"gate\"><testcase name=\"&lol2;\"/></testsuite>";
    let gates = [
        gate_job("only-quarantined", Some(&q_fails), "exit 1"),
        gate_job("other-failure", Some(&q_and_other), "exit 1"),
        gate_job("report-missing", None, "exit 1"),
        gate_job("report-truncated", Some(truncated), "exit 1"),
        // The test process dies by SIGKILL before writing anything (the
        // step's own shell is its PID namespace's init, which a signal from
        // inside does not kill).
        gate_job("crashed", None, "sh -c 'kill -9 $$'"),
        gate_job("passed-but-exit-1", Some(&all_pass), "exit 1"),
        gate_job("hostile-report", Some(laughs), "true"),
    ];
    let sha =
        repo.commit(&[(".kiln/pipeline.yaml", &format!("version: 1\njobs:\n{}", gates.concat()))], "gates").unwrap();
    let (run, log) = run_to_end(&up, &c, "gates", &sha).await;
    let job = |n: &str| run.jobs.iter().find(|j| j.name == n).unwrap_or_else(|| panic!("{n}: {log}"));
    let ok_job = job("only-quarantined");
    assert_eq!(ok_job.status, "success", "{log}");
    assert_eq!(ok_job.message.as_deref(), Some("quarantined failures: 1"), "{ok_job:?}");
    assert!(log.contains("quarantine file=gate :: q"), "steps read $KILN_QUARANTINE: {log}");
    assert!(log.contains("its only failures are quarantined tests: `gate :: q`"), "{log}");
    for name in ["other-failure", "report-missing", "report-truncated", "crashed", "passed-but-exit-1"] {
        assert_eq!(job(name).status, "failed", "{name}: {log}");
    }
    let hostile = job("hostile-report");
    assert_eq!(hostile.status, "success", "a hostile report never changes the job's outcome: {log}");
    let t = tests_json(&up, &run.id);
    let states: Vec<(&str, &str)> = t.attempts.iter().map(|a| (a.job.as_str(), a.state.as_str())).collect();
    assert!(states.contains(&("report-missing", "missing")), "{states:?}");
    assert!(states.contains(&("report-truncated", "truncated")), "{states:?}");
    assert!(states.contains(&("hostile-report", "truncated")), "{states:?}");
    let refused = t.reports.iter().find(|r| r.job == "hostile-report").unwrap();
    assert!(refused.annotations.iter().any(|a| a.kind == "doctype_refused"), "{refused:?}");
    let q_row = t.tests.iter().find(|r| r.job == "only-quarantined" && r.test.id == "gate :: q").unwrap();
    assert!(q_row.quarantined && q_row.test.outcome == "failed", "{q_row:?}");

    // The metrics counted the bound reports' tests.
    let metrics = kiln_testkit::metrics_text(&up.url, &up.token).await;
    let count = |outcome: &str| {
        let key = format!("kiln_tests_total{{outcome=\"{outcome}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    assert!(count("failed") >= 3.0 && count("passed") >= 50.0, "{metrics}");
    let gauge = metrics.lines().find(|l| l.starts_with("kiln_tests_quarantined{repo=\"gates\"}"));
    assert_eq!(gauge, Some("kiln_tests_quarantined{repo=\"gates\"} 1"), "{metrics}");

    // Unquarantined: the same failure fails the job again.
    let (ok, out, err) = cli(&up, &["tests", "unquarantine", "gates", "gate :: q"]);
    assert!(ok && out.contains("no longer quarantined"), "{out}{err}");
    let again = format!("version: 1\njobs:\n{}", gate_job("only-quarantined", Some(&q_fails), "exit 1"));
    let sha = repo.commit(&[(".kiln/pipeline.yaml", &again)], "again").unwrap();
    let (run, log) = run_to_end(&up, &c, "gates", &sha).await;
    assert_eq!(run.status, "failed", "{log}");
}

/// Writes a JUnit report of 1,000 tests: `flaky_0`..`flaky_9` fail with
/// probability 0.2 on every try, `broken_0` and `broken_1` always fail, the
/// rest pass; exits 1 if anything failed.
const SUITE: &str = r#"import random, sys
rng = random.Random()
cases = []
for i in range(10):
    cases.append(("flaky_%d" % i, rng.random() < 0.2))
for i in range(2):
    cases.append(("broken_%d" % i, True))
for i in range(988):
    cases.append(("stable_%d" % i, False))
with open("junit.xml", "w") as f:
    f.write('<testsuite name="gen">')
    for name, failed in cases:
        if failed:
            f.write('<testcase classname="suite" name="%s" time="0.01"><failure message="boom"/></testcase>' % name)
        else:
            f.write('<testcase classname="suite" name="%s" time="0.01"/>' % name)
    f.write('</testsuite>')
sys.exit(1 if any(failed for _, failed in cases) else 0)
"#;

const FLAKY_FLOW: &str = r#"version: 1
jobs:
  - name: test
    retry: 2
    reports: {junit: [junit.xml]}
    steps:
      - /usr/bin/python3 gen.py
"#;

/// A generated suite of 1,000 tests with 10 seeded flakes (p = 0.2) and 2
/// always-broken tests over 20 default-branch runs with job retries: at
/// least 9 of the 10 flakes are flagged, no broken or stable test ever is,
/// and the history gives a flake rate over the default branch.
#[tokio::test(flavor = "multi_thread")]
async fn flakes_are_found_in_the_run_that_shows_them_and_only_flakes() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", FLAKY_FLOW), ("gen.py", SUITE)]).unwrap();
    add_repo(&up, "gen", &repo);
    let c = Client::new(&up.url, &up.token);
    let mut flagged = std::collections::BTreeSet::new();
    for i in 0..20 {
        repo.commit(&[("round.txt", &i.to_string())], &format!("round {i}")).unwrap();
        let (run, log) = run_to_end(&up, &c, "gen", "main").await;
        // The broken tests fail every attempt: the run fails after 3.
        assert_eq!(run.status, "failed", "{log}");
        assert_eq!(run.jobs[0].attempts.len(), 3, "{log}");
        let t = tests_json(&up, &run.id);
        assert_eq!(t.summary.total, 1000);
        assert_eq!(t.attempts.len(), 3, "every attempt's report is bound: {:?}", t.attempts);
        for r in t.tests.iter().filter(|r| r.flaky) {
            flagged.insert(r.test.id.clone());
        }
    }
    let flakes: Vec<&String> = flagged.iter().filter(|id| id.contains("flaky_")).collect();
    let wrong: Vec<&String> = flagged.iter().filter(|id| !id.contains("flaky_")).collect();
    assert!(wrong.is_empty(), "a broken or stable test was flagged flaky: {wrong:?}");
    assert!(flakes.len() >= 9, "at least 9 of the 10 flakes are flagged: {flakes:?}");
    let (ok, out, err) = cli(&up, &["tests", "history", "gen", flakes[0], "--json"]);
    assert!(ok, "{err}");
    let h: kiln_api::TestHistory = serde_json::from_str(&out).unwrap();
    let rate = h.flake_rate.expect("a flake rate over the default branch");
    assert_eq!(rate.runs, 20, "{rate:?}");
    assert!(rate.flaky >= 1 && rate.rate > 0.0, "{rate:?}");
    let (_, out, _) = cli(&up, &["tests", "history", "gen", "gen :: suite :: broken_0", "--json"]);
    let h: kiln_api::TestHistory = serde_json::from_str(&out).unwrap();
    let rate = h.flake_rate.expect("decided on every run");
    assert_eq!((rate.flaky, rate.failed, rate.runs), (0, 20, 20), "{rate:?}");
}

/// Dynamic sharding: two shards take batches from the run's queue; one
/// shard's agent is SIGKILLed after it ran some batches. Its attempt is
/// fenced, its batches (done or not) go back, and in the run's bound
/// reports every test ran to completion exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_shards_batches_run_again_and_every_test_runs_once() {
    let root = nix::unistd::geteuid().is_root();
    let flags: &[&str] = if root { &["--step-user", "root"] } else { &[] };
    let server = kiln_testkit::KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let mut a1 = server.agent("a1", flags).unwrap();
    let a2 = server.agent("a2", flags).unwrap();
    let wf = format!(
        r#"version: 1
jobs:
  - name: test
    matrix: {{shard: [a, b]}}
    reports: {{junit: ["reports/*.xml"]}}
    steps:
      - |
        seq -f 't%02g' 1 40 > all.txt
        mkdir -p reports
        n=0
        while :; do
          rc=0
          {bin} tests next --group unit --batch-size 2 < all.txt > batch.txt || rc=$?
          [ "$rc" -eq 3 ] && break
          [ "$rc" -eq 0 ] || exit "$rc"
          n=$((n+1))
          echo "shard ${{{{ matrix.shard }}}} ran batch $n: $(tr '\n' ' ' < batch.txt)"
          {{ printf '<testsuite name="dyn">'; while read t; do printf '<testcase name="%s"/>' "$t"; done < batch.txt; printf '</testsuite>'; }} > "reports/batch-$n.xml"
          sleep 0.4
        done
        echo "shard ${{{{ matrix.shard }}}} done after $n batches"
      - name: the shard capability allows nothing else
        run: |
          code=$(curl -s -o /dev/null -w '%{{http_code}}' -X POST -H "Authorization: Bearer $KILN_SHARD_TOKEN" "${{KILN_SHARDS_URL%/shards/next}}/heartbeat")
          echo "heartbeat with the shard capability: $code"
          echo "token in the log: $KILN_SHARD_TOKEN"
"#,
        bin = BIN
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("dyn", &repo);
    let c = Client::new(&server.url, &server.token);
    let id =
        c.submit_run("dyn", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap().run_id;
    // Once shard `a` ran two batches, SIGKILL the agent that runs it.
    let mut victim = None;
    for _ in 0..600 {
        let log = logs_of(&server, &id);
        if log.contains("shard a ran batch 2") {
            let run = c.get_run(&id).await.unwrap();
            let a = run.jobs.iter().find(|j| j.name.contains("shard=a")).unwrap();
            victim = a.attempts.last().map(|at| at.runner.clone());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let victim = victim.expect("shard a ran two batches");
    let run = c.get_run(&id).await.unwrap();
    assert_eq!(run.status, "running", "killed mid-way");
    let agents = c.list_agents().await.unwrap();
    let name = agents.iter().find(|g| g.id == victim || g.name == victim).map(|g| g.name.clone()).unwrap();
    if name == "a1" {
        a1.child.kill().unwrap();
        let _ = a1.child.wait();
    } else {
        // a2 runs shard a: kill it, keep a1 for the retry.
        let mut a2 = a2;
        a2.child.kill().unwrap();
        let _ = a2.child.wait();
        let run = wait_run(&c, &id, 300).await;
        return check_once(&server, &c, run).await;
    }
    let run = wait_run(&c, &id, 300).await;
    drop(a2);
    check_once(&server, &c, run).await;
}

fn logs_of(server: &kiln_testkit::KilnServer, run: &str) -> String {
    let o = server.cli().args(["logs", run]).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

async fn check_once(server: &kiln_testkit::KilnServer, c: &Client, run: kiln_api::Run) {
    let log = logs_of(server, &run.id);
    assert_eq!(run.status, "success", "{log}\n{}", server.log());
    assert!(log.contains("heartbeat with the shard capability: 401"), "{log}");
    assert!(!log.contains("kiln_sh1."), "the capability is masked in the log: {log}");
    let a = run.jobs.iter().find(|j| j.name.contains("shard=a")).unwrap();
    assert!(a.attempts.len() >= 2, "shard a was lost and ran again: {:?}", a.attempts);
    assert_eq!(a.attempts[0].outcome, "lost", "{:?}", a.attempts);
    let t = c.run_tests(&run.id, false).await.unwrap();
    let mut seen: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    for r in &t.tests {
        *seen.entry(r.test.id.as_str()).or_default() += 1;
    }
    let want: Vec<String> = (1..=40).map(|i| format!("dyn :: t{i:02}")).collect();
    assert_eq!(seen.keys().map(|k| k.to_string()).collect::<Vec<_>>(), want, "every test ran: {log}");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "every test ran exactly once in the bound reports: {twice:?}\n{log}");
    assert!(
        t.attempts.iter().all(|x| x.epoch != a.attempts[0].epoch || x.job_id != a.id),
        "the killed attempt's reports are never bound"
    );
}

/// Static split in a job: the timings a first run recorded reach the next
/// run's steps as $KILN_TEST_TIMINGS; `kiln tests split` packs by them and
/// says how many tests had none.
#[tokio::test(flavor = "multi_thread")]
async fn a_static_split_in_a_job_packs_by_the_recorded_timings() {
    let flags: &[&str] = if nix::unistd::geteuid().is_root() { &["--step-user", "root"] } else { &[] };
    let up = KilnUp::start_with(BIN.as_ref(), 2, flags).unwrap();
    let record = r#"version: 1
jobs:
  - name: record
    reports: {junit: [j.xml]}
    steps:
      - printf '%s' '<testsuite name="s"><testcase name="a" time="5"/><testcase name="b" time="0.1"/><testcase name="c" time="0.1"/><testcase name="d" time="0.1"/><testcase name="e" time="0.1"/></testsuite>' > j.xml
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", record)]).unwrap();
    add_repo(&up, "split", &repo);
    let c = Client::new(&up.url, &up.token);
    let (run, log) = run_to_end(&up, &c, "split", "main").await;
    assert_eq!(run.status, "success", "{log}");
    let split = format!(
        r#"version: 1
jobs:
  - name: test
    matrix: {{shard: [0, 1]}}
    reports: {{junit: [j.xml]}}
    steps:
      - |
        printf 's :: a\ns :: b\ns :: c\ns :: d\ns :: e\ns :: f\n' | {BIN} tests split --total 2 --index ${{{{ matrix.shard }}}} > mine.txt
        echo "shard ${{{{ matrix.shard }}}} runs: $(tr '\n' ',' < mine.txt)"
        printf '<testsuite name="s"/>' > j.xml
"#
    );
    repo.commit(&[(".kiln/pipeline.yaml", &split)], "split").unwrap();
    let (run, log) = run_to_end(&up, &c, "split", "main").await;
    assert_eq!(run.status, "success", "{log}");
    assert!(log.contains("shard 0 runs: s :: a,\n"), "the heavy test alone: {log}");
    assert!(log.contains("shard 1 runs: s :: b,s :: c,s :: d,s :: e,s :: f,"), "{log}");
    assert!(log.contains("1 of 6 tests have no recorded timing (timings of refs/heads/main)"), "never silent: {log}");
}

/// At expiry a quarantine ends by itself: the test blocks again, and the
/// audit log, the list and the metrics say so.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_quarantine_is_audited_listed_and_counted() {
    let up = KilnUp::start_with(BIN.as_ref(), 1, &["--lease-ttl", "3s"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - {name: t, steps: [true]}\n")]).unwrap();
    add_repo(&up, "exp", &repo);
    let (ok, _, err) = cli(
        &up,
        &["tests", "quarantine", "exp", "s :: slow", "--owner", "carol", "--reason", "slow disk", "--expires", "1s"],
    );
    assert!(ok, "{err}");
    let (ok, _, err) =
        cli(&up, &["tests", "quarantine", "exp", "s :: x", "--owner", "c", "--reason", "r", "--expires", "91d"]);
    assert!(!ok && err.contains("at most 90 days"), "{err}");
    let mut audit = String::new();
    for _ in 0..100 {
        audit = cli(&up, &["audit"]).1;
        if audit.contains("test.quarantine.expire") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(audit.contains("test.quarantine.expire") && audit.contains("owner carol"), "{audit}");
    let (_, out, _) = cli(&up, &["tests", "ls", "exp"]);
    assert!(out.contains("expired") && out.contains("s :: slow"), "{out}");
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", up.url))
        .bearer_auth(&up.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("kiln_tests_quarantine_expired_total{repo=\"exp\"} 1"), "{metrics}");
    assert!(metrics.contains("kiln_tests_total{outcome=\"failed\"}"), "{metrics}");
}
