//! pack → unpack reproduces the tree.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use kiln_cache::{EntryKind, Limits, pack, unpack};
use sha2::{Digest, Sha256};

use super::common::{Node, snapshot};

fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// Builds the source tree; returns how many entries pack must skip.
fn make_tree(src: &Path) -> u64 {
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::create_dir_all(src.join("empty_dir")).unwrap();
    fs::write(src.join("a/b/c/deep.txt"), b"deep").unwrap();
    fs::write(src.join("empty.txt"), b"").unwrap();
    fs::write(src.join("big.bin"), pseudo_random(5 * 1024 * 1024, 42)).unwrap();
    fs::write(src.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    chmod(&src.join("run.sh"), 0o755);
    fs::write(src.join("ro.txt"), b"read only").unwrap();
    chmod(&src.join("ro.txt"), 0o444);
    chmod(&src.join("a/b"), 0o750);
    symlink("a/b/c/deep.txt", src.join("link")).unwrap();
    symlink("../../empty.txt", src.join("a/b/up")).unwrap();
    symlink("a", src.join("dirlink")).unwrap();
    // Hardlinks are stored as independent files.
    fs::hard_link(src.join("run.sh"), src.join("run2.sh")).unwrap();
    // Kept as links: absolute and escaping symlinks (never followed).
    symlink("/etc/passwd", src.join("abs")).unwrap();
    symlink("../../outside", src.join("a/esc")).unwrap();
    // Left out: a fifo, a socket.
    let st = Command::new("mkfifo").arg(src.join("fifo")).status().unwrap();
    assert!(st.success());
    let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let mut skipped = 2;
    // A character device when allowed (root).
    if Command::new("mknod")
        .arg(src.join("null"))
        .args(["c", "1", "3"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        skipped += 1;
    }
    chmod(src, 0o750);
    skipped
}

/// The source snapshot minus what pack skips.
fn expected(src: &Path) -> std::collections::BTreeMap<String, Node> {
    let mut s = snapshot(src);
    for k in ["fifo", "sock", "null"] {
        s.remove(k);
    }
    s
}

#[test]
fn round_trip_reproduces_the_tree_and_replaces_stale_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let src2 = tmp.path().join("src2");
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(src2.join("x")).unwrap();
    fs::write(src2.join("x/y"), b"second root").unwrap();
    let skipped = make_tree(&src);
    let sources = vec![
        ("target".to_string(), src.clone()),
        ("~/.cargo/registry".to_string(), src2.clone()),
        ("missing".to_string(), tmp.path().join("does-not-exist")),
    ];
    let mut out = Vec::new();
    let packed = pack(&sources, &mut out, 3).unwrap();
    assert_eq!(packed.skipped, skipped);
    assert_eq!(packed.archive_bytes, out.len() as u64);
    assert_eq!(packed.archive_sha256, hex::encode(Sha256::digest(&out)));
    let m = &packed.manifest;
    assert_eq!(m.roots, vec!["target", "~/.cargo/registry", "missing"]);
    assert!(m.entries.iter().all(|e| e.root != 2), "missing root has no entries");
    assert!(!m.entries.iter().any(|e| ["fifo", "sock", "null"].contains(&e.path.as_str())));
    let abs = m.entries.iter().find(|e| e.path == "abs").unwrap();
    assert_eq!((abs.kind, abs.target.as_deref()), (EntryKind::Symlink, Some("/etc/passwd")));
    let big = m.entries.iter().find(|e| e.path == "big.bin").unwrap();
    assert_eq!(big.kind, EntryKind::File);
    assert_eq!(big.size, 5 * 1024 * 1024);
    assert_eq!(m.total_bytes, m.entries.iter().map(|e| e.size).sum::<u64>());
    let link = m.entries.iter().find(|e| e.path == "a/b/up").unwrap();
    assert_eq!(link.target.as_deref(), Some("../../empty.txt"));
    // Compressed: the 5 MB random file dominates.
    assert!(out.len() < 6 * 1024 * 1024);

    let declared: Vec<String> = sources.iter().map(|(d, _)| d.clone()).collect();
    let limits = Limits::default();

    // Fresh targets (parents do not exist yet).
    let dst = tmp.path().join("fresh");
    let targets = vec![dst.join("t0"), dst.join("t1"), dst.join("t2")];
    let u = unpack(&out[..], &targets, &declared, &limits).unwrap();
    assert_eq!(u.entries, m.entries.len() as u64);
    assert_eq!(u.bytes, m.total_bytes);
    assert_eq!(snapshot(&targets[0]), expected(&src));
    assert_eq!(snapshot(&targets[1]), snapshot(&src2));
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&targets[0]), 0o750);
    assert_eq!(mode(&targets[0].join("run.sh")), 0o755);
    assert_eq!(mode(&targets[0].join("ro.txt")), 0o444);
    assert_eq!(fs::read(targets[0].join("link")).unwrap(), b"deep");
    assert_eq!(fs::read(targets[0].join("dirlink/b/c/deep.txt")).unwrap(), b"deep");
    assert!(!targets[2].exists(), "a root missing at pack time is not created");
    // Only the targets remain next to each other: no staging or old dirs.
    let names: Vec<_> = fs::read_dir(&dst).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // Stale targets are replaced; a target for a missing root is left alone.
    let stale = tmp.path().join("stale");
    let targets = vec![stale.join("t0"), stale.join("t1"), stale.join("t2")];
    for t in &targets {
        fs::create_dir_all(t.join("sub")).unwrap();
        fs::write(t.join("stale.txt"), b"old").unwrap();
        fs::write(t.join("big.bin"), b"old big").unwrap();
    }
    // A target that is a file (or a symlink) is replaced too.
    fs::remove_dir_all(&targets[1]).unwrap();
    fs::write(&targets[1], b"a file").unwrap();
    let t2_before = snapshot(&targets[2]);
    unpack(&out[..], &targets, &declared, &limits).unwrap();
    assert_eq!(snapshot(&targets[0]), expected(&src));
    assert_eq!(snapshot(&targets[1]), snapshot(&src2));
    assert_eq!(snapshot(&targets[2]), t2_before);
    let mut names: Vec<_> = fs::read_dir(&stale).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec!["t0", "t1", "t2"]);
}

#[test]
fn pack_of_nothing_and_of_an_empty_dir() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("empty")).unwrap();
    let sources = vec![("e".to_string(), tmp.path().join("empty"))];
    let mut out = Vec::new();
    let p = pack(&sources, &mut out, 1).unwrap();
    assert_eq!(p.manifest.entries.len(), 1);
    let t = tmp.path().join("restored");
    let u = unpack(&out[..], std::slice::from_ref(&t), &["e".to_string()], &Limits::default()).unwrap();
    assert_eq!(u, kiln_cache::Unpacked { entries: 1, bytes: 0, left_out: Default::default() });
    assert!(t.is_dir());
    assert!(snapshot(&t).is_empty());
}

#[test]
fn pack_refuses_a_file_as_a_root() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("f"), b"x").unwrap();
    let r = pack(&[("f".to_string(), tmp.path().join("f"))], Vec::new(), 1);
    assert!(matches!(r, Err(kiln_cache::CacheError::Refused(_))));
}

#[test]
fn long_paths_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let deep = src.join("d".repeat(120)).join("e".repeat(120));
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("f".repeat(150)), b"long").unwrap();
    symlink(format!("../{}", "e".repeat(120)), deep.join("l".repeat(110))).unwrap();
    let mut out = Vec::new();
    pack(&[("c".to_string(), src.clone())], &mut out, 1).unwrap();
    let t = tmp.path().join("t");
    unpack(&out[..], std::slice::from_ref(&t), &["c".to_string()], &Limits::default()).unwrap();
    assert_eq!(snapshot(&t), snapshot(&src));
}

/// A prepared copy is used only when it holds exactly the manifest: a
/// changed byte, an extra or missing file, another mode or a link all fail.
#[test]
fn verify_tree_accepts_only_the_manifests_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f.txt"), b"hello").unwrap();
    fs::write(src.join("g.bin"), pseudo_random(70_000, 7)).unwrap();
    let mut archive = Vec::new();
    pack(&[("c".into(), src.clone())], &mut archive, 3).unwrap();
    let declared = vec!["c".to_string()];
    let m = kiln_cache::read_manifest(&archive[..], &declared, &Limits::default()).unwrap();
    assert_eq!(m.entries.len(), 4);
    let fresh = |name: &str| {
        let out = tmp.path().join(name).join("c");
        unpack(&archive[..], std::slice::from_ref(&out), &declared, &Limits::default()).unwrap();
        out
    };
    let ok = fresh("ok");
    kiln_cache::verify_tree(&[("c".into(), ok.clone())], &m).unwrap();

    type Change = (&'static str, Box<dyn Fn(&Path)>);
    let changes: Vec<Change> = vec![
        ("same-size rewrite", Box::new(|t| fs::write(t.join("d/f.txt"), b"HELLO").unwrap())),
        ("extra file", Box::new(|t| fs::write(t.join("d/extra"), b"").unwrap())),
        ("missing file", Box::new(|t| fs::remove_file(t.join("g.bin")).unwrap())),
        ("mode", Box::new(|t| chmod(&t.join("d/f.txt"), 0o777))),
        ("link", Box::new(|t| symlink("/etc/passwd", t.join("d/evil")).unwrap())),
        (
            "file becomes a link",
            Box::new(|t| {
                fs::remove_file(t.join("d/f.txt")).unwrap();
                symlink("../g.bin", t.join("d/f.txt")).unwrap();
            }),
        ),
    ];
    for (i, (what, change)) in changes.iter().enumerate() {
        let t = fresh(&format!("bad{i}"));
        change(&t);
        let r = kiln_cache::verify_tree(&[("c".into(), t)], &m);
        assert!(matches!(r, Err(kiln_cache::CacheError::Corrupt(_))), "{what}: {r:?}");
    }

    // install moves prepared roots into place, replacing the targets.
    let target = tmp.path().join("ws/c");
    fs::create_dir_all(&target).unwrap();
    fs::write(target.join("stale"), b"x").unwrap();
    kiln_cache::install(vec![Some(ok.clone())], std::slice::from_ref(&target)).unwrap();
    assert!(!ok.exists() && !target.join("stale").exists());
    kiln_cache::verify_tree(&[("c".into(), target)], &m).unwrap();
}

/// Issue 45: the manifest digest is the sha256 of the manifest member's
/// bytes (what a directory artifact's provenance names); it follows the
/// tree's contents, and anything that is not an archive with a manifest
/// first is refused.
#[test]
fn the_manifest_digest_is_of_the_manifest_and_follows_the_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f.txt"), b"hello").unwrap();
    let digest_of = |src: &Path| {
        let mut archive = Vec::new();
        pack(&[("c".into(), src.to_path_buf())], &mut archive, 3).unwrap();
        (kiln_cache::manifest_digest(&archive[..], &Limits::default()).unwrap(), archive)
    };
    let (first, archive) = digest_of(&src);
    // The manifest member's own bytes, read with the tar crate.
    let dec = zstd::stream::read::Decoder::new(&archive[..]).unwrap();
    let mut ar = tar::Archive::new(dec);
    let mut member = ar.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(member.path().unwrap().to_str(), Some(kiln_cache::MANIFEST_NAME));
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut member, &mut bytes).unwrap();
    use sha2::Digest;
    assert_eq!(first, hex::encode(sha2::Sha256::digest(&bytes)));
    assert_eq!(digest_of(&src).0, first, "the same tree, the same digest");
    fs::write(src.join("d/f.txt"), b"hellO").unwrap();
    assert_ne!(digest_of(&src).0, first, "a changed byte changes the manifest");
    assert!(kiln_cache::manifest_digest(&b"not an archive"[..], &Limits::default()).is_err());
}
