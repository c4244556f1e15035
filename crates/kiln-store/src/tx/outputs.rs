//! Job outputs (issue 16): the `name=value` pairs a job's steps wrote to
//! `$KILN_OUTPUT`. Like artifacts (spec 000 §9, invariant 4), they are part
//! of the attempt's result and are bound only by the completion of the
//! current live epoch, in that transaction ([`bind`]): a fenced attempt's
//! outputs never reach anyone, and a job's outputs never change once bound.
//! Readers (the claim of a downstream job, the advancement deciding a job's
//! `if:`, the run API) read the bound rows only.

use crate::db::{Exec, Tx};
use crate::error::{Result, StoreError};
use std::collections::BTreeMap;

/// The outputs of a run's jobs, by job name then output name.
pub type RunOutputs = BTreeMap<String, BTreeMap<String, String>>;

/// Refuses outputs the job does not declare, or more than the limit
/// ([`kiln_workflow::MAX_OUTPUT_BYTES`], names included): the agent filters
/// and limits them already, so this is a misbehaving agent; nothing changes.
pub(crate) fn check(declared: &[String], outputs: &BTreeMap<String, String>) -> Result<()> {
    if let Some(name) = outputs.keys().find(|n| !declared.contains(n)) {
        return Err(StoreError::Invalid(format!(
            "output `{name}` is not declared in the job's `outputs` ({})",
            if declared.is_empty() { "it declares none".to_string() } else { declared.join(", ") }
        )));
    }
    let bytes: usize = outputs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > kiln_workflow::MAX_OUTPUT_BYTES {
        return Err(StoreError::Invalid(format!(
            "the job's outputs are {bytes} bytes; at most {} are allowed",
            kiln_workflow::MAX_OUTPUT_BYTES
        )));
    }
    Ok(())
}

/// Binds a successful live attempt's outputs (in its completion transaction).
pub(crate) async fn bind(
    tx: &mut Tx,
    run_id: &str,
    job_id: &str,
    epoch: i64,
    outputs: &BTreeMap<String, String>,
    now: i64,
) -> Result<()> {
    for (name, value) in outputs {
        tx.sql(
            "INSERT INTO job_outputs (run_id, job_id, name, value, epoch, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(run_id)
        .bind(job_id)
        .bind(name)
        .bind(value)
        .bind(epoch)
        .bind(now)
        .execute()
        .await?;
    }
    Ok(())
}

/// Every bound output of a run.
pub(crate) async fn of_run(exec: &mut impl Exec, run_id: &str) -> Result<RunOutputs> {
    let rows: Vec<(String, String, String)> = exec
        .sql(
            "SELECT j.name, o.name, o.value FROM job_outputs o JOIN jobs j ON j.id = o.job_id WHERE o.run_id = $1 \
             ORDER BY j.job_index, o.name",
        )
        .bind(run_id)
        .all()
        .await?;
    let mut out = RunOutputs::new();
    for (job, name, value) in rows {
        out.entry(job).or_default().insert(name, value);
    }
    Ok(out)
}
