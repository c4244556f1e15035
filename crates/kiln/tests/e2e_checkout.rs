//! `checkout:` (issue 47, item 1) end to end: the real `kiln` binary (`kiln
//! up` with a host agent), a real git repository bigger than a pristine
//! copy keeps, runs submitted through the API.
//!
//! * `reuse: true`: the second run's job gets the first run's workspace
//!   (the same inodes) brought to the new commit — what the first job left
//!   and changed is gone, `git status` is clean, and its log says so.
//! * `depth` + `sparse`: only the listed directory, one commit of history.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    checkout: {reuse: true}
    steps:
      - |
        echo "ino=$(stat -c %i d5/f500.txt)"
        cat d0/f0.txt
        ls
        git status --porcelain
        echo "status-done"
        echo left > left-behind.txt
        echo mangled >> d0/f0.txt
"#;

const DOCS: &str = r#"version: 1
jobs:
  - name: docs
    checkout: {depth: 1, sparse: [d1]}
    steps:
      - |
        echo "files=$(find . -path ./.git -prune -o -type f -print | wc -l)"
        echo "outside=$(find . -path ./.git -prune -o -type f -print | grep -vc '^./d1/')"
        echo "commits=$(git log --oneline | wc -l)"
"#;

async fn run_ok(up: &KilnUp, c: &Client, workflow: &str) -> (String, kiln_api::Run) {
    let body = SubmitRun { commit_sha: "main".into(), workflow_path: Some(workflow.into()), ..Default::default() };
    let id = c.submit_run("big", &body, None).await.unwrap().run_id;
    let run = kiln_testkit::wait_run(c, &id, 180).await;
    let all = logs(up, &id, None);
    assert_eq!(run.status.as_str(), "success", "{all}\n{}", up.log());
    (id, run)
}

fn logs(up: &KilnUp, run: &str, job: Option<&str>) -> String {
    let mut cmd = up.cli();
    cmd.args(["logs", run]);
    if let Some(j) = job {
        cmd.arg(j);
    }
    let out = cmd.output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_workspace_comes_back_clean_at_the_next_commit_and_sparse_holds_only_its_cone() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let mut files: Vec<(String, String)> =
        (0..2_100).map(|i| (format!("d{}/f{i}.txt", i / 100), format!("file {i}\n"))).collect();
    files.push((".kiln/pipeline.yaml".into(), WORKFLOW.into()));
    files.push((".kiln/docs.yaml".into(), DOCS.into()));
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    let repo = TestRepo::new(&refs).unwrap();
    let out = up.cli().args(["repo", "add", "big", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
    let c = Client::new(&up.url, &up.token);

    let (first, _) = run_ok(&up, &c, ".kiln/pipeline.yaml").await;
    repo.commit(&[("d0/f0.txt", "file 0, changed\n")], "change").unwrap();
    let (second, _) = run_ok(&up, &c, ".kiln/pipeline.yaml").await;
    let (docs_run, _) = run_ok(&up, &c, ".kiln/docs.yaml").await;

    let one = logs(&up, &first, Some("build"));
    let two = logs(&up, &second, Some("build"));
    let ino = |log: &str| log.lines().find_map(|l| l.split("ino=").nth(1).map(str::to_string)).unwrap();
    assert!(two.contains("bringing it from"), "{two}");
    assert_eq!(ino(&one), ino(&two), "the second job got the first one's workspace:\n{one}\n{two}");
    assert!(two.contains("file 0, changed\n"), "the new commit's file: {two}");
    assert!(!two.contains("mangled") && !two.contains("left-behind.txt"), "what the first job left: {two}");
    let status = two.split("status-done").next().unwrap();
    assert!(!status.lines().any(|l| l.contains("?? ") || l.contains(" M ")), "git status is clean: {two}");

    let docs = logs(&up, &docs_run, Some("docs"));
    assert!(docs.contains("files=100\n") && docs.contains("outside=0\n"), "only d1: {docs}");
    assert!(docs.contains("commits=1\n"), "depth 1: {docs}");
}

const SMALL: &str = r#"version: 1
jobs:
  - name: small
    steps:
      - |
        echo "ino=$(stat -c %i keep.txt)"
        cat keep.txt keep2.txt sub/deep/a.txt
        echo "mode=$(stat -c %a run.sh)"
        ls -A
        git status --porcelain
        echo "head=$(git rev-parse HEAD) branch=$(git branch --show-current)"
        echo probe-done
        case "$KILN_INPUT_MODE" in
          dirty)
            echo mangled >> sub/deep/a.txt; echo new > new.txt; rm keep2.txt; chmod 600 run.sh
            mkdir -p t/x; ln -s /etc lnk; git checkout -q -b other; exit 1 ;;
          deep) echo deep-change >> sub/deep/a.txt ;;
        esac
"#;

/// A small tree's workspace, kept by its job slot for the next job of the
/// same commit (issue 47, item 3): whatever a job changed — a file deep in
/// the tree, a new file, a removed one, a mode, a link, its `.git` — the
/// next job of the commit finds none of it; a job that changed nothing
/// hands the workspace on as it is (the same inodes, nothing compared or
/// copied: the agent looks only at what changed since the steps began).
#[tokio::test(flavor = "multi_thread")]
async fn a_small_trees_kept_workspace_is_clean_for_the_next_job_of_its_commit() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[
        (".kiln/pipeline.yaml", SMALL),
        ("keep.txt", "keep\n"),
        ("keep2.txt", "keep two\n"),
        ("sub/deep/a.txt", "deep a\n"),
        ("run.sh", "#!/bin/sh\n"),
    ])
    .unwrap();
    let out = up.cli().args(["repo", "add", "small", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
    let c = Client::new(&up.url, &up.token);
    let run = |mode: &'static str| {
        let c = c.clone();
        let up = &up;
        async move {
            let body = SubmitRun {
                commit_sha: "main".into(),
                inputs: [("mode".to_string(), mode.to_string())].into_iter().collect(),
                ..Default::default()
            };
            let id = c.submit_run("small", &body, None).await.unwrap().run_id;
            let run = kiln_testkit::wait_run(&c, &id, 120).await;
            let log = logs(up, &id, Some("small"));
            (run.status, log)
        }
    };
    // What a step sees before it changes anything, without the inode.
    let probe = |log: &str| -> String {
        let start = log.find("keep\n").unwrap_or(0);
        let end = log.find("probe-done").unwrap_or(log.len());
        log[start..end].to_string()
    };
    let ino = |log: &str| log.lines().find_map(|l| l.split("ino=").nth(1).map(str::to_string)).unwrap();

    let (status, first) = run("dirty").await;
    assert_eq!(status, "failed", "{first}");
    let (status, a) = run("probe").await;
    assert_eq!(status, "success", "{a}");
    assert_eq!(probe(&a), probe(&first), "the dirty job's changes are gone:\n{first}\n{a}");
    for line in ["keep two\n", "deep a\n", "mode=7"] {
        assert!(probe(&a).contains(line), "{line:?} in {a}");
    }
    for gone in ["new.txt", "lnk", "other", "mangled", "\nt\n", "?? "] {
        assert!(!probe(&a).contains(gone), "{gone:?} left behind: {a}");
    }
    let (_, b) = run("deep").await;
    assert_eq!(probe(&b), probe(&a), "{b}");
    assert_eq!(ino(&b), ino(&a), "a job that changed nothing hands the workspace on as it is:\n{a}\n{b}");
    let (_, after_deep) = run("probe").await;
    assert_eq!(probe(&after_deep), probe(&a), "a change deep in the tree is gone: {after_deep}");
    assert!(!after_deep.contains("deep-change"), "{after_deep}");
}
