//! Issue 39, item 1: packing never follows a symbolic link out of the
//! workspace, keeps the links inside a root as links, and the content scan
//! sees every byte of every file, also across read boundaries.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use kiln_cache::{CacheError, EntryKind, Limits, Scan, Source, pack_sources, unpack};

use super::common::{Node, snapshot};

/// A workspace with a `cache` directory and, outside it, a directory
/// holding a file nobody may pack.
struct Ws {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn ws() -> Ws {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(ws.join("cache")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("shadow"), b"root:$6$not-for-you").unwrap();
    fs::write(ws.join("cache/kept"), b"kept").unwrap();
    Ws { _tmp: tmp, ws, outside }
}

fn pack_one(s: Source) -> Result<kiln_cache::Packed, CacheError> {
    pack_sources(&[s], Vec::new(), 1, None)
}

fn refused(r: Result<kiln_cache::Packed, CacheError>, what: &str) -> String {
    match r {
        Err(CacheError::Refused(m)) => m,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_root_that_is_a_symlink_out_of_the_workspace_is_refused() {
    let w = ws();
    fs::remove_dir_all(w.ws.join("cache")).unwrap();
    symlink(&w.outside, w.ws.join("cache")).unwrap();
    let m = refused(pack_one(Source::within("cache", &w.ws, "cache")), "symlinked root");
    assert!(m.contains("symbolic link") && m.contains("\"cache\""), "{m}");
    // A relative link inside the workspace is refused the same way: a root is
    // a directory, never a link.
    fs::remove_file(w.ws.join("cache")).unwrap();
    fs::create_dir(w.ws.join("real")).unwrap();
    symlink("real", w.ws.join("cache")).unwrap();
    refused(pack_one(Source::within("cache", &w.ws, "cache")), "link to a sibling");
}

#[test]
fn a_root_below_a_symlinked_directory_is_refused() {
    let w = ws();
    fs::create_dir(w.outside.join("deps")).unwrap();
    fs::write(w.outside.join("deps/loot"), b"not-for-you").unwrap();
    symlink(&w.outside, w.ws.join("up")).unwrap();
    let m = refused(pack_one(Source::within("up/deps", &w.ws, "up/deps")), "symlinked intermediate");
    assert!(m.contains("symbolic link"), "{m}");
}

#[test]
fn a_root_with_dotdot_or_absolute_is_refused() {
    let w = ws();
    for rel in ["../outside", "cache/../../outside"] {
        let m = refused(pack_one(Source::within(rel, &w.ws, rel)), rel);
        assert!(m.contains("leaves the workspace"), "{rel}: {m}");
    }
    let abs = w.outside.display().to_string();
    let m = refused(pack_one(Source::within(abs.clone(), &w.ws, &abs)), "absolute");
    assert!(m.contains("leaves the workspace"), "{m}");
}

#[test]
fn a_missing_root_has_no_entries_and_a_plain_one_packs() {
    let w = ws();
    let p = pack_one(Source::within("nope", &w.ws, "nope")).unwrap();
    assert!(p.manifest.entries.is_empty());
    let p = pack_one(Source::within("cache", &w.ws, "cache")).unwrap();
    assert_eq!(p.manifest.total_bytes, 4);
}

#[test]
fn symlinks_inside_a_root_stay_symlinks() {
    let w = ws();
    let c = w.ws.join("cache");
    fs::create_dir_all(c.join("a/b")).unwrap();
    fs::write(c.join("a/b/f"), b"payload").unwrap();
    symlink("a/b/f", c.join("to-file")).unwrap();
    symlink("a", c.join("to-dir")).unwrap();
    symlink("../b/f", c.join("a/b/self")).unwrap();
    // Leaving the root or absolute (issue 41, item 4): kept as links,
    // never followed, restored as the same links.
    symlink(&w.outside, c.join("out-abs")).unwrap();
    symlink("../../outside/shadow", c.join("out-rel")).unwrap();
    let mut out = Vec::new();
    let p = pack_sources(&[Source::within("cache", &w.ws, "cache")], &mut out, 1, None).unwrap();
    assert_eq!(p.skipped, 0);
    assert!(p.left_out.is_empty());
    let kinds: Vec<(String, EntryKind, Option<String>)> =
        p.manifest.entries.iter().map(|e| (e.path.clone(), e.kind, e.target.clone())).collect();
    assert!(kinds.contains(&("to-file".into(), EntryKind::Symlink, Some("a/b/f".into()))), "{kinds:?}");
    assert!(kinds.contains(&("to-dir".into(), EntryKind::Symlink, Some("a".into()))), "{kinds:?}");
    let abs = w.outside.display().to_string();
    assert!(kinds.contains(&("out-abs".into(), EntryKind::Symlink, Some(abs.clone()))), "{kinds:?}");
    // Only the real file's bytes are archived (once): nothing behind a link.
    assert_eq!(p.manifest.total_bytes, b"payload".len() as u64 + 4);
    let t = w.ws.join("restored");
    unpack(&out[..], std::slice::from_ref(&t), &["cache".to_string()], &Limits::default()).unwrap();
    let snap = snapshot(&t);
    assert_eq!(snap["to-file"], Node::Symlink { target: "a/b/f".into() });
    assert_eq!(snap["to-dir"], Node::Symlink { target: "a".into() });
    assert_eq!(snap["out-abs"], Node::Symlink { target: abs });
    assert_eq!(snap["out-rel"], Node::Symlink { target: "../../outside/shadow".into() });
}

/// A Python venv's shape: `bin/python -> /usr/bin/python3` (absolute, out
/// of the workspace), `bin/python3 -> python`, `lib64 -> lib`: a restore
/// gives back the same links, so a hit is a working venv.
#[test]
fn a_venv_comes_back_with_its_links() {
    let w = ws();
    let v = w.ws.join("venv");
    fs::create_dir_all(v.join("bin")).unwrap();
    fs::create_dir_all(v.join("lib/python3/site-packages")).unwrap();
    fs::write(v.join("pyvenv.cfg"), b"home = /usr/bin\n").unwrap();
    symlink("/usr/bin/python3", v.join("bin/python")).unwrap();
    symlink("python", v.join("bin/python3")).unwrap();
    symlink("lib", v.join("lib64")).unwrap();
    let mut out = Vec::new();
    pack_sources(&[Source::within("venv", &w.ws, "venv")], &mut out, 1, None).unwrap();
    let t = w.ws.join("again");
    unpack(&out[..], std::slice::from_ref(&t), &["venv".to_string()], &Limits::default()).unwrap();
    assert_eq!(snapshot(&t), snapshot(&v));
    assert_eq!(fs::read_link(t.join("bin/python")).unwrap(), Path::new("/usr/bin/python3"));
}

/// Sockets, fifos and devices cannot be archived: counted by kind, with
/// the first one named (the job's log shows it; a hit of such an entry is
/// `partial`, not `hit`).
#[test]
fn what_is_left_out_is_counted_by_kind_and_recorded_in_the_manifest() {
    let w = ws();
    let c = w.ws.join("cache");
    fs::create_dir_all(c.join("run")).unwrap();
    fs::write(c.join("keep.txt"), b"kept").unwrap();
    let _a = std::os::unix::net::UnixListener::bind(c.join("run/a.sock")).unwrap();
    let _b = std::os::unix::net::UnixListener::bind(c.join("run/b.sock")).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(c.join("pipe")).status().unwrap().success());
    let mut out = Vec::new();
    let p = pack_sources(&[Source::within("cache", &w.ws, "cache")], &mut out, 1, None).unwrap();
    assert_eq!(p.skipped, 3);
    assert_eq!((p.left_out.sockets, p.left_out.fifos, p.left_out.devices), (2, 1, 0));
    // Names sorted bytewise: `pipe` before `run/`.
    assert_eq!(p.left_out.summary(), "3 entries (2 sockets, 1 fifo); first: cache/pipe");
    assert_eq!(p.manifest.left_out, p.left_out);
    let m = kiln_cache::read_manifest(&out[..], &["cache".to_string()], &Limits::default()).unwrap();
    assert_eq!(m.left_out, p.left_out, "the restore side reads it from the archive");
    let t = w.ws.join("restored");
    unpack(&out[..], std::slice::from_ref(&t), &["cache".to_string()], &Limits::default()).unwrap();
    assert_eq!(fs::read(t.join("keep.txt")).unwrap(), b"kept");
    assert!(!t.join("pipe").exists() && t.join("run").is_dir() && !t.join("run/a.sock").exists());
}

/// A scan finding `needle`, keeping the last `needle.len() - 1` bytes.
struct Needle(&'static [u8]);

impl Scan for Needle {
    fn feed(&self, carry: &mut Vec<u8>, chunk: &[u8]) -> Option<String> {
        carry.extend_from_slice(chunk);
        let found = carry.windows(self.0.len()).any(|w| w == self.0);
        let keep = carry.len().saturating_sub(self.0.len() - 1);
        carry.drain(..keep);
        found.then(|| "the needle".to_string())
    }
}

#[test]
fn the_scan_sees_a_value_across_read_boundaries_and_names_the_file() {
    let w = ws();
    let c = w.ws.join("cache");
    fs::create_dir_all(c.join("sub")).unwrap();
    // pack reads 256 KiB at a time: the needle straddles the first boundary.
    let mut data = vec![b'x'; 256 * 1024 - 3];
    data.extend_from_slice(b"NEEDLE-VALUE");
    data.extend_from_slice(&vec![b'y'; 1000]);
    fs::write(c.join("sub/big.bin"), &data).unwrap();
    let mut out = Vec::new();
    let r = pack_sources(&[Source::within("cache", &w.ws, "cache")], &mut out, 1, Some(&Needle(b"NEEDLE-VALUE")));
    match r {
        Err(e @ CacheError::Secret { .. }) => {
            assert_eq!(e.to_string(), "`cache/sub/big.bin` holds the needle");
        }
        other => panic!("expected the scan to refuse: {other:?}"),
    }
    // Without the needle the same tree packs.
    fs::write(c.join("sub/big.bin"), vec![b'x'; 300 * 1024]).unwrap();
    pack_sources(&[Source::within("cache", &w.ws, "cache")], Vec::new(), 1, Some(&Needle(b"NEEDLE-VALUE"))).unwrap();
}

#[test]
fn a_nested_directory_swapped_for_a_link_is_never_followed() {
    // What a racing step can do at most: the walk opens every directory
    // from its parent without following links, so a link found anywhere
    // is a refusal or an entry kept as a link, never the outside's bytes.
    let w = ws();
    let c = w.ws.join("cache");
    symlink(&w.outside, c.join("d")).unwrap();
    let mut out = Vec::new();
    let p = pack_sources(&[Source::within("cache", &w.ws, "cache")], &mut out, 1, None).unwrap();
    assert!(p.manifest.entries.iter().all(|e| !e.path.starts_with("d/")));
    assert!(!out.is_empty());
    assert!(Path::new(&w.outside.join("shadow")).exists());
}
