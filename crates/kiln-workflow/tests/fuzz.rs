//! Property tests: the parser never panics, and every failure carries at
//! least one diagnostic.

use kiln_workflow::{Diagnostics, MAX_DIAGNOSTICS, Workflow, parse};
use proptest::prelude::*;

const SPEC_EXAMPLE: &str = include_str!("fixtures/valid/spec-example.yaml");

fn check(src: &str) {
    let result: Result<Workflow, Diagnostics> = parse(src);
    match result {
        Ok(w) => {
            assert!(!w.jobs.is_empty());
            // A parsed workflow hashes deterministically.
            assert_eq!(w.canonical_hash(), w.canonical_hash());
        }
        Err(d) => {
            assert!(!d.0.is_empty(), "error without diagnostics for {src:?}");
            assert!(d.0.len() <= MAX_DIAGNOSTICS + 1);
            for diag in &d.0 {
                assert!(!diag.message.is_empty());
                assert!(diag.line >= 1 || src.len() > kiln_workflow::MAX_FILE_BYTES);
            }
        }
    }
}

/// A mutation of the spec example: replace, delete or insert bytes at some
/// character positions.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, String),
    Delete(usize, usize),
    Insert(usize, String),
    SwapLines(usize, usize),
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(":".to_string()),
        Just("- ".to_string()),
        Just("\n".to_string()),
        Just("  ".to_string()),
        Just("\t".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("!!str ".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("#".to_string()),
        Just("|\n".to_string()),
        Just("---\n".to_string()),
        Just("needs: [compile]\n".to_string()),
        Just("    needs: integration-test\n".to_string()),
        Just("    timeout: 30m\n".to_string()),
        Just("    retry: 99\n".to_string()),
        Just("..".to_string()),
        Just("on: push\n".to_string()),
        Just("on:\n  push:\n    branches: [main, \"!x\"]\n".to_string()),
        Just("  schedule:\n    - cron: \"*/15 * * * *\"\n      timezone: Europe/Berlin\n".to_string()),
        Just("paths-ignore: [\"**/*.md\"]".to_string()),
        Just("env: {A: \"${{ inputs.x }}\"}\n".to_string()),
        Just("defaults: {shell: bash, working-directory: src}\n".to_string()),
        Just("inputs:\n  x: {type: choice, options: [a], default: a}\n".to_string()),
        Just("      - run: echo ${{ inputs.x }}\n        if: failure()\n        continue-on-error: true\n".to_string()),
        Just("        shell: perl {0}\n        timeout: 1m\n        working-directory: a/b\n".to_string()),
        Just("[a-z]+?*".to_string()),
        Just("/".to_string()),
        "\\PC{0,8}",
        any::<String>(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), fragment()).prop_map(|(at, s)| Edit::Replace(at, s)),
        (any::<usize>(), 0usize..20).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), fragment()).prop_map(|(at, s)| Edit::Insert(at, s)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(src: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = src.chars().collect();
    for e in edits {
        let len = chars.len().max(1);
        match e {
            Edit::Replace(at, s) => {
                let at = at % len;
                if at < chars.len() {
                    chars.splice(at..=at, s.chars());
                }
            }
            Edit::Delete(at, n) => {
                let at = at % len;
                let end = (at + n).min(chars.len());
                if at < end {
                    chars.drain(at..end);
                }
            }
            Edit::Insert(at, s) => {
                let at = at % (chars.len() + 1);
                chars.splice(at..at, s.chars());
            }
            Edit::SwapLines(a, b) => {
                let text: String = chars.iter().collect();
                let mut lines: Vec<&str> = text.split('\n').collect();
                let n = lines.len();
                lines.swap(a % n, b % n);
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_strings_never_panic(src in any::<String>()) {
        check(&src);
    }

    #[test]
    fn yaml_ish_strings_never_panic(src in "[a-z:\\-\\[\\]{}&*!|>#'\" \n\t0-9.~/]{0,200}") {
        check(&src);
    }

    #[test]
    fn mutated_spec_example_never_panics(edits in prop::collection::vec(edit(), 1..6)) {
        let src = apply(SPEC_EXAMPLE, &edits);
        check(&src);
    }
}

const ON_EXAMPLE: &str = include_str!("fixtures/valid/on-triggers.yaml");

/// Pieces of `on:` syntax, valid and not, to build random `on:` values from.
fn on_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("push".to_string()),
        Just("pull_request".to_string()),
        Just("manual".to_string()),
        Just("schedule".to_string()),
        Just("branches".to_string()),
        Just("branches-ignore".to_string()),
        Just("tags".to_string()),
        Just("paths-ignore".to_string()),
        Just("cron".to_string()),
        Just("timezone".to_string()),
        Just("\"*/15 * * * *\"".to_string()),
        Just("\"0 25 * * *\"".to_string()),
        Just("\"0 0 30 2 *\"".to_string()),
        Just("Europe/Berlin".to_string()),
        Just("\"!**\"".to_string()),
        Just("\"[a-\"".to_string()),
        Just("\"v[12].[0-9]+\"".to_string()),
        Just(": ".to_string()),
        Just(", ".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\n  ".to_string()),
        Just("\n    - ".to_string()),
        "[ -~]{0,6}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_on_values_never_panic(pieces in prop::collection::vec(on_piece(), 0..24)) {
        let src = format!("version: 1\non: {}\njobs:\n  - name: a\n    steps: [x]\n", pieces.concat());
        check(&src);
        if let Ok(w) = parse(&src) {
            // Whatever was accepted can be evaluated without panicking.
            let changed = vec!["src/a.rs".to_string(), "docs/b.md".to_string()];
            let _ = w.on.matches_push("refs/heads/main", Some(&changed));
            let _ = w.on.matches_push("refs/tags/v1.2", None);
            let _ = w.on.matches_pull_request("main", Some(&[]));
            for s in &w.on.schedule {
                let _ = s.due_tick(0, 1_700_000_000_000);
                let _ = s.next_tick(1_700_000_000_000);
            }
        }
    }

    #[test]
    fn mutated_on_example_never_panics(edits in prop::collection::vec(edit(), 1..6)) {
        check(&apply(ON_EXAMPLE, &edits));
    }

    #[test]
    fn glob_match_never_panics(pattern in "[a-z*?+\\[\\]\\\\/!.-]{0,12}", text in "[a-z/.-]{0,12}") {
        let _ = kiln_workflow::glob_match(&pattern, &text);
    }
}

#[test]
fn on_example_is_valid_before_mutation() {
    parse(ON_EXAMPLE).unwrap();
}

#[test]
fn spec_example_is_valid_before_mutation() {
    parse(SPEC_EXAMPLE).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `due_tick` is the latest tick in (last, now]: a tick `next_tick` also
    /// finds, with no tick after it up to `now`.
    #[test]
    fn due_tick_is_the_latest_tick(
        cron in prop::sample::select(vec!["*/15 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "*/7 1-3 * * *", "0 0 29 2 *"]),
        tz in prop::sample::select(vec![None, Some("Europe/Berlin"), Some("America/New_York"), Some("Australia/Lord_Howe")]),
        last in 1_600_000_000_000i64..1_800_000_000_000,
        span in 0i64..(3 * 24 * 3600 * 1000),
    ) {
        let s = kiln_workflow::Schedule { cron: cron.to_string(), timezone: tz.map(str::to_string) };
        let now = last + span;
        match s.due_tick(last, now) {
            Some(t) => {
                prop_assert!(last < t && t <= now);
                prop_assert_eq!(s.next_tick(t - 1), Some(t));
                prop_assert!(s.next_tick(t).is_none_or(|n| n > now));
            }
            None => prop_assert!(s.next_tick(last).is_none_or(|n| n > now)),
        }
    }
}

/// Pieces of `include`/`templates`/`extends` YAML: random files made of them
/// (with includes of each other, cycles and self-extension included) never
/// panic, and every failure has a diagnostic.
fn compose_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("include: .kiln/t/a.yaml\n".to_string()),
        Just("include: [.kiln/t/b.yaml, .kiln/t/a.yaml]\n".to_string()),
        Just("include: 7\n".to_string()),
        Just("templates:\n  a:\n    extends: [b, a]\n    timeout: 5m\n  b:\n    env: {X: y}\n".to_string()),
        Just("templates:\n  b:\n    extends: a\n".to_string()),
        Just("templates: [x]\n".to_string()),
        Just("jobs:\n  - name: j\n    extends: a\n    steps: [echo]\n".to_string()),
        Just("jobs:\n  - name: k\n    extends: [b, zz]\n    env: {X: 1}\n    steps: [echo]\n".to_string()),
        Just("jobs: 3\n".to_string()),
        Just("version: 1\n".to_string()),
        "[a-z:\\-\\[\\] \n.]{0,30}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_includes_and_templates_never_panic(
        main in prop::collection::vec(compose_piece(), 0..5),
        a in prop::collection::vec(compose_piece(), 0..4),
        b in prop::collection::vec(compose_piece(), 0..4),
    ) {
        let (main, a, b) = (main.concat(), a.concat(), b.concat());
        let result = kiln_workflow::parse_with(&main, &mut |p: &str| match p {
            ".kiln/t/a.yaml" => Ok(a.clone()),
            ".kiln/t/b.yaml" => Ok(b.clone()),
            _ => Err("missing".into()),
        });
        if let Err(d) = result {
            prop_assert!(!d.0.is_empty());
            prop_assert!(d.0.iter().all(|x| !x.message.is_empty()));
        }
    }
}
