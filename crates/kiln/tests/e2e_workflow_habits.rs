//! Workflows as people write them (issue 41, items 2 and 7), end to end: the
//! real `kiln` binary (`kiln up` with host agents running real shells) and
//! real git repositories.
//!
//! * A matrix job whose cache `version`/`inputs`/`paths` and artifact
//!   `name`/`path` use `${{ matrix.py }}`: each expansion saves and, on the
//!   next run, restores its own cache, and publishes its own artifact. A
//!   cache without matrix references keys on the matrix values too.
//! * GitHub Actions' `jobs:` map runs end to end (keys as names, `needs`
//!   pointing forward, a job's key standing for its `name:`).
//! * `${{ commit.short_sha }}` / `commit.title` / `commit.author` in a
//!   step's env are the run's commit.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn logs(up: &KilnUp, run: &str, job: &str) -> String {
    let out = up.cli().args(["logs", run, job]).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

async fn run_ok(up: &KilnUp, c: &Client, repo: &str) -> kiln_api::Run {
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let id = c.submit_run(repo, &body, None).await.unwrap().run_id;
    let run = kiln_testkit::wait_run(c, &id, 180).await;
    let all = String::from_utf8_lossy(&up.cli().args(["logs", &id]).output().unwrap().stdout).to_string();
    assert_eq!(run.status.as_str(), "success", "{all}\n{}", up.log());
    run
}

const MATRIX: &str = r#"version: 1
jobs:
  - name: venv
    matrix:
      py: ["3.10", "3.11", "3.12"]
    cache:
      kind: dependencies
      version: "v1-${{ matrix.py }}"
      inputs: ["requirements-${{ matrix.py }}.txt"]
      paths: ["venv-${{ matrix.py }}"]
    artifacts:
      publish:
        - {name: "report-${{ matrix.py }}", path: "out/${{ matrix.py }}/report.txt"}
    steps:
      - |
        if [ -f "venv-${{ matrix.py }}/made-for" ]; then
          echo "restored: $(cat "venv-${{ matrix.py }}/made-for")"
        else
          mkdir -p "venv-${{ matrix.py }}"
          echo "python ${{ matrix.py }} of run $KILN_RUN_ID" > "venv-${{ matrix.py }}/made-for"
          echo "cold venv for ${{ matrix.py }}"
        fi
      - mkdir -p "out/${{ matrix.py }}" && echo "report of ${{ matrix.py }}" > "out/${{ matrix.py }}/report.txt"
  - name: plain-cache
    matrix:
      py: ["3.10", "3.12"]
    cache: {kind: build, version: "1", paths: [shared]}
    steps:
      - 'if [ -f shared/who ]; then echo "restored: $(cat shared/who)"; else mkdir -p shared && echo "$KILN_MATRIX_PY" > shared/who && echo "cold shared"; fi'
"#;

#[tokio::test(flavor = "multi_thread")]
async fn each_matrix_expansion_has_its_own_cache_and_artifact() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/pipeline.yaml", MATRIX),
        ("requirements-3.10.txt", "a==1\n"),
        ("requirements-3.11.txt", "a==2\n"),
        ("requirements-3.12.txt", "a==3\n"),
    ])
    .unwrap();
    add_repo(&up, "py", &repo);
    let c = Client::new(&up.url, &up.token);

    let first = run_ok(&up, &c, "py").await;
    let pys = ["3.10", "3.11", "3.12"];
    let mut keys = std::collections::BTreeSet::new();
    for py in pys {
        let job = format!("venv (py={py})");
        let log = logs(&up, &first.id, &job);
        assert!(log.contains(&format!("cold venv for {py}")), "{job}: {log}");
        let j = first.jobs.iter().find(|j| j.name == job).unwrap_or_else(|| panic!("{job} in {:?}", first.jobs));
        let cache = j.cache.clone().expect("a cache report");
        assert_eq!((cache.result.as_str(), cache.saved.as_deref()), ("miss", Some("saved")), "{job}: {cache:?}");
        keys.insert(cache.key);
        // Published under its own name, with its own bytes.
        let name = format!("report-{py}");
        assert!(j.artifacts.iter().any(|a| a.name == name), "{job}: {:?}", j.artifacts);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("report.txt");
        let out = up.cli().args(["artifact", "get", &first.id, &job, &name, "-o"]).arg(&file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("report of {py}\n"));
    }
    assert_eq!(keys.len(), 3, "one cache key per expansion: {keys:?}");

    // The next run: every expansion restores the venv it saved, not another's.
    let second = run_ok(&up, &c, "py").await;
    for py in pys {
        let job = format!("venv (py={py})");
        let log = logs(&up, &second.id, &job);
        assert!(log.contains(&format!("restored: python {py} of run {}", first.id)), "{job}: {log}");
        let j = second.jobs.iter().find(|j| j.name == job).unwrap();
        assert_eq!(j.cache.as_ref().map(|c| c.result.as_str()), Some("hit"), "{job}");
    }
    // A cache that names no matrix key is keyed on every matrix value.
    for py in ["3.10", "3.12"] {
        let job = format!("plain-cache (py={py})");
        assert!(logs(&up, &first.id, &job).contains("cold shared"), "{job}");
        let log = logs(&up, &second.id, &job);
        assert!(log.contains(&format!("restored: {py}")), "{job} restored another expansion's cache: {log}");
    }
}

const MAP: &str = r#"version: 1
jobs:
  report:
    needs: [package, lint]
    artifacts:
      restore:
        - {from_job: package, name: bundle, path: got}
    steps:
      - echo "report got $(cat got)"
  build:
    steps:
      - echo built > built.txt
  package:
    name: Package it
    needs: build
    artifacts:
      publish:
        - {name: bundle, path: bundle.txt}
    steps:
      - echo "bundle of $KILN_JOB" > bundle.txt
  lint:
    steps: [echo linted]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_github_style_jobs_map_runs() {
    let up = KilnUp::start(BIN.as_ref(), 2).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", MAP)]).unwrap();
    add_repo(&up, "map", &repo);
    let c = Client::new(&up.url, &up.token);
    let run = run_ok(&up, &c, "map").await;
    let graph: Vec<(&str, Vec<&str>)> =
        run.jobs.iter().map(|j| (j.name.as_str(), j.needs.iter().map(String::as_str).collect())).collect();
    // Sorted by needs; without `needs` a job needs nothing (GitHub's
    // parallel default); `package` is the key of `Package it`.
    assert_eq!(
        graph,
        vec![
            ("build", vec![]),
            ("Package it", vec!["build"]),
            ("lint", vec![]),
            ("report", vec!["Package it", "lint"]),
        ],
        "{:?}",
        run.jobs
    );
    assert!(logs(&up, &run.id, "report").contains("report got bundle of Package it"), "{}", up.log());
}

const COMMIT: &str = r#"version: 1
jobs:
  - name: show
    env:
      SHORT: ${{ commit.short_sha }}
    steps:
      - run: echo "short=$SHORT title=$TITLE author=$AUTHOR full=${{ commit.sha }}"
        env:
          TITLE: ${{ commit.title }}
          AUTHOR: ${{ commit.author }}
      - run: echo "only on this commit"
        if: startsWith(commit.title, 'Fix the')
"#;

#[tokio::test(flavor = "multi_thread")]
async fn commit_expressions_are_the_runs_commit() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[("README", "x\n")]).unwrap();
    let sha =
        repo.commit(&[(".kiln/pipeline.yaml", COMMIT)], "Fix the frobnicator; don't `rm`\n\nThe long story.").unwrap();
    add_repo(&up, "commit", &repo);
    let c = Client::new(&up.url, &up.token);
    let run = run_ok(&up, &c, "commit").await;
    assert_eq!(run.commit_sha, sha);
    let log = logs(&up, &run.id, "show");
    let want = format!("short={} title=Fix the frobnicator; don't `rm` author=kiln-test full={sha}", &sha[..7]);
    assert!(log.contains(&want), "{want}\n{log}");
    assert!(log.contains("only on this commit"), "{log}");
}
