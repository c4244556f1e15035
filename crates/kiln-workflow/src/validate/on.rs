//! `on:`: which events start the workflow (see [`Triggers`]).

use super::{Ctx, as_nonempty_text, check_keys, get, key_list, show};
use crate::glob::check_pattern;
use crate::model::{
    MAX_CRON_CHARS, MAX_PATTERN_CHARS, MAX_PATTERNS, MAX_SCHEDULES, MAX_TIMEZONE_CHARS, PullRequestTrigger,
    PushTrigger, Schedule, Triggers,
};
use crate::tree::{Entry, Node, ScalarKind, Value};
use crate::triggers::{parse_cron, parse_timezone};

const EVENTS: &[&str] = &["push", "pull_request", "schedule", "manual"];
pub(super) const PUSH_KEYS: &[&str] = &["branches", "branches-ignore", "tags", "tags-ignore", "paths", "paths-ignore"];
pub(super) const PULL_REQUEST_KEYS: &[&str] = &["branches", "branches-ignore", "paths", "paths-ignore"];
pub(super) const SCHEDULE_KEYS: &[&str] = &["cron", "timezone"];

/// 2000-01-01T00:00:00Z: a schedule that has no tick in the 28 years after
/// this (a full weekday/leap-year cycle) names a date that never comes.
const NEVER_PROBE_MS: i64 = 946_684_800_000;

fn is_null(node: &Node) -> bool {
    matches!(&node.value, Value::Scalar(s) if s.kind() == ScalarKind::Null)
}

fn unknown_event(ctx: &mut Ctx, node: &Node, name: &str) {
    let hint = match name {
        "workflow_dispatch" => "; a run started by hand (CLI, API, web UI) is `manual`".to_string(),
        "pull_request_target"
        | "merge_group"
        | "release"
        | "workflow_run"
        | "workflow_call"
        | "create"
        | "delete"
        | "issues"
        | "issue_comment"
        | "repository_dispatch" => "; Kiln does not support this GitHub event".to_string(),
        _ => String::new(),
    };
    ctx.err(node.pos, format!("unknown event `{}` in `on`; expected one of {}{hint}", show(name), key_list(EVENTS)));
}

/// `on:` as written: an event name, a list of event names, or a map from
/// event to its settings. Every problem is reported; `None` when any was.
pub(super) fn on(ctx: &mut Ctx, node: &Node) -> Option<Triggers> {
    let before = ctx.diags.len();
    let mut t = Triggers { declared: true, ..Triggers::default() };
    let empty_message = "`on` is empty; list the events that start this workflow (`push`, `pull_request`, `schedule`, `manual`), or remove `on` to run it only by hand";
    match &node.value {
        Value::Scalar(s) if s.kind() == ScalarKind::Null => ctx.err(node.pos, empty_message),
        Value::Scalar(_) => {
            if let Some(name) = as_nonempty_text(ctx, node, "`on`", "an event name, a list or a map of events") {
                short_event(ctx, node, name, &mut t);
            }
        }
        Value::Seq(items) => {
            if items.is_empty() {
                ctx.err(node.pos, empty_message);
            }
            let mut seen: Vec<&str> = Vec::new();
            for item in items {
                let Some(name) = as_nonempty_text(ctx, item, "an entry of `on`", "an event name") else { continue };
                if seen.contains(&name) {
                    ctx.err(item.pos, format!("`on` lists `{}` twice; remove one", show(name)));
                    continue;
                }
                seen.push(name);
                short_event(ctx, item, name, &mut t);
            }
        }
        Value::Map(entries) => {
            if entries.is_empty() {
                ctx.err(node.pos, empty_message);
            }
            for e in entries {
                match e.key.as_str() {
                    "push" => t.push = push(ctx, &e.value),
                    "pull_request" => t.pull_request = pull_request(ctx, &e.value),
                    "schedule" => t.schedule = schedules(ctx, &e.value).unwrap_or_default(),
                    "manual" => t.manual = manual(ctx, &e.value),
                    other => {
                        let key_node = Node { pos: e.key_pos, value: Value::Seq(Vec::new()) };
                        unknown_event(ctx, &key_node, other);
                    }
                }
            }
        }
    }
    (ctx.diags.len() == before).then_some(t)
}

/// `on: push` or an entry of `on: [push, manual]`.
fn short_event(ctx: &mut Ctx, node: &Node, name: &str, t: &mut Triggers) {
    match name {
        "push" => t.push = Some(PushTrigger::default()),
        "pull_request" => t.pull_request = Some(PullRequestTrigger::default()),
        "manual" => t.manual = true,
        "schedule" => ctx
            .err(node.pos, "`schedule` needs its times; write it as a map: `on: {schedule: [{cron: \"0 3 * * *\"}]}`"),
        other => unknown_event(ctx, node, other),
    }
}

/// The filter map of `push`/`pull_request` (null: no filters).
fn filter_map<'a>(ctx: &mut Ctx, node: &'a Node, subject: &str) -> Option<&'a [Entry]> {
    match &node.value {
        Value::Map(entries) => Some(entries),
        _ if is_null(node) => Some(&[]),
        _ => {
            ctx.err(
                node.pos,
                format!("{subject} must be a map of filters (or empty for no filters), found {}", node.describe()),
            );
            None
        }
    }
}

/// One filter list; `Vec::new()` when absent or invalid (reported).
fn filter(ctx: &mut Ctx, entries: &[Entry], key: &str, subject: &str) -> Vec<String> {
    get(entries, key).and_then(|e| patterns(ctx, &e.value, &format!("`{key}` in {subject}"))).unwrap_or_default()
}

/// `branches` and `branches-ignore` (and the like) exclude each other.
fn exclusive(ctx: &mut Ctx, entries: &[Entry], key: &str, subject: &str) {
    let ignore = format!("{key}-ignore");
    if let (Some(a), Some(b)) = (get(entries, key), get(entries, &ignore)) {
        let later = if a.key_pos > b.key_pos { a } else { b };
        ctx.err(
            later.key_pos,
            format!(
                "{subject} sets both `{key}` and `{ignore}`; use only one (to exclude some {key} from `{key}`, add `!pattern` entries to it)"
            ),
        );
    }
}

fn push(ctx: &mut Ctx, node: &Node) -> Option<PushTrigger> {
    let subject = "`on.push`";
    let entries = filter_map(ctx, node, subject)?;
    check_keys(ctx, entries, PUSH_KEYS, &format!("in {subject}"));
    for key in ["branches", "tags", "paths"] {
        exclusive(ctx, entries, key, subject);
    }
    Some(PushTrigger {
        branches: filter(ctx, entries, "branches", subject),
        branches_ignore: filter(ctx, entries, "branches-ignore", subject),
        tags: filter(ctx, entries, "tags", subject),
        tags_ignore: filter(ctx, entries, "tags-ignore", subject),
        paths: filter(ctx, entries, "paths", subject),
        paths_ignore: filter(ctx, entries, "paths-ignore", subject),
    })
}

fn pull_request(ctx: &mut Ctx, node: &Node) -> Option<PullRequestTrigger> {
    let subject = "`on.pull_request`";
    let entries = filter_map(ctx, node, subject)?;
    check_keys(ctx, entries, PULL_REQUEST_KEYS, &format!("in {subject}"));
    for key in ["branches", "paths"] {
        exclusive(ctx, entries, key, subject);
    }
    Some(PullRequestTrigger {
        branches: filter(ctx, entries, "branches", subject),
        branches_ignore: filter(ctx, entries, "branches-ignore", subject),
        paths: filter(ctx, entries, "paths", subject),
        paths_ignore: filter(ctx, entries, "paths-ignore", subject),
    })
}

fn manual(ctx: &mut Ctx, node: &Node) -> bool {
    match &node.value {
        Value::Map(entries) => {
            for e in entries {
                ctx.err(
                    e.key_pos,
                    format!(
                        "unknown key `{}` in `on.manual`; it takes no settings (write `manual: {{}}`)",
                        show(&e.key)
                    ),
                );
            }
        }
        _ if is_null(node) => {}
        _ => ctx.err(
            node.pos,
            format!("`on.manual` must be empty (`manual:` or `manual: {{}}`), found {}", node.describe()),
        ),
    }
    true
}

/// A list of filter patterns (a single string is a list of one).
fn patterns(ctx: &mut Ctx, node: &Node, subject: &str) -> Option<Vec<String>> {
    let expected = "a list of patterns like `[main, \"release/**\"]`";
    let items: Vec<&Node> = match &node.value {
        Value::Seq(items) => items.iter().collect(),
        Value::Scalar(_) if !is_null(node) => vec![node],
        _ => {
            ctx.err(node.pos, format!("{subject} must be {expected}, found {}", node.describe()));
            return None;
        }
    };
    if items.is_empty() {
        ctx.err(node.pos, format!("{subject} is empty; list at least one pattern, or remove it"));
        return None;
    }
    if items.len() > MAX_PATTERNS {
        ctx.err(node.pos, format!("{subject} lists {} patterns; at most {MAX_PATTERNS} are allowed", items.len()));
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let Some(text) = as_nonempty_text(ctx, item, &format!("an entry of {subject}"), "a pattern") else {
            ok = false;
            continue;
        };
        match pattern_problem(text, i == 0) {
            Some(problem) => {
                ctx.err(item.pos, format!("invalid pattern `{}` in {subject}: {problem}", show(text)));
                ok = false;
            }
            None => out.push(text.to_string()),
        }
    }
    ok.then_some(out)
}

fn pattern_problem(text: &str, first: bool) -> Option<String> {
    let chars = text.chars().count();
    if chars > MAX_PATTERN_CHARS {
        return Some(format!("it is {chars} characters long; at most {MAX_PATTERN_CHARS} are allowed"));
    }
    if text.chars().any(char::is_control) {
        return Some("it contains a control character".to_string());
    }
    let body = match text.strip_prefix('!') {
        Some(_) if first => {
            return Some(
                "the first pattern of a list cannot be negative (`!`); start with the patterns to include, then exclude from them"
                    .to_string(),
            );
        }
        Some(rest) => rest,
        None => text,
    };
    if body.is_empty() {
        return Some("`!` must be followed by a pattern".to_string());
    }
    check_pattern(body).err()
}

fn schedules(ctx: &mut Ctx, node: &Node) -> Option<Vec<Schedule>> {
    let subject = "`on.schedule`";
    let Value::Seq(items) = &node.value else {
        ctx.err(
            node.pos,
            format!(
                "{subject} must be a list of `- cron: \"<minute> <hour> <day> <month> <weekday>\"` entries, found {}",
                node.describe()
            ),
        );
        return None;
    };
    if items.is_empty() {
        ctx.err(node.pos, format!("{subject} is empty; add at least one `- cron: ...` entry, or remove it"));
        return None;
    }
    if items.len() > MAX_SCHEDULES {
        ctx.err(node.pos, format!("{subject} lists {} schedules; at most {MAX_SCHEDULES} are allowed", items.len()));
        return None;
    }
    let mut out: Vec<Schedule> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match schedule(ctx, item, &format!("schedule {} of {subject}", i + 1)) {
            Some(s) if out.contains(&s) => {
                ctx.err(item.pos, format!("{subject} lists `{}` twice; remove one", show(&s.cron)));
                ok = false;
            }
            Some(s) => out.push(s),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn schedule(ctx: &mut Ctx, node: &Node, subject: &str) -> Option<Schedule> {
    let Value::Map(entries) = &node.value else {
        ctx.err(
            node.pos,
            format!(
                "{subject} must be a map like `{{cron: \"0 3 * * *\", timezone: Europe/Berlin}}`, found {}",
                node.describe()
            ),
        );
        return None;
    };
    check_keys(ctx, entries, SCHEDULE_KEYS, &format!("in {subject}"));
    let timezone = match get(entries, "timezone") {
        None => Some(None),
        Some(e) => {
            let s = format!("`timezone` in {subject}");
            match as_nonempty_text(ctx, &e.value, &s, "an IANA time zone name like `Europe/Berlin`") {
                None => None,
                Some(name) if name.chars().count() > MAX_TIMEZONE_CHARS || parse_timezone(name).is_none() => {
                    ctx.err(
                        e.value.pos,
                        format!(
                            "unknown time zone `{}` in {subject}; use an IANA name like `Europe/Berlin`, `America/New_York` or `UTC`",
                            show(name)
                        ),
                    );
                    None
                }
                Some(name) => Some(Some(name.to_string())),
            }
        }
    };
    let Some(e) = get(entries, "cron") else {
        ctx.err(node.pos, format!("{subject} has no `cron`; add `cron: \"<minute> <hour> <day> <month> <weekday>\"`"));
        return None;
    };
    let s = format!("`cron` in {subject}");
    let cron = as_nonempty_text(ctx, &e.value, &s, "a crontab line like `\"*/15 * * * *\"`")?;
    let s = format!("`cron` `{}` in {subject}", show(cron));
    let chars = cron.chars().count();
    if chars > MAX_CRON_CHARS {
        ctx.err(
            e.value.pos,
            format!("`cron` in {subject} is {chars} characters long; at most {MAX_CRON_CHARS} are allowed"),
        );
        return None;
    }
    if let Err(problem) = parse_cron(cron) {
        ctx.err(e.value.pos, format!("invalid {s}: {problem}"));
        return None;
    }
    let schedule = Schedule { cron: cron.to_string(), timezone: timezone? };
    if schedule.next_tick(NEVER_PROBE_MS).is_none() {
        ctx.err(e.value.pos, format!("{s} never runs: no date matches it (e.g. February 30th)"));
        return None;
    }
    Some(schedule)
}
