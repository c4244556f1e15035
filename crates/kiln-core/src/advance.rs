//! Advancing a run: after something changed, which pending jobs become ready,
//! which are skipped, which wait (matrix `max-parallel`, concurrency group),
//! and whether the run is finished (spec 000 §2 and §9: "if a successor
//! exists: mark successor READY …, else mark the workflow SUCCESS"; spec 003
//! for `if:`, quorum, matrix and concurrency groups).
//!
//! Invariant protected: advancement happens in the transaction that decided
//! the change — a job whose needs all succeeded never stays pending, a job
//! downstream of a failure is skipped, and a run with nothing left to run is
//! finished. The store loads the run's jobs (in job order), runs one
//! [`AdvancePass`] and writes each verdict as it comes.
//!
//! Jobs are listed so that needs always name earlier jobs, so one pass in job
//! order decides every job whose needs are all decided; statuses decided
//! earlier in the pass are visible to later jobs.

use crate::job::{JobEvent, JobStatus};
use crate::run::{RunEvent, RunStatus};
use std::collections::HashMap;

/// The result of a need as an `if:` expression sees it. A need that has not
/// finished (the job is decided early because it is hopeless) counts as a
/// failure, as does a failed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeedResult {
    Success,
    Failure,
    Cancelled,
    Skipped,
}

impl NeedResult {
    /// `None`: the need names no job of the run.
    pub fn of(status: Option<JobStatus>) -> NeedResult {
        match status {
            Some(JobStatus::Success) => NeedResult::Success,
            Some(JobStatus::Cancelled) => NeedResult::Cancelled,
            Some(JobStatus::Skipped) => NeedResult::Skipped,
            _ => NeedResult::Failure,
        }
    }
}

/// Evaluates the workflow language for the pass (kiln-workflow implements it
/// over the frozen run's trigger context; kiln-core does not parse
/// expressions).
pub trait Conditions {
    /// Evaluate the `if:` expression `expr` (`success()` for a job without
    /// one) given the results of the job's needs, in `needs` order, and its
    /// quorum. `Err`: the expression could not be evaluated (its message).
    fn eval_if(&self, expr: &str, needs: &[NeedResult], quorum: Option<u32>) -> Result<bool, String>;
    /// Render a job-level concurrency group template over the run's trigger.
    fn render_group(&self, template: &str) -> Result<String, String>;
}

/// A matrix job's group, its `max-parallel` and `fail-fast`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRule {
    /// The matrix job's name as written: every expansion shares it.
    pub group: String,
    pub max_parallel: Option<u32>,
    /// Used by the failure rule ([`crate::failure::FailureFacts::fail_fast_group`]), not here.
    pub fail_fast: bool,
}

/// A job-level `concurrency:`, or an environment's deploy queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupRule {
    /// The group template (see [`Conditions::render_group`]); unused for
    /// an environment's queue.
    pub template: String,
    pub cancel_in_progress: bool,
    /// `queue: ordered`: jobs waiting for the group are never superseded;
    /// they enter one at a time in acceptance order.
    pub ordered: bool,
    /// The deploy queue of this environment (issue 46): the key is
    /// [`environment_group`], the same for every repository, and the jobs
    /// of one run share the run's place in it.
    pub environment: Option<String>,
}

/// The concurrency group key of `environment`'s deploy queue.
pub fn environment_group(environment: &str) -> String {
    format!("{ENVIRONMENT_GROUP_PREFIX}{environment}")
}

/// Group keys of environments' deploy queues start with this (a job
/// group's key starts with its repository id, which never does).
pub const ENVIRONMENT_GROUP_PREFIX: &str = "environment:";

/// May a job of the run start as far as its environment's protection
/// rules go (issue 46)? The store reads the environment and the run's
/// approvals for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvironmentGate {
    /// No approval needed, or enough given (and not expired).
    Open,
    /// Waiting for approval: the job stays pending and says this.
    Waiting(String),
    /// Rejected: the job is cancelled with this message.
    Rejected(String),
}

/// Where a job's promotion between two rings stands (issue 46, `rings:`),
/// as the store read it: the gate's row, kept by the server's gate runner,
/// `kiln promote` and `kiln pause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromotionGate {
    /// Baked, and the gate passed (or was promoted by hand): the job goes on.
    Open,
    /// Baking, measuring or paused: the job stays pending and says this.
    Waiting(String),
    /// The gate failed: the job is cancelled with this message (and the
    /// server rolls the environment back).
    Failed(String),
}

/// The parts of a job's frozen definition that decide its advancement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobRules {
    /// The `if:` expression as written.
    pub condition: Option<String>,
    pub quorum: Option<u32>,
    pub matrix: Option<MatrixRule>,
    pub concurrency: Option<GroupRule>,
    /// `environment:`: the job waits for [`AdvanceRun::environments`]'s
    /// gate of this name before anything else lets it start.
    pub environment: Option<String>,
    /// The job waits for a promotion between two rings
    /// ([`AdvanceRun::promotions`]) once its needs succeeded.
    pub promotion: bool,
}

/// One job of the run, as its row stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvanceJob {
    pub name: String,
    pub status: JobStatus,
    /// Names of the jobs it needs (always earlier jobs).
    pub needs: Vec<String>,
    /// `None`: the definition has no job at this index (never for a run
    /// accepted from its definition; such a job has no `if:` and is never
    /// hopeless).
    pub rules: Option<JobRules>,
}

/// The run being advanced, as loaded at the start of the pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvanceRun {
    pub status: RunStatus,
    /// Waiting for its run-level concurrency group: no job becomes ready.
    pub held: bool,
    /// Scopes job concurrency group keys (`{repo_id}:{group}`).
    pub repo_id: String,
    /// A fenced attempt of the run has not been confirmed gone (issue 40,
    /// item 5): a cancelling run stays cancelling, whatever its jobs say.
    pub awaiting_release: bool,
    /// The gate of each environment the run's jobs deploy to (an
    /// environment missing here is [`EnvironmentGate::Open`]).
    pub environments: HashMap<String, EnvironmentGate>,
    /// Deploy jobs their environment's provenance policy refuses (issue
    /// 46, `--require-provenance`): job name → why. Such a job, once it
    /// would run, is cancelled with this message (before any approval).
    pub refused: HashMap<String, String>,
    /// Promotions between rings by job name (issue 46). A job with
    /// [`JobRules::promotion`] missing here waits (the store starts its
    /// gate when the job's needs succeeded).
    pub promotions: HashMap<String, PromotionGate>,
}

/// What the store does for one job (or the run). `job` is the index into the
/// jobs the pass was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Make the job ready: a new dispatch generation and its outbox event in
    /// this transaction. `note` (when set) becomes the job's message: it ran
    /// on a quorum.
    Ready { job: usize, note: Option<String> },
    /// The job will never run: status `skipped`, message `why`.
    Skip { job: usize, why: String },
    /// Its matrix group already has `max-parallel` jobs ready or running: it
    /// stays pending (nothing to write).
    WaitMaxParallel { job: usize },
    /// The job may run once it enters its concurrency group `key`, which
    /// depends on other runs' jobs: the caller decides (see
    /// [`crate::groups::decide_group_entry`]) and answers with
    /// [`AdvancePass::resolve_group`]. The next verdict is `Ready` (entered)
    /// or `WaitGroup`.
    EnterGroup { job: usize, key: String, cancel_in_progress: bool, ordered: bool },
    /// The job waits for its environment's approval: it stays pending with
    /// this message.
    WaitApproval { job: usize, message: String },
    /// Its environment's deployment was rejected (or its promotion gate
    /// failed): the job is cancelled with this message.
    Reject { job: usize, why: String },
    /// The job waits for its promotion between two rings: it stays pending
    /// with this message.
    WaitPromotion { job: usize, message: String },
    /// The job stays pending until its concurrency group frees up.
    WaitGroup { job: usize, key: String },
    /// Nothing is left to run: the run ends with this status.
    Finish(RunStatus),
}

/// One advancement pass, verdict by verdict, so the store can resolve
/// concurrency-group entry (a database question) in the middle of it.
#[derive(Debug, Clone)]
pub struct AdvancePass {
    run: AdvanceRun,
    jobs: Vec<AdvanceJob>,
    index: HashMap<String, usize>,
    /// Matrix groups → jobs occupying a `max-parallel` slot, counting those
    /// made ready earlier in this pass.
    occupied: HashMap<String, u32>,
    next: usize,
    /// An `EnterGroup` awaiting its answer: (job, key, note if it enters).
    asking: Option<(usize, String, Option<String>)>,
    /// The group answer, waiting to be reported.
    answered: Option<Verdict>,
    done: bool,
}

impl AdvancePass {
    pub fn new(run: AdvanceRun, jobs: Vec<AdvanceJob>) -> Self {
        let index = jobs.iter().enumerate().map(|(i, j)| (j.name.clone(), i)).collect();
        let mut occupied: HashMap<String, u32> = HashMap::new();
        for j in &jobs {
            if let Some(m) = j.rules.as_ref().and_then(|r| r.matrix.as_ref())
                && j.status.occupies_slot()
            {
                *occupied.entry(m.group.clone()).or_default() += 1;
            }
        }
        AdvancePass { run, jobs, index, occupied, next: 0, asking: None, answered: None, done: false }
    }

    /// The job statuses as the pass has decided them so far.
    pub fn statuses(&self) -> impl Iterator<Item = JobStatus> + '_ {
        self.jobs.iter().map(|j| j.status)
    }

    /// Answer the pending [`Verdict::EnterGroup`]: `entered` makes the job
    /// ready, otherwise it waits for its group.
    ///
    /// # Panics
    /// When no `EnterGroup` is pending.
    pub fn resolve_group(&mut self, entered: bool) {
        let (job, key, note) = self.asking.take().expect("resolve_group answers a pending EnterGroup");
        self.answered = Some(if entered { self.make_ready(job, note) } else { Verdict::WaitGroup { job, key } });
    }

    /// The next verdict; `None` when the pass is over.
    ///
    /// # Panics
    /// When an `EnterGroup` was not answered with [`Self::resolve_group`].
    pub fn next_verdict(&mut self, cond: &impl Conditions) -> Option<Verdict> {
        assert!(self.asking.is_none(), "an EnterGroup verdict must be resolved before the pass goes on");
        if let Some(v) = self.answered.take() {
            return Some(v);
        }
        if self.done {
            return None;
        }
        let deciding = self.run.status.can_claim() && !self.run.held;
        while deciding && self.next < self.jobs.len() {
            let i = self.next;
            self.next += 1;
            if let Some(v) = self.decide(i, cond) {
                return Some(v);
            }
        }
        self.done = true;
        self.finish().map(Verdict::Finish)
    }

    fn status_of(&self, name: &str) -> Option<JobStatus> {
        self.index.get(name).map(|&i| self.jobs[i].status)
    }

    fn decide(&mut self, i: usize, cond: &impl Conditions) -> Option<Verdict> {
        let job = &self.jobs[i];
        if job.status != JobStatus::Pending {
            return None;
        }
        let rules = job.rules.as_ref();
        let needs = &job.needs;
        let all_decided = needs.iter().all(|n| self.status_of(n).is_some_and(|s| s.is_terminal()));
        // Without `if:`, a job whose needs can no longer all (or a quorum)
        // succeed is skipped at once, even while other needs still run.
        let hopeless = rules.is_some_and(|r| r.condition.is_none()) && {
            let lost = needs.iter().filter(|n| self.status_of(n).is_some_and(JobStatus::is_unsuccessful)).count();
            let required = rules.and_then(|r| r.quorum).map(|q| q as usize).unwrap_or(needs.len());
            needs.len() - lost < required
        };
        if !all_decided && !hopeless {
            return None;
        }
        let gate = rules.and_then(|r| r.environment.as_ref()).and_then(|e| self.run.environments.get(e)).cloned();
        let results: Vec<NeedResult> = needs.iter().map(|n| NeedResult::of(self.status_of(n))).collect();
        let quorum = rules.and_then(|r| r.quorum);
        let expr = rules.and_then(|r| r.condition.as_deref());
        // Without `if:`, a job runs when its needs succeeded (spec 000 §2).
        let go = cond.eval_if(expr.unwrap_or("success()"), &results, quorum);
        if go != Ok(true) {
            let why = match (&go, expr) {
                (Err(e), _) => format!("skipped: its condition could not be evaluated: {e}"),
                (_, Some(c)) => format!("skipped: condition `{c}` is false"),
                (_, None) => "skipped: a job it needs did not succeed".to_string(),
            };
            self.set(i, JobEvent::Skip);
            return Some(Verdict::Skip { job: i, why });
        }
        // Provenance first: an artifact the environment refuses is never
        // deployed, however approved.
        if let Some(why) = self.run.refused.get(&self.jobs[i].name).cloned() {
            self.set(i, JobEvent::Cancel);
            return Some(Verdict::Reject { job: i, why });
        }
        // A ring after the first waits for its promotion: the bake and the
        // gate after the ring before.
        if rules.is_some_and(|r| r.promotion) {
            match self.run.promotions.get(&self.jobs[i].name).cloned() {
                Some(PromotionGate::Open) => {}
                Some(PromotionGate::Failed(why)) => {
                    self.set(i, JobEvent::Cancel);
                    return Some(Verdict::Reject { job: i, why });
                }
                Some(PromotionGate::Waiting(message)) => return Some(Verdict::WaitPromotion { job: i, message }),
                None => {
                    let message = "waiting for its promotion gate to start".to_string();
                    return Some(Verdict::WaitPromotion { job: i, message });
                }
            }
        }
        // Approval next: an unapproved deploy holds no place in its
        // environment's queue.
        match gate {
            Some(EnvironmentGate::Waiting(message)) => return Some(Verdict::WaitApproval { job: i, message }),
            Some(EnvironmentGate::Rejected(why)) => {
                self.set(i, JobEvent::Cancel);
                return Some(Verdict::Reject { job: i, why });
            }
            Some(EnvironmentGate::Open) | None => {}
        }
        let ok = results.iter().filter(|r| **r == NeedResult::Success).count();
        // Ran on a quorum: say so where users look.
        let note = (quorum.is_some() && ok < needs.len())
            .then(|| format!("degraded: {ok} of {} needs succeeded (quorum)", needs.len()));
        if let Some(m) = rules.and_then(|r| r.matrix.as_ref())
            && let Some(max) = m.max_parallel
        {
            let n = self.occupied.entry(m.group.clone()).or_default();
            if *n >= max {
                return Some(Verdict::WaitMaxParallel { job: i });
            }
            // Taken now, even if the job then waits for its concurrency group.
            *n += 1;
        }
        if let Some(g) = rules.and_then(|r| r.concurrency.as_ref()) {
            let key = match &g.environment {
                Some(env) => environment_group(env),
                None => {
                    let group = cond.render_group(&g.template).unwrap_or_else(|_| g.template.clone());
                    format!("{}:{group}", self.run.repo_id)
                }
            };
            let (cancel_in_progress, ordered) = (g.cancel_in_progress, g.ordered);
            self.asking = Some((i, key.clone(), note));
            return Some(Verdict::EnterGroup { job: i, key, cancel_in_progress, ordered });
        }
        Some(self.make_ready(i, note))
    }

    fn make_ready(&mut self, job: usize, note: Option<String>) -> Verdict {
        self.set(job, JobEvent::NeedsMet);
        Verdict::Ready { job, note }
    }

    fn set(&mut self, job: usize, event: JobEvent) {
        let j = &mut self.jobs[job];
        j.status = j.status.transition(event).expect("a pending job becomes ready or skipped");
    }

    /// The run's final status when nothing is left to run: cancelled when it
    /// was cancelling, failed when any job failed or was cancelled, else
    /// success (skipped jobs do not fail a run).
    fn finish(&self) -> Option<RunStatus> {
        if self.jobs.iter().any(|j| !j.status.is_terminal()) || self.run.status.is_terminal() {
            return None;
        }
        let event = if self.run.status == RunStatus::Cancelling {
            // spec 000 §9: kept cancelling while physical termination is
            // unresolved; a lapsed lease certifies nothing.
            if self.run.awaiting_release {
                return None;
            }
            RunEvent::Cancelled
        } else if self.jobs.iter().any(|j| j.status.fails_run()) {
            RunEvent::Failed
        } else {
            RunEvent::AllSucceeded
        };
        Some(self.run.status.transition(event).expect("an active run can finish"))
    }
}

/// A whole pass for callers that can answer group entry synchronously (the
/// reference model, tests): `enter_group(job, key, cancel_in_progress)`.
/// Returns every verdict in order, `EnterGroup` questions included.
pub fn plan_advance(
    run: AdvanceRun,
    jobs: Vec<AdvanceJob>,
    cond: &impl Conditions,
    mut enter_group: impl FnMut(usize, &str, bool) -> bool,
) -> Vec<Verdict> {
    let mut pass = AdvancePass::new(run, jobs);
    let mut out = Vec::new();
    while let Some(v) = pass.next_verdict(cond) {
        if let Verdict::EnterGroup { job, key, cancel_in_progress, .. } = &v {
            pass.resolve_group(enter_group(*job, key, *cancel_in_progress));
        }
        out.push(v);
    }
    out
}

#[cfg(test)]
#[path = "advance_tests.rs"]
mod tests;
