//! `kiln cancel RUN`.

use super::shared::client;
use crate::cli::RunRef;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let run = c.cancel_run(&a.run).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        kiln_cmd::outln!("run {} {}", run.id, run.status);
    }
    Ok(exit::OK)
}
