//! `kiln validate FILE`: every problem of a workflow file with its line and column.

use kiln_api::exit;
use std::path::Path;

pub(super) fn run(file: &Path) -> i32 {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
            return exit::USAGE;
        }
    };
    if bytes.len() > kiln_workflow::MAX_FILE_BYTES {
        eprintln!(
            "{}:0:0: the workflow file is {} bytes; at most {} bytes are allowed",
            file.display(),
            bytes.len(),
            kiln_workflow::MAX_FILE_BYTES
        );
        return exit::USAGE;
    }
    let Ok(text) = String::from_utf8(bytes) else {
        eprintln!("{}:0:0: the workflow file is not valid UTF-8", file.display());
        return exit::USAGE;
    };
    match kiln_workflow::parse(&text) {
        Ok(w) => {
            kiln_cmd::outln!(
                "{}: valid ({} jobs, definition sha256 {})",
                file.display(),
                w.jobs.len(),
                w.canonical_hash()
            );
            exit::OK
        }
        Err(d) => {
            for diag in &d.0 {
                eprintln!("{}:{}:{}: {}", file.display(), diag.line, diag.column, diag.message);
            }
            eprintln!("{}: {} problem(s)", file.display(), d.0.len());
            exit::USAGE
        }
    }
}
