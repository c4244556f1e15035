//! Rough pack/unpack throughput on a ~100 MB tree, next to `tar --zstd`.
//!
//! `cargo run -p kiln-cache --example throughput [level]`; prints
//! `name: value` lines.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use kiln_cache::{Limits, pack, unpack};

/// Half random, half repetitive: compresses roughly like build outputs.
fn content(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        if (seed >> 60) < 8 {
            v.extend_from_slice(&seed.to_le_bytes());
        } else {
            v.extend_from_slice(b"fn main() { println!(\"hello\"); } ");
        }
    }
    v.truncate(len);
    v
}

fn make_tree(src: &Path) -> u64 {
    let mut total = 0;
    for d in 0..20 {
        let dir = src.join(format!("deps/d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..10 {
            let data = content(400 * 1024, (d * 100 + f + 1) as u64);
            total += data.len() as u64;
            fs::write(dir.join(format!("lib{f}.rlib")), data).unwrap();
        }
        for f in 0..100 {
            let data = content(5 * 1024, (d * 1000 + f + 7) as u64);
            total += data.len() as u64;
            fs::write(dir.join(format!("small{f}.d")), data).unwrap();
        }
    }
    total
}

fn mb_s(bytes: u64, secs: f64) -> String {
    format!("{:.1} MB/s ({secs:.2} s)", bytes as f64 / 1e6 / secs)
}

fn main() {
    let level: i32 = std::env::args().nth(1).map(|l| l.parse().unwrap()).unwrap_or(3);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let total = make_tree(&src);
    println!("tree_bytes: {total}");
    println!("zstd_level: {level}");

    let archive = tmp.path().join("a.kiln.tar.zst");
    let t = Instant::now();
    let packed = pack(&[("target".to_string(), src.clone())], fs::File::create(&archive).unwrap(), level).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!("kiln_pack: {}", mb_s(total, secs));
    println!("kiln_archive_bytes: {}", packed.archive_bytes);

    let out = tmp.path().join("out/target");
    let t = Instant::now();
    unpack(fs::File::open(&archive).unwrap(), std::slice::from_ref(&out), &["target".to_string()], &Limits::default())
        .unwrap();
    println!("kiln_unpack: {}", mb_s(total, t.elapsed().as_secs_f64()));

    let tarball = tmp.path().join("a.tar.zst");
    let t = Instant::now();
    let st = Command::new("tar").arg("--zstd").arg("-cf").arg(&tarball).arg("-C").arg(&src).arg(".").status().unwrap();
    assert!(st.success());
    println!("tar_zstd_c: {}", mb_s(total, t.elapsed().as_secs_f64()));
    println!("tar_archive_bytes: {}", fs::metadata(&tarball).unwrap().len());
    let x = tmp.path().join("x");
    fs::create_dir(&x).unwrap();
    let t = Instant::now();
    let st = Command::new("tar").arg("--zstd").arg("-xf").arg(&tarball).arg("-C").arg(&x).status().unwrap();
    assert!(st.success());
    println!("tar_zstd_x: {}", mb_s(total, t.elapsed().as_secs_f64()));
}
