//! Which run a path or a command names (issue 42): `REPO#NUMBER`, a full
//! id, or a unique id prefix. Apart from `services::runs` so that the
//! authorization layer (`auth`, the trigger token's repository check) can
//! resolve a run without depending on the services that depend on it.

use crate::error::{ApiErr, ApiResult};
use crate::state::AppState;
use kiln_api as api;

/// Shortest run id prefix accepted in place of a full id.
pub(crate) const MIN_PREFIX: usize = 8;

/// The run a path names (issue 42 adds numbers): `REPO#NUMBER`
/// (`hello#123`, the `#` written `%23` in a URL), its full id, or a unique
/// prefix of at least [`MIN_PREFIX`] characters. A bare number names a run
/// only when there is a single repository; with several it is refused
/// (400) saying to write `REPO#NUMBER`.
pub(crate) async fn resolve_id(state: &AppState, given: &str) -> ApiResult<String> {
    let given = given.trim();
    if let Some((repo, number)) = given.rsplit_once('#') {
        let number = match number.parse::<i64>() {
            Ok(n) if n > 0 && !repo.is_empty() => n,
            _ => {
                return Err(ApiErr::bad_request(format!(
                    "run `{given}`: write REPOSITORY#NUMBER (e.g. hello#123), a run id or a unique prefix of it"
                )));
            }
        };
        let repo = state.store.get_repo(repo).await?;
        return match state.store.find_run_by_number(&repo.id, number).await {
            Err(kiln_store::StoreError::NotFound(_)) => {
                Err(ApiErr::not_found(format!("run {given}: repository {} has no run #{number}", repo.name)))
            }
            r => Ok(r?),
        };
    }
    if !given.is_empty() && given.len() < MIN_PREFIX && given.bytes().all(|b| b.is_ascii_digit()) {
        let repos = state.store.list_repos().await?;
        return match repos.as_slice() {
            [only] => Box::pin(resolve_id(state, &format!("{}#{given}", only.name))).await,
            _ => Err(ApiErr::bad_request(format!(
                "run {given}: a run number needs its repository: write REPOSITORY#{given} (e.g. hello#{given}), \
                 or with the CLI pass --repo REPOSITORY"
            ))),
        };
    }
    if given.len() == 36 || given.len() < MIN_PREFIX || !given.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Ok(given.to_string());
    }
    let mut ids = state.store.find_runs_by_prefix(&given.to_ascii_lowercase(), 11).await?;
    match ids.len() {
        0 => Err(ApiErr::not_found(format!("run {given}"))),
        1 => Ok(ids.remove(0)),
        n => {
            let more = if n > 10 { ", …" } else { "" };
            ids.truncate(10);
            Err(ApiErr::new(
                axum::http::StatusCode::CONFLICT,
                api::codes::AMBIGUOUS,
                format!(
                    "run id prefix {given} is ambiguous: it matches {}{more}; give more characters",
                    ids.join(", ")
                ),
            ))
        }
    }
}
