//! Command implementations.

use crate::cli::*;
use base64::Engine;
use futures::StreamExt;
use kiln_api::{ApiError, Client, exit};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

pub async fn run(cli: Cli) -> i32 {
    let res = match cli.command {
        Command::Up(a) => up(a).await,
        Command::Server(a) => server(a).await,
        Command::Agent(a) => agent(a).await,
        Command::Repo { command } => repo(command).await,
        Command::Secret { command } => secret(command).await,
        Command::Run(a) => run_cmd(a).await,
        Command::Status(a) => status(a).await,
        Command::Logs(a) => logs(a).await,
        Command::Cancel(a) => cancel(a).await,
        Command::Retry(a) => retry(a).await,
        Command::Validate { file } => Ok(validate(&file)),
        Command::Artifact { command: ArtifactCommand::Get { run, job, name, output, conn } } => {
            artifact_get(&conn, &run, &job, &name, &output).await
        }
        Command::Bench(a) => crate::bench::run(a).await,
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", e.message);
            e.code
        }
    }
}

/// A command failure: message for the user and the exit code.
pub struct Failure {
    pub message: String,
    pub code: i32,
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        let hint = match e.status() {
            Some(401) => "\nhint: set KILN_TOKEN (or --token) to the server's DATA_DIR/admin.token",
            None => "\nhint: is the server running? set KILN_SERVER (or --server)",
            _ => "",
        };
        Failure { message: format!("{e}{hint}"), code: e.exit_code() }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure { message: format!("{e:#}"), code: exit::UNAVAILABLE }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code: exit::USAGE }
}

type CmdResult = Result<i32, Failure>;

fn client(conn: &Conn) -> Result<Client, Failure> {
    let token = conn.token.clone().ok_or_else(|| {
        usage("no API token: set KILN_TOKEN or pass --token (the server writes DATA_DIR/admin.token)")
    })?;
    Ok(Client::new(&conn.server, &token))
}

fn agent_config(
    server: String,
    token: String,
    name: String,
    labels: BTreeMap<String, String>,
    work_dir: std::path::PathBuf,
    max_jobs: u32,
) -> kiln_agent::AgentConfig {
    kiln_agent::AgentConfig {
        server,
        token,
        name,
        labels,
        work_dir,
        max_jobs,
        executor: kiln_agent::ExecutorKind::Host,
        upload_rate_limit: None,
        log_limit: None,
        log_rate_limit: None,
        log_buffer: None,
        log_spool_limit: None,
        kill_grace: None,
    }
}

fn default_labels() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("os".into(), std::env::consts::OS.into());
    m.insert("arch".into(), std::env::consts::ARCH.into());
    m
}

async fn ctrl_c() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Start an embedded server and `agents` local agents. Returns the server
/// handle and the agents' shutdown switch.
pub async fn start_embedded(
    data_dir: &Path,
    listen: &str,
    agents: u32,
    lease_ttl: Duration,
    database_url: Option<String>,
) -> anyhow::Result<(kiln_server::ServerHandle, tokio::sync::watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)> {
    let mut config = kiln_server::ServerConfig::new(data_dir.to_path_buf(), listen.to_string());
    config.lease_ttl = lease_ttl;
    config.database_url = database_url;
    let handle = kiln_server::start(config).await?;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = vec![];
    for i in 1..=agents {
        let cfg = agent_config(
            handle.url(),
            handle.agent_token.clone(),
            format!("local-{i}"),
            default_labels(),
            data_dir.join("agents").join(format!("local-{i}")),
            1,
        );
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = kiln_agent::run(cfg, rx).await {
                tracing::error!("agent failed: {e:#}");
            }
        }));
    }
    Ok((handle, stop, tasks))
}

async fn up(a: UpArgs) -> CmdResult {
    let (handle, stop, tasks) =
        start_embedded(&a.data_dir, &a.listen, a.agents, a.lease_ttl, a.database_url.clone()).await?;
    let url = handle.url();
    println!("Kiln is up: server {url}, {} local agent(s), data in {}", a.agents, a.data_dir.display());
    println!("export KILN_SERVER={url} KILN_TOKEN={}", handle.admin_token);
    println!("web UI: {url}/");
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    eprintln!("shutting down");
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    handle.shutdown().await?;
    Ok(exit::OK)
}

async fn server(a: ServerArgs) -> CmdResult {
    if let Some(url) = &a.database_url
        && !["postgres://", "postgresql://", "sqlite:"].iter().any(|p| url.starts_with(p))
    {
        return Err(usage(format!("--database-url {url}: expected postgres://USER@HOST:PORT/DB or sqlite:PATH")));
    }
    let object_store = a.object_store.clone().unwrap_or_default();
    if !object_store.is_empty()
        && let Err(e) = kiln_blob::BlobStore::open_url(&object_store, &a.data_dir.join("objects"))
    {
        return Err(usage(format!("--object-store: {e}")));
    }
    let mut config = kiln_server::ServerConfig::new(a.data_dir.clone(), a.listen.clone());
    config.lease_ttl = a.lease_ttl;
    config.database_url = a.database_url.clone();
    config.object_store = object_store;
    config.loss_grace = a.loss_grace;
    if let Some(d) = a.dispatch_sweep {
        config.dispatch_sweep = d;
    }
    config.gc_grace = a.artifact_gc_grace;
    config.gc_interval = a.gc_interval;
    config.retry_base = a.retry_base;
    config.log_archive_after = a.log_archive_after;
    config.log_archive_interval = a.log_archive_after.clamp(Duration::from_millis(200), Duration::from_secs(10));
    config.registries.insecure = a.insecure_registries.clone();
    for entry in &a.registry_auth {
        let parsed = entry.split_once('=').and_then(|(h, c)| Some((h, c.split_once(':')?)));
        let Some((host, (user, password))) = parsed else {
            return Err(usage("--registry-auth must be HOST=USER:PASSWORD"));
        };
        config.registries.credentials.insert(host.trim().to_string(), (user.to_string(), password.to_string()));
    }
    let handle = kiln_server::start(config).await?;
    println!("kiln server listening on {} (tokens in {})", handle.url(), a.data_dir.display());
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    handle.shutdown().await?;
    Ok(exit::OK)
}

async fn agent(a: AgentArgs) -> CmdResult {
    let mut labels = default_labels();
    for l in &a.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| usage(format!("label `{l}` must be key=value")))?;
        labels.insert(k.trim().into(), v.trim().into());
    }
    let name = a.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "agent".into())
    });
    let mut cfg = agent_config(a.server, a.token, name, labels, a.work_dir, a.max_jobs.max(1));
    cfg.upload_rate_limit = a.upload_rate_limit;
    cfg.log_limit = a.log_limit;
    cfg.log_rate_limit = a.log_rate_limit;
    cfg.log_buffer = a.log_buffer;
    cfg.log_spool_limit = a.log_spool_limit;
    cfg.kill_grace = Some(a.kill_grace);
    if a.executor == "container" {
        let mut settings = kiln_agent::ContainerSettings::new(a.engine.clone());
        settings.default_image = a.default_image.clone();
        settings.network = a.container_network.parse().map_err(usage)?;
        cfg.executor = kiln_agent::ExecutorKind::Container(settings);
    }
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(kiln_agent::run(cfg, rx));
    tokio::pin!(task);
    tokio::select! {
        r = &mut task => { r.map_err(|e| anyhow::anyhow!(e))??; }
        _ = ctrl_c() => {
            let _ = stop.send(true);
            task.await.map_err(|e| anyhow::anyhow!(e))??;
        }
    }
    Ok(exit::OK)
}

async fn repo(cmd: RepoCommand) -> CmdResult {
    match cmd {
        RepoCommand::Add { name, url, webhook_secret, conn } => {
            let c = client(&conn)?;
            let url = absolutize(&url);
            let r = c.create_repo(&kiln_api::CreateRepo { name, clone_url: url, webhook_secret }).await?;
            println!("registered repository {} ({})", r.name, r.clone_url);
        }
        RepoCommand::List { conn } => {
            let c = client(&conn)?;
            for r in c.list_repos().await? {
                println!("{:<24} {}", r.name, r.clone_url);
            }
        }
    }
    Ok(exit::OK)
}

async fn secret(cmd: SecretCommand) -> CmdResult {
    match cmd {
        SecretCommand::Set { repo, name, conn } => {
            let c = client(&conn)?;
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .map_err(|e| usage(format!("cannot read the secret value from standard input: {e}")))?;
            let value = value.strip_suffix('\n').map(|v| v.strip_suffix('\r').unwrap_or(v)).unwrap_or(&value);
            if value.is_empty() {
                return Err(usage("the secret value (standard input) is empty"));
            }
            c.put_secret(&repo, &name, value).await?;
            println!("secret {name} of {repo} set ({} bytes)", value.len());
        }
        SecretCommand::List { repo, conn } => {
            let c = client(&conn)?;
            for s in c.list_secrets(&repo).await? {
                println!("{}", s.name);
            }
        }
        SecretCommand::Rm { repo, name, conn } => {
            client(&conn)?.delete_secret(&repo, &name).await?;
            println!("secret {name} of {repo} deleted");
        }
    }
    Ok(exit::OK)
}

/// Local paths are made absolute so the server and agents find them from anywhere.
fn absolutize(url: &str) -> String {
    if url.contains("://") || url.contains('@') {
        return url.to_string();
    }
    std::fs::canonicalize(url).map(|p| p.display().to_string()).unwrap_or_else(|_| url.to_string())
}

async fn run_cmd(a: RunArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let mut inputs = BTreeMap::new();
    for i in &a.inputs {
        let (k, v) = i.split_once('=').ok_or_else(|| usage(format!("--input `{i}` must be K=V")))?;
        inputs.insert(k.to_string(), v.to_string());
    }
    let body = kiln_api::SubmitRun {
        commit_sha: a.commit.clone(),
        workflow_path: Some(a.workflow.clone()),
        inputs,
        event: None,
    };
    let resp = c.submit_run(&a.repo, &body, a.idempotency_key.as_deref()).await?;
    if !a.follow {
        if a.json {
            let run = c.get_run(&resp.run_id).await?;
            println!("{}", serde_json::to_string_pretty(&run).expect("json"));
        } else {
            println!("{}", resp.run_id);
        }
        return Ok(exit::OK);
    }
    eprintln!("run {} accepted", resp.run_id);
    // With --json, stdout carries only the final run object; logs go to stderr.
    follow_run(&c, &resp.run_id, None, if a.json { Sink::Stderr } else { Sink::Stdout }).await?;
    let run = c.get_run(&resp.run_id).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        print_summary(&run);
    }
    Ok(if run.status == "success" { exit::OK } else { exit::RUN_FAILED })
}

fn print_summary(run: &kiln_api::Run) {
    eprintln!("run {} {}", run.id, run.status);
    for j in &run.jobs {
        let msg = j.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
        eprintln!("  {:<24} {:<10} epoch {}{msg}", j.name, j.status, j.current_epoch);
    }
}

/// Where streamed log bytes go.
#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    fn write(self, bytes: &[u8]) {
        // Raw bytes: the terminal decodes UTF-8 across chunk boundaries.
        let _ = match self {
            Sink::Stdout => std::io::stdout().lock().write_all(bytes).and_then(|_| std::io::stdout().flush()),
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }
}

/// Stream logs of the run's jobs in order until each ends.
async fn follow_run(c: &Client, run_id: &str, only: Option<&str>, sink: Sink) -> Result<(), Failure> {
    let run = c.get_run(run_id).await?;
    let jobs: Vec<_> = run
        .jobs
        .iter()
        .filter(|j| only.is_none_or(|o| j.name == o || j.id == o))
        .map(|j| (j.id.clone(), j.name.clone()))
        .collect();
    if jobs.is_empty() {
        return Err(usage(format!("run {run_id} has no job `{}`", only.unwrap_or(""))));
    }
    for (id, name) in jobs {
        sink.write(format!("── {name} ──\n").as_bytes());
        stream_job(c, &id, sink, true).await?;
    }
    Ok(())
}

/// Print a job's log events. Follows until the `end` event when `follow`,
/// reconnecting with Last-Event-ID so nothing is lost or repeated.
async fn stream_job(c: &Client, job: &str, sink: Sink, follow: bool) -> Result<(), Failure> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut last: Option<String> = None;
    let mut failures = 0;
    loop {
        let stream = match c.log_events(job, last.as_deref()).await {
            Ok(s) => s,
            Err(e) if e.is_retryable() && failures < 30 => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        tokio::pin!(stream);
        loop {
            let next = if follow {
                stream.next().await
            } else {
                match tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
                    Ok(n) => n,
                    Err(_) => return Ok(()),
                }
            };
            match next {
                None => break,
                Some(Err(_)) => break,
                Some(Ok(ev)) => {
                    if !ev.id.is_empty() {
                        last = Some(ev.id.clone());
                    }
                    match ev.event.as_str() {
                        "chunk" => {
                            if let Ok(le) = serde_json::from_str::<kiln_api::LogEvent>(&ev.data)
                                && let Ok(bytes) = b64.decode(le.data.as_bytes())
                            {
                                sink.write(&bytes);
                            }
                        }
                        "end" => return Ok(()),
                        "gap" => {
                            if let Ok(g) = serde_json::from_str::<kiln_api::LogGap>(&ev.data) {
                                eprintln!(
                                    "kiln: ⚠ log gap in attempt {}: {}; its log has no clean end",
                                    g.epoch, g.reason
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        failures += 1;
        if failures > 30 {
            return Err(Failure { message: "log stream kept dropping".into(), code: exit::UNAVAILABLE });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn status(a: StatusArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let run = c.get_run(&a.run).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        println!("run {}  {}", run.id, run.status);
        println!("repo {}  commit {}  workflow {}", run.repo, run.commit_sha, run.workflow_path);
        for j in &run.jobs {
            let runner = j.attempts.last().map(|a| a.runner.as_str()).unwrap_or("-");
            let msg = j.message.as_deref().map(|m| format!("  {m}")).unwrap_or_default();
            println!("  {:<24} {:<10} epoch {:<3} {runner}{msg}", j.name, j.status, j.current_epoch);
        }
    }
    Ok(exit::OK)
}

async fn logs(a: LogsArgs) -> CmdResult {
    let c = client(&a.conn)?;
    if a.follow {
        follow_run(&c, &a.run, a.job.as_deref(), Sink::Stdout).await?;
        return Ok(exit::OK);
    }
    let run = c.get_run(&a.run).await?;
    for j in run.jobs.iter().filter(|j| a.job.as_deref().is_none_or(|o| j.name == o || j.id == o)) {
        println!("── {} ──", j.name);
        let terminal = matches!(j.status.as_str(), "success" | "failed" | "cancelled" | "skipped");
        stream_job(&c, &j.id, Sink::Stdout, terminal).await?;
    }
    Ok(exit::OK)
}

async fn cancel(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let run = c.cancel_run(&a.run).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        println!("run {} {}", run.id, run.status);
    }
    Ok(exit::OK)
}

async fn retry(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let resp = c.retry_run(&a.run).await?;
    if a.json {
        println!("{}", serde_json::json!({ "run_id": resp.run_id }));
    } else {
        println!("{}", resp.run_id);
    }
    Ok(exit::OK)
}

fn validate(file: &Path) -> i32 {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
            return exit::USAGE;
        }
    };
    if bytes.len() > kiln_workflow::MAX_FILE_BYTES {
        eprintln!(
            "{}:0:0: the workflow file is {} bytes; at most {} bytes are allowed",
            file.display(),
            bytes.len(),
            kiln_workflow::MAX_FILE_BYTES
        );
        return exit::USAGE;
    }
    let Ok(text) = String::from_utf8(bytes) else {
        eprintln!("{}:0:0: the workflow file is not valid UTF-8", file.display());
        return exit::USAGE;
    };
    match kiln_workflow::parse(&text) {
        Ok(w) => {
            println!("{}: valid ({} jobs, definition sha256 {})", file.display(), w.jobs.len(), w.canonical_hash());
            exit::OK
        }
        Err(d) => {
            for diag in &d.0 {
                eprintln!("{}:{}:{}: {}", file.display(), diag.line, diag.column, diag.message);
            }
            eprintln!("{}: {} problem(s)", file.display(), d.0.len());
            exit::USAGE
        }
    }
}

/// `kiln artifact get`: resolve the bound generation, download it with its
/// short-lived capability, verify size and sha256, then move it into place.
async fn artifact_get(conn: &Conn, run: &str, job: &str, name: &str, output: &Path) -> CmdResult {
    use sha2::{Digest, Sha256};
    let c = client(conn)?;
    let d = c.artifact(run, job, name).await?;
    let resp = c.download(&d.url).await?;
    let to_stdout = output.as_os_str() == "-";
    let tmp = output.with_file_name(format!(
        ".{}.kiln-partial",
        output.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "artifact".into())
    ));
    let mut file = if to_stdout {
        None
    } else {
        Some(std::fs::File::create(&tmp).map_err(|e| usage(format!("cannot write {}: {e}", tmp.display())))?)
    };
    let bar = indicatif::ProgressBar::new(d.size);
    if to_stdout || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}")
            .expect("template"),
    );
    let mut hasher = Sha256::new();
    let mut n: u64 = 0;
    let mut stream = resp.bytes_stream();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Failure { message: format!("download failed: {e}"), code: exit::UNAVAILABLE })?;
        hasher.update(&chunk);
        n += chunk.len() as u64;
        match file.as_mut() {
            Some(f) => f.write_all(&chunk).map_err(|e| usage(format!("cannot write {}: {e}", tmp.display())))?,
            None => out.write_all(&chunk).map_err(|e| usage(format!("cannot write to stdout: {e}")))?,
        }
        bar.set_position(n);
    }
    bar.finish_and_clear();
    let sha = hex::encode(hasher.finalize());
    if n != d.size || sha != d.sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure {
            message: format!(
                "artifact {job}/{name} failed verification: expected {} bytes sha256 {}, got {n} bytes sha256 {sha}; nothing was written",
                d.size, d.sha256
            ),
            code: exit::UNAVAILABLE,
        });
    }
    if let Some(f) = file {
        f.sync_all().map_err(|e| usage(e.to_string()))?;
        std::fs::rename(&tmp, output).map_err(|e| usage(format!("cannot write {}: {e}", output.display())))?;
        eprintln!("{job}/{name} (epoch {}): {n} bytes, sha256 {sha} -> {}", d.epoch, output.display());
    }
    Ok(exit::OK)
}
