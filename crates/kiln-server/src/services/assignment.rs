//! The assignment of a claimed attempt (spec 000 §7): everything the agent
//! needs to run it, immutable for the attempt — steps, environment (with the
//! run's inputs as `KILN_INPUT_*`), the pinned image, artifacts to publish
//! and restore, lease timing — and, for a run whose trust allows it (§14,
//! invariant 10), the secrets the job asked for.

use crate::error::ApiResult;
use crate::state::AppState;
use kiln_api as api;
use kiln_api::trace::TraceParent;
use kiln_core::Trust;
use kiln_store::{AgentRecord, ClaimedAttempt, NewAudit, RunOutputs};
use kiln_workflow::{ConditionContext, Image, Step};
use std::collections::BTreeMap;
use tracing::Instrument;

/// The assignment from the claimed attempt alone: no clone URL, no secrets.
/// `outputs`: what the run's jobs bound so far (`needs.<job>.outputs.*`).
pub(crate) fn build(lease_ttl_ms: u64, c: &ClaimedAttempt, outputs: RunOutputs) -> api::Assignment {
    let def = &c.run.definition.jobs[c.job.index as usize];
    // Expressions see only the run's frozen data (spec 000 §5) and the
    // outputs bound by the completions of the jobs it needs (§9).
    let ctx = ConditionContext {
        needs_outputs: outputs,
        commit: c.run.commit_context(),
        ..c.run.definition.expr_context(&c.run.event, c.run.git_ref.as_deref(), &c.run.inputs)
    };
    let mut env: BTreeMap<String, String> = def.env.iter().map(|(k, v)| (k.clone(), text(v, &ctx))).collect();
    for (k, v) in &c.run.inputs {
        env.insert(format!("KILN_INPUT_{}", input_var(k)), v.clone());
    }
    // An image read from outputs is evaluated now, from the outputs bound
    // by the needs' completions; everything else was pinned at acceptance.
    let mut image = def.image.as_ref().and_then(|i| match i {
        Image::Ref { reference } => Some(reference.clone()),
        Image::Dockerfile { .. } => None,
    });
    let mut image_digest = c.job.image_digest.clone();
    let mut image_error = None;
    if let Some(reference) = image.clone().filter(|r| r.contains("${{")) {
        match kiln_workflow::render_claimed_image(&reference, &ctx) {
            Ok((r, d)) => (image, image_digest) = (Some(r), Some(d)),
            Err(e) => image_error = Some(e),
        }
    }
    api::Assignment {
        run_id: c.run.id.clone(),
        job_id: c.job.id.clone(),
        job_name: c.job.name.clone(),
        epoch: c.epoch,
        repo: c.run.repo_name.clone(),
        clone_url: String::new(),
        clone_credential: None,
        commit_sha: c.run.commit_sha.clone(),
        steps: def.steps.iter().map(|s| step(s, &ctx)).collect(),
        env,
        timeout_secs: def.timeout_secs,
        hang_after_secs: Some(def.hang_after_secs.unwrap_or(kiln_workflow::HANG_AFTER_SECS)),
        hang_kill_after_secs: Some(def.hang_kill_after_secs.unwrap_or(kiln_workflow::HANG_KILL_AFTER_SECS)),
        image,
        image_digest,
        image_error,
        image_build: def.image.as_ref().and_then(|i| match i {
            Image::Dockerfile { path, context } => {
                Some(api::ImageBuild { dockerfile: path.clone(), context: context.clone() })
            }
            Image::Ref { .. } => None,
        }),
        build_registry: None,
        size: def.runs_on.get("size").cloned(),
        publish: def
            .artifacts
            .publish
            .iter()
            .map(|p| api::PublishSpec { name: p.name.clone(), path: p.path.clone() })
            .collect(),
        restore: def
            .artifacts
            .restore
            .iter()
            .map(|r| api::RestoreSpec { from_job: r.from_job.clone(), name: r.name.clone(), path: r.path.clone() })
            .collect(),
        lease_ttl_ms,
        heartbeat_interval_ms: (lease_ttl_ms / 3).max(50),
        secrets: BTreeMap::new(),
        attempt_token: String::new(),
        cache: def.cache.as_ref().map(|cache| {
            let (write_namespace, read_namespaces) = cache_namespaces(c);
            api::CacheSpec {
                kind: cache.kind.clone(),
                version: cache.version.clone(),
                inputs: cache.inputs.clone(),
                paths: cache.paths.clone(),
                restore_prefix: cache.restore_prefix,
                write_namespace,
                read_namespaces,
            }
        }),
        services: def
            .services
            .iter()
            .map(|(name, s)| api::ServiceSpec {
                name: name.clone(),
                image: s.image.clone(),
                digest: s.digest.clone(),
                env: s.env.clone(),
                ports: s.ports.clone(),
                command: s.command.clone(),
                health_cmd: s.health.as_ref().map(|h| h.cmd.clone()),
                health_interval_ms: s.health.as_ref().map_or(0, |h| h.interval_ms),
                health_retries: s.health.as_ref().map_or(0, |h| h.retries),
            })
            .collect(),
        outputs: def.outputs.clone(),
        reports: def.reports.as_ref().map(|r| api::ReportsSpec { junit: r.junit.clone(), tap: r.tap.clone() }),
        quarantine: Vec::new(),
        shard_token: String::new(),
        traceparent: None,
        trusted: c.run.trust.parse::<Trust>().is_ok_and(|t| t == Trust::Trusted),
        checkout: def.checkout.as_ref().map(|k| api::CheckoutSpec {
            // A workspace brought to another commit is only ever a trusted
            // run's (issue 47).
            reuse: k.reuse && c.run.trust.parse::<Trust>().is_ok_and(|t| t == Trust::Trusted),
            depth: k.depth,
            filter: k.filter.clone(),
            sparse: k.sparse.clone(),
        }),
    }
}

/// A text with `${{ }}` parts (an `env` value, a step name) evaluated. A
/// definition frozen before expressions were checked at parse time may hold
/// one that does not evaluate: it is kept as written, as it was then.
fn text(template: &str, ctx: &ConditionContext) -> String {
    if !template.contains("${{") {
        return template.to_string();
    }
    kiln_workflow::render_group(template, ctx).unwrap_or_else(|_| template.to_string())
}

/// One step as the agent runs it: `${{ }}` in `run` turned into references
/// to variables holding the values (never pasted into the script), `env`
/// and `name` evaluated, `if:` decided for both outcomes of the earlier
/// steps, the shell resolved to a program.
fn step(s: &Step, ctx: &ConditionContext) -> api::StepSpec {
    let (run, values) = if s.run.contains("${{") {
        // A definition frozen before a rule existed may hold a `${{ }}`
        // where its value could run as code: the step fails saying so, and
        // the value is never handed to it.
        kiln_workflow::render_run(&s.run, ctx).unwrap_or_else(|e| {
            (
                "printf 'kiln: this step was not run: %s\\n' \"$KILN_EXPR_ERROR\" >&2; exit 2".to_string(),
                BTreeMap::from([("KILN_EXPR_ERROR".to_string(), e)]),
            )
        })
    } else {
        (s.run.clone(), BTreeMap::new())
    };
    let mut env: BTreeMap<String, String> = s.env.iter().map(|(k, v)| (k.clone(), text(v, ctx))).collect();
    env.extend(values);
    // A condition that does not evaluate (it was checked at parse time)
    // runs the step in neither case rather than guessing.
    let (run_after_success, run_after_failure) =
        kiln_workflow::step_gate(s.condition.as_deref(), ctx).unwrap_or((false, false));
    api::StepSpec {
        name: s.name.as_deref().map(|n| text(n, ctx)),
        run,
        env,
        run_after_success,
        run_after_failure,
        condition: s.condition.clone(),
        working_directory: s.working_directory.clone(),
        timeout_secs: s.timeout_secs,
        continue_on_error: s.continue_on_error,
        shell: kiln_workflow::shell_argv(s.shell.as_deref()),
    }
}

/// The cache namespaces of the attempt's run (spec 000 §10, §14), from the
/// trust decided at acceptance: a trusted run writes and reads `protected`;
/// an untrusted one writes only its own `untrusted/<ref or run>` and reads
/// that, then `protected`. Returns (write, read in lookup order).
pub(crate) fn cache_namespaces(c: &ClaimedAttempt) -> (String, Vec<String>) {
    namespaces_of(&c.run.trust, c.run.git_ref.as_deref(), &c.run.id)
}

/// `cache_namespaces` from a run's trust, ref and id (an unreadable trust
/// is untrusted).
pub(crate) fn namespaces_of(trust: &str, git_ref: Option<&str>, run_id: &str) -> (String, Vec<String>) {
    if trust.parse::<Trust>().is_ok_and(Trust::may_read_secrets) {
        return ("protected".into(), vec!["protected".into()]);
    }
    let scope = git_ref.map(str::to_string).unwrap_or_else(|| format!("run/{run_id}"));
    let own = format!("untrusted/{scope}");
    (own.clone(), vec![own, "protected".into()])
}

/// An input name as an environment variable suffix: ASCII letters and
/// digits upper-cased, anything else `_`.
fn input_var(name: &str) -> String {
    name.chars().map(|ch| if ch.is_ascii_alphanumeric() { ch.to_ascii_uppercase() } else { '_' }).collect()
}

/// Whether the attempt's run may be handed secrets: only a run accepted
/// as trusted (an unreadable trust context is treated as untrusted).
pub(crate) fn may_read_secrets(c: &ClaimedAttempt) -> bool {
    c.run.trust.parse::<Trust>().is_ok_and(Trust::may_read_secrets)
}

/// What the claiming agent gets for an attempt.
pub(crate) enum Handout {
    Assignment(Box<api::Assignment>),
    /// The job asks for secrets of a trusted run, and the agent's pool is
    /// not one the repository hands its secrets to: the attempt must not
    /// run there (the message says why).
    Withheld(String),
}

/// The full assignment: [`build`] plus the clone URL, the attempt's own
/// token and, for a trusted run on an agent of an allowed pool, the values
/// of the secrets the job asked for (each handout is audited).
///
/// The claim is a span of the run's trace (issue 19), a child of its
/// acceptance; the assignment carries its context to the agent.
pub(crate) async fn for_claim(state: &AppState, agent: &AgentRecord, c: &ClaimedAttempt) -> ApiResult<Handout> {
    let parent = c.run.traceparent.as_deref().and_then(TraceParent::parse);
    let span = tracing::info_span!(
        "claim",
        run_id = %c.run.id,
        job_id = %c.job.id,
        job = %c.job.name,
        epoch = c.epoch,
        agent = %agent.name,
        trace_id = tracing::field::Empty
    );
    let trace = kiln_api::trace::enter(&span, parent);
    let mut handout = async {
        tracing::info!("claimed");
        handout(state, agent, c).await
    }
    .instrument(span)
    .await?;
    if let Handout::Assignment(a) = &mut handout {
        a.traceparent = Some(trace.to_string());
    }
    Ok(handout)
}

async fn handout(state: &AppState, agent: &AgentRecord, c: &ClaimedAttempt) -> ApiResult<Handout> {
    let def = &c.run.definition.jobs[c.job.index as usize];
    // Only a job whose needs declare outputs reads them (one query).
    let reads_outputs =
        def.needs.iter().any(|n| c.run.definition.jobs.iter().any(|j| &j.name == n && !j.outputs.is_empty()));
    let outputs = if reads_outputs { state.store.run_outputs(&c.run.id).await? } else { RunOutputs::new() };
    let mut a = build(state.config.lease_ttl.as_millis() as u64, c, outputs);
    if a.image_build.is_some() {
        a.build_registry = state.config.build_registry.clone();
    }
    // Read with the claim (a claim request answered again reads it now).
    let repo = match &c.repo {
        Some(r) => r.clone(),
        None => state.store.get_repo(&c.run.repo_id).await?,
    };
    let remote = crate::services::repos::remote(state, &repo).await?;
    a.clone_url = remote.url;
    a.clone_credential = remote.credential;
    a.attempt_token = state.agent_keys.attempt_token(&c.job.id, c.epoch);
    if def.reports.is_some() {
        // Issue 43: the tests quarantined now ($KILN_QUARANTINE), and the
        // capability its steps' `kiln tests next` calls with.
        a.quarantine = state.store.quarantined_ids(&repo.id).await?;
        a.shard_token = state.agent_keys.shard_token(&c.job.id, c.epoch);
    }
    if !def.secrets.is_empty() && may_read_secrets(c) {
        if !repo.secret_pools.contains(&agent.pool) {
            return Ok(Handout::Withheld(format!(
                "job `{}` needs secrets of repository `{}`, which are not handed to agent pool `{}` (allowed: {})",
                c.job.name,
                repo.name,
                agent.pool,
                if repo.secret_pools.is_empty() { "none".to_string() } else { repo.secret_pools.join(", ") }
            )));
        }
        for (name, stored) in state.store.secret_values(&c.run.repo_id, &def.secrets).await? {
            match state.secrets.open(&c.run.repo_id, &name, &stored) {
                Ok(v) => {
                    a.secrets.insert(name, v);
                }
                Err(e) => return Ok(Handout::Withheld(format!("secret {name} of `{}`: {e}", repo.name))),
            }
        }
        // Issue 46: a deploy job (ready only once its environment's gate
        // opened) gets its environment's secrets too; the environment's
        // value wins over the repository's of the same name.
        let mut target = repo.name.clone();
        if let Some(env) = &def.environment {
            match crate::services::env_secrets::values(state, &env.name, &def.secrets).await? {
                Ok(values) => {
                    for (name, v) in values {
                        a.secrets.insert(name, v);
                    }
                }
                Err(why) => return Ok(Handout::Withheld(why)),
            }
            target = format!("{target}+env:{}", env.name);
        }
        let audit = NewAudit {
            actor: format!("agent:{}", agent.id),
            action: "secret.read".into(),
            target: format!("{target}/{}", a.secrets.keys().cloned().collect::<Vec<_>>().join(",")),
            detail: format!("run {} job {} epoch {}", c.run.id, c.job.name, c.epoch),
        };
        state.store.audit(&audit).await?;
    }
    if let Some(req) = &def.id_token
        && may_read_secrets(c)
    {
        // Defence in depth (the claim placed the job by the same rule,
        // invariant 12): an identity token goes only to the pools the
        // repository hands its secrets to.
        if !repo.secret_pools.contains(&agent.pool) {
            return Ok(Handout::Withheld(format!(
                "job `{}` asks for an identity token of repository `{}`, which is not handed to agent pool `{}` \
                 (allowed: {})",
                c.job.name,
                repo.name,
                agent.pool,
                if repo.secret_pools.is_empty() { "none".to_string() } else { repo.secret_pools.join(", ") }
            )));
        }
        let issuer = state.issuer_url();
        let git_ref = c.run.git_ref.clone().unwrap_or_else(|| c.run.commit_sha.clone());
        let claims = crate::oidc::Claims {
            issuer: &issuer,
            audience: req.audience.as_deref().unwrap_or(&issuer),
            repo: &repo.name,
            git_ref: &git_ref,
            sha: &c.run.commit_sha,
            event: &c.run.event,
            run_id: &c.run.id,
            job: &c.job.name,
            trust: &c.run.trust,
            environment: def.environment.as_ref().map(|e| e.name.as_str()),
            ttl: std::time::Duration::from_secs(def.timeout_secs.unwrap_or(u64::MAX / 2)),
        };
        let token = state.oidc.mint(&claims).map_err(|e| crate::error::ApiErr::internal(format!("{e:#}")))?;
        // Delivered like a secret: an environment variable, masked in logs.
        a.secrets.insert(ID_TOKEN_VAR.to_string(), token);
        let audit = NewAudit {
            actor: format!("agent:{}", agent.id),
            action: "id-token.issue".into(),
            target: format!("{} aud {}", claims.audience, repo.name),
            detail: format!("run {} job {} epoch {}", c.run.id, c.job.name, c.epoch),
        };
        state.store.audit(&audit).await?;
    }
    Ok(Handout::Assignment(Box::new(a)))
}

/// The environment variable a job's identity token is in.
pub(crate) const ID_TOKEN_VAR: &str = "KILN_ID_TOKEN";
