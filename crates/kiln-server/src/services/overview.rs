//! `GET /v1/overview`: what `kiln top` shows (spec 000 §15: reservations,
//! occupancy and the eligible queue by compatibility class, side by side).
//! Every read goes over live rows only (ready jobs, running attempts, the
//! agents), as the `/metrics` gauges do; nothing here decides anything.

use super::access::list_agents;
use crate::error::ApiResult;
use crate::state::AppState;
use kiln_api as api;

/// Label sets of the queue shown at most.
const QUEUE_CLASSES: u32 = 50;
/// Running attempts shown at most.
const RUNNING: u32 = 200;

pub(crate) async fn overview(state: &AppState) -> ApiResult<api::Overview> {
    let jobs = state.store.active_job_counts().await?;
    let queue = state
        .store
        .queue_classes(QUEUE_CLASSES)
        .await?
        .into_iter()
        .map(|c| api::QueueEntry {
            labels: serde_json::from_str(&c.class_key).unwrap_or_default(),
            eligible: c.eligible,
            oldest_age_ms: c.oldest_ms,
        })
        .collect();
    let agents = list_agents(state).await?;
    let running = state
        .store
        .running_attempts(RUNNING)
        .await?
        .into_iter()
        .map(|a| api::RunningJob {
            phase: a.last_system_line.as_deref().map_or(Some("prepare"), phase_of).map(str::to_string),
            activity: a.last_system_line,
            run_id: a.run_id,
            repo: a.repo,
            job_id: a.job_id,
            job: a.job_name,
            epoch: a.epoch,
            agent_id: a.agent_id,
            agent: a.runner,
            started_at_ms: a.started_at,
            elapsed_ms: a.elapsed_ms,
        })
        .collect();
    Ok(api::Overview { at_ms: state.clock.now_ms(), jobs, queue, agents, running })
}

/// The attempt phase (the names of `kiln_attempt_phase_duration_seconds`)
/// that the last line of an attempt's `system` log stream says it is in:
/// the agent writes a line when each part of the attempt begins (checkout,
/// image, restores, each step, cache save, each artifact upload, the end).
/// `None` for a line that does not tell.
fn phase_of(line: &str) -> Option<&'static str> {
    if let Some((i, n)) = step_position(line) {
        // A step begins (▶) or ends (✓, ✗, ○): after the last one ends,
        // what remains is publication.
        let ended = !line.starts_with('▶');
        return Some(if ended && i == n { "publication" } else { "command" });
    }
    let publication =
        ["uploading artifact", "✓ artifact", "outputs:", "cache: not saved", "cache: saving", "✓ job", "✗ job"];
    if publication.iter().any(|p| line.contains(p)) || line.starts_with("cache: warning") {
        return Some("publication");
    }
    if line.contains("image") || line.starts_with("pulling ") || line.starts_with("using ") {
        return Some("image");
    }
    let prepare = ["checking out", "restoring artifact", "restored artifact", "cache:", "services"];
    if prepare.iter().any(|p| line.contains(p)) {
        return Some("prepare");
    }
    None
}

/// `(i, n)` of a line about step `i/n` (`▶ step 2/3: test`).
fn step_position(line: &str) -> Option<(u32, u32)> {
    let rest = line.split_once(" step ")?.1;
    let pos = rest.split([':', ' ']).next()?;
    let (i, n) = pos.split_once('/')?;
    Some((i.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::phase_of;

    #[test]
    fn the_last_system_line_tells_the_phase() {
        for (line, phase) in [
            ("checking out hello at 0123abc", Some("prepare")),
            ("⚠ git fetch failed; retrying", None),
            ("pulling docker.io/library/alpine:3", Some("image")),
            ("▶ building image from Dockerfile (context .)", Some("image")),
            ("✓ image sha256:abc", Some("image")),
            ("restoring artifact `bin` to out", Some("prepare")),
            ("cache: miss; the job runs cold and saves its cache if it succeeds", Some("prepare")),
            ("services ready: db", Some("prepare")),
            ("cache: saving 120 bytes (3 files and directories) as trusted", Some("publication")),
            ("▶ step 1/3: build", Some("command")),
            ("✓ step 1/3: build (0.2 s)", Some("command")),
            ("▶ step 3/3: test", Some("command")),
            ("✓ step 3/3: test (1.0 s)", Some("publication")),
            ("✗ step 3/3 failed: exit code 1 (1.0 s)", Some("publication")),
            ("○ step 3/3: deploy skipped (a step failed)", Some("publication")),
            ("uploading artifact `bin`: 12 bytes", Some("publication")),
            ("✓ artifact `bin` sealed: 12 bytes, sha256 00", Some("publication")),
            ("✓ job success", Some("publication")),
        ] {
            assert_eq!(phase_of(line), phase, "{line}");
        }
    }
}
