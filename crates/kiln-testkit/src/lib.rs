//! Test helpers: real git repositories in temporary directories, a real
//! `kiln up` process, and (feature `app`) the in-process [`TestApp`].
//! Dev-dependency only.

#[cfg(feature = "app")]
mod app;
mod garage;
#[cfg(feature = "otlp")]
pub mod otlp;
mod postgres;
#[cfg(feature = "prometheus")]
pub mod prometheus;

#[cfg(feature = "app")]
pub use app::{Caller, SseEvent, TestApp, TestRequest, TestResponse, next_frame, parse_sse};

pub use garage::{GARAGE_BUCKET, GARAGE_KEY_ID, GARAGE_REGION, GARAGE_SECRET, TempGarage, garage_available};

pub use postgres::{TempPostgres, postgres_available};

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A git repository (non-bare, branch `main`) in a temporary directory.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "kiln-test")
        .env("GIT_AUTHOR_EMAIL", "test@kiln.invalid")
        .env("GIT_COMMITTER_NAME", "kiln-test")
        .env("GIT_COMMITTER_EMAIL", "test@kiln.invalid")
        .output()
        .context("run git")?;
    if !out.status.success() {
        bail!("git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl TestRepo {
    /// A repository whose first commit holds `files` (path, contents).
    pub fn new(files: &[(&str, &str)]) -> Result<TestRepo> {
        let dir = tempfile::tempdir()?;
        git(dir.path(), &["init", "-q", "-b", "main"])?;
        let r = TestRepo { dir };
        r.commit(files, "initial")?;
        Ok(r)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `files` (executable when they end in `.sh`) and commit; returns the SHA.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> Result<String> {
        for (p, content) in files {
            let path = self.dir.path().join(p);
            std::fs::create_dir_all(path.parent().expect("parent"))?;
            std::fs::write(&path, content)?;
            if p.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        git(self.dir.path(), &["add", "-A"])?;
        git(self.dir.path(), &["commit", "-q", "--allow-empty", "-m", message])?;
        self.head()
    }

    pub fn head(&self) -> Result<String> {
        git(self.dir.path(), &["rev-parse", "HEAD"])
    }
}

/// A `kiln` CLI command talking to `url` with `token`.
fn cli(bin: &Path, url: &str, token: &str) -> Command {
    let mut c = Command::new(bin);
    c.env("KILN_SERVER", url).env("KILN_TOKEN", token).env_remove("KILN_LOG");
    c
}

/// Spawn `bin args` (stderr to `log`) and read its stdout until `pick`
/// recognises the line announcing it is ready; keeps draining stdout after.
fn spawn_until<T>(
    bin: &Path,
    args: &[std::ffi::OsString],
    env: &[(String, String)],
    log: &Path,
    what: &str,
    mut pick: impl FnMut(&str) -> Option<T>,
) -> Result<(Child, T)> {
    let mut child = Command::new(bin)
        .args(args)
        // Whatever the host's disk holds (a CI machine's may be nearly
        // full), runs are not refused for it; a test of the levels passes
        // --storage-levels, which wins over the environment.
        .env("KILN_STORAGE_LEVELS", "off")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KILN_LOG", "info,sqlx=warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("spawn {what}"))?;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let found = lines.by_ref().map_while(|l| l.ok()).find_map(|l| pick(&l));
    let Some(found) = found else {
        let _ = child.kill();
        bail!("{what} did not start; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((child, found))
}

/// A real `kiln up` process on a temporary data dir and a free port.
pub struct KilnUp {
    pub child: Child,
    pub data: tempfile::TempDir,
    pub url: String,
    pub token: String,
    pub bin: PathBuf,
    log: PathBuf,
    /// Its `TMPDIR` (dropped after the process: fields drop after `drop`).
    _tmp: tempfile::TempDir,
    /// The environment it was started with (kept for a restart).
    agents_env: Vec<(String, String)>,
}

impl KilnUp {
    pub fn start(bin: &Path, agents: u32) -> Result<KilnUp> {
        Self::start_with(bin, agents, &[])
    }

    pub fn start_with(bin: &Path, agents: u32, extra: &[&str]) -> Result<KilnUp> {
        Self::start_env(bin, agents, extra, &[])
    }

    /// Like [`KilnUp::start_with`], with more environment. `XDG_STATE_HOME`
    /// defaults to [`KilnUp::state_home`] (where `kiln up` registers itself
    /// for the CLI to find), so tests never touch the user's own.
    pub fn start_env(bin: &Path, agents: u32, extra: &[&str], env: &[(&str, &str)]) -> Result<KilnUp> {
        let data = tempfile::tempdir()?;
        let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if !env.iter().any(|(k, _)| k == "XDG_STATE_HOME") {
            env.push(("XDG_STATE_HOME".into(), data.path().join("state").to_string_lossy().into_owned()));
        }
        let tmp = test_tmp()?;
        if !env.iter().any(|(k, _)| k == "TMPDIR") {
            env.push(("TMPDIR".into(), tmp.path().to_string_lossy().into_owned()));
        }
        Self::spawn(bin, data, tmp, agents, extra, env)
    }

    fn spawn(
        bin: &Path,
        data: tempfile::TempDir,
        tmp: tempfile::TempDir,
        agents: u32,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Result<KilnUp> {
        let log = data.path().join("kiln-up.log");
        let mut args: Vec<std::ffi::OsString> =
            ["up", "--listen", "127.0.0.1:0", "--agents", &agents.to_string(), "--data-dir"]
                .iter()
                .map(Into::into)
                .collect();
        args.push(data.path().join("data").into());
        args.extend(extra.iter().map(Into::into));
        // `export KILN_SERVER=… KILN_TOKEN=…`
        let (child, (url, token)) = spawn_until(bin, &args, &env, &log, "kiln up", |line| {
            let rest = line.strip_prefix("export ")?;
            let val = |k: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(k)).map(str::to_string);
            Some((val("KILN_SERVER=")?, val("KILN_TOKEN=")?))
        })?;
        Ok(KilnUp { child, data, url, token, bin: bin.to_path_buf(), log, _tmp: tmp, agents_env: env })
    }

    /// Stop this `kiln up` (SIGTERM, waiting for it to end) and start it
    /// again on the same data dir with `agents` local agents (a new port).
    pub fn restart(self, agents: u32, extra: &[&str]) -> Result<KilnUp> {
        let mut me = std::mem::ManuallyDrop::new(self);
        let _ = Command::new("kill").arg("-TERM").arg(me.child.id().to_string()).status();
        let _ = me.child.wait();
        let data = std::mem::replace(&mut me.data, tempfile::tempdir()?);
        let tmp = std::mem::replace(&mut me._tmp, tempfile::tempdir()?);
        let old_log = std::fs::read_to_string(&me.log).unwrap_or_default();
        let bin = me.bin.clone();
        let up = Self::spawn(&bin, data, tmp, agents, extra, std::mem::take(&mut me.agents_env))?;
        std::fs::write(up.data.path().join("kiln-up.before-restart.log"), old_log)?;
        Ok(up)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// The `XDG_STATE_HOME` this `kiln up` registered itself under (unless
    /// the test gave its own).
    pub fn state_home(&self) -> PathBuf {
        self.data.path().join("state")
    }

    /// A `kiln` CLI command with KILN_SERVER and KILN_TOKEN set.
    pub fn cli(&self) -> Command {
        cli(&self.bin, &self.url, &self.token)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Write a credential `file` readable by its owner only, in `dir` made
/// 0700 (a test's temporary directory, whatever the umask).
pub fn write_private(dir: &Path, file: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(file)?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}

/// A temporary directory, world-writable and sticky like `/tmp`, for a
/// daemon's `TMPDIR`: the agents' sandboxes (under the temp dir by default)
/// then go with the test (a daemon killed at the end of a test cannot
/// remove them itself), and steps run as another user still reach theirs.
fn test_tmp() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new().prefix("kiln-test-tmp-").tempdir()?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777))?;
    Ok(tmp)
}

impl Drop for KilnUp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `f` until it returns `Some` or `timeout` passes (waiting for the
/// system under test, not a timing assertion).
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A real `kiln server` process.
pub struct KilnServer {
    pub child: Child,
    pub data: tempfile::TempDir,
    pub url: String,
    pub token: String,
    pub agent_token: String,
    pub bin: PathBuf,
    log: PathBuf,
    /// Extra environment (e.g. object store credentials), kept for
    /// restarts and replicas.
    env: Vec<(String, String)>,
}

impl KilnServer {
    pub fn start(bin: &Path, extra: &[&str]) -> Result<KilnServer> {
        Self::start_env(bin, extra, &[])
    }

    /// With extra environment variables for the server process.
    pub fn start_env(bin: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<KilnServer> {
        let data = tempfile::tempdir()?;
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self::spawn(bin, data, "127.0.0.1:0", extra, env)
    }

    /// On a data dir prepared by the caller: `data/data` (e.g. a small
    /// tmpfs mounted there), with the log beside it in `data`.
    pub fn start_in(bin: &Path, data: tempfile::TempDir, extra: &[&str]) -> Result<KilnServer> {
        Self::spawn(bin, data, "127.0.0.1:0", extra, Vec::new())
    }

    /// SIGKILL the server and start it again on the same data dir and address.
    pub fn kill_and_restart(self, extra: &[&str]) -> Result<KilnServer> {
        self.restart("KILL", Duration::ZERO, extra)
    }

    /// Send `signal` (e.g. "TERM": a graceful stop), wait for the process to
    /// end, stay down for `down`, then start again on the same data dir and
    /// address.
    pub fn restart(self, signal: &str, down: Duration, extra: &[&str]) -> Result<KilnServer> {
        let mut me = std::mem::ManuallyDrop::new(self);
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(me.child.id().to_string()).status();
        let _ = me.child.wait();
        std::thread::sleep(down);
        let listen = me.url.trim_start_matches("http://").to_string();
        // Keep the data dir: swap a throwaway one into the forgotten value.
        let data = std::mem::replace(&mut me.data, tempfile::tempdir()?);
        let bin = me.bin.clone();
        let old_log = std::fs::read_to_string(&me.log).unwrap_or_default();
        let s = Self::spawn(&bin, data, &listen, extra, std::mem::take(&mut me.env))?;
        std::fs::write(s.data.path().join("server.before-restart.log"), old_log)?;
        Ok(s)
    }

    fn spawn(
        bin: &Path,
        data: tempfile::TempDir,
        listen: &str,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Result<KilnServer> {
        let log = data.path().join("server.log");
        let mut args: Vec<std::ffi::OsString> =
            ["server", "--listen", listen, "--data-dir"].iter().map(Into::into).collect();
        args.push(data.path().join("data").into());
        args.extend(extra.iter().map(Into::into));
        // `kiln server listening on URL (tokens in …)`
        let (child, url) = spawn_until(bin, &args, &env, &log, "kiln server", |line| {
            line.strip_prefix("kiln server listening on ")?.split_whitespace().next().map(str::to_string)
        })?;
        let dir = data.path().join("data");
        let token = std::fs::read_to_string(dir.join("admin.token"))?.trim().to_string();
        let agent_token = std::fs::read_to_string(dir.join("agent.token"))?.trim().to_string();
        Ok(KilnServer { child, data, url, token, agent_token, bin: bin.to_path_buf(), log, env })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// Another server process on the same data dir (tokens, object store)
    /// and `extra` flags (e.g. the same `--database-url`): a replica.
    pub fn replica(&self, extra: &[&str]) -> Result<KilnServer> {
        let dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(self.data_dir(), dir.path().join("data"))?;
        Self::spawn(&self.bin, dir, "127.0.0.1:0", extra, self.env.clone())
    }

    pub fn cli(&self) -> Command {
        cli(&self.bin, &self.url, &self.token)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kiln repo add NAME --url REPO`; it must succeed.
    pub fn add_repo(&self, name: &str, repo: &TestRepo) {
        let out = self.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().expect("kiln repo add");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Start an agent process against this server.
    pub fn agent(&self, name: &str, extra: &[&str]) -> Result<KilnAgent> {
        KilnAgent::spawn(&self.bin, &self.url, &self.agent_token, name, extra)
    }

    /// A join token of `pool` (`kiln agent-token create --pool POOL`).
    pub fn join_token(&self, pool: &str) -> Result<String> {
        let out =
            self.cli().args(["agent-token", "create", "--name", &format!("{pool}-token"), "--pool", pool]).output()?;
        anyhow::ensure!(out.status.success(), "kiln agent-token create: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    /// An agent process of `pool` (joined with a token of that pool), e.g.
    /// `forks` with `--executor container`: the agents that take untrusted
    /// work (the server's `--untrusted-pools`).
    pub fn pool_agent(&self, pool: &str, name: &str, extra: &[&str]) -> Result<KilnAgent> {
        KilnAgent::spawn(&self.bin, &self.url, &self.join_token(pool)?, name, extra)
    }

    /// An agent started as `nice -n NICE kiln agent …` (`nice` execs it:
    /// the pid is the agent's).
    pub fn agent_niced(&self, name: &str, extra: &[&str], nice: i32) -> Result<KilnAgent> {
        KilnAgent::spawn_via(&["nice", "-n", &nice.to_string()], &self.bin, &self.url, &self.agent_token, name, extra)
    }
}

impl Drop for KilnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `kiln agent` process.
pub struct KilnAgent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    log: PathBuf,
    /// Its `TMPDIR` (see [`test_tmp`]).
    _tmp: tempfile::TempDir,
}

impl KilnAgent {
    /// A `kiln agent` process for `server` (one URL, or several comma-separated).
    pub fn spawn(bin: &Path, server: &str, token: &str, name: &str, extra: &[&str]) -> Result<KilnAgent> {
        Self::spawn_via(&[], bin, server, token, name, extra)
    }

    /// [`KilnAgent::spawn`] through a program that execs it (`wrapper`:
    /// that program and its arguments, e.g. `nice -n 10`).
    pub fn spawn_via(
        wrapper: &[&str],
        bin: &Path,
        server: &str,
        token: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<KilnAgent> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("agent.log");
        // The token goes in a file, never in argv (/proc/PID/cmdline is
        // public): 0600 in a 0700 directory, so a step running as another
        // user on this host cannot read it (issue 39, item 12).
        let token_file = dir.path().join("agent.token");
        write_private(dir.path(), &token_file, token)?;
        let tmp = test_tmp()?;
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .args(["agent", "--server", server, "--name", name, "--token-file"])
            .arg(&token_file)
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .args(extra)
            // The default sandbox dir goes with the test (see `test_tmp`).
            .env("TMPDIR", tmp.path())
            .env("KILN_STORAGE_LEVELS", "off")
            .env("KILN_LOG", "info,sqlx=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawn kiln agent")?;
        Ok(KilnAgent { child, dir, log, _tmp: tmp })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }
}

impl Drop for KilnAgent {
    fn drop(&mut self) {
        self.signal("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll a run until `f` holds (bounded by `secs`), returning it. Waiting for
/// the system under test, never a timing assertion.
pub async fn until(
    c: &kiln_api::Client,
    run: &str,
    secs: u64,
    what: &str,
    f: impl Fn(&kiln_api::Run) -> bool,
) -> kiln_api::Run {
    for _ in 0..secs * 20 {
        let r = c.get_run(run).await.expect("get run");
        if f(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run}: {what} did not happen within {secs} s: {:#?}", c.get_run(run).await.ok());
}

/// The server's `/metrics` text, read with `token` (an admin or read token).
pub async fn metrics_text(url: &str, token: &str) -> String {
    reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the /metrics text")
}

/// Wait (bounded by `secs`) until the run is terminal.
pub async fn wait_run(c: &kiln_api::Client, run: &str, secs: u64) -> kiln_api::Run {
    until(c, run, secs, "finishing", |r| r.status.is_terminal()).await
}

/// The runner-vanishes pipeline: `compile` publishes `app` (`bytes` of
/// random data, its sha256 printed), `integration-test` restores it and
/// prints the sha256 it consumed.
pub fn handoff_workflow(bytes: u64) -> String {
    format!(
        r#"version: 1
jobs:
  - name: compile
    steps:
      - mkdir -p target && head -c {bytes} /dev/urandom > target/app.jar && sha256sum target/app.jar
    artifacts:
      publish:
        - name: app
          path: target/app.jar
  - name: integration-test
    artifacts:
      restore:
        - from_job: compile
          name: app
          path: inputs/app.jar
    steps:
      - echo "consumed $(sha256sum < inputs/app.jar | cut -d' ' -f1)"
"#
    )
}

/// Live host processes of a run's steps: those whose environment holds
/// `KILN_RUN_ID=<run_id>`. (Host steps run in their own PID namespace with
/// their own /proc: a pid a step prints is not a host pid.) Needs the
/// right to read other users' /proc/PID/environ (root, in these tests).
pub fn step_processes(run_id: &str) -> Vec<i32> {
    let want = format!("KILN_RUN_ID={run_id}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'));
            !zombie && env.split(|b| *b == 0).any(|v| v == want.as_bytes())
        })
        .collect()
}

/// A temporary directory a host step may write to: under a root agent steps
/// run as `nobody`, and `tempfile`'s directories are 0700.
pub fn step_writable_tempdir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))?;
    Ok(dir)
}

/// Files (not directories) under `dir`, recursively; 0 if it does not exist.
pub fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| if e.path().is_dir() { files_under(&e.path()) } else { 1 }).sum())
        .unwrap_or(0)
}

/// Rows of `job`'s log still in the hot journal of the SQLite database in
/// the server's data dir `data` (read with python3's sqlite3, read-only use).
pub fn journal_rows(data: &Path, job: &str) -> i64 {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('SELECT COUNT(*) FROM log_chunks WHERE job_id=?', (sys.argv[2],)).fetchone()[0])")
        .arg(data.join("kiln.db"))
        .arg(job)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count")
}
