//! `include:` and `extends:` over `tests/fixtures/compose/<case>/`: each case
//! is a repository root with `.kiln/ci.yaml`. `valid-*` cases must parse and
//! match `expected.json`; `invalid-*` cases must fail with the diagnostics in
//! `expected` (an included file's problems carry its path). Bless with
//! `KILN_BLESS=1`.

use kiln_workflow::{parse, parse_with};
use std::path::{Path, PathBuf};

fn cases() -> Vec<PathBuf> {
    // The checkout the test runs in (cargo sets it at run time): a shared
    // target dir may hold a binary built from another checkout.
    let dir = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("tests/fixtures/compose");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn parse_case(root: &Path) -> Result<kiln_workflow::Workflow, kiln_workflow::Diagnostics> {
    let src = std::fs::read_to_string(root.join(".kiln/ci.yaml")).unwrap();
    parse_with(&src, &mut |path: &str| {
        std::fs::read_to_string(root.join(path)).map_err(|_| format!("there is no file `{path}` at this commit"))
    })
}

fn check(path: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(path, actual).unwrap();
        return None;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    (expected.trim_end() != actual.trim_end())
        .then(|| format!("{} differs\n--- expected\n{expected}\n--- actual\n{actual}", path.display()))
}

#[test]
fn compose_fixtures_match() {
    let cases = cases();
    assert!(cases.len() >= 9, "expected the compose fixtures");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        match (name.starts_with("valid"), parse_case(case)) {
            (true, Ok(w)) => {
                let json = serde_json::to_string_pretty(&w).unwrap() + "\n";
                failures.extend(check(&case.join("expected.json"), &json));
            }
            (false, Err(d)) => failures.extend(check(&case.join("expected"), &format!("{d}\n"))),
            (true, Err(d)) => failures.push(format!("{name} failed:\n{d}")),
            (false, Ok(_)) => failures.push(format!("{name} parsed but should not")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Included content is part of the frozen definition: changing an included
/// file changes the hash, so a run's hash names what it ran.
#[test]
fn included_files_are_part_of_the_hash() {
    let root = cases().into_iter().find(|c| c.ends_with("valid-include-and-extends")).unwrap();
    let src = std::fs::read_to_string(root.join(".kiln/ci.yaml")).unwrap();
    let template = std::fs::read_to_string(root.join(".kiln/templates/rust.yaml")).unwrap();
    let hash = |t: String| parse_with(&src, &mut |_: &str| Ok(t.clone())).expect("parses").canonical_hash();
    assert_ne!(hash(template.clone()), hash(template.replace("rust:1.83", "rust:1.84")));
    assert_eq!(hash(template.clone()), hash(template));
}

/// Job fields merge with the template's: maps key by key, the rest replaced.
#[test]
fn extends_merges_maps_and_replaces_the_rest() {
    let root = cases().into_iter().find(|c| c.ends_with("valid-include-and-extends")).unwrap();
    let w = parse_case(&root).unwrap();
    let names: Vec<&str> = w.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["lint", "build", "test"], "included jobs come first");
    let build = w.job("build").unwrap();
    assert_eq!(build.env.get("PROFILE").map(String::as_str), Some("release"), "the job's env wins");
    assert_eq!(build.env.get("CARGO_TERM_COLOR").map(String::as_str), Some("never"), "the template's env is kept");
    assert_eq!(build.steps.len(), 1);
    assert!(build.steps[0].run.contains("cargo build"), "steps are replaced, not appended");
    let test = w.job("test").unwrap();
    assert_eq!(test.timeout_secs, Some(3600), "the later template in the list wins");
}

/// Without a repository, `include` is a clear problem rather than ignored.
#[test]
fn parse_without_a_repository_refuses_include() {
    let d = parse("version: 1\ninclude: .kiln/t/x.yaml\njobs:\n  - name: a\n    steps: [echo]\n").unwrap_err();
    assert!(d.to_string().contains("2:10: cannot include `.kiln/t/x.yaml`"), "{d}");
}
