//! Static test splitting: N shards from test ids and recorded durations.
//!
//! `Timings` mode is LPT (longest processing time first) greedy
//! bin-packing: tests sorted by weight, heaviest first, each put on the
//! currently lightest shard. A test without a recorded duration weighs the
//! median of the known ones (1 ms when none is known, which makes it a
//! count split); how many had none is returned, so the caller can log and
//! annotate it — never silent. `Count` mode deals the tests round-robin
//! in input order.
//!
//! Deterministic: the same ids and durations give the same shards
//! whatever the input order of equal-weight tests (ties are broken by id,
//! then by shard index). Duplicate ids are kept once (and counted).

use crate::model::TestId;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMode {
    Timings,
    Count,
}

/// The shards of one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// `shards[i]` is shard `i`'s tests (index from 0; the CLI's
    /// `--index` is the caller's to map), in the order they were assigned.
    pub shards: Vec<Vec<TestId>>,
    /// Each shard's estimated duration in ms (known durations plus the
    /// assumed weight of unknown ones); in `Count` mode, its test count.
    pub estimated_ms: Vec<u64>,
    /// Tests with no recorded duration (in `Count` mode: all of them were
    /// split without timings, so this is the number without a duration).
    pub without_timing: usize,
    /// The weight given to each of those (the median of the known ones).
    pub assumed_ms: u64,
    /// Ids given more than once (kept once).
    pub duplicates: usize,
}

impl Split {
    /// Longest shard's estimate over the ideal (total / shards); 1.0 is a
    /// perfect split.
    pub fn ratio(&self) -> f64 {
        let total: u64 = self.estimated_ms.iter().sum();
        if total == 0 || self.shards.is_empty() {
            return 1.0;
        }
        let ideal = total as f64 / self.shards.len() as f64;
        *self.estimated_ms.iter().max().unwrap_or(&0) as f64 / ideal
    }
}

/// Split `tests` into `total` shards (`total` ≥ 1; 0 is taken as 1).
/// `durations` are the recorded ones, in ms (this branch's, else the
/// default branch's: the caller picks).
pub fn split(tests: &[TestId], durations: &HashMap<TestId, u64>, total: usize, mode: SplitMode) -> Split {
    let total = total.max(1);
    let mut seen = BTreeSet::new();
    let mut unique = Vec::with_capacity(tests.len());
    for t in tests {
        if seen.insert(t) {
            unique.push(t);
        }
    }
    let duplicates = tests.len() - unique.len();
    let without_timing = unique.iter().filter(|t| !durations.contains_key(**t)).count();
    let mut shards = vec![Vec::new(); total];
    match mode {
        SplitMode::Count => {
            let mut estimated = vec![0u64; total];
            for (i, t) in unique.into_iter().enumerate() {
                shards[i % total].push(t.clone());
                estimated[i % total] += 1;
            }
            Split { shards, estimated_ms: estimated, without_timing, assumed_ms: 0, duplicates }
        }
        SplitMode::Timings => {
            let mut known: Vec<u64> = unique.iter().filter_map(|t| durations.get(*t).copied()).collect();
            known.sort_unstable();
            let assumed = if known.is_empty() {
                1
            } else if known.len() % 2 == 1 {
                known[known.len() / 2]
            } else {
                let (a, b) = (known[known.len() / 2 - 1], known[known.len() / 2]);
                a / 2 + b / 2 + (a % 2 + b % 2) / 2
            };
            // At least 1 ms each: tests recorded at 0 ms (faster than the
            // report's resolution) would add nothing to a shard's load, and
            // every one of them would go to the first shard.
            let mut weighted: Vec<(u64, &TestId)> =
                unique.into_iter().map(|t| (durations.get(t).copied().unwrap_or(assumed).max(1), t)).collect();
            weighted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
            // Min-heap of (load, shard index).
            let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..total).map(|i| Reverse((0, i))).collect();
            let mut estimated = vec![0u64; total];
            for (w, t) in weighted {
                let Reverse((load, i)) = heap.pop().expect("total >= 1");
                shards[i].push(t.clone());
                let load = load.saturating_add(w);
                estimated[i] = load;
                heap.push(Reverse((load, i)));
            }
            Split { shards, estimated_ms: estimated, without_timing, assumed_ms: assumed, duplicates }
        }
    }
}

/// Each dynamic batch holds about this share of the suite's time not yet
/// batched (guided self-scheduling).
const GUIDED_SHARE: u64 = 24;

/// Batches of a suite for a dynamic queue (`kiln tests next`): heaviest
/// tests first (recorded durations in ms; an unknown test weighs the
/// median), each batch about a 24th of the time not yet batched (at least
/// a 400th of the suite's, and one test), or `batch_size` tests each. Shards that take the next batch when
/// they finish one end within about one batch of each other. Duplicates are
/// kept once; deterministic.
pub fn batches(
    tests: &[String],
    durations: &std::collections::BTreeMap<String, u64>,
    batch_size: Option<u32>,
) -> Vec<Vec<String>> {
    let mut seen = BTreeSet::new();
    let unique: Vec<&String> = tests.iter().filter(|t| seen.insert(t.as_str())).collect();
    let mut known: Vec<u64> = unique.iter().filter_map(|t| durations.get(t.as_str()).copied()).collect();
    known.sort_unstable();
    let median = known.get(known.len() / 2).copied().unwrap_or(1).max(1);
    let mut weighted: Vec<(u64, &String)> =
        unique.iter().map(|t| (durations.get(t.as_str()).copied().unwrap_or(median).max(1), *t)).collect();
    weighted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    if let Some(n) = batch_size.filter(|n| *n > 0) {
        return weighted.chunks(n as usize).map(|c| c.iter().map(|(_, t)| (*t).clone()).collect()).collect();
    }
    // Guided: each batch a share of what is left, so the last ones are
    // small and the shards end close together (at least 1/400 of the
    // suite's time, so there are not too many).
    let total: u64 = weighted.iter().map(|(w, _)| w).sum();
    let floor = (total / 400).max(1);
    let mut remaining = total;
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut weight = 0u64;
    let mut target = (remaining / GUIDED_SHARE).max(floor);
    for (w, t) in weighted {
        if !current.is_empty() && weight + w > target {
            out.push(std::mem::take(&mut current));
            remaining -= weight;
            weight = 0;
            target = (remaining / GUIDED_SHARE).max(floor);
        }
        current.push(t.clone());
        weight += w;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The recorded duration of each runner id in `inputs`, from durations
/// keyed by report ids (`suite :: class :: name`). A runner lists its tests
/// in its own form, so an input that is not a report id is matched by:
/// a pytest node id (`tests/test_app.py::TestA::test_b[1]` → class
/// `tests.test_app.TestA`, name `test_b[1]`), a cargo-nextest list line
/// (`binary-id tests::name`), then the report ids' last two parts, then
/// their last part when only one report id ends that way. Returns the
/// durations keyed by the inputs as given (unmatched ones left out).
pub fn match_durations(
    inputs: &[String],
    durations: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    use std::collections::BTreeMap;
    let parts = |k: &str| k.split(TestId::SEPARATOR).map(str::to_string).collect::<Vec<_>>();
    let mut by_tail2: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut by_tail1: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for (k, ms) in durations {
        let p = parts(k);
        let add = |map: &mut BTreeMap<String, Option<u64>>, key: String| {
            map.entry(key).and_modify(|v| *v = None).or_insert(Some(*ms));
        };
        if p.len() >= 2 {
            add(&mut by_tail2, p[p.len() - 2..].join(TestId::SEPARATOR));
        }
        if let Some(last) = p.last() {
            add(&mut by_tail1, last.clone());
        }
    }
    let mut out = BTreeMap::new();
    for input in inputs {
        if let Some(ms) = durations.get(input) {
            out.insert(input.clone(), *ms);
            continue;
        }
        let mut tails: Vec<(String, String)> = Vec::new();
        // pytest: path/to/test_mod.py::Class::test[param]
        if let Some((path, rest)) = input.split_once("::")
            && path.ends_with(".py")
        {
            let module = path.trim_end_matches(".py").replace('/', ".");
            let mut segs: Vec<&str> = rest.split("::").collect();
            let name = segs.pop().unwrap_or_default().to_string();
            let class = if segs.is_empty() { module } else { format!("{module}.{}", segs.join(".")) };
            tails.push((class, name));
        }
        // cargo-nextest list: `binary-id test::path`
        if let Some((bin, name)) = input.split_once(' ')
            && !name.contains(' ')
        {
            tails.push((bin.to_string(), name.to_string()));
        }
        let found = tails
            .iter()
            .find_map(|(c, n)| by_tail2.get(&format!("{c}{}{n}", TestId::SEPARATOR)).copied().flatten())
            .or_else(|| tails.iter().find_map(|(_, n)| by_tail1.get(n).copied().flatten()))
            .or_else(|| by_tail1.get(input.as_str()).copied().flatten());
        if let Some(ms) = found {
            out.insert(input.clone(), ms);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<TestId> {
        (0..n).map(|i| TestId(format!("t{i:03}"))).collect()
    }

    #[test]
    fn every_test_once_and_deterministic() {
        let tests = ids(37);
        let d: HashMap<TestId, u64> =
            tests.iter().enumerate().map(|(i, t)| (t.clone(), (i as u64 * 7) % 13 + 1)).collect();
        let a = split(&tests, &d, 4, SplitMode::Timings);
        let mut rev = tests.clone();
        rev.reverse();
        let b = split(&rev, &d, 4, SplitMode::Timings);
        assert_eq!(a, b, "input order does not matter");
        let mut all: Vec<_> = a.shards.concat();
        all.sort();
        assert_eq!(all, tests);
        assert_eq!(a.without_timing, 0);
    }

    #[test]
    fn unknown_tests_weigh_the_median_and_are_counted() {
        let tests = ids(5);
        let d: HashMap<TestId, u64> = [(tests[0].clone(), 10), (tests[1].clone(), 30), (tests[2].clone(), 20)].into();
        let s = split(&tests, &d, 2, SplitMode::Timings);
        assert_eq!((s.without_timing, s.assumed_ms), (2, 20));
        assert_eq!(s.estimated_ms.iter().sum::<u64>(), 100);
        // None known: a count split, all counted.
        let s = split(&tests, &HashMap::new(), 2, SplitMode::Timings);
        assert_eq!((s.without_timing, s.assumed_ms), (5, 1));
        assert_eq!(s.shards.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 2]);
    }

    #[test]
    fn count_mode_and_duplicates() {
        let mut tests = ids(5);
        tests.push(tests[0].clone());
        let s = split(&tests, &HashMap::new(), 2, SplitMode::Count);
        assert_eq!(s.duplicates, 1);
        assert_eq!(s.shards[0], vec![TestId::from("t000"), "t002".into(), "t004".into()]);
        assert_eq!(s.estimated_ms, vec![3, 2]);
        let s = split(&tests, &HashMap::new(), 0, SplitMode::Count);
        assert_eq!(s.shards.len(), 1);
    }

    #[test]
    fn dynamic_batches_go_heaviest_first_and_shrink_towards_the_end() {
        let ids: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
        let mut d: std::collections::BTreeMap<String, u64> =
            ids.iter().enumerate().map(|(i, t)| (t.clone(), 10 + i as u64)).collect();
        d.remove("t050");
        let mut with_dupes = ids.clone();
        with_dupes.push("t001".into());
        let b = batches(&with_dupes, &d, None);
        let flat: Vec<&String> = b.iter().flatten().collect();
        assert_eq!(flat.len(), 100, "every test once");
        assert_eq!(flat[0], "t099", "the heaviest first");
        let weight = |v: &Vec<String>| v.iter().map(|t| d.get(t).copied().unwrap_or(60)).sum::<u64>();
        assert!(weight(&b[0]) >= weight(b.last().unwrap()), "{b:?}");
        assert!(b.len() > 10, "{}", b.len());
        let fixed = batches(&ids, &d, Some(7));
        assert_eq!(fixed.iter().map(Vec::len).collect::<Vec<_>>()[..3], [7, 7, 7]);
        assert_eq!(fixed.len(), 15);
        assert_eq!(batches(&ids, &d, None), b, "deterministic");
    }

    #[test]
    fn runner_ids_find_the_report_ids_durations() {
        let d: std::collections::BTreeMap<String, u64> = [
            ("pytest :: tests.test_app :: test_login", 700),
            ("pytest :: tests.test_app.TestCart :: test_total[2]", 300),
            ("sample :: tests::flaky", 50),
            ("gen :: suite :: alpha", 9),
            ("other :: suite :: alpha", 10),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        let inputs: Vec<String> = [
            "tests/test_app.py::test_login",
            "tests/test_app.py::TestCart::test_total[2]",
            "sample tests::flaky",
            "pytest :: tests.test_app :: test_login",
            "alpha",
            "tests/test_app.py::test_new",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = match_durations(&inputs, &d);
        assert_eq!(m.get("tests/test_app.py::test_login"), Some(&700));
        assert_eq!(m.get("tests/test_app.py::TestCart::test_total[2]"), Some(&300));
        assert_eq!(m.get("sample tests::flaky"), Some(&50));
        assert_eq!(m.get("pytest :: tests.test_app :: test_login"), Some(&700));
        assert_eq!(m.get("alpha"), None, "two report ids end that way: ambiguous");
        assert_eq!(m.get("tests/test_app.py::test_new"), None, "a new test");
    }

    /// Tests recorded at 0 ms (pytest's fast tests) are still dealt out:
    /// with a weight of 0 every one of them went to shard 0 and shard 1 got
    /// none, so its runner ran the whole suite (seen in e2e_test_reports).
    #[test]
    fn tests_recorded_at_zero_ms_are_spread_over_the_shards() {
        let ids: Vec<TestId> = (0..6).map(|i| TestId(format!("t{i}"))).collect();
        let durations: HashMap<TestId, u64> = ids.iter().map(|t| (t.clone(), 0)).collect();
        let s = split(&ids, &durations, 2, SplitMode::Timings);
        assert_eq!((s.shards[0].len(), s.shards[1].len()), (3, 3), "{:?}", s.shards);
    }
}
