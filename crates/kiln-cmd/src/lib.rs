//! What the `kiln` binary's commands and `kiln bench` (the kiln-bench
//! crate) share, in a library both depend on so that neither depends on the
//! other: the command failure type (message + exit code of
//! `kiln_api::exit`), duration flags, and the embedded server with local
//! agents behind `kiln up`.

mod duration;
mod embedded;
mod failure;

pub use duration::parse_duration;
pub use embedded::{agent_config, default_labels, start_embedded, start_embedded_config};
pub use failure::{CmdResult, Failure, usage};
