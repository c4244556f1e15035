//! A deterministic tree shaped like a build's `target/` or `node_modules/`
//! (many small files, a few large ones, text-like content that compresses
//! about 3×), for `kiln bench cache` and the throughput example.

use std::fs;
use std::io;
use std::path::Path;

/// xorshift64*: small, fast, deterministic.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (l + u * (h - l)).exp() as u64
    }
}

const WORDS: &[&[u8]] = &[
    b"fn ",
    b"let ",
    b"mut ",
    b"impl ",
    b"pub ",
    b"struct ",
    b"return ",
    b"self",
    b"(",
    b")",
    b"{\n",
    b"}\n",
    b"    ",
    b"::",
    b"->",
    b"Result<",
    b">",
    b"Vec<u8>",
    b"String",
    b"match ",
    b"Some(",
    b"None",
    b"Ok(",
    b"Err(",
    b"\"",
    b"0x",
    b"_",
    b".",
    b",",
    b";\n",
    b"module.exports",
    b"require(",
    b"function ",
    b"const ",
    b"var ",
];

/// `len` bytes: mostly tokens (text, symbol tables), a sixteenth noise (hashes,
/// machine code).
pub fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        let x = r.next();
        if x.is_multiple_of(16) {
            v.extend_from_slice(&r.next().to_le_bytes());
        } else {
            v.extend_from_slice(WORDS[(x >> 32) as usize % WORDS.len()]);
            if x & 0x700 == 0 {
                v.extend_from_slice(format!("{}", x >> 48).as_bytes());
            }
        }
    }
    v.truncate(len);
    v
}

/// What [`make_tree`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct Tree {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// Writes `files` files totalling about `bytes` bytes under `root` (created):
/// 98.5 % log-uniform 512 B – 64 KiB in ~32 files per directory, three
/// levels deep; the rest large (the remaining bytes split evenly).
pub fn make_tree(root: &Path, files: u64, bytes: u64) -> io::Result<Tree> {
    let mut r = Rng(0x5eed);
    let large = (files * 15 / 1000).max(1);
    let small = files - large;
    let mut t = Tree { files: 0, dirs: 0, bytes: 0 };
    let mut dir = root.to_path_buf();
    for i in 0..small {
        if i.is_multiple_of(32) {
            let d = i / 32;
            dir = root.join(format!("crate-{}/deps-{}/build-{d}", d / 64, d / 8 % 8));
            fs::create_dir_all(&dir)?;
            t.dirs += 1;
        }
        let len = r.log_uniform(512, 64 << 10);
        fs::write(dir.join(format!("unit-{i}.o")), content(len as usize, i))?;
        t.files += 1;
        t.bytes += len;
    }
    let rest = bytes.saturating_sub(t.bytes);
    let big = root.join("release");
    fs::create_dir_all(&big)?;
    t.dirs += 1;
    for i in 0..large {
        let len = rest / large;
        fs::write(big.join(format!("libdep{i}.rlib")), content(len as usize, 1_000_000 + i))?;
        t.files += 1;
        t.bytes += len;
    }
    Ok(t)
}
