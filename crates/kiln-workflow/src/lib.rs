//! The Kiln workflow language: YAML → validated, frozen definition.
//!
//! Pure: no IO beyond the string handed in. spec 000 §5: parse YAML safely and
//! bound its size, nesting, job count and steps; the canonical hash identifies
//! the frozen definition stored with every run.

mod model;
mod parse;

pub use model::*;
pub use parse::{parse, Diagnostic, Diagnostics};
