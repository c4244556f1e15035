//! Documented CLI exit codes (stable: scripts rely on them).

/// The command succeeded (for `kiln run --follow`: the run succeeded).
pub const OK: i32 = 0;
/// The run finished but did not succeed (failed or cancelled).
pub const RUN_FAILED: i32 = 1;
/// Bad usage or invalid input (flags, workflow file that does not validate).
pub const USAGE: i32 = 2;
/// The server refused the request (4xx other than auth), e.g. unknown repo.
pub const REFUSED: i32 = 3;
/// Authentication or authorization failed (401/403).
pub const AUTH: i32 = 4;
/// The server could not be reached or failed (5xx, connection refused).
pub const UNAVAILABLE: i32 = 5;
