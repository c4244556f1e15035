//! `kiln artifact get RUN JOB NAME (-o PATH | --extract DIR) [--format tar.gz|zip]`,
//! `kiln artifact list RUN [JOB]`.
//!
//! A directory or glob artifact is stored in Kiln's internal archive
//! format (tar+zstd, manifest first); a user never gets that (issue 41,
//! item 5): it is downloaded and verified against its sha256, then either
//! unpacked into DIR with `kiln_cache::unpack` (no `..`, no absolute
//! names, nothing written through a link, staged beside DIR and moved into
//! place only once every member verified) or converted with
//! `kiln_cache::export` into a normal `.tar.gz` or `.zip` of the tree.

use super::shared::client;
use crate::cli::Conn;
use futures::StreamExt;
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, usage};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where `kiln artifact get` puts the artifact.
pub(crate) enum To {
    /// `-o PATH` (`-` for standard output).
    Output(PathBuf),
    /// `--extract DIR`.
    Extract(PathBuf),
}

/// `kiln artifact get`: resolve the bound generation, download it with its
/// short-lived capability, verify size and sha256, then write it where asked.
pub(super) async fn get(conn: &Conn, run: &str, job: &str, name: &str, to: To, format: Option<&str>) -> CmdResult {
    let c = client(conn)?;
    let d = match c.artifact(run, job, name).await {
        Ok(d) => d,
        Err(e) if e.code() == Some(kiln_api::codes::EXPIRED) => {
            return Err(Failure {
                message: format!(
                    "artifact {job}/{name} of run {run} has expired: its bytes were deleted when its retention \
                     (`expire-in`, or the server's --artifact-expire-in) ran out; `kiln artifact list {run}` shows it"
                ),
                code: exit::REFUSED,
            });
        }
        Err(e) => return Err(e.into()),
    };
    let archive = d.kind == kiln_api::types::ARTIFACT_ARCHIVE;
    if let To::Extract(dir) = &to {
        check_extract_dir(dir)?;
    }
    match (&to, archive) {
        (To::Output(output), false) => {
            if format.is_some() {
                eprintln!(
                    "note: {job}/{name} is a single file: it is written as it is (--format is for directories and globs)"
                );
            }
            download_file(&c, &d, job, name, output).await
        }
        (To::Extract(dir), false) => {
            let staged = staging_beside(dir)?;
            let file = staged.path().join(&d.name);
            download_file(&c, &d, job, name, &file).await?;
            place(staged, dir)?;
            eprintln!("{job}/{name}: extracted into {}", dir.display());
            Ok(exit::OK)
        }
        (To::Extract(dir), true) => {
            let parent = parent_of(dir);
            let tmp = temp_in(&parent)?;
            fetch(&c, &d, job, name, tmp.path()).await?;
            let limits = kiln_cache::Limits::default();
            let f = std::fs::File::open(tmp.path())
                .map_err(|e| usage(format!("cannot read {}: {e}", tmp.path().display())))?;
            let u = kiln_cache::unpack(
                std::io::BufReader::new(f),
                std::slice::from_ref(dir),
                std::slice::from_ref(&d.name),
                &limits,
            )
            .map_err(|e| Failure {
                message: format!(
                    "artifact {job}/{name} was not extracted (nothing was written to {}): {e}",
                    dir.display()
                ),
                code: exit::REFUSED,
            })?;
            eprintln!(
                "{job}/{name} (from attempt {}): {} entries, {} bytes extracted into {}",
                d.epoch,
                u.entries.saturating_sub(1),
                u.bytes,
                dir.display()
            );
            Ok(exit::OK)
        }
        (To::Output(output), true) => {
            let format = match format {
                Some(f) => f,
                None if output.extension().is_some_and(|e| e == "zip") => "zip",
                None => "tar.gz",
            };
            let format = kiln_cache::ExportFormat::parse(format).expect("clap checked the format");
            let to_stdout = output.as_os_str() == "-";
            let dir = if to_stdout { std::env::temp_dir() } else { parent_of(output) };
            let tmp = temp_in(&dir)?;
            fetch(&c, &d, job, name, tmp.path()).await?;
            let mut out = temp_in(&dir)?;
            let f = std::fs::File::open(tmp.path())
                .map_err(|e| usage(format!("cannot read {}: {e}", tmp.path().display())))?;
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let e = kiln_cache::export(
                std::io::BufReader::new(f),
                &d.name,
                out.as_file_mut(),
                format,
                now,
                &kiln_cache::Limits::default(),
            )
            .map_err(|e| Failure {
                message: format!(
                    "artifact {job}/{name} could not be written as a .{} (nothing was written): {e}",
                    format.extension()
                ),
                code: exit::REFUSED,
            })?;
            out.as_file().sync_all().map_err(|e| usage(e.to_string()))?;
            if to_stdout {
                let mut f = out.reopen().map_err(|e| usage(e.to_string()))?;
                std::io::copy(&mut f, &mut std::io::stdout().lock())
                    .map_err(|e| usage(format!("cannot write to stdout: {e}")))?;
            } else {
                out.persist(output).map_err(|e| usage(format!("cannot write {}: {}", output.display(), e.error)))?;
                eprintln!(
                    "{job}/{name} (from attempt {}): {} entries, {} bytes -> {} (.{})",
                    d.epoch,
                    e.entries,
                    e.bytes,
                    output.display(),
                    format.extension()
                );
            }
            Ok(exit::OK)
        }
    }
}

/// The directory `p` is in ("." for a bare name).
fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A temporary file in `dir` (removed when dropped).
fn temp_in(dir: &Path) -> Result<tempfile::NamedTempFile, Failure> {
    std::fs::create_dir_all(dir).map_err(|e| usage(format!("cannot create {}: {e}", dir.display())))?;
    tempfile::Builder::new()
        .prefix(".kiln-artifact-")
        .tempfile_in(dir)
        .map_err(|e| usage(format!("cannot write in {}: {e}", dir.display())))
}

/// `--extract DIR`: DIR must not exist, or be an empty directory (it is
/// replaced as a whole: nothing of a user's is ever mixed in or removed).
fn check_extract_dir(dir: &Path) -> Result<(), Failure> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(usage(format!("cannot use {} for --extract: {e}", dir.display()))),
        Ok(m) if m.is_dir() => match std::fs::read_dir(dir).map(|mut r| r.next().is_none()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(usage(format!(
                "--extract {} is not empty: give a new (or empty) directory; nothing was written",
                dir.display()
            ))),
            Err(e) => Err(usage(format!("cannot read {}: {e}", dir.display()))),
        },
        Ok(_) => Err(usage(format!(
            "--extract {} exists and is not a directory: give a new (or empty) directory; nothing was written",
            dir.display()
        ))),
    }
}

/// A staging directory beside `dir` (same filesystem).
fn staging_beside(dir: &Path) -> Result<tempfile::TempDir, Failure> {
    let parent = parent_of(dir);
    std::fs::create_dir_all(&parent).map_err(|e| usage(format!("cannot create {}: {e}", parent.display())))?;
    tempfile::Builder::new()
        .prefix(".kiln-extract-")
        .tempdir_in(&parent)
        .map_err(|e| usage(format!("cannot write in {}: {e}", parent.display())))
}

/// Moves the staged directory to `dir` (new, or empty: replaced).
fn place(staged: tempfile::TempDir, dir: &Path) -> Result<(), Failure> {
    if std::fs::symlink_metadata(dir).is_ok() {
        std::fs::remove_dir(dir).map_err(|e| usage(format!("cannot replace {}: {e}", dir.display())))?;
    }
    let path = staged.keep();
    std::fs::rename(&path, dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&path);
        usage(format!("cannot write {}: {e}", dir.display()))
    })
}

/// Downloads `d` into the file `dest` (created), checking size and sha256;
/// on any failure `dest` is removed.
async fn fetch(
    c: &kiln_api::Client,
    d: &kiln_api::ArtifactDownload,
    job: &str,
    name: &str,
    dest: &Path,
) -> Result<(), Failure> {
    let mut f = std::fs::File::create(dest).map_err(|e| usage(format!("cannot write {}: {e}", dest.display())))?;
    let r = stream(c, d, job, name, Some(&mut f), dest).await;
    if r.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    r.map(|_| ())
}

/// Streams `d` into `file` (or standard output), checking size and
/// sha256 at the end; returns (bytes, sha256).
async fn stream(
    c: &kiln_api::Client,
    d: &kiln_api::ArtifactDownload,
    job: &str,
    name: &str,
    mut file: Option<&mut std::fs::File>,
    shown: &Path,
) -> Result<(u64, String), Failure> {
    use sha2::{Digest, Sha256};
    let resp = c.download(&d.url).await?;
    let bar = indicatif::ProgressBar::new(d.size);
    if file.is_none() || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}")
            .expect("template"),
    );
    let mut hasher = Sha256::new();
    let mut n: u64 = 0;
    let mut body = resp.bytes_stream();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Failure { message: format!("download failed: {e}"), code: exit::UNAVAILABLE })?;
        hasher.update(&chunk);
        n += chunk.len() as u64;
        match file.as_mut() {
            Some(f) => f.write_all(&chunk).map_err(|e| usage(format!("cannot write {}: {e}", shown.display())))?,
            None => out.write_all(&chunk).map_err(|e| usage(format!("cannot write to stdout: {e}")))?,
        }
        bar.set_position(n);
    }
    bar.finish_and_clear();
    let sha = hex::encode(hasher.finalize());
    if n != d.size || sha != d.sha256 {
        return Err(Failure {
            message: format!(
                "artifact {job}/{name} failed verification: expected {} bytes sha256 {}, got {n} bytes sha256 {sha}; nothing was written",
                d.size, d.sha256
            ),
            code: exit::UNAVAILABLE,
        });
    }
    if let Some(f) = file {
        f.sync_all().map_err(|e| usage(e.to_string()))?;
    }
    Ok((n, sha))
}

/// A single file to `output` (`-`: standard output), as it always was:
/// written beside it and renamed into place once verified.
async fn download_file(
    c: &kiln_api::Client,
    d: &kiln_api::ArtifactDownload,
    job: &str,
    name: &str,
    output: &Path,
) -> CmdResult {
    if output.as_os_str() == "-" {
        stream(c, d, job, name, None, output).await?;
        return Ok(exit::OK);
    }
    let tmp = output.with_file_name(format!(
        ".{}.kiln-partial",
        output.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "artifact".into())
    ));
    fetch(c, d, job, name, &tmp).await?;
    if let Err(e) = std::fs::rename(&tmp, output) {
        let _ = std::fs::remove_file(&tmp);
        return Err(usage(format!("cannot write {}: {e}", output.display())));
    }
    eprintln!("{job}/{name} (from attempt {}): {} bytes, sha256 {} -> {}", d.epoch, d.size, d.sha256, output.display());
    Ok(exit::OK)
}

/// One line of `kiln artifact list --json`: the run view's artifact with
/// its job.
#[derive(serde::Serialize)]
struct Listed<'a> {
    job: &'a str,
    #[serde(flatten)]
    artifact: &'a kiln_api::Artifact,
}

/// `kiln artifact list RUN [JOB]`: the bound artifacts of the run (or of one
/// job), from the run view.
pub(super) async fn list(conn: &Conn, run: &str, job: Option<&str>, json: bool) -> CmdResult {
    let c = client(conn)?;
    let r = c.get_run(run).await?;
    let jobs = super::logs::select_jobs(&r, job)?;
    let listed: Vec<Listed> =
        jobs.iter().flat_map(|j| j.artifacts.iter().map(|a| Listed { job: &j.name, artifact: a })).collect();
    if json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&listed).expect("json"));
        return Ok(exit::OK);
    }
    if listed.is_empty() {
        eprintln!(
            "run {} has no published artifacts{}; a job publishes with `publish:` (see docs/workflow.md)",
            r.id,
            job.map(|j| format!(" in job `{j}`")).unwrap_or_default()
        );
        return Ok(exit::OK);
    }
    let out = |s: String| kiln_cmd::outln!("{}", crate::term::for_stdout(&s));
    out(format!("{:<24} {:<24} {:>12} {:<12} {:<8} EXPIRES", "NAME", "JOB", "SIZE", "SHA256", "KIND"));
    for l in &listed {
        let a = l.artifact;
        let expiry = match (a.expired, a.expires_at) {
            (true, _) => "expired".to_string(),
            (false, Some(at)) => super::shared::when(at),
            (false, None) => "never".to_string(),
        };
        let short: String = a.sha256.chars().take(12).collect();
        out(format!("{:<24} {:<24} {:>12} {short:<12} {:<8} {expiry}", a.name, l.job, a.size, a.kind));
    }
    Ok(exit::OK)
}
