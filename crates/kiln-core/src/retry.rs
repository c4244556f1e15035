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

/// What a rollback (issue 46, `kiln rollback ENV`) does with each job of
/// the run that deployed the version it returns to: the deploy jobs (every
/// instance) and everything downstream of them run again; every other job
/// that succeeded is pinned (its bytes, not a rebuild); a job that neither
/// runs nor succeeded is skipped — a rollback builds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollbackPlan {
    pub pinned: BTreeSet<String>,
    pub skipped: BTreeSet<String>,
}

/// Why a rollback to a run is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackRefusal {
    /// Some job has not ended.
    NotEnded,
    /// No job of the run is among the deploy jobs named.
    NoDeployJob,
    /// A job the deploy jobs need did not succeed: its outputs do not exist.
    NeedNotSucceeded(String),
}

/// The rollback plan of a run whose jobs named in `deploy` run again.
pub fn rollback_plan(jobs: &[ParentJob], deploy: &BTreeSet<String>) -> Result<RollbackPlan, RollbackRefusal> {
    if jobs.iter().any(|j| !j.status.is_terminal()) {
        return Err(RollbackRefusal::NotEnded);
    }
    if !jobs.iter().any(|j| deploy.contains(&j.name)) {
        return Err(RollbackRefusal::NoDeployJob);
    }
    // Runs again: a deploy job, or a job needing one (a fixed point: needs
    // name earlier jobs, but a bound keeps a broken definition finite).
    let mut runs: BTreeSet<&str> = jobs.iter().filter(|j| deploy.contains(&j.name)).map(|j| j.name.as_str()).collect();
    for _ in 0..=jobs.len() {
        let before = runs.len();
        for j in jobs {
            if j.needs.iter().any(|n| runs.contains(n.as_str())) {
                runs.insert(j.name.as_str());
            }
        }
        if runs.len() == before {
            break;
        }
    }
    // Everything a running job needs (transitively) must be kept, so must
    // have succeeded.
    let by_name: BTreeMap<&str, &ParentJob> = jobs.iter().map(|j| (j.name.as_str(), j)).collect();
    let mut stack: Vec<&str> = runs.iter().copied().collect();
    let mut seen = BTreeSet::new();
    while let Some(name) = stack.pop() {
        let Some(job) = by_name.get(name) else { continue };
        for need in &job.needs {
            if runs.contains(need.as_str()) || !seen.insert(need.as_str()) {
                continue;
            }
            match by_name.get(need.as_str()) {
                Some(n) if n.status == JobStatus::Success => stack.push(need),
                _ => return Err(RollbackRefusal::NeedNotSucceeded(need.clone())),
            }
        }
    }
    let mut plan = RollbackPlan::default();
    for j in jobs.iter().filter(|j| !runs.contains(j.name.as_str())) {
        if j.status == JobStatus::Success {
            plan.pinned.insert(j.name.clone());
        } else {
            plan.skipped.insert(j.name.clone());
        }
    }
    Ok(plan)
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

    #[test]
    fn a_rollback_reruns_the_deploy_jobs_and_what_follows_and_builds_nothing() {
        // build → test → deploy (two matrix instances) → smoke; lint failed
        // on its own; docs needs lint.
        let jobs = [
            j("build", Success, &[]),
            j("lint", Failed, &[]),
            j("test", Success, &["build"]),
            j("docs", Skipped, &["lint"]),
            j("deploy (eu)", Success, &["test"]),
            j("deploy (us)", Success, &["test"]),
            j("smoke", Success, &["deploy (eu)", "deploy (us)"]),
        ];
        let plan = rollback_plan(&jobs, &names(&["deploy (eu)", "deploy (us)"])).unwrap();
        assert_eq!(plan.pinned, names(&["build", "test"]));
        assert_eq!(plan.skipped, names(&["lint", "docs"]));
        // What the deploy needs must have succeeded.
        let broken = [j("build", Failed, &[]), j("deploy", Skipped, &["build"])];
        assert_eq!(rollback_plan(&broken, &names(&["deploy"])), Err(RollbackRefusal::NeedNotSucceeded("build".into())));
        assert_eq!(rollback_plan(&jobs, &names(&["nope"])), Err(RollbackRefusal::NoDeployJob));
        let going = [j("build", Success, &[]), j("deploy", Running, &["build"])];
        assert_eq!(rollback_plan(&going, &names(&["deploy"])), Err(RollbackRefusal::NotEnded));
    }
}
