//! `kiln retry RUN [--failed | --job NAME] [--follow]`: a new run with the
//! same pinned definition; with `--failed`, only the failed jobs and their
//! descendants run again; with `--job`, that job and its descendants
//! (spec 000 §9, retry from job).

use super::shared::{client, ui_url};
use crate::cli::RetryArgs;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RetryArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let resp = if let Some(job) = &a.job {
        c.retry_job(&a.run, job).await?
    } else if a.failed {
        c.retry_run_with(&a.run, &kiln_api::RetryRun { failed: true }).await?
    } else {
        c.retry_run(&a.run).await?
    };
    super::run::print_warnings(&resp.warnings);
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
    super::run::follow_accepted(&c, &resp.run_id, Some(&url), a.json, a.timestamps).await
}
