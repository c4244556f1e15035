//! What differs between the SQL backends, named in one place.
//!
//! Every statement is written once, with numbered placeholders (`$1`, `$2`…,
//! which sqlx's SQLite driver binds by number too). Where the backends'
//! SQL differs, the statement takes the difference from the [`Dialect`]: the
//! database clock, row-lock suffixes, a set of texts from a bound JSON array.
//! Where a statement names a status or marker, the word comes from its enum
//! (kiln-core's `RunStatus`, `JobStatus`, `AttemptOutcome`, the store's
//! [`LogMarker`] and [`GenerationState`]) through [`lit`] / [`set`], never as
//! a literal in SQL text. Such statements are [`Sql`] values: composed once
//! per backend on first use and kept, so a hot path pays nothing per call
//! and the text the database plans is the same on every call (literal
//! statuses keep PostgreSQL's partial indexes usable).
//!
//! The differences that are whole mechanisms rather than fragments live in
//! the backend's own module: PostgreSQL's batched heartbeat function and
//! LISTEN/NOTIFY (`postgres.rs`), SQLite's one-statement heartbeat and its
//! pragmas (`sqlite.rs`).

use kiln_core::{AttemptOutcome, JobStatus, RunStatus};
use std::fmt;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite = 0,
    Postgres = 1,
}

/// How a transaction begins (spec 000 §9: mutations of one run are
/// serialized). SQLite's single writer serializes every transaction either
/// way; PostgreSQL chooses the isolation level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// SERIALIZABLE: the default for every transaction.
    Serializable,
    /// READ COMMITTED, for a transaction whose every decision reads rows it
    /// locked first (run, then job, then agent, `FOR UPDATE`) or is rechecked
    /// in the `WHERE` of its own `UPDATE`s: the claim and the first try of a
    /// completion (see `tx/claim.rs` for the rules); and a plain acceptance,
    /// which reads and writes only the rows it inserts (`tx/accept.rs`).
    LockedReadCommitted,
}

pub(crate) struct Dialect {
    pub(crate) backend: Backend,
    /// The database clock in unix milliseconds, as an SQL expression.
    pub(crate) now_ms: &'static str,
    /// Appended to a `SELECT` of one table to lock the rows it returns.
    pub(crate) for_update: &'static str,
    /// Appended to a `SELECT` over `runs r` joined with other tables: lock the run row.
    pub(crate) for_update_of_run: &'static str,
    /// [`Self::for_update_of_run`], skipping a run row another transaction holds.
    pub(crate) for_update_of_run_skip_locked: &'static str,
    /// Whether transactions take row locks (run, then job) before deciding.
    /// SQLite's single writer already serializes every transaction.
    pub(crate) row_locks: bool,
    /// How often a transaction that lost a serialization race runs again
    /// before the caller sees [`StoreError::Retryable`](crate::StoreError::Retryable).
    /// PostgreSQL: enough for dozens of transactions racing on one run (a
    /// test's worst case). SQLite: transactions never conflict under one
    /// writer; a busy database is an outage.
    pub(crate) max_tx_retries: u32,
}

pub(crate) static SQLITE: Dialect = Dialect {
    backend: Backend::Sqlite,
    now_ms: "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
    for_update: "",
    for_update_of_run: "",
    for_update_of_run_skip_locked: "",
    row_locks: false,
    max_tx_retries: 0,
};

pub(crate) static POSTGRES: Dialect = Dialect {
    backend: Backend::Postgres,
    now_ms: "CAST(extract(epoch from clock_timestamp()) * 1000 AS BIGINT)",
    for_update: " FOR UPDATE",
    for_update_of_run: " FOR UPDATE OF r",
    for_update_of_run_skip_locked: " FOR UPDATE OF r SKIP LOCKED",
    row_locks: true,
    max_tx_retries: 30,
};

impl Dialect {
    /// The rows (`value`, text) of a JSON array of strings bound as
    /// parameter `$n`, for `x IN (SELECT value FROM …)`.
    pub(crate) fn json_texts(&self, n: u32) -> String {
        match self.backend {
            Backend::Sqlite => format!("json_each(${n})"),
            Backend::Postgres => format!("json_array_elements_text(CAST(${n} AS json))"),
        }
    }

    /// The statement that begins a transaction of `isolation`, if the
    /// backend's default `BEGIN` is not it.
    pub(crate) fn begin(&self, isolation: Isolation) -> Option<&'static str> {
        match (self.backend, isolation) {
            (Backend::Sqlite, _) => None,
            (Backend::Postgres, Isolation::Serializable) => Some("BEGIN ISOLATION LEVEL SERIALIZABLE"),
            (Backend::Postgres, Isolation::LockedReadCommitted) => Some("BEGIN ISOLATION LEVEL READ COMMITTED"),
        }
    }
}

impl Dialect {
    /// Before rerun `tries` of a transaction that lost a serialization race:
    /// a short random pause (jitter), growing with the tries, so racing
    /// transactions spread out.
    pub(crate) async fn retry_pause(&self, tries: u32) {
        use rand::Rng;
        if self.max_tx_retries == 0 {
            return;
        }
        let cap = (1u64 << tries.min(6)).min(50);
        let ms = rand::rng().random_range(0..=cap);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// SQL text composed from a dialect (and status words), built once per
/// backend on first use.
pub(crate) struct Sql {
    built: [OnceLock<String>; 2],
    build: fn(&Dialect) -> String,
}

impl Sql {
    pub(crate) const fn new(build: fn(&Dialect) -> String) -> Sql {
        Sql { built: [OnceLock::new(), OnceLock::new()], build }
    }

    pub(crate) fn text(&'static self, d: &'static Dialect) -> &'static str {
        self.built[d.backend as usize].get_or_init(|| (self.build)(d))
    }
}

/// Statement text as a query takes it: a literal (no dialect, no status
/// word) or a composed [`Sql`].
pub(crate) trait SqlText {
    fn text(self, d: &'static Dialect) -> &'static str;
}

impl SqlText for &'static str {
    fn text(self, _: &'static Dialect) -> &'static str {
        self
    }
}

impl SqlText for &'static Sql {
    fn text(self, d: &'static Dialect) -> &'static str {
        Sql::text(self, d)
    }
}

/// A word the store writes into a column: a status, an outcome, a marker.
pub(crate) trait Word: Copy {
    fn word(self) -> &'static str;
}

impl Word for RunStatus {
    fn word(self) -> &'static str {
        self.as_str()
    }
}

impl Word for JobStatus {
    fn word(self) -> &'static str {
        self.as_str()
    }
}

impl Word for AttemptOutcome {
    fn word(self) -> &'static str {
        self.as_str()
    }
}

/// Log rows that are events rather than bytes, stored as the chunk's
/// `stream`: `seal` (the attempt ended through its agent; every committed
/// byte is all there is) and `gap` (the agent was lost; bytes it had not
/// delivered are missing). spec 000 §13.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogMarker {
    Seal,
    Gap,
}

impl Word for LogMarker {
    fn word(self) -> &'static str {
        match self {
            LogMarker::Seal => kiln_core::logs::stream::SEAL,
            LogMarker::Gap => kiln_core::logs::stream::GAP,
        }
    }
}

/// The `system` stream: lines the server writes into a job's log.
pub(crate) const SYSTEM_STREAM: &str = kiln_core::logs::stream::SYSTEM;

/// The state of an artifact generation (`GenerationRecord::state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GenerationState {
    Uploading,
    Sealed,
    Failed,
    Deleted,
    /// Bound, then expired by the collector (issue 16): bytes deleted, row kept.
    Expired,
}

impl Word for GenerationState {
    fn word(self) -> &'static str {
        match self {
            GenerationState::Uploading => "uploading",
            GenerationState::Sealed => "sealed",
            GenerationState::Failed => "failed",
            GenerationState::Deleted => "deleted",
            GenerationState::Expired => "expired",
        }
    }
}

/// A word as an SQL string literal: `'ready'`.
pub(crate) fn lit(w: impl Word) -> Lit {
    Lit(w.word())
}

pub(crate) struct Lit(&'static str);

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Words are fixed identifiers (checked in this module's tests): no quoting needed.
        write!(f, "'{}'", self.0)
    }
}

/// Words as an SQL list: `('success', 'failed')`.
pub(crate) fn set<W: Word>(words: impl IntoIterator<Item = W>) -> String {
    let items: Vec<String> = words.into_iter().map(|w| lit(w).to_string()).collect();
    format!("({})", items.join(", "))
}

/// The job statuses that are final (`JobStatus::is_terminal`).
pub(crate) fn terminal_jobs() -> String {
    set(JobStatus::ALL.iter().copied().filter(|s| s.is_terminal()))
}

/// The run statuses that occupy a concurrency group: not yet terminal.
pub(crate) fn active_runs() -> String {
    set(RunStatus::ALL.iter().copied().filter(|s| !s.is_terminal()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(w: &str) -> bool {
        !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    }

    #[test]
    fn words_need_no_quoting() {
        let words = RunStatus::ALL
            .iter()
            .map(|s| s.word())
            .chain(JobStatus::ALL.iter().map(|s| s.word()))
            .chain(
                [AttemptOutcome::Running, AttemptOutcome::Success, AttemptOutcome::Failed, AttemptOutcome::Lost]
                    .map(Word::word),
            )
            .chain([LogMarker::Seal.word(), LogMarker::Gap.word(), SYSTEM_STREAM])
            .chain(
                [
                    GenerationState::Uploading,
                    GenerationState::Sealed,
                    GenerationState::Failed,
                    GenerationState::Deleted,
                ]
                .map(Word::word),
            );
        for w in words {
            assert!(plain(w), "{w:?}");
        }
    }

    #[test]
    fn status_sets_come_from_the_enums() {
        assert_eq!(terminal_jobs(), "('success', 'failed', 'cancelled', 'skipped')");
        assert_eq!(active_runs(), "('queued', 'running', 'cancelling')");
    }

    #[test]
    fn json_texts_per_backend() {
        assert_eq!(SQLITE.json_texts(2), "json_each($2)");
        assert_eq!(POSTGRES.json_texts(2), "json_array_elements_text(CAST($2 AS json))");
    }
}
