//! `kiln notify add|ls|rm|log`: signed webhooks on run end (issue 42).

use super::shared::{client, when};
use crate::cli::NotifyCommand;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};

pub(super) async fn run(cmd: NotifyCommand) -> CmdResult {
    match cmd {
        NotifyCommand::Add { repo, url, secret_file, secret, on, format, conn } => {
            if secret.is_some() {
                return Err(usage(
                    "--secret is refused: a secret on the command line is visible to every local user \
                     (/proc/PID/cmdline); pass --secret-file FILE (or - for standard input)",
                ));
            }
            // What can be checked here is, before the secret is read.
            let events = kiln_core::notify::parse_events(&on).map_err(|e| usage(format!("--on: {e}")))?;
            let lower = url.trim().to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) {
                return Err(usage(format!(
                    "--url `{url}`: a notification URL is http:// or https:// (e.g. https://hooks.example.com/kiln)"
                )));
            }
            let Some(secret_file) = secret_file else {
                return Err(usage(
                    "--secret-file FILE is required: the receiver checks each body's signature with that secret \
                     (make one with `openssl rand -hex 32 > notify.secret`)",
                ));
            };
            let secret = super::shared::read_secret("--secret-file", &secret_file)?;
            let c = client(&conn)?;
            let body = kiln_api::CreateNotification { url, secret, events, format: Some(format) };
            let n = c.create_notification(&repo, &body).await?;
            kiln_cmd::outln!(
                "notification {} of {}: {} on {} ({} format)",
                n.id,
                n.repo,
                n.url,
                n.events.join(","),
                n.format
            );
        }
        NotifyCommand::Ls { repo, json, conn } => {
            let list = client(&conn)?.list_notifications(&repo).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!(
                    "no notifications for {repo}; add one with `kiln notify add {repo} --url URL --secret-file FILE --on failure,fixed`"
                );
                return Ok(exit::OK);
            }
            for n in list {
                kiln_cmd::outln!("{}  {:<6} {:<24} {}", n.id, n.format, n.events.join(","), crate::term::clean(&n.url));
            }
        }
        NotifyCommand::Rm { repo, id, conn } => {
            let n = client(&conn)?.delete_notification(&repo, &id).await?;
            kiln_cmd::outln!("notification {} of {} removed ({})", n.id, n.repo, n.url);
        }
        NotifyCommand::Log { repo, limit, json, conn } => {
            let list = client(&conn)?.notification_deliveries(&repo, limit).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!("no notification deliveries for {repo} yet (one is made when a run ends)");
                return Ok(exit::OK);
            }
            kiln_cmd::outln!(
                "{:<14} {:<10} {:<10} {:>8}  {:<24} {}",
                "RUN",
                "EVENT",
                "STATUS",
                "ATTEMPTS",
                "LAST",
                "DELIVERED"
            );
            for d in list {
                let last = match (d.last_status_code, &d.last_error) {
                    (_, Some(e)) => crate::term::clean(e),
                    (Some(code), None) => format!("HTTP {code}"),
                    (None, None) => "-".into(),
                };
                let delivered = d.delivered_at_ms.map(when).unwrap_or_else(|| "-".into());
                kiln_cmd::outln!(
                    "{:<14} {:<10} {:<10} {:>8}  {:<24} {}",
                    d.run,
                    d.event,
                    d.status,
                    d.attempts,
                    last,
                    delivered
                );
            }
        }
    }
    Ok(exit::OK)
}
