//! `kiln retry RUN`: a new run with the same pinned definition.

use super::shared::client;
use crate::cli::RunRef;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let resp = c.retry_run(&a.run).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::json!({ "run_id": resp.run_id }));
    } else {
        kiln_cmd::outln!("{}", resp.run_id);
    }
    Ok(exit::OK)
}
