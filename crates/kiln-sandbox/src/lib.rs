//! Job sandboxes: the [`Executor`] contract and its implementations.
//!
//! The sandbox is the untrusted side of the agent (ARCHITECTURE.md, "Data
//! flow"): it runs the job's commands with a fresh writable state per attempt
//! and never sees the agent's credentials or environment. Implementations:
//! - [`HostExecutor`]: each step is a host process in its own session (and,
//!   where the kernel allows, PID and mount namespaces; as a separate
//!   unprivileged user under a root agent: see [`Isolation`]), with a
//!   cleared environment, killed with its whole process group. For trusted
//!   code: under a non-root agent a step has the agent user's file access.
//! - [`ContainerExecutor`]: each attempt in a fresh container of a pinned
//!   image, steps as execs, through the Docker Engine API (Podman or dockerd).

mod container;
mod host;
mod isolation;
mod mounts;
mod procs;
mod reap;
mod services;
mod spawn;

pub use container::{
    CONTAINER_WORKSPACE, ContainerConfig, ContainerExecutor, Engine, EngineError, LABEL_AGENT, LABEL_EPOCH, LABEL_JOB,
    LABEL_RUN, Limits, Network, PinnedImage, repository_of,
};
pub use host::{DEFAULT_KILL_GRACE, DEFAULT_PATH, HostConfig, HostExecutor};
pub use isolation::{Isolation, Namespaces, StepUser};
pub use procs::process_alive;
pub use reap::{reap_orphans, remove_tree};
pub use services::{FAILED_LOG_TAIL, HealthCheck, LABEL_SERVICE, ServiceError, ServiceRequest, Services};
pub use spawn::set_step_nice;

use futures::future::BoxFuture;
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// Which pipe a piece of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    /// Wire name of the stream (`stdout` / `stderr`), as used in log chunks.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// How a step's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepExit {
    /// The shell exited with this code; 0 is success.
    Code(i32),
    /// The shell was terminated by this signal (for example after [`Executor::kill`]).
    Signal(i32),
}

impl StepExit {
    pub fn success(self) -> bool {
        self == StepExit::Code(0)
    }

    /// The exit code in the shell's convention: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            StepExit::Code(c) => c,
            StepExit::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for StepExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepExit::Code(c) => write!(f, "exit code {c}"),
            StepExit::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// One event of a running step. Output events arrive in the order they were
/// read from each pipe; `Exited` is always the last event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepEvent {
    /// Bytes as read from the pipe. The reader reads into their buffer
    /// again once nobody holds them any more (holding them is safe; it only
    /// costs the reader a fresh buffer).
    Output {
        stream: OutputStream,
        data: bytes::Bytes,
    },
    Exited(StepExit),
}

/// One step to run: a shell command and the environment it adds.
#[derive(Debug, Clone, Default)]
pub struct StepRequest {
    /// Shown in diagnostics only.
    pub name: String,
    /// The script: the last argument of [`StepRequest::program`].
    pub command: String,
    /// The program and its arguments, the command appended as the last one
    /// (`bash --noprofile --norc -eo pipefail -c`, `python3 -c`, …). Empty:
    /// `/bin/sh -e -c`.
    pub program: Vec<String>,
    /// Relative to the workspace (the caller checked it stays inside);
    /// `None`: the workspace.
    pub working_dir: Option<String>,
    /// Job environment (KILN_* and the workflow's `env`). Applied after the
    /// executor's base environment, so a job may override e.g. `PATH`.
    pub env: BTreeMap<String, String>,
}

/// A running step: read its events until [`StepEvent::Exited`].
///
/// The executor keeps draining the step's pipes into a bounded channel, so a
/// consumer that stops reading eventually blocks the step's writes (never the
/// agent): consumers must read promptly and buffer on their side.
pub struct StepHandle {
    events: mpsc::Receiver<StepEvent>,
}

impl StepHandle {
    pub(crate) fn new(events: mpsc::Receiver<StepEvent>) -> Self {
        StepHandle { events }
    }

    /// The next event; `None` only after `Exited` was returned (or if the
    /// executor task was torn down, which callers treat as infrastructure failure).
    pub async fn next(&mut self) -> Option<StepEvent> {
        self.events.recv().await
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// [`Executor::kill`] was called; no further steps are started.
    #[error("the sandbox was killed; no further steps run")]
    Killed,
    /// A step is still running; steps run one at a time.
    #[error("a step is already running in this sandbox")]
    Busy,
    #[error("cannot prepare the sandbox at {path}: {source}")]
    Prepare { path: String, source: std::io::Error },
    #[error("cannot start step `{step}`: {source}")]
    Spawn { step: String, source: std::io::Error },
    #[error("cannot clean up the sandbox at {path}: {source}")]
    Cleanup { path: String, source: std::io::Error },
}

/// A sandbox for one attempt of one job.
///
/// # Lifecycle
/// `prepare` → `exec`* → `cleanup`. One executor value serves exactly one
/// attempt; it is never reused.
/// - `prepare` creates the sandbox's private state (home, tmp). It must be
///   called once before the first `exec`.
/// - `exec` starts one step and returns at once with a [`StepHandle`]; steps
///   run one at a time (a second `exec` while a step runs is [`SandboxError::Busy`]).
///   Drive the handle to `Exited` before starting the next step.
/// - `cleanup` kills whatever still runs and removes the sandbox's private
///   state (the host executor moves it aside at once and deletes it in the
///   background, off the attempt's path). It is safe after a failed or
///   partial `prepare`, after a failed `exec`, after `kill`, and when called
///   more than once.
///
/// # Kill and concurrency
/// The executor is `Send + Sync` and its methods take `&self`: `kill` may be
/// called from any task, concurrently with `exec` or with a consumer reading
/// a `StepHandle`. `kill` is idempotent; it terminates the running step (the
/// whole process tree, gracefully then forcibly), waits until it is gone,
/// and makes every later `exec` fail with [`SandboxError::Killed`]. The
/// killed step's handle still delivers its remaining output and its `Exited`
/// event.
///
/// # Isolation
/// A step sees only the environment the executor builds (base variables
/// plus [`StepRequest::env`]); nothing of the agent's own environment
/// (tokens included) leaks into it.
pub trait Executor: Send + Sync {
    fn prepare(&self) -> BoxFuture<'_, Result<(), SandboxError>>;
    fn exec<'a>(&'a self, step: &'a StepRequest) -> BoxFuture<'a, Result<StepHandle, SandboxError>>;
    fn kill(&self) -> BoxFuture<'_, ()>;
    /// Terminates the running step only, like [`Executor::kill`] (its whole
    /// process tree, gracefully then forcibly, waiting until it is gone),
    /// but later `exec`s still run: for a step's own timeout. No-op when no
    /// step runs.
    fn interrupt(&self) -> BoxFuture<'_, ()>;
    fn cleanup(&self) -> BoxFuture<'_, Result<(), SandboxError>>;
}
