//! The `if:` truth table, concurrency-group rendering, matrix expansion
//! details and a proptest fuzz of the expression language.

use kiln_workflow::{CommitContext, ConditionContext, JobResult, MAX_EXPR_CHARS, eval_condition, parse, render_group};
use proptest::prelude::*;
use std::collections::BTreeMap;

use JobResult::{Cancelled, Failure, Skipped, Success};

fn ctx(name: &str) -> ConditionContext {
    let base = ConditionContext {
        event: "push".into(),
        git_ref: Some("refs/heads/main".into()),
        branch: Some("main".into()),
        inputs: BTreeMap::from([("env".into(), "prod".into()), ("count".into(), "3".into())]),
        needs_results: vec![Success, Success],
        run_cancelled: false,
        quorum: None,
        input_kinds: BTreeMap::new(),
        needs_outputs: BTreeMap::from([(
            "build.v2".into(),
            BTreeMap::from([("version".into(), "1.2.3".into()), ("empty".into(), String::new())]),
        )]),
        commit: CommitContext {
            sha: "0123456789abcdef0123456789abcdef01234567".into(),
            title: "Fix the build".into(),
            author: "Ada Lovelace <ada@example.com>".into(),
        },
    };
    match name {
        "ok" => base,
        "failed" => ConditionContext { needs_results: vec![Success, Failure], ..base },
        "skipped" => ConditionContext { needs_results: vec![Success, Skipped], ..base },
        "cancelled" => ConditionContext { needs_results: vec![Success, Cancelled], run_cancelled: true, ..base },
        "quorum" => ConditionContext { needs_results: vec![Success, Success, Failure], quorum: Some(2), ..base },
        "pr" => ConditionContext {
            event: "pull_request".into(),
            git_ref: Some("refs/pull/7/merge".into()),
            branch: None,
            inputs: BTreeMap::new(),
            needs_outputs: BTreeMap::new(),
            commit: CommitContext::default(),
            ..base
        },
        "root" => ConditionContext { needs_results: vec![], ..base },
        other => panic!("unknown context {other}"),
    }
}

const CONTEXTS: [&str; 7] = ["ok", "failed", "skipped", "cancelled", "quorum", "pr", "root"];

#[test]
fn truth_table() {
    // expression, expected result in each context of CONTEXTS (in order).
    #[rustfmt::skip]
    let table: &[(&str, [bool; 7])] = &[
        //                                              ok     failed skipped cancel quorum pr     root
        ("true",                                        [true,  false, false, false, true,  true,  true ]),
        ("false",                                       [false, false, false, false, false, false, false]),
        ("success()",                                   [true,  false, false, false, true,  true,  true ]),
        ("failure()",                                   [false, true,  false, false, true,  false, false]),
        ("always()",                                    [true,  true,  true,  true,  true,  true,  true ]),
        ("cancelled()",                                 [false, false, false, true,  false, false, false]),
        ("!cancelled()",                                [true,  true,  true,  false, true,  true,  true ]),
        ("failure() || success()",                      [true,  true,  false, false, true,  true,  true ]),
        ("always() && event == 'push'",                 [true,  true,  true,  true,  true,  false, true ]),
        ("event == 'push'",                             [true,  false, false, false, true,  false, true ]),
        ("${{ event != 'push' }}",                      [false, false, false, false, false, true,  false]),
        ("branch == 'main'",                            [true,  false, false, false, true,  false, true ]),
        ("branch == null",                              [false, false, false, false, false, true,  false]),
        ("!branch",                                     [false, false, false, false, false, true,  false]),
        ("ref == \"refs/heads/main\"",                  [true,  false, false, false, true,  false, true ]),
        ("startsWith(ref, 'refs/pull/')",               [false, false, false, false, false, true,  false]),
        ("endsWith(ref, '/main')",                      [true,  false, false, false, true,  false, true ]),
        ("contains(ref, 'heads')",                      [true,  false, false, false, true,  false, true ]),
        ("inputs.env == 'prod'",                        [true,  false, false, false, true,  false, true ]),
        ("inputs.count == 3",                           [true,  false, false, false, true,  false, true ]),
        ("inputs.count != '3'",                         [false, false, false, false, false, true,  false]),
        ("inputs.missing",                              [false, false, false, false, false, false, false]),
        ("inputs.missing == ''",                        [true,  false, false, false, true,  true,  true ]), // null and '' both coerce to 0
        ("inputs.missing == null",                      [true,  false, false, false, true,  true,  true ]),
        ("always() && (branch == 'main' || event == 'pull_request')",
                                                        [true,  true,  true,  true,  true,  true,  true ]),
        ("always() && !(branch == 'main')",             [false, false, false, false, false, true,  false]),
        ("failure() && branch == 'main'",               [false, true,  false, false, true,  false, false]),
        ("0",                                           [false, false, false, false, false, false, false]),
        ("'x'",                                         [true,  false, false, false, true,  true,  true ]),
        ("'it''s' == \"it's\"",                         [true,  false, false, false, true,  true,  true ]),
        ("1 == true",                                   [true,  false, false, false, true,  true,  true ]),
        ("'' == false",                                 [true,  false, false, false, true,  true,  true ]),
        ("needs.build.v2.outputs.version == '1.2.3'",   [true,  false, false, false, true,  false, true ]),
        ("startsWith(needs.build.v2.outputs.version, '1.')",
                                                        [true,  false, false, false, true,  false, true ]),
        ("needs.build.v2.outputs.empty",                [false, false, false, false, false, false, false]),
        ("needs.build.v2.outputs.missing == null",      [true,  false, false, false, true,  true,  true ]),
        ("always() && !needs.ghost.outputs.version",    [true,  true,  true,  true,  true,  true,  true ]),
        // `commit.*` (the pr context was accepted without commit data: null).
        ("commit.short_sha == '0123456'",               [true,  false, false, false, true,  false, true ]),
        ("commit.sha == '0123456789abcdef0123456789abcdef01234567'",
                                                        [true,  false, false, false, true,  false, true ]),
        ("startsWith(commit.title, 'Fix')",             [true,  false, false, false, true,  false, true ]),
        ("contains(commit.author, '<ada@example.com>')",[true,  false, false, false, true,  false, true ]),
        ("commit.title == null",                        [false, false, false, false, false, true,  false]),
    ];
    let mut failures = Vec::new();
    for (expr, expected) in table {
        for (name, want) in CONTEXTS.iter().zip(expected) {
            match eval_condition(expr, &ctx(name)) {
                Ok(got) if got == *want => {}
                other => failures.push(format!("{expr:?} in {name}: expected {want}, got {other:?}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn syntax_errors_are_reported() {
    for bad in ["", "event ==", "(true", "true)", "foo", "github.ref", "contains(a)", "x()", "'open", "a = b", "!"] {
        assert!(eval_condition(bad, &ctx("ok")).is_err(), "{bad:?} should not parse");
    }
    let long = format!("'{}'", "a".repeat(MAX_EXPR_CHARS));
    assert!(eval_condition(&long, &ctx("ok")).unwrap_err().contains("at most"));
}

#[test]
fn group_rendering() {
    let c = ctx("ok");
    assert_eq!(render_group("deploy-${{ branch }}", &c).unwrap(), "deploy-main");
    assert_eq!(render_group("${{ inputs.env }}-${{ event }}", &c).unwrap(), "prod-push");
    assert_eq!(render_group("${{ inputs.none || 'dflt' }}", &c).unwrap(), "dflt");
    assert!(render_group("${{ always() }}", &c).is_err());
    // The job-level template of a matrix job has its matrix values filled in.
    let w = parse(
        "version: 1\njobs:\n  - name: t\n    matrix: {os: [linux]}\n    concurrency: {group: 'g-${{ matrix.os }}-${{ branch }}', cancel-in-progress: true}\n    steps: [x]\n",
    )
    .unwrap();
    let conc = w.jobs[0].concurrency.as_ref().unwrap();
    assert!(conc.cancel_in_progress);
    assert_eq!(render_group(&conc.group, &c).unwrap(), "g-linux-main");
}

#[test]
fn matrix_expansion_details() {
    let w = parse(
        "version: 1\njobs:\n  - name: build\n    steps: [make]\n  - name: test\n    needs: build\n    matrix:\n      shard: [1, 2]\n      os: [linux]\n    steps: ['test ${{ matrix.shard }}']\n  - name: pkg\n    needs: test\n    steps: [pkg]\n",
    )
    .unwrap();
    let names: Vec<&str> = w.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["build", "test (shard=1, os=linux)", "test (shard=2, os=linux)", "pkg"]);
    assert_eq!(w.jobs[3].needs, ["test (shard=1, os=linux)", "test (shard=2, os=linux)"]);
    assert_eq!(w.jobs[2].env["KILN_MATRIX_SHARD"], "2");
    assert_eq!(w.jobs[2].steps[0].run, "test 2");
    let m = w.jobs[1].matrix.as_ref().unwrap();
    assert_eq!((m.group.as_str(), m.fail_fast, m.max_parallel), ("test", true, None));
    // Topological order: every job comes after its needs.
    for (i, j) in w.jobs.iter().enumerate() {
        for n in &j.needs {
            assert!(w.jobs[..i].iter().any(|p| &p.name == n), "{} before {n}", j.name);
        }
    }
    // Exactly MAX_JOBS expansions are accepted.
    let w = parse("version: 1\njobs:\n  - name: t\n    matrix: {a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], b: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}\n    steps: [x]\n").unwrap();
    assert_eq!(w.jobs.len(), kiln_workflow::MAX_JOBS);
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("event".to_string()),
        Just("ref".to_string()),
        Just("branch".to_string()),
        Just("inputs.env".to_string()),
        Just("inputs.".to_string()),
        Just("success()".to_string()),
        Just("failure()".to_string()),
        Just("always()".to_string()),
        Just("cancelled()".to_string()),
        Just("contains(".to_string()),
        Just("startsWith(".to_string()),
        Just("endsWith(".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just("&&".to_string()),
        Just("||".to_string()),
        Just("!".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(",".to_string()),
        Just("'main'".to_string()),
        Just("'".to_string()),
        Just("\"".to_string()),
        Just("12".to_string()),
        Just("-1.5".to_string()),
        Just("true".to_string()),
        Just("null".to_string()),
        Just("${{".to_string()),
        Just("}}".to_string()),
        "[ -~]{0,3}",
        "\\PC{0,2}",
    ]
}

fn any_ctx() -> impl Strategy<Value = ConditionContext> {
    let result = prop_oneof![Just(Success), Just(Failure), Just(Cancelled), Just(Skipped)];
    (prop::collection::vec(result, 0..4), any::<bool>(), prop::option::of(0u32..5), prop::option::of("[a-z/]{0,8}"))
        .prop_map(|(needs_results, run_cancelled, quorum, branch)| ConditionContext {
            event: "push".into(),
            git_ref: branch.as_ref().map(|b| format!("refs/heads/{b}")),
            branch,
            inputs: BTreeMap::from([("env".into(), "prod".into())]),
            needs_results,
            run_cancelled,
            quorum,
            input_kinds: BTreeMap::new(),
            needs_outputs: BTreeMap::new(),
            commit: CommitContext::default(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Token soup never panics: it evaluates or reports an error.
    #[test]
    fn expressions_never_panic(tokens in prop::collection::vec(token(), 0..40), c in any_ctx()) {
        let src = tokens.join(" ");
        let _ = eval_condition(&src, &c);
        let _ = render_group(&src, &c);
        let joined = tokens.concat();
        let _ = eval_condition(&joined, &c);
        let _ = render_group(&joined, &c);
    }

    /// Arbitrary strings (including very deep nesting) never panic.
    #[test]
    fn arbitrary_strings_never_panic(src in "\\PC{0,200}", deep in 0usize..600, c in any_ctx()) {
        let _ = eval_condition(&src, &c);
        let _ = render_group(&src, &c);
        let nested = format!("{}{}{}", "(!".repeat(deep), src, ")".repeat(deep));
        let _ = eval_condition(&nested, &c);
    }

    /// A condition accepted by `parse` evaluates in every context.
    #[test]
    fn accepted_conditions_evaluate(tokens in prop::collection::vec(token(), 1..12), c in any_ctx()) {
        let src = tokens.join(" ");
        let yaml = format!("version: 1\njobs:\n  - name: a\n    steps: [x]\n    if: {}\n", serde_json::to_string(&src).unwrap());
        if parse(&yaml).is_ok() {
            prop_assert!(eval_condition(&src, &c).is_ok(), "{src:?}");
        }
    }

    /// `always()` wins over anything combined with `||`; a status-free
    /// expression never runs after a failure.
    #[test]
    fn status_semantics(c in any_ctx(), lit in prop_oneof![Just("true"), Just("false"), Just("'x'"), Just("null")]) {
        let always = format!("always() || {lit}");
        prop_assert!(eval_condition(&always, &c).unwrap());
        if c.needs_results.contains(&Failure) && c.quorum.is_none() {
            prop_assert!(!eval_condition(lit, &c).unwrap());
        }
    }
}
