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
        "{:<14} {:<6} {:<10} {:<14} {:<12} {:<16} {:<8} {:<12} {:<11} {:<16} TITLE",
        "RUN",
        "#",
        "STATUS",
        "REPO",
        "WORKFLOW",
        "BRANCH/PR",
        "COMMIT",
        "EVENT",
        "CREATED",
        "ACTOR"
    );
    for r in list {
        let short = r.short_id.clone().unwrap_or_else(|| r.id.clone());
        let line = format!(
            "{:<14} {:<6} {:<10} {:<14} {:<12} {:<16} {:<8} {:<12} {:<11} {:<16} {}",
            short,
            if r.number > 0 { format!("#{}", r.number) } else { "-".into() },
            r.status,
            r.repo,
            if r.workflow.is_empty() { "-" } else { &r.workflow },
            ref_text(r.git_ref.as_deref()),
            r.commit_sha.get(..7).unwrap_or(&r.commit_sha),
            r.event,
            when(r.created_at_ms),
            r.actor.as_deref().unwrap_or("-"),
            r.commit_title.as_deref().map(|t| clip(t, 60)).unwrap_or_else(|| "-".into()),
        );
        kiln_cmd::outln!("{}", for_stdout(&line));
    }
    Ok(exit::OK)
}

/// A run's ref as a list shows it: `main` for `refs/heads/main`, `PR #12`
/// for a pull request's `refs/pull/12/…`, a tag or other ref as it is.
pub(super) fn ref_text(git_ref: Option<&str>) -> String {
    let Some(r) = git_ref else { return "-".into() };
    if let Some(b) = r.strip_prefix("refs/heads/") {
        return b.to_string();
    }
    if let Some(n) = r.strip_prefix("refs/pull/").and_then(|p| p.split('/').next()) {
        return format!("PR #{n}");
    }
    r.to_string()
}

/// `text` cut to `max` characters (`…` where it was cut).
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn refs_are_shown_as_branches_and_pull_requests() {
        assert_eq!(super::ref_text(Some("refs/heads/main")), "main");
        assert_eq!(super::ref_text(Some("refs/pull/12/head")), "PR #12");
        assert_eq!(super::ref_text(Some("refs/tags/v1")), "refs/tags/v1");
        assert_eq!(super::ref_text(None), "-");
        assert_eq!(super::clip("abcdef", 3), "abc…");
        assert_eq!(super::clip("abc", 3), "abc");
    }
}
