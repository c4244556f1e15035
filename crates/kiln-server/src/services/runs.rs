//! Reading and cancelling runs (spec 000 §9 cancellation; the run view of
//! the contract in ARCHITECTURE.md).

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

pub(crate) async fn list(
    state: &AppState,
    repo: &str,
    status: Option<&str>,
    limit: Option<u32>,
) -> ApiResult<api::RunList> {
    let repo = state.store.get_repo(repo).await?;
    if let Some(s) = status {
        s.parse::<kiln_core::RunStatus>().map_err(ApiErr::bad_request)?;
    }
    let runs = state.store.list_runs(&repo.id, status, limit.unwrap_or(LIST_DEFAULT).min(LIST_MAX)).await?;
    Ok(api::RunList { runs: runs.iter().map(views::summary).collect() })
}

pub(crate) async fn get(state: &AppState, run: &str) -> ApiResult<api::Run> {
    let view = state.store.get_run(run).await?;
    let bindings = state.store.run_bindings(run).await?;
    Ok(views::run(&view, &bindings))
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
