//! One door for acceptance (spec 000 §5–6; issue 40, item 8): every path
//! that starts a run — the API, a retry, a forge push or pull request, a
//! schedule tick — freezes it through the same checks, in the same order.
//! Which check applies to which trigger is this table; the server's
//! `acceptance::freeze` walks [`Check::ORDER`] and asks [`applies`].

/// What asked for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TriggerKind {
    /// `POST /v1/repos/{repo}/workflow-runs` (the CLI, the web page).
    Api,
    /// `POST /v1/workflow-runs/{run}/retry`: the parent's frozen definition.
    Retry,
    /// A push, from a webhook or found by polling.
    Push,
    /// A pull request (or merge request) webhook.
    PullRequest,
    /// A schedule tick.
    Schedule,
}

impl TriggerKind {
    pub const ALL: [TriggerKind; 5] =
        [TriggerKind::Api, TriggerKind::Retry, TriggerKind::Push, TriggerKind::PullRequest, TriggerKind::Schedule];
}

/// One step of freezing a run, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Check {
    /// Degradation (spec 004): no new run at `critical`, none with a large
    /// job at `degraded`.
    Admission,
    /// The team's queued-job cap and the server's saturation (issue 44):
    /// an API run over them is refused (429); a forge or schedule run waits
    /// and is created once there is room (never refused for a cap).
    Quota,
    /// `on:` allows `manual` (an API run with event `manual`).
    ManualAllowed,
    /// The declared inputs: unknown, ill-typed or missing required ones
    /// refused, defaults filled in (a trigger without inputs gets the
    /// defaults).
    Inputs,
    /// The inputs' sizes.
    InputLimits,
    /// The definition's size (jobs, steps, matrix expansion).
    DefinitionSize,
    /// The secrets a trusted run asks for exist (an untrusted run gets none,
    /// and is not told which exist).
    Secrets,
    /// Every environment a job deploys to exists and lets this ref deploy
    /// (issue 46): 422 naming the rule otherwise.
    Environments,
    /// The run-level concurrency group renders.
    Concurrency,
    /// `runs-on`, `timeout`, `image` templates evaluated over the run's data.
    Render,
    /// Job timeouts within the server's maximum, artifact expiry and the
    /// run timeout defaults written into the definition.
    Limits,
    /// Image tags pinned to digests (a retry copies its parent's pins).
    Images,
    /// The trust context decided from the trigger (`trust::decide`).
    Trust,
}

impl Check {
    pub const ORDER: [Check; 13] = [
        Check::Admission,
        Check::Quota,
        Check::ManualAllowed,
        Check::Inputs,
        Check::InputLimits,
        Check::DefinitionSize,
        Check::Secrets,
        Check::Environments,
        Check::Concurrency,
        Check::Render,
        Check::Limits,
        Check::Images,
        Check::Trust,
    ];
}

/// Whether `check` runs when `kind` asks for a run. A retry re-accepts a
/// definition that was frozen once already: its inputs, rendering, limits
/// and image pins are its parent's and are not redone (a moved tag or a
/// changed server default must not change what a retry runs); every other
/// check applies to every trigger.
pub fn applies(kind: TriggerKind, check: Check) -> bool {
    match check {
        Check::ManualAllowed => kind == TriggerKind::Api,
        Check::Inputs | Check::Render | Check::Limits | Check::Images => kind != TriggerKind::Retry,
        Check::Admission
        | Check::Quota
        | Check::InputLimits
        | Check::DefinitionSize
        | Check::Secrets
        | Check::Environments
        | Check::Concurrency
        | Check::Trust => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every trigger kind × every check, literally.
    #[test]
    fn the_acceptance_table() {
        use Check::*;
        // (check, [Api, Retry, Push, PullRequest, Schedule])
        let table: [(Check, [bool; 5]); 13] = [
            (Admission, [true, true, true, true, true]),
            (Quota, [true, true, true, true, true]),
            (ManualAllowed, [true, false, false, false, false]),
            (Inputs, [true, false, true, true, true]),
            (InputLimits, [true, true, true, true, true]),
            (DefinitionSize, [true, true, true, true, true]),
            (Secrets, [true, true, true, true, true]),
            (Environments, [true, true, true, true, true]),
            (Concurrency, [true, true, true, true, true]),
            (Render, [true, false, true, true, true]),
            (Limits, [true, false, true, true, true]),
            (Images, [true, false, true, true, true]),
            (Trust, [true, true, true, true, true]),
        ];
        assert_eq!(table.map(|(c, _)| c), Check::ORDER, "the table lists every check in order");
        for (check, row) in table {
            for (kind, want) in TriggerKind::ALL.into_iter().zip(row) {
                assert_eq!(applies(kind, check), want, "{check:?} for {kind:?}");
            }
        }
    }
}
