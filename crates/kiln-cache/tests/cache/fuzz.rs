//! Random bytes and mutated archives never panic, never leave staging
//! directories and never touch the targets when they fail.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::sync::OnceLock;

use kiln_cache::{Limits, pack, unpack};
use proptest::prelude::*;

use super::common::{Env, Node, snapshot, zstd};

struct Fixture {
    archive: Vec<u8>,
    tar: Vec<u8>,
    tree: BTreeMap<String, Node>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("d/e")).unwrap();
        fs::write(src.join("d/e/f.txt"), b"some contents").unwrap();
        fs::write(src.join("g.bin"), vec![1u8; 3000]).unwrap();
        symlink("d/e/f.txt", src.join("l")).unwrap();
        let mut archive = Vec::new();
        pack(&[("cache".to_string(), src.clone())], &mut archive, 3).unwrap();
        let tar = zstd::decode_all(&archive[..]).unwrap();
        Fixture { archive, tar, tree: snapshot(&src) }
    })
}

fn check(archive: &[u8]) {
    let env = Env::new();
    let before = env.snapshot();
    let limits = Limits { max_expanded_bytes: 1 << 20, max_entries: 100, max_path_bytes: 4096, deadline: None };
    match unpack(archive, std::slice::from_ref(&env.target), &["cache".to_string()], &limits) {
        Err(_) => assert_eq!(env.snapshot(), before),
        Ok(_) => {
            // Accepted only if it restores exactly the packed tree.
            assert_eq!(snapshot(&env.target), fixture().tree);
            let mut after = env.snapshot();
            after.retain(|k, _| !k.starts_with("base/work/target"));
            let mut before = before;
            before.retain(|k, _| !k.starts_with("base/work/target"));
            assert_eq!(after, before);
        }
    }
}

fn mutate(mut data: Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(i, b) in flips {
        if !data.is_empty() {
            let i = i % data.len();
            data[i] ^= b.max(1);
        }
    }
    if let Some(c) = cut {
        data.truncate(c % (data.len() + 1));
    }
    data
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(data in prop::collection::vec(any::<u8>(), 0..4096), compress in any::<bool>()) {
        let data = if compress { zstd(&data) } else { data };
        check(&data);
    }

    #[test]
    fn mutated_compressed_archive(
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<usize>()),
    ) {
        check(&mutate(fixture().archive.clone(), &flips, cut));
    }

    #[test]
    fn mutated_tar_recompressed(
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in prop::option::of(any::<usize>()),
    ) {
        check(&zstd(&mutate(fixture().tar.clone(), &flips, cut)));
    }
}

#[test]
fn the_fixture_round_trips() {
    check(&fixture().archive);
    let env = Env::new();
    unpack(&fixture().archive[..], std::slice::from_ref(&env.target), &["cache".to_string()], &Limits::default())
        .unwrap();
    assert_eq!(snapshot(&env.target), fixture().tree);
}
