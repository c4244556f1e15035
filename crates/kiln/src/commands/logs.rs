//! `kiln logs RUN [JOB] [--follow]`, and the log feed reader `kiln run --follow` shares:
//! SSE events resumed with Last-Event-ID, so nothing is lost or repeated across reconnects.

use super::shared::{client, now_ms, rfc3339_ms};
use crate::cli::LogsArgs;
use crate::term::{Sanitizer, for_stderr, for_stdout};
use base64::Engine;
use futures::StreamExt;
use kiln_api::logs::event;
use kiln_api::{Client, exit};
use kiln_cmd::{CmdResult, Failure, usage};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

pub(super) async fn run(a: LogsArgs) -> CmdResult {
    let c = client(&a.conn)?;
    if a.follow {
        follow_run(&c, &a.run, a.job.as_deref(), Sink::Stdout, a.timestamps).await?;
        // The exit code is the result of what was followed: the job's with
        // JOB, else the run's (which may still be ending: wait for it).
        return Ok(match a.job.as_deref() {
            Some(only) => {
                let run = c.get_run(&a.run).await?;
                let ok = select_jobs(&run, Some(only))?.iter().all(|j| j.status.is_success());
                if ok { exit::OK } else { exit::RUN_FAILED }
            }
            None => result_code(&wait_terminal(&c, &a.run).await?),
        });
    }
    let run = c.get_run(&a.run).await?;
    let jobs = select_jobs(&run, a.job.as_deref())?;
    for j in jobs {
        kiln_cmd::outln!("{}", for_stdout(&format!("── {} ──", j.name)));
        stream_job(&c, &j.id, Sink::Stdout, j.status.is_terminal(), a.timestamps).await?;
    }
    Ok(exit::OK)
}

/// The jobs of `run` named (or with the id) `only`, or all of them; a matrix
/// job's base name (`test`) names all its expansions (`test (py=3.10)`, …),
/// in the run's order. A name no job has is an error listing the names there are.
pub(super) fn select_jobs<'r>(run: &'r kiln_api::Run, only: Option<&str>) -> Result<Vec<&'r kiln_api::Job>, Failure> {
    let named = |j: &kiln_api::Job, o: &str| j.name == o || j.id == o || (o.len() >= 8 && j.id.starts_with(o));
    let expansion =
        |j: &kiln_api::Job, o: &str| j.name.strip_prefix(o).is_some_and(|r| r.starts_with(" (") && r.ends_with(')'));
    let mut jobs: Vec<_> = run.jobs.iter().filter(|j| only.is_none_or(|o| named(j, o))).collect();
    if let Some(o) = only
        && jobs.is_empty()
    {
        jobs = run.jobs.iter().filter(|j| expansion(j, o)).collect();
    }
    if let Some(o) = only
        && jobs.is_empty()
    {
        let names: Vec<&str> = run.jobs.iter().map(|j| j.name.as_str()).collect();
        return Err(usage(for_stderr(&format!(
            "run {} has no job `{o}`; its jobs are: {}",
            run.id,
            if names.is_empty() { "(none)".to_string() } else { names.join(", ") }
        ))));
    }
    Ok(jobs)
}

/// Exit code of a finished run: 0 on success, 1 otherwise.
pub(super) fn result_code(run: &kiln_api::Run) -> i32 {
    if run.status.is_success() { exit::OK } else { exit::RUN_FAILED }
}

/// The run once it has reached a terminal status (polled every half second).
pub(super) async fn wait_terminal(c: &Client, run_id: &str) -> Result<kiln_api::Run, Failure> {
    let mut failures = 0;
    loop {
        match c.get_run(run_id).await {
            Ok(run) if run.status.is_terminal() => return Ok(run),
            Ok(_) => failures = 0,
            Err(e) if e.is_retryable() && failures < 30 => failures += 1,
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where streamed log bytes go.
#[derive(Clone, Copy)]
pub(super) enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    /// Whether this sink is a terminal (then log bytes are sanitized: see `term`).
    fn is_terminal(self) -> bool {
        use std::io::IsTerminal;
        match self {
            Sink::Stdout => std::io::stdout().is_terminal(),
            Sink::Stderr => std::io::stderr().is_terminal(),
        }
    }

    fn write(self, bytes: &[u8]) {
        // Raw bytes: the terminal decodes UTF-8 across chunk boundaries.
        // A closed standard output (`kiln logs RUN | head -1`) ends the
        // command quietly (see `kiln_cmd::write_stdout`).
        match self {
            Sink::Stdout => kiln_cmd::write_stdout(bytes),
            Sink::Stderr => {
                let _ = std::io::stderr().lock().write_all(bytes);
            }
        }
    }
}

/// Stream logs of the run's jobs until each ends; after each job, a line
/// with its result, duration and attempt (on stderr, like the run's
/// summary, so stdout stays the log). One job: its log as it is, under a
/// `── name ──` header. Several: all at once, interleaved line by line, each
/// line prefixed with its job's name (`build | …`, as `docker compose up`
/// does), so parallel jobs are seen as they run. With a terminal on
/// stderr, a progress line (`3/7 jobs done, 2 running, …`) each time the
/// counts change.
pub(super) async fn follow_run(
    c: &Client,
    run_id: &str,
    only: Option<&str>,
    sink: Sink,
    timestamps: bool,
) -> Result<(), Failure> {
    let run = c.get_run(run_id).await?;
    let jobs: Vec<_> = select_jobs(&run, only)?.into_iter().map(|j| (j.id.clone(), j.name.clone())).collect();
    let progress = async {
        use std::io::IsTerminal;
        if only.is_some() || !std::io::stderr().is_terminal() {
            return std::future::pending().await;
        }
        let mut shown = String::new();
        loop {
            tokio::time::sleep(PROGRESS_POLL).await;
            if let Ok(run) = c.get_run(run_id).await {
                let line = progress_line(&run);
                if line != shown {
                    eprintln!("{}", for_stderr(&format!("── {line}")));
                    shown = line;
                }
            }
        }
    };
    let follow = async {
        if let [(id, name)] = jobs.as_slice() {
            let header = format!("── {name} ──\n");
            sink.write(if sink.is_terminal() { crate::term::clean(&header) } else { header }.as_bytes());
            return follow_job(c, run_id, id, name, sink, timestamps, None).await;
        }
        let width = jobs.iter().map(|(_, n)| n.chars().count()).max().unwrap_or(0).min(PREFIX_WIDTH);
        // Every job's stream at once (a log replays from its start, so one
        // that waits for a slot loses nothing).
        let slots = tokio::sync::Semaphore::new(MAX_STREAMS);
        let each = jobs.iter().map(|(id, name)| {
            let prefix = format!("{:<width$} | ", name.chars().take(PREFIX_WIDTH).collect::<String>());
            let slots = &slots;
            async move {
                let _slot = slots.acquire().await.expect("semaphore open");
                follow_job(c, run_id, id, name, sink, timestamps, Some(prefix)).await
            }
        });
        futures::future::try_join_all(each).await.map(|_| ())
    };
    tokio::select! {
        done = follow => done,
        () = progress => Ok(()),
    }
}

/// At most this many job logs streamed at once by `--follow`.
const MAX_STREAMS: usize = 32;
/// Job names in `--follow` prefixes are cut to this many characters.
const PREFIX_WIDTH: usize = 32;
/// How often `--follow` and `kiln wait` refresh the progress line.
pub(super) const PROGRESS_POLL: Duration = Duration::from_secs(1);

/// One job of [`follow_run`]: its log (until its `end`), what it waits for
/// meanwhile, then its outcome line on stderr.
async fn follow_job(
    c: &Client,
    run_id: &str,
    id: &str,
    name: &str,
    sink: Sink,
    timestamps: bool,
    prefix: Option<String>,
) -> Result<(), Failure> {
    // The log is silent until the job starts: meanwhile, say what it
    // waits for (issue 41, item 3).
    tokio::select! {
        streamed = stream_job_as(c, id, sink, true, timestamps, prefix) => streamed?,
        () = watch_waiting(c, run_id, id, name) => {}
    }
    if let Ok(run) = c.get_run(run_id).await
        && let Some(j) = run.jobs.iter().find(|j| j.id == id)
    {
        eprintln!("{}", for_stderr(&format!("── {name}: {}", super::shared::job_outcome(j, now_ms()))));
    }
    Ok(())
}

/// Where a run stands, in one line: `3/7 jobs done, 2 running, 1 waiting:
/// no connected agent has labels {gpu: a100}, 1 blocked on needs` (the
/// first queued job's reason, as the job's `waiting` says it).
pub(super) fn progress_line(run: &kiln_api::Run) -> String {
    use kiln_api::JobStatus;
    let count = |s: JobStatus| run.jobs.iter().filter(|j| j.status == s).count();
    let done = run.jobs.iter().filter(|j| j.status.is_terminal()).count();
    let mut line = format!("{done}/{} jobs done, {} running", run.jobs.len(), count(JobStatus::Running));
    let queued: Vec<_> = run.jobs.iter().filter(|j| j.status == JobStatus::Ready).collect();
    if !queued.is_empty() {
        line += &format!(", {} waiting", queued.len());
        // `waiting: no connected agent …` / `waiting for concurrency group …`
        if let Some(why) = queued.iter().find_map(|j| j.waiting.as_deref()) {
            line += why.strip_prefix("waiting").unwrap_or(why);
        }
    }
    let blocked = count(JobStatus::Pending);
    if blocked > 0 {
        line += &format!(", {blocked} blocked on needs");
    }
    line
}

/// How often [`watch_waiting`] asks while the job waits, and after it
/// started (a lost attempt puts it back in the queue).
const WAITING_POLL: Duration = Duration::from_secs(1);
const STARTED_POLL: Duration = Duration::from_secs(5);

/// While the job has not started, print what it waits for (`── build:
/// waiting: no connected agent has labels {os: ubuntu-latest}; agents: …`,
/// the job's `waiting`) on stderr: a line each time that changes, not one
/// per poll. Never returns by itself (the log stream ends the follow).
async fn watch_waiting(c: &Client, run_id: &str, job_id: &str, name: &str) {
    let mut shown: Option<String> = None;
    let mut every = WAITING_POLL;
    loop {
        tokio::time::sleep(every).await;
        let Ok(run) = c.get_run(run_id).await else { continue };
        let Some(j) = run.jobs.iter().find(|j| j.id == job_id) else { continue };
        if j.status.is_terminal() {
            return std::future::pending().await;
        }
        every = if j.waiting.is_some() { WAITING_POLL } else { STARTED_POLL };
        if j.waiting != shown {
            if let Some(w) = &j.waiting {
                eprintln!("{}", for_stderr(&format!("── {name}: {w}")));
            }
            shown = j.waiting.clone();
        }
    }
}

/// The whole lines of `pending` + `bytes`, each after `prefix`; what
/// follows the last newline stays in `pending`.
fn prefix_lines(prefix: &str, pending: &mut Vec<u8>, bytes: &[u8]) -> Vec<u8> {
    pending.extend_from_slice(bytes);
    let Some(end) = pending.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
    let rest = pending.split_off(end + 1);
    let whole = std::mem::replace(pending, rest);
    let mut out = Vec::with_capacity(whole.len() + 16);
    for line in whole.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(line);
    }
    out
}

/// Prefixes each line of a stream with the time of its bytes
/// (`--timestamps`): RFC 3339 in UTC, e.g. `2026-12-01T17:30:00.123Z `.
#[derive(Default)]
struct Stamper {
    /// The next byte starts a line.
    mid_line: bool,
}

impl Stamper {
    fn feed(&mut self, at_ms: i64, bytes: &[u8], out: &mut Vec<u8>) {
        for &b in bytes {
            if !self.mid_line {
                out.extend_from_slice(rfc3339_ms(at_ms).as_bytes());
                out.push(b' ');
                self.mid_line = true;
            }
            out.push(b);
            if b == b'\n' {
                self.mid_line = false;
            }
        }
    }
}

/// Without --follow, against a server that does not end the stream by
/// itself: stop reading after this long.
const SNAPSHOT_CAP: Duration = Duration::from_secs(60);

/// Print a job's log events. Follows until the `end` event when `follow`,
/// reconnecting with Last-Event-ID so nothing is lost or repeated; else
/// prints what the server has now and returns, even while the job still
/// prints (`?follow=false` ends the server's stream once caught up; an
/// older server's stream is cut after a quiet spell or [`SNAPSHOT_CAP`]).
async fn stream_job(c: &Client, job: &str, sink: Sink, follow: bool, timestamps: bool) -> Result<(), Failure> {
    stream_job_as(c, job, sink, follow, timestamps, None).await
}

/// [`stream_job`] with each line prefixed by `prefix` (`build | `): whole
/// lines only, so jobs streamed at once interleave line by line; a last
/// line without its newline is ended when the log ends.
async fn stream_job_as(
    c: &Client,
    job: &str,
    sink: Sink,
    follow: bool,
    timestamps: bool,
    prefix: Option<String>,
) -> Result<(), Failure> {
    let mut lines: Option<HashMap<(i64, String), Vec<u8>>> = prefix.is_some().then(HashMap::new);
    let result = stream_job_inner(c, job, sink, follow, timestamps, prefix.as_deref(), &mut lines).await;
    if let (Some(p), Some(map)) = (prefix.as_deref(), lines) {
        for (_, rest) in map.into_iter().filter(|(_, b)| !b.is_empty()) {
            let mut out = p.as_bytes().to_vec();
            out.extend_from_slice(&rest);
            out.push(b'\n');
            sink.write(&out);
        }
    }
    result
}

async fn stream_job_inner(
    c: &Client,
    job: &str,
    sink: Sink,
    follow: bool,
    timestamps: bool,
    prefix: Option<&str>,
    lines: &mut Option<HashMap<(i64, String), Vec<u8>>>,
) -> Result<(), Failure> {
    let b64 = base64::engine::general_purpose::STANDARD;
    // On a terminal, one sanitizer per stream of each attempt (a sequence
    // may be split across chunks, never across streams).
    let mut sanitizers: Option<HashMap<(i64, String), Sanitizer>> = sink.is_terminal().then(HashMap::new);
    // With --timestamps, one line state per stream of each attempt.
    let mut stampers: Option<HashMap<(i64, String), Stamper>> = timestamps.then(HashMap::new);
    let mut last: Option<String> = None;
    let mut failures = 0;
    let cap = tokio::time::Instant::now() + SNAPSHOT_CAP;
    loop {
        let stream = match c.log_events_with(job, last.as_deref(), follow).await {
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
                let quiet = Duration::from_secs(2).min(cap.saturating_duration_since(tokio::time::Instant::now()));
                match tokio::time::timeout(quiet, stream.next()).await {
                    Ok(n) => n,
                    Err(_) => return Ok(()),
                }
            };
            match next {
                // Without --follow the server ends the stream once caught up.
                None if !follow => return Ok(()),
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
                                let key = (le.epoch, le.stream.clone());
                                let bytes = match &mut sanitizers {
                                    None => bytes,
                                    Some(map) => {
                                        let mut out = Vec::with_capacity(bytes.len());
                                        map.entry(key.clone()).or_default().feed(&bytes, &mut out);
                                        out
                                    }
                                };
                                let bytes = match &mut stampers {
                                    None => bytes,
                                    Some(map) => {
                                        // The server's commit time; from an older
                                        // server, the time it arrived here.
                                        let at = le.at_ms.unwrap_or_else(now_ms);
                                        let mut out = Vec::with_capacity(bytes.len() + 32);
                                        map.entry(key.clone()).or_default().feed(at, &bytes, &mut out);
                                        out
                                    }
                                };
                                match (prefix, lines.as_mut()) {
                                    (Some(p), Some(map)) => {
                                        let out = prefix_lines(p, map.entry(key).or_default(), &bytes);
                                        if !out.is_empty() {
                                            sink.write(&out);
                                        }
                                    }
                                    _ => sink.write(&bytes),
                                }
                            }
                        }
                        event::END => return Ok(()),
                        event::GAP => {
                            if let Ok(g) = serde_json::from_str::<kiln_api::LogGap>(&ev.data) {
                                eprintln!(
                                    "kiln: ⚠ log gap in attempt {}: {}; its log has no clean end",
                                    g.epoch,
                                    for_stderr(&g.reason)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixed_lines_are_whole_and_the_rest_waits_for_its_newline() {
        let mut pending = Vec::new();
        assert_eq!(prefix_lines("a | ", &mut pending, b"one\ntw"), b"a | one\n");
        assert_eq!(pending, b"tw");
        assert_eq!(prefix_lines("a | ", &mut pending, b"o"), b"");
        assert_eq!(prefix_lines("a | ", &mut pending, b"\nthree\nfour\n"), b"a | two\na | three\na | four\n");
        assert!(pending.is_empty());
    }

    fn job(name: &str, status: kiln_api::JobStatus, waiting: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "id": name, "name": name, "index": 0, "status": status.to_string(), "current_epoch": 0,
            "image_digest": null, "needs": [], "attempts": [], "artifacts": [], "cache": null,
            "waiting": waiting, "started_at_ms": null, "finished_at_ms": null,
        })
    }

    #[test]
    fn the_progress_line_counts_jobs_and_says_why_the_first_queued_one_waits() {
        use kiln_api::JobStatus::*;
        let run = |jobs: Vec<serde_json::Value>| -> kiln_api::Run {
            serde_json::from_value(serde_json::json!({
                "id": "r", "repo": "hello", "number": 3, "status": "running", "ref": "refs/heads/main",
                "commit_sha": "0".repeat(40), "workflow_path": ".kiln/pipeline.yaml", "workflow_hash": "",
                "event": "manual", "trust": "trusted", "inputs": {}, "parent_run_id": null, "cancel_version": 0,
                "created_at_ms": 0, "finished_at_ms": null, "jobs": jobs,
            }))
            .expect("a run")
        };
        let r = run(vec![
            job("lint", Success, None),
            job("build", Failed, None),
            job("skip", Skipped, None),
            job("test", Running, None),
            job("gpu", Ready, Some("waiting: no connected agent has labels {gpu: a100}")),
            job("other", Ready, None),
            job("deploy", Pending, Some("waiting for needs: test (running)")),
        ]);
        assert_eq!(
            progress_line(&r),
            "3/7 jobs done, 1 running, 2 waiting: no connected agent has labels {gpu: a100}, 1 blocked on needs"
        );
        let r = run(vec![job("a", Running, None), job("b", Ready, Some("waiting for concurrency group deploy"))]);
        assert_eq!(progress_line(&r), "0/2 jobs done, 1 running, 1 waiting for concurrency group deploy");
        assert_eq!(progress_line(&run(vec![job("a", Success, None)])), "1/1 jobs done, 0 running");
    }
}
