//! `kiln env create|ls|show|set|rm`, `kiln approve` and `kiln reject`
//! (issue 46): deployment environments and decisions on a run's deploy.

use super::shared::{client, run_ref};
use crate::cli::{DecideArgs, DeploysArgs, EnvCommand, EnvRules, RingArgs, RingsArgs, RollbackArgs};
use kiln_api::exit;
use kiln_cmd::CmdResult;

/// A comma list as given: `''` clears it.
fn list(v: Option<Vec<String>>) -> Option<Vec<String>> {
    v.map(|l| l.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

fn describe(e: &kiln_api::Environment) -> String {
    let approvals = match (e.min_approvals, e.approvers.is_empty()) {
        (0, true) => "no approval".to_string(),
        (n, true) => format!("{n} approval(s) from any admin"),
        (n, false) => format!("{} approval(s) from {}", n.max(1), e.approvers.join(", ")),
    };
    let refs = if e.refs.is_empty() { "any ref".to_string() } else { e.refs.join(", ") };
    let mut s = format!("{approvals}; refs: {refs}");
    if e.prevent_self_review {
        s.push_str("; no self-approval");
    }
    if e.keep_deployments != kiln_api::DEFAULT_KEEP_DEPLOYMENTS {
        s.push_str(&format!("; keeps {} deployments", e.keep_deployments));
    }
    if e.wait_secs > 0 {
        s.push_str(&format!("; wait {}", super::shared::duration_text(e.wait_secs as i64 * 1000)));
    }
    if let Some(p) = &e.require_provenance {
        s.push_str(&format!("; provenance: {p}"));
    }
    s
}

pub(super) async fn run(cmd: EnvCommand) -> CmdResult {
    match cmd {
        EnvCommand::Create { name, rules, conn } => {
            let EnvRules {
                approvers,
                min_approvals,
                prevent_self_review,
                refs,
                wait,
                approval_expiry,
                keep_deployments,
                require_provenance,
            } = rules;
            let e = client(&conn)?
                .create_environment(&kiln_api::CreateEnvironment {
                    name,
                    approvers: list(approvers).unwrap_or_default(),
                    min_approvals,
                    prevent_self_review: prevent_self_review.unwrap_or(false),
                    refs: list(refs).unwrap_or_default(),
                    wait_secs: wait.map(|d| d.as_secs()),
                    approval_ttl_secs: approval_expiry.map(|d| d.as_secs()),
                    keep_deployments,
                    require_provenance,
                })
                .await?;
            kiln_cmd::outln!("environment {} created: {}", e.name, describe(&e));
            kiln_cmd::outln!("deploy to it with `environment: {}` on a job", e.name);
        }
        EnvCommand::Ls { json, conn } => {
            let l = client(&conn)?.list_environments().await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&l).expect("json"));
                return Ok(exit::OK);
            }
            if l.environments.is_empty() {
                eprintln!("no environments; create one with `kiln env create NAME`");
            }
            for e in &l.environments {
                kiln_cmd::outln!("{:<20} {}", e.name, describe(e));
            }
        }
        EnvCommand::Show { name, json, conn } => {
            let e = client(&conn)?.get_environment(&name).await?;
            if json {
                kiln_cmd::outln!("{}", serde_json::to_string_pretty(&e).expect("json"));
            } else {
                kiln_cmd::outln!("{}: {}", e.name, describe(&e));
            }
        }
        EnvCommand::Set { name, rules, conn } => {
            let EnvRules {
                approvers,
                min_approvals,
                prevent_self_review,
                refs,
                wait,
                approval_expiry,
                keep_deployments,
                require_provenance,
            } = rules;
            let u = kiln_api::UpdateEnvironment {
                approvers: list(approvers),
                min_approvals,
                prevent_self_review,
                refs: list(refs),
                wait_secs: wait.map(|d| d.as_secs()),
                approval_ttl_secs: approval_expiry.map(|d| d.as_secs()),
                keep_deployments,
                require_provenance,
            };
            if u == kiln_api::UpdateEnvironment::default() {
                return Err(kiln_cmd::usage(
                    "nothing to change: give --approvers, --min-approvals, --prevent-self-review, --refs, --wait, \
                     --approval-expiry, --keep-deployments or --require-provenance",
                ));
            }
            let e = client(&conn)?.update_environment(&name, &u).await?;
            kiln_cmd::outln!("environment {}: {}", e.name, describe(&e));
        }
        EnvCommand::Rm { name, conn } => {
            let e = client(&conn)?.delete_environment(&name).await?;
            kiln_cmd::outln!("environment {} removed", e.name);
        }
    }
    Ok(exit::OK)
}

/// `kiln approve` / `kiln reject`.
pub(super) async fn decide(a: DecideArgs, decision: &str) -> CmdResult {
    let run = run_ref(&a.run, a.repo.as_deref())?;
    let r = client(&a.conn)?
        .decide_deployment(
            &run,
            &kiln_api::DecideDeployment { environment: a.env, decision: decision.into(), comment: a.comment },
        )
        .await?;
    kiln_cmd::outln!("{} {}'s deployment to {} (as {})", r.decision, r.run_id, r.environment, r.by);
    Ok(exit::OK)
}

/// `kiln deploys ENV`.
pub(super) async fn deploys(a: DeploysArgs) -> CmdResult {
    let l = client(&a.conn)?.deployments(&a.env, a.limit).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&l).expect("json"));
        return Ok(exit::OK);
    }
    if l.deployments.is_empty() {
        eprintln!("no deployments to {} yet", a.env);
        return Ok(exit::OK);
    }
    let current = l.deployments.iter().position(|d| d.status == "success");
    for (i, d) in l.deployments.iter().enumerate() {
        let mark = if Some(i) == current { "*" } else { " " };
        let ring = d.ring.as_deref().map(|r| format!(" ring {r}")).unwrap_or_default();
        let rollback = d.rollback_of.as_deref().map(|r| format!("  rollback to {r}")).unwrap_or_default();
        let when = super::shared::rfc3339_ms(d.at_ms);
        let approved = if d.approvals.is_empty() { "-".to_string() } else { d.approvals.join(",") };
        kiln_cmd::outln!(
            "{mark} {when}  {} {:<8} {}#{} {}{ring} {}  by {}  approved {}{rollback}",
            d.id,
            d.status,
            d.repo,
            d.run_number,
            d.job,
            &d.commit_sha[..d.commit_sha.len().min(12)],
            d.triggered_by.as_deref().unwrap_or("-"),
            approved
        );
        for art in &d.artifacts {
            kiln_cmd::outln!("      {} (from {}) sha256:{}", art.name, art.from_job, art.sha256);
        }
    }
    if current.is_some() {
        kiln_cmd::outln!("* what {} runs now (its newest successful deployment)", a.env);
    }
    Ok(exit::OK)
}

/// `kiln rollback ENV [--to DEPLOYMENT]`.
pub(super) async fn rollback(a: RollbackArgs) -> CmdResult {
    let r = client(&a.conn)?.rollback(&a.env, &kiln_api::RollbackRequest { to: a.to, comment: a.comment }).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&r).expect("json"));
        return Ok(exit::OK);
    }
    kiln_cmd::outln!(
        "rolling {} back to deployment {} ({}#{} {}): run {} (#{}) deploys it again",
        a.env,
        r.to.id,
        r.to.repo,
        r.to.run_number,
        &r.to.commit_sha[..r.to.commit_sha.len().min(12)],
        r.run_id,
        r.run_number
    );
    for art in &r.to.artifacts {
        kiln_cmd::outln!("  {} (from {}) sha256:{}", art.name, art.from_job, art.sha256);
    }
    kiln_cmd::outln!("follow it with `kiln wait {}` or `kiln deploys {}`", r.run_id, a.env);
    Ok(exit::OK)
}

/// One promotion between rings, as a line.
fn ring_line(p: &kiln_api::RingPromotion) -> String {
    let rollback = match p.rollback.as_deref() {
        None => String::new(),
        Some(r) if r.starts_with("none") => format!("\n    no rollback: {}", r.trim_start_matches("none: ")),
        Some("asked") => "\n    rolling back…".to_string(),
        Some(r) => format!("\n    rolled back by run {r}"),
    };
    format!("{} → {} [{}] {}\n    {}{rollback}", p.from_ring, p.to_ring, p.state, p.job, p.message)
}

pub(super) async fn promote(a: RingArgs, pause: bool) -> CmdResult {
    let p = client(&a.conn)?.promote_run(&a.run, pause).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&p).expect("json"));
        return Ok(exit::OK);
    }
    kiln_cmd::outln!("{}", ring_line(&p));
    Ok(exit::OK)
}

pub(super) async fn rings(a: RingsArgs) -> CmdResult {
    let l = client(&a.conn)?.run_rings(&a.run).await?;
    if a.json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&l).expect("json"));
        return Ok(exit::OK);
    }
    if l.promotions.is_empty() {
        kiln_cmd::outln!("no promotion between rings has started in run {}", a.run);
    }
    for p in &l.promotions {
        kiln_cmd::outln!("{}", ring_line(p));
    }
    Ok(exit::OK)
}
