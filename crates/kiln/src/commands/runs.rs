//! `kiln runs`: runs newest first, filtered by repository, status, branch and event.

use super::shared::{client, when};
use crate::cli::RunsArgs;
use crate::term::for_stdout;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RunsArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let list = c
        .find_runs(a.repo.as_deref(), a.status.as_deref(), a.branch.as_deref(), a.event.as_deref(), Some(a.limit))
        .await?
        .runs;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
        return Ok(exit::OK);
    }
    if list.is_empty() {
        let filtered = a.repo.is_some() || a.status.is_some() || a.branch.is_some() || a.event.is_some();
        eprintln!(
            "{}",
            if filtered {
                "no runs match these filters; `kiln runs` without them lists every run"
            } else {
                "no runs yet; start one with `kiln run --repo REPO` (`kiln repo list` shows the repositories)"
            }
        );
        return Ok(exit::OK);
    }
    kiln_cmd::outln!(
        "{:<14} {:<10} {:<16} {:<20} {:<8} {:<12} CREATED",
        "RUN",
        "STATUS",
        "REPO",
        "REF",
        "COMMIT",
        "EVENT"
    );
    for r in list {
        let short = r.short_id.clone().unwrap_or_else(|| r.id.clone());
        let line = format!(
            "{:<14} {:<10} {:<16} {:<20} {:<8} {:<12} {}",
            short,
            r.status,
            r.repo,
            r.git_ref.as_deref().unwrap_or("-"),
            r.commit_sha.get(..7).unwrap_or(&r.commit_sha),
            r.event,
            when(r.created_at_ms)
        );
        kiln_cmd::outln!("{}", for_stdout(&line));
    }
    Ok(exit::OK)
}
