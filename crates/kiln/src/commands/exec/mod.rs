//! `kiln exec` (issue 48): run a workflow on this machine, from the working
//! tree, with exactly the engine a server uses — an in-process server
//! (SQLite, local object store) and in-process agents, as `kiln up` starts
//! them — and show it as `kiln run --follow` does.
//!
//! The run goes through the server's one door: the working tree is frozen
//! into a commit (`snapshot`), the exec repository holding it is the
//! run's clone URL, and the run is accepted, planned, dispatched, claimed,
//! checked out, cached and completed by the same code as on a server
//! (invariant 1: frozen at acceptance; the steps work on a checkout of the
//! snapshot, and the user's checkout is one of the paths hidden from them).
//!
//! What survives a run lives in the exec home (`$XDG_CACHE_HOME/kiln/exec`,
//! else `~/.cache/kiln/exec`), held by one `kiln exec` at a time: the store
//! (its cache entries are rows bound to stored archives, so caches outlive a
//! run only with the store), the git mirrors, and the exec repositories. A
//! second `kiln exec` while one runs gets a temporary home instead, and says
//! that it starts without caches. Secrets given to a run are removed from
//! the store when it ends (and any a killed run left, when the next starts).

mod plan;
mod snapshot;

use super::run::{follow_accepted, print_warnings};
use super::shared::{apply_agent_tuning, apply_server_tuning};
use super::validate;
use crate::cli::ExecArgs;
use kiln_cmd::{CmdResult, Failure, usage};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a `kiln exec` keeps what outlives it, locked for its lifetime.
struct Home {
    dir: PathBuf,
    /// Held while this run lasts (None for a temporary home).
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// A temporary home, removed at the end.
    _temp: Option<tempfile::TempDir>,
    /// Why this run has a temporary home (another `kiln exec` holds the
    /// per-user one), to say.
    note: Option<String>,
}

/// `$XDG_CACHE_HOME/kiln/exec`, else `~/.cache/kiln/exec`.
fn home_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kiln").join("exec"))
}

impl Home {
    fn open() -> Result<Home, Failure> {
        let temp = |note: String| -> Result<Home, Failure> {
            let t = tempfile::Builder::new()
                .prefix("kiln-exec-home-")
                .tempdir()
                .map_err(|e| Failure::from(anyhow::anyhow!("cannot create a temporary directory: {e}")))?;
            Ok(Home { dir: t.path().to_path_buf(), _lock: None, _temp: Some(t), note: Some(note) })
        };
        let Some(dir) = home_dir() else {
            return temp("no cache directory (neither XDG_CACHE_HOME nor HOME is set): caches start empty".into());
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return temp(format!("cannot create {} ({e}): caches start empty", dir.display()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("exec.lock"))
            .map_err(|e| Failure::from(anyhow::anyhow!("cannot open {}: {e}", dir.join("exec.lock").display())))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Home { dir, _lock: Some(lock), _temp: None, note: None }),
            Err(_) => temp(format!(
                "another kiln exec is using {}: this run has a temporary store and starts without caches",
                dir.display()
            )),
        }
    }
}

/// The repository name of a checkout in the exec store: its directory's
/// name and a hash of its path (two checkouts never share one).
fn repo_name(root: &Path) -> String {
    use sha2::Digest;
    let base: String = root
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(60)
        .collect();
    let hash = hex::encode(sha2::Sha256::digest(root.as_os_str().as_encoded_bytes()));
    let base = if base.is_empty() { "repo".to_string() } else { base };
    format!("{base}-{}", &hash[..8])
}

/// The workflow to run, as a path relative to the checkout's root: the one
/// given, else `.kiln/pipeline.yaml`, else the only one; several are listed.
fn choose_workflow(given: Option<&Path>, root: &Path, cwd: &Path, available: &[String]) -> Result<String, Failure> {
    if let Some(p) = given {
        let abs = std::path::absolute(cwd.join(p)).unwrap_or_else(|_| cwd.join(p));
        // `a/../b` and `./x` as git names them.
        let mut norm = PathBuf::new();
        for c in abs.components() {
            match c {
                std::path::Component::ParentDir => {
                    norm.pop();
                }
                std::path::Component::CurDir => {}
                other => norm.push(other),
            }
        }
        let rel = norm
            .strip_prefix(root)
            .map_err(|_| usage(format!("workflow {}: not inside the checkout {}", p.display(), root.display())))?;
        let rel = rel.to_string_lossy().to_string();
        if !available.contains(&rel) && !root.join(&rel).is_file() {
            let list = if available.is_empty() { "none".to_string() } else { available.join(", ") };
            return Err(usage(format!("workflow {}: no such file; the workflows here are: {list}", p.display())));
        }
        return Ok(rel);
    }
    let default = ".kiln/pipeline.yaml".to_string();
    if available.contains(&default) {
        return Ok(default);
    }
    match available {
        [] => Err(usage(format!(
            "no workflow in {}: kiln exec runs .kiln/pipeline.yaml, or the only workflow of .kiln/ (see \
             docs/workflow.md), or the file you name",
            root.join(".kiln").display()
        ))),
        [only] => Ok(only.clone()),
        several => {
            let mut text =
                format!("{} workflows in .kiln/ and no .kiln/pipeline.yaml; name the one to run:", several.len());
            for w in several {
                text.push_str(&format!("\n  kiln exec {w}"));
            }
            Err(usage(text))
        }
    }
}

/// The workflow files of the working tree (`.kiln/*.yaml`, `.kiln/*.yml`).
fn workflows_on_disk(root: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root.join(".kiln"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
                .map(|n| format!(".kiln/{n}"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// `--ref`: a full ref, a branch name made `refs/heads/NAME`.
fn full_ref(r: &str) -> Result<String, Failure> {
    let r = r.trim();
    if r.is_empty() || r.starts_with('-') || r.contains("..") || r.chars().any(|c| c.is_whitespace() || c == ':') {
        return Err(usage(format!("--ref `{r}` is not a ref name")));
    }
    Ok(if r.starts_with("refs/") { r.to_string() } else { format!("refs/heads/{r}") })
}

pub(super) async fn run(a: ExecArgs) -> CmdResult {
    let cwd = std::env::current_dir().map_err(|e| usage(format!("cannot read the working directory: {e}")))?;
    let checkout = snapshot::Checkout::find(&cwd)?;
    let root = checkout.root.clone();
    let mut inputs = BTreeMap::new();
    for i in &a.inputs {
        let (k, v) = i.split_once('=').ok_or_else(|| usage(format!("--input `{i}` must be K=V")))?;
        inputs.insert(k.to_string(), v.to_string());
    }

    // The workflow, read from what runs (the working tree, or --commit),
    // and checked here as `kiln validate` checks it: its problems with
    // their lines before anything starts.
    let at = match &a.commit {
        Some(rev) => Some(checkout.resolve(rev)?),
        None => None,
    };
    let available = match &at {
        Some((sha, _)) => checkout.workflows_at(sha),
        None => workflows_on_disk(&root),
    };
    let path = choose_workflow(a.workflow.as_deref(), &root, &cwd, &available)?;
    let shown = validate::relative_to_cwd(&root.join(&path));
    let bytes = match &at {
        Some((sha, _)) => checkout.show(sha, &path).map_err(|e| usage(format!("{path} at {sha}: {e}")))?,
        None => std::fs::read(root.join(&path)).map_err(|e| usage(format!("cannot read {}: {e}", shown.display())))?,
    };
    let text = String::from_utf8_lossy(&bytes).to_string();
    // The files it includes, from the same place.
    let load = |p: &str| -> Result<String, String> {
        match &at {
            Some((sha, _)) => checkout.show(sha, p).map(|b| String::from_utf8_lossy(&b).to_string()),
            None => std::fs::read_to_string(root.join(p)).map_err(|e| format!("cannot read {p}: {e}")),
        }
    };
    let wf = match validate::check(&shown, bytes, &root, &mut { load }) {
        Ok(w) => w,
        Err(code) => return Ok(code),
    };
    let keep = plan::select(&wf, &a.jobs)?;
    let (keep, skipped) = plan::without_deployments(&wf, keep)?;
    let jobs = plan::running(&wf, keep.as_ref());
    if a.agent.executor == "host"
        && let Some(j) = jobs.iter().find(|j| j.image.is_some())
    {
        return Err(usage(format!(
            "job `{}` runs in an image (`image:`): run with --executor container (and --engine URL, the Docker \
             Engine API of Podman or Docker)",
            j.name
        )));
    }
    let secrets = plan::secrets(&jobs, &a.secret_files, |k| std::env::var(k).ok())?;
    let event = plan::event(&wf, a.event.as_deref());
    let agents = a.agents.unwrap_or(plan::widest_level(&jobs) as u32);
    let labels = plan::labels(&jobs);
    let reduced = match &keep {
        None => None,
        Some(k) => Some(plan::reduced(&text, k, &jobs, &path, &mut { load })?),
    };

    // Freeze what runs.
    let home = Home::open()?;
    let name = repo_name(&root);
    let repo_dir = home.dir.join("repos").join(format!("{name}.git"));
    snapshot::prepare_repo(&repo_dir, &checkout)?;
    let replace = reduced.as_ref().map(|t| snapshot::Override { path: &path, bytes: t.as_bytes() });
    let snap = snapshot::freeze(&checkout, &repo_dir, a.commit.as_deref(), replace)?;
    let git_ref = match (&a.git_ref, &at) {
        (Some(r), _) => Some(full_ref(r)?),
        (None, Some((_, named))) => named.clone(),
        (None, None) => checkout.branch.clone(),
    };
    snapshot::publish(&repo_dir, &snap.sha, git_ref.as_deref())?;

    // The engine: the server and agents of `kiln up`, in this process.
    let store = home.dir.join("store");
    let listen = a.listen.clone().unwrap_or_else(|| "127.0.0.1:0".to_string());
    let mut config = kiln_server::ServerConfig::new(store.clone(), listen);
    apply_server_tuning(&mut config, &a.server)?;
    // Nothing is scheduled or polled by a local run.
    config.trigger_interval = Duration::ZERO;
    // An untrusted run (a pull request's, as on a server) keeps its
    // limits — no secrets, no protected cache writes, no identity token —
    // but the local agents take it: on your machine they are all there is.
    if !config.untrusted.pools.iter().any(|p| p == "default") {
        config.untrusted.pools.push("default".into());
    }
    config.untrusted.host_executor = true;
    let mut probe =
        kiln_cmd::agent_config(String::new(), String::new(), String::new(), labels.clone(), store.clone(), 1);
    apply_agent_tuning(&mut probe, &a.agent)?;
    let sandboxes = tempfile::Builder::new()
        .prefix("kiln-exec-")
        .tempdir()
        .map_err(|e| Failure::from(anyhow::anyhow!("cannot create a temporary directory: {e}")))?;
    let sandbox_root = sandboxes.path().to_path_buf();
    {
        // Steps of a root agent run as another user (nobody by default, as
        // under `kiln up`): they pass through to their own sandbox.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&sandbox_root, std::fs::Permissions::from_mode(0o711));
    }
    let mut hidden = vec![root.clone(), std::path::absolute(&home.dir).unwrap_or_else(|_| home.dir.clone())];
    // A linked worktree's repository lives elsewhere (`git worktree add`).
    if let Some(git_dir) = checkout.git_dir()
        && !git_dir.starts_with(&root)
    {
        hidden.push(git_dir);
    }
    let tuning = &a.agent;
    let keep_sandboxes = a.keep;
    // The agents stop claiming past the same disk and memory levels as the
    // server (`--storage-levels`, `KILN_STORAGE_LEVELS`), as under `kiln up`.
    let (storage_levels, memory_levels) = (a.server.storage.levels, a.server.storage.memory);
    let (handle, stop, tasks) = kiln_cmd::start_embedded_agents(config, agents, |cfg| {
        cfg.labels.extend(labels.clone());
        // Checked on `probe` above: the same flags cannot fail here.
        let _ = apply_agent_tuning(cfg, tuning);
        cfg.storage_levels = Some(storage_levels);
        cfg.memory_levels = Some(memory_levels);
        cfg.sandbox_dir = Some(sandbox_root.join(&cfg.name));
        cfg.keep_sandboxes = keep_sandboxes;
        // A host step, run as this user, never sees the checkout it came
        // from nor the exec home: it works on its own checkout.
        cfg.hide_paths.extend(hidden.iter().cloned());
    })
    .await
    .map_err(|e| Failure::from(e.context("cannot start the in-process server")))?;
    let c = kiln_api::Client::new(&handle.url(), &handle.admin_token);
    let started = std::sync::Mutex::new(None::<String>);
    let follow = submit_and_follow(
        &a,
        &c,
        &name,
        &repo_dir,
        &path,
        &snap,
        git_ref.as_deref(),
        &event,
        inputs,
        &secrets,
        &jobs,
        &skipped,
        &home,
        &handle,
        &started,
    );
    let mut agents_ended = std::pin::pin!(futures::future::join_all(tasks));
    let result = tokio::select! {
        r = follow => r,
        // An agent that cannot start (its error is logged above) would
        // leave the run waiting for ever.
        _ = &mut agents_ended => Err(Failure {
            message: "the local agents stopped (see the error above); nothing more can run".into(),
            code: kiln_api::exit::UNAVAILABLE,
        }),
        () = super::shared::ctrl_c() => {
            // A cancelled run is a run that did not succeed (exit 1).
            let run = started.lock().expect("lock").clone();
            let message = match run {
                Some(run) => match c.cancel_run(&run).await {
                    Ok(_) => format!("interrupted: run {run} cancelled"),
                    Err(e) => format!("interrupted: cancelling run {run} failed: {e}"),
                },
                None => "interrupted before the run started".to_string(),
            };
            Err(Failure { message, code: kiln_api::exit::RUN_FAILED })
        }
    };
    // The kept workspaces, by job (before the server stops).
    let mut kept_jobs = vec![];
    let run_id = started.lock().expect("lock").clone();
    if a.keep
        && let Some(run_id) = run_id
        && let Ok(run) = c.get_run(&run_id).await
    {
        for j in &run.jobs {
            for at in &j.attempts {
                let ws = sandbox_root.join(&at.runner).join(format!("{}-{}", j.id, at.epoch)).join("ws");
                if ws.is_dir() {
                    kept_jobs.push(format!("  {} (attempt {}): {}", j.name, at.epoch, ws.display()));
                }
            }
        }
    }
    // Secrets do not outlive the run in the store.
    for s in secrets.keys() {
        let _ = c.delete_secret(&name, s).await;
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), agents_ended).await;
    let _ = handle.shutdown().await;
    if a.keep {
        let kept = sandboxes.keep();
        eprintln!(
            "kept: the jobs' sandboxes in {} (workspace, HOME, TMPDIR of each attempt), the store in {}",
            kept.display(),
            store.display()
        );
        for line in kept_jobs {
            eprintln!("{}", crate::term::for_stderr(&line));
        }
    }
    result
}

/// Register the checkout's exec repository, hand over the secrets, submit
/// the run and follow it to its end.
#[allow(clippy::too_many_arguments)]
async fn submit_and_follow(
    a: &ExecArgs,
    c: &kiln_api::Client,
    name: &str,
    repo_dir: &Path,
    path: &str,
    snap: &snapshot::Snapshot,
    git_ref: Option<&str>,
    event: &str,
    inputs: BTreeMap<String, String>,
    secrets: &BTreeMap<String, String>,
    jobs: &[&kiln_workflow::Job],
    skipped: &[String],
    home: &Home,
    handle: &kiln_server::ServerHandle,
    started: &std::sync::Mutex<Option<String>>,
) -> CmdResult {
    let clone_url = repo_dir.to_string_lossy().to_string();
    match c.get_repo(name).await {
        Ok(r) if r.clone_url == clone_url => {}
        Ok(_) => {
            let body = kiln_api::UpdateRepo { clone_url: Some(clone_url.clone()), ..Default::default() };
            c.update_repo(name, &body).await?;
        }
        Err(e) if e.status() == Some(404) => {
            let body = kiln_api::CreateRepo {
                name: name.to_string(),
                clone_url: clone_url.clone(),
                webhook_secret: None,
                secret_pools: None,
                team: None,
                forge: Default::default(),
            };
            c.create_repo(&body).await?;
        }
        Err(e) => return Err(e.into()),
    }
    // Left by a run that was killed before it could remove them.
    for s in c.list_secrets(name).await? {
        if !secrets.contains_key(&s.name) {
            c.delete_secret(name, &s.name).await?;
        }
    }
    for (k, v) in secrets {
        c.put_secret(name, k, v).await?;
    }
    let say = |line: String| eprintln!("{}", crate::term::for_stderr(&line));
    say(format!("kiln exec: {path} at {}", snap.describe));
    if snap.synthetic {
        say(format!(
            "  {} is a synthetic commit made by kiln exec (your index, files and refs are untouched); it exists \
             in no repository but this run's",
            &snap.sha[..12]
        ));
    }
    say(format!(
        "  event {event}, ref {}, {} job(s) on {} local agent(s)",
        git_ref.unwrap_or("none (detached HEAD)"),
        jobs.len(),
        a.agents.unwrap_or(plan::widest_level(jobs) as u32)
    ));
    if let Some(note) = &home.note {
        say(format!("  caches: {note}"));
    } else {
        say(format!("  caches: kept between kiln exec runs in {}", home.dir.display()));
    }
    say("  not local: no commit status is posted to a forge".into());
    for line in skipped {
        say(line.clone());
    }
    for j in jobs.iter().filter(|j| j.id_token.is_some()) {
        say(format!(
            "  not local: job `{}` asks for an identity token; it is signed by this local run's own issuer ({}), \
             which no cloud provider trusts",
            j.name,
            handle.url()
        ));
    }
    if !secrets.is_empty() {
        let names: Vec<&str> = secrets.keys().map(String::as_str).collect();
        say(format!("  secrets: {} (masked in the output)", names.join(", ")));
    }
    if a.listen.is_some() {
        say(format!("  web UI: {}/ while the run lasts (admin token {})", handle.url(), handle.admin_token));
    }
    let body = kiln_api::SubmitRun {
        commit_sha: git_ref.map_or_else(|| snap.sha.clone(), str::to_string),
        workflow_path: Some(path.to_string()),
        inputs,
        event: Some(event.to_string()),
        priority: None,
    };
    let resp = c.submit_run(name, &body, None).await?;
    *started.lock().expect("lock") = Some(resp.run_id.clone());
    print_warnings(&resp.warnings);
    if let Ok(run) = c.get_run(&resp.run_id).await
        && run.trust != "trusted"
    {
        say(format!(
            "  trust: {} (as the server decides for a {event} run): no secrets, no protected cache writes, no \
             identity token",
            run.trust
        ));
    }
    let url = a.listen.as_ref().map(|_| super::shared::ui_url(&handle.url(), &resp.run_id));
    follow_accepted(c, &resp.run_id, url.as_deref(), a.json, a.timestamps).await
}
