//! A problem found in a workflow file, with its position: what the loader
//! (`tree`), the composer (`compose`), the validator (`validate`) and
//! [`crate::parse`] all report. Its own module so that they depend on it and
//! not on each other.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The `include`d file the problem is in (repository-relative);
    /// `None` for the workflow file itself.
    pub file: Option<String>,
    /// Index of that file while composing (0: the workflow file); turned
    /// into `file` by [`crate::parse_with`].
    pub(crate) src: u16,
    /// 1-based line; 0 when the problem has no position (e.g. file too large).
    pub line: usize,
    /// 1-based column; 0 when unknown.
    pub column: usize,
    pub message: String,
}

impl Diagnostic {
    /// A problem in the workflow file itself at `line:column`.
    pub fn new(line: usize, column: usize, message: impl Into<String>) -> Diagnostic {
        Diagnostic { file: None, src: 0, line, column, message: message.into() }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
        }
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
