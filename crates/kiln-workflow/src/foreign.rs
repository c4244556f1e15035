//! Files written with other CI systems' habits (issue 41, item 7).
//!
//! * GitHub Actions' `jobs:` map (`jobs: {build: {...}, test: {needs: build}}`)
//!   is read as the list: [`jobs_map_to_list`] turns each entry into a list
//!   item whose `name` is the key (unless the job has its own `name:`). A
//!   job with its own `name:` is known by that name; its key still works in
//!   `needs` and `from_job` ([`resolve_keys`] rewrites it to the name, so
//!   the frozen definition only holds names). In GitHub the map's order
//!   means nothing and `needs` may point forward, so [`order_by_needs`]
//!   sorts the jobs so that each comes after its needs (file order
//!   otherwise); and since GitHub runs jobs without `needs` in parallel, so
//!   does Kiln for the map form (the list form keeps the spec's sequential
//!   default).
//! * A GitLab CI or Woodpecker file is recognised ([`other_system`]) and
//!   answered with one message pointing at `docs/migrating.md`, instead of
//!   dozens of unknown keys.

use crate::diag::Diagnostic;
use crate::tree::{Entry, Node, Pos, Scalar, ScalarKind, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A job of the map form whose own `name:` differs from its key.
pub(crate) struct KeyAlias {
    pub key: String,
    pub key_pos: Pos,
    pub name: String,
}

/// Turn `jobs:` given as a map into the list form, in place. Returns `None`
/// when `jobs` is not a map, else the keys that stand for another name.
pub(crate) fn jobs_map_to_list(top: &mut [Entry]) -> Option<Vec<KeyAlias>> {
    let jobs = top.iter_mut().find(|e| e.key == "jobs")?;
    let Value::Map(entries) = &mut jobs.value.value else { return None };
    let mut aliases = Vec::new();
    let mut items = Vec::with_capacity(entries.len());
    for e in std::mem::take(entries) {
        let Entry { key, key_pos, mut value } = e;
        if let Value::Map(fields) = &mut value.value {
            match fields.iter().find(|f| f.key == "name") {
                None => fields.insert(
                    0,
                    Entry {
                        key: "name".into(),
                        key_pos,
                        value: Node { pos: key_pos, value: Value::Scalar(Scalar { text: key, plain: false }) },
                    },
                ),
                Some(f) => {
                    if let Value::Scalar(s) = &f.value.value
                        && s.kind() != ScalarKind::Null
                        && s.text != key
                    {
                        aliases.push(KeyAlias { key, key_pos, name: s.text.clone() });
                    }
                }
            }
        }
        items.push(value);
    }
    jobs.value.value = Value::Seq(items);
    Some(aliases)
}

/// The text of a job's `name` (list form).
fn job_name(job: &Node) -> Option<&str> {
    let Value::Map(fields) = &job.value else { return None };
    match &fields.iter().find(|f| f.key == "name")?.value.value {
        Value::Scalar(s) => Some(&s.text),
        _ => None,
    }
}

/// Rewrite `needs` and `from_job` entries that name a job by its map key
/// into the job's name. A key that is also another job's name is refused
/// (it would mean two jobs).
pub(crate) fn resolve_keys(jobs: &mut [Node], aliases: &[KeyAlias], diags: &mut Vec<Diagnostic>) {
    if aliases.is_empty() {
        return;
    }
    let names: HashSet<String> = jobs.iter().filter_map(job_name).map(str::to_string).collect();
    let mut map: HashMap<&str, &str> = HashMap::new();
    for a in aliases {
        if names.contains(&a.key) {
            diags.push(Diagnostic::at(
                a.key_pos,
                format!(
                    "job key `{}` is also the `name` of another job, so `needs: {}` would be ambiguous; rename the \
                     key or the other job",
                    a.key, a.key
                ),
            ));
        } else {
            map.insert(&a.key, &a.name);
        }
    }
    let fix = |node: &mut Node| {
        if let Value::Scalar(s) = &mut node.value
            && let Some(name) = map.get(s.text.as_str())
        {
            s.text = name.to_string();
            s.plain = false;
        }
    };
    for job in jobs {
        let Value::Map(fields) = &mut job.value else { continue };
        for f in fields.iter_mut() {
            match (f.key.as_str(), &mut f.value.value) {
                ("needs", Value::Seq(items)) => items.iter_mut().for_each(fix),
                ("needs", Value::Scalar(_)) => fix(&mut f.value),
                ("artifacts", Value::Map(a)) => {
                    for r in a.iter_mut().filter(|r| r.key == "restore") {
                        let Value::Seq(items) = &mut r.value.value else { continue };
                        for item in items {
                            let Value::Map(rf) = &mut item.value else { continue };
                            rf.iter_mut().filter(|x| x.key == "from_job").for_each(|x| fix(&mut x.value));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Sort the jobs so that each comes after the jobs its `needs` names
/// (stable: otherwise in file order). Jobs in a cycle, or needing an
/// unknown job, keep their place; the validator reports them.
pub(crate) fn order_by_needs(jobs: &mut Vec<Node>) {
    let names: Vec<Option<String>> = jobs.iter().map(|j| job_name(j).map(str::to_string)).collect();
    let index: BTreeMap<&str, usize> =
        names.iter().enumerate().filter_map(|(i, n)| n.as_deref().map(|n| (n, i))).collect();
    let needs: Vec<Vec<usize>> = jobs
        .iter()
        .map(|j| {
            let Value::Map(fields) = &j.value else { return Vec::new() };
            let Some(f) = fields.iter().find(|f| f.key == "needs") else { return Vec::new() };
            let texts: Vec<&str> = match &f.value.value {
                Value::Scalar(s) => vec![&s.text],
                Value::Seq(items) => items
                    .iter()
                    .filter_map(|i| match &i.value {
                        Value::Scalar(s) => Some(s.text.as_str()),
                        _ => None,
                    })
                    .collect(),
                Value::Map(_) => Vec::new(),
            };
            texts.iter().filter_map(|t| index.get(t).copied()).collect()
        })
        .collect();
    let n = jobs.len();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n).find(|&i| !placed[i] && needs[i].iter().all(|&d| placed[d] || d == i));
        // A cycle: the rest keep their order (the validator says why).
        let Some(i) = next else {
            order.extend((0..n).filter(|&i| !placed[i]));
            break;
        };
        placed[i] = true;
        order.push(i);
    }
    let mut old: Vec<Option<Node>> = std::mem::take(jobs).into_iter().map(Some).collect();
    jobs.extend(order.into_iter().filter_map(|i| old[i].take()));
}

/// Top-level keys of a Kiln workflow: a file with them is never taken for
/// another system's.
const KILN_MARKERS: &[&str] = &["version", "jobs"];

/// A single diagnostic when the file is another CI system's: GitLab CI
/// (top-level `stages:`, or jobs with `script:` at the top level) or
/// Woodpecker (`steps:`/`pipeline:` whose steps have `image:` and
/// `commands:`).
pub(crate) fn other_system(root: &Node) -> Option<Diagnostic> {
    let Value::Map(top) = &root.value else { return None };
    if KILN_MARKERS.iter().all(|k| top.iter().any(|e| e.key == *k)) {
        return None;
    }
    let has = |fields: &[Entry], key: &str| fields.iter().any(|f| f.key == key);
    let pointer = "Kiln reads its own format (`version: 1` and a `jobs:` list whose jobs have `steps:`); \
                   docs/migrating.md shows what each key becomes";
    // Woodpecker: steps (a map or list of maps) with `commands` or `image`.
    for e in top.iter().filter(|e| e.key == "steps" || e.key == "pipeline") {
        let steps: Vec<&[Entry]> = match &e.value.value {
            Value::Map(m) => m
                .iter()
                .filter_map(|s| match &s.value.value {
                    Value::Map(f) => Some(f.as_slice()),
                    _ => None,
                })
                .collect(),
            Value::Seq(items) => items
                .iter()
                .filter_map(|s| match &s.value {
                    Value::Map(f) => Some(f.as_slice()),
                    _ => None,
                })
                .collect(),
            Value::Scalar(_) => Vec::new(),
        };
        if steps.iter().any(|f| has(f, "commands") || (has(f, "image") && !has(f, "run"))) {
            return Some(Diagnostic::at(
                e.key_pos,
                format!(
                    "this looks like a Woodpecker file (top-level `{}:` with `image:` and `commands:`); {pointer}",
                    e.key
                ),
            ));
        }
    }
    // GitLab CI: `stages:`, or a top-level job with `script:`.
    if let Some(e) = top.iter().find(|e| e.key == "stages") {
        return Some(Diagnostic::at(
            e.key_pos,
            format!("this looks like a GitLab CI file (top-level `stages:`, jobs with `script:`); {pointer}"),
        ));
    }
    let job = top.iter().find(|e| matches!(&e.value.value, Value::Map(f) if has(f, "script")));
    job.map(|e| {
        Diagnostic::at(
            e.key_pos,
            format!(
                "this looks like a GitLab CI file (`{}` is a top-level job with `script:`); {pointer}",
                e.key.escape_debug()
            ),
        )
    })
}
