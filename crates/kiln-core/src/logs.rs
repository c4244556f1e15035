//! Names of a job log's streams and of its SSE events: the one place the
//! store, the server, the agent and the CLI take them from.
//!
//! Spec 000 §13 (invariant 7): a log is byte chunks per stream of an attempt,
//! plus two marker rows that are events of the attempt rather than bytes:
//! `seal` (the attempt ended through its agent and every committed byte is
//! all there is) and `gap` (the agent was lost; bytes it had not delivered
//! are missing, and the log has no clean end). A reader must never mistake
//! one for the other, or either for output, so the names live here once.

/// Stream names of log rows.
pub mod stream {
    /// The job's standard output.
    pub const STDOUT: &str = "stdout";
    /// The job's standard error.
    pub const STDERR: &str = "stderr";
    /// Agent-side lines (step headers, dropped-output notes).
    pub const SYSTEM: &str = "system";
    /// The output of the job's service containers, each line prefixed
    /// with `[name] `.
    pub const SERVICES: &str = "services";
    /// Marker row: the attempt ended through its agent; its payload is the
    /// JSON of a `LogSealed` (epoch, outcome, committed lengths).
    pub const SEAL: &str = "seal";
    /// Marker row: the attempt's agent was lost; its payload is the JSON of
    /// a `LogGap` (epoch, reason, committed lengths).
    pub const GAP: &str = "gap";
    /// The streams an agent may write bytes to; markers are written only by
    /// the store's own transactions.
    pub const AGENT_STREAMS: [&str; 4] = [STDOUT, STDERR, SYSTEM, SERVICES];

    /// A marker row (`seal`, `gap`) rather than bytes of output.
    pub fn is_marker(name: &str) -> bool {
        name == SEAL || name == GAP
    }
}

/// Event names of the log feed (`GET /v1/jobs/{job}/logs/events`, SSE).
pub mod event {
    /// Bytes of one stream (`LogEvent`).
    pub const CHUNK: &str = "chunk";
    /// An attempt's log is complete (`LogSealed`); sent for a `seal` row.
    pub const SEALED: &str = "sealed";
    /// An attempt's log has a lost tail (`LogGap`); sent for a `gap` row.
    pub const GAP: &str = "gap";
    /// The job reached a terminal status and every committed chunk was sent
    /// (`LogEnd`); the feed closes after it.
    pub const END: &str = "end";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_not_agent_streams() {
        for s in stream::AGENT_STREAMS {
            assert!(!stream::is_marker(s), "{s}");
        }
        assert!(stream::is_marker("seal") && stream::is_marker("gap"));
    }
}
