//! `include:` and `extends:` end to end: the real `kiln` binary reads the
//! included files from the run's commit (real git), runs what the template
//! says, freezes the composed definition, and refuses a broken include at
//! acceptance naming the included file and line.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const WORKFLOW: &str = r#"version: 1
include: .kiln/templates/common.yaml
jobs:
  - name: build
    extends: shell
    env:
      WHO: job
    steps:
      - echo "build greets=$GREETING who=$WHO"
"#;

const TEMPLATES: &str = r#"templates:
  shell:
    timeout: 5m
    env:
      GREETING: hello-from-template
      WHO: template
jobs:
  - name: lint
    extends: shell
    steps:
      - echo "lint greets=$GREETING"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn included_templates_run_from_the_runs_commit() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW), (".kiln/templates/common.yaml", TEMPLATES)]).unwrap();
    let first = repo.head().unwrap();
    let out = up.cli().args(["repo", "add", "reuse", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = Client::new(&up.url, &up.token);

    let run =
        c.submit_run("reuse", &SubmitRun { commit_sha: first.clone(), ..Default::default() }, None).await.unwrap();
    let done = kiln_testkit::wait_run(&c, &run.run_id, 120).await;
    let logs = up.cli().args(["logs", &run.run_id]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout).to_string();
    assert_eq!(done.status, "success", "{logs}\n{}", up.log());
    let names: Vec<&str> = done.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["lint", "build"], "the included file's jobs come first");
    assert!(logs.contains("lint greets=hello-from-template"), "{logs}");
    assert!(logs.contains("build greets=hello-from-template who=job"), "{logs}");

    // A later commit breaks the included file: that commit is refused with
    // 422 naming the included file and line, and nothing is stored.
    let broken = TEMPLATES.replace("timeout: 5m", "timeout: soon");
    let second = repo.commit(&[(".kiln/templates/common.yaml", &broken)], "break the template").unwrap();
    let e =
        c.submit_run("reuse", &SubmitRun { commit_sha: second.clone(), ..Default::default() }, None).await.unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    assert!(e.to_string().contains(".kiln/templates/common.yaml:3:14: `timeout` of job"), "{e}");
    assert_eq!(c.list_runs("reuse", None, None).await.unwrap().runs.len(), 1, "nothing stored");

    // Retrying the first run reruns its frozen definition, not the broken
    // file now at the branch's tip.
    let retry = up.cli().args(["retry", &run.run_id]).output().unwrap();
    assert!(retry.status.success(), "{}", String::from_utf8_lossy(&retry.stderr));
    let runs = c.list_runs("reuse", None, None).await.unwrap().runs;
    let newest = &runs[0].id;
    let again = kiln_testkit::wait_run(&c, newest, 120).await;
    assert_eq!(again.status, "success");
    assert_eq!(again.workflow_hash, done.workflow_hash);

    // `kiln validate` reads includes from the working tree, naming the file.
    let out = std::process::Command::new(BIN)
        .args(["validate", ".kiln/pipeline.yaml"])
        .current_dir(repo.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(".kiln/templates/common.yaml:3:14:"), "{err}");
}
