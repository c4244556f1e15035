//! What the benchmarks share: percentiles, a one-commit repository, waiting
//! for a run, and real server and agent processes.

use kiln_api::Client;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let st = Command::new("git").arg("-C").arg(dir).args(args).status()?;
    anyhow::ensure!(st.success(), "git {args:?} failed");
    Ok(())
}

/// A one-commit git repository (branch `main`) holding `workflow` as
/// `.kiln/pipeline.yaml`: the repository every benchmark registers.
pub(crate) fn repo_with(dir: &Path, workflow: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join(".kiln"))?;
    std::fs::write(dir.join(".kiln/pipeline.yaml"), workflow)?;
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["add", "."])?;
    git(dir, &["-c", "user.name=bench", "-c", "user.email=bench@kiln", "commit", "-q", "-m", "bench"])?;
    Ok(())
}

pub(crate) async fn wait_terminal(c: &Client, run: &str) -> anyhow::Result<kiln_api::Run> {
    wait_terminal_every(c, run, Duration::from_millis(5)).await
}

/// [`wait_terminal`] asking every `poll`: where the server's CPU or the
/// database's transactions are measured, 200 polls a second would be part
/// of what is measured.
pub(crate) async fn wait_terminal_every(c: &Client, run: &str, poll: Duration) -> anyhow::Result<kiln_api::Run> {
    loop {
        let r = c.get_run(run).await?;
        if r.status.is_terminal() {
            return Ok(r);
        }
        tokio::time::sleep(poll).await;
    }
}

/// A real agent process (this binary's `agent` subcommand: kiln-bench runs
/// inside the `kiln` binary); resumed and killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.id().to_string()]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn spawn_agent(server: &str, token: &str, name: &str, dir: &Path) -> anyhow::Result<Proc> {
    spawn_agent_with(server, token, name, dir, &[])
}

pub(crate) fn spawn_agent_with(
    server: &str,
    token: &str,
    name: &str,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<Proc> {
    spawn_agent_niced(server, token, name, dir, extra, 0)
}

/// [`spawn_agent_with`] as `nice -n NICE kiln agent …` (0: without `nice`).
pub(crate) fn spawn_agent_niced(
    server: &str,
    token: &str,
    name: &str,
    dir: &Path,
    extra: &[&str],
    nice: i32,
) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe()?;
    let mut cmd = if nice == 0 {
        Command::new(exe)
    } else {
        let mut c = Command::new("nice");
        c.args(["-n", &nice.to_string()]).arg(exe);
        c
    };
    let child = cmd
        .args(["agent", "--server", server, "--name", name, "--work-dir"])
        .arg(dir.join(name))
        .env("KILN_AGENT_TOKEN", token)
        .args(extra)
        // Extra agent flags for a comparison (e.g. `--log-buffer 1GiB`),
        // separated by spaces: the agents of `logs`, `failover`, … all get them.
        .args(std::env::var("KILN_BENCH_AGENT_ARGS").unwrap_or_default().split_whitespace())
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Proc(child))
}

/// How a daemon of a benchmarked deployment is started: the daemon flags
/// (`--log-format`, `--otlp-endpoint`, …) and environment. With a `log`
/// file the process logs at its default level (`info`) into it, as a
/// deployment logs into its journal; without one it logs errors only, to
/// nowhere.
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    pub(crate) global: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) log: Option<PathBuf>,
}

impl Launch {
    /// `kiln SUB GLOBAL…` with this launch's environment and stderr. The
    /// bench's own KILN_LOG_FORMAT / KILN_OTLP_* would leak into every
    /// configuration, so they are removed; the flags say what is on.
    fn command(&self, sub: &str) -> anyhow::Result<Command> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg(sub).args(&self.global);
        for var in ["KILN_LOG_FORMAT", "KILN_OTLP_ENDPOINT", "KILN_OTLP_PROTOCOL"] {
            cmd.env_remove(var);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        match &self.log {
            Some(file) => {
                cmd.env_remove("KILN_LOG").stderr(std::fs::File::create(file)?);
            }
            None => {
                cmd.env("KILN_LOG", "error").stderr(Stdio::null());
            }
        }
        Ok(cmd)
    }

    /// This launch, logging into `file`.
    pub(crate) fn logging_to(&self, file: PathBuf) -> Self {
        Self { log: Some(file), ..self.clone() }
    }
}

/// `kiln server` on `data` at `listen` (errors only, discarded); returns
/// once it listens, with its URL.
pub(crate) fn spawn_server(data: &Path, listen: &str) -> anyhow::Result<(Proc, String)> {
    spawn_server_with(data, listen, &Launch::default(), &[])
}

/// [`spawn_server`] started as `launch` says, with `extra` server flags
/// (`--database-url …`, `--dispatch-offer …`).
pub(crate) fn spawn_server_with(
    data: &Path,
    listen: &str,
    launch: &Launch,
    extra: &[&str],
) -> anyhow::Result<(Proc, String)> {
    let mut child = launch
        .command("server")?
        .args(["--listen", listen, "--data-dir"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().expect("stdout");
    let proc = Proc(child);
    let mut lines = BufReader::new(out).lines();
    for line in lines.by_ref() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("kiln server listening on ") {
            let url = rest.split_whitespace().next().unwrap_or_default().to_string();
            // Keep reading: a closed stdout would end a later `outln!` (and
            // the server) quietly.
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((proc, url));
        }
    }
    anyhow::bail!("kiln server exited before listening")
}

/// A token the server wrote into its data dir (`admin.token`, `agent.token`).
pub(crate) fn token(data: &Path, name: &str) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(data.join(name))?.trim().to_string())
}

/// Register the local repository `dir` as `name`.
pub(crate) async fn add_repo(c: &Client, name: &str, dir: &Path) -> anyhow::Result<()> {
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: name.into(),
        clone_url: dir.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await?;
    Ok(())
}

/// A `kiln agent` as deployed: its token read from `token_file` (never
/// argv, never the environment), started as `launch` says.
pub(crate) fn spawn_agent_deployed(
    server: &str,
    token_file: &Path,
    name: &str,
    dir: &Path,
    max_jobs: u32,
    launch: &Launch,
) -> anyhow::Result<Proc> {
    let child = launch
        .command("agent")?
        .args(["--server", server, "--name", name, "--max-jobs", &max_jobs.to_string(), "--token-file"])
        .arg(token_file)
        .arg("--work-dir")
        .arg(dir.join(name))
        .env_remove("KILN_AGENT_TOKEN")
        .stdout(Stdio::null())
        .spawn()?;
    Ok(Proc(child))
}

/// User + system CPU ticks of `pids` and of the children they reaped
/// (`/proc/PID/stat` fields 14-17).
pub(crate) fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // After the command name, which may hold spaces: field 3 on.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            rest.split_whitespace().skip(11).take(4).filter_map(|f| f.parse::<u64>().ok()).sum::<u64>()
        })
        .sum()
}

/// [`cpu_ticks`] of one process split: (its own user + system ticks, those
/// of the children it reaped). An agent's reaped children are its steps.
pub(crate) fn cpu_ticks_split(pid: u32) -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0, 0) };
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(4).filter_map(|f| f.parse::<u64>().ok()).collect();
    match f[..] {
        [u, s, cu, cs] => (u + s, cu + cs),
        _ => (0, 0),
    }
}

/// `sysconf(_SC_CLK_TCK)` (100 on Linux), read once from `getconf`.
pub(crate) fn clock_ticks_per_s() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// `KILN_STORAGE_LEVELS`, as `kiln server` and `kiln agent` read it, for a
/// bench's in-process server and agents (a shared host's disk may be fuller
/// than the benchmark's few hundred megabytes need). `None`: unset.
pub(crate) fn storage_levels_from_env() -> anyhow::Result<Option<[f64; 3]>> {
    match std::env::var("KILN_STORAGE_LEVELS") {
        Ok(levels) => Ok(Some(kiln_core::degradation::parse_storage_levels(&levels).map_err(anyhow::Error::msg)?)),
        Err(_) => Ok(None),
    }
}

/// Where a benchmark keeps its files: `$TMPDIR`, else `/var/tmp` — not
/// `/tmp`, which a host step sees as its job's own private directory
/// (issue 39, item 9), so a step could not read a file the benchmark put
/// there.
pub(crate) fn bench_dir() -> PathBuf {
    std::env::var_os("TMPDIR").filter(|d| !d.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// `--database-url` of a suite that also runs on PostgreSQL: `postgres`
/// starts a throwaway durable server (kept alive by the returned handle), a
/// `postgres://` URL is used as given, anything else is a usage error.
pub(crate) async fn postgres_for(
    suite: &str,
    database_url: Option<&str>,
) -> Result<(Option<kiln_testkit::TempPostgres>, Option<String>), kiln_cmd::Failure> {
    match database_url {
        None => Ok((None, None)),
        Some("postgres") => {
            eprintln!("bench {suite}: starting a throwaway PostgreSQL (fsync and synchronous commit on)…");
            let pg = kiln_testkit::TempPostgres::start_durable()?;
            let url = pg.create_database().await?;
            Ok((Some(pg), Some(url)))
        }
        Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => Ok((None, Some(u.to_string()))),
        Some(u) => Err(kiln_cmd::Failure {
            message: format!("bench {suite}: --database-url {u}: expected postgres or postgres://…"),
            code: kiln_api::exit::USAGE,
        }),
    }
}
