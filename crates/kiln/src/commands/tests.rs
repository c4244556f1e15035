//! `kiln tests`: a run's test reports, a test's history, quarantine, and
//! timing-based shards (issue 43).

use super::shared::{client, duration_text, run_ref, when};
use crate::cli::{TestsArgs, TestsCommand};
use crate::term::for_stdout;
use kiln_api::exit;
use kiln_cmd::{CmdResult, usage};
use std::collections::HashMap;
use std::io::BufRead;

pub(super) async fn run(a: TestsArgs) -> CmdResult {
    match a.command {
        Some(cmd) => sub(cmd).await,
        None => {
            let Some(run) = a.run.as_deref() else {
                return Err(usage(
                    "name a run (`kiln tests hello#12`) or a subcommand: history, quarantine, unquarantine, ls, split \
                     (see `kiln tests --help`)",
                ));
            };
            let run = run_ref(run, a.repo.as_deref())?;
            run_tests(&run, a.failed, a.json, &a.conn).await
        }
    }
}

fn out(s: String) {
    kiln_cmd::outln!("{}", for_stdout(&s));
}

/// `12 tests: 3 failed, 2 flaky, 1 skipped`.
pub(crate) fn summary_text(s: &kiln_api::TestSummary) -> String {
    let mut parts = Vec::new();
    for (n, what) in [
        (s.passed, "passed"),
        (s.failed, "failed"),
        (s.errored, "errors"),
        (s.flaky, "flaky"),
        (s.quarantined, "quarantined"),
        (s.skipped, "skipped"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    format!("{} tests: {}", s.total, if parts.is_empty() { "none ran".into() } else { parts.join(", ") })
}

async fn run_tests(run: &str, failed: bool, json: bool, conn: &crate::cli::Conn) -> CmdResult {
    let c = client(conn)?;
    let t = c.run_tests(run, failed).await?;
    if json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&t).expect("json"));
        return Ok(exit::OK);
    }
    if t.attempts.is_empty() {
        eprintln!(
            "run {run} has no test reports: a job declares them with `reports: {{junit: [PATH or GLOB]}}` \
             (or `tap:`); see docs/tests.md"
        );
        return Ok(exit::OK);
    }
    let decided = if t.decided { "" } else { " (running: flaky tests are decided when it ends)" };
    out(format!("{}{decided}", summary_text(&t.summary)));
    for a in t.attempts.iter().filter(|a| a.state != "complete") {
        out(format!(
            "⚠ {} attempt {}: the test report is {} (it never counts towards flakiness nor lets a quarantine excuse a failure)",
            a.job, a.epoch, a.state
        ));
    }
    for r in t.reports.iter().filter(|r| r.truncated || !r.annotations.is_empty()) {
        for an in &r.annotations {
            out(format!("⚠ {} `{}`: {}", r.job, r.path, an.message));
        }
    }
    for row in &t.tests {
        let mut marks = Vec::new();
        if row.flaky {
            marks.push("flaky");
        }
        if row.quarantined {
            marks.push("quarantined");
        }
        let marks = if marks.is_empty() { String::new() } else { format!(" [{}]", marks.join(", ")) };
        let took = row.test.duration_ms.map(|d| format!(" ({})", duration_text(d as i64))).unwrap_or_default();
        let word = match row.test.outcome.as_str() {
            "failed" => "FAILED ",
            "error" => "ERROR  ",
            "skipped" => "skipped",
            _ => "passed ",
        };
        out(format!("{word} {}  {}{took}{marks}", row.job, row.test.id));
        if let Some(m) = row.test.message.as_deref().filter(|_| row.test.outcome != "passed") {
            for line in m.lines().take(3) {
                out(format!("        {line}"));
            }
        }
    }
    Ok(exit::OK)
}

async fn sub(cmd: TestsCommand) -> CmdResult {
    match cmd {
        TestsCommand::History { repo, test_id, limit, json, conn } => {
            let h = client(&conn)?.test_history(&repo, &test_id, limit).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&h).expect("json"));
                return Ok(exit::OK);
            }
            let rate = match &h.flake_rate {
                Some(f) => format!(
                    "flake rate {:.0}% ({} of {} default-branch runs flaky, {} failed)",
                    f.rate * 100.0,
                    f.flaky,
                    f.runs,
                    f.failed
                ),
                None => "no default-branch run decided it yet".into(),
            };
            out(format!("{} in {}: {rate}", h.test_id, h.repo));
            if let Some(q) = &h.quarantine {
                out(format!("quarantined until {} (owner {}): {}", when(q.expires_at_ms), q.owner, q.reason));
            }
            if h.entries.is_empty() {
                eprintln!("no results for `{test_id}` in {repo}; its id is as `kiln tests RUN` shows it");
                return Ok(exit::OK);
            }
            out(format!(
                "{:<16} {:<9} {:<20} {:<16} {:<8} {:>8}  WHEN",
                "RUN", "COMMIT", "REF", "JOB", "OUTCOME", "TOOK"
            ));
            for e in &h.entries {
                let took = e.duration_ms.map(|d| duration_text(d as i64)).unwrap_or_else(|| "-".into());
                let r = e.git_ref.as_deref().map(|r| r.strip_prefix("refs/heads/").unwrap_or(r)).unwrap_or("-");
                let outcome = if e.flaky { format!("{} (flaky)", e.outcome) } else { e.outcome.clone() };
                out(format!(
                    "{:<16} {:<9} {:<20} {:<16} {:<8} {:>8}  {}",
                    format!("{}#{}", h.repo, e.run_number),
                    &e.commit_sha[..e.commit_sha.len().min(8)],
                    r,
                    e.job,
                    outcome,
                    took,
                    when(e.created_at_ms)
                ));
            }
        }
        TestsCommand::Quarantine { repo, test_id, owner, reason, link, expires, conn } => {
            let d = kiln_workflow::parse_duration(&expires).map_err(|e| usage(format!("--expires: {e}")))?;
            if d.is_zero() {
                return Err(usage("--expires must be in the future (e.g. 14d)"));
            }
            let body =
                kiln_api::CreateQuarantine { test_id, owner, reason, link, expires_in_secs: Some(d.as_secs().max(1)) };
            let q = client(&conn)?.quarantine(&repo, &body).await?;
            out(format!(
                "quarantined `{}` in {repo} until {} (owner {}); its failures no longer fail jobs with complete reports",
                q.test_id,
                when(q.expires_at_ms),
                q.owner
            ));
        }
        TestsCommand::Unquarantine { repo, test_id, conn } => {
            let q = client(&conn)?.unquarantine(&repo, &test_id).await?;
            out(format!("`{}` in {repo} is no longer quarantined: its failures fail jobs again", q.test_id));
        }
        TestsCommand::Ls { repo, json, conn } => {
            let list = client(&conn)?.list_quarantine(&repo).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
                return Ok(exit::OK);
            }
            if list.is_empty() {
                eprintln!(
                    "no quarantined tests in {repo}; quarantine one with `kiln tests quarantine {repo} TEST_ID --owner WHO --reason TEXT`"
                );
                return Ok(exit::OK);
            }
            out(format!("{:<8} {:<20} {:<16} {:<40} REASON", "STATE", "EXPIRES", "OWNER", "TEST"));
            for q in list {
                out(format!(
                    "{:<8} {:<20} {:<16} {:<40} {}{}",
                    q.state,
                    when(q.expires_at_ms),
                    q.owner,
                    q.test_id,
                    q.reason,
                    q.link.map(|l| format!(" ({l})")).unwrap_or_default()
                ));
            }
        }
        TestsCommand::Next { group, batch_size } => return next(&group, batch_size).await,
        TestsCommand::Attestation { run, repo, job, output, conn } => {
            let run = crate::commands::shared::run_ref(&run, repo.as_deref())?;
            let env = client(&conn)?.test_attestation(&run, &job).await?;
            let text = serde_json::to_string_pretty(&env).expect("json");
            match &output {
                Some(p) => {
                    std::fs::write(p, format!("{text}\n")).map_err(|e| kiln_cmd::Failure {
                        code: exit::UNAVAILABLE,
                        message: format!("cannot write {}: {e}", p.display()),
                    })?;
                    eprintln!("test attestation of {job} written to {}", p.display());
                }
                None => kiln_cmd::outln!("{text}"),
            }
        }
        TestsCommand::Split { total, index, by, timings, repo, git_ref, conn } => {
            if total == 0 {
                return Err(usage("--total must be at least 1"));
            }
            if index >= total {
                return Err(usage(format!("--index {index} is not a shard of {total}: shards are 0 to {}", total - 1)));
            }
            let mut ids = Vec::new();
            for line in std::io::stdin().lock().lines() {
                let line = line.map_err(|e| usage(format!("cannot read test ids on standard input: {e}")))?;
                let id = line.trim();
                if !id.is_empty() {
                    ids.push(kiln_reports::TestId(id.to_string()));
                }
            }
            let mode = if by == "count" {
                kiln_reports::split::SplitMode::Count
            } else {
                kiln_reports::split::SplitMode::Timings
            };
            let (durations, source) = if mode == kiln_reports::split::SplitMode::Count {
                (HashMap::new(), String::new())
            } else {
                let (recorded, source) =
                    load_timings(timings.as_deref(), repo.as_deref(), git_ref.as_deref(), &conn).await?;
                // The runner's ids (pytest node ids, nextest's list) are
                // matched to the reports' ids.
                let given: Vec<String> = ids.iter().map(|t| t.0.clone()).collect();
                let matched = kiln_reports::split::match_durations(&given, &recorded);
                (matched.into_iter().map(|(k, v)| (kiln_reports::TestId(k), v)).collect(), source)
            };
            let s = kiln_reports::split::split(&ids, &durations, total, mode);
            if mode == kiln_reports::split::SplitMode::Timings {
                if durations.is_empty() && !ids.is_empty() {
                    eprintln!(
                        "kiln tests split: no recorded timings{source}: the {} tests are split by count",
                        ids.len()
                    );
                } else if s.without_timing > 0 {
                    eprintln!(
                        "kiln tests split: {} of {} tests have no recorded timing{source}; each weighs the median ({})",
                        s.without_timing,
                        ids.len(),
                        duration_text(s.assumed_ms as i64)
                    );
                }
                eprintln!(
                    "kiln tests split: shard {index} of {total}: {} tests, about {} (longest shard {:.2}× the ideal)",
                    s.shards[index].len(),
                    duration_text(s.estimated_ms[index] as i64),
                    s.ratio()
                );
            }
            for id in &s.shards[index] {
                kiln_cmd::outln!("{}", id.as_str());
            }
        }
    }
    Ok(exit::OK)
}

/// The recorded durations: a timings file (`$KILN_TEST_TIMINGS` in a job),
/// else the server's for `repo` (and `git_ref`). Returns them and where they
/// come from, for the notes.
async fn load_timings(
    file: Option<&std::path::Path>,
    repo: Option<&str>,
    git_ref: Option<&str>,
    conn: &crate::cli::Conn,
) -> Result<(std::collections::BTreeMap<String, u64>, String), kiln_cmd::Failure> {
    let t: kiln_api::TestTimings = match (file, repo) {
        (Some(f), _) => {
            let text = std::fs::read_to_string(f).map_err(|e| usage(format!("cannot read {}: {e}", f.display())))?;
            serde_json::from_str(&text).map_err(|e| {
                usage(format!("{} is not a timings file ({{\"durations_ms\": {{...}}}}): {e}", f.display()))
            })?
        }
        (None, Some(repo)) => client(conn)?.test_timings(repo, git_ref).await?,
        (None, None) => {
            return Err(usage(
                "no timings: in a job that declares `reports:` they are in $KILN_TEST_TIMINGS; elsewhere name the \
                 repository (--repo REPO [--ref BRANCH]), or split by count (--by count)",
            ));
        }
    };
    let source = t.source_ref.as_deref().map(|r| format!(" (timings of {r})")).unwrap_or_default();
    Ok((t.durations_ms, source))
}

/// Exit code of `kiln tests next` when the queue has no batch left.
const NO_BATCH_LEFT: i32 = 3;

/// `kiln tests next`: in a step, with the attempt's shard capability.
async fn next(group: &str, batch_size: Option<u32>) -> CmdResult {
    let (Ok(url), Ok(token)) = (std::env::var("KILN_SHARDS_URL"), std::env::var("KILN_SHARD_TOKEN")) else {
        return Err(usage(
            "kiln tests next runs in a job's step: it needs $KILN_SHARDS_URL and $KILN_SHARD_TOKEN, which the agent \
             sets for a job that declares `reports:`",
        ));
    };
    // `BASE/v1/jobs/JOB/attempts/EPOCH/shards/next`
    let parsed = url.split_once("/v1/jobs/").and_then(|(base, rest)| {
        let mut parts = rest.split('/');
        let job = parts.next()?.to_string();
        let epoch = parts.nth(1)?.parse::<i64>().ok()?;
        Some((base.to_string(), job, epoch))
    });
    let Some((base, job, epoch)) = parsed else {
        return Err(usage(format!("$KILN_SHARDS_URL `{url}` is not a shard queue's URL")));
    };
    let mut tests = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| usage(format!("cannot read test ids on standard input: {e}")))?;
        if !line.trim().is_empty() {
            tests.push(line.trim().to_string());
        }
    }
    let c = kiln_api::Client::new(&base, &token);
    let body = kiln_api::ShardNext { group: group.to_string(), tests, batch_size };
    let b = c.shard_next(&job, epoch, &body).await?;
    match b.batch {
        Some(no) => {
            eprintln!(
                "kiln tests next: batch {} of {} ({} tests; {} waiting, {} held by other shards)",
                no + 1,
                b.total,
                b.tests.len(),
                b.pending,
                b.leased
            );
            for t in &b.tests {
                kiln_cmd::outln!("{t}");
            }
            Ok(exit::OK)
        }
        None => {
            eprintln!(
                "kiln tests next: no batch left in `{group}` ({} batches; {} held by other shards)",
                b.total, b.leased
            );
            Ok(NO_BATCH_LEFT)
        }
    }
}
