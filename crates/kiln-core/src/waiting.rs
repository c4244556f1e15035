//! Why a job has not started yet, in words (issue 41, item 3; invariant
//! 12: "a job no agent may take waits, and says why"). The server reads
//! the facts when a run is read — the agents registered and connected now,
//! what they run, the job's needs and groups — and these functions say
//! what the job waits for: the run page and `kiln run --follow` show it
//! next to the job, instead of a bare `ready` or `pending`.
//!
//! Every text starts with `waiting`, so it reads after a job's name
//! (`build: waiting for needs: lint (running)`).

use crate::claim::{Executor, JobPlacement, UntrustedPolicy, labels_match, placement_refusal, waiting_reason};
use crate::job::JobStatus;
use std::collections::BTreeMap;

/// One registered agent as the server sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSeen<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The pool of its join token, and its executor.
    pub pool: &'a str,
    pub executor: Executor,
    /// It holds a live session with this server now.
    pub connected: bool,
    /// It said it drains: it claims nothing more.
    pub draining: bool,
    /// Attempts it runs now, and how many it may run at once.
    pub running: u32,
    pub max_jobs: u32,
}

/// Why a `ready` job is not claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentWait {
    /// No agent is connected at all.
    NoneConnected(String),
    /// No connected agent has the job's `runs-on` labels.
    NoLabels(String),
    /// Agents with its labels are connected, but placement (trust,
    /// isolation, secret pools, a pinned image) keeps each from it.
    Placement(String),
    /// Agents that may run it are connected, and every one is full or
    /// draining.
    Busy(String),
}

impl AgentWait {
    pub fn text(&self) -> &str {
        match self {
            AgentWait::NoneConnected(t) | AgentWait::NoLabels(t) | AgentWait::Placement(t) | AgentWait::Busy(t) => t,
        }
    }
}

/// Why a ready job requiring the labels `required` waits for an agent, or
/// `None` when a connected agent may run it and has room (it is about to
/// claim it).
pub fn for_agent(
    required: &BTreeMap<String, String>,
    placement: &JobPlacement,
    policy: &UntrustedPolicy,
    agents: &[AgentSeen<'_>],
) -> Option<AgentWait> {
    let connected: Vec<&AgentSeen> = agents.iter().filter(|a| a.connected).collect();
    // Registered agents that have the labels but are not connected: worth
    // saying, the fix is to start them.
    let absent: Vec<&str> =
        agents.iter().filter(|a| !a.connected && labels_match(required, a.labels)).map(|a| a.name).collect();
    let absent_note = if absent.is_empty() {
        String::new()
    } else {
        let (has, is) = if absent.len() == 1 { ("has", "is") } else { ("have", "are") };
        format!("; {} {has} these labels but {is} not connected", absent.join(", "))
    };
    if connected.is_empty() {
        return Some(AgentWait::NoneConnected(format!(
            "waiting: no agent is connected (start one with `kiln agent`, or `kiln up --agents N`){absent_note}"
        )));
    }
    let matching: Vec<&AgentSeen> = connected.iter().copied().filter(|a| labels_match(required, a.labels)).collect();
    if matching.is_empty() {
        let list: Vec<String> = connected.iter().map(|a| format!("{} {}", a.name, labels_text(a.labels))).collect();
        return Some(AgentWait::NoLabels(format!(
            "waiting: no connected agent has labels {}; agents: {}{absent_note}",
            labels_text(required),
            list.join(", ")
        )));
    }
    let triples: Vec<(&str, &str, Executor)> = matching.iter().map(|a| (a.name, a.pool, a.executor)).collect();
    if let Some(why) = waiting_reason(placement, policy, &triples) {
        return Some(AgentWait::Placement(why));
    }
    let allowed: Vec<&AgentSeen> = matching
        .into_iter()
        .filter(|a| placement_refusal(placement, a.name, a.pool, a.executor, policy).is_none())
        .collect();
    if allowed.iter().any(|a| !a.draining && a.running < a.max_jobs) {
        return None;
    }
    let each: Vec<String> = allowed
        .iter()
        .map(|a| {
            if a.draining {
                format!("{} draining", a.name)
            } else {
                format!("{} {}/{} jobs", a.name, a.running, a.max_jobs)
            }
        })
        .collect();
    Some(AgentWait::Busy(format!("waiting: every agent that can run it is busy ({})", each.join(", "))))
}

/// What a `pending` job waits for, the first that holds: its run's
/// concurrency group (`run_held`: the run's own message), jobs it needs
/// that have not finished (name, status), its own concurrency group
/// (`group_wait`: what the group entry said), a free `max-parallel` slot of
/// its matrix (group name, limit). `None` when none holds (it is about to
/// be decided).
pub fn for_pending(
    run_held: Option<&str>,
    unfinished_needs: &[(&str, JobStatus)],
    group_wait: Option<&str>,
    max_parallel: Option<(&str, u32)>,
) -> Option<String> {
    if let Some(held) = run_held {
        return Some(if held.starts_with("waiting") {
            held.to_string()
        } else {
            "waiting for the run's concurrency group".to_string()
        });
    }
    if !unfinished_needs.is_empty() {
        let list: Vec<String> = unfinished_needs.iter().map(|(n, s)| format!("{n} ({s})")).collect();
        return Some(format!("waiting for needs: {}", list.join(", ")));
    }
    if let Some(g) = group_wait {
        return Some(g.to_string());
    }
    max_parallel.map(|(group, max)| {
        format!("waiting for a free slot: matrix `{group}` runs at most {max} at once (`max-parallel`)")
    })
}

/// Acceptance's warnings (issue 41, item 3): the run is accepted — an
/// agent with the labels may register later — but a job whose `runs-on`
/// labels no registered agent has would wait in silence until the queue
/// timeout. One warning per set of labels, naming its jobs (`jobs`: name
/// and labels, in order) and the label sets the registered agents have.
/// Labels decided only once a job's needs finish (`${{ needs.… }}`) are
/// not judged; with no agent registered at all there is nothing to judge
/// against (the waiting job says "no agent is connected").
pub fn unmatched_labels(
    jobs: &[(&str, &BTreeMap<String, String>)],
    registered: &[(&str, &BTreeMap<String, String>)],
) -> Vec<String> {
    if registered.is_empty() {
        return vec![];
    }
    let mut unmatched: Vec<(&BTreeMap<String, String>, Vec<&str>)> = vec![];
    for (name, required) in jobs {
        if required.values().any(|v| v.contains("${{"))
            || registered.iter().any(|(_, have)| labels_match(required, have))
        {
            continue;
        }
        match unmatched.iter_mut().find(|(l, _)| *l == *required) {
            Some((_, names)) => names.push(name),
            None => unmatched.push((required, vec![name])),
        }
    }
    if unmatched.is_empty() {
        return vec![];
    }
    // The label sets there are, each with its agents.
    let mut sets: Vec<(&BTreeMap<String, String>, Vec<&str>)> = vec![];
    for (name, have) in registered {
        match sets.iter_mut().find(|(l, _)| *l == *have) {
            Some((_, names)) => names.push(name),
            None => sets.push((have, vec![name])),
        }
    }
    const SHOWN: usize = 10;
    let mut there: Vec<String> =
        sets.iter().take(SHOWN).map(|(l, names)| format!("{} ({})", labels_text(l), names.join(", "))).collect();
    if sets.len() > SHOWN {
        there.push(format!("and {} more", sets.len() - SHOWN));
    }
    let there = there.join("; ");
    unmatched
        .into_iter()
        .map(|(required, names)| {
            let which = if names.len() == 1 {
                format!("job `{}` needs", names[0])
            } else {
                format!("jobs {} need", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))
            };
            let flag: Vec<String> = required.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(
                "{which} an agent with labels {}, and no registered agent has them (registered agents have: \
                 {there}); the run waits until one connects (`kiln agent --labels {}`), or change `runs-on`",
                labels_text(required),
                flag.join(",")
            )
        })
        .collect()
}

/// `{os: linux, size: large}`.
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    let kv: Vec<String> = labels.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", kv.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn agent<'a>(name: &'a str, l: &'a BTreeMap<String, String>) -> AgentSeen<'a> {
        AgentSeen {
            name,
            labels: l,
            pool: "default",
            executor: Executor::Host,
            connected: true,
            draining: false,
            running: 0,
            max_jobs: 1,
        }
    }

    fn trusted() -> JobPlacement {
        JobPlacement::of(true, false, false, &[])
    }

    #[test]
    fn no_agent_at_all() {
        let want = labels(&[("os", "linux")]);
        let w = for_agent(&want, &trusted(), &UntrustedPolicy::default(), &[]).unwrap();
        assert_eq!(
            w,
            AgentWait::NoneConnected(
                "waiting: no agent is connected (start one with `kiln agent`, or `kiln up --agents N`)".into()
            )
        );
        // One with the labels is registered, but gone.
        let l = labels(&[("os", "linux")]);
        let gone = AgentSeen { connected: false, ..agent("old-1", &l) };
        let w = for_agent(&want, &trusted(), &UntrustedPolicy::default(), &[gone]).unwrap();
        assert_eq!(
            w.text(),
            "waiting: no agent is connected (start one with `kiln agent`, or `kiln up --agents N`); old-1 has these \
             labels but is not connected"
        );
    }

    #[test]
    fn no_connected_agent_has_the_labels_names_the_labels_there_are() {
        let want = labels(&[("os", "ubuntu-latest")]);
        let (l1, l2) = (labels(&[("arch", "amd64"), ("os", "linux")]), labels(&[("os", "ubuntu-latest")]));
        let agents = [agent("local-1", &l1), AgentSeen { connected: false, ..agent("ub-1", &l2) }];
        let w = for_agent(&want, &trusted(), &UntrustedPolicy::default(), &agents).unwrap();
        assert_eq!(
            w,
            AgentWait::NoLabels(
                "waiting: no connected agent has labels {os: ubuntu-latest}; agents: local-1 {arch: amd64, os: linux}; \
                 ub-1 has these labels but is not connected"
                    .into()
            )
        );
    }

    #[test]
    fn placement_keeps_the_matching_agents_from_it() {
        let want = labels(&[]);
        let l = labels(&[("os", "linux")]);
        let untrusted = JobPlacement::of(false, false, false, &[]);
        let w = for_agent(&want, &untrusted, &UntrustedPolicy::default(), &[agent("local-1", &l)]).unwrap();
        assert_eq!(
            w.text(),
            "waiting for an agent that takes untrusted work (pools: forks, container executor); none connected \
             (connected: local-1 (pool default, host executor))"
        );
        assert!(matches!(w, AgentWait::Placement(_)));
    }

    #[test]
    fn every_agent_that_can_run_it_is_busy() {
        let want = labels(&[("os", "linux")]);
        let l = labels(&[("os", "linux")]);
        let other = labels(&[("os", "mac")]);
        let agents = [
            AgentSeen { running: 1, ..agent("a1", &l) },
            AgentSeen { draining: true, ..agent("a2", &l) },
            agent("mac-1", &other),
        ];
        let w = for_agent(&want, &trusted(), &UntrustedPolicy::default(), &agents).unwrap();
        assert_eq!(
            w,
            AgentWait::Busy("waiting: every agent that can run it is busy (a1 1/1 jobs, a2 draining)".into())
        );
        // One with room: no wait to speak of.
        let agents = [AgentSeen { running: 1, max_jobs: 2, ..agent("a1", &l) }];
        assert_eq!(for_agent(&want, &trusted(), &UntrustedPolicy::default(), &agents), None);
    }

    #[test]
    fn acceptance_warns_of_labels_no_registered_agent_has() {
        let (linux, ubuntu, none) = (labels(&[("os", "linux")]), labels(&[("os", "ubuntu-latest")]), labels(&[]));
        let later = labels(&[("os", "${{ needs.pick.outputs.os }}")]);
        let registered = [("a1", &linux), ("a2", &linux), ("mac-1", &labels(&[("os", "mac")]))];
        let registered: Vec<(&str, &BTreeMap<String, String>)> = registered.to_vec();
        let jobs = [("lint", &linux), ("t (3.10)", &ubuntu), ("t (3.11)", &ubuntu), ("any", &none), ("pick", &later)];
        assert_eq!(
            unmatched_labels(&jobs, &registered),
            ["jobs `t (3.10)`, `t (3.11)` need an agent with labels {os: ubuntu-latest}, and no registered agent has \
              them (registered agents have: {os: linux} (a1, a2); {os: mac} (mac-1)); the run waits until one \
              connects (`kiln agent --labels os=ubuntu-latest`), or change `runs-on`"]
        );
        let one = [("build", &ubuntu)];
        assert_eq!(
            unmatched_labels(&one, &registered[..1]),
            ["job `build` needs an agent with labels {os: ubuntu-latest}, and no registered agent has them \
              (registered agents have: {os: linux} (a1)); the run waits until one connects (`kiln agent --labels \
              os=ubuntu-latest`), or change `runs-on`"]
        );
        assert!(unmatched_labels(&jobs[..1], &registered).is_empty(), "a1 has them");
        assert!(unmatched_labels(&jobs, &[]).is_empty(), "no agent registered: nothing to judge against");
    }

    #[test]
    fn a_pending_job_says_what_it_waits_for_first() {
        let held = Some("waiting for concurrency group `deploy`");
        let needs = [("build", JobStatus::Running), ("lint", JobStatus::Ready)];
        let group = Some("waiting for concurrency group `db`");
        let slot = Some(("test", 2));
        assert_eq!(for_pending(held, &needs, group, slot).unwrap(), "waiting for concurrency group `deploy`");
        assert_eq!(for_pending(None, &needs, group, slot).unwrap(), "waiting for needs: build (running), lint (ready)");
        assert_eq!(for_pending(None, &[], group, slot).unwrap(), "waiting for concurrency group `db`");
        assert_eq!(
            for_pending(None, &[], None, slot).unwrap(),
            "waiting for a free slot: matrix `test` runs at most 2 at once (`max-parallel`)"
        );
        assert_eq!(for_pending(None, &[], None, None), None);
        assert_eq!(for_pending(Some("odd"), &[], None, None).unwrap(), "waiting for the run's concurrency group");
    }
}
