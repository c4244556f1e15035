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

/// The `kiln` binary under test (`KILN_HOSTILE_BIN` to probe another build).
pub(crate) fn bin() -> std::path::PathBuf {
    std::env::var_os("KILN_HOSTILE_BIN").map_or_else(|| std::path::PathBuf::from(BIN), std::path::PathBuf::from)
}

/// A directory every user may enter (0755) holding an executable copy of
/// [`bin`], for an agent started as another uid: (the directory, the copy).
pub(crate) fn executable_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = home.path().join("kiln");
    std::fs::copy(bin(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (home, copy)
}

/// The container engine the tests use (`scripts/container-env`).
pub(crate) fn engine_url() -> String {
    std::env::var("KILN_ENGINE").unwrap_or_else(|_| "unix:///run/podman/podman.sock".into())
}

/// The loopback test registry.
pub(crate) fn registry() -> String {
    std::env::var("KILN_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into())
}

/// True when the engine and the registry answer; otherwise skip (or fail
/// under KILN_REQUIRE_CONTAINERS=1), as e2e_containers does.
pub(crate) fn containers_available() -> bool {
    let sock = engine_url().trim_start_matches("unix://").to_string();
    let ok = |args: &[&str]| std::process::Command::new("curl").args(args).output().is_ok_and(|o| o.status.success());
    let engine = ok(&["-fsS", "--max-time", "3", "--unix-socket", &sock, "http://d/_ping"]);
    let reg = ok(&["-fsS", "--max-time", "3", &format!("http://{}/v2/", registry())]);
    if engine && reg {
        return true;
    }
    let what = format!("engine at {} answers: {engine}, registry {} answers: {reg}", engine_url(), registry());
    if std::env::var("KILN_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_CONTAINERS=1 but containers are not available ({what}); run scripts/container-env");
    }
    eprintln!("SKIPPED: containers are not available ({what}); run scripts/container-env");
    false
}

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
