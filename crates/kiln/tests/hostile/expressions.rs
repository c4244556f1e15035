//! Issue 39 item 11: a `${{ }}` value (here a hand-started run's input, as a
//! trigger-token holder or a forge event would set it) never becomes code in
//! a nested interpreter. With the real `kiln up` (host agent, real `sh` and
//! `bash`): written through `env:` the value reaches `sh -c '…'`, a
//! here-document fed to `sh` and `$((1<<2))` as data; written into the
//! program text of a nested interpreter, arithmetic or single quotes, the
//! run is refused at acceptance with the line, the column and the hint, and
//! nothing is stored or run.

use crate::BIN;
use kiln_api::Client;
use kiln_testkit::{KilnUp, TestRepo, step_writable_tempdir};
use std::process::Output;

fn add_repo(up: &KilnUp, name: &str, repo: &TestRepo) {
    let out = up.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", String::from_utf8_lossy(&out.stderr));
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A value that runs `touch` in every shell, Python and bash-arithmetic
/// reading of it: relative marks land in the workspace (a later step lists
/// them), absolute ones in `marks`.
fn payload(marks: &str) -> String {
    format!(
        "x'; touch pwned-sq {marks}/sq; ' \"; touch pwned-dq {marks}/dq; \" $(touch pwned-sub {marks}/sub) \
         `touch pwned-bt {marks}/bt` a[$(touch pwned-arith {marks}/arith)] \"); import os; os.system('touch pwned-py'); print(\""
    )
}

const AS_DATA: &str = r#"version: 1
inputs:
  title: {description: a pull request title, required: true}
jobs:
  - name: nested
    env:
      TITLE: "${{ inputs.title }}"
    steps:
      - sh -c 'printf "sh-c[%s]\n" "$TITLE"'
      - sh -c 'printf "arg[%s]\n" "$1"' sh "${{ inputs.title }}"
      - |
        sh <<'EOF'
        printf 'heredoc-sh[%s]\n' "$TITLE"
        EOF
      - |
        cat <<EOF
        heredoc-cat[${{ inputs.title }}]
        EOF
      - echo "arith[$((1<<2))] dq[${{ inputs.title }}]"
      - bash -c 'x=$((1<<3)); echo "bash-arith[$x]"'
      - name: check the workspace
        run: for f in pwned*; do [ -e "$f" ] && echo "found-$f"; done; true
"#;

/// Each step writes the value where the shell would hand it to another
/// parser; steps 2 and 5 are fine (the refusals name steps 1, 3, 4, 6, 7).
const AS_CODE: &str = r#"version: 1
inputs:
  title: {description: a pull request title, required: true}
jobs:
  - name: nested
    steps:
      - sh -c 'echo "${{ inputs.title }}"'
      - echo "${{ inputs.title }}"
      - python3 -c "print('${{ inputs.title }}')"
      - |
        echo start
        sh <<EOF
        echo ${{ inputs.title }}
        EOF
      - echo $((1<<2)) "${{ inputs.title }}"
      - echo $(( ${{ inputs.title }} + 1 ))
      - bash -c 'true'; [[ ${{ inputs.title }} -eq 1 ]]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn expression_values_stay_data_in_nested_interpreters() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let marks = step_writable_tempdir().unwrap();
    let m = marks.path().display().to_string();
    let value = payload(&m);

    // Through `env:`: the run succeeds and every form prints the value.
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", AS_DATA)]).unwrap();
    add_repo(&up, "as-data", &repo);
    let out = up
        .cli()
        .args(["run", "--repo", "as-data", "--commit", "main", "--follow", "--input"])
        .arg(format!("title={value}"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}\n{}", up.log());
    for form in ["sh-c", "arg", "heredoc-sh", "heredoc-cat", "dq"] {
        assert!(all.contains(&format!("{form}[{value}]")), "{form}\n{all}");
    }
    assert!(all.contains("arith[4]") && all.contains("bash-arith[8]"), "{all}");
    assert!(!all.contains("found-pwned"), "{all}");
    let made: Vec<_> = std::fs::read_dir(marks.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(made.is_empty(), "the value ran: {made:?}\n{all}");

    // Into program text, arithmetic or single quotes: refused at
    // acceptance, with where and what to do instead; nothing stored.
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", AS_CODE)]).unwrap();
    add_repo(&up, "as-code", &repo);
    let out = up
        .cli()
        .args(["run", "--repo", "as-code", "--commit", "main", "--follow", "--input"])
        .arg(format!("title={value}"))
        .output()
        .unwrap();
    let all = text(&out);
    assert_ne!(out.status.code(), Some(0), "{all}");
    for want in [
        "7:9: invalid step 1 of job `nested`: at line 1, column 14 of the script: `${{ }}` stands inside single quotes",
        "9:9: invalid step 3 of job `nested`: at line 1, column 20 of the script: `${{ }}` is the program text of `python3`",
        "11:9: invalid step 4 of job `nested`: at line 3, column 6 of the script: `${{ }}` stands in a here-document read by `sh`",
        "16:9: invalid step 6 of job `nested`: at line 1, column 10 of the script: `${{ }}` stands in arithmetic",
        "17:9: invalid step 7 of job `nested`: at line 1, column 20 of the script: `${{ }}` stands in a `[[ … ]]` that compares numbers",
        "pass the value through `env:` (e.g. `env: {NAME: \"${{ inputs.title }}\"}`) and use \"$NAME\"",
    ] {
        assert!(all.contains(want), "{want}\n{all}");
    }
    assert!(!all.contains("step 2 of") && !all.contains("step 5 of"), "{all}");
    let c = Client::new(&up.url, &up.token);
    assert!(c.list_runs("as-code", None, None).await.unwrap().runs.is_empty());
    let made: Vec<_> = std::fs::read_dir(marks.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(made.is_empty(), "the value ran: {made:?}\n{all}");
}
