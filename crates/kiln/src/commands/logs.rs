//! `kiln logs RUN [JOB] [--follow]`, and the log feed reader `kiln run --follow` shares:
//! SSE events resumed with Last-Event-ID, so nothing is lost or repeated across reconnects.

use super::shared::client;
use crate::cli::LogsArgs;
use base64::Engine;
use futures::StreamExt;
use kiln_api::logs::event;
use kiln_api::{Client, exit};
use kiln_cmd::{CmdResult, Failure, usage};
use std::io::Write;
use std::time::Duration;

pub(super) async fn run(a: LogsArgs) -> CmdResult {
    let c = client(&a.conn)?;
    if a.follow {
        follow_run(&c, &a.run, a.job.as_deref(), Sink::Stdout).await?;
        return Ok(exit::OK);
    }
    let run = c.get_run(&a.run).await?;
    for j in run.jobs.iter().filter(|j| a.job.as_deref().is_none_or(|o| j.name == o || j.id == o)) {
        println!("── {} ──", j.name);
        stream_job(&c, &j.id, Sink::Stdout, j.status.is_terminal()).await?;
    }
    Ok(exit::OK)
}

/// Where streamed log bytes go.
#[derive(Clone, Copy)]
pub(super) enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    fn write(self, bytes: &[u8]) {
        // Raw bytes: the terminal decodes UTF-8 across chunk boundaries.
        let _ = match self {
            Sink::Stdout => std::io::stdout().lock().write_all(bytes).and_then(|_| std::io::stdout().flush()),
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }
}

/// Stream logs of the run's jobs in order until each ends.
pub(super) async fn follow_run(c: &Client, run_id: &str, only: Option<&str>, sink: Sink) -> Result<(), Failure> {
    let run = c.get_run(run_id).await?;
    let jobs: Vec<_> = run
        .jobs
        .iter()
        .filter(|j| only.is_none_or(|o| j.name == o || j.id == o))
        .map(|j| (j.id.clone(), j.name.clone()))
        .collect();
    if jobs.is_empty() {
        return Err(usage(format!("run {run_id} has no job `{}`", only.unwrap_or(""))));
    }
    for (id, name) in jobs {
        sink.write(format!("── {name} ──\n").as_bytes());
        stream_job(c, &id, sink, true).await?;
    }
    Ok(())
}

/// Print a job's log events. Follows until the `end` event when `follow`,
/// reconnecting with Last-Event-ID so nothing is lost or repeated.
async fn stream_job(c: &Client, job: &str, sink: Sink, follow: bool) -> Result<(), Failure> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut last: Option<String> = None;
    let mut failures = 0;
    loop {
        let stream = match c.log_events(job, last.as_deref()).await {
            Ok(s) => s,
            Err(e) if e.is_retryable() && failures < 30 => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        tokio::pin!(stream);
        loop {
            let next = if follow {
                stream.next().await
            } else {
                match tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
                    Ok(n) => n,
                    Err(_) => return Ok(()),
                }
            };
            match next {
                None => break,
                Some(Err(_)) => break,
                Some(Ok(ev)) => {
                    if !ev.id.is_empty() {
                        last = Some(ev.id.clone());
                    }
                    match ev.event.as_str() {
                        event::CHUNK => {
                            if let Ok(le) = serde_json::from_str::<kiln_api::LogEvent>(&ev.data)
                                && let Ok(bytes) = b64.decode(le.data.as_bytes())
                            {
                                sink.write(&bytes);
                            }
                        }
                        event::END => return Ok(()),
                        event::GAP => {
                            if let Ok(g) = serde_json::from_str::<kiln_api::LogGap>(&ev.data) {
                                eprintln!(
                                    "kiln: ⚠ log gap in attempt {}: {}; its log has no clean end",
                                    g.epoch, g.reason
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        failures += 1;
        if failures > 30 {
            return Err(Failure { message: "log stream kept dropping".into(), code: exit::UNAVAILABLE });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
