//! Artifacts of one attempt (spec 000 §11, §12): restore inputs before the
//! steps, freeze and upload declared outputs after they all succeeded.
//!
//! # Restore
//! For each `assignment.restore` entry: ask the server for the producer's
//! bound generation (`restore`), stream the capability URL into a temporary
//! file beside the target (inside the workspace) while hashing, verify size
//! and sha256, then rename it into place. A 404 is the job's problem ("not
//! available"); a transfer that keeps failing or bytes that do not verify
//! are the infrastructure's. Every retry asks for a fresh download URL.
//!
//! # Publish
//! Only after every step exited 0, and after the executor killed the step
//! process groups (it kills each group when its shell exits, and `cleanup`
//! kills anything still running). Each declared output is *frozen*: moved
//! (renamed) into the agent-owned spool `<attempt>/spool/<name>`, made
//! read-only, then hashed from the spool. Then, per output: `create_upload`
//! → parts of `part_size` bytes, each streamed from the spool file through
//! the agent-wide [`RateLimiter`] and retried with identical bytes (the
//! bytes of each part are hashed while sent; a retry whose bytes differ
//! from the first send aborts the upload) → `seal`, which the server only
//! grants after verifying the stored object (local store: size and sha256;
//! S3: size and the multipart ETag of the parts the store checked, the
//! sha256 being this attempt's word that consumers check as they download).
//!
//! # Directories and globs (issue 16)
//! A `path` that is a directory, or a glob (`dist/**/*.whl`, the filter
//! syntax of `kiln_workflow::glob_match`), is published as ONE object: a
//! `kiln-cache` archive (tar+zstd, manifest first: paths, modes, sizes,
//! sha256) with one root named after the artifact. The directory (or every
//! matched file, at its workspace-relative path) is moved into the spool
//! first, then packed from there; a file with more than one hard link is
//! published only if every one of its names is in the workspace (see
//! below); symbolic links are kept as links (never followed); sockets,
//! devices and fifos are left out (pack skips them).
//!
//! # Hard links (issue 13; issue 41, item 4)
//! Cargo hard-links `target/release/<bin>` to `target/release/deps/<bin>-<hash>`:
//! a file with several names is published when all of them are in the
//! workspace (the freeze counts them with `kiln_cache::count_names`, a walk
//! that follows no link, only when a file has more than one name). A file
//! with a name the walk does not find may be someone else's file linked in
//! (issue 13: a link to `agent.token` made the server's token 0444): it is
//! refused, and nothing touches it. A single file with several names is
//! copied into the spool from the descriptor that was checked (its other
//! names stay the step's; the copy is the agent's alone). The upload session names
//! `kind: archive`; the recorded size and sha256 are the archive's. A
//! restore of an archive downloads and verifies it like a file, then
//! unpacks it with `kiln_cache::unpack` (no `..`, no absolute names,
//! nothing written below a link, size and entry limits, every member checked
//! against the manifest) into a staging directory beside the target, moved
//! into place only once all of it verified: a bad archive fails the job as
//! infrastructure and leaves nothing behind.
//!
//! The freeze protects against the workspace changing under the upload; a
//! process that escaped the step's process group (its own `setsid`) and
//! still holds the file open could in principle write to it — that is
//! caught by the per-part identity check and by the server's verification
//! at seal, never published.
//!
//! 409 stale_epoch anywhere fences the attempt: it stops and publishes
//! nothing more. Any stop reason (cancel, timeout, shutdown) interrupts a
//! transfer.

use crate::control::{Control, Stop, backoff};
use crate::logs::LogStreamer;
use crate::ran::Ran;
use crate::ratelimit::RateLimiter;
use kiln_api::client::{ApiError, Client};
use kiln_api::types::{
    ArtifactDownload, Assignment, CreateUpload, PartReceipt, PartUrlRequest, PublishSpec, RestoreRequest, RestoreSpec,
    UploadSession, UploadedPart,
};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Tries of one API call, part or download before giving up (infra failure).
pub(crate) const MAX_TRIES: u32 = 6;
/// Bytes read from the spool file at once while sending a part.
const READ_CHUNK: u64 = 1024 * 1024;
/// A download that delivers nothing for this long is retried.
const DOWNLOAD_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// What the transfers need from the attempt.
pub(crate) struct Transfer<'a> {
    pub client: &'a Client,
    pub a: &'a Assignment,
    pub ctl: &'a Control,
    pub logs: &'a LogStreamer,
    pub limiter: &'a RateLimiter,
    /// The limit of each artifact's upload and seal (`None`: unlimited).
    pub upload_timeout: Option<std::time::Duration>,
    /// The agent's `/metrics` (part retries).
    pub metrics: &'a crate::metrics::AgentMetrics,
}

/// `path` as a relative path inside the workspace: no root, no `..`, not empty.
pub(crate) fn workspace_relative(path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// An artifact name usable as one file name in the spool.
fn spool_name_ok(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Whether `dir` (which exists) resolves inside `ws`, symlinks followed.
fn inside(ws: &Path, dir: &Path) -> std::io::Result<bool> {
    Ok(dir.canonicalize()?.starts_with(ws.canonicalize()?))
}

/// Creates `ws/rel` (a relative path without `..`) one directory at a time
/// without following symbolic links: a link on the way is
/// `PermissionDenied`, anything else that is not a directory an error.
pub(crate) fn dirs_within(ws: &Path, rel: &Path) -> std::io::Result<()> {
    let mut cur = ws.to_path_buf();
    for c in rel.components() {
        let Component::Normal(c) = c else { continue };
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "a symbolic link is in the way"));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(std::io::Error::other(format!("{} is not a directory", cur.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::create_dir(&cur) {
                Ok(()) => {}
                // Made meanwhile: look again on the next round.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if !std::fs::symlink_metadata(&cur)?.is_dir() {
                        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "not a directory"));
                    }
                }
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn job_error(msg: String) -> Ran {
    tracing::warn!("{msg}");
    Ran::JobError(msg)
}

fn infra(msg: String) -> Ran {
    tracing::error!("{msg}");
    Ran::Infra(msg)
}

/// An API call retried while retryable; 409 stale_epoch fences, any stop
/// reason interrupts. Err carries the final error, or `Ran::Stopped`.
pub(crate) async fn call<T, F, Fut>(t: &Transfer<'_>, what: &str, mut f: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let res = tokio::select! {
            r = f() => r,
            _ = t.ctl.stopped() => return Err(CallError::Stopped),
        };
        match res {
            Ok(v) => return Ok(v),
            Err(e) if e.is_stale_epoch() => {
                tracing::warn!(error = %e, "{what} refused: this attempt was fenced");
                t.ctl.stop(Stop::Fenced);
                return Err(CallError::Stopped);
            }
            Err(e) if e.is_retryable() && tries < MAX_TRIES => {
                let delay = backoff(tries, 250, 10_000);
                tracing::warn!(error = %e, tries, retry_in_ms = delay.as_millis() as u64, "{what} failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = t.ctl.stopped() => return Err(CallError::Stopped),
                }
            }
            Err(e) => return Err(CallError::Api(e, tries)),
        }
    }
}

pub(crate) enum CallError {
    Api(ApiError, u32),
    Stopped,
}

// ---------------------------------------------------------------- restore

/// Restores every declared input into `ws`, in order. Err is the attempt's result.
pub(crate) async fn restore_all(t: &Transfer<'_>, ws: &Path) -> Result<(), Ran> {
    for spec in &t.a.restore {
        restore_one(t, ws, spec).await?;
    }
    Ok(())
}

async fn restore_one(t: &Transfer<'_>, ws: &Path, spec: &RestoreSpec) -> Result<(), Ran> {
    let label = format!("{}/{}", spec.from_job, spec.name);
    let Some(rel) = workspace_relative(&spec.path) else {
        return Err(job_error(format!(
            "cannot restore artifact `{label}` to `{}`: the path must be relative to the workspace, without `..`",
            spec.path
        )));
    };
    let target = ws.join(&rel);
    let parent = target.parent().expect("a joined relative path has a parent");
    // Created one component at a time, never through a symbolic link: the
    // checkout may hold links out of the workspace, and creating first and
    // checking after would already have made directories outside it.
    match dirs_within(ws, rel.parent().unwrap_or(Path::new(""))) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(job_error(format!(
                "cannot restore artifact `{label}` to `{}`: the path leads outside the workspace through a symbolic link",
                spec.path
            )));
        }
        Err(e) => {
            return Err(job_error(format!(
                "cannot restore artifact `{label}` to `{}`: cannot create its directory: {e}",
                spec.path
            )));
        }
    }
    t.logs.system(&format!("restoring artifact `{label}` to {}", rel.display()));
    let body = RestoreRequest { from_job: spec.from_job.clone(), name: spec.name.clone() };
    let mut tries = 0;
    loop {
        tries += 1;
        let dl =
            match call(t, &format!("restore of `{label}`"), || t.client.restore(&t.a.job_id, t.a.epoch, &body)).await {
                Ok(dl) => dl,
                Err(CallError::Stopped) => return Err(Ran::Stopped),
                Err(CallError::Api(e, _)) if e.status() == Some(404) => {
                    return Err(job_error(format!("required artifact `{label}` is not available")));
                }
                Err(CallError::Api(e, _)) if e.code() == Some(kiln_api::codes::EXPIRED) => {
                    return Err(job_error(format!(
                        "required artifact `{label}` has expired (its bytes were deleted when its retention ran out)"
                    )));
                }
                Err(CallError::Api(e, n)) => {
                    return Err(infra(format!("cannot restore artifact `{label}` (after {n} tries): {e}")));
                }
            };
        let archive = dl.kind == kiln_api::types::ARTIFACT_ARCHIVE;
        if !archive && tokio::fs::symlink_metadata(&target).await.is_ok_and(|m| m.is_dir()) {
            return Err(job_error(format!(
                "cannot restore artifact `{label}` to `{}`: a directory is in the way",
                spec.path
            )));
        }
        let tmp = parent.join(format!(".kiln-restore-{}.tmp", uuid::Uuid::new_v4()));
        let done = AtomicU64::new(0);
        let what = format!("downloading artifact `{label}`");
        let res = tokio::select! {
            r = crate::progress::reported(t.logs, &what, dl.size, &done, download(t.client, &dl, &tmp, &done)) => r,
            _ = t.ctl.stopped() => Err(Fetch::Stopped),
        };
        let got = match res {
            Ok(got) => got,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                match e {
                    Fetch::Stopped => return Err(Ran::Stopped),
                    Fetch::Stale(e) => {
                        tracing::warn!(error = %e, "download refused: this attempt was fenced");
                        t.ctl.stop(Stop::Fenced);
                        return Err(Ran::Stopped);
                    }
                    Fetch::Retryable(msg) if tries < MAX_TRIES => {
                        let delay = backoff(tries, 250, 10_000);
                        tracing::warn!(artifact = %label, error = %msg, tries, retry_in_ms = delay.as_millis() as u64,
                            "artifact download failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = t.ctl.stopped() => return Err(Ran::Stopped),
                        }
                        continue;
                    }
                    Fetch::Retryable(msg) | Fetch::Fatal(msg) => {
                        return Err(infra(format!("cannot download artifact `{label}` (after {tries} tries): {msg}")));
                    }
                }
            }
        };
        if got != (dl.size, dl.sha256.to_ascii_lowercase()) {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(infra(format!(
                "artifact `{label}` failed verification: expected {} bytes with sha256 {}, received {} bytes with sha256 {}",
                dl.size, dl.sha256, got.0, got.1
            )));
        }
        if archive {
            let (tmp2, target2, name) = (tmp.clone(), target.clone(), spec.name.clone());
            let res = tokio::task::spawn_blocking(move || unpack_archive(&tmp2, &target2, &name)).await;
            let _ = tokio::fs::remove_file(&tmp).await;
            let u = match res {
                Ok(Ok(u)) => u,
                Ok(Err(e)) => {
                    return Err(infra(format!(
                        "artifact `{label}` could not be unpacked into `{}` (nothing was restored): {e}",
                        spec.path
                    )));
                }
                Err(e) => return Err(infra(format!("the unpack task of artifact `{label}` failed: {e}"))),
            };
            tracing::info!(artifact = %label, path = %rel.display(), size = dl.size, sha256 = %dl.sha256,
                entries = u.entries, bytes = u.bytes, producer_epoch = dl.epoch, "restored artifact archive");
            t.logs.system(&format!("restored artifact `{label}`: {} entries, {} bytes", u.entries, u.bytes));
            return Ok(());
        }
        if let Err(e) = tokio::fs::rename(&tmp, &target).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(infra(format!("cannot move artifact `{label}` into place at {}: {e}", target.display())));
        }
        tracing::info!(artifact = %label, path = %rel.display(), size = dl.size, sha256 = %dl.sha256,
            producer_epoch = dl.epoch, "restored artifact");
        return Ok(());
    }
}

/// Unpacks the verified archive `file` (an artifact `name`: its one root)
/// into `target` with the cache's path-safety rules and limits: staged
/// beside `target`, moved into place (replacing what was there, a
/// symbolic link included, never followed) only once every member
/// verified; on error nothing is left behind. Blocking.
pub(crate) fn unpack_archive(
    file: &Path,
    target: &Path,
    name: &str,
) -> Result<kiln_cache::Unpacked, kiln_cache::CacheError> {
    let f = std::fs::File::open(file).map_err(kiln_cache::CacheError::Io)?;
    kiln_cache::unpack(
        std::io::BufReader::new(f),
        &[target.to_path_buf()],
        &[name.to_string()],
        &kiln_cache::Limits::default(),
    )
}

pub(crate) enum Fetch {
    Stopped,
    Stale(ApiError),
    Retryable(String),
    Fatal(String),
}

/// Streams the download into `tmp`; returns (size, sha256) of what arrived.
/// Stops reading once more than the announced size arrived.
/// `done` follows the bytes received (for [`crate::progress::reported`]).
pub(crate) async fn download(
    client: &Client,
    dl: &ArtifactDownload,
    tmp: &Path,
    done: &AtomicU64,
) -> Result<(u64, String), Fetch> {
    done.store(0, Ordering::Relaxed);
    let mut resp = match client.download(&dl.url).await {
        Ok(r) => r,
        Err(e) if e.is_stale_epoch() => return Err(Fetch::Stale(e)),
        Err(e) if e.is_retryable() => return Err(Fetch::Retryable(e.to_string())),
        Err(e) => return Err(Fetch::Fatal(e.to_string())),
    };
    let mut file = tokio::fs::File::create(tmp)
        .await
        .map_err(|e| Fetch::Fatal(format!("cannot create {}: {e}", tmp.display())))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let chunk = match tokio::time::timeout(DOWNLOAD_STALL, resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(Fetch::Retryable(format!("the transfer broke off: {e}"))),
            Err(_) => {
                return Err(Fetch::Retryable(format!("no data for {} s", DOWNLOAD_STALL.as_secs())));
            }
        };
        size += chunk.len() as u64;
        done.store(size, Ordering::Relaxed);
        if size > dl.size {
            break;
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(|e| Fetch::Fatal(format!("cannot write {}: {e}", tmp.display())))?;
    }
    file.flush().await.map_err(|e| Fetch::Fatal(format!("cannot write {}: {e}", tmp.display())))?;
    Ok((size, hex::encode(hasher.finalize())))
}

// ---------------------------------------------------------------- publish

/// A declared output moved into the spool.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frozen {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    /// A directory or glob packed as one archive (kind `archive`).
    pub archive: bool,
}

/// Freezes every declared output, then uploads and seals each. Ok only when
/// all are sealed.
pub(crate) async fn publish_all(t: &Transfer<'_>, ws: &Path, spool: &Path) -> Result<(), Ran> {
    let mut frozen = vec![];
    // Every published byte is looked at for the job's secrets (issue 39,
    // item 13) before anything is uploaded.
    let scan = Arc::new(crate::mask::SecretScan::new(&t.a.secrets));
    for spec in &t.a.publish {
        let (ws, spool, spec2, scan) = (ws.to_path_buf(), spool.to_path_buf(), spec.clone(), scan.clone());
        let f = tokio::task::spawn_blocking(move || freeze_scanned(&ws, &spool, &spec2, scan.as_ref().as_ref()))
            .await
            .map_err(|e| infra(format!("the freeze task failed: {e}")))?;
        let f = f?;
        tracing::info!(artifact = %f.name, size = f.size, archive = f.archive, "froze artifact");
        frozen.push(f);
    }
    for f in &frozen {
        let what = format!("uploading artifact `{}`", f.name);
        match crate::ran::within(t.upload_timeout, upload(t, f)).await {
            Some(r) => r?,
            None => return Err(crate::ran::op_timed_out(t.logs, &what, t.upload_timeout, "--upload-timeout")),
        };
    }
    Ok(())
}

/// [`freeze_scanned`] without looking for secrets.
#[cfg(test)]
pub(crate) fn freeze(ws: &Path, spool: &Path, spec: &PublishSpec) -> Result<Frozen, Ran> {
    freeze_scanned(ws, spool, spec, None)
}

/// The job's error for an artifact holding a secret: names the file and the
/// secret, never its value; nothing is published.
fn holds_secret(name: &str, file: &str, what: &str) -> Ran {
    job_error(format!(
        "artifact `{name}` is not published: `{file}` holds {what} (an artifact never holds the job's secrets)"
    ))
}

/// Looks for the job's secrets in the frozen file `dst` (read in pieces);
/// on a find the file is removed and the job's error returned.
fn scan_frozen(name: &str, path: &str, dst: &Path, scan: &crate::mask::SecretScan) -> Result<(), Ran> {
    use std::io::Read;
    let mut f = open_nofollow(dst).map_err(|e| infra(format!("cannot read {}: {e}", dst.display())))?;
    let (mut buf, mut carry) = (vec![0u8; READ_CHUNK as usize], Vec::new());
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(infra(format!("cannot read {}: {e}", dst.display()))),
        };
        if let Some(what) = kiln_cache::Scan::feed(scan, &mut carry, &buf[..n]) {
            let _ = std::fs::remove_file(dst);
            return Err(holds_secret(name, path, &what));
        }
    }
}

/// Moves the declared output into `spool/<name>`, read-only, and hashes it
/// there; a directory or glob is moved into the spool and packed there into
/// `spool/<name>` (see the module docs). With `scan`, a file holding one of
/// the job's secrets is refused (the job's error, naming the file and the
/// secret). Blocking.
pub(crate) fn freeze_scanned(
    ws: &Path,
    spool: &Path,
    spec: &PublishSpec,
    scan: Option<&crate::mask::SecretScan>,
) -> Result<Frozen, Ran> {
    let (name, path) = (&spec.name, &spec.path);
    if !spool_name_ok(name) {
        return Err(job_error(format!("artifact name `{name}` cannot be used as a file name")));
    }
    let Some(rel) = workspace_relative(path) else {
        return Err(job_error(format!(
            "declared artifact `{name}` has path `{path}`, which must be relative to the workspace, without `..`"
        )));
    };
    if kiln_workflow::is_glob(path) {
        return freeze_glob(ws, spool, name, path, &rel, scan);
    }
    let not_produced = |why: String| job_error(format!("declared artifact `{name}` was not produced at `{path}`{why}"));
    let src = ws.join(&rel);
    let meta = match std::fs::symlink_metadata(&src) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_produced(String::new())),
        Err(e) => return Err(not_produced(format!(": {e}"))),
    };
    if meta.is_dir() {
        return freeze_dir(ws, spool, name, path, &src, scan);
    }
    if meta.file_type().is_symlink() {
        return Err(not_produced(": it is a symbolic link (publish a regular file)".into()));
    }
    if !meta.is_file() {
        return Err(not_produced(": it is not a regular file".into()));
    }
    let linked = |links: u64, inside: u64| {
        job_error(format!(
            "declared artifact `{name}` at `{path}` has {links} hard links and only {inside} of them {} in the \
             workspace: a file with a name outside the workspace is not published (publish a copy: \
             `cp --remove-destination` or `cat a > b`)",
            if inside == 1 { "is" } else { "are" }
        ))
    };
    let parent = src.parent().expect("a joined relative path has a parent");
    match inside(ws, parent) {
        Ok(true) => {}
        Ok(false) => {
            return Err(not_produced(": the path leads outside the workspace through a symbolic link".into()));
        }
        Err(e) => return Err(infra(format!("cannot resolve {}: {e}", parent.display()))),
    }
    let io = |what: &str, p: &Path, e: std::io::Error| {
        infra(format!("cannot freeze artifact `{name}`: cannot {what} {}: {e}", p.display()))
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(spool).map_err(|e| io("create", spool, e))?;
    let dst = spool.join(name);
    // A file with several names (cargo's `target/release/<bin>`): published
    // only if all of them are in the workspace, checked before anything
    // touches it (issue 13: a link to agent.token made the server's token
    // 0444); then copied from the descriptor that was checked.
    if meta.nlink() > 1 {
        let file = open_nofollow(&src).map_err(|e| io("open", &src, e))?;
        let before = file.metadata().map_err(|e| io("stat", &src, e))?;
        if !before.is_file() {
            return Err(not_produced(": it is not a regular file".into()));
        }
        let inside = names_in(&[ws], &[&before]).map_err(|e| io("look for the other names of", &src, e))?[0];
        let after = file.metadata().map_err(|e| io("stat", &src, e))?;
        if inside != before.nlink() || !same_links(&before, &after) {
            return Err(linked(after.nlink(), inside));
        }
        copy_open(file, &dst).map_err(|e| io("copy into the spool", &src, e))?;
        let frozen = open_nofollow(&dst).map_err(|e| io("open", &dst, e))?;
        let meta = frozen.metadata().map_err(|e| io("stat", &dst, e))?;
        frozen.set_permissions(std::fs::Permissions::from_mode(0o444)).map_err(|e| io("make read-only", &dst, e))?;
        if let Some(scan) = scan {
            scan_frozen(name, path, &dst, scan)?;
        }
        tracing::info!(artifact = %name, links = before.nlink(), "copied a file whose every name is in the workspace");
        return Ok(Frozen { name: name.clone(), path: dst, size: meta.len(), archive: false });
    }
    if let Err(e) = std::fs::rename(&src, &dst) {
        if e.kind() != std::io::ErrorKind::CrossesDevices {
            return Err(io("move into the spool", &src, e));
        }
        copy_nofollow(&src, &dst).map_err(|e| io("copy into the spool", &src, e))?;
    }
    // From here on only the agent's spool names the file: check what was
    // moved (not what the path showed a moment ago) and make *that* inode,
    // with no other name anywhere, read-only.
    let file = open_nofollow(&dst).map_err(|e| io("open", &dst, e))?;
    let meta = file.metadata().map_err(|e| io("stat", &dst, e))?;
    if !meta.is_file() || meta.nlink() != 1 {
        // Linked meanwhile (a process that escaped the step): put it back.
        let _ = std::fs::rename(&dst, &src);
        return Err(linked(meta.nlink(), 0));
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o444)).map_err(|e| io("make read-only", &dst, e))?;
    // The digest is computed while uploading; the secret scan reads the
    // frozen bytes before any leaves the agent.
    if let Some(scan) = scan {
        scan_frozen(name, path, &dst, scan)?;
    }
    Ok(Frozen { name: name.clone(), path: dst, size: meta.len(), archive: false })
}

/// Where a directory or the matches of a glob are gathered before packing.
fn tree_dir(spool: &Path, name: &str) -> PathBuf {
    spool.join(format!(".tree-{name}"))
}

/// A directory artifact: moved into the spool (packed in place if the
/// spool is on another filesystem; pack then still refuses a file that
/// changes while it is read), then packed.
fn freeze_dir(
    ws: &Path,
    spool: &Path,
    name: &str,
    path: &str,
    src: &Path,
    scan: Option<&crate::mask::SecretScan>,
) -> Result<Frozen, Ran> {
    let parent = src.parent().expect("a joined relative path has a parent");
    match inside(ws, parent) {
        Ok(true) => {}
        Ok(false) => {
            return Err(job_error(format!(
                "declared artifact `{name}` was not produced at `{path}`: the path leads outside the workspace through a symbolic link"
            )));
        }
        Err(e) => return Err(infra(format!("cannot resolve {}: {e}", parent.display()))),
    }
    let io = |what: &str, p: &Path, e: std::io::Error| {
        infra(format!("cannot freeze artifact `{name}`: cannot {what} {}: {e}", p.display()))
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(spool).map_err(|e| io("create", spool, e))?;
    let tree = tree_dir(spool, name);
    let root = match std::fs::rename(src, &tree) {
        Ok(()) => tree.clone(),
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => src.to_path_buf(),
        Err(e) => return Err(io("move into the spool", src, e)),
    };
    // Names of the tree's files count in the tree and in the rest of the
    // workspace (the tree is no longer in it once moved).
    let roots: Vec<&Path> = if root == tree { vec![&tree, ws] } else { vec![ws] };
    let res = refuse_linked(name, path, &root, &roots).and_then(|()| pack_tree(spool, name, &root, path, scan));
    let _ = std::fs::remove_dir_all(&tree);
    res
}

/// A glob artifact: every regular file of the workspace whose
/// '/'-separated relative path matches `pattern` is moved, at that path,
/// into a tree in the spool, which is packed. Matching nothing is the
/// job's error. Directories are walked without following symbolic links.
fn freeze_glob(
    ws: &Path,
    spool: &Path,
    name: &str,
    pattern: &str,
    rel: &Path,
    scan: Option<&crate::mask::SecretScan>,
) -> Result<Frozen, Ran> {
    // Walk only below the pattern's literal leading directories.
    let mut base = PathBuf::new();
    let comps: Vec<&std::ffi::OsStr> =
        rel.components().filter_map(|c| if let Component::Normal(s) = c { Some(s) } else { None }).collect();
    for c in &comps[..comps.len().saturating_sub(1)] {
        if c.to_str().is_none_or(|s| s.contains(['*', '?', '[', '+', '\\'])) {
            break;
        }
        base.push(c);
    }
    let pattern_rel: String = comps.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("/");
    let none =
        || job_error(format!("declared artifact `{name}`: the glob `{pattern}` matched no files in the workspace"));
    let start = ws.join(&base);
    match std::fs::symlink_metadata(&start) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.file_type().is_symlink() => {
            return Err(job_error(format!(
                "declared artifact `{name}`: the glob `{pattern}` starts below `{}`, a symbolic link (globs never follow symbolic links)",
                base.display()
            )));
        }
        Ok(_) => return Err(none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(none()),
        Err(e) => return Err(infra(format!("cannot read {}: {e}", start.display()))),
    }
    match inside(ws, &start) {
        Ok(true) => {}
        Ok(false) => {
            return Err(job_error(format!(
                "declared artifact `{name}`: the glob `{pattern}` leads outside the workspace through a symbolic link"
            )));
        }
        Err(e) => return Err(infra(format!("cannot resolve {}: {e}", start.display()))),
    }
    let mut matched = Vec::new();
    let mut stack = vec![base];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(ws.join(&dir)).map_err(|e| infra(format!("cannot read {}: {e}", dir.display())))?;
        for entry in rd {
            let entry = entry.map_err(|e| infra(format!("cannot read {}: {e}", dir.display())))?;
            let r = dir.join(entry.file_name());
            let ft = entry.file_type().map_err(|e| infra(format!("cannot stat {}: {e}", r.display())))?;
            if ft.is_dir() {
                stack.push(r);
                continue;
            }
            let Some(text) = r.to_str() else { continue };
            if !kiln_workflow::glob_match(&pattern_rel, text) {
                continue;
            }
            if ft.is_symlink() {
                return Err(job_error(format!(
                    "declared artifact `{name}`: `{text}` matches `{pattern}` but is a symbolic link (publish regular files)"
                )));
            }
            if ft.is_file() {
                matched.push(r);
            }
        }
    }
    if matched.is_empty() {
        return Err(none());
    }
    matched.sort();
    let io = |what: &str, p: &Path, e: std::io::Error| {
        infra(format!("cannot freeze artifact `{name}`: cannot {what} {}: {e}", p.display()))
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(spool).map_err(|e| io("create", spool, e))?;
    let tree = tree_dir(spool, name);
    // Files with several names: all of them must be in the workspace,
    // checked before anything moves.
    let mut metas = Vec::with_capacity(matched.len());
    for r in &matched {
        let src = ws.join(r);
        metas.push(std::fs::symlink_metadata(&src).map_err(|e| io("stat", &src, e))?);
    }
    let multi: Vec<usize> = (0..matched.len()).filter(|&i| metas[i].nlink() > 1).collect();
    if !multi.is_empty() {
        let of: Vec<&std::fs::Metadata> = multi.iter().map(|&i| &metas[i]).collect();
        let inside = names_in(&[ws], &of).map_err(|e| io("look for the other names of the files in", ws, e))?;
        for (k, &i) in multi.iter().enumerate() {
            if inside[k] != metas[i].nlink() {
                let shown = matched[i].display().to_string();
                return Err(linked_in_tree(name, pattern, &shown, metas[i].nlink(), inside[k]));
            }
        }
    }
    let res = (|| {
        std::fs::DirBuilder::new().mode(0o755).create(&tree).map_err(|e| io("create", &tree, e))?;
        for (r, meta) in matched.iter().zip(&metas) {
            let src = ws.join(r);
            if let Some(p) = r.parent() {
                dirs_within(&tree, p).map_err(|e| io("create", &tree.join(p), e))?;
            }
            let dst = tree.join(r);
            if let Err(e) = std::fs::rename(&src, &dst) {
                if e.kind() != std::io::ErrorKind::CrossesDevices {
                    return Err(io("move into the spool", &src, e));
                }
                // The file that was checked, not what the name shows now.
                let from = open_nofollow(&src).map_err(|e| io("open", &src, e))?;
                let now = from.metadata().map_err(|e| io("stat", &src, e))?;
                if !now.is_file() || !same_links(meta, &now) {
                    return Err(job_error(format!(
                        "declared artifact `{name}`: `{}` changed while it was being published",
                        r.display()
                    )));
                }
                copy_open(from, &dst).map_err(|e| io("copy into the spool", &src, e))?;
                std::fs::set_permissions(&dst, meta.permissions()).map_err(|e| io("chmod", &dst, e))?;
            }
        }
        refuse_linked(name, pattern, &tree, &[&tree, ws])?;
        pack_tree(spool, name, &tree, "", scan)
    })();
    let _ = std::fs::remove_dir_all(&tree);
    res
}

fn linked_in_tree(name: &str, path: &str, file: &str, links: u64, inside: u64) -> Ran {
    job_error(format!(
        "declared artifact `{name}` (`{path}`) holds `{file}`, which has {links} hard links and only {inside} of \
         them {} in the workspace: a file with a name outside the workspace is not published (publish a copy: \
         `cp --remove-destination` or `cat a > b`)",
        if inside == 1 { "is" } else { "are" }
    ))
}

/// How many names each file of `files` has below `roots` (see
/// `kiln_cache::count_names`), in order.
fn names_in(roots: &[&Path], files: &[&std::fs::Metadata]) -> std::io::Result<Vec<u64>> {
    let wanted: std::collections::HashMap<(u64, u64), u64> =
        files.iter().map(|m| ((m.dev(), m.ino()), m.nlink())).collect();
    let found = kiln_cache::count_names(roots, &wanted)?;
    Ok(files.iter().map(|m| found.get(&(m.dev(), m.ino())).copied().unwrap_or(0)).collect())
}

/// Whether no name of the file was made, removed or renamed between two
/// looks (each changes its link count or its change time).
fn same_links(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    (a.dev(), a.ino(), a.nlink(), a.ctime(), a.ctime_nsec()) == (b.dev(), b.ino(), b.nlink(), b.ctime(), b.ctime_nsec())
}

/// Refuses a tree (at `root`) holding a regular file with a name that is
/// not below `roots` (issue 13, as for a single file: pack would archive
/// its bytes); a file whose every name is there is fine (cargo's links).
fn refuse_linked(name: &str, path: &str, root: &Path, roots: &[&Path]) -> Result<(), Ran> {
    let mut linked: Vec<(String, std::fs::Metadata)> = vec![];
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| infra(format!("cannot read {}: {e}", dir.display())))?;
        for entry in rd {
            let entry = entry.map_err(|e| infra(format!("cannot read {}: {e}", dir.display())))?;
            let p = entry.path();
            let meta = std::fs::symlink_metadata(&p).map_err(|e| infra(format!("cannot stat {}: {e}", p.display())))?;
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() && meta.nlink() > 1 {
                linked.push((p.strip_prefix(root).unwrap_or(&p).display().to_string(), meta));
            }
        }
    }
    if linked.is_empty() {
        return Ok(());
    }
    linked.sort_by(|a, b| a.0.cmp(&b.0));
    let metas: Vec<&std::fs::Metadata> = linked.iter().map(|l| &l.1).collect();
    let inside = names_in(roots, &metas).map_err(|e| infra(format!("cannot look for the names of {path}: {e}")))?;
    for ((shown, meta), found) in linked.iter().zip(&inside) {
        let again = std::fs::symlink_metadata(root.join(shown));
        if *found != meta.nlink() || !again.is_ok_and(|a| same_links(meta, &a)) {
            return Err(linked_in_tree(name, path, shown, meta.nlink(), *found));
        }
    }
    Ok(())
}

/// Packs `root` as the archive `spool/<name>` (one root named `name`),
/// read-only. `shown` is where the root is in the workspace ("" for a
/// glob's tree, whose files are at their workspace paths): a file holding
/// a secret is named by its workspace path.
fn pack_tree(
    spool: &Path,
    name: &str,
    root: &Path,
    shown: &str,
    scan: Option<&crate::mask::SecretScan>,
) -> Result<Frozen, Ran> {
    let dst = spool.join(name);
    let io = |what: &str, p: &Path, e: std::io::Error| {
        infra(format!("cannot freeze artifact `{name}`: cannot {what} {}: {e}", p.display()))
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&dst)
        .map_err(|e| io("create", &dst, e))?;
    let mut w = std::io::BufWriter::new(file);
    let source = kiln_cache::Source::at(name, root);
    let packed = kiln_cache::pack_sources(&[source], &mut w, 3, scan.map(|s| s as &dyn kiln_cache::Scan));
    let packed = match packed {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&dst);
            return Err(match e {
                kiln_cache::CacheError::Io(e) => infra(format!("cannot pack artifact `{name}`: {e}")),
                kiln_cache::CacheError::Secret { path, what, .. } => {
                    let file = match shown.trim_end_matches('/') {
                        "" => path,
                        dir => format!("{dir}/{path}"),
                    };
                    holds_secret(name, &file, &what)
                }
                e => job_error(format!("cannot pack artifact `{name}`: {e}")),
            });
        }
    };
    let file = w.into_inner().map_err(|e| io("write", &dst, e.into_error()))?;
    file.sync_all().map_err(|e| io("write", &dst, e))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o444)).map_err(|e| io("make read-only", &dst, e))?;
    if !packed.left_out.is_empty() {
        tracing::warn!(artifact = %name, left_out = %packed.left_out.summary(),
            "left out of the archive (an archive holds files, directories and symbolic links only)");
    }
    let files = packed.manifest.entries.iter().filter(|e| e.kind == kiln_cache::EntryKind::File).count();
    tracing::info!(artifact = %name, files, bytes = packed.manifest.total_bytes, archive_bytes = packed.archive_bytes,
        archive_sha256 = %packed.archive_sha256, "packed artifact");
    Ok(Frozen { name: name.to_string(), path: dst, size: packed.archive_bytes, archive: true })
}

/// Opens `path` for reading, refusing a symbolic link in its last component.
fn open_nofollow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc_o_nofollow()).open(path)
}

fn libc_o_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

/// Copies a regular, singly-linked file without following a symbolic link
/// (the spool is on another filesystem): into a new 0600 file.
fn copy_nofollow(src: &Path, dst: &Path) -> std::io::Result<()> {
    let from = open_nofollow(src)?;
    let meta = from.metadata()?;
    if !meta.is_file() || meta.nlink() != 1 {
        return Err(std::io::Error::other("not a regular file with one name"));
    }
    copy_open(from, dst)
}

/// Copies the open file `from` into a new 0600 file `dst` (removed on error).
fn copy_open(mut from: std::fs::File, dst: &Path) -> std::io::Result<()> {
    let mut to = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst)?;
    if let Err(e) = std::io::copy(&mut from, &mut to).and_then(|_| to.sync_all()) {
        let _ = std::fs::remove_file(dst);
        return Err(e);
    }
    Ok(())
}

/// Byte range `[start, end)` of every part; one empty part for an empty file.
pub(crate) fn part_ranges(size: u64, part_size: u64) -> Vec<(u64, u64)> {
    if size == 0 {
        return vec![(0, 0)];
    }
    (0..size.div_ceil(part_size)).map(|n| (n * part_size, ((n + 1) * part_size).min(size))).collect()
}

/// Uploads and seals `f`; the sealed generation's id.
pub(crate) async fn upload(t: &Transfer<'_>, f: &Frozen) -> Result<String, Ran> {
    let name = &f.name;
    let what = if f.archive { "archive of " } else { "" };
    t.logs.system(&format!("uploading artifact `{name}`: {what}{} bytes", f.size));
    // A file's session is exactly what it always was (no `kind`).
    let kind = f.archive.then(|| kiln_api::types::ARTIFACT_ARCHIVE.to_string());
    let body = CreateUpload { name: name.clone(), size: f.size, sha256: None, kind };
    let session = match call(t, &format!("upload session for `{name}`"), || {
        t.client.create_upload(&t.a.job_id, t.a.epoch, &body)
    })
    .await
    {
        Ok(s) => s,
        Err(CallError::Stopped) => return Err(Ran::Stopped),
        Err(CallError::Api(e, n)) => {
            return Err(infra(format!("cannot open an upload session for artifact `{name}` (after {n} tries): {e}")));
        }
    };
    if session.part_size == 0 || !(session.presigned || session.part_url.contains("{part}")) {
        return Err(infra(format!(
            "the server's upload session for artifact `{name}` is unusable (part_size {}, part_url without `{{part}}`?)",
            session.part_size
        )));
    }
    let mut ranges = part_ranges(f.size, session.part_size);
    if session.presigned && f.size == 0 {
        // An empty object in the store is made at seal: nothing to send.
        ranges.clear();
    }
    tracing::info!(artifact = %name, generation = %session.generation_id, parts = ranges.len(),
        part_size = session.part_size, size = f.size, "uploading artifact");
    // The sha256 of the whole file, extended by each part once it is
    // acknowledged (a retried part restarts from the state before it).
    let sent = Arc::new(AtomicU64::new(0));
    let parts = async {
        let mut digest = Sha256::new();
        let mut etags = vec![];
        for (n, &(start, end)) in ranges.iter().enumerate() {
            if session.presigned {
                let (d, etag) = upload_presigned_part(t, f, &session, n as u64, start, end, digest).await?;
                digest = d;
                etags.push(UploadedPart { part: n as u64, etag });
            } else {
                digest = upload_part(t, f, &session, (n as u64, start, end), digest, &sent).await?;
            }
            sent.fetch_max(end, Ordering::Relaxed);
            tracing::info!(artifact = %name, part = n, parts = ranges.len(), uploaded = end, size = f.size,
                "uploaded part {}/{}", n + 1, ranges.len());
        }
        Ok::<_, Ran>((digest, etags))
    };
    let (digest, etags) =
        crate::progress::reported(t.logs, &format!("uploading artifact `{name}`"), f.size, &sent, parts).await?;
    let sha256 = hex::encode(digest.finalize());
    let gen_id = &session.generation_id;
    let sealed = match call(t, &format!("seal of `{name}`"), || {
        t.client.seal(&t.a.job_id, t.a.epoch, gen_id, Some(&sha256), etags.clone())
    })
    .await
    {
        Ok(s) => s,
        Err(CallError::Stopped) => return Err(Ran::Stopped),
        Err(CallError::Api(e, n)) => {
            return Err(infra(format!("the server did not seal artifact `{name}` (after {n} tries): {e}")));
        }
    };
    if sealed.size != f.size || !sealed.sha256.eq_ignore_ascii_case(&sha256) {
        return Err(infra(format!(
            "the server sealed artifact `{name}` as {} bytes with sha256 {}, but {} bytes with sha256 {sha256} were uploaded",
            sealed.size, sealed.sha256, f.size
        )));
    }
    tracing::info!(artifact = %name, generation = %sealed.generation_id, state = %sealed.state, "sealed artifact");
    t.logs.system(&format!("✓ artifact `{name}` sealed: {} bytes, sha256 {sha256}", f.size));
    Ok(sealed.generation_id)
}

/// Sends part `n` (bytes `[start, end)` of the spool file) until the server
/// acknowledges exactly those bytes, retrying with identical bytes;
/// `progress` follows the furthest byte sent.
async fn upload_part(
    t: &Transfer<'_>,
    f: &Frozen,
    session: &UploadSession,
    (n, start, end): (u64, u64, u64),
    digest: Sha256,
    progress: &Arc<AtomicU64>,
) -> Result<Sha256, Ran> {
    let name = &f.name;
    let url = session.part_url.replace("{part}", &n.to_string());
    let len = end - start;
    // The spool file is frozen (agent-owned, read-only), so a retry sends the
    // same bytes; the server verifies the whole object before sealing.
    let mut tries = 0;
    loop {
        tries += 1;
        let sent = Arc::new(Mutex::new(digest.clone()));
        let body = part_body(f.path.clone(), start, len, t.limiter.clone(), sent.clone(), progress.clone());
        let res = tokio::select! {
            r = t.client.put_part(&url, body) => r,
            _ = t.ctl.stopped() => return Err(Ran::Stopped),
        };
        let err = match res {
            Ok(PartReceipt { part, size, .. }) if part == n && size == len => {
                return Ok(std::mem::take(&mut *sent.lock().expect("digest")));
            }
            Ok(r) => {
                format!("the server acknowledged part {} with {} bytes, not part {n} with {len} bytes", r.part, r.size)
            }
            Err(e) if e.is_stale_epoch() => {
                tracing::warn!(error = %e, artifact = %name, part = n, "part refused: this attempt was fenced");
                t.ctl.stop(Stop::Fenced);
                return Err(Ran::Stopped);
            }
            Err(e) if e.is_retryable() => e.to_string(),
            Err(e) => {
                return Err(infra(format!("upload of part {n} of artifact `{name}` was refused: {e}")));
            }
        };
        if tries >= MAX_TRIES {
            return Err(infra(format!("upload of part {n} of artifact `{name}` failed {tries} times: {err}")));
        }
        let delay = backoff(tries, 250, 10_000);
        t.metrics.multipart_retries.with_label_values(&["server"]).inc();
        tracing::warn!(artifact = %name, part = n, tries, error = %err, retry_in_ms = delay.as_millis() as u64,
            "part upload failed; retrying with the same bytes");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = t.ctl.stopped() => return Err(Ran::Stopped),
        }
    }
}

/// Presigned sessions (S3): part `n` goes straight to the object store. The
/// part is read once into memory (≤ the session's part size) to name its
/// MD5, which the presigned request binds: the store refuses other bytes.
/// A fenced attempt is refused its next part URL; a refused or failed PUT
/// is retried with a fresh URL and the same bytes.
async fn upload_presigned_part(
    t: &Transfer<'_>,
    f: &Frozen,
    session: &UploadSession,
    n: u64,
    start: u64,
    end: u64,
    mut digest: Sha256,
) -> Result<(Sha256, String), Ran> {
    use base64::Engine;
    use md5::Md5;
    let name = &f.name;
    let len = end - start;
    let bytes = read_part(&f.path, start, len, t.limiter)
        .await
        .map_err(|e| infra(format!("cannot read part {n} of artifact `{name}`: {e}")))?;
    let content_md5 = base64::engine::general_purpose::STANDARD.encode(Md5::digest(&bytes));
    let bytes = bytes::Bytes::from(bytes);
    let body = PartUrlRequest { size: len, content_md5 };
    let gen_id = &session.generation_id;
    let mut tries = 0;
    loop {
        tries += 1;
        let req = match call(t, &format!("part {n} URL of `{name}`"), || {
            t.client.part_url(&t.a.job_id, t.a.epoch, gen_id, n, &body)
        })
        .await
        {
            Ok(r) => r,
            Err(CallError::Stopped) => return Err(Ran::Stopped),
            Err(CallError::Api(e, k)) => {
                return Err(infra(format!("no upload URL for part {n} of artifact `{name}` (after {k} tries): {e}")));
            }
        };
        let res = tokio::select! {
            r = t.client.put_presigned(&req, reqwest::Body::from(bytes.clone())) => r,
            _ = t.ctl.stopped() => return Err(Ran::Stopped),
        };
        let err = match res {
            Ok(etag) => {
                digest.update(&bytes);
                return Ok((digest, etag));
            }
            Err(e) => e.to_string(),
        };
        if tries >= MAX_TRIES {
            return Err(infra(format!("upload of part {n} of artifact `{name}` failed {tries} times: {err}")));
        }
        let delay = backoff(tries, 250, 10_000);
        t.metrics.multipart_retries.with_label_values(&["object_store"]).inc();
        tracing::warn!(artifact = %name, part = n, tries, error = %err, retry_in_ms = delay.as_millis() as u64,
            "part upload to the object store failed; retrying with the same bytes");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = t.ctl.stopped() => return Err(Ran::Stopped),
        }
    }
}

/// `len` bytes of `path` from `offset`, read through the rate limiter.
async fn read_part(path: &Path, offset: u64, len: u64, limiter: &RateLimiter) -> std::io::Result<Vec<u8>> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut out = Vec::with_capacity(len as usize);
    let mut left = len;
    while left > 0 {
        let k = left.min(READ_CHUNK);
        let at = out.len();
        out.resize(at + k as usize, 0);
        file.read_exact(&mut out[at..]).await?;
        limiter.acquire(k).await;
        left -= k;
    }
    Ok(out)
}

/// A streamed body of `len` bytes of `path` from `offset`, read in 1 MiB
/// pieces through the rate limiter; `digest` is extended with what is sent.
/// `progress` follows the furthest byte of the file read so far.
fn part_body(
    path: PathBuf,
    offset: u64,
    len: u64,
    limiter: RateLimiter,
    digest: Arc<Mutex<Sha256>>,
    progress: Arc<AtomicU64>,
) -> reqwest::Body {
    let state = (None::<tokio::fs::File>, len);
    let stream = futures::stream::try_unfold(state, move |(file, remaining)| {
        let (path, limiter, digest, progress) = (path.clone(), limiter.clone(), digest.clone(), progress.clone());
        async move {
            if remaining == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            let mut file = match file {
                Some(f) => f,
                None => {
                    let mut f = tokio::fs::File::open(&path).await?;
                    f.seek(std::io::SeekFrom::Start(offset)).await?;
                    f
                }
            };
            let n = remaining.min(READ_CHUNK);
            let mut buf = vec![0u8; n as usize];
            file.read_exact(&mut buf).await?;
            limiter.acquire(n).await;
            digest.lock().expect("digest").update(&buf);
            progress.fetch_max(offset + len - remaining + n, Ordering::Relaxed);
            Ok(Some((buf, (Some(file), remaining - n))))
        }
    });
    reqwest::Body::wrap_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_inside_the_workspace() {
        assert_eq!(workspace_relative("a/b.bin"), Some(PathBuf::from("a/b.bin")));
        assert_eq!(workspace_relative("./a//b"), Some(PathBuf::from("a/b")));
        for bad in ["", ".", "/etc/passwd", "../x", "a/../../x", "a/.."] {
            assert_eq!(workspace_relative(bad), None, "{bad}");
        }
        assert!(spool_name_ok("app.jar"));
        for bad in ["", ".", "..", "a/b"] {
            assert!(!spool_name_ok(bad), "{bad}");
        }
    }

    #[test]
    fn parts_cover_the_file_exactly() {
        assert_eq!(part_ranges(0, 4), [(0, 0)]);
        assert_eq!(part_ranges(4, 4), [(0, 4)]);
        assert_eq!(part_ranges(10, 4), [(0, 4), (4, 8), (8, 10)]);
    }

    fn spec(name: &str, path: &str) -> PublishSpec {
        PublishSpec { name: name.into(), path: path.into() }
    }

    fn failure(r: Result<Frozen, Ran>) -> String {
        match r {
            Err(Ran::JobError(m)) => m,
            Err(other) => panic!("not a job error: {other:?}"),
            Ok(f) => panic!("froze {f:?}"),
        }
    }

    #[test]
    fn freeze_moves_the_file_into_the_read_only_spool() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (ws, spool) = (dir.path().join("ws"), dir.path().join("spool"));
        std::fs::create_dir_all(ws.join("out")).unwrap();
        std::fs::write(ws.join("out/app.bin"), b"frozen bytes").unwrap();
        let f = freeze(&ws, &spool, &spec("app.bin", "out/app.bin")).unwrap();
        assert_eq!(f.path, spool.join("app.bin"));
        assert_eq!(f.size, 12);
        assert!(!ws.join("out/app.bin").exists(), "moved, not copied");
        let mode = std::fs::metadata(&f.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o444);
        assert_eq!(std::fs::read(&f.path).unwrap(), b"frozen bytes");
    }

    #[test]
    fn freeze_refuses_a_hard_link_and_leaves_its_other_name_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (ws, spool) = (dir.path().join("ws"), dir.path().join("spool"));
        std::fs::create_dir_all(&ws).unwrap();
        let token = dir.path().join("agent.token");
        std::fs::write(&token, b"kiln_secret").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&token, ws.join("token.txt")).unwrap();
        let m = failure(freeze(&ws, &spool, &spec("t", "token.txt")));
        assert!(m.contains("2 hard links"), "{m}");
        let meta = std::fs::metadata(&token).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the outside name's mode is unchanged");
        assert_eq!(std::fs::read(&token).unwrap(), b"kiln_secret");
        assert!(!spool.join("t").exists(), "nothing in the spool");
    }

    #[test]
    fn restore_directories_are_never_made_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("up")).unwrap();
        let e = dirs_within(&ws, Path::new("up/new/dir")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing made outside the workspace");
        dirs_within(&ws, Path::new("a/b/c")).unwrap();
        assert!(ws.join("a/b/c").is_dir());
        std::fs::write(ws.join("file"), b"").unwrap();
        assert!(dirs_within(&ws, Path::new("file/x")).is_err());
    }

    #[test]
    fn freeze_refuses_what_is_not_a_regular_file_in_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let (ws, spool) = (dir.path().join("ws"), dir.path().join("spool"));
        std::fs::create_dir_all(ws.join("out/dir")).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), ws.join("out/link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), ws.join("up")).unwrap();

        let m = failure(freeze(&ws, &spool, &spec("a", "out/missing")));
        assert_eq!(m, "declared artifact `a` was not produced at `out/missing`");
        let m = failure(freeze(&ws, &spool, &spec("a", "out/link")));
        assert!(m.contains("symbolic link"), "{m}");
        let m = failure(freeze(&ws, &spool, &spec("a", "up/secret")));
        assert!(m.contains("outside the workspace"), "{m}");
        let m = failure(freeze(&ws, &spool, &spec("a", "../secret")));
        assert!(m.contains("relative to the workspace"), "{m}");
        let m = failure(freeze(&ws, &spool, &spec("../a", "out/dir")));
        assert!(m.contains("file name"), "{m}");
        assert!(dir.path().join("secret").exists());
    }
}

#[cfg(test)]
#[path = "artifacts_tests.rs"]
mod archive_tests;
