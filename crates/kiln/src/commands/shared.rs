//! What the commands share: the API client from `--server`/`--token-file`
//! (or the environment, the profile, a local `kiln up`: see `profile`), and
//! waiting for SIGINT/SIGTERM. (The failure type and the embedded
//! deployment are in kiln-cmd, shared with kiln-bench.)

use super::profile;
use crate::cli::{AgentTuning, Conn, ServerTuning, WebArgs};
use crate::term::for_stderr;
use kiln_api::Client;
use kiln_cmd::{Failure, usage};

pub(super) fn client(conn: &Conn) -> Result<Client, Failure> {
    let r = resolve_conn(conn)?;
    kiln_api::client::check_server_urls(&r.server).map_err(usage)?;
    let Some(token) = r.token else {
        return Err(usage(format!(
            "no API token for {server}: run `kiln login {server}` (it reads the token from standard input or \
             --token-file FILE), set KILN_TOKEN, or pass --token-file FILE (the server writes DATA_DIR/admin.token)",
            server = r.server
        )));
    };
    Ok(Client::new(&r.server, &token))
}

/// The server and token of a client command: flags, then the environment,
/// then the profile, then a running local `kiln up` (see `profile`).
pub(super) fn resolve_conn(conn: &Conn) -> Result<profile::Resolved, Failure> {
    let token = given_token(conn, std::env::var("KILN_TOKEN").ok())?;
    let given = profile::Given { server: conn.server.clone(), token, context: conn.context.clone() };
    let config = match profile::config_path() {
        Ok(p) => p,
        // Without HOME there is no profile: what was given must do.
        Err(_) if given.server.is_some() && given.token.is_some() => std::path::PathBuf::new(),
        Err(e) => return Err(e),
    };
    profile::resolve(given, &config, profile::discover)
}

/// The API token given by `--token-file` or `KILN_TOKEN` (trimmed), if
/// any; never from argv.
pub(super) fn given_token(conn: &Conn, env: Option<String>) -> Result<Option<String>, Failure> {
    let source = TokenSource { what: "API", env: "KILN_TOKEN", file: "admin.token" };
    if conn.token_file.is_none() && env.is_none() && conn.token.is_none() {
        return Ok(None);
    }
    read_token(&source, conn.token.is_some(), conn.token_file.as_deref(), env).map(Some)
}

/// Where a command's token may come from (the messages name them).
pub(super) struct TokenSource {
    /// `API`, `agent`.
    pub what: &'static str,
    /// The environment variable, e.g. `KILN_TOKEN`.
    pub env: &'static str,
    /// The server's file under DATA_DIR holding such a token.
    pub file: &'static str,
}

/// A token from `--token-file` (first) or the environment, trimmed. A
/// `--token` argument is refused: every local user can read a command line
/// (/proc/PID/cmdline).
pub(super) fn read_token(
    source: &TokenSource,
    in_argv: bool,
    file: Option<&std::path::Path>,
    env: Option<String>,
) -> Result<String, Failure> {
    let TokenSource { what, env: var, file: server_file } = source;
    if in_argv {
        return Err(usage(format!(
            "--token is refused: a token on the command line is visible to every local user (/proc/PID/cmdline); \
             set {var} or pass --token-file FILE (e.g. the server's DATA_DIR/{server_file})"
        )));
    }
    let token = match (file, env) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map_err(|e| usage(format!("--token-file {}: {e}", path.display())))?
            .trim()
            .to_string(),
        (None, Some(t)) => t.trim().to_string(),
        (None, None) => {
            return Err(usage(format!(
                "no {what} token: set {var} or pass --token-file FILE (the server writes DATA_DIR/{server_file})"
            )));
        }
    };
    if token.is_empty() {
        return Err(usage(format!("the {what} token is empty ({var} or --token-file)")));
    }
    Ok(token)
}

#[cfg(test)]
mod token_tests {
    use crate::cli::Conn;

    fn conn(token: Option<&str>, file: Option<&std::path::Path>) -> Conn {
        Conn { server: None, context: None, token: token.map(Into::into), token_file: file.map(Into::into) }
    }

    fn api_token(conn: &Conn, env: Option<String>) -> Result<String, kiln_cmd::Failure> {
        super::given_token(conn, env)?.ok_or_else(|| kiln_cmd::usage("no token: KILN_TOKEN"))
    }

    #[test]
    fn the_api_token_comes_from_the_environment_or_a_file_never_argv() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("admin.token");
        std::fs::write(&f, "kiln_file\n").unwrap();
        let ok = |r: Result<String, kiln_cmd::Failure>| r.map_err(|e| e.message).unwrap();
        assert_eq!(ok(api_token(&conn(None, None), Some("kiln_env".into()))), "kiln_env");
        assert_eq!(ok(api_token(&conn(None, Some(&f)), Some("kiln_env".into()))), "kiln_file");
        let Err(e) = api_token(&conn(Some("kiln_argv"), None), Some("kiln_env".into())) else { panic!("refused") };
        assert!(e.message.contains("--token is refused"), "{}", e.message);
        assert!(api_token(&conn(None, None), None).is_err_and(|e| e.message.contains("KILN_TOKEN")));
        assert!(api_token(&conn(None, Some(&dir.path().join("nope"))), None).is_err());
        assert!(api_token(&conn(None, None), Some("  ".into())).is_err());
    }
}

/// Apply what `kiln server` and `kiln up` share (object store, secrets key,
/// grace periods, garbage collection, log archiving, registries).
pub(super) fn apply_server_tuning(config: &mut kiln_server::ServerConfig, t: &ServerTuning) -> Result<(), Failure> {
    let object_store = t.object_store.clone().unwrap_or_default();
    if !object_store.is_empty()
        && let Err(e) = kiln_blob::BlobStore::open_url(&object_store, &config.data_dir.join("objects"))
    {
        return Err(usage(format!("--object-store: {e}")));
    }
    config.object_store = object_store;
    config.secrets_key_file = t.secrets_key_file.clone();
    config.loss_grace = t.loss_grace;
    config.agent_expiry = t.agent_expiry;
    config.quarantine_max_percent = t.quarantine_max_percent;
    if t.aging_step.is_zero() {
        return Err(usage("--aging-step: must be more than 0"));
    }
    config.aging_step = t.aging_step;
    config.max_queued_jobs = t.max_queued_jobs;
    if let Some(d) = t.dispatch_sweep {
        config.dispatch_sweep = d;
    }
    config.dispatch_offer_shared = t.dispatch_offer != "every";
    config.gc_grace = t.artifact_gc_grace;
    config.gc_interval = t.gc_interval;
    config.retry_base = t.retry_base;
    config.delivery_retry_max = t.delivery_retry_max;
    config.delivery_alert_after = t.delivery_alert_after;
    config.notify_retry_base = t.notify_retry_base;
    config.notify_max_attempts = t.notify_max_attempts;
    config.log_archive_after = t.log_archive_after;
    config.log_archive_interval =
        t.log_archive_after.clamp(std::time::Duration::from_millis(200), std::time::Duration::from_secs(10));
    config.registries.insecure = t.insecure_registries.clone();
    config.build_registry = t.build_registry.clone();
    config.resource_interval = t.resource_interval;
    config.degradation.storage_pct = t.storage.levels;
    config.degradation.memory_bytes = t.storage.memory;
    config.job_timeout = t.job_timeout;
    config.queue_timeout = t.queue_timeout;
    config.max_job_timeout = t.max_job_timeout;
    config.run_timeout = t.run_timeout;
    config.artifact_expire_in = t.artifact_expire_in;
    let mut pools: Vec<String> = vec![];
    for p in &t.untrusted_pools {
        let p = p.trim();
        if p.is_empty() || p.len() > 100 || !p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(usage(format!(
                "--untrusted-pools: `{p}` is not a pool name (1-100 characters of [A-Za-z0-9._-])"
            )));
        }
        if !pools.iter().any(|q| q == p) {
            pools.push(p.to_string());
        }
    }
    config.untrusted = kiln_core::claim::UntrustedPolicy { pools, host_executor: t.untrusted_on_host_agents };
    for entry in &t.registry_auth {
        let parsed = entry.split_once('=').and_then(|(h, c)| Some((h, c.split_once(':')?)));
        let Some((host, (user, password))) = parsed else {
            return Err(usage("--registry-auth must be HOST=USER:PASSWORD"));
        };
        config.registries.credentials.insert(host.trim().to_string(), (user.to_string(), password.to_string()));
    }
    Ok(())
}

/// Apply what `kiln agent` and `kiln up`'s local agents share (labels,
/// capacity, executor, limits) to an agent configuration.
pub(super) fn apply_agent_tuning(cfg: &mut kiln_agent::AgentConfig, t: &AgentTuning) -> Result<(), Failure> {
    for l in &t.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| usage(format!("label `{l}` must be key=value")))?;
        if k.trim().is_empty() {
            return Err(usage(format!("label `{l}` has no key")));
        }
        cfg.labels.insert(k.trim().into(), v.trim().into());
    }
    if t.max_jobs == 0 || t.max_jobs > 256 {
        return Err(usage("--max-jobs must be 1-256"));
    }
    cfg.max_jobs = t.max_jobs;
    cfg.step_user = t.step_user.clone();
    cfg.step_nice = t.step_nice;
    let lookup = |k: &str| std::env::var(k).ok();
    for f in &t.env_file {
        cfg.step_env.add_file(f, &lookup).map_err(usage)?;
    }
    for e in &t.step_env {
        cfg.step_env.add_arg(e, &lookup).map_err(usage)?;
    }
    for d in &t.step_path {
        cfg.step_env.add_path(d).map_err(usage)?;
    }
    cfg.user_toolchains = !t.no_user_toolchains;
    cfg.upload_rate_limit = t.upload_rate_limit;
    cfg.log_limit = t.log_limit;
    cfg.log_rate_limit = t.log_rate_limit;
    cfg.log_buffer = t.log_buffer;
    cfg.log_spool_limit = t.log_spool_limit;
    cfg.kill_grace = Some(t.kill_grace);
    cfg.cache_timeout = Some(t.cache_timeout);
    cfg.prepare_timeout = Some(t.prepare_timeout);
    cfg.finalize_timeout = Some(t.finalize_timeout);
    let limit = |d: std::time::Duration| (!d.is_zero()).then_some(d);
    cfg.op_timeouts = kiln_agent::OpTimeouts {
        git: limit(t.git_timeout),
        pull: limit(t.pull_timeout),
        build: limit(t.build_timeout),
        upload: limit(t.upload_timeout),
    };
    cfg.cache_local_budget = t.cache_local_budget;
    if t.executor == "container" {
        let mut settings = kiln_agent::ContainerSettings::new(t.engine.clone());
        settings.default_image = t.default_image.clone();
        settings.network = t.container_network.parse().map_err(usage)?;
        settings.warm_containers = t.warm_containers;
        cfg.executor = kiln_agent::ExecutorKind::Container(settings);
    } else {
        // Host jobs' `services:` run in containers of this engine.
        cfg.services_engine = Some(t.engine.clone());
    }
    Ok(())
}

/// Apply `--public-url`, `--tls-cert/--tls-key` and the connection limits.
pub(super) fn apply_web(config: &mut kiln_server::ServerConfig, web: &WebArgs) -> Result<(), Failure> {
    if let Some(u) = &web.public_url {
        let rest = u.strip_prefix("https://").or_else(|| u.strip_prefix("http://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/') || r.contains(['?', '#', ' ', '@'])) {
            return Err(usage(format!(
                "--public-url {u}: expected http(s)://HOST[:PORT][/PATH] without a query, fragment or credentials"
            )));
        }
        config.public_url = Some(u.trim_end_matches('/').to_string());
    }
    if let Some(u) = &web.prometheus_url {
        let rest = u.strip_prefix("https://").or_else(|| u.strip_prefix("http://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/') || r.contains(['?', '#', ' '])) {
            return Err(usage(format!(
                "--prometheus-url {u}: expected http(s)://HOST[:PORT][/PATH] without a query or fragment"
            )));
        }
        config.prometheus_url = Some(u.trim_end_matches('/').to_string());
    }
    if let (Some(cert), Some(key)) = (&web.tls_cert, &web.tls_key) {
        for (flag, f) in [("--tls-cert", cert), ("--tls-key", key)] {
            if !f.is_file() {
                return Err(usage(format!("{flag} {}: no such file", f.display())));
            }
        }
        config.tls = Some(kiln_server::TlsFiles { cert: cert.clone(), key: key.clone() });
    }
    config.header_read_timeout = web.header_read_timeout;
    if web.idle_timeout <= std::time::Duration::from_secs(60) {
        return Err(usage("--idle-timeout must be above 60s: an agent's claim long-poll waits up to a minute"));
    }
    config.idle_timeout = web.idle_timeout;
    if let Some(n) = web.max_connections {
        if n == 0 {
            return Err(usage("--max-connections must be at least 1"));
        }
        config.max_connections = n;
    }
    if let Some(n) = web.reserved_connections {
        if n >= config.max_connections {
            return Err(usage(format!(
                "--reserved-connections {n} must be less than --max-connections ({}): the rest serve everyone else",
                config.max_connections
            )));
        }
        config.reserved_connections = Some(n);
    }
    config.body_read_timeout = web.body_read_timeout;
    let least = 25 << 20; // kiln_forge::MAX_BODY_BYTES: a webhook delivery must fit
    if web.unauthenticated_body_budget < least || web.unauthenticated_body_budget > u32::MAX as u64 {
        return Err(usage(format!(
            "--unauthenticated-body-budget must be between 25MiB (the largest webhook delivery) and 4GiB; got {} bytes",
            web.unauthenticated_body_budget
        )));
    }
    config.unauthenticated_body_budget = web.unauthenticated_body_budget as usize;
    Ok(())
}

/// Refuse plain `http://` to a server that is not on loopback unless
/// `insecure`: the agent's token, jobs' secrets and artifacts would cross
/// the network in clear.
pub(super) fn check_transport(servers: &str, insecure: bool) -> Result<(), Failure> {
    kiln_api::client::check_server_urls(servers).map_err(usage)?;
    for url in servers.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let Some(rest) = url.strip_prefix("http://") else { continue };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let loopback =
            host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback && !insecure {
            return Err(usage(format!(
                "refusing plain http:// to {url}: it is not a loopback address, so the agent token, job \
                 secrets and artifacts would cross the network unencrypted. Use https:// (kiln server \
                 --tls-cert/--tls-key), or pass --insecure to accept that"
            )));
        }
    }
    Ok(())
}

/// Milliseconds since the epoch as `2026-12-01 17:30:00Z` (UTC).
pub(super) fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Milliseconds since the epoch as RFC 3339 in UTC with milliseconds,
/// `2026-12-01T17:30:00.123Z` (what `--timestamps` prefixes lines with).
pub(super) fn rfc3339_ms(ms: i64) -> String {
    let day = when(ms);
    let (date, time) = day.trim_end_matches('Z').split_once(' ').unwrap_or((&day, ""));
    format!("{date}T{time}.{:03}Z", ms.rem_euclid(1000))
}

/// Now, in milliseconds since the epoch (this machine's clock).
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A duration for people: `850ms`, `12.3s`, `2m05s`, `1h02m`.
pub(super) fn duration_text(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// How long a job took (from the API's `started_at_ms`/`finished_at_ms`),
/// or has been running (`running 12.3s`, by this machine's clock); `-`
/// for a job that never started.
pub(super) fn job_duration(j: &kiln_api::Job, now: i64) -> String {
    match (j.started_at_ms, j.finished_at_ms) {
        (Some(s), Some(f)) => duration_text(f - s),
        (Some(s), None) => format!("{}…", duration_text(now - s)),
        _ => "-".into(),
    }
}

/// Which attempt a job is on, in words: `attempt 2 on local-2 (agent
/// local-1 lost)`; earlier attempts say how they ended. Empty for a job
/// that never had one. (Users read attempts; epochs are the protocol's.)
pub(super) fn attempt_text(j: &kiln_api::Job) -> String {
    use kiln_api::AttemptOutcome as O;
    let Some(last) = j.attempts.last() else { return String::new() };
    let earlier: Vec<String> = j.attempts[..j.attempts.len() - 1]
        .iter()
        .map(|a| match &a.outcome {
            O::Lost => format!("agent {} lost", a.runner),
            O::Failed => match a.exit_code {
                Some(c) => format!("attempt {} failed with exit code {c} on {}", a.epoch, a.runner),
                None => format!("attempt {} failed on {}", a.epoch, a.runner),
            },
            other => format!("attempt {} {other} on {}", a.epoch, a.runner),
        })
        .collect();
    let mut text = format!("attempt {} on {}", last.epoch, last.runner);
    if !earlier.is_empty() {
        text.push_str(&format!(" ({})", earlier.join("; ")));
    }
    text
}

/// One job of a run for people: name, status, duration, attempt, message:
/// `build   success   12.3s  attempt 2 on local-2 (agent local-1 lost)`.
pub(super) fn job_line(j: &kiln_api::Job, now: i64) -> String {
    let attempt = attempt_text(j);
    // What it waits for, unless its message already says so.
    let notes: Vec<&str> = match (j.message.as_deref(), j.waiting.as_deref()) {
        (Some(m), Some(w)) if !m.contains(w) => vec![m, w],
        (m, w) => m.or(w).into_iter().collect(),
    };
    let msg = if notes.is_empty() { String::new() } else { format!("  {}", notes.join("; ")) };
    format!("  {:<24} {:<10} {:>8}  {attempt}{msg}", j.name, j.status.to_string(), job_duration(j, now))
        .trim_end()
        .to_string()
}

/// A finished run's summary on stderr: its result and duration, then a line per job.
pub(super) fn print_summary(run: &kiln_api::Run) {
    let took = run.finished_at_ms.map(|f| format!(" in {}", duration_text(f - run.created_at_ms))).unwrap_or_default();
    eprintln!("run {} {}{took}", run.id, run.status);
    let now = now_ms();
    for j in &run.jobs {
        eprintln!("{}", for_stderr(&job_line(j, now)));
    }
}

/// How a job ended, after its log in `run --follow`/`logs --follow`:
/// `success in 1.2s (attempt 2 on local-2 (agent local-1 lost))`.
pub(super) fn job_outcome(j: &kiln_api::Job, now: i64) -> String {
    let took = match job_duration(j, now).as_str() {
        "-" => String::new(),
        d => format!(" in {}", d.trim_end_matches('…')),
    };
    let notes: Vec<String> =
        [attempt_text(j), j.message.clone().unwrap_or_default()].into_iter().filter(|s| !s.is_empty()).collect();
    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
    format!("{}{took}{notes}", j.status)
}

/// The run's page in the web UI (the UI routes by the URL's fragment).
pub(super) fn ui_url(server: &str, run_id: &str) -> String {
    format!("{}/#/runs/{run_id}", server.split(',').next().unwrap_or(server).trim().trim_end_matches('/'))
}

pub(super) async fn ctrl_c() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_and_times_for_people() {
        use super::{duration_text, rfc3339_ms};
        assert_eq!(duration_text(850), "850ms");
        assert_eq!(duration_text(12_345), "12.3s");
        assert_eq!(duration_text(125_000), "2m05s");
        assert_eq!(duration_text(3_720_000), "1h02m");
        assert_eq!(rfc3339_ms(1_764_610_200_123), "2025-12-01T17:30:00.123Z");
    }

    #[test]
    fn plain_http_is_refused_off_loopback_only() {
        let ok = |u: &str| super::check_transport(u, false).is_ok();
        for u in [
            "http://127.0.0.1:7070",
            "http://localhost:1",
            "http://[::1]:7070/x",
            "https://10.0.0.5:7070",
            "http://127.8.9.1",
        ] {
            assert!(ok(u), "{u}");
        }
        for u in [
            "http://10.0.0.5:7070",
            "http://ci.example.com",
            "http://[2001:db8::1]:80",
            "http://127.0.0.1:1,http://10.0.0.1:2",
            "http://localhost@10.0.0.1/",
        ] {
            assert!(!ok(u), "{u}");
            assert!(super::check_transport(u, true).is_ok(), "{u} with --insecure");
        }
    }
}

/// The run a command names (issue 42), as the server resolves it:
/// `REPO#NUMBER`, an id or a prefix as given; a bare `NUMBER` (or `#NUMBER`)
/// with `--repo REPO` is `REPO#NUMBER`. `--repo` with anything but a number
/// is refused rather than ignored.
pub(super) fn run_ref(run: &str, repo: Option<&str>) -> Result<String, Failure> {
    let run = run.trim();
    let Some(repo) = repo else { return Ok(run.to_string()) };
    let number = run.strip_prefix('#').unwrap_or(run);
    if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(format!("{repo}#{number}"));
    }
    Err(usage(format!(
        "--repo {repo} goes with a run number (`kiln status 123 --repo {repo}`); `{run}` is not one: \
         name the run as REPO#NUMBER, by id, or by a unique id prefix without --repo"
    )))
}

/// A secret from a file (`-`: standard input), without its final newline.
pub(super) fn read_secret(flag: &str, path: &std::path::Path) -> Result<String, Failure> {
    let text = if path == std::path::Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| usage(format!("{flag}: cannot read standard input: {e}")))?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|e| usage(format!("{flag} {}: {e}", path.display())))?
    };
    let value = text.trim_end_matches(['\n', '\r']).to_string();
    if value.is_empty() {
        return Err(usage(format!("{flag}: the secret is empty")));
    }
    Ok(value)
}
