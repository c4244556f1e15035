//! Tree → validated [`Workflow`], collecting every problem with its position.

use crate::diag::Diagnostic;
use crate::expr::{
    Mode, check_inputs, check_template, condition_output_refs, matrix_ref, output_name_ok, parse_condition, parse_expr,
    segments, substitute_matrix_condition, template_output_refs,
};
use crate::model::{
    Artifacts, Cache, Checkout, Concurrency, Environment, GroupQueue, IdToken, Image, InputKind, InputSpec, Job,
    MAX_DECLARED_INPUTS, MAX_JOBS, MAX_OUTPUTS, MAX_REPORT_PATTERNS, MAX_RINGS, MAX_STEPS, MatrixInfo, Promotion,
    Publish, Reports, Restore, Ring, Step, Workflow,
};
use crate::script::{check_run, check_shell, shell_expands};
use crate::tree::{Entry, Node, Pos, ScalarKind, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

mod on;
mod services;

/// Longest accepted job or artifact name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Largest accepted `retry`.
pub const MAX_RETRY: u32 = 10;
/// Largest accepted `timeout`, in seconds (7 days).
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 60 * 60;
/// Largest accepted `expire-in` of a published artifact, in seconds (10 years).
pub const MAX_EXPIRE_IN_SECS: u64 = 3650 * 24 * 60 * 60;

/// Largest accepted cartesian product of a matrix's axes, before `exclude`
/// (the expanded jobs are bounded by [`MAX_JOBS`]).
pub const MAX_MATRIX_COMBINATIONS: usize = 1024;

/// `include` and `templates` (and a job's `extends`) are resolved by
/// `compose` before validation; they are listed for "did you mean".
const TOP_KEYS: &[&str] = &[
    "version",
    "on",
    "inputs",
    "env",
    "defaults",
    "concurrency",
    "timeout",
    "priority",
    "jobs",
    "include",
    "templates",
];
const JOB_KEYS: &[&str] = &[
    "name",
    "image",
    "steps",
    "needs",
    "needs-policy",
    "if",
    "matrix",
    "concurrency",
    "cache",
    "artifacts",
    "timeout",
    "hang-after",
    "hang-kill-after",
    "retry",
    "runs-on",
    "env",
    "defaults",
    "secrets",
    "id-token",
    "services",
    "outputs",
    "reports",
    "extends",
    "environment",
    "rings",
    "checkout",
];
const CHECKOUT_KEYS: &[&str] = &["reuse", "depth", "filter", "sparse"];
/// Deepest `checkout.depth` (a job that wants more wants the whole history).
pub const MAX_CHECKOUT_DEPTH: u32 = 100_000;
/// Most `checkout.sparse` directories.
pub const MAX_SPARSE_PATHS: usize = 200;
const RING_KEYS: &[&str] = &["name", "bake", "gate"];
const GATE_KEYS: &[&str] = &["prometheus", "run"];
const ENVIRONMENT_KEYS: &[&str] = &["name", "url"];
const ID_TOKEN_KEYS: &[&str] = &["audience"];
const MATRIX_KEYWORDS: &[&str] = &["include", "exclude", "max-parallel", "fail-fast"];
const NEEDS_POLICY_KEYS: &[&str] = &["quorum"];
const CONCURRENCY_KEYS: &[&str] = &["group", "cancel-in-progress", "queue"];
const STEP_KEYS: &[&str] = &["run", "name", "env", "if", "working-directory", "timeout", "continue-on-error", "shell"];
const DEFAULTS_KEYS: &[&str] = &["shell", "working-directory"];
const INPUT_KEYS: &[&str] = &["type", "description", "default", "required", "options"];
/// Longest accepted input `description`, in characters.
const MAX_DESCRIPTION_CHARS: usize = 1000;

/// Keys people write from habit (other CI systems, typos of ours): the key
/// meant, when that key is allowed where the unknown one stands.
const ALIASES: &[(&str, &str)] = &[
    ("timeout-minutes", "timeout"),
    ("timeout_minutes", "timeout"),
    ("timeout_secs", "timeout"),
    ("depends_on", "needs"),
    ("depends-on", "needs"),
    ("dependencies", "needs"),
    ("requires", "needs"),
    ("runs_on", "runs-on"),
    ("working_directory", "working-directory"),
    ("working-dir", "working-directory"),
    ("workdir", "working-directory"),
    ("cwd", "working-directory"),
    ("continue_on_error", "continue-on-error"),
    ("allow_failure", "continue-on-error"),
    ("allow-failure", "continue-on-error"),
    ("script", "run"),
    ("command", "run"),
    ("cmd", "run"),
    ("variables", "env"),
    ("when", "if"),
    ("condition", "if"),
    ("strategy", "matrix"),
    ("container", "image"),
    ("needs_policy", "needs-policy"),
    ("id_token", "id-token"),
    ("cancel_in_progress", "cancel-in-progress"),
    ("max_parallel", "max-parallel"),
    ("fail_fast", "fail-fast"),
    ("from-job", "from_job"),
    ("healthcheck", "health"),
    ("health-check", "health"),
    ("test", "cmd"),
];

/// Keys of other CI systems (or of later Kiln versions) that are not built:
/// refused with what to do instead, never silently ignored.
const NOT_BUILT: &[(&str, &str)] = &[
    ("uses", "reusable actions (`uses`) are not supported; write the commands in `run`"),
    ("with", "`with` (inputs of an action) is not supported; set variables in `env`"),
    ("permissions", "`permissions` is not supported; a job's identity token is asked for with `id-token: write`"),
];
const IMAGE_KEYS: &[&str] = &["ref", "dockerfile", "context"];
const CACHE_KEYS: &[&str] = &["kind", "version", "inputs", "paths", "restore-prefix"];
const ARTIFACTS_KEYS: &[&str] = &["publish", "restore"];
const REPORTS_KEYS: &[&str] = &["junit", "tap"];
const PUBLISH_KEYS: &[&str] = &["name", "path", "expire-in"];
const RESTORE_KEYS: &[&str] = &["from_job", "name", "path"];

#[derive(Default)]
struct Ctx {
    diags: Vec<Diagnostic>,
    /// What `${{ matrix.<key> }}` may name in the job being read.
    matrix_refs: MatrixRefs,
    /// The declared inputs (`None`: no `inputs:`, any name may be used).
    inputs: Option<BTreeSet<String>>,
    /// Top-level `env`, under every job's own.
    env: BTreeMap<String, String>,
    /// Top-level `defaults`.
    defaults: Defaults,
    /// `needs.<job>.outputs.<name>` read by the job being read: (position,
    /// job, output, where), checked against the graph in `cross_check`.
    output_refs: Vec<OutputRef>,
    /// `jobs:` was a map (GitHub Actions' form): jobs without `needs` run
    /// in parallel, and the jobs were sorted by their needs.
    jobs_map: bool,
    /// Values refused for a `${{ matrix.* }}` where it is not substituted:
    /// other problems at these positions are consequences, not reported.
    refused: BTreeSet<Pos>,
}

struct OutputRef {
    pos: Pos,
    job: String,
    output: String,
    subject: String,
}

/// `defaults: {shell, working-directory}` (top level or job).
#[derive(Default, Clone)]
struct Defaults {
    shell: Option<String>,
    working_directory: Option<String>,
}

#[derive(Default)]
enum MatrixRefs {
    /// The job has no `matrix`.
    #[default]
    NoMatrix,
    /// The job's matrix keys.
    Keys(BTreeSet<String>),
    /// The job's `matrix` is invalid (already reported): accept any key.
    Unknown,
}

impl Ctx {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        if !self.refused.contains(&pos) {
            self.diags.push(Diagnostic::at(pos, message));
        }
    }

    /// Text where only `${{ matrix.<key> }}` is filled in (cache and
    /// artifact fields, a step's `working-directory`): the matrix
    /// references are checked, any other `${{ }}` is refused.
    fn matrix_only(&mut self, pos: Pos, text: &str, subject: &str) -> bool {
        if !text.contains("${{") {
            return true;
        }
        let before = self.diags.len();
        self.matrix_refs(pos, text, subject);
        match segments(text) {
            Err(e) => self.err(pos, format!("invalid {subject}: {e}")),
            Ok(segs) => {
                for seg in segs {
                    if let crate::expr::Segment::Expr { inner, .. } = seg
                        && matrix_ref(inner).is_none()
                        && !inner.trim_start().starts_with("matrix")
                    {
                        self.err(
                            pos,
                            format!(
                                "{subject} uses `${{{{{}}}}}`; only `${{{{ matrix.<key> }}}}` is filled in here (the \
                                 value is decided when the workflow is read, before the run has any data)",
                                show(inner)
                            ),
                        );
                        break;
                    }
                }
            }
        }
        self.diags.len() == before
    }

    /// Whether `inputs.<name>` may be used: always without an `inputs:`
    /// declaration, else only for a declared input.
    fn input_ok(&self, name: &str) -> Result<(), String> {
        match &self.inputs {
            Some(declared) if !declared.contains(name) => Err(format!(
                "`inputs.{}` is not a declared input; the workflow declares {}",
                show(name),
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                }
            )),
            _ => Ok(()),
        }
    }

    /// Check the `${{ }}` parts of text that is evaluated for each run (an
    /// `env` value, a step's `name` or `run`): matrix references as
    /// [`Ctx::matrix_refs`], everything else as an expression over the
    /// run's data. Returns whether the text has a non-matrix expression.
    fn exprs(&mut self, pos: Pos, text: &str, subject: &str) -> bool {
        self.matrix_refs(pos, text, subject);
        let segs = match segments(text) {
            Ok(s) => s,
            Err(e) => {
                self.err(pos, format!("invalid {subject}: {e}"));
                return false;
            }
        };
        let mut any = false;
        for (job, output) in template_output_refs(text) {
            self.output_refs.push(OutputRef { pos, job, output, subject: subject.to_string() });
        }
        for seg in segs {
            let crate::expr::Segment::Expr { inner, offset } = seg else { continue };
            if inner.trim_start().starts_with("matrix") {
                continue;
            }
            any = true;
            let checked = parse_expr(inner, Mode::Template)
                .map_err(|e| e.shifted(offset).to_string())
                .and_then(|e| check_inputs(&e, &|n| self.input_ok(n)));
            if let Err(m) = checked {
                self.err(pos, format!("invalid `${{{{ }}}}` in {subject}: {m}"));
            }
        }
        any
    }

    /// [`Ctx::exprs`] for text decided when the run is accepted (`runs-on`,
    /// `timeout`): over the run's frozen data only, since no job has
    /// outputs yet.
    fn run_exprs(&mut self, pos: Pos, text: &str, subject: &str) -> bool {
        if let Some((job, output)) = template_output_refs(text).into_iter().next() {
            self.err(
                pos,
                format!(
                    "{subject} uses `needs.{}.outputs.{}`, but it is decided when the run is accepted, before any \
                     job has outputs; outputs can be read in `env`, `if:`, `image` and steps",
                    show(&job),
                    show(&output)
                ),
            );
            return false;
        }
        self.exprs(pos, text, subject)
    }

    /// A job's name is its identity: refuse `${{ }}` other than matrix
    /// references in it.
    fn no_name_exprs(&mut self, pos: Pos, text: &str, subject: &str) {
        let Ok(segs) = segments(text) else { return };
        for seg in segs {
            if let crate::expr::Segment::Expr { inner, .. } = seg
                && !inner.trim_start().starts_with("matrix")
            {
                self.err(
                    pos,
                    format!(
                        "{subject} uses `${{{{{}}}}}`; a job's name is its identity (`needs`, artifacts and outputs \
                         refer to it), so it is fixed in the file: only `${{{{ matrix.<key> }}}}` is filled in; put \
                         the value in a step's `name` instead",
                        show(inner)
                    ),
                );
                return;
            }
        }
    }

    /// Check the `${{ matrix.<key> }}` references in a step, env value or
    /// runs-on value. Other `${{ }}` text is left alone (not ours).
    fn matrix_refs(&mut self, pos: Pos, text: &str, subject: &str) {
        let mut rest = text;
        while let Some(start) = rest.find("${{") {
            let after = &rest[start + 3..];
            let Some(end) = after.find("}}") else { break };
            let inner = &after[..end];
            rest = &after[end + 2..];
            if !inner.trim_start().starts_with("matrix") {
                continue;
            }
            let message = match (matrix_ref(inner), &self.matrix_refs) {
                (_, MatrixRefs::Unknown) => None,
                (Some(_), MatrixRefs::NoMatrix) => {
                    Some(format!("{subject} uses `${{{{{}}}}}`, but the job has no `matrix`", show(inner)))
                }
                (Some(k), MatrixRefs::Keys(keys)) if !keys.contains(k) => Some(format!(
                    "{subject} uses `${{{{{}}}}}`, but the matrix has no key `{}`; its keys are {}",
                    show(inner),
                    show(k),
                    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                )),
                (Some(_), MatrixRefs::Keys(_)) => None,
                (None, _) => Some(format!(
                    "{subject} uses `${{{{{}}}}}`; only a plain `${{{{ matrix.<key> }}}}` is substituted here",
                    show(inner).replace("\\'", "'")
                )),
            };
            if let Some(m) = message {
                self.err(pos, m);
            }
        }
    }
}

/// Where `${{ matrix.<key> }}` is substituted (said when it is refused
/// elsewhere).
const MATRIX_PLACES: &str = "a job's `name`, `env`, `runs-on`, `timeout`, `image`, `if`, `concurrency.group`, \
     `cache` `version`/`paths`/`inputs`, the `name` and `path` of `artifacts.publish` and `artifacts.restore`, \
     and a step's `run`, `name`, `env`, `if` and `working-directory` (also the job's `defaults`)";

/// Whether `${{ matrix.* }}` is substituted at this place of a job (`path`:
/// keys from the job's map, `[]` for a list item, `*` for a name in `env`
/// or `runs-on`).
fn matrix_allowed(path: &str) -> bool {
    matches!(
        path,
        "name"
            | "if"
            | "timeout"
            | "image"
            | "image.ref"
            | "concurrency"
            | "concurrency.group"
            | "runs-on"
            | "runs-on.*"
            | "env.*"
            | "cache.version"
            | "cache.paths[]"
            | "cache.inputs[]"
            | "artifacts.publish[].name"
            | "artifacts.publish[].path"
            | "artifacts.restore[].name"
            | "artifacts.restore[].path"
            | "steps[]"
            | "steps[].run"
            | "steps[].name"
            | "steps[].env.*"
            | "steps[].if"
            | "steps[].working-directory"
            | "defaults.working-directory"
    )
}

/// Refuse `${{ matrix.* }}` in every place of a job where it is not
/// substituted (`needs`, `secrets`, `services`, `from_job`, a step's
/// `timeout`, …), saying where it may be used. The job's `matrix` itself is
/// not searched.
fn refuse_matrix_elsewhere(ctx: &mut Ctx, label: &str, entries: &[Entry]) {
    fn walk(ctx: &mut Ctx, label: &str, node: &Node, pattern: &mut String, shown: &mut String) {
        match &node.value {
            Value::Scalar(s) => {
                if matrix_allowed(pattern) {
                    return;
                }
                let Ok(segs) = segments(&s.text) else { return };
                for seg in segs {
                    if let crate::expr::Segment::Expr { inner, .. } = seg
                        && inner.trim_start().starts_with("matrix")
                    {
                        ctx.err(
                            node.pos,
                            format!(
                                "`{shown}` of {label} uses `${{{{{}}}}}`, but matrix values are not filled in there; \
                                 `${{{{ matrix.<key> }}}}` may be used in {MATRIX_PLACES}",
                                show(inner)
                            ),
                        );
                        ctx.refused.insert(node.pos);
                        return;
                    }
                }
            }
            Value::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let (pl, sl) = (pattern.len(), shown.len());
                    pattern.push_str("[]");
                    shown.push_str(&format!("[{}]", i + 1));
                    walk(ctx, label, item, pattern, shown);
                    pattern.truncate(pl);
                    shown.truncate(sl);
                }
            }
            Value::Map(entries) => {
                let named = pattern.ends_with("env") || pattern == "runs-on";
                for e in entries {
                    let (pl, sl) = (pattern.len(), shown.len());
                    if !pattern.is_empty() {
                        pattern.push('.');
                        shown.push('.');
                    }
                    pattern.push_str(if named { "*" } else { &e.key });
                    shown.push_str(&e.key);
                    walk(ctx, label, &e.value, pattern, shown);
                    pattern.truncate(pl);
                    shown.truncate(sl);
                }
            }
        }
    }
    for e in entries.iter().filter(|e| e.key != "matrix") {
        let (mut pattern, mut shown) = (e.key.clone(), e.key.clone());
        walk(ctx, label, &e.value, &mut pattern, &mut shown);
    }
}

/// Replace every `${{ matrix.<key> }}` with the combination's value (empty
/// when this combination lacks an include-only key); leave other text.
fn substitute(text: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("}}") else { break };
        let inner = &after[..end];
        out.push_str(&rest[..start]);
        match matrix_ref(inner) {
            Some(k) => out.push_str(values.get(k).map_or("", String::as_str)),
            None => out.push_str(&rest[start..start + 3 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Whether text holds a `${{ matrix.<key> }}`.
fn has_matrix_ref(text: &str) -> bool {
    segments(text).is_ok_and(|segs| {
        segs.iter().any(|s| matches!(s, crate::expr::Segment::Expr { inner, .. } if matrix_ref(inner).is_some()))
    })
}

/// The artifact and cache fields of one expansion of a matrix job, checked
/// again with the values filled in (a value may hold `/` or `..`, or be
/// missing in this combination).
fn check_expanded(ctx: &mut Ctx, draft: &Draft, matrix_pos: Pos, job: &Job) {
    let in_job = format!("(in `{}`)", show(&job.name));
    let at = |pos: Pos| Node { pos, value: Value::Seq(Vec::new()) };
    let mut seen: HashSet<&str> = HashSet::new();
    for (p, (written, pos)) in job.artifacts.publish.iter().zip(&draft.publish) {
        if p.name == written.name && p.path == written.path {
            seen.insert(&p.name);
            continue;
        }
        let what = format!("artifact name {in_job}");
        if nonempty_expanded(ctx, *pos, &p.name, &what)
            && check_name(ctx, &at(*pos), &p.name, &what)
            && !seen.insert(&p.name)
        {
            ctx.err(
                *pos,
                format!(
                    "`{}` publishes two artifacts named `{}`; artifact names must be unique within a job",
                    show(&job.name),
                    show(&p.name)
                ),
            );
        }
        let s = format!("`path` of artifact `{}` {in_job}", show(&p.name));
        if nonempty_expanded(ctx, *pos, &p.path, &s) && check_path(ctx, &at(*pos), &p.path, &s, false) {
            publish_pattern_ok(ctx, *pos, &p.path, &s);
        }
    }
    for (r, (written, _, pos)) in job.artifacts.restore.iter().zip(&draft.restore) {
        if r.name != written.name {
            let what = format!("restored artifact name {in_job}");
            if nonempty_expanded(ctx, *pos, &r.name, &what) {
                check_name(ctx, &at(*pos), &r.name, &what);
            }
        }
        if r.path != written.path {
            let s = format!("`path` of restored artifact `{}` {in_job}", show(&r.name));
            if nonempty_expanded(ctx, *pos, &r.path, &s) {
                check_path(ctx, &at(*pos), &r.path, &s, false);
            }
        }
    }
    if let Some(cache) = &job.cache {
        for p in &cache.paths {
            let s = format!("a `cache` path {in_job}");
            if nonempty_expanded(ctx, matrix_pos, p, &s)
                && check_path(ctx, &at(matrix_pos), p, &s, true)
                && let Some(why) = absolute_cache_path_problem(p)
            {
                ctx.err(matrix_pos, format!("{s}: {why}"));
            }
        }
        for p in &cache.inputs {
            let s = format!("a `cache` input {in_job}");
            if nonempty_expanded(ctx, matrix_pos, p, &s) {
                check_path(ctx, &at(matrix_pos), p, &s, false);
            }
        }
    }
}

/// A filled-in value must not be empty (a combination without the key).
fn nonempty_expanded(ctx: &mut Ctx, pos: Pos, text: &str, subject: &str) -> bool {
    if text.trim().is_empty() {
        ctx.err(pos, format!("{subject} is empty once the matrix values are filled in; this combination has no value for the key it names"));
        return false;
    }
    true
}

/// A value for messages: control characters escaped, long values shortened.
fn show(s: &str) -> String {
    let escaped: String = s.escape_debug().collect();
    if escaped.chars().count() > 60 {
        let cut: String = escaped.chars().take(57).collect();
        format!("{cut}...")
    } else {
        escaped
    }
}

fn key_list(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// The entries of a map node, or an error saying what was expected.
fn as_map<'a>(ctx: &mut Ctx, node: &'a Node, subject: &str, expected: &str) -> Option<&'a [Entry]> {
    match &node.value {
        Value::Map(entries) => Some(entries),
        _ => {
            ctx.err(node.pos, format!("{subject} must be {expected}, found {}", node.describe()));
            None
        }
    }
}

fn as_seq<'a>(ctx: &mut Ctx, node: &'a Node, subject: &str, expected: &str) -> Option<&'a [Node]> {
    match &node.value {
        Value::Seq(items) => Some(items),
        _ => {
            ctx.err(node.pos, format!("{subject} must be {expected}, found {}", node.describe()));
            None
        }
    }
}

/// The text of a non-empty scalar. Numbers and booleans keep their source
/// form (`1.10` stays `1.10`).
fn as_text<'a>(ctx: &mut Ctx, node: &'a Node, subject: &str, expected: &str) -> Option<&'a str> {
    match &node.value {
        Value::Scalar(s) if s.kind() != ScalarKind::Null => Some(&s.text),
        _ => {
            ctx.err(node.pos, format!("{subject} must be {expected}, found {}", node.describe()));
            None
        }
    }
}

/// Like [`as_text`], and also refuses an empty (or all-blank) string.
fn as_nonempty_text<'a>(ctx: &mut Ctx, node: &'a Node, subject: &str, expected: &str) -> Option<&'a str> {
    let text = as_text(ctx, node, subject, expected)?;
    if text.trim().is_empty() {
        ctx.err(node.pos, format!("{subject} is empty; it must be {expected}"));
        return None;
    }
    Some(text)
}

fn check_keys(ctx: &mut Ctx, entries: &[Entry], allowed: &[&str], place: &str) {
    for e in entries {
        if allowed.contains(&e.key.as_str()) {
            continue;
        }
        let key = show(&e.key);
        let message = match (suggest(&e.key, allowed), NOT_BUILT.iter().find(|(k, _)| *k == e.key)) {
            (Some(s), _) => {
                format!("unknown key `{key}` {place}; did you mean `{s}`? (expected one of {})", key_list(allowed))
            }
            (None, Some((_, why))) => format!("unsupported key `{key}` {place}: {why}"),
            (None, None) => format!("unknown key `{key}` {place}; expected one of {}", key_list(allowed)),
        };
        ctx.err(e.key_pos, message);
    }
}

/// The allowed key an unknown one most likely means: a known alias, the
/// same key with `_`/`-` swapped or another case, or one at most two edits
/// away (for keys of four or more characters).
fn suggest<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    if let Some((_, to)) = ALIASES.iter().find(|(from, _)| *from == lower)
        && let Some(a) = allowed.iter().find(|a| *a == to)
    {
        return Some(a);
    }
    let norm = |k: &str| k.to_ascii_lowercase().replace('_', "-");
    if let Some(a) = allowed.iter().find(|a| norm(a) == norm(key)) {
        return Some(a);
    }
    if key.chars().count() < 4 || key.chars().count() > 40 {
        return None;
    }
    allowed
        .iter()
        .map(|a| (edit_distance(&lower, a), *a))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

/// Levenshtein distance (keys are short).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn get<'a>(entries: &'a [Entry], key: &str) -> Option<&'a Entry> {
    entries.iter().find(|e| e.key == key)
}

/// Where an object is anchored for "missing key" errors: the map itself.
fn require<'a>(
    ctx: &mut Ctx,
    entries: &'a [Entry],
    map_pos: Pos,
    key: &str,
    message: impl FnOnce() -> String,
) -> Option<&'a Entry> {
    let found = get(entries, key);
    if found.is_none() {
        ctx.err(map_pos, message());
    }
    found
}

/// Job and artifact names: non-empty, at most 100 characters, printable,
/// no `/` (they appear in URLs and storage keys).
fn check_name(ctx: &mut Ctx, node: &Node, text: &str, what: &str) -> bool {
    let chars = text.chars().count();
    if chars > MAX_NAME_CHARS {
        ctx.err(
            node.pos,
            format!("{what} `{}` is {chars} characters long; at most {MAX_NAME_CHARS} are allowed", show(text)),
        );
        return false;
    }
    if text.chars().any(char::is_control) {
        ctx.err(
            node.pos,
            format!("{what} `{}` contains a control character; use printable characters only", show(text)),
        );
        return false;
    }
    if text.contains('/') {
        ctx.err(
            node.pos,
            format!("{what} `{}` contains `/`; use letters, digits, `-`, `_` or `.` instead", show(text)),
        );
        return false;
    }
    true
}

/// A path inside the job's workspace: relative, no `..` component.
/// `allow_absolute` is for cache paths, which name directories in the
/// execution image.
fn check_path(ctx: &mut Ctx, node: &Node, text: &str, subject: &str, allow_absolute: bool) -> bool {
    if text.chars().any(char::is_control) {
        ctx.err(node.pos, format!("{subject} contains a control character (`{}`); use a plain path", show(text)));
        return false;
    }
    if !allow_absolute && (text.starts_with('/') || text.starts_with('\\')) {
        ctx.err(
            node.pos,
            format!("{subject} must be relative to the job's workspace, found the absolute path `{}`", show(text)),
        );
        return false;
    }
    if text.split(['/', '\\']).any(|c| c == "..") {
        ctx.err(
            node.pos,
            format!("{subject} must stay inside the workspace, found a `..` component in `{}`", show(text)),
        );
        return false;
    }
    true
}

fn env_key_ok(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A `timeout` text in whole seconds (the one duration syntax of
/// [`crate::parse_duration`]: `90s`, `1m30s`, `2h30m`, `1d`, or seconds).
fn parse_duration(text: &str) -> Option<u64> {
    let d = crate::parse_duration(text).ok()?;
    (d.subsec_nanos() == 0).then_some(d.as_secs())
}

/// One job as read from the file, with the positions the cross-job checks
/// point at.
struct Draft {
    label: String,
    name: Option<(String, Pos)>,
    needs_declared: bool,
    needs: Vec<(String, Pos)>,
    /// `needs-policy: {quorum: N}` and the position of N.
    quorum: Option<(u32, Pos)>,
    matrix: Option<MatrixSpec>,
    /// `rings:` and its position.
    rings: Option<(Vec<RingSpec>, Pos)>,
    /// `(artifact, position of its entry)`
    publish: Vec<(Publish, Pos)>,
    /// `(restore, position of from_job, position of name)`
    restore: Vec<(Restore, Pos, Pos)>,
    /// `needs.<job>.outputs.<name>` the job reads.
    output_refs: Vec<OutputRef>,
    job: Job,
}

pub(crate) fn validate(root: &Node, jobs_map: bool) -> Result<Workflow, Vec<Diagnostic>> {
    let mut ctx = Ctx { jobs_map, ..Ctx::default() };
    let workflow = workflow(&mut ctx, root);
    match workflow {
        Some(w) if ctx.diags.is_empty() => Ok(w),
        _ => {
            if ctx.diags.is_empty() {
                ctx.err(root.pos, "the workflow file is invalid");
            }
            Err(ctx.diags)
        }
    }
}

fn workflow(ctx: &mut Ctx, root: &Node) -> Option<Workflow> {
    let top = match &root.value {
        Value::Map(entries) => entries,
        Value::Scalar(s) if s.kind() == ScalarKind::Null => {
            ctx.err(root.pos, "the workflow file is empty; start it with `version: 1` and a `jobs:` list");
            return None;
        }
        _ => {
            ctx.err(
                root.pos,
                format!("a workflow file must be a map with `version: 1` and `jobs:`, found {}", root.describe()),
            );
            return None;
        }
    };
    check_keys(ctx, top, TOP_KEYS, "at the top level");
    // Read before `jobs`, so that its problems are reported even when the
    // jobs are missing.
    let triggers = get(top, "on").and_then(|e| on::on(ctx, &e.value)).unwrap_or_default();
    let inputs = match get(top, "inputs") {
        None => BTreeMap::new(),
        Some(e) => {
            let inputs = declared_inputs(ctx, &e.value).unwrap_or_default();
            // Even when some are invalid: check references against what is declared.
            ctx.inputs = Some(match &e.value.value {
                Value::Map(entries) => entries.iter().map(|e| e.key.clone()).collect(),
                _ => BTreeSet::new(),
            });
            inputs
        }
    };
    if let Some(e) = get(top, "env") {
        ctx.env = env(ctx, "the workflow", &e.value).unwrap_or_default();
        for r in std::mem::take(&mut ctx.output_refs) {
            ctx.err(
                r.pos,
                format!(
                    "`needs.{}.outputs.{}` in {} cannot be read in the workflow's `env` (no job is known there); \
                     set it in the `env` of the job that needs `{}`",
                    r.job, r.output, r.subject, r.job
                ),
            );
        }
    }
    if let Some(e) = get(top, "defaults") {
        ctx.defaults = defaults(ctx, "the workflow", &e.value).unwrap_or_default();
    }

    let version = match require(ctx, top, root.pos, "version", || {
        "missing `version`; add `version: 1` at the top of the file".to_string()
    }) {
        None => None,
        Some(e) => match &e.value.value {
            Value::Scalar(s) if s.kind() == ScalarKind::Int => match s.as_int() {
                Some(1) => Some(1u32),
                _ => {
                    ctx.err(
                        e.value.pos,
                        format!(
                            "unsupported workflow `version: {}`; this version of Kiln understands `version: 1`",
                            show(&s.text)
                        ),
                    );
                    None
                }
            },
            _ => {
                ctx.err(
                    e.value.pos,
                    format!("`version` must be the number 1 (write `version: 1`), found {}", e.value.describe()),
                );
                None
            }
        },
    };

    let jobs_entry =
        require(ctx, top, root.pos, "jobs", || "missing `jobs`; add a `jobs:` list with at least one job".to_string())?;
    let items = as_seq(
        ctx,
        &jobs_entry.value,
        "`jobs`",
        "a list of jobs (each starting with `- name: ...`) or a map of job names to jobs",
    )?;
    if items.is_empty() {
        ctx.err(jobs_entry.value.pos, "`jobs` is empty; add at least one job with a `name` and `steps`");
        return None;
    }
    if items.len() > MAX_JOBS {
        ctx.err(
            jobs_entry.value.pos,
            format!("`jobs` lists {} jobs; at most {MAX_JOBS} are allowed in one workflow", items.len()),
        );
        // Validating tens of thousands of jobs (and their ancestor sets) is
        // wasted work on a file that is refused anyway.
        return None;
    }

    let run_concurrency = get(top, "concurrency").and_then(|e| concurrency(ctx, "the run", &e.value, Level::Run));
    let run_timeout = get(top, "timeout").and_then(|e| {
        let subject = "the run's `timeout`";
        if let Value::Scalar(s) = &e.value.value
            && s.text.contains("${{")
        {
            ctx.err(e.value.pos, format!("{subject} uses `${{{{ }}}}`; the run's timeout is a plain duration"));
            return None;
        }
        duration_secs(ctx, subject, &e.value, MAX_TIMEOUT_SECS, "7d")
    });
    let priority = match get(top, "priority") {
        None => Some(BTreeMap::new()),
        Some(e) => priority(ctx, &e.value),
    };
    let drafts: Vec<Draft> = items.iter().enumerate().filter_map(|(i, node)| job(ctx, i, node)).collect();
    let jobs = cross_check(ctx, drafts);
    Some(Workflow {
        version: version?,
        concurrency: run_concurrency,
        jobs,
        on: triggers,
        inputs,
        timeout_secs: run_timeout,
        priority: priority?,
    })
}

/// `priority:` (issue 44): a lane for every event, or a map of event to lane.
fn priority(ctx: &mut Ctx, node: &Node) -> Option<BTreeMap<String, String>> {
    let lanes = key_list(crate::model::PRIORITY_LANES);
    let lane = |ctx: &mut Ctx, n: &Node, subject: &str| -> Option<String> {
        let text = as_nonempty_text(ctx, n, subject, "a priority lane")?;
        if crate::model::PRIORITY_LANES.contains(&text) {
            Some(text.to_string())
        } else {
            ctx.err(n.pos, format!("{subject} is `{}`; expected one of {lanes}", show(text)));
            None
        }
    };
    if let Value::Scalar(_) = &node.value {
        return lane(ctx, node, "`priority`").map(|l| BTreeMap::from([("*".to_string(), l)]));
    }
    let entries =
        as_map(ctx, node, "`priority`", "a lane (`urgent`, `normal`, `background`) or a map of event to lane")?;
    check_keys(ctx, entries, crate::model::PRIORITY_EVENTS, "in `priority`");
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries.iter().filter(|e| crate::model::PRIORITY_EVENTS.contains(&e.key.as_str())) {
        match lane(ctx, &e.value, &format!("`priority.{}`", e.key)) {
            Some(l) => {
                out.insert(e.key.clone(), l);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn job(ctx: &mut Ctx, index: usize, node: &Node) -> Option<Draft> {
    let number = index + 1;
    let entries = as_map(ctx, node, &format!("job {number}"), "a map with `name` and `steps`")?;

    // The name first: every other message mentions it.
    let mut name = None;
    match get(entries, "name") {
        None => ctx.err(node.pos, format!("job {number} has no `name`; add `name: <job name>`")),
        Some(e) => {
            let subject = format!("`name` of job {number}");
            if let Some(text) = as_nonempty_text(ctx, &e.value, &subject, "a job name")
                && check_name(ctx, &e.value, text, "job name")
            {
                ctx.no_name_exprs(e.value.pos, text, &subject);
                name = Some((text.to_string(), e.value.pos));
            }
        }
    }
    let label = match &name {
        Some((n, _)) => format!("job `{}`", show(n)),
        None => format!("job {number}"),
    };
    let place = format!("in {label}");
    refuse_matrix_elsewhere(ctx, &label, entries);
    check_keys(ctx, entries, JOB_KEYS, &place);

    let matrix_entry = get(entries, "matrix");
    let matrix = matrix_entry.and_then(|e| matrix(ctx, &label, &e.value));
    ctx.matrix_refs = match (matrix_entry, &matrix) {
        (None, _) => MatrixRefs::NoMatrix,
        (Some(_), Some(m)) => MatrixRefs::Keys(m.order.iter().cloned().collect()),
        (Some(_), None) => MatrixRefs::Unknown,
    };
    let job_defaults = match get(entries, "defaults") {
        None => ctx.defaults.clone(),
        Some(e) => {
            let own = defaults(ctx, &label, &e.value).unwrap_or_default();
            Defaults {
                shell: own.shell.or_else(|| ctx.defaults.shell.clone()),
                working_directory: own.working_directory.or_else(|| ctx.defaults.working_directory.clone()),
            }
        }
    };
    let steps = match require(ctx, entries, node.pos, "steps", || {
        format!("{label} has no `steps`; add a `steps:` list with at least one command")
    }) {
        None => Vec::new(),
        Some(e) => steps(ctx, &label, &e.value, &job_defaults).unwrap_or_default(),
    };
    let image = get(entries, "image").and_then(|e| image(ctx, &label, &e.value));
    let needs_entry = get(entries, "needs");
    let needs = needs_entry.map(|e| needs_list(ctx, &label, &e.value)).unwrap_or_default();
    let quorum = get(entries, "needs-policy").and_then(|e| needs_policy(ctx, &label, &e.value));
    let condition = get(entries, "if").and_then(|e| condition(ctx, &label, &e.value));
    let environment = get(entries, "environment").and_then(|e| environment(ctx, &label, &e.value));
    let level = Level::Job { environment: get(entries, "environment").is_some() };
    let job_concurrency = get(entries, "concurrency").and_then(|e| concurrency(ctx, &label, &e.value, level));
    let cache = get(entries, "cache").and_then(|e| cache(ctx, &label, &e.value));
    let (publish, restore) = get(entries, "artifacts").map(|e| artifacts(ctx, &label, &e.value)).unwrap_or_default();
    let (timeout_secs, timeout_expr) =
        get(entries, "timeout").map(|e| timeout(ctx, &label, &e.value)).unwrap_or_default();
    let (hang_after_secs, hang_kill_after_secs) = hang(ctx, &label, entries);
    let (retry, retry_on, retry_exit_codes) =
        get(entries, "retry").and_then(|e| retry(ctx, &label, &e.value)).unwrap_or_default();
    let runs_on = get(entries, "runs-on").and_then(|e| runs_on(ctx, &label, &e.value)).unwrap_or_default();
    let own_env = get(entries, "env").and_then(|e| env(ctx, &label, &e.value)).unwrap_or_default();
    // Precedence: step > job > workflow. The workflow's `env` is resolved
    // into every job here (a file without it is unchanged).
    let mut env = ctx.env.clone();
    env.extend(own_env);
    let secrets = get(entries, "secrets").and_then(|e| secrets(ctx, &label, &e.value, &env)).unwrap_or_default();
    let id_token = get(entries, "id-token").and_then(|e| id_token(ctx, &label, &e.value));
    let services = get(entries, "services").and_then(|e| services::services(ctx, &label, &e.value)).unwrap_or_default();
    let outputs = get(entries, "outputs").and_then(|e| outputs(ctx, &label, &e.value)).unwrap_or_default();
    let reports = get(entries, "reports").and_then(|e| reports(ctx, &label, &e.value));
    let rings = get(entries, "rings").and_then(|e| {
        rings(ctx, &label, &e.value, environment.is_some(), matrix_entry.is_some()).map(|r| (r, e.value.pos))
    });
    let checkout = get(entries, "checkout").and_then(|e| checkout(ctx, &label, &e.value));
    let output_refs = std::mem::take(&mut ctx.output_refs);

    let job = Job {
        name: name.as_ref().map(|(n, _)| n.clone()).unwrap_or_default(),
        image,
        steps,
        needs: Vec::new(),
        cache,
        artifacts: Artifacts {
            publish: publish.iter().map(|(p, _)| p.clone()).collect(),
            restore: restore.iter().map(|(r, _, _)| r.clone()).collect(),
        },
        env,
        secrets,
        id_token,
        timeout_secs,
        timeout_expr,
        hang_after_secs,
        hang_kill_after_secs,
        retry,
        retry_on,
        retry_exit_codes,
        runs_on,
        matrix: None,
        quorum: quorum.map(|(n, _)| n),
        condition,
        concurrency: job_concurrency,
        environment,
        services,
        outputs,
        reports,
        promotion: None,
        checkout,
    };
    ctx.matrix_refs = MatrixRefs::NoMatrix;
    Some(Draft {
        label,
        name,
        needs_declared: needs_entry.is_some(),
        needs,
        quorum,
        matrix,
        rings,
        publish,
        restore,
        output_refs,
        job,
    })
}

fn steps(ctx: &mut Ctx, label: &str, node: &Node, defaults: &Defaults) -> Option<Vec<Step>> {
    let items = as_seq(ctx, node, &format!("`steps` of {label}"), "a list of commands")?;
    if items.is_empty() {
        ctx.err(node.pos, format!("`steps` of {label} is empty; add at least one command"));
        return None;
    }
    if items.len() > MAX_STEPS {
        ctx.err(
            node.pos,
            format!(
                "{label} has {} steps; at most {MAX_STEPS} are allowed per job (split it into several jobs)",
                items.len()
            ),
        );
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = items.len() <= MAX_STEPS;
    for (i, item) in items.iter().enumerate() {
        let subject = format!("step {} of {label}", i + 1);
        let step = match &item.value {
            Value::Map(entries) => step(ctx, &subject, item.pos, entries, defaults),
            _ => {
                let run = as_nonempty_text(ctx, item, &subject, "a command string or a map with `run`");
                run.and_then(|run| {
                    let shell = defaults.shell.clone();
                    check_script(ctx, item.pos, run, &subject, shell.as_deref()).then(|| Step {
                        run: run.to_string(),
                        shell,
                        working_directory: defaults.working_directory.clone(),
                        ..Step::default()
                    })
                })
            }
        };
        match step {
            Some(s) => out.push(s),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Check a step's `run`: its `${{ }}` parts, and that they can become
/// environment references for its shell.
fn check_script(ctx: &mut Ctx, pos: Pos, run: &str, subject: &str, shell: Option<&str>) -> bool {
    let before = ctx.diags.len();
    let has_exprs = ctx.exprs(pos, run, subject);
    if has_exprs && !shell_expands(shell) {
        ctx.err(
            pos,
            format!(
                "{subject} uses `${{{{ }}}}` with `shell: {}`; values are handed to the script as environment variables, which only `sh` and `bash` steps can reference in `run` — set the value in the step's `env` and read it from the environment",
                show(shell.unwrap_or("sh"))
            ),
        );
    } else if has_exprs && let Err(e) = check_run(run) {
        ctx.err(pos, format!("invalid {subject}: {}", script_error(run, &e)));
    }
    ctx.diags.len() == before
}

/// A refusal of `run`'s text, with where in the script it stands.
fn script_error(run: &str, e: &crate::expr::ExprError) -> String {
    let before = &run[..e.offset.min(run.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()).saturating_sub(2).max(1);
    format!("at line {line}, column {column} of the script: {}", e.message)
}

fn step(ctx: &mut Ctx, subject: &str, pos: Pos, entries: &[Entry], defaults: &Defaults) -> Option<Step> {
    check_keys(ctx, entries, STEP_KEYS, &format!("in {subject}"));
    let mut ok = true;
    let shell = match get(entries, "shell") {
        None => defaults.shell.clone(),
        Some(e) => {
            let s = shell(ctx, &format!("`shell` of {subject}"), &e.value);
            ok &= s.is_some();
            s
        }
    };
    let run = match require(ctx, entries, pos, "run", || format!("{subject} has no `run`; add `run: <command>`")) {
        None => None,
        Some(e) => {
            let run_subject = format!("`run` in {subject}");
            as_nonempty_text(ctx, &e.value, &run_subject, "a command string")
                .filter(|run| check_script(ctx, e.value.pos, run, &run_subject, shell.as_deref()))
        }
    };
    let name = match get(entries, "name") {
        None => Some(None),
        Some(e) => {
            let n = as_nonempty_text(ctx, &e.value, &format!("`name` in {subject}"), "a string");
            if let Some(n) = n {
                ctx.exprs(e.value.pos, n, &format!("`name` in {subject}"));
            }
            n.map(|n| Some(n.to_string()))
        }
    };
    let env = match get(entries, "env") {
        None => Some(BTreeMap::new()),
        Some(e) => env(ctx, subject, &e.value),
    };
    let condition = match get(entries, "if") {
        None => Some(None),
        Some(e) => condition(ctx, subject, &e.value).map(Some),
    };
    let working_directory = match get(entries, "working-directory") {
        None => Some(defaults.working_directory.clone()),
        Some(e) => working_directory(ctx, &format!("`working-directory` of {subject}"), &e.value).map(Some),
    };
    let timeout_secs = match get(entries, "timeout") {
        None => Some(None),
        Some(e) => step_timeout(ctx, subject, &e.value).map(Some),
    };
    let continue_on_error = match get(entries, "continue-on-error") {
        None => Some(false),
        Some(e) => boolean(ctx, &format!("`continue-on-error` of {subject}"), &e.value),
    };
    if !ok {
        return None;
    }
    Some(Step {
        name: name?,
        run: run?.to_string(),
        env: env?,
        condition: condition?,
        working_directory: working_directory?,
        timeout_secs: timeout_secs?,
        continue_on_error: continue_on_error?,
        shell,
    })
}

fn boolean(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<bool> {
    match &node.value {
        Value::Scalar(s) if s.kind() == ScalarKind::Bool => Some(s.text.eq_ignore_ascii_case("true")),
        _ => {
            ctx.err(node.pos, format!("{subject} must be `true` or `false`, found {}", node.describe()));
            None
        }
    }
}

fn shell(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<String> {
    let text = as_nonempty_text(ctx, node, subject, "`sh`, `bash`, `python3` or a command template with `{0}`")?;
    match check_shell(text) {
        Ok(()) => Some(text.to_string()),
        Err(e) => {
            ctx.err(node.pos, format!("{subject}: {e}"));
            None
        }
    }
}

fn working_directory(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<String> {
    let text = as_nonempty_text(ctx, node, subject, "a directory in the checkout")?;
    (ctx.matrix_only(node.pos, text, subject) && check_path(ctx, node, text, subject, false)).then(|| text.to_string())
}

/// `defaults: {shell, working-directory}` of the workflow or a job.
fn defaults(ctx: &mut Ctx, owner: &str, node: &Node) -> Option<Defaults> {
    let subject = format!("`defaults` of {owner}");
    let entries = as_map(ctx, node, &subject, "a map with `shell` and/or `working-directory`")?;
    if let Some(run) = get(entries, "run") {
        ctx.err(
            run.key_pos,
            format!("{subject} takes `shell` and `working-directory` directly (`defaults: {{shell: bash}}`), not under `run`"),
        );
        return None;
    }
    check_keys(ctx, entries, DEFAULTS_KEYS, &format!("in {subject}"));
    let shell = match get(entries, "shell") {
        None => Some(None),
        Some(e) => shell(ctx, &format!("`shell` in {subject}"), &e.value).map(Some),
    };
    let working_directory = match get(entries, "working-directory") {
        None => Some(None),
        Some(e) => working_directory(ctx, &format!("`working-directory` in {subject}"), &e.value).map(Some),
    };
    Some(Defaults { shell: shell?, working_directory: working_directory? })
}

/// Input names: letters, digits, `_` and `-`, starting with a letter or `_`
/// (what `inputs.<name>` can spell).
fn input_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= 100
}

/// `inputs: {name: {type, description, default, required, options}}`.
fn declared_inputs(ctx: &mut Ctx, node: &Node) -> Option<BTreeMap<String, InputSpec>> {
    let subject = "`inputs`";
    let entries = as_map(ctx, node, subject, "a map of input names to `{type, default, required, description}`")?;
    if entries.len() > MAX_DECLARED_INPUTS {
        ctx.err(
            node.pos,
            format!("{subject} declares {} inputs; at most {MAX_DECLARED_INPUTS} are allowed", entries.len()),
        );
        return None;
    }
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries {
        if !input_name_ok(&e.key) {
            ctx.err(
                e.key_pos,
                format!(
                    "`{}` is not a valid input name; use letters, digits, `_` and `-`, starting with a letter",
                    show(&e.key)
                ),
            );
            ok = false;
            continue;
        }
        match input(ctx, &e.key, &e.value) {
            Some(spec) => {
                out.insert(e.key.clone(), spec);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn input(ctx: &mut Ctx, name: &str, node: &Node) -> Option<InputSpec> {
    let subject = format!("input `{name}`");
    let entries = as_map(ctx, node, &subject, "a map like `{type: string, default: x}`")?;
    check_keys(ctx, entries, INPUT_KEYS, &format!("in {subject}"));
    let kind = match get(entries, "type") {
        None => Some(InputKind::String),
        Some(e) => match as_text(ctx, &e.value, &format!("`type` of {subject}"), "a type name") {
            Some("string") => Some(InputKind::String),
            Some("boolean") => Some(InputKind::Boolean),
            Some("number") => Some(InputKind::Number),
            Some("choice") => Some(InputKind::Choice),
            Some(other) => {
                ctx.err(
                    e.value.pos,
                    format!("`type` of {subject} is `{}`; use `string`, `boolean`, `number` or `choice`", show(other)),
                );
                None
            }
            None => None,
        },
    }?;
    let description = match get(entries, "description") {
        None => Some(None),
        Some(e) => as_text(ctx, &e.value, &format!("`description` of {subject}"), "a string").and_then(|d| {
            if d.chars().count() > MAX_DESCRIPTION_CHARS {
                ctx.err(
                    e.value.pos,
                    format!("`description` of {subject} is longer than {MAX_DESCRIPTION_CHARS} characters"),
                );
                None
            } else {
                Some(Some(d.to_string()))
            }
        }),
    };
    let required = match get(entries, "required") {
        None => Some(false),
        Some(e) => boolean(ctx, &format!("`required` of {subject}"), &e.value),
    };
    let options = match (get(entries, "options"), kind) {
        (None, InputKind::Choice) => {
            ctx.err(node.pos, format!("{subject} is a `choice` without `options`; list the allowed values"));
            None
        }
        (None, _) => Some(Vec::new()),
        (Some(e), InputKind::Choice) => {
            let os = format!("`options` of {subject}");
            as_seq(ctx, &e.value, &os, "a list of values").and_then(|items| {
                let mut opts: Vec<String> = Vec::new();
                for item in items {
                    let v = matrix_value(ctx, item, &format!("an entry of {os}"))?;
                    if opts.contains(&v) {
                        ctx.err(item.pos, format!("{os} lists `{}` twice", show(&v)));
                        return None;
                    }
                    opts.push(v);
                }
                if opts.is_empty() {
                    ctx.err(e.value.pos, format!("{os} is empty; list at least one value"));
                    return None;
                }
                Some(opts)
            })
        }
        (Some(e), _) => {
            ctx.err(e.key_pos, format!("`options` of {subject} only applies to `type: choice`"));
            None
        }
    };
    let mut spec = InputSpec { kind, description: description?, default: None, required: required?, options: options? };
    if let Some(e) = get(entries, "default") {
        let v = matrix_value(ctx, &e.value, &format!("`default` of {subject}"))?;
        if let Err(m) = spec.check(&v) {
            ctx.err(e.value.pos, format!("`default` of {subject} ({}) {m}", kind.as_str()));
            return None;
        }
        spec.default = Some(v);
    }
    Some(spec)
}

fn image(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Image> {
    let subject = format!("`image` of {label}");
    let expected = "an image reference or a map with `ref` or `dockerfile`";
    let check_ref = |ctx: &mut Ctx, n: &Node, text: &str| {
        if text.contains("${{") {
            // Evaluated at acceptance over the run's data, or at claim when
            // it reads outputs (then it must name an image by digest).
            ctx.exprs(n.pos, text, &format!("the image reference of {label}"));
            true
        } else if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            ctx.err(
                n.pos,
                format!("image reference `{}` in {label} contains whitespace or control characters", show(text)),
            );
            false
        } else {
            true
        }
    };
    let entries = match &node.value {
        Value::Scalar(_) => {
            let text = as_nonempty_text(ctx, node, &subject, expected)?;
            return check_ref(ctx, node, text).then(|| Image::Ref { reference: text.to_string() });
        }
        _ => as_map(ctx, node, &subject, expected)?,
    };
    check_keys(ctx, entries, IMAGE_KEYS, &format!("in {subject}"));
    let reference = get(entries, "ref");
    let dockerfile = get(entries, "dockerfile");
    let context = get(entries, "context");
    match (reference, dockerfile) {
        (Some(_), Some(d)) => {
            ctx.err(
                d.key_pos,
                format!(
                    "{subject} sets both `ref` and `dockerfile`; use `ref` for a registry image or `dockerfile` to build one, not both"
                ),
            );
            None
        }
        (None, None) => {
            ctx.err(
                node.pos,
                format!("{subject} needs `ref: <image reference>` or `dockerfile: <path in the repository>`"),
            );
            None
        }
        (Some(r), None) => {
            if let Some(c) = context {
                ctx.err(c.key_pos, format!("`context` in {subject} only applies with `dockerfile`; remove it"));
                return None;
            }
            let text = as_nonempty_text(ctx, &r.value, &format!("`ref` in {subject}"), "an image reference")?;
            check_ref(ctx, &r.value, text).then(|| Image::Ref { reference: text.to_string() })
        }
        (None, Some(d)) => {
            let path_subject = format!("`dockerfile` in {subject}");
            let path = as_nonempty_text(ctx, &d.value, &path_subject, "a path in the repository")
                .filter(|p| check_path(ctx, &d.value, p, &path_subject, false));
            let context = match context {
                None => Some("."),
                Some(c) => {
                    let s = format!("`context` in {subject}");
                    as_nonempty_text(ctx, &c.value, &s, "a directory in the repository")
                        .filter(|p| check_path(ctx, &c.value, p, &s, false))
                }
            };
            Some(Image::Dockerfile { path: path?.to_string(), context: context?.to_string() })
        }
    }
}

fn needs_list(ctx: &mut Ctx, label: &str, node: &Node) -> Vec<(String, Pos)> {
    let subject = format!("`needs` of {label}");
    let expected = "a job name or a list of job names";
    let nodes: Vec<&Node> = match &node.value {
        Value::Seq(items) => items.iter().collect(),
        Value::Scalar(_) => vec![node],
        Value::Map(_) => {
            as_seq(ctx, node, &subject, expected);
            return Vec::new();
        }
    };
    let mut out: Vec<(String, Pos)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for n in nodes {
        match as_nonempty_text(ctx, n, &format!("an entry of {subject}"), "a job name") {
            None => {}
            Some(text) => {
                if !seen.insert(text) {
                    ctx.err(n.pos, format!("{label} lists `{}` twice in `needs`; remove one", show(text)));
                } else {
                    out.push((text.to_string(), n.pos));
                }
            }
        }
    }
    out
}

/// `secrets: [NAME, …]`: repository secrets this job receives as
/// environment variables of the same name (trusted runs only).
fn secrets(ctx: &mut Ctx, label: &str, node: &Node, env: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let subject = format!("`secrets` of {label}");
    let items = as_seq(ctx, node, &subject, "a list of secret names")?;
    let mut out: Vec<String> = Vec::new();
    let mut ok = true;
    for item in items {
        let Some(name) = as_nonempty_text(ctx, item, &format!("an entry of {subject}"), "a secret name") else {
            ok = false;
            continue;
        };
        if !env_key_ok(name) {
            ctx.err(
                item.pos,
                format!(
                    "`{}` in {subject} is not a valid secret name; use letters, digits and `_`, not starting with a digit",
                    show(name)
                ),
            );
            ok = false;
        } else if out.iter().any(|n| n == name) {
            ctx.err(item.pos, format!("{label} lists secret `{name}` twice; remove one"));
            ok = false;
        } else if env.contains_key(name) {
            ctx.err(
                item.pos,
                format!("{label} sets `{name}` in `env` and also asks for the secret `{name}`; keep one"),
            );
            ok = false;
        } else {
            out.push(name.to_string());
        }
    }
    ok.then_some(out)
}

/// `id-token: write` or `id-token: {audience: AUD}`: the job receives a
/// signed OIDC identity token (trusted runs only).
fn id_token(ctx: &mut Ctx, label: &str, node: &Node) -> Option<IdToken> {
    let subject = format!("`id-token` of {label}");
    let expected = "`write`, or a map with `audience`";
    if let Value::Scalar(_) = &node.value {
        let text = as_nonempty_text(ctx, node, &subject, expected)?;
        if text != "write" {
            ctx.err(node.pos, format!("{subject} is `{}`; expected {expected}", show(text)));
            return None;
        }
        return Some(IdToken { audience: None });
    }
    let entries = as_map(ctx, node, &subject, expected)?;
    check_keys(ctx, entries, ID_TOKEN_KEYS, &format!("in {subject}"));
    let audience = match get(entries, "audience") {
        None => None,
        Some(e) => {
            let a = as_nonempty_text(ctx, &e.value, &format!("`audience` of {subject}"), "an audience string")?;
            if a.len() > 256 || a.chars().any(|c| c.is_control() || c.is_whitespace()) {
                ctx.err(e.value.pos, format!("`audience` of {subject} must be up to 256 characters without spaces"));
                return None;
            }
            Some(a.to_string())
        }
    };
    Some(IdToken { audience })
}

/// A job's `checkout:` map (issue 47).
fn checkout(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Checkout> {
    let subject = format!("`checkout` of {label}");
    let entries = as_map(ctx, node, &subject, "a map with `reuse`, `depth`, `filter` or `sparse`")?;
    check_keys(ctx, entries, CHECKOUT_KEYS, &format!("in {subject}"));
    let mut ok = true;
    let mut out = Checkout::default();
    if let Some(e) = get(entries, "reuse") {
        match &e.value.value {
            Value::Scalar(s) if s.kind() == ScalarKind::Bool => out.reuse = s.text.eq_ignore_ascii_case("true"),
            _ => {
                ctx.err(
                    e.value.pos,
                    format!("`reuse` in {subject} must be `true` or `false`, found {}", e.value.describe()),
                );
                ok = false;
            }
        }
    }
    if let Some(e) = get(entries, "depth") {
        let depth = as_text(ctx, &e.value, &format!("`depth` in {subject}"), "a number of commits")
            .and_then(|t| t.parse::<u32>().ok().filter(|d| (1..=MAX_CHECKOUT_DEPTH).contains(d)));
        match depth {
            Some(d) => out.depth = Some(d),
            None => {
                ctx.err(
                    e.value.pos,
                    format!(
                        "`depth` in {subject} must be a number of commits from 1 to {MAX_CHECKOUT_DEPTH}, found {} \
                         (leave it out for the whole history)",
                        match &e.value.value {
                            Value::Scalar(sc) => format!("`{}`", show(&sc.text)),
                            _ => e.value.describe().to_string(),
                        }
                    ),
                );
                ok = false;
            }
        }
    }
    if let Some(e) = get(entries, "filter") {
        match as_text(ctx, &e.value, &format!("`filter` in {subject}"), "`blob:none`") {
            Some("blob:none") => out.filter = Some("blob:none".into()),
            Some(other) => {
                ctx.err(
                    e.value.pos,
                    format!("`filter` in {subject} is `{}`; the one filter supported is `blob:none`", show(other)),
                );
                ok = false;
            }
            None => ok = false,
        }
    }
    if let Some(e) = get(entries, "sparse") {
        let s = format!("`sparse` in {subject}");
        match string_list(ctx, &e.value, &s, false) {
            Some(paths) if paths.is_empty() => {
                ctx.err(e.value.pos, format!("{s} is empty; list the directories to check out, or leave it out"));
                ok = false;
            }
            Some(paths) if paths.len() > MAX_SPARSE_PATHS => {
                ctx.err(
                    e.value.pos,
                    format!("{s} lists {} directories; at most {MAX_SPARSE_PATHS} are allowed", paths.len()),
                );
                ok = false;
            }
            Some(paths) => {
                let items = match &e.value.value {
                    Value::Seq(items) => items.as_slice(),
                    _ => &[],
                };
                for (p, item) in paths.iter().zip(items) {
                    let bad = p.contains(['*', '?', '[', '!', '\\'])
                        || p.starts_with('#')
                        || p.split('/').all(|c| c.is_empty() || c == ".");
                    if bad {
                        ctx.err(
                            item.pos,
                            format!(
                                "an entry of {s} is `{}`; name a directory of the repository (no patterns: the \
                                 checkout is in cone mode)",
                                show(p)
                            ),
                        );
                        ok = false;
                    }
                }
                out.sparse = paths.iter().map(|p| p.trim_matches('/').to_string()).collect();
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn string_list(ctx: &mut Ctx, node: &Node, subject: &str, allow_absolute: bool) -> Option<Vec<String>> {
    let items = as_seq(ctx, node, subject, "a list of paths")?;
    let mut out = Vec::new();
    let mut ok = true;
    for item in items {
        let s = format!("an entry of {subject}");
        match as_nonempty_text(ctx, item, &s, "a path")
            .filter(|p| ctx.matrix_only(item.pos, p, &s) && check_path(ctx, item, p, &s, allow_absolute))
        {
            Some(p) => out.push(p.to_string()),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn cache(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Cache> {
    let subject = format!("`cache` of {label}");
    let entries = as_map(ctx, node, &subject, "a map with `kind`, `version`, `inputs` and `paths`")?;
    check_keys(ctx, entries, CACHE_KEYS, &format!("in {subject}"));
    let text_field = |ctx: &mut Ctx, key: &str, expected: &str| -> Option<String> {
        let e =
            require(ctx, entries, node.pos, key, || format!("{subject} has no `{key}`; add `{key}: <{expected}>`"))?;
        as_nonempty_text(ctx, &e.value, &format!("`{key}` in {subject}"), expected).map(str::to_string)
    };
    let kind = text_field(ctx, "kind", "cache kind");
    let version = text_field(ctx, "version", "cache version").filter(|v| {
        let pos = get(entries, "version").map_or(node.pos, |e| e.value.pos);
        ctx.matrix_only(pos, v, &format!("`version` in {subject}"))
    });
    let inputs = match get(entries, "inputs") {
        None => Some(Vec::new()),
        Some(e) => string_list(ctx, &e.value, &format!("`inputs` in {subject}"), false),
    };
    let paths = match require(ctx, entries, node.pos, "paths", || {
        format!("{subject} has no `paths`; list the directories to cache under `paths`")
    }) {
        None => None,
        Some(e) => {
            let s = format!("`paths` in {subject}");
            let paths = string_list(ctx, &e.value, &s, true);
            if paths.as_ref().is_some_and(Vec::is_empty) {
                ctx.err(e.value.pos, format!("{s} is empty; list at least one directory to cache"));
                None
            } else if let (Some(ps), Value::Seq(items)) = (&paths, &e.value.value) {
                let mut ok = true;
                for (p, item) in ps.iter().zip(items) {
                    if let Some(why) = absolute_cache_path_problem(p) {
                        ctx.err(item.pos, format!("an entry of {s}: {why}"));
                        ok = false;
                    }
                }
                ok.then_some(paths).flatten()
            } else {
                paths
            }
        }
    };
    let restore_prefix = match get(entries, "restore-prefix") {
        None => Some(false),
        Some(e) => match &e.value.value {
            Value::Scalar(sc) if sc.kind() == ScalarKind::Bool => {
                let on = sc.text.eq_ignore_ascii_case("true");
                if on && kind.as_deref().is_some_and(|k| k != "dependencies") {
                    ctx.err(
                        e.value.pos,
                        format!(
                            "`restore-prefix` in {subject} is for dependency caches (`kind: dependencies`) only: \
                             an entry saved for other inputs must not stand in for `{}` outputs",
                            kind.as_deref().unwrap_or_default()
                        ),
                    );
                    None
                } else {
                    Some(on)
                }
            }
            _ => {
                ctx.err(
                    e.value.pos,
                    format!("`restore-prefix` in {subject} must be `true` or `false`, found {}", e.value.describe()),
                );
                None
            }
        },
    };
    Some(Cache { kind: kind?, version: version?, inputs: inputs?, paths: paths?, restore_prefix: restore_prefix? })
}

/// Directories a cache may not be mounted over (absolute cache paths are
/// mounted into the job's container).
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/tmp",
    "/workspace",
];

/// Why an absolute cache path cannot be used (None for a relative path or
/// a usable absolute one).
fn absolute_cache_path_problem(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    if p.len() > 1 && (p.ends_with('/') || p.contains("//") || p.split('/').any(|c| c == ".")) {
        return Some(format!("`{}` is not a normalised path (no `//`, `.` or trailing `/`)", show(p)));
    }
    if p == "/" || SYSTEM_DIRS.contains(&p) || ["/proc/", "/sys/", "/dev/"].iter().any(|d| p.starts_with(d)) {
        return Some(format!(
            "`{}` is a system directory; an absolute cache path is mounted into the job's container \
             and would hide what the image has there (use e.g. `/root/.m2` or `/work/cache/maven`)",
            show(p)
        ));
    }
    None
}

type ArtifactLists = (Vec<(Publish, Pos)>, Vec<(Restore, Pos, Pos)>);

fn artifacts(ctx: &mut Ctx, label: &str, node: &Node) -> ArtifactLists {
    let subject = format!("`artifacts` of {label}");
    let Some(entries) = as_map(ctx, node, &subject, "a map with `publish` and/or `restore`") else {
        return ArtifactLists::default();
    };
    check_keys(ctx, entries, ARTIFACTS_KEYS, &format!("in {subject}"));

    let mut publish: Vec<(Publish, Pos)> = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    if let Some(e) = get(entries, "publish") {
        let s = format!("`artifacts.publish` of {label}");
        match as_seq(ctx, &e.value, &s, "a list of `{name, path}` entries") {
            None => {}
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let es = format!("entry {} of {s}", i + 1);
                    let Some(fields) = as_map(ctx, item, &es, "a map with `name` and `path`") else {
                        continue;
                    };
                    check_keys(ctx, fields, PUBLISH_KEYS, &format!("in {es}"));
                    let name = artifact_name(ctx, fields, item.pos, &es);
                    let path = artifact_path(ctx, fields, item.pos, &es).filter(|p| {
                        let pos = get(fields, "path").map(|e| e.value.pos).unwrap_or(item.pos);
                        publish_pattern_ok(ctx, pos, p, &es)
                    });
                    let expire_in_secs = match get(fields, "expire-in") {
                        None => Some(None),
                        Some(e) => expire_in(ctx, &es, &e.value).map(Some),
                    };
                    let (Some((name, name_pos)), Some(path), Some(expire_in_secs)) = (name, path, expire_in_secs)
                    else {
                        continue;
                    };
                    if let Some(first) = first_line.get(&name) {
                        ctx.err(
                            name_pos,
                            format!(
                                "{label} publishes two artifacts named `{}` (the first on line {}); artifact names must be unique within a job",
                                show(&name),
                                first
                            ),
                        );
                        continue;
                    }
                    first_line.insert(name.clone(), name_pos.line);
                    publish.push((Publish { name, path, expire_in_secs }, name_pos));
                }
            }
        }
    }

    let mut restore = Vec::new();
    if let Some(e) = get(entries, "restore") {
        let s = format!("`artifacts.restore` of {label}");
        match as_seq(ctx, &e.value, &s, "a list of `{from_job, name, path}` entries") {
            None => {}
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let es = format!("entry {} of {s}", i + 1);
                    let Some(fields) = as_map(ctx, item, &es, "a map with `from_job`, `name` and `path`") else {
                        continue;
                    };
                    check_keys(ctx, fields, RESTORE_KEYS, &format!("in {es}"));
                    let from = require(ctx, fields, item.pos, "from_job", || {
                        format!("{es} has no `from_job`; name the job that publishes the artifact")
                    })
                    .and_then(|f| {
                        as_nonempty_text(ctx, &f.value, &format!("`from_job` in {es}"), "a job name")
                            .map(|t| (t.to_string(), f.value.pos))
                    });
                    let name = artifact_name(ctx, fields, item.pos, &es);
                    let path = artifact_path(ctx, fields, item.pos, &es);
                    let (Some((from_job, from_pos)), Some((name, name_pos)), Some(path)) = (from, name, path) else {
                        continue;
                    };
                    restore.push((Restore { from_job, name, path }, from_pos, name_pos));
                }
            }
        }
    }
    (publish, restore)
}

fn artifact_name(ctx: &mut Ctx, fields: &[Entry], pos: Pos, subject: &str) -> Option<(String, Pos)> {
    let e = require(ctx, fields, pos, "name", || format!("{subject} has no `name`; add `name: <artifact name>`"))?;
    let s = format!("`name` in {subject}");
    let text = as_nonempty_text(ctx, &e.value, &s, "an artifact name")?;
    (ctx.matrix_only(e.value.pos, text, &s) && check_name(ctx, &e.value, text, "artifact name"))
        .then(|| (text.to_string(), e.value.pos))
}

fn artifact_path(ctx: &mut Ctx, fields: &[Entry], pos: Pos, subject: &str) -> Option<String> {
    let e = require(ctx, fields, pos, "path", || {
        format!("{subject} has no `path`; add `path: <path relative to the workspace>`")
    })?;
    let s = format!("`path` in {subject}");
    let text = as_nonempty_text(ctx, &e.value, &s, "a path relative to the workspace")?;
    (ctx.matrix_only(e.value.pos, text, &s) && check_path(ctx, &e.value, text, &s, false)).then(|| text.to_string())
}

/// A publish `path` that is a glob ([`crate::is_glob`]) must be a valid
/// pattern.
fn publish_pattern_ok(ctx: &mut Ctx, pos: Pos, path: &str, subject: &str) -> bool {
    if !crate::is_glob(path) {
        return true;
    }
    match crate::glob::check_pattern(path) {
        Ok(()) => true,
        Err(why) => {
            ctx.err(pos, format!("`path` in {subject} is an invalid glob pattern `{}`: {why}", show(path)));
            false
        }
    }
}

/// `expire-in` of a published artifact: a positive duration (the syntax of
/// `timeout`), at most [`MAX_EXPIRE_IN_SECS`].
fn expire_in(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<u64> {
    let subject = format!("`expire-in` in {subject}");
    duration_secs(ctx, &subject, node, MAX_EXPIRE_IN_SECS, "3650d")
}

/// A step's `timeout`: a plain duration (its job's `timeout` may be a
/// template).
fn step_timeout(ctx: &mut Ctx, label: &str, node: &Node) -> Option<u64> {
    let subject = format!("`timeout` of {label}");
    if let Value::Scalar(s) = &node.value
        && s.text.contains("${{")
    {
        ctx.err(node.pos, format!("{subject} uses `${{{{ }}}}`; a step's timeout is a plain duration (the job's `timeout` may use expressions)"));
        return None;
    }
    duration_secs(ctx, &subject, node, MAX_TIMEOUT_SECS, "7d")
}

/// A job's `timeout`: seconds, or a `${{ }}` template evaluated when the
/// run is accepted (returned as the second part).
fn timeout(ctx: &mut Ctx, label: &str, node: &Node) -> (Option<u64>, Option<String>) {
    let subject = format!("`timeout` of {label}");
    if let Value::Scalar(s) = &node.value
        && s.kind() == ScalarKind::Str
        && s.text.contains("${{")
    {
        // Checked here; its value (also after matrix substitution) is
        // checked as a duration when the run is accepted.
        ctx.run_exprs(node.pos, &s.text, &subject);
        return (None, Some(s.text.clone()));
    }
    (duration_secs(ctx, &subject, node, MAX_TIMEOUT_SECS, "7d"), None)
}

/// `hang-after` and `hang-kill-after` (spec 004's hang detection): the
/// silence after which the log gets a warning, and after which the job is
/// killed (class `hang`). The kill must come after the warning.
fn hang(ctx: &mut Ctx, label: &str, entries: &[Entry]) -> (Option<u64>, Option<u64>) {
    let mut one = |key: &str| {
        get(entries, key).map(|e| {
            let secs = duration_secs(ctx, &format!("`{key}` of {label}"), &e.value, MAX_TIMEOUT_SECS, "7d");
            (secs, e.value.pos)
        })
    };
    let after = one("hang-after");
    let kill = one("hang-kill-after");
    let (a, k) = (after.and_then(|(s, _)| s), kill.and_then(|(s, _)| s));
    let (warn_at, kill_at) = (a.unwrap_or(HANG_AFTER_SECS), k.unwrap_or(HANG_KILL_AFTER_SECS));
    if (a.is_some() || k.is_some())
        && kill_at <= warn_at
        && let Some((_, pos)) = kill.or(after)
    {
        ctx.err(
            pos,
            format!(
                "`hang-kill-after` of {label} ({kill_at}s) must be longer than `hang-after` ({warn_at}s): \
                 the warning comes first"
            ),
        );
        return (None, None);
    }
    (a, k)
}

/// The hang detector's defaults (spec 004): a warning after 30 minutes
/// without output...
pub const HANG_AFTER_SECS: u64 = 30 * 60;
/// ...and the kill after 2 hours.
pub const HANG_KILL_AFTER_SECS: u64 = 2 * 60 * 60;

/// A positive duration in whole seconds, at most `max` (written `max_text`
/// in the message). One diagnostic on error.
fn duration_secs(ctx: &mut Ctx, subject: &str, node: &Node, max: u64, max_text: &str) -> Option<u64> {
    let secs = match &node.value {
        Value::Scalar(s) if s.kind() == ScalarKind::Int => match s.as_int() {
            Some(n) if n > 0 => u64::try_from(n).ok().or(Some(u64::MAX)),
            _ => {
                ctx.err(node.pos, format!("{subject} must be greater than zero, found `{}`", show(&s.text)));
                return None;
            }
        },
        Value::Scalar(s) if s.kind() == ScalarKind::Str => match parse_duration(&s.text) {
            Some(n) => Some(n),
            None => {
                ctx.err(
                    node.pos,
                    format!(
                        "{subject} must be a duration like `90s`, `1m30s`, `1h` or `2h30m`, or a number of seconds; found `{}`",
                        show(&s.text)
                    ),
                );
                return None;
            }
        },
        _ => {
            ctx.err(
                node.pos,
                format!("{subject} must be a duration like `30m` or a number of seconds, found {}", node.describe()),
            );
            return None;
        }
    };
    match secs {
        Some(0) => {
            ctx.err(node.pos, format!("{subject} must be greater than zero"));
            None
        }
        Some(n) if n > max => {
            let days = max / 86400;
            ctx.err(
                node.pos,
                format!("{subject} is longer than {days} days; use at most `{max_text}` ({max} seconds)"),
            );
            None
        }
        other => other,
    }
}

/// The failure classes `retry: {on: [...]}` may name (spec 004), and the
/// group `transient` (the infrastructure's).
pub const RETRY_CLASSES: &[&str] = &["step_failed", "timeout", "hang", "agent_lost", "infra"];
const RETRY_KEYS: &[&str] = &["max", "on", "exit_codes"];

/// `retry: N` or `retry: {max: N, on: [classes], exit_codes: [codes]}`:
/// (max, the classes (empty for `retry: N`), the exit codes).
fn retry(ctx: &mut Ctx, label: &str, node: &Node) -> Option<(u32, Vec<String>, Vec<i32>)> {
    let subject = format!("`retry` of {label}");
    let count = |ctx: &mut Ctx, node: &Node, subject: &str| match &node.value {
        Value::Scalar(s) if s.kind() == ScalarKind::Int => match s.as_int() {
            Some(n) if (0..=i128::from(MAX_RETRY)).contains(&n) => u32::try_from(n).ok(),
            _ => {
                ctx.err(node.pos, format!("{subject} is `{}`; it must be from 0 to {MAX_RETRY}", show(&s.text)));
                None
            }
        },
        _ => {
            ctx.err(
                node.pos,
                format!(
                    "{subject} must be a whole number from 0 to {MAX_RETRY} or a map like \
                     `{{max: 2, on: [timeout, agent_lost]}}`, found {}",
                    node.describe()
                ),
            );
            None
        }
    };
    let Value::Map(entries) = &node.value else {
        return count(ctx, node, &subject).map(|n| (n, Vec::new(), Vec::new()));
    };
    check_keys(ctx, entries, RETRY_KEYS, &format!("in {subject}"));
    let max = require(ctx, entries, node.pos, "max", || {
        format!("{subject} has no `max`; write `{{max: N, on: [...]}}` (N extra attempts)")
    })
    .and_then(|e| count(ctx, &e.value, &format!("`max` in {subject}")));
    let on = match get(entries, "on") {
        // Without `on`, every class that can be retried.
        None => Some(RETRY_CLASSES.iter().map(|c| c.to_string()).collect::<Vec<_>>()),
        Some(e) => retry_classes(ctx, &subject, &e.value),
    };
    let codes = match get(entries, "exit_codes") {
        None => Some(Vec::new()),
        Some(e) => retry_exit_codes(ctx, &subject, &e.value),
    };
    let (max, on, codes) = (max?, on?, codes?);
    if !codes.is_empty() && !on.iter().any(|c| c == "step_failed") {
        let pos = get(entries, "exit_codes").map_or(node.pos, |e| e.key_pos);
        ctx.err(
            pos,
            format!(
                "`exit_codes` in {subject} choose which `step_failed` attempts are retried; add `step_failed` to `on`"
            ),
        );
        return None;
    }
    Some((max, on, codes))
}

fn retry_classes(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<Vec<String>> {
    let expected = format!("a failure class or a list of them ({}, or `transient`)", key_list(RETRY_CLASSES));
    let items: Vec<&Node> = match &node.value {
        Value::Seq(items) => items.iter().collect(),
        Value::Scalar(_) => vec![node],
        _ => {
            ctx.err(node.pos, format!("`on` in {subject} must be {expected}, found {}", node.describe()));
            return None;
        }
    };
    if items.is_empty() {
        ctx.err(node.pos, format!("`on` in {subject} is empty; name a class to retry, or write `retry: 0`"));
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut ok = true;
    for item in items {
        let Some(name) = as_nonempty_text(ctx, item, &format!("`on` in {subject}"), &expected) else {
            ok = false;
            continue;
        };
        let names: Vec<&str> = match name {
            "transient" => vec!["agent_lost", "infra"],
            "cancelled" => {
                ctx.err(item.pos, format!("`on` in {subject} names `cancelled`: a cancelled attempt is never retried"));
                ok = false;
                continue;
            }
            n if RETRY_CLASSES.contains(&n) => vec![n],
            n => {
                let hint = suggest(n, RETRY_CLASSES).map(|s| format!("did you mean `{s}`? ")).unwrap_or_default();
                ctx.err(
                    item.pos,
                    format!("`on` in {subject}: unknown failure class `{}`; {hint}expected {expected}", show(n)),
                );
                ok = false;
                continue;
            }
        };
        for n in names {
            if !out.iter().any(|o| o == n) {
                out.push(n.to_string());
            }
        }
    }
    // In the order of RETRY_CLASSES, so equal policies freeze equally.
    out.sort_by_key(|c| RETRY_CLASSES.iter().position(|k| k == c));
    ok.then_some(out)
}

fn retry_exit_codes(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<Vec<i32>> {
    let expected = "a list of exit codes from 1 to 255, e.g. `[75, 137]`";
    let items = as_seq(ctx, node, &format!("`exit_codes` in {subject}"), expected)?;
    if items.is_empty() {
        ctx.err(node.pos, format!("`exit_codes` in {subject} is empty; leave it out to retry any exit code"));
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for item in items {
        match &item.value {
            Value::Scalar(s) if s.kind() == ScalarKind::Int && s.as_int().is_some_and(|n| (1..=255).contains(&n)) => {
                let n = s.as_int().and_then(|n| i32::try_from(n).ok()).unwrap_or_default();
                if !out.contains(&n) {
                    out.push(n);
                }
            }
            _ => {
                let found = match &item.value {
                    Value::Scalar(s) if s.kind() == ScalarKind::Int => format!("`{}`", show(&s.text)),
                    _ => item.describe().to_string(),
                };
                ctx.err(
                    item.pos,
                    format!("an entry of `exit_codes` in {subject} must be an exit code from 1 to 255, found {found}"),
                );
                ok = false;
            }
        }
    }
    out.sort_unstable();
    ok.then_some(out)
}

fn runs_on(ctx: &mut Ctx, label: &str, node: &Node) -> Option<BTreeMap<String, String>> {
    let subject = format!("`runs-on` of {label}");
    let expected = "a map of agent labels (e.g. `{os: linux}`) or an OS name";
    if let Value::Scalar(_) = node.value {
        let os = as_nonempty_text(ctx, node, &subject, expected)?;
        ctx.run_exprs(node.pos, os, &subject);
        return Some(BTreeMap::from([("os".to_string(), os.to_string())]));
    }
    let entries = as_map(ctx, node, &subject, expected)?;
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries {
        if e.key.trim().is_empty() {
            ctx.err(e.key_pos, format!("{subject} has an empty label name"));
            ok = false;
            continue;
        }
        match as_nonempty_text(ctx, &e.value, &format!("label `{}` in {subject}", show(&e.key)), "a string") {
            Some(v) => {
                ctx.run_exprs(e.value.pos, v, &format!("label `{}` in {subject}", show(&e.key)));
                out.insert(e.key.clone(), v.to_string());
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn env(ctx: &mut Ctx, label: &str, node: &Node) -> Option<BTreeMap<String, String>> {
    let subject = format!("`env` of {label}");
    let entries = as_map(ctx, node, &subject, "a map of variable names to values")?;
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries {
        if e.key.is_empty() {
            ctx.err(e.key_pos, format!("{subject} has an empty variable name; give the variable a name"));
            continue;
        }
        if !env_key_ok(&e.key) {
            ctx.err(
                e.key_pos,
                format!(
                    "`{}` in {subject} is not a valid variable name; use letters, digits and `_`, not starting with a digit",
                    show(&e.key)
                ),
            );
            ok = false;
            continue;
        }
        match &e.value.value {
            Value::Scalar(s) if s.kind() != ScalarKind::Null => {
                ctx.exprs(e.value.pos, &s.text, &format!("variable `{}` in {subject}", e.key));
                out.insert(e.key.clone(), s.text.clone());
            }
            Value::Scalar(_) => {
                ctx.err(
                    e.value.pos,
                    format!(
                        "variable `{}` in {subject} has no value; write `{}: \"\"` for an empty string",
                        e.key, e.key
                    ),
                );
                ok = false;
            }
            _ => {
                ctx.err(
                    e.value.pos,
                    format!("variable `{}` in {subject} must be a string, found {}", e.key, e.value.describe()),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// A parsed `matrix:`: the combinations in expansion order.
struct MatrixSpec {
    pos: Pos,
    /// Key order for names: the axes as written, then include-only keys in
    /// order of first appearance.
    order: Vec<String>,
    combos: Vec<BTreeMap<String, String>>,
    max_parallel: Option<u32>,
    fail_fast: bool,
}

fn matrix_key_ok(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `KILN_MATRIX_<KEY>`: upper-cased, `-` → `_`.
fn matrix_env_name(key: &str) -> String {
    format!("KILN_MATRIX_{}", key.to_ascii_uppercase().replace('-', "_"))
}

/// The `{key: value}` entries of an `include`/`exclude` list.
/// The `key: value` pairs of one `include`/`exclude` entry, and its position.
type MatrixEntry = (Vec<(String, String)>, Pos);

fn matrix_entries(ctx: &mut Ctx, node: &Node, subject: &str) -> Option<Vec<MatrixEntry>> {
    let items = as_seq(ctx, node, subject, "a list of `{key: value}` maps")?;
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let es = format!("entry {} of {subject}", i + 1);
        let Some(fields) = as_map(ctx, item, &es, "a map of matrix keys to values") else {
            ok = false;
            continue;
        };
        if fields.is_empty() {
            ctx.err(item.pos, format!("{es} is empty; give at least one `key: value`"));
            ok = false;
            continue;
        }
        let mut pairs = Vec::new();
        for f in fields {
            if !matrix_key_ok(&f.key) {
                ctx.err(
                    f.key_pos,
                    format!(
                        "`{}` in {es} is not a valid matrix key; use letters, digits, `_` and `-`, starting with a letter",
                        show(&f.key)
                    ),
                );
                ok = false;
                continue;
            }
            match matrix_value(ctx, &f.value, &format!("`{}` in {es}", show(&f.key))) {
                Some(v) => pairs.push((f.key.clone(), v)),
                None => ok = false,
            }
        }
        out.push((pairs, item.pos));
    }
    ok.then_some(out)
}

fn matrix_value(ctx: &mut Ctx, node: &Node, subject: &str) -> Option<String> {
    match &node.value {
        Value::Scalar(s) if s.kind() != ScalarKind::Null => Some(s.text.clone()),
        _ => {
            ctx.err(node.pos, format!("{subject} must be a string, number or boolean, found {}", node.describe()));
            None
        }
    }
}

fn matrix(ctx: &mut Ctx, label: &str, node: &Node) -> Option<MatrixSpec> {
    let subject = format!("`matrix` of {label}");
    let entries = as_map(
        ctx,
        node,
        &subject,
        "a map of axes (`key: [values]`) with optional `include`, `exclude`, `max-parallel` and `fail-fast`",
    )?;
    let mut ok = true;
    let mut axes: Vec<(String, Vec<String>)> = Vec::new();
    let mut include = Vec::new();
    let mut exclude = Vec::new();
    let mut max_parallel = None;
    let mut fail_fast = true;
    for e in entries {
        match e.key.as_str() {
            "include" => match matrix_entries(ctx, &e.value, &format!("`include` in {subject}")) {
                Some(v) => include = v,
                None => ok = false,
            },
            "exclude" => match matrix_entries(ctx, &e.value, &format!("`exclude` in {subject}")) {
                Some(v) => exclude = v,
                None => ok = false,
            },
            "max-parallel" => match &e.value.value {
                Value::Scalar(s) if s.kind() == ScalarKind::Int => match s.as_int() {
                    Some(n) if n >= 1 && n <= MAX_JOBS as i128 => max_parallel = u32::try_from(n).ok(),
                    _ => {
                        ctx.err(
                            e.value.pos,
                            format!(
                                "`max-parallel` in {subject} is `{}`; it must be from 1 to {MAX_JOBS}",
                                show(&s.text)
                            ),
                        );
                        ok = false;
                    }
                },
                _ => {
                    ctx.err(
                        e.value.pos,
                        format!("`max-parallel` in {subject} must be a whole number, found {}", e.value.describe()),
                    );
                    ok = false;
                }
            },
            "fail-fast" => match &e.value.value {
                Value::Scalar(s) if s.kind() == ScalarKind::Bool => fail_fast = s.text.eq_ignore_ascii_case("true"),
                _ => {
                    ctx.err(
                        e.value.pos,
                        format!("`fail-fast` in {subject} must be `true` or `false`, found {}", e.value.describe()),
                    );
                    ok = false;
                }
            },
            key => {
                if !matrix_key_ok(key) {
                    ctx.err(
                        e.key_pos,
                        format!(
                            "`{}` in {subject} is not a valid matrix axis name; use letters, digits, `_` and `-`, starting with a letter (the other keys are {})",
                            show(key),
                            key_list(MATRIX_KEYWORDS)
                        ),
                    );
                    ok = false;
                    continue;
                }
                let axis = format!("axis `{key}` of {subject}");
                let Some(items) = as_seq(ctx, &e.value, &axis, "a list of values") else {
                    ok = false;
                    continue;
                };
                if items.is_empty() {
                    ctx.err(e.value.pos, format!("{axis} is empty; list at least one value"));
                    ok = false;
                    continue;
                }
                let mut values = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match matrix_value(ctx, item, &format!("value {} of {axis}", i + 1)) {
                        Some(v) => values.push(v),
                        None => ok = false,
                    }
                }
                axes.push((key.to_string(), values));
            }
        }
    }
    if !ok {
        return None;
    }
    if axes.is_empty() && include.is_empty() {
        ctx.err(node.pos, format!("{subject} has no axes; add one like `os: [linux, macos]` or an `include` list"));
        return None;
    }
    for (pairs, pos) in &exclude {
        for (k, _) in pairs {
            if !axes.iter().any(|(a, _)| a == k) {
                ctx.err(
                    *pos,
                    format!("`exclude` in {subject} names `{}`, which is not an axis of the matrix", show(k)),
                );
                return None;
            }
        }
    }
    let mut order: Vec<String> = axes.iter().map(|(k, _)| k.clone()).collect();
    for (pairs, _) in &include {
        for (k, _) in pairs {
            if !order.contains(k) {
                order.push(k.clone());
            }
        }
    }
    let mut env_names: HashMap<String, &str> = HashMap::new();
    for k in &order {
        if let Some(other) = env_names.insert(matrix_env_name(k), k) {
            ctx.err(
                node.pos,
                format!(
                    "matrix keys `{other}` and `{k}` in {subject} both become the variable `{}`; rename one",
                    matrix_env_name(k)
                ),
            );
            return None;
        }
    }

    // The cartesian product, first axis outermost, bounded before enumeration.
    let product = axes.iter().try_fold(1usize, |acc, (_, v)| acc.checked_mul(v.len()));
    match product {
        Some(n) if n <= MAX_MATRIX_COMBINATIONS => {}
        _ => {
            let shown = product.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
            ctx.err(
                node.pos,
                format!(
                    "{subject} has {shown} combinations of its axes; at most {MAX_MATRIX_COMBINATIONS} are allowed (and at most {MAX_JOBS} jobs after `exclude`/`include`)"
                ),
            );
            return None;
        }
    }
    let mut combos: Vec<BTreeMap<String, String>> = if axes.is_empty() { Vec::new() } else { vec![BTreeMap::new()] };
    for (k, values) in &axes {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.insert(k.clone(), v.clone());
                    c
                })
            })
            .collect();
    }
    combos.retain(|c| !exclude.iter().any(|(pairs, _)| pairs.iter().all(|(k, v)| c.get(k) == Some(v))));
    let original = combos.len();
    let is_axis = |k: &str| axes.iter().any(|(a, _)| a == k);
    for (pairs, _) in &include {
        let mut matched = false;
        for c in combos.iter_mut().take(original) {
            if pairs.iter().filter(|(k, _)| is_axis(k)).all(|(k, v)| c.get(k) == Some(v)) {
                matched = true;
                for (k, v) in pairs.iter().filter(|(k, _)| !is_axis(k)) {
                    c.insert(k.clone(), v.clone());
                }
            }
        }
        if !matched {
            combos.push(pairs.iter().cloned().collect());
            if combos.len() > MAX_JOBS {
                break;
            }
        }
    }
    let mut seen = HashSet::new();
    combos.retain(|c| seen.insert(c.clone()));
    if combos.is_empty() {
        ctx.err(node.pos, format!("{subject} expands to no jobs: `exclude` removes every combination"));
        return None;
    }
    if combos.len() > MAX_JOBS {
        ctx.err(
            node.pos,
            format!("{subject} expands to more than {MAX_JOBS} jobs; at most {MAX_JOBS} are allowed in one workflow"),
        );
        return None;
    }
    Some(MatrixSpec { pos: node.pos, order, combos, max_parallel, fail_fast })
}

fn needs_policy(ctx: &mut Ctx, label: &str, node: &Node) -> Option<(u32, Pos)> {
    let subject = format!("`needs-policy` of {label}");
    let entries = as_map(ctx, node, &subject, "a map like `{quorum: 2}`")?;
    check_keys(ctx, entries, NEEDS_POLICY_KEYS, &format!("in {subject}"));
    let e = require(ctx, entries, node.pos, "quorum", || {
        format!("{subject} has no `quorum`; write `{{quorum: N}}` (N of the needed jobs must succeed)")
    })?;
    match &e.value.value {
        Value::Scalar(s) if s.kind() == ScalarKind::Int => match s.as_int() {
            Some(n) if n >= 1 && n <= MAX_JOBS as i128 => u32::try_from(n).ok().map(|n| (n, e.value.pos)),
            _ => {
                ctx.err(e.value.pos, format!("`quorum` in {subject} is `{}`; it must be at least 1", show(&s.text)));
                None
            }
        },
        _ => {
            ctx.err(e.value.pos, format!("`quorum` in {subject} must be a whole number, found {}", e.value.describe()));
            None
        }
    }
}

/// `outputs: [name, …]`: the names the job's steps may write to
/// `$KILN_OUTPUT`.
fn outputs(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Vec<String>> {
    let subject = format!("`outputs` of {label}");
    let items = as_seq(ctx, node, &subject, "a list of output names, e.g. `outputs: [version]`")?;
    if items.len() > MAX_OUTPUTS {
        ctx.err(node.pos, format!("{subject} declares {} outputs; at most {MAX_OUTPUTS} are allowed", items.len()));
        return None;
    }
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        let Some(name) = as_nonempty_text(ctx, item, &format!("an entry of {subject}"), "an output name") else {
            ok = false;
            continue;
        };
        if !output_name_ok(name) {
            ctx.err(
                item.pos,
                format!(
                    "output name `{}` in {subject} must start with a letter or `_` and hold only letters, digits, `_` \
                     and `-` (at most 100 characters)",
                    show(name)
                ),
            );
            ok = false;
        } else if names.iter().any(|n| n == name) {
            ctx.err(item.pos, format!("output `{}` is declared twice in {subject}", show(name)));
            ok = false;
        } else {
            names.push(name.to_string());
        }
    }
    ok.then_some(names)
}

/// `reports: {junit: …, tap: …}`: each a path or glob, or a list of them,
/// relative to the workspace.
fn reports(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Reports> {
    let subject = format!("`reports` of {label}");
    let entries = as_map(ctx, node, &subject, "a map like `reports: {junit: [reports/*.xml], tap: [out.tap]}`")?;
    check_keys(ctx, entries, REPORTS_KEYS, &format!("in {subject}"));
    let mut out = Reports::default();
    let mut ok = true;
    for e in entries {
        let list = match e.key.as_str() {
            "junit" => &mut out.junit,
            "tap" => &mut out.tap,
            _ => continue,
        };
        let s = format!("`reports.{}` of {label}", e.key);
        let items: Vec<&Node> = match &e.value.value {
            Value::Seq(items) => items.iter().collect(),
            _ => vec![&e.value],
        };
        if items.is_empty() {
            ctx.err(e.value.pos, format!("{s} is empty; list the report files (paths or globs) or leave it out"));
            ok = false;
        }
        for item in items {
            let Some(text) = as_nonempty_text(ctx, item, &format!("an entry of {s}"), "a path or glob") else {
                ok = false;
                continue;
            };
            if !(ctx.matrix_only(item.pos, text, &s)
                && check_path(ctx, item, text, &s, false)
                && publish_pattern_ok(ctx, item.pos, text, &s))
            {
                ok = false;
                continue;
            }
            list.push(text.to_string());
        }
    }
    if out.junit.len() + out.tap.len() > MAX_REPORT_PATTERNS {
        ctx.err(
            node.pos,
            format!(
                "{subject} lists {} paths; at most {MAX_REPORT_PATTERNS} are allowed (use globs)",
                out.junit.len() + out.tap.len()
            ),
        );
        ok = false;
    }
    if ok && out.junit.is_empty() && out.tap.is_empty() {
        ctx.err(node.pos, format!("{subject} names no report; add `junit:` or `tap:` with the report files"));
        ok = false;
    }
    ok.then_some(out)
}

fn condition(ctx: &mut Ctx, label: &str, node: &Node) -> Option<String> {
    let subject = format!("`if` of {label}");
    let text = as_nonempty_text(ctx, node, &subject, "an expression like `branch == 'main'`")?;
    for (job, output) in condition_output_refs(text) {
        ctx.output_refs.push(OutputRef { pos: node.pos, job, output, subject: subject.clone() });
    }
    match parse_condition(text) {
        Ok(e) => match check_inputs(&e, &|n| ctx.input_ok(n)).and_then(|()| {
            let mut keys = Vec::new();
            crate::expr::matrix_names(&e, &mut keys);
            keys.iter().try_for_each(|k| match &ctx.matrix_refs {
                MatrixRefs::NoMatrix => Err(format!("`matrix.{}` can only be used in a job with a `matrix`", show(k))),
                MatrixRefs::Keys(keys) if !keys.contains(k) => Err(format!(
                    "the matrix has no key `{}`; its keys are {}",
                    show(k),
                    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                )),
                _ => Ok(()),
            })
        }) {
            Ok(()) => Some(text.to_string()),
            Err(m) => {
                ctx.err(node.pos, format!("invalid {subject}: {m}"));
                None
            }
        },
        Err(e) => {
            ctx.err(node.pos, format!("invalid {subject}: {e}"));
            None
        }
    }
}

/// Where a `concurrency:` stands.
#[derive(Clone, Copy)]
enum Level {
    Run,
    /// `environment`: the job has one (its group is the environment's
    /// deploy queue: no `group` of its own).
    Job {
        environment: bool,
    },
}

fn concurrency(ctx: &mut Ctx, owner: &str, node: &Node, level: Level) -> Option<Concurrency> {
    let subject = format!("`concurrency` of {owner}");
    let deploy = matches!(level, Level::Job { environment: true });
    let (group_node, cancel_in_progress, queue) = match &node.value {
        Value::Scalar(_) => (Some(node), false, None),
        _ => {
            let expected = match level {
                Level::Run => "a group name or a map with `group` and `cancel-in-progress`",
                Level::Job { .. } => "a group name or a map with `group`, `cancel-in-progress` and `queue`",
            };
            let entries = as_map(ctx, node, &subject, expected)?;
            check_keys(ctx, entries, CONCURRENCY_KEYS, &format!("in {subject}"));
            let cancel = match get(entries, "cancel-in-progress") {
                None => Some(false),
                Some(e) => match &e.value.value {
                    Value::Scalar(s) if s.kind() == ScalarKind::Bool => Some(s.text.eq_ignore_ascii_case("true")),
                    _ => {
                        ctx.err(
                            e.value.pos,
                            format!(
                                "`cancel-in-progress` in {subject} must be `true` or `false`, found {}",
                                e.value.describe()
                            ),
                        );
                        None
                    }
                },
            };
            let queue = match get(entries, "queue") {
                None => Some(None),
                Some(_) if matches!(level, Level::Run) => {
                    let e = get(entries, "queue").expect("just found");
                    ctx.err(
                        e.value.pos,
                        format!(
                            "`queue` in {subject} is for job-level groups (and deploy jobs); waiting runs of a \
                             run-level group run in acceptance order unless a newer one supersedes them"
                        ),
                    );
                    None
                }
                Some(e) => match as_nonempty_text(ctx, &e.value, &format!("`queue` in {subject}"), "a queue mode") {
                    Some("ordered") => Some(Some(GroupQueue::Ordered)),
                    Some("supersede-pending") => Some(Some(GroupQueue::SupersedePending)),
                    Some(other) => {
                        ctx.err(
                            e.value.pos,
                            format!(
                                "`queue` in {subject} is `{}`; expected `ordered` (every waiting job runs, in \
                                 acceptance order) or `supersede-pending` (a newer job cancels the ones waiting)",
                                show(other)
                            ),
                        );
                        None
                    }
                    None => None,
                },
            };
            let group = match get(entries, "group") {
                Some(g) if deploy => {
                    ctx.err(
                        g.value.pos,
                        format!(
                            "`group` in {subject}: a job with `environment` waits in its environment's deploy queue \
                             (one run at a time, in acceptance order); remove `group` (keep `queue` or \
                             `cancel-in-progress` to change how that queue behaves)"
                        ),
                    );
                    return None;
                }
                None if deploy => None,
                _ => Some(
                    &require(ctx, entries, node.pos, "group", || {
                        format!("{subject} has no `group`; add `group: <name>`")
                    })?
                    .value,
                ),
            };
            (group, cancel?, queue?)
        }
    };
    let Some(group_node) = group_node else {
        return Some(Concurrency { group: String::new(), cancel_in_progress, queue });
    };
    if deploy {
        ctx.err(
            group_node.pos,
            format!(
                "{subject}: a job with `environment` waits in its environment's deploy queue (one run at a time, in \
                 acceptance order) and has no group of its own; write `concurrency: {{queue: supersede-pending}}` \
                 to change how that queue behaves"
            ),
        );
        return None;
    }
    let group_subject = format!("`group` in {subject}");
    let group = as_nonempty_text(ctx, group_node, &group_subject, "a group name")?;
    let refs = std::mem::take(&mut ctx.matrix_refs);
    let checked = check_template(
        group,
        &|key| match &refs {
            MatrixRefs::NoMatrix => Err(format!("`matrix.{key}` can only be used in a job with a `matrix`")),
            MatrixRefs::Keys(keys) if !keys.contains(key) => Err(format!("the matrix has no key `{key}`")),
            _ => Ok(()),
        },
        &|n| ctx.input_ok(n),
    );
    ctx.matrix_refs = refs;
    if let Err(e) = checked {
        ctx.err(group_node.pos, format!("invalid {group_subject}: {e}"));
        return None;
    }
    if let Some((job, output)) = template_output_refs(group).into_iter().next() {
        ctx.err(
            group_node.pos,
            format!(
                "invalid {group_subject}: `needs.{job}.outputs.{output}` is not known when concurrency groups are \
                 decided (at acceptance); use `event`, `ref`, `branch`, `inputs.*` or `matrix.*`"
            ),
        );
        return None;
    }
    Some(Concurrency { group: group.to_string(), cancel_in_progress, queue })
}

/// Whether `name` may name a deployment environment: 1 to 64 of ASCII
/// letters, digits, `-`, `_` and `.`, starting with a letter or digit.
pub fn valid_environment_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A job's `environment:`: a name, or `{name, url}`.
fn environment(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Environment> {
    let subject = format!("`environment` of {label}");
    let expected = "an environment name, or a map with `name` and `url`";
    let (name_node, url) = match &node.value {
        Value::Scalar(_) => (node, None),
        _ => {
            let entries = as_map(ctx, node, &subject, expected)?;
            check_keys(ctx, entries, ENVIRONMENT_KEYS, &format!("in {subject}"));
            let url = match get(entries, "url") {
                None => None,
                Some(e) => {
                    let u = as_nonempty_text(ctx, &e.value, &format!("`url` of {subject}"), "an http(s) URL")?;
                    if !(u.starts_with("https://") || u.starts_with("http://"))
                        || u.len() > 2048
                        || u.chars().any(|c| c.is_control() || c.is_whitespace())
                    {
                        ctx.err(
                            e.value.pos,
                            format!(
                                "`url` of {subject} must be an http:// or https:// URL of up to 2,048 characters \
                                 without spaces"
                            ),
                        );
                        return None;
                    }
                    Some(u.to_string())
                }
            };
            let name =
                require(ctx, entries, node.pos, "name", || format!("{subject} has no `name`; add `name: production`"))?;
            (&name.value, url)
        }
    };
    let name = as_nonempty_text(ctx, name_node, &format!("`name` of {subject}"), "an environment name")?;
    if !valid_environment_name(name) {
        ctx.err(
            name_node.pos,
            format!(
                "environment name `{}` of {label}: use 1 to 64 letters, digits, `-`, `_` or `.`, starting with a \
                 letter or digit (`${{{{ }}}}` is not allowed: the environment is decided when the run is accepted)",
                show(name)
            ),
        );
        return None;
    }
    Some(Environment { name: name.to_string(), url, ring: None })
}

/// One entry of a deploy job's `rings:` as written.
struct RingSpec {
    name: String,
    /// Held after this ring deployed, before its gate decides.
    bake_secs: u64,
    gate: Option<GateSpec>,
}

/// A ring's `gate:`.
enum GateSpec {
    /// `prometheus: {…}`, canonical JSON (checked by kiln-deploy).
    Prometheus(String),
    /// `run: command`: a job of its own between the rings.
    Command(String),
}

/// The longest `bake` accepted: a week.
const MAX_BAKE_SECS: u64 = 7 * 24 * 3600;

/// A YAML value as JSON (for the parts of a workflow another crate reads,
/// such as a Prometheus gate). Scalars keep their core-schema type.
fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        Value::Scalar(s) => match s.kind() {
            ScalarKind::Null => J::Null,
            ScalarKind::Bool => J::Bool(s.text.eq_ignore_ascii_case("true")),
            ScalarKind::Int => match s.as_int().and_then(|i| i64::try_from(i).ok()) {
                Some(i) => J::from(i),
                None => J::String(s.text.clone()),
            },
            ScalarKind::Float => s
                .text
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or(J::String(s.text.clone()), J::Number),
            ScalarKind::Str => J::String(s.text.clone()),
        },
        Value::Seq(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => J::Object(entries.iter().map(|e| (e.key.clone(), to_json(&e.value))).collect()),
    }
}

/// A deploy job's `rings: [{name, bake, gate}, …]` (issue 46): the job runs
/// once per ring, in order; between two rings the earlier ring's `bake`
/// and `gate` decide the promotion.
fn rings(ctx: &mut Ctx, label: &str, node: &Node, has_environment: bool, has_matrix: bool) -> Option<Vec<RingSpec>> {
    let subject = format!("`rings` of {label}");
    let items = as_seq(ctx, node, &subject, "a list of rings, e.g. `[{name: canary, bake: 10m}, {name: all}]`")?;
    if !has_environment {
        ctx.err(node.pos, format!("{subject}: rings deploy an environment in steps; add `environment:` to {label}"));
        return None;
    }
    if has_matrix {
        ctx.err(
            node.pos,
            format!("{subject}: a job with `rings` cannot have a `matrix` (yet); deploy each region or cell as a ring"),
        );
        return None;
    }
    if items.is_empty() || items.len() > MAX_RINGS {
        ctx.err(node.pos, format!("{subject} has {} rings; give 1 to {MAX_RINGS}", items.len()));
        return None;
    }
    let mut out: Vec<RingSpec> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let place = format!("ring {} of {subject}", i + 1);
        let Some(entries) = as_map(ctx, item, &place, "a map with `name` (and `bake`, `gate`)") else {
            ok = false;
            continue;
        };
        check_keys(ctx, entries, RING_KEYS, &format!("in {place}"));
        let Some(name_entry) =
            require(ctx, entries, item.pos, "name", || format!("{place} has no `name`; add `name: canary`"))
        else {
            ok = false;
            continue;
        };
        let Some(name) = as_nonempty_text(ctx, &name_entry.value, &format!("`name` of {place}"), "a ring name") else {
            ok = false;
            continue;
        };
        if !valid_environment_name(name) || name.len() > 32 {
            ctx.err(
                name_entry.value.pos,
                format!(
                    "ring name `{}` in {subject}: use 1 to 32 letters, digits, `-`, `_` or `.`, starting with a letter or digit",
                    show(name)
                ),
            );
            ok = false;
            continue;
        }
        if out.iter().any(|r| r.name == name) {
            ctx.err(name_entry.value.pos, format!("{subject} names ring `{name}` twice; ring names must be unique"));
            ok = false;
            continue;
        }
        let last = i + 1 == items.len();
        let mut bake_secs = 0;
        if let Some(e) = get(entries, "bake") {
            let text = as_nonempty_text(
                ctx,
                &e.value,
                &format!("`bake` of ring `{name}` in {subject}"),
                "a duration such as `10m`",
            );
            match text.and_then(parse_duration) {
                Some(s) if s <= MAX_BAKE_SECS => bake_secs = s,
                Some(_) => {
                    ctx.err(e.value.pos, format!("`bake` of ring `{name}` in {subject} is longer than a week (7d)"));
                    ok = false;
                }
                None => {
                    if text.is_some() {
                        ctx.err(
                            e.value.pos,
                            format!(
                                "`bake` of ring `{name}` in {subject} must be a duration in whole seconds such as `90s`, `10m` or `1h`, found `{}`",
                                show(text.unwrap_or_default())
                            ),
                        );
                    }
                    ok = false;
                }
            }
            if last && bake_secs > 0 {
                ctx.err(
                    e.key_pos,
                    format!(
                        "ring `{name}` is the last of {subject}, so its `bake` would hold nothing; bake and gate decide the promotion to the next ring"
                    ),
                );
                ok = false;
            }
        }
        let gate = match get(entries, "gate") {
            None => None,
            Some(_) if last => {
                ctx.err(
                    get(entries, "gate").map_or(item.pos, |e| e.key_pos),
                    format!(
                        "ring `{name}` is the last of {subject}, so its `gate` would promote to nothing; a gate decides the promotion to the next ring"
                    ),
                );
                ok = false;
                None
            }
            Some(e) => {
                let gsub = format!("`gate` of ring `{name}` in {subject}");
                let expected = "a map with one of `prometheus: {query, success, …}` or `run: <command>`";
                match as_map(ctx, &e.value, &gsub, expected) {
                    None => {
                        ok = false;
                        None
                    }
                    Some(g) => {
                        check_keys(ctx, g, GATE_KEYS, &format!("in {gsub}"));
                        match (get(g, "prometheus"), get(g, "run")) {
                            (Some(p), None) => {
                                let json = to_json(&p.value);
                                match kiln_deploy::PrometheusGate::from_value(&json) {
                                    Ok(_) => Some(GateSpec::Prometheus(json.to_string())),
                                    Err(why) => {
                                        ctx.err(p.value.pos, format!("invalid `prometheus` in {gsub}: {why}"));
                                        ok = false;
                                        None
                                    }
                                }
                            }
                            (None, Some(r)) => {
                                match as_nonempty_text(ctx, &r.value, &format!("`run` of {gsub}"), "a command") {
                                    Some(cmd) => match check_run(cmd) {
                                        Err(e) => {
                                            let why = script_error(cmd, &e);
                                            ctx.err(r.value.pos, format!("invalid `run` of {gsub}: {why}"));
                                            ok = false;
                                            None
                                        }
                                        Ok(_) => Some(GateSpec::Command(cmd.to_string())),
                                    },
                                    None => {
                                        ok = false;
                                        None
                                    }
                                }
                            }
                            _ => {
                                // An unknown key was named above already.
                                if g.iter().all(|e| GATE_KEYS.contains(&e.key.as_str())) {
                                    ctx.err(e.value.pos, format!("{gsub} must be {expected}"));
                                }
                                ok = false;
                                None
                            }
                        }
                    }
                }
            }
        };
        out.push(RingSpec { name: name.to_string(), bake_secs, gate });
    }
    ok.then_some(out)
}

/// The jobs a deploy job with `rings:` becomes: one per ring (`deploy
/// (canary)`, with `KILN_RING`), each needing the one before — or, after a
/// ring with a command gate, the gate job (`deploy (canary gate)`) that
/// runs the command. Returns each job with the names it needs (`None`: the
/// job's own `needs`).
fn ring_jobs(base: &Job, rings: &[RingSpec]) -> Vec<(Job, Option<Vec<String>>)> {
    let env = base.environment.clone().unwrap_or_default();
    let count = u32::try_from(rings.len()).unwrap_or(u32::MAX);
    let mut out: Vec<(Job, Option<Vec<String>>)> = Vec::new();
    let mut before: Option<String> = None;
    for (i, ring) in rings.iter().enumerate() {
        let mut job = base.clone();
        job.name = format!("{} ({})", base.name, ring.name);
        job.env.insert("KILN_RING".into(), ring.name.clone());
        job.environment = Some(Environment {
            ring: Some(Ring { name: ring.name.clone(), index: u32::try_from(i).unwrap_or(u32::MAX), count }),
            ..env.clone()
        });
        if i > 0 {
            let prev = &rings[i - 1];
            let command = matches!(prev.gate, Some(GateSpec::Command(_)));
            if !command {
                job.promotion = Some(Promotion {
                    environment: env.name.clone(),
                    from: prev.name.clone(),
                    to: ring.name.clone(),
                    bake_secs: prev.bake_secs,
                    prometheus: match &prev.gate {
                        Some(GateSpec::Prometheus(p)) => Some(p.clone()),
                        _ => None,
                    },
                    command: false,
                });
            }
        }
        let needs = before.take().map(|b| vec![b]);
        let name = job.name.clone();
        out.push((job, needs));
        before = Some(name.clone());
        if let Some(GateSpec::Command(cmd)) = &ring.gate {
            let next = rings.get(i + 1).map_or_else(String::new, |r| r.name.clone());
            let mut env_vars = base.env.clone();
            env_vars.insert("KILN_RING".into(), ring.name.clone());
            let gate = Job {
                name: format!("{} ({} gate)", base.name, ring.name),
                image: base.image.clone(),
                steps: vec![Step { name: Some(format!("gate before `{next}`")), run: cmd.clone(), ..Step::default() }],
                env: env_vars,
                runs_on: base.runs_on.clone(),
                timeout_secs: base.timeout_secs,
                timeout_expr: base.timeout_expr.clone(),
                promotion: Some(Promotion {
                    environment: env.name.clone(),
                    from: ring.name.clone(),
                    to: next,
                    bake_secs: ring.bake_secs,
                    prometheus: None,
                    command: true,
                }),
                ..Job::default()
            };
            let gate_name = gate.name.clone();
            out.push((gate, Some(vec![name])));
            before = Some(gate_name);
        }
    }
    out
}

/// One job of the workflow after matrix expansion.
struct Unit {
    draft: usize,
    job: Job,
    /// The names it needs when not its draft's (a ring after the first).
    needs: Option<Vec<String>>,
}

/// A name `needs`/`from_job` may use.
struct Target {
    units: Vec<usize>,
    draft: usize,
    line: usize,
    /// The base name of a matrix job (stands for all its expansions).
    group: bool,
}

/// Expand matrices, then check what spans jobs: unique names, `needs`
/// pointing backwards, quorums, restores from ancestors that publish the
/// artifact. Fills in each job's effective `needs`. The result is in file
/// order, so every job comes after its needs.
fn cross_check(ctx: &mut Ctx, drafts: Vec<Draft>) -> Vec<Job> {
    let mut units: Vec<Unit> = Vec::new();
    let mut draft_units: Vec<Vec<usize>> = Vec::with_capacity(drafts.len());
    let mut index: HashMap<String, Target> = HashMap::new();
    let mut over_limit = false;
    for (i, d) in drafts.iter().enumerate() {
        let mut mine = Vec::new();
        let Some((name, pos)) = &d.name else {
            draft_units.push(mine);
            continue;
        };
        let mut names: Vec<(String, Vec<usize>, bool)> = Vec::new();
        match &d.matrix {
            None if d.rings.is_some() => {
                let (rings, _) = d.rings.as_ref().expect("rings");
                for (job, needs) in ring_jobs(&d.job, rings) {
                    names.push((job.name.clone(), vec![units.len()], false));
                    mine.push(units.len());
                    units.push(Unit { draft: i, job, needs });
                }
                names.push((name.clone(), mine.clone(), true));
            }
            None => {
                names.push((name.clone(), vec![units.len()], false));
                mine.push(units.len());
                units.push(Unit { draft: i, job: d.job.clone(), needs: None });
            }
            Some(m) => {
                if units.len() + m.combos.len() > MAX_JOBS && !over_limit {
                    over_limit = true;
                    ctx.err(
                        m.pos,
                        format!(
                            "the matrix of {} brings the workflow to {} jobs; at most {MAX_JOBS} are allowed in one workflow",
                            d.label,
                            units.len() + m.combos.len()
                        ),
                    );
                }
                if over_limit {
                    draft_units.push(mine);
                    continue;
                }
                for values in &m.combos {
                    let parts: Vec<String> =
                        m.order.iter().filter_map(|k| values.get(k).map(|v| format!("{k}={v}"))).collect();
                    let expanded = format!("{name} ({})", parts.join(", "));
                    let node = Node { pos: m.pos, value: Value::Seq(Vec::new()) };
                    if !check_name(ctx, &node, &expanded, "expanded matrix job name") {
                        continue;
                    }
                    let mut job = d.job.clone();
                    job.name = expanded.clone();
                    for (i, step) in job.steps.iter_mut().enumerate() {
                        let written = step.run.clone();
                        step.run = substitute(&step.run, values);
                        // The values are text of the script now: check again
                        // where the other `${{ }}` stand.
                        if step.run != written
                            && step.run.contains("${{")
                            && shell_expands(step.shell.as_deref())
                            && let Err(e) = check_run(&step.run)
                        {
                            ctx.err(
                                m.pos,
                                format!(
                                    "invalid `run` in step {} of {}: {}",
                                    i + 1,
                                    expanded,
                                    script_error(&step.run, &e)
                                ),
                            );
                        }
                        step.name = step.name.as_deref().map(|n| substitute(n, values));
                        for v in step.env.values_mut() {
                            *v = substitute(v, values);
                        }
                        step.working_directory = step.working_directory.as_deref().map(|w| substitute(w, values));
                        step.condition = step.condition.as_deref().map(|c| substitute_matrix_condition(c, values));
                    }
                    job.condition = job.condition.as_deref().map(|c| substitute_matrix_condition(c, values));
                    if let Some(cache) = &mut job.cache {
                        // The user's cache fields name the matrix keys the
                        // entry depends on; without any, every value does:
                        // two expansions never share an entry by accident.
                        let chosen = std::iter::once(&cache.version)
                            .chain(&cache.paths)
                            .chain(&cache.inputs)
                            .any(|t| has_matrix_ref(t));
                        cache.version = substitute(&cache.version, values);
                        for p in cache.paths.iter_mut().chain(cache.inputs.iter_mut()) {
                            *p = substitute(p, values);
                        }
                        if !chosen {
                            cache.version = format!("{} (matrix: {})", cache.version, parts.join(", "));
                        }
                    }
                    for p in &mut job.artifacts.publish {
                        p.name = substitute(&p.name, values);
                        p.path = substitute(&p.path, values);
                    }
                    for r in &mut job.artifacts.restore {
                        r.name = substitute(&r.name, values);
                        r.path = substitute(&r.path, values);
                    }
                    check_expanded(ctx, d, m.pos, &job);
                    for v in job.env.values_mut().chain(job.runs_on.values_mut()).chain(job.timeout_expr.iter_mut()) {
                        *v = substitute(v, values);
                    }
                    if let Some(Image::Ref { reference }) = &mut job.image {
                        *reference = substitute(reference, values);
                    }
                    for (k, v) in values {
                        job.env.insert(matrix_env_name(k), v.clone());
                    }
                    if let Some(c) = &mut job.concurrency {
                        c.group = substitute(&c.group, values);
                    }
                    job.matrix = Some(MatrixInfo {
                        group: name.clone(),
                        values: values.clone(),
                        max_parallel: m.max_parallel,
                        fail_fast: m.fail_fast,
                    });
                    names.push((expanded, vec![units.len()], false));
                    mine.push(units.len());
                    units.push(Unit { draft: i, job, needs: None });
                }
                names.push((name.clone(), mine.clone(), true));
            }
        }
        for (n, single, group) in names {
            match index.get(&n) {
                Some(t) => ctx.err(
                    *pos,
                    format!(
                        "duplicate job name `{}` (first used on line {}); job names must be unique",
                        show(&n),
                        t.line
                    ),
                ),
                None => {
                    index.insert(n, Target { units: single, draft: i, line: pos.line, group });
                }
            }
        }
        draft_units.push(mine);
    }
    if over_limit {
        return Vec::new();
    }

    // The list form is sequential until a job declares `needs` (spec 000
    // §2); in the map form, as in GitHub Actions, jobs without `needs` run
    // in parallel.
    let explicit = ctx.jobs_map || drafts.iter().any(|d| d.needs_declared);
    // Per draft: ancestor units and effective needs (unit names).
    let mut ancestors: Vec<BTreeSet<usize>> = Vec::with_capacity(drafts.len());
    let mut effective: Vec<Vec<String>> = Vec::with_capacity(drafts.len());
    for (i, d) in drafts.iter().enumerate() {
        let mut anc: BTreeSet<usize> = BTreeSet::new();
        let mut needs: Vec<usize> = Vec::new();
        if explicit {
            for (need, pos) in &d.needs {
                match index.get(need) {
                    None => ctx.err(
                        *pos,
                        format!(
                            "{} needs unknown job `{}`; `needs` must name a job defined earlier in this file",
                            d.label,
                            show(need)
                        ),
                    ),
                    Some(t) if t.draft == i => ctx.err(
                        *pos,
                        format!("{} needs itself; a job cannot depend on itself (cycles are not allowed)", d.label),
                    ),
                    // The map form was sorted by needs: only a cycle is left.
                    Some(t) if t.draft > i && ctx.jobs_map => ctx.err(
                        *pos,
                        format!(
                            "{} needs `{}`, which needs {} (directly or through other jobs); cycles are not allowed",
                            d.label,
                            show(need),
                            d.label
                        ),
                    ),
                    Some(t) if t.draft > i => ctx.err(
                        *pos,
                        format!(
                            "{} needs `{}`, which is defined later (line {}); a job may only need jobs defined before it, so cycles are not allowed — move `{}` above {}",
                            d.label,
                            show(need),
                            t.line,
                            show(need),
                            d.label
                        ),
                    ),
                    Some(t) => {
                        for &u in &t.units {
                            if !needs.contains(&u) {
                                needs.push(u);
                            }
                            anc.insert(u);
                            anc.extend(ancestors[units[u].draft].iter().copied());
                        }
                    }
                }
            }
        } else if i > 0 {
            anc.extend(ancestors[i - 1].iter().copied());
            anc.extend(draft_units[i - 1].iter().copied());
            needs.extend(draft_units[i - 1].iter().copied());
        }
        if let Some((_, pos)) = d.quorum
            && needs.is_empty()
        {
            ctx.err(pos, format!("{} has a `needs-policy` but needs no jobs; remove it or add `needs`", d.label));
        } else if let Some((q, pos)) = d.quorum
            && usize::try_from(q).unwrap_or(usize::MAX) > needs.len()
        {
            ctx.err(
                pos,
                format!(
                    "`quorum: {q}` of {} is more than the {} job{} it needs; use at most {}",
                    d.label,
                    needs.len(),
                    if needs.len() == 1 { "" } else { "s" },
                    needs.len()
                ),
            );
        }
        ancestors.push(anc);
        effective.push(needs.iter().map(|&u| units[u].job.name.clone()).collect());
    }

    for (i, d) in drafts.iter().enumerate() {
        for r in &d.output_refs {
            let job = show(&r.job);
            let problem = match index.get(&r.job) {
                None => Some(format!("there is no job named `{job}`")),
                Some(t) if t.group => Some(format!(
                    "`{job}` is a matrix job, and the outputs of its expansions cannot be read as one; write the value \
                     in a job that is not a matrix"
                )),
                Some(t) if !t.units.iter().any(|u| effective[i].contains(&units[*u].job.name)) => {
                    Some(format!("{} does not need `{job}`; add `{job}` to its `needs`", d.label))
                }
                Some(t) if !drafts[t.draft].job.outputs.contains(&r.output) => {
                    let declared = &drafts[t.draft].job.outputs;
                    Some(format!(
                        "`{job}` declares no output `{}`; {}",
                        show(&r.output),
                        if declared.is_empty() {
                            format!("add `outputs: [{}]` to `{job}`", show(&r.output))
                        } else {
                            format!(
                                "it declares {}",
                                declared.iter().map(|o| format!("`{o}`")).collect::<Vec<_>>().join(", ")
                            )
                        }
                    ))
                }
                Some(_) => None,
            };
            if let Some(p) = problem {
                ctx.err(r.pos, format!("invalid `needs.{job}.outputs.{}` in {}: {p}", show(&r.output), r.subject));
            }
        }
    }

    for (i, d) in drafts.iter().enumerate() {
        for (ri, (r, from_pos, name_pos)) in d.restore.iter().enumerate() {
            let from = show(&r.from_job);
            match index.get(&r.from_job) {
                None => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from unknown job `{from}`; `from_job` must name an earlier job in this file",
                        d.label
                    ),
                ),
                Some(t) if t.draft >= i => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from `{from}`, which is not defined before it; `from_job` must name an earlier job that {} needs",
                        d.label, d.label
                    ),
                ),
                Some(t) if t.group => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from matrix job `{from}`; a restore from a matrix job must name one expansion, e.g. `{}`",
                        d.label,
                        t.units.first().map_or(String::new(), |u| show(&units[*u].job.name))
                    ),
                ),
                Some(t) if !t.units.iter().all(|u| ancestors[i].contains(u)) => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from `{from}`, which it does not depend on; add `{from}` to its `needs` (directly or through another job)",
                        d.label
                    ),
                ),
                Some(t) => {
                    // Names as published and restored by the expansions
                    // (`${{ matrix.<key> }}` filled in).
                    let published: Vec<&str> = t
                        .units
                        .iter()
                        .flat_map(|u| units[*u].job.artifacts.publish.iter().map(|p| p.name.as_str()))
                        .collect();
                    let wanted: Vec<&str> = draft_units[i]
                        .iter()
                        .filter_map(|u| units[*u].job.artifacts.restore.get(ri))
                        .map(|r| r.name.as_str())
                        .collect();
                    for name in wanted.into_iter().filter(|n| !published.contains(n)) {
                        let hint = if published.is_empty() {
                            "it publishes no artifacts".to_string()
                        } else {
                            format!(
                                "it publishes {}",
                                published.iter().map(|p| format!("`{}`", show(p))).collect::<Vec<_>>().join(", ")
                            )
                        };
                        ctx.err(
                            *name_pos,
                            format!(
                                "{} restores artifact `{}` from `{from}`, but `{from}` does not publish an artifact of that name; {hint}",
                                d.label,
                                show(name)
                            ),
                        );
                    }
                }
            }
        }
    }

    units
        .into_iter()
        .map(|u| {
            let needs = u.needs.unwrap_or_else(|| effective[u.draft].clone());
            Job { needs, ..u.job }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m"), Some(1800));
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("1h"), Some(3600));
        assert_eq!(parse_duration("2h30m"), Some(9000));
        assert_eq!(parse_duration("1d2h3m4s"), Some(93784));
        assert_eq!(parse_duration("120"), Some(120));
        assert_eq!(parse_duration("h"), None);
        assert_eq!(parse_duration("30"), Some(30));
        assert_eq!(parse_duration("30x"), None);
        assert_eq!(parse_duration("1.5h"), Some(5400));
        assert_eq!(parse_duration("1m30s"), Some(90));
        assert_eq!(parse_duration("1.5s"), None, "whole seconds");
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("99999999999999999999999h"), None);
    }

    /// Every key the validator accepts is shown in the README (issue 16: "the
    /// README's workflow section documents every key with a short example"),
    /// as `key:` in an example or in running text. A key added to a key list
    /// without a word in the README fails here. (`on:`'s own keys are in
    /// docs/workflow.md, which the README points to for them.)
    #[test]
    fn the_readme_shows_every_accepted_key() {
        // The checkout the test runs in (cargo sets it at run time).
        let root = std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
        )
        .join("../..");
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md at the workspace root");
        let reference = std::fs::read_to_string(root.join("docs/workflow.md")).expect("docs/workflow.md");
        let shown = |text: &str, key: &str| {
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            text.match_indices(&format!("{key}:")).any(|(i, _)| !text[..i].chars().next_back().is_some_and(word))
        };
        let readme_lists: &[(&str, &[&str])] = &[
            ("top level", TOP_KEYS),
            ("job", JOB_KEYS),
            ("step", STEP_KEYS),
            ("defaults", DEFAULTS_KEYS),
            ("input", INPUT_KEYS),
            ("matrix", MATRIX_KEYWORDS),
            ("needs-policy", NEEDS_POLICY_KEYS),
            ("concurrency", CONCURRENCY_KEYS),
            ("retry", RETRY_KEYS),
            ("image", IMAGE_KEYS),
            ("cache", CACHE_KEYS),
            ("artifacts", ARTIFACTS_KEYS),
            ("artifacts.publish", PUBLISH_KEYS),
            ("artifacts.restore", RESTORE_KEYS),
            ("id-token", ID_TOKEN_KEYS),
            ("checkout", CHECKOUT_KEYS),
            ("service", services::SERVICE_KEYS),
            ("health", services::HEALTH_KEYS),
            ("rings", RING_KEYS),
            ("rings.gate", GATE_KEYS),
        ];
        let mut missing = Vec::new();
        for (place, keys) in readme_lists {
            missing.extend(keys.iter().filter(|k| !shown(&readme, k)).map(|k| format!("README: {place} key `{k}`")));
        }
        for (place, keys) in
            [("push", on::PUSH_KEYS), ("pull_request", on::PULL_REQUEST_KEYS), ("schedule", on::SCHEDULE_KEYS)]
        {
            missing.extend(
                keys.iter()
                    .filter(|k| !shown(&reference, k))
                    .map(|k| format!("docs/workflow.md: `on.{place}` key `{k}`")),
            );
        }
        assert!(missing.is_empty(), "accepted keys documented nowhere:\n{}", missing.join("\n"));
    }

    #[test]
    fn priority_is_a_lane_or_a_lane_per_event() {
        let job = "jobs:\n  - name: a\n    steps: [echo]\n";
        let wf = crate::parse(&format!("version: 1\npriority: background\n{job}")).unwrap();
        assert_eq!(wf.priority_for("push"), Some("background"));
        let wf = crate::parse(&format!("version: 1\npriority: {{push: urgent, schedule: background}}\n{job}")).unwrap();
        assert_eq!(wf.priority_for("push"), Some("urgent"));
        assert_eq!(wf.priority_for("pull_request"), None, "not named: the trigger's default");
        let plain = crate::parse(&format!("version: 1\n{job}")).unwrap();
        assert!(plain.priority.is_empty());
        let frozen = serde_json::to_string(&plain).unwrap();
        assert!(!frozen.contains("priority"), "a workflow without the key freezes (and hashes) as before: {frozen}");
        let e = crate::parse(&format!("version: 1\npriority: high\n{job}")).unwrap_err().to_string();
        assert!(e.contains("`priority` is `high`; expected one of `urgent`, `normal`, `background`"), "{e}");
        let e = crate::parse(&format!("version: 1\npriority: {{tag: urgent}}\n{job}")).unwrap_err().to_string();
        assert!(e.contains("unknown key `tag` in `priority`"), "{e}");
        let e = crate::parse(&format!("version: 1\npriority: {{push: soon}}\n{job}")).unwrap_err().to_string();
        assert!(e.contains("`priority.push` is `soon`"), "{e}");
    }

    #[test]
    fn env_keys() {
        assert!(env_key_ok("A"));
        assert!(env_key_ok("_a1"));
        assert!(!env_key_ok("1A"));
        assert!(!env_key_ok("A-B"));
        assert!(!env_key_ok(""));
    }
}
