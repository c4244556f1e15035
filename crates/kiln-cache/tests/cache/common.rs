//! Helpers: tree snapshots, test environments and raw archive building.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kiln_cache::{EntryKind, MANIFEST_NAME, Manifest, ManifestEntry};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File { mode: u32, sha256: String, len: u64 },
    Dir { mode: u32 },
    Symlink { target: String },
    Other,
}

/// Every path under `dir` (not following symlinks), relative, with what it is.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, Node>) {
    let mut names: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let child = if rel.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{rel}/{}", name.to_string_lossy())
        };
        let meta = fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).unwrap().to_string_lossy().into_owned();
            out.insert(child, Node::Symlink { target });
        } else if meta.is_dir() {
            out.insert(child.clone(), Node::Dir { mode });
            walk(&path, &child, out);
        } else if meta.is_file() {
            let data = fs::read(&path).unwrap();
            out.insert(child, Node::File { mode, sha256: hex::encode(Sha256::digest(&data)), len: data.len() as u64 });
        } else {
            out.insert(child, Node::Other);
        }
    }
}

/// `tmp/base/work/target` with stale contents, plus a sentinel next to it.
pub struct Env {
    pub tmp: tempfile::TempDir,
    pub target: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("base/work");
        let target = work.join("target");
        fs::create_dir_all(target.join("olddir")).unwrap();
        fs::write(target.join("old.txt"), b"stale").unwrap();
        fs::write(target.join("olddir/x"), b"stale x").unwrap();
        fs::write(tmp.path().join("base/sentinel"), b"keep").unwrap();
        Env { tmp, target }
    }

    pub fn snapshot(&self) -> BTreeMap<String, Node> {
        snapshot(self.tmp.path())
    }

    /// The escape destination used by hostile archives (absolute form).
    pub fn escape(&self) -> PathBuf {
        self.tmp.path().join("escaped")
    }
}

/// Unpacks into a fresh `Env` and asserts the failure left everything as it was.
pub fn assert_refused(archive: &[u8], declared: &[&str], limits: &kiln_cache::Limits) -> kiln_cache::CacheError {
    let env = Env::new();
    let before = env.snapshot();
    let declared: Vec<String> = declared.iter().map(|s| s.to_string()).collect();
    let targets = vec![env.target.clone(); 1]
        .into_iter()
        .chain((1..declared.len()).map(|i| env.target.with_file_name(format!("t{i}"))))
        .collect::<Vec<_>>();
    let r = kiln_cache::unpack(archive, &targets, &declared, limits);
    let err = match r {
        Ok(u) => panic!("hostile archive was accepted: {u:?}"),
        Err(e) => e,
    };
    assert!(!matches!(err, kiln_cache::CacheError::Io(_)), "expected a refusal, got an i/o error: {err}");
    assert_eq!(env.snapshot(), before, "unpack changed the filesystem: {err}");
    err
}

/// One raw tar member.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: Vec<u8>,
    pub ty: tar::EntryType,
    pub mode: u32,
    pub data: Vec<u8>,
    pub link: Option<Vec<u8>>,
    /// Header size if it should differ from `data.len()`.
    pub size: Option<u64>,
}

impl Member {
    pub fn file(name: &str, data: &[u8]) -> Member {
        Member {
            name: name.as_bytes().to_vec(),
            ty: tar::EntryType::Regular,
            mode: 0o644,
            data: data.to_vec(),
            link: None,
            size: None,
        }
    }
    pub fn dir(name: &str) -> Member {
        Member { ty: tar::EntryType::Directory, mode: 0o755, ..Member::file(name, b"") }
    }
    pub fn link(name: &str, ty: tar::EntryType, target: &str) -> Member {
        Member { ty, mode: 0o777, link: Some(target.as_bytes().to_vec()), ..Member::file(name, b"") }
    }
    pub fn special(name: &str, ty: tar::EntryType) -> Member {
        Member { ty, ..Member::file(name, b"") }
    }
    pub fn manifest(m: &Manifest) -> Member {
        Member::file(MANIFEST_NAME, &serde_json::to_vec(m).unwrap())
    }
}

/// Raw header: names are written as given (no checks by the tar crate).
pub fn header(m: &Member) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(m.ty);
    h.set_mode(m.mode);
    h.set_size(m.size.unwrap_or(m.data.len() as u64));
    h.set_mtime(0);
    {
        let old = h.as_old_mut();
        assert!(m.name.len() <= 100, "test names must fit the header");
        old.name[..m.name.len()].copy_from_slice(&m.name);
        if let Some(l) = &m.link {
            old.linkname[..l.len()].copy_from_slice(l);
        }
    }
    h.set_cksum();
    h
}

/// An uncompressed tar stream of the members (with the end marker).
pub fn tar_bytes(members: &[Member]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for m in members {
        b.append(&header(m), &m.data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

/// A zstd-compressed archive of the members.
pub fn build(members: &[Member]) -> Vec<u8> {
    zstd(&tar_bytes(members))
}

pub fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

pub fn entry(path: &str, kind: EntryKind, data: &[u8]) -> ManifestEntry {
    ManifestEntry {
        root: 0,
        path: path.to_string(),
        kind,
        mode: match kind {
            EntryKind::File => 0o644,
            EntryKind::Dir => 0o755,
            EntryKind::Symlink => 0o777,
        },
        size: if kind == EntryKind::File { data.len() as u64 } else { 0 },
        sha256: (kind == EntryKind::File).then(|| sha(data)),
        target: None,
    }
}

pub fn manifest(roots: &[&str], entries: Vec<ManifestEntry>) -> Manifest {
    Manifest {
        format: kiln_cache::FORMAT_VERSION,
        roots: roots.iter().map(|s| s.to_string()).collect(),
        total_bytes: entries.iter().map(|e| e.size).sum(),
        entries,
        left_out: Default::default(),
    }
}

/// The members matching a manifest (file contents from `data`).
pub fn members_for(m: &Manifest, data: &dyn Fn(&str) -> Vec<u8>) -> Vec<Member> {
    let mut out = vec![Member::manifest(m)];
    for e in &m.entries {
        let name = if e.path.is_empty() { e.root.to_string() } else { format!("{}/{}", e.root, e.path) };
        let mut mem = match e.kind {
            EntryKind::File => Member::file(&name, &data(&e.path)),
            EntryKind::Dir => Member::dir(&name),
            EntryKind::Symlink => Member::link(&name, tar::EntryType::Symlink, e.target.as_deref().unwrap()),
        };
        mem.mode = e.mode;
        out.push(mem);
    }
    out
}
