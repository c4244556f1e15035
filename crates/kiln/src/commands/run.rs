//! `kiln run`: submit a run; with `--follow`, stream its logs and exit 0 only on success.

use super::logs::{Sink, follow_run, result_code, wait_terminal};
use super::shared::{client, print_summary, ui_url};
use crate::cli::{RunArgs, WorkflowsArgs};
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, usage};
use std::collections::BTreeMap;

pub(super) async fn run(a: RunArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let mut inputs = BTreeMap::new();
    for i in &a.inputs {
        let (k, v) = i.split_once('=').ok_or_else(|| usage(format!("--input `{i}` must be K=V")))?;
        inputs.insert(k.to_string(), v.to_string());
    }
    // Which workflows: the one asked for, else what the server selects
    // (issue 41, item 6) — several are several runs.
    let paths = match &a.workflow {
        Some(w) => vec![w.clone()],
        None => {
            let list = c.list_workflows(&a.repo, &a.commit).await?;
            if list.selected.is_empty() {
                return Err(Failure { message: pick_one(&a.repo, &list), code: exit::REFUSED });
            }
            list.selected
        }
    };
    let several = paths.len() > 1;
    if several {
        eprintln!("starting {} runs, one per workflow started by hand: {}", paths.len(), paths.join(", "));
    }
    let mut started = vec![];
    for path in &paths {
        let body = kiln_api::SubmitRun {
            commit_sha: a.commit.clone(),
            workflow_path: Some(path.clone()),
            inputs: inputs.clone(),
            event: None,
            priority: a.priority.clone(),
        };
        // One key per workflow: a resubmission finds each run again.
        let key = a.idempotency_key.as_ref().map(|k| if several { format!("{k}/{path}") } else { k.clone() });
        let resp = c.submit_run(&a.repo, &body, key.as_deref()).await?;
        print_warnings(&resp.warnings);
        started.push(resp.run_id);
    }
    let mut code = exit::OK;
    for run_id in &started {
        let url = ui_url(c.base_url(), run_id);
        if !a.follow {
            // Standard output is the run id alone (scripts read it); the page is for people.
            eprintln!("web UI: {url}");
            if a.json {
                let run = c.get_run(run_id).await?;
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
            } else {
                kiln_cmd::outln!("{run_id}");
            }
            continue;
        }
        let this = follow_accepted(&c, run_id, Some(&url), a.json, a.timestamps).await?;
        if code == exit::OK {
            code = this;
        }
    }
    Ok(code)
}

/// The answer to `kiln run` without `--workflow` when nothing is selected:
/// the workflows there are, and how to pick.
fn pick_one(repo: &str, list: &kiln_api::WorkflowList) -> String {
    let sha = &list.commit_sha;
    if list.workflows.is_empty() {
        return format!(
            "repository {repo} has no workflow at commit {sha}: Kiln runs .kiln/*.yaml (see docs/workflow.md)"
        );
    }
    let mut text = format!(
        "repository {repo} has {} workflows at commit {sha} and none is the default (.kiln/pipeline.yaml) or \
         declares `on: [manual]`; pick one with --workflow:",
        list.workflows.len()
    );
    for w in &list.workflows {
        text.push_str(&format!("\n  kiln run --repo {repo} --workflow {}", w.path));
    }
    text
}

/// `kiln workflows REPO [--commit REV] [--json]`.
pub(super) async fn workflows(a: WorkflowsArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let list = c.list_workflows(&a.repo, &a.commit).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
        return Ok(exit::OK);
    }
    if list.workflows.is_empty() {
        eprintln!(
            "no workflow at commit {}; Kiln runs `.kiln/*.yaml`: add one (see docs/workflow.md), check it with `kiln validate`",
            list.commit_sha
        );
        return Ok(exit::OK);
    }
    let width = list.workflows.iter().map(|w| w.path.len()).max().unwrap_or(0).max(8);
    kiln_cmd::outln!("{:width$}  {:6}  {:7}  ON", "WORKFLOW", "MANUAL", "KILN RUN");
    for w in &list.workflows {
        let on = match (&w.error, w.triggers.is_empty()) {
            (Some(e), _) => format!("invalid: {}", e.lines().next().unwrap_or_default()),
            (None, true) => "(no on:, started by hand)".to_string(),
            (None, false) => w.triggers.join(", "),
        };
        let selected = if list.selected.contains(&w.path) { "yes" } else { "" };
        let manual = if w.manual { "yes" } else { "no" };
        kiln_cmd::outln!("{:width$}  {manual:6}  {selected:7}  {on}", w.path);
    }
    kiln_cmd::outln!("commit {}", list.commit_sha);
    Ok(exit::OK)
}

/// What the server accepted the run despite (a job whose `runs-on` labels
/// no registered agent has), on stderr.
pub(super) fn print_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("{}", crate::term::for_stderr(&format!("warning: {w}")));
    }
}

/// `--follow` of a run just accepted (`kiln run`, `kiln retry`, `kiln
/// exec`): its logs until it ends, then its summary (or, with `json`, the
/// run object alone on standard output); exits with the run's result.
/// `url`: the run's page, when there is a web UI to see it in.
pub(super) async fn follow_accepted(
    c: &kiln_api::Client,
    run_id: &str,
    url: Option<&str>,
    json: bool,
    timestamps: bool,
) -> CmdResult {
    // `run ID accepted` stays a line of its own: scripts read it.
    eprintln!("run {run_id} accepted");
    if let Some(url) = url {
        eprintln!("web UI: {url}");
    }
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
