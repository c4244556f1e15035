//! A property test over random interleavings of claims (by two agents),
//! heartbeats, lease expiry and fencing, completions by current and stale
//! holders, replayed claim requests and cancellation. After every step it
//! checks the protocol's safety rules against the store's own view:
//!
//! - at most one attempt per job ever succeeds, and it is the job's current
//!   epoch at completion;
//! - a terminal job or run never changes again;
//! - a job never has an attempt before all its needs succeeded;
//! - refused calls (stale epoch, stale generation, absorbed duplicates)
//!   change nothing; eligible claims are not refused;
//! - retry budgets are counted per job (deterministic vs. infrastructure);
//! - advancement is never left pending: a job whose needs all succeeded is
//!   ready, one downstream of a failure is skipped, an active run has work left.
//!
//! The same operations also drive kiln-core's reference model
//! ([`kiln_core::protocol::RunModel`], built from the decision functions the
//! store is to execute): every call must be refused by both or by neither
//! (for the same reason, stale-epoch messages included), and after every
//! step both must show the same observable state (`reference::Observed`:
//! run and job statuses, dispatch generations, epochs, messages, attempt
//! holders and outcomes) and retry counts. The model has no clock: a lease
//! ends by an explicit operation on both sides, and backoff times are not
//! compared (with `FAST` a retried job is ready at once on both).
//!
//! Operations mostly aim at a job where they can take effect (a ready job for
//! a claim, a held live epoch for a holder's call) so that runs get finished;
//! the rest aim anywhere and exercise refusals. No sleeps beyond a few ms:
//! leases end in database time via `shorten_session_leases(…, 0)` or a 1 ms
//! heartbeat.

mod reference;

use super::*;
use kiln_core::RunStatus;
use kiln_core::backoff::DEFAULT_INFRA_RETRIES;
use kiln_core::lease::Stale;
use kiln_core::protocol::{Refusal, Report, RunModel};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reference::{Trigger, observe_model, observe_store};
use std::collections::HashMap;

/// A diamond plus an independent root: b and c need a, d needs b and c.
const JOBS: [(&str, &[&str]); 5] = [("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"]), ("e", &[])];
const AGENTS: usize = 2;
const MAX_JOBS: u32 = 2;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Success,
    Failure,
    Infra,
}

/// Which job an operation is about.
#[derive(Debug, Clone)]
enum Target {
    /// Any job, whatever its state (mostly refused calls).
    Any(usize),
    /// A job where the call can take effect: for a claim, a ready job; for a
    /// holder's call, a job whose current epoch the agent holds (falling back
    /// to any job it ever held, then to any job).
    Useful(prop::sample::Index),
}

#[derive(Debug, Clone)]
enum Op {
    /// A dispatch delivery of the job's current (or a stale) generation.
    Claim {
        agent: usize,
        job: Target,
        stale: bool,
    },
    /// The agent retries its last claim request for the job (lost ack).
    ReplayClaim {
        agent: usize,
        job: Target,
    },
    Heartbeat {
        agent: usize,
        job: Target,
    },
    /// The agent's connection dropped: its session leases end now, then the reconciler runs.
    LoseSession {
        agent: usize,
    },
    /// The agent's last lease for the job runs out in database time, then the reconciler runs.
    ExpireLease {
        agent: usize,
        job: Target,
    },
    /// The reconciler runs with nothing expired.
    Fence,
    Complete {
        agent: usize,
        job: Target,
        kind: Kind,
    },
    Cancel,
    /// The agent says the sandbox of its last attempt of the job is gone
    /// (issue 40, item 5).
    Release {
        agent: usize,
        job: Target,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let agent = 0..AGENTS;
    let job = prop_oneof![
        1 => (0..JOBS.len()).prop_map(Target::Any),
        6 => any::<prop::sample::Index>().prop_map(Target::Useful),
    ];
    let kind = prop_oneof![6 => Just(Kind::Success), 1 => Just(Kind::Failure), 1 => Just(Kind::Infra)];
    let (agent_r, job_r) = (agent.clone(), job.clone());
    prop_oneof![
        24 => (agent.clone(), job.clone(), prop::bool::weighted(0.15))
            .prop_map(|(agent, job, stale)| Op::Claim { agent, job, stale }),
        3 => (agent.clone(), job.clone()).prop_map(|(agent, job)| Op::ReplayClaim { agent, job }),
        6 => (agent.clone(), job.clone()).prop_map(|(agent, job)| Op::Heartbeat { agent, job }),
        2 => agent.clone().prop_map(|agent| Op::LoseSession { agent }),
        5 => (agent.clone(), job.clone()).prop_map(|(agent, job)| Op::ExpireLease { agent, job }),
        2 => Just(Op::Fence),
        28 => (agent, job, kind).prop_map(|(agent, job, kind)| Op::Complete { agent, job, kind }),
        1 => Just(Op::Cancel),
        2 => (agent_r, job_r).prop_map(|(agent, job)| Op::Release { agent, job }),
    ]
}

pub fn check<S: Store + 'static>(opener: Opener<S>) {
    let mut runner =
        TestRunner::new(Config { cases: 64, failure_persistence: None, max_shrink_iters: 400, ..Config::default() });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let strategy = (prop::collection::vec(0u32..=1, JOBS.len()), prop::collection::vec(op(), 1..80));
    let result = runner.run(&strategy, |(retries, ops)| {
        rt.block_on(run_case(&opener, &retries, &ops));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

struct Model<'a, S> {
    s: &'a S,
    run_id: String,
    ids: Vec<String>,
    retries: Vec<u32>,
    agents: Vec<AgentRecord>,
    /// Claims each agent won, per job: (request, epoch), oldest first.
    held: HashMap<(usize, usize), Vec<(ClaimInput, i64)>>,
    failure_used: Vec<u32>,
    infra_used: Vec<u32>,
    /// The reference model, driven with the same operations.
    reference: RunModel<Trigger>,
}

async fn run_case<S: Store + 'static>(opener: &Opener<S>, retries: &[u32], ops: &[Op]) {
    let fx = opener.open(FAST).await;
    let s = &*fx.store;
    let wf = workflow(JOBS.iter().zip(retries).map(|((name, needs), r)| job(name, needs, *r)).collect());
    let (_, run_id) = start(s, wf).await;
    let v = view(s, &run_id).await;
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        agents.push(agent(s, &format!("agent-{i}"), MAX_JOBS).await);
    }
    let mut m = Model {
        s,
        run_id,
        ids: v.jobs.iter().map(|j| j.job.id.clone()).collect(),
        retries: retries.to_vec(),
        agents,
        held: HashMap::new(),
        failure_used: vec![0; JOBS.len()],
        infra_used: vec![0; JOBS.len()],
        reference: reference::model(retries),
    };
    check_invariants(&v, &v);
    m.compare(&v, "accepted");
    for (step, op) in ops.iter().enumerate() {
        let pre = view(s, &m.run_id).await;
        let pre_snap = snapshot(s, &m.run_id).await;
        let changed = m.apply(op, &pre).await;
        let post = view(s, &m.run_id).await;
        if !changed {
            assert_eq!(snapshot(s, &m.run_id).await, pre_snap, "step {step} {op:?} was refused but changed state");
        }
        m.compare(&post, &format!("step {step} {op:?}"));
        check_invariants(&pre, &post);
    }
}

fn live(pre: &RunView, job: usize, epoch: i64) -> bool {
    let j = &pre.jobs[job];
    j.job.current_epoch == epoch && j.attempts.iter().any(|a| a.epoch == epoch && a.outcome == AttemptOutcome::Running)
}

fn running_in_session(pre: &RunView, session: &str) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = pre
        .jobs
        .iter()
        .flat_map(|j| j.attempts.iter())
        .filter(|a| a.outcome == AttemptOutcome::Running && a.session_id == session)
        .map(|a| (a.job_id.clone(), a.epoch))
        .collect();
    v.sort();
    v
}

impl<S: Store> Model<'_, S> {
    /// The store and the reference model show the same run, and the retry
    /// counts this test keeps are the model's.
    fn compare(&self, post: &RunView, after: &str) {
        let (store, model) = (observe_store(post, &self.agents), observe_model(&self.reference));
        assert_eq!(store, model, "store (left) and reference model (right) differ after {after}");
        for (j, job) in self.reference.jobs.iter().enumerate() {
            assert_eq!(
                (job.budget.failure_used, job.budget.infra_used),
                (self.failure_used[j], self.infra_used[j]),
                "retries counted for job {} after {after}",
                job.spec.name
            );
        }
    }

    fn last(&self, agent: usize, job: usize) -> Option<(ClaimInput, i64)> {
        self.held.get(&(agent, job)).and_then(|v| v.last().cloned())
    }

    /// A ready job when there is one.
    fn claim_target(&self, target: &Target, pre: &RunView) -> usize {
        let ready: Vec<usize> = (0..JOBS.len()).filter(|&j| pre.jobs[j].job.status == JobStatus::Ready).collect();
        match target {
            Target::Any(j) => *j,
            Target::Useful(i) if !ready.is_empty() => *i.get(&ready),
            Target::Useful(i) => i.index(JOBS.len()),
        }
    }

    /// For a holder's call: `(agent, job)` where the agent holds the job's live
    /// epoch (switching to the other agent if need be), else a job the agent
    /// held, else any job.
    fn held_target(&self, agent: usize, target: &Target, pre: &RunView) -> (usize, usize) {
        let i = match target {
            Target::Any(j) => return (agent, *j),
            Target::Useful(i) => i,
        };
        let live_of = |a: usize| -> Vec<(usize, usize)> {
            (0..JOBS.len()).filter(|&j| self.last(a, j).is_some_and(|(_, e)| live(pre, j, e))).map(|j| (a, j)).collect()
        };
        let mine = live_of(agent);
        let any_live: Vec<(usize, usize)> = (0..AGENTS).flat_map(live_of).collect();
        let held: Vec<(usize, usize)> =
            (0..JOBS.len()).filter(|&j| self.last(agent, j).is_some()).map(|j| (agent, j)).collect();
        [mine, any_live, held]
            .into_iter()
            .find(|c| !c.is_empty())
            .map(|c| *i.get(&c))
            .unwrap_or((agent, i.index(JOBS.len())))
    }

    /// Applies `op`, checks its specific outcome, and says whether it may have
    /// changed state (false: the store must be exactly as before).
    async fn apply(&mut self, op: &Op, pre: &RunView) -> bool {
        let s = self.s;
        match *op {
            Op::Claim { agent, ref job, stale } => {
                let job = self.claim_target(job, pre);
                let j = &pre.jobs[job].job;
                let generation = if stale { j.dispatch_generation - 1 } else { j.dispatch_generation };
                let req = claim_input(&self.agents[agent], &self.ids[job], generation, LONG_TTL);
                let got = s.claim(req.clone()).await.expect("claim with a valid session");
                let modelled = self.reference.claim(agent, job, generation);
                assert_eq!(got.as_ref().map(|c| c.epoch), modelled.ok(), "{op:?}: store vs model ({modelled:?})");
                let eligible = !stale
                    && j.status == JobStatus::Ready
                    && pre.run.status.can_claim()
                    && (running_in_session(pre, &self.agents[agent].session_id).len() as u32) < MAX_JOBS;
                match got {
                    Some(c) => {
                        assert!(eligible, "{op:?} claimed an ineligible job: {:?} run {}", j, pre.run.status);
                        assert_eq!(c.epoch, j.current_epoch + 1, "epoch = previous + 1");
                        assert_eq!(c.job.id, self.ids[job]);
                        self.held.entry((agent, job)).or_default().push((req, c.epoch));
                        true
                    }
                    None => {
                        assert!(!eligible, "{op:?} refused an eligible claim: {j:?}");
                        false
                    }
                }
            }
            Op::ReplayClaim { agent, ref job } => {
                let (agent, job) = self.held_target(agent, job, pre);
                let Some((req, epoch)) = self.last(agent, job) else {
                    return false;
                };
                let still = live(pre, job, epoch);
                let got = s.claim(req.clone()).await.expect("replayed claim");
                assert_eq!(got.map(|c| c.epoch), still.then_some(epoch), "replayed claim of epoch {epoch}");
                assert_eq!(self.reference.replay_claim(job, epoch), still.then_some(epoch), "model: replayed claim");
                let rec =
                    s.claimed_by_request(&req.claim_request_id, &req.session_id).await.expect("claimed_by_request");
                assert_eq!(rec.map(|c| c.epoch), still.then_some(epoch));
                false
            }
            Op::Heartbeat { agent, ref job } => {
                let (agent, job) = self.held_target(agent, job, pre);
                let Some((_, epoch)) = self.last(agent, job) else {
                    return false;
                };
                let r = s.heartbeat(&self.ids[job], epoch, LONG_TTL).await;
                let modelled = self.reference.heartbeat(job, epoch);
                same_refusal(&r, &modelled, &self.ids[job], epoch);
                if let (Ok(hb), Ok(stop)) = (&r, &modelled) {
                    assert_eq!(hb.cancel_requested, *stop, "heartbeat: store vs model stop");
                }
                if live(pre, job, epoch) {
                    let hb = r.expect("heartbeat of the live epoch");
                    assert_eq!(hb.cancel_requested, pre.run.status == RunStatus::Cancelling);
                    true
                } else {
                    assert_stale(r);
                    false
                }
            }
            Op::LoseSession { agent } => {
                let session = self.agents[agent].session_id.clone();
                let want = running_in_session(pre, &session);
                let n = s.shorten_session_leases(&session, 0).await.expect("shorten");
                assert_eq!(n as usize, want.len());
                assert_eq!(self.reference.lose_session(agent), want.len(), "model: leases of the session");
                let mut fenced = s.fence_expired().await.expect("fence");
                fenced.sort();
                let mut modelled: Vec<(String, i64)> =
                    self.reference.fence().into_iter().map(|(j, e)| (self.ids[j].clone(), e)).collect();
                modelled.sort();
                assert_eq!(fenced, modelled, "fenced: store vs model");
                assert_eq!(fenced, want, "fenced exactly the session's running attempts");
                for (job_id, _) in &fenced {
                    let job = self.ids.iter().position(|i| i == job_id).unwrap();
                    self.expect_lost(pre, job).await;
                }
                !want.is_empty()
            }
            Op::ExpireLease { agent, ref job } => {
                let (agent, job) = self.held_target(agent, job, pre);
                let Some((_, epoch)) = self.last(agent, job) else {
                    return false;
                };
                if !live(pre, job, epoch) {
                    return false;
                }
                s.heartbeat(&self.ids[job], epoch, 1).await.expect("heartbeat of the live epoch");
                self.reference.heartbeat(job, epoch).expect("model: heartbeat of the live epoch");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                self.reference.expire_lease(job, epoch);
                let r = s.heartbeat(&self.ids[job], epoch, LONG_TTL).await;
                assert!(matches!(r, Err(StoreError::StaleEpoch(_))), "an ended lease is stale, got {r:?}");
                let modelled = self.reference.heartbeat(job, epoch);
                assert_eq!(modelled, Err(Refusal::Stale(Stale::Expired)), "model: an ended lease is stale");
                same_refusal(&r, &modelled, &self.ids[job], epoch);
                let fenced = s.fence_expired().await.expect("fence");
                assert_eq!(fenced, vec![(self.ids[job].clone(), epoch)]);
                assert_eq!(self.reference.fence(), vec![(job, epoch)], "model: fenced");
                self.expect_lost(pre, job).await;
                true
            }
            Op::Fence => {
                assert!(s.fence_expired().await.expect("fence").is_empty(), "no lease has expired");
                assert!(self.reference.fence().is_empty(), "model: no lease has expired");
                false
            }
            Op::Complete { agent, ref job, kind } => {
                let (agent, job) = self.held_target(agent, job, pre);
                let Some((_, epoch)) = self.last(agent, job) else {
                    return false;
                };
                let input = match kind {
                    Kind::Success => success(),
                    Kind::Failure => failure(1),
                    Kind::Infra => infra_failure(),
                };
                let report = Report {
                    outcome: input.outcome,
                    exit_code: input.exit_code,
                    message: input.message.clone(),
                    class: input.failure_class,
                };
                let r = s.complete(&self.ids[job], epoch, input).await;
                let modelled = self.reference.complete(job, epoch, &report);
                same_refusal(&r, &modelled, &self.ids[job], epoch);
                if let (Ok(status), Ok(want)) = (&r, &modelled) {
                    assert_eq!(status, want.as_str(), "completion: store vs model");
                }
                if !live(pre, job, epoch) {
                    assert_stale(r);
                    return false;
                }
                let post = view(s, &self.run_id).await;
                let pj = &post.jobs[job];
                let attempt = pj.attempts.iter().find(|a| a.epoch == epoch).unwrap();
                if pre.run.status == RunStatus::Cancelling {
                    assert_conflict(r);
                    assert_eq!(attempt.outcome, AttemptOutcome::Cancelled);
                    assert_eq!(pj.job.status, JobStatus::Cancelled);
                    return true;
                }
                assert!(pre.run.status.can_claim());
                let status = r.expect("completion of the live epoch");
                match kind {
                    Kind::Success => {
                        assert_eq!(status, "success");
                        assert_eq!(attempt.outcome, AttemptOutcome::Success);
                        assert_eq!(pj.job.status, JobStatus::Success);
                        assert_eq!(pj.job.current_epoch, epoch);
                    }
                    Kind::Failure | Kind::Infra => {
                        assert_eq!(attempt.outcome, AttemptOutcome::Failed);
                        let (used, allowed) = match kind {
                            Kind::Failure => (&mut self.failure_used[job], self.retries[job]),
                            _ => (&mut self.infra_used[job], DEFAULT_INFRA_RETRIES),
                        };
                        let want = if *used < allowed {
                            *used += 1;
                            JobStatus::Ready
                        } else {
                            JobStatus::Failed
                        };
                        assert_eq!(status, want.as_str(), "{op:?} budget");
                        assert_eq!(pj.job.status, want);
                        if want == JobStatus::Ready {
                            assert!(pj.job.dispatch_generation > pre.jobs[job].job.dispatch_generation);
                        }
                    }
                }
                true
            }
            Op::Release { agent, ref job } => {
                let (agent, job) = self.held_target(agent, job, pre);
                let Some((_, epoch)) = self.last(agent, job) else {
                    return false;
                };
                let end = SandboxEnd { evidence: "gone".into(), cleanup_error: None };
                let r = s.release_attempt(&self.ids[job], epoch, end).await;
                let modelled = self.reference.release(job, epoch);
                match (&r, &modelled) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "release: store vs model"),
                    (Err(StoreError::Conflict(_)), Err(Refusal::Invalid)) => {}
                    _ => panic!("release: store {r:?} vs model {modelled:?}"),
                }
                matches!(r, Ok(true))
            }
            Op::Cancel => {
                let r = s.cancel_run(&self.run_id).await.expect("cancel");
                let post = view(s, &self.run_id).await;
                assert_eq!(r.status, post.run.status);
                assert_eq!(self.reference.cancel(), r.status, "cancel: store vs model");
                let any_running = pre.jobs.iter().any(|j| j.job.status == JobStatus::Running);
                let want = match pre.run.status {
                    st if st.is_terminal() => st,
                    RunStatus::Cancelling => RunStatus::Cancelling,
                    _ if any_running || awaiting_release(pre) => RunStatus::Cancelling,
                    _ => RunStatus::Cancelled,
                };
                assert_eq!(post.run.status, want);
                if pre.run.status.can_claim() {
                    for (a, b) in pre.jobs.iter().zip(&post.jobs) {
                        if matches!(a.job.status, JobStatus::Pending | JobStatus::Ready) {
                            assert_eq!(b.job.status, JobStatus::Cancelled, "{}", a.job.name);
                        }
                    }
                }
                pre.run.status.can_claim()
            }
        }
    }

    /// After the reconciler fenced the current attempt of `job`.
    async fn expect_lost(&mut self, pre: &RunView, job: usize) {
        let post = view(self.s, &self.run_id).await;
        let (a, b) = (&pre.jobs[job], &post.jobs[job]);
        let epoch = a.job.current_epoch;
        let at = b.attempts.iter().find(|x| x.epoch == epoch).unwrap();
        assert_eq!(at.outcome, AttemptOutcome::Lost);
        let want = if pre.run.status == RunStatus::Cancelling {
            JobStatus::Cancelled
        } else if self.infra_used[job] < DEFAULT_INFRA_RETRIES {
            self.infra_used[job] += 1;
            JobStatus::Ready
        } else {
            JobStatus::Failed
        };
        assert_eq!(b.job.status, want, "job {} after losing epoch {epoch}", a.job.name);
        if want == JobStatus::Ready {
            assert!(b.job.dispatch_generation > a.job.dispatch_generation, "a new dispatch generation");
        }
    }
}

/// Whether a fenced attempt's sandbox is not yet confirmed gone.
fn awaiting_release(v: &RunView) -> bool {
    v.jobs.iter().flat_map(|j| &j.attempts).any(|a| a.outcome == AttemptOutcome::Lost && a.released_at.is_none())
}

/// Safety rules that hold after every step, given the state before it.
fn check_invariants(pre: &RunView, post: &RunView) {
    let ctx = || format!("\nbefore: {:?}\nafter: {:?}", statuses(pre), statuses(post));
    for (a, b) in pre.jobs.iter().zip(&post.jobs) {
        let name = &b.job.name;
        let wins: Vec<&AttemptRecord> = b.attempts.iter().filter(|x| x.outcome == AttemptOutcome::Success).collect();
        assert!(wins.len() <= 1, "job {name} has {} successful attempts{}", wins.len(), ctx());
        if b.job.status == JobStatus::Success {
            assert_eq!(wins.len(), 1, "successful job {name} without a successful attempt{}", ctx());
            assert_eq!(wins[0].epoch, b.job.current_epoch, "job {name} won by a stale epoch{}", ctx());
        } else {
            assert!(wins.is_empty(), "job {name} is {} with a successful attempt{}", b.job.status, ctx());
        }
        // Epochs are 1, 2, … current_epoch.
        let epochs: Vec<i64> = b.attempts.iter().map(|x| x.epoch).collect();
        assert_eq!(epochs, (1..=b.job.current_epoch).collect::<Vec<_>>(), "job {name} epochs");
        // One live attempt at most, and only for a running job.
        let running: Vec<&AttemptRecord> = b.attempts.iter().filter(|x| x.outcome == AttemptOutcome::Running).collect();
        assert!(running.len() <= 1, "job {name} has two running attempts");
        assert_eq!(running.len() == 1, b.job.status == JobStatus::Running, "job {name} status vs attempts{}", ctx());
        if let Some(r) = running.first() {
            assert_eq!(r.epoch, b.job.current_epoch);
        }
        // Terminal jobs never change again.
        if a.job.status.is_terminal() {
            assert_eq!(b.job.status, a.job.status, "terminal job {name} changed{}", ctx());
            assert_eq!(b.job.current_epoch, a.job.current_epoch);
            // Only a fenced attempt's confirmation may come later (issue 40, item 5).
            let unconfirmed = |v: &[AttemptRecord]| {
                let mut v = v.to_vec();
                for x in &mut v {
                    if x.outcome == AttemptOutcome::Lost {
                        (x.released_at, x.release_evidence) = (None, None);
                    }
                }
                format!("{v:?}")
            };
            assert_eq!(unconfirmed(&b.attempts), unconfirmed(&a.attempts), "attempts of terminal job {name}");
        }
        // Attempts never start before every need succeeded.
        if let Some(first) = b.attempts.first() {
            for need in &b.job.needs {
                let n = post.jobs.iter().find(|j| &j.job.name == need).unwrap();
                assert_eq!(n.job.status, JobStatus::Success, "job {name} started before {need} succeeded{}", ctx());
                assert!(n.job.finished_at.unwrap() <= first.started_at, "job {name} started before {need} finished");
            }
        }
        // Advancement happens in the transaction that decides it: a pending job
        // whose needs all succeeded is ready, one downstream of a failure is
        // skipped (in an active run).
        if b.job.status == JobStatus::Pending {
            let need_status = |n: &String| post.jobs.iter().find(|j| &j.job.name == n).unwrap().job.status;
            assert!(
                !b.job.needs.iter().all(|n| need_status(n) == JobStatus::Success),
                "job {name} is pending although its needs succeeded{}",
                ctx()
            );
            if post.run.status.can_claim() {
                assert!(
                    !b.job.needs.iter().any(|n| matches!(
                        need_status(n),
                        JobStatus::Failed | JobStatus::Cancelled | JobStatus::Skipped
                    )),
                    "job {name} is pending downstream of a failure{}",
                    ctx()
                );
            }
        }
        if b.job.status == JobStatus::Ready {
            assert!(post.run.status.can_claim(), "ready job {name} in a {} run", post.run.status);
        }
    }
    let run = post.run.status;
    if pre.run.status.is_terminal() {
        assert_eq!(run, pre.run.status, "terminal run changed{}", ctx());
        assert_eq!(post.run.finished_at, pre.run.finished_at);
    }
    if !run.is_terminal() {
        // Or a cancel waiting for a fenced sandbox to be confirmed gone.
        let waits = run == RunStatus::Cancelling && awaiting_release(post);
        assert!(
            waits || post.jobs.iter().any(|j| !j.job.status.is_terminal()),
            "{run} run whose jobs all finished{}",
            ctx()
        );
    }
    if run == RunStatus::Cancelled && pre.run.status != RunStatus::Cancelled {
        assert!(!awaiting_release(post), "a lapsed lease certified a cancel{}", ctx());
    }
    if run.is_terminal() {
        assert!(post.run.finished_at.is_some());
        assert!(post.jobs.iter().all(|j| j.job.status.is_terminal()), "{run} run with unfinished jobs{}", ctx());
    }
    match run {
        RunStatus::Success => assert!(post.jobs.iter().all(|j| j.job.status == JobStatus::Success), "{}", ctx()),
        RunStatus::Failed => assert!(post.jobs.iter().any(|j| j.job.status == JobStatus::Failed), "{}", ctx()),
        RunStatus::Cancelling => assert!(
            post.jobs.iter().any(|j| j.job.status == JobStatus::Running) || awaiting_release(post),
            "cancelling with nothing running and nothing to confirm"
        ),
        RunStatus::Queued => assert!(post.jobs.iter().all(|j| j.attempts.is_empty())),
        RunStatus::Running | RunStatus::Cancelled => {}
    }
}

/// The store and the model refused a call for the same reason, or neither
/// did: a stale epoch with the same message, a completion after
/// cancellation as a conflict.
#[track_caller]
fn same_refusal<T: Debug, U: Debug>(
    store: &Result<T>,
    model: &std::result::Result<U, Refusal>,
    job_id: &str,
    epoch: i64,
) {
    match (store, model) {
        (Ok(_), Ok(_)) => {}
        (Err(StoreError::StaleEpoch(msg)), Err(Refusal::Stale(why))) => {
            assert_eq!(msg, &why.message(job_id, epoch), "stale-epoch reason: store vs model")
        }
        (Err(StoreError::Conflict(_)), Err(Refusal::CancelledFirst)) => {}
        (store, model) => panic!("store answered {store:?}, the model {model:?}"),
    }
}
