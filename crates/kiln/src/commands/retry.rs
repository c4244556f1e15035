//! `kiln retry RUN [--failed] [--follow]`: a new run with the same pinned
//! definition; with `--failed`, only the failed jobs and their descendants
//! run again (spec 000 §9, retry from job).

use super::logs::{Sink, follow_run, result_code, wait_terminal};
use super::shared::{client, print_summary, ui_url};
use crate::cli::RetryArgs;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RetryArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let resp = if a.failed {
        c.retry_run_with(&a.run, &kiln_api::RetryRun { failed: true }).await?
    } else {
        c.retry_run(&a.run).await?
    };
    let url = ui_url(c.base_url(), &resp.run_id);
    if !a.follow {
        eprintln!("web UI: {url}");
        if a.json {
            kiln_cmd::outln!("{}", serde_json::json!({ "run_id": resp.run_id }));
        } else {
            kiln_cmd::outln!("{}", resp.run_id);
        }
        return Ok(exit::OK);
    }
    // `run ID accepted` stays a line of its own: scripts read it.
    eprintln!("run {} accepted", resp.run_id);
    eprintln!("web UI: {url}");
    let sink = if a.json { Sink::Stderr } else { Sink::Stdout };
    follow_run(&c, &resp.run_id, None, sink, a.timestamps).await?;
    let run = wait_terminal(&c, &resp.run_id).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        print_summary(&run);
    }
    Ok(result_code(&run))
}
