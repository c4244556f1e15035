//! Workspace checkout from agent-side bare mirrors.
//!
//! One bare mirror per clone URL, `<mirrors>/<sha256(url)[..16]>.git`,
//! fetched only when the wanted commit is missing, with fetches of one
//! mirror serialized. A workspace is a repository that borrows the mirror's
//! objects (alternates) with HEAD detached at the frozen commit, filled by one
//! `git read-tree -u`: no object copy, one short process.
//! The run's commit SHA is frozen at acceptance (invariant 1); branch names
//! are never consulted to pick the bytes.

use crate::slots::{Budget, copy_tree};
use kiln_sandbox::remove_tree;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckoutError {
    #[error("`{0}` is not a full commit SHA")]
    BadSha(String),
    #[error("`{0}` is not a usable clone URL")]
    BadUrl(String),
    #[error("commit {sha} was not found in {url} (fetched all branches and tags, and the commit by id)")]
    MissingCommit { sha: String, url: String },
    #[error("`git {args}` failed: {detail}")]
    Git { args: String, detail: String },
    /// A fetch ran past `kiln agent --git-timeout`.
    #[error("`git {args}` took longer than {limit} (kiln agent --git-timeout)")]
    TimedOut { args: String, limit: String },
    #[error("cannot prepare {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Most (mirror, commit) pairs a [`Mirrors`] remembers as present.
const KNOWN_MAX: usize = 1024;

pub(crate) struct Mirrors {
    dir: PathBuf,
    /// Fetch retries (spec 004's table for git clone: 3 tries, 5 s doubling
    /// to 60 s, ±15 % jitter); shorter in tests.
    retry: FetchRetry,
    /// The limit of each fetch (`None`: unlimited).
    fetch_timeout: Option<std::time::Duration>,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    /// (mirror, sha) seen present: objects are never removed from a mirror,
    /// so the next checkout of that commit skips the `cat-file` probe. At
    /// most [`KNOWN_MAX`] (see [`Mirrors::remember`]).
    known: Mutex<std::collections::HashSet<(PathBuf, String)>>,
    /// Pristine checkouts known to exist (see [`Mirrors::keep_pristine`]),
    /// each with the number of copies from it in progress.
    pristine: Arc<Mutex<HashMap<PathBuf, usize>>>,
}

impl Mirrors {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Mirrors {
            dir,
            retry: FetchRetry::default(),
            fetch_timeout: Some(LOCAL_GIT_TIMEOUT),
            locks: Mutex::default(),
            known: Mutex::default(),
            pristine: Arc::default(),
        }
    }

    /// Notes that `sha` is in `mirror`. Issue 47: every commit an agent
    /// ever checked out stayed in [`Mirrors::known`]; past [`KNOWN_MAX`]
    /// the set starts again (a forgotten commit costs one `cat-file`).
    fn remember(&self, mirror: PathBuf, sha: &str) {
        let mut known = self.known.lock().expect("known");
        if known.len() >= KNOWN_MAX {
            *known = Default::default();
        }
        known.insert((mirror, sha.to_string()));
    }

    /// Bounds each `git fetch` (spec 004: git clone, 10 min; `None`: unlimited).
    pub(crate) fn with_fetch_timeout(mut self, limit: Option<std::time::Duration>) -> Self {
        self.fetch_timeout = limit;
        self
    }

    pub(crate) fn mirror_path(&self, clone_url: &str) -> PathBuf {
        let digest = hex::encode(Sha256::digest(clone_url.as_bytes()));
        self.dir.join(format!("{}.git", &digest[..16]))
    }

    /// The mirror of `clone_url`, or its partial mirror (commits and trees,
    /// blobs fetched as checkouts need them: `filter: blob:none`).
    fn mirror_for(&self, clone_url: &str, partial: bool) -> PathBuf {
        if !partial {
            return self.mirror_path(clone_url);
        }
        let digest = hex::encode(Sha256::digest(format!("{clone_url}\0blob:none").as_bytes()));
        self.dir.join(format!("{}-partial.git", &digest[..16]))
    }

    /// Fetches into the partial `mirror` the blobs of `sha`'s tree that
    /// `shape` checks out and it lacks, by id, in batches.
    async fn fetch_blobs(
        &self,
        mirror: &Path,
        url: &str,
        env: &[(String, String)],
        sha: &str,
        shape: &Shape,
    ) -> Result<(), CheckoutError> {
        let listing = git_out(Some(mirror), ["ls-tree", "-r", "-z", "--full-tree", sha], &[]).await?;
        let tree = crate::kept::Tree::parse(&listing)
            .map_err(|e| CheckoutError::Git { args: "ls-tree".into(), detail: e.to_string() })?;
        let wanted: Vec<String> = tree
            .files
            .iter()
            .filter(|(p, e)| e.mode != 0o160000 && shape.covers(p))
            .map(|(_, e)| e.oid.clone())
            .collect();
        let missing = missing_objects(mirror, &wanted).await?;
        if missing.is_empty() {
            return Ok(());
        }
        tracing::info!(url = %kiln_api::giturl::redact(url), blobs = missing.len(), "fetching blobs into the partial mirror");
        for batch in missing.chunks(1000) {
            let mut args = vec!["fetch", "-q", "--no-tags", "--filter=blob:none", "--", url];
            args.extend(batch.iter().map(String::as_str));
            git_within_env(self.fetch_timeout, Some(mirror), args, env).await?;
        }
        let still = missing_objects(mirror, &missing).await?;
        if let Some(oid) = still.first() {
            return Err(CheckoutError::Git {
                args: "fetch (blobs of a partial checkout)".into(),
                detail: format!(
                    "{} blobs are still missing (e.g. {oid}); does the server allow fetching by id?",
                    still.len()
                ),
            });
        }
        Ok(())
    }

    fn lock_for(&self, mirror: &Path) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().expect("mirror locks").entry(mirror.to_path_buf()).or_default().clone()
    }

    /// Checks out `sha` of `clone_url` into `ws`, which must not exist
    /// unless it is a job slot's kept workspace (`slot_trash`: where what is
    /// moved out of it goes, see [`Mirrors::sync_existing`]).
    ///
    /// With `private_objects` (steps that cannot open the agent's mirrors:
    /// another user, for whom they are 0700, or a mount namespace that
    /// hides the agent's work dir), the workspace gets its own object
    /// store instead of borrowing the mirror's: its files hard-linked (made
    /// read-only first) or copied.
    ///
    /// A fetch that fails transiently (connection refused or reset, DNS, a
    /// timeout, HTTP 5xx or 429) is tried again with backoff; `on_retry`
    /// gets a line for the job's log each time. A permanent failure
    /// (repository not found, authentication, other 4xx) is not retried.
    #[cfg(test)]
    pub(crate) async fn checkout(
        &self,
        clone_url: &str,
        sha: &str,
        ws: &Path,
        private_objects: bool,
        slot_trash: Option<&Path>,
        on_retry: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), CheckoutError> {
        self.checkout_with(clone_url, None, sha, ws, private_objects, slot_trash, None, &Shape::default(), on_retry)
            .await
            .map(drop)
    }

    /// [`Mirrors::checkout`] with the clone URL's credential, which reaches
    /// git only through its environment (a credential helper answering for
    /// the URL's origin; see `kiln_api::giturl::git_credential_env`): never
    /// a command line, a file, or a step.
    ///
    /// `kept`: a job slot's workspace of a big tree (see [`crate::kept`]):
    /// where the agent keeps its index, and the commit the kept workspace
    /// holds when the job may have it brought to `sha` (`reuse`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn checkout_with(
        &self,
        clone_url: &str,
        credential: Option<&kiln_api::giturl::CloneCredential>,
        sha: &str,
        ws: &Path,
        private_objects: bool,
        slot_trash: Option<&Path>,
        kept: Option<Kept<'_>>,
        shape: &Shape,
        on_retry: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Checkout, CheckoutError> {
        let full_sha = (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit());
        if !full_sha {
            return Err(CheckoutError::BadSha(sha.to_string()));
        }
        // A credential still written in the URL (an older server) is taken
        // out of it too.
        let (bare, inline) = kiln_api::giturl::split_credential(clone_url);
        let url = resolve_url(&bare)?;
        let env = match credential.or(inline.as_ref()) {
            Some(c) => kiln_api::giturl::git_credential_env(&url, c),
            None => Vec::new(),
        };
        let mirror = self.mirror_for(clone_url, shape.partial);
        {
            let lock = self.lock_for(&mirror);
            let _guard = lock.lock().await;
            self.ensure_mirror(&mirror).await?;
            let known = self.known.lock().expect("known").contains(&(mirror.clone(), sha.to_string()));
            if !known && !has_commit(&mirror, sha).await {
                tracing::info!(url = %bare, mirror = %mirror.display(), "fetching into mirror");
                let refs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"];
                // A partial mirror holds commits and trees only.
                let filter = if shape.partial { "--filter=blob:none" } else { "--no-tags" };
                let mut tries = 0;
                let fetch_all = loop {
                    tries += 1;
                    let r = git_within_env(
                        self.fetch_timeout,
                        Some(&mirror),
                        ["fetch", "-q", "--no-tags", filter, "--", &url, refs[0], refs[1]],
                        &env,
                    )
                    .await;
                    match r {
                        Err(e) if tries < self.retry.tries && is_transient(&e) => {
                            let delay = self.retry.delay(tries);
                            let line = format!(
                                "git fetch failed (try {tries}/{}): {e}; retrying in {:.1}s",
                                self.retry.tries,
                                delay.as_secs_f64()
                            );
                            tracing::warn!("{line}");
                            on_retry(line);
                            tokio::time::sleep(delay).await;
                        }
                        r => break r,
                    }
                };
                if !has_commit(&mirror, sha).await {
                    // An unadvertised commit (e.g. a pull request head): ask for it by id.
                    let by_id = git_within_env(
                        self.fetch_timeout,
                        Some(&mirror),
                        ["fetch", "-q", "--no-tags", filter, "--", &url, sha],
                        &env,
                    )
                    .await;
                    if !has_commit(&mirror, sha).await {
                        return Err(match (fetch_all, by_id) {
                            (Err(e), _) => e,
                            (_, Err(e @ CheckoutError::TimedOut { .. })) => e,
                            _ => CheckoutError::MissingCommit { sha: sha.to_string(), url: bare.clone() },
                        });
                    }
                }
            }
        }
        if shape.partial {
            // The blobs of the paths checked out, fetched into the partial
            // mirror by id (under its lock: one fetch at a time).
            let lock = self.lock_for(&mirror);
            let _guard = lock.lock().await;
            self.fetch_blobs(&mirror, &url, &env, sha, shape).await?;
        }
        if !shape.plain() {
            // A sparse, partial or shallow workspace is always made afresh:
            // a slot's kept workspace (of any shape) is moved out.
            if let Some(trash) = slot_trash
                && std::fs::symlink_metadata(ws).is_ok()
            {
                let mut doomed = crate::slots::Doomed::new(trash);
                if doomed.take(ws).is_err() {
                    let _ = remove_tree(ws);
                }
                doomed.bury();
            }
            let io = |source| CheckoutError::Io { path: ws.display().to_string(), source };
            let objects = std::path::absolute(mirror.join("objects")).map_err(io)?;
            write_git_dir(ws, &objects, sha).await.map_err(io)?;
            shape.write(ws, &mirror, sha).await?;
            git(Some(ws), ["read-tree", "--reset", "-u", sha]).await?;
            if private_objects {
                self.give_objects(&mirror, ws).await.map_err(io)?;
            }
            self.remember(mirror, sha);
            return Ok(Checkout::Fresh);
        }
        // The workspace is a minimal repository borrowing the mirror's objects
        // (alternates, like `clone --shared`), HEAD detached at the frozen
        // commit; one `read-tree` fills index and files. This skips clone's
        // templates, ref negotiation and upload-pack process: a checkout
        // costs one short git process. A small tree checked out before is
        // copied from the mirror's pristine copy of it instead: no process.
        // A job slot's kept workspace (see `crate::slots`): brought to the
        // commit in place when this agent has its pristine tree.
        // A kept workspace of a big tree brought to this commit (`reuse`).
        if let (Some(trash), Some(k)) = (slot_trash, &kept)
            && let Some(from) = k.from
            && std::fs::symlink_metadata(ws).is_ok()
            && self.reset_kept(clone_url, from, sha, ws, private_objects, None, k.index, k.owner, trash).await
        {
            self.remember(mirror, sha);
            return Ok(Checkout::Kept);
        }
        if let Some(trash) = slot_trash
            && std::fs::symlink_metadata(ws).is_ok()
            && self.sync_existing(clone_url, sha, ws, private_objects, trash).await
        {
            self.remember(mirror, sha);
            return Ok(Checkout::Fresh);
        }
        let io = |source| CheckoutError::Io { path: ws.display().to_string(), source };
        let objects = std::path::absolute(mirror.join("objects")).map_err(io)?;
        let dot_git = ws.join(".git");
        let pristine = self.pristine_path(&mirror, sha);
        if !self.copy_from_pristine(&pristine, ws).await {
            write_git_dir(ws, &objects, sha).await.map_err(io)?;
            git(Some(ws), ["read-tree", "--reset", "-u", sha]).await?;
            self.keep_pristine(&mirror, sha, ws).await;
        }
        // The index as the checkout left it, for a later reset of this
        // workspace in place (the job may change the workspace's own).
        if let Some(k) = &kept {
            let _ = std::fs::remove_file(k.index);
            if let Some(dir) = k.index.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = std::fs::copy(dot_git.join("index"), k.index) {
                tracing::debug!(error = %e, "cannot keep the checkout's index");
                let _ = std::fs::remove_file(k.index);
            }
        }
        if private_objects {
            self.give_objects(&mirror, ws).await.map_err(io)?;
        }
        self.remember(mirror, sha);
        Ok(Checkout::Fresh)
    }

    /// Where the pristine copy of `sha`'s checkout of `mirror` is kept:
    /// `pristine/` in the agent's private work dir (no step ever sees it;
    /// workspaces get copies, never links).
    fn pristine_path(&self, mirror: &Path, sha: &str) -> PathBuf {
        let name = mirror.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.pristine_dir().join(format!("{}{PRISTINE_INFIX}{sha}", name.trim_end_matches(".git")))
    }

    /// `pristine/` beside `mirrors/` in the agent's work dir.
    fn pristine_dir(&self) -> PathBuf {
        self.dir.parent().unwrap_or(&self.dir).join("pristine")
    }

    /// Fills the fresh workspace `ws` from `pristine`, if there is one.
    /// False (and `ws` removed again) when there is none or the copy
    /// failed: the caller then checks out with git. A copy in progress
    /// keeps its source from being removed (see [`Mirrors::keep_pristine`]).
    async fn copy_from_pristine(&self, pristine: &Path, ws: &Path) -> bool {
        if !self.pin(pristine) {
            return false;
        }
        let (from, to) = (pristine.to_path_buf(), ws.to_path_buf());
        let copied = tokio::task::spawn_blocking(move || {
            let r = copy_tree(&from, &to, &mut Budget::unlimited());
            if r.is_err() {
                let _ = remove_tree(&to);
            }
            r
        })
        .await;
        self.unpin(pristine);
        match copied {
            Ok(Ok(())) => true,
            other => {
                tracing::warn!(pristine = %pristine.display(), result = ?other.map(|r| r.err()),
                    "cannot copy the pristine checkout; checking out with git");
                false
            }
        }
    }

    /// Counts a copy from `pristine` in progress (so that it is not
    /// removed meanwhile); false when there is no such pristine tree.
    fn pin(&self, pristine: &Path) -> bool {
        let mut copies = self.pristine.lock().expect("pristine");
        if !copies.contains_key(pristine) {
            // A previous agent process made it (renamed into place only
            // once whole).
            if !std::fs::symlink_metadata(pristine).is_ok_and(|m| m.is_dir()) {
                return false;
            }
            copies.insert(pristine.to_path_buf(), 0);
        }
        *copies.get_mut(pristine).expect("present") += 1;
        true
    }

    fn unpin(&self, pristine: &Path) {
        if let Some(n) = self.pristine.lock().expect("pristine").get_mut(pristine) {
            *n -= 1;
        }
    }

    /// Brings the existing workspace `ws` of a job slot (see
    /// [`crate::slots`]) to the pristine tree of `sha` in place. False when
    /// there is no pristine tree of that commit here or the workspace
    /// cannot be brought back: `ws` is then moved out (to `trash`, deleted
    /// in the background) and the caller checks out afresh. With
    /// `private_objects` the workspace's own object store keeps only hard
    /// links to the mirror's files and gets the missing ones.
    pub(crate) async fn sync_existing(
        &self,
        clone_url: &str,
        sha: &str,
        ws: &Path,
        private_objects: bool,
        trash: &Path,
    ) -> bool {
        let mirror = self.mirror_path(clone_url);
        let pristine = self.pristine_path(&mirror, sha);
        let mut doomed = crate::slots::Doomed::new(trash);
        let mut ok = false;
        if self.pin(&pristine) {
            let (src, dst, theirs) = (pristine.clone(), ws.to_path_buf(), mirror.join("objects"));
            let synced = tokio::task::spawn_blocking(move || {
                let r = (|| -> std::io::Result<()> {
                    let objects = dst.join(".git/objects");
                    crate::slots::sync_tree(&src, &dst, private_objects.then_some(objects.as_path()), &mut doomed)?;
                    if private_objects {
                        match std::fs::symlink_metadata(&objects) {
                            Ok(m) if m.is_dir() => {}
                            Ok(_) => {
                                doomed.take(&objects)?;
                                std::fs::create_dir(&objects)?;
                            }
                            Err(_) => std::fs::create_dir(&objects)?,
                        }
                        crate::slots::prune_objects(&objects, &theirs, &mut doomed)?;
                    }
                    Ok(())
                })();
                (r, doomed)
            })
            .await;
            self.unpin(&pristine);
            match synced {
                Ok((r, d)) => {
                    doomed = d;
                    match r {
                        Ok(()) => ok = true,
                        Err(e) => tracing::warn!(ws = %ws.display(), error = %e,
                            "cannot bring the slot's workspace back in place; checking out afresh"),
                    }
                }
                Err(_) => doomed = crate::slots::Doomed::new(trash),
            }
        }
        if ok && private_objects {
            let lock = self.lock_for(&mirror);
            let _guard = lock.lock().await;
            let (src, dst) = (mirror.join("objects"), ws.join(".git/objects"));
            let linked = tokio::task::spawn_blocking(move || link_objects(&src, &dst)).await;
            ok = matches!(linked, Ok(Ok(())));
        }
        if !ok && std::fs::symlink_metadata(ws).is_ok() && doomed.take(ws).is_err() {
            let _ = remove_tree(ws);
        }
        doomed.bury();
        ok
    }

    /// Keeps a pristine copy of the workspace just checked out (before any
    /// step ran in it) for the next checkout of the same commit, when its
    /// tree is small ([`PRISTINE_MAX_FILES`], [`PRISTINE_MAX_BYTES`]). One
    /// per mirror: the copies of its other commits are removed unless a
    /// copy from them is in progress (then a later call removes them).
    /// Best effort: a failure only means the next checkout runs git again.
    async fn keep_pristine(&self, mirror: &Path, sha: &str, ws: &Path) {
        let target = self.pristine_path(mirror, sha);
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let prefix = name.trim_end_matches(sha).to_string();
        let (dir, ws, copies) = (self.pristine_dir(), ws.to_path_buf(), self.pristine.clone());
        let kept = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".pristine-{}", uuid::Uuid::new_v4()));
            if let Err(e) = copy_tree(&ws, &tmp, &mut Budget::new(PRISTINE_MAX_FILES, PRISTINE_MAX_BYTES)) {
                let _ = remove_tree(&tmp);
                return if e.kind() == std::io::ErrorKind::FileTooLarge { Ok(false) } else { Err(e) };
            }
            if std::fs::rename(&tmp, &target).is_err() {
                // Another slot kept the same commit first.
                let _ = remove_tree(&tmp);
            }
            let mut trash = vec![];
            {
                let mut copies = copies.lock().expect("pristine");
                copies.entry(target.clone()).or_insert(0);
                for e in std::fs::read_dir(&dir)?.flatten() {
                    let (path, n) = (e.path(), e.file_name());
                    if !n.to_string_lossy().starts_with(&prefix) || path == target {
                        continue;
                    }
                    if copies.get(&path).is_some_and(|n| *n > 0) {
                        continue;
                    }
                    // Renamed away under the lock: no new copy can start from it.
                    let t = dir.join(format!(".trash-{}", uuid::Uuid::new_v4()));
                    if std::fs::rename(&path, &t).is_ok() {
                        copies.remove(&path);
                        trash.push(t);
                    }
                }
            }
            for t in trash {
                let _ = remove_tree(&t);
            }
            Ok(true)
        })
        .await;
        if let Ok(Err(e)) = kept {
            tracing::debug!(error = %e, "cannot keep a pristine copy of the checkout");
        }
    }

    async fn ensure_mirror(&self, mirror: &Path) -> Result<(), CheckoutError> {
        if mirror.join("HEAD").exists() {
            return Ok(());
        }
        let io = |source| CheckoutError::Io { path: mirror.display().to_string(), source };
        tokio::fs::create_dir_all(&self.dir).await.map_err(io)?;
        // Init beside the final path and rename, so a crash never leaves a half-made mirror.
        let tmp = self.dir.join(format!(".init-{}", uuid::Uuid::new_v4()));
        let o = OsStr::new;
        git(None, [o("init"), o("--bare"), o("-q"), tmp.as_os_str()]).await?;
        let _ = remove_tree(mirror);
        tokio::fs::rename(&tmp, mirror).await.map_err(io)
    }
}

/// What a job's `checkout:` asks of its workspace beyond a full checkout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// History seen by `git log`: this many generations.
    pub(crate) depth: Option<u32>,
    /// `filter: blob:none`: from the repository's partial mirror.
    pub(crate) partial: bool,
    /// Cone-mode directories (none: everything).
    pub(crate) sparse: Vec<String>,
}

impl Shape {
    pub(crate) fn of(spec: Option<&kiln_api::CheckoutSpec>) -> Shape {
        match spec {
            None => Shape::default(),
            Some(k) => Shape {
                depth: k.depth,
                partial: k.filter.as_deref() == Some("blob:none"),
                sparse: k.sparse.iter().map(|d| d.trim_matches('/').to_string()).filter(|d| !d.is_empty()).collect(),
            },
        }
    }

    /// A plain full checkout: slots keep it, pristine copies serve it.
    pub(crate) fn plain(&self) -> bool {
        *self == Shape::default()
    }

    /// What tells two shapes apart in a slot's tree key.
    pub(crate) fn key(&self) -> String {
        format!("depth={:?} partial={} sparse={}", self.depth, self.partial, self.sparse.join(":"))
    }

    /// Whether the (cone-mode) sparse set holds `path`: every top-level
    /// file, and everything below a listed directory.
    pub(crate) fn covers(&self, path: &Path) -> bool {
        if self.sparse.is_empty() || path.parent().is_none_or(|p| p.as_os_str().is_empty()) {
            return true;
        }
        self.sparse.iter().any(|d| path.starts_with(d))
    }

    /// Writes the shape into the fresh `ws/.git`: the sparse-checkout
    /// patterns (cone mode) and the shallow boundary.
    async fn write(&self, ws: &Path, mirror: &Path, sha: &str) -> Result<(), CheckoutError> {
        let io = |source| CheckoutError::Io { path: ws.display().to_string(), source };
        let dot_git = ws.join(".git");
        let mut config = String::new();
        if !self.sparse.is_empty() {
            config.push_str("[core]\n\tsparseCheckout = true\n\tsparseCheckoutCone = true\n");
            tokio::fs::create_dir_all(dot_git.join("info")).await.map_err(io)?;
            tokio::fs::write(dot_git.join("info/sparse-checkout"), cone_patterns(&self.sparse)).await.map_err(io)?;
        }
        if self.partial {
            // Blobs outside the checkout are absent: no repacking that would look for them.
            config.push_str("[gc]\n\tauto = 0\n");
        }
        if !config.is_empty() {
            let mut all = tokio::fs::read_to_string(dot_git.join("config")).await.map_err(io)?;
            all.push_str(&config);
            tokio::fs::write(dot_git.join("config"), all).await.map_err(io)?;
        }
        if let Some(depth) = self.depth {
            let (git_dir, tip) = (mirror.to_path_buf(), sha.to_string());
            let shallow = tokio::task::spawn_blocking(move || shallow_boundary(&git_dir, &tip, depth))
                .await
                .expect("shallow task")
                .map_err(io)?;
            if !shallow.is_empty() {
                tokio::fs::write(dot_git.join("shallow"), shallow.join("\n") + "\n").await.map_err(io)?;
            }
        }
        Ok(())
    }
}

/// Cone-mode sparse-checkout patterns for `dirs` (as `git sparse-checkout
/// set --cone` writes them): top-level files, each directory whole, and
/// the files directly in each of its parents.
fn cone_patterns(dirs: &[String]) -> String {
    let mut parents = std::collections::BTreeSet::new();
    for d in dirs {
        let mut p = Path::new(d).parent();
        while let Some(q) = p.filter(|q| !q.as_os_str().is_empty()) {
            parents.insert(q.to_string_lossy().into_owned());
            p = q.parent();
        }
    }
    let mut out = String::from("/*\n!/*/\n");
    for p in &parents {
        out.push_str(&format!("/{p}/\n!/{p}/*/\n"));
    }
    let mut whole: Vec<&String> = dirs.iter().filter(|d| !parents.contains(*d)).collect();
    whole.sort();
    whole.dedup();
    for d in whole {
        out.push_str(&format!("/{d}/\n"));
    }
    out
}

/// The commits `depth` generations from `tip` (the nearest path counts)
/// that have parents: what `.git/shallow` lists for a clone of that depth.
fn shallow_boundary(git_dir: &Path, tip: &str, depth: u32) -> std::io::Result<Vec<String>> {
    use std::io::{BufRead, Read, Write};
    let mut child = crate::kept::cat_file_batch(git_dir)?;
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut parents_of = |c: &str| -> std::io::Result<Vec<String>> {
        writeln!(stdin, "{c}")?;
        stdin.flush()?;
        let mut header = String::new();
        out.read_line(&mut header)?;
        let size: usize = header
            .split_whitespace()
            .nth(2)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("commit {c}: {}", header.trim())))?;
        let mut body = vec![0u8; size + 1];
        out.read_exact(&mut body)?;
        let text = String::from_utf8_lossy(&body[..size]);
        Ok(text
            .lines()
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.strip_prefix("parent "))
            .map(|p| p.trim().to_string())
            .collect())
    };
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::from([tip.to_string()]);
    let mut frontier = vec![tip.to_string()];
    let mut boundary = vec![];
    for level in 1..=depth {
        let mut next = vec![];
        for c in &frontier {
            let parents = parents_of(c)?;
            if level == depth {
                if !parents.is_empty() {
                    boundary.push(c.clone());
                }
                continue;
            }
            for p in parents {
                if seen.insert(p.clone()) {
                    next.push(p);
                }
            }
        }
        frontier = next;
        if frontier.is_empty() {
            break;
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    boundary.sort();
    Ok(boundary)
}

/// Which of `oids` the repository `git_dir` lacks (never fetching them).
async fn missing_objects(git_dir: &Path, oids: &[String]) -> Result<Vec<String>, CheckoutError> {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["cat-file", "--batch-check"])
        .env("GIT_NO_LAZY_FETCH", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| CheckoutError::Git { args: "cat-file --batch-check".into(), detail: e.to_string() })?;
    let mut stdin = child.stdin.take().expect("stdin");
    let input: String = oids.iter().map(|o| format!("{o}\n")).collect();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(input.as_bytes()).await;
    });
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| CheckoutError::Git { args: "cat-file --batch-check".into(), detail: e.to_string() })?;
    let _ = writer.await;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(" missing"))
        .map(str::to_string)
        .collect())
}

/// A job slot's kept workspace as a checkout sees it (see [`crate::kept`]).
pub(crate) struct Kept<'a> {
    /// The agent's copy of the workspace's index (never in the workspace).
    pub(crate) index: &'a Path,
    /// The commit the workspace holds, when it may be brought to another.
    pub(crate) from: Option<&'a str>,
    /// Who the entries it writes are handed to (the step user).
    pub(crate) owner: Option<(u32, u32)>,
}

/// How a workspace came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checkout {
    /// Written afresh (or copied from a pristine tree): the agent's files.
    Fresh,
    /// A kept workspace brought to the commit in place: the step user's
    /// files but for `.git`.
    Kept,
}

/// The whole walk of [`crate::kept`]: every entry changed since `fence`
/// or not in `to`'s tree renamed out, what is then missing written.
async fn sweep_and_restore(
    mirror: &Path,
    from: &str,
    to: &str,
    ws: &Path,
    fence: Option<crate::kept::Fence>,
    owner: Option<(u32, u32)>,
    trash: &Path,
) -> Result<(usize, usize), String> {
    let listing =
        git_out(Some(mirror), ["ls-tree", "-r", "-z", "--full-tree", to], &[]).await.map_err(|e| e.to_string())?;
    let stale = if from == to {
        Vec::new()
    } else {
        git_out(Some(mirror), ["diff-tree", "-r", "-z", "--no-renames", "--name-only", from, to], &[])
            .await
            .map_err(|e| e.to_string())?
    };
    let (ws, mirror, trash) = (ws.to_path_buf(), mirror.to_path_buf(), trash.to_path_buf());
    tokio::task::spawn_blocking(move || -> std::io::Result<(usize, usize)> {
        use std::os::unix::ffi::OsStrExt;
        let tree = crate::kept::Tree::parse(&listing)?;
        let stale: std::collections::HashSet<PathBuf> =
            stale.split(|b| *b == 0).filter(|p| !p.is_empty()).map(|p| PathBuf::from(OsStr::from_bytes(p))).collect();
        let mut doomed = crate::slots::Doomed::new(&trash);
        let fence = fence.unwrap_or(crate::kept::Fence::NEVER);
        let r = crate::kept::sweep(&ws, &tree, &stale, fence, &mut doomed);
        doomed.bury();
        let swept = r?;
        let written = crate::kept::restore(&ws, &mirror, &tree, &swept.present, owner)?;
        Ok((swept.doomed, written))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
}

/// Makes `ws/.git`: a minimal repository borrowing `objects` (alternates,
/// like `clone --shared`), HEAD detached at `sha`, no index yet.
async fn write_git_dir(ws: &Path, objects: &Path, sha: &str) -> std::io::Result<()> {
    let dot_git = ws.join(".git");
    for d in ["objects/info", "refs"] {
        tokio::fs::create_dir_all(dot_git.join(d)).await?;
    }
    tokio::fs::write(dot_git.join("objects/info/alternates"), format!("{}\n", objects.display())).await?;
    tokio::fs::write(dot_git.join("HEAD"), format!("{sha}\n")).await?;
    tokio::fs::write(
        dot_git.join("config"),
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = false\n",
    )
    .await
}

impl Mirrors {
    /// Brings the kept workspace `ws` of a big tree from commit `from` to
    /// `to` in place (see [`crate::kept`]): what its job changed since
    /// `fence` (none: nothing ran in it since it was last brought back) and
    /// what differs between the commits is renamed out and written again,
    /// `.git` is made afresh with the agent's copy of the index (`index`,
    /// moved on to `to`). False when it cannot: `ws` is then moved out (to
    /// `trash`) and the caller checks out afresh.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn reset_kept(
        &self,
        clone_url: &str,
        from: &str,
        to: &str,
        ws: &Path,
        private_objects: bool,
        fence: Option<crate::kept::Fence>,
        index: &Path,
        owner: Option<(u32, u32)>,
        trash: &Path,
    ) -> bool {
        let started = std::time::Instant::now();
        let r = self.try_reset_kept(clone_url, from, to, ws, private_objects, fence, index, owner, trash).await;
        match &r {
            Ok((doomed, written)) => tracing::debug!(
                ws = %ws.display(), from, to, doomed, written, ms = started.elapsed().as_millis() as u64,
                "kept workspace brought to its commit"
            ),
            Err(e) => tracing::warn!(ws = %ws.display(), error = %e,
                "cannot bring the kept workspace to its commit; checking out afresh"),
        }
        if r.is_err() {
            let _ = std::fs::remove_file(index);
            let mut doomed = crate::slots::Doomed::new(trash);
            if std::fs::symlink_metadata(ws).is_ok() && doomed.take(ws).is_err() {
                let _ = remove_tree(ws);
            }
            doomed.bury();
        }
        r.is_ok()
    }

    #[allow(clippy::too_many_arguments)]
    async fn try_reset_kept(
        &self,
        clone_url: &str,
        from: &str,
        to: &str,
        ws: &Path,
        private_objects: bool,
        fence: Option<crate::kept::Fence>,
        index: &Path,
        owner: Option<(u32, u32)>,
        trash: &Path,
    ) -> Result<(usize, usize), String> {
        let mirror = self.mirror_path(clone_url);
        if !index.is_file() {
            return Err("the agent kept no index of it".into());
        }
        // Nothing ran in it since it was brought to `from`: only what the
        // commits change is touched (no walk of the tree).
        let diff_only = fence.is_none() && from != to;
        let merged = async {
            if from == to {
                return Ok(());
            }
            // The kept index moved on to `to`: a two-tree merge keeps the
            // stat data of every entry the commits share.
            let next = index.with_extension("next");
            std::fs::copy(index, &next).map_err(|e| e.to_string())?;
            let env = [("GIT_INDEX_FILE".to_string(), next.display().to_string())];
            let o = OsStr::new;
            git_out(None, [o("--git-dir"), mirror.as_os_str(), o("read-tree"), o("-i"), o("-m"), o(from), o(to)], &env)
                .await
                .map_err(|e| e.to_string())?;
            std::fs::rename(&next, index).map_err(|e| e.to_string())
        };
        let files = async {
            if diff_only {
                let raw = git_out(Some(&mirror), ["diff-tree", "-r", "-z", "--no-renames", from, to], &[])
                    .await
                    .map_err(|e| e.to_string())?;
                let (ws, mirror, trash) = (ws.to_path_buf(), mirror.clone(), trash.to_path_buf());
                return tokio::task::spawn_blocking(move || -> std::io::Result<(usize, usize)> {
                    let mut doomed = crate::slots::Doomed::new(&trash);
                    let r = crate::kept::apply_diff(&ws, &mirror, &raw, &mut doomed, owner);
                    doomed.bury();
                    r
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string());
            }
            sweep_and_restore(&mirror, from, to, ws, fence, owner, trash).await
        };
        let (merged, swept) = tokio::join!(merged, files);
        merged?;
        let swept = swept?;
        let io = |e: std::io::Error| e.to_string();
        let objects = std::path::absolute(mirror.join("objects")).map_err(io)?;
        write_git_dir(ws, &objects, to).await.map_err(io)?;
        std::fs::copy(index, ws.join(".git/index")).map_err(io)?;
        if private_objects {
            self.give_objects(&mirror, ws).await.map_err(io)?;
        }
        Ok(swept)
    }

    /// Gives the workspace `ws` (its `.git` borrowing `mirror`'s objects)
    /// an object store of its own: hard links to the mirror's files, under
    /// the mirror's lock (no fetch is adding packs meanwhile), alternates
    /// removed.
    async fn give_objects(&self, mirror: &Path, ws: &Path) -> std::io::Result<()> {
        let lock = self.lock_for(mirror);
        let _guard = lock.lock().await;
        let objects = std::path::absolute(mirror.join("objects"))?;
        let dst = ws.join(".git/objects");
        tokio::task::spawn_blocking(move || link_objects(&objects, &dst)).await.expect("link task")?;
        tokio::fs::remove_file(ws.join(".git/objects/info/alternates")).await
    }

    /// Whether this agent keeps a pristine copy of `sha`'s tree (a small
    /// tree: its slots are reset from it, not by [`Mirrors::reset_kept`]).
    pub(crate) fn has_pristine(&self, clone_url: &str, sha: &str) -> bool {
        let p = self.pristine_path(&self.mirror_path(clone_url), sha);
        std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
    }
}

/// `<mirror>` + this + `<sha>`: a pristine checkout beside its mirror.
const PRISTINE_INFIX: &str = ".tree-";
/// Largest tree kept as a pristine copy: files (directories and links
/// included) and bytes. Beyond, `git read-tree` is the cheaper checkout.
const PRISTINE_MAX_FILES: u64 = 2_000;
const PRISTINE_MAX_BYTES: u64 = 32 * 1024 * 1024;

/// Gives `dst` every object file of `src` (a mirror's `objects/`): a hard
/// link where possible (the mirror's files are made read-only for all
/// first: they are immutable, and only reachable through a workspace of the
/// same repository), else a copy. Git's temporary files are skipped.
fn link_objects(src: &Path, dst: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let name = e.file_name();
        let n = name.to_string_lossy();
        if n.starts_with("tmp_") || n.starts_with("incoming-") || n == "alternates" {
            continue;
        }
        let (from, to) = (e.path(), dst.join(&name));
        let ft = e.file_type()?;
        if ft.is_dir() {
            link_objects(&from, &to)?;
        } else if ft.is_file() {
            if to.exists() {
                continue;
            }
            std::fs::set_permissions(&from, std::fs::Permissions::from_mode(0o444))?;
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to)?;
            }
        }
    }
    Ok(())
}

/// Local paths are made absolute (git runs with another working directory);
/// URLs and scp-like `host:path` pass as they are.
fn resolve_url(url: &str) -> Result<String, CheckoutError> {
    // The server checks URLs when a repository is registered; an agent does
    // not take that on trust (issue 13: an option-like URL or `ext::` helper
    // would run a command here).
    if kiln_api::giturl::check_clone_url(url).is_err() {
        return Err(CheckoutError::BadUrl(url.to_string()));
    }
    let p = Path::new(url);
    if !url.contains("://") && !url.contains(':') && p.is_relative() {
        let abs = std::env::current_dir().map(|d| d.join(p)).map_err(|_| CheckoutError::BadUrl(url.to_string()))?;
        return Ok(abs.display().to_string());
    }
    Ok(url.to_string())
}

async fn has_commit(repo: &Path, sha: &str) -> bool {
    git(Some(repo), ["cat-file", "-e", &format!("{sha}^{{commit}}")]).await.is_ok()
}

/// How often, and how patiently, a fetch is tried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FetchRetry {
    pub tries: u32,
    pub base: std::time::Duration,
    pub max: std::time::Duration,
}

impl Default for FetchRetry {
    fn default() -> Self {
        FetchRetry { tries: 3, base: std::time::Duration::from_secs(5), max: std::time::Duration::from_secs(60) }
    }
}

impl FetchRetry {
    /// The wait after failed try `n` (1-based): `base` doubling up to
    /// `max`, then ±15 % jitter.
    fn delay(&self, n: u32) -> std::time::Duration {
        let ceiling = self.base.saturating_mul(1u32 << (n - 1).min(16)).min(self.max);
        ceiling.mul_f64(rand::random_range(0.85..=1.15))
    }
}

/// Whether a failed git call is worth trying again: the network or the
/// server failed, not the request (a repository that does not exist, a
/// refused login, another 4xx stay failed however often they are asked).
fn is_transient(e: &CheckoutError) -> bool {
    if matches!(e, CheckoutError::TimedOut { .. }) {
        return true;
    }
    let CheckoutError::Git { detail, .. } = e else { return false };
    let d = detail.to_ascii_lowercase();
    const PERMANENT: &[&str] = &[
        "not found",
        "does not appear to be a git repository",
        "authentication failed",
        "could not read username",
        "permission denied",
        "returned error: 4",
        "unsupported protocol",
        "transport '",
    ];
    if d.contains("returned error: 429") {
        return true;
    }
    !PERMANENT.iter().any(|p| d.contains(p))
}

/// The longest a local git call of a checkout (init, cat-file, read-tree)
/// may take, and a fetch's default (spec 004: git clone, 10 min).
const LOCAL_GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

async fn git<I, S>(dir: Option<&Path>, args: I) -> Result<(), CheckoutError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    git_within(Some(LOCAL_GIT_TIMEOUT), dir, args).await
}

/// [`git`], returning what it printed, with more environment.
async fn git_out<I, S>(dir: Option<&Path>, args: I, env: &[(String, String)]) -> Result<Vec<u8>, CheckoutError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    git_within_env(Some(LOCAL_GIT_TIMEOUT), dir, args, env).await
}

/// Runs git, killed (and [`CheckoutError::TimedOut`]) past `limit`.
async fn git_within<I, S>(limit: Option<std::time::Duration>, dir: Option<&Path>, args: I) -> Result<(), CheckoutError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    git_within_env(limit, dir, args, &[]).await.map(drop)
}

/// [`git_within`] with more environment (a credential helper's).
async fn git_within_env<I, S>(
    limit: Option<std::time::Duration>,
    dir: Option<&Path>,
    args: I,
    env: &[(String, String)],
) -> Result<Vec<u8>, CheckoutError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
    let mut cmd = Command::new("git");
    cmd.args(["-c", "gc.auto=0", "-c", "maintenance.auto=false"]);
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    cmd.args(&args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", kiln_api::giturl::GIT_ALLOW_PROTOCOL)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout also kills the remote
        // helper (git-remote-http) that holds the stalled connection.
        .process_group(0)
        .kill_on_drop(true);
    let shown = || kiln_api::giturl::redact(&args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
    let child =
        cmd.spawn().map_err(|e| CheckoutError::Git { args: shown(), detail: format!("cannot run git: {e}") })?;
    let pgid = child.id().map(|id| nix::unistd::Pid::from_raw(id as i32));
    // spec 004: a git fetch gets 10 minutes by default; past it the whole
    // process group is killed.
    let output = child.wait_with_output();
    let out = match limit {
        Some(limit) => match tokio::time::timeout(limit, output).await {
            Ok(out) => out,
            Err(_) => {
                if let Some(pgid) = pgid {
                    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                }
                let limit = kiln_workflow::format_duration(limit);
                return Err(CheckoutError::TimedOut { args: shown(), limit });
            }
        },
        None => output.await,
    };
    let out = out.map_err(|e| CheckoutError::Git { args: shown(), detail: format!("cannot run git: {e}") })?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let detail = kiln_api::giturl::redact(&stderr.trim().chars().take(2000).collect::<String>());
    Err(CheckoutError::Git { args: shown(), detail: if detail.is_empty() { out.status.to_string() } else { detail } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Issue 47: the commits a long-lived agent remembers as present are
    /// bounded, however many it checks out.
    #[test]
    fn the_commits_remembered_as_present_are_bounded() {
        let m = Mirrors::new(PathBuf::from("/nonexistent/mirrors"));
        for i in 0..3 * KNOWN_MAX + 5 {
            m.remember(PathBuf::from("/m.git"), &format!("{i:040x}"));
            assert!(m.known.lock().unwrap().len() <= KNOWN_MAX);
        }
        let last = (PathBuf::from("/m.git"), format!("{:040x}", 3 * KNOWN_MAX + 4));
        assert!(m.known.lock().unwrap().contains(&last), "the latest commit is remembered");
    }

    /// A real git repository served over dumb HTTP by Python, answering
    /// 503 to its first `fail` requests.
    struct FlakyServer {
        child: std::process::Child,
        url: String,
        sha: String,
        _dir: tempfile::TempDir,
    }

    impl Drop for FlakyServer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn sh(dir: &Path, cmd: &str) -> String {
        let out = std::process::Command::new("sh").arg("-c").arg(cmd).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn flaky_server(fail: usize) -> FlakyServer {
        served(fail, false)
    }

    /// A server whose every GET hangs (it never answers).
    fn stalled_server() -> FlakyServer {
        served(0, true)
    }

    fn served(fail: usize, stall: bool) -> FlakyServer {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        sh(
            &repo,
            "git init -q && echo hi > f && git add f && git -c user.name=t -c user.email=t@t commit -qm one \
             && git update-server-info",
        );
        let sha = sh(&repo, "git rev-parse HEAD");
        let script = format!(
            r#"
import http.server, sys, functools
import time
left = [{fail}]
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if {stall}:
            time.sleep(3600)
        if left[0] > 0:
            left[0] -= 1
            self.send_error(503, "try later")
            return
        super().do_GET()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
print(s.server_address[1], flush=True)
s.serve_forever()
"#,
            stall = if stall { "True" } else { "False" }
        );
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(repo.join(".git"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = format!("http://127.0.0.1:{}/", line.trim());
        FlakyServer { child, url, sha, _dir: dir }
    }

    fn mirrors(dir: &Path) -> Mirrors {
        let mut m = Mirrors::new(dir.join("mirrors"));
        m.retry = FetchRetry {
            tries: 3,
            base: std::time::Duration::from_millis(20),
            max: std::time::Duration::from_millis(50),
        };
        m
    }

    #[tokio::test]
    async fn a_fetch_failing_with_503_is_retried_with_a_line_per_retry() {
        let server = flaky_server(2);
        let work = tempfile::tempdir().unwrap();
        let lines = Mutex::new(Vec::new());
        let on_retry = |l: String| lines.lock().unwrap().push(l);
        let ws = work.path().join("ws");
        mirrors(work.path()).checkout(&server.url, &server.sha, &ws, false, None, &on_retry).await.unwrap();
        assert_eq!(std::fs::read_to_string(ws.join("f")).unwrap(), "hi\n");
        let lines = lines.into_inner().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("try 1/3") && lines[0].contains("503"), "{lines:?}");
        assert!(lines[1].contains("try 2/3"), "{lines:?}");
    }

    #[tokio::test]
    async fn a_permanent_failure_is_not_retried_and_retries_are_bounded() {
        let server = flaky_server(0);
        let work = tempfile::tempdir().unwrap();
        let calls = AtomicUsize::new(0);
        let on_retry = |_: String| {
            calls.fetch_add(1, Ordering::SeqCst);
        };
        // 404: the repository does not exist there.
        let missing = format!("{}nosuch/", server.url);
        let e =
            mirrors(work.path()).checkout(&missing, &server.sha, &work.path().join("a"), false, None, &on_retry).await;
        assert!(e.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 0, "404 is permanent");
        // Always 503: three tries, two retries, then the error.
        let down = flaky_server(100);
        let e =
            mirrors(work.path()).checkout(&down.url, &down.sha, &work.path().join("b"), false, None, &on_retry).await;
        assert!(e.unwrap_err().to_string().contains("503"));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// `--git-timeout`: a fetch that never finishes is killed at the limit,
    /// tried again like any transient failure, and ends as `TimedOut`
    /// naming the flag.
    #[tokio::test]
    async fn a_fetch_past_the_git_timeout_is_killed_retried_and_reported() {
        let server = stalled_server();
        let work = tempfile::tempdir().unwrap();
        let lines = Mutex::new(Vec::new());
        let on_retry = |l: String| lines.lock().unwrap().push(l);
        let m = mirrors(work.path()).with_fetch_timeout(Some(std::time::Duration::from_millis(300)));
        let e =
            m.checkout(&server.url, &server.sha, &work.path().join("ws"), false, None, &on_retry).await.unwrap_err();
        assert!(matches!(e, CheckoutError::TimedOut { .. }), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains("took longer than 300ms") && shown.contains("--git-timeout"), "{shown}");
        let lines = lines.into_inner().unwrap();
        assert_eq!(lines.len(), 2, "a timeout is transient: tried 3 times: {lines:?}");
        assert!(lines[0].contains("try 1/3") && lines[0].contains("--git-timeout"), "{lines:?}");
        // Killed, not left behind: no git of this mirror still runs.
        let mirror = m.mirror_path(&server.url);
        let ps = std::process::Command::new("ps").args(["-eo", "args"]).output().unwrap();
        let ps = String::from_utf8_lossy(&ps.stdout);
        let port = server.url.trim_end_matches('/').rsplit(':').next().unwrap().to_string();
        let left: Vec<_> = ps
            .lines()
            .filter(|l| {
                l.contains("git") && (l.contains(&*mirror.to_string_lossy()) || l.contains(&format!(":{port}/")))
            })
            .collect();
        assert!(left.is_empty(), "git and its remote helper are killed: {left:?}");
    }

    /// A second checkout of a commit is copied from the pristine tree kept
    /// at the first: it holds none of what a job did to the first
    /// workspace (new, hidden and read-only files, a tracked file changed
    /// in place), and git sees it clean at the commit.
    #[tokio::test]
    async fn a_checkout_copied_from_the_pristine_tree_has_none_of_an_earlier_jobs_files() {
        let work = tempfile::tempdir().unwrap();
        let repo = work.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        sh(
            &repo,
            "git init -q && mkdir -p sub && echo hi > f && echo deep > sub/g && ln -s f link && chmod +x sub/g \
             && git add -A && git -c user.name=t -c user.email=t@t commit -qm one",
        );
        let sha = sh(&repo, "git rev-parse HEAD");
        let url = repo.display().to_string();
        let m = mirrors(work.path());
        let none = |_: String| {};
        let first = work.path().join("ws1");
        m.checkout(&url, &sha, &first, false, None, &none).await.unwrap();
        assert!(m.pristine_path(&m.mirror_path(&url), &sha).is_dir(), "kept after the first checkout");
        // What a job leaves behind.
        sh(
            &first,
            "echo changed > f.tmp && cat f.tmp > f && echo x > .hidden && mkdir -p ro/deeper && echo y > ro/deeper/z \
             && chmod -R a-w ro && echo dirty >> sub/g && git config user.name job",
        );
        let second = work.path().join("ws2");
        m.checkout(&url, &sha, &second, false, None, &none).await.unwrap();
        assert_eq!(std::fs::read_to_string(second.join("f")).unwrap(), "hi\n");
        assert_eq!(std::fs::read_to_string(second.join("sub/g")).unwrap(), "deep\n");
        assert_eq!(std::fs::read_link(second.join("link")).unwrap(), Path::new("f"));
        for left in ["f.tmp", ".hidden", "ro"] {
            assert!(!second.join(left).exists(), "{left} of the first job is not in the second workspace");
        }
        assert_eq!(sh(&second, "git status --porcelain"), "", "clean at the commit");
        assert_eq!(sh(&second, "git rev-parse HEAD"), sha);
        assert_eq!(sh(&second, "test -x sub/g && echo exec"), "exec", "modes kept");
        assert_eq!(sh(&second, "git config --local --get user.name || true"), "", "the job's git config is not kept");
        // The first workspace is the job's own, untouched by the copy.
        assert_eq!(std::fs::read_to_string(first.join("f")).unwrap(), "changed\n");
        // A checkout of another commit replaces the kept tree.
        sh(&repo, "echo two > f && git -c user.name=t -c user.email=t@t commit -qam two");
        let sha2 = sh(&repo, "git rev-parse HEAD");
        m.checkout(&url, &sha2, &work.path().join("ws3"), false, None, &none).await.unwrap();
        assert!(m.pristine_path(&m.mirror_path(&url), &sha2).is_dir());
        assert!(!m.pristine_path(&m.mirror_path(&url), &sha).exists(), "one kept tree per mirror");
    }

    #[test]
    fn delays_double_up_to_the_cap_with_jitter() {
        let r = FetchRetry::default();
        for (n, ceiling) in [(1, 5.0), (2, 10.0), (3, 20.0), (6, 60.0), (30, 60.0)] {
            let d = r.delay(n).as_secs_f64();
            assert!((ceiling * 0.85..=ceiling * 1.15).contains(&d), "try {n}: {d}s");
        }
    }
}
