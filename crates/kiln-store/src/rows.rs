//! Row mapping, in one place: the column lists the store selects and how a
//! row becomes a record (`*_from_row`), plus the loaders every transaction
//! family shares (`load_run`, `load_job`). Records are plain structs of
//! `model.rs`; nothing derives database traits on domain types.

use crate::db::{Exec, Row};
use crate::dialect::Sql;
use crate::error::{Result, StoreError, parse_enum};
use crate::model::{
    AgentRecord, AttemptRecord, BoundArtifact, GenerationRecord, JobRecord, RepoForge, RepoRecord, RunRecord,
    RunSummaryRecord,
};
use kiln_core::failure::FailureClass;

/// A run with its repository's name; the run table is `r`, repos `p`.
pub(crate) const RUN_COLS: &str = "r.id, r.repo_id, p.name AS repo_name, r.status, r.commit_sha, r.git_ref, \
    r.event, r.trust, r.workflow_path, r.workflow_hash, r.definition, r.inputs, r.actor, r.parent_run_id, r.cancel_version, \
    r.message, r.created_at, r.finished_at, r.traceparent, r.commit_title, r.commit_author, r.held, r.run_number, r.pull_request_title, p.team AS team, r.priority, r.rollback_of";

/// A run as listed (no definition, no inputs); tables as in [`RUN_COLS`].
pub(crate) const RUN_SUMMARY_COLS: &str = "r.id, r.repo_id, p.name AS repo_name, r.status, r.commit_sha, r.git_ref, \
    r.event, r.trust, r.workflow_path, r.workflow_hash, r.actor, r.parent_run_id, r.message, r.created_at, r.finished_at, \
    r.run_number, r.commit_title, r.pull_request_title, p.team AS team, r.priority";

pub(crate) const JOB_COLS: &str = "id, run_id, job_index, name, status, needs, class_key, dispatch_generation, \
    current_epoch, next_attempt_at, image_digest, message, started_at, finished_at, failure_retries, infra_retries, \
    max_failure_retries, cancel_requested, cache_result, image_agent, group_waiting";

pub(crate) const ATTEMPT_COLS: &str = "job_id, epoch, agent_id, session_id, runner, lease_deadline, outcome, exit_code, message, started_at, finished_at, steps, failure_class, \
    released_at, release_evidence, cleanup_error";

/// A generation; the table is `g`.
/// `object_key`: where the bytes are read (the content object once they
/// moved there); `session_key`: the key they were uploaded under.
pub(crate) const GEN_COLS: &str = "g.id, g.run_id, g.job_id, g.epoch, g.name, \
    COALESCE(g.content_key, g.object_key) AS object_key, g.object_key AS session_key, g.expected_size, \
    g.expected_sha256, g.part_size, g.state, g.created_at, g.upload_id, g.kind";
/// The binding's columns beside [`GEN_COLS`] for [`bound_from_row`].
pub(crate) const BINDING_COLS: &str = "j.name AS job_name, b.job_id AS bound_job_id, b.expires_at, b.expired_at";

/// What the heartbeat fast path returns for a live lease it extended: the new
/// deadline, the job's `cancel_requested`, the run's status.
pub(crate) type LeaseExtended = (i64, i64, String);

/// A job of a parent run that a retry or a rollback pins (`tx::accept`).
pub(crate) struct PinnedFrom {
    pub(crate) job_id: String,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
}

/// The jobs of run `parent` as a retry or a rollback decides over them
/// (kiln-core's [`kiln_core::retry::ParentJob`], in job order, with each
/// one's index), and what pinning each would copy, by name.
pub(crate) async fn parent_jobs(
    ex: &mut impl Exec,
    parent: &str,
) -> Result<(Vec<(i64, kiln_core::retry::ParentJob)>, std::collections::HashMap<String, PinnedFrom>)> {
    let rows = ex
        .sql("SELECT id, name, job_index, status, needs, started_at, finished_at FROM jobs WHERE run_id = $1 ORDER BY job_index")
        .bind(parent)
        .fetch_all()
        .await?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut from = std::collections::HashMap::new();
    for r in &rows {
        let name: String = r.get("name")?;
        jobs.push((
            r.get("job_index")?,
            kiln_core::retry::ParentJob {
                name: name.clone(),
                status: parse_enum(r.str("status")?)?,
                needs: serde_json::from_str(r.str("needs")?).unwrap_or_default(),
            },
        ));
        from.insert(
            name,
            PinnedFrom { job_id: r.get("id")?, started_at: r.get("started_at")?, finished_at: r.get("finished_at")? },
        );
    }
    Ok((jobs, from))
}

/// A new row id: time-ordered (UUIDv7), so ids sort by creation.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A JSON column (definition, inputs, needs).
fn json<T: serde::de::DeserializeOwned>(s: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|e| StoreError::Invalid(e.to_string()))
}

pub(crate) fn run_from_row(row: &Row) -> Result<RunRecord> {
    run_from_row_as(row, "")
}

/// [`RUN_COLS`] with every column named `run_<name>`, for a statement
/// that reads a run beside another table's columns of the same names
/// ([`run_from_row_as`] with `run_`); the tables as in [`RUN_COLS`].
pub(crate) fn run_cols_as_run() -> String {
    RUN_COLS
        .split(',')
        .map(|c| {
            let c = c.trim();
            match c.split_once(" AS ") {
                Some((expr, name)) => format!("{expr} AS run_{name}"),
                None => format!("{c} AS run_{}", c.rsplit('.').next().unwrap_or(c)),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A run whose columns are named `{prefix}<name>`.
pub(crate) fn run_from_row_as(row: &Row, prefix: &str) -> Result<RunRecord> {
    let name = |n: &str| -> String { format!("{prefix}{n}") };
    Ok(RunRecord {
        id: row.get(&name("id"))?,
        repo_id: row.get(&name("repo_id"))?,
        repo_name: row.get(&name("repo_name"))?,
        status: parse_enum(row.str(&name("status"))?)?,
        commit_sha: row.get(&name("commit_sha"))?,
        git_ref: row.get(&name("git_ref"))?,
        event: row.get(&name("event"))?,
        trust: row.get(&name("trust"))?,
        workflow_path: row.get(&name("workflow_path"))?,
        workflow_hash: row.get(&name("workflow_hash"))?,
        definition: json(row.str(&name("definition"))?)?,
        inputs: json(row.str(&name("inputs"))?)?,
        actor: row.get(&name("actor"))?,
        parent_run_id: row.get(&name("parent_run_id"))?,
        cancel_version: row.get(&name("cancel_version"))?,
        message: row.get(&name("message"))?,
        created_at: row.get(&name("created_at"))?,
        finished_at: row.get(&name("finished_at"))?,
        traceparent: row.get(&name("traceparent"))?,
        commit_title: row.get(&name("commit_title"))?,
        commit_author: row.get(&name("commit_author"))?,
        held: row.get::<i64>(&name("held"))? != 0,
        number: row.get(&name("run_number"))?,
        pull_request_title: row.get(&name("pull_request_title"))?,
        team: row.get(&name("team"))?,
        priority: row.get(&name("priority"))?,
        rollback_of: row.get(&name("rollback_of"))?,
    })
}

pub(crate) fn run_summary_from_row(row: &Row) -> Result<RunSummaryRecord> {
    Ok(RunSummaryRecord {
        id: row.get("id")?,
        repo_id: row.get("repo_id")?,
        repo_name: row.get("repo_name")?,
        status: parse_enum(row.str("status")?)?,
        commit_sha: row.get("commit_sha")?,
        git_ref: row.get("git_ref")?,
        event: row.get("event")?,
        trust: row.get("trust")?,
        workflow_path: row.get("workflow_path")?,
        workflow_hash: row.get("workflow_hash")?,
        actor: row.get("actor")?,
        parent_run_id: row.get("parent_run_id")?,
        message: row.get("message")?,
        created_at: row.get("created_at")?,
        finished_at: row.get("finished_at")?,
        number: row.get("run_number")?,
        commit_title: row.get("commit_title")?,
        pull_request_title: row.get("pull_request_title")?,
        team: row.get("team")?,
        priority: row.get("priority")?,
    })
}

pub(crate) fn job_from_row(row: &Row) -> Result<JobRecord> {
    Ok(JobRecord {
        id: row.get("id")?,
        run_id: row.get("run_id")?,
        index: row.get("job_index")?,
        name: row.get("name")?,
        status: parse_enum(row.str("status")?)?,
        needs: json(row.str("needs")?)?,
        class_key: row.get("class_key")?,
        dispatch_generation: row.get("dispatch_generation")?,
        current_epoch: row.get("current_epoch")?,
        next_attempt_at: row.get("next_attempt_at")?,
        image_digest: row.get("image_digest")?,
        image_agent: row.get("image_agent")?,
        message: row.get("message")?,
        started_at: row.get("started_at")?,
        finished_at: row.get("finished_at")?,
        cancel_requested: row.get::<i64>("cancel_requested")? != 0,
        cache_result: row.get("cache_result")?,
        group_waiting: row.get::<i64>("group_waiting")? != 0,
    })
}

/// A job's retry budget and stop request (columns of [`JOB_COLS`] that the
/// public record does not carry).
pub(crate) struct JobBudget {
    pub(crate) failure_retries: i64,
    pub(crate) infra_retries: i64,
    pub(crate) max_failure_retries: i64,
    /// The job alone was asked to stop (fail-fast of a matrix sibling).
    pub(crate) cancel_requested: bool,
}

pub(crate) fn budget_from_row(row: &Row) -> Result<JobBudget> {
    Ok(JobBudget {
        failure_retries: row.get("failure_retries")?,
        infra_retries: row.get("infra_retries")?,
        max_failure_retries: row.get("max_failure_retries")?,
        cancel_requested: row.get::<i64>("cancel_requested")? != 0,
    })
}

pub(crate) fn attempt_from_row(row: &Row) -> Result<AttemptRecord> {
    Ok(AttemptRecord {
        job_id: row.get("job_id")?,
        epoch: row.get("epoch")?,
        agent_id: row.get("agent_id")?,
        session_id: row.get("session_id")?,
        runner: row.get("runner")?,
        lease_deadline: row.get("lease_deadline")?,
        outcome: parse_enum(row.str("outcome")?)?,
        exit_code: row.get("exit_code")?,
        message: row.get("message")?,
        started_at: row.get("started_at")?,
        finished_at: row.get("finished_at")?,
        steps: row.get("steps")?,
        failure_class: row.get::<Option<String>>("failure_class")?.as_deref().and_then(FailureClass::parse),
        released_at: row.get("released_at")?,
        release_evidence: row.get("release_evidence")?,
        cleanup_error: row.get("cleanup_error")?,
    })
}

pub(crate) fn repo_from_row(row: &Row) -> Result<RepoRecord> {
    repo_from_row_as(row, "")
}

/// The name a repository's clone credential is kept under in its secrets
/// (sealed like them; `@` keeps it out of listings, workflows and the API).
pub const CLONE_CREDENTIAL: &str = "@clone-credential";

/// The columns of `repos` a [`RepoRecord`] is read from.
const REPO_FIELDS: [&str; 16] = [
    "id",
    "name",
    "clone_url",
    "webhook_secret",
    "created_at",
    "secret_pools",
    "forge",
    "forge_url",
    "forge_repo",
    "forge_token",
    "default_branch",
    "protected_refs",
    "pull_request_trust",
    "poll_interval_ms",
    "is_public",
    "team",
];

/// The columns of the repository `table` a [`RepoRecord`] is read from,
/// each named `{prefix}<name>`, with its sealed clone credential and its
/// team's queue cap.
pub(crate) fn repo_cols(table: &str, prefix: &str) -> String {
    let mut cols: Vec<String> = REPO_FIELDS.iter().map(|f| format!("{table}.{f} AS {prefix}{f}")).collect();
    cols.push(format!(
        "(SELECT s.value FROM secrets s WHERE s.repo_id = {table}.id AND s.name = '{credential}') \
         AS {prefix}clone_credential",
        credential = CLONE_CREDENTIAL
    ));
    cols.push(format!("(SELECT t.max_queued FROM teams t WHERE t.name = {table}.team) AS {prefix}team_max_queued"));
    cols.join(", ")
}

/// A repository whose columns ([`repo_cols`]) are named `{prefix}<name>`.
pub(crate) fn repo_from_row_as(row: &Row, prefix: &str) -> Result<RepoRecord> {
    let name = |n: &str| -> String { format!("{prefix}{n}") };
    Ok(RepoRecord {
        id: row.get(&name("id"))?,
        name: row.get(&name("name"))?,
        clone_url: row.get(&name("clone_url"))?,
        webhook_secret: row.get(&name("webhook_secret"))?,
        created_at: row.get(&name("created_at"))?,
        secret_pools: serde_json::from_str(row.str(&name("secret_pools"))?).unwrap_or_default(),
        forge: RepoForge {
            forge: row.get(&name("forge"))?,
            forge_url: row.get(&name("forge_url"))?,
            forge_repo: row.get(&name("forge_repo"))?,
            forge_token: row.get(&name("forge_token"))?,
            default_branch: row.get(&name("default_branch"))?,
            protected_refs: serde_json::from_str(row.str(&name("protected_refs"))?).unwrap_or_default(),
            pull_request_trust: row.get(&name("pull_request_trust"))?,
            poll_interval_ms: row.get(&name("poll_interval_ms"))?,
        },
        public: row.get::<i64>(&name("is_public"))? != 0,
        team: row.get(&name("team"))?,
        clone_credential: row.get(&name("clone_credential"))?,
        team_max_queued: row.get::<Option<i64>>(&name("team_max_queued"))?.and_then(|n| u32::try_from(n).ok()),
    })
}

pub(crate) fn agent_from_row(row: &Row) -> Result<AgentRecord> {
    Ok(AgentRecord {
        id: row.get("id")?,
        name: row.get("name")?,
        labels: serde_json::from_str(row.str("labels")?).unwrap_or_default(),
        max_jobs: row.get::<i64>("max_jobs")? as u32,
        session_id: row.get("session_id")?,
        pool: row.get("pool")?,
        created_at: row.get("created_at")?,
        last_seen_at: row.get("last_seen_at")?,
        version: row.get("version")?,
        draining: row.get::<i64>("draining")? != 0,
        executor: kiln_core::claim::Executor::reported(Some(row.str("executor")?)),
    })
}

pub(crate) fn gen_from_row(row: &Row) -> Result<GenerationRecord> {
    Ok(GenerationRecord {
        id: row.get("id")?,
        run_id: row.get("run_id")?,
        job_id: row.get("job_id")?,
        epoch: row.get("epoch")?,
        name: row.get("name")?,
        object_key: row.get("object_key")?,
        expected_size: row.get("expected_size")?,
        expected_sha256: row.get("expected_sha256")?,
        part_size: row.get("part_size")?,
        state: row.get("state")?,
        created_at: row.get("created_at")?,
        upload_id: row.get("upload_id")?,
        kind: row.get("kind")?,
        session_key: row.get("session_key")?,
    })
}

/// A generation with its binding's `job_name` column.
pub(crate) fn bound_from_row(row: &Row) -> Result<BoundArtifact> {
    Ok(BoundArtifact {
        // The binding's job: a pinned job of a retry binds a generation of
        // its parent run's job (`generation.job_id`).
        job_id: row.get("bound_job_id")?,
        job_name: row.get("job_name")?,
        name: row.get("name")?,
        generation: gen_from_row(row)?,
        expires_at: row.get("expires_at")?,
        expired_at: row.get("expired_at")?,
    })
}

pub(crate) async fn load_run(ex: &mut impl Exec, run_id: &str) -> Result<RunRecord> {
    static SQL: Sql =
        Sql::new(|_| format!("SELECT {RUN_COLS} FROM runs r JOIN repos p ON p.id = r.repo_id WHERE r.id = $1"));
    let row = ex.sql(&SQL).bind(run_id).fetch_optional().await?;
    run_from_row(&row.ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?)
}

pub(crate) async fn load_job(ex: &mut impl Exec, job_id: &str) -> Result<(JobRecord, JobBudget)> {
    static SQL: Sql = Sql::new(|_| format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1"));
    let row = ex.sql(&SQL).bind(job_id).fetch_optional().await?;
    let row = row.ok_or_else(|| StoreError::NotFound(format!("job {job_id}")))?;
    Ok((job_from_row(&row)?, budget_from_row(&row)?))
}
