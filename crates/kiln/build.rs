//! `kiln --version` names the commit it was built from: `kiln 0.1.0 (abc1234 2026-12-06)`.
//! From a source tarball (no git, no .git) it says `commit unknown`, unless
//! KILN_BUILD_COMMIT gives it (e.g. `abc1234 2026-12-06` from the tarball's name).

use std::path::PathBuf;
use std::process::Command;

/// Where this build's sources are, as cargo says when it runs the script:
/// not `env!` (fixed when the script was compiled), because a target dir
/// shared by several clones (a CI cache) reuses one compiled script for all.
fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(manifest_dir()).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KILN_BUILD_COMMIT");
    let version = env!("CARGO_PKG_VERSION");
    let commit = match std::env::var("KILN_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => match (git(&["rev-parse", "--short", "HEAD"]), git(&["log", "-1", "--format=%cs"])) {
            (Some(sha), Some(date)) => {
                // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a
                // commit), packed-refs (a gc). A worktree's refs are in the common dir.
                let dir = PathBuf::from(git(&["rev-parse", "--absolute-git-dir"]).unwrap_or_default());
                let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
                    .map_or_else(|| dir.clone(), PathBuf::from);
                let mut watch = vec![dir.join("HEAD"), common.join("packed-refs")];
                if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    watch.push(common.join(&r));
                    watch.push(dir.join(&r));
                }
                for p in watch.into_iter().filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
                format!("{sha} {date}")
            }
            _ => {
                // git failed (not installed, or a passing trouble): run again once
                // a repository appears or moves, so `commit unknown` never sticks
                // to a build of a real checkout.
                let root = manifest_dir();
                for p in root.ancestors().map(|d| d.join(".git")).filter(|p| p.exists()).take(1) {
                    println!("cargo:rerun-if-changed={}", p.display());
                    println!("cargo:rerun-if-changed={}", p.join("HEAD").display());
                }
                "commit unknown".to_string()
            }
        },
    };
    println!("cargo:rustc-env=KILN_LONG_VERSION={version} ({commit})");
}
