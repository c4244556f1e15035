//! Env precedence, step options, typed inputs and `${{ }}` in `run`:
//! parse-time resolution and the pure functions the server evaluates them
//! with (the end-to-end behaviour is in `crates/kiln/tests/e2e_workflow_lang.rs`).

use kiln_workflow::{ConditionContext, InputKind, parse, render_run, shell_argv, step_gate};
use proptest::prelude::*;
use std::collections::BTreeMap;

const SPEC_EXAMPLE: &str = include_str!("fixtures/valid/spec-example.yaml");

fn inputs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn env_and_defaults_resolve_step_over_job_over_workflow() {
    let w = parse(include_str!("fixtures/valid/step-options.yaml")).unwrap();
    let build = &w.jobs[0];
    assert_eq!(build.env["LEVEL"], "job");
    assert_eq!(build.env["GREETING"], "hello");
    assert_eq!(build.steps[1].env["LEVEL"], "step");
    assert_eq!(w.jobs[1].env["LEVEL"], "workflow");
    // Job defaults over workflow defaults, a step's own over both.
    assert_eq!(build.steps[0].working_directory.as_deref(), Some("app"));
    assert_eq!(build.steps[2].working_directory.as_deref(), Some("tools"));
    assert_eq!(w.jobs[1].steps[0].working_directory.as_deref(), Some("src"));
    assert_eq!(build.steps[0].shell.as_deref(), Some("bash"));
    assert_eq!(build.steps[3].shell.as_deref(), Some("sh"));
}

#[test]
fn unused_keys_leave_the_hash_alone_and_used_ones_change_it() {
    let base = parse(SPEC_EXAMPLE).unwrap().canonical_hash();
    assert_eq!(base, "68f2f5d2edf567830848ff490b87bd648893150dafb62893952f9194e83d7134");
    let step = "      - ./ci/build.sh\n";
    let changed = [
        format!("env: {{A: b}}\n{SPEC_EXAMPLE}"),
        format!("defaults: {{shell: bash}}\n{SPEC_EXAMPLE}"),
        format!("inputs: {{who: {{default: x}}}}\n{SPEC_EXAMPLE}"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        env: {A: b}\n"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        if: always()\n"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        timeout: 1m\n"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        continue-on-error: true\n"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        working-directory: ci\n"),
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        shell: bash\n"),
    ];
    for src in &changed {
        assert_ne!(parse(src).unwrap_or_else(|d| panic!("{d}\n{src}")).canonical_hash(), base, "{src}");
    }
    // Written out but at their defaults: the same definition.
    let same =
        SPEC_EXAMPLE.replace(step, "      - run: ./ci/build.sh\n        continue-on-error: false\n        env: {}\n");
    assert_eq!(parse(&same).unwrap().canonical_hash(), base);
}

#[test]
fn declared_inputs_are_checked_and_defaulted() {
    let w = parse(include_str!("fixtures/valid/inputs.yaml")).unwrap();
    let ok = w.check_inputs(&inputs(&[("shards", "3"), ("deploy", "true")])).unwrap();
    assert_eq!(ok, inputs(&[("deploy", "true"), ("shards", "3"), ("target", "staging"), ("who", "world")]));
    let refused = [
        (inputs(&[("shards", "3"), ("nope", "x")]), "unknown input `nope`"),
        (inputs(&[]), "input `shards` is required"),
        (inputs(&[("shards", "three")]), "input `shards` (number) must be a number"),
        (inputs(&[("shards", "1"), ("deploy", "yes")]), "input `deploy` (boolean) must be `true` or `false`"),
        (
            inputs(&[("shards", "1"), ("target", "prod")]),
            "input `target` (choice) must be one of `staging`, `production`",
        ),
        (inputs(&[("shards", "inf")]), "must be a number"),
    ];
    for (given, want) in refused {
        let e = w.check_inputs(&given).unwrap_err();
        assert!(e.contains(want), "{given:?}: {e}");
    }
    // Without a declaration anything goes, as before.
    let free = parse(SPEC_EXAMPLE).unwrap();
    assert_eq!(free.check_inputs(&inputs(&[("x", "y")])).unwrap(), inputs(&[("x", "y")]));
}

#[test]
fn typed_inputs_in_expressions() {
    let w = parse(include_str!("fixtures/valid/inputs.yaml")).unwrap();
    assert_eq!(w.input_kinds()["deploy"], InputKind::Boolean);
    let off = w.expr_context("manual", Some("refs/heads/main"), &inputs(&[("deploy", "false"), ("shards", "0")]));
    assert_eq!(off.branch.as_deref(), Some("main"));
    // A `false` boolean input is false (the string "false" would be truthy).
    assert_eq!(step_gate(Some("inputs.deploy"), &off).unwrap(), (false, false));
    assert_eq!(step_gate(Some("inputs.shards == 0"), &off).unwrap(), (true, false));
    let on = w.expr_context("manual", None, &inputs(&[("deploy", "true")]));
    assert_eq!(step_gate(Some("inputs.deploy"), &on).unwrap(), (true, false));
}

#[test]
fn step_gates() {
    let c = ConditionContext { event: "push".into(), ..Default::default() };
    let cases = [
        (None, (true, false)),
        (Some("success()"), (true, false)),
        (Some("failure()"), (false, true)),
        (Some("always()"), (true, true)),
        (Some("${{ !cancelled() }}"), (true, true)),
        (Some("event == 'push'"), (true, false)),
        (Some("event == 'pr'"), (false, false)),
        (Some("failure() && event == 'push'"), (false, true)),
    ];
    for (expr, want) in cases {
        assert_eq!(step_gate(expr, &c).unwrap(), want, "{expr:?}");
    }
}

#[test]
fn shells_are_argv_prefixes() {
    assert!(shell_argv(None).is_empty());
    assert_eq!(shell_argv(Some("python3")), ["python3", "-c"]);
    let t = shell_argv(Some("perl -w {0}"));
    assert_eq!((t[0].as_str(), t[1].as_str()), ("sh", "-c"));
    assert_eq!(t[3..], ["kiln-step", "perl", "-w", "{0}"]);
}

fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\"; rm -rf ~; echo \"".to_string()),
        Just("'; touch /tmp/pwned; '".to_string()),
        Just("$(touch /tmp/pwned)".to_string()),
        Just("`id`".to_string()),
        Just("\nEOF\ntouch /tmp/pwned\n".to_string()),
        "\\PC{0,40}",
    ]
}

fn script_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("echo ".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("\\".to_string()),
        Just("#".to_string()),
        Just("\n".to_string()),
        Just("<<EOF\n".to_string()),
        Just("<<'Q'\n".to_string()),
        Just("EOF\n".to_string()),
        Just("${{ inputs.v }}".to_string()),
        Just("${{ inputs.v || 'x' }}".to_string()),
        Just("${{ event".to_string()),
        Just("$HOME ".to_string()),
        "[a-z ]{0,5}",
        // Issue 39 item 11: nested interpreters, arithmetic, names.
        Just("sh -c ".to_string()),
        Just("python3 -c ".to_string()),
        Just("eval ".to_string()),
        Just("$((".to_string()),
        Just("((".to_string()),
        Just("))".to_string()),
        Just("1<<2".to_string()),
        Just("[[ ".to_string()),
        Just(" -eq 1 ]]".to_string()),
        Just("a[".to_string()),
        Just("]".to_string()),
        Just("${".to_string()),
        Just("}".to_string()),
        Just("$(".to_string()),
        Just(")".to_string()),
        Just("`".to_string()),
        Just("<<<".to_string()),
        Just("cat ".to_string()),
        Just("sh ".to_string()),
        Just("| ".to_string()),
        Just("; ".to_string()),
        Just("read ".to_string()),
        Just("let ".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Rendering never panics, and the value never appears in the script:
    /// only references to variables that hold it.
    #[test]
    fn values_never_reach_the_script(pieces in prop::collection::vec(script_piece(), 0..16), value in hostile()) {
        let run: String = pieces.concat();
        let ctx = ConditionContext { event: "push".into(), inputs: inputs(&[("v", &value)]), ..Default::default() };
        if let Ok((script, vars)) = render_run(&run, &ctx) {
            prop_assert!(!script.contains("${{"), "{script}");
            for (k, v) in &vars {
                prop_assert!(k.starts_with("KILN_EXPR_"));
                prop_assert!(v == &value || v == "x" || v.is_empty() || v == "push", "{v}");
            }
            if value.len() > 6 && !run.contains(&value) {
                prop_assert!(!script.contains(&value), "{script}");
            }
        }
    }
}

/// Shell text before a `${{ }}`: the contexts of issue 39 item 11 and
/// plain ones (no loops, no reads from the terminal).
fn before_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("echo ".to_string()),
        Just("echo \"".to_string()),
        Just("echo '".to_string()),
        Just("sh -c \"echo ".to_string()),
        Just("sh -c 'echo ".to_string()),
        Just("bash -c ".to_string()),
        Just("python3 -c \"print('".to_string()),
        Just("eval \"echo ".to_string()),
        Just("echo $(( ".to_string()),
        Just("(( x = ".to_string()),
        Just("[[ ".to_string()),
        Just("[ ".to_string()),
        Just("a[".to_string()),
        Just("echo ${x:-".to_string()),
        Just("echo \"$(echo ".to_string()),
        Just("sh -c \"$(echo ".to_string()),
        Just("sh <<EOF\necho ".to_string()),
        Just("cat <<EOF\n".to_string()),
        Just("cat <<EOF | sh\necho ".to_string()),
        Just("bash <<< \"echo ".to_string()),
        Just("cat <<< ".to_string()),
        Just("read ".to_string()),
        Just("let x=".to_string()),
        Just("x=".to_string()),
        Just("echo $((1<<2)); echo ".to_string()),
        Just("if [[ ".to_string()),
        Just("bash <(echo ".to_string()),
        Just("echo x | tee >(sh) | echo ".to_string()),
        Just("\n".to_string()),
        Just("; ".to_string()),
        Just(" ".to_string()),
    ]
}

/// Shell text after a `${{ }}`.
fn after_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("')\"".to_string()),
        Just(" ))".to_string()),
        Just(" -eq 1 ]]".to_string()),
        Just(" == a ]]".to_string()),
        Just(" = a ]".to_string()),
        Just("]=1".to_string()),
        Just("}".to_string()),
        Just(")\"".to_string()),
        Just("\nEOF\n".to_string()),
        Just("\n".to_string()),
        Just(" ".to_string()),
        Just(" | sh".to_string()),
        Just("\" | bash".to_string()),
        Just(" | tr a a | sh -s".to_string()),
        Just(")".to_string()),
        Just(" > >(sh)".to_string()),
        Just(" -gt 1 ]]; then :; fi".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Issue 39 item 11: whatever script the pieces make, if it renders, the
    /// real `sh` and `bash` running it with a hostile value never run the
    /// value (the marker file is never created).
    #[test]
    fn rendered_scripts_never_run_the_value(
        before in prop::collection::vec(before_value(), 1..3),
        after in prop::collection::vec(after_value(), 0..3),
        which in 0usize..6,
    ) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-expr-prop-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("pwned");
        let m = mark.display();
        let value = [
            format!("x; touch {m}"),
            format!("'; touch {m}; '"),
            format!("\"; touch {m}; \""),
            format!("$(touch {m})`touch {m}`"),
            format!("a[$(touch {m})]"),
            format!("x\nEOF\ntouch {m}\n"),
        ][which].clone();
        let run = format!("{}${{{{ inputs.v }}}}{}", before.concat(), after.concat());
        let ctx = ConditionContext { event: "push".into(), inputs: inputs(&[("v", &value)]), ..Default::default() };
        if let Ok((script, vars)) = render_run(&run, &ctx) {
            for shell in ["sh", "bash"] {
                let mut child = std::process::Command::new("timeout")
                    .args(["5", shell, "-c", &script])
                    .envs(&vars)
                    .current_dir(&dir)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                child.wait().unwrap();
                let ran = mark.exists();
                if ran {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                prop_assert!(!ran, "{shell} ran the value {value:?}\nrun: {run:?}\nscript: {script:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Issue 16: `expire-in` on a published artifact is optional; a workflow
/// without it hashes (and serialises) exactly as before the key existed.
#[test]
fn artifact_expire_in_is_left_out_of_the_canonical_encoding_when_unset() {
    let plain = "version: 1\njobs:\n  - name: a\n    steps: [make]\n    artifacts:\n      publish:\n        - {name: app, path: out/app}\n";
    let w = parse(plain).unwrap();
    let json = serde_json::to_string(&w).unwrap();
    assert!(!json.contains("expire"), "{json}");
    let with = plain.replace("path: out/app}", "path: out/app, expire-in: 7d}");
    let w2 = parse(&with).unwrap();
    assert_eq!(w2.jobs[0].artifacts.publish[0].expire_in_secs, Some(7 * 86400));
    assert_ne!(w2.canonical_hash(), w.canonical_hash());
    // Directories and globs are paths as before: only the agent tells them apart.
    let glob = plain.replace("out/app", "\"dist/**/*.whl\"");
    assert!(kiln_workflow::is_glob(&parse(&glob).unwrap().jobs[0].artifacts.publish[0].path));
    assert!(!kiln_workflow::is_glob("out/site/"));
}

#[test]
fn the_run_level_timeout_is_a_plain_duration() {
    let jobs = "jobs:\n  - name: a\n    steps: [echo]\n";
    let w = parse(&format!("version: 1\ntimeout: 2h30m\n{jobs}")).unwrap();
    assert_eq!(w.timeout_secs, Some(9000));
    assert_eq!(parse(&format!("version: 1\n{jobs}")).unwrap().timeout_secs, None);
    // Absent, it does not change the definition (nor its hash).
    assert!(!serde_json::to_string(&parse(&format!("version: 1\n{jobs}")).unwrap()).unwrap().contains("timeout"));
    for (bad, why) in [
        ("timeout: 0", "greater than zero"),
        ("timeout: soon", "must be a duration"),
        ("timeout: 8d", "7d"),
        ("timeout: ${{ inputs.t }}", "plain duration"),
    ] {
        let e = parse(&format!("version: 1\n{bad}\n{jobs}")).unwrap_err().to_string();
        assert!(e.contains("the run's `timeout`") && e.contains(why), "{bad}: {e}");
    }
}
