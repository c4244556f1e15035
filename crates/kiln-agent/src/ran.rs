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
    /// A stop reason interrupted the work.
    Stopped,
}
