//! `kiln top`: the eligible queue by `runs-on` label set, the agents and
//! the running jobs, from one `GET /v1/overview` per refresh (spec 000 §15:
//! queue depth alone does not say why jobs wait; the queue's label sets
//! beside the agents' labels and free slots do).
//!
//! On a terminal the view is redrawn every `--interval` until Ctrl-C; with
//! `--once`, `--json` or a standard output that is not a terminal, one
//! snapshot is printed and the command exits (a closed pipe ends it quietly,
//! through `kiln_cmd::write_stdout`).

use super::shared::{client, duration_text, when};
use crate::cli::TopArgs;
use crate::term::for_stdout;
use kiln_api::{Overview, exit};
use kiln_cmd::CmdResult;
use std::fmt::Write as _;
use std::io::IsTerminal;

/// Clear the screen and home the cursor.
const CLEAR: &str = "\x1b[H\x1b[2J";

pub(super) async fn run(a: TopArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let live = !a.once && !a.json && std::io::stdout().is_terminal();
    let first = c.overview().await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&first).expect("json"));
        return Ok(exit::OK);
    }
    if !live {
        kiln_cmd::write_stdout(for_stdout(&render(&first, c.base_url())).as_bytes());
        return Ok(exit::OK);
    }
    let mut last = first;
    let mut error: Option<String> = None;
    loop {
        let mut screen = String::from(CLEAR);
        screen.push_str(&for_stdout(&render(&last, c.base_url())));
        if let Some(e) = &error {
            let _ = writeln!(screen, "\n(showing {}: {})", when(last.at_ms), for_stdout(e));
        }
        kiln_cmd::write_stdout(screen.as_bytes());
        tokio::select! {
            // `--interval 0s` must not turn into a busy loop against the server.
            _ = tokio::time::sleep(a.interval.max(std::time::Duration::from_millis(100))) => {}
            _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
        }
        match c.overview().await {
            Ok(o) => (last, error) = (o, None),
            Err(e) => error = Some(format!("cannot refresh: {e}")),
        }
    }
}

/// One snapshot as plain text: a header, then the queue, agents and
/// running jobs (each section says when it is empty).
fn render(o: &Overview, server: &str) -> String {
    let mut s = String::new();
    let count = |k: &str| o.jobs.get(k).copied().unwrap_or(0);
    let _ = writeln!(
        s,
        "kiln top  {server}  {}   jobs: {} pending, {} ready, {} running",
        when(o.at_ms),
        count("pending"),
        count("ready"),
        count("running")
    );

    let _ = writeln!(s, "\nQUEUE (eligible jobs by runs-on labels)");
    if o.queue.is_empty() {
        let _ = writeln!(s, "  no job is waiting for an agent");
    } else {
        let _ = writeln!(s, "  {:<40} {:>8}  OLDEST", "LABELS", "ELIGIBLE");
        for q in &o.queue {
            let _ = writeln!(s, "  {:<40} {:>8}  {}", labels(&q.labels), q.eligible, duration_text(q.oldest_age_ms));
        }
    }

    let _ = writeln!(s, "\nAGENTS");
    if o.agents.is_empty() {
        let _ = writeln!(s, "  no agent is registered");
    } else {
        let _ = writeln!(
            s,
            "  {:<20} {:<32} {:>6}  {:<9} {:<8} LAST SEEN",
            "NAME", "LABELS", "SLOTS", "CONNECTED", "DRAINING"
        );
        for ag in &o.agents {
            let _ = writeln!(
                s,
                "  {:<20} {:<32} {:>6}  {:<9} {:<8} {} ago",
                ag.name,
                labels(&ag.labels),
                format!("{}/{}", ag.running_jobs, ag.max_jobs),
                if ag.connected { "yes" } else { "no" },
                if ag.draining { "yes" } else { "no" },
                duration_text(o.at_ms - ag.last_seen_at_ms)
            );
        }
    }

    let _ = writeln!(s, "\nRUNNING");
    if o.running.is_empty() {
        let _ = writeln!(s, "  no job is running");
    } else {
        let _ = writeln!(
            s,
            "  {:<15} {:<16} {:<20} {:<20} {:<12} {:>8}  ACTIVITY",
            "RUN", "REPO", "JOB", "AGENT", "PHASE", "ELAPSED"
        );
        for r in &o.running {
            let activity: String = r.activity.as_deref().unwrap_or("-").chars().take(60).collect();
            let _ = writeln!(
                s,
                "  {:<15} {:<16} {:<20} {:<20} {:<12} {:>8}  {}",
                // Through the UUIDv7's millisecond timestamp: 8 characters
                // are the same for every run of about a minute.
                r.run_id.get(..13).unwrap_or(&r.run_id),
                r.repo,
                r.job,
                r.agent,
                r.phase.as_deref().unwrap_or("-"),
                duration_text(r.elapsed_ms),
                activity
            );
        }
    }
    s
}

/// `os=linux,size=large`; `any` for no labels (as `/metrics` names the class).
fn labels(l: &std::collections::BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return "any".into();
    }
    l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_api::{AgentInfo, QueueEntry, RunningJob};
    use std::collections::BTreeMap;

    #[test]
    fn a_snapshot_shows_the_queue_agents_and_running_jobs() {
        let at = 1_796_146_200_000;
        let o = Overview {
            at_ms: at,
            jobs: BTreeMap::from([("pending".into(), 1), ("ready".into(), 2), ("running".into(), 1)]),
            queue: vec![QueueEntry {
                labels: BTreeMap::from([("os".into(), "ubuntu-latest".into())]),
                eligible: 2,
                oldest_age_ms: 65_000,
            }],
            agents: vec![AgentInfo {
                id: "a1".into(),
                name: "local-1".into(),
                pool: "default".into(),
                labels: BTreeMap::from([("os".into(), "linux".into())]),
                max_jobs: 2,
                created_at_ms: at - 60_000,
                last_seen_at_ms: at - 1_500,
                connected: true,
                running_jobs: 1,
                jobs: vec![],
                version: None,
                draining: false,
                executor: None,
                takes_untrusted: None,
            }],
            running: vec![RunningJob {
                run_id: "0190aaaa-bbbb-7ccc-8000-000000000000".into(),
                repo: "hello".into(),
                job_id: "j1".into(),
                job: "build".into(),
                epoch: 1,
                agent_id: "a1".into(),
                agent: "local-1".into(),
                started_at_ms: at - 12_300,
                elapsed_ms: 12_300,
                phase: Some("command".into()),
                activity: Some("▶ step 1/2: make".into()),
            }],
        };
        let text = render(&o, "http://127.0.0.1:7070");
        let want = "\
kiln top  http://127.0.0.1:7070  2026-12-01 17:30:00Z   jobs: 1 pending, 2 ready, 1 running

QUEUE (eligible jobs by runs-on labels)
  LABELS                                   ELIGIBLE  OLDEST
  os=ubuntu-latest                                2  1m05s

AGENTS
  NAME                 LABELS                            SLOTS  CONNECTED DRAINING LAST SEEN
  local-1              os=linux                            1/2  yes       no       1.5s ago

RUNNING
  RUN             REPO             JOB                  AGENT                PHASE         ELAPSED  ACTIVITY
  0190aaaa-bbbb   hello            build                local-1              command         12.3s  ▶ step 1/2: make
";
        assert_eq!(text, want);
        let empty = render(&Overview { queue: vec![], agents: vec![], running: vec![], ..o }, "u");
        assert!(empty.contains("no job is waiting for an agent"), "{empty}");
        assert!(empty.contains("no agent is registered") && empty.contains("no job is running"), "{empty}");
    }
}
