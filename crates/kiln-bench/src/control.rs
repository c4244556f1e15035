//! `kiln bench control-plane`: simulated agents over HTTP drive claim →
//! heartbeat → complete against a real server and store (spec 000 §3's
//! peak: 230 claims/s, 230 completions/s, 82,800 leases heartbeating every
//! 30 s ≈ 2,760 heartbeats/s). No processes run per job: a virtual agent
//! holds each claimed lease for `--hold`, heartbeating so that all held
//! leases together send `--heartbeats-per-s`, then completes it.
//!
//! Holding 82,800 leases for 6 minutes is not practical in a benchmark, so
//! the lease population is scaled down (claims/s × hold) and each lease
//! heartbeats proportionally more often: the store sees the same rate of
//! the same heartbeat transaction. The figure printed says so.

use crate::util::{
    Launch, Proc, clock_ticks_per_s, cpu_ticks, percentile, postgres_pids, repo_with, spawn_server_with, token,
};
use kiln_api::{ClaimRequest, Client, Completion, RegisterAgent, SubmitRun, exit};
use kiln_cmd::Failure;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

#[derive(Debug, Clone)]
pub struct ControlArgs {
    pub claims_per_s: f64,
    pub heartbeats_per_s: f64,
    pub seconds: u64,
    pub hold: Duration,
    pub agents: u32,
    /// `postgres://…` to run against PostgreSQL instead of SQLite;
    /// `postgres`: a throwaway PostgreSQL server the bench starts (also the
    /// default with several replicas).
    pub database_url: Option<String>,
    /// Server processes (replicas) on the same database.
    pub replicas: u32,
    /// The replicas' `--dispatch-offer`.
    pub dispatch_offer: String,
}

#[derive(Default)]
struct Stats {
    claims: AtomicU64,
    heartbeats: AtomicU64,
    completions: AtomicU64,
    errors: AtomicU64,
    claim_ms: Mutex<Vec<f64>>,
    heartbeat_ms: Mutex<Vec<f64>>,
    complete_ms: Mutex<Vec<f64>>,
}

pub async fn run(a: ControlArgs) -> Result<i32, Failure> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-control-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = tmp.join("repo");
    repo_with(&repo, "version: 1\njobs:\n  - name: j\n    steps: [\"true\"]\n")?;

    // A throwaway PostgreSQL server when asked for (`postgres`), and for
    // several replicas without a URL: the figure is one command.
    let mut _pg = None;
    let database_url = match a.database_url.as_deref() {
        Some("postgres") | None if a.replicas > 1 || a.database_url.is_some() => {
            eprintln!("bench control-plane: starting a throwaway PostgreSQL (fsync and synchronous commit on)…");
            let pg = kiln_testkit::TempPostgres::start_durable()?;
            let url = pg.create_database().await?;
            _pg = Some(pg);
            Some(url)
        }
        other => other.map(str::to_string),
    };
    let postgres = database_url.as_deref().is_some_and(|u| u.starts_with("postgres"));
    if a.replicas > 1 && !postgres {
        return Err(Failure {
            message: "--replicas needs a shared database: pass --database-url postgres://… (or postgres)".into(),
            code: exit::USAGE,
        });
    }
    // Replicas are `kiln server` processes, as deployed: they share the
    // database and the data dir (tokens, object store), as on one box
    // behind a load balancer; started one after the other.
    let data = tmp.join("data");
    let mut servers = vec![];
    for _ in 0..a.replicas.max(1) {
        servers.push(spawn_replica(&data, database_url.as_deref(), &a.dispatch_offer)?);
    }
    let urls: Vec<String> = servers.iter().map(|(_, u)| u.clone()).collect();
    let server_pids: Vec<u32> = servers.iter().map(|(p, _)| p.0.id()).collect();
    let pg_pids = _pg.as_ref().map(|pg| postgres_pids(pg.port())).unwrap_or_default();
    let admin_token = token(&data, "admin.token")?;
    let admin = Client::new(&urls[0], &admin_token);
    let agent_token = token(&data, "agent.token")?;
    admin
        .create_repo(&kiln_api::CreateRepo {
            team: None,
            forge: Default::default(),
            name: "control".into(),
            clone_url: repo.display().to_string(),
            webhook_secret: None,
            secret_pools: None,
        })
        .await?;

    // Baseline in the same invocation: bare HTTP round trips (GET /healthz)
    // from the same client, at the same concurrency as the agents.
    let base = {
        let http = reqwest::Client::new();
        let n = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..a.agents {
            let (http, n, url) = (http.clone(), n.clone(), urls[i as usize % urls.len()].clone());
            set.spawn(async move {
                while t0.elapsed() < Duration::from_secs(2) {
                    if http.get(format!("{url}/healthz")).send().await.is_ok() {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while set.join_next().await.is_some() {}
        n.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
    };

    // Enough ready jobs for the whole measurement, submitted first.
    let total = (a.claims_per_s * a.seconds as f64).ceil() as usize + 50;
    eprintln!("bench control-plane: submitting {total} runs…");
    let t_submit = Instant::now();
    let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
    let next = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..16 {
        let (c, body, next) = (Client::new(&urls[w % urls.len()], &admin_token), body.clone(), next.clone());
        set.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total as u64 {
                c.submit_run("control", &body, None).await?;
            }
            Ok::<_, kiln_api::ApiError>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(anyhow::Error::from)??;
    }
    let accept_rate = total as f64 / t_submit.elapsed().as_secs_f64();
    eprintln!("bench control-plane: {accept_rate:.0} runs/s accepted; claiming for {} s…", a.seconds);

    // Virtual agents.
    let stats = Arc::new(Stats::default());
    let hb_every = Duration::from_secs_f64((a.claims_per_s * a.hold.as_secs_f64() / a.heartbeats_per_s).max(0.01));
    let pace = Duration::from_secs_f64(1.0 / a.claims_per_s);
    let start = Instant::now() + Duration::from_millis(200);
    let claim_until = start + Duration::from_secs(a.seconds);
    let ticket = Arc::new(AtomicU64::new(0));
    let mut agents = tokio::task::JoinSet::new();
    let mut jobs = tokio::task::JoinSet::new();
    let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<(String, i64, String, String)>();
    for i in 0..a.agents {
        let c = Client::new(&urls[i as usize % urls.len()], &agent_token);
        let reg = c
            .register_agent(&RegisterAgent {
                name: format!("virtual-{i}"),
                labels: Default::default(),
                max_jobs: 256,
                version: None,
                executor: None,
                fresh_start: false,
            })
            .await?;
        // Claims carry the session's credential, not the join token.
        let c = c.with_token(&reg.credential);
        let (stats, ticket, job_tx, url) =
            (stats.clone(), ticket.clone(), job_tx.clone(), urls[i as usize % urls.len()].clone());
        agents.spawn(async move {
            loop {
                // Open-loop pacing: claim k is sent at start + k / rate.
                let k = ticket.fetch_add(1, Ordering::Relaxed);
                let at = start + pace * k as u32;
                if at >= claim_until {
                    return;
                }
                tokio::time::sleep_until(at.into()).await;
                let req = ClaimRequest {
                    session_id: reg.session_id.clone(),
                    claim_request_id: uuid::Uuid::new_v4().to_string(),
                    wait_ms: 2_000,
                };
                let t = Instant::now();
                match c.claim(&reg.agent_id, &req).await {
                    Ok(r) => {
                        if let Some(asg) = r.assignment {
                            stats.claim_ms.lock().await.push(t.elapsed().as_secs_f64() * 1000.0);
                            stats.claims.fetch_add(1, Ordering::Relaxed);
                            let _ = job_tx.send((asg.job_id, asg.epoch, asg.attempt_token, url.clone()));
                        }
                    }
                    Err(_) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    drop(job_tx);
    let hold = a.hold;
    // One client (one connection pool) per replica for all leases: a client
    // per lease would spend the bench's share of the two cores loading TLS
    // roots and opening connections, CPU the server and database then lack.
    let lease_clients: std::collections::HashMap<String, Client> =
        urls.iter().map(|u| (u.clone(), Client::new(u, &agent_token))).collect();
    let spawner = {
        let stats = stats.clone();
        tokio::spawn(async move {
            while let Some((job, epoch, token, url)) = job_rx.recv().await {
                // Each attempt's calls carry its own token (same connection pool).
                let c = lease_clients
                    .get(&url)
                    .cloned()
                    .unwrap_or_else(|| Client::new(&url, &agent_token))
                    .with_token(&token);
                let stats = stats.clone();
                jobs.spawn(async move {
                    let until = Instant::now() + hold;
                    // Spread the first heartbeat so leases do not beat in lockstep.
                    let mut next = Instant::now() + hb_every.mul_f64(rand::random::<f64>());
                    while next < until {
                        tokio::time::sleep_until(next.into()).await;
                        let t = Instant::now();
                        match c.heartbeat(&job, epoch).await {
                            Ok(_) => {
                                stats.heartbeat_ms.lock().await.push(t.elapsed().as_secs_f64() * 1000.0);
                                stats.heartbeats.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                stats.errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        next += hb_every;
                    }
                    tokio::time::sleep_until(until.into()).await;
                    let t = Instant::now();
                    let done = Completion::success();
                    match c.complete(&job, epoch, &done).await {
                        Ok(_) => {
                            stats.complete_ms.lock().await.push(t.elapsed().as_secs_f64() * 1000.0);
                            stats.completions.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            stats.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            while jobs.join_next().await.is_some() {}
        })
    };
    // Steady state is from `hold` after the start (leases held, completions
    // flowing) to the end of claiming.
    let steady_from = start + a.hold;
    tokio::time::sleep_until(steady_from.into()).await;
    let (c0, h0, d0) = counts(&stats);
    let cpu0 = (cpu_ticks(&server_pids), cpu_ticks(&pg_pids), cpu_ticks(&[std::process::id()]));
    let xacts0 = pg_xacts(database_url.as_deref()).await;
    let waits = database_url
        .as_deref()
        .filter(|u| u.starts_with("postgres"))
        .map(|u| tokio::spawn(pg_waits(u.to_string(), claim_until)));
    tokio::time::sleep_until(claim_until.into()).await;
    let (c1, h1, d1) = counts(&stats);
    let cpu1 = (cpu_ticks(&server_pids), cpu_ticks(&pg_pids), cpu_ticks(&[std::process::id()]));
    let xacts1 = pg_xacts(database_url.as_deref()).await;
    let window = (claim_until - steady_from).as_secs_f64();
    while agents.join_next().await.is_some() {}
    let _ = spawner.await;

    let sorted = |v: &Mutex<Vec<f64>>| {
        let v = v.try_lock().map(|g| g.clone()).unwrap_or_default();
        let mut v = v;
        v.sort_by(f64::total_cmp);
        v
    };
    let (cl, hb, co) = (sorted(&stats.claim_ms), sorted(&stats.heartbeat_ms), sorted(&stats.complete_ms));
    let backend = match (postgres, _pg.is_some()) {
        (true, true) => "postgres (started by the bench: fsync and synchronous commit on)",
        (true, false) => "postgres",
        _ => "sqlite",
    };
    // CPU time in the steady window, in percent of one core.
    let pct = |t0: u64, t1: u64| t1.saturating_sub(t0) as f64 / clock_ticks_per_s() / window * 100.0;
    kiln_cmd::outln!("control_backend: {backend}");
    kiln_cmd::outln!("control_replicas: {}", a.replicas.max(1));
    kiln_cmd::outln!("control_dispatch_offer: {}", a.dispatch_offer);
    kiln_cmd::outln!("control_target_claims_per_s: {:.0}", a.claims_per_s);
    kiln_cmd::outln!("control_target_heartbeats_per_s: {:.0}", a.heartbeats_per_s);
    kiln_cmd::outln!(
        "control_leases_held: {:.0} (heartbeat every {} ms each)",
        a.claims_per_s * a.hold.as_secs_f64(),
        hb_every.as_millis()
    );
    kiln_cmd::outln!("control_accepted_runs_per_s: {accept_rate:.0}");
    kiln_cmd::outln!("control_claims_per_s: {:.0}", (c1 - c0) as f64 / window);
    kiln_cmd::outln!("control_heartbeats_per_s: {:.0}", (h1 - h0) as f64 / window);
    kiln_cmd::outln!("control_completions_per_s: {:.0}", (d1 - d0) as f64 / window);
    kiln_cmd::outln!("control_claim_latency_p50_ms: {:.1}", percentile(&cl, 0.5));
    kiln_cmd::outln!("control_claim_latency_p99_ms: {:.1}", percentile(&cl, 0.99));
    kiln_cmd::outln!("control_heartbeat_latency_p50_ms: {:.1}", percentile(&hb, 0.5));
    kiln_cmd::outln!("control_heartbeat_latency_p99_ms: {:.1}", percentile(&hb, 0.99));
    kiln_cmd::outln!("control_completion_latency_p50_ms: {:.1}", percentile(&co, 0.5));
    kiln_cmd::outln!("control_completion_latency_p99_ms: {:.1}", percentile(&co, 0.99));
    kiln_cmd::outln!("control_errors: {}", stats.errors.load(Ordering::Relaxed));
    kiln_cmd::outln!("control_server_cpu_pct: {:.0} (all replicas, % of one core)", pct(cpu0.0, cpu1.0));
    if !pg_pids.is_empty() {
        kiln_cmd::outln!("control_postgres_cpu_pct: {:.0}", pct(cpu0.1, cpu1.1));
    }
    if let (Some((c0, r0)), Some((c1, r1))) = (xacts0, xacts1) {
        // Rolled back: mostly serialization failures and deadlocks that the
        // store ran again (each one a transaction's work done twice).
        kiln_cmd::outln!("control_postgres_commits_per_s: {:.0}", (c1 - c0) as f64 / window);
        kiln_cmd::outln!("control_postgres_rollbacks_per_s: {:.0}", (r1 - r0) as f64 / window);
    }
    if let Some(Ok(Some(w))) = match waits {
        Some(t) => Some(t.await),
        None => None,
    } {
        kiln_cmd::outln!("control_postgres_active_backends: {:.1} (mean of {} samples)", w.active_mean, w.samples);
        kiln_cmd::outln!("control_postgres_waits: {}", w.top);
    }
    kiln_cmd::outln!("control_bench_client_cpu_pct: {:.0}", pct(cpu0.2, cpu1.2));
    kiln_cmd::outln!("baseline_http_healthz_per_s: {base:.0}");
    drop(servers);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(if stats.errors.load(Ordering::Relaxed) == 0 { exit::OK } else { exit::RUN_FAILED })
}

/// PostgreSQL's committed and rolled-back transactions on the bench's
/// database so far (`pg_stat_database`); `None` on SQLite.
async fn pg_xacts(url: Option<&str>) -> Option<(i64, i64)> {
    use sqlx::Connection;
    let url = url.filter(|u| u.starts_with("postgres"))?;
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    // The statistics are sent by each backend at transaction end and read
    // from a snapshot: start from a fresh one.
    let _ = sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut c).await;
    sqlx::query_as("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&mut c)
        .await
        .ok()
}

/// What PostgreSQL's backends were doing in the window.
struct Waits {
    samples: u64,
    active_mean: f64,
    /// The most frequent states of active backends, in % of active samples.
    top: String,
}

/// Samples `pg_stat_activity` every 50 ms until `until`: how many of the
/// bench database's backends run a statement, and what each of those
/// waits for (`IO:WALSync`, `Lock:transactionid`, … or `CPU` when it waits
/// for nothing PostgreSQL knows of). `None` if the database cannot be read.
async fn pg_waits(url: String, until: Instant) -> Option<Waits> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&url).await.ok()?;
    let mut by: std::collections::HashMap<String, u64> = Default::default();
    let (mut samples, mut active) = (0u64, 0u64);
    while Instant::now() < until {
        let rows: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut c)
        .await
        .ok()?;
        samples += 1;
        active += rows.len() as u64;
        for (kind, event) in rows {
            let key = match (kind, event) {
                (Some(k), Some(e)) => format!("{k}:{e}"),
                _ => "CPU".to_string(),
            };
            *by.entry(key).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut top: Vec<(String, u64)> = by.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let total = active.max(1) as f64;
    let top = top
        .iter()
        .take(6)
        .map(|(k, n)| format!("{k} {:.0}%", *n as f64 * 100.0 / total))
        .collect::<Vec<_>>()
        .join(", ");
    Some(Waits { samples, active_mean: active as f64 / samples.max(1) as f64, top })
}

fn counts(s: &Stats) -> (u64, u64, u64) {
    (s.claims.load(Ordering::Relaxed), s.heartbeats.load(Ordering::Relaxed), s.completions.load(Ordering::Relaxed))
}

/// A replica: `kiln server` on the shared data dir and database.
fn spawn_replica(data: &Path, database_url: Option<&str>, offer: &str) -> anyhow::Result<(Proc, String)> {
    let mut extra = vec!["--dispatch-offer", offer];
    if let Some(url) = database_url {
        extra.extend(["--database-url", url]);
    }
    spawn_server_with(data, "127.0.0.1:0", &Launch::default(), &extra)
}
