//! The workflow language for daily use, end to end: the real `kiln` binary
//! (`kiln up` with real agents running real shells), real git repositories.
//! Env precedence (step > job > workflow), `defaults`, step `if` /
//! `continue-on-error` / `timeout` / `working-directory` / `shell`, typed
//! inputs refused at acceptance, and hostile values inert in `run`.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo, step_writable_tempdir};
use std::collections::BTreeMap;
use std::process::Output;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn logs(up: &KilnUp, run: &str) -> String {
    text(&up.cli().args(["logs", run]).output().unwrap())
}

const OPTIONS: &str = r#"version: 1
env:
  A: workflow
  B: workflow
  C: workflow
defaults:
  shell: bash
jobs:
  - name: options
    env:
      B: job
      C: job
    defaults:
      working-directory: sub
    steps:
      - name: precedence
        run: echo "vars A=$A B=$B C=$C"
        env:
          C: step
      - name: defaults
        run: echo "bash=${BASH_VERSION:+yes} dir=$(basename "$PWD")"
      - name: own directory
        run: echo "dir=$(basename "$PWD")"
        working-directory: sub/deeper
      - name: python
        run: print("py", 6 * 7)
        shell: python3
        env:
          # The system interpreter: a pyenv shim under /root is closed to
          # the step user (`nobody`) of a root agent.
          PATH: /usr/local/bin:/usr/bin:/bin
      - name: template
        run: echo "template ran from $(basename "$0" | cut -c1-9)"
        shell: sh -e {0}
      - name: not yet
        run: echo "failure-step-ran-too-early"
        if: failure()
      - name: allowed to fail
        run: exit 3
        continue-on-error: true
      - name: after continued
        run: echo "after-continued success=${{ event }}"
      - name: too slow
        run: sleep 600
        timeout: 1
        continue-on-error: true
      - name: after timeout
        run: echo "after-timeout"
      - name: breaks
        run: exit 4
      - name: skipped after failure
        run: echo "must-not-run"
      - name: cleanup
        run: echo "cleanup-ran"
        if: failure()
      - name: always
        run: echo "always-ran"
        if: always()
      - name: missing directory
        run: echo "must-not-run-either"
        working-directory: nowhere
        if: always()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn env_precedence_and_step_options() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", OPTIONS), ("sub/deeper/.keep", ""), ("sub/.keep", "")]).unwrap();
    add_repo(&up, "opts", &repo);
    let c = Client::new(&up.url, &up.token);
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let run = c.submit_run("opts", &body, None).await.unwrap().run_id;
    let done = kiln_testkit::wait_run(&c, &run, 120).await;
    let all = logs(&up, &run);
    assert_eq!(done.status, "failed", "{all}\n{}", up.log());
    let job = &done.jobs[0];
    let message = job.attempts[0].message.clone().unwrap_or_default();
    assert!(message.contains("`breaks` failed: exit code 4"), "{message}\n{all}");
    assert_eq!(job.attempts[0].exit_code, Some(4), "{all}");

    // Step > job > workflow.
    assert!(all.contains("vars A=workflow B=job C=step"), "{all}");
    // Workflow `defaults.shell`, job `defaults.working-directory`, a step's own.
    assert!(all.contains("bash=yes dir=sub"), "{all}");
    assert!(all.contains("dir=deeper"), "{all}");
    assert!(all.contains("py 42"), "{all}");
    assert!(all.contains("template ran from kiln-step"), "{all}");
    // `if: failure()` before any failure: skipped, and said so.
    assert!(!all.contains("failure-step-ran-too-early"), "{all}");
    assert!(all.contains("step 6/15: not yet skipped (`if: failure()` is false)"), "{all}");
    // continue-on-error: the job goes on, and later steps still see success.
    assert!(all.contains("continue-on-error: the job goes on"), "{all}");
    assert!(all.contains("after-continued success=manual"), "{all}");
    // A step's own timeout interrupts it; with continue-on-error the job goes on.
    assert!(all.contains("step 9/15 failed: timed out after 1s"), "{all}");
    assert!(all.contains("after-timeout"), "{all}");
    // After a real failure: plain steps skipped, failure()/always() run.
    assert!(!all.contains("must-not-run"), "{all}");
    assert!(all.contains("skipped after failure skipped (an earlier step failed)"), "{all}");
    assert!(all.contains("cleanup-ran") && all.contains("always-ran"), "{all}");
    assert!(all.contains("working-directory `nowhere` does not exist"), "{all}");
    // Each step's outcome and duration is recorded on the attempt (the run API).
    let steps = &job.attempts[0].steps;
    let step = |name: &str| steps.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name}: {steps:#?}"));
    assert_eq!(steps.len(), 15, "{steps:#?}");
    assert_eq!(step("precedence").outcome, "success");
    assert!(step("precedence").duration_ms.is_some());
    assert_eq!(step("not yet").outcome, "skipped");
    assert_eq!(step("not yet").duration_ms, None);
    assert_eq!(step("allowed to fail").outcome, "continued");
    assert_eq!(step("breaks").outcome, "failure");
    assert!(step("breaks").message.as_deref().unwrap_or("").contains("exit code 4"), "{steps:#?}");
    assert_eq!(step("skipped after failure").outcome, "skipped");
    assert_eq!(step("cleanup").outcome, "success");
    // The summary shows every step's outcome.
    for line in [
        "1. ✓ precedence: success",
        "6. ○ not yet: skipped",
        "7. ✗ allowed to fail: failure, continued",
        "9. ✗ too slow: failure, continued",
        "11. ✗ breaks: failure",
        "12. ○ skipped after failure: skipped",
        "13. ✓ cleanup: success",
    ] {
        assert!(all.contains(line), "{line}\n{all}");
    }
}

const HOSTILE_WF: &str = r#"version: 1
inputs:
  who:
    description: Someone to greet
    required: true
  loud:
    type: boolean
    default: false
jobs:
  - name: greet
    env:
      WHO: "${{ inputs.who }}"
    steps:
      - echo "dq[${{ inputs.who }}]"
      - echo bare[${{ inputs.who }}]
      - echo 'sq['"${{ inputs.who }}"']'
      - |
        cat <<EOF
        hd[${{ inputs.who }}]
        EOF
      - echo "env[$WHO]"
      - echo "branch[${{ branch }}]"
      - run: echo "loud is on"
        if: inputs.loud
      - name: "named ${{ inputs.loud }}"
        run: echo "loud=${{ inputs.loud }}"
      - name: check the workspace
        run: for f in pwned*; do [ -e "$f" ] && echo "found-$f"; done; true
"#;

#[tokio::test(flavor = "multi_thread")]
async fn hostile_values_are_inert_in_run() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let marks = step_writable_tempdir().unwrap();
    let m = marks.path().display().to_string();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", HOSTILE_WF)]).unwrap();
    // A branch whose name is shell code, too (its marks land in the workspace).
    let branch = "x\";touch${IFS}pwned-branch;$(touch${IFS}pwned-branch2)'".to_string();
    let out = std::process::Command::new("git").arg("-C").arg(repo.path()).args(["branch", &branch]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    add_repo(&up, "hostile", &repo);
    let who =
        format!("\"; touch {m}/dq; echo \" '; touch {m}/sq; ' $(touch {m}/sub) `touch {m}/bt`\nEOF\ntouch {m}/hd");
    let out = up
        .cli()
        .args(["run", "--repo", "hostile", "--commit", &branch, "--follow", "--input"])
        .arg(format!("who={who}"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}\n{}", up.log());
    let marks_made: Vec<_> = std::fs::read_dir(marks.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(marks_made.is_empty(), "injected commands ran: {marks_made:?}\n{all}");
    // Each form printed the value as text.
    let first = who.lines().next().unwrap();
    for form in ["dq", "bare", "sq", "hd", "env"] {
        assert!(all.contains(&format!("{form}[{first}")), "{form}\n{all}");
    }
    assert!(all.contains(&format!("branch[{branch}]")), "{all}");
    assert!(!all.contains("found-pwned"), "{all}");
    // The boolean input's default is false: the step is skipped.
    assert!(!all.lines().any(|l| l == "loud is on"), "{all}");
    assert!(all.contains("skipped (`if: inputs.loud` is false)"), "{all}");
    assert!(all.contains("named false") && all.contains("loud=false"), "{all}");
}

#[tokio::test(flavor = "multi_thread")]
async fn declared_inputs_are_enforced_at_acceptance() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let wf = r#"version: 1
inputs:
  target: {type: choice, options: [staging, production], default: staging}
  count: {type: number, required: true}
jobs:
  - name: show
    steps: ["echo \"target=$KILN_INPUT_TARGET count=${{ inputs.count }}\""]
"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    add_repo(&up, "typed", &repo);
    let c = Client::new(&up.url, &up.token);
    let submit = |inputs: &[(&str, &str)]| SubmitRun {
        commit_sha: "main".into(),
        inputs: inputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        ..Default::default()
    };
    let refused = [
        (vec![("count", "2"), ("nope", "x")], "unknown input `nope`"),
        (vec![("count", "two")], "input `count` (number) must be a number"),
        (vec![("count", "2"), ("target", "prod")], "input `target` (choice) must be one of `staging`, `production`"),
        (vec![], "input `count` is required"),
    ];
    for (inputs, want) in &refused {
        let e = c.submit_run("typed", &submit(inputs), None).await.unwrap_err();
        assert_eq!(e.status(), Some(422), "{e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    // The CLI says the same and exits non-zero.
    let out = up.cli().args(["run", "--repo", "typed", "--commit", "main", "--input", "colour=red"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("unknown input `colour`"), "{}", text(&out));
    // Nothing was stored.
    let listed = c.list_runs("typed", None, None).await.unwrap();
    assert!(listed.runs.is_empty(), "{listed:?}");

    // A valid submission is frozen with its defaults.
    let run = c.submit_run("typed", &submit(&[("count", "3")]), None).await.unwrap().run_id;
    let done = kiln_testkit::wait_run(&c, &run, 120).await;
    assert_eq!(done.status, "success");
    assert!(logs(&up, &run).contains("target=staging count=3"));
}
