//! Test reports, flaky tests, quarantine and timings (issue 43): the
//! agent's report upload (attempt token) and the public reads and
//! quarantine management.

use super::body::parse;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::{runs, test_reports};
use crate::state::State;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State as S};
use axum::http::StatusCode;
use kiln_api as api;

/// Most bytes of one report upload (one parsed report file).
pub(crate) const MAX_REPORT_BODY: usize = 16 * 1024 * 1024;

#[utoipa::path(
    operation_id = "attempts_stage_report",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/reports", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::ReportUpload,
    responses(
        (status = 200, description = "Staged for the attempt's completion to bind (`staged: false`: that path was staged already)", body = api::ReportAck),
    ),
    security(("attempt_token" = [])),
)]
pub(crate) async fn stage(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ReportAck>> {
    // Up to 16 MiB of JSON: parsed and checked off the async runtime.
    let report = tokio::task::spawn_blocking(move || parse::<api::ReportUpload>(&body).and_then(test_reports::staged))
        .await
        .map_err(|e| crate::error::ApiErr::internal(e.to_string()))??;
    Ok(Json(test_reports::stage(&state, &job, epoch, report).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct RunTestsQuery {
    failed: Option<bool>,
}

/// `GET /v1/workflow-runs/{run}/tests[?failed=true]`.
#[utoipa::path(
    operation_id = "runs_tests",
    get, path = "/v1/workflow-runs/{run}/tests", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("failed" = Option<bool>, Query, description = "Only failed and errored tests"),
    ),
    responses(
        (status = 200, description = "The run's tests: each job's last attempt's, failed first", body = api::RunTests),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn run_tests(
    S(state): S<State>,
    Path(run): Path<String>,
    Query(q): Query<RunTestsQuery>,
) -> ApiResult<Json<api::RunTests>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(test_reports::run_tests(&state, &run, q.failed.unwrap_or(false)).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct HistoryQuery {
    id: String,
    limit: Option<u32>,
}

/// `GET /v1/repos/{repo}/tests/history?id=TEST_ID`.
#[utoipa::path(
    operation_id = "repos_test_history",
    get, path = "/v1/repos/{repo}/tests/history", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("id" = String, Query, description = "The test's id, as `kiln tests RUN` shows it"),
        ("limit" = Option<u32>, Query, description = "Most results (default 100, at most 1000)"),
    ),
    responses((status = 200, description = "The test's results, newest first, and its flake rate", body = api::TestHistory)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn history(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Json<api::TestHistory>> {
    Ok(Json(test_reports::history(&state, &repo, &q.id, q.limit.unwrap_or(100)).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct TimingsQuery {
    #[serde(rename = "ref")]
    git_ref: Option<String>,
}

/// `GET /v1/repos/{repo}/tests/timings?ref=REF`.
#[utoipa::path(
    operation_id = "repos_test_timings",
    get, path = "/v1/repos/{repo}/tests/timings", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("ref" = Option<String>, Query, description = "A branch or ref; the default branch's timings when it has none"),
    ),
    responses((status = 200, description = "Each test's latest duration", body = api::TestTimings)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn timings(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<TimingsQuery>,
) -> ApiResult<Json<api::TestTimings>> {
    Ok(Json(test_reports::timings(&state, &repo, q.git_ref.as_deref()).await?))
}

#[utoipa::path(
    operation_id = "repos_quarantine_add",
    post, path = "/v1/repos/{repo}/quarantine", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),),
    request_body(content = api::CreateQuarantine, content_type = "application/json"),
    responses((status = 201, description = "The quarantine", body = api::Quarantine)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn quarantine(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::Quarantine>)> {
    let req: api::CreateQuarantine = parse(&body)?;
    Ok((StatusCode::CREATED, Json(test_reports::quarantine(&state, &by, &repo, req).await?)))
}

#[derive(serde::Deserialize)]
pub(crate) struct TestIdQuery {
    id: String,
}

#[utoipa::path(
    operation_id = "repos_quarantine_remove",
    delete, path = "/v1/repos/{repo}/quarantine", tag = "repos",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("id" = String, Query, description = "The quarantined test's id"),
    ),
    responses((status = 200, description = "The quarantine, ended", body = api::Quarantine)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn unquarantine(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    Query(q): Query<TestIdQuery>,
) -> ApiResult<Json<api::Quarantine>> {
    Ok(Json(test_reports::unquarantine(&state, &by, &repo, &q.id).await?))
}

#[utoipa::path(
    operation_id = "repos_quarantine_list",
    get, path = "/v1/repos/{repo}/quarantine", tag = "repos",
    params(("repo" = String, Path, description = "The repository's name"),),
    responses((status = 200, description = "Open quarantines, then those ended in the last 30 days", body = crate::handlers::answers::QuarantineList)),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn quarantine_list(
    S(state): S<State>,
    Path(repo): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let list = test_reports::list(&state, &repo).await?;
    Ok(Json(serde_json::json!({ "quarantine": list })))
}

/// `GET /v1/jobs/{job}/attempts/{epoch}/timings`: the recorded durations a
/// job's `kiln tests split` uses (its run's branch, else the default
/// branch), written by the agent to `$KILN_TEST_TIMINGS`.
#[utoipa::path(
    operation_id = "attempts_test_timings",
    get, path = "/v1/jobs/{job}/attempts/{epoch}/timings", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    responses((status = 200, description = "Each test's latest duration", body = api::TestTimings)),
    security(("attempt_token" = [])),
)]
pub(crate) async fn attempt_timings(
    S(state): S<State>,
    Path((job, _epoch)): Path<(String, i64)>,
) -> ApiResult<Json<api::TestTimings>> {
    Ok(Json(test_reports::timings_of_job(&state, &job).await?))
}

/// `POST /v1/jobs/{job}/attempts/{epoch}/shards/next`: `kiln tests next`
/// in a step, with the attempt's shard capability.
#[utoipa::path(
    operation_id = "attempts_shard_next",
    post, path = "/v1/jobs/{job}/attempts/{epoch}/shards/next", tag = "agent",
    params(
        ("job" = String, Path, description = "The job's id"),
        ("epoch" = i64, Path, description = "The attempt's epoch"),
    ),
    request_body = api::ShardNext,
    responses((status = 200, description = "The next batch leased to this attempt, or none left", body = api::ShardBatch)),
    security(("attempt_token" = [])),
)]
pub(crate) async fn shard_next(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ShardBatch>> {
    let req: api::ShardNext = tokio::task::spawn_blocking(move || parse(&body))
        .await
        .map_err(|e| crate::error::ApiErr::internal(e.to_string()))??;
    Ok(Json(test_reports::shard_next(&state, &job, epoch, req).await?))
}
