//! `kiln bench reports`: the test-report parser on a generated 10 MB JUnit
//! file (and a 10 MB TAP stream) beside quick-xml's bare event loop over
//! the same bytes, and the static split's balance (issue 43's targets:
//! ≤ 200 ms for 10 MB; longest shard ≤ 1.10 × ideal with full history,
//! ≤ 1.5 × with 20 % new tests). Pure CPU: no server, no agent.

use kiln_api::exit;
use kiln_cmd::Failure;
use kiln_reports::split::{SplitMode, split};
use kiln_reports::{Limits, TestId, parse_junit, parse_tap};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

const SIZE: usize = 10 << 20;
const ROUNDS: usize = 7;
const PARSE_TARGET_MS: f64 = 200.0;

/// A JUnit file of about `size` bytes shaped like a large real suite:
/// suites of 50 cases, 5 % failing with a 1.5 KB stack trace and output,
/// 2 % skipped, 1 % flaky with a retry record, escapes and non-ASCII.
fn junit_doc(size: usize, rng: &mut StdRng) -> Vec<u8> {
    let trace: String =
        (0..20).map(|i| format!("\tat com.example.service.Handler.method{i}(Handler.java:{})\n", 100 + i)).collect();
    let mut d = String::with_capacity(size + 64 * 1024);
    d.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"bench\">\n");
    let mut suite = 0;
    while d.len() < size {
        d.push_str(&format!("  <testsuite name=\"com.example.Suite{suite}\" tests=\"50\" time=\"12.5\">\n"));
        for case in 0..50 {
            let time = rng.random_range(0.001..2.0);
            d.push_str(&format!(
                "    <testcase classname=\"com.example.Suite{suite}\" name=\"handles_case_{case}[α &amp; β]\" time=\"{time:.3}\""
            ));
            let roll: f64 = rng.random();
            if roll < 0.05 {
                d.push_str(&format!(
                    ">\n      <failure message=\"expected: &lt;{case}&gt; but was: &lt;0&gt;\" type=\"java.lang.AssertionError\">java.lang.AssertionError: expected: &lt;{case}&gt;\n{trace}</failure>\n      <system-out><![CDATA[request id={suite}-{case} → 500]]></system-out>\n    </testcase>\n"
                ));
            } else if roll < 0.07 {
                d.push_str(">\n      <skipped message=\"disabled on CI\"/>\n    </testcase>\n");
            } else if roll < 0.08 {
                d.push_str(&format!(
                    ">\n      <flakyFailure message=\"timeout\" type=\"java.net.SocketTimeoutException\"><stackTrace>{trace}</stackTrace></flakyFailure>\n    </testcase>\n"
                ));
            } else {
                d.push_str("/>\n");
            }
        }
        d.push_str("  </testsuite>\n");
        suite += 1;
    }
    d.push_str("</testsuites>\n");
    d.into_bytes()
}

fn tap_doc(size: usize) -> Vec<u8> {
    let mut d = String::with_capacity(size + 4096);
    d.push_str("TAP version 14\n");
    let mut n = 0u64;
    while d.len() < size {
        n += 1;
        if n.is_multiple_of(20) {
            d.push_str(&format!(
                "not ok {n} - handles case {n}\n  ---\n  message: 'expected 1, got 0'\n  duration_ms: 12.5\n  at: test/cases.js:{n}\n  ...\n"
            ));
        } else {
            d.push_str(&format!("ok {n} - handles case {n} of the checkout flow with a saved card\n"));
        }
    }
    d.push_str(&format!("1..{n}\n"));
    d.into_bytes()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time_ms(f: impl Fn()) -> f64 {
    // One warm-up, then the median of ROUNDS.
    f();
    median(
        (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    )
}

/// quick-xml's event loop alone over the same bytes: the floor any
/// quick-xml-based parser sits on.
fn raw_events(bytes: &[u8]) -> u64 {
    let mut r = quick_xml::Reader::from_reader(bytes);
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut n = 0u64;
    loop {
        buf.clear();
        match r.read_event_into(&mut buf) {
            Ok(quick_xml::events::Event::Eof) | Err(_) => break,
            Ok(_) => n += 1,
        }
    }
    n
}

fn lognormal_ms(rng: &mut StdRng) -> u64 {
    let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (2000f64.ln() + z).exp().round().max(1.0) as u64
}

/// Longest shard's actual time over the ideal, for 400 lognormal tests
/// into 8 shards, splitting with `new_pct` % of the durations unknown.
fn split_ratio(seed: u64, new_pct: usize, mode: SplitMode) -> f64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<TestId> = (0..400).map(|i| TestId(format!("suite :: test_{i:03}"))).collect();
    let truth: HashMap<TestId, u64> = ids.iter().map(|id| (id.clone(), lognormal_ms(&mut rng))).collect();
    let mut shuffled = ids.clone();
    shuffled.shuffle(&mut rng);
    let new: BTreeSet<&TestId> = shuffled[..400 * new_pct / 100].iter().collect();
    let known: HashMap<TestId, u64> =
        truth.iter().filter(|(k, _)| !new.contains(k)).map(|(k, v)| (k.clone(), *v)).collect();
    let s = split(&ids, &known, 8, mode);
    let loads: Vec<u64> = s.shards.iter().map(|sh| sh.iter().map(|t| truth[t]).sum()).collect();
    let ideal = loads.iter().sum::<u64>() as f64 / 8.0;
    *loads.iter().max().unwrap_or(&0) as f64 / ideal
}

/// A dynamic split: 8 shards each take the next batch of the queue when
/// they finish one (each batch costs `startup_ms` to start), over 400
/// lognormal tests whose recorded durations are off by up to ±20 %.
/// Returns the makespan over the ideal plus one batch's start-up.
fn dynamic_ratio(seed: u64, startup_ms: u64) -> f64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<String> = (0..400).map(|i| format!("suite :: test_{i:03}")).collect();
    let truth: HashMap<&String, u64> = ids.iter().map(|id| (id, lognormal_ms(&mut rng))).collect();
    let recorded: std::collections::BTreeMap<String, u64> =
        ids.iter().map(|id| (id.clone(), (truth[id] as f64 * rng.random_range(0.8..1.2)).round() as u64)).collect();
    let queue = kiln_reports::split::batches(&ids, &recorded, None);
    let mut free_at = [0u64; 8];
    for b in &queue {
        let shard = (0..8).min_by_key(|i| (free_at[*i], *i)).unwrap_or(0);
        free_at[shard] += startup_ms + b.iter().map(|t| truth[t]).sum::<u64>();
    }
    let work: u64 = truth.values().sum();
    let ideal = work as f64 / 8.0;
    *free_at.iter().max().unwrap_or(&0) as f64 / (ideal + startup_ms as f64)
}

pub fn run() -> Result<i32, Failure> {
    let mut rng = StdRng::seed_from_u64(43);
    let doc = junit_doc(SIZE, &mut rng);
    let limits = Limits::default();
    let report = parse_junit(&doc[..], &limits);
    if report.truncated {
        return Err(anyhow::anyhow!("the generated report was truncated: {:?}", report.annotations).into());
    }
    let mb = doc.len() as f64 / (1 << 20) as f64;
    let counts = report.counts();
    kiln_cmd::outln!("reports_junit_bytes: {}", doc.len());
    kiln_cmd::outln!(
        "reports_junit_tests: {} ({} failed, {} skipped, {} flaky on a runner retry)",
        report.tests.len(),
        counts.failed,
        counts.skipped,
        counts.runner_flaky
    );
    let parse = time_ms(|| {
        std::hint::black_box(parse_junit(&doc[..], &limits));
    });
    kiln_cmd::outln!("reports_junit_parse_ms: {parse:.1}");
    kiln_cmd::outln!("reports_junit_parse_mb_per_s: {:.0}", mb / (parse / 1000.0));
    let raw = time_ms(|| {
        std::hint::black_box(raw_events(&doc));
    });
    kiln_cmd::outln!("reports_baseline_quick_xml_events_ms: {raw:.1}");
    kiln_cmd::outln!("reports_baseline_quick_xml_events_mb_per_s: {:.0}", mb / (raw / 1000.0));
    kiln_cmd::outln!("reports_junit_parse_over_baseline: {:.2}", parse / raw);
    kiln_cmd::outln!("reports_junit_parse_target_ms: {PARSE_TARGET_MS:.0}");

    let tap = tap_doc(SIZE);
    let tap_report = parse_tap(&tap[..], "bench.tap", &limits);
    if tap_report.truncated {
        return Err(anyhow::anyhow!("the generated TAP stream was truncated: {:?}", tap_report.annotations).into());
    }
    let tap_ms = time_ms(|| {
        std::hint::black_box(parse_tap(&tap[..], "bench.tap", &limits));
    });
    kiln_cmd::outln!("reports_tap_tests: {}", tap_report.tests.len());
    kiln_cmd::outln!("reports_tap_parse_ms: {tap_ms:.1}");
    kiln_cmd::outln!("reports_tap_parse_mb_per_s: {:.0}", tap.len() as f64 / (1 << 20) as f64 / (tap_ms / 1000.0));

    // The split: the worst of 20 seeded suites, against a count split.
    let worst = |pct, mode| (0..20).map(|s| split_ratio(s, pct, mode)).fold(0.0, f64::max);
    let full = worst(0, SplitMode::Timings);
    let partial = worst(20, SplitMode::Timings);
    let count = worst(0, SplitMode::Count);
    kiln_cmd::outln!("reports_split_400x8_full_history_ratio: {full:.3} (target 1.10; worst of 20 seeds)");
    kiln_cmd::outln!("reports_split_400x8_20pct_new_ratio: {partial:.3} (target 1.50)");
    kiln_cmd::outln!("reports_split_400x8_count_mode_ratio: {count:.3} (baseline: no timings)");
    // The dynamic queue: the worst of 20 seeded suites, 50 ms per batch start-up.
    let dynamic = (0..20).map(|s| dynamic_ratio(s, 50)).fold(0.0, f64::max);
    let batches =
        kiln_reports::split::batches(&(0..400).map(|i| format!("t{i}")).collect::<Vec<_>>(), &Default::default(), None)
            .len();
    kiln_cmd::outln!(
        "reports_dynamic_400x8_makespan_over_ideal_plus_one_startup: {dynamic:.3} (target 1.05; worst of 20 seeds, \
         {batches} batches, 50 ms start-up each, recorded durations off by up to 20%)"
    );
    let met = parse <= PARSE_TARGET_MS && full <= 1.10 && partial <= 1.5 && dynamic <= 1.05;
    kiln_cmd::outln!("reports_targets_met: {}", if met { "yes" } else { "no" });
    Ok(exit::OK)
}
