//! `include:` and `extends:`: several YAML files → one tree, before validation.
//!
//! The run is frozen at acceptance (spec 000 §5): included files are read at
//! the run's commit, and what is validated, hashed and stored is the composed
//! workflow, so a later change to an included file never alters an accepted
//! run. Composition works on the span-carrying tree, so every diagnostic —
//! also one found by the validator in a job inherited from a template —
//! points at the file and line the text came from.
//!
//! Rules (documented in `docs/workflow.md`):
//!
//! * `include:` (top level of the workflow or of an included file) is a
//!   repository-relative path or a list of them. An included file may hold
//!   only `include`, `templates` and `jobs`. Its jobs come before the jobs of
//!   the file that includes it, in include order (depth first). At most
//!   [`MAX_INCLUDE_DEPTH`] levels and [`MAX_INCLUDED_FILES`] files; a file is
//!   included once (which also rules out cycles).
//! * `templates:` maps a name to a partial job. A job (or template) with
//!   `extends: name` (or a list, merged left to right) starts from the
//!   template and overrides it: maps (e.g. `env`, `image`, `cache`) merge key
//!   by key, recursively; any other value (`steps`, `needs`, lists, scalars)
//!   replaces the template's. At most [`MAX_EXTENDS_DEPTH`] levels; cycles
//!   are refused.

use crate::diag::Diagnostic;
use crate::model::MAX_FILE_BYTES;
use crate::tree::{Entry, Node, Pos, ScalarKind, Value, load};
use std::collections::{BTreeMap, HashMap};

/// Deepest chain of files including files (the workflow file is level 0).
pub const MAX_INCLUDE_DEPTH: usize = 4;
/// Most files one workflow may include, all levels together.
pub const MAX_INCLUDED_FILES: usize = 16;
/// Longest chain of templates extending templates.
pub const MAX_EXTENDS_DEPTH: usize = 10;

/// Keys an included file may hold.
const INCLUDED_KEYS: &[&str] = &["include", "templates", "jobs"];

/// Reads a repository-relative path at the run's commit (or from the working
/// tree for `kiln validate`): the text, or why not.
pub type Loader<'a> = dyn FnMut(&str) -> Result<String, String> + 'a;

pub(crate) struct Composed {
    pub root: Node,
    /// The included files by index (`files[0]` is the workflow file, "").
    pub files: Vec<String>,
    /// `jobs:` was written as a map keyed by job (GitHub Actions' form).
    pub jobs_map: bool,
}

struct Composer<'l, 'a> {
    load: &'l mut Loader<'a>,
    files: Vec<String>,
    /// Where each included path was first included.
    seen: HashMap<String, Pos>,
    templates: BTreeMap<String, (Pos, Vec<Entry>)>,
    /// Templates with their own `extends` resolved (memoised, so a wide
    /// diamond of templates costs linear work), with the length of their
    /// longest chain (the template itself included): a memoised template
    /// reused deeper down must still count its whole chain.
    expanded: HashMap<String, (Vec<Entry>, usize)>,
    diags: Vec<Diagnostic>,
}

/// Resolve `include` and `extends` in the workflow tree `root`. Problems are
/// appended to `diags`; the returned tree is what the validator reads.
pub(crate) fn compose(root: Node, load: &mut Loader<'_>, diags: &mut Vec<Diagnostic>) -> Composed {
    let mut c = Composer {
        load,
        files: vec![String::new()],
        seen: HashMap::new(),
        templates: BTreeMap::new(),
        expanded: HashMap::new(),
        diags: Vec::new(),
    };
    let (root, jobs_map) = c.root(root);
    diags.append(&mut c.diags);
    Composed { root, files: c.files, jobs_map }
}

impl Composer<'_, '_> {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.push(Diagnostic::at(pos, message));
    }

    fn root(&mut self, mut root: Node) -> (Node, bool) {
        let Value::Map(entries) = &mut root.value else { return (root, false) };
        // GitHub Actions' `jobs:` map becomes the list before anything else
        // reads it (includes add to it, `extends` applies to its jobs).
        let aliases = crate::foreign::jobs_map_to_list(entries);
        let mut included_jobs = Vec::new();
        if let Some(inc) = take(entries, "include") {
            self.includes(&inc.value, 1, &mut included_jobs);
        }
        if let Some(t) = take(entries, "templates") {
            self.add_templates(t.value);
        }
        if !included_jobs.is_empty() {
            match entries.iter_mut().find(|e| e.key == "jobs") {
                Some(Entry { value: Node { value: Value::Seq(own), .. }, .. }) => {
                    included_jobs.append(own);
                    *own = included_jobs;
                }
                // A `jobs` that is not a list is reported by the validator.
                Some(_) => {}
                None => {
                    let pos = Pos { file: 0, line: 1, column: 1 };
                    entries.push(Entry {
                        key: "jobs".into(),
                        key_pos: pos,
                        value: Node { pos, value: Value::Seq(included_jobs) },
                    });
                }
            }
        }
        if let Some(Entry { value: Node { value: Value::Seq(jobs), .. }, .. }) =
            entries.iter_mut().find(|e| e.key == "jobs")
        {
            for job in jobs.iter_mut() {
                if let Value::Map(fields) = &mut job.value {
                    let own = std::mem::take(fields);
                    *fields = self.extend(own, &mut Vec::new()).0;
                }
            }
            if let Some(aliases) = &aliases {
                crate::foreign::resolve_keys(jobs, aliases, &mut self.diags);
                crate::foreign::order_by_needs(jobs);
            }
        }
        (root, aliases.is_some())
    }

    /// Read the files named by an `include` value (at `depth`), appending
    /// their jobs (and their includes' jobs before them) to `jobs`.
    fn includes(&mut self, value: &Node, depth: usize, jobs: &mut Vec<Node>) {
        let paths: Vec<(String, Pos)> = match &value.value {
            Value::Scalar(s) if s.kind() == ScalarKind::Str => vec![(s.text.clone(), value.pos)],
            Value::Seq(items) if !items.is_empty() => {
                let mut out = Vec::new();
                for item in items {
                    match &item.value {
                        Value::Scalar(s) if s.kind() == ScalarKind::Str => out.push((s.text.clone(), item.pos)),
                        _ => self.err(item.pos, format!("an `include` entry is a path; found {}", item.describe())),
                    }
                }
                out
            }
            _ => {
                self.err(
                    value.pos,
                    format!(
                        "`include` takes a repository-relative path or a list of them, e.g. `include: [.kiln/templates/rust.yaml]`; found {}",
                        value.describe()
                    ),
                );
                return;
            }
        };
        for (path, pos) in paths {
            if let Err(m) = check_path(&path) {
                self.err(pos, format!("cannot include `{path}`: {m}"));
                continue;
            }
            if let Some(first) = self.seen.get(&path) {
                let at = self.where_is(*first);
                self.err(pos, format!("`{path}` is already included (at {at}); a file is included once, and includes may not form a cycle"));
                continue;
            }
            if depth > MAX_INCLUDE_DEPTH {
                self.err(
                    pos,
                    format!("cannot include `{path}`: includes nest at most {MAX_INCLUDE_DEPTH} levels deep"),
                );
                continue;
            }
            if self.files.len() > MAX_INCLUDED_FILES {
                self.err(
                    pos,
                    format!("cannot include `{path}`: a workflow includes at most {MAX_INCLUDED_FILES} files"),
                );
                continue;
            }
            self.seen.insert(path.clone(), pos);
            let text = match (self.load)(&path) {
                Ok(t) => t,
                Err(e) => {
                    self.err(pos, format!("cannot include `{path}`: {e}"));
                    continue;
                }
            };
            if text.len() > MAX_FILE_BYTES {
                self.err(
                    pos,
                    format!(
                        "cannot include `{path}`: it is {} bytes; at most {MAX_FILE_BYTES} are allowed",
                        text.len()
                    ),
                );
                continue;
            }
            let index = u16::try_from(self.files.len()).expect("bounded by MAX_INCLUDED_FILES");
            self.files.push(path.clone());
            let mut loaded = load(&text);
            for d in &mut loaded.diags {
                d.src = index;
            }
            self.diags.append(&mut loaded.diags);
            if loaded.fatal {
                continue;
            }
            let Some(mut root) = loaded.root else {
                self.err(pos, format!("`{path}` is empty; an included file holds `templates` and/or `jobs`"));
                continue;
            };
            root.stamp(index);
            self.included(root, &path, depth, jobs);
        }
    }

    fn included(&mut self, root: Node, path: &str, depth: usize, jobs: &mut Vec<Node>) {
        let Value::Map(mut entries) = root.value else {
            self.err(
                root.pos,
                format!("`{path}` must be a map of `templates` and/or `jobs`; found {}", root.describe()),
            );
            return;
        };
        for e in &entries {
            if !INCLUDED_KEYS.contains(&e.key.as_str()) {
                self.err(
                    e.key_pos,
                    format!(
                        "`{}` cannot be set in an included file: it holds only `include`, `templates` and `jobs` (top-level settings belong in the workflow file)",
                        e.key
                    ),
                );
            }
        }
        if let Some(inc) = take(&mut entries, "include") {
            self.includes(&inc.value, depth + 1, jobs);
        }
        if let Some(t) = take(&mut entries, "templates") {
            self.add_templates(t.value);
        }
        if let Some(j) = take(&mut entries, "jobs") {
            match j.value.value {
                Value::Seq(items) => jobs.extend(items),
                _ => self.err(j.value.pos, format!("`jobs` must be a list of jobs; found {}", j.value.describe())),
            }
        }
    }

    fn add_templates(&mut self, node: Node) {
        let Value::Map(entries) = node.value else {
            self.err(
                node.pos,
                format!("`templates` maps a template's name to a partial job, e.g. `templates: {{rust: {{image: …}}}}`; found {}", node.describe()),
            );
            return;
        };
        for e in entries {
            if let Some((first, _)) = self.templates.get(&e.key) {
                let at = self.where_is(*first);
                self.err(e.key_pos, format!("template `{}` is already defined at {at}", e.key));
                continue;
            }
            if e.key.is_empty() || e.key.chars().count() > crate::validate::MAX_NAME_CHARS {
                self.err(e.key_pos, "a template's name is 1 to 100 characters");
                continue;
            }
            match e.value.value {
                Value::Map(fields) => {
                    self.templates.insert(e.key, (e.key_pos, fields));
                }
                _ => self.err(
                    e.value.pos,
                    format!("template `{}` must be a map of job keys; found {}", e.key, e.value.describe()),
                ),
            }
        }
    }

    /// A job's (or template's) fields with its `extends` resolved, and the
    /// length of the longest chain of templates below it. `chain` holds the
    /// templates being expanded, to report cycles and chains too deep.
    fn extend(&mut self, mut fields: Vec<Entry>, chain: &mut Vec<String>) -> (Vec<Entry>, usize) {
        let Some(ext) = take(&mut fields, "extends") else { return (fields, 0) };
        let names: Vec<(String, Pos)> = match &ext.value.value {
            Value::Scalar(s) if s.kind() == ScalarKind::Str => vec![(s.text.clone(), ext.value.pos)],
            Value::Seq(items) if !items.is_empty() => items
                .iter()
                .filter_map(|i| match &i.value {
                    Value::Scalar(s) if s.kind() == ScalarKind::Str => Some((s.text.clone(), i.pos)),
                    _ => {
                        self.err(i.pos, format!("an `extends` entry is a template's name; found {}", i.describe()));
                        None
                    }
                })
                .collect(),
            _ => {
                self.err(
                    ext.value.pos,
                    format!("`extends` takes a template's name or a list of them; found {}", ext.value.describe()),
                );
                return (fields, 0);
            }
        };
        let mut base: Vec<Entry> = Vec::new();
        let mut below = 0;
        for (name, pos) in names {
            if let Some(i) = chain.iter().position(|n| *n == name) {
                let mut cycle = chain[i..].to_vec();
                cycle.push(name.clone());
                self.err(pos, format!("`extends` forms a cycle: {}", cycle.join(" → ")));
                continue;
            }
            if chain.len() >= MAX_EXTENDS_DEPTH {
                self.err(pos, format!("`extends` chains at most {MAX_EXTENDS_DEPTH} templates deep"));
                continue;
            }
            let Some((template, height)) = self.template(&name, chain) else {
                let known: Vec<&str> = self.templates.keys().map(String::as_str).collect();
                let hint = closest(&name, &known).map(|k| format!("did you mean `{k}`? ")).unwrap_or_default();
                let listing = if known.is_empty() {
                    "none is defined; define it under top-level `templates:`".to_string()
                } else {
                    format!("defined: {}", known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "))
                };
                self.err(pos, format!("unknown template `{name}`; {hint}({listing})"));
                continue;
            };
            // A template expanded earlier (memoised) was checked against its
            // own chain only; here it hangs below `chain`.
            if chain.len() + height > MAX_EXTENDS_DEPTH {
                self.err(pos, format!("`extends` chains at most {MAX_EXTENDS_DEPTH} templates deep"));
                continue;
            }
            below = below.max(height);
            base = merge(base, template);
        }
        (merge(base, fields), below)
    }

    /// Template `name` with its own `extends` resolved, and the length of
    /// its longest chain, itself included (`None`: unknown).
    fn template(&mut self, name: &str, chain: &mut Vec<String>) -> Option<(Vec<Entry>, usize)> {
        if let Some(done) = self.expanded.get(name) {
            return Some(done.clone());
        }
        let (_, fields) = self.templates.get(name)?.clone();
        chain.push(name.to_string());
        let (fields, below) = self.extend(fields, chain);
        chain.pop();
        let done = (fields, below + 1);
        self.expanded.insert(name.to_string(), done.clone());
        Some(done)
    }

    /// `file:line:col` of a position, for "already … at".
    fn where_is(&self, pos: Pos) -> String {
        match self.files.get(usize::from(pos.file)).filter(|f| !f.is_empty()) {
            Some(f) => format!("{f}:{}:{}", pos.line, pos.column),
            None => format!("{}:{} of the workflow file", pos.line, pos.column),
        }
    }
}

/// Remove and return the entry `key`.
fn take(entries: &mut Vec<Entry>, key: &str) -> Option<Entry> {
    let i = entries.iter().position(|e| e.key == key)?;
    Some(entries.remove(i))
}

/// `over` on top of `base`: maps merge key by key, anything else replaces.
fn merge(mut base: Vec<Entry>, over: Vec<Entry>) -> Vec<Entry> {
    for e in over {
        match base.iter_mut().find(|b| b.key == e.key) {
            Some(b) => {
                let both_maps = matches!((&b.value.value, &e.value.value), (Value::Map(_), Value::Map(_)));
                if both_maps {
                    let Value::Map(inner) = std::mem::replace(&mut b.value.value, Value::Seq(Vec::new())) else {
                        unreachable!("checked")
                    };
                    let Value::Map(over_inner) = e.value.value else { unreachable!("checked") };
                    b.value.value = Value::Map(merge(inner, over_inner));
                    b.value.pos = e.value.pos;
                } else {
                    b.value = e.value;
                }
                b.key_pos = e.key_pos;
            }
            None => base.push(e),
        }
    }
    base
}

/// Include paths are repository-relative, normalised, and name a YAML file
/// that is not itself a workflow (files directly in `.kiln/` are run).
fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.starts_with('/') {
        return Err("paths are relative to the repository's root; remove the leading `/`".into());
    }
    if path.contains('\\') || path.contains('\0') {
        return Err("use `/` to separate directories".into());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err("write the path without `..`, `.` or empty parts (relative to the repository's root)".into());
    }
    if !(path.ends_with(".yaml") || path.ends_with(".yml")) {
        return Err("an included file is YAML: its name ends in `.yaml` or `.yml`".into());
    }
    if parts.len() == 2 && parts[0] == ".kiln" {
        return Err(
            "files directly in `.kiln/` are workflows of their own; keep included files in a subdirectory such as `.kiln/templates/`"
                .into(),
        );
    }
    Ok(())
}

/// The known name within two edits of `name`, if any.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (crate::validate::edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Index → file name, for diagnostics.
pub(crate) fn name_files(diags: &mut [Diagnostic], files: &[String]) {
    for d in diags {
        d.file = files.get(usize::from(d.src)).filter(|f| !f.is_empty()).cloned();
    }
}
