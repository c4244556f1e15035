//! `kiln status RUN`: a run's status and jobs.

use super::shared::{client, job_line, now_ms, ui_url};
use crate::cli::StatusArgs;
use crate::term::for_stdout;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: StatusArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let run = c.get_run(&a.run).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        // Names and messages come from the server (and from repositories):
        // sanitized on a terminal.
        let out = |s: String| kiln_cmd::outln!("{}", for_stdout(&s));
        if run.number > 0 {
            out(format!("run {}#{}  {}  {}", run.repo, run.number, run.status, run.id));
        } else {
            out(format!("run {}  {}", run.id, run.status));
        }
        out(format!("repo {}  commit {}  workflow {}", run.repo, run.commit_sha, run.workflow_path));
        if let Some(title) = &run.commit_title {
            out(format!("title {title}"));
        }
        let by = run.actor.as_deref().map(|a| format!("  by {a}")).unwrap_or_default();
        out(format!("{} {}{by}", run.event, super::runs::ref_text(run.git_ref.as_deref())));
        if let Some(pr) = run.pull_request.as_ref().filter(|p| !p.title.is_empty()) {
            out(format!("pull request #{} {}", pr.number, pr.title));
        }
        if let Some(parent) = &run.parent_run_id {
            out(format!("retry of {parent}"));
        }
        out(format!("web UI {}", ui_url(c.base_url(), &run.id)));
        if let Some(m) = &run.message {
            out(format!("message {m}"));
        }
        let now = now_ms();
        for j in &run.jobs {
            out(job_line(j, now));
        }
    }
    Ok(exit::OK)
}
