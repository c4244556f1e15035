//! `kiln validate FILE`: every problem of a workflow file (and of the files
//! it includes) with its line and column. `kiln validate`: every workflow of
//! the checkout.

use kiln_api::exit;
use std::path::{Path, PathBuf};

/// The repository root `include:` paths are relative to: the nearest
/// directory above FILE holding `.git`, else the parent of FILE's `.kiln/`
/// directory, else FILE's directory.
fn repo_root(file: &Path) -> PathBuf {
    let abs = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    let dir = abs.parent().map(Path::to_path_buf).unwrap_or_default();
    if let Some(root) = dir.ancestors().find(|d| d.join(".git").exists()) {
        return root.to_path_buf();
    }
    if let Some(k) = dir.ancestors().find(|d| d.file_name().is_some_and(|n| n == ".kiln")) {
        return k.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    dir
}

/// `path` relative to the working directory when it is below it.
pub(super) fn relative_to_cwd(path: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
}

pub(super) fn run(file: &Path) -> i32 {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
            return exit::USAGE;
        }
    };
    let root = repo_root(file);
    let mut load = |path: &str| -> Result<String, String> {
        // `path` is checked by the parser: relative, no `..`.
        std::fs::read_to_string(root.join(path)).map_err(|e| format!("cannot read {}: {e}", root.join(path).display()))
    };
    match check(file, bytes, &root, &mut load) {
        Ok(w) => {
            kiln_cmd::outln!(
                "{}: valid ({} jobs, definition sha256 {})",
                file.display(),
                w.jobs.len(),
                w.canonical_hash()
            );
            exit::OK
        }
        Err(code) => code,
    }
}

/// Parse and validate the workflow `bytes` (the file shown as `file`; the
/// files it includes read with `load`, relative to `root`); every problem
/// is printed on stderr as `FILE:LINE:COLUMN: message`, and the result is
/// the exit code (2). `kiln validate` and `kiln exec` say the same.
pub(super) fn check(
    file: &Path,
    bytes: Vec<u8>,
    root: &Path,
    load: &mut kiln_workflow::Loader<'_>,
) -> Result<kiln_workflow::Workflow, i32> {
    if bytes.len() > kiln_workflow::MAX_FILE_BYTES {
        eprintln!(
            "{}:0:0: the workflow file is {} bytes; at most {} bytes are allowed",
            file.display(),
            bytes.len(),
            kiln_workflow::MAX_FILE_BYTES
        );
        return Err(exit::USAGE);
    }
    let Ok(text) = String::from_utf8(bytes) else {
        eprintln!("{}:0:0: the workflow file is not valid UTF-8", file.display());
        return Err(exit::USAGE);
    };
    match kiln_workflow::parse_with(&text, load) {
        Ok(w) => Ok(w),
        Err(d) => {
            for diag in &d.0 {
                let shown =
                    diag.file.as_ref().map(|f| relative_to_cwd(&root.join(f))).unwrap_or_else(|| file.to_path_buf());
                eprintln!("{}:{}:{}: {}", shown.display(), diag.line, diag.column, diag.message);
            }
            eprintln!("{}: {} problem(s)", file.display(), d.0.len());
            Err(exit::USAGE)
        }
    }
}

/// `kiln validate` without FILE: every `.kiln/*.yaml` and `.kiln/*.yml` of
/// the git checkout around the working directory, each with its result;
/// exit 2 if any is invalid (or there is none).
pub(super) fn checkout() -> i32 {
    let cwd = std::env::current_dir().unwrap_or_default();
    let Some(root) = cwd.ancestors().find(|d| d.join(".git").exists()) else {
        eprintln!(
            "error: {} is not inside a git checkout; give the workflow file: `kiln validate .kiln/pipeline.yaml`",
            cwd.display()
        );
        return exit::USAGE;
    };
    let dir = root.join(".kiln");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        eprintln!(
            "error: no workflows in {} (`.kiln/*.yaml`); write one (see docs/workflow.md) or give a file: `kiln validate FILE`",
            relative_to_cwd(&dir).display()
        );
        return exit::USAGE;
    }
    let invalid = files.iter().filter(|f| run(&relative_to_cwd(f)) != exit::OK).count();
    if invalid > 0 {
        eprintln!("{invalid} of {} workflow(s) invalid", files.len());
        return exit::USAGE;
    }
    exit::OK
}
