//! YAML → Workflow with diagnostics (line, column, message).

use crate::model::Workflow;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// 1-based line; 0 when the problem has no position (e.g. file too large).
    pub line: usize,
    /// 1-based column; 0 when unknown.
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Parse and validate a workflow file. Returns every problem found, each with
/// its line and column, or the validated model.
pub fn parse(_src: &str) -> Result<Workflow, Diagnostics> {
    todo!("implemented by the workflow parser")
}
