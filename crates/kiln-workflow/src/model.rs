//! The validated workflow model. Every field here is part of the frozen run
//! definition and of the canonical hash.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Maximum size of a workflow file in bytes.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// Maximum number of jobs in one workflow.
pub const MAX_JOBS: usize = 256;
/// Maximum number of steps in one job.
pub const MAX_STEPS: usize = 256;
/// Maximum YAML nesting depth.
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workflow {
    pub version: u32,
    /// Run-level `concurrency:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// Every job, matrices expanded, in a topological order: each job comes
    /// after all of its `needs`.
    pub jobs: Vec<Job>,
    /// `on:`: which events start a run. Absent (not declared) → only a run
    /// started by hand; a workflow without `on:` serialises (and hashes)
    /// exactly as before the key existed.
    #[serde(default, skip_serializing_if = "Triggers::is_unset")]
    pub on: Triggers,
    /// `inputs:`: the inputs a run may be given, by name. Empty (not
    /// declared) → any inputs are accepted as strings, as before the key
    /// existed; declared → [`Workflow::check_inputs`] refuses unknown and
    /// ill-typed ones at acceptance and fills in defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, InputSpec>,
    /// The run-level `timeout:` in seconds: the run is cancelled (with every
    /// job still waiting or running) once it has existed this long. Absent →
    /// the server's `--run-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// `priority:` (issue 44): the lane of its runs, `urgent`, `normal` or
    /// `background` — one for every event (key `*`), or per event (`push`,
    /// `pull_request`, `schedule`, `manual`). Absent → the trigger's
    /// default (docs/scheduling.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub priority: BTreeMap<String, String>,
}

/// The priority lanes a workflow's `priority:` may name, highest first.
pub const PRIORITY_LANES: &[&str] = &["urgent", "normal", "background"];

/// The events `priority:` may be given per.
pub const PRIORITY_EVENTS: &[&str] = &["push", "pull_request", "schedule", "manual"];

impl Workflow {
    /// The lane `priority:` gives a run of `event`, if it says.
    pub fn priority_for(&self, event: &str) -> Option<&str> {
        self.priority.get(event).or_else(|| self.priority.get("*")).map(String::as_str)
    }
}

/// Most inputs one workflow may declare.
pub const MAX_DECLARED_INPUTS: usize = 64;

/// One declared input (`inputs: {name: {type, description, default, required, options}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    #[serde(rename = "type")]
    pub kind: InputKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The value used when the run is not given one (already checked
    /// against `kind` and `options`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// Without a `default`, a run must be given a value.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// The allowed values of a `choice`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// The type of a declared input. Values travel as strings; a `boolean` is
/// `true` or `false`, a `number` a decimal number, a `choice` one of its
/// options. In expressions a boolean input is a boolean and a number input
/// a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    String,
    Boolean,
    Number,
    Choice,
}

impl InputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::String => "string",
            InputKind::Boolean => "boolean",
            InputKind::Number => "number",
            InputKind::Choice => "choice",
        }
    }
}

impl InputSpec {
    /// Why `value` is not a valid value of this input, if it is not.
    pub fn check(&self, value: &str) -> Result<(), String> {
        match self.kind {
            InputKind::String => Ok(()),
            InputKind::Boolean if value == "true" || value == "false" => Ok(()),
            InputKind::Boolean => Err(format!("must be `true` or `false`, found `{}`", value.escape_debug())),
            InputKind::Number if is_number(value) => Ok(()),
            InputKind::Number => Err(format!("must be a number, found `{}`", value.escape_debug())),
            InputKind::Choice if self.options.iter().any(|o| o == value) => Ok(()),
            InputKind::Choice => Err(format!(
                "must be one of {}, found `{}`",
                self.options.iter().map(|o| format!("`{}`", o.escape_debug())).collect::<Vec<_>>().join(", "),
                value.escape_debug()
            )),
        }
    }
}

/// `branch` of a run's ref: `refs/heads/X` → `X`; another `refs/…` or a
/// full commit SHA → none; a bare name as given.
pub fn branch_of(git_ref: &str) -> Option<String> {
    match git_ref.strip_prefix("refs/heads/") {
        Some(b) => Some(b.to_string()),
        None if git_ref.starts_with("refs/")
            || (git_ref.len() == 40 && git_ref.bytes().all(|b| b.is_ascii_hexdigit())) =>
        {
            None
        }
        None => Some(git_ref.to_string()),
    }
}

/// A decimal number: optional sign, digits, optional fraction and exponent
/// (what `f64` parses, without `inf`/`nan`).
pub(crate) fn is_number(text: &str) -> bool {
    let t = text.trim();
    !t.is_empty()
        && t.len() == text.len()
        && t.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
        && t.parse::<f64>().is_ok_and(f64::is_finite)
}

/// Longest accepted filter pattern (branch, tag or path), in characters.
pub const MAX_PATTERN_CHARS: usize = 512;
/// Most patterns in one filter list (`branches`, `paths-ignore`, …).
pub const MAX_PATTERNS: usize = 100;
/// Most `schedule` entries in one workflow.
pub const MAX_SCHEDULES: usize = 20;
/// Longest accepted `cron` expression, in characters.
pub const MAX_CRON_CHARS: usize = 100;
/// Longest accepted `timezone` name, in characters.
pub const MAX_TIMEZONE_CHARS: usize = 64;

/// `on:`: when a workflow runs (see [`Triggers::matches_push`] and friends).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Triggers {
    /// Whether `on:` was written at all (false → manual only, today's behaviour).
    #[serde(default)]
    pub declared: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushTrigger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<PullRequestTrigger>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<Schedule>,
    /// `manual`: a run may be started by hand (CLI, API, UI).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
}

/// `on: push:` filters. Empty lists mean "not given".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PushTrigger {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches_ignore: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags_ignore: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths_ignore: Vec<String>,
}

/// `on: pull_request:` filters; `branches` filter the pull request's base
/// (target) branch. Empty lists mean "not given".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PullRequestTrigger {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches_ignore: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths_ignore: Vec<String>,
}

/// One `schedule:` entry: a 5-field crontab line read in `timezone`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// As written (validated at parse time): minute hour day-of-month month day-of-week.
    pub cron: String,
    /// An IANA time zone name; `None` means UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

/// What identity token a job asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdToken {
    /// The token's `aud` (default: the server's public URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    pub steps: Vec<Step>,
    /// Effective dependencies by job name, after normalisation: when no job in
    /// the file declares `needs`, each job needs the one before it (spec 000 §2
    /// sequential model); otherwise exactly what the file declares.
    #[serde(default)]
    pub needs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Cache>,
    #[serde(default)]
    pub artifacts: Artifacts,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Repository secrets this job receives as environment variables of the
    /// same name (`secrets: [NAME, …]`); only trusted runs get them, and
    /// their values are masked in logs (best effort).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// `id-token:`: the job receives a signed OIDC identity token
    /// (`KILN_ID_TOKEN`) for cloud federation; trusted runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_token: Option<IdToken>,
    /// Job timeout in seconds (`timeout: 30m`, `90s`, `1h`, or a number of seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// `timeout: ${{ … }}` as written: evaluated over the run's data when
    /// the run is accepted ([`Workflow::render_accepted`]), which sets
    /// `timeout_secs` and clears this. Never set in a frozen definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_expr: Option<String>,
    /// `hang-after`: seconds without output after which the log gets a
    /// warning (default [`crate::HANG_AFTER_SECS`], 30 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_after_secs: Option<u64>,
    /// `hang-kill-after`: seconds without output after which the job is
    /// killed and fails with class `hang` (default 2 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_kill_after_secs: Option<u64>,
    /// How many extra attempts the job's failures in `retry_on` get
    /// (`retry: N`, or `retry: {max: N}`). 0 by default.
    #[serde(default)]
    pub retry: u32,
    /// `retry: {on: [...]}`: the failure classes `retry` applies to
    /// (`step_failed`, `timeout`, `hang`, `agent_lost`, `infra`). Empty: those
    /// of `retry: N`, the job's own (`step_failed`, `timeout`, `hang`).
    /// Infrastructure failures always get at least 2 retries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_on: Vec<String>,
    /// `retry: {exit_codes: [...]}`: a `step_failed` attempt is retried only
    /// when its exit code is one of these. Empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_exit_codes: Vec<i32>,
    /// Labels an agent must carry to run this job (`runs-on: {os: linux, size: large}`).
    #[serde(default)]
    pub runs_on: BTreeMap<String, String>,
    /// Set on every job expanded from a `matrix:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<MatrixInfo>,
    /// `needs-policy: {quorum: N}`: the job becomes ready once N of its
    /// effective `needs` succeeded (and is then marked degraded if some did
    /// not). `None`: every need must succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<u32>,
    /// The `if:` expression as written (see [`eval_condition`](crate::eval_condition)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// Job-level `concurrency:` (matrix references already substituted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// `environment:` (issue 46): the deployment environment this job
    /// deploys to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// `services:` by name: containers started beside the job, reachable
    /// by name from a container job (on a network of their own) and on
    /// loopback ports from a host job.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, Service>,
    /// `outputs: [name, …]`: values the job's steps write to `$KILN_OUTPUT`
    /// (`name=value`, or `name<<DELIM` … `DELIM`), bound by the completion
    /// of its successful attempt and read downstream as
    /// `${{ needs.<job>.outputs.<name> }}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// `reports: {junit: [globs], tap: [globs]}`: test reports the agent
    /// reads after the steps (also when one failed), bound with the
    /// attempt's completion like its outputs (issue 43).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reports: Option<Reports>,
    /// Set on the job that waits for a promotion between two rings
    /// (`rings:`, issue 46).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<Promotion>,
    /// `checkout:`: how the job's workspace is checked out (issue 47).
    /// Absent: a fresh full checkout of the run's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout: Option<Checkout>,
}

/// A job's `checkout:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkout {
    /// `reuse: true`: the job slot's previous workspace of the same
    /// repository (and trust) is brought to the commit and cleaned instead
    /// of checked out afresh. Trusted runs only; others check out afresh.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse: bool,
    /// `depth: N`: the job's `git log` sees N generations of history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// `filter: blob:none`: a partial checkout: the agent's mirror of the
    /// repository holds commits and trees, and fetches only the blobs the
    /// job's (sparse) tree needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// `sparse: [DIR, …]`: only these directories (and the files at the
    /// top level) are checked out (cone mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sparse: Vec<String>,
}

/// A job's `reports:`: workspace-relative paths or globs of its test
/// reports, by format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reports {
    /// JUnit XML (pytest `--junitxml`, cargo-nextest, Surefire, jest-junit,
    /// go-junit-report …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub junit: Vec<String>,
    /// TAP 13/14.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tap: Vec<String>,
}

/// Most report paths or globs one job may declare (all formats).
pub const MAX_REPORT_PATTERNS: usize = 32;

/// Most outputs one job may declare.
pub const MAX_OUTPUTS: usize = 64;
/// Most bytes of output values (names included) one attempt may bind.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Most services one job may declare.
pub const MAX_SERVICES: usize = 8;
/// Most ports one service may publish.
pub const MAX_SERVICE_PORTS: usize = 16;

/// One service container (`services: {db: {image, env, ports, health}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    /// The image reference as written.
    pub image: String,
    /// The manifest digest `image` resolved to at acceptance (spec 000 §5:
    /// pinned like a job's `image.ref`, so a retry runs the same bytes).
    /// `None` until the run is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Container ports: published on loopback for a host job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// `command:` overriding the image's (an argument list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The readiness check; without one a service is ready once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<ServiceHealth>,
}

/// `health: {cmd, interval, retries}`: `cmd` runs with `sh -c` inside the
/// service's container every `interval` until it exits 0, at most
/// `retries` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceHealth {
    pub cmd: String,
    pub interval_ms: u64,
    pub retries: u32,
}

/// Which matrix combination a job is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatrixInfo {
    /// The job's name as written (the base of `test (shard=2, os=linux)`).
    pub group: String,
    /// The combination's values (`KILN_MATRIX_<KEY>` in the job's env).
    pub values: BTreeMap<String, String>,
    /// At most this many jobs of the group run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// When one job of the group fails, cancel its siblings.
    pub fail_fast: bool,
}

/// `concurrency: {group, cancel-in-progress, queue}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Concurrency {
    /// The group template: text with `${{ }}` expressions over `event`,
    /// `ref`, `branch` and `inputs.*` (see [`render_group`](crate::render_group)).
    /// Empty on a job with `environment:`: its group is the environment's
    /// deploy queue.
    pub group: String,
    /// A new run/job in the group cancels the one in progress (otherwise it
    /// waits).
    #[serde(default)]
    pub cancel_in_progress: bool,
    /// What happens to jobs already waiting when another one arrives
    /// (job-level groups; `None`: the default of the group's kind —
    /// `supersede-pending` for a named group, `ordered` for an
    /// environment's deploy queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<GroupQueue>,
}

/// `concurrency.queue`: the waiting jobs of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupQueue {
    /// Every waiting job runs, one at a time, in acceptance order.
    Ordered,
    /// A newer job cancels the jobs waiting before it (each says so).
    SupersedePending,
}

impl GroupQueue {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupQueue::Ordered => "ordered",
            GroupQueue::SupersedePending => "supersede-pending",
        }
    }
}

/// A job's `environment:` (issue 46): the deployment environment it
/// deploys to. Its protection rules (allowed refs, approvals, wait) are the
/// server's (`kiln env create`); its deploy jobs run one run at a time, in
/// acceptance order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    pub name: String,
    /// Where the deployed thing is reached (shown with the deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The ring this job deploys (`rings:`, expanded at parse time into one
    /// job per ring, each needing the one before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<Ring>,
}

/// One ring of a deploy job's `rings:` (issue 46): the job deploys this
/// ring (`KILN_RING`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ring {
    pub name: String,
    /// Its place, from 0, among `count` rings.
    pub index: u32,
    pub count: u32,
}

/// Most rings one deploy job may declare.
pub const MAX_RINGS: usize = 10;

/// The promotion from one ring to the next (issue 46), on the job that
/// waits for it: the next ring's deploy job, or — for a command gate — the
/// generated gate job (`deploy (canary gate)`), which the next ring needs.
/// Once the job's needs succeeded, the server holds it for `bake_secs`,
/// then evaluates the Prometheus gate (if any); `kiln promote` opens it at
/// once, `kiln pause` holds it. A failed gate cancels the job and rolls the
/// environment back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promotion {
    pub environment: String,
    /// The ring deployed before (whose bake and gate this is).
    pub from: String,
    /// The ring it promotes to.
    pub to: String,
    /// How long to wait after `from` deployed before the gate decides.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bake_secs: u64,
    /// `gate: {prometheus: {query, success, interval, failure-limit,
    /// duration}}`, canonical JSON; evaluated by the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<String>,
    /// `gate: {run: …}`: this job is the gate; its steps are the command,
    /// it deploys nothing, and its failure fails the gate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub command: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Image {
    /// `image: {ref: registry/name:tag}` (or `image: registry/name:tag`).
    Ref { reference: String },
    /// `image: {dockerfile: path, context: dir}`.
    Dockerfile { path: String, context: String },
}

/// One step. The optional fields are left out of the canonical encoding
/// when unused, so workflows written before they existed keep their hash.
/// Workflow- and job-level `env` and `defaults` are already resolved into
/// each step's job (`Job::env`) and into `shell`/`working_directory` here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub run: String,
    /// The step's own `env` (over the job's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `if:` as written; `success()`/`failure()` refer to the earlier steps
    /// of the job (see [`step_gate`](crate::step_gate)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// Relative to the checkout (no `..`); `None` is the checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// A failure of this step does not fail the job (nor make `failure()` true).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continue_on_error: bool,
    /// `sh`, `bash`, `python3` or a command template with `{0}` (the script
    /// file); `None` is `sh` (see [`shell_argv`](crate::shell_argv)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    pub kind: String,
    pub version: String,
    pub inputs: Vec<String>,
    /// Workspace-relative directories, or absolute directories in the job's
    /// container (mounted there from the agent).
    pub paths: Vec<String>,
    /// On a miss, restore the most recently used entry saved for other
    /// inputs (dependency caches only); the exact key is saved after.
    /// Left out of the canonical encoding when false, so workflows without
    /// it hash as before.
    #[serde(default, rename = "restore-prefix", skip_serializing_if = "std::ops::Not::not")]
    pub restore_prefix: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifacts {
    #[serde(default)]
    pub publish: Vec<Publish>,
    #[serde(default)]
    pub restore: Vec<Restore>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub name: String,
    /// A file, a directory, or a glob ([`crate::is_glob`]: `dist/**/*.whl`)
    /// relative to the workspace. A directory or a glob is published as one
    /// archive.
    pub path: String,
    /// `expire-in`: how long after the job's completion the artifact's bytes
    /// are kept (the server's `--artifact-expire-in` is frozen in at
    /// acceptance when unset). Left out of the canonical encoding when unset,
    /// so workflows without it hash as before.
    #[serde(default, rename = "expire-in", skip_serializing_if = "Option::is_none")]
    pub expire_in_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restore {
    pub from_job: String,
    pub name: String,
    pub path: String,
}

impl Workflow {
    /// sha256 (hex) of the canonical encoding of the validated model: JSON with
    /// sorted keys and no insignificant whitespace. Two files that differ only
    /// in formatting, comments or key order hash the same.
    pub fn canonical_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        // serde_json::Value keeps object keys sorted (BTreeMap), so this is canonical.
        let value = serde_json::to_value(self).expect("workflow serialises");
        let bytes = serde_json::to_vec(&value).expect("value serialises");
        hex::encode(Sha256::digest(&bytes))
    }

    pub fn job(&self, name: &str) -> Option<&Job> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// The inputs a run of this workflow is accepted with (spec 000 §5:
    /// frozen at acceptance). Without an `inputs:` declaration, `given` as
    /// is. With one: an undeclared or ill-typed input, or a missing required
    /// one, is an error naming it; missing ones get their `default`.
    pub fn check_inputs(&self, given: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
        if self.inputs.is_empty() {
            return Ok(given.clone());
        }
        let declared = || self.inputs.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        for name in given.keys() {
            if !self.inputs.contains_key(name) {
                return Err(format!("unknown input `{}`; the workflow declares {}", name.escape_debug(), declared()));
            }
        }
        let mut out = BTreeMap::new();
        for (name, spec) in &self.inputs {
            match given.get(name).or(spec.default.as_ref()) {
                Some(v) => {
                    spec.check(v).map_err(|e| format!("input `{name}` ({}) {e}", spec.kind.as_str()))?;
                    out.insert(name.clone(), v.clone());
                }
                None if spec.required => {
                    return Err(format!("input `{name}` is required; give it with `--input {name}=VALUE`"));
                }
                None => {}
            }
        }
        Ok(out)
    }

    /// What the expressions of a run of this workflow see: the frozen
    /// trigger (`event`, `ref`, `branch`) and inputs, typed as declared.
    pub fn expr_context(
        &self,
        event: &str,
        git_ref: Option<&str>,
        inputs: &BTreeMap<String, String>,
    ) -> crate::ConditionContext {
        crate::ConditionContext {
            event: event.to_string(),
            git_ref: git_ref.map(str::to_string),
            branch: git_ref.and_then(branch_of),
            inputs: inputs.clone(),
            input_kinds: self.input_kinds(),
            ..Default::default()
        }
    }

    /// The declared type of each input (for expressions).
    pub fn input_kinds(&self) -> BTreeMap<String, InputKind> {
        self.inputs.iter().map(|(k, v)| (k.clone(), v.kind)).collect()
    }
}
