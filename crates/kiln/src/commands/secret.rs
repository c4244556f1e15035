//! `kiln secret set|list|rm`: repository secrets, and with `--env ENV` an
//! environment's (issue 46); values are read from stdin, never shown.

use super::shared::client;
use crate::cli::SecretCommand;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};

/// Whose secret: a repository's (`REPO NAME`) or an environment's (`NAME --env ENV`).
enum Owner {
    Repo(String),
    Env(String),
}

impl Owner {
    fn of(first: String, second: Option<String>, env: Option<String>) -> Result<(Owner, String), kiln_cmd::Failure> {
        match (env, second) {
            (Some(env), None) => Ok((Owner::Env(env), first)),
            (Some(env), Some(_)) => Err(usage(format!(
                "with --env {env}, give only the secret's NAME: an environment's secrets belong to no repository"
            ))),
            (None, Some(name)) => Ok((Owner::Repo(first), name)),
            (None, None) => Err(usage("give REPO NAME, or NAME --env ENV")),
        }
    }

    fn describe(&self) -> String {
        match self {
            Owner::Repo(r) => r.clone(),
            Owner::Env(e) => format!("environment {e}"),
        }
    }
}

pub(super) async fn run(cmd: SecretCommand) -> CmdResult {
    match cmd {
        SecretCommand::Set { repo, name, env, conn } => {
            let (owner, name) = Owner::of(repo, name, env)?;
            let c = client(&conn)?;
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .map_err(|e| usage(format!("cannot read the secret value from standard input: {e}")))?;
            let value = value.strip_suffix('\n').map(|v| v.strip_suffix('\r').unwrap_or(v)).unwrap_or(&value);
            if value.is_empty() {
                return Err(usage("the secret value (standard input) is empty"));
            }
            match &owner {
                Owner::Repo(repo) => c.put_secret(repo, &name, value).await?,
                Owner::Env(env) => c.put_env_secret(env, &name, value).await?,
            };
            kiln_cmd::outln!("secret {name} of {} set ({} bytes)", owner.describe(), value.len());
        }
        SecretCommand::List { repo, env, json, conn } => {
            let c = client(&conn)?;
            let (list, hint) = match (repo, env) {
                (Some(_), Some(env)) => {
                    return Err(usage(format!(
                        "give REPO or --env {env}, not both: an environment's secrets belong to no repository"
                    )));
                }
                (None, None) => return Err(usage("give REPO, or --env ENV")),
                (Some(repo), None) => (
                    c.list_secrets(&repo).await?,
                    format!("no secrets in {repo}; set one with `printf %s VALUE | kiln secret set {repo} NAME`"),
                ),
                (None, Some(env)) => (
                    c.list_env_secrets(&env).await?,
                    format!(
                        "no secrets in environment {env}; set one with `printf %s VALUE | kiln secret set NAME --env {env}`"
                    ),
                ),
            };
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("{hint}");
                return Ok(exit::OK);
            }
            for s in list {
                kiln_cmd::outln!("{}", s.name);
            }
        }
        SecretCommand::Rm { repo, name, env, conn } => {
            let (owner, name) = Owner::of(repo, name, env)?;
            let c = client(&conn)?;
            match &owner {
                Owner::Repo(repo) => c.delete_secret(repo, &name).await?,
                Owner::Env(env) => c.delete_env_secret(env, &name).await?,
            }
            kiln_cmd::outln!("secret {name} of {} deleted", owner.describe());
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
