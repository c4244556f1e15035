//! What a `kiln exec` run is made of, decided before anything starts: the
//! jobs `--job` selects (and the workflow file reduced to them), the event,
//! how many local agents, the labels they carry, the secrets the jobs ask
//! for and where each comes from, and what cannot be local.

use kiln_cmd::{Failure, usage};
use kiln_workflow::Workflow;
use std::collections::{BTreeMap, BTreeSet};

/// The local agents at most when `--agents` is not given.
const MAX_DEFAULT_AGENTS: usize = 8;

/// The base name of a job: a matrix expansion's group (`test` of
/// `test (py=3.12)`), else its name.
fn base(j: &kiln_workflow::Job) -> &str {
    j.matrix.as_ref().map_or(j.name.as_str(), |m| m.group.as_str())
}

/// The jobs `--job` names and every job they need (transitively), as base
/// names; None without `--job`. An unknown name is a usage error listing
/// the jobs there are.
pub(super) fn select(wf: &Workflow, wanted: &[String]) -> Result<Option<BTreeSet<String>>, Failure> {
    if wanted.is_empty() {
        return Ok(None);
    }
    fn named<'w>(wf: &'w Workflow, n: &str) -> Vec<&'w kiln_workflow::Job> {
        wf.jobs.iter().filter(|j| j.name == n || base(j) == n).collect()
    }
    let mut keep: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<&kiln_workflow::Job> = vec![];
    for w in wanted {
        let found = named(wf, w);
        if found.is_empty() {
            let mut names: Vec<&str> = wf.jobs.iter().map(base).collect();
            names.dedup();
            return Err(usage(format!("--job {w}: the workflow has no job `{w}`; its jobs are: {}", names.join(", "))));
        }
        todo.extend(found);
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    while let Some(j) = todo.pop() {
        if !seen.insert(j.name.as_str()) {
            continue;
        }
        keep.insert(base(j).to_string());
        for n in &j.needs {
            todo.extend(named(wf, n));
        }
    }
    Ok(Some(keep))
}

/// The jobs of `wf` that run: all, or those of `keep`.
pub(super) fn running<'w>(wf: &'w Workflow, keep: Option<&BTreeSet<String>>) -> Vec<&'w kiln_workflow::Job> {
    wf.jobs.iter().filter(|j| keep.is_none_or(|k| k.contains(base(j)))).collect()
}

/// The most jobs that can run at once: the widest level of the graph
/// (a job's level is one more than its deepest need's), at least 1.
pub(super) fn widest_level(jobs: &[&kiln_workflow::Job]) -> usize {
    let by_name: BTreeMap<&str, &kiln_workflow::Job> = jobs.iter().map(|j| (j.name.as_str(), *j)).collect();
    let mut level: BTreeMap<&str, usize> = BTreeMap::new();
    fn depth<'a>(
        j: &'a kiln_workflow::Job,
        by_name: &BTreeMap<&str, &'a kiln_workflow::Job>,
        level: &mut BTreeMap<&'a str, usize>,
        guard: usize,
    ) -> usize {
        if let Some(d) = level.get(j.name.as_str()) {
            return *d;
        }
        let mut d = 0;
        if guard < 1000 {
            for n in &j.needs {
                if let Some(p) = by_name.get(n.as_str()) {
                    d = d.max(depth(p, by_name, level, guard + 1) + 1);
                }
            }
        }
        level.insert(j.name.as_str(), d);
        d
    }
    let mut width: BTreeMap<usize, usize> = BTreeMap::new();
    for j in jobs {
        *width.entry(depth(j, &by_name, &mut level, 0)).or_default() += 1;
    }
    width.values().copied().max().unwrap_or(1).clamp(1, MAX_DEFAULT_AGENTS)
}

/// The event the run is started as: `--event`, else `manual` when the
/// workflow may be started by hand, else the first trigger it declares.
pub(super) fn event(wf: &Workflow, given: Option<&str>) -> String {
    if let Some(e) = given {
        return e.to_string();
    }
    let on = &wf.on;
    if on.allows_manual() {
        "manual"
    } else if on.push.is_some() {
        "push"
    } else if on.pull_request.is_some() {
        "pull_request"
    } else if !on.schedule.is_empty() {
        "schedule"
    } else {
        "manual"
    }
    .to_string()
}

/// Labels of the local agents: this machine's `os` and `arch`, and every
/// label a running job asks for with `runs-on` (the local agents take
/// every job: there is no other machine to wait for).
pub(super) fn labels(jobs: &[&kiln_workflow::Job]) -> BTreeMap<String, String> {
    let mut l = kiln_cmd::default_labels();
    for j in jobs {
        for (k, v) in &j.runs_on {
            l.insert(k.clone(), v.clone());
        }
    }
    l
}

/// What `kiln exec` leaves out: every job deploying to an environment
/// (approvals, protection rules, deployment records and environment
/// secrets live on a server) and every job that needs one, transitively.
/// Returns the base names that still run (within `keep` when `--job` gave
/// one) and one line for each job left out. Nothing left to run is a usage
/// error.
pub(super) fn without_deployments(
    wf: &Workflow,
    keep: Option<BTreeSet<String>>,
) -> Result<(Option<BTreeSet<String>>, Vec<String>), Failure> {
    let chosen = running(wf, keep.as_ref());
    // Base name → why it is left out, in the order of the file.
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut order: Vec<String> = vec![];
    for j in &chosen {
        if let Some(e) = &j.environment
            && !out.contains_key(base(j))
        {
            out.insert(base(j).to_string(), format!("it deploys to environment `{}`", e.name));
            order.push(base(j).to_string());
        }
    }
    if out.is_empty() {
        return Ok((keep, vec![]));
    }
    // Whoever needs a job left out is left out too.
    loop {
        let mut more = vec![];
        for j in &chosen {
            if out.contains_key(base(j)) || more.iter().any(|(b, _): &(String, String)| b == base(j)) {
                continue;
            }
            let need = j.needs.iter().find_map(|n| {
                chosen.iter().find(|d| (d.name == *n || base(d) == n) && out.contains_key(base(d))).map(|d| base(d))
            });
            if let Some(n) = need {
                more.push((base(j).to_string(), format!("it needs `{n}`, which is left out")));
            }
        }
        if more.is_empty() {
            break;
        }
        for (b, why) in more {
            order.push(b.clone());
            out.insert(b, why);
        }
    }
    let left: BTreeSet<String> = chosen.iter().map(|j| base(j).to_string()).filter(|b| !out.contains_key(b)).collect();
    let lines: Vec<String> = order
        .iter()
        .map(|b| {
            format!(
                "  skipped: job `{b}`: {} (deployments and their approvals exist only on a server)",
                out[b.as_str()]
            )
        })
        .collect();
    if left.is_empty() {
        return Err(usage(format!(
            "nothing to run: every job deploys or needs a deployment, and kiln exec does not run deployments \
             (environment approvals, protection rules, deployment records and environment secrets exist only on a \
             server); push and let the server deploy\n{}",
            lines.join("\n")
        )));
    }
    Ok((Some(left), lines))
}

/// The secrets the running jobs ask for, each with its value: from
/// `--secret-file NAME=FILE`, else `KILN_SECRET_<NAME>`. A secret asked for
/// and given nowhere is a usage error naming both ways.
pub(super) fn secrets(
    jobs: &[&kiln_workflow::Job],
    files: &[String],
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, Failure> {
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    for f in files {
        let (name, path) = f
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| usage(format!("--secret-file `{f}` must be NAME=FILE")))?;
        let value = super::super::shared::read_secret(&format!("--secret-file {name}"), std::path::Path::new(path))?;
        given.insert(name.to_string(), value);
    }
    let mut missing: Vec<String> = vec![];
    let mut wanted: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for j in jobs {
        for s in &j.secrets {
            wanted.entry(s.as_str()).or_default().push(j.name.as_str());
        }
    }
    for (name, by) in &wanted {
        if given.contains_key(*name) {
            continue;
        }
        match env(&format!("KILN_SECRET_{name}")).filter(|v| !v.is_empty()) {
            Some(v) => {
                given.insert(name.to_string(), v);
            }
            None => missing.push(format!("{name} (job {})", by.join(", "))),
        }
    }
    if !missing.is_empty() {
        return Err(usage(format!(
            "the workflow asks for secret(s) {}; give each with --secret-file NAME=FILE or the variable \
             KILN_SECRET_NAME (kiln exec reads secrets from nowhere else)",
            missing.join(", ")
        )));
    }
    Ok(given)
}

/// The workflow text with only the jobs of `keep` (base names) left in its
/// top-level `jobs:` block, everything else as written. Works on block
/// style (`jobs:` then a list of `- name: …` items or a map keyed by job
/// name); the caller checks the result by parsing it again.
pub(super) fn reduce(text: &str, keep: &BTreeSet<String>) -> Result<String, String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let indent = |l: &str| l.len() - l.trim_start_matches(' ').len();
    let blank = |l: &str| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    };
    let start = lines
        .iter()
        .position(|l| l.starts_with("jobs:") && l["jobs:".len()..].trim().is_empty_or_comment())
        .ok_or("no top-level `jobs:` block in block style")?;
    let end = (start + 1..lines.len()).find(|&i| !blank(lines[i]) && indent(lines[i]) == 0).unwrap_or(lines.len());
    let body: Vec<usize> = (start + 1..end).filter(|&i| !blank(lines[i])).collect();
    let Some(&first) = body.first() else { return Err("the `jobs:` block is empty".into()) };
    let col = indent(lines[first]);
    let list = lines[first][col..].starts_with("- ") || lines[first][col..].trim_end() == "-";
    // Item starts: lines at the block's indentation (a list's `- `).
    let starts: Vec<usize> = body.iter().copied().filter(|&i| indent(lines[i]) == col).collect();
    let mut out: String = lines[..=start].concat();
    // Blank and comment lines before the first item stay.
    out.push_str(&lines[start + 1..first].concat());
    for (n, &s) in starts.iter().enumerate() {
        let e = starts.get(n + 1).copied().unwrap_or(end);
        let item = &lines[s..e];
        let name = if list { list_item_name(item, col) } else { map_item_name(item[0], col) };
        let name = name.ok_or_else(|| format!("cannot tell the name of the job at line {}", s + 1))?;
        if keep.contains(&name) {
            out.push_str(&item.concat());
        }
    }
    out.push_str(&lines[end..].concat());
    Ok(out)
}

/// The workflow text reduced to `keep` ([`reduce`]), checked by parsing
/// it again (its includes read with `load`): the server must run exactly
/// the selected jobs, or nothing runs.
pub(super) fn reduced(
    text: &str,
    keep: &BTreeSet<String>,
    jobs: &[&kiln_workflow::Job],
    path: &str,
    load: &mut kiln_workflow::Loader<'_>,
) -> Result<String, Failure> {
    let out = reduce(text, keep)
        .map_err(|e| usage(format!("--job: cannot leave the other jobs out of {path} ({e}); run without --job")))?;
    let names = |jobs: &[&kiln_workflow::Job]| -> Vec<String> {
        let mut n: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        n.sort_unstable();
        n
    };
    match kiln_workflow::parse_with(&out, load) {
        Ok(w) if names(&running(&w, None)) == names(jobs) => Ok(out),
        _ => Err(usage(format!(
            "--job: cannot leave the other jobs out of {path} (its jobs: block is not in plain block style, or they \
             come from an include); run without --job"
        ))),
    }
}

trait EmptyOrComment {
    fn is_empty_or_comment(&self) -> bool;
}

impl EmptyOrComment for str {
    fn is_empty_or_comment(&self) -> bool {
        self.is_empty() || self.starts_with('#')
    }
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    let s = s.split(" #").next().unwrap_or(s).trim();
    s.strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
        .unwrap_or(s)
        .to_string()
}

/// `  build:` → `build`.
fn map_item_name(line: &str, col: usize) -> Option<String> {
    let key = line[col..].trim_end().strip_suffix(':').or_else(|| line[col..].split_once(": ").map(|(k, _)| k))?;
    Some(unquote(key))
}

/// The `name:` of a list item (`- name: build`, or a later line at the
/// item's indentation).
fn list_item_name(item: &[&str], col: usize) -> Option<String> {
    let content = col + 2;
    for (i, l) in item.iter().enumerate() {
        let text = if i == 0 { l.get(content..)? } else { l };
        let at = if i == 0 { 0 } else { l.len() - l.trim_start_matches(' ').len() };
        if (i == 0 || at == content)
            && let Some(v) = text.trim_start().strip_prefix("name:")
        {
            return Some(unquote(v));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "version: 1\n# the jobs\njobs:\n  - name: build\n    steps:\n      - run: make\n\n  - name: test\n    needs: [build]\n    steps: [{run: make test}]\n  - name: \"lint\"\n    steps: [{run: lint}]\non: {manual: {}}\n";

    fn keep(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_list_keeps_the_selected_items_as_written() {
        let out = reduce(LIST, &keep(&["build", "test"])).unwrap();
        assert!(out.contains("  - name: build\n    steps:\n      - run: make\n\n  - name: test\n"), "{out}");
        assert!(!out.contains("lint"), "{out}");
        assert!(out.ends_with("on: {manual: {}}\n"), "{out}");
        let w = kiln_workflow::parse(&out).unwrap();
        assert_eq!(w.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), ["build", "test"]);
    }

    #[test]
    fn a_map_keeps_the_selected_keys() {
        let text = "version: 1\njobs:\n  build:\n    steps: [{run: make}]\n  'test':\n    needs: build\n    steps: [{run: t}]\n";
        let out = reduce(text, &keep(&["test", "build"])).unwrap();
        assert_eq!(out, text);
        let out = reduce(text, &keep(&["build"])).unwrap();
        assert_eq!(out, "version: 1\njobs:\n  build:\n    steps: [{run: make}]\n");
    }

    #[test]
    fn selection_takes_what_the_jobs_need() {
        let w = kiln_workflow::parse(LIST).unwrap();
        assert_eq!(select(&w, &["test".into()]).ok().flatten(), Some(keep(&["build", "test"])));
        assert_eq!(select(&w, &["lint".into()]).ok().flatten(), Some(keep(&["lint"])));
        let e = select(&w, &["nope".into()]).err().unwrap();
        assert!(e.message.contains("no job `nope`") && e.message.contains("build, test, lint"), "{}", e.message);
        assert_eq!(e.code, kiln_api::exit::USAGE);
    }

    #[test]
    fn the_widest_level_counts_jobs_that_can_run_at_once() {
        let w = kiln_workflow::parse(LIST).unwrap();
        assert_eq!(widest_level(&running(&w, None)), 2);
        let seq = kiln_workflow::parse(
            "version: 1\njobs:\n  - name: a\n    steps: [{run: a}]\n  - name: b\n    steps: [{run: b}]\n",
        )
        .unwrap();
        assert_eq!(widest_level(&running(&seq, None)), 1);
    }

    #[test]
    fn secrets_come_from_files_or_the_environment_only() {
        let w = kiln_workflow::parse(
            "version: 1\njobs:\n  - name: a\n    secrets: [TOKEN, OTHER]\n    steps: [{run: a}]\n",
        )
        .unwrap();
        let jobs = running(&w, None);
        let got = secrets(&jobs, &[], |k| (k == "KILN_SECRET_TOKEN").then(|| "t".to_string()));
        let e = got.err().unwrap();
        assert!(e.message.contains("OTHER (job a)") && !e.message.contains("TOKEN (job"), "{}", e.message);
        let got = secrets(&jobs, &[], |k| Some(format!("v-{k}"))).ok().expect("given");
        assert_eq!(got["OTHER"], "v-KILN_SECRET_OTHER");
    }
}
