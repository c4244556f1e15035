//! Workflow runs: submit and list (per repository), get, cancel, retry.

use super::body::{json_blocking, parse};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::services::acceptance::{self, Submission};
use crate::services::{run_feed, runs};
use crate::state::State;
use axum::body::Bytes;
use axum::extract::{Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::{Extension, Json};
use futures::{Stream, StreamExt};
use kiln_api as api;
use std::convert::Infallible;
use std::time::Duration;
use tracing::Instrument;

/// `POST /v1/repos/{repo}/workflow-runs` (`Idempotency-Key` header) → 202.
#[utoipa::path(
    operation_id = "runs_submit",
    post, path = "/v1/repos/{repo}/workflow-runs", tag = "runs",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("Idempotency-Key" = Option<String>, Header, description = "The same key returns the same run; with a different body, 409"),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: the run's trace becomes a child of it"),
    ),
    request_body = api::SubmitRun,
    responses(
        (status = 202, description = "The run, accepted", body = api::SubmitRunResponse),
        (status = 409, description = "The `Idempotency-Key` was used with a different body (`idempotency_key_reused`)", body = api::ErrorBody),
        (status = 422, description = "The workflow is not valid, or its inputs are not (`invalid`)", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn submit(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(repo): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let request: api::SubmitRun = parse(&body)?;
    let idempotency_key = headers.get("idempotency-key").map(|v| v.as_bytes().to_vec());
    // The run's trace (issue 19) begins with this trigger, a child of the
    // submitter's `traceparent` when it sent a valid one (an invalid one
    // starts a new trace, as W3C Trace Context says).
    let parent = headers.get(api::trace::HEADER).and_then(|v| v.to_str().ok()).and_then(api::trace::TraceParent::parse);
    let span = tracing::info_span!("trigger", trigger = "api", repo = %repo, trace_id = tracing::field::Empty);
    let trace = Some(api::trace::enter(&span, parent));
    let (run_id, job_labels) =
        acceptance::submit_labelled(&state, Submission { repo, request, idempotency_key, by, trace })
            .instrument(span)
            .await?;
    let warnings = acceptance::warnings(&state, &job_labels).await;
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id, warnings })))
}

/// `GET /v1/repos/{repo}/workflow-runs?status=…&branch=…&limit=…`, newest first.
#[utoipa::path(
    operation_id = "runs_list",
    get, path = "/v1/repos/{repo}/workflow-runs", tag = "runs",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("status" = Option<api::RunStatus>, Query, description = "Only runs with this status"),
        ("branch" = Option<String>, Query, description = "Only runs of this branch"),
        ("event" = Option<String>, Query, description = "Only runs of this event (`push`, `pull_request`, `manual`, `schedule`)"),
        ("actor" = Option<String>, Query, description = "Only runs caused by this actor"),
        ("before" = Option<String>, Query, description = "A run id: only runs listed after it (older); the previous page's `next_before`"),
        ("limit" = Option<u32>, Query, description = "At most this many runs"),
    ),
    responses(
        (status = 200, description = "The repository's runs, newest first", body = api::RunList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<runs::ListFilter>,
) -> ApiResult<Response> {
    json_blocking(runs::list(&state, Some(&repo), &q).await?).await
}

/// `GET /v1/workflow-runs?repo=…&status=…&branch=…&limit=…`: every
/// repository's runs, newest first.
#[utoipa::path(
    operation_id = "runs_list_all",
    get, path = "/v1/workflow-runs", tag = "runs",
    params(
        ("repo" = Option<String>, Query, description = "Only this repository's runs"),
        ("status" = Option<api::RunStatus>, Query, description = "Only runs with this status"),
        ("branch" = Option<String>, Query, description = "Only runs of this branch"),
        ("event" = Option<String>, Query, description = "Only runs of this event (`push`, `pull_request`, `manual`, `schedule`)"),
        ("actor" = Option<String>, Query, description = "Only runs caused by this actor"),
        ("before" = Option<String>, Query, description = "A run id: only runs listed after it (older); the previous page's `next_before`"),
        ("limit" = Option<u32>, Query, description = "At most this many runs"),
    ),
    responses(
        (status = 200, description = "Every repository's runs, newest first", body = api::RunList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list_all(S(state): S<State>, Query(q): Query<runs::ListFilter>) -> ApiResult<Response> {
    json_blocking(runs::list(&state, None, &q).await?).await
}

/// `GET /v1/workflow-runs/events?repo=…&status=…&branch=…&event=…&actor=…&limit=…`:
/// the list `GET /v1/workflow-runs` gives, as an SSE `runs` event now and
/// whenever it changes (the web UI's runs page).
#[utoipa::path(
    operation_id = "runs_list_events",
    get, path = "/v1/workflow-runs/events", tag = "runs",
    params(
        ("repo" = Option<String>, Query, description = "Only this repository's runs"),
        ("status" = Option<api::RunStatus>, Query, description = "Only runs with this status"),
        ("branch" = Option<String>, Query, description = "Only runs of this branch"),
        ("event" = Option<String>, Query, description = "Only runs of this event (`push`, `pull_request`, `manual`, `schedule`)"),
        ("actor" = Option<String>, Query, description = "Only runs caused by this actor"),
        ("before" = Option<String>, Query, description = "A run id: only runs listed after it (older); the previous page's `next_before`"),
        ("limit" = Option<u32>, Query, description = "At most this many runs"),
    ),
    responses(
        (status = 200, description = "Server-sent events: `runs` (data: a `RunList`) now and whenever the list changes", content_type = "text/event-stream"),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn list_events(
    S(state): S<State>,
    Query(q): Query<runs::ListFilter>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let feed = run_feed::follow_list(&state, q).await?;
    Ok(sse(feed, "runs"))
}

/// `GET /v1/workflow-runs/{run}/events`: the run as `GET
/// /v1/workflow-runs/{run}` gives it, as an SSE `run` event now and
/// whenever it changes (the web UI's run page).
#[utoipa::path(
    operation_id = "runs_run_events",
    get, path = "/v1/workflow-runs/{run}/events", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "Server-sent events: `run` (data: a `Run`) now and whenever the run changes", content_type = "text/event-stream"),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn run_events(
    S(state): S<State>,
    Path(run): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let run = runs::resolve_id(&state, &run).await?;
    let feed = run_feed::follow_run(&state, run).await?;
    Ok(sse(feed, "run"))
}

fn sse(
    feed: impl Stream<Item = String> + Send + 'static,
    name: &'static str,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(feed.map(move |data| Ok(Event::default().event(name).data(data))))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /v1/workflow-runs/{run}` (a full id or a unique prefix of 8+ characters).
#[utoipa::path(
    operation_id = "runs_get",
    get, path = "/v1/workflow-runs/{run}", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "The run and its jobs", body = api::Run),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn get(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Response> {
    let run = runs::resolve_id(&state, &run).await?;
    json_blocking(runs::get(&state, &run).await?).await
}

#[utoipa::path(
    operation_id = "runs_cancel",
    post, path = "/v1/workflow-runs/{run}/cancel", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "The run, cancelling (or already finished)", body = api::Run),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn cancel(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
) -> ApiResult<Json<api::Run>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(runs::cancel(&state, &by, &run).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct RetryQuery {
    #[serde(default)]
    failed: Option<bool>,
}

/// `POST /v1/workflow-runs/{run}/retry`: a new run with the same frozen
/// definition; with `{"failed": true}` (or `?failed=true`) only the failed
/// jobs and their descendants run again (the rest is pinned).
#[utoipa::path(
    operation_id = "runs_retry",
    post, path = "/v1/workflow-runs/{run}/retry", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("failed" = Option<bool>, Query, description = "Only the failed jobs and their descendants run again"),
    ),
    request_body(content = Option<api::RetryRun>, description = "Optional", content_type = "application/json"),
    responses(
        (status = 202, description = "The new run", body = api::SubmitRunResponse),
        (status = 409, description = "Refused: a retry of failed jobs while the run is active, or none of its jobs failed", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn retry(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path(run): Path<String>,
    Query(q): Query<RetryQuery>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    // An empty body is the plain retry of old clients.
    let req: api::RetryRun = if body.iter().all(u8::is_ascii_whitespace) { Default::default() } else { parse(&body)? };
    let failed = req.failed || q.failed.unwrap_or(false);
    let run = runs::resolve_id(&state, &run).await?;
    let run_id = acceptance::retry(&state, &by, &run, failed).await?;
    let warnings = acceptance::run_warnings(&state, &run_id).await;
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id, warnings })))
}

/// `POST /v1/workflow-runs/{run}/jobs/{job}/retry` (issue 42): a new run
/// in which the job (by name or id; a matrix job's name without its values
/// is every instance) and everything downstream of it run again, the rest
/// of the run's successes pinned. 409 while the run goes on.
#[utoipa::path(
    operation_id = "runs_retry_job",
    post, path = "/v1/workflow-runs/{run}/jobs/{job}/retry", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("job" = String, Path, description = "A job's name or id; a matrix job's name without its values: every instance"),
    ),
    responses(
        (status = 202, description = "The new run: the job and what needs it run again, the other successes pinned", body = api::SubmitRunResponse),
        (status = 409, description = "Refused while the run is active", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn retry_job(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((run, job)): Path<(String, String)>,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let run = runs::resolve_id(&state, &run).await?;
    let run_id = acceptance::retry_jobs(&state, &by, &run, false, Some(&job)).await?;
    let warnings = acceptance::run_warnings(&state, &run_id).await;
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id, warnings })))
}

/// `POST /v1/workflow-runs/{run}/jobs/{job}/cancel` (issue 42): cancel one
/// job of an active run (a matrix job's name without its values: every
/// instance); the run as it now stands. 409 when the run is not active or
/// the job has ended.
#[utoipa::path(
    operation_id = "runs_cancel_job",
    post, path = "/v1/workflow-runs/{run}/jobs/{job}/cancel", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
        ("job" = String, Path, description = "A job's name or id; a matrix job's name without its values: every instance"),
    ),
    responses(
        (status = 200, description = "The run as it now stands", body = api::Run),
        (status = 409, description = "Refused: the run has ended or is cancelling, or the job has ended", body = api::ErrorBody),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn cancel_job(
    S(state): S<State>,
    Extension(by): Extension<Principal>,
    Path((run, job)): Path<(String, String)>,
) -> ApiResult<Json<api::Run>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(runs::cancel_job(&state, &by, &run, &job).await?))
}

/// `GET /v1/workflow-runs/{run}/artifacts` (issue 42): every artifact the
/// run's jobs bound, with size, digest and expiry.
#[utoipa::path(
    operation_id = "runs_artifacts",
    get, path = "/v1/workflow-runs/{run}/artifacts", tag = "runs",
    params(
        ("run" = String, Path, description = "A run: its id, a unique prefix of 8 or more characters, or `REPO#NUMBER`"),
    ),
    responses(
        (status = 200, description = "Every artifact the run's jobs bound, in job order", body = api::RunArtifacts),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn artifacts(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Json<api::RunArtifacts>> {
    let run = runs::resolve_id(&state, &run).await?;
    Ok(Json(runs::artifacts(&state, &run).await?))
}

#[derive(serde::Deserialize)]
pub(crate) struct InputsQuery {
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    workflow: Option<String>,
}

#[derive(serde::Deserialize)]
pub(crate) struct WorkflowsQuery {
    #[serde(rename = "ref")]
    git_ref: Option<String>,
}

/// `GET /v1/repos/{repo}/workflows?ref=…`: the workflow files at that ref
/// (default `HEAD`) and which a run without a workflow path starts.
#[utoipa::path(
    operation_id = "runs_workflows",
    get, path = "/v1/repos/{repo}/workflows", tag = "runs",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("ref" = Option<String>, Query, description = "A branch, tag or commit (default `HEAD`)"),
    ),
    responses(
        (status = 200, description = "The workflow files at that ref", body = api::WorkflowList),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn workflows(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<WorkflowsQuery>,
) -> ApiResult<Json<api::WorkflowList>> {
    let git_ref = q.git_ref.unwrap_or_else(|| "HEAD".into());
    Ok(Json(acceptance::list_workflows(&state, &repo, &git_ref).await?))
}

/// `GET /v1/repos/{repo}/workflow-inputs?ref=…&workflow=…`: the inputs the
/// workflow at that ref declares (default `HEAD` and `.kiln/pipeline.yaml`).
#[utoipa::path(
    operation_id = "runs_workflow_inputs",
    get, path = "/v1/repos/{repo}/workflow-inputs", tag = "runs",
    params(
        ("repo" = String, Path, description = "The repository's name"),
        ("ref" = Option<String>, Query, description = "A branch, tag or commit (default `HEAD`)"),
        ("workflow" = Option<String>, Query, description = "The workflow's path (default `.kiln/pipeline.yaml`)"),
    ),
    responses(
        (status = 200, description = "The inputs the workflow declares", body = api::WorkflowInputs),
    ),
    security(("api_token" = []), ("ui_session" = [])),
)]
pub(crate) async fn workflow_inputs(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<InputsQuery>,
) -> ApiResult<Json<api::WorkflowInputs>> {
    let git_ref = q.git_ref.unwrap_or_else(|| "HEAD".into());
    Ok(Json(acceptance::describe_inputs(&state, &repo, &git_ref, q.workflow.as_deref()).await?))
}
