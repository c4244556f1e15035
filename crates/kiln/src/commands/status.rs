//! `kiln status RUN`: a run's status and jobs.

use super::shared::client;
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
        out(format!("run {}  {}", run.id, run.status));
        out(format!("repo {}  commit {}  workflow {}", run.repo, run.commit_sha, run.workflow_path));
        if let Some(m) = &run.message {
            out(format!("message {m}"));
        }
        for j in &run.jobs {
            let runner = j.attempts.last().map(|a| a.runner.as_str()).unwrap_or("-");
            let msg = j.message.as_deref().map(|m| format!("  {m}")).unwrap_or_default();
            out(format!("  {:<24} {:<10} epoch {:<3} {runner}{msg}", j.name, j.status, j.current_epoch));
        }
    }
    Ok(exit::OK)
}
