//! Real toolchains the way users have them (issue 41, "must show"), end to
//! end with the real `kiln` binary, host agents and real git repositories:
//!
//! * A Python project: a real `python3 -m venv` cached per expansion of a
//!   3-value interpreter matrix. Each expansion gets its own cache entry;
//!   on the second run each restores its own venv, whose `bin/python` is
//!   still the symlink to its interpreter, and that venv works. (The
//!   machine has one CPython, under three names: the matrix is over the
//!   name, which is what each venv's links point to; `system` is
//!   `/usr/bin/python3.11`.)
//! * A Rust crate built with the agent user's own rustup and cargo (passed
//!   through: `RUSTUP_HOME`, `CARGO_HOME`, `~/.cargo/bin`): its release
//!   binary — hard-linked by cargo into `target/release/deps` — is
//!   published as built, downloaded by the next job and run.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn logs(up: &KilnUp, run: &str) -> String {
    let out = up.cli().args(["logs", run]).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

async fn run_ok(up: &KilnUp, c: &Client, repo: &str) -> (kiln_api::Run, String) {
    let body = SubmitRun { commit_sha: "HEAD".into(), ..Default::default() };
    let id = c.submit_run(repo, &body, None).await.unwrap().run_id;
    let run = kiln_testkit::wait_run(c, &id, 600).await;
    let log = logs(up, &id);
    assert_eq!(run.status.as_str(), "success", "{log}\n{}", up.log());
    (run, log)
}

const VENV: &str = r#"version: 1
jobs:
  - name: test
    matrix:
      python: [python3, python3.11, system]
    cache:
      kind: dependencies
      version: "venv-1"
      inputs: [requirements.txt]
      paths: [.venv]
    steps:
      - |
        if [ -x .venv/bin/python ]; then
          echo "venv restored for ${{ matrix.python }}: made by $(cat .venv/made-by)"
        else
          PY=${{ matrix.python }}; [ "$PY" = system ] && PY=/usr/bin/python3.11
          $PY -m venv .venv
          echo "${{ matrix.python }}" > .venv/made-by
          echo "venv created for ${{ matrix.python }}"
        fi
      - L=$(readlink .venv/bin/python); echo "python link of ${{ matrix.python }} -> $L -> $(readlink .venv/bin/$L)"
      - .venv/bin/python -c 'import sys; assert sys.prefix != sys.base_prefix; print("venv works:", sys.prefix.endswith("/.venv"))'
      - .venv/bin/python -m pip --version >/dev/null && echo "pip works"
"#;

fn python_ready() -> bool {
    std::process::Command::new("/usr/bin/python3.11")
        .args(["-c", "import ensurepip, venv"])
        .status()
        .is_ok_and(|s| s.success())
}

/// A real venv per matrix expansion, restored from the cache on the next
/// run as a working venv (its interpreter links kept as links).
#[tokio::test(flavor = "multi_thread")]
async fn a_python_venv_cache_per_matrix_expansion_works_when_restored() {
    if !python_ready() {
        assert!(std::env::var_os("KILN_REQUIRE_PYTHON").is_none(), "python3.11 with venv and ensurepip is required");
        eprintln!("skipped: no /usr/bin/python3.11 with venv (apt-get install python3-venv)");
        return;
    }
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", VENV), ("requirements.txt", "# none yet\n")]).unwrap();
    add_repo(&up, "py", &repo);
    let c = Client::new(&up.url, &up.token);
    let (first, log) = run_ok(&up, &c, "py").await;
    for p in ["python3", "python3.11", "system"] {
        assert!(log.contains(&format!("venv created for {p}")), "{log}");
    }
    let keys: std::collections::BTreeSet<String> =
        first.jobs.iter().filter_map(|j| j.cache.as_ref().map(|c| c.key.clone())).collect();
    assert_eq!(keys.len(), 3, "one cache entry per expansion: {:?}", first.jobs);

    let (second, log) = run_ok(&up, &c, "py").await;
    for p in ["python3", "python3.11", "system"] {
        assert!(log.contains(&format!("venv restored for {p}: made by {p}")), "each its own venv: {log}");
    }
    // Each venv's interpreter link is the one its expansion made.
    assert!(log.contains("python link of python3 -> python3 -> /usr/bin/python3\n"), "{log}");
    assert!(log.contains("python link of system -> python3.11 -> /usr/bin/python3.11\n"), "{log}");
    let lines = |text: &str| log.lines().filter(|l| *l == text).count();
    assert_eq!(lines("venv works: True"), 3, "{log}");
    assert_eq!(lines("pip works"), 3, "{log}");
    for j in &second.jobs {
        let cache = j.cache.as_ref().expect("a cache");
        assert_eq!(cache.result, "hit", "{}: {cache:?}", j.name);
    }
}

const CRATE: &str = r#"version: 1
jobs:
  - name: build
    artifacts:
      publish:
        - {name: hello, path: target/release/hello}
    steps:
      - cargo --version
      - cargo build --release --offline
      - ls -li target/release/hello target/release/deps/hello-*
  - name: use
    needs: [build]
    artifacts:
      restore:
        - {name: hello, from_job: build, path: bin/hello}
    steps:
      - chmod +x bin/hello && ./bin/hello
"#;

/// `cargo build --release` with the agent user's rustup, its hard-linked
/// binary published as built, downloaded by the next job and run.
#[tokio::test(flavor = "multi_thread")]
async fn a_cargo_release_binary_is_published_and_run_by_the_next_job() {
    let home = std::env::var("HOME").unwrap_or_default();
    if !std::path::Path::new(&home).join(".cargo/bin/cargo").exists() {
        eprintln!("skipped: no rustup cargo in this user's home");
        return;
    }
    // A root agent's steps run as nobody, who cannot read root's home: the
    // rustup toolchain is usable by steps that run as its owner
    // (docs/deploy.md). A non-root agent's steps are its own user already.
    let flags: &[&str] = if nix::unistd::geteuid().is_root() { &["--step-user", "root"] } else { &[] };
    let up = KilnUp::start_env(BIN.as_ref(), 1, flags, &[("RUSTUP_HOME", ""), ("CARGO_HOME", "")]).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/pipeline.yaml", CRATE),
        ("Cargo.toml", "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n"),
        ("src/main.rs", "fn main() { println!(\"hello from a kiln-built binary\"); }\n"),
    ])
    .unwrap();
    add_repo(&up, "rs", &repo);
    let c = Client::new(&up.url, &up.token);
    let (run, log) = run_ok(&up, &c, "rs").await;
    assert!(log.contains("Compiling hello v0.1.0"), "cargo really built it: {log}");
    assert!(log.contains("hello from a kiln-built binary"), "{log}");
    let build = run.jobs.iter().find(|j| j.name == "build").unwrap();
    let art = build.artifacts.iter().find(|a| a.name == "hello").expect("published");
    assert!(art.size > 100_000, "the real binary: {art:?}");
    assert!(up.log().contains("host steps get the toolchains in"), "{}", up.log());
}
