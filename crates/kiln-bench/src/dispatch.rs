//! `kiln bench dispatch`: no-op run throughput, trigger-to-start and claim
//! latency of a deployment, each printed beside a bare `sh -c true`
//! baseline measured in the same invocation.
//!
//! By default the deployment is real processes: `kiln server` (SQLite in a
//! temporary data dir) and `--agents` `kiln agent` processes holding their
//! token in a file, logging at their default level into files, measured
//! once per `--configs` entry with fresh processes each time:
//!
//! - `plain`: text logs, nothing scraped;
//! - `observed`: `--log-format json`, and the bench scrapes the server's
//!   `/metrics` every second during the measurement, as Prometheus would;
//! - `otlp`: observed, and every process exports its spans with
//!   `--otlp-endpoint` (OTLP/HTTP, a 200 ms batch delay so that export
//!   happens inside the measurement) to a loopback sink ([`crate::otlp_sink`]).
//!
//! Issue 19 asks what observability costs: `observed_overhead_pct` and
//! `otlp_overhead_pct` are the throughput lost against `plain` on the same
//! host in the same invocation (noise on a shared host can make them
//! negative; they are printed as measured).
//!
//! Trigger-to-start is measured to the step's command itself: the no-op step
//! prints its own clock (`KILN_T=<ns since the epoch>`), the bench reads the
//! job's log through the API after the run ends and subtracts its own clock
//! at submission (one host, one clock). Claim latency (the attempt's
//! `started_at_ms`, set by the server at claim, minus submission) is printed
//! beside it: the difference is the agent's preparation (checkout, sandbox,
//! spawning the step). `--embedded` measures an in-process `kiln up` instead,
//! with the earlier figure names.
//!
//! `--database-url postgres` measures the same deployment with the server
//! on a throwaway PostgreSQL (durable: fsync and synchronous commit on, a
//! fresh database per configuration and round), `--database-url
//! postgres://…` on that database; `dispatch_database` says which.
//! `cpu_ms_per_run` stays the daemons and their steps (comparable with
//! SQLite, whose work happens inside the server); PostgreSQL's own
//! processes are printed beside it (`cpu_ms_per_run_postgres_*`).

use crate::args::BenchArgs;
use crate::costs::postgres_pids;
use crate::otlp_sink::OtlpSink;
use crate::util::{
    Launch, Proc, add_repo, clock_ticks_per_s, cpu_ticks_split, now_ms, percentile, repo_with, spawn_agent_deployed,
    spawn_server_with, token, wait_terminal,
};
use futures::StreamExt;
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::{Failure, start_embedded};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the no-op step prints: its own clock, in ns since the epoch.
const MARKER: &str = "KILN_T=";
const WORKFLOW: &str = "version: 1\njobs:\n  - name: noop\n    steps:\n      - \"echo KILN_T=$(date +%s%N)\"\n";
/// [`WORKFLOW`] with one small artifact per job (`--artifact-per-job`).
const WORKFLOW_ARTIFACT: &str = "version: 1\njobs:\n  - name: noop\n    steps:\n      - \"echo KILN_T=$(date +%s%N) | tee out.txt\"\n    artifacts:\n      publish:\n        - {name: out, path: out.txt}\n";
/// How often the observed configurations scrape `/metrics` (Prometheus'
/// usual interval is 15-60 s; 1 s is a pessimistic scraper).
const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// OTEL_BSP_SCHEDULE_DELAY for `otlp` (the SDK's default, 5 s, could leave
/// a short measurement's spans unexported until after it ends).
const OTLP_BATCH_DELAY_MS: &str = "200";

pub(crate) async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    if a.embedded {
        if a.artifact_per_job {
            return Err(
                anyhow::anyhow!("--artifact-per-job measures real processes; it does not go with --embedded").into()
            );
        }
        return embedded(a).await;
    }
    processes(a).await
}

/// One deployment's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Plain,
    Observed,
    Otlp,
}

impl Config {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "plain" => Some(Self::Plain),
            "observed" => Some(Self::Observed),
            "otlp" => Some(Self::Otlp),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Observed => "observed",
            Self::Otlp => "otlp",
        }
    }
}

/// One configuration's figures.
struct Figures {
    runs_per_s: f64,
    failed: usize,
    /// Sorted, ms: submission → the step's own clock.
    step: Vec<f64>,
    /// Sorted, ms: submission → the attempt's claim.
    claim: Vec<f64>,
    scrapes: u64,
    log_bytes: u64,
    /// (export requests, bytes) the sink received.
    otlp: Option<(u64, u64)>,
    /// CPU time (user + system, the daemons and the steps they reaped)
    /// per run of the throughput phase, ms: steadier than throughput on a
    /// shared host, since another process's load does not add to it.
    cpu_ms_per_run: f64,
    /// [`Self::cpu_ms_per_run`] split: the server (and the git it
    /// reaped), the agents' own threads, the steps the agents reaped.
    cpu_split: CpuSplit,
    /// CPU time of the PostgreSQL server's processes per run, ms (`None`
    /// on SQLite, or a database the bench did not start).
    cpu_ms_per_run_db: Option<f64>,
    /// Mean ms of each attempt phase the agents reported during the
    /// throughput phase, then (`*_idle`) the one-at-a-time phase
    /// (`kiln_attempt_phase_duration_seconds`, from the server's
    /// `/metrics`): where an agent's turn-around goes.
    phases: Vec<(String, f64)>,
}

impl Figures {
    /// Several rounds of one configuration as one: the median throughput,
    /// the latencies pooled, the counts summed.
    fn pool(mut rounds: Vec<Figures>) -> Figures {
        rounds.sort_by(|a, b| a.runs_per_s.total_cmp(&b.runs_per_s));
        let rates: Vec<f64> = rounds.iter().map(|f| f.runs_per_s).collect();
        let sorted = |v: Vec<f64>| {
            let mut v = v;
            v.sort_by(|a, b| a.total_cmp(b));
            v
        };
        Figures {
            runs_per_s: percentile(&rates, 0.5),
            failed: rounds.iter().map(|f| f.failed).sum(),
            step: sorted(rounds.iter().flat_map(|f| f.step.iter().copied()).collect()),
            claim: sorted(rounds.iter().flat_map(|f| f.claim.iter().copied()).collect()),
            scrapes: rounds.iter().map(|f| f.scrapes).sum(),
            log_bytes: rounds.iter().map(|f| f.log_bytes).sum(),
            otlp: rounds.iter().filter_map(|f| f.otlp).reduce(|(r, b), (r2, b2)| (r + r2, b + b2)),
            cpu_ms_per_run: percentile(&sorted(rounds.iter().map(|f| f.cpu_ms_per_run).collect()), 0.5),
            cpu_split: CpuSplit {
                server: percentile(&sorted(rounds.iter().map(|f| f.cpu_split.server).collect()), 0.5),
                agents: percentile(&sorted(rounds.iter().map(|f| f.cpu_split.agents).collect()), 0.5),
                steps: percentile(&sorted(rounds.iter().map(|f| f.cpu_split.steps).collect()), 0.5),
            },
            cpu_ms_per_run_db: rounds
                .iter()
                .all(|f| f.cpu_ms_per_run_db.is_some())
                .then(|| percentile(&sorted(rounds.iter().filter_map(|f| f.cpu_ms_per_run_db).collect()), 0.5)),
            phases: rounds
                .first()
                .map(|f| f.phases.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    let v: Vec<f64> =
                        rounds.iter().flat_map(|f| f.phases.iter()).filter(|(k, _)| *k == p).map(|(_, v)| *v).collect();
                    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
                    (p, mean)
                })
                .collect(),
        }
    }
}

/// CPU time per run, ms, by process (each the median of the rounds).
#[derive(Debug, Clone, Copy, Default)]
struct CpuSplit {
    server: f64,
    agents: f64,
    steps: f64,
}

/// The metadata database of the measured deployments.
enum Database {
    Sqlite,
    /// A throwaway server the bench started: a fresh database per
    /// deployment, its processes' CPU measured.
    Throwaway(kiln_testkit::TempPostgres),
    /// `--database-url postgres://…`, used as it is.
    Given(String),
}

impl Database {
    fn name(&self) -> &'static str {
        match self {
            Database::Sqlite => "sqlite",
            Database::Throwaway(_) => "postgres (started by the bench: fsync and synchronous commit on)",
            Database::Given(_) => "postgres",
        }
    }

    /// The server's `--database-url` for one deployment.
    async fn url(&self) -> anyhow::Result<Option<String>> {
        Ok(match self {
            Database::Sqlite => None,
            Database::Throwaway(pg) => Some(pg.create_database().await?),
            Database::Given(u) => Some(u.clone()),
        })
    }

    /// CPU ticks of the database's processes, when the bench started them.
    fn cpu_ticks(&self) -> Option<u64> {
        match self {
            Database::Throwaway(pg) => Some(
                postgres_pids(pg.port())
                    .into_iter()
                    .map(|p| {
                        let (own, reaped) = cpu_ticks_split(p);
                        own + reaped
                    })
                    .sum(),
            ),
            _ => None,
        }
    }
}

async fn processes(a: &BenchArgs) -> Result<i32, Failure> {
    let mut configs = vec![];
    for s in &a.configs {
        let c = Config::parse(s).ok_or_else(|| anyhow::anyhow!("--configs: unknown configuration {s:?}"))?;
        if !configs.contains(&c) {
            configs.push(c);
        }
    }
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-dispatch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(&repo, if a.artifact_per_job { WORKFLOW_ARTIFACT } else { WORKFLOW })?;
    let n = a.runs as usize;
    let (sh_rate, sh_lat) = baseline(n)?;
    let db = match a.database_url.as_deref() {
        None => Database::Sqlite,
        Some("postgres") => {
            eprintln!("bench dispatch: starting a throwaway PostgreSQL (fsync and synchronous commit on)…");
            Database::Throwaway(kiln_testkit::TempPostgres::start_durable()?)
        }
        Some(u) if u.starts_with("postgres") => Database::Given(u.to_string()),
        Some(u) => {
            return Err(Failure {
                message: format!(
                    "--database-url {u:?}: dispatch measures SQLite (no flag) or PostgreSQL (`postgres` or postgres://…)"
                ),
                code: exit::USAGE,
            });
        }
    };

    kiln_cmd::outln!("dispatch_database: {}", db.name());
    kiln_cmd::outln!("dispatch_agents: {}", a.agents);
    kiln_cmd::outln!("dispatch_agent_max_jobs: {}", a.agent_max_jobs);
    kiln_cmd::outln!("dispatch_artifact_per_job: {}", a.artifact_per_job);
    // Rounds interleave the configurations, so that a host's drift (other
    // load, a warming page cache) falls on all of them alike.
    let mut rounds: Vec<(Config, Vec<Figures>)> = configs.iter().map(|c| (*c, vec![])).collect();
    for round in 0..a.rounds.max(1) {
        for (cfg, figs) in &mut rounds {
            figs.push(measure(a, *cfg, &db, &repo, &tmp.join(format!("{}-{round}", cfg.name()))).await?);
        }
    }
    if a.rounds > 1 {
        kiln_cmd::outln!("dispatch_rounds: {} (throughput: the median round; latency: all rounds pooled)", a.rounds);
    }
    let mut results = vec![];
    for (cfg, figs) in rounds {
        let f = Figures::pool(figs);
        let s = cfg.name();
        kiln_cmd::outln!("noop_runs_per_s_{s}: {:.1}", f.runs_per_s);
        kiln_cmd::outln!("noop_runs_failed_{s}: {}", f.failed);
        kiln_cmd::outln!("trigger_to_start_p50_ms_{s}: {:.1}", percentile(&f.step, 0.5));
        kiln_cmd::outln!("trigger_to_start_p95_ms_{s}: {:.1}", percentile(&f.step, 0.95));
        kiln_cmd::outln!("claim_p50_ms_{s}: {:.1}", percentile(&f.claim, 0.5));
        kiln_cmd::outln!("claim_p95_ms_{s}: {:.1}", percentile(&f.claim, 0.95));
        kiln_cmd::outln!("daemon_log_bytes_{s}: {}", f.log_bytes);
        kiln_cmd::outln!("cpu_ms_per_run_{s}: {:.2}", f.cpu_ms_per_run);
        kiln_cmd::outln!("cpu_ms_per_run_server_{s}: {:.2}", f.cpu_split.server);
        kiln_cmd::outln!("cpu_ms_per_run_agents_{s}: {:.2}", f.cpu_split.agents);
        kiln_cmd::outln!("cpu_ms_per_run_steps_{s}: {:.2}", f.cpu_split.steps);
        if let Some(db) = f.cpu_ms_per_run_db {
            kiln_cmd::outln!("cpu_ms_per_run_postgres_{s}: {db:.2}");
        }
        for (phase, ms) in &f.phases {
            kiln_cmd::outln!("attempt_{phase}_ms_mean_{s}: {ms:.1}");
        }
        if cfg != Config::Plain {
            kiln_cmd::outln!("metrics_scrapes_{s}: {}", f.scrapes);
        }
        if let Some((requests, bytes)) = f.otlp {
            kiln_cmd::outln!("otlp_export_requests_{s}: {requests}");
            kiln_cmd::outln!("otlp_export_bytes_{s}: {bytes}");
        }
        results.push((cfg, f));
    }
    let rate = |c: Config| results.iter().find(|(k, _)| *k == c).map(|(_, f)| f.runs_per_s);
    let cpu = |c: Config| results.iter().find(|(k, _)| *k == c).map(|(_, f)| f.cpu_ms_per_run);
    if let (Some(plain), Some(plain_cpu)) = (rate(Config::Plain), cpu(Config::Plain)) {
        for c in [Config::Observed, Config::Otlp] {
            if let (Some(r), Some(u)) = (rate(c), cpu(c)) {
                kiln_cmd::outln!("{}_overhead_pct: {:.1}", c.name(), (1.0 - r / plain) * 100.0);
                kiln_cmd::outln!("{}_cpu_overhead_pct: {:.1}", c.name(), (u / plain_cpu - 1.0) * 100.0);
            }
        }
    }
    kiln_cmd::outln!("baseline_sh_true_per_s: {sh_rate:.1}");
    kiln_cmd::outln!("baseline_sh_true_p50_ms: {:.2}", percentile(&sh_lat, 0.5));
    kiln_cmd::outln!("baseline_sh_true_p95_ms: {:.2}", percentile(&sh_lat, 0.95));
    let _ = std::fs::remove_dir_all(&tmp);
    let failed: usize = results.iter().map(|(_, f)| f.failed).sum();
    Ok(if failed == 0 { exit::OK } else { exit::RUN_FAILED })
}

/// Start `cfg`'s deployment in `dir`, measure it, stop it.
async fn measure(a: &BenchArgs, cfg: Config, db: &Database, repo: &Path, dir: &Path) -> anyhow::Result<Figures> {
    std::fs::create_dir_all(dir)?;
    let sink = match cfg {
        Config::Otlp => Some(OtlpSink::start().await?),
        _ => None,
    };
    let mut launch = Launch { env: vec![("KILN_STORAGE_LEVELS".into(), "off".into())], ..Default::default() };
    if cfg != Config::Plain {
        launch.global.extend(["--log-format".into(), "json".into()]);
    }
    if let Some(sink) = &sink {
        launch.global.extend(["--otlp-endpoint".into(), sink.url.clone(), "--otlp-protocol".into(), "http".into()]);
        launch.env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), OTLP_BATCH_DELAY_MS.into()));
    }
    let data = dir.join("data");
    let database_url = db.url().await?;
    let extra: Vec<&str> = database_url.iter().flat_map(|u| ["--database-url", u.as_str()]).collect();
    let (server, url) = spawn_server_with(&data, "127.0.0.1:0", &launch.logging_to(dir.join("server.log")), &extra)?;
    let c = Client::new(&url, &token(&data, "admin.token")?);
    add_repo(&c, "bench", repo).await?;
    let agents: Vec<Proc> = (0..a.agents)
        .map(|i| {
            let name = format!("bench-{i}");
            spawn_agent_deployed(
                &url,
                &data.join("agent.token"),
                &name,
                dir,
                a.agent_max_jobs,
                &launch.logging_to(dir.join(format!("{name}.log"))),
            )
        })
        .collect::<Result<_, _>>()?;
    let body = SubmitRun { commit_sha: head_sha(repo)?, ..Default::default() };

    // Warm up: one run per agent (its mirror fetch, its first checkout).
    let mut warm = vec![];
    for _ in 0..a.agents.max(1) {
        warm.push(c.submit_run("bench", &body, None).await?.run_id);
    }
    wait_all_terminal(&c, &warm).await?;

    let scrapes = Arc::new(AtomicU64::new(0));
    let admin = token(&data, "admin.token")?;
    let scraper =
        (cfg != Config::Plain).then(|| tokio::spawn(scrape(format!("{url}/metrics"), admin.clone(), scrapes.clone())));

    // Throughput: all runs submitted at once, until all are terminal.
    let n = a.runs as usize;
    let agent_pids: Vec<u32> = agents.iter().map(|p| p.0.id()).collect();
    let cpu = || {
        let server = cpu_ticks_split(server.0.id());
        let agents = agent_pids.iter().map(|p| cpu_ticks_split(*p)).fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        [server.0 + server.1, agents.0, agents.1, db.cpu_ticks().unwrap_or(0)]
    };
    let cpu0 = cpu();
    let phases0 = phase_sums(&url, &admin).await?;
    let (t0, wall0_ms) = (Instant::now(), now_ms());
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let c = c.clone();
        let body = body.clone();
        set.spawn(async move { c.submit_run("bench", &body, None).await });
    }
    let mut ids = vec![];
    while let Some(r) = set.join_next().await {
        ids.push(r??.run_id);
    }
    let (failed, last_ms) = wait_all_terminal(&c, &ids).await?;
    let runs_per_s = n as f64 / elapsed_until(t0, wall0_ms, last_ms);
    let cpu1 = cpu();
    let ms = |i: usize| cpu1[i].saturating_sub(cpu0[i]) as f64 * 1000.0 / clock_ticks_per_s() / n as f64;
    let cpu_split = CpuSplit { server: ms(0), agents: ms(1), steps: ms(2) };
    let cpu_ms_per_run = cpu_split.server + cpu_split.agents + cpu_split.steps;
    let cpu_ms_per_run_db = db.cpu_ticks().map(|_| ms(3));
    let phases1 = phase_sums(&url, &admin).await?;

    // Trigger-to-start on an idle deployment, one run at a time.
    let (mut step, mut claim) = (vec![], vec![]);
    for _ in 0..a.sequential {
        let t = now_ns();
        let r = c.submit_run("bench", &body, None).await?;
        let run = wait_terminal(&c, &r.run_id).await?;
        let job = run.jobs.first().ok_or_else(|| anyhow::anyhow!("run {}: no job", r.run_id))?;
        if let Some(att) = job.attempts.first() {
            claim.push((att.started_at_ms as f64 - t as f64 / 1e6).max(0.0));
        }
        step.push(((step_clock_ns(&c, &job.id).await? - t) as f64 / 1e6).max(0.0));
    }
    step.sort_by(|a, b| a.total_cmp(b));
    claim.sort_by(|a, b| a.total_cmp(b));
    let phases2 = phase_sums(&url, &admin).await?;
    let mut phases = phase_means(&phases0, &phases1);
    phases.extend(phase_means(&phases1, &phases2).into_iter().map(|(p, v)| (format!("{p}_idle"), v)));

    if let Some(s) = scraper {
        s.abort();
    }
    drop(agents);
    drop(server);
    let log_bytes = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    Ok(Figures {
        runs_per_s,
        failed,
        step,
        claim,
        scrapes: scrapes.load(Relaxed),
        log_bytes,
        otlp: sink.map(|s| (s.requests(), s.bytes())),
        cpu_ms_per_run,
        cpu_split,
        cpu_ms_per_run_db,
        phases,
    })
}

/// The attempt phases the bench reports, as the server's metric labels them.
const PHASES: [&str; 3] = ["prepare", "command", "publication"];

/// Mean ms of each phase between two [`phase_sums`].
fn phase_means(before: &[(String, f64, f64)], after: &[(String, f64, f64)]) -> Vec<(String, f64)> {
    let get = |m: &[(String, f64, f64)], p: &str| {
        m.iter().find(|(k, ..)| k == p).map(|(_, s, c)| (*s, *c)).unwrap_or_default()
    };
    PHASES
        .iter()
        .map(|p| {
            let ((s0, c0), (s1, c1)) = (get(before, p), get(after, p));
            (p.to_string(), if c1 > c0 { (s1 - s0) / (c1 - c0) * 1000.0 } else { f64::NAN })
        })
        .collect()
}

/// `(phase, sum of seconds, count)` of `kiln_attempt_phase_duration_seconds`
/// from the server's `/metrics`.
async fn phase_sums(url: &str, token: &str) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let text = reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let value = |name: &str, phase: &str| {
        let key = format!("kiln_attempt_phase_duration_seconds_{name}{{phase=\"{phase}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(PHASES.iter().map(|p| (p.to_string(), value("sum", p), value("count", p))).collect())
}

/// GET `url` every [`SCRAPE_EVERY`], reading the whole body, counting
/// successful scrapes, until aborted.
async fn scrape(url: String, token: String, ok: Arc<AtomicU64>) {
    let http = reqwest::Client::new();
    let mut tick = tokio::time::interval(SCRAPE_EVERY);
    loop {
        tick.tick().await;
        if let Ok(resp) = http.get(&url).bearer_auth(&token).send().await
            && resp.status().is_success()
            && resp.bytes().await.is_ok()
        {
            ok.fetch_add(1, Relaxed);
        }
    }
}

/// The clock the no-op step printed, read from the job's log once the run
/// has ended (the log is sealed before the attempt completes, but a retry
/// covers a server that commits the tail just after).
async fn step_clock_ns(c: &Client, job: &str) -> anyhow::Result<i64> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut text = String::new();
    for _ in 0..50 {
        text.clear();
        let stream = c.log_events_with(job, None, false).await?;
        tokio::pin!(stream);
        while let Some(ev) = stream.next().await {
            let ev = ev?;
            if ev.event == kiln_api::logs::event::CHUNK {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data)?;
                text.push_str(&String::from_utf8_lossy(&b64.decode(le.data)?));
            }
        }
        if let Some(ns) = parse_marker(&text) {
            return Ok(ns);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tail: String = text.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
    anyhow::bail!("job {job}: no {MARKER} line in its log after 1 s; it ends: {tail:?}")
}

/// The value of the line `KILN_T=<digits>` (the agent's own `▶ step` line
/// also shows the command, `echo KILN_T=$(…)`, which is not it).
fn parse_marker(log: &str) -> Option<i64> {
    log.lines().find_map(|l| l.trim_end().strip_prefix(MARKER)?.parse().ok())
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos() as i64
}

fn head_sha(repo: &Path) -> anyhow::Result<String> {
    let out = Command::new("git").arg("-C").arg(repo).args(["rev-parse", "HEAD"]).output()?;
    anyhow::ensure!(out.status.success(), "git rev-parse HEAD in {} failed", repo.display());
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// The same work as a bare loop of `sh -c true`: (per s, sorted ms each).
fn baseline(n: usize) -> anyhow::Result<(f64, Vec<f64>)> {
    let t0 = Instant::now();
    let mut lat = vec![];
    for _ in 0..n {
        let t = Instant::now();
        Command::new("sh").args(["-c", "true"]).status()?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok((rate, lat))
}

/// Seconds from `t0` (the wall clock then: `wall0_ms`) to the last run's
/// end (`last_ms`, the server's clock on the same host), or to now when
/// the runs did not say when they ended.
fn elapsed_until(t0: Instant, wall0_ms: i64, last_ms: Option<i64>) -> f64 {
    match last_ms {
        Some(end) if end > wall0_ms => (end - wall0_ms) as f64 / 1000.0,
        _ => t0.elapsed().as_secs_f64(),
    }
}

/// How often [`wait_all_terminal`] lists the runs. The end of the
/// measurement is the last run's own `finished_at`, not the poll that saw
/// it, so polling slowly loses no precision, and it keeps the bench's own
/// queries (each lists every run) from eating the server's CPU.
const POLL_RUNS: Duration = Duration::from_millis(200);

/// Wait until every run of `ids` is terminal: how many did not succeed,
/// and when the last one ended (ms since the epoch). Polls the run list
/// (one query) rather than every run.
async fn wait_all_terminal(c: &Client, ids: &[String]) -> anyhow::Result<(usize, Option<i64>)> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // Page by page (the server returns at most a few hundred at once).
        let mut runs = vec![];
        let mut before: Option<String> = None;
        loop {
            let page = c.list_runs_before("bench", None, Some(ids.len() as u32 + 10), before.as_deref()).await?;
            runs.extend(page.runs);
            match page.next_before {
                Some(b) if runs.len() < ids.len() + 10 => before = Some(b),
                _ => break,
            }
        }
        let wanted: std::collections::HashSet<&String> = ids.iter().collect();
        let mine: Vec<_> = runs.iter().filter(|r| wanted.contains(&r.id)).collect();
        if mine.len() == ids.len() && mine.iter().all(|r| r.status.is_terminal()) {
            let failed = mine.iter().filter(|r| !r.status.is_success()).count();
            return Ok((failed, mine.iter().filter_map(|r| r.finished_at_ms).max()));
        }
        anyhow::ensure!(Instant::now() < deadline, "{} runs not all ended after 600 s", ids.len());
        tokio::time::sleep(POLL_RUNS).await;
    }
}

/// The earlier figure: an in-process `kiln up` (`--embedded`).
async fn embedded(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(&repo, "version: 1\njobs:\n  - name: noop\n    steps:\n      - \"true\"\n")?;
    let (handle, stop, tasks) =
        start_embedded(&tmp.join("data"), "127.0.0.1:0", a.agents, Duration::from_secs(30), None).await?;
    let c = Client::new(&handle.url(), &handle.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "bench".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await?;
    let body = SubmitRun { commit_sha: head_sha(&repo)?, ..Default::default() };

    // Warm up (mirror fetch, agent checkouts).
    let w = c.submit_run("bench", &body, None).await?;
    wait_terminal(&c, &w.run_id).await?;

    let n = a.runs as usize;
    let (sh_rate, lat) = baseline(n)?;

    // Throughput: all runs submitted at once.
    let (t0, wall0_ms) = (Instant::now(), now_ms());
    let mut ids = vec![];
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let c = c.clone();
        let body = body.clone();
        set.spawn(async move { c.submit_run("bench", &body, None).await });
    }
    while let Some(r) = set.join_next().await {
        ids.push(r.map_err(anyhow::Error::from)??.run_id);
    }
    let (failed, last_ms) = wait_all_terminal(&c, &ids).await?;
    let rate = n as f64 / elapsed_until(t0, wall0_ms, last_ms);

    // Trigger-to-start on an idle system.
    let mut starts = vec![];
    for _ in 0..a.sequential {
        let t = now_ms();
        let r = c.submit_run("bench", &body, None).await?;
        let run = wait_terminal(&c, &r.run_id).await?;
        if let Some(att) = run.jobs.first().and_then(|j| j.attempts.first()) {
            starts.push((att.started_at_ms - t).max(0) as f64);
        }
    }
    starts.sort_by(|a, b| a.total_cmp(b));

    kiln_cmd::outln!("noop_jobs_per_s: {rate:.1}");
    kiln_cmd::outln!("baseline_sh_true_per_s: {sh_rate:.1}");
    kiln_cmd::outln!("noop_runs_failed: {failed}");
    kiln_cmd::outln!("trigger_to_start_p50_ms: {:.1}", percentile(&starts, 0.5));
    kiln_cmd::outln!("trigger_to_start_p95_ms: {:.1}", percentile(&starts, 0.95));
    kiln_cmd::outln!("baseline_sh_true_p50_ms: {:.2}", percentile(&lat, 0.5));
    kiln_cmd::outln!("baseline_sh_true_p95_ms: {:.2}", percentile(&lat, 0.95));
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if failed == 0 { exit::OK } else { exit::RUN_FAILED })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_clock_is_read_from_its_line() {
        assert_eq!(parse_marker("KILN_T=1764820000123456789\n"), Some(1_764_820_000_123_456_789));
        assert_eq!(parse_marker("noise\nKILN_T=42\r\n"), Some(42));
        assert_eq!(parse_marker("KILN_T=\n"), None);
        assert_eq!(parse_marker("▶ step 1/1: echo KILN_T=$(date +%s%N)\nKILN_T=7\n"), Some(7));
        assert_eq!(parse_marker("nothing"), None);
    }

    #[test]
    fn configs_parse_by_name() {
        for c in [Config::Plain, Config::Observed, Config::Otlp] {
            assert_eq!(Config::parse(c.name()), Some(c));
        }
        assert_eq!(Config::parse("loud"), None);
    }
}
