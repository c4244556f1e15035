//! What the `kiln` binary's commands and `kiln bench` (the kiln-bench
//! crate) share, in a library both depend on so that neither depends on the
//! other: the command failure type (message + exit code of
//! `kiln_api::exit`), standard output that survives a closed pipe (`outln!`),
//! duration flags, and the embedded server with local
//! agents behind `kiln up`.

mod duration;
mod embedded;
mod failure;
mod output;

pub use duration::{parse_bytes, parse_duration, parse_duration_or_off, parse_memory_levels};
pub use embedded::{agent_config, default_labels, start_embedded, start_embedded_agents, start_embedded_config};
pub use failure::{CmdResult, Failure, usage};
pub use output::write_stdout;
