//! Reading and cancelling runs (spec 000 §9 cancellation; the run view of
//! the contract in ARCHITECTURE.md).

pub(crate) use super::run_ref::{MIN_PREFIX, resolve_id};
use crate::auth::Principal;
use crate::error::{ApiErr, ApiResult};
use crate::services::access;
use crate::services::notices;
use crate::state::AppState;
use crate::views;
use kiln_api as api;

/// Default and largest page of a run list.
const LIST_DEFAULT: u32 = 50;
const LIST_MAX: u32 = 500;

/// What a run list may be filtered by
/// (`?status=&branch=&event=&actor=&before=&limit=`; empty means any).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct ListFilter {
    pub status: Option<String>,
    pub branch: Option<String>,
    pub event: Option<String>,
    pub actor: Option<String>,
    /// A run id: only runs listed after it (older); `next_before` of the
    /// previous page.
    pub before: Option<String>,
    pub limit: Option<u32>,
    /// Only for `GET /v1/workflow-runs`: a repository's name.
    pub repo: Option<String>,
}

/// `GET /v1/repos/{repo}/workflow-runs` (`repo` given) or `GET
/// /v1/workflow-runs` (every repository, or `?repo=`): newest first.
pub(crate) async fn list(state: &AppState, repo: Option<&str>, q: &ListFilter) -> ApiResult<api::RunList> {
    let repo_id = match repo.or(q.repo.as_deref().filter(|r| !r.is_empty())) {
        Some(r) => Some(state.store.get_repo(r).await?.id),
        None => None,
    };
    let given = |v: &Option<String>| v.clone().filter(|x| !x.is_empty());
    let status = given(&q.status);
    if let Some(s) = &status {
        s.parse::<kiln_core::RunStatus>().map_err(ApiErr::bad_request)?;
    }
    let before = match (given(&q.before), &repo_id) {
        (Some(b), Some(repo_id)) => Some(cursor_in_repo(state, repo_id, &b).await?),
        (Some(b), None) => Some(resolve_id(state, &b).await?),
        (None, _) => None,
    };
    let limit = q.limit.unwrap_or(LIST_DEFAULT).clamp(1, LIST_MAX);
    let filter = kiln_store::RunFilter {
        repo_id,
        status,
        branch: given(&q.branch),
        event: given(&q.event),
        actor: match given(&q.actor) {
            Some(a) => Some(actor_filter(state, a).await?),
            None => None,
        },
        before,
        limit,
    };
    let runs = state.store.find_runs(&filter).await?;
    let next_before = (runs.len() == limit as usize).then(|| runs.last().map(|r| r.id.clone())).flatten();
    let mut out = Vec::with_capacity(runs.len());
    let mut names = ActorNames::default();
    let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
    let mut neighbours = state.store.run_id_neighbours_of(&ids).await?;
    for r in &runs {
        let mut summary = views::summary(r);
        let (before, after) = neighbours.remove(&r.id).unwrap_or_default();
        summary.short_id = Some(short_id(&r.id, [before.as_deref(), after.as_deref()]));
        summary.actor = names.shown(state, summary.actor.take()).await;
        out.push(summary);
    }
    Ok(api::RunList { runs: out, next_before })
}

/// Who started a run, by name (issue 42): `admin` for the bootstrap
/// `admin.token`, a token's name for `token:ID` (its id when the token is
/// gone), anything else (a forge user, `schedule`) as stored. Token names
/// read once per list.
#[derive(Default)]
struct ActorNames(std::collections::HashMap<String, String>);

impl ActorNames {
    async fn shown(&mut self, state: &AppState, stored: Option<String>) -> Option<String> {
        let stored = stored?;
        if let Some(name) = views::actor_shown(&stored) {
            return Some(name.to_string());
        }
        let Some(id) = stored.strip_prefix("token:") else { return Some(stored) };
        if let Some(name) = self.0.get(id) {
            return Some(name.clone());
        }
        let name = match state.store.get_api_token(id).await {
            Ok(t) => t.name,
            Err(_) => stored.clone(),
        };
        self.0.insert(id.to_string(), name.clone());
        Some(name)
    }
}

/// How a stored actor reads (a token by its name, `admin`).
pub(crate) async fn actor_name(state: &AppState, stored: Option<String>) -> Option<String> {
    ActorNames::default().shown(state, stored).await
}

/// The stored actor a list's `?actor=` names: `admin` is the bootstrap
/// `admin.token`, a token's name its `token:ID`; anything else as given.
async fn actor_filter(state: &AppState, given: String) -> ApiResult<String> {
    if given == "admin" {
        return Ok(crate::auth::ADMIN_ACTOR.to_string());
    }
    let tokens = state.store.list_api_tokens().await?;
    Ok(tokens.into_iter().find(|t| t.name == given).map(|t| format!("token:{}", t.id)).unwrap_or(given))
}

/// The shortest prefix of `id`, at least [`MIN_PREFIX`] characters, that
/// its neighbours in id order (hence every other id) do not start with.
fn short_id(id: &str, neighbours: [Option<&str>; 2]) -> String {
    let shared = |other: &str| id.bytes().zip(other.bytes()).take_while(|(a, b)| a == b).count();
    let len = neighbours.into_iter().flatten().map(|n| shared(n) + 1).max().unwrap_or(0).max(MIN_PREFIX);
    id.get(..len.min(id.len())).unwrap_or(id).to_string()
}

/// The run a path names: its full id, or a unique prefix of at least
/// [`MIN_PREFIX`] characters (ids are UUIDv7, so runs made close together
/// share their first characters: an ambiguous prefix is a 409 listing the
/// runs it matches).
/// The `before=` cursor of one repository's run list (issue 39, item 12):
/// a run of that repository, by id or unambiguous prefix among its runs. A
/// run of another repository is refused exactly as a run that does not
/// exist (the same 400), so a caller who may list one repository (a
/// trigger token) learns nothing of another's run ids: neither that one
/// exists, nor where it falls in time, nor the ids a prefix matches.
async fn cursor_in_repo(state: &AppState, repo_id: &str, given: &str) -> ApiResult<String> {
    let given = given.trim();
    let refused = || {
        ApiErr::bad_request(format!("before={given}: not a run of this repository (use a `next_before` of this list)"))
    };
    let candidates = if given.len() == 36 {
        vec![given.to_string()]
    } else if given.len() >= MIN_PREFIX && given.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        state.store.find_runs_by_prefix(&given.to_ascii_lowercase(), 11).await?
    } else {
        return Err(refused());
    };
    let mut mine = vec![];
    for id in candidates {
        match state.store.get_run(&id).await {
            Ok(v) if v.run.repo_id == repo_id => mine.push(id),
            Ok(_) | Err(kiln_store::StoreError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match mine.len() {
        0 => Err(refused()),
        1 => Ok(mine.remove(0)),
        _ => Err(ApiErr::new(
            axum::http::StatusCode::CONFLICT,
            api::codes::AMBIGUOUS,
            format!(
                "before={given} matches several runs of this repository ({}); give more characters",
                mine.join(", ")
            ),
        )),
    }
}

pub(crate) async fn get(state: &AppState, run: &str) -> ApiResult<api::Run> {
    let view = state.store.get_run(run).await?;
    let bindings = state.store.run_bindings(run).await?;
    let mut out = views::run(&view, &bindings);
    out.actor = ActorNames::default().shown(state, out.actor.take()).await;
    if view.run.definition.jobs.iter().any(|j| !j.outputs.is_empty()) {
        let mut outputs = state.store.run_outputs(run).await?;
        for job in &mut out.jobs {
            job.outputs = outputs.remove(&job.name).unwrap_or_default();
        }
    }
    if let Ok(repo) = state.store.get_repo(&view.run.repo_id).await {
        out.commit_url = commit_url(&repo.forge, &view.run.commit_sha);
    }
    out.commit = state.mirrors.commit_info(&view.run.repo_id, &view.run.commit_sha).await.ok();
    explain_waiting(state, &view, &mut out).await?;
    Ok(out)
}

/// Every job that has not started says why in `waiting` (issue 41, item
/// 3; [`kiln_core::waiting`]): a ready job, what keeps the agents from it —
/// none connected, none with its labels (naming the labels there are),
/// placement (invariant 12), all busy; a pending job, its run's or its own
/// concurrency group, the needs not finished, a `max-parallel` slot.
/// Decided when read, against the agents registered and connected now.
///
/// A ready job no agent can take also says it in its `message` ("waiting:
/// no connected agent has labels {os: ubuntu-latest}; agents: a1 {os:
/// linux}", or "waiting for an agent that takes untrusted work (pools:
/// forks, container executor); none connected …"), as it did before
/// `waiting` existed.
async fn explain_waiting(state: &AppState, view: &kiln_store::RunView, out: &mut api::Run) -> ApiResult<()> {
    use kiln_core::JobStatus;
    if view.run.status.is_terminal() || view.run.status == kiln_core::RunStatus::Cancelling {
        return Ok(());
    }
    let jobs = &view.jobs;
    if !jobs.iter().any(|j| matches!(j.job.status, JobStatus::Ready | JobStatus::Pending)) {
        return Ok(());
    }
    let registered = state.store.list_agents().await?;
    let running = state.store.running_per_agent().await?;
    let seen: Vec<kiln_core::waiting::AgentSeen> = registered
        .iter()
        .map(|a| kiln_core::waiting::AgentSeen {
            name: &a.name,
            labels: &a.labels,
            pool: &a.pool,
            executor: a.executor,
            connected: state.live_agents.is_connected(&a.id),
            draining: a.draining,
            running: running.get(&a.id).copied().unwrap_or(0),
            max_jobs: a.max_jobs,
        })
        .collect();
    let mut secret_pools = None;
    // Group keys are scoped by repository (`{repo_id}:{group}`): say the
    // group as the workflow wrote it.
    let scope = format!("`{}:", view.run.repo_id);
    let unscoped = |m: &str| m.replace(&scope, "`");
    for (i, j) in jobs.iter().enumerate() {
        let waiting = match j.job.status {
            JobStatus::Ready => {
                let required: std::collections::BTreeMap<String, String> =
                    serde_json::from_str(&j.job.class_key).unwrap_or_default();
                let pools = match &secret_pools {
                    Some(p) => p,
                    None => secret_pools.insert(state.store.get_repo(&view.run.repo_id).await?.secret_pools),
                };
                let placement = kiln_store::job_placement(&view.run, &j.job, pools);
                let why = kiln_core::waiting::for_agent(&required, &placement, &state.config.untrusted, &seen);
                if let Some(why) = why.as_ref().filter(|w| !matches!(w, kiln_core::waiting::AgentWait::Busy(_)))
                    && let Some(job) = out.jobs.get_mut(i)
                {
                    // A retried job keeps what happened to it ("retrying:
                    // agent lost …") before what it waits for now.
                    job.message = Some(match job.message.take() {
                        Some(before) => format!("{before}; {}", why.text()),
                        None => why.text().to_string(),
                    });
                }
                // Where its team stands (issue 44): at its quota, or
                // against its share and the jobs competing in its lane.
                let lane = kiln_core::fair::Lane::parse(&view.run.priority).unwrap_or(kiln_core::fair::Lane::Normal);
                let fair = crate::services::queue::waiting_text(state, &view.run.team, lane, &j.job.class_key);
                match (why, fair) {
                    (Some(kiln_core::waiting::AgentWait::Busy(t)), Some((_, f))) => Some(format!("{t}; {f}")),
                    (None, Some((true, f))) => Some(format!("waiting: {f}")),
                    (why, _) => why.map(|w| w.text().to_string()),
                }
            }
            JobStatus::Pending => {
                let held = view.run.held.then(|| unscoped(view.run.message.as_deref().unwrap_or_default()));
                let unfinished: Vec<(&str, JobStatus)> = j
                    .job
                    .needs
                    .iter()
                    .filter_map(|n| jobs.iter().find(|o| o.job.name == *n || o.job.id == *n))
                    .filter(|o| !o.job.status.is_terminal())
                    .map(|o| (o.job.name.as_str(), o.job.status))
                    .collect();
                let group = j.job.group_waiting.then(|| unscoped(j.job.message.as_deref().unwrap_or_default()));
                let group = group.filter(|g| g.starts_with("waiting")).or_else(|| {
                    // Issue 46: its environment's approval (the gate's message).
                    j.job.message.as_deref().filter(|m| m.starts_with("waiting for approval")).map(str::to_string)
                });
                if let (Some(g), Some(job)) = (&group, out.jobs.get_mut(i)) {
                    job.message = Some(g.clone());
                }
                let slot = view
                    .run
                    .definition
                    .jobs
                    .get(usize::try_from(j.job.index).unwrap_or(usize::MAX))
                    .and_then(|d| d.matrix.as_ref())
                    .and_then(|m| m.max_parallel.map(|max| (m.group.as_str(), max)));
                kiln_core::waiting::for_pending(held.as_deref(), &unfinished, group.as_deref(), slot)
            }
            _ => None,
        };
        if let Some(job) = out.jobs.get_mut(i) {
            job.waiting = waiting;
        }
    }
    Ok(())
}

/// Why no connected agent with the job's labels may run it (trust,
/// isolation, secret pools; kiln-core's `waiting_reason`), or None.
fn misplaced(
    connected: &[kiln_store::AgentRecord],
    required: &std::collections::BTreeMap<String, String>,
    placement: &kiln_core::claim::JobPlacement,
    policy: &kiln_core::claim::UntrustedPolicy,
) -> Option<String> {
    let matching: Vec<(&str, &str, kiln_core::claim::Executor)> = connected
        .iter()
        .filter(|a| kiln_core::claim::labels_match(required, &a.labels))
        .map(|a| (a.name.as_str(), a.pool.as_str(), a.executor))
        .collect();
    kiln_core::claim::waiting_reason(placement, policy, &matching)
}

/// Why no agent of `connected` can take a job requiring `required`, or
/// None when one can.
fn unclaimable(
    connected: &[kiln_store::AgentRecord],
    required: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    if connected.iter().any(|a| kiln_core::claim::labels_match(required, &a.labels)) {
        return None;
    }
    Some(if connected.is_empty() {
        "no agent is connected (start one with `kiln agent`, or `kiln up --agents N`)".to_string()
    } else {
        let list: Vec<String> = connected.iter().map(|a| format!("{} {}", a.name, labels_text(&a.labels))).collect();
        format!("no connected agent has labels {}; agents: {}", labels_text(required), list.join(", "))
    })
}

/// The queue timeout (spec 004): ready jobs no agent claimed within
/// `--queue-timeout` fail, saying why (no compatible agent connected, or
/// the compatible ones stayed busy); their runs move on.
pub(crate) async fn queue_timeout_once(state: &AppState) -> Result<usize, kiln_store::StoreError> {
    let limit = state.config.queue_timeout;
    if limit.is_zero() {
        return Ok(0);
    }
    let ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
    let overdue = state.store.overdue_jobs(ms, 100).await?;
    if overdue.is_empty() {
        return Ok(0);
    }
    let agents: Vec<_> =
        state.store.list_agents().await?.into_iter().filter(|a| state.live_agents.is_connected(&a.id)).collect();
    let mut failed = 0;
    for (job, class_key) in overdue {
        let required = serde_json::from_str(&class_key).unwrap_or_default();
        let why = match unclaimable(&agents, &required) {
            Some(why) => why,
            None => placement_of(state, &job)
                .await
                .and_then(|p| misplaced(&agents, &required, &p, &state.config.untrusted))
                .unwrap_or_else(|| "the connected agents that could run it stayed busy".to_string()),
        };
        let message =
            format!("queue timeout: no agent claimed the job within {} ({why})", kiln_workflow::format_duration(limit));
        if state.store.fail_overdue_job(&job, ms, &message).await? {
            tracing::warn!(job = %job, "{message}");
            state.metrics.queue_timeouts.inc();
            state.metrics.job_finished("failed");
            state.job_changed(&job);
            failed += 1;
        }
    }
    Ok(failed)
}

/// What a job needs of its agent (invariant 12), if it can be read.
async fn placement_of(state: &AppState, job_id: &str) -> Option<kiln_core::claim::JobPlacement> {
    let job = state.store.get_job(job_id).await.ok()?;
    let view = state.store.get_run(&job.run_id).await.ok()?;
    let repo = state.store.get_repo(&view.run.repo_id).await.ok()?;
    Some(kiln_store::job_placement(&view.run, &job, &repo.secret_pools))
}

/// The run-level timeout (spec 004): runs past their frozen `timeout` are
/// cancelled — waiting jobs at once, running attempts through their
/// heartbeat — and say why.
pub(crate) async fn run_timeout_once(state: &AppState) -> Result<usize, kiln_store::StoreError> {
    let mut timed_out = 0;
    for run in state.store.overdue_runs(100).await? {
        if state.store.time_out_run(&run).await? {
            tracing::warn!(run = %run, "the run timed out: cancelled");
            state.metrics.run_timeouts.inc();
            let view = state.store.get_run(&run).await?;
            notices::run_cancelled(state, &view);
            timed_out += 1;
        }
    }
    Ok(timed_out)
}

use kiln_core::waiting::labels_text;

/// The commit's page on the forge's web UI.
pub(crate) fn commit_url(f: &kiln_store::RepoForge, sha: &str) -> Option<String> {
    let forge: kiln_forge::Forge = f.forge.as_deref()?.parse().ok()?;
    let repo = f.forge_repo.as_deref()?;
    let base = match (forge, f.forge_url.as_deref()) {
        (kiln_forge::Forge::Github, None) => "https://github.com".to_string(),
        (kiln_forge::Forge::Github, Some(u)) if u.contains("api.github.com") => "https://github.com".to_string(),
        (_, Some(u)) => u
            .trim_end_matches('/')
            .trim_end_matches("/api/v3")
            .trim_end_matches("/api/v4")
            .trim_end_matches("/api/v1")
            .to_string(),
        (_, None) => return None,
    };
    Some(match forge {
        kiln_forge::Forge::Gitlab => format!("{base}/{repo}/-/commit/{sha}"),
        _ => format!("{base}/{repo}/commit/{sha}"),
    })
}

/// Cancel the run, tell the agents of its running attempts, and return it.
pub(crate) async fn cancel(state: &AppState, by: &Principal, run: &str) -> ApiResult<api::Run> {
    state.store.cancel_run(run).await?;
    access::audit(state, &by.actor, "run.cancel", run, "").await?;
    let view = state.store.get_run(run).await?;
    notices::run_cancelled(state, &view);
    let bindings = state.store.run_bindings(run).await?;
    Ok(views::run(&view, &bindings))
}

/// The jobs of a run that a path's `{job}` names (issue 42): the job of
/// that name or id, or, for a matrix job's name without its values
/// (`test` of `test (shard=1)`, `test (shard=2)`), every instance of it.
/// None is a 404 listing the run's jobs.
pub(crate) fn jobs_named<'a>(view: &'a kiln_store::RunView, given: &str) -> ApiResult<Vec<&'a kiln_store::JobRecord>> {
    let given = given.trim();
    let exact: Vec<_> = view.jobs.iter().map(|j| &j.job).filter(|j| j.name == given || j.id == given).collect();
    if !exact.is_empty() {
        return Ok(exact);
    }
    let instances: Vec<_> = view
        .jobs
        .iter()
        .map(|j| &j.job)
        .filter(|j| j.name.strip_prefix(given).is_some_and(|rest| rest.starts_with(" (") && rest.ends_with(')')))
        .collect();
    if !instances.is_empty() {
        return Ok(instances);
    }
    let names: Vec<&str> = view.jobs.iter().map(|j| j.job.name.as_str()).collect();
    Err(ApiErr::new(
        axum::http::StatusCode::NOT_FOUND,
        api::codes::NOT_FOUND,
        format!("run {} has no job `{given}` (its jobs: {})", view.run.id, names.join(", ")),
    ))
}

/// Every artifact the run's jobs bound (issue 42), in job order, as the
/// run's `jobs[].artifacts[]` give them, with the job beside each.
pub(crate) async fn artifacts(state: &AppState, run: &str) -> ApiResult<api::RunArtifacts> {
    let view = state.store.get_run(run).await?;
    let bindings = state.store.run_bindings(run).await?;
    let out = views::run(&view, &bindings);
    let mut jobs = out.jobs;
    jobs.sort_by_key(|j| j.index);
    let artifacts = jobs
        .into_iter()
        .flat_map(|j| {
            let (job, job_id) = (j.name, j.id);
            j.artifacts.into_iter().map(move |artifact| api::RunArtifact {
                job: job.clone(),
                job_id: job_id.clone(),
                artifact,
            })
        })
        .collect();
    Ok(api::RunArtifacts { run_id: run.to_string(), artifacts })
}

/// Cancel one job of a running run (or every instance of a matrix job;
/// issue 42), tell the agent of its running attempt, and return the run.
/// Refused (409) when the run has ended or is cancelling, or the job has
/// ended; the rest of the run goes on (`kiln_core::cancel::plan_cancel_job`).
pub(crate) async fn cancel_job(state: &AppState, by: &Principal, run: &str, job: &str) -> ApiResult<api::Run> {
    let view = state.store.get_run(run).await?;
    let named: Vec<(String, String)> =
        jobs_named(&view, job)?.into_iter().map(|j| (j.id.clone(), j.name.clone())).collect();
    let mut cancelled = Vec::new();
    let mut refused = None;
    for (id, name) in &named {
        match state.store.cancel_job(id).await {
            Ok(_) => cancelled.push((id.clone(), name.clone())),
            // Of a matrix job's instances, the ones already ended are left
            // as they are; all of them ended is a refusal.
            Err(kiln_store::StoreError::Conflict(why)) => {
                refused.get_or_insert(why);
            }
            Err(e) => return Err(e.into()),
        }
    }
    if cancelled.is_empty() {
        return Err(ApiErr::new(
            axum::http::StatusCode::CONFLICT,
            api::codes::CONFLICT,
            refused.unwrap_or_else(|| format!("nothing to cancel in run {run}")),
        ));
    }
    let names: Vec<&str> = cancelled.iter().map(|(_, n)| n.as_str()).collect();
    access::audit(state, &by.actor, "job.cancel", run, names.join(", ")).await?;
    let view = state.store.get_run(run).await?;
    let ids: Vec<String> = cancelled.into_iter().map(|(id, _)| id).collect();
    notices::jobs_cancelled(state, &view, &ids);
    get(state, run).await
}

#[cfg(test)]
mod tests {
    use super::commit_url;
    use kiln_store::RepoForge;

    fn f(forge: &str, url: Option<&str>) -> RepoForge {
        RepoForge {
            forge: Some(forge.into()),
            forge_url: url.map(Into::into),
            forge_repo: Some("acme/w".into()),
            ..Default::default()
        }
    }

    #[test]
    fn commit_links_point_at_each_forges_web_ui() {
        let sha = "abc";
        assert_eq!(commit_url(&f("github", None), sha).unwrap(), "https://github.com/acme/w/commit/abc");
        assert_eq!(
            commit_url(&f("github", Some("https://ghe.corp/api/v3")), sha).unwrap(),
            "https://ghe.corp/acme/w/commit/abc"
        );
        assert_eq!(
            commit_url(&f("gitlab", Some("https://gitlab.com")), sha).unwrap(),
            "https://gitlab.com/acme/w/-/commit/abc"
        );
        assert_eq!(commit_url(&f("gitea", Some("https://git.io/")), sha).unwrap(), "https://git.io/acme/w/commit/abc");
        assert_eq!(commit_url(&RepoForge::default(), sha), None);
    }
}

#[cfg(test)]
mod short_id_tests {
    #[test]
    fn a_short_id_is_unique_among_its_neighbours() {
        let id = "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee";
        assert_eq!(super::short_id(id, [None, None]), "0190aaaa");
        assert_eq!(super::short_id(id, [Some("0190aaa0-0000-7000-8000-000000000000"), None]), "0190aaaa");
        assert_eq!(super::short_id(id, [Some("0190aaaa-bb00-7000-8000-000000000000"), None]), "0190aaaa-bbb");
        assert_eq!(super::short_id(id, [None, Some("0190aaaa-bbbb-7ccd-8000-000000000000")]), "0190aaaa-bbbb-7ccc");
    }
}
