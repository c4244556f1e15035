//! The Kiln workflow language: YAML → validated, frozen definition.
//!
//! Pure: no IO beyond the string handed in. spec 000 §5: parse YAML safely and
//! bound its size, nesting, job count and steps; the canonical hash identifies
//! the frozen definition stored with every run.
//!
//! [`parse`] reads the YAML with the event parser of serde-saphyr
//! (`granit_parser`) into a span-carrying tree, refusing anchors/aliases,
//! tags, duplicate keys, multiple documents and deep nesting, then validates
//! it into a [`Workflow`]. Every problem is reported as a [`Diagnostic`]
//! (`line:col: message`, 1-based), sorted by position.
//!
//! Pipelines as graphs (spec 003, Deep Dive 3):
//!
//! * `matrix:` is expanded by [`parse`]: `Workflow::jobs` lists every
//!   combination as its own job named `base (k1=v1, k2=v2)` (axes in the
//!   order written, then include-only keys), with `KILN_MATRIX_<KEY>` in its
//!   env (upper-cased, `-` → `_`; overrides an `env` entry of that name) and
//!   [`MatrixInfo`] set. `${{ matrix.<key> }}` is substituted in step `run`
//!   and `name`, `env` values, `runs-on` values and the job's concurrency
//!   group (empty when the combination lacks an include-only key); any other
//!   `${{ }}` text in steps/env/runs-on is left verbatim, for the runner.
//! * `needs: base` means every expansion; `needs` may only name jobs defined
//!   earlier in the file, so the graph is acyclic and `jobs` is in
//!   topological order. With no `needs` anywhere, each file-level job needs
//!   every job expanded from the one before it.
//! * `restore.from_job` must name one expansion of a matrix job, never the
//!   base name.
//! * `if:` ([`eval_condition`]) and concurrency groups ([`render_group`])
//!   use the small expression language of the `expr` module, checked at
//!   parse time.
//!
//! When a workflow runs (`on:`, see `docs/workflow.md`): [`Workflow::on`]
//! ([`Triggers`]) holds the push / pull request filters, schedules and
//! whether a hand-started run is allowed. [`Triggers::matches_push`],
//! [`Triggers::matches_pull_request`] and [`Triggers::allows_manual`] decide
//! with GitHub Actions filter semantics ([`glob_match`]);
//! [`Schedule::due_tick`] and [`Schedule::next_tick`] give a schedule's ticks
//! (croner, in the schedule's IANA time zone). A workflow without `on:`
//! runs only by hand, and its frozen definition and hash are unchanged.

mod compose;
mod diag;
mod duration;
mod expr;
mod foreign;
mod freeze;
mod glob;
mod model;
mod parse;
mod script;
mod tree;
mod triggers;
mod validate;

pub use compose::{Loader, MAX_EXTENDS_DEPTH, MAX_INCLUDE_DEPTH, MAX_INCLUDED_FILES};
pub use diag::{Diagnostic, Diagnostics};
pub use duration::{format_duration, parse_bytes, parse_duration};
pub use expr::{
    CommitContext, ConditionContext, JobResult, MAX_EXPR_CHARS, MAX_EXPR_DEPTH, SHORT_SHA_LEN, eval_condition,
    output_name_ok, render_group, step_gate,
};
pub use freeze::render_claimed_image;
pub use glob::glob_match;

/// Whether an artifact `path` is a glob pattern (it has `*`, `?` or `[`)
/// rather than one file or directory. Patterns use the filter syntax of
/// [`glob_match`] and are matched against '/'-separated paths relative to
/// the workspace.
pub fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}
pub use model::*;
pub use parse::{MAX_DIAGNOSTICS, parse, parse_with};
pub use script::{SHELLS, render_run, shell_argv};
pub use triggers::MAX_CATCH_UP_MS;
pub use validate::{
    HANG_AFTER_SECS, HANG_KILL_AFTER_SECS, MAX_EXPIRE_IN_SECS, MAX_MATRIX_COMBINATIONS, MAX_NAME_CHARS, MAX_RETRY,
    MAX_TIMEOUT_SECS, valid_environment_name,
};
