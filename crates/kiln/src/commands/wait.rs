//! `kiln wait RUN`: block until the run ends; exit with its result code.

use super::logs::{result_code, wait_terminal};
use super::shared::client;
use crate::cli::RunRef;
use crate::term::for_stdout;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let run = wait_terminal(&c, &a.run).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        kiln_cmd::outln!("{}", for_stdout(&format!("run {} {}", run.id, run.status)));
    }
    Ok(result_code(&run))
}
