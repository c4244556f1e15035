//! The claim's eligibility (spec 000 §7, invariant 2): run active, job
//! ready, dispatch generation matches, predecessors decided, retry backoff
//! over, the agent's session current, its labels compatible and its
//! capacity free → a new attempt with epoch = previous + 1 and a lease in
//! database time.
//!
//! Invariant protected: a queue delivery never grants ownership by itself;
//! duplicates and stale deliveries are absorbed (refused without effect).
//!
//! Placement (invariant 12) is part of compatibility: an untrusted job is
//! claimed only by an agent configured for untrusted work, a job with
//! `image:` only by a container executor, a job handed secrets or an
//! identity token only by an agent of a pool the repository allows
//! ([`placement_refusal`]). A job no connected agent may take waits, and
//! says why ([`waiting_reason`]).

use crate::job::{JobEvent, JobStatus};
use crate::run::{RunEvent, RunStatus};
use std::collections::BTreeMap;

/// The executor an agent runs jobs with, as it said when it registered.
/// An agent that did not say (an older agent) counts as a host executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Executor {
    /// Processes on the agent's machine.
    Host,
    /// A fresh container per attempt.
    Container,
}

crate::string_enum!(Executor { Host => "host", Container => "container" });

impl Executor {
    /// What an agent reported (`None`, or anything unknown: host).
    pub fn reported(s: Option<&str>) -> Executor {
        match s.map(str::trim) {
            Some("container") => Executor::Container,
            _ => Executor::Host,
        }
    }
}

/// Which agents may take untrusted work: those of `pools` (the server's
/// `--untrusted-pools`) that run a container executor, or, with
/// `host_executor` (`--untrusted-on-host-agents`, unsafe), any executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntrustedPolicy {
    pub pools: Vec<String>,
    pub host_executor: bool,
}

/// The pool `--untrusted-pools` names by default.
pub const DEFAULT_UNTRUSTED_POOL: &str = "forks";

impl Default for UntrustedPolicy {
    fn default() -> Self {
        UntrustedPolicy { pools: vec![DEFAULT_UNTRUSTED_POOL.to_string()], host_executor: false }
    }
}

impl UntrustedPolicy {
    /// Whether an agent of `pool` running `executor` may take untrusted work.
    pub fn takes_untrusted(&self, pool: &str, executor: Executor) -> bool {
        self.pools.iter().any(|p| p == pool) && (executor == Executor::Container || self.host_executor)
    }

    /// `pools: forks, container executor` (what an agent needs).
    pub fn describe(&self) -> String {
        let pools = if self.pools.is_empty() { "none".to_string() } else { self.pools.join(", ") };
        if self.host_executor {
            format!("pools: {pools}, any executor")
        } else {
            format!("pools: {pools}, container executor")
        }
    }
}

/// What a job asks of the agent that runs it (invariant 12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobPlacement {
    /// The run is untrusted.
    pub untrusted: bool,
    /// The job needs a container executor: it names an `image:` (a
    /// reference or a Dockerfile), or caches an absolute path.
    pub container: bool,
    /// The job caches an absolute path (`cache.paths: [/root/.m2]`): only a
    /// container can mount a directory of its own there (issue 40, item 9;
    /// a host step would write into the agent's machine).
    pub absolute_cache: bool,
    /// Only this agent (by name) holds the image an earlier attempt built
    /// without a build registry: the job's retries go to it alone (issue
    /// 40, item 7).
    pub pinned_agent: Option<String>,
    /// The job is handed secrets or an identity token: only an agent of
    /// one of these pools (the repository's secret pools) may run it.
    /// `None`: any pool.
    pub credential_pools: Option<Vec<String>>,
}

impl JobPlacement {
    /// From the run's trust and the job's definition: only a trusted run
    /// is handed the secrets (or the identity token) a job asks for, so
    /// only then does the pool matter.
    pub fn of(trusted: bool, image: bool, wants_credentials: bool, secret_pools: &[String]) -> JobPlacement {
        JobPlacement {
            untrusted: !trusted,
            container: image,
            credential_pools: (trusted && wants_credentials).then(|| secret_pools.to_vec()),
            absolute_cache: false,
            pinned_agent: None,
        }
    }

    /// Only agent `name` holds the job's built image.
    pub fn pinned_to(mut self, name: Option<String>) -> JobPlacement {
        self.pinned_agent = name;
        self
    }

    /// The job caches an absolute path: it needs a container executor too.
    pub fn with_absolute_cache(mut self, absolute: bool) -> JobPlacement {
        self.absolute_cache = absolute;
        self.container |= absolute;
        self
    }
}

/// Which placement rule keeps an agent from a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementRefusal {
    /// The run is untrusted and the agent does not take untrusted work.
    Untrusted,
    /// The job has `image:` and the agent runs a host executor.
    Container,
    /// The job is handed secrets or an identity token and the agent's pool
    /// is not one the repository allows.
    CredentialPool,
    /// The job's built image is only in another agent's engine.
    PinnedAgent,
}

/// The placement rule: `None` when an agent of `pool` running `executor`
/// may run the job.
pub fn placement_refusal(
    job: &JobPlacement,
    name: &str,
    pool: &str,
    executor: Executor,
    policy: &UntrustedPolicy,
) -> Option<PlacementRefusal> {
    if job.untrusted && !policy.takes_untrusted(pool, executor) {
        return Some(PlacementRefusal::Untrusted);
    }
    if job.container && executor != Executor::Container {
        return Some(PlacementRefusal::Container);
    }
    if job.credential_pools.as_ref().is_some_and(|pools| !pools.iter().any(|p| p == pool)) {
        return Some(PlacementRefusal::CredentialPool);
    }
    if job.pinned_agent.as_deref().is_some_and(|pinned| pinned != name) {
        return Some(PlacementRefusal::PinnedAgent);
    }
    None
}

/// What the job waits for, as a phrase: `an agent that takes untrusted
/// work (pools: forks, container executor)`, joined with `and`.
pub fn placement_needs(job: &JobPlacement, policy: &UntrustedPolicy) -> Vec<String> {
    let mut needs = vec![];
    if job.untrusted {
        needs.push(format!("takes untrusted work ({})", policy.describe()));
    } else if job.container && job.absolute_cache {
        needs.push(
            "runs a container executor (the job caches an absolute path, which only a container can give it)"
                .to_string(),
        );
    } else if job.container {
        needs.push("runs a container executor (the job has `image:`)".to_string());
    }
    if let Some(pools) = &job.credential_pools {
        let pools = if pools.is_empty() { "none".to_string() } else { pools.join(", ") };
        needs.push(format!("is of a pool the repository hands secrets and identity tokens to ({pools})"));
    }
    if let Some(agent) = &job.pinned_agent {
        needs.push(format!(
            "is {agent}, whose engine alone holds the image an earlier attempt built (with kiln server \
             --build-registry any agent pulls it)"
        ));
    }
    needs
}

/// Why a ready job waits, given the connected agents whose labels match
/// its `runs-on` (name, pool, executor): `None` when one of them may run
/// it (it is busy, or about to claim it).
pub fn waiting_reason(
    job: &JobPlacement,
    policy: &UntrustedPolicy,
    matching: &[(&str, &str, Executor)],
) -> Option<String> {
    if matching.iter().any(|(name, pool, executor)| placement_refusal(job, name, pool, *executor, policy).is_none()) {
        return None;
    }
    let needs = placement_needs(job, policy);
    let connected: Vec<String> =
        matching.iter().map(|(name, pool, executor)| format!("{name} (pool {pool}, {executor} executor)")).collect();
    Some(format!(
        "waiting for an agent that {}; none connected{}",
        needs.join(" and "),
        if connected.is_empty() { String::new() } else { format!(" (connected: {})", connected.join(", ")) }
    ))
}

/// The claiming agent, as its (locked) row stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAgent<'a> {
    /// The claim names the agent's current session.
    pub session_current: bool,
    pub labels: &'a BTreeMap<String, String>,
    /// Its name (a job whose built image only one agent holds goes to it).
    pub name: &'a str,
    /// The pool of its join token, and its executor.
    pub pool: &'a str,
    pub executor: Executor,
    /// Attempts of the session still running, and how many it may run.
    /// `None`: the caller admits capacity atomically with creating the
    /// attempt (the store's insert counts the session's running attempts in
    /// the same statement, see [`admits`]); the verdict then assumes room.
    pub running: Option<u32>,
    pub max_jobs: u32,
}

/// Everything the claim decides on, read under the run, job and agent locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFacts<'a> {
    pub run: RunStatus,
    pub job: JobStatus,
    pub dispatch_generation: i64,
    /// The generation the delivery carried.
    pub requested_generation: i64,
    /// Needs of the job that have not finished (defensive: readiness already
    /// implies none; which results let it run was its `if:`).
    pub needs_unfinished: usize,
    /// Retry backoff: not claimable before this (database time).
    pub next_attempt_at: Option<i64>,
    pub now: i64,
    pub current_epoch: i64,
    /// The job's `runs-on` labels.
    pub required_labels: &'a BTreeMap<String, String>,
    /// What the job asks of its agent beyond labels, and which agents take
    /// untrusted work.
    pub placement: &'a JobPlacement,
    pub untrusted: &'a UntrustedPolicy,
    /// `None`: no such agent.
    pub agent: Option<ClaimAgent<'a>>,
    pub lease_ttl_ms: i64,
}

/// Why a claim is refused, in the order the checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefusal {
    /// The job is not ready (claimed already, finished, pending).
    NotReady,
    /// The delivery carried an older dispatch generation.
    StaleGeneration,
    /// The run is cancelling or finished.
    RunInactive,
    NeedsUnfinished,
    /// Its retry backoff has not passed.
    BackingOff,
    /// An error, not an absorbed delivery: no such agent (404).
    UnknownAgent,
    /// An error: the agent's session was replaced (409 stale).
    SessionReplaced,
    /// The agent lacks a label the job requires.
    Labels,
    /// The agent may not run the job (trust, isolation or secret pool).
    Placement(PlacementRefusal),
    /// The agent's session runs as many attempts as it may.
    Capacity,
}

impl ClaimRefusal {
    /// Refusals the caller reports as errors; the others are an absorbed
    /// (stale, duplicate, or not yet admissible) delivery: `Ok(None)`.
    pub fn is_error(self) -> bool {
        matches!(self, ClaimRefusal::UnknownAgent | ClaimRefusal::SessionReplaced)
    }
}

/// A granted claim: the new attempt and the statuses it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimGrant {
    pub epoch: i64,
    pub lease_deadline: i64,
    pub job: JobStatus,
    pub run: RunStatus,
}

/// The checks on the locked run and job alone, in the claim's order: a
/// caller may run them before reading anything else (the predecessors, the
/// agent) and stop there.
pub fn check_delivery(
    run: RunStatus,
    job: JobStatus,
    dispatch_generation: i64,
    requested_generation: i64,
) -> Result<(), ClaimRefusal> {
    if !job.can_claim() {
        return Err(ClaimRefusal::NotReady);
    }
    if dispatch_generation != requested_generation {
        return Err(ClaimRefusal::StaleGeneration);
    }
    if !run.can_claim() {
        return Err(ClaimRefusal::RunInactive);
    }
    Ok(())
}

/// Capacity admission: a session running `running` attempts may start
/// another while it runs fewer than `max_jobs`.
pub fn admits(running: u32, max_jobs: u32) -> bool {
    running < max_jobs
}

/// Every label the job requires, with the same value ([`label_eq`]).
pub fn labels_match(required: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    required.iter().all(|(k, v)| have.get(k).is_some_and(|h| label_eq(k, v, h)))
}

/// Whether a label's wanted value is the agent's: equal, or for `arch` the
/// same architecture under another common name (`amd64` = `x86_64` =
/// `x86-64`, `arm64` = `aarch64`), as the image resolver treats them.
pub fn label_eq(key: &str, want: &str, have: &str) -> bool {
    fn arch(v: &str) -> &str {
        match v {
            "x86_64" | "x86-64" => "amd64",
            "aarch64" => "arm64",
            v => v,
        }
    }
    want == have || (key == "arch" && arch(want) == arch(have))
}

/// The claim rule.
pub fn decide_claim(f: &ClaimFacts<'_>) -> Result<ClaimGrant, ClaimRefusal> {
    check_delivery(f.run, f.job, f.dispatch_generation, f.requested_generation)?;
    if f.needs_unfinished > 0 {
        return Err(ClaimRefusal::NeedsUnfinished);
    }
    if f.next_attempt_at.is_some_and(|t| t > f.now) {
        return Err(ClaimRefusal::BackingOff);
    }
    let agent = f.agent.as_ref().ok_or(ClaimRefusal::UnknownAgent)?;
    if !agent.session_current {
        return Err(ClaimRefusal::SessionReplaced);
    }
    // Compatibility is part of the claim, not only of queue routing.
    if !labels_match(f.required_labels, agent.labels) {
        return Err(ClaimRefusal::Labels);
    }
    if let Some(why) = placement_refusal(f.placement, agent.name, agent.pool, agent.executor, f.untrusted) {
        return Err(ClaimRefusal::Placement(why));
    }
    if agent.running.is_some_and(|running| !admits(running, agent.max_jobs)) {
        return Err(ClaimRefusal::Capacity);
    }
    let job = f.job.transition(JobEvent::Claimed).expect("a ready job is claimable");
    let run =
        if f.run == RunStatus::Queued { f.run.transition(RunEvent::Started).expect("queued starts") } else { f.run };
    Ok(ClaimGrant { epoch: f.current_epoch + 1, lease_deadline: f.now + f.lease_ttl_ms, job, run })
}

/// A retried claim request (its acknowledgement was lost) returns the
/// attempt it created while that attempt is still the job's running epoch.
pub fn replay_stands(job: JobStatus, current_epoch: i64, claimed_epoch: i64) -> bool {
    current_epoch == claimed_epoch && job == JobStatus::Running
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimRefusal as R;

    #[test]
    fn arch_labels_match_their_other_common_names() {
        let l = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(labels_match(&l("arch", "amd64"), &l("arch", "x86_64")));
        assert!(labels_match(&l("arch", "x86_64"), &l("arch", "amd64")));
        assert!(labels_match(&l("arch", "arm64"), &l("arch", "aarch64")));
        assert!(!labels_match(&l("arch", "arm64"), &l("arch", "x86_64")));
        assert!(!labels_match(&l("os", "amd64"), &l("os", "x86_64")), "only `arch` has aliases");
        assert!(!labels_match(&l("arch", "amd64"), &BTreeMap::new()));
    }

    #[test]
    fn table() {
        let linux = BTreeMap::from([("os".to_string(), "linux".to_string())]);
        let linux_big =
            BTreeMap::from([("os".to_string(), "linux".to_string()), ("size".to_string(), "big".to_string())]);
        let mac = BTreeMap::from([("os".to_string(), "macos".to_string())]);
        let agent = |labels, running, session_current| ClaimAgent {
            name: "a1",
            session_current,
            labels,
            pool: "default",
            executor: Executor::Host,
            running: Some(running),
            max_jobs: 2,
        };
        let anywhere = JobPlacement::default();
        let policy = UntrustedPolicy::default();
        let untrusted = JobPlacement { untrusted: true, ..JobPlacement::default() };
        let base = ClaimFacts {
            run: RunStatus::Running,
            job: JobStatus::Ready,
            dispatch_generation: 3,
            requested_generation: 3,
            needs_unfinished: 0,
            next_attempt_at: Some(900),
            now: 1_000,
            current_epoch: 1,
            required_labels: &linux,
            placement: &anywhere,
            untrusted: &policy,
            agent: Some(agent(&linux_big, 1, true)),
            lease_ttl_ms: 30_000,
        };
        let grant = |run| Ok(ClaimGrant { epoch: 2, lease_deadline: 31_000, job: JobStatus::Running, run });
        let rows: Vec<(ClaimFacts, Result<ClaimGrant, ClaimRefusal>)> = vec![
            (base.clone(), grant(RunStatus::Running)),
            (ClaimFacts { run: RunStatus::Queued, ..base.clone() }, grant(RunStatus::Running)),
            (ClaimFacts { job: JobStatus::Running, ..base.clone() }, Err(R::NotReady)),
            (ClaimFacts { job: JobStatus::Pending, ..base.clone() }, Err(R::NotReady)),
            (ClaimFacts { requested_generation: 2, ..base.clone() }, Err(R::StaleGeneration)),
            (ClaimFacts { run: RunStatus::Cancelling, ..base.clone() }, Err(R::RunInactive)),
            (ClaimFacts { run: RunStatus::Failed, ..base.clone() }, Err(R::RunInactive)),
            (ClaimFacts { needs_unfinished: 1, ..base.clone() }, Err(R::NeedsUnfinished)),
            (ClaimFacts { next_attempt_at: Some(1_001), ..base.clone() }, Err(R::BackingOff)),
            (ClaimFacts { next_attempt_at: Some(1_000), ..base.clone() }, grant(RunStatus::Running)),
            (ClaimFacts { agent: None, ..base.clone() }, Err(R::UnknownAgent)),
            // An absorbed delivery is not an error, even from an unknown agent.
            (ClaimFacts { agent: None, requested_generation: 1, ..base.clone() }, Err(R::StaleGeneration)),
            (ClaimFacts { agent: Some(agent(&linux, 0, false)), ..base.clone() }, Err(R::SessionReplaced)),
            (ClaimFacts { agent: Some(agent(&mac, 0, true)), ..base.clone() }, Err(R::Labels)),
            (
                ClaimFacts { required_labels: &linux_big, agent: Some(agent(&linux, 0, true)), ..base.clone() },
                Err(R::Labels),
            ),
            (ClaimFacts { agent: Some(agent(&linux, 2, true)), ..base.clone() }, Err(R::Capacity)),
            // Capacity left to the caller's atomic admission.
            (
                ClaimFacts {
                    agent: Some(ClaimAgent {
                        session_current: true,
                        labels: &linux,
                        name: "a1",
                        pool: "default",
                        executor: Executor::Host,
                        running: None,
                        max_jobs: 0,
                    }),
                    ..base.clone()
                },
                grant(RunStatus::Running),
            ),
            // Placement: an untrusted job on a default-pool host agent whose
            // labels match is refused (before capacity)...
            (ClaimFacts { placement: &untrusted, ..base.clone() }, Err(R::Placement(PlacementRefusal::Untrusted))),
            (
                ClaimFacts { placement: &untrusted, agent: Some(agent(&linux, 2, true)), ..base.clone() },
                Err(R::Placement(PlacementRefusal::Untrusted)),
            ),
            // ... and granted to a container agent of the forks pool.
            (
                ClaimFacts {
                    placement: &untrusted,
                    agent: Some(ClaimAgent { pool: "forks", executor: Executor::Container, ..agent(&linux, 0, true) }),
                    ..base.clone()
                },
                grant(RunStatus::Running),
            ),
        ];
        for (facts, want) in rows {
            assert_eq!(decide_claim(&facts), want, "{facts:?}");
        }
        assert!(R::UnknownAgent.is_error() && R::SessionReplaced.is_error() && !R::Capacity.is_error());
    }

    #[test]
    fn placement_table() {
        use Executor::{Container, Host};
        use PlacementRefusal as P;
        let policy = UntrustedPolicy::default();
        let unsafe_host = UntrustedPolicy { pools: vec!["forks".into(), "pr".into()], host_executor: true };
        let default_pools = vec!["default".to_string()];
        // (trusted, image, credentials, agent pool, executor, policy) → refusal
        let rows = [
            (true, false, false, "default", Host, &policy, None),
            (true, false, false, "forks", Container, &policy, None),
            // Untrusted: only agents of the configured pools, and only
            // container executors unless the unsafe opt-in says otherwise.
            (false, false, false, "default", Host, &policy, Some(P::Untrusted)),
            (false, false, false, "default", Container, &policy, Some(P::Untrusted)),
            (false, false, false, "forks", Host, &policy, Some(P::Untrusted)),
            (false, false, false, "forks", Container, &policy, None),
            (false, false, false, "pr", Host, &unsafe_host, None),
            (false, false, false, "default", Host, &unsafe_host, Some(P::Untrusted)),
            // An untrusted run is handed no credentials: no pool rule.
            (false, false, true, "forks", Container, &policy, None),
            // `image:` never on a host executor, whatever the trust.
            (true, true, false, "default", Host, &policy, Some(P::Container)),
            (true, true, false, "default", Container, &policy, None),
            (false, true, false, "pr", Host, &unsafe_host, Some(P::Container)),
            // Secrets or an identity token: only the repository's pools.
            (true, false, true, "forks", Container, &policy, Some(P::CredentialPool)),
            (true, false, true, "default", Host, &policy, None),
            (true, true, true, "forks", Host, &policy, Some(P::Container)),
        ];
        for (trusted, image, creds, pool, executor, policy, want) in rows {
            let job = JobPlacement::of(trusted, image, creds, &default_pools);
            assert_eq!(placement_refusal(&job, "a1", pool, executor, policy), want, "{job:?} on {pool}/{executor}");
        }
        assert_eq!(Executor::reported(None), Host);
        assert_eq!(Executor::reported(Some("container")), Container);
        assert_eq!(Executor::reported(Some("microvm")), Host, "unknown: the conservative guess");
    }

    #[test]
    fn a_waiting_job_says_what_it_waits_for() {
        use Executor::{Container, Host};
        let policy = UntrustedPolicy::default();
        let fork = JobPlacement::of(false, false, false, &[]);
        let why = waiting_reason(&fork, &policy, &[("a1", "default", Host)]).unwrap();
        assert_eq!(
            why,
            "waiting for an agent that takes untrusted work (pools: forks, container executor); none connected \
             (connected: a1 (pool default, host executor))"
        );
        assert_eq!(waiting_reason(&fork, &policy, &[("a1", "default", Host), ("pr", "forks", Container)]), None);
        let image = JobPlacement::of(true, true, false, &[]);
        assert!(waiting_reason(&image, &policy, &[("a1", "default", Host)]).unwrap().contains("container executor"));
        let secrets = JobPlacement::of(true, false, true, &["default".to_string()]);
        // Issue 40, item 9: an absolute cache path is a container's to give.
        let cache = JobPlacement::of(true, false, false, &[]).with_absolute_cache(true);
        assert_eq!(placement_refusal(&cache, "a1", "default", Host, &policy), Some(PlacementRefusal::Container));
        assert_eq!(placement_refusal(&cache, "a1", "default", Container, &policy), None);
        // Issue 40, item 7: a built image only one agent holds pins the job to it.
        let pinned = JobPlacement::of(true, true, false, &[]).pinned_to(Some("builder".into()));
        assert_eq!(
            placement_refusal(&pinned, "other", "default", Container, &policy),
            Some(PlacementRefusal::PinnedAgent)
        );
        assert_eq!(placement_refusal(&pinned, "builder", "default", Container, &policy), None);
        let why = waiting_reason(&pinned, &policy, &[("other", "default", Container)]).unwrap();
        assert!(why.contains("is builder, whose engine alone holds the image"), "{why}");
        let why = waiting_reason(&cache, &policy, &[("a1", "default", Host)]).unwrap();
        assert!(why.contains("caches an absolute path"), "{why}");
        let why = waiting_reason(&secrets, &policy, &[("pr", "forks", Container)]).unwrap();
        assert!(why.contains("hands secrets and identity tokens to (default)"), "{why}");
    }

    proptest::proptest! {
        /// A granted claim never breaks a placement rule, and a refusal
        /// names the first rule broken.
        #[test]
        fn grants_follow_placement(
            trusted: bool, image: bool, creds: bool, in_secret_pool: bool, in_untrusted_pool: bool,
            container: bool, host_opt_in: bool,
        ) {
            let labels = BTreeMap::new();
            let pool = "p";
            let secret_pools = if in_secret_pool { vec![pool.to_string()] } else { vec!["default".to_string()] };
            let policy = UntrustedPolicy {
                pools: if in_untrusted_pool { vec![pool.to_string()] } else { vec!["forks".to_string()] },
                host_executor: host_opt_in,
            };
            let executor = if container { Executor::Container } else { Executor::Host };
            let placement = JobPlacement::of(trusted, image, creds, &secret_pools);
            let facts = ClaimFacts {
                run: RunStatus::Running,
                job: JobStatus::Ready,
                dispatch_generation: 1,
                requested_generation: 1,
                needs_unfinished: 0,
                next_attempt_at: None,
                now: 0,
                current_epoch: 0,
                required_labels: &labels,
                placement: &placement,
                untrusted: &policy,
                agent: Some(ClaimAgent {
                    session_current: true,
                    labels: &labels,
                    name: "a1",
                    pool,
                    executor,
                    running: Some(0),
                    max_jobs: 1,
                }),
                lease_ttl_ms: 1,
            };
            let granted = decide_claim(&facts).is_ok();
            let untrusted_ok = trusted || (in_untrusted_pool && (container || host_opt_in));
            let image_ok = !image || container;
            let creds_ok = !(trusted && creds) || in_secret_pool;
            proptest::prop_assert_eq!(granted, untrusted_ok && image_ok && creds_ok);
            if !untrusted_ok {
                proptest::prop_assert_eq!(decide_claim(&facts), Err(R::Placement(PlacementRefusal::Untrusted)));
            }
        }
    }

    #[test]
    fn delivery_table() {
        // (run, job, generation, requested) → the first refusal
        let rows = [
            (RunStatus::Running, JobStatus::Ready, 2, 2, Ok(())),
            (RunStatus::Queued, JobStatus::Ready, 2, 2, Ok(())),
            (RunStatus::Running, JobStatus::Running, 2, 2, Err(R::NotReady)),
            (RunStatus::Cancelling, JobStatus::Pending, 2, 1, Err(R::NotReady)),
            (RunStatus::Cancelling, JobStatus::Ready, 2, 1, Err(R::StaleGeneration)),
            (RunStatus::Cancelling, JobStatus::Ready, 2, 2, Err(R::RunInactive)),
        ];
        for (run, job, generation, requested, want) in rows {
            assert_eq!(check_delivery(run, job, generation, requested), want, "{run} {job}");
        }
        assert!(admits(1, 2) && !admits(2, 2) && !admits(0, 0));
    }

    #[test]
    fn replay_table() {
        let rows = [
            (JobStatus::Running, 2, 2, true),
            (JobStatus::Running, 3, 2, false),
            (JobStatus::Success, 2, 2, false),
            (JobStatus::Ready, 2, 2, false),
        ];
        for (job, current, claimed, want) in rows {
            assert_eq!(replay_stands(job, current, claimed), want);
        }
    }
}
