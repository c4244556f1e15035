//! Provenance written with each binding (issue 45): in the completion
//! transaction that binds an artifact generation, its SLSA provenance
//! statement is built from the facts this transaction reads — the frozen
//! run (repository, ref, commit, workflow and its hash, event, inputs,
//! trust), the job and its matrix values, the winning epoch and its agent's
//! pool and executor, the pinned image, the restored artifacts' generations
//! — signed by the server's [`Attester`] and stored beside the binding. A
//! statement that cannot be signed fails the transaction: no binding
//! without provenance. Nothing a step reported goes in.

use crate::db::{Exec, Tx};
use crate::error::{Result, StoreError};
use crate::model::{Attester, JobRecord, ProvenanceRecord, RunRecord, TestAttestationRecord};
use crate::store::SqlStore;
use kiln_provenance::statement::{self, BuildFacts, Dependency, Subject};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The facts of `job`'s attempt `epoch` of `run`, as of `now`.
/// An artifact generation a job restores: the one bound for (job, name)
/// in its run (a pinned one included).
pub(crate) struct Restored {
    pub name: String,
    pub from_job: String,
    /// The producing run and job's name.
    pub run_id: String,
    pub producer_job: String,
    pub generation: String,
    pub sha256: String,
}

/// What the job `def` of `run_id` restores, as bound now (an artifact not
/// bound is left out): read by its provenance and by its deployment.
pub(crate) async fn restored(tx: &mut Tx, run_id: &str, def: &kiln_workflow::Job) -> Result<Vec<Restored>> {
    let mut out = Vec::new();
    for r in &def.artifacts.restore {
        let bound: Option<(String, String, String, String)> = tx
            .sql(
                "SELECT g.expected_sha256, g.run_id, pj.name, g.id FROM artifact_bindings b \
                 JOIN jobs j ON j.id = b.job_id JOIN artifact_generations g ON g.id = b.generation_id \
                 JOIN jobs pj ON pj.id = g.job_id \
                 WHERE b.run_id = $1 AND j.name = $2 AND b.name = $3",
            )
            .bind(run_id)
            .bind(&r.from_job)
            .bind(&r.name)
            .optional()
            .await?;
        if let Some((sha256, run_id, producer_job, generation)) = bound {
            out.push(Restored {
                name: r.name.clone(),
                from_job: r.from_job.clone(),
                run_id,
                producer_job,
                generation,
                sha256,
            });
        }
    }
    Ok(out)
}

pub(crate) async fn facts(
    tx: &mut Tx,
    attester: &dyn Attester,
    run: &RunRecord,
    job: &JobRecord,
    epoch: i64,
    now: i64,
) -> Result<BuildFacts> {
    let agent: Option<(Option<String>, Option<String>, i64)> = tx
        .sql(
            "SELECT g.pool, g.executor, a.started_at FROM attempts a LEFT JOIN agents g ON g.id = a.agent_id \
             WHERE a.job_id = $1 AND a.epoch = $2",
        )
        .bind(&job.id)
        .bind(epoch)
        .optional()
        .await?;
    let (pool, executor, started) = agent.unwrap_or((None, None, now));
    let pool = pool.unwrap_or_else(|| "default".into());
    let executor = executor.unwrap_or_else(|| "host".into());
    let clone_url: String = tx.sql("SELECT clone_url FROM repos WHERE id = $1").bind(&run.repo_id).scalar().await?;
    let definition = usize::try_from(job.index).ok().and_then(|i| run.definition.jobs.get(i));
    let mut deps = vec![Dependency {
        name: None,
        uri: format!("git+{}", without_credential(&clone_url)),
        digest: BTreeMap::from([("gitCommit".to_string(), run.commit_sha.clone())]),
        annotations: run.git_ref.iter().map(|r| ("ref".to_string(), r.clone())).collect(),
    }];
    // The job's image, by the digest it was pinned to.
    if let (Some(digest), Some(image)) = (&job.image_digest, definition.and_then(|d| d.image.as_ref())) {
        let reference = match image {
            kiln_workflow::Image::Ref { reference } => reference.clone(),
            kiln_workflow::Image::Dockerfile { path, .. } => format!("built:{path}"),
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        deps.push(Dependency {
            name: Some("image".into()),
            uri: format!("oci://{reference}"),
            digest: BTreeMap::from([("sha256".to_string(), hex.to_string())]),
            annotations: BTreeMap::new(),
        });
    }
    // Every artifact it restored: the generation bound for (job, name) in
    // this run (a pinned one included), by its sha256 and producer.
    if let Some(d) = definition {
        for r in restored(tx, &run.id, d).await? {
            deps.push(Dependency {
                name: Some(r.name.clone()),
                uri: format!("kiln:runs/{}/jobs/{}/artifacts/{}", r.run_id, r.producer_job, r.name),
                digest: BTreeMap::from([("sha256".to_string(), r.sha256)]),
                annotations: BTreeMap::from([("generation".to_string(), r.generation)]),
            });
        }
    }
    // Every service, by the digest it was pinned to at acceptance.
    for (name, svc) in definition.map(|d| &d.services).into_iter().flatten() {
        if let Some(digest) = &svc.digest {
            let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
            deps.push(Dependency {
                name: Some(format!("service:{name}")),
                uri: format!("oci://{}", svc.image),
                digest: BTreeMap::from([("sha256".to_string(), hex.to_string())]),
                annotations: BTreeMap::new(),
            });
        }
    }
    // The cache it restored (the live attempt's report names the key; the
    // entry's bytes, while it exists, by their sha256).
    if let Some(report) = job.cache_result.as_deref().and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok()) {
        let text = |k: &str| report[k].as_str().unwrap_or_default().to_string();
        let (key, result, namespace) = (text("key"), text("result"), text("namespace"));
        if !key.is_empty() && matches!(result.as_str(), "hit" | "partial" | "prefix") {
            let sha: Option<String> = tx
                .sql("SELECT sha256 FROM cache_entries WHERE repo_id = $1 AND namespace = $2 AND cache_key = $3")
                .bind(&run.repo_id)
                .bind(&namespace)
                .bind(&key)
                .scalar_optional()
                .await?;
            deps.push(Dependency {
                name: Some("cache".into()),
                uri: format!("kiln:caches/{namespace}/{key}"),
                digest: sha.into_iter().map(|d| ("sha256".to_string(), d)).collect(),
                annotations: BTreeMap::from([("result".to_string(), result)]),
            });
        }
    }
    Ok(BuildFacts {
        repository: run.repo_name.clone(),
        git_ref: run.git_ref.clone(),
        commit: run.commit_sha.clone(),
        workflow_path: run.workflow_path.clone(),
        workflow_sha256: run.workflow_hash.clone(),
        event: run.event.clone(),
        inputs: run.inputs.clone(),
        run: run.id.clone(),
        run_number: run.number,
        job: job.name.clone(),
        matrix: definition.and_then(|d| d.matrix.as_ref()).map(|m| m.values.clone()).unwrap_or_default(),
        epoch,
        trust: run.trust.clone(),
        executor,
        builder_id: attester.builder_id(&pool),
        pool,
        dependencies: deps,
        kiln_version: attester.version(),
        invocation_id: format!("{}/{}/{epoch}", run.id, job.id),
        started_on: statement::rfc3339_ms(started),
        finished_on: statement::rfc3339_ms(now),
    })
}

/// `scheme://user:secret@host/…` → `scheme://host/…` (the stored URL has
/// no credential; an older one might).
fn without_credential(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Sign and store the provenance of each `(name, generation)` bound by
/// this completion. A generation that already has one (a retry pinning its
/// parent's) keeps it.
pub(crate) async fn write(
    store: &SqlStore,
    tx: &mut Tx,
    run: &RunRecord,
    job: &JobRecord,
    epoch: i64,
    bound: &[(String, String)],
    now: i64,
) -> Result<()> {
    if bound.is_empty() {
        return Ok(());
    }
    let attester: Arc<dyn Attester> = store.attester().ok_or_else(|| {
        StoreError::Unavailable("no attestation key is loaded: artifacts are bound only with signed provenance".into())
    })?;
    let facts = facts(tx, &*attester, run, job, epoch, now).await?;
    for (name, generation) in bound {
        let (sha, manifest): (String, Option<String>) = tx
            .sql("SELECT expected_sha256, manifest_sha256 FROM artifact_generations WHERE id = $1")
            .bind(generation)
            .one()
            .await?;
        // A directory artifact: its archive, and the manifest at its head
        // (every file's path, mode, size and sha256).
        let mut subjects = vec![Subject::sha256(name, &sha)];
        if let Some(m) = manifest {
            subjects.push(Subject::sha256(&format!("{name}/{}", kiln_provenance::statement::MANIFEST_SUBJECT), &m));
        }
        let st = statement::provenance(subjects, &facts);
        let (envelope, keyid) = attester
            .sign(&statement::to_bytes(&st))
            .map_err(|e| StoreError::Unavailable(format!("cannot sign the provenance of `{name}`: {e}")))?;
        tx.sql(
            "INSERT INTO artifact_provenance (generation_id, run_id, job_id, epoch, keyid, envelope, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (generation_id) DO NOTHING",
        )
        .bind(generation)
        .bind(&run.id)
        .bind(&job.id)
        .bind(epoch)
        .bind(&keyid)
        .bind(&envelope)
        .bind(now)
        .execute()
        .await?;
    }
    Ok(())
}

/// Names listed per outcome in a Test Result statement, at most.
const MAX_LISTED: usize = 10_000;

/// Sign and store the Test Result statement of `job`'s attempt `epoch`,
/// whose reports this completion bound: over the artifacts it restored (by
/// sha256), else over its commit; passed tests, quarantined failures as
/// warned, other failures and errors as failed (each list at most
/// [`MAX_LISTED`] names). Not signed: the transaction fails.
pub(crate) async fn write_test_result(
    store: &SqlStore,
    tx: &mut Tx,
    run: &RunRecord,
    job: &JobRecord,
    epoch: i64,
    quarantined: &std::collections::BTreeSet<String>,
    now: i64,
) -> Result<()> {
    let attester: Arc<dyn Attester> = store.attester().ok_or_else(|| {
        StoreError::Unavailable("no attestation key is loaded: test results are bound only with a signature".into())
    })?;
    let facts = facts(tx, &*attester, run, job, epoch, now).await?;
    let mut subjects: Vec<Subject> = facts
        .dependencies
        .iter()
        .filter(|d| d.uri.starts_with("kiln:runs/"))
        .filter_map(|d| Some(Subject { name: d.name.clone()?, digest: d.digest.clone() }))
        .collect();
    if subjects.is_empty() {
        subjects = facts
            .dependencies
            .iter()
            .filter(|d| d.digest.contains_key("gitCommit"))
            .map(|d| Subject { name: d.uri.clone(), digest: d.digest.clone() })
            .collect();
    }
    let results: Vec<(String, String)> = tx
        .sql("SELECT test_id, outcome FROM test_results WHERE job_id = $1 AND epoch = $2 ORDER BY report_id, seq")
        .bind(&job.id)
        .bind(epoch)
        .all()
        .await?;
    let (mut passed, mut warned, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for (id, outcome) in results {
        let list = match outcome.as_str() {
            "passed" => &mut passed,
            "failed" | "error" if quarantined.contains(&id) => &mut warned,
            "failed" | "error" => &mut failed,
            _ => continue,
        };
        if list.len() < MAX_LISTED {
            list.push(id);
        }
    }
    let st = statement::test_result(subjects, &facts, passed, warned, failed);
    let result = st.predicate["result"].as_str().unwrap_or("FAILED").to_string();
    let (envelope, keyid) = attester
        .sign(&statement::to_bytes(&st))
        .map_err(|e| StoreError::Unavailable(format!("cannot sign the test results of `{}`: {e}", job.name)))?;
    tx.sql(
        "INSERT INTO test_attestations (job_id, epoch, run_id, result, keyid, envelope, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id, epoch) DO NOTHING",
    )
    .bind(&job.id)
    .bind(epoch)
    .bind(&run.id)
    .bind(&result)
    .bind(&keyid)
    .bind(&envelope)
    .bind(now)
    .execute()
    .await?;
    Ok(())
}

/// `TestStore::test_attestation`: the newest attempt's of `job_id`.
pub(crate) async fn test_attestation(store: &SqlStore, job_id: &str) -> Result<Option<TestAttestationRecord>> {
    type Row = (String, i64, String, String, String, String, i64);
    let row: Option<Row> = store
        .reader()
        .await?
        .sql(
            "SELECT job_id, epoch, run_id, result, keyid, envelope, created_at FROM test_attestations \
             WHERE job_id = $1 ORDER BY epoch DESC LIMIT 1",
        )
        .bind(job_id)
        .optional()
        .await?;
    Ok(row.map(|(job_id, epoch, run_id, result, keyid, envelope, created_at)| TestAttestationRecord {
        job_id,
        epoch,
        run_id,
        result,
        keyid,
        envelope,
        created_at,
    }))
}

/// `ArtifactStore::artifact_provenance`.
pub(crate) async fn get(store: &SqlStore, generation_id: &str) -> Result<Option<ProvenanceRecord>> {
    type Row = (String, String, String, i64, String, String, i64);
    let row: Option<Row> = store
        .reader()
        .await?
        .sql(
            "SELECT generation_id, run_id, job_id, epoch, keyid, envelope, created_at FROM artifact_provenance \
             WHERE generation_id = $1",
        )
        .bind(generation_id)
        .optional()
        .await?;
    Ok(row.map(|(generation_id, run_id, job_id, epoch, keyid, envelope, created_at)| ProvenanceRecord {
        generation_id,
        run_id,
        job_id,
        epoch,
        keyid,
        envelope,
        created_at,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_leave_the_source_uri() {
        assert_eq!(super::without_credential("https://u:p@git.example.com/a/b.git"), "https://git.example.com/a/b.git");
        assert_eq!(super::without_credential("https://git.example.com/a@b"), "https://git.example.com/a@b");
        assert_eq!(super::without_credential("/srv/repo"), "/srv/repo");
    }
}
