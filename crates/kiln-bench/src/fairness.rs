//! `kiln bench fairness` (issue 44): what fair share buys and what it
//! costs, against an in-process `kiln up` with `--fair-slots` agents.
//!
//! - **A/B.** Team `a` submits a backlog of `--fair-jobs` jobs of
//!   `--fair-job-secs` each (matrix runs of at most 250); 5 s later, and
//!   then at even intervals while the backlog lasts, team `b` submits a
//!   one-job run, 20 times. Each of b's waits (its run accepted → its job
//!   claimed) is measured; beside them, what oldest-first would have made
//!   it wait — the backlog still ready when b's run arrived, divided among
//!   the slots (a model, printed as such). a's makespan is measured alone
//!   first, then with b's jobs, in the same invocation.
//! - **Claim throughput by number of teams.** The same no-op jobs (1,000
//!   by default, from 50 repositories) with every repository in one team,
//!   then each in its own: jobs per second to the last one's end. Fairness
//!   must not make claims slower.
//! - **Claims alone.** The same comparison with no checkout and no step:
//!   the jobs ask for a label no real agent has (`virtual: "yes"`), and
//!   virtual agents over HTTP claim and complete them at once, as fast as
//!   the server hands them out: the fair-share decision's own cost,
//!   separated from what an agent does between claims (five times as many
//!   jobs, at most 250 per repository: claims alone go fast).
//!
//! Figures are `name: value` lines; nothing is asserted.

use crate::args::BenchArgs;
use crate::util::{now_ms, percentile, repo_with};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::path::Path;
use std::time::{Duration, Instant};

/// Most jobs one workflow may hold (kiln-workflow's MAX_JOBS is 256).
const PER_RUN: u32 = 250;
/// How many times team b submits during a's backlog.
const B_SUBMISSIONS: usize = 20;
/// Teams of the spread-out throughput phase.
const TEAMS: u32 = 50;
/// The order of the throughput measurements (teams of each): every
/// measurement adds its runs to the database and its repositories to the
/// agents, so each one is a little slower than the one before (about 2 %
/// per 5,000 jobs measured on SQLite). Alternating 1, 50, 1, 50 puts every
/// 50-team figure after a 1-team one and so charges that drift to fair
/// share; ABBA BAAB gives both the same mean position, so a linear drift
/// falls on both alike and cancels in their means.
const ORDER: [u32; 8] = [1, TEAMS, TEAMS, 1, TEAMS, 1, 1, TEAMS];

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Each teams' figures in [`ORDER`]: (1 team, 50 teams), each the mean.
fn by_teams(figures: &[(u32, f64)]) -> (f64, f64) {
    let of = |n: u32| figures.iter().filter(|(t, _)| *t == n).map(|(_, f)| *f).collect::<Vec<_>>();
    (mean(&of(1)), mean(&of(TEAMS)))
}

fn matrix(n: u32, step: &str) -> String {
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    format!("version: 1\njobs:\n  - name: m\n    matrix: {{i: [{}]}}\n    steps: [\"{step}\"]\n", values.join(", "))
}

async fn add(c: &Client, name: &str, dir: &Path, team: Option<&str>) -> anyhow::Result<()> {
    if let Some(t) = team
        && c.list_teams().await?.teams.iter().all(|x| x.name != t)
    {
        c.create_team(&kiln_api::CreateTeam { name: t.into(), ..Default::default() }).await?;
    }
    c.create_repo(&kiln_api::CreateRepo {
        name: name.into(),
        clone_url: dir.display().to_string(),
        webhook_secret: None,
        secret_pools: None,
        team: team.map(str::to_string),
        forge: Default::default(),
    })
    .await?;
    Ok(())
}

async fn submit(c: &Client, repo: &str) -> anyhow::Result<String> {
    submit_wf(c, repo, ".kiln/pipeline.yaml").await
}

async fn submit_wf(c: &Client, repo: &str, workflow: &str) -> anyhow::Result<String> {
    let body = SubmitRun { commit_sha: "HEAD".into(), workflow_path: Some(workflow.into()), ..Default::default() };
    Ok(c.submit_run(repo, &body, None).await?.run_id)
}

/// [`repo_with`], plus `.kiln/warm.yaml`: one no-op job, run once before a
/// measurement so the server's mirror and the agents' checkouts exist.
fn repo_warm(dir: &Path, workflow: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join(".kiln"))?;
    std::fs::write(dir.join(".kiln/warm.yaml"), "version: 1\njobs:\n  - name: warm\n    steps: [\"true\"]\n")?;
    repo_with(dir, workflow)
}

async fn wait_all(c: &Client, ids: &[String]) -> anyhow::Result<Vec<kiln_api::Run>> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut done = Vec::new();
    for id in ids {
        loop {
            let r = c.get_run(id).await?;
            if r.status.is_terminal() {
                done.push(r);
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "run {id} did not end within an hour");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(done)
}

/// a's backlog as runs of at most [`PER_RUN`] jobs: their ids.
async fn backlog(c: &Client, repos: &[String]) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for r in repos {
        ids.push(submit(c, r).await?);
    }
    Ok(ids)
}

/// The repositories of a's backlog (each a matrix of its share of `jobs`).
fn backlog_repos(dir: &Path, jobs: u32, step: &str) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    let mut out = Vec::new();
    let mut left = jobs;
    let mut i = 0;
    while left > 0 {
        let n = left.min(PER_RUN);
        let p = dir.join(format!("a{i}"));
        repo_warm(&p, &matrix(n, step))?;
        out.push((format!("a{i}"), p));
        left -= n;
        i += 1;
    }
    Ok(out)
}

fn makespan(runs: &[kiln_api::Run], from_ms: i64) -> f64 {
    let end = runs.iter().filter_map(|r| r.finished_at_ms).max().unwrap_or(from_ms);
    (end - from_ms) as f64 / 1000.0
}

fn ready_jobs(runs: &[kiln_api::Run]) -> usize {
    runs.iter().flat_map(|r| &r.jobs).filter(|j| j.status == "ready").count()
}

pub(crate) async fn run(a: &BenchArgs) -> Result<i32, Failure> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-fairness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let slots = a.fair_slots;
    let secs = a.fair_job_secs;
    let step = format!("sleep {secs}");
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    config.lease_ttl = Duration::from_secs(30);
    // As `kiln server` reads it (a shared host's disk may be fuller than
    // the benchmark needs).
    if let Some(levels) = crate::util::storage_levels_from_env()? {
        config.degradation.storage_pct = levels;
    }
    let (handle, stop, _tasks) = kiln_cmd::start_embedded_config(config, slots).await?;
    let c = Client::new(&handle.url(), &handle.admin_token);
    kiln_cmd::outln!("fairness_slots: {slots}");
    kiln_cmd::outln!("fairness_job_secs: {secs}");
    kiln_cmd::outln!("fairness_a_jobs: {}", a.fair_jobs);

    if a.fair_jobs > 0 {
        ab_scenario(a, &c, &tmp, slots, secs, &step).await?;
    }

    // Claim throughput: one team and fifty in [`ORDER`] (the mean of each).
    let n = a.fair_noop_jobs;
    let mut figures = Vec::new();
    for (i, teams) in ORDER.into_iter().enumerate() {
        figures.push((teams, throughput(&c, &tmp.join(format!("e2e{i}")), n, teams).await?));
    }
    let (one, fifty) = by_teams(&figures);
    kiln_cmd::outln!("fairness_noop_jobs: {n}");
    kiln_cmd::outln!("fairness_claims_per_s_1_team: {one:.1}");
    kiln_cmd::outln!("fairness_claims_per_s_{TEAMS}_teams: {fifty:.1}");
    kiln_cmd::outln!("fairness_claims_{TEAMS}_teams_vs_1_pct: {:.1}", fifty / one * 100.0);
    let urls = [handle.url()];
    kiln_cmd::outln!("fairness_claims_only_jobs: {}", n * 5);
    let (one, fifty) = claims_rounds(&c, &urls, &handle.agent_token, &tmp.join("virtual"), n * 5).await?;
    kiln_cmd::outln!("fairness_claims_only_per_s_1_team: {one:.1}");
    kiln_cmd::outln!("fairness_claims_only_per_s_{TEAMS}_teams: {fifty:.1}");
    kiln_cmd::outln!("fairness_claims_only_{TEAMS}_teams_vs_1_pct: {:.1}", fifty / one * 100.0);
    let _ = stop.send(true);
    if a.database_url.is_some() {
        let ((one, fifty), (v_one, v_fifty)) = on_replicas(a, &tmp.join("replicas")).await?;
        let r = a.replicas.max(2);
        kiln_cmd::outln!("fairness_claims_per_s_1_team_postgres_{r}_replicas: {one:.1}");
        kiln_cmd::outln!("fairness_claims_per_s_{TEAMS}_teams_postgres_{r}_replicas: {fifty:.1}");
        kiln_cmd::outln!("fairness_claims_{TEAMS}_teams_vs_1_pct_postgres_{r}_replicas: {:.1}", fifty / one * 100.0);
        kiln_cmd::outln!("fairness_claims_only_per_s_1_team_postgres_{r}_replicas: {v_one:.1}");
        kiln_cmd::outln!("fairness_claims_only_per_s_{TEAMS}_teams_postgres_{r}_replicas: {v_fifty:.1}");
        kiln_cmd::outln!(
            "fairness_claims_only_{TEAMS}_teams_vs_1_pct_postgres_{r}_replicas: {:.1}",
            v_fifty / v_one * 100.0
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}

/// `n` no-op jobs from [`TEAMS`] repositories (runs of at most
/// [`PER_RUN`] jobs), all submitted at once: jobs per second from the first
/// submission to the last job's end. With `teams` 1 the repositories are
/// all in one team, else each in its own: the same runs and jobs, only the
/// fair-share decision differs.
async fn throughput(c: &Client, dir: &Path, n: u32, teams: u32) -> anyhow::Result<f64> {
    let per_repo = n.div_ceil(TEAMS);
    let mut repos = Vec::new();
    for t in 0..TEAMS {
        let mut left = per_repo;
        let mut i = 0;
        while left > 0 {
            let k = left.min(PER_RUN);
            let name = format!("{}-t{t}-{i}", dir.file_name().and_then(|s| s.to_str()).unwrap_or("x"));
            let p = dir.join(&name);
            repo_warm(&p, &matrix(k, "true"))?;
            let team = if teams == 1 { "one".to_string() } else { format!("t{t}") };
            add(c, &name, &p, Some(&team)).await?;
            repos.push(name);
            left -= k;
            i += 1;
        }
    }
    let mut warm = Vec::new();
    for r in &repos {
        warm.push(submit_wf(c, r, ".kiln/warm.yaml").await?);
    }
    wait_all(c, &warm).await?;
    let t0 = now_ms();
    let ids = backlog(c, &repos).await?;
    let runs = wait_all(c, &ids).await?;
    let jobs: usize = runs.iter().map(|r| r.jobs.len()).sum();
    Ok(jobs as f64 / makespan(&runs, t0).max(0.001))
}

/// The throughput phase on PostgreSQL: `--replicas` (at least two) `kiln
/// server` processes on one throwaway database (or `--database-url`), the
/// `--fair-slots` agents split between them, each knowing its replica.
async fn on_replicas(a: &BenchArgs, dir: &Path) -> anyhow::Result<((f64, f64), (f64, f64))> {
    use crate::util::{Launch, spawn_agent_deployed, spawn_server_with, token};
    let mut _pg = None;
    let url = match a.database_url.as_deref() {
        Some("postgres") | None => {
            eprintln!("bench fairness: starting a throwaway PostgreSQL (fsync and synchronous commit on)…");
            let pg = kiln_testkit::TempPostgres::start_durable()?;
            let url = pg.create_database().await?;
            _pg = Some(pg);
            url
        }
        Some(u) => u.to_string(),
    };
    let data = dir.join("data");
    let mut servers = Vec::new();
    for _ in 0..a.replicas.max(2) {
        servers.push(spawn_server_with(&data, "127.0.0.1:0", &Launch::default(), &["--database-url", &url])?);
    }
    let urls: Vec<String> = servers.iter().map(|(_, u)| u.clone()).collect();
    let token_file = data.join("agent.token");
    let mut agents = Vec::new();
    for i in 0..a.fair_slots {
        let server = &urls[i as usize % urls.len()];
        agents.push(spawn_agent_deployed(server, &token_file, &format!("r{i}"), dir, 1, &Launch::default())?);
    }
    let c = Client::new(&urls[0], &token(&data, "admin.token")?);
    let n = a.fair_noop_jobs;
    let mut figures = Vec::new();
    for (i, teams) in ORDER.into_iter().enumerate() {
        figures.push((teams, throughput(&c, &dir.join(format!("e2e{i}")), n, teams).await?));
    }
    let (one, fifty) = by_teams(&figures);
    let virt = claims_rounds(&c, &urls, &token(&data, "agent.token")?, &dir.join("virtual"), n * 5).await?;
    drop(agents);
    drop(servers);
    Ok(((one, fifty), virt))
}

/// [`claims_only`] of `n` jobs with 1 team and 50 in [`ORDER`]: the means.
async fn claims_rounds(
    c: &Client,
    urls: &[String],
    agent_token: &str,
    dir: &Path,
    n: u32,
) -> anyhow::Result<(f64, f64)> {
    let mut figures = Vec::new();
    for (i, teams) in ORDER.into_iter().enumerate() {
        figures.push((teams, claims_only(c, urls, agent_token, &dir.join(format!("v{i}")), n, teams).await?));
    }
    Ok(by_teams(&figures))
}

/// Virtual agents claiming over HTTP (one per agent slot of a real agent).
const VIRTUAL_AGENTS: usize = 8;

/// `n` no-op jobs from [`TEAMS`] repositories (as [`throughput`]) that
/// only virtual agents may take (`runs-on: {virtual: "yes"}`), all ready
/// before the first claim: [`VIRTUAL_AGENTS`] agents (split over `urls`)
/// claim and complete them at once, each claim as soon as the last one was
/// answered; jobs per second from the first claim to the last completion.
async fn claims_only(
    c: &Client,
    urls: &[String],
    agent_token: &str,
    dir: &Path,
    n: u32,
    teams: u32,
) -> anyhow::Result<f64> {
    use kiln_api::{ClaimRequest, Completion, RegisterAgent};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let per_repo = n.div_ceil(TEAMS);
    let tag = dir.file_name().and_then(|s| s.to_str()).unwrap_or("x").to_string();
    let mut ids = Vec::new();
    for t in 0..TEAMS {
        let name = format!("v{tag}-t{t}");
        let p = dir.join(&name);
        let values: Vec<String> = (1..=per_repo.min(PER_RUN)).map(|i| i.to_string()).collect();
        repo_with(
            &p,
            &format!(
                "version: 1\njobs:\n  - name: m\n    runs-on: {{virtual: \"yes\"}}\n    matrix: {{i: [{}]}}\n    steps: [\"true\"]\n",
                values.join(", ")
            ),
        )?;
        let team = if teams == 1 { format!("v{tag}") } else { format!("v{tag}-t{t}") };
        add(c, &name, &p, Some(&team)).await?;
        ids.push(submit(c, &name).await?);
    }
    let total: u64 = {
        let mut sum = 0;
        for id in &ids {
            loop {
                let r = c.get_run(id).await?;
                if r.jobs.iter().all(|j| j.status == "ready") && !r.jobs.is_empty() {
                    sum += r.jobs.len() as u64;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        sum
    };
    let done = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..VIRTUAL_AGENTS {
        let url = &urls[i % urls.len()];
        let a = Client::new(url, agent_token);
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("virtual".to_string(), "yes".to_string());
        let reg = a
            .register_agent(&RegisterAgent {
                name: format!("virtual-{tag}-{i}"),
                labels,
                max_jobs: 1,
                version: None,
                executor: None,
                fresh_start: false,
            })
            .await?;
        let (agent, lease) = (a.with_token(&reg.credential), Client::new(url, agent_token));
        let (done, first) = (done.clone(), first.clone());
        set.spawn(async move {
            while done.load(Ordering::Relaxed) < total {
                let req = ClaimRequest {
                    session_id: reg.session_id.clone(),
                    claim_request_id: uuid::Uuid::new_v4().to_string(),
                    wait_ms: 500,
                };
                let Some(asg) = agent.claim(&reg.agent_id, &req).await?.assignment else { continue };
                first.lock().map(|mut f| *f.get_or_insert_with(Instant::now)).ok();
                let outcome = Completion::success();
                lease.with_token(&asg.attempt_token).complete(&asg.job_id, asg.epoch, &outcome).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let t0 = first.lock().ok().and_then(|f| *f).unwrap_or_else(Instant::now);
    let secs = t0.elapsed().as_secs_f64();
    wait_all(c, &ids).await?;
    Ok(total as f64 / secs.max(0.001))
}

/// The A/B scenario: a's backlog alone, then with b's jobs during it.
async fn ab_scenario(a: &BenchArgs, c: &Client, tmp: &Path, slots: u32, secs: f64, step: &str) -> anyhow::Result<()> {
    let c = c.clone();
    // a alone, then a with b's jobs: each backlog in its own repositories.
    let alone: Vec<(String, std::path::PathBuf)> = backlog_repos(&tmp.join("alone"), a.fair_jobs, step)?
        .into_iter()
        .map(|(n, p)| (format!("alone-{n}"), p))
        .collect();
    let shared = backlog_repos(&tmp.join("shared"), a.fair_jobs, step)?;
    let mut warm = Vec::new();
    for (name, p) in alone.iter().chain(&shared) {
        add(&c, name, p, Some("a")).await?;
        warm.push(submit_wf(&c, name, ".kiln/warm.yaml").await?);
    }
    wait_all(&c, &warm).await?;
    let b_dir = tmp.join("b");
    repo_with(&b_dir, &format!("version: 1\njobs:\n  - name: hotfix\n    steps: [\"{step}\"]\n"))?;
    add(&c, "b", &b_dir, Some("b")).await?;
    // Warm the mirrors and the agents' checkouts.
    let w = submit(&c, "b").await?;
    wait_all(&c, &[w]).await?;

    let t0 = now_ms();
    let names: Vec<String> = alone.iter().map(|(n, _)| n.clone()).collect();
    let ids = backlog(&c, &names).await?;
    let runs = wait_all(&c, &ids).await?;
    let alone_s = makespan(&runs, t0);

    let t0 = now_ms();
    let names: Vec<String> = shared.iter().map(|(n, _)| n.clone()).collect();
    let ids = backlog(&c, &names).await?;
    let expected = f64::from(a.fair_jobs) * secs / f64::from(slots);
    let every = Duration::from_secs_f64(((expected - 10.0) / B_SUBMISSIONS as f64).max(secs));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut b_runs = Vec::new();
    let mut oldest_first = Vec::new();
    for _ in 0..B_SUBMISSIONS {
        let now: Vec<kiln_api::Run> = {
            let mut v = Vec::new();
            for id in &ids {
                v.push(c.get_run(id).await?);
            }
            v
        };
        let ahead = ready_jobs(&now);
        if ahead == 0 {
            break;
        }
        b_runs.push(submit(&c, "b").await?);
        oldest_first.push(ahead as f64 * secs / f64::from(slots));
        tokio::time::sleep(every).await;
    }
    let runs = wait_all(&c, &ids).await?;
    let with_b_s = makespan(&runs, t0);
    let bs = wait_all(&c, &b_runs).await?;
    let mut waits: Vec<f64> = bs
        .iter()
        .filter_map(|r| Some((r.jobs.first()?.started_at_ms? - r.created_at_ms).max(0) as f64 / 1000.0))
        .collect();
    waits.sort_by(|x, y| x.total_cmp(y));
    oldest_first.sort_by(|x, y| x.total_cmp(y));
    kiln_cmd::outln!("fairness_b_submissions: {}", waits.len());
    kiln_cmd::outln!("fairness_b_wait_p50_s: {:.2}", percentile(&waits, 0.5));
    kiln_cmd::outln!("fairness_b_wait_p99_s: {:.2}", percentile(&waits, 0.99));
    kiln_cmd::outln!("fairness_b_wait_max_s: {:.2}", waits.last().copied().unwrap_or(0.0));
    kiln_cmd::outln!("fairness_b_wait_oldest_first_model_p50_s: {:.1}", percentile(&oldest_first, 0.5));
    kiln_cmd::outln!("fairness_a_makespan_alone_s: {alone_s:.1}");
    kiln_cmd::outln!("fairness_a_makespan_with_b_s: {with_b_s:.1}");
    kiln_cmd::outln!("fairness_a_makespan_ratio_pct: {:.1}", with_b_s / alone_s * 100.0);
    kiln_cmd::outln!("fairness_b_slot_secs: {:.0}", waits.len() as f64 * secs);

    Ok(())
}
