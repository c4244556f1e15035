//! Test reports, flaky tests and quarantine (issue 43).
//!
//! An attempt's agent stages each report file it read under the attempt's
//! epoch ([`stage_report`], refused for any but the live epoch). The
//! attempt's completion binds them ([`bind`], in the completion
//! transaction, whatever the outcome): one `test_attempts` row with what
//! they add up to. Every reader joins through that row, so a fenced
//! attempt's staged reports are never read. When the run ends
//! ([`on_run_end`], in the transaction that ends it) the tests that both
//! passed and failed for the run's commit are flagged flaky, and the run's
//! summary is written.

use crate::db::{Exec, Row, Tx, now};
use crate::dialect::{Isolation, Sql};
use crate::error::{Result, StoreError};
use crate::model::{
    JobRecord, NewQuarantine, QuarantineRecord, RunTestsRecord, ShardBatch, StagedReport, StagedTest,
    TestAttemptRecord, TestHistoryRecord, TestReportRecord, TestResultRecord, TestSummary,
};
use crate::rows::new_id;
use crate::store::{SqlStore, lock_job};
use crate::tx::attempt::require_live;
use kiln_reports::flaky::{AttemptReports, AttemptResults, TestResult, Verdict, decide};
use kiln_reports::{Outcome, TestId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most report files one attempt may stage.
pub const MAX_REPORTS_PER_ATTEMPT: i64 = 256;
/// Most tests one attempt's reports may hold together.
pub const MAX_TESTS_PER_ATTEMPT: i64 = 250_000;

/// Rows per multi-row insert of results.
const BATCH: usize = 50;
const RESULT_COLS: &str = "report_id, seq, run_id, job_id, epoch, repo_id, test_id, suite, class, name, file, \
    outcome, duration_ms, message, excerpt, retries, created_at";
const RESULT_PARAMS: usize = 17;

fn insert_results(rows: usize) -> String {
    let mut s = format!("INSERT INTO test_results ({RESULT_COLS}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..RESULT_PARAMS {
            if c > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!("${}", r * RESULT_PARAMS + c + 1));
        }
        s.push(')');
    }
    s
}

fn outcome_of(s: &str) -> Option<Outcome> {
    Some(match s {
        "passed" => Outcome::Passed,
        "failed" => Outcome::Failed,
        "error" => Outcome::Error,
        "skipped" => Outcome::Skipped,
        _ => return None,
    })
}

/// `TestStore::stage_report`: `Ok(false)` when the attempt already staged
/// a report of that path (a retried upload changes nothing).
pub(crate) async fn stage_report(store: &SqlStore, job_id: &str, epoch: i64, report: &StagedReport) -> Result<bool> {
    static MANY: Sql = Sql::new(|_| insert_results(BATCH));
    static ONE: Sql = Sql::new(|_| insert_results(1));
    if outcome_check(&report.tests).is_some() {
        return Err(StoreError::Invalid(format!(
            "test outcome `{}` is not one of passed, failed, error, skipped",
            outcome_check(&report.tests).unwrap_or_default()
        )));
    }
    if !matches!(report.format.as_str(), "junit" | "tap") {
        return Err(StoreError::Invalid(format!("report format `{}` is not junit or tap", report.format)));
    }
    store
        .transaction(Isolation::Serializable, &(job_id, epoch, report), |tx, &(job_id, epoch, report)| {
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                // A fenced attempt stages nothing (invariant 3).
                let (job, _, now) = require_live(tx, job_id, epoch).await?;
                let seen: Option<String> = tx
                    .sql("SELECT id FROM test_reports WHERE job_id = $1 AND epoch = $2 AND path = $3")
                    .bind(job_id)
                    .bind(epoch)
                    .bind(&report.path)
                    .scalar_optional()
                    .await?;
                if seen.is_some() {
                    return Ok(false);
                }
                let (files, tests): (i64, Option<i64>) = tx
                    .sql("SELECT COUNT(*), CAST(SUM(tests) AS BIGINT) FROM test_reports WHERE job_id = $1 AND epoch = $2")
                    .bind(job_id)
                    .bind(epoch)
                    .one()
                    .await?;
                if files >= MAX_REPORTS_PER_ATTEMPT {
                    return Err(StoreError::Invalid(format!(
                        "an attempt may stage at most {MAX_REPORTS_PER_ATTEMPT} report files"
                    )));
                }
                let total = tests.unwrap_or(0) + report.tests.len() as i64;
                if total > MAX_TESTS_PER_ATTEMPT {
                    return Err(StoreError::Invalid(format!(
                        "the attempt's reports would hold {total} tests; at most {MAX_TESTS_PER_ATTEMPT} are kept"
                    )));
                }
                let repo_id: String =
                    tx.sql("SELECT repo_id FROM runs WHERE id = $1").bind(&job.run_id).scalar().await?;
                let id = new_id();
                tx.sql(
                    "INSERT INTO test_reports (id, run_id, job_id, epoch, path, format, truncated, annotations, \
                     tests, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&id)
                .bind(&job.run_id)
                .bind(job_id)
                .bind(epoch)
                .bind(&report.path)
                .bind(&report.format)
                .bind(i64::from(report.truncated))
                .bind(&report.annotations)
                .bind(report.tests.len() as i64)
                .bind(now)
                .execute()
                .await?;
                let ctx = RowCtx { report_id: &id, run_id: &job.run_id, job_id, epoch, repo_id: &repo_id, now };
                let mut seq = 0i64;
                for chunk in report.tests.chunks(BATCH) {
                    if chunk.len() == BATCH {
                        let mut q = tx.sql(&MANY);
                        for t in chunk {
                            q = bind_result(q, &ctx, seq, t);
                            seq += 1;
                        }
                        q.execute().await?;
                    } else {
                        for t in chunk {
                            bind_result(tx.sql(&ONE), &ctx, seq, t).execute().await?;
                            seq += 1;
                        }
                    }
                }
                Ok(true)
            })
        })
        .await
}

fn outcome_check(tests: &[StagedTest]) -> Option<String> {
    tests.iter().find(|t| outcome_of(&t.outcome).is_none()).map(|t| t.outcome.clone())
}

struct RowCtx<'a> {
    report_id: &'a str,
    run_id: &'a str,
    job_id: &'a str,
    epoch: i64,
    repo_id: &'a str,
    now: i64,
}

fn bind_result<'c>(q: crate::db::Stmt<'c>, c: &RowCtx<'_>, seq: i64, t: &StagedTest) -> crate::db::Stmt<'c> {
    q.bind(c.report_id.to_string())
        .bind(seq)
        .bind(c.run_id.to_string())
        .bind(c.job_id.to_string())
        .bind(c.epoch)
        .bind(c.repo_id.to_string())
        .bind(t.test_id.clone())
        .bind(t.suite.clone())
        .bind(t.class.clone())
        .bind(t.name.clone())
        .bind(t.file.clone())
        .bind(t.outcome.clone())
        .bind(t.duration_ms)
        .bind(t.message.clone())
        .bind(t.excerpt.clone())
        .bind(t.retries.clone())
        .bind(c.now)
}

/// What a completion bound: the attempt's state and the failures the
/// quarantine does not cover.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bound {
    pub state: String,
    /// Failed or errored tests, with whether each is quarantined now.
    pub failures: Vec<(String, bool)>,
}

/// Binds the live attempt's staged reports (in its completion transaction),
/// for a job that declares `reports:`.
pub(crate) async fn bind(tx: &mut Tx, job: &JobRecord, epoch: i64, now: i64) -> Result<Bound> {
    let (repo_id, sha): (String, String) =
        tx.sql("SELECT repo_id, commit_sha FROM runs WHERE id = $1").bind(&job.run_id).one().await?;
    let (files, truncated): (i64, Option<i64>) = tx
        .sql("SELECT COUNT(*), MAX(truncated) FROM test_reports WHERE job_id = $1 AND epoch = $2")
        .bind(&job.id)
        .bind(epoch)
        .one()
        .await?;
    let state = match (files, truncated.unwrap_or(0)) {
        (0, _) => "missing",
        (_, 1..) => "truncated",
        _ => "complete",
    };
    let counts: Vec<(String, i64)> = tx
        .sql("SELECT outcome, COUNT(*) FROM test_results WHERE job_id = $1 AND epoch = $2 GROUP BY outcome")
        .bind(&job.id)
        .bind(epoch)
        .all()
        .await?;
    let count = |o: &str| counts.iter().find(|(k, _)| k == o).map_or(0, |(_, n)| *n);
    let quarantine: BTreeSet<String> = active_ids(tx, &repo_id, now).await?.into_iter().collect();
    let failing: Vec<String> = tx
        .sql(
            "SELECT test_id FROM test_results WHERE job_id = $1 AND epoch = $2 AND outcome IN ('failed', 'error') \
             ORDER BY report_id, seq",
        )
        .bind(&job.id)
        .bind(epoch)
        .scalars()
        .await?;
    let failures: Vec<(String, bool)> = failing.into_iter().map(|t| (t.clone(), quarantine.contains(&t))).collect();
    let quarantined = failures.iter().filter(|(_, q)| *q).count() as i64;
    tx.sql(
        "INSERT INTO test_attempts (job_id, epoch, run_id, repo_id, commit_sha, state, total, passed, failed, \
         errored, skipped, quarantined, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(&job.id)
    .bind(epoch)
    .bind(&job.run_id)
    .bind(&repo_id)
    .bind(&sha)
    .bind(state)
    .bind(counts.iter().map(|(_, n)| n).sum::<i64>())
    .bind(count("passed"))
    .bind(count("failed"))
    .bind(count("error"))
    .bind(count("skipped"))
    .bind(quarantined)
    .bind(now)
    .execute()
    .await?;
    Ok(Bound { state: state.to_string(), failures })
}

/// Whether a completion that let failures through as quarantined may
/// stand: `Err(why)` unless the bound reports are complete, hold at least
/// one failure, and every failure is quarantined now.
pub(crate) fn check_quarantined(b: &Bound) -> std::result::Result<usize, String> {
    if b.state != "complete" {
        return Err(format!(
            "failures were let through as quarantined, but the job's test report is {} (a quarantine covers only \
             failures a complete report names)",
            b.state
        ));
    }
    if b.failures.is_empty() {
        return Err("failures were let through as quarantined, but the job's reports name no failed test".into());
    }
    let loose: Vec<&str> = b.failures.iter().filter(|(_, q)| !q).map(|(t, _)| t.as_str()).collect();
    if !loose.is_empty() {
        return Err(format!(
            "{} failed test(s) are not quarantined (any more): {}",
            loose.len(),
            loose.iter().take(5).map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(b.failures.len())
}

async fn active_ids(ex: &mut impl Exec, repo_id: &str, now: i64) -> Result<Vec<String>> {
    ex.sql(
        "SELECT test_id FROM test_quarantine WHERE repo_id = $1 AND ended_at IS NULL AND expires_at > $2 \
         ORDER BY test_id",
    )
    .bind(repo_id)
    .bind(now)
    .scalars()
    .await
}

/// When a run with bound reports ends (in the transaction that ends it;
/// `finish_run` reads whether it has any with the end itself): flag the
/// tests that both passed and failed for its commit, and write its summary.
pub(crate) async fn on_run_end(tx: &mut Tx, run_id: &str, now: i64) -> Result<()> {
    let (repo_id, sha): (String, String) =
        tx.sql("SELECT repo_id, commit_sha FROM runs WHERE id = $1").bind(run_id).one().await?;
    // Every bound attempt that ran this commit, in any run.
    let attempts: Vec<(String, i64, String)> = tx
        .sql(
            "SELECT job_id, epoch, state FROM test_attempts WHERE repo_id = $1 AND commit_sha = $2 \
             ORDER BY created_at, job_id, epoch",
        )
        .bind(&repo_id)
        .bind(&sha)
        .all()
        .await?;
    let rows: Vec<(String, i64, String, String, Option<String>)> = tx
        .sql(
            "SELECT t.job_id, t.epoch, t.test_id, t.outcome, t.retries FROM test_results t \
             JOIN test_attempts a ON a.job_id = t.job_id AND a.epoch = t.epoch \
             WHERE a.repo_id = $1 AND a.commit_sha = $2 AND a.state = 'complete'",
        )
        .bind(&repo_id)
        .bind(&sha)
        .all()
        .await?;
    let mut by_attempt: HashMap<(String, i64), Vec<TestResult>> = HashMap::new();
    for (job, epoch, id, outcome, retries) in rows {
        let Some(outcome) = outcome_of(&outcome) else { continue };
        by_attempt.entry((job, epoch)).or_default().push(TestResult {
            id: TestId(id),
            outcome,
            runner_retries: retry_outcomes(retries.as_deref()),
        });
    }
    let input: Vec<AttemptResults> = attempts
        .into_iter()
        .map(|(job, epoch, state)| {
            let label = format!("{job}#{epoch}");
            let reports = match state.as_str() {
                "missing" => AttemptReports::Missing,
                "truncated" => AttemptReports::Truncated,
                _ => AttemptReports::Complete(by_attempt.remove(&(job, epoch)).unwrap_or_default()),
            };
            AttemptResults { attempt: label, reports }
        })
        .collect();
    let decision = decide(&input);
    let mut flaky = 0i64;
    for (id, tally) in &decision.verdicts {
        if tally.verdict() != Verdict::Flaky {
            continue;
        }
        flaky += 1;
        tx.sql(
            "INSERT INTO test_flakes (run_id, repo_id, test_id, commit_sha, passes, failures, decided_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id, test_id) DO NOTHING",
        )
        .bind(run_id)
        .bind(&repo_id)
        .bind(id.as_str())
        .bind(&sha)
        .bind(i64::from(tally.passes))
        .bind(i64::from(tally.failures))
        .bind(now)
        .execute()
        .await?;
    }
    // The summary: each job's last bound attempt.
    let last: Vec<(i64, i64, i64, i64, i64, i64)> = tx
        .sql(
            "SELECT a.total, a.passed, a.failed, a.errored, a.skipped, a.quarantined FROM test_attempts a \
             WHERE a.run_id = $1 AND a.epoch = (SELECT MAX(b.epoch) FROM test_attempts b WHERE b.job_id = a.job_id)",
        )
        .bind(run_id)
        .all()
        .await?;
    let mut s = TestSummary { flaky, ..TestSummary::default() };
    for (total, passed, failed, errored, skipped, quarantined) in last {
        s.total += total;
        s.passed += passed;
        s.failed += failed;
        s.errored += errored;
        s.skipped += skipped;
        s.quarantined += quarantined;
    }
    let json = serde_json::to_string(&s).map_err(|e| StoreError::Invalid(e.to_string()))?;
    tx.sql("UPDATE runs SET test_summary = $1 WHERE id = $2").bind(json).bind(run_id).execute().await?;
    Ok(())
}

/// The outcomes of a test's runner retry records (stored JSON).
fn retry_outcomes(json: Option<&str>) -> Vec<Outcome> {
    #[derive(serde::Deserialize)]
    struct R {
        outcome: String,
    }
    json.and_then(|j| serde_json::from_str::<Vec<R>>(j).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| outcome_of(&r.outcome))
        .collect()
}

const TEST_COLS: &str = "t.run_id, t.job_id, j.name AS job_name, t.epoch, t.test_id, t.suite, t.class, t.name, \
    t.file, t.outcome, t.duration_ms, t.message, t.excerpt, t.retries, t.created_at";

fn test_from_row(row: &Row) -> Result<TestResultRecord> {
    Ok(TestResultRecord {
        run_id: row.get("run_id")?,
        job_id: row.get("job_id")?,
        job_name: row.get("job_name")?,
        epoch: row.get("epoch")?,
        created_at: row.get("created_at")?,
        test: StagedTest {
            test_id: row.get("test_id")?,
            suite: row.get("suite")?,
            class: row.get("class")?,
            name: row.get("name")?,
            file: row.get("file")?,
            outcome: row.get("outcome")?,
            duration_ms: row.get("duration_ms")?,
            message: row.get("message")?,
            excerpt: row.get("excerpt")?,
            retries: row.get("retries")?,
        },
    })
}

/// A `test_attempts` row joined with its job's name.
type AttemptRow = (String, String, i64, String, i64, i64, i64, i64, i64, i64, i64);

fn attempt_of(r: AttemptRow) -> TestAttemptRecord {
    let (job_id, job_name, epoch, state, total, passed, failed, errored, skipped, quarantined, created_at) = r;
    TestAttemptRecord {
        job_id,
        job_name,
        epoch,
        state,
        total,
        passed,
        failed,
        errored,
        skipped,
        quarantined,
        created_at,
    }
}

/// `TestStore::run_tests`.
pub(crate) async fn run_tests(store: &SqlStore, run_id: &str, failed_only: bool) -> Result<RunTestsRecord> {
    static ATTEMPTS: Sql = Sql::new(|_| {
        "SELECT a.job_id, j.name, a.epoch, a.state, a.total, a.passed, a.failed, a.errored, a.skipped, \
         a.quarantined, a.created_at FROM test_attempts a JOIN jobs j ON j.id = a.job_id WHERE a.run_id = $1 \
         ORDER BY j.job_index, a.epoch"
            .to_string()
    });
    static REPORTS: Sql = Sql::new(|_| {
        "SELECT r.job_id, j.name, r.epoch, r.path, r.format, r.truncated, r.annotations, r.tests FROM test_reports r \
         JOIN test_attempts a ON a.job_id = r.job_id AND a.epoch = r.epoch JOIN jobs j ON j.id = r.job_id \
         WHERE a.run_id = $1 AND a.epoch = (SELECT MAX(b.epoch) FROM test_attempts b WHERE b.job_id = a.job_id) \
         ORDER BY j.job_index, r.path"
            .to_string()
    });
    static TESTS: Sql = Sql::new(|_| {
        format!(
            "SELECT {TEST_COLS} FROM test_results t \
             JOIN test_attempts a ON a.job_id = t.job_id AND a.epoch = t.epoch JOIN jobs j ON j.id = t.job_id \
             JOIN test_reports r ON r.id = t.report_id \
             WHERE a.run_id = $1 AND a.epoch = (SELECT MAX(b.epoch) FROM test_attempts b WHERE b.job_id = a.job_id) \
             AND ($2 = 0 OR t.outcome IN ('failed', 'error')) ORDER BY j.job_index, r.path, t.seq"
        )
    });
    let mut c = store.reader().await?;
    let (repo_id, status): (String, String) = c
        .sql("SELECT repo_id, status FROM runs WHERE id = $1")
        .bind(run_id)
        .optional()
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
    let attempts = c.sql(&ATTEMPTS).bind(run_id).all::<AttemptRow>().await?.into_iter().map(attempt_of).collect();
    let reports = c
        .sql(&REPORTS)
        .bind(run_id)
        .all::<(String, String, i64, String, String, i64, String, i64)>()
        .await?
        .into_iter()
        .map(|(job_id, job_name, epoch, path, format, truncated, annotations, tests)| TestReportRecord {
            job_id,
            job_name,
            epoch,
            path,
            format,
            truncated: truncated != 0,
            annotations,
            tests,
        })
        .collect();
    let rows = c.sql(&TESTS).bind(run_id).bind(i64::from(failed_only)).fetch_all().await?;
    let tests = rows.iter().map(test_from_row).collect::<Result<Vec<_>>>()?;
    let flaky: Vec<(String, i64, i64)> = c
        .sql("SELECT test_id, passes, failures FROM test_flakes WHERE run_id = $1 ORDER BY test_id")
        .bind(run_id)
        .all()
        .await?;
    let now = now(&mut c).await?;
    let quarantined = active_ids(&mut c, &repo_id, now).await?;
    let decided = status.parse::<kiln_core::RunStatus>().is_ok_and(|s| s.is_terminal());
    Ok(RunTestsRecord { repo_id, attempts, reports, tests, flaky, quarantined, decided })
}

/// `TestStore::test_history`: newest first.
pub(crate) async fn test_history(
    store: &SqlStore,
    repo_id: &str,
    test_id: &str,
    limit: u32,
) -> Result<Vec<TestHistoryRecord>> {
    static SQL: Sql = Sql::new(|_| {
        "SELECT t.run_id, r.run_number, r.commit_sha, r.git_ref, j.name AS job_name, t.epoch, t.outcome, t.duration_ms, \
         t.message, t.created_at, \
         CAST(CASE WHEN EXISTS (SELECT 1 FROM test_flakes f WHERE f.run_id = t.run_id AND f.test_id = t.test_id) \
         THEN 1 ELSE 0 END AS BIGINT) AS flaky \
         FROM test_results t JOIN test_attempts a ON a.job_id = t.job_id AND a.epoch = t.epoch \
         JOIN runs r ON r.id = t.run_id JOIN jobs j ON j.id = t.job_id \
         WHERE t.repo_id = $1 AND t.test_id = $2 ORDER BY t.created_at DESC, t.epoch DESC LIMIT $3"
            .to_string()
    });
    let rows = store.reader().await?.sql(&SQL).bind(repo_id).bind(test_id).bind(i64::from(limit)).fetch_all().await?;
    rows.iter()
        .map(|row| {
            Ok(TestHistoryRecord {
                run_id: row.get("run_id")?,
                run_number: row.get("run_number")?,
                commit_sha: row.get("commit_sha")?,
                git_ref: row.get("git_ref")?,
                job_name: row.get("job_name")?,
                epoch: row.get("epoch")?,
                outcome: row.get("outcome")?,
                duration_ms: row.get("duration_ms")?,
                message: row.get("message")?,
                created_at: row.get("created_at")?,
                flaky: row.get::<i64>("flaky")? != 0,
            })
        })
        .collect()
}

/// `TestStore::test_durations`: each test's latest recorded duration in
/// runs of `git_ref` (executed tests of bound attempts).
pub(crate) async fn test_durations(store: &SqlStore, repo_id: &str, git_ref: &str) -> Result<BTreeMap<String, i64>> {
    static SQL: Sql = Sql::new(|_| {
        "SELECT t.test_id, t.duration_ms FROM test_results t \
         JOIN test_attempts a ON a.job_id = t.job_id AND a.epoch = t.epoch JOIN runs r ON r.id = t.run_id \
         WHERE t.repo_id = $1 AND r.git_ref = $2 AND t.duration_ms IS NOT NULL AND t.outcome <> 'skipped' \
         ORDER BY t.created_at DESC LIMIT 500000"
            .to_string()
    });
    let rows: Vec<(String, i64)> = store.reader().await?.sql(&SQL).bind(repo_id).bind(git_ref).all().await?;
    let mut out = BTreeMap::new();
    for (id, ms) in rows {
        out.entry(id).or_insert(ms);
    }
    Ok(out)
}

const Q_COLS: &str =
    "id, repo_id, test_id, owner, reason, link, created_by, created_at, expires_at, ended_at, ended_by";

fn quarantine_from_row(row: &Row) -> Result<QuarantineRecord> {
    Ok(QuarantineRecord {
        id: row.get("id")?,
        repo_id: row.get("repo_id")?,
        test_id: row.get("test_id")?,
        owner: row.get("owner")?,
        reason: row.get("reason")?,
        link: row.get("link")?,
        created_by: row.get("created_by")?,
        created_at: row.get("created_at")?,
        expires_at: row.get("expires_at")?,
        ended_at: row.get("ended_at")?,
        ended_by: row.get("ended_by")?,
    })
}

/// The size of a repository's suite, for the quarantine cap: the distinct
/// tests of its latest run with bound reports.
async fn suite_size(tx: &mut Tx, repo_id: &str) -> Result<i64> {
    let run: Option<String> = tx
        .sql("SELECT run_id FROM test_attempts WHERE repo_id = $1 ORDER BY created_at DESC LIMIT 1")
        .bind(repo_id)
        .scalar_optional()
        .await?;
    let Some(run) = run else { return Ok(0) };
    tx.sql(
        "SELECT COUNT(DISTINCT t.test_id) FROM test_results t \
         JOIN test_attempts a ON a.job_id = t.job_id AND a.epoch = t.epoch WHERE a.run_id = $1",
    )
    .bind(run)
    .scalar()
    .await
}

/// How many tests may be quarantined in a suite of `suite` tests.
pub fn quarantine_cap(suite: i64, max_percent: f64) -> i64 {
    ((suite as f64 * max_percent / 100.0).floor() as i64).max(1)
}

/// A test's open quarantine (`$1` repository, `$2` test).
static OPEN_QUARANTINE: Sql = Sql::new(|_| {
    format!("SELECT {Q_COLS} FROM test_quarantine WHERE repo_id = $1 AND test_id = $2 AND ended_at IS NULL")
});

/// `TestStore::quarantine_test`.
pub(crate) async fn quarantine_test(store: &SqlStore, q: &NewQuarantine) -> Result<QuarantineRecord> {
    static GET: Sql = Sql::new(|_| format!("SELECT {Q_COLS} FROM test_quarantine WHERE id = $1"));
    store
        .transaction(Isolation::Serializable, q, |tx, q| {
            Box::pin(async move {
                let now = now(tx).await?;
                expire_due(tx, now).await?;
                if let Some(row) = tx.sql(&OPEN_QUARANTINE).bind(&q.repo_id).bind(&q.test_id).fetch_optional().await? {
                    let open = quarantine_from_row(&row)?;
                    return Err(StoreError::Conflict(format!(
                        "`{}` is already quarantined (owner {}, until {} ms since the epoch); unquarantine it first \
                         to change it",
                        q.test_id, open.owner, open.expires_at
                    )));
                }
                let active: i64 = tx
                    .sql("SELECT COUNT(*) FROM test_quarantine WHERE repo_id = $1 AND ended_at IS NULL")
                    .bind(&q.repo_id)
                    .scalar()
                    .await?;
                let suite = suite_size(tx, &q.repo_id).await?;
                let cap = quarantine_cap(suite, q.max_percent);
                if active + 1 > cap {
                    return Err(StoreError::Invalid(format!(
                        "the quarantine cap is reached: at most {cap} test(s) may be quarantined ({}% of the {suite} \
                         tests of the latest run with reports; at least one); {active} already are. Fix or \
                         unquarantine one first, or raise the server's --quarantine-max-percent",
                        q.max_percent
                    )));
                }
                let id = new_id();
                tx.sql(
                    "INSERT INTO test_quarantine (id, repo_id, test_id, owner, reason, link, created_by, created_at, \
                     expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(&id)
                .bind(&q.repo_id)
                .bind(&q.test_id)
                .bind(&q.owner)
                .bind(&q.reason)
                .bind(q.link.as_deref())
                .bind(&q.created_by)
                .bind(now)
                .bind(now.saturating_add(q.expires_in_ms))
                .execute()
                .await?;
                quarantine_from_row(&tx.sql(&GET).bind(&id).fetch_all().await?.remove(0))
            })
        })
        .await
}

/// Ends the open quarantines whose time is up (`ended_by` = `expiry`);
/// returns them.
async fn expire_due(tx: &mut Tx, now: i64) -> Result<Vec<QuarantineRecord>> {
    static DUE: Sql = Sql::new(|_| {
        format!("SELECT {Q_COLS} FROM test_quarantine WHERE ended_at IS NULL AND expires_at <= $1 ORDER BY id")
    });
    let rows = tx.sql(&DUE).bind(now).fetch_all().await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let mut q = quarantine_from_row(row)?;
        tx.sql(
            "UPDATE test_quarantine SET ended_at = expires_at, ended_by = 'expiry' WHERE id = $1 AND ended_at IS NULL",
        )
        .bind(&q.id)
        .execute()
        .await?;
        q.ended_at = Some(q.expires_at);
        q.ended_by = Some("expiry".into());
        out.push(q);
    }
    Ok(out)
}

/// `TestStore::expire_quarantines`.
pub(crate) async fn expire_quarantines(store: &SqlStore) -> Result<Vec<QuarantineRecord>> {
    store
        .transaction(Isolation::Serializable, &(), |tx, _| {
            Box::pin(async move {
                let now = now(tx).await?;
                expire_due(tx, now).await
            })
        })
        .await
}

/// `TestStore::end_quarantine`.
pub(crate) async fn end_quarantine(
    store: &SqlStore,
    repo_id: &str,
    test_id: &str,
    by: &str,
) -> Result<Option<QuarantineRecord>> {
    store
        .transaction(Isolation::Serializable, &(repo_id, test_id, by), |tx, &(repo_id, test_id, by)| {
            Box::pin(async move {
                let now = now(tx).await?;
                expire_due(tx, now).await?;
                let Some(row) = tx.sql(&OPEN_QUARANTINE).bind(repo_id).bind(test_id).fetch_optional().await? else {
                    return Ok(None);
                };
                let mut q = quarantine_from_row(&row)?;
                tx.sql("UPDATE test_quarantine SET ended_at = $1, ended_by = $2 WHERE id = $3")
                    .bind(now)
                    .bind(by)
                    .bind(&q.id)
                    .execute()
                    .await?;
                q.ended_at = Some(now);
                q.ended_by = Some(by.to_string());
                Ok(Some(q))
            })
        })
        .await
}

/// `TestStore::list_quarantine`: open ones, then those ended in the last
/// `ended_within_ms`, newest first.
pub(crate) async fn list_quarantine(
    store: &SqlStore,
    repo_id: &str,
    ended_within_ms: i64,
) -> Result<Vec<QuarantineRecord>> {
    static SQL: Sql = Sql::new(|_| {
        format!(
            "SELECT {Q_COLS} FROM test_quarantine WHERE repo_id = $1 AND (ended_at IS NULL OR ended_at > $2) \
             ORDER BY CASE WHEN ended_at IS NULL THEN 0 ELSE 1 END, created_at DESC"
        )
    });
    let mut c = store.reader().await?;
    let now = now(&mut c).await?;
    let rows = c.sql(&SQL).bind(repo_id).bind(now.saturating_sub(ended_within_ms)).fetch_all().await?;
    rows.iter().map(quarantine_from_row).collect()
}

/// `TestStore::quarantined_ids`: the tests quarantined now.
pub(crate) async fn quarantined_ids(store: &SqlStore, repo_id: &str) -> Result<Vec<String>> {
    let mut c = store.reader().await?;
    let now = now(&mut c).await?;
    active_ids(&mut c, repo_id, now).await
}

/// `TestStore::test_gauges`: per repository name, (tests flagged flaky in
/// the last `window_ms`, tests quarantined now).
pub(crate) async fn test_gauges(store: &SqlStore, window_ms: i64) -> Result<BTreeMap<String, (i64, i64)>> {
    let mut c = store.reader().await?;
    let now = now(&mut c).await?;
    let flaky: Vec<(String, i64)> = c
        .sql(
            "SELECT r.name, COUNT(DISTINCT f.test_id) FROM test_flakes f JOIN repos r ON r.id = f.repo_id \
             WHERE f.decided_at > $1 GROUP BY r.name",
        )
        .bind(now.saturating_sub(window_ms))
        .all()
        .await?;
    let quarantined: Vec<(String, i64)> = c
        .sql(
            "SELECT r.name, COUNT(*) FROM test_quarantine q JOIN repos r ON r.id = q.repo_id \
             WHERE q.ended_at IS NULL AND q.expires_at > $1 GROUP BY r.name",
        )
        .bind(now)
        .all()
        .await?;
    let mut out: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (name, n) in flaky {
        out.entry(name).or_default().0 = n;
    }
    for (name, n) in quarantined {
        out.entry(name).or_default().1 = n;
    }
    Ok(out)
}

/// `TestStore::attempt_tests`: what one bound attempt's reports add up to.
pub(crate) async fn attempt_tests(store: &SqlStore, job_id: &str, epoch: i64) -> Result<Option<TestAttemptRecord>> {
    let row: Option<AttemptRow> = store
        .reader()
        .await?
        .sql(
            "SELECT a.job_id, j.name, a.epoch, a.state, a.total, a.passed, a.failed, a.errored, a.skipped, \
             a.quarantined, a.created_at FROM test_attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.job_id = $1 AND a.epoch = $2",
        )
        .bind(job_id)
        .bind(epoch)
        .optional()
        .await?;
    Ok(row.map(attempt_of))
}

/// A test's verdict per run from its history (newest first): flaky when
/// flagged, failed when it failed on every bound attempt, else passed.
pub fn verdicts_per_run(history: &[TestHistoryRecord]) -> Vec<(String, Verdict)> {
    let mut order: Vec<String> = Vec::new();
    let mut by_run: HashMap<&str, (bool, bool, bool)> = HashMap::new();
    for h in history {
        let e = by_run.entry(h.run_id.as_str()).or_insert_with(|| {
            order.push(h.run_id.clone());
            (false, false, false)
        });
        match h.outcome.as_str() {
            "passed" => e.0 = true,
            "failed" | "error" => e.1 = true,
            _ => {}
        }
        e.2 |= h.flaky;
    }
    order
        .into_iter()
        .filter_map(|run| {
            let (passed, failed, flaky) = by_run[run.as_str()];
            let v = match (flaky || (passed && failed), failed, passed) {
                (true, _, _) => Verdict::Flaky,
                (_, true, _) => Verdict::Failed,
                (_, _, true) => Verdict::Passed,
                _ => return None,
            };
            Some((run, v))
        })
        .collect()
}

/// `TestStore::shard_next`: the next batch of `(run of job, group)` for the
/// live attempt `(job, epoch)`. The first call seeds the queue with
/// `batches` (later calls' are ignored); batches leased to an attempt that
/// is no longer running (and whose completion did not finish them) go back
/// to the queue first.
pub(crate) async fn shard_next(
    store: &SqlStore,
    job_id: &str,
    epoch: i64,
    group: &str,
    batches: &[Vec<String>],
) -> Result<ShardBatch> {
    static RETURN_LOST: Sql = Sql::new(|_| {
        "UPDATE test_shard_batches SET state = 'pending', job_id = NULL, epoch = NULL, leased_at = NULL \
         WHERE run_id = $1 AND grp = $2 AND state = 'leased' AND NOT EXISTS (SELECT 1 FROM attempts a \
         WHERE a.job_id = test_shard_batches.job_id AND a.epoch = test_shard_batches.epoch AND a.outcome = 'running')"
            .to_string()
    });
    store
        .transaction(
            Isolation::Serializable,
            &(job_id, epoch, group, batches),
            |tx, &(job_id, epoch, group, batches)| {
                Box::pin(async move {
                    lock_job(tx, job_id).await?;
                    let (job, _, now) = require_live(tx, job_id, epoch).await?;
                    let seeded: i64 = tx
                        .sql("SELECT COUNT(*) FROM test_shard_batches WHERE run_id = $1 AND grp = $2")
                        .bind(&job.run_id)
                        .bind(group)
                        .scalar()
                        .await?;
                    if seeded == 0 {
                        for (i, b) in batches.iter().enumerate() {
                            let tests = serde_json::to_string(b).map_err(|e| StoreError::Invalid(e.to_string()))?;
                            tx.sql(
                                "INSERT INTO test_shard_batches (run_id, grp, batch_no, tests, state, created_at) \
                             VALUES ($1, $2, $3, $4, 'pending', $5) ON CONFLICT (run_id, grp, batch_no) DO NOTHING",
                            )
                            .bind(&job.run_id)
                            .bind(group)
                            .bind(i as i64)
                            .bind(tests)
                            .bind(now)
                            .execute()
                            .await?;
                        }
                    }
                    tx.sql(&RETURN_LOST).bind(&job.run_id).bind(group).execute().await?;
                    let next: Option<(i64, String)> = tx
                        .sql(
                            "SELECT batch_no, tests FROM test_shard_batches WHERE run_id = $1 AND grp = $2 \
                         AND state = 'pending' ORDER BY batch_no LIMIT 1",
                        )
                        .bind(&job.run_id)
                        .bind(group)
                        .optional()
                        .await?;
                    let mut out = ShardBatch::default();
                    if let Some((no, tests)) = next {
                        tx.sql(
                            "UPDATE test_shard_batches SET state = 'leased', job_id = $1, epoch = $2, leased_at = $3 \
                         WHERE run_id = $4 AND grp = $5 AND batch_no = $6 AND state = 'pending'",
                        )
                        .bind(job_id)
                        .bind(epoch)
                        .bind(now)
                        .bind(&job.run_id)
                        .bind(group)
                        .bind(no)
                        .execute()
                        .await?;
                        out.batch = Some(no);
                        out.tests = serde_json::from_str(&tests).unwrap_or_default();
                    }
                    let counts: Vec<(String, i64)> = tx
                    .sql(
                        "SELECT state, COUNT(*) FROM test_shard_batches WHERE run_id = $1 AND grp = $2 GROUP BY state",
                    )
                    .bind(&job.run_id)
                    .bind(group)
                    .all()
                    .await?;
                    for (state, n) in counts {
                        out.total += n;
                        match state.as_str() {
                            "pending" => out.pending = n,
                            "leased" => out.leased = n,
                            _ => {}
                        }
                    }
                    Ok(out)
                })
            },
        )
        .await
}

/// In a completion that bound the attempt's reports: the batches it was
/// handed are done.
pub(crate) async fn finish_batches(tx: &mut Tx, job_id: &str, epoch: i64) -> Result<()> {
    tx.sql("UPDATE test_shard_batches SET state = 'done' WHERE job_id = $1 AND epoch = $2 AND state = 'leased'")
        .bind(job_id)
        .bind(epoch)
        .execute()
        .await?;
    Ok(())
}

/// `TestStore::collect_staged_reports`: reports staged by attempts that
/// ended without binding them (fenced, lost) more than `grace_ms` ago are
/// never read: delete them (at most `limit` files). Returns how many.
pub(crate) async fn collect_staged_reports(store: &SqlStore, grace_ms: i64, limit: u32) -> Result<u64> {
    static UNBOUND: Sql = Sql::new(|_| {
        "SELECT r.id FROM test_reports r WHERE r.created_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM test_attempts a WHERE a.job_id = r.job_id AND a.epoch = r.epoch) \
         AND NOT EXISTS (SELECT 1 FROM attempts t WHERE t.job_id = r.job_id AND t.epoch = r.epoch \
         AND t.outcome = 'running') ORDER BY r.created_at LIMIT $2"
            .to_string()
    });
    store
        .transaction(Isolation::Serializable, &(grace_ms, limit), |tx, &(grace_ms, limit)| {
            Box::pin(async move {
                let now = now(tx).await?;
                let ids: Vec<String> =
                    tx.sql(&UNBOUND).bind(now.saturating_sub(grace_ms)).bind(i64::from(limit)).scalars().await?;
                for id in &ids {
                    tx.sql("DELETE FROM test_results WHERE report_id = $1").bind(id).execute().await?;
                    tx.sql("DELETE FROM test_reports WHERE id = $1").bind(id).execute().await?;
                }
                Ok(ids.len() as u64)
            })
        })
        .await
}
