//! What the benchmarks share: percentiles, a one-commit repository, waiting
//! for a run, and real agent processes.

use kiln_api::Client;
use std::path::Path;
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
    loop {
        let r = c.get_run(run).await?;
        if r.status.is_terminal() {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
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
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["agent", "--server", server, "--name", name, "--work-dir"])
        .arg(dir.join(name))
        .env("KILN_AGENT_TOKEN", token)
        .args(extra)
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Proc(child))
}
