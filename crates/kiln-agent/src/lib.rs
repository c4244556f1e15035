//! The Kiln agent: claims jobs from a server and runs them in sandboxes.
//!
//! Sibling mechanisms, each in its own module (ARCHITECTURE.md, buildkite's
//! shape): the claim loop (here), the agent [`session`] stream, one
//! [`attempt`] per assignment with its [`heartbeat`], [`checkout`],
//! [`artifacts`] (restore, freeze, upload through the agent-wide
//! [`ratelimit`]) and [`logs`] streamer, all running steps through a
//! `kiln-sandbox` executor. The agent is trusted and holds the
//! lease; the sandbox is not and never sees the agent's token.
//!
//! # Lifecycle of [`run`]
//! 1. Lock `work_dir` (one agent per directory), SIGKILL step process
//!    groups a previous agent process left behind, delete stale attempt
//!    workspaces (mirrors are kept).
//! 2. Register, retrying with backoff while the server is unreachable.
//!    Then hold the [`session`] stream open for the agent's lifetime (fast
//!    loss detection; a reconnect makes every running attempt heartbeat at
//!    once).
//! 3. `max_jobs` slots, each long-polling `claim` and running what it gets.
//!    A claim that fails with a retryable error is retried with the *same*
//!    `claim_request_id`, so an assignment whose acknowledgement was lost
//!    after the server committed it is recovered (spec 000 §7).
//! 4. Shutdown (the watch flips to true): slots stop claiming at once (an
//!    in-flight long poll is abandoned); running attempts are killed —
//!    SIGTERM, SIGKILL after the sandbox's grace (10 s) — and completed as
//!    `failed` with `infra_failure` ("the agent shut down during the job"),
//!    so the server can retry them elsewhere without waiting for a lease to
//!    expire. `run` returns once every attempt has completed and cleaned up.

mod artifacts;
mod attempt;
mod caches;
mod checkout;
mod control;
mod disk;
mod heartbeat;
mod kept;
mod layout;
mod logs;
mod mask;
mod metrics;
mod outputs;
mod progress;
mod ran;
mod ratelimit;
mod reports;
mod services;
mod session;
mod slots;
pub mod step_env;
mod warm;

use anyhow::Context;
use attempt::{AttemptContext, run_attempt};
use checkout::Mirrors;
use control::backoff;
use kiln_api::client::Client;
use kiln_api::types::{AgentRegistration, Assignment, ClaimRequest, RegisterAgent};
use ratelimit::RateLimiter;
use session::Beats;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{Mutex, watch};

/// How long the server may hold a claim open waiting for work.
pub const CLAIM_WAIT_MS: u64 = 20_000;

/// Which sandbox runs the steps.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ExecutorKind {
    /// Host processes (see `kiln_sandbox::HostExecutor`). A job's `image:`
    /// is not used.
    #[default]
    Host,
    /// A fresh container per attempt (see `kiln_sandbox::ContainerExecutor`).
    Container(ContainerSettings),
}

/// How the container executor runs jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSettings {
    /// Docker Engine API endpoint, e.g. `unix:///run/podman/podman.sock`.
    pub engine: String,
    /// Image for jobs that declare no `image:` (used as the engine resolves
    /// it: pin it with `repo@sha256:…`). `None`: such jobs fail with a
    /// message saying so.
    pub default_image: Option<String>,
    /// `none` (default: no network) or `bridge`.
    pub network: kiln_sandbox::Network,
    /// For how many of the job shapes (image digest, size, network) it ran
    /// last the agent keeps one container started for the next job (see
    /// `warm.rs`; 0: every job's container is created when the job starts).
    /// Default 1.
    pub warm_containers: usize,
}

impl ContainerSettings {
    pub fn new(engine: impl Into<String>) -> Self {
        ContainerSettings {
            engine: engine.into(),
            default_image: None,
            network: kiln_sandbox::Network::None,
            warm_containers: 1,
        }
    }
}

/// The limits of an attempt's single operations (spec 004's operation
/// timeouts; `None`: unlimited). Each bounds one try: a git fetch that
/// times out is tried again like any transient failure. Past its limit an
/// operation's attempt fails as `timeout` (exit 124), the message naming
/// the operation and its `kiln agent` flag. Cache restore and save have
/// their own limit ([`AgentConfig::cache_timeout`]): a slow cache is a
/// miss, not a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpTimeouts {
    /// Each `git fetch` of a checkout (`--git-timeout`, 10 min).
    pub git: Option<std::time::Duration>,
    /// Pulling the job's image (`--pull-timeout`, 10 min).
    pub pull: Option<std::time::Duration>,
    /// Building the job's Dockerfile image (`--build-timeout`, 10 min).
    pub build: Option<std::time::Duration>,
    /// Uploading and sealing each declared artifact (`--upload-timeout`, 10 min).
    pub upload: Option<std::time::Duration>,
}

impl Default for OpTimeouts {
    fn default() -> Self {
        let ten = Some(std::time::Duration::from_secs(600));
        OpTimeouts { git: ten, pull: ten, build: ten, upload: ten }
    }
}

/// The nice value steps run at unless `--step-nice` says otherwise (issue
/// 47): 19. On a machine the server shares with its agents, the server's
/// log path and the agents' own work (logs, heartbeats) come first — the
/// 20-writer write→SSE p99 fell from 661 to 172 ms — while steps still get
/// every idle cycle. `--step-nice 0` keeps the agent's own.
pub const DEFAULT_STEP_NICE: i32 = 19;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Base URL of the server, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    /// Agent token (`DATA_DIR/agent.token`). Never passed to steps.
    pub token: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Private to this agent process (0700; no step runs under it):
    /// `attempts/` (log spools, deleted after each attempt), `mirrors/`
    /// (bare git mirrors, kept), `pristine/` (one small pristine checkout
    /// per mirror, kept), `pgids/` (running step groups),
    /// `agent.lock`.
    pub work_dir: PathBuf,
    /// Root of the attempts' workspaces, `HOME`s and `TMPDIR`s, apart from
    /// `work_dir` (see the `layout` module). `None`: a directory of the
    /// system temp dir named after the agent's uid and work dir.
    pub sandbox_dir: Option<PathBuf>,
    /// Host executor under a root agent: the user steps run as (a name,
    /// `UID` or `UID:GID`; `None`: `nobody`; `root` opts out). A non-root
    /// agent's steps keep its uid (asking for another is refused).
    pub step_user: Option<String>,
    /// The lowest priority steps run at (`--step-nice`, 0–19; issue 47):
    /// the agent's and a co-hosted server's own work come before busy steps.
    pub step_nice: i32,
    /// Concurrent jobs (at least 1).
    pub max_jobs: u32,
    pub executor: ExecutorKind,
    /// Upload bandwidth cap in bytes per second for the whole agent (one
    /// token bucket shared by every upload of every job); `None` is
    /// unlimited. `Some(0)` is refused.
    pub upload_rate_limit: Option<u64>,
    /// Per-attempt stdout + stderr limit in bytes; `None` is the default
    /// (100 MiB). Output over it is drained and dropped, and the log says so.
    pub log_limit: Option<u64>,
    /// Per-attempt stdout + stderr rate in bytes per second (`None`:
    /// unlimited). Output over it is drained, dropped, and marked as a gap.
    pub log_rate_limit: Option<u64>,
    /// Unshipped log bytes an attempt keeps in memory (`None`: 16 MiB).
    /// When full, the step waits on its pipe while chunks are still being
    /// shipped, and output spills to the on-disk spool after
    /// 500 ms without progress.
    pub log_buffer: Option<u64>,
    /// Largest on-disk log spool per attempt (`None`: 1 GiB); beyond it
    /// output is dropped and the drop recorded.
    pub log_spool_limit: Option<u64>,
    /// Time between SIGTERM and SIGKILL when a job is stopped (default 10 s).
    pub kill_grace: Option<std::time::Duration>,
    /// Longest a cache restore, and a cache save, may take (default 10
    /// min); past it the restore is a clean miss, the save is skipped.
    pub cache_timeout: Option<std::time::Duration>,
    /// Longest an attempt may spend preparing (checkout, image, artifact and
    /// cache restore, services) before it fails as `timeout` (default 15
    /// min, spec 004); `Some(ZERO)`: unlimited.
    pub prepare_timeout: Option<std::time::Duration>,
    /// Longest an attempt may spend finalizing (cache save, artifact
    /// upload) after its steps (default 15 min); `Some(ZERO)`: unlimited.
    pub finalize_timeout: Option<std::time::Duration>,
    /// Operation timeouts (git fetch, image pull and build, artifact upload).
    pub op_timeouts: OpTimeouts,
    /// Node-local cache copies kept at most, in bytes (default 5 GiB).
    pub cache_local_budget: Option<u64>,
    /// Host executor: the Docker Engine API endpoint that runs jobs'
    /// `services:` (the container executor uses its own engine). `None`:
    /// a host job with services fails, saying so.
    pub services_engine: Option<String>,
    /// Percent of the workspaces' disk used at which warning, degraded and
    /// critical start (default 80/90/95); a slot claims nothing at critical.
    pub storage_levels: Option<[f64; 3]>,
    /// Available memory below which warning, degraded and critical start
    /// (`None`: 2 GiB, 1 GiB, 500 MiB; `[0; 3]`: off).
    pub memory_levels: Option<[u64; 3]>,
    /// Where to serve the agent's own `GET /metrics` (Prometheus text);
    /// `None` (the default): nowhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Paths no host step may see besides `work_dir` (always hidden): the
    /// token file, `kiln up`'s data directory, `--hide-path`. Each step's
    /// mount namespace covers them; a step that cannot get one and would
    /// run as the agent's own user does not run (issue 39, item 8).
    pub hide_paths: Vec<PathBuf>,
    /// Host executor: variables and `PATH` directories every step gets
    /// (`--env`, `--env-file`, `--path`; issue 41, item 1).
    pub step_env: step_env::StepEnv,
    /// Host executor: also pass the toolchains found in the step user's
    /// home directory (rustup, cargo, pyenv, nvm, sdkman; see
    /// [`step_env`]). `--no-user-toolchains` turns it off.
    pub user_toolchains: bool,
    /// Leave each attempt's sandbox (workspace, `HOME`, `TMPDIR`) in place
    /// when the attempt ends, for a person to look at (`kiln exec --keep`):
    /// every attempt then gets a sandbox of its own (no reused job slots),
    /// named `<job>-<epoch>` under the sandbox root.
    pub keep_sandboxes: bool,
}

struct Agent {
    config: AgentConfig,
    client: Client,
    registration: Mutex<AgentRegistration>,
    ctx: AttemptContext,
}

impl Agent {
    fn thresholds(&self) -> kiln_core::degradation::Thresholds {
        thresholds(&self.config)
    }
}

/// Runs the agent until `shutdown` becomes true (see the crate docs for the
/// shutdown semantics). Errors only on a bad configuration, an unusable
/// work_dir, or a registration the server refuses (e.g. a wrong token).
pub async fn run(config: AgentConfig, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let (_never, drain) = watch::channel(false);
    run_draining(config, drain, shutdown).await
}

/// [`run`], and when `drain` becomes true (spec 004, graceful drain): slots
/// stop claiming at once, running attempts go on to their end, and `run`
/// returns once none is left. `shutdown` still stops what runs (the caller
/// sends it when a drain timeout passes, or to hand jobs back at once).
pub async fn run_draining(
    config: AgentConfig,
    drain: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    anyhow::ensure!(config.max_jobs >= 1, "max_jobs must be at least 1");
    logs::in_flight_setting().map_err(anyhow::Error::msg)?;
    logs::batch_setting().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        config.upload_rate_limit != Some(0),
        "upload_rate_limit must be positive (leave it unset for no limit)"
    );
    let work_dir = &config.work_dir;
    layout::private_dir(work_dir).with_context(|| format!("cannot create work dir {}", work_dir.display()))?;
    let _lock = lock_work_dir(work_dir)?;
    let isolation = host_isolation(config.step_user.as_deref())?;
    kiln_sandbox::set_step_nice(config.step_nice);
    let sandbox_dir = config.sandbox_dir.clone().unwrap_or_else(|| layout::default_sandbox_dir(work_dir));
    let step_env = match config.executor {
        ExecutorKind::Host => {
            tracing::info!(sandbox_dir = %sandbox_dir.display(), "{}", isolation.describe());
            host_step_env(&config, &isolation)
        }
        _ => {
            anyhow::ensure!(
                config.step_env == step_env::StepEnv::default(),
                "--env, --env-file and --path are for host steps: a container job's environment comes from its \
                 image and the workflow's `env:`"
            );
            step_env::StepEnv::default()
        }
    };
    let hide = hidden_paths(work_dir, &config.hide_paths, &sandbox_dir)?;
    layout::prepare_sandbox_root(&sandbox_dir, isolation.user.is_some())?;
    let reaped = kiln_sandbox::reap_orphans(&work_dir.join("pgids"))
        .with_context(|| format!("cannot reap orphaned steps recorded in {}", work_dir.join("pgids").display()))?;
    if reaped > 0 {
        tracing::warn!(reaped, "killed step process groups left by a previous agent");
    }
    // Containers are labelled with the agent's name: those a previous
    // process of this agent left (SIGKILL, crash) are removed now.
    let engine = match &config.executor {
        ExecutorKind::Host => {
            // Services of host jobs a previous process left (best effort:
            // a host agent runs without an engine until a job needs one).
            if let Some(url) = &config.services_engine
                && let Ok(e) = kiln_sandbox::Engine::connect(url)
                && e.ping().await.is_ok()
            {
                let reaped = e.reap(&config.name).await.unwrap_or(0) + e.reap_networks(&config.name).await.unwrap_or(0);
                if reaped > 0 {
                    tracing::warn!(reaped, "removed service containers and networks left by a previous agent process");
                }
            }
            None
        }
        ExecutorKind::Container(c) => {
            let engine = kiln_sandbox::Engine::connect(&c.engine)?;
            engine.ping().await?;
            let reaped = engine.reap(&config.name).await? + engine.reap_networks(&config.name).await?;
            if reaped > 0 {
                tracing::warn!(reaped, agent = %config.name, "removed containers left by a previous agent process");
            }
            Some(engine)
        }
    };
    let attempts = work_dir.join("attempts");
    kiln_sandbox::remove_tree(&attempts)
        .with_context(|| format!("cannot remove stale workspaces in {}", attempts.display()))?;
    std::fs::create_dir_all(&attempts).with_context(|| format!("cannot create {}", attempts.display()))?;

    let metrics = Arc::new(metrics::AgentMetrics::new(config.max_jobs));
    let metrics_task = match config.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}: cannot listen"))?;
            let bound = listener.local_addr()?;
            tracing::info!("agent metrics on http://{bound}/metrics");
            let thresholds = thresholds(&config);
            Some(tokio::spawn(metrics::serve(
                listener,
                metrics.clone(),
                attempts.clone(),
                sandbox_dir.clone(),
                thresholds,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let client = Client::new(&config.server, &config.token);
    let mut sd = shutdown.clone();
    let Some(registration) = register(&client, &config, &mut sd).await? else {
        return Ok(());
    };
    tracing::info!(agent_id = %registration.agent_id, session_id = %registration.session_id, server = %config.server,
        max_jobs = config.max_jobs, "agent registered");
    tracing::info!("{}", untrusted_line(&config.name, &registration, executor_name(&config.executor)));
    let warm = match (&config.executor, &engine) {
        (ExecutorKind::Container(c), Some(e)) if c.warm_containers > 0 => {
            Some(warm::WarmPool::new(e.clone(), config.name.clone(), sandbox_dir.clone(), c.warm_containers))
        }
        _ => None,
    };
    let slots_root = sandbox_dir.clone();
    let ctx = AttemptContext {
        client: client.clone(),
        work_dir: work_dir.clone(),
        sandbox_dir,
        isolation,
        hide: Arc::new(hide),
        step_env: Arc::new(step_env),
        mirrors: Arc::new(Mirrors::new(work_dir.join("mirrors")).with_fetch_timeout(config.op_timeouts.git)),
        slots: Arc::new(slots::Slots::new(slots_root)),
        keep_sandboxes: config.keep_sandboxes,
        executor: config.executor.clone(),
        engine,
        services_engine: config.services_engine.clone(),
        agent_name: config.name.clone(),
        kill_grace: config.kill_grace.unwrap_or(kiln_sandbox::DEFAULT_KILL_GRACE),
        cache: caches::Settings {
            timeout: config.cache_timeout.unwrap_or(caches::DEFAULT_TIMEOUT),
            local_budget: config.cache_local_budget.unwrap_or(caches::DEFAULT_LOCAL_BUDGET),
        },
        limiter: RateLimiter::new(config.upload_rate_limit),
        prepare_timeout: stage_limit(config.prepare_timeout),
        finalize_timeout: stage_limit(config.finalize_timeout),
        ops: config.op_timeouts,
        beats: Beats::default(),
        log_limit: config.log_limit.unwrap_or(logs::DEFAULT_LOG_LIMIT),
        log_rate_limit: config.log_rate_limit,
        log_buffer: config.log_buffer.map_or(logs::MAX_BUFFERED, |b| b as usize),
        log_spool_limit: config.log_spool_limit.unwrap_or(logs::DEFAULT_SPOOL_LIMIT),
        metrics,
        warm,
    };
    let agent = Arc::new(Agent { config: config.clone(), client, registration: Mutex::new(registration), ctx });
    let session = tokio::spawn(session::session_loop(agent.clone()));
    // When draining starts, say so to the server (`GET /v1/agents`, `kiln
    // agents` show it); best effort: the slots stop claiming regardless.
    let reporter = {
        let agent = agent.clone();
        let mut drain = drain.clone();
        tokio::spawn(async move {
            if drain.wait_for(|d| *d).await.is_err() {
                return;
            }
            let reg = agent.registration.lock().await.clone();
            if let Err(e) = agent.client.with_token(&reg.credential).report_draining(&reg.agent_id).await {
                tracing::warn!(error = %e, "could not tell the server that this agent drains");
            }
        })
    };
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..config.max_jobs {
        slots.spawn(slot_loop(agent.clone(), slot, drain.clone(), shutdown.clone()));
    }
    while let Some(r) = slots.join_next().await {
        if let Err(e) = r {
            tracing::error!(error = %e, "a job slot failed");
        }
    }
    // The stream lives as long as attempts may run: until every slot ended.
    session.abort();
    reporter.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    if let Some(pool) = &agent.ctx.warm {
        pool.drain().await;
    }
    if let Some(engine) = &agent.ctx.engine {
        engine.settle().await;
    }
    let kept = agent.ctx.slots.drain();
    let _ = tokio::task::spawn_blocking(move || kept.iter().for_each(|d| drop(kiln_sandbox::remove_tree(d)))).await;
    if config.sandbox_dir.is_none() {
        // The default sandbox dir is the agent's alone: leave no empty
        // directory behind in the system temp dir.
        let root = agent.ctx.sandbox_dir.clone();
        let _ = tokio::task::spawn_blocking(move || kiln_sandbox::remove_tree(&root)).await;
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// What host steps may not see: the work dir and `extra`, absolute. Err
/// when the sandbox root lies under one of them (its jobs would vanish
/// with it).
fn hidden_paths(
    work_dir: &std::path::Path,
    extra: &[PathBuf],
    sandbox: &std::path::Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let abs = |p: &std::path::Path| {
        p.canonicalize().unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
    };
    let sandbox = abs(sandbox);
    let mut hide = vec![];
    for p in std::iter::once(work_dir).chain(extra.iter().map(PathBuf::as_path)) {
        let p = abs(p);
        anyhow::ensure!(
            !sandbox.starts_with(&p),
            "the sandbox dir {} is under {}, which host steps must not see: pass another --sandbox-dir",
            sandbox.display(),
            p.display()
        );
        if !hide.contains(&p) {
            hide.push(p);
        }
    }
    Ok(hide)
}

/// What host steps get from this machine (see [`step_env`]): the
/// `--env`/`--path` flags, the step user's own toolchains unless turned
/// off, and a warning naming `PATH` entries the step user cannot reach.
fn host_step_env(config: &AgentConfig, isolation: &kiln_sandbox::Isolation) -> step_env::StepEnv {
    let mut env = config.step_env.clone();
    let me = nix::unistd::geteuid();
    let (uid, gid) = match isolation.user {
        Some(u) => (u.uid, u.gid),
        None => (me.as_raw(), nix::unistd::getegid().as_raw()),
    };
    let own = uid == me.as_raw();
    let lookup = |k: &str| std::env::var(k).ok();
    if config.user_toolchains {
        let home = match std::env::var_os("HOME").filter(|h| own && !h.is_empty()) {
            Some(h) => Some(PathBuf::from(h)),
            None => nix::unistd::User::from_uid(uid.into()).ok().flatten().map(|u| u.dir),
        };
        if let Some(home) = home {
            let added = env.add_user_toolchains(&home, own, &lookup);
            if !added.is_empty() {
                tracing::info!(
                    "host steps get the toolchains in {} (--no-user-toolchains to turn off): {}",
                    home.display(),
                    added.join(", ")
                );
            }
        }
    }
    let base =
        std::env::var("PATH").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| kiln_sandbox::DEFAULT_PATH.into());
    let unreachable = step_env::unreachable_path_entries(&env.steps_path(&base), uid, gid);
    if !unreachable.is_empty() {
        let who = nix::unistd::User::from_uid(uid.into()).ok().flatten().map_or(format!("uid {uid}"), |u| u.name);
        tracing::warn!(
            "host steps run as {who}, who cannot reach these PATH entries: {}. Tools there will not be found \
             (exit 127): install them system-wide, pass --path with a directory {who} can read, or choose \
             another --step-user (see docs/deploy.md)",
            unreachable.join(", ")
        );
    }
    env
}

/// Who runs host steps: under root, `step_user` (default `nobody`; `root`
/// opts out); otherwise the agent's own uid.
fn host_isolation(step_user: Option<&str>) -> anyhow::Result<kiln_sandbox::Isolation> {
    let root = nix::unistd::geteuid().is_root();
    let user = match step_user {
        Some(spec) => {
            Some(kiln_sandbox::StepUser::lookup(spec).with_context(|| format!("--step-user {spec}: no such user"))?)
        }
        None if root => Some(kiln_sandbox::StepUser::nobody()),
        None => None,
    };
    kiln_sandbox::Isolation::detect(user).map_err(|e| anyhow::anyhow!("--step-user: {e}"))
}

fn lock_work_dir(dir: &std::path::Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("agent.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "work dir {} is in use by another agent ({e}); give each agent its own --work-dir",
            dir.display()
        )
    })
}

/// The executor's name as the agent registers it (placement, invariant 12).
fn executor_name(kind: &ExecutorKind) -> &'static str {
    match kind {
        ExecutorKind::Host => "host",
        ExecutorKind::Container(_) => "container",
    }
}

/// The start-up line saying whether this agent takes untrusted work (fork
/// pull requests, untrusted trigger-token runs), as the server decided.
pub fn untrusted_line(name: &str, reg: &AgentRegistration, executor: &str) -> String {
    let pool = &reg.pool;
    let who = reg.untrusted_agents.as_deref().unwrap_or("see the server's --untrusted-pools");
    match reg.takes_untrusted {
        Some(true) => format!("agent `{name}` (pool {pool}, {executor} executor) takes untrusted work ({who})"),
        Some(false) => format!(
            "agent `{name}` (pool {pool}, {executor} executor) takes no untrusted work: untrusted runs go to agents of {who}"
        ),
        None => format!(
            "agent `{name}` (pool {pool}, {executor} executor): the server did not say whether it takes untrusted work"
        ),
    }
}

/// Registers, retrying while the server is unreachable. None on shutdown.
async fn register(
    client: &Client,
    config: &AgentConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> anyhow::Result<Option<AgentRegistration>> {
    let body = RegisterAgent {
        name: config.name.clone(),
        labels: config.labels.clone(),
        max_jobs: config.max_jobs,
        version: Some(env!("CARGO_PKG_VERSION").into()),
        executor: Some(executor_name(&config.executor).into()),
        // Step 1 of the lifecycle ran: what the previous process left is
        // gone, and the server may count its fenced attempts confirmed.
        fresh_start: true,
    };
    let mut failures = 0;
    loop {
        let res = tokio::select! {
            r = client.register_agent(&body) => r,
            _ = shutdown.wait_for(|s| *s) => return Ok(None),
        };
        match res {
            Ok(r) => return Ok(Some(r)),
            Err(e) if e.is_retryable() => {
                failures += 1;
                let delay = backoff(failures, 500, 30_000);
                tracing::warn!(server = %config.server, error = %e, retry_in_ms = delay.as_millis() as u64,
                    "cannot register with the Kiln server; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait_for(|s| *s) => return Ok(None),
                }
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "the Kiln server at {} refused to register agent `{}`: {e}",
                    config.server,
                    config.name
                ));
            }
        }
    }
}

async fn slot_loop(
    agent: Arc<Agent>,
    slot: u32,
    mut drain: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if *shutdown.borrow() || *drain.borrow() {
            return;
        }
        if let Err(why) = disk::may_claim(&agent.ctx.sandbox_dir, &agent.thresholds()) {
            if slot == 0 {
                tracing::warn!("not claiming jobs: {why}; claiming again once space returns");
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => continue,
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
        let assignment = tokio::select! {
            a = claim(&agent, slot) => a,
            _ = shutdown.wait_for(|s| *s) => return,
            _ = drain.wait_for(|d| *d) => {
                if slot == 0 {
                    tracing::info!("draining: no more claims; running jobs go on to their end");
                }
                return;
            }
        };
        if let Some(a) = assignment {
            let trace_id =
                a.traceparent.as_deref().and_then(kiln_api::trace::TraceParent::parse).map(|t| t.trace_id_hex());
            tracing::info!(
                slot,
                run = %a.run_id,
                job = %a.job_name,
                job_id = %a.job_id,
                epoch = a.epoch,
                trace_id = trace_id.as_deref().unwrap_or_default(),
                "claimed job"
            );
            agent.ctx.metrics.jobs_running.inc();
            run_attempt(&agent.ctx, a, slot, shutdown.clone()).await;
            agent.ctx.metrics.jobs_running.dec();
        }
    }
}

/// One logical claim: a fresh claim_request_id, reused across retries.
async fn claim(agent: &Agent, slot: u32) -> Option<Assignment> {
    let claim_request_id = uuid::Uuid::new_v4().to_string();
    let mut failures = 0;
    loop {
        let reg = agent.registration.lock().await.clone();
        let body = ClaimRequest {
            session_id: reg.session_id.clone(),
            claim_request_id: claim_request_id.clone(),
            wait_ms: CLAIM_WAIT_MS,
        };
        match agent.client.with_token(&reg.credential).claim(&reg.agent_id, &body).await {
            Ok(r) => {
                let result = if r.assignment.is_some() { "assigned" } else { "empty" };
                agent.ctx.metrics.claims.with_label_values(&[result]).inc();
                return r.assignment;
            }
            Err(e) => {
                agent.ctx.metrics.claims.with_label_values(&["error"]).inc();
                failures += 1;
                let delay = backoff(failures, 500, 30_000);
                if e.is_retryable() {
                    tracing::warn!(slot, error = %e, %claim_request_id, retry_in_ms = delay.as_millis() as u64,
                        "claim failed; retrying with the same claim_request_id");
                    tokio::time::sleep(delay).await;
                    continue;
                }
                tracing::error!(slot, error = %e, retry_in_ms = delay.as_millis() as u64, "the server refused the claim");
                tokio::time::sleep(delay).await;
                // Unknown agent or session (data reset, `kiln agents rm`), or a
                // credential the server no longer accepts: register again.
                if matches!(e.status(), Some(401 | 404 | 410)) {
                    reregister(agent, &reg.session_id).await;
                }
                return None;
            }
        }
    }
}

/// The server no longer knows our agent or session (e.g. its data was
/// reset): register again, once for all slots and the session stream.
pub(crate) async fn reregister(agent: &Agent, stale_session: &str) {
    let mut reg = agent.registration.lock().await;
    if reg.session_id != stale_session {
        return;
    }
    let body = RegisterAgent {
        name: agent.config.name.clone(),
        labels: agent.config.labels.clone(),
        max_jobs: agent.config.max_jobs,
        version: Some(env!("CARGO_PKG_VERSION").into()),
        executor: Some(executor_name(&agent.config.executor).into()),
        // Its attempts may still run: it confirms nothing.
        fresh_start: false,
    };
    match agent.client.register_agent(&body).await {
        Ok(r) => {
            tracing::info!(agent_id = %r.agent_id, session_id = %r.session_id, "agent registered again");
            *reg = r;
        }
        Err(e) => tracing::warn!(error = %e, "cannot register again; will retry"),
    }
}

/// A stage timeout as configured: unset → spec 004's 15 minutes, zero → none.
/// The degradation levels of `config` (`--storage-levels`, `--memory-levels`).
fn thresholds(config: &AgentConfig) -> kiln_core::degradation::Thresholds {
    let mut t = kiln_core::degradation::Thresholds::default();
    if let Some(levels) = config.storage_levels {
        t.storage_pct = levels;
    }
    if let Some(levels) = config.memory_levels {
        t.memory_bytes = levels;
    }
    t
}

fn stage_limit(configured: Option<std::time::Duration>) -> Option<std::time::Duration> {
    match configured {
        None => Some(attempt::DEFAULT_STAGE_TIMEOUT),
        Some(d) if d.is_zero() => None,
        Some(d) => Some(d),
    }
}
