//! `kiln run`: submit a run; with `--follow`, stream its logs and exit 0 only on success.

use super::logs::{Sink, follow_run, result_code, wait_terminal};
use super::shared::{client, print_summary, ui_url};
use crate::cli::RunArgs;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};
use std::collections::BTreeMap;

pub(super) async fn run(a: RunArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let mut inputs = BTreeMap::new();
    for i in &a.inputs {
        let (k, v) = i.split_once('=').ok_or_else(|| usage(format!("--input `{i}` must be K=V")))?;
        inputs.insert(k.to_string(), v.to_string());
    }
    let body = kiln_api::SubmitRun {
        commit_sha: a.commit.clone(),
        workflow_path: Some(a.workflow.clone()),
        inputs,
        event: None,
    };
    let resp = c.submit_run(&a.repo, &body, a.idempotency_key.as_deref()).await?;
    print_warnings(&resp.warnings);
    let url = ui_url(c.base_url(), &resp.run_id);
    if !a.follow {
        // Standard output is the run id alone (scripts read it); the page is for people.
        eprintln!("web UI: {url}");
        if a.json {
            let run = c.get_run(&resp.run_id).await?;
            kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
        } else {
            kiln_cmd::outln!("{}", resp.run_id);
        }
        return Ok(exit::OK);
    }
    follow_accepted(&c, &resp.run_id, &url, a.json, a.timestamps).await
}

/// What the server accepted the run despite (a job whose `runs-on` labels
/// no registered agent has), on stderr.
pub(super) fn print_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("{}", crate::term::for_stderr(&format!("warning: {w}")));
    }
}

/// `--follow` of a run just accepted (`kiln run`, `kiln retry`): its logs
/// until it ends, then its summary (or, with `json`, the run object alone on
/// standard output); exits with the run's result.
pub(super) async fn follow_accepted(
    c: &kiln_api::Client,
    run_id: &str,
    url: &str,
    json: bool,
    timestamps: bool,
) -> CmdResult {
    // `run ID accepted` stays a line of its own: scripts read it.
    eprintln!("run {run_id} accepted");
    eprintln!("web UI: {url}");
    // With --json, stdout carries only the final run object; logs go to stderr.
    let sink = if json { Sink::Stderr } else { Sink::Stdout };
    follow_run(c, run_id, None, sink, timestamps).await?;
    let run = wait_terminal(c, run_id).await?;
    if json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        print_summary(&run);
    }
    Ok(result_code(&run))
}
