//! Dispatch queues per compatibility class, fed by the outbox relay.
//!
//! A delivery grants nothing: the claim transaction decides ownership, so a
//! duplicate or stale event is simply absorbed there (spec 000 §7, §15).
//! Queues are in memory; after a restart they are rebuilt from ready jobs,
//! and with several replicas each one also sweeps the ready jobs now and then
//! (a job relayed by another replica, or by one that died, reaches every
//! replica's agents). A (job, generation) is queued at most once per replica.

use kiln_store::OutboxEvent;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use tokio::sync::Notify;

type ClassQueue = (BTreeMap<String, String>, VecDeque<OutboxEvent>);

#[derive(Default)]
pub struct Dispatcher {
    inner: Mutex<Queues>,
    pub notify: Notify,
}

#[derive(Default)]
struct Queues {
    /// Class key → (the class's required labels, its deliveries in order).
    by_class: HashMap<String, ClassQueue>,
    /// (job, dispatch generation) of every queued delivery.
    queued: HashSet<(String, i64)>,
}

impl Dispatcher {
    /// Queue a delivery (unless the same job and generation is queued already).
    pub fn push(&self, ev: OutboxEvent) -> bool {
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
        let labels: BTreeMap<String, String> = serde_json::from_str(&ev.class_key).unwrap_or_default();
        let queue = &mut q.by_class.entry(ev.class_key.clone()).or_insert_with(|| (labels, VecDeque::new())).1;
        if front {
            queue.push_front(ev)
        } else {
            queue.push_back(ev)
        }
        true
    }

    /// Next event of any class whose labels are a subset of the agent's.
    pub fn pop(&self, agent_labels: &BTreeMap<String, String>) -> Option<OutboxEvent> {
        let mut q = self.inner.lock().unwrap();
        let ev = q
            .by_class
            .values_mut()
            .filter(|(labels, _)| labels.iter().all(|(k, v)| agent_labels.get(k) == Some(v)))
            .filter_map(|(_, queue)| Some((queue.front()?.id, queue)))
            .min_by_key(|(id, _)| *id)
            .and_then(|(_, queue)| queue.pop_front())?;
        q.queued.remove(&(ev.job_id.clone(), ev.dispatch_generation));
        Some(ev)
    }

    pub fn depth(&self) -> usize {
        self.inner.lock().unwrap().by_class.values().map(|(_, q)| q.len()).sum()
    }
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
}
