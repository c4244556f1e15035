//! Retry from a job (spec 000 §9: "retry from job"; `kiln retry RUN
//! --failed`): which jobs of the parent run a retry pins. A pinned job is
//! not run again: the retry's job is `success` at once and binds the
//! parent job's artifacts (the same generations). Every other job runs
//! again: the jobs that did not succeed and everything downstream of them.

use crate::job::JobStatus;
use std::collections::{BTreeMap, BTreeSet};

/// A job of the parent run, as the decision needs it.
#[derive(Debug, Clone)]
pub struct ParentJob {
    pub name: String,
    pub status: JobStatus,
    pub needs: Vec<String>,
}

/// Why a retry of the failed jobs is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryFailedRefusal {
    /// Some job has not ended: pinning needs the parent's final results.
    NotEnded,
    /// Every job succeeded: there is nothing to run again.
    NothingFailed,
}

/// The names of the jobs a retry of the failed jobs pins: the jobs that
/// succeeded none of whose needs (transitively) runs again. A success
/// downstream of a failure (an `if: always()` job) runs again, since its
/// inputs change.
pub fn pinned_jobs(jobs: &[ParentJob]) -> Result<BTreeSet<String>, RetryFailedRefusal> {
    if jobs.iter().any(|j| !j.status.is_terminal()) {
        return Err(RetryFailedRefusal::NotEnded);
    }
    if jobs.iter().all(|j| j.status == JobStatus::Success) {
        return Err(RetryFailedRefusal::NothingFailed);
    }
    Ok(pinned(jobs, &BTreeSet::new()))
}

/// The names of the jobs a retry of the jobs named in `rerun` pins (issue
/// 42: `kiln retry RUN --job NAME`): the jobs that succeeded, are not in
/// `rerun`, and none of whose needs (transitively) runs again. So the named
/// jobs and everything downstream of them run again — downstream jobs must
/// consume the new outputs, never keep a success built from the old ones
/// (spec 000 §9, "retry from job N") — and so does any job that did not
/// succeed (nothing failed can be kept). A succeeded job may be named: it
/// runs again. Refused while the parent has jobs that have not ended.
pub fn pinned_for_rerun(jobs: &[ParentJob], rerun: &BTreeSet<String>) -> Result<BTreeSet<String>, RetryFailedRefusal> {
    if jobs.iter().any(|j| !j.status.is_terminal()) {
        return Err(RetryFailedRefusal::NotEnded);
    }
    Ok(pinned(jobs, rerun))
}

fn pinned(jobs: &[ParentJob], rerun: &BTreeSet<String>) -> BTreeSet<String> {
    let by_name: BTreeMap<&str, &ParentJob> = jobs.iter().map(|j| (j.name.as_str(), j)).collect();
    // Memoized: does `name` run again?
    fn reruns<'a>(
        name: &'a str,
        by_name: &BTreeMap<&'a str, &'a ParentJob>,
        rerun: &BTreeSet<String>,
        memo: &mut BTreeMap<&'a str, bool>,
        depth: usize,
    ) -> bool {
        if let Some(&r) = memo.get(name) {
            return r;
        }
        let Some(job) = by_name.get(name) else { return true };
        // A valid definition has no cycles; a bound keeps a broken one finite.
        let r = depth > by_name.len()
            || job.status != JobStatus::Success
            || rerun.contains(name)
            || job.needs.iter().any(|n| reruns(n, by_name, rerun, memo, depth + 1));
        memo.insert(name, r);
        r
    }
    let mut memo = BTreeMap::new();
    jobs.iter().filter(|j| !reruns(&j.name, &by_name, rerun, &mut memo, 0)).map(|j| j.name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    fn j(name: &str, status: JobStatus, needs: &[&str]) -> ParentJob {
        ParentJob { name: name.into(), status, needs: needs.iter().map(|s| s.to_string()).collect() }
    }

    fn names(s: &[&str]) -> BTreeSet<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_successful_prefix_is_pinned_and_the_rest_runs_again() {
        // build → test (failed) → deploy (skipped); lint succeeded on its own.
        let jobs = [
            j("build", Success, &[]),
            j("lint", Success, &[]),
            j("test", Failed, &["build"]),
            j("deploy", Skipped, &["test", "lint"]),
            j("report", Success, &["test"]), // `if: always()`
        ];
        assert_eq!(pinned_jobs(&jobs), Ok(names(&["build", "lint"])));
        let cancelled = [j("a", Success, &[]), j("b", Cancelled, &["a"]), j("c", Skipped, &["b"])];
        assert_eq!(pinned_jobs(&cancelled), Ok(names(&["a"])));
        assert_eq!(pinned_jobs(&[j("a", Failed, &[])]), Ok(names(&[])));
    }

    #[test]
    fn a_run_still_going_or_without_failures_is_refused() {
        assert_eq!(pinned_jobs(&[j("a", Success, &[]), j("b", Running, &["a"])]), Err(RetryFailedRefusal::NotEnded));
        assert_eq!(pinned_jobs(&[j("a", Success, &[]), j("b", Pending, &["a"])]), Err(RetryFailedRefusal::NotEnded));
        assert_eq!(pinned_jobs(&[j("a", Success, &[])]), Err(RetryFailedRefusal::NothingFailed));
    }

    #[test]
    fn rerunning_a_job_reruns_it_and_everything_downstream() {
        // build → test → deploy, lint alone; everything succeeded.
        let ok = [
            j("build", Success, &[]),
            j("lint", Success, &[]),
            j("test", Success, &["build"]),
            j("deploy", Success, &["test", "lint"]),
        ];
        assert_eq!(pinned_for_rerun(&ok, &names(&["test"])), Ok(names(&["build", "lint"])));
        assert_eq!(pinned_for_rerun(&ok, &names(&["deploy"])), Ok(names(&["build", "lint", "test"])));
        assert_eq!(pinned_for_rerun(&ok, &names(&["build"])), Ok(names(&["lint"])));
        // A job that did not succeed cannot be kept: it runs again too.
        let failed = [j("a", Success, &[]), j("b", Failed, &[]), j("c", Success, &["a"])];
        assert_eq!(pinned_for_rerun(&failed, &names(&["c"])), Ok(names(&["a"])));
        // Refused while the run goes on.
        let going = [j("a", Success, &[]), j("b", Running, &["a"])];
        assert_eq!(pinned_for_rerun(&going, &names(&["a"])), Err(RetryFailedRefusal::NotEnded));
    }
}
