//! YAML → Workflow with diagnostics (file, line, column, message).

use crate::compose::{Loader, compose, name_files};
use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{MAX_FILE_BYTES, Workflow};

/// At most this many diagnostics are returned; the rest are summarised in a
/// final one.
pub const MAX_DIAGNOSTICS: usize = 100;

/// Parse and validate a workflow file that includes no other file (an
/// `include:` is reported as a problem). See [`parse_with`].
pub fn parse(src: &str) -> Result<Workflow, Diagnostics> {
    parse_with(src, &mut |path: &str| {
        Err(format!("`{path}` cannot be read here: this workflow is checked without its repository"))
    })
}

/// Parse and validate a workflow file, reading the files it `include`s
/// (repository-relative paths) with `load`. Returns every problem found,
/// each with its file (for an included one), line and column, or the
/// validated model of the composed workflow.
///
/// Diagnostics are sorted by file (the workflow file first, then included
/// files in the order read) and position. A file larger than
/// [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES) yields a single diagnostic at
/// line 0, column 0. A YAML syntax error stops parsing and yields the
/// problems found so far plus one `invalid YAML: …` diagnostic at the error.
pub fn parse_with(src: &str, load: &mut Loader<'_>) -> Result<Workflow, Diagnostics> {
    if src.len() > MAX_FILE_BYTES {
        return Err(Diagnostics(vec![Diagnostic::new(
            0,
            0,
            format!(
                "the workflow file is {} bytes; at most {MAX_FILE_BYTES} bytes (256 KiB) are allowed — move long scripts into files in the repository",
                src.len()
            ),
        )]));
    }
    let loaded = crate::tree::load(src);
    let mut diags = loaded.diags;
    let mut files = Vec::new();
    let result = if loaded.fatal {
        None
    } else {
        match loaded.root {
            None => {
                diags.push(Diagnostic::new(
                    1,
                    1,
                    "the workflow file is empty; start it with `version: 1` and a `jobs:` list",
                ));
                None
            }
            Some(root) => match crate::foreign::other_system(&root) {
                // Another CI system's file: one message, not a key-by-key list.
                Some(d) => {
                    diags.push(d);
                    None
                }
                None => {
                    let composed = compose(root, load, &mut diags);
                    files = composed.files;
                    match crate::validate::validate(&composed.root, composed.jobs_map) {
                        Ok(w) => Some(w),
                        Err(more) => {
                            diags.extend(more);
                            None
                        }
                    }
                }
            },
        }
    };
    name_files(&mut diags, &files);
    match result {
        Some(w) if diags.is_empty() => Ok(w),
        _ => Err(finish(diags)),
    }
}

fn finish(mut diags: Vec<Diagnostic>) -> Diagnostics {
    if diags.is_empty() {
        diags.push(Diagnostic::new(1, 1, "the workflow file is invalid"));
    }
    diags.sort_by_key(|d| (d.src, d.line, d.column));
    diags.dedup();
    if diags.len() > MAX_DIAGNOSTICS {
        let rest = diags.len() - MAX_DIAGNOSTICS;
        let next = diags[MAX_DIAGNOSTICS].clone();
        diags.truncate(MAX_DIAGNOSTICS);
        diags.push(Diagnostic { message: format!("{rest} more problems not shown; fix the ones above first"), ..next });
    }
    Diagnostics(diags)
}
