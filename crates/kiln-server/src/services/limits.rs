//! Size limits of what a submission may store (issue 13, findings 7 and
//! 10): a run's inputs and its frozen definition. Each is refused with 422
//! and a message naming the limit, before anything is stored — rather than
//! accepted, stored, and then failing every attempt as an infrastructure
//! error (an environment that `execve` refuses) or weighing on every read.

use crate::error::{ApiErr, ApiResult};
use kiln_workflow::Workflow;
use std::collections::BTreeMap;

/// Inputs per run.
pub(crate) const MAX_INPUTS: usize = 64;
/// Bytes of one input's name.
pub(crate) const MAX_INPUT_NAME: usize = 128;
/// Bytes of one input's value (Linux refuses a single environment string
/// past 128 KiB; inputs are for parameters, not payloads).
pub(crate) const MAX_INPUT_VALUE: usize = 16 * 1024;
/// Bytes of all names and values together.
pub(crate) const MAX_INPUTS_TOTAL: usize = 64 * 1024;
/// Bytes of a frozen definition as stored (JSON). A 256 KiB workflow file
/// can expand to several times that (every step and matrix cell spelled
/// out); every read of the run parses it.
pub(crate) const MAX_DEFINITION: usize = 512 * 1024;

/// Refuse inputs past the limits, or that cannot be an environment variable.
pub(crate) fn check_inputs(inputs: &BTreeMap<String, String>) -> ApiResult<()> {
    if inputs.len() > MAX_INPUTS {
        return Err(ApiErr::invalid(format!("{} inputs; at most {MAX_INPUTS} are accepted", inputs.len())));
    }
    let mut total = 0;
    for (k, v) in inputs {
        if k.is_empty() || k.len() > MAX_INPUT_NAME || k.contains('=') || k.chars().any(char::is_control) {
            return Err(ApiErr::invalid(format!(
                "input name `{}` must be 1-{MAX_INPUT_NAME} bytes without `=` or control characters",
                k.escape_debug()
            )));
        }
        if v.len() > MAX_INPUT_VALUE {
            return Err(ApiErr::invalid(format!(
                "input `{k}` is {} bytes; at most {MAX_INPUT_VALUE} bytes per value are accepted",
                v.len()
            )));
        }
        if v.contains('\0') {
            return Err(ApiErr::invalid(format!("input `{k}` contains a NUL byte")));
        }
        total += k.len() + v.len();
    }
    if total > MAX_INPUTS_TOTAL {
        return Err(ApiErr::invalid(format!(
            "inputs total {total} bytes; at most {MAX_INPUTS_TOTAL} bytes are accepted"
        )));
    }
    Ok(())
}

/// Refuse a definition whose stored form is past [`MAX_DEFINITION`]
/// (measured off the async runtime: it may be large).
pub(crate) async fn check_definition(workflow: &Workflow, path: &str) -> ApiResult<()> {
    let wf = workflow.clone();
    let size = tokio::task::spawn_blocking(move || serde_json::to_vec(&wf).map(|v| v.len()))
        .await
        .map_err(|e| ApiErr::internal(e.to_string()))?
        .map_err(|e| ApiErr::internal(e.to_string()))?;
    if size > MAX_DEFINITION {
        return Err(ApiErr::invalid(format!(
            "{path} expands to a {} KiB definition; at most {} KiB are stored per run (fewer jobs, steps or \
             matrix cells, or split the workflow)",
            size / 1024,
            MAX_DEFINITION / 1024
        )));
    }
    Ok(())
}

/// Job timeouts (spec 004's hierarchy): a job without `timeout` gets the
/// server's default, frozen into the definition (a retry keeps it); one
/// asking for more than the server's maximum is refused with 422.
pub(crate) fn job_timeouts(
    wf: &mut Workflow,
    default: std::time::Duration,
    max: std::time::Duration,
) -> Result<(), String> {
    for job in &mut wf.jobs {
        match job.timeout_secs {
            Some(t) if t > max.as_secs() => {
                return Err(format!(
                    "job `{}` asks for `timeout: {t}s`; this server allows at most {}s (kiln server --max-job-timeout)",
                    job.name,
                    max.as_secs()
                ));
            }
            Some(_) => {}
            None => job.timeout_secs = Some(default.as_secs().min(max.as_secs()).max(1)),
        }
    }
    Ok(())
}

/// The run-level timeout (spec 004's hierarchy): a workflow without a
/// top-level `timeout` gets the server's `--run-timeout` (none when off),
/// frozen into the definition like the job timeouts (a retry keeps it).
pub(crate) fn run_timeout(wf: &mut Workflow, default: std::time::Duration) {
    if wf.timeout_secs.is_none() && !default.is_zero() {
        wf.timeout_secs = Some(default.as_secs().clamp(1, kiln_workflow::MAX_TIMEOUT_SECS));
    }
}

/// Artifact retention (issue 16): a published artifact without `expire-in`
/// gets the server's `--artifact-expire-in`, frozen into the definition
/// like the job timeout (a retry keeps it); the completion transaction
/// turns it into the binding's `expires_at`.
pub(crate) fn artifact_expiry(wf: &mut Workflow, default: std::time::Duration) {
    let secs = default.as_secs().clamp(1, kiln_workflow::MAX_EXPIRE_IN_SECS);
    for job in &mut wf.jobs {
        for p in &mut job.artifacts.publish {
            p.expire_in_secs.get_or_insert(secs);
        }
    }
}

#[cfg(test)]
mod timeout_tests {
    use std::time::Duration;

    #[test]
    fn defaults_fill_in_and_the_maximum_refuses() {
        let mut wf = kiln_workflow::parse(
            "version: 1\njobs:\n  - name: a\n    steps: [echo]\n  - name: b\n    timeout: 2h\n    steps: [echo]\n",
        )
        .unwrap();
        super::job_timeouts(&mut wf, Duration::from_secs(3600), Duration::from_secs(86400)).unwrap();
        assert_eq!(wf.jobs[0].timeout_secs, Some(3600));
        assert_eq!(wf.jobs[1].timeout_secs, Some(7200));
        let e = super::job_timeouts(&mut wf, Duration::from_secs(3600), Duration::from_secs(3600)).unwrap_err();
        assert!(e.contains("job `b`") && e.contains("at most 3600s"), "{e}");
    }

    #[test]
    fn artifact_expiry_defaults_fill_in() {
        let mut wf = kiln_workflow::parse(
            "version: 1\njobs:\n  - name: a\n    steps: [echo]\n    artifacts:\n      publish:\n        \
             - {name: x, path: x}\n        - {name: y, path: y, expire-in: 1h}\n",
        )
        .unwrap();
        super::artifact_expiry(&mut wf, Duration::from_secs(86400));
        let got: Vec<_> = wf.jobs[0].artifacts.publish.iter().map(|p| p.expire_in_secs).collect();
        assert_eq!(got, [Some(86400), Some(3600)]);
    }
}
