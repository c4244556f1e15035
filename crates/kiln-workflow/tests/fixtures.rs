//! Data-driven tests over `tests/fixtures/`.
//!
//! * `valid/*.yaml` must parse; the normalised model is compared with the
//!   sibling `*.json` snapshot.
//! * `invalid/*.yaml` must fail; the diagnostics (one `line:col: message` per
//!   line) are compared with the sibling `*.expected` file.
//!
//! Run with `KILN_BLESS=1` to (re)write the snapshots, then review the diff.

use kiln_workflow::{Diagnostics, MAX_DEPTH, MAX_FILE_BYTES, MAX_JOBS, MAX_STEPS, parse};
use std::path::{Path, PathBuf};

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")).join("tests/fixtures").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn bless() -> bool {
    std::env::var_os("KILN_BLESS").is_some()
}

/// Compare `actual` with the snapshot at `path` (or write it when blessing).
/// Returns a failure description.
fn check_snapshot(path: &Path, actual: &str) -> Option<String> {
    if bless() {
        std::fs::write(path, actual).unwrap();
        return None;
    }
    let expected = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) => return Some(format!("{}: {e}\nactual:\n{actual}", path.display())),
    };
    (expected.trim_end() != actual.trim_end()).then(|| {
        format!("{} differs\n--- expected\n{}\n--- actual\n{}", path.display(), expected.trim_end(), actual.trim_end())
    })
}

fn render(d: &Diagnostics) -> String {
    let mut s = d.to_string();
    s.push('\n');
    s
}

#[test]
fn valid_fixtures_match_their_snapshots() {
    let files = fixtures("valid");
    assert!(files.len() >= 4, "expected several valid fixtures");
    let mut failures = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap();
        match parse(&src) {
            Err(d) => failures.push(format!("{} failed to parse:\n{d}", file.display())),
            Ok(w) => {
                let mut json = serde_json::to_string_pretty(&w).unwrap();
                json.push('\n');
                failures.extend(check_snapshot(&file.with_extension("json"), &json));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn invalid_fixtures_match_their_diagnostics() {
    let files = fixtures("invalid");
    assert!(files.len() >= 35, "expected at least 35 invalid fixtures, found {}", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap();
        match parse(&src) {
            Ok(_) => failures.push(format!("{} parsed but should not", file.display())),
            Err(d) => {
                assert!(!d.0.is_empty());
                for diag in &d.0 {
                    if diag.line == 0 || diag.column == 0 {
                        failures.push(format!("{}: diagnostic without a position: {diag}", file.display()));
                    }
                }
                failures.extend(check_snapshot(&file.with_extension("expected"), &render(&d)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_fixture_has_a_snapshot() {
    if bless() {
        return;
    }
    for (dir, ext) in [("valid", "json"), ("invalid", "expected")] {
        for file in fixtures(dir) {
            assert!(file.with_extension(ext).exists(), "{} has no .{ext} snapshot", file.display());
        }
    }
}

fn lines(src: &str) -> Vec<String> {
    match parse(src) {
        Ok(_) => panic!("parsed but should not:\n{src}"),
        Err(d) => d.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn oversize_file_is_refused_without_position() {
    let mut src = String::from("version: 1\njobs:\n  - name: big\n    steps:\n      - |\n");
    while src.len() <= MAX_FILE_BYTES {
        src.push_str("        echo 0123456789012345678901234567890123456789012345678901234567890123456789\n");
    }
    let d = parse(&src).unwrap_err();
    assert_eq!(d.0.len(), 1);
    assert_eq!((d.0[0].line, d.0[0].column), (0, 0));
    assert_eq!(
        d.0[0].to_string(),
        format!(
            "0:0: the workflow file is {} bytes; at most 262144 bytes (256 KiB) are allowed — move long scripts into files in the repository",
            src.len()
        )
    );
}

#[test]
fn file_just_under_the_limit_is_accepted() {
    let mut src = String::from("version: 1\njobs:\n  - name: big\n    steps:\n      - |\n");
    let line = "        echo 0123456789\n";
    while src.len() + line.len() <= MAX_FILE_BYTES {
        src.push_str(line);
    }
    assert!(src.len() <= MAX_FILE_BYTES);
    parse(&src).unwrap();
}

#[test]
fn deep_block_nesting_is_refused() {
    // A block mapping nested far past the limit inside a job's env.
    let mut src = String::from("version: 1\njobs:\n  - name: deep\n    steps: [x]\n    env:\n");
    for depth in 0..200 {
        src.push_str(&" ".repeat(6 + 2 * depth));
        src.push_str("k:\n");
    }
    assert_eq!(
        lines(&src),
        vec![format!("35:{}: the YAML nests deeper than {MAX_DEPTH} levels; flatten the structure", 7 + 2 * 29)]
    );
}

#[test]
fn deep_flow_nesting_is_refused() {
    let src = format!("version: 1\njobs:\n  - name: deep\n    steps: {}x{}\n", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(
        lines(&src),
        vec![format!(
            "4:{}: the YAML nests deeper than {MAX_DEPTH} levels; flatten the structure",
            // The scanner's flow-nesting limit fires at the 33rd `[` (column 12 is the first).
            12 + MAX_DEPTH
        )]
    );
}

#[test]
fn too_many_jobs() {
    let mut src = String::from("version: 1\njobs:\n");
    for i in 0..=MAX_JOBS {
        src.push_str(&format!("  - name: job{i}\n    steps: [x]\n"));
    }
    assert_eq!(
        lines(&src),
        vec![format!("3:3: `jobs` lists {} jobs; at most {MAX_JOBS} are allowed in one workflow", MAX_JOBS + 1)]
    );
    // Exactly at the limit is fine.
    let mut src = String::from("version: 1\njobs:\n");
    for i in 0..MAX_JOBS {
        src.push_str(&format!("  - name: job{i}\n    steps: [x]\n"));
    }
    assert_eq!(parse(&src).unwrap().jobs.len(), MAX_JOBS);
}

#[test]
fn too_many_steps() {
    let mut src = String::from("version: 1\njobs:\n  - name: long\n    steps:\n");
    for i in 0..=MAX_STEPS {
        src.push_str(&format!("      - echo {i}\n"));
    }
    assert_eq!(
        lines(&src),
        vec![format!(
            "5:7: job `long` has {} steps; at most {MAX_STEPS} are allowed per job (split it into several jobs)",
            MAX_STEPS + 1
        )]
    );
}

#[test]
fn diagnostics_are_capped() {
    let mut src = String::from("version: 1\njobs:\n");
    for i in 0..200 {
        src.push_str(&format!("  - name: job{i}\n    steps: [x]\n    retry: 99\n"));
    }
    let d = parse(&src).unwrap_err();
    assert_eq!(d.0.len(), kiln_workflow::MAX_DIAGNOSTICS + 1);
    assert!(d.0.last().unwrap().message.contains("100 more problems"));
}

/// Worst-case inputs just under the size limit are handled quickly.
#[test]
fn pathological_inputs_are_fast() {
    let budget = std::time::Duration::from_secs(if cfg!(debug_assertions) { 10 } else { 2 });
    let fill = |prefix: &str, unit: &str| {
        let mut s = String::from(prefix);
        while s.len() + unit.len() <= MAX_FILE_BYTES {
            s.push_str(unit);
        }
        s
    };
    let cases = [
        fill("version: 1\njobs:\n", "  - {name: j, steps: [x]}\n"),
        fill("version: 1\njobs: [", "{name: a, steps: [x]},"),
        fill("version: 1\njobs:\n  - name: a\n    steps: [", "x,"),
        fill("version: 1\njobs:\n  - name: a\n    steps: [x]\n    env:\n", "      A: b\n"),
        fill("version: 1\njobs:\n  - name: a\n    steps:\n      - ", "x"),
        fill("", "["),
        fill("", "- "),
        fill("", "a: "),
        fill("", "? "),
        fill("", "\""),
        fill("", "&a "),
        fill("version: 1\njobs:\n", "  - name: x\n    steps: [x]\n    needs: [x, y]\n"),
    ];
    for src in &cases {
        let start = std::time::Instant::now();
        let _ = parse(src);
        let took = start.elapsed();
        assert!(took < budget, "{took:?} for input starting {:?}", &src[..40.min(src.len())]);
    }
}

#[test]
fn long_lists_are_fast() {
    let budget = std::time::Duration::from_secs(if cfg!(debug_assertions) { 10 } else { 2 });
    let mut needs =
        String::from("version: 1\njobs:\n  - {name: a, steps: [x]}\n  - name: b\n    steps: [x]\n    needs: [");
    let mut publish = String::from("version: 1\njobs:\n  - name: a\n    steps: [x]\n    artifacts:\n      publish:\n");
    let mut i = 0;
    while needs.len() < MAX_FILE_BYTES - 16 {
        needs.push_str(&format!("n{i},"));
        publish.push_str(&format!("        - {{name: n{i}, path: p}}\n"));
        i += 1;
    }
    needs.push_str("a]\n");
    publish.truncate(MAX_FILE_BYTES - 1);
    for src in [&needs, &publish] {
        let start = std::time::Instant::now();
        let _ = parse(src);
        assert!(start.elapsed() < budget, "{:?}", start.elapsed());
    }
}
