//! Tree → validated [`Workflow`], collecting every problem with its position.

use crate::model::{Artifacts, Cache, Image, Job, MAX_JOBS, MAX_STEPS, Publish, Restore, Step, Workflow};
use crate::parse::Diagnostic;
use crate::tree::{Entry, Node, Pos, ScalarKind, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Longest accepted job or artifact name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Largest accepted `retry`.
pub const MAX_RETRY: u32 = 10;
/// Largest accepted `timeout`, in seconds (7 days).
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 60 * 60;

const TOP_KEYS: &[&str] = &["version", "jobs"];
const JOB_KEYS: &[&str] =
    &["name", "image", "steps", "needs", "matrix", "cache", "artifacts", "timeout", "retry", "runs-on", "env"];
const STEP_KEYS: &[&str] = &["run", "name"];
const IMAGE_KEYS: &[&str] = &["ref", "dockerfile", "context"];
const CACHE_KEYS: &[&str] = &["kind", "version", "inputs", "paths"];
const ARTIFACTS_KEYS: &[&str] = &["publish", "restore"];
const PUBLISH_KEYS: &[&str] = &["name", "path"];
const RESTORE_KEYS: &[&str] = &["from_job", "name", "path"];

#[derive(Default)]
struct Ctx {
    diags: Vec<Diagnostic>,
}

impl Ctx {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.push(Diagnostic { line: pos.line, column: pos.column, message: message.into() });
    }
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
        if !allowed.contains(&e.key.as_str()) {
            ctx.err(
                e.key_pos,
                format!("unknown key `{}` {place}; expected one of {}", show(&e.key), key_list(allowed)),
            );
        }
    }
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

/// `30m`, `90s`, `1h`, `2h30m`, `1d12h` or a bare number of seconds. Units
/// must appear at most once each, largest first.
fn parse_duration(text: &str) -> Option<u64> {
    let text = text.trim();
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
        return text.parse().ok();
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    let mut last_rank = usize::MAX;
    let mut any = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let (rank, unit) = match c {
            'd' => (3, 86_400),
            'h' => (2, 3_600),
            'm' => (1, 60),
            's' => (0, 1),
            _ => return None,
        };
        if number.is_empty() || rank >= last_rank {
            return None;
        }
        last_rank = rank;
        let n: u64 = number.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        number.clear();
        any = true;
    }
    if !number.is_empty() || !any {
        return None;
    }
    Some(total)
}

/// One job as read from the file, with the positions the cross-job checks
/// point at.
struct Draft {
    label: String,
    name: Option<(String, Pos)>,
    needs_declared: bool,
    needs: Vec<(String, Pos)>,
    /// `(artifact, position of its entry)`
    publish: Vec<(Publish, Pos)>,
    /// `(restore, position of from_job, position of name)`
    restore: Vec<(Restore, Pos, Pos)>,
    job: Job,
}

pub(crate) fn validate(root: &Node) -> Result<Workflow, Vec<Diagnostic>> {
    let mut ctx = Ctx::default();
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
    let items = as_seq(ctx, &jobs_entry.value, "`jobs`", "a list of jobs (each starting with `- name: ...`)")?;
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

    let drafts: Vec<Draft> = items.iter().enumerate().filter_map(|(i, node)| job(ctx, i, node)).collect();
    let jobs = cross_check(ctx, drafts);
    Some(Workflow { version: version?, jobs })
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
                name = Some((text.to_string(), e.value.pos));
            }
        }
    }
    let label = match &name {
        Some((n, _)) => format!("job `{}`", show(n)),
        None => format!("job {number}"),
    };
    let place = format!("in {label}");
    check_keys(ctx, entries, JOB_KEYS, &place);

    let steps = match require(ctx, entries, node.pos, "steps", || {
        format!("{label} has no `steps`; add a `steps:` list with at least one command")
    }) {
        None => Vec::new(),
        Some(e) => steps(ctx, &label, &e.value).unwrap_or_default(),
    };
    let image = get(entries, "image").and_then(|e| image(ctx, &label, &e.value));
    let needs_entry = get(entries, "needs");
    let needs = needs_entry.map(|e| needs_list(ctx, &label, &e.value)).unwrap_or_default();
    if let Some(e) = get(entries, "matrix") {
        ctx.err(e.key_pos, format!("`matrix` in {label} is not supported yet; write one job per combination for now"));
    }
    let cache = get(entries, "cache").and_then(|e| cache(ctx, &label, &e.value));
    let (publish, restore) = get(entries, "artifacts").map(|e| artifacts(ctx, &label, &e.value)).unwrap_or_default();
    let timeout_secs = get(entries, "timeout").and_then(|e| timeout(ctx, &label, &e.value));
    let retry = get(entries, "retry").and_then(|e| retry(ctx, &label, &e.value)).unwrap_or(0);
    let runs_on = get(entries, "runs-on").and_then(|e| runs_on(ctx, &label, &e.value)).unwrap_or_default();
    let env = get(entries, "env").and_then(|e| env(ctx, &label, &e.value)).unwrap_or_default();

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
        timeout_secs,
        retry,
        runs_on,
    };
    Some(Draft { label, name, needs_declared: needs_entry.is_some(), needs, publish, restore, job })
}

fn steps(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Vec<Step>> {
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
            Value::Map(entries) => {
                check_keys(ctx, entries, STEP_KEYS, &format!("in {subject}"));
                let run = match require(ctx, entries, item.pos, "run", || {
                    format!("{subject} has no `run`; add `run: <command>`")
                }) {
                    None => None,
                    Some(e) => as_nonempty_text(ctx, &e.value, &format!("`run` in {subject}"), "a command string"),
                };
                let name = match get(entries, "name") {
                    None => Some(None),
                    Some(e) => as_nonempty_text(ctx, &e.value, &format!("`name` in {subject}"), "a string")
                        .map(|n| Some(n.to_string())),
                };
                match (run, name) {
                    (Some(run), Some(name)) => Some(Step { name, run: run.to_string() }),
                    _ => None,
                }
            }
            _ => as_nonempty_text(ctx, item, &subject, "a command string or a map with `run`")
                .map(|run| Step { name: None, run: run.to_string() }),
        };
        match step {
            Some(s) => out.push(s),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn image(ctx: &mut Ctx, label: &str, node: &Node) -> Option<Image> {
    let subject = format!("`image` of {label}");
    let expected = "an image reference or a map with `ref` or `dockerfile`";
    let check_ref = |ctx: &mut Ctx, n: &Node, text: &str| {
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
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

fn string_list(ctx: &mut Ctx, node: &Node, subject: &str, allow_absolute: bool) -> Option<Vec<String>> {
    let items = as_seq(ctx, node, subject, "a list of paths")?;
    let mut out = Vec::new();
    let mut ok = true;
    for item in items {
        let s = format!("an entry of {subject}");
        match as_nonempty_text(ctx, item, &s, "a path").filter(|p| check_path(ctx, item, p, &s, allow_absolute)) {
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
    let version = text_field(ctx, "version", "cache version");
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
            } else {
                paths
            }
        }
    };
    Some(Cache { kind: kind?, version: version?, inputs: inputs?, paths: paths? })
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
                    let path = artifact_path(ctx, fields, item.pos, &es);
                    let (Some((name, name_pos)), Some(path)) = (name, path) else {
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
                    publish.push((Publish { name, path }, name_pos));
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
    let text = as_nonempty_text(ctx, &e.value, &format!("`name` in {subject}"), "an artifact name")?;
    check_name(ctx, &e.value, text, "artifact name").then(|| (text.to_string(), e.value.pos))
}

fn artifact_path(ctx: &mut Ctx, fields: &[Entry], pos: Pos, subject: &str) -> Option<String> {
    let e = require(ctx, fields, pos, "path", || {
        format!("{subject} has no `path`; add `path: <path relative to the workspace>`")
    })?;
    let s = format!("`path` in {subject}");
    let text = as_nonempty_text(ctx, &e.value, &s, "a path relative to the workspace")?;
    check_path(ctx, &e.value, text, &s, false).then(|| text.to_string())
}

fn timeout(ctx: &mut Ctx, label: &str, node: &Node) -> Option<u64> {
    let subject = format!("`timeout` of {label}");
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
                        "{subject} must be a duration like `90s`, `30m`, `1h` or `2h30m`, or a number of seconds; found `{}`",
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
        Some(n) if n > MAX_TIMEOUT_SECS => {
            ctx.err(
                node.pos,
                format!("{subject} is longer than 7 days; use at most `7d` ({MAX_TIMEOUT_SECS} seconds)"),
            );
            None
        }
        other => other,
    }
}

fn retry(ctx: &mut Ctx, label: &str, node: &Node) -> Option<u32> {
    let subject = format!("`retry` of {label}");
    match &node.value {
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
                format!("{subject} must be a whole number from 0 to {MAX_RETRY}, found {}", node.describe()),
            );
            None
        }
    }
}

fn runs_on(ctx: &mut Ctx, label: &str, node: &Node) -> Option<BTreeMap<String, String>> {
    let subject = format!("`runs-on` of {label}");
    let expected = "a map of agent labels (e.g. `{os: linux}`) or an OS name";
    if let Value::Scalar(_) = node.value {
        let os = as_nonempty_text(ctx, node, &subject, expected)?;
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

/// Checks that span jobs: unique names, `needs` pointing backwards,
/// restores from ancestors that publish the artifact. Fills in each job's
/// effective `needs`.
fn cross_check(ctx: &mut Ctx, drafts: Vec<Draft>) -> Vec<Job> {
    // name -> (draft index, line)
    let mut index: HashMap<String, (usize, usize)> = HashMap::new();
    for (i, d) in drafts.iter().enumerate() {
        let Some((name, pos)) = &d.name else { continue };
        match index.get(name) {
            Some((_, first_line)) => ctx.err(
                *pos,
                format!(
                    "duplicate job name `{}` (first used on line {first_line}); job names must be unique",
                    show(name)
                ),
            ),
            None => {
                index.insert(name.clone(), (i, pos.line));
            }
        }
    }

    let explicit = drafts.iter().any(|d| d.needs_declared);
    let mut ancestors: Vec<BTreeSet<usize>> = Vec::with_capacity(drafts.len());
    let mut effective: Vec<Vec<String>> = Vec::with_capacity(drafts.len());
    for (i, d) in drafts.iter().enumerate() {
        let mut anc = BTreeSet::new();
        let mut needs = Vec::new();
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
                    Some((j, _)) if *j == i => ctx.err(
                        *pos,
                        format!(
                            "{} needs itself; a job cannot depend on itself (cycles are not allowed)",
                            d.label
                        ),
                    ),
                    Some((j, line)) if *j > i => ctx.err(
                        *pos,
                        format!(
                            "{} needs `{}`, which is defined later (line {line}); a job may only need jobs defined before it, so cycles are not allowed — move `{}` above {}",
                            d.label,
                            show(need),
                            show(need),
                            d.label
                        ),
                    ),
                    Some((j, _)) => {
                        anc.insert(*j);
                        anc.extend(ancestors[*j].iter().copied());
                        needs.push(need.clone());
                    }
                }
            }
        } else if i > 0 {
            anc.extend(ancestors[i - 1].iter().copied());
            anc.insert(i - 1);
            if let Some((prev, _)) = &drafts[i - 1].name {
                needs.push(prev.clone());
            }
        }
        ancestors.push(anc);
        effective.push(needs);
    }

    let published: Vec<HashSet<&str>> =
        drafts.iter().map(|d| d.publish.iter().map(|(p, _)| p.name.as_str()).collect()).collect();
    for (i, d) in drafts.iter().enumerate() {
        for (r, from_pos, name_pos) in &d.restore {
            let from = show(&r.from_job);
            match index.get(&r.from_job) {
                None => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from unknown job `{from}`; `from_job` must name an earlier job in this file",
                        d.label
                    ),
                ),
                Some((j, _)) if *j >= i => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from `{from}`, which is not defined before it; `from_job` must name an earlier job that {} needs",
                        d.label, d.label
                    ),
                ),
                Some((j, _)) if !ancestors[i].contains(j) => ctx.err(
                    *from_pos,
                    format!(
                        "{} restores an artifact from `{from}`, which it does not depend on; add `{from}` to its `needs` (directly or through another job)",
                        d.label
                    ),
                ),
                Some((j, _)) => {
                    let producer = &drafts[*j];
                    if !published[*j].contains(r.name.as_str()) {
                        let published: Vec<String> = producer
                            .publish
                            .iter()
                            .map(|(p, _)| format!("`{}`", show(&p.name)))
                            .collect();
                        let hint = if published.is_empty() {
                            "it publishes no artifacts".to_string()
                        } else {
                            format!("it publishes {}", published.join(", "))
                        };
                        ctx.err(
                            *name_pos,
                            format!(
                                "{} restores artifact `{}` from `{from}`, but `{from}` does not publish an artifact of that name; {hint}",
                                d.label,
                                show(&r.name)
                            ),
                        );
                    }
                }
            }
        }
    }

    drafts.into_iter().zip(effective).map(|(d, needs)| Job { needs, ..d.job }).collect()
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
        assert_eq!(parse_duration("30m2h"), None);
        assert_eq!(parse_duration("1h1h"), None);
        assert_eq!(parse_duration("h"), None);
        assert_eq!(parse_duration("30"), Some(30));
        assert_eq!(parse_duration("30x"), None);
        assert_eq!(parse_duration("1.5h"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("99999999999999999999999h"), None);
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
