//! `kiln up`: a server and N local agents in one process on embedded defaults.

use super::profile;
use super::shared::{apply_agent_tuning, apply_server_tuning, apply_web, ctrl_c};
use crate::cli::UpArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, start_embedded_agents, usage};
use std::io::Write;
use std::time::Duration;

/// Whether `kiln up`'s local agents (pool `default`, of `agent.token`)
/// take untrusted work, in one line.
fn untrusted_line(policy: &kiln_core::claim::UntrustedPolicy, agent: &kiln_agent::AgentConfig) -> String {
    let executor = match agent.executor {
        kiln_agent::ExecutorKind::Host => kiln_core::claim::Executor::Host,
        kiln_agent::ExecutorKind::Container(_) => kiln_core::claim::Executor::Container,
    };
    if policy.takes_untrusted("default", executor) {
        format!(
            "untrusted work (fork pull requests, untrusted runs): taken by the local agents (pool default, {executor} executor)"
        )
    } else {
        format!(
            "untrusted work (fork pull requests, untrusted runs): not taken by the local agents (pool default, {executor} \
             executor); it waits for an agent of {} (docs/security.md)",
            policy.describe()
        )
    }
}

/// `kiln up` as root through `sudo`, without `--step-user`: host steps run
/// as the user who ran sudo (their toolchains, their files), not as
/// `nobody` (docs/deploy.md, single machine). Plain root keeps `nobody`.
fn sudo_step_user(agent: &kiln_agent::AgentConfig, sudo_user: Option<String>) -> Option<String> {
    let host = agent.executor == kiln_agent::ExecutorKind::Host;
    let root = nix::unistd::geteuid().is_root();
    sudo_user.filter(|u| host && root && agent.step_user.is_none() && !u.is_empty() && u != "root")
}

/// Who the local agents' host steps run as, in one line (none for the
/// container executor).
fn steps_line(agent: &kiln_agent::AgentConfig, from_sudo: bool) -> Option<String> {
    if agent.executor != kiln_agent::ExecutorKind::Host {
        return None;
    }
    let root = nix::unistd::geteuid().is_root();
    let who = match (&agent.step_user, root) {
        (Some(u), _) if from_sudo => format!("{u} (who ran sudo; --step-user to choose another)"),
        (Some(u), _) => u.clone(),
        (None, true) => "nobody (--step-user to choose; tools installed in root's home are not theirs)".into(),
        (None, false) => "this user".into(),
    };
    Some(format!(
        "host steps run as {who}, with a private HOME; see docs/deploy.md for passing toolchains (--env, --path)"
    ))
}

pub(super) async fn run(a: UpArgs) -> CmdResult {
    let _lock = lock_data_dir(&a.data_dir)?;
    let mut config = kiln_server::ServerConfig::new(a.data_dir.clone(), a.listen.clone());
    config.lease_ttl = a.lease_ttl;
    config.database_url = a.database_url.clone();
    apply_server_tuning(&mut config, &a.server)?;
    apply_web(&mut config, &a.web)?;
    // Check the agents' flags once, before anything starts.
    let mut probe =
        kiln_cmd::agent_config(String::new(), String::new(), String::new(), Default::default(), a.data_dir.clone(), 1);
    apply_agent_tuning(&mut probe, &a.agent)?;
    let sudo_user = sudo_step_user(&probe, std::env::var("SUDO_USER").ok());
    probe.step_user = probe.step_user.clone().or(sudo_user.clone());
    if let Some(cert) = &a.web.tls_cert {
        // The local agents reach the server over TLS too: they trust its certificate.
        let pem = std::fs::read(cert).map_err(|e| usage(format!("--tls-cert {}: {e}", cert.display())))?;
        kiln_api::client::trust_root_pem(&pem).map_err(|e| usage(format!("--tls-cert {}: {e}", cert.display())))?;
    }
    let untrusted = config.untrusted.clone();
    let tuning = &a.agent;
    let (storage_levels, memory_levels) = (a.server.storage.levels, a.server.storage.memory);
    let (handle, stop, tasks) = start_embedded_agents(config, a.agents, |cfg| {
        // Checked on `probe` above: the same flags cannot fail here.
        let _ = apply_agent_tuning(cfg, tuning);
        cfg.step_user = cfg.step_user.clone().or(sudo_user.clone());
        cfg.storage_levels = Some(storage_levels);
        cfg.memory_levels = Some(memory_levels);
    })
    .await?;
    let url = handle.url();
    let data_dir = std::path::absolute(&a.data_dir).unwrap_or_else(|_| a.data_dir.clone());
    let recorded = record(&data_dir, &url);
    kiln_cmd::outln!("Kiln is up: server {url}, {} local agent(s), data in {}", a.agents, a.data_dir.display());
    // The one command to run, for a shell of another user or machine; on
    // this one the CLI finds this `kiln up` by itself (see `profile`).
    kiln_cmd::outln!(
        "kiln login {url} --token-file {}   # or nothing: the kiln CLI of this user finds this kiln up",
        data_dir.join("admin.token").display()
    );
    kiln_cmd::outln!("export KILN_SERVER={url} KILN_TOKEN={}", handle.admin_token);
    kiln_cmd::outln!("web UI: {url}/");
    kiln_cmd::outln!("{}", untrusted_line(&untrusted, &probe));
    if let Some(line) = steps_line(&probe, sudo_user.is_some()) {
        kiln_cmd::outln!("{line}");
    }
    let _ = std::io::stdout().flush();
    ctrl_c().await;
    for f in recorded {
        let _ = std::fs::remove_file(f);
    }
    eprintln!("shutting down");
    let _ = stop.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    handle.shutdown().await?;
    Ok(exit::OK)
}

/// The lock file of a data directory `kiln up` runs on.
const LOCK_FILE: &str = profile::UP_LOCK_FILE;

/// Record this `kiln up` for the CLI to find (`profile::discover`):
/// `DATA_DIR/kiln-up.json` and an entry under `$XDG_STATE_HOME/kiln/up/`.
/// Both are valid only while the data directory's lock is held, so an
/// entry left by a killed `kiln up` is ignored (and removed) by readers.
/// Returns the files written, to remove at shutdown. Failing to record is
/// no reason not to run: the CLI then needs `kiln login` or the environment.
fn record(data_dir: &std::path::Path, url: &str) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let state = profile::UpState { pid: std::process::id(), url: url.to_string(), data_dir: data_dir.to_path_buf() };
    let json = serde_json::to_vec_pretty(&state).expect("json");
    let mut written = vec![];
    let local = data_dir.join(profile::UP_STATE_FILE);
    match std::fs::write(&local, &json) {
        Ok(()) => written.push(local),
        Err(e) => tracing::warn!("cannot write {}: {e}", local.display()),
    }
    if let Some(dir) = profile::up_registry() {
        let entry = dir.join(format!("{}.json", std::process::id()));
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| std::fs::write(&entry, &json))
        {
            Ok(()) => written.push(entry),
            Err(e) => tracing::warn!("cannot register this kiln up in {}: {e}", dir.display()),
        }
    }
    written
}

/// Hold an exclusive lock on `DATA_DIR/kiln-up.lock` (with our pid in it)
/// for as long as the returned value lives: a second `kiln up` on the same
/// directory would share the database and tokens but not the agents, and
/// run none of the jobs. The kernel drops the lock when the process dies,
/// however it dies.
fn lock_data_dir(dir: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>, kiln_cmd::Failure> {
    use std::io::{Read, Seek};
    let fail = |e: &dyn std::fmt::Display| usage(format!("--data-dir {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| fail(&e))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0).and_then(|()| lock.rewind()).map_err(|e| fail(&e))?;
            write!(lock, "{}", std::process::id()).and_then(|()| lock.flush()).map_err(|e| fail(&e))?;
            Ok(lock)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            Err(usage(format!(
                "data directory {} is in use by another kiln up (pid {}); stop it first, or pass another --data-dir",
                dir.display(),
                if pid.is_empty() { "unknown" } else { pid }
            )))
        }
        Err((_, e)) => Err(fail(&format!("cannot lock {}: {e}", path.display()))),
    }
}
