//! Fair share between teams, priority lanes and aging (issue 44; spec 003
//! Deep Dive 1): which ready job a freed slot takes. A pure function over
//! the candidates an agent may run and the teams' state; the dispatcher
//! and the claim transaction hold the state, this decides.
//!
//! **The rule.** Among the candidates whose team is under its running quota
//! (reservations count: a claimed job that has not started holds its slot):
//! 1. the best *effective lane* wins: a job's lane (`urgent` < `normal` <
//!    `background`) rises one step per [`AGING_STEP_MS`] it has waited, so a
//!    `background` job competes as `urgent` after two steps;
//! 2. among the teams with a candidate in that lane, the one with the
//!    smallest virtual time (*pass*) goes (stride scheduling: each start
//!    adds `cost × STRIDE / weight` to its team's pass, so over time teams
//!    start work in proportion to their weights); a team that was idle
//!    re-enters at most one stride behind the scheduler's clock, so idling
//!    banks no credit;
//! 3. within the team, the oldest job of that lane (by ready time, then
//!    sequence).
//!
//! **Bounds.** A job waits at most `2 × AGING_STEP_MS` before it competes in
//! the top lane. From then, every start that is not its team's is another
//! team's turn; with `W` the total weight of the teams competing and `w`
//! its team's, its team gets at least one start in every `ceil(W / w) + 1`
//! consecutive starts while it is under quota, and it starts the team's
//! jobs of the top lane oldest first. `docs/scheduling.md` states the
//! bound and the property test (`tests/fair.rs`) checks it against a
//! simulation.

use std::collections::BTreeMap;

/// The lane a run of `kind` gets when neither its workflow's `priority:`
/// nor an admin says otherwise: a push to the default branch or a
/// protected ref (`trunk`) is `urgent`, a schedule tick `background`,
/// anything else (pull requests, API runs, pushes elsewhere) `normal`. A
/// retry keeps its parent's lane (the caller passes it).
pub fn default_lane(kind: crate::acceptance::TriggerKind, trunk: bool) -> Lane {
    use crate::acceptance::TriggerKind;
    match kind {
        TriggerKind::Push if trunk => Lane::Urgent,
        TriggerKind::Schedule => Lane::Background,
        _ => Lane::Normal,
    }
}

/// Whether a new API run of `lane` is refused at server saturation: with
/// `queued` jobs of at most `limit`, `background` from 80 % of it,
/// `normal` at it; `urgent` never (its team's cap still applies). The
/// lowest lane is refused first.
pub fn saturated(lane: Lane, queued: u64, limit: u64) -> bool {
    match lane {
        Lane::Background => queued.saturating_mul(5) >= limit.saturating_mul(4),
        Lane::Normal => queued >= limit,
        Lane::Urgent => false,
    }
}

/// A job's priority lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    Urgent = 0,
    Normal = 1,
    Background = 2,
}

impl Lane {
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Urgent => "urgent",
            Lane::Normal => "normal",
            Lane::Background => "background",
        }
    }

    pub fn parse(s: &str) -> Option<Lane> {
        Some(match s {
            "urgent" => Lane::Urgent,
            "normal" => Lane::Normal,
            "background" => Lane::Background,
            _ => return None,
        })
    }

    fn up(self, steps: i64) -> Lane {
        match (self as i64 - steps.max(0)).max(0) {
            0 => Lane::Urgent,
            1 => Lane::Normal,
            _ => Lane::Background,
        }
    }
}

/// How long a job waits before it moves up one lane.
pub const AGING_STEP_MS: i64 = 120_000;

/// A start of cost 1 by a team of weight 1 adds this to its pass.
pub const STRIDE: u64 = 1 << 20;

/// A team's virtual time after it starts a job of `cost`: from its pass,
/// or one stride behind `clock` if it is further behind (an idle team banks
/// no credit), plus its stride. What [`Shares::start`] does and what the
/// claim transaction persists.
pub fn charged_pass(pass: u64, weight: u32, clock: u64, cost: u64) -> u64 {
    let t = Team { weight, pass, ..Team::default() };
    t.effective_pass(clock).saturating_add(t.stride(cost))
}

/// The scheduler clock to resume from, given the teams' persisted virtual
/// times (after a restart or failover): where the most advanced team's
/// last start began.
pub fn resumed_clock<'a>(teams: impl IntoIterator<Item = &'a Team>) -> u64 {
    teams.into_iter().map(|t| t.pass.saturating_sub(t.stride(1))).max().unwrap_or(0)
}

/// The lane a job competes in after waiting since `ready_at_ms`.
pub fn effective_lane(lane: Lane, ready_at_ms: i64, now_ms: i64) -> Lane {
    aged(lane, ready_at_ms, now_ms, AGING_STEP_MS)
}

/// [`effective_lane`] with another aging step.
pub fn aged(lane: Lane, ready_at_ms: i64, now_ms: i64, step_ms: i64) -> Lane {
    lane.up((now_ms - ready_at_ms).max(0) / step_ms.max(1))
}

/// A ready job an agent may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub team: String,
    pub lane: Lane,
    pub ready_at_ms: i64,
    /// Tie-break within a team and lane (the outbox order).
    pub seq: i64,
}

/// A team's share and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Team {
    /// Its share relative to the others (at least 1).
    pub weight: u32,
    /// Jobs it may hold at once, reservations included (`None`: no quota).
    pub max_running: Option<u32>,
    /// Jobs it holds now: running and claimed-but-not-started.
    pub running: u32,
    /// Its virtual time.
    pub pass: u64,
}

impl Default for Team {
    fn default() -> Team {
        Team { weight: 1, max_running: None, running: 0, pass: 0 }
    }
}

impl Team {
    fn stride(&self, cost: u64) -> u64 {
        cost.max(1).saturating_mul(STRIDE) / u64::from(self.weight.max(1))
    }

    fn under_quota(&self) -> bool {
        self.max_running.is_none_or(|m| self.running < m)
    }

    /// Its pass as the scheduler compares it: at most one stride behind
    /// the clock (an idle team banks no credit).
    fn effective_pass(&self, clock: u64) -> u64 {
        self.pass.max(clock.saturating_sub(self.stride(1)))
    }
}

/// The scheduler's state: every team's, and its clock (the effective pass
/// of the last start, never decreasing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shares {
    pub teams: BTreeMap<String, Team>,
    pub clock: u64,
    /// How long a job waits before it moves up a lane ([`AGING_STEP_MS`]
    /// unless the server was told otherwise).
    pub aging_step_ms: i64,
}

impl Default for Shares {
    fn default() -> Shares {
        Shares { teams: BTreeMap::new(), clock: 0, aging_step_ms: AGING_STEP_MS }
    }
}

impl Shares {
    /// A team's state (a team not configured: weight 1, no quota).
    pub fn team(&self, name: &str) -> Team {
        self.teams.get(name).cloned().unwrap_or_default()
    }

    /// Which candidate a freed slot takes (its index), or `None` when every
    /// candidate's team is at its quota.
    pub fn choose(&self, candidates: &[Candidate], now_ms: i64) -> Option<usize> {
        let eligible: Vec<(usize, Lane)> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| self.team(&c.team).under_quota())
            .map(|(i, c)| (i, aged(c.lane, c.ready_at_ms, now_ms, self.aging_step_ms)))
            .collect();
        let top = eligible.iter().map(|(_, l)| *l).min()?;
        let in_top = || eligible.iter().filter(move |(_, l)| *l == top).map(|(i, _)| *i);
        // Teams behind in virtual time first; between equals, the one whose
        // job has waited longest.
        let team = in_top()
            .map(|i| &candidates[i])
            .min_by_key(|c| (self.team(&c.team).effective_pass(self.clock), c.ready_at_ms, c.seq, c.team.clone()))?
            .team
            .clone();
        in_top()
            .filter(|i| candidates[*i].team == team)
            .min_by_key(|i| (candidates[*i].ready_at_ms, candidates[*i].seq, *i))
    }

    /// `team` starts a job of `cost` (1 for a job of ordinary length): its
    /// pass moves by its stride and it holds one more slot.
    pub fn start(&mut self, team: &str, cost: u64) {
        let clock = self.clock;
        let t = self.teams.entry(team.to_string()).or_default();
        let from = t.effective_pass(clock);
        t.pass = charged_pass(t.pass, t.weight, clock, cost);
        t.running += 1;
        self.clock = self.clock.max(from);
    }

    /// A start decided elsewhere (the claim transaction, maybe of another
    /// replica) left `team`'s virtual time at `pass`: it holds one more
    /// slot, and the clock moves to where that start began.
    pub fn started_at_pass(&mut self, team: &str, pass: u64) {
        let t = self.teams.entry(team.to_string()).or_default();
        let from = pass.saturating_sub(t.stride(1));
        t.pass = t.pass.max(pass);
        t.running += 1;
        self.clock = self.clock.max(from);
    }

    /// A start counted by [`Shares::start`] did not happen (its claim was
    /// refused): the slot and the stride are given back.
    pub fn unstart(&mut self, team: &str, cost: u64) {
        if let Some(t) = self.teams.get_mut(team) {
            t.running = t.running.saturating_sub(1);
            t.pass = t.pass.saturating_sub(t.stride(cost));
        }
    }

    /// A job of `team` ended (or its reservation was given back).
    pub fn finish(&mut self, team: &str) {
        if let Some(t) = self.teams.get_mut(team) {
            t.running = t.running.saturating_sub(1);
        }
    }
}

/// The longest a job can wait for a slot in a system where every slot
/// frees at least every `max_job_ms` (`slots` slots), its team has weight
/// `weight` of the `teams` competing teams' `total_weight`, and `ahead`
/// jobs of its team are ahead of it: aging to the top lane, then its
/// team's turns (between two of them, each other team starts at most
/// `ceil(w_other / weight) + 1` jobs). The team is assumed under quota (a
/// quota delays it by its own jobs' durations).
pub fn wait_bound_ms(slots: u32, max_job_ms: i64, weight: u32, total_weight: u32, teams: u32, ahead: u32) -> i64 {
    let turn = u64::from(total_weight.div_ceil(weight.max(1)) + teams);
    let starts = turn * u64::from(ahead + 1);
    // Each start needs a slot to free: with `slots` slots, `slots` starts
    // per `max_job_ms` at the least.
    let rounds = i64::try_from(starts.div_ceil(u64::from(slots.max(1)))).unwrap_or(i64::MAX / 4);
    2 * AGING_STEP_MS + max_job_ms.saturating_mul(rounds + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(team: &str, lane: Lane, ready: i64, seq: i64) -> Candidate {
        Candidate { team: team.into(), lane, ready_at_ms: ready, seq }
    }

    #[test]
    fn triggers_have_default_lanes_and_saturation_refuses_the_lowest_first() {
        use crate::acceptance::TriggerKind;
        assert_eq!(default_lane(TriggerKind::Push, true), Lane::Urgent);
        assert_eq!(default_lane(TriggerKind::Push, false), Lane::Normal);
        assert_eq!(default_lane(TriggerKind::PullRequest, true), Lane::Normal);
        assert_eq!(default_lane(TriggerKind::Schedule, true), Lane::Background);
        assert_eq!(default_lane(TriggerKind::Api, true), Lane::Normal);
        assert!(!saturated(Lane::Background, 79, 100));
        assert!(saturated(Lane::Background, 80, 100));
        assert!(!saturated(Lane::Normal, 99, 100));
        assert!(saturated(Lane::Normal, 100, 100));
        assert!(!saturated(Lane::Urgent, 10_000, 100));
    }

    #[test]
    fn lanes_age_one_step_per_aging_step() {
        assert_eq!(effective_lane(Lane::Background, 0, AGING_STEP_MS - 1), Lane::Background);
        assert_eq!(effective_lane(Lane::Background, 0, AGING_STEP_MS), Lane::Normal);
        assert_eq!(effective_lane(Lane::Background, 0, 2 * AGING_STEP_MS), Lane::Urgent);
        assert_eq!(effective_lane(Lane::Urgent, 0, 10 * AGING_STEP_MS), Lane::Urgent);
        assert_eq!(Lane::parse("normal"), Some(Lane::Normal));
    }

    #[test]
    fn a_higher_lane_goes_first_then_the_team_behind_then_the_oldest() {
        let mut s = Shares::default();
        let cands = vec![c("a", Lane::Normal, 0, 1), c("b", Lane::Urgent, 50, 2), c("b", Lane::Urgent, 10, 3)];
        assert_eq!(s.choose(&cands, 100), Some(2), "urgent first, the older of b's");
        // Two teams in one lane: the one behind in virtual time.
        s.start("a", 1);
        let cands = vec![c("a", Lane::Normal, 0, 1), c("b", Lane::Normal, 5, 2)];
        assert_eq!(s.choose(&cands, 100), Some(1));
    }

    #[test]
    fn weights_share_starts_and_quotas_count_reservations() {
        let mut s = Shares::default();
        s.teams.insert("big".into(), Team { weight: 3, ..Team::default() });
        s.teams.insert("small".into(), Team { weight: 1, max_running: Some(2), ..Team::default() });
        let mut starts: BTreeMap<String, u32> = BTreeMap::new();
        for i in 0..400 {
            let cands = vec![c("big", Lane::Normal, i, i), c("small", Lane::Normal, i, i + 1)];
            let pick = s.choose(&cands, 0).unwrap();
            let team = cands[pick].team.clone();
            s.start(&team, 1);
            *starts.entry(team.clone()).or_default() += 1;
            s.finish(&team);
        }
        assert_eq!((starts["big"], starts["small"]), (300, 100), "3:1");
        // At its quota (two reserved), small is passed over.
        s.teams.get_mut("small").unwrap().running = 2;
        let cands = vec![c("small", Lane::Urgent, 0, 1)];
        assert_eq!(s.choose(&cands, 0), None);
    }

    #[test]
    fn a_start_that_did_not_happen_is_given_back() {
        let mut s = Shares::default();
        s.teams.insert("a".into(), Team { weight: 2, ..Team::default() });
        s.start("a", 1);
        let once = s.team("a");
        s.start("a", 1);
        s.unstart("a", 1);
        assert_eq!(s.team("a"), once, "slot and stride back");
    }

    #[test]
    fn an_idle_team_banks_no_credit() {
        let mut s = Shares::default();
        for _ in 0..1000 {
            s.start("busy", 1);
            s.finish("busy");
        }
        // `late` arrives now: it may go first, but then they alternate.
        let mut order = Vec::new();
        for i in 0..6 {
            let cands = vec![c("busy", Lane::Normal, 0, i), c("late", Lane::Normal, 0, i + 100)];
            let t = cands[s.choose(&cands, 0).unwrap()].team.clone();
            s.start(&t, 1);
            s.finish(&t);
            order.push(t);
        }
        let late = order.iter().filter(|t| *t == "late").count();
        assert!((3..=4).contains(&late), "{order:?}");
    }
}
