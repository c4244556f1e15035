//! What the commands share: the API client from `--server`/`--token`, and
//! waiting for SIGINT/SIGTERM. (The failure type and the embedded
//! deployment are in kiln-cmd, shared with kiln-bench.)

use crate::cli::{Conn, WebArgs};
use kiln_api::Client;
use kiln_cmd::{Failure, usage};

pub(super) fn client(conn: &Conn) -> Result<Client, Failure> {
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
