//! `kiln bench`: throughput and latency of a real Kiln deployment (embedded
//! server, in-process or real agent processes, real store), each figure
//! printed beside a bare baseline measured in the same invocation, as
//! `name: value` lines on stdout.
//!
//! A library the `kiln` binary calls; the suites that spawn agent
//! processes run `std::env::current_exe() agent …`, so they must run inside
//! the `kiln` binary.

mod args;
mod artifacts;
mod cache;
mod checkout;
mod containers;
mod control;
mod costs;
mod dispatch;
mod exec;
mod failover;
mod fairness;
mod logs;
mod memory;
mod otlp_sink;
mod provenance;
mod reports;
mod rollback;
mod util;
mod webhooks;

pub use args::BenchArgs;
use kiln_api::exit;
use kiln_cmd::Failure;

/// Run the suite(s) `a.suite` names; the exit code is the worst of theirs.
pub async fn run(a: BenchArgs) -> Result<i32, Failure> {
    let mut code = exit::OK;
    if matches!(a.suite.as_str(), "dispatch" | "all") {
        code = code.max(dispatch::run(&a).await?);
    }
    if matches!(a.suite.as_str(), "failover" | "all") {
        code = code.max(failover::run().await?);
    }
    if matches!(a.suite.as_str(), "artifacts" | "all") {
        code = code.max(artifacts::run(a.object_store.clone().unwrap_or_default(), a.database_url.as_deref()).await?);
    }
    if matches!(a.suite.as_str(), "logs" | "all") {
        code = code.max(logs::run(a.database_url.as_deref()).await?);
    }
    if a.suite == "control-plane" && !a.fit.is_empty() {
        costs::run_fit(&a.fit)?;
        return Ok(code);
    }
    if matches!(a.suite.as_str(), "control-plane" | "all") {
        code = code.max(
            control::run(control::ControlArgs {
                claims_per_s: a.claims_per_s,
                heartbeats_per_s: a.heartbeats_per_s,
                seconds: a.seconds,
                hold: a.hold,
                agents: 32,
                database_url: a.database_url.clone(),
                replicas: a.replicas,
                dispatch_offer: a.dispatch_offer.clone(),
            })
            .await?,
        );
    }
    if matches!(a.suite.as_str(), "webhooks" | "all") {
        code = code.max(webhooks::run(&a).await?);
    }
    if matches!(a.suite.as_str(), "reports" | "all") {
        code = code.max(reports::run()?);
    }
    if matches!(a.suite.as_str(), "provenance" | "all") {
        code = code.max(provenance::run()?);
    }
    if matches!(a.suite.as_str(), "rollback" | "all") {
        code = code.max(rollback::run().await?);
    }
    if matches!(a.suite.as_str(), "memory" | "all") {
        code = code.max(memory::run().await?);
    }
    // Not part of `all`: minutes of sleeping jobs.
    if a.suite == "fairness" {
        code = code.max(fairness::run(&a).await?);
    }
    // Not part of `all`: it writes and moves several GB.
    if a.suite == "cache" {
        code = code.max(cache::run(a.object_store.clone().unwrap_or_default()).await?);
    }
    // Not part of `all`: it writes and checks out repositories of 100,000 files.
    if a.suite == "checkout" {
        code = code.max(checkout::run(&a.checkout_files).await.map_err(kiln_cmd::Failure::from)?);
    }
    // Not part of `all`: it measures `kiln exec` processes of this binary.
    if a.suite == "exec" {
        code = code.max(exec::run().await?);
    }
    // Not part of `all`: it needs a container engine and a registry.
    if a.suite == "containers" {
        code = code.max(containers::run(&a).await?);
    }
    Ok(code)
}
