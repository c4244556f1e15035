//! Job-level concurrency groups (spec 003): at most one job of a group is
//! ready or running, across runs. A job about to become ready asks to enter
//! its group ([`crate::advance::Verdict::EnterGroup`]); the store reads the
//! group's other jobs and this decides what happens.
//!
//! Invariant protected: a group never has two occupants (ready or running);
//! a newer job supersedes older ones waiting, and with `cancel-in-progress`
//! stops the occupant instead of waiting behind it.

use crate::job::JobStatus;

/// One thing the store does to another job of the group, in this order
/// (each cancelled job's run is advanced right after it is cancelled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupAction {
    /// An older job waiting for the group: cancelled with this message.
    Supersede { job: String, why: String },
    /// A ready occupant under `cancel-in-progress`: cancelled with this message.
    CancelReady { job: String, why: String },
    /// A running occupant under `cancel-in-progress`: asked to stop (its
    /// heartbeat says so); it ends `cancelled` when it reports or is fenced.
    StopRunning { job: String },
}

/// The answer to "may `job` enter group `key`?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// The job becomes ready now.
    pub enter: bool,
    pub actions: Vec<GroupAction>,
    /// When it does not enter: it is marked waiting, with this message.
    pub wait_message: Option<String>,
}

/// Decide entry of `job` into group `key`. `occupants`: the group's other
/// jobs that are ready or running (id, status); `waiting`: its other jobs
/// waiting for it (pending).
pub fn decide_group_entry(
    job: &str,
    key: &str,
    cancel_in_progress: bool,
    ordered: bool,
    occupants: &[(String, JobStatus)],
    waiting: &[String],
) -> GroupEntry {
    if occupants.is_empty() {
        return GroupEntry { enter: true, actions: vec![], wait_message: None };
    }
    // `queue: ordered`: the jobs waiting stay, and this one waits behind them.
    let superseded: &[String] = if ordered { &[] } else { waiting };
    let mut actions: Vec<GroupAction> = superseded
        .iter()
        .map(|w| GroupAction::Supersede {
            job: w.clone(),
            why: format!("cancelled: superseded by job {job} in concurrency group `{key}`"),
        })
        .collect();
    let mut still_running = true;
    if cancel_in_progress {
        still_running = false;
        for (occupant, status) in occupants {
            if *status == JobStatus::Running {
                still_running = true;
                actions.push(GroupAction::StopRunning { job: occupant.clone() });
            } else {
                actions.push(GroupAction::CancelReady {
                    job: occupant.clone(),
                    why: format!("cancelled in progress by job {job} in concurrency group `{key}`"),
                });
            }
        }
    }
    let wait_message = still_running.then(|| match key.strip_prefix(crate::advance::ENVIRONMENT_GROUP_PREFIX) {
        Some(env) if ordered && !waiting.is_empty() => format!(
            "waiting for environment `{env}`: another run is deploying to it ({} runs' jobs ahead in its queue)",
            waiting.len()
        ),
        Some(env) => format!("waiting for environment `{env}`: another run is deploying to it"),
        None if ordered && !waiting.is_empty() => {
            format!("waiting for concurrency group `{key}` ({} ahead in its queue)", waiting.len())
        }
        None => format!("waiting for concurrency group `{key}`"),
    });
    GroupEntry { enter: !still_running, actions, wait_message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::{Ready, Running};

    type Occupants = Vec<(String, JobStatus)>;

    fn s(v: &str) -> String {
        v.to_string()
    }

    #[test]
    fn table() {
        let supersede = |j: &str| GroupAction::Supersede {
            job: s(j),
            why: s("cancelled: superseded by job new in concurrency group `r:deploy`"),
        };
        let cancel = |j: &str| GroupAction::CancelReady {
            job: s(j),
            why: s("cancelled in progress by job new in concurrency group `r:deploy`"),
        };
        let stop = |j: &str| GroupAction::StopRunning { job: s(j) };
        let wait = Some(s("waiting for concurrency group `r:deploy`"));
        // (cancel-in-progress, occupants, waiting) → (enter, actions, wait message)
        let rows: Vec<(bool, Occupants, Vec<String>, GroupEntry)> = vec![
            // A free group is entered, even with jobs waiting (they wait for a release).
            (false, vec![], vec![s("w")], GroupEntry { enter: true, actions: vec![], wait_message: None }),
            (true, vec![], vec![], GroupEntry { enter: true, actions: vec![], wait_message: None }),
            // Occupied: wait, superseding older waiters.
            (
                false,
                vec![(s("o"), Running)],
                vec![s("w1"), s("w2")],
                GroupEntry {
                    enter: false,
                    actions: vec![supersede("w1"), supersede("w2")],
                    wait_message: wait.clone(),
                },
            ),
            (
                false,
                vec![(s("o"), Ready)],
                vec![],
                GroupEntry { enter: false, actions: vec![], wait_message: wait.clone() },
            ),
            // cancel-in-progress: a ready occupant is cancelled and the job enters.
            (
                true,
                vec![(s("o"), Ready)],
                vec![s("w")],
                GroupEntry { enter: true, actions: vec![supersede("w"), cancel("o")], wait_message: None },
            ),
            // A running one is asked to stop; the job waits for it to end.
            (
                true,
                vec![(s("o1"), Ready), (s("o2"), Running)],
                vec![],
                GroupEntry { enter: false, actions: vec![cancel("o1"), stop("o2")], wait_message: wait.clone() },
            ),
        ];
        for (cip, occupants, waiting, want) in rows {
            assert_eq!(decide_group_entry("new", "r:deploy", cip, false, &occupants, &waiting), want, "{occupants:?}");
        }
    }

    #[test]
    fn an_ordered_queue_supersedes_nobody_and_waits_behind() {
        let occupants = vec![(s("o"), Running)];
        let waiting = vec![s("w1"), s("w2")];
        let e = decide_group_entry("new", "environment:production", false, true, &occupants, &waiting);
        assert!(!e.enter);
        assert!(e.actions.is_empty(), "{:?}", e.actions);
        assert_eq!(
            e.wait_message.as_deref(),
            Some(
                "waiting for environment `production`: another run is deploying to it (2 runs' jobs ahead in its queue)"
            )
        );
        // cancel-in-progress still stops the occupant; the waiting stay.
        let e = decide_group_entry("new", "r:deploy", true, true, &[(s("o"), Ready)], &waiting);
        assert!(e.enter);
        assert_eq!(
            e.actions,
            vec![GroupAction::CancelReady {
                job: s("o"),
                why: s("cancelled in progress by job new in concurrency group `r:deploy`")
            }]
        );
    }
}
