//! Server-side repository mirrors: resolve a commit once, at acceptance, and
//! read the workflow file at that exact SHA (spec 000 §5, invariant 1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::process::Command;
use tokio::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot fetch from {url}: {detail}")]
    Fetch { url: String, detail: String },
    #[error("commit or ref `{0}` was not found in the repository")]
    UnknownRevision(String),
    #[error("workflow file `{path}` does not exist at commit {sha}")]
    MissingFile { path: String, sha: String },
    #[error("git failed: {0}")]
    Other(String),
}

#[derive(Clone)]
pub struct Mirrors {
    root: PathBuf,
    locks: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
    /// Content at a commit never changes: (repo, sha) known to be present,
    /// and (repo, sha, path) → bytes, so resubmitting a commit runs no git.
    known: Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
    files: Arc<std::sync::Mutex<HashMap<FileKey, Arc<Vec<u8>>>>>,
}

const FILE_CACHE_ENTRIES: usize = 512;

/// (repository id, commit sha, path).
type FileKey = (String, String, String);

/// Normalise `file://` and plain paths; remote URLs pass through.
pub fn normalize_url(url: &str) -> String {
    url.strip_prefix("file://").map(str::to_string).unwrap_or_else(|| url.to_string())
}

fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn git(dir: &Path, args: &[&str]) -> Result<std::process::Output, GitError> {
    Command::new("git")
        // No background gc/maintenance processes forked by fetches.
        .args(["-c", "gc.auto=0", "-c", "maintenance.auto=false"])
        .arg("--git-dir")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| GitError::Other(format!("cannot run git: {e}")))
}

impl Mirrors {
    pub fn new(root: PathBuf) -> Self {
        Mirrors { root, locks: Default::default(), known: Default::default(), files: Default::default() }
    }

    fn dir(&self, repo_id: &str) -> PathBuf {
        self.root.join(format!("{repo_id}.git"))
    }

    async fn lock(&self, repo_id: &str) -> Arc<Mutex<()>> {
        self.locks.lock().await.entry(repo_id.to_string()).or_default().clone()
    }

    /// Fetch every ref of `url` into the mirror of `repo_id`, creating it.
    pub async fn fetch(&self, repo_id: &str, url: &str) -> Result<(), GitError> {
        let dir = self.dir(repo_id);
        if !dir.join("HEAD").exists() {
            tokio::fs::create_dir_all(&dir).await.map_err(|e| GitError::Other(e.to_string()))?;
            let out = git(&dir, &["init", "--bare", "-q"]).await?;
            if !out.status.success() {
                return Err(GitError::Other(String::from_utf8_lossy(&out.stderr).into()));
            }
        }
        let url = normalize_url(url);
        let out = git(
            &dir,
            &[
                "fetch",
                "-q",
                "--prune",
                "--no-tags",
                &url,
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
                "+HEAD:refs/kiln/HEAD",
            ],
        )
        .await?;
        if !out.status.success() {
            return Err(GitError::Fetch { url, detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
        }
        Ok(())
    }

    /// Resolve `rev` (a SHA or ref) to a commit SHA, fetching when the answer
    /// could be stale: refs are always refetched, a full SHA only if absent.
    pub async fn resolve(&self, repo_id: &str, url: &str, rev: &str) -> Result<String, GitError> {
        if rev.is_empty()
            || rev.starts_with('-')
            || rev.contains("..")
            || rev.chars().any(|c| c.is_control() || c == ' ')
        {
            return Err(GitError::UnknownRevision(rev.to_string()));
        }
        let key = (repo_id.to_string(), rev.to_ascii_lowercase());
        if is_full_sha(rev) && self.known.lock().expect("cache").contains(&key) {
            return Ok(key.1);
        }
        let lock = self.lock(repo_id).await;
        let _g = lock.lock().await;
        let dir = self.dir(repo_id);
        if !(is_full_sha(rev) && self.has_commit(&dir, rev).await) {
            self.fetch(repo_id, url).await?;
        }
        let spec = if rev == "HEAD" { "refs/kiln/HEAD".to_string() } else { rev.to_string() };
        let out = git(&dir, &["rev-parse", "--verify", "-q", &format!("{spec}^{{commit}}")]).await?;
        if !out.status.success() {
            return Err(GitError::UnknownRevision(rev.to_string()));
        }
        let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
        self.known.lock().expect("cache").insert((repo_id.to_string(), sha.clone()));
        Ok(sha)
    }

    async fn has_commit(&self, dir: &Path, sha: &str) -> bool {
        matches!(git(dir, &["cat-file", "-e", &format!("{sha}^{{commit}}")]).await, Ok(o) if o.status.success())
    }

    /// Read `path` at commit `sha`, refusing files over `max_bytes`.
    pub async fn read_file(&self, repo_id: &str, sha: &str, path: &str, max_bytes: usize) -> Result<Vec<u8>, GitError> {
        let key = (repo_id.to_string(), sha.to_string(), path.to_string());
        if let Some(b) = self.files.lock().expect("cache").get(&key) {
            return Ok(b.as_ref().clone());
        }
        let bytes = self.read_file_uncached(repo_id, sha, path, max_bytes).await?;
        let mut files = self.files.lock().expect("cache");
        if files.len() >= FILE_CACHE_ENTRIES {
            files.clear();
        }
        files.insert(key, Arc::new(bytes.clone()));
        Ok(bytes)
    }

    async fn read_file_uncached(
        &self,
        repo_id: &str,
        sha: &str,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, GitError> {
        let dir = self.dir(repo_id);
        let spec = format!("{sha}:{}", path.trim_start_matches("./"));
        let size = git(&dir, &["cat-file", "-s", &spec]).await?;
        if !size.status.success() {
            return Err(GitError::MissingFile { path: path.into(), sha: sha.into() });
        }
        let n: usize = String::from_utf8_lossy(&size.stdout).trim().parse().unwrap_or(usize::MAX);
        if n > max_bytes {
            return Err(GitError::Other(format!("workflow file `{path}` is {n} bytes; the limit is {max_bytes}")));
        }
        let out = git(&dir, &["cat-file", "blob", &spec]).await?;
        if !out.status.success() {
            return Err(GitError::MissingFile { path: path.into(), sha: sha.into() });
        }
        Ok(out.stdout)
    }
}
