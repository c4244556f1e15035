//! One attempt: (job_id, epoch) of one assignment, from checkout to completion.
//!
//! Order: heartbeat and log shipper start → checkout → restore declared
//! inputs → steps in order, stop at the first failure → (all steps passed)
//! freeze and upload declared outputs, seal each → every log chunk
//! acknowledged → `complete` → clean up. Heartbeats run throughout, uploads
//! included. A stop reason (see [`crate::control::Stop`]) kills the sandbox at any
//! point; a fenced attempt publishes nothing more — no chunk, no completion.

use crate::ExecutorKind;
use crate::artifacts::{Transfer, publish_all, restore_all};
use crate::checkout::Mirrors;
use crate::control::{Control, Stage, Stop, backoff};
use crate::heartbeat::heartbeat_loop;
use crate::logs::{LogConfig, LogStreamer, Stream};
use crate::ran::Ran;
use crate::ratelimit::RateLimiter;
use crate::session::Beats;
use crate::warm::{Warm, WarmKey};
use kiln_api::AttemptOutcome;
use kiln_api::client::Client;
use kiln_api::types::{Assignment, Completion};
use kiln_sandbox::{
    ContainerConfig, ContainerExecutor, Engine, EngineError, Executor, HostConfig, HostExecutor, Limits, PinnedImage,
    StepEvent, StepRequest, remove_tree,
};
use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

/// Spec 004's stage timeouts for preparing and for finalizing.
pub(crate) const DEFAULT_STAGE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

#[derive(Clone)]
pub(crate) struct AttemptContext {
    pub client: Client,
    pub work_dir: PathBuf,
    /// Root of the attempts' sandboxes (see [`crate::layout`]).
    pub sandbox_dir: PathBuf,
    /// Sandboxes are left in place when their attempt ends (`AgentConfig::keep_sandboxes`).
    pub keep_sandboxes: bool,
    /// Who runs host steps, in which namespaces.
    pub isolation: kiln_sandbox::Isolation,
    /// What host steps may not see (see `AgentConfig::hide_paths`).
    pub hide: Arc<Vec<PathBuf>>,
    /// Host executor: what every step gets from this machine (`--env`,
    /// `--path`, the step user's toolchains).
    pub step_env: Arc<crate::step_env::StepEnv>,
    pub mirrors: Arc<Mirrors>,
    pub executor: ExecutorKind,
    /// The container engine (container executor only).
    pub engine: Option<Engine>,
    /// Host executor: where jobs' services run (see `AgentConfig`).
    pub services_engine: Option<String>,
    /// Containers are labelled `kiln.agent=<agent_name>`.
    pub agent_name: String,
    /// SIGTERM → SIGKILL grace of the sandbox.
    pub kill_grace: Duration,
    /// Cache operation timeout and node-local budget.
    pub cache: crate::caches::Settings,
    /// Agent-wide upload rate limit, shared by all attempts.
    pub limiter: RateLimiter,
    /// Stage timeouts (`None`: unlimited).
    pub prepare_timeout: Option<Duration>,
    pub finalize_timeout: Option<Duration>,
    /// Operation timeouts.
    pub ops: crate::OpTimeouts,
    /// "Heartbeat now" triggers of the running attempts (session stream).
    pub beats: Beats,
    /// Per-attempt stdout + stderr limit in bytes.
    pub log_limit: u64,
    /// Per-attempt stdout + stderr bytes per second.
    pub log_rate_limit: Option<u64>,
    /// Unshipped log bytes kept in memory before spilling to disk.
    pub log_buffer: usize,
    /// Largest on-disk log spool per attempt.
    pub log_spool_limit: u64,
    /// The agent's own `/metrics` series.
    pub metrics: Arc<crate::metrics::AgentMetrics>,
    /// Warm containers (container executor only; see [`crate::warm`]).
    pub warm: Option<Arc<crate::warm::WarmPool>>,
    /// The job slots' kept sandboxes (host executor with PID namespaces;
    /// see [`crate::slots`]).
    pub slots: Arc<crate::slots::Slots>,
}

/// When an attempt's phases began and ended (its telemetry).
#[derive(Default)]
struct Phases {
    image: Option<Duration>,
    steps_started: Option<std::time::Instant>,
    steps_done: Option<std::time::Instant>,
    /// When the sandbox was handed to the steps: what changed in the
    /// workspace from then on is the job's (see [`crate::kept`]).
    fence: Option<crate::kept::Fence>,
    /// The sandbox's cleanup failed: something of the job may still run.
    sandbox_dirty: bool,
    /// What that cleanup could not do (sent with the completion or the
    /// release: issue 40, item 5).
    cleanup_error: Option<String>,
    /// Test ids whose failures were let through as quarantined (issue 43).
    quarantined: Vec<String>,
    /// Test report files staged for the completion (issue 43).
    reports_staged: u32,
}

/// Where an attempt's sandbox is.
struct SandboxDir {
    path: PathBuf,
    /// A job slot's kept sandbox (see [`crate::slots`]).
    slot: bool,
    /// It exists already, reset after the slot's last attempt.
    reused: bool,
    /// The tree ([`tree_key`]) its workspace was brought to then.
    tree: Option<String>,
    /// The agent's copy of a slot workspace's index (see [`crate::kept`]).
    index: Option<PathBuf>,
    /// Its workspace is the step user's but for `.git` (see [`crate::kept`]).
    owned: bool,
}

/// Which pristine tree a workspace holds: the run's trust, whether its
/// objects are its own ([`AttemptContext::own_objects`]), the clone URL,
/// and (last line) the commit. A kept workspace only ever goes to a job of
/// the same trust and repository.
fn tree_key(ctx: &AttemptContext, a: &Assignment) -> String {
    format!("{}\n{}\n{}\n{}", shape_key(ctx, a), ctx.own_objects(), a.clone_url, a.commit_sha)
}

/// The first line of [`tree_key`]: trust, and the checkout's shape.
fn shape_key(_ctx: &AttemptContext, a: &Assignment) -> String {
    let trust = if a.trusted { "trusted" } else { "untrusted" };
    format!("{trust} {}", crate::checkout::Shape::of(a.checkout.as_ref()).key())
}

/// The commit a kept workspace holds, when the job `a` may have it brought
/// to its own commit: `checkout: {reuse: true}` (only ever sent for a
/// trusted run), and the same trust, objects and repository.
fn reusable_from<'t>(ctx: &AttemptContext, a: &Assignment, tree: Option<&'t str>) -> Option<&'t str> {
    if !a.checkout.as_ref().is_some_and(|k| k.reuse) || !a.trusted {
        return None;
    }
    let (shape, sha) = tree?.rsplit_once('\n')?;
    let (mine, _) = tree_key(ctx, a).rsplit_once('\n').map(|(s, c)| (s.to_string(), c.to_string()))?;
    (shape == mine).then_some(sha)
}

impl AttemptContext {
    /// This context with a client that sends the attempt's own token: the
    /// server accepts calls on an attempt only with it (invariant 11).
    pub(crate) fn for_attempt(&self, attempt_token: &str) -> AttemptContext {
        AttemptContext { client: self.client.with_token(attempt_token), ..self.clone() }
    }

    pub(crate) fn attempts_dir(&self) -> PathBuf {
        self.work_dir.join("attempts")
    }

    pub(crate) fn pgid_dir(&self) -> PathBuf {
        self.work_dir.join("pgids")
    }

    /// The attempt's sandbox: `ws/`, `home/`, `tmp/` (the step's).
    fn sandbox_of(&self, attempt: &str) -> PathBuf {
        self.sandbox_dir.join(attempt)
    }

    /// The agent's spool for the attempt's published artifacts, beside its
    /// sandbox (same filesystem) but the agent's alone.
    fn spool_of(&self, attempt: &str) -> PathBuf {
        self.sandbox_dir.join(format!("{attempt}.spool"))
    }

    /// Whether host job slots keep their sandbox from one attempt to the
    /// next: only where every process of a job is gone once its sandbox is
    /// cleaned up (PID namespaces; see [`crate::slots`]).
    fn keeps_slots(&self) -> bool {
        !self.keep_sandboxes
            && self.executor == ExecutorKind::Host
            && self.isolation.namespaces != kiln_sandbox::Namespaces::None
    }

    /// A separate step user whose checkout must not borrow the agent's
    /// mirror objects (alternates): host executor with a root agent only.
    fn private_objects(&self) -> Option<kiln_sandbox::StepUser> {
        if self.executor == ExecutorKind::Host { self.isolation.user } else { None }
    }

    /// Whether host steps run as root (`--step-user root`, or an agent run
    /// by root on an executor without a separate step user).
    fn steps_as_root(&self) -> bool {
        match self.private_objects() {
            Some(u) => u.uid == 0,
            None => nix::unistd::geteuid().is_root(),
        }
    }

    /// Whether a host checkout gets its own object store instead of
    /// borrowing the mirror's (alternates): when its steps cannot open the
    /// mirror, run as another user ([`Self::private_objects`]) or with the
    /// agent's work dir, mirrors included, hidden by their mount namespace
    /// (any host agent with namespaces; issue 39, item 8).
    fn own_objects(&self) -> bool {
        self.private_objects().is_some()
            || (self.executor == ExecutorKind::Host && self.isolation.namespaces != kiln_sandbox::Namespaces::None)
    }
}

pub(crate) async fn run_attempt(ctx: &AttemptContext, a: Assignment, slot: u32, mut shutdown: watch::Receiver<bool>) {
    let span = tracing::info_span!(
        "attempt",
        run_id = %a.run_id,
        job = %a.job_name,
        job_id = %a.job_id,
        epoch = a.epoch,
        trace_id = tracing::field::Empty
    );
    // The attempt is a span of the run's trace, a child of its claim
    // (issue 19); its calls carry the context back to the server.
    let parent = a.traceparent.as_deref().and_then(kiln_api::trace::TraceParent::parse);
    let trace = kiln_api::trace::enter(&span, parent).to_string();
    let mut own = ctx.for_attempt(&a.attempt_token);
    own.client = own.client.with_traceparent(&trace);
    let ctx = &own;
    async move {
        let ctl = Control::new();
        let beat = ctx.beats.register();
        let hb = tokio::spawn(heartbeat_loop(
            ctx.client.clone(),
            a.job_id.clone(),
            a.epoch,
            Duration::from_millis(a.heartbeat_interval_ms),
            Duration::from_millis(a.lease_ttl_ms),
            ctl.clone(),
            beat.notify.clone(),
            ctx.metrics.clone(),
        ));
        let watcher = {
            let ctl = ctl.clone();
            let timeout = a.timeout_secs.map(Duration::from_secs);
            let (prepare, finalize) = (ctx.prepare_timeout, ctx.finalize_timeout);
            tokio::spawn(async move {
                let timer = async {
                    match timeout {
                        Some(t) => tokio::time::sleep(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = timer => ctl.stop(Stop::TimedOut),
                    _ = shutdown.wait_for(|s| *s) => ctl.stop(Stop::Shutdown),
                    _ = ctl.enforce_stage_timeouts(prepare, finalize) => {}
                    _ = ctl.stopped() => {}
                }
            })
        };
        let attempt = format!("{}-{}", a.job_id, a.epoch);
        let attempt_dir = ctx.attempts_dir().join(&attempt);
        let sandbox = if ctx.keeps_slots() {
            let (path, reused, tree, owned) = ctx.slots.take(slot);
            let index = ctx.work_dir.join("kept-index").join(format!("slot-{slot}"));
            SandboxDir { path, slot: true, reused, tree, index: Some(index), owned }
        } else {
            let path = ctx.sandbox_of(&attempt);
            SandboxDir { path, slot: false, reused: false, tree: None, index: None, owned: false }
        };
        let logs = LogStreamer::start(
            ctx.client.clone(),
            a.job_id.clone(),
            a.epoch,
            ctl.clone(),
            LogConfig {
                max_bytes: ctx.log_limit,
                rate_limit: ctx.log_rate_limit,
                max_buffered: ctx.log_buffer,
                spool_dir: Some(attempt_dir.join("log-spool")),
                max_spool: ctx.log_spool_limit,
                metrics: Some(ctx.metrics.clone()),
                ..LogConfig::default()
            },
            // The shard capability is masked like a secret.
            crate::mask::Masker::new(
                a.secrets.values().map(String::as_str).chain(Some(a.shard_token.as_str()).filter(|t| !t.is_empty())),
            ),
        );

        let t0 = std::time::Instant::now();
        let (mut outputs, mut steps, mut phases) = (BTreeMap::new(), Vec::new(), Phases::default());
        let hang_watch = async {
            let secs = |s: Option<u64>| s.map(Duration::from_secs);
            logs.watch_silence(secs(a.hang_after_secs), secs(a.hang_kill_after_secs), &ctl).await;
            std::future::pending::<Ran>().await
        };
        let ran = tokio::select! {
            ran = execute(ctx, &a, &attempt, &sandbox, &ctl, &logs, &mut outputs, &mut steps, &mut phases) => ran,
            never = hang_watch => never,
        };
        let t_exec = t0.elapsed();
        for s in &steps {
            if let Some(ms) = s.duration_ms {
                ctx.metrics.steps.with_label_values(&[s.outcome.as_str()]).observe(ms as f64 / 1000.0);
            }
        }
        let quarantined = std::mem::take(&mut phases.quarantined);
        let completion = decide(&a, ran, ctl.reason(), outputs, ctx).map(|c| Completion {
            steps,
            // Only a success may stand on quarantined failures.
            quarantined: if c.outcome.is_success() { quarantined } else { Vec::new() },
            reports_staged: (phases.reports_staged > 0).then_some(phases.reports_staged),
            ..c
        });
        // What the completion says reaches every reader of the run: mask
        // the job's secrets in it as in its log (a step named after its
        // command may hold one).
        let completion = match crate::mask::Masker::new(a.secrets.values().map(String::as_str)) {
            Some(m) => completion.map(|mut c| {
                c.message = c.message.map(|t| m.mask_text(&t));
                for s in &mut c.steps {
                    s.name = m.mask_text(&s.name);
                    s.message = s.message.as_deref().map(|t| m.mask_text(t));
                }
                c
            }),
            None => completion,
        };
        logs.report_truncation();
        if let Some(c) = &completion {
            let mark = if c.outcome.is_success() { "✓" } else { "✗" };
            let detail = c.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
            logs.system(&format!("{mark} job {}{detail}", c.outcome));
        }
        let (log_truncated_bytes, log_rate_dropped_bytes, log_buffer_dropped_bytes) = logs.losses();
        let logs_complete = logs.finish().await;
        let t_logs = t0.elapsed();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let telemetry = kiln_api::AttemptTelemetry {
            prepare_ms: phases.steps_started.map(|s| ms(s - t0)),
            image_ms: phases.image.map(ms),
            command_ms: phases.steps_started.zip(phases.steps_done).map(|(s, d)| ms(d - s)),
            // Up to now: the completion is sent next.
            publish_ms: phases.steps_done.map(|d| ms(d.elapsed())),
            log_truncated_bytes,
            log_rate_dropped_bytes,
            log_buffer_dropped_bytes,
        };
        let m = &ctx.metrics;
        let observe = |phase: &str, v: Option<u64>| {
            if let Some(v) = v {
                m.phases.with_label_values(&[phase]).observe(v as f64 / 1000.0);
            }
        };
        observe("prepare", telemetry.prepare_ms);
        observe("image", telemetry.image_ms);
        observe("command", telemetry.command_ms);
        observe("publish", telemetry.publish_ms);
        // Every step was killed and the sandbox cleaned up before this: the
        // completion says so, or, for a fenced attempt, a release does, so
        // a cancel waiting for it can end (issue 40, item 5).
        let sandbox_end = kiln_api::SandboxEnd {
            evidence: sandbox_evidence(ctx).to_string(),
            cleanup_error: phases.cleanup_error.clone(),
        };
        let completion =
            completion.map(|c| Completion { telemetry: Some(telemetry), sandbox: Some(sandbox_end.clone()), ..c });
        let sent = match completion {
            Some(c) if logs_complete && !ctl.is_fenced() => complete(ctx, &a, &c, &ctl).await,
            _ => {
                tracing::warn!("attempt fenced: the sandbox was killed and nothing more is published");
                Sent::Fenced
            }
        };
        if sent == Sent::Fenced {
            release(ctx, &a, &sandbox_end).await;
        }
        let t_complete = t0.elapsed();
        hb.abort();
        drop(beat);
        watcher.abort();
        let mut gone = vec![attempt_dir, ctx.spool_of(&attempt)];
        let reset = match sandbox.slot && !phases.sandbox_dirty {
            true => reset_slot(ctx, &a, &sandbox, phases.fence).await,
            false => None,
        };
        let kept = match reset {
            Some((synced, owned)) => {
                let tree = synced.then(|| tree_key(ctx, &a));
                ctx.slots.keep(slot, &sandbox.path, tree, synced && owned).is_ok()
            }
            None => false,
        };
        if !kept && !ctx.keep_sandboxes {
            gone.push(sandbox.path);
        }
        discard(gone);
        ctx.metrics.attempt_duration.observe(t0.elapsed().as_secs_f64());
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            execute_ms = ms(t_exec),
            logs_ms = ms(t_logs - t_exec),
            complete_ms = ms(t_complete - t_logs),
            cleanup_ms = ms(t0.elapsed() - t_complete),
            "attempt phases"
        );
    }
    .instrument(span)
    .await
}

/// Moves the attempt's directories out of the way and deletes them, all in
/// the background: deleting even a small tree takes milliseconds on ext4
/// (tens to a hundred while another process syncs the same disk), which
/// must delay neither the completion nor the next claim. Every directory
/// is named after its attempt, so a new attempt never meets one of these.
/// Leftovers are removed when the agent starts.
fn discard(dirs: Vec<PathBuf>) {
    tokio::task::spawn_blocking(move || {
        for dir in dirs {
            let parent = dir.parent().unwrap_or(&dir);
            let trash = parent.join(format!(".trash-{}", uuid::Uuid::new_v4()));
            let target = if std::fs::rename(&dir, &trash).is_ok() { trash } else { dir };
            if let Err(e) = remove_tree(&target) {
                tracing::warn!(dir = %target.display(), error = %e, "cannot remove the attempt directory");
            }
        }
    });
}

/// Puts a slot's sandbox back for its next attempt (see [`crate::slots`]):
/// the workspace at the commit's pristine tree (or moved out when there is
/// none), `home/`, `tmp/` and the output file emptied, the rest moved out.
/// `Some((true, _))`: the workspace is at the commit's tree (`(_, true)`:
/// brought back in place, its entries the step user's but for `.git`);
/// `None`: the sandbox must go.
async fn reset_slot(
    ctx: &AttemptContext,
    a: &Assignment,
    sandbox_dir: &SandboxDir,
    fence: Option<crate::kept::Fence>,
) -> Option<(bool, bool)> {
    let sandbox = sandbox_dir.path.as_path();
    let ws = sandbox.join("ws");
    let root = ctx.sandbox_dir.clone();
    let (mut synced, mut owned) = (false, false);
    // The fence to look for changes since, when nothing else was done to
    // the workspace (see below).
    let mut untouched: Option<crate::kept::Fence> = None;
    if std::fs::symlink_metadata(&ws).is_ok() {
        // False: moved out, and the next attempt checks out afresh; if it
        // could not even be moved (a root step's `chattr +i`), the slot
        // starts over with a new sandbox.
        let private = ctx.own_objects();
        // A tree too big for a pristine copy is brought back in place from
        // what changed since the steps began (see `crate::kept`).
        let plain = crate::checkout::Shape::of(a.checkout.as_ref()).plain();
        let kept = match (fence, sandbox_dir.index.as_deref()) {
            // A sparse, partial or shallow workspace is not kept.
            _ if !plain => None,
            (Some(f), Some(index)) if index.is_file() && !ctx.mirrors.has_pristine(&a.clone_url, &a.commit_sha) => {
                Some((f, index))
            }
            _ => None,
        };
        owned = kept.is_some();
        synced = match kept {
            Some((f, index)) => {
                let sha = a.commit_sha.as_str();
                let owner = ctx.private_objects().map(|u| (u.uid, u.gid));
                ctx.mirrors.reset_kept(&a.clone_url, sha, sha, &ws, private, Some(f), index, owner, &root).await
            }
            None if !plain => {
                let mut doomed = crate::slots::Doomed::new(&root);
                let _ = doomed.take(&ws);
                doomed.bury();
                false
            }
            // Nothing in it changed since the steps began (looked at below,
            // with the skeleton): it is still the commit's tree its checkout
            // made, with no compare with the pristine tree and no pass over
            // its objects. Not after steps that ran as root: they could set
            // the clock back, and a change's `ctime` with it.
            None if fence.is_some() && !ctx.steps_as_root() => {
                untouched = fence;
                true
            }
            None => ctx.mirrors.sync_existing(&a.clone_url, &a.commit_sha, &ws, private, &root).await,
        };
        if !synced && stuck(&ws) {
            return None;
        }
    }
    let dir = sandbox.to_path_buf();
    let (check, skeleton_root) = (ws.clone(), root.clone());
    let reset = tokio::task::spawn_blocking(move || {
        let unchanged = untouched.map(|f| crate::kept::unchanged_since(&check, f).unwrap_or(false));
        let mut doomed = crate::slots::Doomed::new(&skeleton_root);
        let r = crate::slots::reset_skeleton(&dir, &skeleton_root, &mut doomed);
        doomed.bury();
        r.map(|()| unchanged)
    })
    .await;
    if let Ok(Ok(Some(false))) = reset {
        // Changed: brought back to the pristine tree after all.
        synced = ctx.mirrors.sync_existing(&a.clone_url, &a.commit_sha, &ws, ctx.own_objects(), &root).await;
        if !synced && stuck(&ws) {
            return None;
        }
    }
    match reset {
        Ok(Ok(_)) => Some((synced, owned)),
        other => {
            tracing::warn!(sandbox = %sandbox.display(), result = ?other.map(|r| r.err()),
                "cannot reset the job slot's sandbox; the next attempt makes a fresh one");
            None
        }
    }
}

/// A workspace that was neither brought back nor moved out (a root step's
/// `chattr +i`): the slot starts over with a new sandbox.
fn stuck(ws: &Path) -> bool {
    let left = std::fs::symlink_metadata(ws).is_ok();
    if left {
        tracing::warn!(ws = %ws.display(), "cannot move the job slot's workspace out; the next attempt makes a fresh sandbox");
    }
    left
}

/// Checkout, restore, steps, publish. The sandbox is killed as soon as a
/// stop reason is set.
// What the attempt produced goes back through the last three.
#[allow(clippy::too_many_arguments)]
async fn execute(
    ctx: &AttemptContext,
    a: &Assignment,
    attempt: &str,
    sandbox_dir: &SandboxDir,
    ctl: &Control,
    logs: &LogStreamer,
    outputs: &mut BTreeMap<String, String>,
    steps: &mut Vec<kiln_api::StepResult>,
    phases: &mut Phases,
) -> Ran {
    // Spans of the attempt's phases (issue 19): each lasts from its
    // creation to its drop.
    let prepare_span = tracing::info_span!("prepare");
    let sandbox = sandbox_dir.path.clone();
    let ws = sandbox.join("ws");
    // A warm container of the job's shape, if the agent has one: its
    // sandbox directory (bound into it) becomes the attempt's.
    let warm_key = warm_key(ctx, a);
    let mut warm = match (&ctx.warm, &warm_key) {
        (Some(pool), Some(key)) => pool.take(key).await.map(|w| (pool.clone(), w)),
        _ => None,
    };
    // The spool is made when something is published or cached.
    let _ = remove_tree(&ctx.spool_of(attempt));
    if !sandbox_dir.reused {
        let _ = remove_tree(&sandbox);
        let mut made = false;
        if let Some((pool, w)) = warm.take() {
            match std::fs::rename(&w.dir, &sandbox) {
                Ok(()) => {
                    warm = Some((pool, w));
                    made = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot move the warm container's directory; starting a fresh one");
                    pool.discard(Some(w));
                }
            }
        }
        if !made && let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&sandbox) {
            return Ran::Infra(format!("cannot create the attempt directory {}: {e}", sandbox.display()));
        }
    }
    // Until the executor adopts it, the warm container is the attempt's to remove.
    let mut warm = warm.map(|(pool, w)| {
        tracing::info!(container = %w.id, job = %a.job_id, epoch = a.epoch, "the job takes a warm container");
        WarmTaken { pool, warm: Some(Warm { dir: sandbox.clone(), ..w }) }
    });

    logs.system_note(&format!("checking out {} at {}", a.repo, a.commit_sha));
    let on_retry = |line: String| logs.system(&format!("⚠ {line}"));
    // A kept workspace brought to this very tree when the slot's last job
    // ended (nothing ran in it since) is the checkout already.
    let at_tree = sandbox_dir.tree.as_deref() == Some(tree_key(ctx, a).as_str());
    let from = if at_tree { None } else { reusable_from(ctx, a, sandbox_dir.tree.as_deref()) };
    if a.checkout.as_ref().is_some_and(|k| k.reuse) {
        match (at_tree, from, sandbox_dir.slot) {
            (true, _, _) => logs.system_note("checkout: reusing this job slot's workspace, already at the commit"),
            (_, Some(from), _) => logs.system_note(&format!(
                "checkout: reusing this job slot's workspace of {}: bringing it from {} to {} and cleaning it",
                a.repo,
                &from[..from.len().min(12)],
                &a.commit_sha[..a.commit_sha.len().min(12)]
            )),
            (_, None, false) => logs.system_note(
                "checkout: `reuse` needs a job slot that keeps its workspace (host executor with namespaces); \
                 checking out afresh",
            ),
            (_, None, true) if !a.trusted => {
                logs.system_note("checkout: `reuse` applies to trusted runs only; checking out afresh")
            }
            (_, None, true) => logs.system_note(
                "checkout: no workspace of this repository kept in this job slot yet; checking out afresh",
            ),
        }
    }
    let shape = crate::checkout::Shape::of(a.checkout.as_ref());
    if !shape.plain() && a.checkout.as_ref().is_some_and(|k| k.reuse) {
        logs.system_note(
            "checkout: `reuse` does not apply to a sparse, partial or shallow checkout; checking out afresh",
        );
    }
    let kept = sandbox_dir.index.as_deref().filter(|_| shape.plain()).map(|index| crate::checkout::Kept {
        index,
        from,
        owner: ctx.private_objects().map(|u| (u.uid, u.gid)),
    });
    let checkout = match at_tree {
        true if sandbox_dir.owned => Ok(crate::checkout::Checkout::Kept),
        true => Ok(crate::checkout::Checkout::Fresh),
        false => tokio::select! {
            r = ctx.mirrors.checkout_with(
                &a.clone_url,
                a.clone_credential.as_ref(),
                &a.commit_sha,
                &ws,
                ctx.own_objects(),
                sandbox_dir.slot.then_some(ctx.sandbox_dir.as_path()),
                kept,
                &shape,
                &on_retry,
            ) => r,
            _ = ctl.stopped() => return Ran::Stopped,
        },
    };
    // A kept workspace's entries are the step user's already (see `crate::kept`).
    let ws_owned = matches!(checkout, Ok(crate::checkout::Checkout::Kept));
    if let Err(e) = checkout {
        let msg = kiln_api::giturl::redact(&format!("checkout of {} at {} failed: {e}", a.clone_url, a.commit_sha));
        tracing::error!("{msg}");
        logs.system(&format!("✗ {msg}"));
        return match e {
            crate::checkout::CheckoutError::TimedOut { .. } => Ran::TimedOut(msg),
            _ => Ran::Infra(msg),
        };
    }

    // The checkout filled the directory the warm container has bound (not
    // one put in its place).
    if let Some(t) = warm.as_mut()
        && !t.warm.as_ref().is_some_and(|w| w.binds(&ws))
    {
        tracing::warn!("the workspace is not the warm container's any more; starting a fresh one");
        t.release();
        warm = None;
    }
    // The job's image, pinned (pulled or built from the checkout) before
    // any user step runs.
    let image = match (&ctx.executor, &ctx.engine, warm.as_ref().and(warm_key.as_ref())) {
        (ExecutorKind::Container(_), Some(_), Some(key)) => {
            // The warm container runs the pinned digest an earlier attempt
            // verified; the next job of this shape gets the next one.
            logs.system_note(&format!("using a warm container of {}", key.reference));
            phases.image = Some(Duration::ZERO);
            if let Some(pool) = &ctx.warm {
                pool.refill(key);
            }
            Some(key.reference.clone())
        }
        (ExecutorKind::Container(settings), Some(engine), _) => {
            let started = std::time::Instant::now();
            let r = prepare_image(ctx, engine, settings, a, &ws, ctl, logs).await;
            phases.image = Some(started.elapsed());
            match r {
                Ok(r) => {
                    // The next job of this shape finds its container started.
                    if let (Some(pool), Some(key)) = (&ctx.warm, &warm_key)
                        && key.reference == r
                    {
                        pool.refill(key);
                    }
                    Some(r)
                }
                Err(ran) => return ran,
            }
        }
        _ => {
            if a.image.is_some() || a.image_build.is_some() {
                logs.system_note("this agent runs steps on the host (--executor host): the job's image is not used");
            }
            None
        }
    };

    let transfer = Transfer {
        client: &ctx.client,
        a,
        ctl,
        logs,
        limiter: &ctx.limiter,
        upload_timeout: ctx.ops.upload,
        metrics: &ctx.metrics,
    };
    if let Err(ran) = restore_all(&transfer, &ws).await {
        return ran;
    }
    // The cache key names the image the steps run in (its digest or local
    // id), or the host.
    let image_id = image.clone();
    // Absolute cache paths are directories of the attempt mounted into the
    // container; the host executor has nowhere private to put them.
    let mounts_dir = image.is_some().then(|| sandbox.join("cache-mounts"));
    let mut cache = match crate::caches::restore(
        &transfer,
        ctx.cache,
        &ctx.work_dir,
        &ws,
        mounts_dir.as_deref(),
        image_id.as_deref(),
    )
    .await
    {
        Ok(c) => c,
        Err(ran) => return ran,
    };
    let mounts = cache.as_ref().map(|c| c.mounts().to_vec()).unwrap_or_default();

    // Services (healthy) before the first step; a container job joins
    // their network, a host job gets their loopback ports.
    let (container_engine, internal) = match (&ctx.executor, &image, &ctx.engine) {
        (ExecutorKind::Container(settings), Some(_), Some(engine)) => {
            (Some(engine), settings.network != kiln_sandbox::Network::Bridge)
        }
        _ => (None, false),
    };
    let mut services = match crate::services::start(
        ctx.services_engine.as_deref(),
        &ctx.agent_name,
        a,
        container_engine,
        internal,
        ctl,
        logs,
    )
    .await
    {
        Ok(s) => s,
        Err(ran) => return ran,
    };
    let with_ports;
    let a = match services.as_ref().filter(|s| !s.env.is_empty()) {
        Some(s) => {
            let mut copy = a.clone();
            copy.env.extend(s.env.clone());
            with_ports = copy;
            &with_ports
        }
        None => a,
    };

    // `$KILN_OUTPUT`: one file per attempt outside the workspace.
    let in_container = matches!((&ctx.executor, &image, &ctx.engine), (ExecutorKind::Container(_), Some(_), Some(_)));
    let output_file = if warm.is_some() {
        // Made with the warm container's directory.
        crate::outputs::prepared_for_container(&sandbox)
    } else {
        crate::outputs::prepare(&sandbox, in_container, ctx.private_objects())
    };
    let output_file = match output_file {
        Ok(f) => f,
        Err(e) => return Ran::Infra(format!("cannot create the job's output file: {e}")),
    };
    let mut mounts = mounts;
    if in_container {
        mounts.push((output_file.dir.clone(), crate::outputs::CONTAINER_DIR.to_string()));
    }
    // Issue 43: the recorded test durations `kiln tests split` reads.
    let timings = match &a.reports {
        Some(_) => match ctx.client.attempt_timings(&a.job_id, a.epoch).await {
            Ok(t) => Some(t),
            Err(e) => {
                logs.system_note(&format!("⚠ no recorded test timings ({e}); `kiln tests split` splits by count"));
                Some(kiln_api::TestTimings::default())
            }
        },
        None => None,
    };
    let with_output;
    let a = {
        let mut copy = a.clone();
        copy.env.insert("KILN_OUTPUT".into(), output_file.env_value.clone());
        // Issue 43: the quarantined tests, one id per line, for runners
        // that mute or skip them.
        if copy.reports.is_some() {
            match crate::reports::write_quarantine(&output_file.dir, &copy.quarantine) {
                Ok(_) if in_container => {
                    copy.env.insert("KILN_QUARANTINE".into(), format!("{}/quarantine", crate::outputs::CONTAINER_DIR));
                }
                Ok(path) => {
                    copy.env.insert("KILN_QUARANTINE".into(), path.display().to_string());
                }
                Err(e) => return Ran::Infra(format!("cannot write the job's quarantine file: {e}")),
            }
        }
        // `kiln tests next`: the attempt's shard capability (it allows that
        // call alone, while this attempt lives) and where to call.
        if !copy.shard_token.is_empty() {
            copy.env.insert("KILN_SHARD_TOKEN".into(), copy.shard_token.clone());
            copy.env.insert(
                "KILN_SHARDS_URL".into(),
                format!(
                    "{}/v1/jobs/{}/attempts/{}/shards/next",
                    ctx.client.base_url().trim_end_matches('/'),
                    copy.job_id,
                    copy.epoch
                ),
            );
        }
        if let Some(t) = &timings {
            match crate::reports::write_timings(&output_file.dir, t) {
                Ok(_) if in_container => {
                    copy.env.insert("KILN_TEST_TIMINGS".into(), format!("{}/timings", crate::outputs::CONTAINER_DIR));
                }
                Ok(path) => {
                    copy.env.insert("KILN_TEST_TIMINGS".into(), path.display().to_string());
                }
                Err(e) => return Ran::Infra(format!("cannot write the job's test timings file: {e}")),
            }
        }
        with_output = copy;
        &with_output
    };
    let exec: Arc<dyn Executor> = match (&ctx.executor, image, &ctx.engine) {
        (ExecutorKind::Container(settings), Some(image), Some(engine)) => {
            let labels = BTreeMap::from([
                (kiln_sandbox::LABEL_AGENT.to_string(), ctx.agent_name.clone()),
                (kiln_sandbox::LABEL_JOB.to_string(), a.job_id.clone()),
                (kiln_sandbox::LABEL_EPOCH.to_string(), a.epoch.to_string()),
                (kiln_sandbox::LABEL_RUN.to_string(), a.run_id.clone()),
            ]);
            let cfg = ContainerConfig {
                image,
                workspace: ws.clone(),
                mounts,
                labels,
                limits: Limits::for_size(a.size.as_deref()),
                network: match &services {
                    Some(s) => kiln_sandbox::Network::Named(s.network().to_string()),
                    None => settings.network.clone(),
                },
                kill_grace: ctx.kill_grace,
            };
            match warm.as_mut().and_then(WarmTaken::adopt) {
                Some(id) => Arc::new(ContainerExecutor::adopt(engine.clone(), cfg, id)),
                None => Arc::new(ContainerExecutor::new(engine.clone(), cfg)),
            }
        }
        _ => {
            let mut cfg = HostConfig::new(ws.clone(), sandbox.clone(), ctx.pgid_dir());
            cfg.kill_grace = ctx.kill_grace;
            cfg.isolation = ctx.isolation;
            cfg.hide = ctx.hide.to_vec();
            cfg.path = ctx.step_env.steps_path(&cfg.path);
            cfg.keep_dirs = sandbox_dir.slot;
            cfg.workspace_owned = ws_owned;
            Arc::new(HostExecutor::new(cfg))
        }
    };
    let killer = {
        let (exec, ctl) = (exec.clone(), ctl.clone());
        tokio::spawn(async move {
            let reason = ctl.stopped().await;
            tracing::info!(?reason, "killing the sandbox");
            exec.kill().await;
        })
    };
    tracing::debug!("checkout and restore done");
    drop(prepare_span);
    ctl.enter(Stage::Running);
    let steps_started = std::time::Instant::now();
    phases.steps_started = Some(steps_started);
    let ran = match services.as_mut() {
        None => {
            run_steps(&exec, a, &ws, ctl, logs, steps, &StepsAs::of(ctx), &mut phases.quarantined, &mut phases.fence)
                .await
        }
        Some(s) => {
            let pump = s.pump(logs);
            let steps = async {
                let ran = run_steps(
                    &exec,
                    a,
                    &ws,
                    ctl,
                    logs,
                    steps,
                    &StepsAs::of(ctx),
                    &mut phases.quarantined,
                    &mut phases.fence,
                )
                .await;
                // The job's container leaves the services' network first.
                if let Err(e) = exec.cleanup().await {
                    tracing::warn!(error = %e, "sandbox cleanup failed");
                }
                if let Some(s) = services.take() {
                    s.stop().await;
                }
                ran
            };
            tokio::join!(steps, pump).0
        }
    };
    phases.steps_done = Some(std::time::Instant::now());
    if let Some(c) = cache.as_mut() {
        c.info.steps_seconds = Some(steps_started.elapsed().as_secs_f64());
    }
    // The declared outputs, read once every step is done (an output file
    // that cannot be read as outputs fails the job: it is the job's own).
    let ran = match ran {
        Ran::Success if !a.outputs.is_empty() => {
            let secrets: Vec<&str> = a.secrets.values().map(String::as_str).collect();
            match crate::outputs::read(&output_file.host_path, &a.outputs, &secrets) {
                Ok(got) => {
                    for w in &got.warnings {
                        logs.system_note(&format!("⚠ {w}"));
                    }
                    let names: Vec<&str> = got.outputs.keys().map(String::as_str).collect();
                    if !names.is_empty() {
                        logs.system_note(&format!("outputs: {}", names.join(", ")));
                    }
                    *outputs = got.outputs;
                    Ran::Success
                }
                Err(m) => Ran::JobError(m),
            }
        }
        other => other,
    };
    tracing::debug!("steps done");
    ctl.enter(Stage::Finalizing);
    // Every step's process group (and PID namespace, where available) was
    // killed when its shell exited; cleanup kills whatever still runs, so
    // nothing of the job runs while its outputs are frozen and uploaded.
    if let Err(e) = exec.cleanup().await {
        tracing::warn!(error = %e, "sandbox cleanup failed");
        phases.sandbox_dirty = true;
        phases.cleanup_error = Some(e.to_string());
    }
    killer.abort();
    // Issue 43: the job's test reports, read now that nothing of it runs,
    // staged whatever the steps' outcome; the completion binds them.
    if let Some(spec) = &a.reports
        && ctl.reason().is_none()
        && !matches!(ran, Ran::Stopped)
    {
        match crate::reports::stage_all(&ctx.client, a, &ws, spec, ctl, logs).await {
            Ok(n) => phases.reports_staged = n,
            Err(r) => return r,
        }
    }
    if let Some(c) = cache.as_mut() {
        if matches!(ran, Ran::Success) && ctl.reason().is_none() {
            let spool = ctx.spool_of(attempt).join("cache");
            if let Err(r) = crate::caches::save(&transfer, ctx.cache, &spool, &ctx.work_dir, c).await {
                return r;
            }
        }
        crate::caches::report(&transfer, c).await;
    }
    if !matches!(ran, Ran::Success) || a.publish.is_empty() {
        return ran;
    }
    if ctl.reason().is_some() {
        return Ran::Stopped;
    }
    match publish_all(&transfer, &ws, &ctx.spool_of(attempt)).instrument(tracing::info_span!("upload")).await {
        Ok(()) => Ran::Success,
        Err(ran) => ran,
    }
}

/// What a warm container must match to serve `a`; `None` when its
/// container needs something chosen at run time (see [`crate::warm`]).
fn warm_key(ctx: &AttemptContext, a: &Assignment) -> Option<WarmKey> {
    let ExecutorKind::Container(settings) = &ctx.executor else { return None };
    ctx.warm.as_ref()?;
    if a.image_build.is_some() || a.image_error.is_some() || !a.services.is_empty() {
        return None;
    }
    if a.cache.as_ref().is_some_and(|c| c.paths.iter().any(|p| p.starts_with('/'))) {
        return None;
    }
    let (Some(image), Some(digest)) = (&a.image, &a.image_digest) else { return None };
    let pinned = PinnedImage::Registry { repository: kiln_sandbox::repository_of(image), digest: digest.clone() };
    Some(WarmKey {
        reference: pinned.reference(),
        limits: Limits::for_size(a.size.as_deref()),
        network: settings.network.clone(),
    })
}

/// A warm container an attempt took: removed with its directory unless an
/// executor adopts it.
struct WarmTaken {
    pool: Arc<crate::warm::WarmPool>,
    warm: Option<Warm>,
}

impl WarmTaken {
    /// The container's id, now the executor's to clean up.
    fn adopt(&mut self) -> Option<String> {
        self.warm.take().map(|w| w.id)
    }

    /// Gives the container up (removed in the background).
    fn release(&mut self) {
        if let Some(w) = self.warm.take() {
            // The directory is the attempt's sandbox now: the attempt removes it.
            self.pool.discard_container(w.id);
        }
    }
}

impl Drop for WarmTaken {
    fn drop(&mut self) {
        self.release();
    }
}

/// Makes the job's image available and returns the reference to run:
/// the digest pinned at acceptance (pulled unless the engine has it), or a
/// Dockerfile built from the checkout and committed to the job first (a
/// retry reuses the committed digest), or the agent's default image.
async fn prepare_image(
    ctx: &AttemptContext,
    engine: &Engine,
    settings: &crate::ContainerSettings,
    a: &Assignment,
    ws: &Path,
    ctl: &Control,
    logs: &LogStreamer,
) -> Result<String, Ran> {
    let infra = |e: EngineError| Ran::Infra(format!("cannot prepare the job's image: {e}"));
    if let Some(why) = &a.image_error {
        logs.system(&format!("✗ {why}"));
        return Err(Ran::JobError(why.clone()));
    }
    if let Some(build) = &a.image_build {
        // With the server's --build-registry, a built image lives at
        // REGISTRY/JOB_ID under its manifest digest (issue 40, item 7).
        let pushed_to = a.build_registry.as_deref().map(|r| format!("{r}/{}", a.job_id.to_ascii_lowercase()));
        if let Some(digest) = &a.image_digest {
            if let Some(repository) = &pushed_to {
                logs.system_note(&format!("using the image an earlier attempt built: {repository}@{digest}"));
                let pinned = PinnedImage::Registry { repository: repository.clone(), digest: digest.clone() };
                return ensure_pinned(ctx, engine, &pinned, ctl, logs).await;
            }
            return match engine.local_image(digest).await.map_err(infra)? {
                Some(_) => {
                    logs.system_note(&format!("using the image an earlier attempt built: {digest}"));
                    Ok(digest.clone())
                }
                None => Err(Ran::Infra(format!(
                    "the job's image {digest} was built by an earlier attempt on another agent and is not in this \
                     agent's engine; built images are not pushed to a registry (kiln server --build-registry)"
                ))),
            };
        }
        logs.system(&format!("▶ building image from {} (context {})", build.dockerfile, build.context));
        let tag = format!("localhost/kiln-build/{}:{}", a.job_id.to_ascii_lowercase(), a.epoch);
        let mut out = |b: &[u8]| logs.write(crate::logs::Stream::Stdout, b);
        // The build gets the job's own limits.
        let limits = kiln_sandbox::Limits::for_size(a.size.as_deref());
        let built = tokio::select! {
            r = crate::ran::within(ctx.ops.build, engine.build(ws, &build.dockerfile, &build.context, &tag, &settings.network, &limits, &mut out)) => r,
            _ = ctl.stopped() => return Err(Ran::Stopped),
        };
        let Some(built) = built else {
            logs.flush();
            return Err(crate::ran::op_timed_out(logs, "the image build", ctx.ops.build, "--build-timeout"));
        };
        logs.flush();
        let id = match built {
            Ok(id) => id,
            Err(EngineError::Build(m)) => {
                logs.system(&format!("✗ image build failed: {m}"));
                return Err(Ran::JobError(format!("image build failed: {m}")));
            }
            Err(e) => return Err(infra(e)),
        };
        let (mine, run_ref) = match &pushed_to {
            Some(repository) => {
                logs.system_note(&format!("pushing the built image to {repository}"));
                let push_tag = format!("epoch-{}", a.epoch);
                let pushed = tokio::select! {
                    r = crate::ran::within(ctx.ops.pull, engine.push(&id, repository, &push_tag)) => r,
                    _ = ctl.stopped() => return Err(Ran::Stopped),
                };
                let digest = match pushed {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(Ran::Infra(format!("cannot push the built image: {e}"))),
                    None => {
                        return Err(crate::ran::op_timed_out(
                            logs,
                            "pushing the built image",
                            ctx.ops.pull,
                            "--pull-timeout",
                        ));
                    }
                };
                (digest.clone(), Some(repository.clone()))
            }
            None => (id.clone(), None),
        };
        let committed = commit_image(ctx, a, &mine, run_ref.as_deref(), ctl).await?;
        if let Some(repository) = run_ref {
            if committed != mine {
                logs.system_note(&format!("an earlier build of this job was committed first: {committed}"));
            }
            logs.system(&format!("✓ image {repository}@{committed}"));
            let pinned = PinnedImage::Registry { repository, digest: committed };
            return ensure_pinned(ctx, engine, &pinned, ctl, logs).await;
        }
        if committed != id {
            // Another attempt's build won: run that one if this engine has it.
            logs.system_note(&format!("an earlier build of this job was committed first: {committed}"));
            if engine.local_image(&committed).await.map_err(infra)?.is_none() {
                return Err(Ran::Infra(format!("the job's committed image {committed} is not in this agent's engine")));
            }
        }
        logs.system(&format!("✓ image {committed}"));
        return Ok(committed);
    }
    let pinned = match (&a.image, &a.image_digest, &settings.default_image) {
        (Some(r), Some(d), _) => {
            PinnedImage::Registry { repository: kiln_sandbox::repository_of(r), digest: d.clone() }
        }
        (Some(r), None, _) => {
            logs.system_note(&format!("⚠ image {r} was not pinned at acceptance; using what the engine resolves"));
            PinnedImage::Unpinned { reference: r.clone() }
        }
        (None, _, Some(default)) => PinnedImage::Unpinned { reference: default.clone() },
        (None, _, None) => {
            return Err(Ran::JobError(
                "the job has no `image:` and this agent (--executor container) has no --default-image".into(),
            ));
        }
    };
    ensure_pinned(ctx, engine, &pinned, ctl, logs).await
}

/// Makes `pinned` available (pulled unless the engine has it) and returns
/// the reference to run. A copy whose digest does not match what was
/// pinned is the engine's trouble, not the job's (issue 40, item 7): it is
/// removed and pulled once more; a second mismatch fails the attempt as an
/// infrastructure failure (retried within the budget).
async fn ensure_pinned(
    ctx: &AttemptContext,
    engine: &Engine,
    pinned: &PinnedImage,
    ctl: &Control,
    logs: &LogStreamer,
) -> Result<String, Ran> {
    let infra = |e: EngineError| Ran::Infra(format!("cannot prepare the job's image: {e}"));
    let mut evicted = false;
    loop {
        // The engine says `pulling REF` when the image is not in its store.
        let pulled = std::sync::atomic::AtomicBool::new(false);
        let mut progress = |m: &str| {
            if m.starts_with("pulling ") {
                pulled.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            logs.system_note(m)
        };
        let started = std::time::Instant::now();
        let res = tokio::select! {
            r = crate::ran::within(ctx.ops.pull, engine.ensure_image(pinned, &mut progress)) => r,
            _ = ctl.stopped() => return Err(Ran::Stopped),
        };
        let result = match &res {
            Some(Ok(_)) if pulled.load(std::sync::atomic::Ordering::Relaxed) => "pulled",
            Some(Ok(_)) => "present",
            _ => "failed",
        };
        ctx.metrics.image_pull.with_label_values(&[result]).observe(started.elapsed().as_secs_f64());
        let Some(res) = res else {
            return Err(crate::ran::op_timed_out(logs, "pulling the job's image", ctx.ops.pull, "--pull-timeout"));
        };
        match res {
            Ok(reference) => return Ok(reference),
            Err(e @ EngineError::DigestMismatch { .. }) if !evicted => {
                logs.system_note(&format!("⚠ {e}; removing the engine's copy and pulling it again"));
                engine.remove_image(&pinned.reference()).await.map_err(infra)?;
                evicted = true;
            }
            Err(e) => return Err(infra(e)),
        }
    }
}

/// Commits a built image's digest to the job (retrying transport errors),
/// with the repository it was pushed to (none: it stays in this engine and
/// the job's retries come back here); returns the job's committed digest.
async fn commit_image(
    ctx: &AttemptContext,
    a: &Assignment,
    id: &str,
    repository: Option<&str>,
    ctl: &Control,
) -> Result<String, Ran> {
    let body = kiln_api::types::ImageCommit { digest: id.to_string(), repository: repository.map(str::to_string) };
    let mut failures = 0;
    loop {
        let res = tokio::select! {
            r = ctx.client.commit_image(&a.job_id, a.epoch, &body) => r,
            _ = ctl.stopped() => return Err(Ran::Stopped),
        };
        match res {
            Ok(c) => return Ok(c.digest),
            Err(e) if e.is_stale_epoch() => return Err(Ran::Stopped),
            Err(e) if e.is_retryable() && failures < 8 => {
                failures += 1;
                tokio::time::sleep(backoff(failures, 250, 5_000)).await;
            }
            Err(e) => return Err(Ran::Infra(format!("cannot commit the built image's digest: {e}"))),
        }
    }
}

/// How one step ended, for the log's summary.
enum StepOutcome {
    Success,
    Failure(String),
    /// Failed with `continue-on-error`: the job goes on as if it succeeded.
    Continued(String),
    /// Failed only by quarantined tests (issue 43): the job goes on.
    Quarantined(String),
    Skipped,
}

/// `results`: each step's outcome and duration, pushed as each one ends
/// (for the completion; steps never reached are left out).
// The step's outcomes and the quarantined ids are both its results.
#[allow(clippy::too_many_arguments)]
async fn run_steps(
    exec: &Arc<dyn Executor>,
    a: &Assignment,
    ws: &Path,
    ctl: &Control,
    logs: &LogStreamer,
    results: &mut Vec<kiln_api::StepResult>,
    who: &StepsAs,
    quarantined: &mut Vec<String>,
    fence: &mut Option<crate::kept::Fence>,
) -> Ran {
    if let Err(e) = exec.prepare().await {
        return Ran::Infra(format!("cannot prepare the sandbox: {e}"));
    }
    // Prepared (the workspace handed to the step user): what changes from
    // now on is the job's.
    let marker = who.fence_marker.clone();
    *fence = match tokio::task::spawn_blocking(move || crate::kept::Fence::now(&marker)).await.expect("fence task") {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the workspace's fence; the slot checks out afresh next time");
            None
        }
    };
    // The agent's `--env` and the user's toolchains, below the workflow's.
    let mut env: BTreeMap<String, String> = who.env.clone();
    env.extend(a.env.clone());
    env.extend(a.secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in [
        ("KILN_RUN_ID", a.run_id.clone()),
        ("KILN_JOB", a.job_name.clone()),
        ("KILN_JOB_ID", a.job_id.clone()),
        ("KILN_EPOCH", a.epoch.to_string()),
        ("KILN_COMMIT", a.commit_sha.clone()),
        ("KILN_WORKSPACE", ws.display().to_string()),
    ] {
        env.insert(k.to_string(), v);
    }
    let n = a.steps.len();
    // The first failure that fails the job; later steps run only if their
    // `if:` holds after a failure (`failure()`, `always()`).
    let mut failed: Option<Ran> = None;
    let mut summary: Vec<(String, StepOutcome, Option<Duration>)> = Vec::with_capacity(n);
    for (i, s) in a.steps.iter().enumerate() {
        if ctl.reason().is_some() {
            return Ran::Stopped;
        }
        let label = s.name.clone().unwrap_or_else(|| summarize(&s.run));
        let runs = if failed.is_none() { s.run_after_success } else { s.run_after_failure };
        if !runs {
            let why = match &s.condition {
                Some(c) => format!("`if: {c}` is false"),
                None => "an earlier step failed".to_string(),
            };
            logs.system(&format!("○ step {}/{n}: {label} skipped ({why})", i + 1));
            results.push(kiln_api::StepResult {
                name: label.clone(),
                outcome: "skipped".into(),
                duration_ms: None,
                message: Some(why),
            });
            summary.push((label, StepOutcome::Skipped, None));
            continue;
        }
        logs.system(&format!("▶ step {}/{n}: {label}", i + 1));
        let mut step_env = env.clone();
        // Step > job > workflow; the KILN_* variables stay the agent's.
        for (k, v) in &s.env {
            if !k.starts_with("KILN_") || k.starts_with("KILN_EXPR_") {
                step_env.insert(k.clone(), v.clone());
            }
        }
        let started = std::time::Instant::now();
        // Fresh reports are those written since (the file system's clock
        // may trail a little).
        let started_at = std::time::SystemTime::now() - Duration::from_millis(100);
        let mut tail = Tail::default();
        let result = match &s.working_directory {
            Some(d) if !ws.join(d).is_dir() => {
                Err(format!("working-directory `{d}` does not exist in the checkout (or is not a directory)"))
            }
            _ => {
                let req = StepRequest {
                    name: label.clone(),
                    command: s.run.clone(),
                    env: step_env,
                    program: s.shell.clone(),
                    working_dir: s.working_directory.clone(),
                };
                match run_one(exec, &req, s.timeout_secs, logs, &mut tail)
                    .instrument(tracing::info_span!("step", step = i + 1))
                    .await
                {
                    Ok(r) => r,
                    Err(ran) => return ran,
                }
            }
        };
        let took = started.elapsed();
        if ctl.reason().is_some() {
            return Ran::Stopped;
        }
        // Issue 43: a step that failed only by quarantined tests.
        let excused = match &result {
            Err(why) if !s.continue_on_error && why.starts_with("exit code ") => {
                crate::reports::excused(a, ws, started_at).await
            }
            _ => None,
        };
        let outcome = match result {
            Ok(()) => {
                logs.system(&format!("✓ step {}/{n}: {label} ({})", i + 1, seconds(took)));
                StepOutcome::Success
            }
            Err(why) if excused.is_some() => {
                let ids = excused.unwrap_or_default();
                let shown: Vec<String> = ids.iter().take(5).map(|t| format!("`{t}`")).collect();
                let more = if ids.len() > 5 { format!(" and {} more", ids.len() - 5) } else { String::new() };
                logs.system(&format!(
                    "⚠ step {}/{n}: {label} failed ({why}, {}), but its only failures are quarantined tests: {}{more}; \
                     the job goes on",
                    i + 1,
                    seconds(took),
                    shown.join(", ")
                ));
                let note = format!("quarantined failures: {}", ids.len());
                quarantined.extend(ids);
                StepOutcome::Quarantined(note)
            }
            Err(why) if s.continue_on_error => {
                logs.system(&format!(
                    "✗ step {}/{n} failed: {why} ({}); continue-on-error: the job goes on",
                    i + 1,
                    seconds(took)
                ));
                StepOutcome::Continued(why)
            }
            Err(why) => {
                logs.system(&format!("✗ step {}/{n} failed: {why} ({})", i + 1, seconds(took)));
                if let Some(hint) = exit_hint(exit_code_of(&why), &label, &tail.text(), who) {
                    logs.system_note(&hint);
                }
                if failed.is_none() {
                    let timed_out = why.starts_with(STEP_TIMED_OUT);
                    failed = Some(Ran::StepFailed {
                        // 124: the exit code of timeout(1), the convention for "timed out".
                        exit_code: if timed_out { 124 } else { exit_code_of(&why) },
                        message: format!("step {}/{n} `{label}` failed: {why}", i + 1),
                        timed_out,
                    });
                }
                StepOutcome::Failure(why)
            }
        };
        let (word, message) = match &outcome {
            StepOutcome::Success => ("success", None),
            StepOutcome::Failure(w) => ("failure", Some(w.clone())),
            StepOutcome::Continued(w) => ("continued", Some(w.clone())),
            StepOutcome::Quarantined(w) => ("quarantined", Some(w.clone())),
            StepOutcome::Skipped => ("skipped", None),
        };
        results.push(kiln_api::StepResult {
            name: label.clone(),
            outcome: word.into(),
            duration_ms: Some(took.as_millis() as u64),
            message,
        });
        summary.push((label, outcome, Some(took)));
    }
    if summary.iter().any(|(_, o, _)| !matches!(o, StepOutcome::Success)) {
        let mut text = String::from("steps:");
        for (i, (label, outcome, took)) in summary.iter().enumerate() {
            let took = took.map(|t| format!(" in {}", seconds(t))).unwrap_or_default();
            let line = match outcome {
                StepOutcome::Success => format!("✓ {label}: success{took}"),
                StepOutcome::Failure(w) => format!("✗ {label}: failure{took} ({w})"),
                StepOutcome::Continued(w) => format!("✗ {label}: failure, continued{took} ({w})"),
                StepOutcome::Quarantined(w) => format!("⚠ {label}: failure, quarantined{took} ({w})"),
                StepOutcome::Skipped => format!("○ {label}: skipped"),
            };
            text.push_str(&format!("\n  {}. {line}", i + 1));
        }
        logs.system(&text);
    }
    failed.unwrap_or(Ran::Success)
}

/// Runs one step to its end; `Ok(Err(why))` when it failed or ran out of
/// its own `timeout` (then it is interrupted, and the next steps still
/// run). `Err` ends the attempt (killed sandbox, lost executor).
async fn run_one(
    exec: &Arc<dyn Executor>,
    req: &StepRequest,
    timeout_secs: Option<u64>,
    logs: &LogStreamer,
    tail: &mut Tail,
) -> Result<Result<(), String>, Ran> {
    let mut handle = match exec.exec(req).await {
        Ok(h) => h,
        Err(kiln_sandbox::SandboxError::Killed) => return Err(Ran::Stopped),
        Err(kiln_sandbox::SandboxError::Spawn { source, .. }) => {
            return Ok(Err(format!("cannot start the step's shell: {source}")));
        }
        Err(e) => return Err(Ran::Infra(e.to_string())),
    };
    let timer = async {
        match timeout_secs {
            Some(t) => tokio::time::sleep(Duration::from_secs(t)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timer);
    let mut timed_out = false;
    let exit = loop {
        tokio::select! {
            ev = handle.next() => match ev {
                Some(StepEvent::Output { stream, data }) => {
                    // Output faster than it is shipped waits here (and the
                    // step on its pipe) while the server keeps taking it.
                    logs.room(data.len()).await;
                    tail.push(&data);
                    logs.write(Stream::from(stream), &data);
                }
                Some(StepEvent::Exited(e)) => break e,
                None => return Err(Ran::Infra(format!("lost track of step `{}`", req.name))),
            },
            _ = &mut timer, if !timed_out => {
                timed_out = true;
                // Interrupted beside this loop, which keeps draining the
                // step's output until it exits.
                let exec = exec.clone();
                tokio::spawn(async move { exec.interrupt().await });
            }
        }
    };
    logs.flush();
    Ok(match (timed_out, exit.success()) {
        (true, _) => Err(format!("{STEP_TIMED_OUT}{}s", timeout_secs.unwrap_or_default())),
        (false, true) => Ok(()),
        (false, false) => Err(exit.to_string()),
    })
}

/// How a step stopped by its own `timeout` fails.
const STEP_TIMED_OUT: &str = "timed out after ";

/// Who a step runs as and what it gets from the agent (issue 41, item 1).
pub(crate) struct StepsAs {
    /// "as nobody, not as the agent's user: …", for hints.
    runs_as: String,
    /// The agent's `--env` and the step user's toolchains (host steps).
    env: BTreeMap<String, String>,
    /// `PATH` entries the step user cannot reach (host steps).
    unreachable: Vec<String>,
    /// `--step-user` may be what helps (a host step under a root agent).
    other_user: bool,
    /// A file of the agent's whose change time tells the file systems'
    /// clock (see [`crate::kept::Fence`]).
    fence_marker: PathBuf,
}

impl StepsAs {
    fn of(ctx: &AttemptContext) -> StepsAs {
        let none = StepsAs {
            runs_as: String::new(),
            env: BTreeMap::new(),
            unreachable: vec![],
            other_user: false,
            fence_marker: ctx.work_dir.join("fence"),
        };
        match (&ctx.executor, ctx.isolation.user) {
            (ExecutorKind::Container(_), _) => {
                StepsAs { runs_as: "in the job's container, as its image's user".to_string(), ..none }
            }
            (_, user) => {
                let me = nix::unistd::geteuid().as_raw();
                let (uid, gid) = user.map_or((me, nix::unistd::getegid().as_raw()), |u| (u.uid, u.gid));
                let mut env = ctx.step_env.vars.clone();
                // `PATH` is the executor's (`--path` directories first).
                let path = env.remove("PATH");
                let base = path.or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
                let runs_as = if uid == me {
                    "as the agent's own user".to_string()
                } else {
                    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                        .ok()
                        .flatten()
                        .map(|p| p.name)
                        .unwrap_or_else(|| format!("uid {uid}"));
                    format!("as {name}, not as the agent's user")
                };
                StepsAs {
                    runs_as,
                    env,
                    unreachable: crate::step_env::unreachable_path_entries(&ctx.step_env.steps_path(&base), uid, gid),
                    other_user: uid != me,
                    ..none
                }
            }
        }
    }
}

/// The last output of a step (both streams), for hints naming what failed.
#[derive(Default)]
pub(crate) struct Tail(Vec<u8>);

impl Tail {
    const KEEP: usize = 4096;

    fn push(&mut self, data: &[u8]) {
        self.0.extend_from_slice(&data[data.len().saturating_sub(Self::KEEP)..]);
        if self.0.len() > Self::KEEP {
            self.0.drain(..self.0.len() - Self::KEEP);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

/// The command a shell, `env` or a version manager said it could not find
/// or run, from the step's last output lines.
fn failed_command(tail: &str) -> Option<String> {
    for line in tail.lines().rev().take(20) {
        let line = line.trim();
        for (suffix, _) in [(": not found", ()), (": command not found", ()), (": Permission denied", ())] {
            if let Some(rest) = line.strip_suffix(suffix) {
                // `sh: 1: cargo`, `bash: line 3: cargo`, `pyenv: python3.10`
                if let Some(cmd) = rest.rsplit(": ").next().filter(|c| !c.is_empty() && !c.contains(' ')) {
                    return Some(cmd.to_string());
                }
            }
        }
        // `/usr/bin/env: 'python3.10': No such file or directory`
        if let Some(rest) = line.strip_suffix(": No such file or directory")
            && let Some(cmd) = rest.rsplit(": ").next()
        {
            let cmd = cmd.trim_matches(|c| c == '\'' || c == '‘' || c == '’' || c == '`');
            if !cmd.is_empty() && !cmd.contains(' ') {
                return Some(cmd.to_string());
            }
        }
    }
    None
}

/// What exit codes 126 and 127 usually mean — and rustup's "could not
/// choose a version" — naming the command and who ran the step (issue 41,
/// item 1: a tool installed for another user is the usual cause).
fn exit_hint(code: i32, step: &str, tail: &str, who: &StepsAs) -> Option<String> {
    let cmd = failed_command(tail);
    let named = cmd.as_deref().map_or("a command it runs".to_string(), |c| format!("`{c}`"));
    let what = match code {
        127 => format!("{named} was not found on the step's PATH"),
        126 => format!("{named} was found but may not be executed (permissions)"),
        _ if tail.contains("rustup could not choose a version") => {
            "rustup found no toolchain: it looks in RUSTUP_HOME (default ~/.rustup), and the step's HOME is its own"
                .to_string()
        }
        _ => return None,
    };
    let mut hint = format!("hint: exit {code} from `{step}`: {what}. The step ran {}", who.runs_as);
    if !who.unreachable.is_empty() {
        hint.push_str(&format!(", who cannot reach these PATH entries of the agent: {}", who.unreachable.join(", ")));
    }
    hint.push_str(
        ". A tool installed in a home directory (rustup, pyenv, nvm, sdkman) needs its own variable and PATH: \
         start the agent with --env NAME[=VALUE] / --path DIR",
    );
    if who.other_user {
        hint.push_str(", or --step-user a user who can read it");
    }
    hint.push_str("; or install it system-wide, or run the job in a container image that has it (docs/deploy.md)");
    Some(hint)
}

/// `exit code N` → N (the job's exit code is its first failed step's).
fn exit_code_of(why: &str) -> i32 {
    why.strip_prefix("exit code ").and_then(|c| c.parse().ok()).unwrap_or(1)
}

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The first line of a command, shortened, to name an unnamed step.
fn summarize(cmd: &str) -> String {
    let line = cmd.trim().lines().next().unwrap_or("");
    if line.chars().count() > 80 {
        format!("{}…", line.chars().take(79).collect::<String>())
    } else {
        line.to_string()
    }
}

/// The completion to send, or None when fenced.
fn decide(
    a: &Assignment,
    ran: Ran,
    stop: Option<Stop>,
    outputs: BTreeMap<String, String>,
    ctx: &AttemptContext,
) -> Option<Completion> {
    let failed = |exit_code, message: String, class: &str| Completion {
        outcome: AttemptOutcome::Failed,
        exit_code,
        message: Some(message),
        // Kept for servers that read only the flag.
        infra_failure: class == "infra",
        failure_class: Some(class.to_string()),
        outputs: BTreeMap::new(),
        steps: Vec::new(),
        telemetry: None,
        sandbox: None,
        quarantined: Vec::new(),
        reports_staged: None,
    };
    if stop == Some(Stop::Fenced) {
        return None;
    }
    // Work that ended on its own keeps its result even if a stop reason
    // arrived afterwards; only interrupted work reports the reason.
    Some(match ran {
        Ran::Success => Completion {
            outcome: AttemptOutcome::Success,
            exit_code: Some(0),
            message: None,
            infra_failure: false,
            failure_class: None,
            outputs,
            steps: Vec::new(),
            telemetry: None,
            sandbox: None,
            quarantined: Vec::new(),
            reports_staged: None,
        },
        Ran::StepFailed { exit_code, message, timed_out } => {
            failed(Some(exit_code), message, if timed_out { "timeout" } else { "step_failed" })
        }
        Ran::JobError(message) => failed(None, message, "step_failed"),
        Ran::Infra(message) => failed(None, message, "infra"),
        Ran::TimedOut(message) => failed(Some(124), message, "timeout"),
        Ran::Stopped => match stop {
            Some(Stop::Cancelled) => Completion {
                outcome: AttemptOutcome::Cancelled,
                exit_code: None,
                message: Some("cancelled".into()),
                infra_failure: false,
                failure_class: Some("cancelled".into()),
                outputs: BTreeMap::new(),
                steps: Vec::new(),
                telemetry: None,
                sandbox: None,
                quarantined: Vec::new(),
                reports_staged: None,
            },
            Some(Stop::TimedOut) => {
                // 124: the exit code of timeout(1), the convention for "timed out".
                failed(Some(124), format!("timed out after {}s", a.timeout_secs.unwrap_or_default()), "timeout")
            }
            Some(Stop::Hung) => failed(
                Some(124),
                format!(
                    "hang: no output for {}; killed",
                    kiln_workflow::format_duration(Duration::from_secs(a.hang_kill_after_secs.unwrap_or_default()))
                ),
                "hang",
            ),
            Some(Stop::StageTimedOut(stage)) => {
                let (limit, flag) = match stage {
                    Stage::Finalizing => (ctx.finalize_timeout, "--finalize-timeout"),
                    _ => (ctx.prepare_timeout, "--prepare-timeout"),
                };
                let limit = kiln_workflow::format_duration(limit.unwrap_or_default());
                failed(
                    Some(124),
                    format!("{} took longer than {limit} (kiln agent {flag})", stage.describe()),
                    "timeout",
                )
            }
            // Handed back (drain timeout, preemption): retried elsewhere at once.
            Some(Stop::Shutdown) => failed(None, "the agent shut down during the job".into(), "agent_lost"),
            Some(Stop::Fenced) | None => failed(None, "the job was stopped".into(), "infra"),
        },
    })
}

/// How an attempt's completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// The server took it (or refused it for good).
    Done,
    /// The attempt was fenced before it was taken: its sandbox is confirmed
    /// by a release instead.
    Fenced,
}

/// How this agent knows a job's sandbox is gone once its cleanup returned
/// (issue 40, item 5).
fn sandbox_evidence(ctx: &AttemptContext) -> &'static str {
    match (&ctx.executor, ctx.isolation.namespaces) {
        (ExecutorKind::Container(_), _) => "the job's container was killed and removed",
        (_, kiln_sandbox::Namespaces::None) => "every process group of the job's steps was killed",
        _ => "the job's PID namespaces were killed: no process of the job is left",
    }
}

/// A fenced attempt's sandbox is gone: say so (retrying transport errors
/// for a while), so a cancel that waits for it ends.
async fn release(ctx: &AttemptContext, a: &Assignment, end: &kiln_api::SandboxEnd) {
    for failures in 1..=8u32 {
        match ctx.client.release(&a.job_id, a.epoch, end).await {
            Ok(ack) => {
                tracing::info!(released = ack.released, "told the server the fenced attempt's sandbox is gone");
                return;
            }
            Err(e) if e.is_retryable() => {
                let delay = backoff(failures, 250, 10_000);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "release not accepted; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the server refused the release");
                return;
            }
        }
    }
}

/// Sends the completion, retrying transport errors with the identical body.
async fn complete(ctx: &AttemptContext, a: &Assignment, c: &Completion, ctl: &Control) -> Sent {
    let mut failures = 0;
    loop {
        let res = tokio::select! {
            r = ctx.client.complete(&a.job_id, a.epoch, c) => r,
            _ = ctl.fenced() => {
                tracing::warn!("attempt fenced before its completion was accepted");
                return Sent::Fenced;
            }
        };
        match res {
            Ok(ack) => {
                tracing::info!(outcome = %c.outcome, exit_code = ?c.exit_code, job_status = %ack.job_status, "completed job");
                return Sent::Done;
            }
            Err(e) if e.is_stale_epoch() => {
                tracing::warn!(error = %e, "completion refused: this attempt was fenced");
                return Sent::Fenced;
            }
            Err(e) if e.is_retryable() => {
                failures += 1;
                let delay = backoff(failures, 250, 10_000);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "completion not accepted; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                tracing::error!(error = %e, outcome = %c.outcome, "the server refused the completion");
                return Sent::Done;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_126_and_127_get_a_hint_naming_the_step_and_its_user() {
        let nobody = StepsAs {
            runs_as: "as nobody, not as the agent's user".into(),
            env: BTreeMap::new(),
            unreachable: vec!["/root/.cargo/bin".into()],
            other_user: true,
            fence_marker: PathBuf::new(),
        };
        let hint = exit_hint(127, "cargo build", "$ cargo build\nsh: 1: cargo: not found\n", &nobody).unwrap();
        assert!(hint.contains("`cargo` was not found on the step's PATH"), "{hint}");
        assert!(hint.contains("ran as nobody"), "{hint}");
        assert!(hint.contains("cannot reach these PATH entries of the agent: /root/.cargo/bin"), "{hint}");
        assert!(hint.contains("--step-user"), "{hint}");
        let hint = exit_hint(126, "./run.sh", "bash: line 1: ./run.sh: Permission denied", &nobody).unwrap();
        assert!(hint.contains("`./run.sh` was found but may not be executed"), "{hint}");
        let hint = exit_hint(127, "py", "/usr/bin/env: 'python3.10': No such file or directory", &nobody).unwrap();
        assert!(hint.contains("`python3.10` was not found"), "{hint}");
        let hint = exit_hint(127, "x", "", &nobody).unwrap();
        assert!(hint.contains("a command it runs was not found"), "{hint}");
        let rustup = "error: rustup could not choose a version of cargo to run, because one wasn't specified";
        assert!(exit_hint(1, "cargo", rustup, &nobody).unwrap().contains("RUSTUP_HOME"));
        assert_eq!(exit_hint(1, "make", "make: *** [all] Error 1", &nobody), None);
        assert_eq!(exit_code_of("exit code 127"), 127);
    }

    #[test]
    fn unnamed_steps_are_named_by_their_first_line() {
        assert_eq!(summarize("  make test\nmake lint"), "make test");
        assert_eq!(summarize(&"x".repeat(100)).chars().count(), 80);
    }
}
