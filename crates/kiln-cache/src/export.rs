//! An archive as people expect to download it (issue 41, item 5): a
//! `.tar.gz` or a `.zip` of the tree, never the internal format (whose
//! manifest stays Kiln's own).
//!
//! The archive is read once, in order, with every check `unpack` makes
//! (the manifest first and valid, each member the manifest's next entry,
//! every file's sha256, the limits): a corrupt or hostile archive is an
//! error, and the caller throws away what was written (the output is a
//! temporary file until then). Names in the output are the manifest's
//! relative paths (no `..`, not absolute: checked), below no top
//! directory: what `kiln artifact get --extract DIR` puts in DIR.

use std::io::{self, Read, Seek, Write};

use sha2::{Digest, Sha256};

use crate::unpack::{LimitReader, MAX_TRAILER, SourceReader, check_member, manifest_cap, manifest_member, next_member};
use crate::{CacheError, EntryKind, Limits, io_err};

/// The normal archive formats an export can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A gzip-compressed tar (`tar -xzf`).
    TarGz,
    /// A zip (deflated files; directories and symbolic links as zip keeps them).
    Zip,
}

impl ExportFormat {
    /// `tar.gz` (or `tgz`) and `zip`; None otherwise.
    pub fn parse(s: &str) -> Option<ExportFormat> {
        match s {
            "tar.gz" | "tgz" => Some(ExportFormat::TarGz),
            "zip" => Some(ExportFormat::Zip),
            _ => None,
        }
    }

    /// The file name extension (`tar.gz`, `zip`).
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::TarGz => "tar.gz",
            ExportFormat::Zip => "zip",
        }
    }

    /// The media type of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            ExportFormat::TarGz => "application/gzip",
            ExportFormat::Zip => "application/zip",
        }
    }
}

/// Result of [`export`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// Entries written (files, directories, symbolic links; not the root).
    pub entries: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
}

/// Writes the tree of `archive` (made by [`pack`](crate::pack) with the
/// one root `declared`) to `out` as `format`, every entry dated `mtime`
/// (seconds since 1970). Err on anything `unpack` would refuse; `out` then
/// holds a partial archive the caller must discard.
pub fn export<W: Write + Seek>(
    archive: impl Read,
    declared: &str,
    out: W,
    format: ExportFormat,
    mtime: u64,
    limits: &Limits,
) -> Result<Exported, CacheError> {
    let mut dec =
        zstd::stream::read::Decoder::new(SourceReader(archive)).map_err(|e| io_err("starting the zstd decoder", e))?;
    dec.window_log_max(27).map_err(|e| io_err("configuring the zstd decoder", e))?;
    let per_entry = 3 * 512 + 2 * limits.max_path_bytes as u64;
    let budget = limits
        .max_expanded_bytes
        .saturating_add(manifest_cap(limits))
        .saturating_add(limits.max_entries.saturating_add(2).saturating_mul(per_entry))
        .saturating_add(MAX_TRAILER);
    let mut ar = tar::Archive::new(LimitReader { inner: dec, read: 0, budget });
    let mut entries = ar.entries().map_err(|e| crate::unpack::read_err("reading the archive", e))?.raw(true);
    let manifest = manifest_member(&mut entries, &[declared.to_string()], limits)?;

    let mut sink = Sink::new(out, format, mtime)?;
    let (mut count, mut written, mut bytes) = (0usize, 0u64, 0u64);
    while let Some(mut m) = next_member(&mut entries, limits)? {
        limits.check_deadline("exporting the archive")?;
        let shown = String::from_utf8_lossy(&m.name).into_owned();
        let Some(exp) = manifest.entries.get(count) else {
            return Err(CacheError::Refused(format!("member {shown:?} is not in the manifest")));
        };
        let (kind, size) = check_member(&m, exp, limits)?;
        count += 1;
        if exp.path.is_empty() {
            continue;
        }
        match kind {
            EntryKind::Dir => sink.dir(&exp.path, exp.mode)?,
            EntryKind::Symlink => sink.symlink(&exp.path, exp.target.as_deref().unwrap_or_default())?,
            EntryKind::File => {
                if bytes.saturating_add(size) > limits.max_expanded_bytes {
                    return Err(CacheError::TooLarge(format!(
                        "member {shown:?} takes the archive past {} bytes",
                        limits.max_expanded_bytes
                    )));
                }
                let mut r = Hashing { inner: (&mut m.entry).take(size), hasher: Sha256::new(), n: 0 };
                sink.file(&exp.path, exp.mode, size, &mut r)?;
                if r.n != size {
                    return Err(CacheError::Corrupt(format!(
                        "member {shown:?} is truncated ({} of {size} bytes)",
                        r.n
                    )));
                }
                let digest = hex::encode(r.hasher.finalize());
                if Some(&digest) != exp.sha256.as_ref() {
                    return Err(CacheError::Corrupt(format!(
                        "member {shown:?}: sha256 {digest} differs from the manifest"
                    )));
                }
                bytes += size;
            }
        }
        written += 1;
    }
    crate::unpack::check_end(ar.into_inner(), count, manifest.entries.len())?;
    sink.finish()?;
    Ok(Exported { entries: written, bytes })
}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.hasher.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }
}

/// The output archive being written.
enum Sink<W: Write + Seek> {
    Tar(tar::Builder<flate2::write::GzEncoder<W>>, u64),
    Zip(Box<zip::ZipWriter<W>>, zip::DateTime),
}

fn wctx(e: io::Error) -> CacheError {
    io_err("writing the export", e)
}

fn zctx(e: zip::result::ZipError) -> CacheError {
    match e {
        zip::result::ZipError::Io(e) => wctx(e),
        e => CacheError::Io(io::Error::other(format!("writing the zip: {e}"))),
    }
}

impl<W: Write + Seek> Sink<W> {
    fn new(out: W, format: ExportFormat, mtime: u64) -> Result<Sink<W>, CacheError> {
        Ok(match format {
            ExportFormat::TarGz => {
                let gz = flate2::write::GzEncoder::new(out, flate2::Compression::new(6));
                let mut b = tar::Builder::new(gz);
                b.mode(tar::HeaderMode::Deterministic);
                Sink::Tar(b, mtime)
            }
            ExportFormat::Zip => Sink::Zip(Box::new(zip::ZipWriter::new(out)), zip_time(mtime)),
        })
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(mtime);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    fn zip_options(mode: u32, time: zip::DateTime) -> zip::write::SimpleFileOptions {
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(mode)
            .last_modified_time(time)
            .large_file(false)
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), CacheError> {
        match self {
            Sink::Tar(b, t) => {
                let mut h = Self::header(tar::EntryType::Directory, mode, 0, *t);
                b.append_data(&mut h, format!("{path}/"), io::empty()).map_err(wctx)
            }
            Sink::Zip(z, t) => z.add_directory(format!("{path}/"), Self::zip_options(mode, *t)).map_err(zctx),
        }
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), CacheError> {
        match self {
            Sink::Tar(b, t) => {
                let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0, *t);
                b.append_link(&mut h, path, target).map_err(wctx)
            }
            Sink::Zip(z, t) => z.add_symlink(path, target, Self::zip_options(0o777, *t)).map_err(zctx),
        }
    }

    fn file(&mut self, path: &str, mode: u32, size: u64, r: &mut impl Read) -> Result<(), CacheError> {
        match self {
            Sink::Tar(b, t) => {
                let mut h = Self::header(tar::EntryType::Regular, mode, size, *t);
                b.append_data(&mut h, path, r).map_err(wctx)
            }
            Sink::Zip(z, t) => {
                let o = Self::zip_options(mode, *t).large_file(size >= u32::MAX as u64);
                z.start_file(path, o).map_err(zctx)?;
                io::copy(r, z.as_mut()).map_err(wctx)?;
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<(), CacheError> {
        match self {
            Sink::Tar(b, _) => {
                let gz = b.into_inner().map_err(wctx)?;
                let mut out = gz.finish().map_err(wctx)?;
                out.flush().map_err(wctx)
            }
            Sink::Zip(z, _) => {
                let mut out = z.finish().map_err(zctx)?;
                out.flush().map_err(wctx)
            }
        }
    }
}

/// `secs` since 1970 as a zip date (UTC; zip keeps 1980 to 2107).
fn zip_time(secs: u64) -> zip::DateTime {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s) = ((rem / 3600) as u8, ((rem % 3600) / 60) as u8, (rem % 60) as u8);
    zip::DateTime::from_date_and_time(y.clamp(1980, 2107) as u16, m as u8, d as u8, h, mi, s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zip_dates_are_civil_dates() {
        // 2024-02-29 12:34:56 UTC.
        let t = zip_time(1_709_210_096);
        assert_eq!((t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()), (2024, 2, 29, 12, 34, 56));
        assert_eq!(zip_time(0).year(), 1980);
    }

    #[test]
    fn formats_parse() {
        assert_eq!(ExportFormat::parse("tar.gz"), Some(ExportFormat::TarGz));
        assert_eq!(ExportFormat::parse("tgz"), Some(ExportFormat::TarGz));
        assert_eq!(ExportFormat::parse("zip"), Some(ExportFormat::Zip));
        assert_eq!(ExportFormat::parse("tar.zst"), None);
    }
}
