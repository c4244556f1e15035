//! hash_inputs and cache_key.

use std::fs;
use std::os::unix::fs::symlink;

use kiln_cache::{CacheError, KeyParts, cache_key, hash_inputs};

use super::common::sha;

#[test]
fn hash_inputs_literals_patterns_and_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    fs::create_dir_all(r.join("crates/a/src")).unwrap();
    fs::create_dir_all(r.join("crates/b")).unwrap();
    fs::create_dir_all(r.join("src/deep/er")).unwrap();
    fs::write(r.join("Cargo.lock"), b"lock").unwrap();
    fs::write(r.join("crates/a/Cargo.toml"), b"a").unwrap();
    fs::write(r.join("crates/b/Cargo.toml"), b"b").unwrap();
    fs::write(r.join("crates/a/src/lib.rs"), b"lib").unwrap();
    fs::write(r.join("src/main.rs"), b"main").unwrap();
    fs::write(r.join("src/deep/er/x.rs"), b"x").unwrap();
    fs::write(r.join("src/deep/notes.txt"), b"n").unwrap();
    // Symlinked directories are not descended by patterns.
    symlink("src", r.join("srclink")).unwrap();
    let inputs: Vec<String> =
        ["Cargo.lock", "crates/*/Cargo.toml", "**/*.rs", "missing.txt", "nothing/**/*.zz", "src/**/x.rs"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let got = hash_inputs(r, &inputs).unwrap();
    let want: Vec<(String, String)> = [
        ("Cargo.lock", sha(b"lock")),
        ("crates/a/Cargo.toml", sha(b"a")),
        ("crates/b/Cargo.toml", sha(b"b")),
        ("crates/a/src/lib.rs", sha(b"lib")),
        ("src/deep/er/x.rs", sha(b"x")),
        ("src/main.rs", sha(b"main")),
        ("missing.txt", "absent".to_string()),
        ("nothing/**/*.zz", "absent".to_string()),
        ("src/deep/er/x.rs", sha(b"x")),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b))
    .collect();
    assert_eq!(got, want);
    // Content changes change the digest.
    fs::write(r.join("crates/b/Cargo.toml"), b"b2").unwrap();
    let again = hash_inputs(r, &inputs).unwrap();
    assert_ne!(again, got);
    assert_eq!(again[2].1, sha(b"b2"));
}

#[test]
fn hash_inputs_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("ws");
    fs::create_dir_all(r.join("dir")).unwrap();
    fs::write(tmp.path().join("secret"), b"s").unwrap();
    symlink("../secret", r.join("escape")).unwrap();
    for bad in ["../secret", "/etc/passwd", "a/../../secret", "./x", "dir", "escape", "*scape"] {
        let r = hash_inputs(&r, &[bad.to_string()]);
        assert!(matches!(r, Err(CacheError::Refused(_))), "{bad}: {r:?}");
    }
}

fn parts() -> KeyParts {
    KeyParts {
        namespace: "forge/owner/repo".into(),
        os: "linux".into(),
        arch: "x86_64".into(),
        image: "host".into(),
        kind: "cargo".into(),
        version: "1".into(),
        paths: vec!["target".into(), "~/.cargo/registry".into()],
        inputs: vec![("Cargo.lock".into(), "absent".into())],
    }
}

#[test]
fn cache_key_is_stable() {
    let k = cache_key(&parts());
    assert_eq!(k.len(), 64);
    assert_eq!(k, cache_key(&parts().clone()));
    // A fixed vector: changing the encoding changes every key in the world.
    assert_eq!(k, FIXED);
}

/// Format 2 (issue 41, item 4: links kept whatever their target) changed
/// every key on purpose: an older agent, which refuses such links, never
/// looks an entry of a newer one up.
const FIXED: &str = "fae7dbf66a82e171b4f7cb6522d8a45cf574867166aa8cb5f995013f84512827";

type Change = Box<dyn Fn(&mut KeyParts)>;

#[test]
fn cache_key_changes_with_every_part() {
    let base = cache_key(&parts());
    let variants: Vec<Change> = vec![
        Box::new(|p| p.namespace.push('x')),
        Box::new(|p| p.os = "macos".into()),
        Box::new(|p| p.arch = "aarch64".into()),
        Box::new(|p| p.image = "sha256:abc".into()),
        Box::new(|p| p.kind = "npm".into()),
        Box::new(|p| p.version = "2".into()),
        Box::new(|p| p.paths.push("more".into())),
        Box::new(|p| p.paths.reverse()),
        Box::new(|p| p.paths = vec!["target~/.cargo/registry".into()]),
        Box::new(|p| p.inputs.clear()),
        Box::new(|p| p.inputs[0].1 = "0".repeat(64)),
        Box::new(|p| p.inputs[0].0 = "Cargo.toml".into()),
        Box::new(|p| p.inputs.push(("a".into(), "b".into()))),
        // Moving bytes between fields must not collide.
        Box::new(|p| {
            p.os = "linuxx".into();
            p.arch = "86_64".into();
        }),
        Box::new(|p| {
            p.paths = vec![];
            p.inputs.insert(0, ("target".into(), "~/.cargo/registry".into()));
        }),
    ];
    let mut seen = std::collections::HashSet::new();
    seen.insert(base.clone());
    for (i, v) in variants.iter().enumerate() {
        let mut p = parts();
        v(&mut p);
        let k = cache_key(&p);
        assert!(seen.insert(k), "variant {i} collides");
    }
}

#[test]
fn prefix_key_ignores_input_contents_only() {
    use kiln_cache::prefix_key;
    let base = prefix_key(&parts());
    assert_ne!(base, cache_key(&parts()), "a prefix never equals a key");
    let mut p = parts();
    p.inputs[0].1 = "0".repeat(64);
    assert_eq!(prefix_key(&p), base, "other input contents: same prefix");
    let changes: Vec<Change> = vec![
        Box::new(|p| p.namespace.push('x')),
        Box::new(|p| p.image = "sha256:abc".into()),
        Box::new(|p| p.kind = "npm".into()),
        Box::new(|p| p.version = "2".into()),
        Box::new(|p| p.paths.push("more".into())),
        Box::new(|p| p.inputs[0].0 = "Cargo.toml".into()),
    ];
    for (i, c) in changes.iter().enumerate() {
        let mut p = parts();
        c(&mut p);
        assert_ne!(prefix_key(&p), base, "change {i} keeps the prefix");
    }
}
