//! How an attempt's own work ended, before stop reasons are applied: what
//! the steps (in `attempt`) and the artifact transfers (in `artifacts`)
//! report, and what `attempt` turns into the completion it sends (spec 000
//! §8: a job's own failure is final, an infrastructure failure is retried
//! within the budget). Its own module so that `attempt` depends on
//! `artifacts` and not the other way round.

/// How the job's own work ended (before stop reasons are applied).
#[derive(Debug)]
pub(crate) enum Ran {
    Success,
    StepFailed {
        exit_code: i32,
        message: String,
        /// The step ran past its own `timeout` (class `timeout`, exit 124).
        timed_out: bool,
    },
    /// The job's own fault without an exit code (a declared output missing,
    /// a required input not available): not retried as infrastructure.
    JobError(String),
    Infra(String),
    /// An operation of the attempt (git fetch, image pull or build,
    /// artifact upload) ran past its own limit: class `timeout`, exit 124.
    TimedOut(String),
    /// A stop reason interrupted the work.
    Stopped,
}

/// `fut`'s output, or `None` once `limit` passed (the future is dropped).
pub(crate) async fn within<T>(
    limit: Option<std::time::Duration>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// The result of an operation past its limit: class `timeout`, the
/// message naming the operation and the flag that sets the limit.
pub(crate) fn op_timed_out(
    logs: &crate::logs::LogStreamer,
    what: &str,
    limit: Option<std::time::Duration>,
    flag: &str,
) -> Ran {
    let limit = kiln_workflow::format_duration(limit.unwrap_or_default());
    let msg = format!("{what} took longer than {limit} (kiln agent {flag})");
    tracing::error!("{msg}");
    logs.system(&format!("✗ {msg}"));
    Ran::TimedOut(msg)
}
