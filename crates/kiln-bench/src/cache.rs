//! `kiln bench cache`: a 500 MB cache of 20,000 files (the shape of a
//! `target/` tree) saved and restored through a real server and real agent
//! processes, beside `tar -c --zstd` / `tar -x --zstd` of the same tree and
//! archive, measured in the same invocation.

use crate::util::{percentile, repo_with, spawn_agent_with, wait_terminal};
use kiln_api::{Client, SubmitRun, exit};
use kiln_cmd::Failure;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FILES: u64 = 20_000;
const BYTES: u64 = 500_000_000;
const ROUNDS: usize = 3;

fn sh(cmd: &str) -> anyhow::Result<f64> {
    let _ = Command::new("sync").status();
    let t = Instant::now();
    let st = Command::new("sh").arg("-c").arg(cmd).status()?;
    anyhow::ensure!(st.success(), "`{cmd}` failed");
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    percentile(&v, 0.5)
}

/// Whether `agent_dir` holds a prepared copy of a cache entry.
fn prepared(agent_dir: &Path) -> bool {
    std::fs::read_dir(agent_dir.join("caches/trees"))
        .is_ok_and(|rd| rd.flatten().any(|e| !e.file_name().to_string_lossy().starts_with('.')))
}

pub async fn run(object_store: String) -> Result<i32, Failure> {
    Ok(measure(object_store).await?)
}

async fn measure(object_store: String) -> anyhow::Result<i32> {
    let tmp = crate::util::bench_dir().join(format!("kiln-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let corpus = tmp.join("corpus");
    eprintln!("bench cache: writing {FILES} files, {} MB ...", BYTES / 1_000_000);
    let tree = kiln_cache::corpus::make_tree(&corpus, FILES, BYTES)?;
    let (c, t) = (corpus.display(), tmp.display());

    // Baselines and the library alone, same tree, same disk.
    eprintln!("bench cache: baselines ...");
    let mut tar_c = vec![];
    let mut tar_x = vec![];
    let mut pack = vec![];
    let mut unpack = vec![];
    let archive = tmp.join("kiln.tar.zst");
    let declared = vec!["deps".to_string()];
    for i in 0..ROUNDS {
        tar_c.push(sh(&format!("tar -c --zstd -f {t}/base.tar.zst -C {c} ."))?);
        let _ = Command::new("sync").status();
        let s = Instant::now();
        let f = std::io::BufWriter::new(std::fs::File::create(&archive)?);
        kiln_cache::pack(&[("deps".into(), corpus.clone())], f, 3)?;
        pack.push(s.elapsed().as_secs_f64() * 1000.0);
        let x = tmp.join(format!("x{i}"));
        std::fs::create_dir_all(&x)?;
        tar_x.push(sh(&format!("tar -x --zstd -f {} -C {}", archive.display(), x.display()))?);
        let _ = std::fs::remove_dir_all(&x);
        let _ = Command::new("sync").status();
        let u = tmp.join(format!("u{i}/deps"));
        let s = Instant::now();
        let f = std::io::BufReader::new(std::fs::File::open(&archive)?);
        kiln_cache::unpack(f, std::slice::from_ref(&u), &declared, &kiln_cache::Limits::default())?;
        unpack.push(s.elapsed().as_secs_f64() * 1000.0);
        let _ = std::fs::remove_dir_all(tmp.join(format!("u{i}")));
    }
    let archive_bytes = std::fs::metadata(&archive)?.len();
    let tar_bytes = std::fs::metadata(tmp.join("base.tar.zst"))?.len();

    // Through Kiln: a cold run saves, fresh agents restore from the object
    // store, the same agent again restores from its node-local copy.
    let repo = tmp.join("repo");
    repo_with(
        &repo,
        &format!(
            "version: 1\njobs:\n  - name: cached\n    cache: {{kind: dependencies, version: \"1\", paths: [deps]}}\n    steps:\n      - 'if [ ! -d deps/release ]; then mkdir -p deps && cp -a {c}/. deps/; fi'\n"
        ),
    )?;
    let mut config = kiln_server::ServerConfig::new(tmp.join("data"), "127.0.0.1:0".into());
    config.object_store = object_store.clone();
    let server = kiln_server::start(config).await?;
    let client = Client::new(&server.url(), &server.admin_token);
    client
        .create_repo(&kiln_api::CreateRepo {
            team: None,
            forge: Default::default(),
            name: "cache".into(),
            clone_url: repo.display().to_string(),
            webhook_secret: None,
            secret_pools: None,
        })
        .await?;
    let agents = tmp.join("agents");
    let go = |c: &Client| {
        let c = c.clone();
        async move {
            let r = c.submit_run("cache", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await?;
            let run = wait_terminal(&c, &r.run_id).await?;
            anyhow::ensure!(run.status.is_success(), "benchmark run failed: {run:?}");
            run.jobs[0].cache.clone().ok_or_else(|| anyhow::anyhow!("no cache report"))
        }
    };
    eprintln!("bench cache: cold run (save) ...");
    // Sandboxes inside the bench's directory: the agents are killed, and
    // their 500 MB workspaces go with it.
    // Beside the agents' private work dirs, not in them: the step user
    // (nobody, under a root agent) must reach its sandbox.
    let sandbox = |name: &str| tmp.join("sandboxes").join(name).display().to_string();
    let agent =
        spawn_agent_with(&server.url(), &server.agent_token, "cold", &agents, &["--sandbox-dir", &sandbox("cold")])?;
    let cold = go(&client).await?;
    anyhow::ensure!(cold.saved.as_deref() == Some("saved"), "the cold run did not save: {cold:?}");
    let save_ms = cold.seconds.unwrap_or(f64::NAN) * 1000.0;
    drop(agent);
    let (mut blob, mut local, mut local_how) = (vec![], vec![], vec![]);
    for i in 0..ROUNDS {
        eprintln!("bench cache: restore round {} of {ROUNDS} ...", i + 1);
        let name = format!("warm{i}");
        let agent =
            spawn_agent_with(&server.url(), &server.agent_token, &name, &agents, &["--sandbox-dir", &sandbox(&name)])?;
        let hit = go(&client).await?;
        anyhow::ensure!(hit.result == "hit", "expected a hit from the object store: {hit:?}");
        blob.push(hit.seconds.unwrap_or(f64::NAN) * 1000.0);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !prepared(&agents.join(&name)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let hit = go(&client).await?;
        anyhow::ensure!(hit.result == "hit", "expected a node-local hit: {hit:?}");
        local.push(hit.seconds.unwrap_or(f64::NAN) * 1000.0);
        local_how.push(hit.message.unwrap_or_default());
        drop(agent);
    }
    let store = if object_store.starts_with("s3") { "s3" } else { "local" };
    let (tar_c, tar_x, pack, unpack) = (median(tar_c), median(tar_x), median(pack), median(unpack));
    let (blob, local) = (median(blob), median(local));
    println!("cache_object_store: {store}");
    println!("cache_tree_files: {}", tree.files);
    println!("cache_tree_bytes: {}", tree.bytes);
    println!("cache_archive_bytes: {archive_bytes}");
    println!("baseline_tar_zstd_archive_bytes: {tar_bytes}");
    println!("cache_pack_ms: {pack:.0}");
    println!("baseline_tar_c_zstd_ms: {tar_c:.0}");
    println!("cache_pack_speed_vs_tar_c: {:.2}", tar_c / pack);
    println!("cache_unpack_ms: {unpack:.0}");
    println!("baseline_tar_x_zstd_same_archive_ms: {tar_x:.0}");
    println!("cache_unpack_speed_vs_tar_x: {:.2}", tar_x / unpack);
    println!("cache_save_through_agent_ms: {save_ms:.0}");
    println!("cache_save_through_agent_speed_vs_tar_c: {:.2}", tar_c / save_ms);
    println!("cache_restore_from_object_store_ms: {blob:.0}");
    println!("cache_restore_from_object_store_speed_vs_tar_x: {:.2}", tar_x / blob);
    println!("cache_restore_node_local_ms: {local:.0}");
    println!("cache_restore_node_local_how: {}", local_how.join(", "));
    println!("cache_node_local_speedup_vs_object_store: {:.2}", blob / local);
    let _ = server.shutdown().await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(exit::OK)
}
