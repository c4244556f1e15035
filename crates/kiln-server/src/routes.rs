//! HTTP routes: the public API (admin token), the agent API (agent token),
//! health endpoints and the embedded UI.

use crate::error::{ApiErr, ApiResult};
use crate::{State, artifacts, auth, views};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State as S};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use base64::Engine;
use futures::Stream;
use kiln_api as api;
use kiln_core::{AttemptOutcome, JobStatus, logs};
use kiln_store::{ClaimInput, Idempotency, NewLogChunk, NewRun, StoreError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::time::Duration;

/// Largest accepted JSON body (log chunks are ≤ 1 MiB of bytes, base64 grows them).
const MAX_BODY: usize = 2 * 1024 * 1024;
const MAX_CHUNK: usize = 1024 * 1024;

pub fn router(state: State) -> Router {
    let public = Router::new()
        .route("/v1/repos", post(create_repo).get(list_repos))
        .route("/v1/repos/{repo}/workflow-runs", post(submit_run).get(list_runs))
        .route("/v1/repos/{repo}/secrets", get(list_secrets))
        .route("/v1/repos/{repo}/secrets/{name}", axum::routing::put(put_secret).delete(delete_secret))
        .route("/v1/workflow-runs/{run}", get(get_run))
        .route("/v1/workflow-runs/{run}/cancel", post(cancel_run))
        .route("/v1/workflow-runs/{run}/retry", post(retry_run))
        .route("/v1/jobs/{job}/logs/events", get(log_events))
        .route("/v1/workflow-runs/{run}/artifacts/{job}/{name}", get(artifacts::get_artifact))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_admin));
    let agent = Router::new()
        .route("/v1/agents/register", post(register_agent))
        .route("/v1/agents/{agent}/claim", post(claim))
        .route("/v1/jobs/{job}/attempts/{epoch}/heartbeat", post(heartbeat))
        .route("/v1/jobs/{job}/attempts/{epoch}/logs", post(append_log))
        .route("/v1/jobs/{job}/attempts/{epoch}/complete", post(complete))
        .route("/v1/jobs/{job}/attempts/{epoch}/image", post(commit_image))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts", post(artifacts::create_upload))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/parts/{part}", post(artifacts::part_url))
        .route("/v1/jobs/{job}/attempts/{epoch}/artifacts/{generation}/seal", post(artifacts::seal))
        .route("/v1/jobs/{job}/attempts/{epoch}/restore", post(artifacts::restore))
        .route("/v1/agents/{agent}/session", get(session))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_agent));
    // Data plane: capability URLs, no bearer token, bodies streamed to disk.
    let blob = Router::new()
        .route("/blob/uploads/{generation}/parts/{part}", axum::routing::put(artifacts::put_part))
        .route("/blob/objects/{generation}", get(artifacts::get_object))
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(public)
        .merge(agent)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/", get(ui))
        .fallback(|| async { ApiErr::not_found("no such endpoint") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .merge(blob)
        .with_state(state)
}

pub(crate) fn parse<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiErr::bad_request(format!("invalid JSON body: {e}")))
}

async fn readyz(S(state): S<State>) -> Response {
    match state.store.list_repos().await {
        Ok(_) => (StatusCode::OK, "ready").into_response(),
        Err(e) => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, api::codes::UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// Prometheus text exposition (more series arrive with the reliability layer).
async fn metrics(S(state): S<State>) -> impl IntoResponse {
    let body = format!(
        "# HELP kiln_dispatch_queue_depth Deliveries waiting in dispatch queues.\n\
         # TYPE kiln_dispatch_queue_depth gauge\n\
         kiln_dispatch_queue_depth {}\n",
        state.dispatcher.depth()
    );
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

async fn ui() -> Html<&'static str> {
    Html(include_str!("../assets/index.html"))
}

// ---------- repositories ----------

async fn create_repo(S(state): S<State>, body: Bytes) -> ApiResult<(StatusCode, Json<api::Repo>)> {
    let req: api::CreateRepo = parse(&body)?;
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(ApiErr::invalid("repository name must be 1-100 characters of [A-Za-z0-9._-]"));
    }
    kiln_api::giturl::check_clone_url(req.clone_url.trim()).map_err(ApiErr::invalid)?;
    let repo = state.store.create_repo(name, req.clone_url.trim(), req.webhook_secret.as_deref()).await?;
    Ok((
        StatusCode::CREATED,
        Json(api::Repo { id: repo.id, name: repo.name, clone_url: repo.clone_url, created_at_ms: repo.created_at }),
    ))
}

async fn list_repos(S(state): S<State>) -> ApiResult<Json<serde_json::Value>> {
    let repos: Vec<api::Repo> = state
        .store
        .list_repos()
        .await?
        .into_iter()
        .map(|r| api::Repo { id: r.id, name: r.name, clone_url: r.clone_url, created_at_ms: r.created_at })
        .collect();
    Ok(Json(serde_json::json!({ "repos": repos })))
}

// ---------- runs ----------

// ---------- secrets ----------

/// Largest secret value accepted.
const MAX_SECRET: usize = 64 * 1024;

fn secret_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

async fn put_secret(
    S(state): S<State>,
    Path((repo, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<api::SecretInfo>> {
    let req: api::PutSecret = parse(&body)?;
    let repo = state.store.get_repo(&repo).await?;
    if !secret_name_ok(&name) {
        return Err(ApiErr::bad_request(format!(
            "`{name}` is not a valid secret name; use letters, digits and `_`, not starting with a digit"
        )));
    }
    if req.value.is_empty() || req.value.len() > MAX_SECRET {
        return Err(ApiErr::bad_request(format!("a secret value is 1 to {MAX_SECRET} bytes")));
    }
    state.store.put_secret(&repo.id, &name, &req.value).await?;
    let updated_at_ms =
        state.store.list_secrets(&repo.id).await?.into_iter().find(|(n, _)| *n == name).map_or(0, |(_, t)| t);
    Ok(Json(api::SecretInfo { name, updated_at_ms }))
}

async fn list_secrets(S(state): S<State>, Path(repo): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    let repo = state.store.get_repo(&repo).await?;
    let secrets: Vec<api::SecretInfo> = state
        .store
        .list_secrets(&repo.id)
        .await?
        .into_iter()
        .map(|(name, updated_at_ms)| api::SecretInfo { name, updated_at_ms })
        .collect();
    Ok(Json(serde_json::json!({ "secrets": secrets })))
}

async fn delete_secret(
    S(state): S<State>,
    Path((repo, name)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let repo = state.store.get_repo(&repo).await?;
    if !state.store.delete_secret(&repo.id, &name).await? {
        return Err(ApiErr::not_found(format!("secret {name} not found in repository {}", repo.name)));
    }
    Ok(Json(serde_json::json!({ "deleted": name })))
}

async fn submit_run(
    S(state): S<State>,
    Path(repo): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let req: api::SubmitRun = parse(&body)?;
    let repo = state.store.get_repo(&repo).await?;
    let idempotency = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v.to_str().map_err(|_| ApiErr::bad_request("Idempotency-Key must be ASCII"))?;
            if key.is_empty() || key.len() > 200 {
                return Err(ApiErr::bad_request("Idempotency-Key must be 1-200 characters"));
            }
            // The digest covers the request as sent (canonical JSON), so a
            // redelivery matches even if a branch moved since.
            let canonical = serde_json::to_vec(&serde_json::to_value(&req).expect("request")).expect("json");
            Some(Idempotency {
                scope: format!("admin:{}", repo.id),
                key: key.to_string(),
                request_digest: hex::encode(Sha256::digest(&canonical)),
            })
        }
    };
    let event = req.event.clone().unwrap_or_else(|| "manual".into());
    if !["manual", "push", "pull_request", "retry", "schedule"].contains(&event.as_str()) {
        return Err(ApiErr::invalid(format!("unknown event `{event}`")));
    }
    let workflow_path = req.workflow_path.clone().unwrap_or_else(|| api::DEFAULT_WORKFLOW_PATH.to_string());
    let sha = state.mirrors.resolve(&repo.id, &repo.clone_url, req.commit_sha.trim()).await.map_err(|e| match e {
        crate::git::GitError::UnknownRevision(_) => ApiErr::invalid(e.to_string()),
        crate::git::GitError::Fetch { .. } => {
            ApiErr::new(StatusCode::BAD_GATEWAY, api::codes::UNAVAILABLE, e.to_string())
        }
        _ => ApiErr::internal(e.to_string()),
    })?;
    let bytes = state
        .mirrors
        .read_file(&repo.id, &sha, &workflow_path, kiln_workflow::MAX_FILE_BYTES)
        .await
        .map_err(|e| ApiErr::invalid(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| ApiErr::invalid(format!("{workflow_path} is not UTF-8")))?;
    let workflow = kiln_workflow::parse(&text)
        .map_err(|d| ApiErr::invalid(format!("{workflow_path} at {sha} is not a valid workflow:\n{d}")))?;
    let wanted: Vec<String> = workflow.jobs.iter().flat_map(|j| j.secrets.iter().cloned()).collect();
    if !wanted.is_empty() {
        let have = state.store.secret_values(&repo.id, &wanted).await?;
        let mut missing: Vec<&str> = wanted.iter().filter(|n| !have.contains_key(*n)).map(String::as_str).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            return Err(ApiErr::invalid(format!(
                "{workflow_path} asks for secrets that repository {} does not have: {}; add them with `kiln secret set {} NAME`",
                repo.name,
                missing.join(", "),
                repo.name
            )));
        }
    }
    let git_ref = (req.commit_sha.trim() != sha).then(|| req.commit_sha.trim().to_string());
    let concurrency = run_concurrency(&workflow, &event, git_ref.as_deref(), &req.inputs).map_err(ApiErr::invalid)?;
    let image_digests = resolve_images(&state, &workflow).await?;
    let accepted = state
        .store
        .accept_run(NewRun {
            repo_id: repo.id.clone(),
            commit_sha: sha,
            git_ref,
            event,
            trust: "trusted".into(),
            workflow_path,
            workflow,
            inputs: req.inputs.clone(),
            parent_run_id: None,
            idempotency,
            concurrency,
            image_digests,
        })
        .await?;
    state.relay_wake.notify_one();
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id: accepted.run_id })))
}

/// Pin every `image.ref` of the workflow to a digest (spec 000 §5). An
/// unknown image or tag refuses the run (422); an unreachable registry is 502.
async fn resolve_images(state: &State, wf: &kiln_workflow::Workflow) -> ApiResult<BTreeMap<String, String>> {
    state.resolver.resolve_workflow(wf).await.map_err(|e| match e {
        crate::ResolveError::Refused(m) => ApiErr::invalid(m),
        crate::ResolveError::Unavailable(m) => ApiErr::new(StatusCode::BAD_GATEWAY, api::codes::UNAVAILABLE, m),
    })
}

/// Render the workflow's run-level concurrency group for this trigger.
fn run_concurrency(
    wf: &kiln_workflow::Workflow,
    event: &str,
    git_ref: Option<&str>,
    inputs: &BTreeMap<String, String>,
) -> Result<Option<kiln_store::RunConcurrency>, String> {
    let Some(c) = &wf.concurrency else { return Ok(None) };
    let branch = git_ref.map(|r| r.strip_prefix("refs/heads/").unwrap_or(r).to_string());
    let ctx = kiln_workflow::ConditionContext {
        event: event.to_string(),
        git_ref: git_ref.map(str::to_string),
        branch,
        inputs: inputs.clone(),
        ..Default::default()
    };
    let group = kiln_workflow::render_group(&c.group, &ctx).map_err(|e| format!("concurrency group: {e}"))?;
    Ok(Some(kiln_store::RunConcurrency { group, cancel_in_progress: c.cancel_in_progress }))
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    limit: Option<u32>,
}

async fn list_runs(
    S(state): S<State>,
    Path(repo): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<api::RunList>> {
    let repo = state.store.get_repo(&repo).await?;
    if let Some(s) = &q.status {
        s.parse::<kiln_core::RunStatus>().map_err(ApiErr::bad_request)?;
    }
    let runs = state.store.list_runs(&repo.id, q.status.as_deref(), q.limit.unwrap_or(50).min(500)).await?;
    Ok(Json(api::RunList { runs: runs.iter().map(views::summary).collect() }))
}

async fn get_run(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Json<api::Run>> {
    let view = state.store.get_run(&run).await?;
    let bindings = state.store.run_bindings(&run).await?;
    Ok(Json(views::run(&view, &bindings)))
}

async fn cancel_run(S(state): S<State>, Path(run): Path<String>) -> ApiResult<Json<api::Run>> {
    state.store.cancel_run(&run).await?;
    let view = state.store.get_run(&run).await?;
    for j in &view.jobs {
        let _ = state.job_events.send(j.job.id.clone());
        if let Some(a) = j.attempts.iter().find(|a| a.outcome == kiln_core::AttemptOutcome::Running) {
            let _ = state.cancel_events.send(crate::CancelEvent {
                session: a.session_id.clone(),
                job_id: j.job.id.clone(),
                epoch: a.epoch,
            });
        }
    }
    let bindings = state.store.run_bindings(&run).await?;
    Ok(Json(views::run(&view, &bindings)))
}

async fn retry_run(
    S(state): S<State>,
    Path(run): Path<String>,
) -> ApiResult<(StatusCode, Json<api::SubmitRunResponse>)> {
    let old_view = state.store.get_run(&run).await?;
    // Same pinned definition, same pinned images: registry digests are
    // copied, never re-resolved (a moved tag must not change what a retry
    // runs). Built images are rebuilt by the new run.
    let image_digests: BTreeMap<String, String> = old_view
        .jobs
        .iter()
        .filter(|j| {
            matches!(
                old_view.run.definition.job(&j.job.name).and_then(|d| d.image.as_ref()),
                Some(kiln_workflow::Image::Ref { .. })
            )
        })
        .filter_map(|j| Some((j.job.name.clone(), j.job.image_digest.clone()?)))
        .collect();
    let old = old_view.run;
    let concurrency =
        run_concurrency(&old.definition, "retry", old.git_ref.as_deref(), &old.inputs).map_err(ApiErr::invalid)?;
    let accepted = state
        .store
        .accept_run(NewRun {
            concurrency,
            repo_id: old.repo_id,
            commit_sha: old.commit_sha,
            git_ref: old.git_ref,
            event: "retry".into(),
            trust: old.trust,
            workflow_path: old.workflow_path,
            workflow: old.definition,
            inputs: old.inputs,
            parent_run_id: Some(old.id),
            idempotency: None,
            image_digests,
        })
        .await?;
    state.relay_wake.notify_one();
    Ok((StatusCode::ACCEPTED, Json(api::SubmitRunResponse { run_id: accepted.run_id })))
}

// ---------- logs (SSE) ----------

#[derive(Deserialize)]
struct EventsQuery {
    after: Option<i64>,
}

async fn log_events(
    S(state): S<State>,
    Path(job): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    state.store.get_job(&job).await?;
    let cursor = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .or(q.after)
        .unwrap_or(0);
    let stream = async_stream(state, job, cursor);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

fn async_stream(state: State, job: String, mut cursor: i64) -> impl Stream<Item = Result<Event, Infallible>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut events = state.job_events.subscribe();
        let b64 = base64::engine::general_purpose::STANDARD;
        loop {
            let chunks = match crate::logarchive::chunks_after(&state, &job, cursor, 256).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(job, "cannot read log: {e:#}");
                    break;
                }
            };
            let got = !chunks.is_empty();
            for c in chunks {
                cursor = c.id;
                let ev = Event::default().id(c.id.to_string());
                // `seal` and `gap` rows are events of the attempt, not bytes.
                let ev = match c.stream.as_str() {
                    logs::stream::SEAL => ev.event(logs::event::SEALED).data(String::from_utf8_lossy(&c.data)),
                    logs::stream::GAP => ev.event(logs::event::GAP).data(String::from_utf8_lossy(&c.data)),
                    _ => ev
                        .event(logs::event::CHUNK)
                        .json_data(api::LogEvent {
                            epoch: c.epoch,
                            stream: c.stream,
                            offset: c.offset,
                            data: b64.encode(&c.data),
                        })
                        .expect("json"),
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
            if got {
                continue;
            }
            let status = match state.store.get_job(&job).await {
                Ok(j) => j.status,
                Err(_) => break,
            };
            if status.is_terminal() {
                // Chunks are acknowledged before completion: re-read once, then end.
                let rest = crate::logarchive::chunks_after(&state, &job, cursor, 1).await.unwrap_or_default();
                if rest.is_empty() {
                    let ev = Event::default()
                        .id(cursor.to_string())
                        .event(logs::event::END)
                        .json_data(api::LogEnd { status: status.into() })
                        .expect("json");
                    let _ = tx.send(ev).await;
                    return;
                }
                continue;
            }
            // Wait for news about this job (or poll now and then).
            let deadline = tokio::time::sleep(Duration::from_secs(1));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    m = events.recv() => match m {
                        Ok(id) if id == job => break,
                        Ok(_) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(_) => return,
                    },
                    _ = tx.closed() => return,
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}

use futures::StreamExt;

// ---------- agent API ----------

async fn register_agent(S(state): S<State>, body: Bytes) -> ApiResult<Json<api::AgentRegistration>> {
    let req: api::RegisterAgent = parse(&body)?;
    if req.name.trim().is_empty() || req.name.len() > 100 {
        return Err(ApiErr::invalid("agent name must be 1-100 characters"));
    }
    if req.max_jobs == 0 || req.max_jobs > 256 {
        return Err(ApiErr::invalid("max_jobs must be 1-256"));
    }
    let labels = serde_json::to_string(&req.labels).expect("labels");
    let agent = state.store.register_agent(req.name.trim(), &labels, req.max_jobs).await?;
    let ttl = state.config.lease_ttl.as_millis() as u64;
    Ok(Json(api::AgentRegistration {
        agent_id: agent.id,
        session_id: agent.session_id,
        lease_ttl_ms: ttl,
        heartbeat_interval_ms: (ttl / 3).max(50),
    }))
}

fn assignment(state: &State, c: &kiln_store::ClaimedAttempt) -> api::Assignment {
    let def = &c.run.definition.jobs[c.job.index as usize];
    let ttl = state.config.lease_ttl.as_millis() as u64;
    let mut env: BTreeMap<String, String> = def.env.clone();
    for (k, v) in &c.run.inputs {
        let key: String =
            k.chars().map(|ch| if ch.is_ascii_alphanumeric() { ch.to_ascii_uppercase() } else { '_' }).collect();
        env.insert(format!("KILN_INPUT_{key}"), v.clone());
    }
    api::Assignment {
        run_id: c.run.id.clone(),
        job_id: c.job.id.clone(),
        job_name: c.job.name.clone(),
        epoch: c.epoch,
        repo: c.run.repo_name.clone(),
        clone_url: String::new(),
        commit_sha: c.run.commit_sha.clone(),
        steps: def.steps.iter().map(|s| api::StepSpec { name: s.name.clone(), run: s.run.clone() }).collect(),
        env,
        timeout_secs: def.timeout_secs,
        image: def.image.as_ref().and_then(|i| match i {
            kiln_workflow::Image::Ref { reference } => Some(reference.clone()),
            kiln_workflow::Image::Dockerfile { .. } => None,
        }),
        image_digest: c.job.image_digest.clone(),
        image_build: def.image.as_ref().and_then(|i| match i {
            kiln_workflow::Image::Dockerfile { path, context } => {
                Some(api::ImageBuild { dockerfile: path.clone(), context: context.clone() })
            }
            kiln_workflow::Image::Ref { .. } => None,
        }),
        size: def.runs_on.get("size").cloned(),
        publish: def
            .artifacts
            .publish
            .iter()
            .map(|p| api::PublishSpec { name: p.name.clone(), path: p.path.clone() })
            .collect(),
        restore: def
            .artifacts
            .restore
            .iter()
            .map(|r| api::RestoreSpec { from_job: r.from_job.clone(), name: r.name.clone(), path: r.path.clone() })
            .collect(),
        lease_ttl_ms: ttl,
        heartbeat_interval_ms: (ttl / 3).max(50),
        secrets: BTreeMap::new(),
    }
}

/// The assignment of a claimed attempt, with what needs the store: the clone
/// URL, and the secrets the job asked for (trusted runs only).
async fn full_assignment(state: &State, c: &kiln_store::ClaimedAttempt) -> ApiResult<api::Assignment> {
    let mut a = assignment(state, c);
    a.clone_url = state.store.get_repo(&a.repo).await?.clone_url;
    let def = &c.run.definition.jobs[c.job.index as usize];
    if !def.secrets.is_empty() && c.run.trust == "trusted" {
        a.secrets = state.store.secret_values(&c.run.repo_id, &def.secrets).await?;
    }
    Ok(a)
}

/// Long-poll claim. Pops dispatch deliveries compatible with the agent and
/// runs the claim transaction on each until one grants an attempt.
async fn claim(S(state): S<State>, Path(agent_id): Path<String>, body: Bytes) -> ApiResult<Json<api::ClaimResponse>> {
    let req: api::ClaimRequest = parse(&body)?;
    let agent = state.store.get_agent(&agent_id).await?;
    if agent.session_id != req.session_id {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            api::codes::STALE_EPOCH,
            "agent session was replaced; register again",
        ));
    }
    if let Some(c) = state.store.claimed_by_request(&req.claim_request_id).await? {
        return Ok(Json(api::ClaimResponse { assignment: Some(full_assignment(&state, &c).await?) }));
    }
    let wait = Duration::from_millis(req.wait_ms.min(60_000));
    let deadline = tokio::time::Instant::now() + wait;
    let ttl = state.config.lease_ttl.as_millis() as i64;
    // Jobs whose run another transaction held when this request tried them.
    let mut busy: HashSet<(String, i64)> = HashSet::new();
    loop {
        let notified = state.dispatcher.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        while let Some(ev) = state.dispatcher.pop(&agent.labels) {
            let input = ClaimInput {
                agent_id: agent.id.clone(),
                session_id: req.session_id.clone(),
                claim_request_id: req.claim_request_id.clone(),
                job_id: ev.job_id.clone(),
                dispatch_generation: ev.dispatch_generation,
                lease_ttl_ms: ttl,
                // Every replica queues every ready job, so agents of two
                // replicas often claim the same job at the same moment: the
                // loser moves on at once instead of waiting for the winner.
                skip_locked: true,
            };
            match state.store.claim(input).await {
                Ok(Some(c)) => {
                    let _ = state.job_events.send(c.job.id.clone());
                    tracing::info!(run = %c.run.id, job = %c.job.name, epoch = c.epoch, agent = %agent.name, "claimed");
                    return Ok(Json(api::ClaimResponse { assignment: Some(full_assignment(&state, &c).await?) }));
                }
                Ok(None) => {
                    // Duplicate or stale deliveries are absorbed. A job still
                    // ready at this generation was declined for capacity: it
                    // stays queued for another agent.
                    // This agent is full (the database still counts an attempt
                    // it considers over): hand the job to the others at once,
                    // and answer this agent after a pause rather than spin.
                    if let Ok(j) = state.store.get_job(&ev.job_id).await
                        && j.status == JobStatus::Ready
                        && j.dispatch_generation == ev.dispatch_generation
                    {
                        state.dispatcher.push_front(ev);
                        state.dispatcher.notify.notify_waiters();
                        tokio::time::sleep(Duration::from_millis(500).min(wait)).await;
                        return Ok(Json(api::ClaimResponse { assignment: None }));
                    }
                }
                Err(StoreError::Busy(_)) => {
                    // Try the other queued jobs first; by the time this one
                    // comes round again, its run is most likely free (and the
                    // job claimed elsewhere). Met busy twice: give the holder
                    // a moment rather than spin.
                    let again = !busy.insert((ev.job_id.clone(), ev.dispatch_generation));
                    state.dispatcher.push_back(ev);
                    if tokio::time::Instant::now() >= deadline {
                        return Ok(Json(api::ClaimResponse { assignment: None }));
                    }
                    if again {
                        busy.clear();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                Err(e) => {
                    state.dispatcher.push_front(ev);
                    return Err(e.into());
                }
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(Json(api::ClaimResponse { assignment: None }));
        }
    }
}

/// After a job failed, fail-fast may have asked running matrix siblings to
/// stop: tell their agents now rather than at their next heartbeat.
async fn notify_stopped_jobs(state: &State, job_id: &str) {
    let Ok(job) = state.store.get_job(job_id).await else { return };
    let Ok(view) = state.store.get_run(&job.run_id).await else { return };
    for j in view.jobs.iter().filter(|j| j.job.cancel_requested && j.job.status == JobStatus::Running) {
        if let Some(a) = j.attempts.iter().find(|a| a.outcome == AttemptOutcome::Running) {
            let _ = state.cancel_events.send(crate::CancelEvent {
                session: a.session_id.clone(),
                job_id: j.job.id.clone(),
                epoch: a.epoch,
            });
        }
    }
}

#[derive(Deserialize)]
struct SessionQuery {
    session_id: String,
}

/// Shortens a session's leases when its stream is dropped.
struct SessionGuard {
    state: State,
    session: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let state = self.state.clone();
        let session = std::mem::take(&mut self.session);
        let grace = state.config.loss_grace.as_millis() as i64;
        tokio::spawn(async move {
            match state.store.shorten_session_leases(&session, grace).await {
                Ok(n) if n > 0 => {
                    tracing::warn!(session, leases = n, "agent connection lost: leases shortened to the loss grace")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot shorten leases of session {session}: {e}"),
            }
        });
    }
}

/// The agent's long-lived connection (fast loss detection): pings every
/// second; when the connection drops, the session's leases are shortened to
/// the loss grace so a dead agent's jobs are re-dispatched within seconds. A
/// paused agent keeps its connection and is caught by the lease TTL instead.
async fn session(
    S(state): S<State>,
    Path(agent_id): Path<String>,
    Query(q): Query<SessionQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let agent = state.store.get_agent(&agent_id).await?;
    if agent.session_id != q.session_id {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            api::codes::STALE_EPOCH,
            "agent session was replaced; register again",
        ));
    }
    let session = q.session_id.clone();
    let guard = SessionGuard { state: state.clone(), session: q.session_id };
    let ticks =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(Duration::from_millis(api::SESSION_PING_MS)))
            .map(|_| Event::default().event("ping").data("{}"));
    // Cancellation notices for this session's attempts: the agent stops the
    // sandbox at once instead of at its next heartbeat.
    let cancels = tokio_stream::wrappers::BroadcastStream::new(state.cancel_events.subscribe()).filter_map(move |m| {
        let ev = match m {
            Ok(n) if n.session == session => Some(
                Event::default()
                    .event("cancel")
                    .json_data(api::CancelNotice { job_id: n.job_id, epoch: n.epoch })
                    .expect("json"),
            ),
            _ => None,
        };
        futures::future::ready(ev)
    });
    let stream = futures::stream::select(ticks, cancels).map(move |ev| {
        let _keep = &guard;
        Ok(ev)
    });
    Ok(Sse::new(stream))
}

async fn heartbeat(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
) -> ApiResult<Json<api::HeartbeatResponse>> {
    let ttl = state.config.lease_ttl.as_millis() as i64;
    let out = state.store.heartbeat(&job, epoch, ttl).await?;
    Ok(Json(api::HeartbeatResponse { cancel_requested: out.cancel_requested, lease_ttl_ms: ttl as u64 }))
}

async fn append_log(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<api::LogAck>> {
    let raw = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/octet-stream"));
    let chunk = if raw { raw_chunk(&headers, body)? } else { json_chunk(&body)? };
    if !logs::stream::AGENT_STREAMS.contains(&chunk.stream.as_str()) {
        return Err(ApiErr::bad_request("stream must be stdout, stderr or system"));
    }
    if chunk.data.len() > MAX_CHUNK {
        return Err(ApiErr::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            api::codes::TOO_LARGE,
            "a log chunk carries at most 1 MiB",
        ));
    }
    let api::RawLogChunk { stream, seq, offset, sha256, data } = chunk;
    let data = data.to_vec();
    let committed = state
        .store
        .append_log_chunk(NewLogChunk { job_id: job.clone(), epoch, stream, seq, offset, sha256, data })
        .await?;
    let _ = state.job_events.send(job);
    Ok(Json(api::LogAck { committed: committed.into_iter().collect() }))
}

/// A chunk in a JSON body (`data` in base64).
fn json_chunk(body: &Bytes) -> Result<api::RawLogChunk, ApiErr> {
    let c: api::LogChunk = parse(body)?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(c.data.as_bytes())
        .map_err(|e| ApiErr::bad_request(format!("chunk data is not base64: {e}")))?;
    Ok(api::RawLogChunk { stream: c.stream, seq: c.seq, offset: c.offset, sha256: c.sha256, data: data.into() })
}

/// A chunk as a raw body, its identity in `kiln-log-*` headers.
fn raw_chunk(headers: &HeaderMap, body: Bytes) -> Result<api::RawLogChunk, ApiErr> {
    use api::log_headers as h;
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ApiErr::bad_request(format!("a raw log chunk needs the {name} header")))
    };
    let int =
        |name: &str| get(name)?.parse::<i64>().map_err(|_| ApiErr::bad_request(format!("{name} must be an integer")));
    Ok(api::RawLogChunk {
        stream: get(h::STREAM)?.to_string(),
        seq: int(h::SEQ)?,
        offset: int(h::OFFSET)?,
        sha256: get(h::SHA256)?.to_string(),
        data: body,
    })
}

async fn complete(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::CompletionAck>> {
    let c: api::Completion = parse(&body)?;
    let outcome = AttemptOutcome::try_from(c.outcome).map_err(ApiErr::bad_request)?;
    if outcome == AttemptOutcome::Running || outcome == AttemptOutcome::Lost {
        return Err(ApiErr::bad_request("outcome must be success, failed or cancelled"));
    }
    let res = state
        .store
        .complete(
            &job,
            epoch,
            kiln_store::CompletionInput {
                outcome,
                exit_code: c.exit_code,
                message: c.message.map(|m| m.chars().take(2000).collect()),
                infra_failure: c.infra_failure,
            },
        )
        .await;
    let _ = state.job_events.send(job.clone());
    state.relay_wake.notify_one();
    if matches!(&res, Ok(s) if s == "failed") {
        notify_stopped_jobs(&state, &job).await;
    }
    match res {
        Ok(status) => {
            tracing::info!(job, epoch, status, "completed");
            Ok(Json(api::CompletionAck { job_status: status.into() }))
        }
        Err(StoreError::Conflict(m)) => Err(ApiErr::new(StatusCode::CONFLICT, api::codes::STALE_EPOCH, m)),
        Err(e) => Err(e.into()),
    }
}

/// A Dockerfile job's attempt commits the digest of the image it built,
/// before any user step runs. The first committed digest wins; the answer is
/// the digest every attempt must run.
async fn commit_image(
    S(state): S<State>,
    Path((job, epoch)): Path<(String, i64)>,
    body: Bytes,
) -> ApiResult<Json<api::ImageCommit>> {
    let req: api::ImageCommit = parse(&body)?;
    let ok =
        req.digest.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
    if !ok {
        return Err(ApiErr::invalid("digest must be sha256:<64 hex digits>"));
    }
    let digest = state.store.commit_image_digest(&job, epoch, &req.digest).await?;
    Ok(Json(api::ImageCommit { digest }))
}
