//! The Kiln workflow language: YAML → validated, frozen definition.
//!
//! Pure: no IO beyond the string handed in. spec 000 §5: parse YAML safely and
//! bound its size, nesting, job count and steps; the canonical hash identifies
//! the frozen definition stored with every run.
//!
//! [`parse`] reads the YAML with the event parser of serde-saphyr
//! (`granit_parser`) into a span-carrying tree, refusing anchors/aliases,
//! tags, duplicate keys, multiple documents and deep nesting, then validates
//! it into a [`Workflow`]. Every problem is reported as a [`Diagnostic`]
//! (`line:col: message`, 1-based), sorted by position.

mod model;
mod parse;
mod tree;
mod validate;

pub use model::*;
pub use parse::{Diagnostic, Diagnostics, MAX_DIAGNOSTICS, parse};
pub use validate::{MAX_NAME_CHARS, MAX_RETRY, MAX_TIMEOUT_SECS};
