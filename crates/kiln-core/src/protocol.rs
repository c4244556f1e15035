//! A reference model of one run's protocol (spec 000 §7–§9), built only from
//! the decision functions of this crate: the same rules the store executes
//! in its transactions, applied to plain data. The store's property test
//! (`kiln-store/tests/conformance/state_machine.rs`) drives this model and
//! the real store with the same operations and compares what both can know;
//! the tests below check the protocol's safety rules on the model alone.
//!
//! The model has no clock: a lease ends only by an explicit operation
//! ([`RunModel::expire_lease`], [`RunModel::lose_session`]), retry backoff is
//! not modelled (a retried job is ready at once), and job-level concurrency
//! groups (which involve other runs) are outside it.

use crate::advance::{AdvanceJob, AdvanceRun, Conditions, JobRules, Verdict, plan_advance};
use crate::attempt::{AttemptEvent, AttemptOutcome};
use crate::backoff::Backoff;
use crate::cancel::{CancelVerdict, plan_cancel};
use crate::claim::{ClaimAgent, ClaimFacts, ClaimRefusal, JobPlacement, UntrustedPolicy, decide_claim, replay_stands};
use crate::complete::{CompletionFacts, CompletionVerdict, decide_completion, missing_output, success_message};
use crate::failure::{
    CANCELLED, FailureClass, FailureFacts, FailureVerdict, RetryBudget, SiblingAction, decide_failure,
    fail_fast_siblings,
};
use crate::job::{JobEvent, JobStatus};
use crate::lease::{AttemptLease, LOST_ATTEMPT, LOST_JOB, LeaseVerdict, Stale, check_live, decide_heartbeat};
use crate::run::RunStatus;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not the current live epoch (HTTP 409 stale_epoch).
    Stale(Stale),
    /// Cancellation committed first: the late completion is refused (409).
    CancelledFirst,
    /// A completion reporting `running`.
    Invalid,
}

/// A job of the run as the model declares it.
#[derive(Debug, Clone, Default)]
pub struct JobSpec {
    pub name: String,
    pub needs: Vec<String>,
    pub rules: JobRules,
    /// The workflow's `retry:`.
    pub retry: u32,
    pub runs_on: BTreeMap<String, String>,
    /// Declared outputs (`artifacts.publish`).
    pub outputs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAttempt {
    pub epoch: i64,
    pub agent: usize,
    pub outcome: AttemptOutcome,
    pub message: Option<String>,
    pub lease_deadline: i64,
    /// Outputs this epoch sealed.
    pub sealed: Vec<String>,
    /// Its sandbox is confirmed gone: it ended through its agent, or its
    /// agent said so after it was fenced (issue 40, item 5).
    pub released: bool,
}

#[derive(Debug, Clone)]
pub struct ModelJob {
    pub spec: JobSpec,
    pub status: JobStatus,
    pub dispatch_generation: i64,
    pub current_epoch: i64,
    pub message: Option<String>,
    pub cancel_requested: bool,
    pub budget: RetryBudget,
    pub attempts: Vec<ModelAttempt>,
    /// Epoch whose outputs are bound (only by a successful completion).
    pub bound: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct ModelAgent {
    pub labels: BTreeMap<String, String>,
    pub max_jobs: u32,
}

/// What an agent reports at completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    pub class: Option<FailureClass>,
}

/// One run, its jobs and the agents that claim them.
#[derive(Debug, Clone)]
pub struct RunModel<C> {
    pub run: RunStatus,
    pub jobs: Vec<ModelJob>,
    pub agents: Vec<ModelAgent>,
    /// The database clock: fixed; leases end by explicit operations.
    pub now: i64,
    cond: C,
    backoff: Backoff,
    rng: StdRng,
}

/// The lease a claim or heartbeat grants (any positive length works: the
/// model's clock does not move).
const TTL: i64 = 1;

impl<C: Conditions> RunModel<C> {
    /// An accepted run: its jobs pending, then advanced (roots ready).
    ///
    /// # Panics
    /// When a job has a job-level concurrency group (not modelled).
    pub fn accept(jobs: Vec<JobSpec>, agents: Vec<ModelAgent>, cond: C, backoff: Backoff, seed: u64) -> Self {
        assert!(jobs.iter().all(|j| j.rules.concurrency.is_none()), "job concurrency groups are not modelled");
        let jobs = jobs
            .into_iter()
            .map(|spec| ModelJob {
                status: JobStatus::Pending,
                dispatch_generation: 0,
                current_epoch: 0,
                message: None,
                cancel_requested: false,
                budget: RetryBudget::new(0, 0, spec.retry),
                attempts: vec![],
                bound: None,
                spec,
            })
            .collect();
        let mut m =
            RunModel { run: RunStatus::Queued, jobs, agents, now: 0, cond, backoff, rng: StdRng::seed_from_u64(seed) };
        m.advance();
        m
    }

    fn attempt(&self, job: usize, epoch: i64) -> Option<&ModelAttempt> {
        self.jobs[job].attempts.iter().find(|a| a.epoch == epoch)
    }

    fn attempt_mut(&mut self, job: usize, epoch: i64) -> &mut ModelAttempt {
        self.jobs[job].attempts.iter_mut().find(|a| a.epoch == epoch).expect("a live attempt exists")
    }

    fn live(&self, job: usize, epoch: i64) -> Result<(), Stale> {
        let lease =
            self.attempt(job, epoch).map(|a| AttemptLease { outcome: a.outcome, lease_deadline: a.lease_deadline });
        check_live(epoch, self.jobs[job].current_epoch, lease, self.now)
    }

    /// Whether `(job, epoch)` is live now.
    pub fn is_live(&self, job: usize, epoch: i64) -> bool {
        self.live(job, epoch).is_ok()
    }

    /// Attempts of `agent` still running (its session's capacity in use).
    pub fn running_of(&self, agent: usize) -> u32 {
        let all = self.jobs.iter().flat_map(|j| &j.attempts);
        all.filter(|a| a.agent == agent && a.outcome == AttemptOutcome::Running).count() as u32
    }

    /// The claim transaction, for a delivery carrying `generation`.
    pub fn claim(&mut self, agent: usize, job: usize, generation: i64) -> Result<i64, ClaimRefusal> {
        let j = &self.jobs[job];
        let needs_unfinished =
            self.jobs.iter().filter(|o| j.spec.needs.contains(&o.spec.name) && !o.status.is_terminal()).count();
        let a = &self.agents[agent];
        let grant = decide_claim(&ClaimFacts {
            run: self.run,
            job: j.status,
            dispatch_generation: j.dispatch_generation,
            requested_generation: generation,
            needs_unfinished,
            next_attempt_at: None,
            now: self.now,
            current_epoch: j.current_epoch,
            required_labels: &j.spec.runs_on,
            placement: &JobPlacement::default(),
            untrusted: &UntrustedPolicy::default(),
            agent: Some(ClaimAgent {
                session_current: true,
                labels: &a.labels,
                name: "agent",
                pool: "default",
                executor: crate::claim::Executor::Host,
                running: Some(self.running_of(agent)),
                max_jobs: a.max_jobs,
            }),
            lease_ttl_ms: TTL,
        })?;
        self.run = grant.run;
        let j = &mut self.jobs[job];
        j.status = grant.job;
        j.current_epoch = grant.epoch;
        j.attempts.push(ModelAttempt {
            epoch: grant.epoch,
            agent,
            outcome: AttemptOutcome::Running,
            message: None,
            lease_deadline: grant.lease_deadline,
            sealed: vec![],
            released: false,
        });
        Ok(grant.epoch)
    }

    /// A claim request retried after its acknowledgement was lost.
    pub fn replay_claim(&self, job: usize, epoch: i64) -> Option<i64> {
        let j = &self.jobs[job];
        replay_stands(j.status, j.current_epoch, epoch).then_some(epoch)
    }

    /// The heartbeat: `Ok(stop)` extends the lease.
    pub fn heartbeat(&mut self, job: usize, epoch: i64) -> Result<bool, Refusal> {
        let j = &self.jobs[job];
        let lease =
            self.attempt(job, epoch).map(|a| AttemptLease { outcome: a.outcome, lease_deadline: a.lease_deadline });
        match decide_heartbeat(epoch, j.current_epoch, lease, self.run, j.cancel_requested, self.now, TTL) {
            LeaseVerdict::Extend { lease_deadline, stop } => {
                self.attempt_mut(job, epoch).lease_deadline = lease_deadline;
                Ok(stop)
            }
            LeaseVerdict::Stale(s) => Err(Refusal::Stale(s)),
        }
    }

    /// Seal an output of `epoch` (its upload was verified).
    pub fn seal(&mut self, job: usize, epoch: i64, output: &str) -> Result<(), Refusal> {
        self.live(job, epoch).map_err(Refusal::Stale)?;
        self.attempt_mut(job, epoch).sealed.push(output.to_string());
        Ok(())
    }

    /// The lease of `(job, epoch)` runs out now (if it is running).
    pub fn expire_lease(&mut self, job: usize, epoch: i64) {
        let now = self.now;
        if let Some(a) =
            self.jobs[job].attempts.iter_mut().find(|a| a.epoch == epoch && a.outcome == AttemptOutcome::Running)
        {
            a.lease_deadline = a.lease_deadline.min(now);
        }
    }

    /// The agent's session is gone: its running leases end now. Returns how many.
    pub fn lose_session(&mut self, agent: usize) -> usize {
        let now = self.now;
        let mut ended = 0;
        for a in self.jobs.iter_mut().flat_map(|j| &mut j.attempts) {
            if a.agent == agent && a.outcome == AttemptOutcome::Running {
                a.lease_deadline = a.lease_deadline.min(now);
                ended += 1;
            }
        }
        ended
    }

    /// The reconciler: fence every running attempt whose lease expired, then
    /// authorize a replacement within the budget. Returns (job, epoch) fenced.
    pub fn fence(&mut self) -> Vec<(usize, i64)> {
        let now = self.now;
        let expired: Vec<(usize, i64)> = (0..self.jobs.len())
            .flat_map(|j| self.jobs[j].attempts.iter().map(move |a| (j, a)))
            .filter(|(_, a)| a.outcome == AttemptOutcome::Running && a.lease_deadline <= now)
            .map(|(j, a)| (j, a.epoch))
            .collect();
        for &(job, epoch) in &expired {
            let a = self.attempt_mut(job, epoch);
            a.outcome = a.outcome.transition(AttemptEvent::Fenced).expect("running → lost");
            a.message = Some(LOST_ATTEMPT.into());
            let j = &self.jobs[job];
            if crate::lease::fence_fails_job(j.status, j.current_epoch, epoch) {
                self.fail_or_retry(job, FailureClass::AgentLost, None, LOST_JOB);
            }
        }
        expired
    }

    /// The completion transaction. `Ok`: the job's status after it.
    pub fn complete(&mut self, job: usize, epoch: i64, report: &Report) -> Result<JobStatus, Refusal> {
        self.live(job, epoch).map_err(Refusal::Stale)?;
        let verdict = decide_completion(&CompletionFacts {
            run: self.run,
            cancel_requested: self.jobs[job].cancel_requested,
            reported: report.outcome,
            exit_code: report.exit_code,
            message: report.message.as_deref(),
            class: report.class,
        });
        let Some(outcome) = verdict.attempt_outcome() else { return Err(Refusal::Invalid) };
        match verdict {
            CompletionVerdict::Cancelled { accepted } => {
                self.end_attempt(job, epoch, outcome, Some(CANCELLED.into()));
                self.fail_or_retry(job, FailureClass::Cancelled, report.exit_code, CANCELLED);
                if accepted { Ok(self.jobs[job].status) } else { Err(Refusal::CancelledFirst) }
            }
            CompletionVerdict::Succeed => {
                let sealed = &self.attempt(job, epoch).expect("live").sealed;
                if let Some(missing) = self.jobs[job].spec.outputs.iter().find(|o| !sealed.contains(o)) {
                    let msg = missing_output(missing, epoch);
                    self.end_attempt(job, epoch, AttemptOutcome::Failed, Some(msg.clone()));
                    self.fail_or_retry(job, FailureClass::StepFailed, None, &msg);
                    return Ok(self.jobs[job].status);
                }
                self.end_attempt(job, epoch, outcome, report.message.clone());
                let j = &mut self.jobs[job];
                j.bound = Some(epoch);
                j.status = j.status.transition(JobEvent::Succeeded).expect("running → success");
                j.message = success_message(j.message.as_deref()).map(str::to_string);
                self.advance();
                Ok(JobStatus::Success)
            }
            CompletionVerdict::Fail { message, class } => {
                self.end_attempt(job, epoch, outcome, Some(message.clone()));
                self.fail_or_retry(job, class, report.exit_code, &message);
                Ok(self.jobs[job].status)
            }
            CompletionVerdict::Invalid => Err(Refusal::Invalid),
        }
    }

    /// Cancellation of the run. Returns the run's status after it.
    pub fn cancel(&mut self) -> RunStatus {
        let statuses: Vec<JobStatus> = self.jobs.iter().map(|j| j.status).collect();
        if let CancelVerdict::Cancel { jobs, run } = plan_cancel(self.run, &statuses, self.awaiting_release()) {
            for i in jobs {
                let j = &mut self.jobs[i];
                j.status = j.status.transition(JobEvent::Cancel).expect("pending/ready → cancelled");
                j.message = Some(CANCELLED.into());
            }
            self.run = run;
        }
        self.run
    }

    fn end_attempt(&mut self, job: usize, epoch: i64, outcome: AttemptOutcome, message: Option<String>) {
        let a = self.attempt_mut(job, epoch);
        debug_assert!(a.outcome.can_publish());
        a.outcome = outcome;
        a.message = message;
        a.released = true;
    }

    /// Whether a fenced attempt's sandbox is not yet confirmed gone.
    pub fn awaiting_release(&self) -> bool {
        self.jobs.iter().flat_map(|j| &j.attempts).any(|a| a.outcome == AttemptOutcome::Lost && !a.released)
    }

    /// The agent of `(job, epoch)` confirms its sandbox is gone (after a
    /// fence; or its restart or removal). `Ok(true)`: newly confirmed. A
    /// running attempt is refused: its completion confirms it.
    pub fn release(&mut self, job: usize, epoch: i64) -> Result<bool, Refusal> {
        let Some(a) = self.jobs[job].attempts.iter_mut().find(|a| a.epoch == epoch) else {
            return Err(Refusal::Invalid);
        };
        if a.outcome == AttemptOutcome::Running {
            return Err(Refusal::Invalid);
        }
        if a.released {
            return Ok(false);
        }
        a.released = true;
        if self.run == RunStatus::Cancelling {
            self.advance();
        }
        Ok(true)
    }

    /// The failure rule applied to a job whose attempt ended without success.
    fn fail_or_retry(&mut self, job: usize, class: FailureClass, exit_code: Option<i32>, message: &str) {
        let j = &self.jobs[job];
        let fail_fast_group = j.spec.rules.matrix.as_ref().filter(|m| m.fail_fast).map(|m| m.group.clone());
        let facts = FailureFacts {
            run: self.run,
            cancel_requested: j.cancel_requested,
            class,
            exit_code,
            budget: j.budget,
            message,
            fail_fast_group: fail_fast_group.as_deref(),
        };
        let verdict = decide_failure(&facts, &self.backoff, &mut self.rng);
        let j = &mut self.jobs[job];
        j.status = verdict.job_status(j.status).expect("the failure rule moves a running job");
        match verdict {
            FailureVerdict::Cancel { why } => j.message = Some(why.into()),
            FailureVerdict::Retry { class, message, .. } => {
                if class.is_infrastructure() {
                    j.budget.infra_used += 1;
                } else {
                    j.budget.failure_used += 1;
                }
                j.message = Some(message);
                // Backoff is not modelled: ready again with a new generation.
                j.dispatch_generation += 1;
                return;
            }
            FailureVerdict::Fail { message } => j.message = Some(message),
            FailureVerdict::FailFast { message, group } => {
                j.message = Some(message);
                let failed = j.spec.name.clone();
                let jobs: Vec<(&str, JobStatus, Option<&str>)> = self
                    .jobs
                    .iter()
                    .map(|o| (o.spec.name.as_str(), o.status, o.spec.rules.matrix.as_ref().map(|m| m.group.as_str())))
                    .collect();
                for (i, action) in fail_fast_siblings(&failed, &group, &jobs) {
                    let s = &mut self.jobs[i];
                    match action {
                        SiblingAction::Cancel { why } => {
                            s.status = s.status.transition(JobEvent::Cancel).expect("pending/ready → cancelled");
                            s.message = Some(why);
                        }
                        SiblingAction::Stop => s.cancel_requested = true,
                    }
                }
            }
        }
        self.advance();
    }

    /// One advancement pass, its verdicts applied.
    fn advance(&mut self) {
        let run = AdvanceRun {
            status: self.run,
            held: false,
            repo_id: String::new(),
            awaiting_release: self.awaiting_release(),
            environments: Default::default(),
            refused: Default::default(),
            promotions: Default::default(),
        };
        let jobs = self
            .jobs
            .iter()
            .map(|j| AdvanceJob {
                name: j.spec.name.clone(),
                status: j.status,
                needs: j.spec.needs.clone(),
                rules: Some(j.spec.rules.clone()),
            })
            .collect();
        for v in plan_advance(run, jobs, &self.cond, |_, _, _| unreachable!("no job concurrency groups")) {
            match v {
                Verdict::Ready { job, note } => {
                    let j = &mut self.jobs[job];
                    j.status = j.status.transition(JobEvent::NeedsMet).expect("pending → ready");
                    j.dispatch_generation += 1;
                    if note.is_some() {
                        j.message = note;
                    }
                }
                Verdict::Skip { job, why } => {
                    let j = &mut self.jobs[job];
                    j.status = j.status.transition(JobEvent::Skip).expect("pending → skipped");
                    j.message = Some(why);
                }
                Verdict::Finish(status) => self.run = status,
                Verdict::WaitMaxParallel { .. }
                | Verdict::EnterGroup { .. }
                | Verdict::WaitGroup { .. }
                | Verdict::WaitApproval { .. }
                | Verdict::WaitPromotion { .. }
                | Verdict::Reject { .. } => {}
            }
        }
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
