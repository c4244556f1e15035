//! The provenance gate of a deploy job (issue 46, `kiln env set NAME
//! --require-provenance POLICY`): before a deploy job of an environment with
//! a policy may start, every artifact generation it would restore (as bound
//! in its run when its needs have ended) must have a signed provenance
//! statement that verifies with the server's keys and satisfies the policy
//! (the pure check: `kiln_provenance::deploy`). A job refused here is
//! cancelled by the advance pass with the refusal as its message, and its
//! run fails. Below `advance`; reads `gates` and `provenance` only.

use crate::db::{Exec, Tx};
use crate::error::Result;
use crate::model::{DeployedArtifact, RunRecord};
use crate::store::SqlStore;
use crate::tx::gates::get_in;
use kiln_core::JobStatus;
use kiln_core::advance::AdvanceJob;
use kiln_provenance::deploy::{DeployPolicy, Refusal, check_artifact};
use kiln_provenance::dsse::PublicKey;
use std::collections::HashMap;

/// An environment's policy, parsed. A stored policy that does not parse
/// (never written so: the store checks it) refuses every artifact.
fn policy_of(text: Option<&str>) -> std::result::Result<Option<DeployPolicy>, String> {
    match text {
        None => Ok(None),
        Some(t) => DeployPolicy::parse(t),
    }
}

/// The first of `artifacts` the policy refuses, checking each one's stored
/// statement with `keys`.
async fn first_refusal(
    tx: &mut Tx,
    policy: &DeployPolicy,
    keys: &[PublicKey],
    artifacts: &[(String, String, String)],
) -> Result<Option<Refusal>> {
    for (name, generation, sha256) in artifacts {
        let envelope: Option<String> = tx
            .sql("SELECT envelope FROM artifact_provenance WHERE generation_id = $1")
            .bind(generation)
            .scalar_optional()
            .await?;
        if let Err(r) = check_artifact(policy, name, generation, sha256, envelope.as_deref().map(str::as_bytes), keys) {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

fn bad_policy(environment: &str, e: String) -> Refusal {
    Refusal {
        check: "policy",
        artifact: String::new(),
        generation: String::new(),
        detail: format!("environment `{environment}`'s provenance policy does not parse: {e}"),
    }
}

/// The deploy jobs of `run` the pass may decide now (pending, every need
/// ended) that their environment's policy refuses: job name → the message
/// it is cancelled with. `indices[i]` is `jobs[i]`'s index in the run's
/// definition. Keys: those of the attester of the transaction's store.
pub(crate) async fn refusals(
    tx: &mut Tx,
    run: &RunRecord,
    jobs: &[AdvanceJob],
    indices: &[i64],
) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    let mut policies: HashMap<String, std::result::Result<Option<DeployPolicy>, String>> = HashMap::new();
    let mut keys: Option<Vec<PublicKey>> = None;
    for (job, index) in jobs.iter().zip(indices) {
        if job.status != JobStatus::Pending {
            continue;
        }
        let Some(def) = usize::try_from(*index).ok().and_then(|i| run.definition.jobs.get(i)) else { continue };
        let Some(env) = &def.environment else { continue };
        let ended = |n: &String| jobs.iter().any(|j| &j.name == n && j.status.is_terminal());
        if !job.needs.iter().all(ended) {
            continue;
        }
        if !policies.contains_key(&env.name) {
            let stored = get_in(tx, &env.name).await?.and_then(|e| e.require_provenance);
            policies.insert(env.name.clone(), policy_of(stored.as_deref()));
        }
        let policy = match &policies[&env.name] {
            Ok(Some(p)) => p.clone(),
            Ok(None) => continue,
            Err(e) => {
                out.insert(job.name.clone(), format!("cancelled: {}", bad_policy(&env.name, e.clone())));
                continue;
            }
        };
        let keys = match &keys {
            Some(k) => k,
            None => keys.insert(crate::store::scoped_attester().map(|a| a.verifying_keys()).unwrap_or_default()),
        };
        let artifacts: Vec<(String, String, String)> = crate::tx::provenance::restored(tx, &run.id, def)
            .await?
            .into_iter()
            .map(|r| (r.name, r.generation, r.sha256))
            .collect();
        if let Some(r) = first_refusal(tx, &policy, keys, &artifacts).await? {
            out.insert(
                job.name.clone(),
                format!("cancelled: not deployed to `{}` (--require-provenance {policy}): {r}", env.name),
            );
        }
    }
    Ok(out)
}

/// `EnvSecretStore::provenance_refusal`: whether `environment`'s policy
/// refuses one of `artifacts` (a promotion's or a rollback's), and which
/// check failed.
pub(crate) async fn provenance_refusal(
    store: &SqlStore,
    environment: &str,
    artifacts: &[DeployedArtifact],
) -> Result<Option<Refusal>> {
    let keys = store.attester().map(|a| a.verifying_keys()).unwrap_or_default();
    let items: Vec<(String, String, String)> =
        artifacts.iter().map(|a| (a.name.clone(), a.generation.clone(), a.sha256.clone())).collect();
    store
        .read(&(environment, keys, items), |tx, (environment, keys, items)| {
            Box::pin(provenance_refusal_tx(tx, environment, keys, items))
        })
        .await
}

async fn provenance_refusal_tx(
    tx: &mut Tx,
    environment: &str,
    keys: &[PublicKey],
    items: &[(String, String, String)],
) -> Result<Option<Refusal>> {
    let env = get_in(tx, environment).await?.ok_or_else(|| crate::tx::gates::not_found(environment))?;
    let policy = match policy_of(env.require_provenance.as_deref()) {
        Ok(Some(p)) => p,
        Ok(None) => return Ok(None),
        Err(e) => return Ok(Some(bad_policy(environment, e))),
    };
    first_refusal(tx, &policy, keys, items).await
}
