//! Dispatch queues per compatibility class, fed by the outbox relay.
//!
//! A delivery grants nothing: the claim transaction decides ownership, so a
//! duplicate or stale event is simply absorbed there (spec 000 §7, §15).
//! Queues are in memory; after a restart they are rebuilt from ready jobs.

use kiln_store::OutboxEvent;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use tokio::sync::Notify;

type ClassQueue = (BTreeMap<String, String>, VecDeque<OutboxEvent>);

#[derive(Default)]
pub struct Dispatcher {
    /// Class key → (the class's required labels, its deliveries in order).
    queues: Mutex<HashMap<String, ClassQueue>>,
    pub notify: Notify,
}

impl Dispatcher {
    pub fn push(&self, ev: OutboxEvent) {
        let labels: BTreeMap<String, String> = serde_json::from_str(&ev.class_key).unwrap_or_default();
        let mut q = self.queues.lock().unwrap();
        q.entry(ev.class_key.clone()).or_insert_with(|| (labels, VecDeque::new())).1.push_back(ev);
        drop(q);
        self.notify.notify_waiters();
    }

    /// Put back an event whose claim was declined for capacity: it stays eligible.
    pub fn push_front(&self, ev: OutboxEvent) {
        let labels: BTreeMap<String, String> = serde_json::from_str(&ev.class_key).unwrap_or_default();
        let mut q = self.queues.lock().unwrap();
        q.entry(ev.class_key.clone()).or_insert_with(|| (labels, VecDeque::new())).1.push_front(ev);
    }

    /// Next event of any class whose labels are a subset of the agent's.
    pub fn pop(&self, agent_labels: &BTreeMap<String, String>) -> Option<OutboxEvent> {
        let mut q = self.queues.lock().unwrap();
        q.values_mut()
            .filter(|(labels, _)| labels.iter().all(|(k, v)| agent_labels.get(k) == Some(v)))
            .filter_map(|(_, queue)| Some((queue.front()?.id, queue)))
            .min_by_key(|(id, _)| *id)
            .and_then(|(_, queue)| queue.pop_front())
    }

    pub fn depth(&self) -> usize {
        self.queues.lock().unwrap().values().map(|(_, q)| q.len()).sum()
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
}
