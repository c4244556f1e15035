//! Test reports (issue 43): after the steps (also when one failed) the
//! agent reads the files the job's `reports:` globs match, parses them with
//! kiln-reports' bounded, hostile-safe parsers and stages each with the
//! server under the attempt's epoch; the completion binds them.
//!
//! The files are the step's, so untrusted: a match must be a regular file
//! with one name, reached inside the workspace without a symbolic link
//! (opened `O_NOFOLLOW`; a directory on the way that leads outside is
//! refused), so a report can never make the agent read a file the step
//! could not. Reading happens after the sandbox was cleaned up (nothing of
//! the job runs). Messages, excerpts and names have the job's secrets
//! masked, as in its log.
//!
//! Quarantine: a step that failed with an exit code (not a timeout, not a
//! signal) whose reports — the matching files it wrote — are complete and
//! name failed tests that are all quarantined does not fail the job
//! ([`quarantined_only`]); the completion lists them and the server checks
//! them again against the bound reports and the quarantine.

use crate::control::Control;
use crate::logs::LogStreamer;
use crate::ran::Ran;
use kiln_api::client::Client;
use kiln_api::types::Assignment;
use kiln_api::{ReportAnnotation, ReportUpload, ReportsSpec, TestCaseResult, TestRetry};
use kiln_reports::{Limits, Report};
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

/// Most files the globs of one job may match.
pub(crate) const MAX_FILES: usize = 64;

/// The caps the agent parses with: the parser's own, with less text per
/// test so one report stays well within the upload's 16 MiB.
pub(crate) fn limits() -> Limits {
    Limits {
        max_tests: 100_000,
        max_message_bytes: 2 << 10,
        max_excerpt_bytes: 8 << 10,
        max_total_text_bytes: 6 << 20,
        ..Limits::default()
    }
}

/// One matched file: its workspace-relative path and format.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Found {
    pub rel: String,
    pub format: &'static str,
}

/// What was found: the files, and what the log should say about the rest.
#[derive(Debug, Default)]
pub(crate) struct Matches {
    pub files: Vec<Found>,
    /// Refused matches and patterns that matched nothing, for the log.
    pub notes: Vec<String>,
}

/// The files `spec` matches in `ws` (at most [`MAX_FILES`]), sorted;
/// `since`: only files modified since then (a step's own).
pub(crate) fn find(ws: &Path, spec: &ReportsSpec, since: Option<SystemTime>) -> Matches {
    let mut m = Matches::default();
    let mut seen = BTreeSet::new();
    for (format, patterns) in [("junit", &spec.junit), ("tap", &spec.tap)] {
        for p in patterns {
            let before = m.files.len();
            for rel in matches(ws, p, &mut m.notes) {
                if since.is_some_and(|s| modified(&ws.join(&rel)).is_none_or(|t| t < s)) {
                    continue;
                }
                if seen.insert(rel.clone()) {
                    m.files.push(Found { rel, format });
                }
            }
            if m.files.len() == before && since.is_none() {
                m.notes.push(format!("reports: `{p}` ({format}) matched no file"));
            }
        }
    }
    m.files.sort();
    if m.files.len() > MAX_FILES {
        m.notes.push(format!("reports: {} files matched; the first {MAX_FILES} are read", m.files.len()));
        m.files.truncate(MAX_FILES);
    }
    m
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::symlink_metadata(p).ok()?.modified().ok()
}

/// `pattern`'s matches below `ws` (relative paths), walking without
/// following symbolic links.
fn matches(ws: &Path, pattern: &str, notes: &mut Vec<String>) -> Vec<String> {
    let comps: Vec<String> = Path::new(pattern)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if comps.is_empty() || Path::new(pattern).components().any(|c| matches!(c, Component::ParentDir)) {
        notes.push(format!("reports: `{pattern}` is not a path inside the workspace"));
        return Vec::new();
    }
    let rel = comps.join("/");
    if !kiln_workflow::is_glob(pattern) {
        // A path that is not there matched nothing (the report is missing);
        // one that is there is read (and refused if it may not be).
        return match std::fs::symlink_metadata(ws.join(&rel)) {
            Ok(_) => vec![rel],
            Err(_) => Vec::new(),
        };
    }
    // Walk only below the pattern's literal leading directories.
    let mut base = PathBuf::new();
    for c in &comps[..comps.len() - 1] {
        if c.contains(['*', '?', '[', '{', '\\']) {
            break;
        }
        base.push(c);
    }
    let mut out = Vec::new();
    let mut stack = vec![base];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(ws.join(&dir)) else { continue };
        for entry in rd.flatten() {
            visited += 1;
            if visited > 200_000 {
                notes.push(format!("reports: `{pattern}` walked 200000 entries; the rest is not looked at"));
                return out;
            }
            let r = dir.join(entry.file_name());
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                stack.push(r);
                continue;
            }
            let Some(text) = r.to_str() else { continue };
            if kiln_workflow::glob_match(&rel, text) {
                out.push(text.to_string());
            }
        }
    }
    out
}

/// Opens a matched file the way a report may be read: inside the
/// workspace, not through a symbolic link, a regular file with one name.
pub(crate) fn open(ws: &Path, rel: &str) -> Result<std::fs::File, String> {
    let path = ws.join(rel);
    let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("cannot read `{rel}`: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!("`{rel}` is a symbolic link; a report must be a regular file"));
    }
    let parent = path.parent().unwrap_or(ws);
    let inside = parent
        .canonicalize()
        .and_then(|p| Ok(p.starts_with(ws.canonicalize()?)))
        .map_err(|e| format!("cannot resolve `{rel}`: {e}"))?;
    if !inside {
        return Err(format!("`{rel}` leads outside the workspace through a symbolic link"));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&path)
        .map_err(|e| format!("cannot open `{rel}`: {e}"))?;
    let m = file.metadata().map_err(|e| format!("cannot read `{rel}`: {e}"))?;
    if !m.is_file() {
        return Err(format!("`{rel}` is not a regular file"));
    }
    if m.nlink() != 1 {
        return Err(format!("`{rel}` has {} hard links; a report must be a file of its own", m.nlink()));
    }
    Ok(file)
}

/// Parses one matched file (blocking). A file that cannot be read is a
/// truncated, empty report saying why: the job declared it, so its absence
/// must show.
pub(crate) fn parse(ws: &Path, f: &Found) -> Report {
    let limits = limits();
    match open(ws, &f.rel) {
        Ok(file) => match f.format {
            "tap" => kiln_reports::parse_tap(file, &f.rel, &limits),
            _ => kiln_reports::parse_junit(file, &limits),
        },
        Err(why) => Report {
            format: if f.format == "tap" { kiln_reports::Format::Tap } else { kiln_reports::Format::Junit },
            tests: Vec::new(),
            truncated: true,
            annotations: vec![kiln_reports::Annotation { kind: kiln_reports::AnnotationKind::Io, message: why }],
            bytes_read: 0,
        },
    }
}

fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The upload of one parsed file; `mask` hides the job's secrets.
pub(crate) fn upload(rel: &str, format: &str, r: Report, mask: &dyn Fn(&str) -> String) -> ReportUpload {
    ReportUpload {
        path: rel.to_string(),
        format: format.to_string(),
        truncated: r.truncated,
        annotations: r
            .annotations
            .iter()
            .map(|a| ReportAnnotation { kind: name_of(&a.kind), message: mask(&a.message) })
            .collect(),
        tests: r
            .tests
            .into_iter()
            .map(|t| TestCaseResult {
                id: mask(t.id.as_str()),
                suite: mask(&t.suite),
                class: t.class.as_deref().map(mask),
                name: mask(&t.name),
                file: t.file,
                outcome: t.outcome.as_str().to_string(),
                duration_ms: t.duration_ms,
                message: t.message.as_deref().map(mask),
                excerpt: t.excerpt.as_deref().map(mask),
                retries: t
                    .retries
                    .iter()
                    .map(|r| TestRetry {
                        kind: format!(
                            "{}_{}",
                            name_of(&r.kind),
                            if r.outcome == kiln_reports::Outcome::Error { "error" } else { "failure" }
                        ),
                        outcome: r.outcome.as_str().to_string(),
                        message: r.message.as_deref().map(mask),
                        duration_ms: r.duration_ms,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The failed tests of complete reports if every one is quarantined:
/// `Some(ids)` (at least one) lets the step's failure through. `None`: no
/// report, a truncated one, no failed test (the step failed for another
/// reason), or a failure that is not quarantined.
pub(crate) fn quarantined_only(reports: &[Report], quarantine: &BTreeSet<&str>) -> Option<Vec<String>> {
    if reports.is_empty() || reports.iter().any(|r| r.truncated) {
        return None;
    }
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|r| &r.tests)
        .filter(|t| t.outcome.is_failure())
        .map(|t| t.id.as_str().to_string())
        .collect();
    (!failed.is_empty() && failed.iter().all(|id| quarantine.contains(id.as_str()))).then_some(failed)
}

/// Writes `$KILN_TEST_TIMINGS` (the API's `TestTimings` as JSON), readable
/// by the step, beside `$KILN_QUARANTINE`.
pub(crate) fn write_timings(dir: &Path, t: &kiln_api::TestTimings) -> std::io::Result<PathBuf> {
    let text = serde_json::to_string(t).map_err(std::io::Error::other)?;
    write_file(dir, "timings", &text)
}

/// Writes `$KILN_QUARANTINE`: one quarantined test id per line, readable by
/// the step (in the attempt's output directory).
pub(crate) fn write_quarantine(dir: &Path, ids: &[String]) -> std::io::Result<PathBuf> {
    let mut text = String::new();
    for id in ids {
        text.push_str(id);
        text.push('\n');
    }
    write_file(dir, "quarantine", &text)
}

/// A new 0644 file of the agent's in the attempt's output directory.
fn write_file(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    use std::io::Write;
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)?;
    f.write_all(text.as_bytes())?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    Ok(path)
}

/// The failed tests a failed step's own reports (files it wrote since
/// `since`) name, if every one is quarantined: the step then does not fail
/// the job ([`quarantined_only`]).
pub(crate) async fn excused(a: &Assignment, ws: &Path, since: SystemTime) -> Option<Vec<String>> {
    let spec = a.reports.clone()?;
    if a.quarantine.is_empty() {
        return None;
    }
    let (ws, quarantine) = (ws.to_path_buf(), a.quarantine.clone());
    tokio::task::spawn_blocking(move || {
        let found = find(&ws, &spec, Some(since));
        let reports: Vec<Report> = found.files.iter().map(|f| parse(&ws, f)).collect();
        let q: BTreeSet<&str> = quarantine.iter().map(String::as_str).collect();
        quarantined_only(&reports, &q)
    })
    .await
    .ok()
    .flatten()
}

/// Reads, logs and stages every report of the job (after the steps, the
/// sandbox cleaned up). A report the server refuses, or cannot take after
/// retries, fails the attempt as an infrastructure failure (retried): a
/// missing report would otherwise read as a complete one. A stale epoch
/// means the attempt was fenced: nothing more is sent.
pub(crate) async fn stage_all(
    client: &Client,
    a: &Assignment,
    ws: &Path,
    spec: &ReportsSpec,
    ctl: &Control,
    logs: &LogStreamer,
) -> Result<u32, Ran> {
    let masker = crate::mask::Masker::new(a.secrets.values().map(String::as_str));
    let (ws2, spec2) = (ws.to_path_buf(), spec.clone());
    let parsed = tokio::task::spawn_blocking(move || {
        let found = find(&ws2, &spec2, None);
        let reports: Vec<(Found, Report)> = found.files.into_iter().map(|f| (f.clone(), parse(&ws2, &f))).collect();
        (found.notes, reports)
    })
    .await
    .map_err(|e| Ran::Infra(format!("reading the test reports failed: {e}")))?;
    let (notes, reports) = parsed;
    for n in notes {
        logs.system(&format!("⚠ {n}"));
    }
    if reports.is_empty() {
        logs.system("⚠ reports: no test report was found; the job's tests count as missing");
        return Ok(0);
    }
    let staged = reports.len() as u32;
    for (f, r) in reports {
        let c = r.counts();
        let mut line = format!("reports: {} `{}`: {} tests", f.format, f.rel, r.tests.len());
        for (n, what) in [(c.failed, "failed"), (c.error, "errors"), (c.skipped, "skipped")] {
            if n > 0 {
                line.push_str(&format!(", {n} {what}"));
            }
        }
        if r.truncated {
            line.push_str(" (truncated: it never counts towards flakiness or excuses a failure)");
        }
        logs.system_note(&line);
        for an in &r.annotations {
            logs.system_note(&format!("⚠ reports: `{}`: {}", f.rel, an.message));
        }
        let mask = |t: &str| masker.as_ref().map_or_else(|| t.to_string(), |m| m.mask_text(t));
        let body = upload(&f.rel, f.format, r, &mask);
        let mut failures = 0u32;
        loop {
            let res = tokio::select! {
                r = client.stage_report(&a.job_id, a.epoch, &body) => r,
                _ = ctl.fenced() => return Err(Ran::Stopped),
            };
            match res {
                Ok(_) => break,
                Err(e) if e.is_stale_epoch() => return Err(Ran::Stopped),
                Err(e) if e.is_retryable() && failures < 8 => {
                    failures += 1;
                    tokio::time::sleep(crate::control::backoff(failures, 250, 5_000)).await;
                }
                Err(e) => {
                    let msg = format!("cannot stage test report `{}`: {e}", f.rel);
                    logs.system(&format!("✗ {msg}"));
                    return Err(Ran::Infra(msg));
                }
            }
        }
    }
    Ok(staged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const JUNIT: &str = r#"<testsuite name="s"><testcase classname="c" name="ok"/><testcase classname="c" name="bad"><failure message="boom"/></testcase></testsuite>"#;

    fn spec(junit: &[&str]) -> ReportsSpec {
        ReportsSpec { junit: junit.iter().map(|s| s.to_string()).collect(), tap: vec![] }
    }

    #[test]
    fn globs_find_regular_files_and_links_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path();
        std::fs::create_dir_all(ws.join("out/a")).unwrap();
        std::fs::write(ws.join("out/a/one.xml"), JUNIT).unwrap();
        std::fs::write(ws.join("out/two.xml"), JUNIT).unwrap();
        symlink("/etc/passwd", ws.join("out/evil.xml")).unwrap();
        let m = find(ws, &spec(&["out/**/*.xml"]), None);
        let rels: Vec<&str> = m.files.iter().map(|f| f.rel.as_str()).collect();
        assert_eq!(rels, ["out/a/one.xml", "out/evil.xml", "out/two.xml"]);
        // The link is found by the glob but never read.
        let evil = parse(ws, &m.files[1]);
        assert!(evil.truncated && evil.tests.is_empty(), "{evil:?}");
        assert!(evil.annotations[0].message.contains("symbolic link"), "{:?}", evil.annotations);
        let ok = parse(ws, &m.files[0]);
        assert_eq!(ok.tests.len(), 2);
        // A directory link leading outside: refused too.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("r.xml"), JUNIT).unwrap();
        symlink(outside.path(), ws.join("linked")).unwrap();
        let f = Found { rel: "linked/r.xml".into(), format: "junit" };
        assert!(parse(ws, &f).truncated);
        // A hard link to a file elsewhere.
        std::fs::write(outside.path().join("secret"), JUNIT).unwrap();
        if std::fs::hard_link(outside.path().join("secret"), ws.join("hard.xml")).is_ok() {
            let f = Found { rel: "hard.xml".into(), format: "junit" };
            let r = parse(ws, &f);
            assert!(r.truncated && r.annotations[0].message.contains("hard links"), "{r:?}");
        }
        // A pattern that matches nothing says so.
        let none = find(ws, &spec(&["nothing/*.xml"]), None);
        assert!(none.files.is_empty() && none.notes[0].contains("matched no file"), "{:?}", none.notes);
    }

    #[test]
    fn only_quarantined_failures_of_complete_reports_let_a_step_through() {
        let r = kiln_reports::parse_junit(JUNIT.as_bytes(), &limits());
        let q = |ids: &[&'static str]| ids.iter().copied().collect::<BTreeSet<&str>>();
        assert_eq!(
            quarantined_only(std::slice::from_ref(&r), &q(&["s :: c :: bad"])),
            Some(vec!["s :: c :: bad".to_string()]),
            "{:?}",
            r.tests
        );
        assert_eq!(quarantined_only(std::slice::from_ref(&r), &q(&["s :: c :: other"])), None);
        assert_eq!(quarantined_only(&[], &q(&["s :: c :: bad"])), None);
        let mut truncated = r.clone();
        truncated.truncated = true;
        assert_eq!(quarantined_only(&[truncated], &q(&["s :: c :: bad"])), None);
        let passed =
            kiln_reports::parse_junit(r#"<testsuite name="s"><testcase name="ok"/></testsuite>"#.as_bytes(), &limits());
        assert_eq!(quarantined_only(&[passed], &q(&["s :: c :: bad"])), None);
    }
}
