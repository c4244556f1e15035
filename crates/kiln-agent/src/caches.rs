//! The job's build cache on the agent (spec 000 §10, §14; issue 15).
//!
//! Before the steps: the key is computed from the cache block, the image
//! and the declared input files at the checkout; the node-local copy is
//! tried first, then the server (only the namespaces the assignment allows
//! this run to read). Every archive is verified and unpacked by
//! `kiln_cache::unpack`, which leaves the targets untouched on any failure:
//! a refused, corrupt, truncated or vanished archive is a clean miss and
//! the job runs cold.
//!
//! After successful steps on a miss: the declared paths are packed, uploaded
//! through the live epoch's upload session (artifact `@cache`), and bound to
//! the key in the run's one writable namespace; the server keeps the first
//! writer. Cache trouble never fails the job: it is reported (log, run API).

use crate::artifacts::{CallError, Fetch, Frozen, Transfer, call, download, upload};
use crate::ran::Ran;
use kiln_api::{CacheCandidate, CacheInfo, CacheLookup, CacheSave, CacheSpec};
use sha2::{Digest, Sha256};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Node-local copies kept at most (least recently used removed first).
pub(crate) const DEFAULT_LOCAL_BUDGET: u64 = 5 << 30;
/// Longest a restore, and a save, may take.
pub(crate) const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The agent's cache settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub timeout: std::time::Duration,
    pub local_budget: u64,
}

/// What the restore decided, carried to the save and the report.
pub(crate) struct CacheRun {
    spec: CacheSpec,
    /// (namespace, key) per readable namespace, in lookup order.
    candidates: Vec<(String, String)>,
    /// The key in the writable namespace.
    write_key: String,
    /// The key without the input fingerprints, per namespace (with
    /// `restore-prefix`, and for the save).
    prefixes: Vec<(String, String)>,
    write_prefix: String,
    /// The declared paths and where they are on this host.
    dirs: Vec<(String, PathBuf)>,
    /// The same, as what is packed: each below a directory of the agent's
    /// (the workspace, or the mounts directory), reached without following
    /// a symbolic link.
    sources: Vec<kiln_cache::Source>,
    /// (host directory, path in the container) of absolute cache paths.
    mounts: Vec<(PathBuf, String)>,
    pub(crate) info: CacheInfo,
    /// Restored by its exact key: nothing to save.
    hit: bool,
    started: Instant,
}

fn local_name(namespace: &str, key: &str) -> String {
    hex::encode(Sha256::digest(format!("{namespace}\n{key}").as_bytes()))
}

/// The declared paths as (declared, directory on this host), and the
/// mounts absolute paths need: a workspace-relative path is in the
/// workspace; an absolute one is a directory of its own under `mounts_dir`
/// mounted at that path in the job's container (`mounts_dir` is None on the
/// host executor, where an absolute path cannot be given to the job alone).
type Targets = (Vec<(String, PathBuf)>, Vec<(PathBuf, String)>, Vec<kiln_cache::Source>);
fn targets(ws: &Path, mounts_dir: Option<&Path>, spec: &CacheSpec) -> Result<Targets, String> {
    let (mut dirs, mut mounts, mut sources) = (vec![], vec![], vec![]);
    for (i, p) in spec.paths.iter().enumerate() {
        if let Some(rest) = p.strip_prefix(kiln_sandbox::CONTAINER_WORKSPACE).and_then(|r| r.strip_prefix('/'))
            && mounts_dir.is_some()
            && let Some(rel) = crate::artifacts::workspace_relative(rest)
        {
            dirs.push((p.clone(), ws.join(&rel)));
            sources.push(kiln_cache::Source::within(p.clone(), ws, rel));
            continue;
        }
        if let Some(rel) = crate::artifacts::workspace_relative(p) {
            dirs.push((p.clone(), ws.join(&rel)));
            sources.push(kiln_cache::Source::within(p.clone(), ws, rel));
            continue;
        }
        let usable = p.starts_with('/') && !p.split('/').any(|c| c == ".." || c == ".") && p.len() > 1;
        match mounts_dir {
            Some(m) if usable => {
                let host = m.join(i.to_string());
                dirs.push((p.clone(), host.clone()));
                sources.push(kiln_cache::Source::within(p.clone(), m, i.to_string()));
                mounts.push((host, p.clone()));
            }
            Some(_) => return Err(format!("cache path `{p}` is neither in the workspace nor a plain absolute path")),
            None => {
                return Err(format!(
                    "cache path `{p}` is absolute: absolute cache paths are mounted into the job's container, and \
                     this agent runs steps on the host (--executor host); use a workspace-relative path"
                ));
            }
        }
    }
    Ok((dirs, mounts, sources))
}

/// Compute the key and restore; None when the job declares no cache.
/// `mounts_dir`: where absolute cache paths live on this host (container
/// executor only); see [`CacheRun::mounts`].
pub(crate) async fn restore(
    t: &Transfer<'_>,
    settings: Settings,
    work_dir: &Path,
    ws: &Path,
    mounts_dir: Option<&Path>,
    image: Option<&str>,
) -> Result<Option<CacheRun>, Ran> {
    let Some(spec) = t.a.cache.clone() else { return Ok(None) };
    let started = Instant::now();
    let deadline = started + settings.timeout;
    let mut run = CacheRun {
        candidates: vec![],
        write_key: String::new(),
        prefixes: vec![],
        write_prefix: String::new(),
        dirs: vec![],
        sources: vec![],
        mounts: vec![],
        info: CacheInfo { result: "miss".into(), ..Default::default() },
        hit: false,
        started,
        spec,
    };
    match targets(ws, mounts_dir, &run.spec) {
        Ok((dirs, mounts, sources)) => {
            for (host, _) in &mounts {
                if let Err(e) = std::fs::create_dir_all(host) {
                    return Err(Ran::Infra(format!("cannot create the cache directory {}: {e}", host.display())));
                }
            }
            (run.dirs, run.mounts, run.sources) = (dirs, mounts, sources);
        }
        Err(why) => {
            t.logs.system(&format!("cache: {why}; the job runs without its cache"));
            run.info.result = "error".into();
            run.info.message = Some(why);
            return Ok(Some(run));
        }
    };
    let (ws2, inputs) = (ws.to_path_buf(), run.spec.inputs.clone());
    let hashed = tokio::task::spawn_blocking(move || kiln_cache::hash_inputs(&ws2, &inputs)).await;
    let inputs = match hashed {
        Ok(Ok(i)) => i,
        Ok(Err(e)) => {
            t.logs.system(&format!("cache: cannot hash the declared inputs: {e}; the job runs without its cache"));
            run.info.result = "error".into();
            run.info.message = Some(e.to_string());
            return Ok(Some(run));
        }
        Err(e) => return Err(Ran::Infra(format!("the input hashing task failed: {e}"))),
    };
    let parts_for = |namespace: &str| kiln_cache::KeyParts {
        namespace: namespace.to_string(),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        image: image.unwrap_or("host").to_string(),
        kind: run.spec.kind.clone(),
        version: run.spec.version.clone(),
        paths: run.spec.paths.clone(),
        inputs: inputs.clone(),
    };
    let key_for = |ns: &str| kiln_cache::cache_key(&parts_for(ns));
    let prefix_for = |ns: &str| kiln_cache::prefix_key(&parts_for(ns));
    run.candidates = run.spec.read_namespaces.iter().map(|ns| (ns.clone(), key_for(ns))).collect();
    run.prefixes = run.spec.read_namespaces.iter().map(|ns| (ns.clone(), prefix_for(ns))).collect();
    run.write_key = key_for(&run.spec.write_namespace);
    run.write_prefix = prefix_for(&run.spec.write_namespace);
    run.info.key = run.write_key.clone();
    let local_dir = work_dir.join("caches");
    let declared: Vec<String> = run.dirs.iter().map(|d| d.0.clone()).collect();

    // The server decides whether there is an entry this run may read, and
    // its digest: a node-local copy is used only if it has those bytes (a
    // step that could write the agent's directory cannot poison it).
    let body = CacheLookup {
        candidates: run
            .candidates
            .iter()
            .zip(&run.prefixes)
            .map(|((n, k), (_, prefix))| CacheCandidate {
                namespace: n.clone(),
                key: k.clone(),
                prefix: run.spec.restore_prefix.then(|| prefix.clone()),
            })
            .collect(),
    };
    let found = match call(t, "cache lookup", || t.client.cache_lookup(&t.a.job_id, t.a.epoch, &body)).await {
        Ok(r) => r.hit,
        Err(CallError::Stopped) => return Err(Ran::Stopped),
        Err(CallError::Api(e, _)) => {
            t.logs.system(&format!("cache: lookup failed ({e}); the job runs cold"));
            run.info.result = "error".into();
            run.info.message = Some(e.to_string());
            return Ok(Some(run));
        }
    };
    let Some(hit) = found else {
        t.logs.system("cache: miss; the job runs cold and saves its cache if it succeeds");
        return Ok(Some(run));
    };
    // Each target is named through an open descriptor of its parent, made
    // without following a link (issue 39: a committed `deps -> /root`
    // would have had the agent restore, and replace, outside the workspace).
    let anchored: Result<Vec<kiln_cache::Target>, _> =
        run.sources.iter().map(|s| kiln_cache::target_within(&s.declared, &s.base, &s.rel)).collect();
    let anchored = match anchored {
        Ok(a) => a,
        Err(e) => {
            t.logs.system(&format!("cache: {e}; nothing is restored or saved, the job runs without its cache"));
            run.info.result = "error".into();
            run.info.message = Some(e.to_string());
            run.write_key.clear();
            return Ok(Some(run));
        }
    };
    let target_dirs: Vec<PathBuf> = anchored.iter().map(|a| a.path.clone()).collect();
    let local = local_dir.join(local_name(&hit.namespace, &hit.key));
    if local.is_file() {
        let (path, want) = (local.clone(), hit.download.sha256.clone());
        let same = tokio::task::spawn_blocking(move || file_sha256(&path).is_ok_and(|h| h.eq_ignore_ascii_case(&want)))
            .await
            .unwrap_or(false);
        if same && let Some((bytes, left_out)) = use_tree(&local_dir, &local, &target_dirs, &declared, deadline).await {
            let _ = filetime_touch(&local);
            t.logs.system(&format!(
                "cache: {} ({}) from this agent's prepared copy, {bytes} bytes restored",
                hit_word(&hit, &left_out),
                hit.namespace
            ));
            run.hit_with(t, &hit, bytes, &left_out);
            run.info.message = Some("node-local prepared copy".into());
            prepare_tree(&local_dir, &local, &declared);
            return Ok(Some(run));
        }
        match same {
            true => match unpack_file(&local, &target_dirs, &declared, deadline).await {
                Ok((bytes, left_out)) => {
                    let _ = filetime_touch(&local);
                    prepare_tree(&local_dir, &local, &declared);
                    t.logs.system(&format!(
                        "cache: {} ({}) from this agent's copy, {bytes} bytes restored",
                        hit_word(&hit, &left_out),
                        hit.namespace
                    ));
                    run.hit_with(t, &hit, bytes, &left_out);
                    run.info.message = Some("node-local copy".into());
                    return Ok(Some(run));
                }
                Err(e) => {
                    t.logs.system(&format!("cache: this agent's copy was refused ({e}); it is removed"));
                    let _ = std::fs::remove_file(&local);
                }
            },
            false => {
                t.logs.system("cache: this agent's copy does not have the entry's bytes; it is removed");
                let _ = std::fs::remove_file(&local);
            }
        }
    }
    if let Err(e) = std::fs::DirBuilder::new().recursive(true).create(local_dir.join("tmp")) {
        return Ok(Some(run.failed(t, "error", format!("cannot create {}: {e}", local_dir.display()))));
    }
    let tmp = local_dir.join("tmp").join(format!("{}.part", uuid_like()));
    let done = std::sync::atomic::AtomicU64::new(0);
    let what = format!("cache: restoring `{}`", hit.namespace);
    let fetch = crate::progress::reported(
        t.logs,
        &what,
        hit.download.size,
        &done,
        download(t.client, &hit.download, &tmp, &done),
    );
    let got = match tokio::time::timeout_at(deadline.into(), fetch).await {
        Ok(r) => r,
        Err(_) => Err(Fetch::Fatal(format!("timed out after {:?} (--cache-timeout)", settings.timeout))),
    };
    let verified = match got {
        Ok((size, sha)) if size == hit.download.size && sha.eq_ignore_ascii_case(&hit.download.sha256) => Ok(()),
        Ok((size, sha)) => Err(format!(
            "the download has {size} bytes with sha256 {sha}, not {} bytes with {}",
            hit.download.size, hit.download.sha256
        )),
        Err(Fetch::Stopped) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Ran::Stopped);
        }
        Err(Fetch::Stale(e)) => Err(e.to_string()),
        Err(Fetch::Retryable(e) | Fetch::Fatal(e)) => Err(e),
    };
    if let Err(why) = verified {
        let _ = std::fs::remove_file(&tmp);
        let mut run = run.failed(t, "error", format!("the cache download failed: {why}"));
        run.info.namespace = Some(hit.namespace.clone());
        run.info.key = hit.key.clone();
        // Tell the server now: it checks the stored bytes and drops a
        // damaged entry, so this attempt's save can replace it.
        report(t, &run).await;
        run.info.key = run.write_key.clone();
        run.info.namespace = None;
        return Ok(Some(run));
    }
    match unpack_file(&tmp, &target_dirs, &declared, deadline).await {
        Ok((bytes, left_out)) => {
            let keep = local_dir.join(local_name(&hit.namespace, &hit.key));
            match std::fs::rename(&tmp, &keep) {
                Ok(()) => prepare_tree(&local_dir, &keep, &declared),
                Err(_) => {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            prune_local(&local_dir, settings.local_budget);
            t.logs.system(&format!("cache: {} ({}), {bytes} bytes restored", hit_word(&hit, &left_out), hit.namespace));
            run.hit_with(t, &hit, bytes, &left_out);
            Ok(Some(run))
        }
        Err(e @ kiln_cache::CacheError::Timeout(_)) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(Some(run.failed(t, "error", format!("{e} (--cache-timeout {:?})", settings.timeout))))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            let mut run = run.failed(t, "partial-refused", format!("the cache archive was refused: {e}"));
            run.info.namespace = Some(hit.namespace.clone());
            run.info.key = hit.key.clone();
            report(t, &run).await;
            run.info.key = run.write_key.clone();
            run.info.namespace = None;
            Ok(Some(run))
        }
    }
}

fn hit_word(hit: &kiln_api::CacheHitInfo, left_out: &kiln_cache::LeftOut) -> &'static str {
    match (hit.by_prefix, left_out.is_empty()) {
        (true, _) => "restored by prefix (an entry saved for other inputs; the exact key is saved if the job succeeds)",
        (false, true) => "hit",
        (false, false) => "partial hit (the entry left things out when it was saved)",
    }
}

impl CacheRun {
    /// (host directory, path in the container) to mount for absolute
    /// cache paths.
    pub(crate) fn mounts(&self) -> &[(PathBuf, String)] {
        &self.mounts
    }

    /// A restore of `hit` (`bytes` restored; `left_out`: what its save left
    /// out, which makes a hit `partial`, said in the log).
    fn hit_with(&mut self, t: &Transfer<'_>, hit: &kiln_api::CacheHitInfo, bytes: u64, left_out: &kiln_cache::LeftOut) {
        // A prefix restore still saves the exact key after success.
        self.hit = !hit.by_prefix;
        self.info.result = match (hit.by_prefix, left_out.is_empty()) {
            (true, _) => "prefix",
            (false, true) => "hit",
            (false, false) => "partial",
        }
        .into();
        if !left_out.is_empty() {
            let what = left_out.summary();
            t.logs.system(&format!(
                "cache: the restored entry left out {what} when it was saved (a cache holds files, directories and \
                 symbolic links only)"
            ));
            self.info.left_out = Some(what);
        }
        self.info.namespace = Some(hit.namespace.clone());
        if !hit.by_prefix {
            self.info.key = hit.key.clone();
        }
        self.info.bytes = Some(bytes);
        self.info.seconds = Some(self.started.elapsed().as_secs_f64());
    }

    fn failed(mut self, t: &Transfer<'_>, result: &str, why: String) -> CacheRun {
        t.logs.system(&format!("cache: {why}; nothing was restored, the job runs cold"));
        self.info.result = result.into();
        self.info.message = Some(why);
        self
    }
}

async fn unpack_file(
    file: &Path,
    targets: &[PathBuf],
    declared: &[String],
    deadline: Instant,
) -> Result<(u64, kiln_cache::LeftOut), kiln_cache::CacheError> {
    let (file, targets, declared) = (file.to_path_buf(), targets.to_vec(), declared.to_vec());
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&file).map_err(kiln_cache::CacheError::Io)?;
        let limits = kiln_cache::Limits { deadline: Some(deadline), ..Default::default() };
        kiln_cache::unpack(std::io::BufReader::new(f), &targets, &declared, &limits).map(|u| (u.bytes, u.left_out))
    })
    .await
    .map_err(|e| kiln_cache::CacheError::Io(std::io::Error::other(e.to_string())))?
}

/// After successful steps: save on a miss (a hit's key already exists).
pub(crate) async fn save(
    t: &Transfer<'_>,
    settings: Settings,
    spool: &Path,
    work_dir: &Path,
    run: &mut CacheRun,
) -> Result<(), Ran> {
    if run.hit || run.write_key.is_empty() || run.dirs.is_empty() {
        return Ok(());
    }
    let dirs = run.dirs.clone();
    let started = Instant::now();
    // The agent's alone (the spool is made on first use).
    let mut builder = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(builder.recursive(true), 0o700);
    if let Err(e) = builder.create(spool) {
        run.info.saved = Some(format!("not saved: cannot create {}: {e}", spool.display()));
        return Ok(());
    }
    let archive = spool.join("cache.tar.zst");
    let (archive2, sources) = (archive.clone(), run.sources.clone());
    // The job's secrets are looked for in every file while it is hashed
    // (issue 39, item 13): a cache holding one is not saved.
    let scan = crate::mask::SecretScan::new(&t.a.secrets);
    let packed = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::create(&archive2).map_err(kiln_cache::CacheError::Io)?;
        let mut w = std::io::BufWriter::new(f);
        let scan = scan.as_ref().map(|s| s as &dyn kiln_cache::Scan);
        let p = kiln_cache::pack_sources(&sources, &mut w, 3, scan)?;
        std::io::Write::flush(&mut w).map_err(kiln_cache::CacheError::Io)?;
        Ok::<_, kiln_cache::CacheError>(p)
    })
    .await
    .map_err(|e| Ran::Infra(format!("the cache packing task failed: {e}")))?;
    let packed = match packed {
        Ok(p) => p,
        Err(e) => {
            let why = match &e {
                kiln_cache::CacheError::Secret { .. } => format!("{e}; a cache never holds the job's secrets"),
                _ => e.to_string(),
            };
            t.logs.system(&format!("cache: not saved: {why}"));
            run.info.saved = Some(format!("not saved: {why}"));
            let _ = std::fs::remove_file(&archive);
            return Ok(());
        }
    };
    if !packed.left_out.is_empty() {
        let what = packed.left_out.summary();
        t.logs.system(&format!(
            "cache: left out {what}: a cache holds files, directories and symbolic links only (a restore of this \
             entry is reported as `partial`)"
        ));
        run.info.left_out = Some(what);
    }
    t.logs.system(&format!(
        "cache: saving {} bytes ({} files, directories and links) as {}",
        packed.archive_bytes,
        packed.manifest.entries.len(),
        run.spec.write_namespace
    ));
    let frozen =
        Frozen { name: CACHE_ARTIFACT.to_string(), path: archive.clone(), size: packed.archive_bytes, archive: false };
    let budget = settings.timeout.saturating_sub(started.elapsed());
    let generation = match tokio::time::timeout(budget, upload(t, &frozen)).await {
        Err(_) => {
            t.logs.system(&format!("cache: not saved: the upload took longer than {:?}", settings.timeout));
            run.info.saved = Some("not saved: timed out".into());
            let _ = std::fs::remove_file(&archive);
            return Ok(());
        }
        Ok(Ok(g)) => g,
        Ok(Err(Ran::Stopped)) => return Err(Ran::Stopped),
        Ok(Err(ran)) => {
            run.info.saved = Some(format!("not saved: {ran:?}"));
            let _ = std::fs::remove_file(&archive);
            return Ok(());
        }
    };
    let body = CacheSave {
        generation_id: generation,
        namespace: run.spec.write_namespace.clone(),
        key: run.write_key.clone(),
        prefix: Some(run.write_prefix.clone()),
        build_seconds: run.info.steps_seconds,
    };
    match call(t, "cache save", || t.client.cache_save(&t.a.job_id, t.a.epoch, &body)).await {
        Ok(s) if s.conflict => {
            t.logs.system("cache: warning: another attempt saved other bytes under this key first; it stays");
            run.info.saved = Some("conflict".into());
        }
        Ok(s) if s.bound => {
            run.info.saved = Some("saved".into());
            // Keep it on this agent too: the next run here restores locally.
            let local_dir = work_dir.join("caches");
            if std::fs::DirBuilder::new().recursive(true).create(&local_dir).is_ok() {
                let keep = local_dir.join(local_name(&run.spec.write_namespace, &run.write_key));
                if std::fs::rename(&archive, &keep).is_ok() {
                    let declared: Vec<String> = dirs.iter().map(|d| d.0.clone()).collect();
                    prepare_tree(&local_dir, &keep, &declared);
                    prune_local(&local_dir, settings.local_budget);
                }
            }
        }
        Ok(_) => run.info.saved = Some("exists".into()),
        Err(CallError::Stopped) => return Err(Ran::Stopped),
        Err(CallError::Api(e, _)) => {
            t.logs.system(&format!("cache: not saved: {e}"));
            run.info.saved = Some(format!("not saved: {e}"));
        }
    }
    let _ = std::fs::remove_file(&archive);
    if !matches!(run.info.result.as_str(), "prefix") {
        run.info.bytes = Some(packed.archive_bytes);
    }
    run.info.seconds = Some(run.info.seconds.unwrap_or(0.0) + started.elapsed().as_secs_f64());
    Ok(())
}

/// The artifact name cache archives are uploaded under (the server's
/// `kiln_store::CACHE_ARTIFACT`).
const CACHE_ARTIFACT: &str = "@cache";

/// Tell the server what happened (shown on the job); best effort.
pub(crate) async fn report(t: &Transfer<'_>, run: &CacheRun) {
    let mut info = run.info.clone();
    info.seconds.get_or_insert_with(|| run.started.elapsed().as_secs_f64());
    let _ = t.client.cache_report(&t.a.job_id, t.a.epoch, &info).await;
}

fn uuid_like() -> String {
    format!("{}-{}", std::process::id(), rand::random::<u64>())
}

/// sha256 of a file, hex.
fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf)?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// Mark a node-local copy as just used (its mtime), for the LRU prune.
fn filetime_touch(file: &Path) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().append(true).open(file)?;
    f.set_modified(std::time::SystemTime::now())
}

/// Where the prepared (unpacked, verified) copy of a node-local archive is.
fn tree_of(local_dir: &Path, archive: &Path) -> PathBuf {
    local_dir.join("trees").join(archive.file_name().unwrap_or_default())
}

/// In the background, unpack a node-local archive (already checked against
/// the server's digest) into a prepared copy, so the next restore of this
/// entry on this agent is a check and a rename instead of an unpack. One
/// prepared copy per archive; a restore consumes it and prepares the next.
fn prepare_tree(local_dir: &Path, archive: &Path, declared: &[String]) {
    let (tree, archive, declared) = (tree_of(local_dir, archive), archive.to_path_buf(), declared.to_vec());
    if tree.exists() {
        return;
    }
    tokio::task::spawn_blocking(move || {
        let Some(parent) = tree.parent() else { return };
        let tmp = parent.join(format!(".tmp-{}", uuid_like()));
        let roots: Vec<PathBuf> = (0..declared.len()).map(|i| tmp.join(i.to_string())).collect();
        let made = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&tmp).is_ok()
            && std::fs::File::open(&archive).is_ok_and(|f| {
                kiln_cache::unpack(std::io::BufReader::new(f), &roots, &declared, &kiln_cache::Limits::default())
                    .is_ok()
            });
        if !made || std::fs::rename(&tmp, &tree).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    });
}

/// Restore from the prepared copy of `archive` (whose bytes the caller
/// checked): claim it (so no other job takes it), check it holds exactly
/// the archive's manifest, move its roots into place. None (and the copy
/// gone) on any failure: the caller unpacks the archive instead.
async fn use_tree(
    local_dir: &Path,
    archive: &Path,
    targets: &[PathBuf],
    declared: &[String],
    deadline: Instant,
) -> Option<(u64, kiln_cache::LeftOut)> {
    let tree = tree_of(local_dir, archive);
    let claimed = local_dir.join("trees").join(format!(".claimed-{}", uuid_like()));
    std::fs::rename(&tree, &claimed).ok()?;
    let (archive, targets, declared, claimed2) =
        (archive.to_path_buf(), targets.to_vec(), declared.to_vec(), claimed.clone());
    let used = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&archive).ok()?;
        let limits = kiln_cache::Limits::default();
        let m = kiln_cache::read_manifest(std::io::BufReader::new(f), &declared, &limits).ok()?;
        let present: Vec<bool> = (0..declared.len()).map(|i| m.entries.iter().any(|e| e.root as usize == i)).collect();
        let roots: Vec<(String, PathBuf)> =
            declared.iter().enumerate().map(|(i, d)| (d.clone(), claimed2.join(i.to_string()))).collect();
        kiln_cache::verify_tree(&roots, &m).ok()?;
        if Instant::now() >= deadline {
            return None;
        }
        let staged = roots.into_iter().zip(&present).map(|((_, p), &here)| here.then_some(p)).collect();
        kiln_cache::install(staged, &targets).ok()?;
        Some((m.total_bytes, m.left_out))
    })
    .await
    .ok()
    .flatten();
    let _ = std::fs::remove_dir_all(&claimed);
    used
}

/// Remove the least recently used node-local copies beyond `budget` bytes
/// (with their prepared copies), and prepared copies left half-made.
fn prune_local(dir: &Path, budget: u64) {
    if let Ok(rd) = std::fs::read_dir(dir.join("trees")) {
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for e in rd.flatten() {
            let stale = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < hour_ago);
            let name = e.file_name().to_string_lossy().into_owned();
            let orphan = !name.starts_with('.') && !dir.join(&name).is_file();
            if (name.starts_with('.') && stale) || orphan {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file().then(|| (m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len(), e.path()))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut total = 0u64;
    for (_, len, path) in files {
        total += len;
        if total > budget {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_dir_all(tree_of(dir, &path));
        }
    }
}
