//! Pack/unpack throughput on the bench corpus, next to `tar --zstd`.
//!
//! `cargo run --release -p kiln-cache --example throughput [files] [MB]`;
//! prints `name: value` lines.

use std::fs;
use std::process::Command;
use std::time::Instant;

use kiln_cache::{Limits, pack, unpack};

fn main() {
    let mut args = std::env::args().skip(1);
    let files: u64 = args.next().map(|a| a.parse().unwrap()).unwrap_or(20_000);
    let mb: u64 = args.next().map(|a| a.parse().unwrap()).unwrap_or(500);
    let tmp = tempfile::tempdir_in(std::env::var("TMPDIR").unwrap_or("/var/tmp".into())).unwrap();
    let src = tmp.path().join("src");
    let tree = kiln_cache::corpus::make_tree(&src, files, mb * 1_000_000).unwrap();
    println!("tree: {tree:?}");
    let sync = || {
        let _ = Command::new("sync").status();
    };
    sync();

    let archive = tmp.path().join("a.kiln.tar.zst");
    let t = Instant::now();
    let packed = pack(&[("target".to_string(), src.clone())], fs::File::create(&archive).unwrap(), 3).unwrap();
    println!("kiln_pack_ms: {:.0}", t.elapsed().as_secs_f64() * 1000.0);
    println!("kiln_archive_bytes: {}", packed.archive_bytes);

    let tarball = tmp.path().join("a.tar.zst");
    let t = Instant::now();
    let st = Command::new("tar").arg("--zstd").arg("-cf").arg(&tarball).arg("-C").arg(&src).arg(".").status().unwrap();
    assert!(st.success());
    println!("tar_c_zstd_ms: {:.0}", t.elapsed().as_secs_f64() * 1000.0);
    println!("tar_archive_bytes: {}", fs::metadata(&tarball).unwrap().len());
    sync();

    for round in 0..2 {
        let out = tmp.path().join(format!("out{round}/target"));
        let t = Instant::now();
        unpack(
            std::io::BufReader::new(fs::File::open(&archive).unwrap()),
            std::slice::from_ref(&out),
            &["target".to_string()],
            &Limits::default(),
        )
        .unwrap();
        println!("kiln_unpack_ms: {:.0}", t.elapsed().as_secs_f64() * 1000.0);
        sync();
        let x = tmp.path().join(format!("x{round}"));
        fs::create_dir(&x).unwrap();
        let t = Instant::now();
        let st = Command::new("tar").arg("--zstd").arg("-xf").arg(&archive).arg("-C").arg(&x).status().unwrap();
        assert!(st.success());
        println!("tar_x_zstd_same_archive_ms: {:.0}", t.elapsed().as_secs_f64() * 1000.0);
        sync();
    }
}
