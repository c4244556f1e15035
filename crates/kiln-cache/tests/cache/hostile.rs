//! A hostile corpus: every archive is refused and leaves no trace.

use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_cache::{CacheError, EntryKind, Limits, Manifest, ManifestEntry, unpack};
use tar::EntryType;

use super::common::{Env, Member, assert_refused, build, entry, manifest, members_for, snapshot, tar_bytes, zstd};

const CONTENT: &[u8] = b"hello";

/// A small valid archive: root, dir, file, internal symlink.
fn good_manifest() -> Manifest {
    let mut link = entry("sub/link", EntryKind::Symlink, b"");
    link.target = Some("../file.txt".into());
    manifest(
        &["cache"],
        vec![
            entry("", EntryKind::Dir, b""),
            entry("sub", EntryKind::Dir, b""),
            entry("file.txt", EntryKind::File, CONTENT),
            link,
        ],
    )
}

fn good_members() -> Vec<Member> {
    members_for(&good_manifest(), &|_| CONTENT.to_vec())
}

fn default_limits() -> Limits {
    Limits::default()
}

#[test]
fn the_baseline_archive_is_accepted() {
    // The hostile cases below are variations of this archive: it must pass,
    // so their failures come from what they change.
    let env = Env::new();
    let archive = build(&good_members());
    let u = unpack(&archive[..], std::slice::from_ref(&env.target), &["cache".to_string()], &default_limits()).unwrap();
    assert_eq!(u.entries, 4);
    let snap = snapshot(&env.target);
    assert_eq!(snap.len(), 3);
    assert_eq!(std::fs::read(env.target.join("sub/link")).unwrap(), CONTENT);
}

fn with_extra(extra: Vec<ManifestEntry>, members: Vec<Member>) -> Vec<u8> {
    let mut m = good_manifest();
    m.entries.extend(extra);
    m.total_bytes = m.entries.iter().map(|e| e.size).sum();
    let mut all = members_for(&m, &|_| CONTENT.to_vec());
    all.truncate(1 + good_manifest().entries.len());
    all.extend(members);
    build(&all)
}

#[test]
fn path_traversal() {
    // Listed under an innocent name, stored under a climbing one.
    let a = with_extra(vec![entry("x", EntryKind::File, CONTENT)], vec![Member::file("0/../../../x", CONTENT)]);
    assert_refused(&a, &["cache"], &default_limits());
    // Listed and stored under the climbing name.
    let a =
        with_extra(vec![entry("../../../x", EntryKind::File, CONTENT)], vec![Member::file("0/../../../x", CONTENT)]);
    assert!(matches!(assert_refused(&a, &["cache"], &default_limits()), CacheError::Refused(_)));
    // Inside a path.
    let a =
        with_extra(vec![entry("sub/../../x", EntryKind::File, CONTENT)], vec![Member::file("0/sub/../../x", CONTENT)]);
    assert_refused(&a, &["cache"], &default_limits());
}

#[test]
fn absolute_path() {
    let env = Env::new();
    let abs = env.escape().join("x");
    let abs = abs.to_str().unwrap();
    let a = with_extra(vec![entry("x", EntryKind::File, CONTENT)], vec![Member::file(abs, CONTENT)]);
    assert_refused(&a, &["cache"], &default_limits());
    let a = with_extra(vec![entry(abs, EntryKind::File, CONTENT)], vec![Member::file(&format!("0/{abs}"), CONTENT)]);
    assert_refused(&a, &["cache"], &default_limits());
}

/// A link leaving the root (issue 41, item 4: a venv's `bin/python ->
/// /usr/bin/python3`) is restored as that link and never followed:
/// nothing is written where it points.
#[test]
fn a_symlink_leaving_the_root_is_restored_as_a_link_and_never_followed() {
    for target in ["../../etc", "..", "/etc", "sub/../..", "../sub/../..", "../../escaped"] {
        let env = Env::new();
        let mut e = entry("link", EntryKind::Symlink, b"");
        e.target = Some(target.into());
        let a = with_extra(vec![e], vec![Member::link("0/link", EntryType::Symlink, target)]);
        unpack(&a[..], std::slice::from_ref(&env.target), &["cache".to_string()], &default_limits()).unwrap();
        assert_eq!(std::fs::read_link(env.target.join("link")).unwrap(), std::path::Path::new(target));
        assert!(!env.escape().exists(), "{target}: nothing made where the link points");
    }
    // The manifest says an inner target, the member another one.
    let mut e = entry("link", EntryKind::Symlink, b"");
    e.target = Some("file.txt".into());
    let a = with_extra(vec![e], vec![Member::link("0/link", EntryType::Symlink, "../../etc")]);
    assert_refused(&a, &["cache"], &default_limits());
    // An empty target, or one with a NUL, is not a link pack makes.
    for bad in ["", "a\0b"] {
        let mut e = entry("link", EntryKind::Symlink, b"");
        e.target = Some(bad.into());
        let a = with_extra(vec![e], vec![Member::link("0/link", EntryType::Symlink, "x")]);
        assert!(matches!(assert_refused(&a, &["cache"], &default_limits()), CacheError::Refused(_)), "{bad:?}");
    }
}

#[test]
fn file_written_through_a_symlinked_directory() {
    // A link inside the root and links leaving it, then a file written
    // through each: refused, nothing written anywhere.
    for (target, extra) in [("sub", "d"), ("../..", "d"), ("/tmp", "d"), ("../../escaped", "d")] {
        let mut l = entry(extra, EntryKind::Symlink, b"");
        l.target = Some(target.into());
        let f = entry(&format!("{extra}/x"), EntryKind::File, CONTENT);
        let a = with_extra(
            vec![l, f],
            vec![
                Member::link(&format!("0/{extra}"), EntryType::Symlink, target),
                Member::file(&format!("0/{extra}/x"), CONTENT),
            ],
        );
        assert_refused(&a, &["cache"], &default_limits());
    }
    // The same with a directory listed over the symlink (duplicate path).
    let mut l = entry("d", EntryKind::Symlink, b"");
    l.target = Some("sub".into());
    let a = with_extra(
        vec![l, entry("d", EntryKind::Dir, b""), entry("d/x", EntryKind::File, CONTENT)],
        vec![Member::link("0/d", EntryType::Symlink, "sub"), Member::dir("0/d"), Member::file("0/d/x", CONTENT)],
    );
    assert_refused(&a, &["cache"], &default_limits());
}

#[test]
fn hardlinks_devices_and_fifos() {
    let env = Env::new();
    let outside = env.escape();
    for m in [
        Member::link("0/h", EntryType::Link, "0/file.txt"),
        Member::link("0/h", EntryType::Link, outside.to_str().unwrap()),
        Member::special("0/h", EntryType::Char),
        Member::special("0/h", EntryType::Block),
        Member::special("0/h", EntryType::Fifo),
        Member::special("0/h", EntryType::GNUSparse),
        Member::special("0/h", EntryType::XHeader),
    ] {
        let a = with_extra(vec![entry("h", EntryKind::File, b"")], vec![m.clone()]);
        assert!(matches!(assert_refused(&a, &["cache"], &default_limits()), CacheError::Refused(_)), "{m:?}");
    }
}

/// Serves `head`, then `frame` repeated `times`, counting bytes served.
struct Bomb {
    head: io::Cursor<Vec<u8>>,
    frame: Vec<u8>,
    pos: usize,
    left: u64,
    served: Arc<AtomicU64>,
}

impl Read for Bomb {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.head.read(buf)?;
        let n = if n > 0 {
            n
        } else {
            if self.left == 0 {
                return Ok(0);
            }
            let k = (self.frame.len() - self.pos).min(buf.len());
            buf[..k].copy_from_slice(&self.frame[self.pos..self.pos + k]);
            self.pos += k;
            if self.pos == self.frame.len() {
                self.pos = 0;
                self.left -= 1;
            }
            k
        };
        self.served.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

const MIB: u64 = 1024 * 1024;

/// An archive whose file `big` expands to `actual` bytes of zeros
/// (10 GB here) while costing a few hundred kilobytes, never held in memory.
fn bomb(m: &Manifest, header_size: u64, actual_mib: u64) -> (Bomb, Arc<AtomicU64>) {
    let mut members = members_for(m, &|_| Vec::new());
    let last = members.pop().unwrap();
    let mut head = tar_bytes(&members);
    head.truncate(head.len() - 1024); // drop the end marker
    let mut h = super::common::header(&last);
    h.set_size(header_size);
    h.set_cksum();
    head.extend_from_slice(h.as_bytes());
    let served = Arc::new(AtomicU64::new(0));
    let b = Bomb {
        head: io::Cursor::new(zstd(&head)),
        frame: zstd(&vec![0u8; MIB as usize]),
        pos: 0,
        left: actual_mib,
        served: served.clone(),
    };
    (b, served)
}

fn bomb_manifest(claimed: u64) -> Manifest {
    let mut big = entry("big", EntryKind::File, b"");
    big.size = claimed;
    manifest(&["cache"], vec![entry("", EntryKind::Dir, b""), big])
}

fn assert_bomb_stopped(m: &Manifest, header_size: u64, limits: &Limits) {
    let env = Env::new();
    let before = env.snapshot();
    let (b, served) = bomb(m, header_size, 10 * 1024);
    let r = unpack(b, std::slice::from_ref(&env.target), &["cache".into()], limits);
    assert!(r.is_err(), "bomb accepted");
    assert!(!matches!(r, Err(CacheError::Io(_))), "{r:?}");
    assert_eq!(env.snapshot(), before);
    // Stopped early: at most a few compressed megabytes were read of the
    // ~10 GB stream.
    let served = served.load(Ordering::Relaxed);
    assert!(served < 4 * MIB, "read {served} bytes before stopping");
}

#[test]
fn bomb_with_an_honest_manifest_above_a_small_limit() {
    let ten_gb = 10 * 1024 * MIB;
    let limits = Limits { max_expanded_bytes: MIB, ..Limits::default() };
    assert_bomb_stopped(&bomb_manifest(ten_gb), ten_gb, &limits);
}

#[test]
fn bomb_above_the_default_limit() {
    let thirty_gb = 30 * 1024 * MIB;
    assert_bomb_stopped(&bomb_manifest(thirty_gb), thirty_gb, &Limits::default());
}

#[test]
fn bomb_whose_header_lies_about_the_size() {
    // The manifest promises 1 KiB, the member header says 10 GB.
    assert_bomb_stopped(&bomb_manifest(1024), 10 * 1024 * MIB, &Limits::default());
}

#[test]
fn bomb_whose_manifest_total_lies() {
    let ten_gb = 10 * 1024 * MIB;
    let mut m = bomb_manifest(ten_gb);
    m.total_bytes = 1024;
    assert_bomb_stopped(&m, ten_gb, &Limits::default());
}

#[test]
fn bomb_of_zeros_after_the_end() {
    // A complete valid archive followed by 10 GB of zero blocks.
    let env = Env::new();
    let before = env.snapshot();
    let served = Arc::new(AtomicU64::new(0));
    let b = Bomb {
        head: io::Cursor::new(build(&good_members())),
        frame: zstd(&vec![0u8; MIB as usize]),
        pos: 0,
        left: 10 * 1024,
        served: served.clone(),
    };
    let r = unpack(b, std::slice::from_ref(&env.target), &["cache".into()], &Limits::default());
    assert!(matches!(r, Err(CacheError::Corrupt(_))), "{r:?}");
    assert_eq!(env.snapshot(), before);
    assert!(served.load(Ordering::Relaxed) < 4 * MIB);
}

#[test]
fn streamed_bytes_count_against_the_limit() {
    // Two files of 600 KiB under a 1 MiB limit: refused before the second
    // (and before anything is moved into place).
    let data = vec![7u8; 600 * 1024];
    let m = manifest(
        &["cache"],
        vec![entry("", EntryKind::Dir, b""), entry("a", EntryKind::File, &data), entry("b", EntryKind::File, &data)],
    );
    let a = build(&members_for(&m, &|_| data.clone()));
    let limits = Limits { max_expanded_bytes: MIB, ..Limits::default() };
    assert!(matches!(assert_refused(&a, &["cache"], &limits), CacheError::TooLarge(_)));
    // Just under the limit it works.
    let env = Env::new();
    let ok = Limits { max_expanded_bytes: 1200 * 1024, ..Limits::default() };
    unpack(&a[..], std::slice::from_ref(&env.target), &["cache".into()], &ok).unwrap();
}

#[test]
fn too_many_entries() {
    let mut entries = vec![entry("", EntryKind::Dir, b"")];
    for i in 0..20 {
        entries.push(entry(&format!("d{i}"), EntryKind::Dir, b""));
    }
    let m = manifest(&["cache"], entries);
    let a = build(&members_for(&m, &|_| Vec::new()));
    let limits = Limits { max_entries: 10, ..Limits::default() };
    assert!(matches!(assert_refused(&a, &["cache"], &limits), CacheError::TooLarge(_)));
    // More members than the manifest lists.
    let mut members = members_for(&good_manifest(), &|_| CONTENT.to_vec());
    for i in 0..20 {
        members.push(Member::dir(&format!("0/extra{i}")));
    }
    assert_refused(&build(&members), &["cache"], &Limits::default());
}

#[test]
fn path_too_long() {
    let long = "p".repeat(90);
    let a = with_extra(vec![entry(&long, EntryKind::File, CONTENT)], vec![Member::file(&format!("0/{long}"), CONTENT)]);
    let limits = Limits { max_path_bytes: 64, ..Limits::default() };
    assert_refused(&a, &["cache"], &limits);
}

#[test]
fn truncated_stream() {
    let a = build(&good_members());
    for cut in [0, 1, 4, a.len() / 3, a.len() / 2, a.len() - 8, a.len() - 1] {
        assert_refused(&a[..cut], &["cache"], &default_limits());
    }
    // Truncated tar inside a complete zstd stream.
    let t = tar_bytes(&good_members());
    for cut in [512, 1024, t.len() - 1536, t.len() - 1024 - 512] {
        assert_refused(&zstd(&t[..cut]), &["cache"], &default_limits());
    }
    // A member missing at the end (tar and zstd complete).
    let mut members = good_members();
    members.pop();
    assert_refused(&build(&members), &["cache"], &default_limits());
}

#[test]
fn wrong_digest_or_size() {
    let mut members = good_members();
    members[3].data = b"HELLO".to_vec(); // same size, other bytes
    assert!(matches!(assert_refused(&build(&members), &["cache"], &default_limits()), CacheError::Corrupt(_)));
    let mut m = good_manifest();
    m.entries[2].sha256 = Some("0".repeat(64));
    assert!(matches!(
        assert_refused(&build(&members_for(&m, &|_| CONTENT.to_vec())), &["cache"], &default_limits()),
        CacheError::Corrupt(_)
    ));
    let mut members = good_members();
    members[3].data = b"hello!".to_vec(); // other size
    assert_refused(&build(&members), &["cache"], &default_limits());
    // Mode or kind differing from the manifest.
    let mut members = good_members();
    members[3].mode = 0o755;
    assert_refused(&build(&members), &["cache"], &default_limits());
    let mut members = good_members();
    members[2] = Member::file("0/sub", b"");
    assert_refused(&build(&members), &["cache"], &default_limits());
}

#[test]
fn entry_not_in_the_manifest() {
    let mut members = good_members();
    members.insert(3, Member::file("0/unlisted", CONTENT));
    assert_refused(&build(&members), &["cache"], &default_limits());
    let mut members = good_members();
    members.push(Member::file("0/unlisted", CONTENT));
    assert_refused(&build(&members), &["cache"], &default_limits());
    // Out-of-order members.
    let mut members = good_members();
    members.swap(3, 4);
    assert_refused(&build(&members), &["cache"], &default_limits());
}

#[test]
fn manifest_missing_or_not_first() {
    let mut members = good_members();
    let m = members.remove(0);
    assert_refused(&build(&members), &["cache"], &default_limits());
    members.insert(1, m);
    assert_refused(&build(&members), &["cache"], &default_limits());
    // An unparsable manifest.
    let mut members = good_members();
    members[0].data = b"{not json".to_vec();
    assert!(matches!(assert_refused(&build(&members), &["cache"], &default_limits()), CacheError::Corrupt(_)));
    // A manifest claiming a huge size.
    let mut members = good_members();
    members[0].size = Some(1 << 40);
    assert_refused(&build(&members), &["cache"], &default_limits());
    // Empty archive.
    assert_refused(&build(&[]), &["cache"], &default_limits());
}

#[test]
fn roots_mismatch_and_bad_root_index() {
    let a = build(&good_members());
    assert!(matches!(assert_refused(&a, &["other"], &default_limits()), CacheError::Refused(_)));
    assert!(matches!(assert_refused(&a, &["cache", "more"], &default_limits()), CacheError::Refused(_)));
    let mut m = good_manifest();
    m.entries[2].root = 1;
    assert_refused(&build(&members_for(&m, &|_| CONTENT.to_vec())), &["cache"], &default_limits());
    // An unknown format; format 1 (the previous one) is still read.
    let mut m = good_manifest();
    m.format = kiln_cache::FORMAT_VERSION + 1;
    assert_refused(&build(&members_for(&m, &|_| CONTENT.to_vec())), &["cache"], &default_limits());
    let mut m = good_manifest();
    m.format = 1;
    let env = Env::new();
    let a = build(&members_for(&m, &|_| CONTENT.to_vec()));
    unpack(&a[..], std::slice::from_ref(&env.target), &["cache".to_string()], &default_limits()).unwrap();
}

#[test]
fn a_second_root_failing_leaves_the_first_target_alone() {
    // Root 0 is fine, root 1 has a bad digest at the very end.
    let mut m = good_manifest();
    m.roots.push("second".into());
    let mut r1 = entry("", EntryKind::Dir, b"");
    r1.root = 1;
    let mut f1 = entry("f", EntryKind::File, CONTENT);
    f1.root = 1;
    m.entries.extend([r1, f1]);
    m.total_bytes += CONTENT.len() as u64;
    let mut members = members_for(&m, &|_| CONTENT.to_vec());
    members.last_mut().unwrap().data = b"HELLO".to_vec();
    assert_refused(&build(&members), &["cache", "second"], &default_limits());
}

#[test]
fn past_its_deadline_an_unpack_leaves_nothing() {
    let env = Env::new();
    let before = env.snapshot();
    let a = build(&good_members());
    let limits = Limits { deadline: Some(std::time::Instant::now()), ..Limits::default() };
    let r = unpack(&a[..], std::slice::from_ref(&env.target), &["cache".into()], &limits);
    assert!(matches!(r, Err(CacheError::Timeout(_))), "{r:?}");
    assert_eq!(env.snapshot(), before);
}
