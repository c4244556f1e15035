//! `kiln bench checkout` (issue 47, item 1): a big repository to the first
//! step, beside git's own path to the same tree in the same invocation.
//!
//! For each size (`--checkout-files`, default 30,000 and 100,000 files of
//! 0.25–16 KB, one commit, packed) a real `kiln server` and `kiln agent`
//! run one-step jobs whose step prints its clock; each figure is the time
//! from the run's submission to that clock (median of `REPS`):
//!
//! - **cold**: a new agent (empty work dir; the server has seen the
//!   repository before) — beside `git clone --bare` (over `file://`, no
//!   hard links) plus `git clone --shared` of it;
//! - **warm**: a one-file change, the agent's mirror and earlier checkout
//!   present — beside `git fetch` into the bare clone plus a fresh
//!   `git clone --shared`;
//! - **rerun**: the same commit again (target ≤ 0.5 s);
//! - **reuse**: a one-file change with `checkout: {reuse: true}` — beside
//!   `git fetch`, `git checkout -f` and `git clean -ffdx` in a kept clone.

use crate::util::{Launch, add_repo, bench_dir, git, spawn_agent_deployed, spawn_server, token, wait_terminal};
use kiln_api::{Client, exit};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const REPS: usize = 3;

const FRESH: &str = "version: 1\njobs:\n  - name: first\n    steps:\n      - echo \"bench-start $(date +%s%3N)\"\n";
const REUSE: &str = "version: 1\njobs:\n  - name: first\n    checkout: {reuse: true}\n    steps:\n      - echo \"bench-start $(date +%s%3N)\"\n";

pub(crate) async fn run(sizes: &[u32]) -> anyhow::Result<i32> {
    for &files in sizes {
        one_size(files).await?;
    }
    Ok(exit::OK)
}

fn label(files: u32) -> String {
    if files.is_multiple_of(1000) { format!("{}k", files / 1000) } else { files.to_string() }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Wall time of `f`, in ms, each from a disk with nothing left to write
/// back (a checkout writes hundreds of megabytes).
fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    settle();
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// A repository of `files` files in directories of ten, with both
/// workflows, one commit, packed; served with filters allowed.
fn generate(dir: &Path, files: u32) -> anyhow::Result<u64> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = 0u64;
    for i in 0..files {
        let d = dir.join(format!("crate{:04}/src/m{}", i / 100, (i / 10) % 10));
        if i % 10 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        // xorshift: incompressible-ish text of 256..16,000 bytes.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let size = 256 + (seed % 15_744) as usize;
        let mut text = String::with_capacity(size);
        let mut x = seed;
        while text.len() < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(&format!("{x:016x}"));
        }
        text.truncate(size);
        bytes += size as u64;
        std::fs::write(d.join(format!("f{i}.rs")), text)?;
    }
    std::fs::create_dir_all(dir.join(".kiln"))?;
    std::fs::write(dir.join(".kiln/pipeline.yaml"), FRESH)?;
    std::fs::write(dir.join(".kiln/reuse.yaml"), REUSE)?;
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["config", "uploadpack.allowFilter", "true"])?;
    git(dir, &["add", "."])?;
    commit(dir, "one")?;
    git(dir, &["repack", "-adq"])?;
    Ok(bytes)
}

fn commit(dir: &Path, msg: &str) -> anyhow::Result<()> {
    git(dir, &["-c", "user.name=bench", "-c", "user.email=bench@kiln", "commit", "-q", "-m", msg])
}

/// A one-file change, committed.
fn change(dir: &Path, n: u32) -> anyhow::Result<()> {
    let f = dir.join("crate0000/src/m0/f0.rs");
    let mut text = std::fs::read_to_string(&f)?;
    text.push_str(&format!("\n// change {n}\n"));
    std::fs::write(&f, text)?;
    git(dir, &["add", "."])?;
    commit(dir, &format!("change {n}"))
}

/// Submission of `workflow` at `main` to its step's clock, in ms.
async fn to_first_step(c: &Client, workflow: &str) -> anyhow::Result<f64> {
    let body =
        kiln_api::SubmitRun { commit_sha: "main".into(), workflow_path: Some(workflow.into()), ..Default::default() };
    settle();
    let t0 = crate::util::now_ms();
    let run = c.submit_run("big", &body, None).await?.run_id;
    let r = wait_terminal(c, &run).await?;
    anyhow::ensure!(r.status == "success", "run {run} ended {}: {:?}", r.status, r.jobs);
    let job = &r.jobs[0].id;
    let start = crate::logs::step_start_ms(c, job).await?.ok_or_else(|| anyhow::anyhow!("no bench-start line"))?;
    Ok((start - t0) as f64)
}

async fn one_size(files: u32) -> anyhow::Result<()> {
    let l = label(files);
    let tmp = bench_dir().join(format!("kiln-bench-checkout-{}-{l}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let src = tmp.join("src");
    eprintln!("bench checkout: generating {files} files ...");
    let bytes = generate(&src, files)?;
    kiln_cmd::outln!("checkout_{l}_files: {files}");
    kiln_cmd::outln!("checkout_{l}_mb: {:.0}", bytes as f64 / 1e6);
    let url = format!("file://{}", src.display());

    // git's own path, measured first (a cold page cache is nobody's).
    eprintln!("bench checkout: git baselines ...");
    let (mut cold, mut warm, mut incr) = (vec![], vec![], vec![]);
    for rep in 0..REPS {
        let g = tmp.join(format!("git-{rep}"));
        std::fs::create_dir_all(&g)?;
        cold.push(timed(|| {
            run_git(&g, &["clone", "-q", "--bare", "--no-local", &url, "m.git"])?;
            run_git(&g, &["clone", "-q", "--shared", "m.git", "ws"])
        })?);
        // A kept clone for the incremental checkout.
        run_git(&g, &["clone", "-q", "--shared", "m.git", "kept"])?;
        change(&src, 1000 + rep as u32)?;
        warm.push(timed(|| {
            run_git(&g.join("m.git"), &["fetch", "-q", &url, "+refs/heads/*:refs/heads/*"])?;
            run_git(&g, &["clone", "-q", "--shared", "m.git", "ws2"])
        })?);
        change(&src, 2000 + rep as u32)?;
        incr.push(timed(|| {
            run_git(&g.join("m.git"), &["fetch", "-q", &url, "+refs/heads/*:refs/heads/*"])?;
            let kept = g.join("kept");
            run_git(&kept, &["fetch", "-q", "origin"])?;
            run_git(&kept, &["checkout", "-q", "-f", "--detach", "origin/main"])?;
            run_git(&kept, &["clean", "-ffdxq"])
        })?);
        let _ = std::fs::remove_dir_all(&g);
    }
    let (git_cold, git_warm, git_incr) = (median(cold), median(warm), median(incr));
    kiln_cmd::outln!("checkout_{l}_git_cold_ms: {git_cold:.0}");
    kiln_cmd::outln!("checkout_{l}_git_warm_ms: {git_warm:.0}");
    kiln_cmd::outln!("checkout_{l}_git_incremental_ms: {git_incr:.0}");

    // Kiln: a server that has seen the repository, then fresh agents.
    let data = tmp.join("data");
    let (_server, server_url) = spawn_server(&data, "127.0.0.1:0")?;
    let c = Client::new(&server_url, &token(&data, "admin.token")?);
    add_repo(&c, "big", &src).await?;
    let first = {
        let _agent =
            spawn_agent_deployed(&server_url, &data.join("agent.token"), "first", &tmp, 1, &sandboxed(&tmp, "first"))?;
        to_first_step(&c, ".kiln/pipeline.yaml").await?
    };
    kiln_cmd::outln!("checkout_{l}_first_run_ms: {first:.0}");
    let (mut cold, mut warm, mut rerun, mut reuse) = (vec![], vec![], vec![], vec![]);
    for rep in 0..REPS {
        eprintln!("bench checkout: kiln, round {} of {REPS} ...", rep + 1);
        let name = format!("agent-{rep}");
        let _agent =
            spawn_agent_deployed(&server_url, &data.join("agent.token"), &name, &tmp, 1, &sandboxed(&tmp, &name))?;
        change(&src, 3000 + rep as u32)?;
        cold.push(to_first_step(&c, ".kiln/pipeline.yaml").await?);
        change(&src, 4000 + rep as u32)?;
        warm.push(to_first_step(&c, ".kiln/pipeline.yaml").await?);
        // Let the slot's reset after the last job finish first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        rerun.push(to_first_step(&c, ".kiln/pipeline.yaml").await?);
        // The kept workspace of a reuse job, then a one-file change.
        to_first_step(&c, ".kiln/reuse.yaml").await?;
        change(&src, 5000 + rep as u32)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        reuse.push(to_first_step(&c, ".kiln/reuse.yaml").await?);
        let _ = std::fs::remove_dir_all(tmp.join(&name));
        let _ = std::fs::remove_dir_all(tmp.join("sandboxes").join(&name));
    }
    let (cold, warm, rerun, reuse) = (median(cold), median(warm), median(rerun), median(reuse));
    kiln_cmd::outln!("checkout_{l}_cold_ms: {cold:.0}");
    kiln_cmd::outln!("checkout_{l}_cold_vs_git: {:.2}", cold / git_cold);
    kiln_cmd::outln!("checkout_{l}_warm_ms: {warm:.0}");
    kiln_cmd::outln!("checkout_{l}_warm_vs_git: {:.2}", warm / git_warm);
    kiln_cmd::outln!("checkout_{l}_rerun_ms: {rerun:.0}");
    kiln_cmd::outln!("checkout_{l}_reuse_ms: {reuse:.0}");
    kiln_cmd::outln!("checkout_{l}_reuse_vs_git: {:.2}", reuse / git_incr);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// An agent whose sandboxes (kept job slots of big trees) live in the
/// bench's directory, removed with it: a killed agent leaves its own.
fn sandboxed(tmp: &Path, name: &str) -> Launch {
    let dir = tmp.join("sandboxes").join(name);
    Launch { global: vec!["--sandbox-dir".into(), dir.display().to_string()], ..Launch::default() }
}

/// `sync`: what earlier rounds wrote is on the disk.
fn settle() {
    let _ = Command::new("sync").status();
}

fn run_git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output()?;
    anyhow::ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
