//! Hostile inputs against the real server (issue 13's findings, one
//! module per boundary): each is refused with a clear error and changes
//! nothing on disk or in the database.

mod agents;
mod caches;
mod edge;
mod expressions;
mod forge;
mod git_urls;
mod host_executor;
mod http;
mod isolation;
mod oidc;
mod placement;

use std::path::Path;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// Every file name under `dir`, recursively (to prove nothing was created).
pub(crate) fn names_under(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}
