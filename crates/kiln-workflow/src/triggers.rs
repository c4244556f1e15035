//! What `on:` decides: whether an event (push, pull request, a hand-started
//! run) starts a workflow, and when its schedules tick. Pure: the caller
//! hands in the ref, the changed files and the clock.

use crate::glob::list_matches;
use crate::model::{PullRequestTrigger, PushTrigger, Schedule, Triggers};
use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

impl Triggers {
    /// True when `on:` was not written (the workflow keeps today's behaviour:
    /// it runs only when started by hand).
    pub fn is_unset(&self) -> bool {
        !self.declared
    }

    /// Whether a hand-started (manual/API) run is allowed: true when `on:` is
    /// not declared or declares `manual`.
    pub fn allows_manual(&self) -> bool {
        !self.declared || self.manual
    }

    /// `git_ref` is a full ref: `"refs/heads/<branch>"` or `"refs/tags/<tag>"`.
    /// `changed` is the list of changed file paths (repo-relative,
    /// '/'-separated), or None when unknown (e.g. a new branch): then path
    /// filters pass.
    pub fn matches_push(&self, git_ref: &str, changed: Option<&[String]>) -> bool {
        match &self.push {
            Some(p) if self.declared => p.matches(git_ref, changed),
            _ => false,
        }
    }

    /// `base_branch` is the pull request's target branch name (no
    /// refs/heads/ prefix).
    pub fn matches_pull_request(&self, base_branch: &str, changed: Option<&[String]>) -> bool {
        match &self.pull_request {
            Some(p) if self.declared => p.matches(base_branch, changed),
            _ => false,
        }
    }
}

/// `list` (a positive filter) when given must match; `ignore` when given
/// must not. The two are never both given (refused at parse time).
fn name_passes(list: &[String], ignore: &[String], name: &str) -> bool {
    (list.is_empty() || list_matches(list, name)) && (ignore.is_empty() || !list_matches(ignore, name))
}

/// `paths`: at least one changed file must be included. `paths-ignore`:
/// skip only when every changed file is ignored (so no changed files at all
/// runs). Unknown changes (`None`) pass.
fn paths_pass(paths: &[String], ignore: &[String], changed: Option<&[String]>) -> bool {
    let Some(files) = changed else { return true };
    if !paths.is_empty() {
        return files.iter().any(|f| list_matches(paths, f));
    }
    if !ignore.is_empty() {
        return files.is_empty() || !files.iter().all(|f| list_matches(ignore, f));
    }
    true
}

impl PushTrigger {
    fn has_branch_filter(&self) -> bool {
        !self.branches.is_empty() || !self.branches_ignore.is_empty()
    }

    fn has_tag_filter(&self) -> bool {
        !self.tags.is_empty() || !self.tags_ignore.is_empty()
    }

    fn matches(&self, git_ref: &str, changed: Option<&[String]>) -> bool {
        if let Some(branch) = git_ref.strip_prefix("refs/heads/") {
            if branch.is_empty() || (self.has_tag_filter() && !self.has_branch_filter()) {
                return false;
            }
            name_passes(&self.branches, &self.branches_ignore, branch)
                && paths_pass(&self.paths, &self.paths_ignore, changed)
        } else if let Some(tag) = git_ref.strip_prefix("refs/tags/") {
            if tag.is_empty() || (self.has_branch_filter() && !self.has_tag_filter()) {
                return false;
            }
            // Path filters are not evaluated for tag pushes.
            name_passes(&self.tags, &self.tags_ignore, tag)
        } else {
            false
        }
    }
}

impl PullRequestTrigger {
    fn matches(&self, base_branch: &str, changed: Option<&[String]>) -> bool {
        !base_branch.is_empty()
            && name_passes(&self.branches, &self.branches_ignore, base_branch)
            && paths_pass(&self.paths, &self.paths_ignore, changed)
    }
}

/// How far back [`Schedule::due_tick`] looks: a tick older than this is not
/// run on recovery (only the latest missed tick ever runs anyway).
pub const MAX_CATCH_UP_MS: i64 = 400 * 24 * 60 * 60 * 1000;

/// The parser used for `cron:`: exactly five fields, no seconds, no year.
pub(crate) fn parse_cron(cron: &str) -> Result<Cron, String> {
    let text = cron.trim();
    if text.starts_with('@') {
        return Err(format!(
            "`{}` is not supported; write five fields (minute hour day-of-month month day-of-week), e.g. `0 0 * * *` for daily",
            text.split_whitespace().next().unwrap_or(text)
        ));
    }
    let fields = text.split_whitespace().count();
    if fields != 5 {
        return Err(format!(
            "it has {fields} field{}; write exactly five: minute hour day-of-month month day-of-week (no seconds or year field)",
            if fields == 1 { "" } else { "s" }
        ));
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| {
            format!(
                "{} (the fields are minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 0-7 or SUN-SAT)",
                e.to_string().trim_end_matches('.')
            )
        })
}

pub(crate) fn parse_timezone(name: &str) -> Option<Tz> {
    name.parse::<Tz>().ok()
}

impl Schedule {
    fn compiled(&self) -> Option<(Cron, Tz)> {
        let cron = parse_cron(&self.cron).ok()?;
        let tz = match &self.timezone {
            None => Tz::UTC,
            Some(name) => parse_timezone(name)?,
        };
        Some((cron, tz))
    }

    /// The latest tick t of this schedule with last < t <= now (unix
    /// milliseconds, UTC), or None. Used by the scheduler: a tick missed
    /// while the server was down runs once on recovery (only the latest
    /// missed tick). Ticks older than 400 days before `now` are not looked
    /// for.
    pub fn due_tick(&self, last_ms: i64, now_ms: i64) -> Option<i64> {
        if now_ms <= last_ms {
            return None;
        }
        let (cron, tz) = self.compiled()?;
        let floor = last_ms.max(now_ms.saturating_sub(MAX_CATCH_UP_MS));
        // The latest wall clock match at or before now, searching backwards;
        // the forward search (which defines the ticks) then confirms it and
        // picks up anything the backward search stepped over.
        let mut probe = floor;
        if let Some(prev) = prev_tick_in(&cron, &tz, now_ms)
            && prev > floor
        {
            probe = prev - 1;
        }
        let mut best = None;
        // One step when the two searches agree; bounded either way.
        for _ in 0..64 {
            match next_tick_in(&cron, &tz, probe) {
                Some(t) if t <= now_ms => {
                    best = Some(t);
                    probe = t;
                }
                _ => break,
            }
        }
        best
    }

    /// The first tick strictly after `after_ms`.
    pub fn next_tick(&self, after_ms: i64) -> Option<i64> {
        let (cron, tz) = self.compiled()?;
        next_tick_in(&cron, &tz, after_ms)
    }
}

fn at(ms: i64, tz: &Tz) -> Option<DateTime<Tz>> {
    DateTime::<Utc>::from_timestamp_millis(ms).map(|t| t.with_timezone(tz))
}

/// Whether `t` is the second instant of a wall clock time that a fall-back
/// repeats.
fn repeated_later(tz: &Tz, t: &DateTime<Tz>) -> bool {
    matches!(tz.from_local_datetime(&t.naive_local()), LocalResult::Ambiguous(_, later) if later == *t)
}

/// The latest wall clock match at or before `at_ms`, skipping the second
/// instants of repeated wall clock times (see [`next_tick_in`]).
fn prev_tick_in(cron: &Cron, tz: &Tz, at_ms: i64) -> Option<i64> {
    let mut from = at(at_ms, tz)?;
    let mut inclusive = true;
    for _ in 0..256 {
        let prev = cron.find_previous_occurrence(&from, inclusive).ok()?;
        if !repeated_later(tz, &prev) {
            return Some(prev.timestamp_millis());
        }
        from = prev;
        inclusive = false;
    }
    None
}

/// The ticks are croner's forward matches, in the zone's wall clock: a
/// fixed time that falls in a spring-forward gap runs at the first instant
/// after the gap, an interval pattern skips the gap, and a wall clock minute
/// that a fall-back repeats runs once, at its first (earlier) instant.
fn next_tick_in(cron: &Cron, tz: &Tz, after_ms: i64) -> Option<i64> {
    // Ticks fall on whole seconds: searching after the whole second that
    // holds `after_ms` finds the first tick strictly after it.
    let mut from = at(after_ms.div_euclid(1000).checked_mul(1000)?, tz)?;
    // A repeated hour holds at most 60 per-minute matches of its later half.
    for _ in 0..256 {
        let next = cron.find_next_occurrence(&from, false).ok()?;
        if !repeated_later(tz, &next) {
            return Some(next.timestamp_millis());
        }
        from = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn push(p: PushTrigger) -> Triggers {
        Triggers { declared: true, push: Some(p), ..Triggers::default() }
    }

    fn files(items: &[&str]) -> Vec<String> {
        v(items)
    }

    #[test]
    fn undeclared_is_manual_only() {
        let t = Triggers::default();
        assert!(t.is_unset());
        assert!(t.allows_manual());
        assert!(!t.matches_push("refs/heads/main", None));
        assert!(!t.matches_pull_request("main", None));
        // Declared without `manual`: no hand-started runs.
        let t = push(PushTrigger::default());
        assert!(!t.is_unset());
        assert!(!t.allows_manual());
        assert!(!t.matches_pull_request("main", None));
        let t = Triggers { declared: true, manual: true, ..Triggers::default() };
        assert!(t.allows_manual());
        assert!(!t.matches_push("refs/heads/main", None));
    }

    #[test]
    fn push_without_filters_runs_for_every_branch_and_tag() {
        let t = push(PushTrigger::default());
        assert!(t.matches_push("refs/heads/main", None));
        assert!(t.matches_push("refs/heads/feature/x", Some(&[])));
        assert!(t.matches_push("refs/tags/v1.0", None));
        assert!(!t.matches_push("main", None));
        assert!(!t.matches_push("refs/heads/", None));
        assert!(!t.matches_push("refs/tags/", None));
        assert!(!t.matches_push("refs/pull/1/head", None));
        assert!(!t.matches_push("refs/remotes/origin/main", None));
    }

    #[test]
    fn branch_filters_skip_tags_and_tag_filters_skip_branches() {
        let t = push(PushTrigger { branches: v(&["main", "release/**"]), ..Default::default() });
        assert!(t.matches_push("refs/heads/main", None));
        assert!(t.matches_push("refs/heads/release/1.x/rc", None));
        assert!(!t.matches_push("refs/heads/dev", None));
        assert!(!t.matches_push("refs/tags/main", None));

        let t = push(PushTrigger { branches_ignore: v(&["wip/*"]), ..Default::default() });
        assert!(t.matches_push("refs/heads/main", None));
        assert!(!t.matches_push("refs/heads/wip/x", None));
        assert!(t.matches_push("refs/heads/wip/x/y", None));
        assert!(!t.matches_push("refs/tags/v1", None));

        let t = push(PushTrigger { tags: v(&["v*"]), ..Default::default() });
        assert!(t.matches_push("refs/tags/v1.2.3", None));
        assert!(!t.matches_push("refs/tags/nightly", None));
        assert!(!t.matches_push("refs/heads/v1", None));

        let t = push(PushTrigger { tags_ignore: v(&["nightly*"]), ..Default::default() });
        assert!(t.matches_push("refs/tags/v1", None));
        assert!(!t.matches_push("refs/tags/nightly-2024", None));
        assert!(!t.matches_push("refs/heads/main", None));

        let t = push(PushTrigger { branches: v(&["main"]), tags: v(&["v*"]), ..Default::default() });
        assert!(t.matches_push("refs/heads/main", None));
        assert!(t.matches_push("refs/tags/v2", None));
        assert!(!t.matches_push("refs/heads/dev", None));
        assert!(!t.matches_push("refs/tags/x", None));
    }

    #[test]
    fn negated_branch_patterns() {
        // The cheat sheet's example for `branches` with `!`.
        let t = push(PushTrigger { branches: v(&["releases/**", "!releases/**-alpha"]), ..Default::default() });
        assert!(t.matches_push("refs/heads/releases/10", None));
        assert!(t.matches_push("refs/heads/releases/beta/mona", None));
        assert!(!t.matches_push("refs/heads/releases/10-alpha", None));
        assert!(!t.matches_push("refs/heads/releases/beta/3-alpha", None));
        assert!(!t.matches_push("refs/heads/main", None));
    }

    #[test]
    fn path_filters() {
        let t = push(PushTrigger { paths: v(&["src/**", "!src/docs/**"]), ..Default::default() });
        let main = "refs/heads/main";
        assert!(t.matches_push(main, Some(&files(&["src/lib.rs"]))));
        assert!(t.matches_push(main, Some(&files(&["README.md", "src/lib.rs"]))));
        assert!(!t.matches_push(main, Some(&files(&["src/docs/a.md"]))));
        assert!(!t.matches_push(main, Some(&files(&["README.md"]))));
        assert!(t.matches_push(main, Some(&files(&["src/docs/a.md", "src/x.rs"]))));
        // Nothing changed: `paths` does not run.
        assert!(!t.matches_push(main, Some(&[])));
        // Unknown changes: path filters pass.
        assert!(t.matches_push(main, None));
        // Tag pushes ignore path filters.
        assert!(t.matches_push("refs/tags/v1", Some(&files(&["README.md"]))));

        let t = push(PushTrigger { paths_ignore: v(&["docs/**", "*.md"]), ..Default::default() });
        assert!(!t.matches_push(main, Some(&files(&["docs/a.txt", "README.md"]))));
        assert!(t.matches_push(main, Some(&files(&["docs/a.txt", "src/x.rs"]))));
        // Nothing changed: `paths-ignore` runs (GitHub does).
        assert!(t.matches_push(main, Some(&[])));
        assert!(t.matches_push(main, None));

        // The cheat sheet's example: `*.md` and `!README.md` ignore.
        let t = push(PushTrigger { paths_ignore: v(&["docs/**"]), ..Default::default() });
        assert!(!t.matches_push(main, Some(&files(&["docs/octocat.md"]))));
        assert!(t.matches_push(main, Some(&files(&["docs/octocat.md", "app.js"]))));

        // Branch and path filters both apply.
        let t = push(PushTrigger { branches: v(&["main"]), paths: v(&["**.js"]), ..Default::default() });
        assert!(t.matches_push(main, Some(&files(&["a/b.js"]))));
        assert!(!t.matches_push("refs/heads/dev", Some(&files(&["a/b.js"]))));
        assert!(!t.matches_push(main, Some(&files(&["a/b.rs"]))));
    }

    #[test]
    fn pull_request_filters() {
        let t = Triggers {
            declared: true,
            pull_request: Some(PullRequestTrigger {
                branches: v(&["main", "release/*"]),
                paths: v(&["src/**"]),
                ..Default::default()
            }),
            ..Triggers::default()
        };
        assert!(t.matches_pull_request("main", None));
        assert!(t.matches_pull_request("release/1", Some(&files(&["src/a"]))));
        assert!(!t.matches_pull_request("release/1", Some(&files(&["docs/a"]))));
        assert!(!t.matches_pull_request("dev", None));
        assert!(!t.matches_pull_request("", None));
        assert!(!t.matches_push("refs/heads/main", None));
        let t = Triggers {
            declared: true,
            pull_request: Some(PullRequestTrigger { branches_ignore: v(&["wip/**"]), ..Default::default() }),
            ..Triggers::default()
        };
        assert!(t.matches_pull_request("main", None));
        assert!(!t.matches_pull_request("wip/a/b", None));
        let t = Triggers { declared: true, pull_request: Some(Default::default()), ..Triggers::default() };
        assert!(t.matches_pull_request("anything/at/all", Some(&[])));
    }

    // ---- schedules ----

    fn sched(cron: &str, tz: Option<&str>) -> Schedule {
        Schedule { cron: cron.to_string(), timezone: tz.map(str::to_string) }
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap().timestamp_millis()
    }

    const MIN: i64 = 60_000;

    #[test]
    fn every_fifteen_minutes() {
        let s = sched("*/15 * * * *", None);
        let t0 = utc(2024, 5, 1, 10, 0);
        assert_eq!(s.next_tick(t0 - 1), Some(t0));
        assert_eq!(s.next_tick(t0), Some(t0 + 15 * MIN));
        assert_eq!(s.next_tick(t0 + 1), Some(t0 + 15 * MIN));
        assert_eq!(s.next_tick(t0 + 14 * MIN + 59_999), Some(t0 + 15 * MIN));
        // due: the latest tick in (last, now]
        assert_eq!(s.due_tick(t0, t0 + 14 * MIN), None);
        assert_eq!(s.due_tick(t0, t0 + 15 * MIN), Some(t0 + 15 * MIN));
        assert_eq!(s.due_tick(t0 - 1, t0), Some(t0));
        assert_eq!(s.due_tick(t0, t0), None);
        assert_eq!(s.due_tick(t0 + MIN, t0), None);
        // Down for a day and a half: only the latest missed tick.
        assert_eq!(s.due_tick(t0, t0 + 36 * 60 * MIN + 7 * MIN), Some(t0 + 36 * 60 * MIN));
    }

    #[test]
    fn due_tick_from_the_far_past_is_bounded_and_fast() {
        let s = sched("* * * * *", None);
        let now = utc(2024, 5, 1, 10, 0) + 30_000;
        let start = std::time::Instant::now();
        assert_eq!(s.due_tick(0, now), Some(utc(2024, 5, 1, 10, 0)));
        assert_eq!(s.due_tick(i64::MIN, now), Some(utc(2024, 5, 1, 10, 0)));
        // A yearly tick 2 years ago is outside the window.
        let yearly = sched("0 0 1 1 *", None);
        assert_eq!(yearly.due_tick(0, utc(2024, 6, 1, 0, 0)), Some(utc(2024, 1, 1, 0, 0)));
        let rare = sched("0 0 29 2 *", None);
        assert_eq!(rare.due_tick(0, utc(2025, 6, 1, 0, 0)), None); // 2024-02-29 is > 400 days back
        assert_eq!(rare.due_tick(0, utc(2025, 1, 1, 0, 0)), Some(utc(2024, 2, 29, 0, 0)));
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
    }

    #[test]
    fn day_of_week() {
        // 2024-05-01 is a Wednesday.
        let s = sched("30 9 * * MON-FRI", None);
        let sat = utc(2024, 5, 4, 12, 0);
        assert_eq!(s.next_tick(sat), Some(utc(2024, 5, 6, 9, 30)));
        assert_eq!(s.due_tick(utc(2024, 5, 3, 10, 0), sat), None);
        assert_eq!(s.due_tick(utc(2024, 5, 3, 9, 0), sat), Some(utc(2024, 5, 3, 9, 30)));
        let sunday = sched("0 0 * * 0", None);
        assert_eq!(sunday.next_tick(utc(2024, 5, 1, 0, 0)), Some(utc(2024, 5, 5, 0, 0)));
        assert_eq!(sched("0 0 * * 7", None).next_tick(utc(2024, 5, 1, 0, 0)), Some(utc(2024, 5, 5, 0, 0)));
    }

    #[test]
    fn time_zone_offset() {
        // 09:00 in Berlin is 07:00 UTC in summer (CEST) and 08:00 in winter.
        let s = sched("0 9 * * *", Some("Europe/Berlin"));
        assert_eq!(s.next_tick(utc(2024, 7, 1, 0, 0)), Some(utc(2024, 7, 1, 7, 0)));
        assert_eq!(s.next_tick(utc(2024, 1, 10, 0, 0)), Some(utc(2024, 1, 10, 8, 0)));
        let ny = sched("0 9 * * *", Some("America/New_York"));
        assert_eq!(ny.next_tick(utc(2024, 1, 10, 0, 0)), Some(utc(2024, 1, 10, 14, 0)));
        // Same for the weekday: Monday 00:30 in Tokyo is Sunday 15:30 UTC.
        let tokyo = sched("30 0 * * MON", Some("Asia/Tokyo"));
        assert_eq!(tokyo.next_tick(utc(2024, 5, 1, 0, 0)), Some(utc(2024, 5, 5, 15, 30)));
        assert_eq!(sched("0 9 * * *", Some("UTC")).next_tick(utc(2024, 1, 10, 0, 0)), Some(utc(2024, 1, 10, 9, 0)));
    }

    #[test]
    fn spring_forward_gap() {
        // Berlin, 2024-03-31: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let daily = sched("30 2 * * *", Some("Europe/Berlin"));
        // 02:30 does not exist that day: the fixed-time job runs at the first
        // instant after the gap, 03:00 CEST = 01:00 UTC, once.
        let before = utc(2024, 3, 30, 12, 0);
        assert_eq!(daily.next_tick(before), Some(utc(2024, 3, 31, 1, 0)));
        assert_eq!(daily.next_tick(utc(2024, 3, 31, 1, 0)), Some(utc(2024, 4, 1, 0, 30)));
        assert_eq!(daily.due_tick(before, utc(2024, 3, 31, 3, 0)), Some(utc(2024, 3, 31, 1, 0)));
        // An interval pattern just skips the missing hour.
        let quarter = sched("*/15 * * * *", Some("Europe/Berlin"));
        let t = utc(2024, 3, 31, 0, 45); // 01:45 CET
        assert_eq!(quarter.next_tick(t), Some(utc(2024, 3, 31, 1, 0))); // 03:00 CEST
        assert_eq!(quarter.due_tick(t, utc(2024, 3, 31, 1, 5)), Some(utc(2024, 3, 31, 1, 0)));
    }

    #[test]
    fn fall_back_repeats_no_wall_clock_minute() {
        // Berlin, 2024-10-27: 03:00 CEST goes back to 02:00 CET (01:00 UTC);
        // 02:00–02:59 happens twice (00:00–00:59 UTC and 01:00–01:59 UTC).
        let daily = sched("30 2 * * *", Some("Europe/Berlin"));
        let before = utc(2024, 10, 26, 12, 0);
        assert_eq!(daily.next_tick(before), Some(utc(2024, 10, 27, 0, 30)));
        assert_eq!(daily.next_tick(utc(2024, 10, 27, 0, 30)), Some(utc(2024, 10, 28, 1, 30)));
        assert_eq!(daily.due_tick(utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 1, 45)), None);

        let quarter = sched("*/15 * * * *", Some("Europe/Berlin"));
        let mut ticks = Vec::new();
        let mut t = utc(2024, 10, 26, 23, 50);
        while let Some(n) = quarter.next_tick(t) {
            if n > utc(2024, 10, 27, 2, 0) {
                break;
            }
            ticks.push(n);
            t = n;
        }
        // 01:00, 01:15, 01:30, 01:45 CEST (23:xx UTC), 02:00–02:45 CEST once,
        // the repeated 02:xx CET skipped, then 03:00 CET (02:00 UTC).
        let expected: Vec<i64> =
            [(0, 0), (0, 15), (0, 30), (0, 45), (2, 0)].iter().map(|&(h, m)| utc(2024, 10, 27, h, m)).collect();
        assert_eq!(ticks, expected);
        // The scheduler's view: waking during the repeated hour finds nothing
        // new after the last tick at 02:45 CEST.
        assert_eq!(quarter.due_tick(utc(2024, 10, 27, 0, 45), utc(2024, 10, 27, 1, 50)), None);
        // Down since before the last CEST tick, waking in the repeated hour:
        // that tick (02:45 CEST) is due, not a repeated 02:xx CET one.
        assert_eq!(
            quarter.due_tick(utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 1, 50)),
            Some(utc(2024, 10, 27, 0, 45))
        );
        assert_eq!(daily.due_tick(utc(2024, 10, 26, 12, 0), utc(2024, 10, 27, 1, 45)), Some(utc(2024, 10, 27, 0, 30)));
        // Every tick that due_tick reports is one that next_tick walks through.
        let mut last = utc(2024, 10, 26, 22, 0);
        let mut now = last;
        let mut walked = Vec::new();
        while now < utc(2024, 10, 27, 3, 0) {
            now += 7 * MIN;
            if let Some(t) = quarter.due_tick(last, now) {
                assert_eq!(quarter.next_tick(last), Some(t), "one tick per 7 minutes at most");
                walked.push(t);
                last = t;
            }
        }
        assert!(walked.windows(2).all(|w| w[0] < w[1]));
        assert!(!walked.iter().any(|&t| t > utc(2024, 10, 27, 0, 45) && t < utc(2024, 10, 27, 2, 0)), "{walked:?}");
        assert_eq!(quarter.due_tick(utc(2024, 10, 27, 0, 45), utc(2024, 10, 27, 2, 1)), Some(utc(2024, 10, 27, 2, 0)));
    }

    #[test]
    fn cron_parsing() {
        assert!(parse_cron("*/15 * * * *").is_ok());
        assert!(parse_cron("0 0 * * SUN").is_ok());
        assert!(parse_cron("0 0 1 JAN *").is_ok());
        for bad in ["", "* * * *", "0 * * * * *", "0 0 * * * * 2024", "@reboot", "@daily", "61 * * * *", "x * * * *"] {
            assert!(parse_cron(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_timezone("Europe/Berlin").is_some());
        assert!(parse_timezone("Mars/Olympus").is_none());
        // An invalid stored schedule never ticks (and never panics).
        assert_eq!(sched("nonsense", None).next_tick(0), None);
        assert_eq!(sched("* * * * *", Some("Nowhere/Else")).due_tick(0, 1_000_000), None);
        assert_eq!(sched("* * * * *", None).next_tick(i64::MAX), None);
        assert_eq!(sched("* * * * *", None).due_tick(i64::MIN, i64::MIN + 1), None);
    }
}
