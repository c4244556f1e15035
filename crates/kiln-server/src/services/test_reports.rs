//! Test reports, flaky tests, quarantine and timings (issue 43).
//!
//! The agent parses a job's `reports:` after its steps and stages each file
//! under the attempt's epoch ([`stage`]); the completion binds them (store
//! `tx/test_reports.rs`), and flakiness is decided when the run ends. This
//! module checks what an agent sends (an attempt token is all it takes to
//! call, so every field is bounded here again), answers the reads, and
//! manages quarantine: owner required, every quarantine expires (default
//! 14 days), a cap per repository, each change and each expiry audited.

use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::state::AppState;
use kiln_api as api;
use kiln_store::{NewQuarantine, QuarantineRecord, StagedReport, StagedTest, StoreError};
use std::collections::{BTreeMap, BTreeSet};

/// Longest test id (and suite, class, name, file) kept.
const MAX_ID_BYTES: usize = 1024;
/// Longest message kept per test.
const MAX_MESSAGE_BYTES: usize = 4 << 10;
/// Longest output excerpt kept per test.
const MAX_EXCERPT_BYTES: usize = 16 << 10;
/// Retry records kept per test.
const MAX_RETRIES: usize = 16;
/// A quarantine's default and longest lifetime.
pub const DEFAULT_QUARANTINE: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);
pub const MAX_QUARANTINE: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);
/// How many of a test's latest results its flake rate reads.
const RATE_HISTORY: u32 = 5000;
/// Quarantines that ended this recently are still listed.
const ENDED_LISTED_MS: i64 = 30 * 24 * 3600 * 1000;

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn outcome_ok(o: &str) -> bool {
    matches!(o, "passed" | "failed" | "error" | "skipped")
}

/// The store's form of an upload, every field checked and bounded.
pub(crate) fn staged(u: api::ReportUpload) -> ApiResult<StagedReport> {
    let path = u.path.trim();
    if path.is_empty() || path.len() > 4096 || path.chars().any(char::is_control) {
        return Err(ApiErr::invalid("a report's `path` is its workspace-relative file name (1 to 4096 bytes)"));
    }
    if !matches!(u.format.as_str(), "junit" | "tap") {
        return Err(ApiErr::invalid(format!("report format `{}` is not junit or tap", u.format)));
    }
    let mut tests = Vec::with_capacity(u.tests.len());
    for t in u.tests {
        if t.id.trim().is_empty() || !outcome_ok(&t.outcome) {
            return Err(ApiErr::invalid(format!(
                "a test needs an `id` and an outcome of passed, failed, error or skipped (got `{}`)",
                cut(&t.outcome, 40)
            )));
        }
        let retries: Vec<serde_json::Value> = t
            .retries
            .iter()
            .take(MAX_RETRIES)
            .filter(|r| outcome_ok(&r.outcome))
            .map(|r| {
                serde_json::json!({
                    "kind": cut(&r.kind, 32),
                    "outcome": r.outcome,
                    "message": r.message.as_deref().map(|m| cut(m, MAX_MESSAGE_BYTES)),
                    "duration_ms": r.duration_ms,
                })
            })
            .collect();
        tests.push(StagedTest {
            test_id: cut(&t.id, MAX_ID_BYTES),
            suite: cut(&t.suite, MAX_ID_BYTES),
            class: t.class.as_deref().map(|c| cut(c, MAX_ID_BYTES)),
            name: cut(&t.name, MAX_ID_BYTES),
            file: t.file.as_deref().map(|f| cut(f, MAX_ID_BYTES)),
            outcome: t.outcome,
            duration_ms: t.duration_ms.map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
            message: t.message.as_deref().map(|m| cut(m, MAX_MESSAGE_BYTES)),
            excerpt: t.excerpt.as_deref().map(|e| cut(e, MAX_EXCERPT_BYTES)),
            retries: (!retries.is_empty()).then(|| serde_json::Value::Array(retries).to_string()),
        });
    }
    let annotations: Vec<api::ReportAnnotation> = u
        .annotations
        .into_iter()
        .take(64)
        .map(|a| api::ReportAnnotation { kind: cut(&a.kind, 64), message: cut(&a.message, 1024) })
        .collect();
    Ok(StagedReport {
        path: path.to_string(),
        format: u.format,
        truncated: u.truncated,
        annotations: serde_json::to_string(&annotations).unwrap_or_else(|_| "[]".into()),
        tests,
    })
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/reports`.
pub(crate) async fn stage(state: &AppState, job: &str, epoch: i64, report: StagedReport) -> ApiResult<api::ReportAck> {
    let staged = state.store.stage_report(job, epoch, &report).await?;
    Ok(api::ReportAck { staged })
}

fn annotations_of(json: &str) -> Vec<api::ReportAnnotation> {
    serde_json::from_str(json).unwrap_or_default()
}

/// A stored test as the API shows it.
pub(crate) fn case_of(t: kiln_store::StagedTest) -> api::TestCaseResult {
    #[derive(serde::Deserialize)]
    struct R {
        kind: String,
        outcome: String,
        message: Option<String>,
        duration_ms: Option<u64>,
    }
    let retries: Vec<R> = t.retries.as_deref().and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default();
    api::TestCaseResult {
        id: t.test_id,
        suite: t.suite,
        class: t.class,
        name: t.name,
        file: t.file,
        outcome: t.outcome,
        duration_ms: t.duration_ms.and_then(|d| u64::try_from(d).ok()),
        message: t.message,
        excerpt: t.excerpt,
        retries: retries
            .into_iter()
            .map(|r| api::TestRetry {
                kind: r.kind,
                outcome: r.outcome,
                message: r.message,
                duration_ms: r.duration_ms,
            })
            .collect(),
    }
}

fn n(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// `GET /v1/workflow-runs/{run}/tests`.
pub(crate) async fn run_tests(state: &AppState, run_id: &str, failed_only: bool) -> ApiResult<api::RunTests> {
    let r = state.store.run_tests(run_id, failed_only).await?;
    let flaky: BTreeSet<&str> = r.flaky.iter().map(|(id, _, _)| id.as_str()).collect();
    let quarantined: BTreeSet<&str> = r.quarantined.iter().map(String::as_str).collect();
    let mut summary = api::TestSummary { flaky: r.flaky.len() as u64, ..Default::default() };
    // Each job's last bound attempt.
    let mut last: BTreeMap<&str, &kiln_store::TestAttemptRecord> = BTreeMap::new();
    for a in &r.attempts {
        last.insert(a.job_id.as_str(), a);
    }
    for a in last.values() {
        summary.total += n(a.total);
        summary.passed += n(a.passed);
        summary.failed += n(a.failed);
        summary.errored += n(a.errored);
        summary.skipped += n(a.skipped);
        summary.quarantined += n(a.quarantined);
    }
    let mut tests: Vec<api::TestRow> = r
        .tests
        .into_iter()
        .map(|t| {
            let is_flaky = flaky.contains(t.test.test_id.as_str());
            let is_quarantined = quarantined.contains(t.test.test_id.as_str());
            api::TestRow {
                job: t.job_name,
                job_id: t.job_id,
                epoch: t.epoch,
                test: case_of(t.test),
                flaky: is_flaky,
                quarantined: is_quarantined,
            }
        })
        .collect();
    // Failed first (stable: report order within each group).
    tests.sort_by_key(|t| !matches!(t.test.outcome.as_str(), "failed" | "error"));
    Ok(api::RunTests {
        run_id: run_id.to_string(),
        summary,
        decided: r.decided,
        attempts: r
            .attempts
            .into_iter()
            .map(|a| api::TestAttemptInfo {
                job: a.job_name,
                job_id: a.job_id,
                epoch: a.epoch,
                state: a.state,
                total: n(a.total),
                passed: n(a.passed),
                failed: n(a.failed),
                errored: n(a.errored),
                skipped: n(a.skipped),
                quarantined: n(a.quarantined),
            })
            .collect(),
        reports: r
            .reports
            .into_iter()
            .map(|p| api::TestReportInfo {
                annotations: annotations_of(&p.annotations),
                job: p.job_name,
                job_id: p.job_id,
                epoch: p.epoch,
                path: p.path,
                format: p.format,
                truncated: p.truncated,
                tests: n(p.tests),
            })
            .collect(),
        tests,
    })
}

/// `GET /v1/repos/{repo}/tests/history?id=TEST_ID`.
pub(crate) async fn history(state: &AppState, repo: &str, test_id: &str, limit: u32) -> ApiResult<api::TestHistory> {
    let repo = state.store.get_repo(repo).await?;
    let test_id = test_id.trim();
    if test_id.is_empty() {
        return Err(ApiErr::invalid("name the test: `?id=TEST_ID` (as `kiln tests RUN` shows it)"));
    }
    // The flake rate reads more history than the list shows.
    let mut rows = state.store.test_history(&repo.id, test_id, RATE_HISTORY).await?;
    // The flake rate over default-branch runs.
    let default_ref = format!("refs/heads/{}", repo.forge.default_branch);
    let on_default: Vec<kiln_store::TestHistoryRecord> = rows
        .iter()
        .filter(|h| h.git_ref.as_deref().is_some_and(|r| r == default_ref || r == repo.forge.default_branch))
        .cloned()
        .collect();
    let verdicts: Vec<Option<kiln_reports::flaky::Verdict>> =
        kiln_store::verdicts_per_run(&on_default).into_iter().map(|(_, v)| Some(v)).collect();
    let flake_rate = kiln_reports::flaky::flake_rate(&verdicts).map(|f| api::FlakeRate {
        runs: f.runs,
        flaky: f.flaky,
        failed: f.failed,
        rate: f.rate,
    });
    rows.truncate(limit.clamp(1, 1000) as usize);
    let quarantine = state
        .store
        .list_quarantine(&repo.id, 0)
        .await?
        .into_iter()
        .find(|q| q.test_id == test_id && q.ended_at.is_none())
        .map(|q| view(q, now_ms()));
    Ok(api::TestHistory {
        repo: repo.name,
        test_id: test_id.to_string(),
        flake_rate,
        quarantine,
        entries: rows
            .into_iter()
            .map(|h| api::TestHistoryEntry {
                run_id: h.run_id,
                run_number: h.run_number,
                commit_sha: h.commit_sha,
                git_ref: h.git_ref,
                job: h.job_name,
                epoch: h.epoch,
                outcome: h.outcome,
                duration_ms: h.duration_ms.and_then(|d| u64::try_from(d).ok()),
                message: h.message,
                flaky: h.flaky,
                created_at_ms: h.created_at,
            })
            .collect(),
    })
}

/// `GET /v1/repos/{repo}/tests/timings?ref=REF`: the ref's recorded
/// durations, else the default branch's.
pub(crate) async fn timings(state: &AppState, repo: &str, git_ref: Option<&str>) -> ApiResult<api::TestTimings> {
    let repo = state.store.get_repo(repo).await?;
    let default_ref = format!("refs/heads/{}", repo.forge.default_branch);
    let mut refs: Vec<String> = Vec::new();
    if let Some(r) = git_ref.map(str::trim).filter(|r| !r.is_empty()) {
        refs.push(if r.starts_with("refs/") { r.to_string() } else { format!("refs/heads/{r}") });
    }
    refs.push(default_ref);
    for r in refs {
        let d = state.store.test_durations(&repo.id, &r).await?;
        if !d.is_empty() {
            return Ok(api::TestTimings {
                source_ref: Some(r),
                durations_ms: d.into_iter().map(|(k, v)| (k, n(v))).collect(),
            });
        }
    }
    Ok(api::TestTimings::default())
}

/// The timings for a job's run: its branch's, else the default branch's.
pub(crate) async fn timings_of_job(state: &AppState, job: &str) -> ApiResult<api::TestTimings> {
    let job = state.store.get_job(job).await?;
    let run = state.store.get_run(&job.run_id).await?;
    timings(state, &run.run.repo_id, run.run.git_ref.as_deref()).await
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A quarantine as the API shows it.
pub(crate) fn view(q: QuarantineRecord, now: i64) -> api::Quarantine {
    let state = match (&q.ended_by, q.ended_at) {
        (Some(by), Some(_)) if by == "expiry" => "expired",
        (Some(_), Some(_)) => "removed",
        _ if q.expires_at <= now => "expired",
        _ => "active",
    };
    api::Quarantine {
        id: q.id,
        test_id: q.test_id,
        owner: q.owner,
        reason: q.reason,
        link: q.link,
        created_by: q.created_by,
        created_at_ms: q.created_at,
        expires_at_ms: q.expires_at,
        state: state.into(),
        ended_at_ms: q.ended_at,
        ended_by: q.ended_by,
    }
}

/// `POST /v1/repos/{repo}/quarantine`.
pub(crate) async fn quarantine(
    state: &AppState,
    by: &Principal,
    repo: &str,
    req: api::CreateQuarantine,
) -> ApiResult<api::Quarantine> {
    let repo = state.store.get_repo(repo).await?;
    let test_id = req.test_id.trim();
    let owner = req.owner.trim();
    let reason = req.reason.trim();
    if test_id.is_empty() || test_id.len() > MAX_ID_BYTES {
        return Err(ApiErr::invalid("name the test to quarantine (its id as `kiln tests RUN` shows it)"));
    }
    if owner.is_empty() || owner.len() > 200 || owner.chars().any(char::is_control) {
        return Err(ApiErr::invalid(
            "a quarantine needs an owner: who fixes the test (`--owner alice`, a team, an email)",
        ));
    }
    if reason.is_empty() || reason.len() > 2000 {
        return Err(ApiErr::invalid("a quarantine needs a reason (`--reason 'times out on slow disks'`)"));
    }
    if let Some(link) = req.link.as_deref()
        && !(link.starts_with("https://") || link.starts_with("http://"))
    {
        return Err(ApiErr::invalid(format!("`--link {link}` is not an http(s) URL")));
    }
    let lifetime = match req.expires_in_secs {
        None => DEFAULT_QUARANTINE,
        Some(0) => return Err(ApiErr::invalid("a quarantine's expiry must be in the future")),
        Some(s) if s > MAX_QUARANTINE.as_secs() => {
            return Err(ApiErr::invalid(format!(
                "a quarantine lasts at most {} days; quarantine it again when it expires (the owner is told)",
                MAX_QUARANTINE.as_secs() / 86400
            )));
        }
        Some(s) => std::time::Duration::from_secs(s),
    };
    let q = state
        .store
        .quarantine_test(&NewQuarantine {
            repo_id: repo.id.clone(),
            test_id: test_id.to_string(),
            owner: owner.to_string(),
            reason: reason.to_string(),
            link: req.link.clone(),
            created_by: by.actor.clone(),
            expires_in_ms: i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX),
            max_percent: state.config.quarantine_max_percent,
        })
        .await?;
    let detail = format!("{test_id}: owner {owner}, {} days: {reason}", lifetime.as_secs() / 86400);
    access::audit(state, &by.actor, "test.quarantine", &repo.name, detail).await?;
    Ok(view(q, now_ms()))
}

/// `DELETE /v1/repos/{repo}/quarantine?id=TEST_ID`.
pub(crate) async fn unquarantine(
    state: &AppState,
    by: &Principal,
    repo: &str,
    test_id: &str,
) -> ApiResult<api::Quarantine> {
    let repo = state.store.get_repo(repo).await?;
    let Some(q) = state.store.end_quarantine(&repo.id, test_id.trim(), &by.actor).await? else {
        return Err(ApiErr::not_found(format!("`{}` is not quarantined in {}", test_id.trim(), repo.name)));
    };
    access::audit(state, &by.actor, "test.unquarantine", &repo.name, q.test_id.clone()).await?;
    Ok(view(q, now_ms()))
}

/// `GET /v1/repos/{repo}/quarantine`.
pub(crate) async fn list(state: &AppState, repo: &str) -> ApiResult<Vec<api::Quarantine>> {
    let repo = state.store.get_repo(repo).await?;
    let now = now_ms();
    Ok(state.store.list_quarantine(&repo.id, ENDED_LISTED_MS).await?.into_iter().map(|q| view(q, now)).collect())
}

/// One round of quarantine bookkeeping: quarantines past their expiry end,
/// each with an audit entry naming its owner, and the metric counts it:
/// the test blocks again.
pub(crate) async fn expire_once(state: &AppState) -> Result<usize, StoreError> {
    let gone = state.store.expire_quarantines().await?;
    for q in &gone {
        let repo = state.store.get_repo(&q.repo_id).await.map(|r| r.name).unwrap_or_else(|_| q.repo_id.clone());
        tracing::warn!(repo = %repo, test = %q.test_id, owner = %q.owner, "quarantine expired: the test blocks again");
        state.metrics.quarantine_expired(&repo);
        let e = kiln_store::NewAudit {
            actor: "kiln".into(),
            action: "test.quarantine.expire".into(),
            target: repo,
            detail: format!("{}: owner {} (quarantined by {}: {})", q.test_id, q.owner, q.created_by, q.reason),
        };
        state.store.audit(&e).await?;
    }
    Ok(gone.len())
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/shards/next`.
pub(crate) async fn shard_next(
    state: &AppState,
    job: &str,
    epoch: i64,
    req: api::ShardNext,
) -> ApiResult<api::ShardBatch> {
    let group = req.group.trim();
    if group.is_empty() || group.len() > 200 || group.chars().any(char::is_control) {
        return Err(ApiErr::invalid("name the queue: `kiln tests next --group NAME`"));
    }
    if req.tests.len() > kiln_store::MAX_TESTS_PER_ATTEMPT as usize {
        return Err(ApiErr::invalid(format!(
            "{} tests given; a queue holds at most {}",
            req.tests.len(),
            kiln_store::MAX_TESTS_PER_ATTEMPT
        )));
    }
    let record = state.store.get_job(job).await?;
    let run = state.store.get_run(&record.run_id).await?;
    let declares = usize::try_from(record.index)
        .ok()
        .and_then(|i| run.run.definition.jobs.get(i))
        .is_some_and(|d| d.reports.is_some());
    if !declares {
        return Err(ApiErr::invalid(format!(
            "job `{}` declares no `reports:`: a batch is done when the attempt's reports are bound, so \
             `kiln tests next` needs them (add `reports: {{junit: [...]}}`)",
            record.name
        )));
    }
    let tests: Vec<String> =
        req.tests.iter().map(|t| t.trim()).filter(|t| !t.is_empty()).map(|t| cut(t, MAX_ID_BYTES)).collect();
    let durations: std::collections::BTreeMap<String, u64> = if tests.is_empty() {
        Default::default()
    } else {
        timings(state, &run.run.repo_id, run.run.git_ref.as_deref()).await?.durations_ms
    };
    // The runner's ids (pytest node ids, nextest's list) matched to the reports'.
    let durations = kiln_reports::split::match_durations(&tests, &durations);
    let planned = kiln_reports::split::batches(&tests, &durations, req.batch_size);
    let b = state.store.shard_next(job, epoch, group, &planned).await?;
    Ok(api::ShardBatch {
        batch: b.batch,
        tests: b.tests,
        pending: n(b.pending),
        leased: n(b.leased),
        total: n(b.total),
    })
}
