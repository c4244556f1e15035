//! The reference model's side of the model-vs-store property test: the
//! workflow language plugged into kiln-core's decisions, the model built for
//! the test's run, and the observable state both sides are compared on.

use super::{AGENTS, JOBS, MAX_JOBS};
use kiln_core::advance::{Conditions, JobRules, NeedResult};
use kiln_core::protocol::{JobSpec, ModelAgent, RunModel};
use kiln_core::{AttemptOutcome, Backoff, JobStatus, RunStatus};
use kiln_store::{AgentRecord, RunView};
use kiln_workflow::{ConditionContext, JobResult};
use std::collections::BTreeMap;

/// `if:` and group templates over a run's frozen trigger, as the store
/// evaluates them (kiln-workflow's evaluator).
pub struct Trigger(pub ConditionContext);

impl Trigger {
    /// The trigger of the conformance suite's runs (`new_run`).
    pub fn of_suite_run() -> Self {
        Trigger(ConditionContext {
            event: "manual".into(),
            git_ref: Some("refs/heads/main".into()),
            branch: Some("main".into()),
            ..ConditionContext::default()
        })
    }

    fn with_needs(&self, needs: &[NeedResult], quorum: Option<u32>) -> ConditionContext {
        let needs_results = needs
            .iter()
            .map(|n| match n {
                NeedResult::Success => JobResult::Success,
                NeedResult::Failure => JobResult::Failure,
                NeedResult::Cancelled => JobResult::Cancelled,
                NeedResult::Skipped => JobResult::Skipped,
            })
            .collect();
        ConditionContext { needs_results, quorum, ..self.0.clone() }
    }
}

impl Conditions for Trigger {
    fn eval_if(&self, expr: &str, needs: &[NeedResult], quorum: Option<u32>) -> Result<bool, String> {
        kiln_workflow::eval_condition(expr, &self.with_needs(needs, quorum))
    }

    fn render_group(&self, template: &str) -> Result<String, String> {
        kiln_workflow::render_group(template, &self.0)
    }
}

fn linux() -> BTreeMap<String, String> {
    BTreeMap::from([("os".to_string(), "linux".to_string())])
}

/// The model of the test's run: the diamond of `JOBS` with the case's
/// `retry:` per job, and the test's agents.
pub fn model(retries: &[u32]) -> RunModel<Trigger> {
    let jobs = JOBS
        .iter()
        .zip(retries)
        .map(|((name, needs), retry)| JobSpec {
            name: name.to_string(),
            needs: needs.iter().map(|n| n.to_string()).collect(),
            rules: JobRules::default(),
            retry: *retry,
            runs_on: linux(),
            outputs: vec![],
        })
        .collect();
    let agents = (0..AGENTS).map(|_| ModelAgent { labels: linux(), max_jobs: MAX_JOBS }).collect();
    // Backoff is not modelled (the store runs with `FAST`: retries are ready at once).
    RunModel::accept(jobs, agents, Trigger::of_suite_run(), Backoff { base_ms: 0, max_ms: 0 }, 0)
}

/// What both the model and the store know about a run: statuses, dispatch
/// generations, epochs, messages, who holds which attempt and how it ended.
/// Not compared: times (leases, backoff), which the model has no clock for.
#[derive(Debug, PartialEq, Eq)]
pub struct Observed {
    pub run: RunStatus,
    pub jobs: Vec<ObservedJob>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ObservedJob {
    pub name: String,
    pub status: JobStatus,
    pub dispatch_generation: i64,
    pub current_epoch: i64,
    pub message: Option<String>,
    pub cancel_requested: bool,
    /// (epoch, agent index, outcome, message, sandbox confirmed gone)
    pub attempts: Vec<(i64, usize, AttemptOutcome, Option<String>, bool)>,
}

pub fn observe_store(v: &RunView, agents: &[AgentRecord]) -> Observed {
    let agent = |id: &str| agents.iter().position(|a| a.id == id).expect("a known agent");
    Observed {
        run: v.run.status,
        jobs: v
            .jobs
            .iter()
            .map(|j| ObservedJob {
                name: j.job.name.clone(),
                status: j.job.status,
                dispatch_generation: j.job.dispatch_generation,
                current_epoch: j.job.current_epoch,
                message: j.job.message.clone(),
                cancel_requested: j.job.cancel_requested,
                attempts: j
                    .attempts
                    .iter()
                    .map(|a| (a.epoch, agent(&a.agent_id), a.outcome, a.message.clone(), a.released_at.is_some()))
                    .collect(),
            })
            .collect(),
    }
}

pub fn observe_model(m: &RunModel<Trigger>) -> Observed {
    Observed {
        run: m.run,
        jobs: m
            .jobs
            .iter()
            .map(|j| ObservedJob {
                name: j.spec.name.clone(),
                status: j.status,
                dispatch_generation: j.dispatch_generation,
                current_epoch: j.current_epoch,
                message: j.message.clone(),
                cancel_requested: j.cancel_requested,
                attempts: j
                    .attempts
                    .iter()
                    .map(|a| (a.epoch, a.agent, a.outcome, a.message.clone(), a.released))
                    .collect(),
            })
            .collect(),
    }
}
