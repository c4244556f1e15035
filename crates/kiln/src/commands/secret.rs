//! `kiln secret set|list|rm`: repository secrets (values are read from stdin, never shown).

use super::shared::client;
use crate::cli::SecretCommand;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};

pub(super) async fn run(cmd: SecretCommand) -> CmdResult {
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
            kiln_cmd::outln!("secret {name} of {repo} set ({} bytes)", value.len());
        }
        SecretCommand::List { repo, json, conn } => {
            let c = client(&conn)?;
            let list = c.list_secrets(&repo).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("no secrets in {repo}; set one with `printf %s VALUE | kiln secret set {repo} NAME`");
                return Ok(exit::OK);
            }
            for s in list {
                kiln_cmd::outln!("{}", s.name);
            }
        }
        SecretCommand::Rm { repo, name, conn } => {
            client(&conn)?.delete_secret(&repo, &name).await?;
            kiln_cmd::outln!("secret {name} of {repo} deleted");
        }
        SecretCommand::RotateKey { data_dir, database_url, secrets_key_file } => {
            let mut config = kiln_server::ServerConfig::new(data_dir, String::new());
            config.database_url = database_url;
            config.secrets_key_file = secrets_key_file;
            let (n, id) = kiln_server::rotate_secrets_key(&config)
                .await
                .map_err(|e| kiln_cmd::Failure { code: exit::REFUSED, message: format!("{e:#}") })?;
            kiln_cmd::outln!("{n} secrets sealed under the new key {id} ({})", config.secrets_key_path().display());
        }
    }
    Ok(exit::OK)
}
