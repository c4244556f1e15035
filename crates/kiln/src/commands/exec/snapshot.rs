//! What `kiln exec` runs: the working tree frozen into a synthetic commit,
//! or a commit of the checkout, published to the in-process server through a
//! bare repository of its own (issue 48).
//!
//! The user's repository is only read: the snapshot is made with a
//! temporary index (`GIT_INDEX_FILE`, a copy of theirs so unchanged files are
//! not hashed again) and every object git writes goes to the exec
//! repository's object directory (`GIT_OBJECT_DIRECTORY`), which borrows the
//! user's objects through `objects/info/alternates`. Their index, files,
//! refs and object directory stay as they were. The exec repository is the
//! run's clone URL: the server's mirror and the agents fetch from it as from
//! any remote, so the run is frozen at acceptance exactly like a server run
//! (invariant 1) and its steps work on a checkout of the snapshot, never on
//! the user's tree.

use kiln_cmd::{Failure, usage};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The checkout `kiln exec` was started in.
pub(super) struct Checkout {
    /// `git rev-parse --show-toplevel`.
    pub root: PathBuf,
    /// Its object directory (shared by worktrees).
    objects: PathBuf,
    /// Its index file.
    index: PathBuf,
    /// `HEAD`'s commit and tree (none before the first commit).
    head: Option<(String, String)>,
    /// `refs/heads/NAME` checked out (none when HEAD is detached).
    pub branch: Option<String>,
}

/// What the run is of.
pub(super) struct Snapshot {
    pub sha: String,
    /// True when `sha` was made here (the working tree, or a commit with
    /// the `--job` selection written in): a commit no one else has.
    pub synthetic: bool,
    /// What to say about it, in one line.
    pub describe: String,
}

/// One file of the snapshot replaced (the workflow reduced to `--job`).
pub(super) struct Override<'a> {
    pub path: &'a str,
    pub bytes: &'a [u8],
}

fn git_in(dir: &Path) -> Command {
    let mut c = Command::new("git");
    // No background maintenance, no pager, nothing prompts.
    c.args(["-c", "gc.auto=0", "-c", "maintenance.auto=false", "-c", "core.fsmonitor=false"])
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .stdin(Stdio::null());
    c
}

/// Run `c`; its trimmed standard output, or what git said.
fn out(mut c: Command, what: &str) -> Result<String, String> {
    let o = c.output().map_err(|e| format!("cannot run git ({what}): {e}"))?;
    if !o.status.success() {
        return Err(format!("`git {what}` failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

impl Checkout {
    /// The git checkout around `cwd`; a usage error outside one.
    pub(super) fn find(cwd: &Path) -> Result<Checkout, Failure> {
        let mut c = git_in(cwd);
        c.args([
            "rev-parse",
            "--show-toplevel",
            "--path-format=absolute",
            "--git-path",
            "objects",
            "--git-path",
            "index",
        ]);
        let text = out(c, "rev-parse").map_err(|e| {
            usage(format!(
                "{} is not inside a git checkout ({}); kiln exec runs the workflow of the checkout you are in",
                cwd.display(),
                e.lines().last().unwrap_or_default()
            ))
        })?;
        let mut lines = text.lines();
        let (Some(root), Some(objects), Some(index)) = (lines.next(), lines.next(), lines.next()) else {
            return Err(usage(format!("{} is not inside a git checkout with a working tree", cwd.display())));
        };
        let root = PathBuf::from(root);
        let mut c = git_in(&root);
        c.args(["rev-parse", "HEAD^{commit}", "HEAD^{tree}"]).stderr(Stdio::null());
        let head = out(c, "rev-parse HEAD").ok().and_then(|t| {
            let mut l = t.lines();
            Some((l.next()?.to_string(), l.next()?.to_string()))
        });
        let mut c = git_in(&root);
        c.args(["symbolic-ref", "-q", "HEAD"]);
        let branch = out(c, "symbolic-ref HEAD").ok().filter(|b| b.starts_with("refs/heads/"));
        Ok(Checkout { root, objects: PathBuf::from(objects), index: PathBuf::from(index), head, branch })
    }

    /// The repository's own directory (of a linked worktree: the main
    /// repository's), where its objects are.
    pub(super) fn git_dir(&self) -> Option<PathBuf> {
        self.objects.parent().map(Path::to_path_buf)
    }

    /// `rev` of this checkout as a full commit SHA, and the ref it names
    /// (`refs/heads/…`, `refs/tags/…`) if it names one.
    pub(super) fn resolve(&self, rev: &str) -> Result<(String, Option<String>), Failure> {
        if rev.starts_with('-') {
            return Err(usage(format!("--commit `{rev}` is not a revision")));
        }
        let mut c = git_in(&self.root);
        c.args(["rev-parse", "-q", "--verify", &format!("{rev}^{{commit}}")]);
        let sha = out(c, "rev-parse").map_err(|_| {
            usage(format!(
                "--commit `{rev}`: no such commit in {} (git rev-parse {rev} found none)",
                self.root.display()
            ))
        })?;
        let mut c = git_in(&self.root);
        c.args(["rev-parse", "--symbolic-full-name", rev]);
        let named = out(c, "rev-parse --symbolic-full-name")
            .ok()
            .filter(|r| r.starts_with("refs/heads/") || r.starts_with("refs/tags/"));
        Ok((sha, named))
    }

    /// The file at `path` (relative to the root) in commit `sha`.
    pub(super) fn show(&self, sha: &str, path: &str) -> Result<Vec<u8>, String> {
        let mut c = git_in(&self.root);
        c.args(["show", &format!("{sha}:{path}")]);
        let o = c.output().map_err(|e| format!("cannot run git: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        Ok(o.stdout)
    }

    /// The `.kiln/*.yaml` and `.kiln/*.yml` files of commit `sha`.
    pub(super) fn workflows_at(&self, sha: &str) -> Vec<String> {
        let mut c = git_in(&self.root);
        c.args(["ls-tree", "--name-only", &format!("{sha}:.kiln")]);
        let listed = out(c, "ls-tree").unwrap_or_default();
        let mut files: Vec<String> = listed
            .lines()
            .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
            .map(|n| format!(".kiln/{n}"))
            .collect();
        files.sort();
        files
    }
}

/// The exec repository `dir` (a bare repository of the exec home), created
/// on first use, borrowing the checkout's objects.
pub(super) fn prepare_repo(dir: &Path, checkout: &Checkout) -> Result<(), Failure> {
    let fail = |e: String| Failure { message: e, code: kiln_api::exit::UNAVAILABLE };
    if !dir.join("HEAD").exists() {
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        let mut c = git_in(dir);
        c.args(["init", "--bare", "-q"]);
        out(c, "init --bare").map_err(fail)?;
    }
    let info = dir.join("objects").join("info");
    std::fs::create_dir_all(&info).map_err(|e| fail(format!("cannot create {}: {e}", info.display())))?;
    std::fs::write(info.join("alternates"), format!("{}\n", checkout.objects.display()))
        .map_err(|e| fail(format!("cannot write {}: {e}", info.join("alternates").display())))?;
    Ok(())
}

/// Freeze what the run is of into the exec repository `repo`: the working
/// tree (`rev` None) or commit `rev`, with `replace` written over one file
/// (a new, synthetic commit then). A clean working tree without `replace`
/// runs `HEAD` itself.
pub(super) fn freeze(
    checkout: &Checkout,
    repo: &Path,
    rev: Option<&str>,
    replace: Option<Override<'_>>,
) -> Result<Snapshot, Failure> {
    let fail = |e: String| Failure { message: e, code: kiln_api::exit::UNAVAILABLE };
    if let Some(rev) = rev
        && replace.is_none()
    {
        let (sha, _) = checkout.resolve(rev)?;
        return Ok(Snapshot { describe: format!("commit {sha} ({rev})"), sha, synthetic: false });
    }
    let index = repo.join(format!("exec-index-{}", std::process::id()));
    let _ = std::fs::remove_file(&index);
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&index);
    let objects = repo.join("objects");
    let env = |c: &mut Command| {
        c.env("GIT_INDEX_FILE", &index)
            .env("GIT_OBJECT_DIRECTORY", &objects)
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", &checkout.objects);
    };
    let parent = match rev {
        Some(rev) => {
            let (sha, _) = checkout.resolve(rev)?;
            let mut c = git_in(&checkout.root);
            env(&mut c);
            c.args(["read-tree", &sha]);
            out(c, "read-tree").map_err(fail)?;
            Some(sha)
        }
        None => {
            // A copy of the user's index: its stat data spares hashing the
            // files that did not change. Git only ever writes the copy.
            if checkout.index.is_file() {
                std::fs::copy(&checkout.index, &index)
                    .map_err(|e| fail(format!("cannot copy {}: {e}", checkout.index.display())))?;
            }
            let mut c = git_in(&checkout.root);
            env(&mut c);
            c.args(["add", "-A", "--", "."]);
            out(c, "add -A (into a temporary index)").map_err(fail)?;
            checkout.head.as_ref().map(|(sha, _)| sha.clone())
        }
    };
    if let Some(o) = &replace {
        let mut c = git_in(&checkout.root);
        env(&mut c);
        c.args(["hash-object", "-w", "--stdin"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| fail(format!("cannot run git hash-object: {e}")))?;
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), o.bytes)
            .map_err(|e| fail(format!("git hash-object: {e}")))?;
        let done = child.wait_with_output().map_err(|e| fail(format!("git hash-object: {e}")))?;
        if !done.status.success() {
            return Err(fail(format!("`git hash-object` failed: {}", String::from_utf8_lossy(&done.stderr))));
        }
        let blob = String::from_utf8_lossy(&done.stdout).trim().to_string();
        let mut c = git_in(&checkout.root);
        env(&mut c);
        c.args(["update-index", "--add", "--cacheinfo", &format!("100644,{blob},{}", o.path)]);
        out(c, "update-index").map_err(fail)?;
    }
    let mut c = git_in(&checkout.root);
    env(&mut c);
    c.arg("write-tree");
    let tree = out(c, "write-tree").map_err(fail)?;
    if rev.is_none()
        && replace.is_none()
        && let Some((sha, head_tree)) = &checkout.head
        && *head_tree == tree
    {
        return Ok(Snapshot {
            describe: format!("commit {sha} (HEAD; the working tree has no changes)"),
            sha: sha.clone(),
            synthetic: false,
        });
    }
    let message = match (rev, &replace) {
        (None, None) => format!("kiln exec: snapshot of the working tree of {}", checkout.root.display()),
        (None, Some(o)) => format!(
            "kiln exec: snapshot of the working tree of {}, {} reduced to the selected jobs",
            checkout.root.display(),
            o.path
        ),
        (Some(rev), Some(o)) => format!("kiln exec: {rev} with {} reduced to the selected jobs", o.path),
        (Some(rev), None) => format!("kiln exec: {rev}"),
    };
    let commit_tree = |identity: bool| {
        let mut c = git_in(&checkout.root);
        env(&mut c);
        c.args(["commit-tree", &tree, "-m", &message]);
        if let Some(p) = &parent {
            c.args(["-p", p]);
        }
        if identity {
            // No user.name / user.email configured: the snapshot is signed
            // by kiln exec (it is not the user's commit anyway).
            for (k, v) in [
                ("GIT_AUTHOR_NAME", "kiln exec"),
                ("GIT_AUTHOR_EMAIL", "kiln-exec@localhost"),
                ("GIT_COMMITTER_NAME", "kiln exec"),
                ("GIT_COMMITTER_EMAIL", "kiln-exec@localhost"),
            ] {
                c.env(k, v);
            }
        }
        out(c, "commit-tree")
    };
    let sha = commit_tree(false).or_else(|_| commit_tree(true)).map_err(fail)?;
    let base = match (rev, &parent) {
        (Some(rev), _) => format!("{rev} with the selected jobs only"),
        (None, Some(p)) => format!("the working tree on {}", &p[..p.len().min(12)]),
        (None, None) => "the working tree (no commit yet)".to_string(),
    };
    let what = match (rev, &replace) {
        (None, None) => format!("a synthetic snapshot of {base}, uncommitted and untracked files included"),
        (None, Some(o)) => format!(
            "a synthetic snapshot of {base}, uncommitted and untracked files included, {} holding the selected jobs only",
            o.path
        ),
        (Some(_), _) => format!("a synthetic commit: {base}"),
    };
    Ok(Snapshot { describe: format!("commit {sha}: {what}"), sha, synthetic: true })
}

/// Point the exec repository at `sha`: its HEAD (detached) and `git_ref`
/// if the run has one; every other ref is removed, so the server's mirror
/// (fetched with `--prune`) holds this run's commit and nothing stale.
pub(super) fn publish(repo: &Path, sha: &str, git_ref: Option<&str>) -> Result<(), Failure> {
    let fail = |e: String| Failure { message: e, code: kiln_api::exit::UNAVAILABLE };
    let mut c = git_in(repo);
    c.args(["for-each-ref", "--format=%(refname)"]);
    let refs = out(c, "for-each-ref").map_err(fail)?;
    let mut script = String::new();
    for r in refs.lines().filter(|r| Some(*r) != git_ref) {
        script.push_str(&format!("delete {r}\n"));
    }
    if let Some(r) = git_ref {
        script.push_str(&format!("update {r} {sha}\n"));
    }
    let mut c = git_in(repo);
    c.args(["update-ref", "--stdin"]).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| fail(format!("cannot run git update-ref: {e}")))?;
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), script.as_bytes())
        .map_err(|e| fail(format!("git update-ref: {e}")))?;
    let done = child.wait_with_output().map_err(|e| fail(format!("git update-ref: {e}")))?;
    if !done.status.success() {
        return Err(fail(format!("`git update-ref` failed: {}", String::from_utf8_lossy(&done.stderr).trim())));
    }
    let mut c = git_in(repo);
    c.args(["update-ref", "--no-deref", "HEAD", sha]);
    out(c, "update-ref HEAD").map_err(fail)?;
    Ok(())
}
