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
