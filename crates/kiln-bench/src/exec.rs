//! `kiln bench exec` (issue 48): how long `kiln exec` takes, as a person
//! typing it sees it — real `kiln exec` processes (this binary) in a real
//! git checkout, with a cache home of their own.
//!
//! - `exec_to_step_ms`: from just before the process is spawned to the
//!   moment a one-job, one-step workflow's command runs (the step prints
//!   its clock, read from its output), median of the warm runs (target:
//!   150 ms); `exec_first_to_step_ms` is the first run on an empty cache
//!   home (store created, migrations, mirrors cloned).
//! - `exec_one_step_total_ms`: the same runs to the process's exit.
//! - `exec_hello_total_ms`: the bundled `examples/hello` pipeline (two
//!   jobs, an artifact between them) end to end (target: 1 s).
//! - `exec_hello_dirty_total_ms`: the same with an uncommitted change (a
//!   synthetic snapshot commit each run).
//! - baseline `sh_spawn_ms`: `sh -c true` spawned and waited for, the
//!   floor of any command a step runs.

use crate::util::{git, percentile};
use kiln_api::exit;
use kiln_cmd::Failure;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Runs of each figure (the first run of a fresh home counted apart).
const RUNS: usize = 7;

const HELLO: &[(&str, &str)] = &[
    (".kiln/pipeline.yaml", include_str!("../../../examples/hello/.kiln/pipeline.yaml")),
    ("ci/build.sh", include_str!("../../../examples/hello/ci/build.sh")),
    ("ci/test.sh", include_str!("../../../examples/hello/ci/test.sh")),
    ("ci/integration-test.sh", include_str!("../../../examples/hello/ci/integration-test.sh")),
    ("src/greet.sh", include_str!("../../../examples/hello/src/greet.sh")),
];

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos()
}

fn checkout(dir: &Path, files: &[(&str, &str)]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (p, content) in files {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().expect("a parent"))?;
        std::fs::write(&path, content)?;
        if p.ends_with(".sh") {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["add", "."])?;
    git(dir, &["-c", "user.name=bench", "-c", "user.email=bench@kiln", "commit", "-q", "-m", "bench"])?;
    Ok(())
}

/// One `kiln exec` in `dir`: (ms to the step's clock line if any, ms to exit).
fn exec_once(dir: &Path, cache: &Path, tmp: &Path) -> anyhow::Result<(Option<f64>, f64)> {
    let exe = std::env::current_exe()?;
    let start_ns = now_ns();
    let t0 = Instant::now();
    let out = Command::new(exe)
        .arg("exec")
        .current_dir(dir)
        .env("XDG_CACHE_HOME", cache)
        .env("TMPDIR", tmp)
        .env_remove("KILN_LOG")
        .stdin(Stdio::null())
        .output()?;
    let total = t0.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        out.status.success(),
        "kiln exec failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let step = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("step-started-at=").and_then(|v| v.parse::<u128>().ok()))
        .map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6);
    Ok((step, total))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

pub(crate) async fn run() -> Result<i32, Failure> {
    tokio::task::spawn_blocking(measure).await.map_err(|e| Failure::from(anyhow::anyhow!("{e}")))??;
    Ok(exit::OK)
}

fn measure() -> Result<(), Failure> {
    let dir = tempfile::tempdir().map_err(anyhow::Error::from)?;
    let (cache, tmp) = (dir.path().join("cache"), dir.path().join("tmp"));
    std::fs::create_dir_all(&tmp).map_err(anyhow::Error::from)?;

    let mut spawn = vec![];
    for _ in 0..20 {
        let t = Instant::now();
        let st = Command::new("sh").args(["-c", "true"]).status().map_err(anyhow::Error::from)?;
        assert!(st.success());
        spawn.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    kiln_cmd::outln!("sh_spawn_ms: {:.2}", median(spawn));

    let one = dir.path().join("one-step");
    checkout(
        &one,
        &[(
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: one\n    steps:\n      - name: clock\n        run: echo \"step-started-at=$(date +%s%N)\"\n",
        )],
    )?;
    let (first_step, first_total) = exec_once(&one, &cache, &tmp)?;
    kiln_cmd::outln!("exec_first_to_step_ms: {:.1}", first_step.unwrap_or(f64::NAN));
    kiln_cmd::outln!("exec_first_total_ms: {first_total:.1}");
    let (mut steps, mut totals) = (vec![], vec![]);
    for _ in 0..RUNS {
        let (s, t) = exec_once(&one, &cache, &tmp)?;
        steps.push(s.unwrap_or(f64::NAN));
        totals.push(t);
    }
    kiln_cmd::outln!("exec_to_step_ms: {:.1}", median(steps.clone()));
    kiln_cmd::outln!("exec_to_step_max_ms: {:.1}", steps.iter().copied().fold(f64::NAN, f64::max));
    kiln_cmd::outln!("exec_one_step_total_ms: {:.1}", median(totals));

    let hello = dir.path().join("hello");
    checkout(&hello, HELLO)?;
    let _ = exec_once(&hello, &cache, &tmp)?;
    let mut totals = vec![];
    for _ in 0..RUNS {
        totals.push(exec_once(&hello, &cache, &tmp)?.1);
    }
    kiln_cmd::outln!("exec_hello_total_ms: {:.1}", median(totals));
    let mut totals = vec![];
    for i in 0..RUNS {
        std::fs::write(hello.join("NOTES"), format!("change {i}\n")).map_err(anyhow::Error::from)?;
        totals.push(exec_once(&hello, &cache, &tmp)?.1);
    }
    kiln_cmd::outln!("exec_hello_dirty_total_ms: {:.1}", median(totals));
    kiln_cmd::outln!("exec_runs_per_figure: {RUNS}");
    Ok(())
}
