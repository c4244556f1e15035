//! What the commands share: the API client from `--server`/`--token`, and
//! waiting for SIGINT/SIGTERM. (The failure type and the embedded
//! deployment are in kiln-cmd, shared with kiln-bench.)

use crate::cli::Conn;
use kiln_api::Client;
use kiln_cmd::{Failure, usage};

pub(super) fn client(conn: &Conn) -> Result<Client, Failure> {
    let token = conn.token.clone().ok_or_else(|| {
        usage("no API token: set KILN_TOKEN or pass --token (the server writes DATA_DIR/admin.token)")
    })?;
    Ok(Client::new(&conn.server, &token))
}

pub(super) async fn ctrl_c() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
