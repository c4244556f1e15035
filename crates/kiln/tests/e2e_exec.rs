//! `kiln exec` end to end (issue 48): the real binary run inside real git
//! checkouts, its in-process server and agents running real processes; one
//! test runs the same workflow through a real `kiln up` and compares.
//!
//! Every test gives `kiln exec` a cache home (`XDG_CACHE_HOME`) and a
//! `TMPDIR` of its own, so tests never share a store or touch the user's.

use kiln_testkit::KilnUp;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// A checkout (branch `main`, one commit of `files`), and the directories
/// `kiln exec` gets as its cache home and temp dir.
struct Checkout {
    _dir: tempfile::TempDir,
    repo: PathBuf,
    cache: PathBuf,
    tmp: PathBuf,
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@kiln.invalid"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (p, content) in files {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        if p.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}

impl Checkout {
    fn new(files: &[(&str, &str)]) -> Checkout {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("project");
        std::fs::create_dir_all(&repo).unwrap();
        write(&repo, files);
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "initial"]);
        Self::around(dir, repo)
    }

    fn around(dir: tempfile::TempDir, repo: PathBuf) -> Checkout {
        let cache = dir.path().join("cache");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
        Checkout { _dir: dir, repo, cache, tmp }
    }

    /// The bundled example, committed.
    fn hello() -> Checkout {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("hello");
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello");
        assert!(Command::new("cp").arg("-r").arg(&example).arg(&repo).status().unwrap().success());
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-q", "-m", "example"]);
        Self::around(dir, repo)
    }

    /// `kiln exec ARGS` in `dir` (the checkout by default).
    fn exec_in(&self, dir: &Path, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("exec")
            .args(args)
            .current_dir(dir)
            .env("XDG_CACHE_HOME", &self.cache)
            .env("TMPDIR", &self.tmp)
            .env("KILN_STORAGE_LEVELS", "off")
            .env_remove("KILN_LOG")
            .env_remove("KILN_SERVER")
            .env_remove("KILN_TOKEN")
            .output()
            .unwrap()
    }

    fn exec(&self, args: &[&str]) -> Output {
        self.exec_in(&self.repo, args)
    }

    /// What `git status` and the index say, to compare before and after.
    fn state(&self) -> (String, String, String) {
        (
            git(&self.repo, &["status", "--porcelain", "--untracked-files=all", "--ignored"]),
            git(&self.repo, &["rev-parse", "HEAD"]),
            git(&self.repo, &["ls-files", "-s"]),
        )
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not a run object ({e}): {}", text(o)))
}

/// The bundled pipeline: compile publishes target/app.jar, integration-test
/// restores exactly those bytes and runs them.
#[test]
fn the_bundled_example_runs_with_its_artifact_crossing_jobs() {
    let c = Checkout::hello();
    let out = c.exec(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = run_json(&out);
    assert_eq!(run["status"], "success");
    let art = &run["jobs"][0]["artifacts"][0];
    assert_eq!(art["name"], "app");
    let sha = art["sha256"].as_str().unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains(&format!("testing {sha}  inputs/app.jar")), "{}", text(&out));
    assert!(logs.contains("ok - the published app greets"), "{}", text(&out));
    // A clean tree runs HEAD itself, and says so.
    let head = git(&c.repo, &["rev-parse", "HEAD"]);
    assert_eq!(run["commit_sha"], head.as_str());
    assert!(logs.contains("the working tree has no changes"), "{}", text(&out));
}

/// The working tree runs, uncommitted and untracked (not ignored) files
/// included, as a synthetic commit; the user's index, HEAD and files stay.
#[test]
fn an_uncommitted_change_is_what_runs() {
    let c = Checkout::new(&[
        (".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: show\n    steps:\n      - echo committed-step\n"),
        (".gitignore", "ignored.txt\n"),
    ]);
    write(
        &c.repo,
        &[
            (
                ".kiln/pipeline.yaml",
                "version: 1\njobs:\n  - name: show\n    steps:\n      - name: changed\n        run: echo uncommitted-step; cat untracked.txt; test ! -e ignored.txt && echo no-ignored-file\n",
            ),
            ("untracked.txt", "untracked-content\n"),
            ("ignored.txt", "ignored\n"),
        ],
    );
    git(&c.repo, &["add", ".gitignore"]);
    let before = c.state();
    let objects_before = git(&c.repo, &["count-objects", "-v"]);
    let out = c.exec(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l == "uncommitted-step"), "{}", text(&out));
    assert!(!stdout.lines().any(|l| l == "committed-step"), "{}", text(&out));
    assert!(stdout.contains("untracked-content") && stdout.contains("no-ignored-file"), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("synthetic snapshot of the working tree"), "{}", text(&out));
    assert_eq!(c.state(), before, "the checkout changed");
    assert_eq!(git(&c.repo, &["count-objects", "-v"]), objects_before, "objects were written into the checkout");
}

/// A step that deletes and writes files, by relative and by absolute path,
/// changes its own checkout of the snapshot, never the user's tree.
#[test]
fn a_step_cannot_change_the_working_tree() {
    let c = Checkout::new(&[("keep.txt", "precious\n"), ("README", "readme\n")]);
    let root = c.repo.display().to_string();
    write(
        &c.repo,
        &[(
            ".kiln/pipeline.yaml",
            &format!(
                "version: 1\njobs:\n  - name: vandal\n    steps:\n      - rm -f keep.txt README && echo overwritten > new.txt && test ! -e keep.txt && echo own-checkout-changed\n      - rm -f '{root}/keep.txt' || true\n      - echo pwned > '{root}/pwned.txt' || true\n      - echo more >> '{root}/README' || true\n      - rm -rf '{root}/.git' || true\n"
            ),
        )],
    );
    let before = c.state();
    // As root, steps would run as `nobody`, who cannot reach the checkout
    // anyway: run them as root, so what protects the tree is the snapshot
    // and the hidden paths, as for a user running kiln exec as themselves.
    let args: &[&str] = if nix::unistd::geteuid().is_root() { &["--step-user", "root"] } else { &[] };
    let out = c.exec(args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("own-checkout-changed"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(c.repo.join("keep.txt")).unwrap(), "precious\n");
    assert_eq!(std::fs::read_to_string(c.repo.join("README")).unwrap(), "readme\n");
    assert!(!c.repo.join("pwned.txt").exists() && !c.repo.join("new.txt").exists());
    assert_eq!(c.state(), before, "the checkout changed");
}

const MATRIX: &str = r#"version: 1
jobs:
  - name: version
    outputs: [version]
    steps:
      - echo "version=1.2.$(cat PATCH)" >> "$KILN_OUTPUT"
  - name: test
    needs: [version]
    matrix:
      n: ["1", "2"]
    env: {VERSION: "${{ needs.version.outputs.version }}"}
    steps:
      - mkdir -p out && echo "shard $KILN_MATRIX_N of $VERSION" | tee out/report.txt
    artifacts:
      publish: [{name: "report-${{ matrix.n }}", path: out/report.txt}]
  - name: summary
    needs: [version, test]
    outputs: [seen]
    artifacts:
      restore:
        - {from_job: "test (n=1)", name: report-1, path: r1.txt}
        - {from_job: "test (n=2)", name: report-2, path: r2.txt}
    steps:
      - cat r1.txt r2.txt
      - echo "seen=${{ needs.version.outputs.version }}" >> "$KILN_OUTPUT"
"#;

/// A matrix job between a job with outputs and one that needs them both.
#[test]
fn a_matrix_with_outputs_and_needs() {
    let c = Checkout::new(&[(".kiln/pipeline.yaml", MATRIX), ("PATCH", "7\n")]);
    let out = c.exec(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = run_json(&out);
    let names: Vec<&str> = run["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["version", "test (n=1)", "test (n=2)", "summary"]);
    assert_eq!(run["jobs"][0]["outputs"]["version"], "1.2.7");
    assert_eq!(run["jobs"][3]["outputs"]["seen"], "1.2.7");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("shard 1 of 1.2.7") && logs.contains("shard 2 of 1.2.7"), "{}", text(&out));
    // Two jobs at once at the widest level: two local agents.
    assert!(logs.contains("4 job(s) on 2 local agent(s)"), "{}", text(&out));
}

/// `--job` runs a job and what it needs, nothing else.
#[test]
fn job_selects_a_job_and_what_it_needs() {
    let c = Checkout::new(&[(".kiln/pipeline.yaml", MATRIX), ("PATCH", "7\n")]);
    let out = c.exec(&["--json", "--job", "test"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = run_json(&out);
    let names: Vec<&str> = run["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["version", "test (n=1)", "test (n=2)"]);
    let out = c.exec(&["--job", "deploy"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no job `deploy`") && err.contains("version, test, summary"), "{}", text(&out));
}

/// The second `kiln exec` with the same cache home restores what the first saved.
#[test]
fn the_second_exec_hits_the_cache() {
    let wf = r#"version: 1
jobs:
  - name: deps
    cache:
      kind: dependencies
      version: "v1"
      inputs: [deps.lock]
      paths: [vendor]
    steps:
      - if [ -f vendor/built ]; then echo "vendor came from the cache"; else mkdir -p vendor && echo once > vendor/built && echo "vendor built cold"; fi
"#;
    let c = Checkout::new(&[(".kiln/pipeline.yaml", wf), ("deps.lock", "a==1\n")]);
    let first = c.exec(&["--json"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(String::from_utf8_lossy(&first.stderr).contains("vendor built cold"), "{}", text(&first));
    assert_eq!(run_json(&first)["jobs"][0]["cache"]["result"], "miss");
    // A change elsewhere in the tree: a new snapshot, the same cache key.
    write(&c.repo, &[("notes.txt", "changed\n")]);
    let second = c.exec(&["--json"]);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert!(String::from_utf8_lossy(&second.stderr).contains("vendor came from the cache"), "{}", text(&second));
    assert_eq!(run_json(&second)["jobs"][0]["cache"]["result"], "hit", "{}", text(&second));
}

/// A secret from `--secret-file` reaches the step and is masked in the
/// output; one asked for and not given is refused before anything runs.
#[test]
fn a_secret_from_a_file_is_masked() {
    let wf = "version: 1\njobs:\n  - name: use\n    secrets: [API_TOKEN]\n    steps:\n      - echo \"token=$API_TOKEN\"; test \"$API_TOKEN\" = s3cr3t-v4lue && echo token-arrived\n";
    let c = Checkout::new(&[(".kiln/pipeline.yaml", wf)]);
    let file = c.tmp.join("token");
    std::fs::write(&file, "s3cr3t-v4lue\n").unwrap();
    let out = c.exec(&["--secret-file", &format!("API_TOKEN={}", file.display())]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let all = text(&out);
    assert!(all.contains("token=***") && all.contains("token-arrived"), "{all}");
    assert!(!all.contains("s3cr3t-v4lue"), "{all}");
    let out = c.exec(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("API_TOKEN (job use)") && err.contains("KILN_SECRET_"), "{}", text(&out));
}

/// A failing step: exit 1, and the output names the step.
#[test]
fn a_failing_step_exits_1_and_names_it() {
    let wf = "version: 1\njobs:\n  - name: build\n    steps:\n      - name: prepare\n        run: echo fine\n      - name: explode\n        run: echo about to fail; exit 3\n  - name: after\n    steps: [echo never]\n";
    let c = Checkout::new(&[(".kiln/pipeline.yaml", wf)]);
    let out = c.exec(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The summary's line of the failed job names its failed step.
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.trim_start().starts_with("build ")).unwrap_or_default();
    assert!(line.contains("failed") && line.contains("`explode`"), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("never\n"), "{}", text(&out));
}

/// What kiln exec refuses, each with a message and exit 2.
#[test]
fn bad_input_is_refused_with_exit_2() {
    let c = Checkout::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo a]\n")]);
    // Not in a git checkout.
    let outside = c.tmp.join("not-a-repo");
    std::fs::create_dir_all(&outside).unwrap();
    let out = c.exec_in(&outside, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not inside a git checkout"), "{}", text(&out));
    // A workflow that does not exist.
    let out = c.exec(&[".kiln/nope.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the workflows here are: .kiln/pipeline.yaml"),
        "{}",
        text(&out)
    );
    // Malformed YAML: the validator's message with its line.
    write(&c.repo, &[(".kiln/broken.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo a\n")]);
    let out = c.exec(&[".kiln/broken.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".kiln/broken.yaml:") && err.contains("problem(s)"), "{}", text(&out));
    // Several workflows and no pipeline.yaml: the list to pick from.
    std::fs::rename(c.repo.join(".kiln/pipeline.yaml"), c.repo.join(".kiln/ci.yaml")).unwrap();
    let out = c.exec(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kiln exec .kiln/broken.yaml") && err.contains("kiln exec .kiln/ci.yaml"), "{}", text(&out));
    // An unknown --job.
    let out = c.exec(&[".kiln/ci.yaml", "--job", "zzz"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job `zzz`"), "{}", text(&out));
    // Nothing but a deployment: nothing to run.
    write(
        &c.repo,
        &[(
            ".kiln/ci.yaml",
            "version: 1\njobs:\n  - name: ship\n    environment: production\n    steps: [echo ship]\n",
        )],
    );
    let out = c.exec(&[".kiln/ci.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing to run") && err.contains("does not run deployments"), "{}", text(&out));
    assert!(err.contains("skipped: job `ship`: it deploys to environment `production`"), "{}", text(&out));
}

/// A job deploying to an environment, and the jobs that need it, are
/// skipped with one line each; the rest of the pipeline runs.
#[test]
fn deployments_and_what_needs_them_are_skipped_with_a_line_each() {
    let c = Checkout::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: build\n    steps: [echo built-it]\n  - name: lint\n    steps: [echo linted]\n  \
         - name: ship\n    needs: [build]\n    environment: {name: production, url: https://shop.example}\n    \
         matrix: {region: [eu, us]}\n    steps: [echo shipped-it]\n  - name: smoke\n    needs: [ship]\n    \
         steps: [echo smoked-it]\n  - name: notify\n    needs: [smoke, lint]\n    steps: [echo notified]\n",
    )]);
    let out = c.exec(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let skipped: Vec<&str> = err.lines().filter(|l| l.contains("skipped: job")).collect();
    assert_eq!(skipped.len(), 3, "one line per job left out: {}", text(&out));
    assert!(skipped[0].contains("`ship`: it deploys to environment `production`"), "{}", text(&out));
    assert!(skipped[1].contains("`smoke`: it needs `ship`"), "{}", text(&out));
    assert!(skipped[2].contains("`notify`: it needs `smoke`"), "{}", text(&out));
    let run = run_json(&out);
    assert_eq!(run["status"], "success", "{}", text(&out));
    let mut names: Vec<String> =
        run["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["build", "lint"], "{}", text(&out));
    assert!(err.contains("built-it") && err.contains("linted"), "{}", text(&out));
    assert!(!err.contains("shipped-it") && !err.contains("smoked-it"), "{}", text(&out));
    // --job naming a deploying job: it is skipped, what it needs runs.
    let out = c.exec(&["--job", "ship", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let names: Vec<String> =
        run_json(&out)["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["build"], "{}", text(&out));
}

/// `--commit REV` runs that commit, not the working tree.
#[test]
fn commit_runs_a_commit_instead_of_the_tree() {
    let c =
        Checkout::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo first-commit]\n")]);
    let first = git(&c.repo, &["rev-parse", "HEAD"]);
    write(&c.repo, &[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo second-commit]\n")]);
    git(&c.repo, &["commit", "-q", "-am", "second"]);
    write(&c.repo, &[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo in-the-tree]\n")]);
    let out = c.exec(&["--commit", "HEAD~1", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(run_json(&out)["commit_sha"], first.as_str());
    assert!(String::from_utf8_lossy(&out.stderr).contains("first-commit"), "{}", text(&out));
}

/// A job in a container, through the test engine (skipped without one, as
/// the other container tests are).
#[test]
fn a_container_job_runs_through_the_engine() {
    let engine = std::env::var("KILN_ENGINE").unwrap_or_else(|_| "unix:///run/podman/podman.sock".into());
    let registry = std::env::var("KILN_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into());
    let sock = engine.trim_start_matches("unix://").to_string();
    let up = |args: &[&str]| Command::new("curl").args(args).output().is_ok_and(|o| o.status.success());
    let available = up(&["-fsS", "--max-time", "3", "--unix-socket", &sock, "http://d/_ping"])
        && up(&["-fsS", "--max-time", "3", &format!("http://{registry}/v2/")]);
    if !available {
        if std::env::var("KILN_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_CONTAINERS=1 but containers are not available; run scripts/container-env");
        }
        eprintln!(
            "SKIPPED: containers are not available (engine {engine}, registry {registry}); run scripts/container-env"
        );
        return;
    }
    let wf = format!(
        "version: 1\njobs:\n  - name: inside\n    image: {registry}/kiln-test/base:latest\n    steps:\n      - test \"$PWD\" = /workspace && test -f .kiln/pipeline.yaml && echo in-a-container\n"
    );
    let c = Checkout::new(&[(".kiln/pipeline.yaml", &wf)]);
    let out = c.exec(&["--json"]);
    assert_eq!(out.status.code(), Some(2), "host executor refuses an image job: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--executor container"), "{}", text(&out));
    let out = c.exec(&["--json", "--executor", "container", "--engine", &engine, "--insecure-registry", &registry]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = run_json(&out);
    assert!(run["jobs"][0]["image_digest"].as_str().is_some_and(|d| d.contains("sha256:")), "{run}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in-a-container"), "{}", text(&out));
}

/// The same workflow through `kiln exec` and through a real server: the
/// same job graph (names, needs), statuses, outputs and artifact digests.
#[test]
fn exec_and_a_server_agree() {
    let c = Checkout::new(&[(".kiln/pipeline.yaml", MATRIX), ("PATCH", "3\n")]);
    let local = c.exec(&["--json"]);
    assert_eq!(local.status.code(), Some(0), "{}", text(&local));
    let local = run_json(&local);

    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let out = up.cli().args(["repo", "add", "project", "--url"]).arg(&c.repo).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = up.cli().args(["run", "--repo", "project", "--commit", "main", "--follow", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), up.log());
    let server = run_json(&out);

    assert_eq!(local["commit_sha"], server["commit_sha"], "a clean tree runs the same commit");
    let shape = |run: &serde_json::Value| -> Vec<serde_json::Value> {
        run["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                let arts: Vec<_> = j["artifacts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| serde_json::json!([a["name"], a["size"], a["sha256"]]))
                    .collect();
                serde_json::json!({
                    "name": j["name"], "needs": j["needs"], "status": j["status"],
                    "outputs": j["outputs"], "artifacts": arts,
                })
            })
            .collect()
    };
    assert_eq!(local["status"], server["status"]);
    assert_eq!(shape(&local), shape(&server));
    assert!(!shape(&local).is_empty());
}

/// `--keep` leaves each job's workspace and prints where, by job.
#[test]
fn keep_leaves_the_workspaces_and_says_where() {
    let c = Checkout::new(&[(
        ".kiln/pipeline.yaml",
        "version: 1\njobs:\n  - name: maker\n    steps: [echo made > made.txt]\n",
    )]);
    let out = c.exec(&["--keep"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("maker (attempt 1): "))
        .unwrap_or_else(|| panic!("{}", text(&out)));
    let ws = PathBuf::from(line.trim());
    assert!(ws.starts_with(&c.tmp), "kept outside TMPDIR: {}", ws.display());
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "made\n");
}

/// While one `kiln exec` holds the cache home, another runs on a temporary
/// store and says it starts without caches.
#[test]
fn a_second_exec_at_once_gets_a_temporary_store() {
    let c = Checkout::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: a\n    steps: [echo a]\n")]);
    let home = c.cache.join("kiln/exec");
    std::fs::create_dir_all(&home).unwrap();
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(home.join("exec.lock")).unwrap();
    let _held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e).unwrap();
    let out = c.exec(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another kiln exec is using"), "{}", text(&out));
    assert!(!home.join("store").exists(), "the held home was used");
}

/// `--event` and `--ref` are what the run's expressions see; a pull
/// request's run is untrusted as on a server, says so, and still runs.
#[test]
fn event_and_ref_reach_the_run() {
    let wf = "version: 1\njobs:\n  - name: show\n    steps:\n      - echo \"event=${{ event }} ref=${{ ref }}\"\n";
    let c = Checkout::new(&[(".kiln/pipeline.yaml", wf)]);
    let out = c.exec(&["--event", "pull_request", "--ref", "feature/x", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = run_json(&out);
    assert_eq!((run["event"].as_str(), run["ref"].as_str()), (Some("pull_request"), Some("refs/heads/feature/x")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("event=pull_request ref=refs/heads/feature/x"), "{}", text(&out));
    assert!(err.contains("trust: untrusted"), "{}", text(&out));
}

/// With `--listen`, the API and the web UI serve there while the run lasts,
/// and the run's page is printed; the admin token printed opens the API.
#[test]
fn listen_serves_the_web_ui_while_the_run_lasts() {
    let wf = "version: 1\njobs:\n  - name: wait\n    steps: [\"sleep 3; echo waited\"]\n";
    let c = Checkout::new(&[(".kiln/pipeline.yaml", wf)]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let err_file = c.tmp.join("listen.err");
    let mut child = Command::new(BIN)
        .args(["exec", "--listen", &addr])
        .current_dir(&c.repo)
        .env("XDG_CACHE_HOME", &c.cache)
        .env("TMPDIR", &c.tmp)
        .env("KILN_STORAGE_LEVELS", "off")
        .env_remove("KILN_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let curl = |url: &str| Command::new("curl").args(["-fsS", "--max-time", "3", url]).output().unwrap();
    let page = kiln_testkit::wait_for(std::time::Duration::from_secs(30), || {
        let o = curl(&format!("http://{addr}/"));
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).to_string())
    });
    // The step lasts 3 s: the page was served while the run lasted.
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(&err_file).unwrap();
    assert!(page.is_some_and(|p| p.to_lowercase().contains("<html")), "no web UI at {addr}: {err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("web UI: http://{addr}/#/runs/")), "{err}");
    assert!(err.contains("admin token kiln_"), "{err}");
}
