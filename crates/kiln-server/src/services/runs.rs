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
    let mut out = views::run(&view, &bindings);
    if let Ok(repo) = state.store.get_repo(&view.run.repo_id).await {
        out.commit_url = commit_url(&repo.forge, &view.run.commit_sha);
    }
    Ok(out)
}

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
