//! `kiln cancel RUN [--job NAME]`.

use super::shared::client;
use crate::cli::CancelArgs;
use kiln_api::exit;
use kiln_cmd::CmdResult;

pub(super) async fn run(a: CancelArgs) -> CmdResult {
    let c = client(&a.conn)?;
    let run = match &a.job {
        Some(job) => c.cancel_job(&a.run, job).await?,
        None => c.cancel_run(&a.run).await?,
    };
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&run).expect("json"));
    } else if let Some(job) = &a.job {
        // The job (or a matrix job's instances) as it now stands: cancelled,
        // or running while its attempt stops.
        for j in run.jobs.iter().filter(|j| j.name == *job || j.id == *job || is_instance(&j.name, job)) {
            match &j.message {
                Some(m) if j.status == kiln_api::JobStatus::Running => {
                    kiln_cmd::outln!("job {} {} — {m}", j.name, j.status)
                }
                _ => kiln_cmd::outln!("job {} {}", j.name, j.status),
            }
        }
        kiln_cmd::outln!("run {} {}", run.id, run.status);
    } else {
        kiln_cmd::outln!("run {} {}", run.id, run.status);
    }
    Ok(exit::OK)
}

/// `test (shard=1)` is an instance of matrix job `test`.
fn is_instance(name: &str, base: &str) -> bool {
    name.strip_prefix(base).is_some_and(|rest| rest.starts_with(" (") && rest.ends_with(')'))
}
