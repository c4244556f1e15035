//! A reference model of one job's ownership protocol (spec 000 §7–§9), built
//! only from the state machines of this crate. The store implements the same
//! rules transactionally; this model states them so they can be checked
//! exhaustively by property tests (below) without any IO.

use crate::attempt::AttemptEvent;
use crate::job::JobEvent;
use crate::run::RunEvent;
use crate::{AttemptOutcome, JobStatus, RunStatus};

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not the current live epoch (HTTP 409 stale_epoch).
    StaleEpoch,
    /// The job or run does not allow it now (claim absorbed, late completion).
    NotAllowed,
}

#[derive(Debug, Clone)]
pub struct Attempt {
    pub epoch: u32,
    pub agent: u8,
    pub outcome: AttemptOutcome,
    pub lease_deadline: u64,
    /// Epoch whose candidate output this attempt sealed.
    pub sealed: bool,
}

/// One job of a one-job run, with a database clock.
#[derive(Debug, Clone)]
pub struct JobModel {
    pub now: u64,
    pub ttl: u64,
    pub run: RunStatus,
    pub job: JobStatus,
    pub attempts: Vec<Attempt>,
    /// Epoch whose output is bound (set only by a successful completion).
    pub bound: Option<u32>,
    pub infra_budget: u32,
}

impl JobModel {
    pub fn new(ttl: u64, infra_budget: u32) -> Self {
        JobModel {
            now: 0,
            ttl,
            run: RunStatus::Queued,
            job: JobStatus::Ready,
            attempts: vec![],
            bound: None,
            infra_budget,
        }
    }

    pub fn current_epoch(&self) -> u32 {
        self.attempts.len() as u32
    }

    fn live(&self, epoch: u32) -> Result<usize, Refusal> {
        let i = epoch.checked_sub(1).ok_or(Refusal::StaleEpoch)? as usize;
        let a = self.attempts.get(i).ok_or(Refusal::StaleEpoch)?;
        if epoch != self.current_epoch() || !a.outcome.can_publish() || a.lease_deadline <= self.now {
            return Err(Refusal::StaleEpoch);
        }
        Ok(i)
    }

    /// The claim transaction.
    pub fn claim(&mut self, agent: u8) -> Result<u32, Refusal> {
        if !self.run.can_claim() || !self.job.can_claim() {
            return Err(Refusal::NotAllowed);
        }
        self.job = self.job.transition(JobEvent::Claimed).map_err(|_| Refusal::NotAllowed)?;
        if self.run == RunStatus::Queued {
            self.run = self.run.transition(RunEvent::Started).expect("queued → running");
        }
        let epoch = self.current_epoch() + 1;
        self.attempts.push(Attempt {
            epoch,
            agent,
            outcome: AttemptOutcome::Running,
            lease_deadline: self.now + self.ttl,
            sealed: false,
        });
        Ok(epoch)
    }

    pub fn heartbeat(&mut self, epoch: u32) -> Result<bool, Refusal> {
        let i = self.live(epoch)?;
        self.attempts[i].lease_deadline = self.now + self.ttl;
        Ok(self.run == RunStatus::Cancelling)
    }

    /// Seal a candidate generation for `epoch` (upload verified).
    pub fn seal(&mut self, epoch: u32) -> Result<(), Refusal> {
        let i = self.live(epoch)?;
        self.attempts[i].sealed = true;
        Ok(())
    }

    /// The completion transaction.
    pub fn complete(&mut self, epoch: u32, success: bool) -> Result<(), Refusal> {
        let i = self.live(epoch)?;
        if self.run == RunStatus::Cancelling {
            // Cancellation committed first: the late completion only confirms termination.
            self.attempts[i].outcome = self.attempts[i].outcome.transition(AttemptEvent::Cancelled).expect("running");
            self.job = self.job.transition(JobEvent::Cancel).expect("running → cancelled");
            self.run = self.run.transition(RunEvent::Cancelled).expect("cancelling → cancelled");
            return Err(Refusal::NotAllowed);
        }
        if success && self.attempts[i].sealed {
            self.attempts[i].outcome = self.attempts[i].outcome.transition(AttemptEvent::Succeeded).expect("running");
            self.bound = Some(epoch);
            self.job = self.job.transition(JobEvent::Succeeded).expect("running → success");
            self.run = self.run.transition(RunEvent::AllSucceeded).expect("running → success");
        } else {
            // A failure, or success without its required output: fail explicitly.
            self.attempts[i].outcome = self.attempts[i].outcome.transition(AttemptEvent::Failed).expect("running");
            self.job = self.job.transition(JobEvent::Failed).expect("running → failed");
            self.run = self.run.transition(RunEvent::Failed).expect("running → failed");
        }
        Ok(())
    }

    pub fn cancel(&mut self) {
        if self.run.is_terminal() || self.run == RunStatus::Cancelling {
            return;
        }
        if self.job == JobStatus::Running {
            self.run = self.run.transition(RunEvent::CancelRequested).expect("active → cancelling");
        } else {
            self.job = self.job.transition(JobEvent::Cancel).expect("ready → cancelled");
            self.run = self.run.transition(RunEvent::Cancelled).expect("active → cancelled");
        }
    }

    /// Time passes; the reconciler fences expired leases before authorizing a replacement.
    pub fn tick(&mut self, ms: u64) {
        self.now += ms;
        let now = self.now;
        let Some(a) = self.attempts.last_mut() else { return };
        if a.outcome != AttemptOutcome::Running || a.lease_deadline > now {
            return;
        }
        a.outcome = a.outcome.transition(AttemptEvent::Fenced).expect("running → lost");
        if self.run == RunStatus::Cancelling {
            self.job = self.job.transition(JobEvent::Cancel).expect("running → cancelled");
            self.run = self.run.transition(RunEvent::Cancelled).expect("cancelling → cancelled");
        } else if self.attempts.len() as u32 <= self.infra_budget {
            self.job = self.job.transition(JobEvent::Retry).expect("running → ready");
        } else {
            self.job = self.job.transition(JobEvent::Failed).expect("running → failed");
            self.run = self.run.transition(RunEvent::Failed).expect("running → failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Claim(u8),
        Heartbeat(u8),
        Seal(u8),
        Complete(u8, bool),
        Cancel,
        Tick(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..2).prop_map(Op::Claim),
            (0u8..2).prop_map(Op::Heartbeat),
            (0u8..2).prop_map(Op::Seal),
            ((0u8..2), any::<bool>()).prop_map(|(a, s)| Op::Complete(a, s)),
            Just(Op::Cancel),
            (1u64..150).prop_map(Op::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Two agents, each remembering the last epoch it was granted, act in
        /// random interleavings with leases expiring in between.
        #[test]
        fn ownership_invariants_hold(ops in proptest::collection::vec(op(), 1..80)) {
            let mut m = JobModel::new(100, 3);
            let mut held: [Option<u32>; 2] = [None, None];
            let mut terminal_seen: Option<(RunStatus, JobStatus)> = None;
            for op in ops {
                match op {
                    Op::Claim(a) => if let Ok(e) = m.claim(a) { held[a as usize] = Some(e) },
                    Op::Heartbeat(a) => if let Some(e) = held[a as usize] { let _ = m.heartbeat(e); },
                    Op::Seal(a) => if let Some(e) = held[a as usize] { let _ = m.seal(e); },
                    Op::Complete(a, s) => if let Some(e) = held[a as usize] {
                        let r = m.complete(e, s);
                        // A refused completion never changes the bound output.
                        if r.is_err() { prop_assert!(m.bound.is_none_or(|b| b != e || m.job == JobStatus::Success)); }
                    },
                    Op::Cancel => m.cancel(),
                    Op::Tick(ms) => m.tick(ms),
                }
                // At most one success per job.
                let successes = m.attempts.iter().filter(|a| a.outcome == AttemptOutcome::Success).count();
                prop_assert!(successes <= 1);
                // Bindings only from the successful epoch, and only once it sealed.
                if let Some(b) = m.bound {
                    let a = &m.attempts[b as usize - 1];
                    prop_assert_eq!(a.outcome, AttemptOutcome::Success);
                    prop_assert!(a.sealed);
                    prop_assert_eq!(m.job, JobStatus::Success);
                } else {
                    prop_assert_ne!(m.job, JobStatus::Success);
                }
                // At most one running attempt, and only the current epoch.
                let running: Vec<_> = m.attempts.iter().filter(|a| a.outcome == AttemptOutcome::Running).collect();
                prop_assert!(running.len() <= 1);
                if let Some(r) = running.first() { prop_assert_eq!(r.epoch, m.current_epoch()); }
                // No transition out of a terminal state.
                if let Some(t) = terminal_seen { prop_assert_eq!((m.run, m.job), t); }
                if m.run.is_terminal() {
                    prop_assert!(m.job.is_terminal());
                    terminal_seen = Some((m.run, m.job));
                }
            }
        }
    }

    #[test]
    fn stale_epoch_cannot_publish_after_replacement() {
        let mut m = JobModel::new(100, 3);
        let e1 = m.claim(0).unwrap();
        m.tick(100);
        assert_eq!(m.attempts[0].outcome, AttemptOutcome::Lost);
        let e2 = m.claim(1).unwrap();
        assert_eq!(e2, 2);
        assert_eq!(m.heartbeat(e1), Err(Refusal::StaleEpoch));
        assert_eq!(m.seal(e1), Err(Refusal::StaleEpoch));
        assert_eq!(m.complete(e1, true), Err(Refusal::StaleEpoch));
        m.seal(e2).unwrap();
        m.complete(e2, true).unwrap();
        assert_eq!(m.bound, Some(2));
    }

    #[test]
    fn success_without_sealed_output_fails_explicitly() {
        let mut m = JobModel::new(100, 3);
        let e = m.claim(0).unwrap();
        m.complete(e, true).unwrap();
        assert_eq!(m.job, JobStatus::Failed);
        assert_eq!(m.bound, None);
    }

    #[test]
    fn cancel_races_success_both_orders() {
        let mut m = JobModel::new(100, 3);
        let e = m.claim(0).unwrap();
        m.seal(e).unwrap();
        m.complete(e, true).unwrap();
        m.cancel();
        assert_eq!((m.run, m.job), (RunStatus::Success, JobStatus::Success));

        let mut m = JobModel::new(100, 3);
        let e = m.claim(0).unwrap();
        m.seal(e).unwrap();
        m.cancel();
        assert_eq!(m.run, RunStatus::Cancelling);
        assert_eq!(m.heartbeat(e), Ok(true), "the agent is asked to stop");
        assert_eq!(m.complete(e, true), Err(Refusal::NotAllowed));
        assert_eq!((m.run, m.job, m.bound), (RunStatus::Cancelled, JobStatus::Cancelled, None));
    }
}
