//! Dispatch queues per compatibility class, fed by the outbox relay.
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

use kiln_core::claim::JobPlacement;
use kiln_store::OutboxEvent;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

type ClassQueue = (BTreeMap<String, String>, VecDeque<OutboxEvent>);

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
        let queue = class_queue(&mut q.by_class, &ev.class_key);
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
        if let Some(ev) = pop_from(&mut q.by_class, agent_labels, &may) {
            q.queued.remove(&(ev.job_id.clone(), ev.dispatch_generation));
            return Some(ev);
        }
        pop_from(&mut q.spare, agent_labels, &may)
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
        self.inner.lock().unwrap().by_class.values().map(|(_, q)| q.len()).sum()
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
        for (_, queue) in q.by_class.values_mut() {
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

    /// A sweep's result: every job ready now. Queues those this replica
    /// offers (returns how many were new), notes the others, and makes
    /// spare those of them ready for at least `spare_after`.
    pub fn sweep(&self, ready: Vec<OutboxEvent>, spare_after: Duration) -> usize {
        let offer = self.offer.lock().unwrap().clone();
        let now = Instant::now();
        let mut added = 0;
        let mut others = vec![];
        for ev in ready {
            if offer.mine(&ev.job_id) {
                added += usize::from(self.insert(ev, false));
            } else {
                others.push(ev);
            }
        }
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
                    class_queue(&mut spare, &ev.class_key).push_back(ev);
                }
                unowned.insert(key, since);
            }
            woke |= spare.values().any(|(_, q)| !q.is_empty());
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

fn class_queue<'a>(by_class: &'a mut HashMap<String, ClassQueue>, class_key: &str) -> &'a mut VecDeque<OutboxEvent> {
    &mut by_class
        .entry(class_key.to_string())
        .or_insert_with(|| (serde_json::from_str(class_key).unwrap_or_default(), VecDeque::new()))
        .1
}

/// The oldest delivery of a class the agent's labels fit that `may` allows
/// (usually each queue's front; deliveries the agent may not run are passed
/// over and stay queued).
fn pop_from(
    by_class: &mut HashMap<String, ClassQueue>,
    agent_labels: &BTreeMap<String, String>,
    may: &dyn Fn(&OutboxEvent) -> bool,
) -> Option<OutboxEvent> {
    by_class
        .values_mut()
        .filter(|(labels, _)| kiln_core::claim::labels_match(labels, agent_labels))
        .filter_map(|(_, queue)| {
            let at = queue.iter().position(may)?;
            Some((queue[at].id, at, queue))
        })
        .min_by_key(|(id, ..)| *id)
        .and_then(|(_, at, queue)| queue.remove(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: i64, class: &str) -> OutboxEvent {
        OutboxEvent { id, job_id: format!("j{id}"), dispatch_generation: 1, class_key: class.into() }
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
        OutboxEvent { id: 0, job_id: id.into(), dispatch_generation: 1, class_key: "{}".into() }
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
