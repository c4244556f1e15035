//! Directory and glob artifacts (issue 16): freezing packs them as one
//! `kiln-cache` archive; restoring unpacks with the cache's path-safety
//! rules. The hostile cases follow kiln-cache's corpus (traversal, absolute
//! names, files through links (a link itself is restored as a link), bombs, wrong
//! roots, random and mutated bytes): each is refused and leaves nothing
//! behind, neither beside the target nor outside it.

use super::*;
use kiln_cache::{EntryKind, FORMAT_VERSION, MANIFEST_NAME, Manifest, ManifestEntry};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

fn spec(name: &str, path: &str) -> PublishSpec {
    PublishSpec { name: name.into(), path: path.into() }
}

fn job_failure(r: Result<Frozen, Ran>) -> String {
    match r {
        Err(Ran::JobError(m)) => m,
        Err(other) => panic!("not a job error: {other:?}"),
        Ok(f) => panic!("froze {f:?}"),
    }
}

/// Every path below `dir` with (mode, contents or link target), links not followed.
fn snapshot(dir: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, (u32, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().to_string();
            let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let mode = m.permissions().mode() & 0o777;
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                out.insert(r, (0, t.to_string_lossy().as_bytes().to_vec()));
            } else if m.is_dir() {
                out.insert(r.clone(), (mode, vec![]));
                walk(&e.path(), &r, out);
            } else {
                out.insert(r, (mode, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

fn write(path: &Path, data: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

struct Env {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    spool: PathBuf,
    outside: PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let (ws, spool, outside) = (dir.path().join("ws"), dir.path().join("spool"), dir.path().join("outside"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Env { _dir: dir, ws, spool, outside }
}

#[test]
fn a_directory_is_packed_with_its_modes_and_restored_file_by_file() {
    let e = env();
    let site = e.ws.join("out/site");
    for i in 0..50u32 {
        let mode = if i % 7 == 0 { 0o755 } else { 0o644 };
        write(&site.join(format!("d{}/n{}/f{i}.txt", i % 3, i % 5)), format!("file {i}").as_bytes(), mode);
    }
    write(&site.join("bin/run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    std::os::unix::fs::symlink("../bin/run.sh", site.join("d0/run")).unwrap();
    std::fs::write(e.outside.join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink(e.outside.join("secret"), site.join("escape")).unwrap();
    let before = snapshot(&site);

    let f = freeze(&e.ws, &e.spool, &spec("site", "out/site")).unwrap();
    assert!(f.archive);
    assert_eq!(f.path, e.spool.join("site"));
    assert_eq!(f.size, std::fs::metadata(&f.path).unwrap().len(), "the recorded size is the archive's");
    assert_eq!(std::fs::metadata(&f.path).unwrap().permissions().mode() & 0o777, 0o444);
    assert!(!site.exists(), "moved into the spool, not copied");
    assert_eq!(std::fs::read_dir(&e.spool).unwrap().count(), 1, "only the archive is left in the spool");

    let target = e.ws.join("restored");
    let u = unpack_archive(&f.path, &target, "site").unwrap();
    // Every link is kept as a link, never followed (issue 41, item 4).
    assert_eq!(snapshot(&target), before, "every file, mode and link as published");
    assert!(u.entries > 50);
}

#[test]
fn a_glob_packs_the_matching_files_at_their_workspace_paths() {
    let e = env();
    write(&e.ws.join("dist/a/x-1.0.whl"), b"x", 0o644);
    write(&e.ws.join("dist/a/b/y-2.0.whl"), b"y", 0o755);
    write(&e.ws.join("dist/z.whl"), b"z", 0o644);
    write(&e.ws.join("dist/notes.txt"), b"keep", 0o644);
    write(&e.ws.join("src/other.whl"), b"not below dist", 0o644);
    let f = freeze(&e.ws, &e.spool, &spec("wheels", "dist/**/*.whl")).unwrap();
    assert!(f.archive);
    assert!(e.ws.join("dist/notes.txt").exists() && e.ws.join("src/other.whl").exists(), "non-matches stay");
    assert!(!e.ws.join("dist/z.whl").exists());
    let target = e.ws.join("wheels");
    unpack_archive(&f.path, &target, "wheels").unwrap();
    let got: Vec<(String, u32)> = snapshot(&target)
        .into_iter()
        .filter(|(_, (_, data))| !data.is_empty())
        .map(|(p, (mode, _))| (p, mode))
        .collect();
    assert_eq!(
        got,
        [
            ("dist/a/b/y-2.0.whl".to_string(), 0o755),
            ("dist/a/x-1.0.whl".to_string(), 0o644),
            ("dist/z.whl".to_string(), 0o644)
        ]
    );
}

#[test]
fn a_glob_matching_nothing_names_the_pattern() {
    let e = env();
    write(&e.ws.join("dist/notes.txt"), b"", 0o644);
    for pattern in ["dist/*.whl", "missing/**/*.whl", "*.tar.gz"] {
        let m = job_failure(freeze(&e.ws, &e.spool, &spec("w", pattern)));
        assert_eq!(m, format!("declared artifact `w`: the glob `{pattern}` matched no files in the workspace"));
    }
}

#[test]
fn hard_links_and_escaping_paths_are_refused_in_trees_and_globs() {
    let e = env();
    let token = e.outside.join("agent.token");
    write(&token, b"kiln_secret", 0o600);
    write(&e.ws.join("out/ok.txt"), b"ok", 0o644);
    std::fs::hard_link(&token, e.ws.join("out/token.txt")).unwrap();
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("out", "out")));
    assert!(m.contains("`token.txt`") && m.contains("2 hard links and only 1 of them is in the workspace"), "{m}");
    assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!e.spool.join("out").exists(), "no archive");

    write(&e.ws.join("g/a.txt"), b"a", 0o644);
    std::fs::hard_link(&token, e.ws.join("g/b.txt")).unwrap();
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("g", "g/*.txt")));
    assert!(m.contains("2 hard links"), "{m}");

    std::os::unix::fs::symlink(&e.outside, e.ws.join("up")).unwrap();
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("up", "up")));
    assert!(m.contains("symbolic link"), "{m}");
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("up", "up/**/*")));
    assert!(m.contains("a symbolic link"), "{m}");
    std::fs::create_dir_all(e.outside.join("x")).unwrap();
    write(&e.outside.join("x/f.txt"), b"outside", 0o644);
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("up", "up/x/*")));
    assert!(m.contains("outside the workspace"), "{m}");
    assert!(e.outside.join("x/f.txt").exists(), "nothing moved from outside");
    std::os::unix::fs::symlink(&token, e.ws.join("g/c.txt")).unwrap();
    std::fs::remove_file(e.ws.join("g/b.txt")).unwrap();
    let m = job_failure(freeze(&e.ws, &e.spool, &spec("g", "g/*.txt")));
    assert!(m.contains("is a symbolic link"), "{m}");
    assert_eq!(std::fs::read(&token).unwrap(), b"kiln_secret");
}

#[test]
fn a_single_file_is_published_as_before() {
    let e = env();
    write(&e.ws.join("out/app.bin"), b"frozen bytes", 0o644);
    let f = freeze(&e.ws, &e.spool, &spec("app.bin", "out/app.bin")).unwrap();
    assert_eq!(
        f,
        Frozen { name: "app.bin".into(), path: e.spool.join("app.bin"), size: 12, archive: false },
        "the file itself, not an archive"
    );
    assert_eq!(std::fs::read(&f.path).unwrap(), b"frozen bytes");
}

// ---------------------------------------------------------------- hostile restores

/// One raw tar member (names written as given, unchecked by the tar crate).
#[derive(Clone)]
struct Member {
    name: String,
    ty: tar::EntryType,
    data: Vec<u8>,
    link: Option<String>,
    size: Option<u64>,
}

fn file(name: &str, data: &[u8]) -> Member {
    Member { name: name.into(), ty: tar::EntryType::Regular, data: data.to_vec(), link: None, size: None }
}

fn dir(name: &str) -> Member {
    Member { ty: tar::EntryType::Directory, ..file(name, b"") }
}

fn link(name: &str, ty: tar::EntryType, target: &str) -> Member {
    Member { ty, link: Some(target.into()), ..file(name, b"") }
}

fn archive(members: &[Member]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for m in members {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(m.ty);
        h.set_mode(if m.ty == tar::EntryType::Directory { 0o755 } else { 0o644 });
        h.set_size(m.size.unwrap_or(m.data.len() as u64));
        {
            let old = h.as_old_mut();
            old.name[..m.name.len()].copy_from_slice(m.name.as_bytes());
            if let Some(l) = &m.link {
                old.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
        }
        h.set_cksum();
        b.append(&h, &m.data[..]).unwrap();
    }
    zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap()
}

fn entry(path: &str, kind: EntryKind, data: &[u8]) -> ManifestEntry {
    use sha2::Digest;
    ManifestEntry {
        root: 0,
        path: path.into(),
        kind,
        mode: if kind == EntryKind::Dir { 0o755 } else { 0o644 },
        size: if kind == EntryKind::File { data.len() as u64 } else { 0 },
        sha256: (kind == EntryKind::File).then(|| hex::encode(Sha256::digest(data))),
        target: None,
    }
}

fn manifest_member(root: &str, entries: Vec<ManifestEntry>) -> Member {
    let m = Manifest {
        format: FORMAT_VERSION,
        roots: vec![root.into()],
        total_bytes: entries.iter().map(|e| e.size).sum(),
        entries,
        left_out: Default::default(),
    };
    file(MANIFEST_NAME, &serde_json::to_vec(&m).unwrap())
}

/// The valid baseline: root, a dir, a file.
fn good(root: &str) -> Vec<Member> {
    vec![
        manifest_member(
            root,
            vec![
                entry("", EntryKind::Dir, b""),
                entry("sub", EntryKind::Dir, b""),
                entry("a.txt", EntryKind::File, b"hi"),
            ],
        ),
        dir("0"),
        dir("0/sub"),
        file("0/a.txt", b"hi"),
    ]
}

/// Unpacks `bytes` as artifact `art` into `ws/restored` (where a file
/// already is); asserts it is refused and that the workspace and the
/// outside directory are exactly as before.
fn assert_refused(e: &Env, bytes: &[u8]) {
    let target = e.ws.join("restored");
    write(&target.join("old.txt"), b"before", 0o644);
    let tmp = e.outside.join("../archive.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    let (ws_before, outside_before) = (snapshot(&e.ws), snapshot(&e.outside));
    let r = unpack_archive(&tmp, &target, "art");
    assert!(r.is_err(), "a hostile archive was accepted");
    assert_eq!(snapshot(&e.ws), ws_before, "the workspace (target and beside it) is unchanged");
    assert_eq!(snapshot(&e.outside), outside_before, "nothing written outside");
}

#[test]
fn the_baseline_archive_restores() {
    let e = env();
    let tmp = e.outside.join("../good.tmp");
    std::fs::write(&tmp, archive(&good("art"))).unwrap();
    // Even a symbolic link at the target is replaced, never followed.
    std::os::unix::fs::symlink(&e.outside, e.ws.join("restored")).unwrap();
    unpack_archive(&tmp, &e.ws.join("restored"), "art").unwrap();
    assert_eq!(std::fs::read(e.ws.join("restored/a.txt")).unwrap(), b"hi");
    assert!(std::fs::symlink_metadata(e.ws.join("restored")).unwrap().is_dir());
    assert!(snapshot(&e.outside).is_empty());
}

#[test]
fn hostile_archives_are_refused_and_leave_nothing() {
    let e = env();
    let abs = format!("{}/evil", e.outside.display());
    let with = |extra_entries: Vec<ManifestEntry>, extra: Vec<Member>| {
        let mut m = good("art");
        let mut entries = vec![
            entry("", EntryKind::Dir, b""),
            entry("sub", EntryKind::Dir, b""),
            entry("a.txt", EntryKind::File, b"hi"),
        ];
        entries.extend(extra_entries);
        m[0] = manifest_member("art", entries);
        m.extend(extra);
        archive(&m)
    };
    let mut out_link = entry("sub/out", EntryKind::Symlink, b"");
    out_link.target = Some("../../../outside".into());
    // A link leaving the target is restored as that link (issue 41, item
    // 4), and nothing is ever written through it (the next case).
    {
        let tmp = e.outside.join("../link.tmp");
        let link_only =
            with(vec![out_link.clone()], vec![link("0/sub/out", tar::EntryType::Symlink, "../../../outside")]);
        std::fs::write(&tmp, link_only).unwrap();
        let target = e.ws.join("linked");
        unpack_archive(&tmp, &target, "art").unwrap();
        assert_eq!(std::fs::read_link(target.join("sub/out")).unwrap(), Path::new("../../../outside"));
        assert!(snapshot(&e.outside).is_empty(), "nothing written where it points");
        std::fs::remove_dir_all(&target).unwrap();
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("traversal member", with(vec![entry("x", EntryKind::File, b"p")], vec![file("0/../../x", b"p")])),
        (
            "traversal in the manifest",
            with(vec![entry("../../x", EntryKind::File, b"p")], vec![file("0/../../x", b"p")]),
        ),
        ("absolute member", with(vec![entry("x", EntryKind::File, b"p")], vec![file(&abs, b"p")])),
        (
            "link whose member differs from the manifest",
            with(vec![out_link], vec![link("0/sub/out", tar::EntryType::Symlink, "/etc")]),
        ),
        (
            "file through a link",
            with(
                vec![entry("sub/l", EntryKind::Symlink, b""), entry("sub/l/evil", EntryKind::File, b"p")],
                vec![
                    link("0/sub/l", tar::EntryType::Symlink, &e.outside.display().to_string()),
                    file("0/sub/l/evil", b"p"),
                ],
            ),
        ),
        (
            "hard link",
            with(vec![entry("h", EntryKind::File, b"")], vec![link("0/h", tar::EntryType::Link, "/etc/passwd")]),
        ),
        ("entry not in the manifest", with(vec![], vec![file("0/extra", b"p")])),
        ("wrong digest", {
            let mut m = good("art");
            m[3] = file("0/a.txt", b"ho");
            archive(&m)
        }),
        ("another artifact's archive", archive(&good("other"))),
        ("no manifest", archive(&good("art")[1..])),
        ("a bomb whose header lies", {
            let mut m = good("art");
            m[3] = Member { size: Some(1 << 40), ..file("0/a.txt", b"hi") };
            archive(&m)
        }),
        ("truncated", {
            let a = archive(&good("art"));
            a[..a.len() / 2].to_vec()
        }),
        ("not zstd", b"PK\x03\x04 definitely not an archive".to_vec()),
        ("empty", vec![]),
    ];
    for (what, bytes) in cases {
        eprintln!("case: {what}");
        assert_refused(&e, &bytes);
    }
}

fn fixture() -> Vec<u8> {
    archive(&good("art"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random bytes, zstd or not: refused, nothing left behind.
    #[test]
    fn random_bytes_are_refused(data in prop::collection::vec(any::<u8>(), 0..2048), compress in any::<bool>()) {
        let e = env();
        let bytes = if compress { zstd::encode_all(&data[..], 1).unwrap() } else { data };
        assert_refused(&e, &bytes);
    }

    /// A valid archive with flipped bytes (recompressed so the tar layer
    /// sees them): refused or, if the flips missed everything that
    /// matters, restored exactly; never anything outside the target.
    #[test]
    fn mutated_archives_never_escape(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let e = env();
        let mut raw = zstd::decode_all(&fixture()[..]).unwrap();
        for (i, b) in &flips {
            let at = i.index(raw.len());
            raw[at] ^= b | 1;
        }
        let bytes = zstd::encode_all(&raw[..], 1).unwrap();
        let tmp = e.outside.join("../m.tmp");
        std::fs::write(&tmp, &bytes).unwrap();
        let target = e.ws.join("restored");
        match unpack_archive(&tmp, &target, "art") {
            Ok(_) => prop_assert_eq!(std::fs::read(target.join("a.txt")).unwrap(), b"hi".to_vec()),
            Err(_) => prop_assert!(!target.exists()),
        }
        prop_assert!(snapshot(&e.outside).is_empty());
        let names: Vec<String> = std::fs::read_dir(&e.ws).unwrap().map(|d| d.unwrap().file_name().to_string_lossy().to_string()).collect();
        prop_assert!(names.iter().all(|n| n == "restored"), "{:?}", names);
    }
}

/// Issue 41, item 4: cargo hard-links `target/release/<bin>` to
/// `target/release/deps/<bin>-<hash>`. A file whose every name is in the
/// workspace is published (as a file, a directory or a glob match); one
/// with a name outside is still refused (the test above).
#[test]
fn hard_links_whose_every_name_is_in_the_workspace_are_published() {
    let e = env();
    let deps = e.ws.join("target/release/deps");
    write(&deps.join("app-0123abcd"), b"\x7fELF binary", 0o755);
    std::fs::hard_link(deps.join("app-0123abcd"), e.ws.join("target/release/app")).unwrap();

    // A single file: copied from the checked descriptor, the spool's copy
    // has one name, both workspace names stay as they were.
    let f = freeze(&e.ws, &e.spool, &spec("app", "target/release/app")).unwrap();
    assert!(!f.archive);
    assert_eq!(std::fs::read(&f.path).unwrap(), b"\x7fELF binary");
    let m = std::fs::metadata(&f.path).unwrap();
    assert_eq!((m.nlink(), m.permissions().mode() & 0o777), (1, 0o444));
    let ws_meta = std::fs::metadata(e.ws.join("target/release/app")).unwrap();
    assert_eq!((ws_meta.nlink(), ws_meta.permissions().mode() & 0o777), (2, 0o755), "the step's file is untouched");

    // A directory holding one name, the other elsewhere in the workspace.
    let f = freeze(&e.ws, &e.spool, &spec("deps", "target/release/deps")).unwrap();
    let out = e.ws.join("restored-deps");
    unpack_archive(&f.path, &out, "deps").unwrap();
    assert_eq!(std::fs::read(out.join("app-0123abcd")).unwrap(), b"\x7fELF binary");

    // A glob matching both names of one file.
    write(&e.ws.join("b/x.bin"), b"twice", 0o644);
    std::fs::hard_link(e.ws.join("b/x.bin"), e.ws.join("b/y.bin")).unwrap();
    let f = freeze(&e.ws, &e.spool, &spec("bins", "b/*.bin")).unwrap();
    let out = e.ws.join("restored-bins");
    unpack_archive(&f.path, &out, "bins").unwrap();
    assert_eq!(std::fs::read(out.join("b/x.bin")).unwrap(), b"twice");
    assert_eq!(std::fs::read(out.join("b/y.bin")).unwrap(), b"twice");
}
