//! Workspace checkout from agent-side bare mirrors.
//!
//! One bare mirror per clone URL, `<mirrors>/<sha256(url)[..16]>.git`,
//! fetched only when the wanted commit is missing, with fetches of one
//! mirror serialized. A workspace is a repository that borrows the mirror's
//! objects (alternates) with HEAD detached at the frozen commit, filled by one
//! `git read-tree -u`: no object copy, one short process.
//! The run's commit SHA is frozen at acceptance (invariant 1); branch names
//! are never consulted to pick the bytes.

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
    #[error("cannot prepare {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

pub(crate) struct Mirrors {
    dir: PathBuf,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    /// (mirror, sha) seen present: objects are never removed from a mirror,
    /// so the next checkout of that commit skips the `cat-file` probe.
    known: Mutex<std::collections::HashSet<(PathBuf, String)>>,
}

impl Mirrors {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Mirrors { dir, locks: Mutex::default(), known: Mutex::default() }
    }

    pub(crate) fn mirror_path(&self, clone_url: &str) -> PathBuf {
        let digest = hex::encode(Sha256::digest(clone_url.as_bytes()));
        self.dir.join(format!("{}.git", &digest[..16]))
    }

    fn lock_for(&self, mirror: &Path) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().expect("mirror locks").entry(mirror.to_path_buf()).or_default().clone()
    }

    /// Checks out `sha` of `clone_url` into `ws` (which must not exist).
    ///
    /// With `private_objects` (steps run as another user, who cannot open
    /// the agent's 0700 mirrors), the workspace gets its own object
    /// store instead of borrowing the mirror's: its files hard-linked (made
    /// read-only first; the step user does not own them) or copied.
    pub(crate) async fn checkout(
        &self,
        clone_url: &str,
        sha: &str,
        ws: &Path,
        private_objects: bool,
    ) -> Result<(), CheckoutError> {
        let full_sha = (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit());
        if !full_sha {
            return Err(CheckoutError::BadSha(sha.to_string()));
        }
        let url = resolve_url(clone_url)?;
        let mirror = self.mirror_path(clone_url);
        {
            let lock = self.lock_for(&mirror);
            let _guard = lock.lock().await;
            self.ensure_mirror(&mirror).await?;
            let known = self.known.lock().expect("known").contains(&(mirror.clone(), sha.to_string()));
            if !known && !has_commit(&mirror, sha).await {
                tracing::info!(url = %clone_url, mirror = %mirror.display(), "fetching into mirror");
                let fetch_all = git(
                    Some(&mirror),
                    ["fetch", "-q", "--no-tags", "--", &url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"],
                )
                .await;
                if !has_commit(&mirror, sha).await {
                    // An unadvertised commit (e.g. a pull request head): ask for it by id.
                    let by_id = git(Some(&mirror), ["fetch", "-q", "--no-tags", "--", &url, sha]).await;
                    if !has_commit(&mirror, sha).await {
                        return Err(match (fetch_all, by_id) {
                            (Err(e), _) => e,
                            _ => CheckoutError::MissingCommit { sha: sha.to_string(), url: clone_url.to_string() },
                        });
                    }
                }
            }
        }
        // The workspace is a minimal repository borrowing the mirror's objects
        // (alternates, like `clone --shared`), HEAD detached at the frozen
        // commit; one `read-tree` fills index and files. This skips clone's
        // templates, ref negotiation and upload-pack process: a checkout
        // costs one short git process.
        let io = |source| CheckoutError::Io { path: ws.display().to_string(), source };
        let objects = std::path::absolute(mirror.join("objects")).map_err(io)?;
        let dot_git = ws.join(".git");
        for d in ["objects/info", "refs"] {
            tokio::fs::create_dir_all(dot_git.join(d)).await.map_err(io)?;
        }
        tokio::fs::write(dot_git.join("objects/info/alternates"), format!("{}\n", objects.display()))
            .await
            .map_err(io)?;
        tokio::fs::write(dot_git.join("HEAD"), format!("{sha}\n")).await.map_err(io)?;
        tokio::fs::write(
            dot_git.join("config"),
            "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = false\n",
        )
        .await
        .map_err(io)?;
        git(Some(ws), ["read-tree", "--reset", "-u", sha]).await?;
        if private_objects {
            // Under the mirror's lock: no fetch is adding packs meanwhile.
            let lock = self.lock_for(&mirror);
            let _guard = lock.lock().await;
            let (src, dst) = (objects.clone(), dot_git.join("objects"));
            tokio::task::spawn_blocking(move || link_objects(&src, &dst)).await.expect("link task").map_err(io)?;
            tokio::fs::remove_file(dot_git.join("objects/info/alternates")).await.map_err(io)?;
        }
        self.known.lock().expect("known").insert((mirror, sha.to_string()));
        Ok(())
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

/// The longest any git call of a checkout may take (spec 004: git clone, 10 min).
const GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

async fn git<I, S>(dir: Option<&Path>, args: I) -> Result<(), CheckoutError>
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
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let shown = || args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
    // spec 004: a git fetch gets 10 minutes; the process is killed after.
    let out = match tokio::time::timeout(GIT_TIMEOUT, cmd.output()).await {
        Ok(out) => out.map_err(|e| CheckoutError::Git { args: shown(), detail: format!("cannot run git: {e}") })?,
        Err(_) => return Err(CheckoutError::Git { args: shown(), detail: format!("timed out after {GIT_TIMEOUT:?}") }),
    };
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let detail = stderr.trim().chars().take(2000).collect::<String>();
    Err(CheckoutError::Git { args: shown(), detail: if detail.is_empty() { out.status.to_string() } else { detail } })
}
