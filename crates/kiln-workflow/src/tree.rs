//! A small span-carrying YAML tree built from parser events.
//!
//! Building our own tree (instead of deserialising straight into the model)
//! gives every node a line and column for semantic diagnostics, and lets us
//! refuse the unsafe parts of YAML up front:
//!
//! * anchors and aliases are refused outright, so alias bombs ("billion
//!   laughs") cannot expand;
//! * nesting deeper than [`MAX_DEPTH`] is refused as soon as it is seen, so
//!   nothing here recurses deeper than that;
//! * tags are refused (reported, then ignored);
//! * duplicate mapping keys are reported;
//! * only a single document is accepted.
//!
//! Scalars keep their source text and whether they were plain; typing follows
//! the YAML 1.2 core schema with strict booleans (`true`/`false` only: `yes`,
//! `no`, `on`, `off` are strings).

use crate::diag::Diagnostic;
use crate::model::MAX_DEPTH;
use serde_saphyr::granit_parser::{self as gp, Event, Marker, ScalarStyle};
use std::collections::HashMap;

/// A 1-based source position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    /// Which file: 0 is the workflow file, others are `include`d files
    /// (numbered by `compose`, in the order they were read).
    pub file: u16,
    pub line: usize,
    pub column: usize,
}

impl Pos {
    fn from_marker(m: &Marker) -> Pos {
        Pos { file: 0, line: m.line().max(1), column: m.col() + 1 }
    }
}

impl Diagnostic {
    /// A problem at `pos` (in whichever file `pos` is).
    pub(crate) fn at(pos: Pos, message: impl Into<String>) -> Diagnostic {
        Diagnostic { file: None, src: pos.file, line: pos.line, column: pos.column, message: message.into() }
    }
}

impl Node {
    /// Mark every position in this tree as being in file `file`.
    pub(crate) fn stamp(&mut self, file: u16) {
        self.pos.file = file;
        match &mut self.value {
            Value::Scalar(_) => {}
            Value::Seq(items) => items.iter_mut().for_each(|n| n.stamp(file)),
            Value::Map(entries) => {
                for e in entries {
                    e.key_pos.file = file;
                    e.value.stamp(file);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub(crate) enum Value {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

#[derive(Debug, Clone)]
pub(crate) struct Scalar {
    pub text: String,
    /// Plain (unquoted, non-block) scalars are typed by the core schema;
    /// every other style is a string.
    pub plain: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

/// The core-schema type of a scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarKind {
    Null,
    Bool,
    Int,
    Float,
    Str,
}

impl Scalar {
    pub(crate) fn kind(&self) -> ScalarKind {
        if !self.plain {
            return ScalarKind::Str;
        }
        let t = self.text.as_str();
        match t {
            "" | "~" | "null" | "Null" | "NULL" => ScalarKind::Null,
            "true" | "True" | "TRUE" | "false" | "False" | "FALSE" => ScalarKind::Bool,
            _ if is_int(t) => ScalarKind::Int,
            _ if is_float(t) => ScalarKind::Float,
            _ => ScalarKind::Str,
        }
    }

    /// The value of an integer scalar, `None` when not an integer or out of
    /// range of i128.
    pub(crate) fn as_int(&self) -> Option<i128> {
        if self.kind() != ScalarKind::Int {
            return None;
        }
        let t = self.text.as_str();
        if let Some(h) = t.strip_prefix("0x") {
            i128::from_str_radix(h, 16).ok()
        } else if let Some(o) = t.strip_prefix("0o") {
            i128::from_str_radix(o, 8).ok()
        } else {
            t.parse::<i128>().ok()
        }
    }
}

fn is_int(t: &str) -> bool {
    let digits = |s: &str, radix: u32| !s.is_empty() && s.chars().all(|c| c.is_digit(radix));
    if let Some(h) = t.strip_prefix("0x") {
        return digits(h, 16);
    }
    if let Some(o) = t.strip_prefix("0o") {
        return digits(o, 8);
    }
    let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
    digits(unsigned, 10)
}

fn is_float(t: &str) -> bool {
    let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(t, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    // [0-9]* ( . [0-9]* )? ( [eE] [-+]? [0-9]+ )? with at least one digit in the mantissa
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((a, b)) => (a, b),
        None => (mantissa, ""),
    };
    let all_digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if int_part.is_empty() && frac_part.is_empty() {
        return false;
    }
    if !all_digits(int_part) || !all_digits(frac_part) {
        return false;
    }
    match exponent {
        None => true,
        Some(e) => {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && all_digits(e)
        }
    }
}

impl Node {
    /// A short description of what this node is, for "found …" in messages.
    pub(crate) fn describe(&self) -> &'static str {
        match &self.value {
            Value::Map(_) => "a map",
            Value::Seq(_) => "a list",
            Value::Scalar(s) => match s.kind() {
                ScalarKind::Null => "an empty value",
                ScalarKind::Bool => "a boolean",
                ScalarKind::Int | ScalarKind::Float => "a number",
                ScalarKind::Str => "a string",
            },
        }
    }
}

/// The outcome of reading the YAML: the root node (if the file has a
/// document) plus every problem found. When `fatal` is set the tree is
/// incomplete and must not be validated further.
pub(crate) struct Loaded {
    pub root: Option<Node>,
    pub diags: Vec<Diagnostic>,
    pub fatal: bool,
}

enum KeyState {
    /// The next node is a key.
    Expect,
    /// The next node is the value of this key; `keep` is false when the
    /// entry must be dropped (duplicate or invalid key).
    Have { key: String, pos: Pos, keep: bool },
}

enum Frame {
    Seq { pos: Pos, items: Vec<Node> },
    Map { pos: Pos, entries: Vec<Entry>, key: KeyState, first_seen: HashMap<String, usize> },
}

fn diag(pos: Pos, message: impl Into<String>) -> Diagnostic {
    Diagnostic::at(pos, message)
}

const ANCHOR_MESSAGE: &str =
    "YAML anchors and aliases (`&name`, `*name`) are not supported in workflow files; write the value out in full";

/// Read `src` into a tree. Never panics; bounded by [`MAX_DEPTH`] and the
/// input size.
pub(crate) fn load(src: &str) -> Loaded {
    let options = gp::options! {
        // The scanner reads flow collections ahead of the events, so its own
        // limit can fire before our depth check; both report the same message.
        flow_nesting_limit: MAX_DEPTH,
        block_nesting_limit: MAX_DEPTH,
        emit_comments: false,
    };
    let mut parser = gp::Parser::new_from_str_with_options(src, options).keep_tags(true);
    let mut out = Loaded { root: None, diags: Vec::new(), fatal: false };
    let mut stack: Vec<Frame> = Vec::new();
    let mut documents = 0usize;

    let fatal = |out: &mut Loaded, pos: Pos, message: String| {
        out.diags.push(diag(pos, message));
        out.fatal = true;
    };

    while let Some(result) = parser.next_event() {
        let (event, span) = match result {
            Ok(ok) => ok,
            Err(e) => {
                let mut pos = Pos::from_marker(e.marker());
                let message = match e.kind() {
                    gp::ErrorKind::UnknownAnchor => ANCHOR_MESSAGE.to_string(),
                    gp::ErrorKind::RecursionLimitExceeded => depth_message(),
                    kind => {
                        let detail = kind.to_string();
                        if detail.contains("tab") {
                            pos = first_indent_tab(src, pos.line).unwrap_or(pos);
                            format!("invalid YAML: {detail}; indent with spaces, not tabs")
                        } else {
                            format!("invalid YAML: {detail}")
                        }
                    }
                };
                fatal(&mut out, pos, message);
                return out;
            }
        };
        let pos = Pos::from_marker(&span.start);

        // Tags: report once per node, then carry on as if untagged.
        if let Some(tag) = event.tag() {
            let tag_pos = span.tag_start.as_ref().map_or(pos, Pos::from_marker);
            out.diags.push(diag(
                tag_pos,
                format!("YAML tags (`{}`) are not supported in workflow files; remove the tag", tag.original()),
            ));
        }
        if event.anchor_id().is_some() || event.is_alias() {
            fatal(&mut out, pos, ANCHOR_MESSAGE.to_string());
            return out;
        }

        let completed: Node = match event {
            Event::DocumentStart(..) => {
                documents += 1;
                if documents > 1 {
                    fatal(
                        &mut out,
                        pos,
                        "a workflow file must hold a single YAML document; remove the second document (the one starting here)".to_string(),
                    );
                    return out;
                }
                continue;
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                if stack.len() >= MAX_DEPTH {
                    fatal(&mut out, pos, depth_message());
                    return out;
                }
                stack.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq { pos, items: Vec::new() }
                } else {
                    Frame::Map { pos, entries: Vec::new(), key: KeyState::Expect, first_seen: HashMap::new() }
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq { pos, items }) => Node { pos, value: Value::Seq(items) },
                Some(Frame::Map { pos, entries, .. }) => Node { pos, value: Value::Map(entries) },
                None => continue,
            },
            Event::Scalar(text, style, ..) => Node {
                pos,
                value: Value::Scalar(Scalar { text: text.into_owned(), plain: style == ScalarStyle::Plain }),
            },
            _ => continue,
        };

        // Attach the completed node to its parent (or make it the root).
        match stack.last_mut() {
            None => out.root = Some(completed),
            Some(Frame::Seq { items, .. }) => items.push(completed),
            Some(Frame::Map { entries, key, first_seen, .. }) => match std::mem::replace(key, KeyState::Expect) {
                KeyState::Expect => {
                    let (name, keep) = match &completed.value {
                        Value::Scalar(s) => (s.text.clone(), true),
                        _ => {
                            out.diags.push(diag(
                                completed.pos,
                                format!("mapping keys must be plain strings, found {}", completed.describe()),
                            ));
                            (String::new(), false)
                        }
                    };
                    let keep = keep
                        && match first_seen.get(&name) {
                            Some(first_line) => {
                                out.diags.push(diag(
                                    completed.pos,
                                    format!(
                                        "duplicate key `{name}` (first defined on line {first_line}); remove one of them"
                                    ),
                                ));
                                false
                            }
                            None => {
                                first_seen.insert(name.clone(), completed.pos.line);
                                true
                            }
                        };
                    *key = KeyState::Have { key: name, pos: completed.pos, keep };
                }
                KeyState::Have { key: name, pos: key_pos, keep } => {
                    if keep {
                        entries.push(Entry { key: name, key_pos, value: completed });
                    }
                }
            },
        }
    }

    if documents == 0 {
        out.root = None;
    }
    out
}

fn depth_message() -> String {
    format!("the YAML nests deeper than {MAX_DEPTH} levels; flatten the structure")
}

/// The first tab used for indentation on or after `line`: scanner errors
/// about tabs point at the token before it, which is confusing.
fn first_indent_tab(src: &str, line: usize) -> Option<Pos> {
    src.lines().enumerate().skip(line.saturating_sub(1)).find_map(|(i, text)| {
        let indent = text.len() - text.trim_start_matches([' ', '\t']).len();
        text[..indent].find('\t').map(|col| Pos { file: 0, line: i + 1, column: col + 1 })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str, plain: bool) -> Scalar {
        Scalar { text: text.into(), plain }
    }

    #[test]
    fn core_schema_kinds() {
        assert_eq!(scalar("", true).kind(), ScalarKind::Null);
        assert_eq!(scalar("~", true).kind(), ScalarKind::Null);
        assert_eq!(scalar("true", true).kind(), ScalarKind::Bool);
        assert_eq!(scalar("no", true).kind(), ScalarKind::Str);
        assert_eq!(scalar("yes", true).kind(), ScalarKind::Str);
        assert_eq!(scalar("12", true).kind(), ScalarKind::Int);
        assert_eq!(scalar("-12", true).kind(), ScalarKind::Int);
        assert_eq!(scalar("0x1F", true).as_int(), Some(31));
        assert_eq!(scalar("0o17", true).as_int(), Some(15));
        assert_eq!(scalar("1.5", true).kind(), ScalarKind::Float);
        assert_eq!(scalar("1e3", true).kind(), ScalarKind::Float);
        assert_eq!(scalar(".inf", true).kind(), ScalarKind::Float);
        assert_eq!(scalar(".", true).kind(), ScalarKind::Str);
        assert_eq!(scalar("30m", true).kind(), ScalarKind::Str);
        assert_eq!(scalar("12", false).kind(), ScalarKind::Str);
        assert_eq!(scalar("true", false).kind(), ScalarKind::Str);
    }

    #[test]
    fn positions_are_one_based() {
        let loaded = load("a:\n  b: [1, 2]\n");
        assert!(!loaded.fatal, "{:?}", loaded.diags);
        let root = loaded.root.unwrap();
        let Value::Map(entries) = &root.value else { panic!() };
        assert_eq!(entries[0].key_pos, Pos { file: 0, line: 1, column: 1 });
        let Value::Map(inner) = &entries[0].value.value else { panic!() };
        assert_eq!(inner[0].key_pos, Pos { file: 0, line: 2, column: 3 });
        assert_eq!(inner[0].value.pos, Pos { file: 0, line: 2, column: 6 });
    }

    #[test]
    fn anchors_are_refused() {
        let loaded = load("a: &x 1\nb: *x\n");
        assert!(loaded.fatal);
        assert_eq!(loaded.diags.len(), 1);
        assert_eq!(loaded.diags[0].line, 1);
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let src = "[".repeat(10_000);
        let loaded = load(&src);
        assert!(loaded.fatal);
        let src = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let loaded = load(&src);
        assert!(!loaded.fatal, "{:?}", loaded.diags);
    }
}
