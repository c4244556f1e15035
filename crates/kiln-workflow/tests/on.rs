//! `on:` (when a workflow runs): parsing, diagnostics and the frozen model.

use kiln_workflow::{Schedule, Triggers, parse};

const JOBS: &str = "jobs:\n  - name: build\n    steps: [make]\n";

fn with_on(on: &str) -> String {
    format!("version: 1\n{on}{JOBS}")
}

fn triggers(on: &str) -> Triggers {
    match parse(&with_on(on)) {
        Ok(w) => w.on,
        Err(d) => panic!("{on}\n{d}"),
    }
}

fn errors(on: &str) -> Vec<String> {
    match parse(&with_on(on)) {
        Ok(w) => panic!("parsed but should not:\n{on}\n{w:?}"),
        Err(d) => d.0.iter().map(ToString::to_string).collect(),
    }
}

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn no_on_keeps_todays_behaviour_and_hash() {
    let src = format!("version: 1\n{JOBS}");
    let w = parse(&src).unwrap();
    assert!(w.on.is_unset());
    assert!(w.on.allows_manual());
    let json = serde_json::to_value(&w).unwrap();
    assert!(json.get("on").is_none(), "{json}");
    // The hash is that of the JSON without the field, as before `on:` existed.
    let mut value = json.clone();
    value.as_object_mut().unwrap().remove("on");
    use sha2::Digest;
    let before = hex::encode(sha2::Sha256::digest(serde_json::to_vec(&value).unwrap()));
    assert_eq!(w.canonical_hash(), before);
    // The spec example fixture (no `on:`) still round-trips to an unset trigger.
    let spec = parse(include_str!("fixtures/valid/spec-example.yaml")).unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    assert!(!json.contains("\"on\""));
    let back: kiln_workflow::Workflow = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn short_forms() {
    let t = triggers("on: push\n");
    assert!(t.declared && t.push == Some(Default::default()) && t.pull_request.is_none() && !t.manual);
    assert!(!t.allows_manual());
    assert!(t.matches_push("refs/heads/any", None));

    let t = triggers("on: [push, pull_request, manual]\n");
    assert!(t.push.is_some() && t.pull_request.is_some() && t.manual);
    assert!(t.matches_pull_request("main", None));

    let t = triggers("on:\n  push:\n  pull_request:\n  manual:\n");
    assert!(t.push.is_some() && t.pull_request.is_some() && t.manual);
    let t = triggers("on: {manual: {}}\n");
    assert!(t.manual && t.push.is_none());
    assert!(t.allows_manual());
    assert!(!t.matches_push("refs/heads/main", None));
}

#[test]
fn the_full_form() {
    let t = triggers(
        r#"on:
  push:
    branches: [main, "release/**"]
    tags: ["v*"]
    paths: ["src/**", "!src/docs/**"]
  pull_request:
    branches: [main]
    paths-ignore: ["docs/**"]
  schedule:
    - cron: "*/15 * * * *"
      timezone: "Europe/Berlin"
    - cron: "0 3 * * MON"
  manual: {}
"#,
    );
    let push = t.push.as_ref().unwrap();
    assert_eq!(push.branches, v(&["main", "release/**"]));
    assert_eq!(push.tags, v(&["v*"]));
    assert_eq!(push.paths, v(&["src/**", "!src/docs/**"]));
    let pr = t.pull_request.as_ref().unwrap();
    assert_eq!(pr.branches, v(&["main"]));
    assert_eq!(pr.paths_ignore, v(&["docs/**"]));
    assert_eq!(
        t.schedule,
        vec![
            Schedule { cron: "*/15 * * * *".into(), timezone: Some("Europe/Berlin".into()) },
            Schedule { cron: "0 3 * * MON".into(), timezone: None },
        ]
    );
    assert!(t.manual);
    assert!(t.matches_push("refs/heads/release/2.0", Some(&v(&["src/main.rs"]))));
    assert!(!t.matches_push("refs/heads/release/2.0", Some(&v(&["src/docs/x.md"]))));
    assert!(t.matches_push("refs/tags/v2.0", Some(&v(&["src/docs/x.md"]))));

    // Serialised with kebab-case filter names, and it round-trips.
    let w = parse(&with_on("on:\n  push:\n    branches-ignore: [wip]\n")).unwrap();
    let json = serde_json::to_value(&w).unwrap();
    assert_eq!(json["on"], serde_json::json!({"declared": true, "push": {"branches-ignore": ["wip"]}}));
    let back: kiln_workflow::Workflow = serde_json::from_value(json).unwrap();
    assert_eq!(back, w);
    // Declaring `on:` changes the hash.
    let plain = parse(&format!("version: 1\n{JOBS}")).unwrap();
    assert_ne!(plain.canonical_hash(), w.canonical_hash());
}

#[test]
fn every_problem_is_reported_with_its_position() {
    let lines = errors(
        r#"on:
  push:
    branches: [main]
    branches-ignore: [dev]
    tags: ["v*"]
    tags-ignore: [x]
    paths: [a]
    paths-ignore: [b]
    branch: [main]
  pull_request:
    branches: ["!main"]
    tags: [v1]
  schedule:
    - cron: "* * * * * *"
    - cron: "@reboot"
    - cron: "0 3 * * *"
      timezone: Mars/Olympus
      at: now
    - timezone: UTC
    - cron: "0 0 30 2 *"
  manual:
    inputs: {}
  workflow_dispatch:
"#,
    );
    let expected = vec![
        "5:5: `on.push` sets both `branches` and `branches-ignore`; use only one (to exclude some branches from `branches`, add `!pattern` entries to it)",
        "7:5: `on.push` sets both `tags` and `tags-ignore`; use only one (to exclude some tags from `tags`, add `!pattern` entries to it)",
        "9:5: `on.push` sets both `paths` and `paths-ignore`; use only one (to exclude some paths from `paths`, add `!pattern` entries to it)",
        "10:5: unknown key `branch` in `on.push`; did you mean `branches`? (expected one of `branches`, `branches-ignore`, `tags`, `tags-ignore`, `paths`, `paths-ignore`)",
        "12:16: invalid pattern `!main` in `branches` in `on.pull_request`: the first pattern of a list cannot be negative (`!`); start with the patterns to include, then exclude from them",
        "13:5: unknown key `tags` in `on.pull_request`; expected one of `branches`, `branches-ignore`, `paths`, `paths-ignore`",
        "15:13: invalid `cron` `* * * * * *` in schedule 1 of `on.schedule`: it has 6 fields; write exactly five: minute hour day-of-month month day-of-week (no seconds or year field)",
        "16:13: invalid `cron` `@reboot` in schedule 2 of `on.schedule`: `@reboot` is not supported; write five fields (minute hour day-of-month month day-of-week), e.g. `0 0 * * *` for daily",
        "18:17: unknown time zone `Mars/Olympus` in schedule 3 of `on.schedule`; use an IANA name like `Europe/Berlin`, `America/New_York` or `UTC`",
        "19:7: unknown key `at` in schedule 3 of `on.schedule`; expected one of `cron`, `timezone`",
        "20:7: schedule 4 of `on.schedule` has no `cron`; add `cron: \"<minute> <hour> <day> <month> <weekday>\"`",
        "21:13: `cron` `0 0 30 2 *` in schedule 5 of `on.schedule` never runs: no date matches it (e.g. February 30th)",
        "23:5: unknown key `inputs` in `on.manual`; it takes no settings (write `manual: {}`)",
        "24:3: unknown event `workflow_dispatch` in `on`; expected one of `push`, `pull_request`, `schedule`, `manual`; a run started by hand (CLI, API, web UI) is `manual`",
    ];
    assert_eq!(lines, expected, "\n{}", lines.join("\n"));
}

#[test]
fn short_form_problems() {
    assert_eq!(
        errors("on:\n"),
        vec![
            "2:3: `on` is empty; list the events that start this workflow (`push`, `pull_request`, `schedule`, `manual`), or remove `on` to run it only by hand"
        ]
    );
    assert!(errors("on: []\n")[0].starts_with("2:5: `on` is empty"));
    assert!(errors("on: {}\n")[0].starts_with("2:5: `on` is empty"));
    assert_eq!(errors("on: [push, push]\n"), vec!["2:12: `on` lists `push` twice; remove one"]);
    assert!(errors("on: schedule\n")[0].starts_with("2:5: `schedule` needs its times"));
    assert!(errors("on: pushh\n")[0].starts_with("2:5: unknown event `pushh` in `on`"));
    assert!(errors("on: 3\n")[0].starts_with("2:5: unknown event `3` in `on`"));
    assert!(errors("on: [push, [x]]\n")[0].starts_with("2:12: an entry of `on` must be an event name, found a list"));
    assert!(errors("on: {push: [main]}\n")[0].starts_with("2:12: `on.push` must be a map of filters"));
    assert!(errors("on: {manual: true}\n")[0].starts_with("2:14: `on.manual` must be empty"));
    assert!(errors("on: {schedule: \"0 * * * *\"}\n")[0].starts_with("2:16: `on.schedule` must be a list"));
    assert!(errors("on: {schedule: []}\n")[0].starts_with("2:16: `on.schedule` is empty"));
    assert!(errors("on: {schedule: [x]}\n")[0].starts_with("2:17: schedule 1 of `on.schedule` must be a map"));
    // `on` problems are reported even when `jobs` is missing.
    let d = parse("version: 1\non: pushh\n").unwrap_err();
    assert_eq!(d.0.len(), 2, "{d}");
}

#[test]
fn pattern_problems() {
    let e = |list: &str| errors(&format!("on:\n  push:\n    branches: {list}\n"));
    assert!(e("[]")[0].starts_with("4:15: `branches` in `on.push` is empty"));
    assert!(e("[\"\"]")[0].starts_with("4:16: an entry of `branches` in `on.push` is empty"));
    assert!(
        e("[main, \"!\"]")[0].starts_with("4:22: invalid pattern `!` in `branches` in `on.push`: `!` must be followed")
    );
    assert!(
        e("[\"[abc\"]")[0].starts_with(
            "4:16: invalid pattern `[abc` in `branches` in `on.push`: `[` at position 1 has no closing `]`"
        )
    );
    assert!(e("[\"?a\"]")[0].contains("must follow a character"));
    assert!(e("{a: b}")[0].starts_with("4:15: `branches` in `on.push` must be a list of patterns"));
    let long = "x".repeat(kiln_workflow::MAX_PATTERN_CHARS + 1);
    assert!(e(&format!("[{long}]"))[0].contains("at most 512 are allowed"));
    let many: Vec<String> = (0..=kiln_workflow::MAX_PATTERNS).map(|i| format!("b{i}")).collect();
    assert!(e(&format!("[{}]", many.join(", ")))[0].contains("lists 101 patterns; at most 100 are allowed"));
    // A single string is a list of one; numbers keep their text.
    let t = triggers("on:\n  push:\n    branches: main\n    paths: [1.10]\n");
    assert_eq!(t.push.unwrap().branches, v(&["main"]));
    let schedules: Vec<String> =
        (0..=kiln_workflow::MAX_SCHEDULES).map(|i| format!("    - cron: \"{i} * * * *\"\n")).collect();
    let lines = errors(&format!("on:\n  schedule:\n{}", schedules.concat()));
    assert!(lines[0].contains("lists 21 schedules; at most 20 are allowed"), "{lines:?}");
    let lines = errors("on:\n  schedule:\n    - cron: \"0 * * * *\"\n    - {cron: \"0 * * * *\"}\n");
    assert!(lines[0].starts_with("5:7: `on.schedule` lists `0 * * * *` twice"), "{lines:?}");
}

/// Schedules that never fire are refused, and quickly, even twenty of them.
#[test]
fn never_firing_schedules_are_refused_quickly() {
    let days = ["30 2 *", "31 4,6,9,11 *", "31 2 *", "30,31 2 *"];
    let mut src = String::from("on:\n  schedule:\n");
    for i in 0..kiln_workflow::MAX_SCHEDULES {
        src.push_str(&format!("    - cron: \"{} 0 {}\"\n", i % 60, days[i % days.len()]));
    }
    let start = std::time::Instant::now();
    let lines = errors(&src);
    let took = start.elapsed();
    assert_eq!(lines.len(), kiln_workflow::MAX_SCHEDULES, "{lines:#?}");
    assert!(lines.iter().all(|l| l.contains("never runs")), "{lines:#?}");
    let budget = std::time::Duration::from_secs(if cfg!(debug_assertions) { 10 } else { 2 });
    assert!(took < budget, "{took:?}");
}
