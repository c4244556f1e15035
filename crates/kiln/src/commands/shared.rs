//! What the commands share: the API client from `--server`/`--token`, and
//! waiting for SIGINT/SIGTERM. (The failure type and the embedded
//! deployment are in kiln-cmd, shared with kiln-bench.)

use crate::cli::{AgentTuning, Conn, ServerTuning, WebArgs};
use kiln_api::Client;
use kiln_cmd::{Failure, usage};

pub(super) fn client(conn: &Conn) -> Result<Client, Failure> {
    kiln_api::client::check_server_urls(&conn.server).map_err(usage)?;
    let token = api_token(conn, std::env::var("KILN_TOKEN").ok())?;
    Ok(Client::new(&conn.server, &token))
}

/// The API token from `KILN_TOKEN` or `--token-file`; never from argv.
pub(super) fn api_token(conn: &Conn, env: Option<String>) -> Result<String, Failure> {
    let source = TokenSource { what: "API", env: "KILN_TOKEN", file: "admin.token" };
    read_token(&source, conn.token.is_some(), conn.token_file.as_deref(), env)
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
    use super::api_token;
    use crate::cli::Conn;

    fn conn(token: Option<&str>, file: Option<&std::path::Path>) -> Conn {
        Conn { server: "http://127.0.0.1:7070".into(), token: token.map(Into::into), token_file: file.map(Into::into) }
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
    if let Some(d) = t.dispatch_sweep {
        config.dispatch_sweep = d;
    }
    config.gc_grace = t.artifact_gc_grace;
    config.gc_interval = t.gc_interval;
    config.retry_base = t.retry_base;
    config.log_archive_after = t.log_archive_after;
    config.log_archive_interval =
        t.log_archive_after.clamp(std::time::Duration::from_millis(200), std::time::Duration::from_secs(10));
    config.registries.insecure = t.insecure_registries.clone();
    config.resource_interval = t.resource_interval;
    config.job_timeout = t.job_timeout;
    config.max_job_timeout = t.max_job_timeout;
    config.artifact_expire_in = t.artifact_expire_in;
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
    cfg.upload_rate_limit = t.upload_rate_limit;
    cfg.log_limit = t.log_limit;
    cfg.log_rate_limit = t.log_rate_limit;
    cfg.log_buffer = t.log_buffer;
    cfg.log_spool_limit = t.log_spool_limit;
    cfg.kill_grace = Some(t.kill_grace);
    cfg.cache_timeout = Some(t.cache_timeout);
    cfg.cache_local_budget = t.cache_local_budget;
    if t.executor == "container" {
        let mut settings = kiln_agent::ContainerSettings::new(t.engine.clone());
        settings.default_image = t.default_image.clone();
        settings.network = t.container_network.parse().map_err(usage)?;
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
