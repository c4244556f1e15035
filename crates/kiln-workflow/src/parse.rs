//! YAML → Workflow with diagnostics (line, column, message).

use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{MAX_FILE_BYTES, Workflow};

/// At most this many diagnostics are returned; the rest are summarised in a
/// final one.
pub const MAX_DIAGNOSTICS: usize = 100;

/// Parse and validate a workflow file. Returns every problem found, each with
/// its line and column, or the validated model.
///
/// Diagnostics are sorted by position. A file larger than
/// [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES) yields a single diagnostic at
/// line 0, column 0. A YAML syntax error stops parsing and yields the
/// problems found so far plus one `invalid YAML: …` diagnostic at the error.
pub fn parse(src: &str) -> Result<Workflow, Diagnostics> {
    if src.len() > MAX_FILE_BYTES {
        return Err(Diagnostics(vec![Diagnostic {
            line: 0,
            column: 0,
            message: format!(
                "the workflow file is {} bytes; at most {MAX_FILE_BYTES} bytes (256 KiB) are allowed — move long scripts into files in the repository",
                src.len()
            ),
        }]));
    }
    let loaded = crate::tree::load(src);
    let mut diags = loaded.diags;
    let result = if loaded.fatal {
        None
    } else {
        match &loaded.root {
            None => {
                diags.push(Diagnostic {
                    line: 1,
                    column: 1,
                    message: "the workflow file is empty; start it with `version: 1` and a `jobs:` list".to_string(),
                });
                None
            }
            Some(root) => match crate::validate::validate(root) {
                Ok(w) => Some(w),
                Err(more) => {
                    diags.extend(more);
                    None
                }
            },
        }
    };
    match result {
        Some(w) if diags.is_empty() => Ok(w),
        _ => Err(finish(diags)),
    }
}

fn finish(mut diags: Vec<Diagnostic>) -> Diagnostics {
    if diags.is_empty() {
        diags.push(Diagnostic { line: 1, column: 1, message: "the workflow file is invalid".to_string() });
    }
    diags.sort_by_key(|d| (d.line, d.column));
    diags.dedup();
    if diags.len() > MAX_DIAGNOSTICS {
        let rest = diags.len() - MAX_DIAGNOSTICS;
        let next = &diags[MAX_DIAGNOSTICS];
        let (line, column) = (next.line, next.column);
        diags.truncate(MAX_DIAGNOSTICS);
        diags.push(Diagnostic {
            line,
            column,
            message: format!("{rest} more problems not shown; fix the ones above first"),
        });
    }
    Diagnostics(diags)
}
