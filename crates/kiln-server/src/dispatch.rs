//! Dispatch queues per compatibility class, team and lane, fed by the
//! outbox relay.
//!
//! A delivery grants nothing: the claim transaction decides ownership, so a
//! duplicate or stale event is simply absorbed there (spec 000 §7, §15).
//! Queues are in memory; after a restart they are rebuilt from ready jobs,
//! and with several replicas each one also sweeps the ready jobs now and then
//! (a job relayed by another replica, or by one that died, reaches every
//! replica's agents). A (job, generation) is queued at most once per replica.
//!
//! **Offering with several replicas.** Replicas on one database whose agents
//! are claiming register in the database (a lease `offer:<instance>` with an
//! expiry in database time, renewed every second; see `loops::offering`).
//! Each ready job is *offered* by one of them: the member with the highest
//! rendezvous weight of (member, job id), so a member joining or leaving
//! moves only its own share. A replica queues the jobs it offers; the others'
//! it only notes, and hands those out ([`Dispatcher::pop`]) when its agents
//! have nothing of their own and the job has been ready for a while (its
//! owner's agents are busy, or cannot run it, or the owner died and its lease
//! has not lapsed yet). So the claim transactions of all replicas together
//! stay about one per job instead of one per job and replica. Offering only
//! decides who tries first: the claim transaction alone decides who owns.
//!
//! **Placement.** A delivery knows only the job's labels. When a claim is
//! refused because the agent may never run the job (invariant 12: an
//! untrusted run, an `image:`, secrets), the job's needs are noted on its
//! delivery ([`Dispatcher::note_placement`]) and agents that may not run it
//! pass it over ([`Dispatcher::pop_for`]) while it waits for one that may,
//! instead of trying it again and again ahead of the jobs behind it. A note
//! is trusted for [`PLACEMENT_NOTE_TTL`], then learned again by a claim (the
//! repository's secret pools may have changed).
//!
//! **Fair share** (issue 44, `docs/scheduling.md`). Each class's deliveries
//! are queued per (team, lane), oldest first. A freed slot's candidates are
//! the first delivery the agent may run of each such queue in the classes
//! its labels fit — a handful, never every ready job — and kiln-core's
//! [`Shares::choose`] picks one: best effective lane (aging), then the team
//! furthest behind in virtual time, then the oldest. The teams' weights,
//! quotas, virtual times and what each holds are refreshed from the
//! database every second ([`Dispatcher::set_teams`]); the claim transaction
//! persists each start's virtual time and enforces the running quota, so
//! every replica orders by the same state and a restart resumes it.

use kiln_core::claim::JobPlacement;
use kiln_core::fair::{Candidate, Lane, Shares, Team};
use kiln_store::OutboxEvent;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A class's required labels and its deliveries per (team, lane), each in
/// order.
#[derive(Default)]
struct ClassQueue {
    labels: BTreeMap<String, String>,
    lanes: BTreeMap<(String, Lane), VecDeque<OutboxEvent>>,
}

impl ClassQueue {
    fn len(&self) -> usize {
        self.lanes.values().map(VecDeque::len).sum()
    }

    fn retain(&mut self, mut keep: impl FnMut(&OutboxEvent) -> bool) {
        for q in self.lanes.values_mut() {
            q.retain(&mut keep);
        }
        self.lanes.retain(|_, q| !q.is_empty());
    }
}

/// The lane a delivery competes in (an unknown word: `normal`).
pub fn lane_of(ev: &OutboxEvent) -> Lane {
    Lane::parse(&ev.lane).unwrap_or(Lane::Normal)
}

/// How long a delivery's noted placement is trusted before a claim learns it again.
pub const PLACEMENT_NOTE_TTL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Dispatcher {
    inner: Mutex<Queues>,
    pub notify: Notify,
    offer: Mutex<Offer>,
    /// Claim long-polls in flight, and when the last one ended.
    polls: AtomicUsize,
    last_poll: Mutex<Option<Instant>>,
    /// The teams' shares as last read, with the starts made since.
    shares: Mutex<Shares>,
    /// Starts claimed through this replica and not yet written to their
    /// teams' virtual times: team → (starts, the clock at the first).
    charges: Mutex<BTreeMap<String, (u64, u64)>>,
    /// The live jobs by team × lane × class and the connected slots, as
    /// last read (for the `waiting` texts).
    groups: Mutex<(std::sync::Arc<Vec<kiln_store::QueueGroup>>, u32)>,
}

#[derive(Default)]
struct Queues {
    /// Class key → (the class's required labels, its deliveries in order).
    by_class: HashMap<String, ClassQueue>,
    /// (job, dispatch generation) of every queued delivery.
    queued: HashSet<(String, i64)>,
    /// Ready jobs other replicas offer, ready for a while: handed out only
    /// when nothing of this replica's own fits (replaced by every sweep).
    spare: HashMap<String, ClassQueue>,
    /// When each ready job another replica offers was first seen ready.
    unowned: HashMap<(String, i64), Instant>,
    /// What (job, generation) needs of its agent, as a refused claim said.
    placements: HashMap<(String, i64), (JobPlacement, Instant)>,
}

/// The replicas sharing the offering of ready jobs, as last read.
#[derive(Default, Clone, PartialEq, Eq)]
struct Offer {
    me: String,
    /// Live members, sorted; this replica offers every job unless it is
    /// one of at least two.
    members: Vec<String>,
}

impl Offer {
    fn partitioned(&self) -> bool {
        self.members.len() > 1 && self.members.contains(&self.me)
    }

    fn mine(&self, job_id: &str) -> bool {
        !self.partitioned() || offered_by(&self.members, job_id) == Some(self.me.as_str())
    }
}

/// The member that offers `job_id`: highest rendezvous weight (a hash that
/// is the same in every process, unlike the standard library's).
pub fn offered_by<'a>(members: &'a [String], job_id: &str) -> Option<&'a str> {
    members.iter().max_by_key(|m| weight(m, job_id)).map(|m| m.as_str())
}

fn weight(member: &str, job_id: &str) -> u64 {
    // FNV-1a over member, a separator and the job id, then a 64-bit finalizer.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes().chain([0xff]).chain(job_id.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Counts a claim long-poll as in flight while held.
pub struct PollGuard<'a>(&'a Dispatcher);

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        *self.0.last_poll.lock().unwrap() = Some(Instant::now());
        self.0.polls.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Dispatcher {
    /// Queue a delivery (unless the same job and generation is queued
    /// already, or another replica offers the job).
    pub fn push(&self, ev: OutboxEvent) -> bool {
        if !self.offers(&ev.job_id) {
            return false;
        }
        let added = self.insert(ev, false);
        if added {
            self.notify.notify_waiters();
        }
        added
    }

    /// Put back an event whose claim was declined for capacity: it stays eligible.
    pub fn push_front(&self, ev: OutboxEvent) {
        self.insert(ev, true);
    }

    /// Put back an event that could not be tried now: after the others,
    /// without waking waiting claims (it is nothing new).
    pub fn push_back(&self, ev: OutboxEvent) {
        self.insert(ev, false);
    }

    fn insert(&self, ev: OutboxEvent, front: bool) -> bool {
        let mut q = self.inner.lock().unwrap();
        if !q.queued.insert((ev.job_id.clone(), ev.dispatch_generation)) {
            return false;
        }
        let queue = lane_queue(&mut q.by_class, &ev);
        if front {
            queue.push_front(ev)
        } else {
            queue.push_back(ev)
        }
        true
    }

    /// Next event of any class whose labels are a subset of the agent's:
    /// of the jobs this replica offers, oldest first; with none that fits,
    /// a spare job (one another replica offers that waited too long).
    #[cfg(test)]
    pub fn pop(&self, agent_labels: &BTreeMap<String, String>) -> Option<OutboxEvent> {
        self.pop_for(agent_labels, |_| true)
    }

    /// [`Self::pop`], passing over deliveries whose noted placement the
    /// agent does not meet (`fits` false).
    pub fn pop_for(
        &self,
        agent_labels: &BTreeMap<String, String>,
        fits: impl Fn(&JobPlacement) -> bool,
    ) -> Option<OutboxEvent> {
        let mut q = self.inner.lock().unwrap();
        let q = &mut *q;
        let now = Instant::now();
        let placements = &q.placements;
        let may = |ev: &OutboxEvent| match placements.get(&(ev.job_id.clone(), ev.dispatch_generation)) {
            Some((needs, at)) if now.duration_since(*at) < PLACEMENT_NOTE_TTL => fits(needs),
            _ => true,
        };
        let mut shares = self.shares.lock().unwrap();
        let now_ms = wall_ms();
        if let Some(ev) = pop_from(&mut q.by_class, agent_labels, &may, &mut shares, now_ms) {
            q.queued.remove(&(ev.job_id.clone(), ev.dispatch_generation));
            return Some(ev);
        }
        pop_from(&mut q.spare, agent_labels, &may, &mut shares, now_ms)
    }

    /// The teams' weights, quotas and virtual times as the database has
    /// them, with the jobs each holds now (running, reservations included).
    /// Weights and quotas changed at runtime apply from here. Waiting
    /// claims are woken when a team at its quota got room.
    pub fn set_teams(&self, teams: impl IntoIterator<Item = (String, Team)>) {
        let charges = self.charges.lock().unwrap().clone();
        let freed = {
            let mut s = self.shares.lock().unwrap();
            let mut freed = false;
            let mut next = BTreeMap::new();
            for (name, mut t) in teams {
                // The database's virtual time is the truth (every replica
                // writes its starts there each second), with this replica's
                // starts not written yet.
                if let Some(&(starts, clock)) = charges.get(&name) {
                    t.pass = kiln_core::fair::charged_pass(t.pass, t.weight, clock, starts);
                }
                if let Some(old) = s.teams.get(&name) {
                    freed |= old.max_running.is_some_and(|m| old.running >= m)
                        && t.max_running.is_none_or(|m| t.running < m);
                }
                next.insert(name, t);
            }
            let resumed = kiln_core::fair::resumed_clock(next.values());
            s.teams = next;
            s.clock = s.clock.max(resumed);
            freed
        };
        if freed {
            self.notify.notify_waiters();
        }
    }

    /// A claim of `team`'s job committed; `started`: a new start (not a
    /// claim request answered again), to be charged to the team's virtual
    /// time with the next [`Self::take_charges`] (its stride was counted
    /// here when the delivery was handed out).
    pub fn claimed(&self, team: &str, started: bool) {
        if started {
            let clock = self.shares.lock().unwrap().clock;
            let mut charges = self.charges.lock().unwrap();
            let c = charges.entry(team.to_string()).or_insert((0, clock));
            c.0 += 1;
            c.1 = c.1.min(clock);
        }
    }

    /// The starts to write to the teams' virtual times
    /// (`TeamStore::charge_teams`), taken: give them back with
    /// [`Self::restore_charges`] if the write fails.
    pub fn take_charges(&self) -> Vec<kiln_store::TeamCharge> {
        std::mem::take(&mut *self.charges.lock().unwrap())
            .into_iter()
            .map(|(team, (starts, clock))| kiln_store::TeamCharge { team, starts, clock })
            .collect()
    }

    /// Charges [`Self::take_charges`] took that were not written.
    pub fn restore_charges(&self, taken: Vec<kiln_store::TeamCharge>) {
        let mut charges = self.charges.lock().unwrap();
        for t in taken {
            let c = charges.entry(t.team).or_insert((0, t.clock));
            c.0 += t.starts;
            c.1 = c.1.min(t.clock);
        }
    }

    /// A delivery handed out for `team` was not claimed: the slot and the
    /// stride it counted are given back (a job tried again and again — its
    /// run busy on another replica — does not push its team behind).
    pub fn unclaimed(&self, team: &str) {
        self.shares.lock().unwrap().unstart(team, 1);
    }

    /// A job of `team` ended (a completion through this replica): its slot
    /// is free; claims waiting on the team's quota are woken. Other
    /// replicas learn it at their next refresh (within a second).
    pub fn finished(&self, team: &str) {
        let woke = {
            let mut s = self.shares.lock().unwrap();
            let Some(t) = s.teams.get_mut(team) else { return };
            let full = t.max_running.is_some_and(|m| t.running >= m);
            t.running = t.running.saturating_sub(1);
            full
        };
        if woke {
            self.notify.notify_waiters();
        }
    }

    /// `team` holds its quota as the claim transaction counted it.
    pub fn at_quota(&self, team: &str, held: u32) {
        let mut s = self.shares.lock().unwrap();
        let t = s.teams.entry(team.to_string()).or_default();
        t.running = t.running.max(held);
        t.max_running = Some(t.max_running.map_or(held, |m| m.min(held)));
    }

    /// How long a job waits before it moves up a lane (`--aging-step`).
    pub fn set_aging_step(&self, step: Duration) {
        self.shares.lock().unwrap().aging_step_ms = step.as_millis().max(1) as i64;
    }

    /// The live jobs by team × lane × class and the connected slots, as
    /// the last refresh read them.
    pub fn set_groups(&self, groups: Vec<kiln_store::QueueGroup>, slots: u32) {
        *self.groups.lock().unwrap() = (std::sync::Arc::new(groups), slots);
    }

    /// What [`Self::set_groups`] was last given.
    pub fn groups(&self) -> (std::sync::Arc<Vec<kiln_store::QueueGroup>>, u32) {
        let g = self.groups.lock().unwrap();
        (g.0.clone(), g.1)
    }

    /// The teams' shares as this replica sees them.
    pub fn shares(&self) -> Shares {
        self.shares.lock().unwrap().clone()
    }

    /// Note what a delivery's job needs of its agent (a claim was refused
    /// for placement), and put the delivery back where it was, waking the
    /// waiting claims (one of them may be of an agent that may run it).
    pub fn note_placement(&self, ev: OutboxEvent, needs: JobPlacement) {
        {
            let mut q = self.inner.lock().unwrap();
            q.placements.insert((ev.job_id.clone(), ev.dispatch_generation), (needs, Instant::now()));
        }
        if self.insert(ev, true) {
            self.notify.notify_waiters();
        }
    }

    /// Forget every noted placement (what jobs need of their agents changed,
    /// e.g. a repository's secret pools): the next claim learns them again.
    /// Other replicas keep theirs for at most [`PLACEMENT_NOTE_TTL`].
    pub fn forget_placements(&self) {
        self.inner.lock().unwrap().placements.clear();
        self.notify.notify_waiters();
    }

    /// Deliveries queued for this replica's agents (spare ones not counted).
    pub fn depth(&self) -> usize {
        self.inner.lock().unwrap().by_class.values().map(ClassQueue::len).sum()
    }

    /// Whether this replica offers `job_id` (always, unless it shares the
    /// offering with other live replicas).
    pub fn offers(&self, job_id: &str) -> bool {
        self.offer.lock().unwrap().mine(job_id)
    }

    /// How many replicas share the offering (0: this one offers everything).
    pub fn offer_members(&self) -> usize {
        let o = self.offer.lock().unwrap();
        if o.partitioned() { o.members.len() } else { 0 }
    }

    /// The live members as read from the database (`me` is this replica).
    /// Returns whether the offering changed; queued jobs this replica no
    /// longer offers leave its queues (their new owner's sweep queues them).
    pub fn set_members(&self, me: &str, mut members: Vec<String>) -> bool {
        members.sort();
        members.dedup();
        let new = Offer { me: me.to_string(), members };
        {
            let mut o = self.offer.lock().unwrap();
            if *o == new {
                return false;
            }
            *o = new.clone();
        }
        let mut q = self.inner.lock().unwrap();
        let q = &mut *q;
        for queue in q.by_class.values_mut() {
            queue.retain(|ev| {
                let keep = new.mine(&ev.job_id);
                if !keep {
                    q.queued.remove(&(ev.job_id.clone(), ev.dispatch_generation));
                }
                keep
            });
        }
        true
    }

    /// Queues the jobs of `ready` this replica offers: how many were new,
    /// and the others (another replica's to offer).
    fn queue_own(&self, ready: Vec<OutboxEvent>) -> (usize, Vec<OutboxEvent>) {
        let offer = self.offer.lock().unwrap().clone();
        let mut added = 0;
        let mut others = vec![];
        for ev in ready {
            if offer.mine(&ev.job_id) {
                added += usize::from(self.insert(ev, false));
            } else {
                others.push(ev);
            }
        }
        (added, others)
    }

    /// A sweep's result: every job ready now. Queues those this replica
    /// offers (returns how many were new), notes the others, and makes
    /// spare those of them ready for at least `spare_after`.
    pub fn sweep(&self, ready: Vec<OutboxEvent>, spare_after: Duration) -> usize {
        let now = Instant::now();
        let (added, others) = self.queue_own(ready);
        let mut woke = added > 0;
        {
            let mut q = self.inner.lock().unwrap();
            let q = &mut *q;
            let mut unowned = HashMap::with_capacity(others.len());
            let mut spare: HashMap<String, ClassQueue> = HashMap::new();
            for ev in others {
                let key = (ev.job_id.clone(), ev.dispatch_generation);
                let since = q.unowned.get(&key).copied().unwrap_or(now);
                if now.duration_since(since) >= spare_after && !q.queued.contains(&key) {
                    lane_queue(&mut spare, &ev).push_back(ev);
                }
                unowned.insert(key, since);
            }
            woke |= spare.values().any(|q| q.len() > 0);
            q.unowned = unowned;
            q.spare = spare;
            // Notes of deliveries no longer queued here (claimed, or moved
            // to another replica) go.
            let (queued, unowned) = (&q.queued, &q.unowned);
            q.placements.retain(|k, _| queued.contains(k) || unowned.contains_key(k));
        }
        if woke {
            self.notify.notify_waiters();
        }
        added
    }

    /// Part of a sweep: `ready` are some of the jobs ready now (those a
    /// notification from another replica named). Queues those this replica
    /// offers (returns how many were new) and notes the others, as
    /// [`Self::sweep`] does, but forgets nothing it knew of other jobs; the
    /// next full sweep makes noted jobs spare.
    pub fn sweep_some(&self, ready: Vec<OutboxEvent>) -> usize {
        let now = Instant::now();
        let (added, others) = self.queue_own(ready);
        if !others.is_empty() {
            let mut q = self.inner.lock().unwrap();
            for ev in others {
                q.unowned.entry((ev.job_id, ev.dispatch_generation)).or_insert(now);
            }
        }
        if added > 0 {
            self.notify.notify_waiters();
        }
        added
    }

    /// Whether ready jobs other replicas offer were seen at the last sweep.
    pub fn has_unowned(&self) -> bool {
        !self.inner.lock().unwrap().unowned.is_empty()
    }

    /// Count a claim long-poll as in flight until the guard drops.
    pub fn poll_started(&self) -> PollGuard<'_> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        PollGuard(self)
    }

    /// Whether agents claim through this replica: a long-poll in flight, or
    /// one ended within `within`.
    pub fn has_agents(&self, within: Duration) -> bool {
        self.polls.load(Ordering::Relaxed) > 0 || self.last_poll.lock().unwrap().is_some_and(|t| t.elapsed() < within)
    }
}

/// Milliseconds since the Unix epoch (what ready times are measured in:
/// the database clock is the system clock).
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn lane_queue<'a>(by_class: &'a mut HashMap<String, ClassQueue>, ev: &OutboxEvent) -> &'a mut VecDeque<OutboxEvent> {
    by_class
        .entry(ev.class_key.clone())
        .or_insert_with(|| ClassQueue {
            labels: serde_json::from_str(&ev.class_key).unwrap_or_default(),
            ..Default::default()
        })
        .lanes
        .entry((ev.team.clone(), lane_of(ev)))
        .or_default()
}

/// The delivery a freed slot takes, by fair share: the candidates are the
/// first delivery `may` allows of each (team, lane) queue in the classes
/// the agent's labels fit (deliveries the agent may not run are passed
/// over and stay queued); [`Shares::choose`] decides, and the start is
/// counted against the team at once (its claim confirms or gives it back).
fn pop_from(
    by_class: &mut HashMap<String, ClassQueue>,
    agent_labels: &BTreeMap<String, String>,
    may: &dyn Fn(&OutboxEvent) -> bool,
    shares: &mut Shares,
    now_ms: i64,
) -> Option<OutboxEvent> {
    let mut at: Vec<(&String, &(String, Lane), usize)> = Vec::new();
    let mut candidates: Vec<Candidate> = Vec::new();
    for (class, queue) in by_class.iter() {
        if !kiln_core::claim::labels_match(&queue.labels, agent_labels) {
            continue;
        }
        for (key, q) in &queue.lanes {
            if let Some(i) = q.iter().position(may) {
                let ev = &q[i];
                candidates.push(Candidate {
                    team: key.0.clone(),
                    lane: key.1,
                    ready_at_ms: ev.ready_at_ms,
                    seq: ev.id,
                });
                at.push((class, key, i));
            }
        }
    }
    let pick = shares.choose(&candidates, now_ms)?;
    let (class, key, i) = at[pick];
    let (class, key) = (class.clone(), key.clone());
    let queue = by_class.get_mut(&class)?;
    let lane = queue.lanes.get_mut(&key)?;
    let ev = lane.remove(i)?;
    if lane.is_empty() {
        queue.lanes.remove(&key);
    }
    shares.start(&key.0, 1);
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: i64, class: &str) -> OutboxEvent {
        OutboxEvent {
            id,
            job_id: format!("j{id}"),
            dispatch_generation: 1,
            class_key: class.into(),
            team: "default".into(),
            lane: "normal".into(),
            ready_at_ms: id,
        }
    }

    #[test]
    fn compatible_classes_only_oldest_first() {
        let d = Dispatcher::default();
        d.push(ev(2, "{}"));
        d.push(ev(1, r#"{"os":"linux","size":"large"}"#));
        d.push(ev(3, r#"{"os":"macos"}"#));
        let linux: BTreeMap<String, String> = [("os".to_string(), "linux".to_string())].into();
        assert_eq!(d.pop(&linux).unwrap().id, 2, "large job needs size=large");
        assert!(d.pop(&linux).is_none());
        let big: BTreeMap<String, String> =
            [("os".to_string(), "linux".to_string()), ("size".to_string(), "large".to_string())].into();
        assert_eq!(d.pop(&big).unwrap().id, 1);
        assert_eq!(d.depth(), 1);
    }

    fn team_ev(id: i64, team: &str, lane: &str) -> OutboxEvent {
        // Ready just now, in id order (not aged).
        OutboxEvent { team: team.into(), lane: lane.into(), ready_at_ms: wall_ms() + id, ..ev(id, "{}") }
    }

    #[test]
    fn a_freed_slot_goes_to_the_team_behind_and_a_higher_lane_first() {
        let d = Dispatcher::default();
        let any = BTreeMap::new();
        // Team a's backlog arrived first; b's one job after.
        for i in 1..=10 {
            d.push(team_ev(i, "a", "normal"));
        }
        d.push(team_ev(11, "b", "normal"));
        let first = d.pop(&any).unwrap();
        assert_eq!(first.team, "a", "both at virtual time 0: the older job's team first");
        assert_eq!(d.pop(&any).unwrap().id, 11, "then b: a is a stride ahead");
        assert_eq!(d.pop(&any).unwrap().team, "a");
        // An urgent job goes before every normal one, whatever its team's time.
        d.push(team_ev(12, "a", "urgent"));
        assert_eq!(d.pop(&any).unwrap().id, 12);
        // At its quota (reservations counted), a team is passed over.
        d.set_teams([("a".to_string(), Team { max_running: Some(1), running: 1, ..Team::default() })]);
        d.push(team_ev(13, "b", "background"));
        assert_eq!(d.pop(&any).unwrap().id, 13, "a holds its quota: b's background job runs");
        assert!(d.pop(&any).is_none(), "a's jobs wait for its quota");
        assert_eq!(d.depth(), 8);
        // A claim that did not happen gives the slot back.
        d.set_teams([("a".to_string(), Team { max_running: Some(1), running: 0, ..Team::default() })]);
        let e = d.pop(&any).unwrap();
        assert_eq!(e.team, "a");
        assert!(d.pop(&any).is_none(), "its start was counted at once");
        d.unclaimed("a");
        assert_eq!(d.pop(&any).unwrap().team, "a");
    }

    #[test]
    fn starts_are_charged_in_batches_and_kept_until_written() {
        use kiln_core::fair::STRIDE;
        let d = Dispatcher::default();
        let any = BTreeMap::new();
        let team = |pass| ("a".to_string(), Team { weight: 1, pass, ..Team::default() });
        d.set_teams([team(0)]);
        for (i, started) in [(1, true), (2, true), (3, false)] {
            d.push(team_ev(i, "a", "normal"));
            d.pop(&any).unwrap();
            // false: a claim request answered again, no start.
            d.claimed("a", started);
        }
        // A refresh before the write: the database's time plus the starts
        // not written yet.
        d.set_teams([team(0)]);
        assert_eq!(d.shares().teams["a"].pass, 2 * STRIDE);
        let taken = d.take_charges();
        assert_eq!(taken, vec![kiln_store::TeamCharge { team: "a".into(), starts: 2, clock: 0 }]);
        assert!(d.take_charges().is_empty(), "taken once");
        // The write failed: given back, and added to what comes after.
        d.restore_charges(taken);
        d.claimed("a", true);
        assert_eq!(d.take_charges()[0].starts, 3);
    }

    #[test]
    fn a_job_generation_is_queued_once_until_popped() {
        let d = Dispatcher::default();
        assert!(d.push(ev(1, "{}")));
        assert!(!d.push(ev(1, "{}")), "a sweep re-finding a queued job adds nothing");
        assert_eq!(d.depth(), 1);
        let any = BTreeMap::new();
        let e = d.pop(&any).unwrap();
        assert!(d.pop(&any).is_none());
        d.push_front(e);
        assert_eq!(d.depth(), 1, "declined for capacity: back in the queue");
        d.pop(&any).unwrap();
        assert!(d.push(ev(1, "{}")), "popped: may be queued again (e.g. its claim failed)");
    }

    #[test]
    fn agents_pass_over_jobs_they_may_not_run() {
        let d = Dispatcher::default();
        d.push(ev(1, "{}"));
        d.push(ev(2, "{}"));
        let any = BTreeMap::new();
        let untrusted = JobPlacement { untrusted: true, ..JobPlacement::default() };
        let trusted_only = |p: &JobPlacement| !p.untrusted;
        // Not yet known: tried by whoever asks first, refused, noted.
        let first = d.pop_for(&any, trusted_only).unwrap();
        assert_eq!(first.id, 1);
        d.note_placement(first, untrusted);
        assert_eq!(d.depth(), 2, "still queued for an agent that may run it");
        // The host agent now gets the job behind it, then nothing.
        assert_eq!(d.pop_for(&any, trusted_only).unwrap().id, 2);
        assert!(d.pop_for(&any, trusted_only).is_none());
        // An agent that takes untrusted work gets it.
        assert_eq!(d.pop_for(&any, |_| true).unwrap().id, 1);
        assert_eq!(d.depth(), 0);
    }

    fn job(id: &str) -> OutboxEvent {
        OutboxEvent {
            id: 0,
            job_id: id.into(),
            dispatch_generation: 1,
            class_key: "{}".into(),
            team: "default".into(),
            lane: "normal".into(),
            ready_at_ms: 0,
        }
    }

    #[test]
    fn each_ready_job_is_offered_by_one_live_member() {
        let members: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let (a, b) = (Dispatcher::default(), Dispatcher::default());
        assert!(a.offers("anything"), "alone: everything");
        assert!(a.set_members("a", members[..2].to_vec()));
        assert!(!a.set_members("a", vec!["b".into(), "a".into()]), "same members: no change");
        b.set_members("b", members[..2].to_vec());
        assert_eq!(a.offer_members(), 2);
        let ids: Vec<String> = (0..1000).map(|i| format!("job-{i}")).collect();
        let of_a = ids.iter().filter(|j| a.offers(j)).count();
        assert!(ids.iter().all(|j| a.offers(j) != b.offers(j)), "exactly one of two offers each job");
        assert!((400..600).contains(&of_a), "about half each: {of_a}");
        // A third member takes only from the others' shares (rendezvous).
        let moved = ids
            .iter()
            .filter(|j| offered_by(&members[..2], j) != offered_by(&members, j))
            .inspect(|j| assert_eq!(offered_by(&members, j), Some("c")))
            .count();
        assert!((200..450).contains(&moved), "{moved}");
        // Not (or no longer) a member: offers everything again.
        a.set_members("a", vec!["b".into(), "c".into()]);
        assert_eq!(a.offer_members(), 0);
        assert!(ids.iter().all(|j| a.offers(j)));
    }

    #[test]
    fn jobs_of_other_replicas_are_spare_after_a_while_and_only_when_nothing_else_fits() {
        let d = Dispatcher::default();
        d.set_members("a", vec!["a".into(), "b".into()]);
        let ids: Vec<String> = (0..20).map(|i| format!("job-{i}")).collect();
        let (mine, theirs): (Vec<&String>, Vec<&String>) = ids.iter().partition(|j| d.offers(j));
        assert!(!mine.is_empty() && !theirs.is_empty());
        assert!(!d.push(job(theirs[0])), "the relay does not queue another replica's job");
        let all = || ids.iter().map(|j| job(j)).collect::<Vec<_>>();
        assert_eq!(d.sweep(all(), Duration::from_secs(3600)), mine.len());
        assert!(d.has_unowned());
        let any = BTreeMap::new();
        for _ in &mine {
            assert!(d.offers(&d.pop(&any).unwrap().job_id));
        }
        assert!(d.pop(&any).is_none(), "others' jobs not yet spare");
        // Seen ready long enough (here: at once), with nothing of its own.
        assert_eq!(d.sweep(all(), Duration::ZERO), mine.len(), "its own again (popped, never claimed)");
        for _ in &mine {
            assert!(d.offers(&d.pop(&any).unwrap().job_id), "its own first");
        }
        let mut spare = vec![];
        while let Some(ev) = d.pop(&any) {
            spare.push(ev.job_id);
        }
        spare.sort();
        let mut theirs: Vec<String> = theirs.into_iter().cloned().collect();
        theirs.sort();
        assert_eq!(spare, theirs);
        // The other member's lease lapsed: its share is queued by the next
        // sweep, with this replica's own (popped, never claimed) jobs.
        assert!(d.set_members("a", vec!["a".into()]));
        assert_eq!(d.sweep(all(), Duration::from_secs(3600)), ids.len());
        assert!(!d.has_unowned());
    }

    #[test]
    fn a_partial_sweep_queues_its_jobs_and_forgets_nothing() {
        let d = Dispatcher::default();
        d.set_members("a", vec!["a".into(), "b".into()]);
        let ids: Vec<String> = (0..20).map(|i| format!("job-{i}")).collect();
        let (mine, theirs): (Vec<&String>, Vec<&String>) = ids.iter().partition(|j| d.offers(j));
        // A full sweep saw the first of theirs; a notification names the
        // rest of the jobs (one of its own among them).
        d.sweep(vec![job(theirs[0])], Duration::from_secs(3600));
        let named: Vec<OutboxEvent> = ids.iter().filter(|j| *j != theirs[0]).map(|j| job(j)).collect();
        assert_eq!(d.sweep_some(named.clone()), mine.len());
        assert_eq!(d.sweep_some(named), 0, "queued once");
        assert_eq!(d.depth(), mine.len());
        // Every job of theirs is noted (the first one too, still), and the
        // next full sweep makes them spare once they waited long enough.
        assert_eq!(d.inner.lock().unwrap().unowned.len(), theirs.len());
        let any = BTreeMap::new();
        while d.pop(&any).is_some() {}
        d.sweep(ids.iter().map(|j| job(j)).collect(), Duration::ZERO);
        let mut spare = 0;
        while let Some(ev) = d.pop(&any) {
            spare += usize::from(!d.offers(&ev.job_id));
        }
        assert_eq!(spare, theirs.len());
    }

    #[test]
    fn a_new_member_takes_its_share_out_of_the_queues() {
        let d = Dispatcher::default();
        let ids: Vec<String> = (0..50).map(|i| format!("job-{i}")).collect();
        assert_eq!(d.sweep(ids.iter().map(|j| job(j)).collect(), Duration::ZERO), 50);
        d.set_members("a", vec!["a".into(), "b".into()]);
        let kept = ids.iter().filter(|j| d.offers(j)).count();
        assert_eq!(d.depth(), kept);
        assert!(kept < 50);
    }
}
