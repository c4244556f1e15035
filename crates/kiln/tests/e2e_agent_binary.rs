//! `kiln agent` through the lean `kiln-agent` binary (issue 47, item 2;
//! `crates/kiln/src/lean_agent.rs`): beside `kiln` and of the same build it
//! takes over the very process `kiln agent` started, which then runs jobs
//! and answers signals as before; of another build it hands the agent back
//! to `kiln`, which runs it in its own process and says why.

use kiln_testkit::{KilnAgent, KilnServer, TestRepo, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");
const LEAN: &str = env!("CARGO_BIN_EXE_kiln-agent");

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The executable process `pid` runs, once it is `want` (an agent execs
/// right after it starts).
fn exe_becomes(pid: i32, want: &Path) -> PathBuf {
    let want = want.canonicalize().unwrap();
    let exe = || std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    wait_for(Duration::from_secs(30), || exe().filter(|e| *e == want)).unwrap_or_else(|| exe().unwrap_or_default())
}

/// A repository whose one job prints `word`; `kiln run --follow` of it
/// must succeed and show it.
fn runs_a_job(server: &KilnServer, name: &str, word: &str) {
    let repo = TestRepo::new(&[(
        ".kiln/pipeline.yaml",
        &format!("version: 1\njobs:\n  - name: hello\n    steps:\n      - echo {word}-$((20+22))\n"),
    )])
    .unwrap();
    server.add_repo(name, &repo);
    let out = server.cli().args(["run", "--repo", name, "--follow"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{word}-42")), "{}", text(&out));
}

/// `build` as `kiln-agent --version` of `bin` names it.
fn build_of(bin: &Path) -> String {
    let out = Command::new(bin).arg("--version").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v = String::from_utf8(out.stdout).unwrap();
    v.trim().rsplit_once("build ").map(|(_, b)| b.to_string()).unwrap_or_else(|| panic!("no build in {v:?}"))
}

#[test]
fn kiln_agent_runs_as_the_lean_binary_in_the_same_process() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let mut agent = server.agent("lean", &[]).unwrap();
    let pid = agent.pid();
    assert_eq!(exe_becomes(pid, LEAN.as_ref()), Path::new(LEAN).canonicalize().unwrap(), "{}", agent.log());
    // The arguments are those `kiln agent` was started with (and hold no token).
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    assert_eq!(args[0], BIN, "{args:?}");
    assert_eq!(&args[1..3], ["agent", "--server"], "{args:?}");
    assert!(!args.iter().any(|a| a.contains(&server.agent_token)), "{args:?}");

    runs_a_job(&server, "lean", "lean");
    // SIGTERM drains the lean agent as it did the in-process one: nothing
    // is running, so it stops at once, with 0.
    agent.signal("TERM");
    let status = agent.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    assert!(agent.log().contains("SIGTERM: draining"), "{}", agent.log());
    assert!(!agent.log().contains("runs in the kiln process"), "{}", agent.log());

    let help = Command::new(LEAN).arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("kiln agent") && help.contains("--token-file") && help.contains("KILN_AGENT_IN_PROCESS"),
        "{help}"
    );
}

#[test]
fn a_kiln_agent_of_another_build_hands_the_agent_back_to_kiln() {
    // `kiln` and a `kiln-agent` whose build id was changed in its bytes:
    // what an upgrade that copied one binary leaves.
    let dir = tempfile::tempdir().unwrap();
    let kiln = dir.path().join("kiln");
    if std::fs::hard_link(BIN, &kiln).is_err() {
        std::fs::copy(BIN, &kiln).unwrap();
    }
    let build = build_of(LEAN.as_ref());
    let hash = build.rsplit_once('-').unwrap().1.as_bytes().to_vec();
    let other: Vec<u8> = hash.iter().map(|b| if *b == b'0' { b'1' } else { b'0' }).collect();
    let mut bytes = std::fs::read(LEAN).unwrap();
    let mut patched = 0;
    let mut i = 0;
    while let Some(at) = bytes[i..].windows(hash.len()).position(|w| w == hash.as_slice()) {
        bytes[i + at..i + at + hash.len()].copy_from_slice(&other);
        patched += 1;
        i += at + hash.len();
    }
    assert!(patched > 0, "the build id {build} is in the binary");
    let lean = dir.path().join("kiln-agent");
    std::fs::write(&lean, &bytes).unwrap();
    std::fs::set_permissions(&lean, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_ne!(build_of(&lean), build);

    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let agent = KilnAgent::spawn(&kiln, &server.url, &server.agent_token, "fallback", &[]).unwrap();
    runs_a_job(&server, "fallback", "fallback");
    assert_eq!(exe_becomes(agent.pid(), &kiln), kiln.canonicalize().unwrap(), "{}", agent.log());
    let log = agent.log();
    assert!(
        log.contains(&format!("is build {}", build_of(&lean))) && log.contains("runs in the kiln process"),
        "the agent's log says why it runs in the kiln process:\n{log}"
    );
    drop(agent);

    // Without a `kiln-agent` beside it, `kiln agent` runs in its process,
    // as it always did, and says nothing about it.
    std::fs::remove_file(&lean).unwrap();
    let agent = KilnAgent::spawn(&kiln, &server.url, &server.agent_token, "alone", &[]).unwrap();
    runs_a_job(&server, "alone", "alone");
    assert_eq!(exe_becomes(agent.pid(), &kiln), kiln.canonicalize().unwrap());
    assert!(!agent.log().contains("runs in the kiln process"), "{}", agent.log());
}

/// Both binaries are linked with packed relative relocations where the
/// glibc they are built against has them (crates/kiln/build.rs; issue 47,
/// memory): without them the loader reads and keeps 2.2 MB of relocation
/// table in every `kiln` process. The linker marks such a binary with a
/// `GLIBC_ABI_DT_RELR` version dependency.
#[test]
fn both_binaries_pack_their_relative_relocations() {
    let glibc = Command::new("getconf").arg("GNU_LIBC_VERSION").output().map(|o| text(&o)).unwrap_or_default();
    let version: Vec<u32> =
        glibc.split_whitespace().nth(1).unwrap_or("0.0").split('.').map(|p| p.parse().unwrap_or(0)).collect();
    if version.as_slice() < [2, 36].as_slice() || std::env::var("KILN_PACK_RELOCS").as_deref() == Ok("0") {
        eprintln!("skipped: glibc {glibc:?} has no DT_RELR or KILN_PACK_RELOCS=0");
        return;
    }
    for bin in [BIN, LEAN] {
        let bytes = std::fs::read(bin).unwrap();
        let marked = bytes.windows(17).any(|w| w == b"GLIBC_ABI_DT_RELR");
        assert!(marked, "{bin} is not linked with -z pack-relative-relocs");
    }
}
