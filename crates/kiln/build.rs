//! `kiln --version` names the commit it was built from: `kiln 0.1.0 (abc1234 2026-12-06)`.
//! From a source tarball (no git, no .git) it says `commit unknown`, unless
//! KILN_BUILD_COMMIT gives it (e.g. `abc1234 2026-12-06` from the tarball's name).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
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
    println!("cargo:rustc-env=KILN_BUILD_ID={}", build_id(version));
    pack_relative_relocations();
}

/// Links `kiln` and `kiln-agent` with packed relative relocations (DT_RELR,
/// issue 47): a position-independent executable's relocation table shrinks
/// from 2.2 MB (kiln) and 0.9 MB (kiln-agent) of `.rela.dyn`, every byte of
/// which the loader reads at each start and which then stays resident, to a
/// few KB. Needs glibc ≥ 2.36 where the binary runs (the linker adds a
/// `GLIBC_ABI_DT_RELR` version dependency), so only when the glibc this is
/// built against has it; `KILN_PACK_RELOCS=0` turns it off (a build meant for
/// an older system).
fn pack_relative_relocations() {
    println!("cargo:rerun-if-env-changed=KILN_PACK_RELOCS");
    let target_ok = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    let wanted = std::env::var("KILN_PACK_RELOCS").map_or(true, |v| v != "0");
    if target_ok && wanted && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the build host's glibc (`getconf GNU_LIBC_VERSION`: `glibc 2.36`)
/// is at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.split_whitespace().nth(1) else { return false };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    out.status.success() && found >= (major, minor)
}

/// The build `kiln` and `kiln-agent` both carry (`KILN_BUILD_ID`): the
/// version and a hash of the workspace's crates (sources and manifests,
/// but the test kit) and of Cargo.lock. `kiln agent` execs `kiln-agent`
/// only when its build is the same (`src/lean_agent.rs`): one from another
/// build — `cargo build --bin kiln` relinks `kiln` alone, an upgrade may
/// copy one binary — would run agent code the `kiln` beside it has not.
/// Without the workspace around (the crate alone), this crate's own sources.
fn build_id(version: &str) -> String {
    let here = manifest_dir();
    let root = here.join("../..");
    let crates = root.join("crates");
    let mut inputs: Vec<PathBuf> = Vec::new();
    let workspace = crates.is_dir() && root.join("Cargo.lock").is_file();
    let base = if workspace { root.clone() } else { here.clone() };
    if workspace {
        inputs.push(root.join("Cargo.lock"));
        inputs.push(root.join("Cargo.toml"));
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        dirs.retain(|d| d.join("Cargo.toml").is_file() && !d.ends_with("kiln-testkit"));
        inputs.extend(dirs.iter().map(|d| d.join("Cargo.toml")));
        inputs.extend(dirs.iter().map(|d| d.join("src")));
    } else {
        inputs.push(here.join("Cargo.toml"));
        inputs.push(here.join("src"));
    }
    let mut files = Vec::new();
    for input in &inputs {
        println!("cargo:rerun-if-changed={}", input.display());
        walk(input, &mut files);
    }
    files.sort();
    let mut h = std::hash::DefaultHasher::new();
    for f in &files {
        f.strip_prefix(&base).unwrap_or(f).hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    format!("{version}-{:016x}", h.finish())
}

/// Every file under `path` (itself, if a file).
fn walk(path: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => entries.filter_map(|e| e.ok()).for_each(|e| walk(&e.path(), out)),
        Err(_) if path.is_file() => out.push(path.to_path_buf()),
        Err(_) => {}
    }
}
