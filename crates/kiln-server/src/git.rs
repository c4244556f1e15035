//! Server-side repository mirrors: resolve a commit once, at acceptance, and
//! read the workflow file at that exact SHA (spec 000 §5, invariant 1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
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
    /// (repo, sha) → what the commit says (it never changes either).
    commits: Arc<std::sync::Mutex<HashMap<(String, String), kiln_api::CommitInfo>>>,
    /// (repo, sha) → its workflow files ([`Mirrors::list_workflows`]): a
    /// commit's tree never changes, and a run submitted without a workflow
    /// path would otherwise run `git ls-tree` each time (issue 47).
    listings: Arc<std::sync::Mutex<HashMap<(String, String), Listing>>>,
    /// (repo, sha, path) → the workflow parsed and validated there, with
    /// its includes ([`Mirrors::parse_workflow`]): a function of the
    /// commit's bytes alone. A submission without a workflow path parses
    /// its workflow to select it, then again to run it.
    parsed: Arc<std::sync::Mutex<HashMap<FileKey, Arc<kiln_workflow::Workflow>>>>,
}

const FILE_CACHE_ENTRIES: usize = 512;

/// (repository id, commit sha, path).
type FileKey = (String, String, String);

/// A commit's workflow files (see [`Mirrors::list_workflows`]).
type Listing = Arc<Vec<String>>;

/// Inserts into one of the mirror's caches, emptying it first once it
/// holds [`FILE_CACHE_ENTRIES`] entries (a bound, not an LRU: entries are
/// cheap to read again).
fn remember<K: std::hash::Hash + Eq, V>(cache: &std::sync::Mutex<HashMap<K, V>>, key: K, value: V) {
    let mut cache = cache.lock().expect("cache");
    if cache.len() >= FILE_CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(key, value);
}

/// Normalise `file://` and plain paths; remote URLs pass through.
pub fn normalize_url(url: &str) -> String {
    url.strip_prefix("file://").map(str::to_string).unwrap_or_else(|| url.to_string())
}

fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How long a fetch from the repository's remote may take (spec 004: git
/// clone, 10 min); local git calls get [`LOCAL_TIMEOUT`].
const FETCH_TIMEOUT: Duration = Duration::from_secs(600);
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Beyond this many changed files a diff is "unknown" for path filters.
pub const MAX_CHANGED_FILES: usize = 3000;

/// Runs git on the mirror `dir`. Transports are restricted for any URL
/// (`GIT_ALLOW_PROTOCOL`: no `ext::` helpers), nothing prompts, and the
/// process is killed when `limit` passes.
async fn git_within(
    dir: &Path,
    args: &[&str],
    limit: Duration,
    env: &[(String, String)],
) -> Result<std::process::Output, GitError> {
    let out = Command::new("git")
        // No background gc/maintenance processes forked by fetches.
        .args(["-c", "gc.auto=0", "-c", "maintenance.auto=false"])
        .arg("--git-dir")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", kiln_api::giturl::GIT_ALLOW_PROTOCOL)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, out).await {
        Ok(out) => out.map_err(|e| GitError::Other(format!("cannot run git: {e}"))),
        Err(_) => Err(GitError::Other(format!("`git {}` took longer than {limit:?}", args.first().unwrap_or(&"")))),
    }
}

/// `git ls-remote ARGS` for `remote`, outside any repository: no prompt,
/// only the allowed transports, the remote's credential environment, and
/// killed when dropped.
fn ls_remote(remote: &Remote, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("ls-remote")
        .args(args)
        .current_dir(std::env::temp_dir())
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", kiln_api::giturl::GIT_ALLOW_PROTOCOL)
        .envs(remote.env())
        .env_remove("GIT_DIR")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// How long `probe` waits for a remote to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `url` answers as a git repository (`git ls-remote --heads`),
/// run outside any repository: what `POST /v1/repos` checks before it
/// registers anything. The error says what git said.
pub async fn probe(remote: &Remote) -> Result<(), GitError> {
    remote.check()?;
    let url = &remote.url;
    let target = normalize_url(url);
    let mut cmd = ls_remote(remote, &["--heads", "--", &target]);
    let out = cmd.output();
    let out = match tokio::time::timeout(PROBE_TIMEOUT, out).await {
        Ok(out) => out.map_err(|e| GitError::Other(format!("cannot run git: {e}")))?,
        Err(_) => {
            return Err(GitError::Fetch {
                url: url.to_string(),
                detail: format!("no answer within {PROBE_TIMEOUT:?}"),
            });
        }
    };
    if !out.status.success() {
        return Err(GitError::Fetch { url: url.to_string(), detail: stderr_of(&out) });
    }
    Ok(())
}

/// The branch the remote's HEAD is a symbolic ref to (`refs/heads/NAME`),
/// or None when it is detached, the remote does not say, or cannot be
/// asked (the fetch that follows reports an unreachable remote).
async fn remote_head_branch(remote: &Remote) -> Option<String> {
    remote.check().ok()?;
    let url = normalize_url(&remote.url);
    let mut cmd = ls_remote(remote, &["--symref", "--", &url, "HEAD"]);
    let out = cmd.output();
    let out = tokio::time::timeout(PROBE_TIMEOUT, out).await.ok()?.ok()?;
    if !out.status.success() {
        return None;
    }
    symref_of_head(&String::from_utf8_lossy(&out.stdout))
}

/// `ref: refs/heads/main<TAB>HEAD` in `git ls-remote --symref` output.
fn symref_of_head(listing: &str) -> Option<String> {
    listing.lines().find_map(|l| {
        let (target, name) = l.strip_prefix("ref: ")?.split_once('\t')?;
        (name == "HEAD" && target.starts_with("refs/heads/")).then(|| target.to_string())
    })
}

/// What git said, with any URL credential in it redacted.
fn stderr_of(out: &std::process::Output) -> String {
    kiln_api::giturl::redact(String::from_utf8_lossy(&out.stderr).trim())
}

/// A repository's remote: its URL (never with a credential in it) and the
/// credential git is given through its environment.
#[derive(Clone, Debug, Default)]
pub struct Remote {
    pub url: String,
    pub credential: Option<kiln_api::giturl::CloneCredential>,
}

impl Remote {
    /// The remote of `url` with `credential`; a credential still written in
    /// the URL (stored by an older version) is taken out of it here too.
    pub fn new(url: &str, credential: Option<kiln_api::giturl::CloneCredential>) -> Remote {
        let (url, inline) = kiln_api::giturl::split_credential(url);
        Remote { url, credential: credential.or(inline) }
    }

    /// Checked again before every git call: a URL stored before the check
    /// existed is not trusted either.
    fn check(&self) -> Result<(), GitError> {
        kiln_api::giturl::check_clone_url(&self.url)
            .map_err(|detail| GitError::Fetch { url: self.url.clone(), detail: kiln_api::giturl::redact(&detail) })
    }

    fn env(&self) -> Vec<(String, String)> {
        match &self.credential {
            Some(c) => kiln_api::giturl::git_credential_env(&self.url, c),
            None => Vec::new(),
        }
    }
}

async fn git(dir: &Path, args: &[&str]) -> Result<std::process::Output, GitError> {
    git_within(dir, args, LOCAL_TIMEOUT, &[]).await
}

impl Mirrors {
    pub fn new(root: PathBuf) -> Self {
        Mirrors {
            root,
            locks: Default::default(),
            known: Default::default(),
            files: Default::default(),
            commits: Default::default(),
            listings: Default::default(),
            parsed: Default::default(),
        }
    }

    fn dir(&self, repo_id: &str) -> PathBuf {
        self.root.join(format!("{repo_id}.git"))
    }

    async fn lock(&self, repo_id: &str) -> Arc<Mutex<()>> {
        self.locks.lock().await.entry(repo_id.to_string()).or_default().clone()
    }

    /// An exclusive lock on `{repo_id}.lock` beside the mirror, held until
    /// the returned file is dropped (other processes wait for it).
    async fn file_lock(&self, repo_id: &str) -> Result<std::fs::File, GitError> {
        let path = self.root.join(format!("{repo_id}.lock"));
        let other = |e: std::io::Error| GitError::Other(format!("mirror lock {}: {e}", path.display()));
        tokio::fs::create_dir_all(&self.root).await.map_err(other)?;
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(other)?;
        tokio::task::spawn_blocking(move || file.lock().map(|()| file))
            .await
            .map_err(|e| GitError::Other(e.to_string()))?
            .map_err(other)
    }

    /// Fetch every ref of `url` into the mirror of `repo_id`, creating it.
    pub async fn fetch(&self, repo_id: &str, remote: &Remote) -> Result<(), GitError> {
        let dir = self.dir(repo_id);
        if !dir.join("HEAD").exists() {
            // Initialized aside and renamed into place: a mirror directory
            // either does not exist or is a whole repository.
            let tmp = self.root.join(format!("{repo_id}.git.init-{}", uuid::Uuid::new_v4()));
            tokio::fs::create_dir_all(&tmp).await.map_err(|e| GitError::Other(e.to_string()))?;
            let out = git(&tmp, &["init", "--bare", "-q"]).await?;
            if !out.status.success() {
                let _ = tokio::fs::remove_dir_all(&tmp).await;
                return Err(GitError::Other(String::from_utf8_lossy(&out.stderr).into()));
            }
            if tokio::fs::rename(&tmp, &dir).await.is_err() && !dir.join("HEAD").exists() {
                // A half-made mirror (a crash while creating it in place, as
                // versions before this did): replace it. The file lock is held.
                let _ = tokio::fs::remove_dir_all(&dir).await;
                if let Err(e) = tokio::fs::rename(&tmp, &dir).await {
                    let _ = tokio::fs::remove_dir_all(&tmp).await;
                    return Err(GitError::Other(format!("cannot create mirror {}: {e}", dir.display())));
                }
            }
            let _ = tokio::fs::remove_dir_all(&tmp).await;
        }
        // Checked again here: a URL stored before the check existed is not
        // trusted either. `--` ends git's options before the URL.
        remote.check()?;
        let url = normalize_url(&remote.url);
        let out = git_within(
            &dir,
            &[
                "fetch",
                "-q",
                "--prune",
                "--no-tags",
                "--",
                &url,
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
                "+HEAD:refs/kiln/HEAD",
            ],
            FETCH_TIMEOUT,
            &remote.env(),
        )
        .await?;
        if !out.status.success() {
            return Err(GitError::Fetch { url, detail: stderr_of(&out) });
        }
        Ok(())
    }

    /// Resolve `rev` (a SHA or ref) to a commit SHA, fetching when the answer
    /// could be stale: refs are always refetched, a full SHA only if absent.
    pub async fn resolve(&self, repo_id: &str, remote: &Remote, rev: &str) -> Result<String, GitError> {
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
            // Replicas may share the data directory: one fetch into a
            // mirror at a time across processes too.
            let _file_lock = self.file_lock(repo_id).await?;
            self.fetch(repo_id, remote).await?;
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

    /// Resolve what an API caller named to a commit and the full ref it
    /// names (issue 39): a full SHA is itself (no ref); `HEAD` is the
    /// branch the remote's HEAD points to (see [`Self::resolve_head`]); a full ref (`refs/...`) is that ref; a short name is the
    /// branch `refs/heads/NAME` if there is one, else the tag `refs/tags/NAME`
    /// — never a tag that shadows a branch, as git's own lookup order would
    /// — else an abbreviated commit id (no ref). Anything else is unknown.
    pub async fn resolve_named(
        &self,
        repo_id: &str,
        remote: &Remote,
        rev: &str,
    ) -> Result<(String, Option<String>), GitError> {
        let hex = !rev.is_empty() && rev.bytes().all(|b| b.is_ascii_hexdigit());
        if is_full_sha(rev) || (hex && rev.len() == 64) {
            return Ok((self.resolve(repo_id, remote, rev).await?, None));
        }
        if rev == "HEAD" {
            return self.resolve_head(repo_id, remote).await;
        }
        if rev.starts_with("refs/") {
            return Ok((self.resolve(repo_id, remote, rev).await?, Some(rev.to_string())));
        }
        let branch = format!("refs/heads/{rev}");
        match self.resolve(repo_id, remote, &branch).await {
            Ok(sha) => return Ok((sha, Some(branch))),
            Err(GitError::UnknownRevision(_)) => {}
            Err(e) => return Err(e),
        }
        // Fetched just now by the branch lookup: no second fetch.
        let dir = self.dir(repo_id);
        let tag = format!("refs/tags/{rev}");
        let out = git(&dir, &["rev-parse", "--verify", "-q", &format!("{tag}^{{commit}}")]).await?;
        if out.status.success() {
            return Ok((String::from_utf8_lossy(&out.stdout).trim().to_string(), Some(tag)));
        }
        if hex && rev.len() >= 4 {
            let out = git(&dir, &["rev-parse", "--verify", "-q", &format!("{rev}^{{commit}}")]).await?;
            if out.status.success() {
                return Ok((String::from_utf8_lossy(&out.stdout).trim().to_string(), None));
            }
        }
        Err(GitError::UnknownRevision(rev.to_string()))
    }

    /// `HEAD` as the branch it stands for (issue 41, item 8: one name per
    /// branch): the branch the remote's HEAD points to (`git ls-remote
    /// --symref`), so a run started at HEAD carries `refs/heads/main` as a
    /// run started with `main` does, and branch filters, `on:` filters and
    /// concurrency groups see one name. A remote that does not say (its
    /// HEAD detached, or a transport without symrefs) gets the one branch
    /// at HEAD's commit, else the ref stays `HEAD`.
    pub async fn resolve_head(&self, repo_id: &str, remote: &Remote) -> Result<(String, Option<String>), GitError> {
        if let Some(branch) = remote_head_branch(remote).await {
            match self.resolve(repo_id, remote, &branch).await {
                Ok(sha) => return Ok((sha, Some(branch))),
                // HEAD names a branch with no commit yet: as if it did not say.
                Err(GitError::UnknownRevision(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let sha = self.resolve(repo_id, remote, "HEAD").await?;
        let out =
            git(&self.dir(repo_id), &["for-each-ref", "--format=%(refname)", "--points-at", &sha, "--", "refs/heads/"])
                .await?;
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        let branches: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
        let git_ref = match branches.as_slice() {
            [one] if out.status.success() => one.to_string(),
            _ => "HEAD".to_string(),
        };
        Ok((sha, Some(git_ref)))
    }

    /// Fetch one ref (a pull request's head, which a fork's commit is only
    /// reachable from) into the mirror under the same name.
    pub async fn fetch_ref(&self, repo_id: &str, remote: &Remote, git_ref: &str) -> Result<(), GitError> {
        if !git_ref.starts_with("refs/")
            || git_ref.contains("..")
            || git_ref.chars().any(|c| c.is_control() || c == ' ' || c == ':' || c == '*')
        {
            return Err(GitError::UnknownRevision(git_ref.to_string()));
        }
        let lock = self.lock(repo_id).await;
        let _g = lock.lock().await;
        let _file_lock = self.file_lock(repo_id).await?;
        if !self.dir(repo_id).join("HEAD").exists() {
            self.fetch(repo_id, remote).await?;
        }
        remote.check()?;
        let url = normalize_url(&remote.url);
        let spec = format!("+{git_ref}:{git_ref}");
        let out = git_within(
            &self.dir(repo_id),
            &["fetch", "-q", "--no-tags", "--", &url, &spec],
            FETCH_TIMEOUT,
            &remote.env(),
        )
        .await?;
        if !out.status.success() {
            return Err(GitError::Fetch { url, detail: stderr_of(&out) });
        }
        Ok(())
    }

    /// `sha` if the remote's `git_ref` (fetched now, under the same name)
    /// is that commit or has it as an ancestor; [`GitError::UnknownRevision`]
    /// if not. What the mirror held before does not count.
    pub async fn commit_on_remote_ref(
        &self,
        repo_id: &str,
        remote: &Remote,
        git_ref: &str,
        sha: &str,
    ) -> Result<String, GitError> {
        if !(is_full_sha(sha) || (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()))) {
            return Err(GitError::UnknownRevision(sha.to_string()));
        }
        let sha = sha.to_ascii_lowercase();
        // The mirror's copy of a branch or tag only ever comes from the
        // remote's ref of the same name: a commit already on it was on the
        // remote's ref. Otherwise the ref is fetched now and asked again.
        if !(self.dir(repo_id).join("HEAD").exists() && self.on_mirror_ref(repo_id, git_ref, &sha).await?) {
            self.fetch_ref(repo_id, remote, git_ref).await?;
            if !self.on_mirror_ref(repo_id, git_ref, &sha).await? {
                return Err(GitError::UnknownRevision(sha));
            }
        }
        self.known.lock().expect("cache").insert((repo_id.to_string(), sha.clone()));
        Ok(sha)
    }

    /// Whether the mirror's `git_ref` is `sha` or has it as an ancestor.
    async fn on_mirror_ref(&self, repo_id: &str, git_ref: &str, sha: &str) -> Result<bool, GitError> {
        let lock = self.lock(repo_id).await;
        let _g = lock.lock().await;
        let dir = self.dir(repo_id);
        let tip = git(&dir, &["rev-parse", "--verify", "-q", &format!("{git_ref}^{{commit}}")]).await?;
        if !tip.status.success() {
            return Ok(false);
        }
        let tip = String::from_utf8_lossy(&tip.stdout).trim().to_string();
        if tip == sha {
            return Ok(true);
        }
        if !self.has_commit(&dir, sha).await {
            return Ok(false);
        }
        Ok(git(&dir, &["merge-base", "--is-ancestor", sha, &tip]).await?.status.success())
    }

    /// The workflow files at `sha`: `.kiln/*.yaml` and `.kiln/*.yml` (not in
    /// subdirectories), sorted; each is a separate pipeline. Cached for a
    /// full commit id (a name such as a branch may move).
    pub async fn list_workflows(&self, repo_id: &str, sha: &str) -> Result<Vec<String>, GitError> {
        let key = (repo_id.to_string(), sha.to_ascii_lowercase());
        let cached = is_full_sha(sha).then(|| self.listings.lock().expect("cache").get(&key).cloned()).flatten();
        if let Some(files) = cached {
            return Ok(files.as_ref().clone());
        }
        let files = self.list_workflows_uncached(repo_id, sha).await?;
        if is_full_sha(sha) {
            remember(&self.listings, key, Arc::new(files.clone()));
        }
        Ok(files)
    }

    async fn list_workflows_uncached(&self, repo_id: &str, sha: &str) -> Result<Vec<String>, GitError> {
        let out = git(&self.dir(repo_id), &["ls-tree", "-z", sha, "--", ".kiln/"]).await?;
        if !out.status.success() {
            return Err(GitError::UnknownRevision(sha.to_string()));
        }
        let mut files: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .filter_map(|entry| {
                let entry = std::str::from_utf8(entry).ok()?;
                let (meta, path) = entry.split_once('\t')?;
                let kind = meta.split(' ').nth(1)?;
                (kind == "blob" && (path.ends_with(".yaml") || path.ends_with(".yml"))).then(|| path.to_string())
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Paths changed from `from` to `to` (`three_dot`: since their merge
    /// base, as a pull request's diff). None when it cannot be known: `from`
    /// is missing from the mirror (a force push's old tip), or the diff is
    /// larger than [`MAX_CHANGED_FILES`] (then path filters do not exclude).
    pub async fn changed_files(
        &self,
        repo_id: &str,
        from: &str,
        to: &str,
        three_dot: bool,
    ) -> Result<Option<Vec<String>>, GitError> {
        let dir = self.dir(repo_id);
        if !self.has_commit(&dir, from).await || !self.has_commit(&dir, to).await {
            return Ok(None);
        }
        let range = if three_dot { format!("{from}...{to}") } else { format!("{from}..{to}") };
        let out = git(&dir, &["diff", "--name-only", "-z", "--no-renames", &range, "--"]).await?;
        if !out.status.success() {
            return Ok(None);
        }
        let files: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .take(MAX_CHANGED_FILES + 1)
            .collect();
        Ok((files.len() <= MAX_CHANGED_FILES).then_some(files))
    }

    /// The branch and tag heads of `url` (`git ls-remote`), tags peeled to
    /// their commits.
    pub async fn ls_remote(&self, repo_id: &str, remote: &Remote) -> Result<Vec<(String, String)>, GitError> {
        if !self.dir(repo_id).join("HEAD").exists() {
            let lock = self.lock(repo_id).await;
            let _g = lock.lock().await;
            let _file_lock = self.file_lock(repo_id).await?;
            self.fetch(repo_id, remote).await?;
        }
        remote.check()?;
        let url = normalize_url(&remote.url);
        let out = git_within(
            &self.dir(repo_id),
            &["ls-remote", "--heads", "--tags", "--", &url],
            FETCH_TIMEOUT,
            &remote.env(),
        )
        .await?;
        if !out.status.success() {
            return Err(GitError::Fetch { url, detail: stderr_of(&out) });
        }
        let mut heads: std::collections::BTreeMap<String, String> = Default::default();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((sha, name)) = line.split_once('\t') else { continue };
            match name.strip_suffix("^{}") {
                // The peeled commit of an annotated tag wins over the tag object.
                Some(tag) => {
                    heads.insert(tag.to_string(), sha.to_string());
                }
                None => {
                    heads.entry(name.to_string()).or_insert_with(|| sha.to_string());
                }
            }
        }
        Ok(heads.into_iter().collect())
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
        remember(&self.files, key, Arc::new(bytes.clone()));
        Ok(bytes)
    }

    /// The message and author of commit `sha` in the mirror (the web UI's
    /// run page). Cached: a commit's metadata never changes.
    pub async fn commit_info(&self, repo_id: &str, sha: &str) -> Result<kiln_api::CommitInfo, GitError> {
        if !is_full_sha(sha) {
            return Err(GitError::UnknownRevision(sha.to_string()));
        }
        let key = (repo_id.to_string(), sha.to_string());
        if let Some(c) = self.commits.lock().expect("cache").get(&key) {
            return Ok(c.clone());
        }
        // NUL-separated: names and messages may hold any other character.
        let out = git_within(
            &self.dir(repo_id),
            &["show", "-s", "--format=%an%x00%ae%x00%at%x00%B", sha, "--"],
            Duration::from_secs(5),
            &[],
        )
        .await?;
        if !out.status.success() {
            return Err(GitError::UnknownRevision(sha.to_string()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut parts = text.splitn(4, '\0');
        let (name, email, at, message) = (parts.next(), parts.next(), parts.next(), parts.next());
        let info = kiln_api::CommitInfo {
            author_name: name.unwrap_or_default().to_string(),
            author_email: email.unwrap_or_default().to_string(),
            authored_at_ms: at.and_then(|t| t.trim().parse::<i64>().ok()).map(|s| s * 1000),
            message: message.unwrap_or_default().trim_end().to_string(),
        };
        remember(&self.commits, key, info.clone());
        Ok(info)
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

/// Why a workflow could not be read at a commit.
#[derive(Debug)]
pub enum WorkflowFileError {
    /// The file itself could not be read.
    Read(GitError),
    /// It (or a file it includes) is not a valid workflow.
    Invalid(kiln_workflow::Diagnostics),
    Internal(String),
}

impl Mirrors {
    /// The workflow file `path` at `sha`, with every file it `include`s read
    /// at the same commit (spec 000 §5: the composed definition is what is
    /// frozen), parsed and validated off the async runtime.
    pub async fn parse_workflow(
        &self,
        repo_id: &str,
        sha: &str,
        path: &str,
    ) -> Result<kiln_workflow::Workflow, WorkflowFileError> {
        let key = (repo_id.to_string(), sha.to_ascii_lowercase(), path.to_string());
        let cached = is_full_sha(sha).then(|| self.parsed.lock().expect("cache").get(&key).cloned()).flatten();
        if let Some(wf) = cached {
            return Ok(wf.as_ref().clone());
        }
        let wf = self.parse_workflow_uncached(repo_id, sha, path).await?;
        if is_full_sha(sha) {
            remember(&self.parsed, key, Arc::new(wf.clone()));
        }
        Ok(wf)
    }

    async fn parse_workflow_uncached(
        &self,
        repo_id: &str,
        sha: &str,
        path: &str,
    ) -> Result<kiln_workflow::Workflow, WorkflowFileError> {
        let max = kiln_workflow::MAX_FILE_BYTES;
        let bytes = self.read_file(repo_id, sha, path, max).await.map_err(WorkflowFileError::Read)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            WorkflowFileError::Invalid(kiln_workflow::Diagnostics(vec![kiln_workflow::Diagnostic::new(
                0,
                0,
                "the file is not UTF-8",
            )]))
        })?;
        let (mirrors, repo_id, sha) = (self.clone(), repo_id.to_string(), sha.to_string());
        let runtime = tokio::runtime::Handle::current();
        // YAML parsing is CPU work (up to 256 KiB a file): a blocking thread,
        // which may wait on the runtime for the included files' bytes.
        tokio::task::spawn_blocking(move || {
            kiln_workflow::parse_with(&text, &mut |inc: &str| {
                let bytes = runtime.block_on(mirrors.read_file(&repo_id, &sha, inc, max)).map_err(|e| match e {
                    GitError::MissingFile { .. } => format!("there is no file `{inc}` at commit {sha}"),
                    e => e.to_string(),
                })?;
                String::from_utf8(bytes).map_err(|_| format!("`{inc}` is not UTF-8"))
            })
        })
        .await
        .map_err(|e| WorkflowFileError::Internal(e.to_string()))?
        .map_err(WorkflowFileError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, cmd: &str) {
        let ok = std::process::Command::new("sh").arg("-c").arg(cmd).current_dir(dir).status().unwrap().success();
        assert!(ok, "{cmd}");
    }

    /// A URL stored before registration checked it (an older version, a
    /// hand-edited database) still never reaches git as an option or a
    /// remote helper: the fetch refuses it and runs nothing.
    #[tokio::test]
    async fn fetch_refuses_option_like_and_helper_urls() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join("pwned");
        let m = Mirrors::new(tmp.path().join("mirrors"));
        for url in [
            format!("--upload-pack=touch {};false", marker.display()),
            format!("ext::sh -c touch% {}", marker.display()),
        ] {
            let e = m.resolve("r", &Remote::new(&url, None), "main").await.expect_err(&url);
            assert!(matches!(e, GitError::Fetch { .. }), "{url}: {e}");
        }
        assert!(!marker.exists(), "no command ran");
    }

    /// `HEAD` resolves to the branch the remote's HEAD points to (issue 41,
    /// item 8), even when another branch is at the same commit; a branch
    /// by short or full name is that branch; a full SHA names no branch; a
    /// detached HEAD is the one branch at its commit, else stays `HEAD`.
    #[tokio::test]
    async fn head_resolves_to_the_branch_it_points_to() {
        let tmp = tempfile::tempdir().unwrap();
        let origin = tmp.path().join("origin");
        std::fs::create_dir_all(&origin).unwrap();
        sh(
            &origin,
            "git init -q -b main && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m one \
             && git branch feature && git rev-parse HEAD > ../sha",
        );
        let sha = std::fs::read_to_string(tmp.path().join("sha")).unwrap().trim().to_string();
        let m = Mirrors::new(tmp.path().join("mirrors"));
        let remote = Remote::new(&origin.display().to_string(), None);
        let named = async |rev: &str| m.resolve_named("r", &remote, rev).await.unwrap();
        let main = (sha.clone(), Some("refs/heads/main".to_string()));
        assert_eq!(named("HEAD").await, main, "HEAD is main, not `feature` at the same commit");
        assert_eq!(named("main").await, main);
        assert_eq!(named("refs/heads/main").await, main);
        assert_eq!(named(&sha).await, (sha.clone(), None), "a SHA names no branch");

        sh(&origin, "git symbolic-ref HEAD refs/heads/feature");
        assert_eq!(named("HEAD").await, (sha.clone(), Some("refs/heads/feature".into())));

        // Detached: two branches at its commit, then a commit no branch has,
        // then one branch there.
        sh(&origin, "git checkout -q --detach main");
        assert_eq!(named("HEAD").await, (sha.clone(), Some("HEAD".into())));
        sh(&origin, "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m two");
        assert_eq!(named("HEAD").await.1.as_deref(), Some("HEAD"));
        sh(&origin, "git branch only");
        assert_eq!(named("HEAD").await.1.as_deref(), Some("refs/heads/only"));
    }

    /// A commit's workflow listing is read once per full commit id and
    /// served from the cache after (no git: it answers with the mirror
    /// gone), each commit its own; a branch name is never cached.
    #[tokio::test]
    async fn workflow_listings_are_cached_per_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let origin = tmp.path().join("origin");
        std::fs::create_dir_all(origin.join(".kiln")).unwrap();
        let commit = |file: &str| {
            sh(
                &origin,
                &format!(
                    "touch .kiln/{file} && git add -A && git -c user.name=t -c user.email=t@t commit -q -m {file} \
                     && git rev-parse HEAD > ../sha"
                ),
            );
            std::fs::read_to_string(tmp.path().join("sha")).unwrap().trim().to_string()
        };
        sh(&origin, "git init -q -b main");
        let one = commit("a.yaml");
        let two = commit("b.yml");
        let m = Mirrors::new(tmp.path().join("mirrors"));
        let remote = Remote::new(&origin.display().to_string(), None);
        assert_eq!(m.resolve("r", &remote, "main").await.unwrap(), two);
        assert_eq!(m.list_workflows("r", &one).await.unwrap(), [".kiln/a.yaml"]);
        assert_eq!(m.list_workflows("r", &two).await.unwrap(), [".kiln/a.yaml", ".kiln/b.yml"]);
        assert_eq!(m.list_workflows("r", "main").await.unwrap(), [".kiln/a.yaml", ".kiln/b.yml"]);
        std::fs::remove_dir_all(tmp.path().join("mirrors")).unwrap();
        assert_eq!(m.list_workflows("r", &one).await.unwrap(), [".kiln/a.yaml"], "from the cache");
        assert_eq!(m.list_workflows("r", &two.to_uppercase()).await.unwrap(), [".kiln/a.yaml", ".kiln/b.yml"]);
        assert!(m.list_workflows("r", "main").await.is_err(), "a name is asked of git each time");
        assert!(m.list_workflows("other", &one).await.is_err(), "per repository");
    }

    /// A workflow is parsed once per commit and path, then served from
    /// the cache (it answers with the mirror gone): each commit gets its
    /// own definition, included files as they are at that commit.
    #[tokio::test]
    async fn parsed_workflows_are_cached_per_commit_and_path() {
        let tmp = tempfile::tempdir().unwrap();
        let origin = tmp.path().join("origin");
        std::fs::create_dir_all(origin.join(".kiln")).unwrap();
        sh(&origin, "git init -q -b main");
        let commit = |job: &str| {
            let wf = format!("version: 1\njobs:\n  - name: {job}\n    steps: [\"true\"]\n");
            std::fs::write(origin.join(".kiln/ci.yaml"), wf).unwrap();
            sh(
                &origin,
                &format!(
                    "git add -A && git -c user.name=t -c user.email=t@t commit -q -m {job} && git rev-parse HEAD > ../sha"
                ),
            );
            std::fs::read_to_string(tmp.path().join("sha")).unwrap().trim().to_string()
        };
        let one = commit("first");
        let two = commit("second");
        let m = Mirrors::new(tmp.path().join("mirrors"));
        m.resolve("r", &Remote::new(&origin.display().to_string(), None), "main").await.unwrap();
        let jobs = async |sha: &str| -> Vec<String> {
            let wf = m.parse_workflow("r", sha, ".kiln/ci.yaml").await.map_err(|e| format!("{e:?}")).unwrap();
            wf.jobs.iter().map(|j| j.name.clone()).collect()
        };
        assert_eq!(jobs(&one).await, ["first"]);
        assert_eq!(jobs(&two).await, ["second"]);
        std::fs::remove_dir_all(tmp.path().join("mirrors")).unwrap();
        assert_eq!(jobs(&one).await, ["first"], "from the cache");
        assert_eq!(jobs(&two).await, ["second"]);
        assert!(m.parse_workflow("r", &one, ".kiln/other.yaml").await.is_err(), "per path");
    }

    #[test]
    fn the_symref_of_head_is_read_from_ls_remote() {
        let listing = "ref: refs/heads/trunk\tHEAD\n0123456789012345678901234567890123456789\tHEAD\n";
        assert_eq!(symref_of_head(listing).as_deref(), Some("refs/heads/trunk"));
        assert_eq!(symref_of_head("0123456789012345678901234567890123456789\tHEAD\n"), None, "detached");
        assert_eq!(symref_of_head(""), None);
    }

    /// Two server processes sharing a data directory (replicas on one box)
    /// create and fetch the same mirror at the same moment: every resolve
    /// succeeds and the mirror is one whole repository. (Two `Mirrors` are
    /// two processes here: the in-process lock is per `Mirrors`, and the
    /// file lock is per open file.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_sharing_a_data_dir_create_one_mirror() {
        let tmp = tempfile::tempdir().unwrap();
        let origin = tmp.path().join("origin");
        std::fs::create_dir_all(&origin).unwrap();
        sh(
            &origin,
            "git init -q -b main && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m one && git rev-parse HEAD > ../sha",
        );
        let sha = std::fs::read_to_string(tmp.path().join("sha")).unwrap().trim().to_string();
        let root = tmp.path().join("mirrors");
        let (a, b) = (Mirrors::new(root.clone()), Mirrors::new(root.clone()));
        let url = origin.display().to_string();
        let mut tasks = vec![];
        for i in 0..8 {
            let m = if i % 2 == 0 { a.clone() } else { b.clone() };
            let url = url.clone();
            tasks.push(tokio::spawn(async move { m.resolve("repo-1", &Remote::new(&url, None), "main").await }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().expect("resolve"), sha);
        }
        let names: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        let mut names = names;
        names.sort();
        assert_eq!(names, ["repo-1.git", "repo-1.lock"], "no half-made or leftover mirror directories");
    }
}
