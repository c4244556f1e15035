//! Hashing the files a cache depends on.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::paths::check_rel_path;
use crate::{CacheError, io_err};

/// Digest recorded for an input that matches no file.
pub const ABSENT: &str = "absent";

/// sha256 (lowercase hex) of each input file, paths relative to `root`,
/// '/'-separated.
///
/// An input without `*` names one file: `(input, digest)`, or
/// `(input, "absent")` if it does not exist. An input with `*` (any
/// characters within one component) or `**` (a whole component: any number
/// of directories) is a pattern: `(matched path, digest)` for each matching
/// file, sorted, or `(pattern, "absent")` if nothing matches. Patterns do
/// not descend into symlinked directories. Absolute inputs, `..`/`.`
/// components and files resolving outside `root` are refused; a literal
/// input naming a directory is refused (write `dir/**`).
pub fn hash_inputs(root: &Path, inputs: &[String]) -> Result<Vec<(String, String)>, CacheError> {
    let canon_root = fs::canonicalize(root).map_err(|e| io_err(format_args!("resolving {}", root.display()), e))?;
    let mut out = Vec::new();
    for input in inputs {
        check_rel_path(input).map_err(|m| CacheError::Refused(format!("input {input:?}: {m}")))?;
        if !input.contains('*') {
            let path = root.join(input);
            match fs::metadata(&path) {
                Ok(m) if m.is_dir() => {
                    return Err(CacheError::Refused(format!("input {input:?} is a directory (use {input}/**)")));
                }
                Ok(_) => out.push((input.clone(), hash_file(&canon_root, &path, input)?)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    out.push((input.clone(), ABSENT.to_string()));
                }
                Err(e) => return Err(io_err(format_args!("stat {}", path.display()), e)),
            }
            continue;
        }
        let pattern: Vec<&str> = input.split('/').collect();
        // Walk from the longest literal prefix.
        let fixed = pattern.iter().take_while(|c| !c.contains('*')).count();
        let prefix = pattern[..fixed].join("/");
        let mut found = Vec::new();
        let start = if prefix.is_empty() { root.to_path_buf() } else { root.join(&prefix) };
        walk(&start, &prefix, &pattern[fixed..], &mut found)?;
        found.sort();
        found.dedup();
        if found.is_empty() {
            out.push((input.clone(), ABSENT.to_string()));
        }
        for rel in found {
            let digest = hash_file(&canon_root, &root.join(&rel), &rel)?;
            out.push((rel, digest));
        }
    }
    Ok(out)
}

/// Collects the files under `dir` (whose relative path is `rel`) matching
/// the remaining pattern components.
fn walk(dir: &Path, rel: &str, pat: &[&str], found: &mut Vec<String>) -> Result<(), CacheError> {
    let Some((first, rest)) = pat.split_first() else {
        return Ok(());
    };
    if *first == "**" {
        // Zero directories...
        walk(dir, rel, rest, found)?;
    }
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Ok(());
        }
        Err(e) => return Err(io_err(format_args!("listing {}", dir.display()), e)),
    };
    for ent in rd {
        let ent = ent.map_err(|e| io_err(format_args!("listing {}", dir.display()), e))?;
        let Some(name) = ent.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path: PathBuf = ent.path();
        let child = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        let lmeta = fs::symlink_metadata(&path).map_err(|e| io_err(format_args!("stat {}", path.display()), e))?;
        let is_real_dir = lmeta.is_dir();
        if *first == "**" {
            // ...or one more directory, staying on `**`.
            if is_real_dir {
                walk(&path, &child, pat, found)?;
            }
            continue;
        }
        if !glob_component(first, &name) {
            continue;
        }
        if rest.is_empty() {
            // A file (or a symlink to one).
            if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                found.push(child);
            }
        } else if is_real_dir {
            walk(&path, &child, rest, found)?;
        }
    }
    Ok(())
}

/// `*` matches any run of characters (within one component).
fn glob_component(pat: &str, name: &str) -> bool {
    let (p, n) = (pat.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

fn hash_file(canon_root: &Path, path: &Path, shown: &str) -> Result<String, CacheError> {
    let canon = fs::canonicalize(path).map_err(|e| io_err(format_args!("resolving {}", path.display()), e))?;
    if !canon.starts_with(canon_root) {
        return Err(CacheError::Refused(format!("input {shown:?} resolves outside the workspace")));
    }
    let mut f = File::open(&canon).map_err(|e| io_err(format_args!("opening {}", path.display()), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => h.update(&buf[..k]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(format_args!("reading {}", path.display()), e)),
        }
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::glob_component;

    #[test]
    fn globs() {
        assert!(glob_component("*.lock", "Cargo.lock"));
        assert!(glob_component("*", ""));
        assert!(glob_component("a*b*c", "aXXbYc"));
        assert!(!glob_component("a*b*c", "aXXbYd"));
        assert!(glob_component("Cargo.toml", "Cargo.toml"));
        assert!(!glob_component("Cargo.toml", "Cargo.tom"));
    }
}
