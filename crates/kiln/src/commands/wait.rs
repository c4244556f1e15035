//! `kiln wait RUN`: block until the run ends; exit with its result code.
//! On a terminal, a progress line on stderr says where the run stands
//! (`3/7 jobs done, 2 running, 1 waiting: …`), redrawn in place.

use super::logs::{PROGRESS_POLL, progress_line, result_code, wait_terminal};
use super::shared::client;
use crate::cli::RunRef;
use crate::term::{for_stderr, for_stdout};
use kiln_cmd::CmdResult;
use std::io::{IsTerminal, Write};

pub(super) async fn run(a: RunRef) -> CmdResult {
    let c = client(&a.conn)?;
    let run = if std::io::stderr().is_terminal() {
        let progress = async {
            loop {
                if let Ok(run) = c.get_run(&a.run).await {
                    let line = format!("{}#{}: {}", run.repo, run.number, progress_line(&run));
                    // Redrawn in place: carriage return, clear the line.
                    let _ = write!(std::io::stderr().lock(), "\r\x1b[2K{}", for_stderr(&line));
                }
                tokio::time::sleep(PROGRESS_POLL).await;
            }
        };
        let run = tokio::select! {
            run = wait_terminal(&c, &a.run) => run,
            () = progress => unreachable!("the progress line never ends"),
        };
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        run?
    } else {
        wait_terminal(&c, &a.run).await?
    };
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else {
        kiln_cmd::outln!("{}", for_stdout(&format!("run {} {}", run.id, run.status)));
    }
    Ok(result_code(&run))
}
