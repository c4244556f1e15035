//! Export (issue 41, item 5): an archive as a `.tar.gz` that plain `tar`
//! unpacks, or a `.zip` that Python's `zipfile` unpacks, to the packed
//! tree; a hostile archive is refused, as by `unpack`.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use kiln_cache::{CacheError, EntryKind, ExportFormat, Limits, export, pack};
use tar::EntryType;

use super::common::{Member, Node, build, entry, manifest, members_for, snapshot};

fn tree(src: &Path) {
    fs::create_dir_all(src.join("bin")).unwrap();
    fs::create_dir_all(src.join("share/doc/empty")).unwrap();
    fs::write(src.join("bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
    fs::set_permissions(src.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(src.join("share/doc/README"), b"read me\n".repeat(1000)).unwrap();
    let long = "n".repeat(150);
    fs::write(src.join("share").join(&long), b"a long name").unwrap();
    symlink("bin/tool", src.join("tool")).unwrap();
}

fn packed(src: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    pack(&[("dist".to_string(), src.to_path_buf())], &mut out, 3).unwrap();
    out
}

fn exported(archive: &[u8], format: ExportFormat) -> Result<(Vec<u8>, kiln_cache::Exported), CacheError> {
    let mut out = std::io::Cursor::new(Vec::new());
    let e = export(archive, "dist", &mut out, format, 1_700_000_000, &Limits::default())?;
    Ok((out.into_inner(), e))
}

#[test]
fn a_tar_gz_that_plain_tar_unpacks_to_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    let (bytes, e) = exported(&packed(&src), ExportFormat::TarGz).unwrap();
    assert_eq!(e.entries, snapshot(&src).len() as u64);
    let file = tmp.path().join("dist.tar.gz");
    fs::write(&file, &bytes).unwrap();
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let st = Command::new("tar").arg("-xzf").arg(&file).arg("-C").arg(&out).status().unwrap();
    assert!(st.success());
    assert_eq!(snapshot(&out), snapshot(&src));
}

#[test]
fn a_zip_that_python_unpacks_to_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    let (bytes, _) = exported(&packed(&src), ExportFormat::Zip).unwrap();
    let file = tmp.path().join("dist.zip");
    fs::write(&file, &bytes).unwrap();
    let out = tmp.path().join("out");
    let st = Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&file).arg(&out).status().unwrap();
    assert!(st.success());
    let (got, want) = (snapshot(&out), snapshot(&src));
    // zipfile writes neither modes nor links: compare names and contents.
    let files = |s: &std::collections::BTreeMap<String, Node>| {
        s.iter()
            .filter_map(|(k, v)| match v {
                Node::File { sha256, .. } => Some((k.clone(), sha256.clone())),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // Python's extractor writes a link as a file holding its target.
    let mut got_files = files(&got);
    got_files.retain(|(k, _)| k != "tool");
    assert_eq!(got_files, files(&want));
    assert!(got.contains_key("share/doc/empty"), "empty directories are kept");
    // `unzip`-style readers see the link and the modes in the external attributes.
    let check = "import sys, zipfile, stat\nz = zipfile.ZipFile(sys.argv[1])\ni = z.getinfo('tool')\nprint(stat.S_ISLNK(i.external_attr >> 16), z.read('tool').decode(), oct((z.getinfo('bin/tool').external_attr >> 16) & 0o777))";
    let o = Command::new("python3").args(["-c", check]).arg(&file).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "True bin/tool 0o755");
}

#[test]
fn a_traversal_entry_or_a_bad_digest_is_refused() {
    let content = b"hello".as_slice();
    let good = manifest(&["dist"], vec![entry("", EntryKind::Dir, b""), entry("x", EntryKind::File, content)]);
    let mut members = members_for(&good, &|_| content.to_vec());
    assert!(exported(&build(&members), ExportFormat::TarGz).is_ok(), "the baseline exports");
    // A member stored under a climbing name.
    members[2] = Member::file("0/../../x", content);
    assert!(matches!(exported(&build(&members), ExportFormat::TarGz), Err(CacheError::Refused(_))));
    // Listed and stored under a climbing name.
    let bad = manifest(&["dist"], vec![entry("", EntryKind::Dir, b""), entry("../x", EntryKind::File, content)]);
    let members = members_for(&bad, &|_| content.to_vec());
    for f in [ExportFormat::TarGz, ExportFormat::Zip] {
        assert!(matches!(exported(&build(&members), f), Err(CacheError::Refused(_))));
    }
    // Other bytes than the manifest's digest.
    let members = members_for(&good, &|_| b"HELLO".to_vec());
    assert!(matches!(exported(&build(&members), ExportFormat::Zip), Err(CacheError::Corrupt(_))));
    // A hard link member.
    let mut members = members_for(&good, &|_| content.to_vec());
    members[2] = Member::link("0/x", EntryType::Link, "/etc/passwd");
    assert!(exported(&build(&members), ExportFormat::TarGz).is_err());
}
