//! `kiln bench logs`: log ingestion (200 MB of stdout, each chunk durable
//! before it is acknowledged) beside a file write + fsync, the
//! write-to-reader latency of the SSE log feed beside a bare pipe, and both
//! again with 20 jobs writing at once (issue 20): their aggregate rate, and
//! the write-to-SSE latency of a ticker job running beside them.

use crate::util::{add_repo, percentile, repo_with, spawn_agent_niced, spawn_agent_with, wait_terminal};
use kiln_api::logs::{event, stream};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Log ingestion: one job writes 200 MB to stdout; every chunk is committed
/// (durable in the store) before the agent gets its acknowledgement. The
/// figure is 200 MB over the time from the step's start (its own clock, the
/// first line it prints) to the attempt's end (database time: after its last
/// chunk was acknowledged), beside the same bytes written to a file and
/// fsynced. The attempt's whole duration, which also holds its checkout
/// before the step, is reported beside it (`log_attempt_*`: the figure
/// before 2026-12-05). Both run [`SINGLE_ROUNDS`] times, alternating (the
/// file, then the job), and the figures are the medians, the ratio's being
/// that of each round's ratio to its own baseline (before session 39,
/// one round).
pub async fn run(database_url: Option<&str>) -> Result<i32, Failure> {
    const SIZE: u64 = 200_000_000;
    // Checked before anything runs.
    let crowd_nice = env_setting("KILN_BENCH_CROWD_NICE", "a nice value", 1..=19, CROWD_NICE)?;
    let rounds = env_setting("KILN_BENCH_LOG_ROUNDS", "a count", 1..=20, SINGLE_ROUNDS)?;
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(anyhow::Error::from)?;
    let repo = tmp.join("repo");
    repo_with(
        &repo,
        &format!(
            "version: 1\njobs:\n  - name: loud\n    steps:\n      - echo \"bench-start $(date +%s%3N)\"; head -c {SIZE} /dev/zero | tr '\\0' x\n"
        ),
    )?;
    let limit = (SIZE * 2).to_string();
    let (server, c, agent) = ingest_side(&tmp, "data", None, &repo, &limit).await?;
    // `--database-url postgres` (or a URL): the same single stream on a
    // server on PostgreSQL, round by round beside the SQLite one.
    let (_pg, pg_url) = crate::util::postgres_for("logs", database_url).await?;
    let pg = match &pg_url {
        Some(url) => Some(ingest_side(&tmp, "data-pg", Some(url.clone()), &repo, &limit).await?),
        None => None,
    };
    // What a PostgreSQL round costs, for docs/capacity.md: this process's
    // CPU (the server on PostgreSQL runs in it; the SQLite one idles), the
    // throwaway PostgreSQL's CPU, its transactions and WAL.
    let meter = crate::costs::Meter {
        server_pids: vec![std::process::id()],
        pg_port: _pg.as_ref().map(|p| p.port()),
        pg_url: pg_url.clone(),
    };
    let mut pg_costs: Vec<String> = vec![];
    let mb_per_s = |ms: i64| SIZE as f64 / 1e6 / (ms as f64 / 1000.0).max(0.001);
    kiln_cmd::outln!("log_bytes: {SIZE}");
    kiln_cmd::outln!("log_ingest_rounds: {rounds}");
    // Each round writes the bytes to a file with fsync, then has a job
    // write them to its stdout, so each ratio compares two measurements
    // taken seconds apart on the same host.
    let mut single_ok = true;
    let (mut ingest, mut bases, mut ratios, mut attempts) = (vec![], vec![], vec![], vec![]);
    let (mut pg_ingest, mut pg_ratios, mut pg_vs_sqlite) = (vec![], vec![], vec![]);
    for round in 1..=rounds {
        let base = file_write_fsync_mb_per_s(&tmp, SIZE)?;
        let (ok, step_ms, attempt_ms, before) = ingest_once(&c).await?;
        single_ok &= ok;
        let (rate, attempt) = (mb_per_s(step_ms), mb_per_s(attempt_ms));
        kiln_cmd::outln!(
            "log_ingest_round_{round}: {rate:.0} MB/s, write + fsync {base:.0} MB/s: {:.2} ({}; {before} ms before the step)",
            rate / base,
            if ok { "success" } else { "failed" },
        );
        ingest.push(rate);
        bases.push(base);
        ratios.push(rate / base);
        attempts.push(attempt / base);
        if let Some((_, pc, _)) = &pg {
            let r0 = meter.read().await;
            let (ok, step_ms, _, before) = ingest_once_every(pc, Duration::from_millis(100)).await?;
            let r1 = meter.read().await;
            pg_costs.push(crate::costs::window_fields(&r0, &r1, &[("log_bytes", SIZE), ("runs", 1)]));
            single_ok &= ok;
            let pg_rate = mb_per_s(step_ms);
            kiln_cmd::outln!(
                "pg_log_ingest_round_{round}: {pg_rate:.0} MB/s: {:.2} of write + fsync, {:.2} of SQLite's ({}; {before} ms before the step)",
                pg_rate / base,
                pg_rate / rate,
                if ok { "success" } else { "failed" },
            );
            pg_ingest.push(pg_rate);
            pg_ratios.push(pg_rate / base);
            pg_vs_sqlite.push(pg_rate / rate);
        }
    }
    for (i, c) in pg_costs.iter().enumerate() {
        // The whole run of the loud job (accept, claim, the log, completion),
        // polled every 100 ms.
        kiln_cmd::outln!("pg_log_round_{}_cost: {c}", i + 1);
    }
    if pg.is_some() {
        kiln_cmd::outln!("pg_log_ingest_mb_per_s: {:.0}", median(&mut pg_ingest));
        kiln_cmd::outln!("pg_log_ingest_vs_baseline: {:.2}", median(&mut pg_ratios));
        kiln_cmd::outln!("pg_log_ingest_vs_sqlite: {:.2}", median(&mut pg_vs_sqlite));
    }
    if let Some((pg_server, _, pg_agent)) = pg {
        drop(pg_agent);
        let _ = pg_server.shutdown().await;
    }
    // Medians: one round disturbed by the host (a noisy neighbour's I/O, a
    // stall in the baseline's own fsync) moves neither figure.
    kiln_cmd::outln!("log_ingest_mb_per_s: {:.0}", median(&mut ingest));
    kiln_cmd::outln!("baseline_file_write_fsync_mb_per_s: {:.0}", median(&mut bases));
    kiln_cmd::outln!("log_ingest_vs_baseline: {:.2}", median(&mut ratios));
    kiln_cmd::outln!("log_ingest_vs_baseline_min: {:.2}", ratios[0]);
    kiln_cmd::outln!("log_ingest_vs_baseline_max: {:.2}", ratios[ratios.len() - 1]);
    kiln_cmd::outln!("log_attempt_vs_baseline: {:.2}", median(&mut attempts));
    // KILN_BENCH_LOG_SINGLE_ONLY=1: the single stream only (the capacity
    // figures), without the latency and the 20 writers.
    if std::env::var("KILN_BENCH_LOG_SINGLE_ONLY").is_ok_and(|v| v == "1") {
        drop(agent);
        let _ = server.shutdown().await;
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(if single_ok { exit::OK } else { exit::RUN_FAILED });
    }
    let latency_ok = write_to_reader_latency(&c, &tmp).await?;
    drop(agent);
    // One agent per job (as 21 machines would run them), one job each:
    // first at the server's CPU priority, then with the loud jobs' agents
    // (and so their steps) at CROWD_NICE, as if the agents had machines of
    // their own (see `concurrent`).
    let mut crowd_ok = true;
    for (round, nice) in [(0, 0), (1, crowd_nice)] {
        let mut crowd = vec![];
        // The ticker's agent (`role=ticker`, at the server's priority: its
        // machine would be idle but for it) and the loud jobs' 20.
        for i in 0..=CONCURRENT {
            let (role, nice) = if i == 0 { ("ticker", 0) } else { ("loud", nice) };
            crowd.push(spawn_agent_niced(
                &server.url(),
                &server.agent_token,
                &format!("crowd{round}-{i}"),
                &tmp,
                &["--log-limit", &limit, "--labels", &format!("role={role}")],
                nice,
            )?);
        }
        crowd_ok &= concurrent(&c, &tmp, round, nice).await?;
        drop(crowd);
    }
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if single_ok && latency_ok && crowd_ok { exit::OK } else { exit::RUN_FAILED })
}

/// A server (in this process; on PostgreSQL with `database_url`) with the
/// `logs` repository and one agent for the single stream.
async fn ingest_side(
    tmp: &Path,
    data: &str,
    database_url: Option<String>,
    repo: &Path,
    limit: &str,
) -> Result<(kiln_server::ServerHandle, Client, crate::util::Proc), Failure> {
    let mut config = kiln_server::ServerConfig::new(tmp.join(data), "127.0.0.1:0".into());
    config.database_url = database_url;
    // As `kiln server` reads it (a shared host's disk may be fuller than
    // the benchmark's few hundred megabytes need).
    if let Some(levels) = crate::util::storage_levels_from_env()? {
        config.degradation.storage_pct = levels;
    }
    let server = kiln_server::start(config).await?;
    let c = Client::new(&server.url(), &server.admin_token);
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "logs".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await?;
    let agent =
        spawn_agent_with(&server.url(), &server.agent_token, &format!("talker-{data}"), tmp, &["--log-limit", limit])?;
    Ok((server, c, agent))
}

/// One run of the loud job: (succeeded, ms from the step's first line to
/// the attempt's end, ms of the whole attempt, ms before the step).
async fn ingest_once(c: &Client) -> anyhow::Result<(bool, i64, i64, i64)> {
    ingest_once_every(c, Duration::from_millis(5)).await
}

/// [`ingest_once`], asking for the run's state every `poll`.
async fn ingest_once_every(c: &Client, poll: Duration) -> anyhow::Result<(bool, i64, i64, i64)> {
    let r = c.submit_run("logs", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
    let run = crate::util::wait_terminal_every(c, &r.run_id, poll).await?;
    let a = run.jobs[0].attempts.last().expect("attempt");
    let finished = a.finished_at_ms.unwrap_or(a.started_at_ms);
    let step_start = step_start_ms(c, &run.jobs[0].id).await?.unwrap_or(a.started_at_ms);
    Ok((run.status.is_success(), finished - step_start, finished - a.started_at_ms, step_start - a.started_at_ms))
}

/// Rounds of the single stream (`KILN_BENCH_LOG_ROUNDS` overrides it).
const SINGLE_ROUNDS: usize = 3;

/// Writes `size` bytes to a file (`head | tr`, as the job's step makes
/// them) and fsyncs it: MB/s.
fn file_write_fsync_mb_per_s(tmp: &Path, size: u64) -> anyhow::Result<f64> {
    let out = tmp.join("out");
    let t = std::time::Instant::now();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c {size} /dev/zero | tr '\\0' x > {f} && sync {f}", f = out.display()))
        .status()?;
    let s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&out);
    anyhow::ensure!(st.success(), "the write + fsync baseline failed: {st}");
    Ok(size as f64 / 1e6 / s)
}

/// The value of environment variable `name`, which must be `what` in
/// `range`; `default` when it is unset.
fn env_setting<T>(name: &str, what: &str, range: std::ops::RangeInclusive<T>, default: T) -> anyhow::Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    setting(name, std::env::var(name).ok(), what, range, default)
}

/// [`env_setting`] of the variable's value `raw`.
fn setting<T>(
    name: &str,
    raw: Option<String>,
    what: &str,
    range: std::ops::RangeInclusive<T>,
    default: T,
) -> anyhow::Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    match raw {
        Some(v) => v.parse().ok().filter(|n| range.contains(n)).ok_or_else(|| {
            anyhow::anyhow!("{name} must be {what} from {} to {}, not {v:?}", range.start(), range.end())
        }),
        None => Ok(default),
    }
}

/// The median of `v` (sorted in place; the mean of the middle two for an
/// even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Jobs writing at once in the concurrent measurement.
const CONCURRENT: usize = 20;

/// The nice value of the loud jobs' agents (and so of their steps) in the
/// second concurrent round (`KILN_BENCH_CROWD_NICE` overrides it). 19, not
/// 10: each step leads a session, which on this kernel is a scheduling
/// group of its own, weighted by its nice value. 20 groups at nice 10
/// (weight 110 each) still outweigh the server's group (1,024) two to one;
/// at 19 (15 each) they weigh 300. Measured: write→SSE p99 287–516 ms at
/// nice 10, 114–141 ms at 19.
const CROWD_NICE: i32 = 19;

/// 20 jobs each write 25 MB to stdout at once, beside a ticker job printing
/// its clock every 50 ms. Each loud job is a run of its own, so 20 agents
/// (one job each) start them together; they wait for a shared start time
/// first, so the writing overlaps even if claims are spread out. The
/// aggregate rate is all bytes over the span from the first loud write to
/// the last loud attempt's end (database times); the latency is that of the
/// ticker's lines printed within that span, read from the SSE feed as the
/// web UI reads it.
///
/// Here the server shares two cores with 21 agents and 20 steps. At the
/// server's CPU priority (`log_concurrent_*`), the agents draining 20 steps
/// at full speed take the CPU from it for about the first second (issue 20;
/// the ticker's lines printed then arrive together, late). In a deployment
/// the agents have machines of their own; the second round
/// (`log_concurrent_niced_*`) runs the loud jobs' agents, and so their
/// steps, at nice [`CROWD_NICE`], so the server comes first on the shared
/// cores as it would on a machine of its own. The ticker's agent stays at
/// the server's priority (its machine would be idle but for it); labels
/// (`role=ticker`, `role=loud`) keep each job on its kind of agent.
async fn concurrent(c: &Client, tmp: &Path, round: usize, nice: i32) -> anyhow::Result<bool> {
    const PER_JOB: u64 = 25_000_000;
    const LINES: usize = 200;
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    // Every loud job starts writing at this second (agents claim within it).
    let go = now_s + 6;
    let ticker_repo = tmp.join(format!("crowd-ticker{round}"));
    repo_with(
        &ticker_repo,
        &format!(
            "version: 1\njobs:\n  - name: ticker\n    runs-on: {{role: ticker}}\n    steps:\n      - for i in $(seq 1 {LINES}); do date +%s%N; sleep 0.05; done\n"
        ),
    )?;
    let loud_repo = tmp.join(format!("crowd-repo{round}"));
    repo_with(
        &loud_repo,
        &format!(
            "version: 1\njobs:\n  - name: loud\n    runs-on: {{role: loud}}\n    steps:\n      - while [ $(date +%s) -lt {go} ]; do sleep 0.01; done; head -c {PER_JOB} /dev/zero | tr '\\0' x\n"
        ),
    )?;
    let (ticker_name, loud_name) = (format!("crowd-ticker{round}"), format!("crowd{round}"));
    for (name, repo) in [(&ticker_name, &ticker_repo), (&loud_name, &loud_repo)] {
        add_repo(c, name, repo).await?;
    }
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let tr = c.submit_run(&ticker_name, &body, None).await?;
    let mut loud_runs = vec![];
    for _ in 0..CONCURRENT {
        loud_runs.push(c.submit_run(&loud_name, &body, None).await?.run_id);
    }
    let ticker = c.get_run(&tr.run_id).await?.jobs[0].id.clone();
    let lines = ticker_lines(c, &ticker).await?;
    let mut ok = wait_terminal(c, &tr.run_id).await?.status.is_success();
    let mut loud = vec![];
    for r in &loud_runs {
        let run = wait_terminal(c, r).await?;
        ok &= run.status.is_success();
        loud.extend(run.jobs[0].attempts.last().cloned());
    }
    let first_start = loud.iter().map(|a| a.started_at_ms).min().unwrap_or(0);
    let last_start = loud.iter().map(|a| a.started_at_ms).max().unwrap_or(0);
    let start = (go as i64 * 1000).max(last_start);
    let end = loud.iter().map(|a| a.finished_at_ms.unwrap_or(a.started_at_ms)).max().unwrap_or(0);
    let first_end = loud.iter().map(|a| a.finished_at_ms.unwrap_or(a.started_at_ms)).min().unwrap_or(0);
    let secs = (end - start) as f64 / 1000.0;
    let p = if nice == 0 { "log_concurrent" } else { "log_concurrent_niced" };
    kiln_cmd::outln!(
        "{p}_span_s: {secs:.1} (attempts started over {} ms, all before the shared start: {}; first finished {} ms after it)",
        last_start - first_start,
        last_start <= go as i64 * 1000,
        first_end - start
    );
    // Lines printed while the loud jobs wrote.
    let mut lat_ms: Vec<f64> = lines
        .iter()
        .filter(|(ts_ns, _)| *ts_ns / 1_000_000 >= start as i128 && *ts_ns / 1_000_000 <= end as i128)
        .map(|(_, l)| *l)
        .collect();
    lat_ms.sort_by(f64::total_cmp);
    kiln_cmd::outln!("{p}_jobs: {CONCURRENT}");
    kiln_cmd::outln!("{p}_agent_nice: {nice}");
    kiln_cmd::outln!("{p}_bytes: {}", PER_JOB * CONCURRENT as u64);
    kiln_cmd::outln!("{p}_aggregate_mb_per_s: {:.0}", (PER_JOB * CONCURRENT as u64) as f64 / 1e6 / secs.max(0.001));
    kiln_cmd::outln!("{p}_latency_lines: {}", lat_ms.len());
    kiln_cmd::outln!("{p}_write_to_sse_p50_ms: {:.1}", percentile(&lat_ms, 0.5));
    kiln_cmd::outln!("{p}_write_to_sse_p95_ms: {:.1}", percentile(&lat_ms, 0.95));
    kiln_cmd::outln!("{p}_write_to_sse_p99_ms: {:.1}", percentile(&lat_ms, 0.99));
    kiln_cmd::outln!("{p}_write_to_sse_max_ms: {:.1}", lat_ms.last().copied().unwrap_or(f64::NAN));
    Ok(ok && lines.len() == LINES)
}

/// The clock (ms) a job's step printed first (`bench-start <ms>`), read
/// from the job's log feed.
pub(crate) async fn step_start_ms(c: &Client, job: &str) -> anyhow::Result<Option<i64>> {
    use base64::Engine;
    use futures::StreamExt;
    let events = c.log_events(job, None).await?;
    tokio::pin!(events);
    let mut text = String::new();
    while let Some(Ok(ev)) = tokio::time::timeout(Duration::from_secs(60), events.next()).await? {
        match ev.event.as_str() {
            event::CHUNK => {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data)?;
                if le.stream != stream::STDOUT {
                    continue;
                }
                let data = base64::engine::general_purpose::STANDARD.decode(le.data)?;
                text.push_str(&String::from_utf8_lossy(&data[..data.len().min(256)]));
                let Some(line) = text.lines().next().filter(|_| text.contains('\n')) else { continue };
                return Ok(line.strip_prefix("bench-start ").and_then(|t| t.trim().parse().ok()));
            }
            event::END => break,
            _ => {}
        }
    }
    Ok(None)
}

/// Follows `job`'s SSE feed to its end; per stdout line holding a clock
/// (ns), that clock and the line's arrival latency (ms).
async fn ticker_lines(c: &Client, job: &str) -> anyhow::Result<Vec<(i128, f64)>> {
    use base64::Engine;
    use futures::StreamExt;
    let events = c.log_events(job, None).await?;
    tokio::pin!(events);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut partial = String::new();
    let mut out = Vec::new();
    while let Some(Ok(ev)) = tokio::time::timeout(Duration::from_secs(120), events.next()).await? {
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i128;
        match ev.event.as_str() {
            event::CHUNK => {
                let le: kiln_api::LogEvent = serde_json::from_str(&ev.data)?;
                if le.stream != stream::STDOUT {
                    continue;
                }
                partial.push_str(&String::from_utf8_lossy(&b64.decode(le.data)?));
                while let Some(i) = partial.find('\n') {
                    if let Ok(ts) = partial[..i].trim().parse::<i128>() {
                        out.push((ts, (now_ns - ts) as f64 / 1e6));
                    }
                    partial.drain(..=i);
                }
            }
            event::END => break,
            _ => {}
        }
    }
    Ok(out)
}

/// Write-to-reader latency: a step prints its clock (ns) every 50 ms; a
/// reader follows the job's SSE stream (the endpoint the web UI's log viewer
/// uses) and, per line, subtracts the printed time from its arrival time.
/// Same machine, same clock.
async fn write_to_reader_latency(c: &Client, tmp: &Path) -> anyhow::Result<bool> {
    const LINES: usize = 100;
    let repo = tmp.join("ticker");
    repo_with(
        &repo,
        &format!(
            "version: 1\njobs:\n  - name: ticker\n    steps:\n      - for i in $(seq 1 {LINES}); do date +%s%N; sleep 0.05; done\n"
        ),
    )?;
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: "ticker".into(),
        clone_url: repo.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await?;
    let r = c.submit_run("ticker", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
    let job = c.get_run(&r.run_id).await?.jobs[0].id.clone();
    let mut lat_ms: Vec<f64> = ticker_lines(c, &job).await?.into_iter().map(|(_, l)| l).collect();
    lat_ms.sort_by(f64::total_cmp);
    // Baseline: the same loop read straight from a pipe.
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("for i in $(seq 1 {LINES}); do date +%s%N; sleep 0.05; done"))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().expect("stdout")));
    let mut base_ms = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i128;
        if let Ok(ts) = line.trim().parse::<i128>() {
            base_ms.push((now_ns - ts) as f64 / 1e6);
        }
    }
    child.wait().await?;
    base_ms.sort_by(f64::total_cmp);
    kiln_cmd::outln!("log_latency_lines: {}", lat_ms.len());
    kiln_cmd::outln!("log_write_to_reader_p50_ms: {:.1}", percentile(&lat_ms, 0.5));
    kiln_cmd::outln!("log_write_to_reader_p95_ms: {:.1}", percentile(&lat_ms, 0.95));
    kiln_cmd::outln!("log_write_to_reader_max_ms: {:.1}", lat_ms.last().copied().unwrap_or(f64::NAN));
    kiln_cmd::outln!("baseline_pipe_p95_ms: {:.2}", percentile(&base_ms, 0.95));
    Ok(lat_ms.len() == LINES)
}

#[cfg(test)]
mod tests {
    use super::{median, setting};

    #[test]
    fn a_setting_is_its_default_unset_and_refused_outside_its_range() {
        let rounds = |raw: Option<&str>| setting("KILN_BENCH_LOG_ROUNDS", raw.map(String::from), "a count", 1..=20, 3);
        assert_eq!(rounds(None).unwrap(), 3);
        assert_eq!(rounds(Some("5")).unwrap(), 5);
        assert_eq!(rounds(Some("20")).unwrap(), 20);
        for bad in ["0", "21", "-1", "three", ""] {
            let e = rounds(Some(bad)).unwrap_err().to_string();
            assert_eq!(e, format!("KILN_BENCH_LOG_ROUNDS must be a count from 1 to 20, not {bad:?}"));
        }
    }

    #[test]
    fn the_median_is_the_middle_round_whatever_the_order() {
        assert_eq!(median(&mut [0.9, 0.5, 0.8]), 0.8);
        assert_eq!(median(&mut [0.7]), 0.7);
        assert_eq!(median(&mut [0.6, 1.0, 0.8, 0.7]), 0.75);
        assert!(median(&mut []).is_nan());
        let mut v = [3.0, 1.0, 2.0];
        median(&mut v);
        assert_eq!(v, [1.0, 2.0, 3.0], "sorted in place: the first is the least");
    }
}
