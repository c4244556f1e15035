//! The small, safe expression language of `if:` conditions and
//! `concurrency.group` templates.
//!
//! Grammar (lowest precedence first):
//!
//! ```text
//! or      := and ( "||" and )*
//! and     := cmp ( "&&" cmp )*
//! cmp     := unary ( ( "==" | "!=" ) unary )?      -- not chainable
//! unary   := "!" unary | primary
//! primary := literal | name | call | "(" or ")"
//! literal := 'string' ('' escapes a quote) | "string" | number | true | false | null
//! name    := event | ref | branch | inputs.<name> | needs.<job>.outputs.<name>
//!          | commit.sha | commit.short_sha | commit.title | commit.author
//!          | matrix.<key>      -- only in `if:` of a matrix job, replaced at expansion
//! call    := success() | failure() | always() | cancelled()
//!          | contains(a, b) | startsWith(a, b) | endsWith(a, b)
//! ```
//!
//! Bounded: at most [`MAX_EXPR_CHARS`] bytes, nesting (parentheses, `!`,
//! call arguments) at most [`MAX_EXPR_DEPTH`] levels, no loops; parsing and
//! evaluation never panic. Values are null, booleans, numbers and strings.
//! Truthiness: null, `false`, `0`, NaN and `''` are false. `==` compares
//! values of the same type directly (strings case-sensitively); values of
//! different types are compared as numbers (null → 0, booleans → 0/1,
//! strings parsed, NaN otherwise), like GitHub Actions. `&&` and `||`
//! return one of their operands, so `inputs.env || 'prod'` works in group
//! templates. Unknown `inputs.<name>` and missing `ref`/`branch` are null;
//! so is `needs.<job>.outputs.<name>` when that job bound no such output
//! (it did not run, failed, or never wrote it).
//! `contains`, `startsWith` and `endsWith` work on the string forms of
//! their arguments (case-sensitive).

use crate::model::InputKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest accepted expression (or `if:` source), in bytes.
pub const MAX_EXPR_CHARS: usize = 1024;
/// Deepest accepted nesting of parentheses, `!` and call arguments.
pub const MAX_EXPR_DEPTH: usize = 32;

/// The outcome of a job, as seen by the conditions of the jobs that need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobResult {
    Success,
    Failure,
    Cancelled,
    Skipped,
}

/// What an expression can see. Built by the server when it decides whether a
/// job runs (`if:`) or which concurrency group a run/job belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConditionContext {
    /// `event` (e.g. `push`, `manual`).
    pub event: String,
    /// `ref` (e.g. `refs/heads/main`); null when absent.
    pub git_ref: Option<String>,
    /// `branch` (e.g. `main`); null when absent.
    pub branch: Option<String>,
    /// `inputs.<name>`; a name not present is null.
    pub inputs: BTreeMap<String, String>,
    /// The declared type of each input (`Workflow::input_kinds`): a
    /// `boolean` input is a boolean in expressions, a `number` a number;
    /// anything else (or undeclared) is a string.
    pub input_kinds: BTreeMap<String, InputKind>,
    /// The results of the job's effective `needs` (every expansion of a
    /// matrix), in any order.
    pub needs_results: Vec<JobResult>,
    /// `needs.<job>.outputs.<name>`: the outputs bound by the completion of
    /// each job's successful attempt (spec 000 §9), by job name. A job or
    /// output not present is null.
    pub needs_outputs: BTreeMap<String, BTreeMap<String, String>>,
    /// `cancelled()`: the run has been cancelled.
    pub run_cancelled: bool,
    /// The job's `needs-policy: {quorum: N}`: with it, `success()` holds when
    /// at least N needs succeeded instead of all of them.
    pub quorum: Option<u32>,
    /// `commit.*`: the run's commit, frozen at acceptance.
    pub commit: CommitContext,
}

/// `commit.sha`, `commit.short_sha`, `commit.title` and `commit.author`:
/// the run's commit as read from git when the run was accepted (spec 000
/// §5: frozen with the run). Empty fields are null in expressions (a run
/// accepted before they were recorded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitContext {
    /// The full commit SHA.
    pub sha: String,
    /// The first line of the commit message.
    pub title: String,
    /// The commit's author, `Name <email>`.
    pub author: String,
}

/// How many hex digits `commit.short_sha` has (git's usual abbreviation).
pub const SHORT_SHA_LEN: usize = 7;

/// Evaluate an `if:` expression (optionally wrapped in `${{ }}`).
///
/// Like GitHub Actions, an expression that calls none of the status
/// functions (`success()`, `failure()`, `always()`, `cancelled()`) is
/// evaluated as `success() && (expr)`. `success()`: the run is not cancelled
/// and every need succeeded (at least `quorum` of them when set);
/// `failure()`: some need failed; `always()`: true; `cancelled()`: the run
/// was cancelled. Errors are syntax errors (which [`parse`](crate::parse)
/// already reports when the workflow is accepted).
pub fn eval_condition(expr: &str, ctx: &ConditionContext) -> Result<bool, String> {
    let parsed = parse_condition(expr).map_err(|e| e.to_string())?;
    let value = eval(&parsed, ctx);
    Ok(if has_status_call(&parsed) { value.truthy() } else { status_success(ctx) && value.truthy() })
}

/// Render a concurrency-group template: literal text with `${{ expr }}`
/// parts, each evaluated over `event`, `ref`, `branch` and `inputs.*` (no
/// status functions) and replaced by its string form (null → empty).
pub fn render_group(template: &str, ctx: &ConditionContext) -> Result<String, String> {
    let mut out = String::new();
    for seg in segments(template).map_err(|e| e.to_string())? {
        match seg {
            Segment::Text(t) => out.push_str(t),
            Segment::Expr { inner, offset } => {
                let e = parse_expr(inner, Mode::Template).map_err(|e| e.shifted(offset).to_string())?;
                out.push_str(&eval(&e, ctx).to_text());
            }
        }
    }
    Ok(out)
}

/// Whether a step with this `if:` runs: `(after_success, after_failure)` —
/// when every earlier step of the job succeeded, and when one failed (a
/// `continue-on-error` step's failure does not count). `success()` and
/// `failure()` refer to those earlier steps; everything else is the frozen
/// run's data in `ctx` (its `needs_results`, `quorum` and `run_cancelled`
/// are ignored). No `if:` is `(true, false)`: a failed step skips the rest.
pub fn step_gate(expr: Option<&str>, ctx: &ConditionContext) -> Result<(bool, bool), String> {
    let Some(expr) = expr else { return Ok((true, false)) };
    let with =
        |result| ConditionContext { needs_results: vec![result], quorum: None, run_cancelled: false, ..ctx.clone() };
    Ok((eval_condition(expr, &with(JobResult::Success))?, eval_condition(expr, &with(JobResult::Failure))?))
}

/// A problem in an expression: byte offset into the source and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExprError {
    pub offset: usize,
    pub message: String,
}

impl ExprError {
    fn new(offset: usize, message: impl Into<String>) -> Self {
        ExprError { offset, message: message.into() }
    }

    pub(crate) fn shifted(self, by: usize) -> Self {
        ExprError { offset: self.offset + by, ..self }
    }
}

impl std::fmt::Display for ExprError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at character {})", self.message, self.offset + 1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `if:` — status functions allowed.
    Condition,
    /// `${{ }}` parts of a concurrency group — no status functions.
    Template,
}

/// Parse an `if:` source: optional `${{ }}` wrapper, bounded length.
pub(crate) fn parse_condition(src: &str) -> Result<Expr, ExprError> {
    if src.len() > MAX_EXPR_CHARS {
        return Err(ExprError::new(
            0,
            format!("the expression is {} bytes long; at most {MAX_EXPR_CHARS} are allowed", src.len()),
        ));
    }
    let trimmed_start = src.len() - src.trim_start().len();
    let t = src.trim();
    if let Some(inner) = t.strip_prefix("${{").and_then(|r| r.strip_suffix("}}")) {
        return parse_expr(inner, Mode::Condition).map_err(|e| e.shifted(trimmed_start + 3));
    }
    parse_expr(src, Mode::Condition)
}

/// Check every `${{ }}` part of a template (concurrency group, `env`
/// value, step `name` or `run`). `matrix_ok` accepts a part that is exactly
/// `matrix.<key>` (substituted at expansion); `input_ok` each `inputs.<name>`.
pub(crate) fn check_template(
    src: &str,
    matrix_ok: &dyn Fn(&str) -> Result<(), String>,
    input_ok: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(), ExprError> {
    for seg in segments(src)? {
        if let Segment::Expr { inner, offset } = seg {
            if let Some(key) = matrix_ref(inner) {
                matrix_ok(key).map_err(|m| ExprError::new(offset, m))?;
                continue;
            }
            let e = parse_expr(inner, Mode::Template).map_err(|e| e.shifted(offset))?;
            check_inputs(&e, input_ok).map_err(|m| ExprError::new(offset, m))?;
        }
    }
    Ok(())
}

/// Every `inputs.<name>` of `e` passes `input_ok`.
pub(crate) fn check_inputs(e: &Expr, input_ok: &dyn Fn(&str) -> Result<(), String>) -> Result<(), String> {
    match e {
        Expr::Lit(_)
        | Expr::Name(
            Name::Event | Name::Ref | Name::Branch | Name::Output { .. } | Name::Commit(_) | Name::Matrix(_),
        ) => Ok(()),
        Expr::Name(Name::Input(n)) => input_ok(n),
        Expr::Not(x) => check_inputs(x, input_ok),
        Expr::And(xs) | Expr::Or(xs) | Expr::Call(_, xs) => xs.iter().try_for_each(|x| check_inputs(x, input_ok)),
        Expr::Eq(a, b, _) => check_inputs(a, input_ok).and_then(|()| check_inputs(b, input_ok)),
    }
}

/// Every `needs.<job>.outputs.<name>` of `e`, as (job, output).
pub(crate) fn output_refs(e: &Expr, out: &mut Vec<(String, String)>) {
    match e {
        Expr::Name(Name::Output { job, output }) => out.push((job.clone(), output.clone())),
        Expr::Lit(_) | Expr::Name(_) => {}
        Expr::Not(x) => output_refs(x, out),
        Expr::And(xs) | Expr::Or(xs) | Expr::Call(_, xs) => xs.iter().for_each(|x| output_refs(x, out)),
        Expr::Eq(a, b, _) => {
            output_refs(a, out);
            output_refs(b, out);
        }
    }
}

/// Every `needs.<job>.outputs.<name>` in the `${{ }}` parts of a template
/// (parts that do not parse are left to the other checks).
pub(crate) fn template_output_refs(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for seg in segments(src).unwrap_or_default() {
        if let Segment::Expr { inner, .. } = seg
            && let Ok(e) = parse_expr(inner, Mode::Template)
        {
            output_refs(&e, &mut out);
        }
    }
    out
}

/// Every `needs.<job>.outputs.<name>` of an `if:` source.
pub(crate) fn condition_output_refs(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(e) = parse_condition(src) {
        output_refs(&e, &mut out);
    }
    out
}

/// Evaluate one `${{ }}` part (no wrapper) of a template to its text.
pub(crate) fn eval_part(inner: &str, ctx: &ConditionContext) -> Result<String, ExprError> {
    Ok(eval(&parse_expr(inner, Mode::Template)?, ctx).to_text())
}

/// Every `matrix.<key>` name of `e`.
pub(crate) fn matrix_names(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Name(Name::Matrix(k)) => out.push(k.clone()),
        Expr::Lit(_) | Expr::Name(_) => {}
        Expr::Not(x) => matrix_names(x, out),
        Expr::And(xs) | Expr::Or(xs) | Expr::Call(_, xs) => xs.iter().for_each(|x| matrix_names(x, out)),
        Expr::Eq(a, b, _) => {
            matrix_names(a, out);
            matrix_names(b, out);
        }
    }
}

/// An `if:` with each `matrix.<key>` name replaced by the combination's
/// value as a string literal (missing key: `null`). The text is otherwise
/// unchanged; one that does not lex is returned as is (it was refused).
pub(crate) fn substitute_matrix_condition(src: &str, values: &BTreeMap<String, String>) -> String {
    // The `${{ }}` wrapper, if any (as `parse_condition` reads it).
    let lead = src.len() - src.trim_start().len();
    let offset = match src.trim().strip_prefix("${{").and_then(|r| r.strip_suffix("}}")) {
        Some(_) => lead + 3,
        None => 0,
    };
    let end = if offset == 0 { src.len() } else { lead + src.trim().len() - 2 };
    let Ok(toks) = lex(&src[offset..end]) else { return src.to_string() };
    let mut out = String::new();
    let mut at = 0;
    for (tok, start) in toks {
        let Tok::Ident(name) = tok else { continue };
        let Some(key) = matrix_ref(&name) else { continue };
        let start = start + offset;
        out.push_str(&src[at..start]);
        match values.get(key) {
            Some(v) => {
                out.push('\'');
                out.push_str(&v.replace('\'', "''"));
                out.push('\'');
            }
            None => out.push_str("null"),
        }
        at = start + name.len();
    }
    out.push_str(&src[at..]);
    out
}

/// `matrix.<key>` (trimmed) → the key.
pub(crate) fn matrix_ref(inner: &str) -> Option<&str> {
    let key = inner.trim().strip_prefix("matrix.")?;
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')).then_some(key)
}

pub(crate) enum Segment<'a> {
    Text(&'a str),
    /// The text between `${{` and `}}`; `offset` is its byte offset.
    Expr {
        inner: &'a str,
        offset: usize,
    },
}

/// Split a template into text and `${{ }}` parts. An unterminated `${{` is an
/// error.
pub(crate) fn segments(src: &str) -> Result<Vec<Segment<'_>>, ExprError> {
    let mut out = Vec::new();
    let mut rest = 0;
    while let Some(start) = src[rest..].find("${{").map(|i| i + rest) {
        if start > rest {
            out.push(Segment::Text(&src[rest..start]));
        }
        let inner_start = start + 3;
        let Some(end) = src[inner_start..].find("}}").map(|i| i + inner_start) else {
            return Err(ExprError::new(start, "`${{` is not closed with `}}`"));
        };
        if end - inner_start > MAX_EXPR_CHARS {
            return Err(ExprError::new(start, format!("an expression is longer than {MAX_EXPR_CHARS} bytes")));
        }
        out.push(Segment::Expr { inner: &src[inner_start..end], offset: inner_start });
        rest = end + 2;
    }
    if rest < src.len() {
        out.push(Segment::Text(&src[rest..]));
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
}

impl Val {
    fn truthy(&self) -> bool {
        match self {
            Val::Null => false,
            Val::Bool(b) => *b,
            Val::Num(n) => *n != 0.0 && !n.is_nan(),
            Val::Str(s) => !s.is_empty(),
        }
    }

    fn to_text(&self) -> String {
        match self {
            Val::Null => String::new(),
            Val::Bool(b) => b.to_string(),
            Val::Num(n) if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e15 => format!("{}", *n as i64),
            Val::Num(n) => n.to_string(),
            Val::Str(s) => s.clone(),
        }
    }

    fn to_num(&self) -> f64 {
        match self {
            Val::Null => 0.0,
            Val::Bool(b) => f64::from(u8::from(*b)),
            Val::Num(n) => *n,
            Val::Str(s) => {
                let t = s.trim();
                if t.is_empty() {
                    0.0
                } else if t.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')) {
                    t.parse().unwrap_or(f64::NAN)
                } else {
                    f64::NAN
                }
            }
        }
    }
}

fn loose_eq(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Null, Val::Null) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Str(x), Val::Str(y)) => x == y,
        _ => a.to_num() == b.to_num(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Success,
    Failure,
    Always,
    Cancelled,
    Contains,
    StartsWith,
    EndsWith,
}

impl Func {
    fn lookup(name: &str) -> Option<(Func, usize)> {
        Some(match name {
            "success" => (Func::Success, 0),
            "failure" => (Func::Failure, 0),
            "always" => (Func::Always, 0),
            "cancelled" => (Func::Cancelled, 0),
            "contains" => (Func::Contains, 2),
            "startsWith" => (Func::StartsWith, 2),
            "endsWith" => (Func::EndsWith, 2),
            _ => return None,
        })
    }

    fn is_status(self) -> bool {
        matches!(self, Func::Success | Func::Failure | Func::Always | Func::Cancelled)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Name {
    Event,
    Ref,
    Branch,
    Input(String),
    /// `needs.<job>.outputs.<output>`.
    Output {
        job: String,
        output: String,
    },
    /// `commit.<field>`.
    Commit(CommitField),
    /// `matrix.<key>` in an `if:`: replaced by the combination's value when
    /// the matrix is expanded ([`substitute_matrix_condition`]); null if
    /// ever evaluated.
    Matrix(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitField {
    Sha,
    ShortSha,
    Title,
    Author,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Lit(Val),
    Name(Name),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    /// `a == b` (`negate`: `a != b`).
    Eq(Box<Expr>, Box<Expr>, bool),
    Call(Func, Vec<Expr>),
}

fn has_status_call(e: &Expr) -> bool {
    match e {
        Expr::Lit(_) | Expr::Name(_) => false,
        Expr::Not(x) => has_status_call(x),
        Expr::And(xs) | Expr::Or(xs) => xs.iter().any(has_status_call),
        Expr::Eq(a, b, _) => has_status_call(a) || has_status_call(b),
        Expr::Call(f, args) => f.is_status() || args.iter().any(has_status_call),
    }
}

fn status_success(ctx: &ConditionContext) -> bool {
    let ok = ctx.needs_results.iter().filter(|r| **r == JobResult::Success).count();
    let needed = match ctx.quorum {
        Some(q) => usize::try_from(q).unwrap_or(usize::MAX).min(ctx.needs_results.len()),
        None => ctx.needs_results.len(),
    };
    !ctx.run_cancelled && ok >= needed
}

fn eval(e: &Expr, ctx: &ConditionContext) -> Val {
    match e {
        Expr::Lit(v) => v.clone(),
        Expr::Name(Name::Event) => Val::Str(ctx.event.clone()),
        Expr::Name(Name::Ref) => ctx.git_ref.clone().map_or(Val::Null, Val::Str),
        Expr::Name(Name::Branch) => ctx.branch.clone().map_or(Val::Null, Val::Str),
        Expr::Name(Name::Input(n)) => match (ctx.inputs.get(n), ctx.input_kinds.get(n)) {
            (None, _) => Val::Null,
            (Some(v), Some(InputKind::Boolean)) => Val::Bool(v == "true"),
            (Some(v), Some(InputKind::Number)) => Val::Num(v.trim().parse().unwrap_or(f64::NAN)),
            (Some(v), _) => Val::Str(v.clone()),
        },
        Expr::Name(Name::Output { job, output }) => {
            ctx.needs_outputs.get(job).and_then(|o| o.get(output)).map_or(Val::Null, |v| Val::Str(v.clone()))
        }
        Expr::Name(Name::Commit(field)) => {
            let c = &ctx.commit;
            let text = match field {
                CommitField::Sha => c.sha.clone(),
                CommitField::ShortSha => c.sha.chars().take(SHORT_SHA_LEN).collect(),
                CommitField::Title => c.title.clone(),
                CommitField::Author => c.author.clone(),
            };
            if text.is_empty() { Val::Null } else { Val::Str(text) }
        }
        Expr::Name(Name::Matrix(_)) => Val::Null,
        Expr::Not(x) => Val::Bool(!eval(x, ctx).truthy()),
        Expr::And(xs) => {
            let mut last = Val::Bool(true);
            for x in xs {
                last = eval(x, ctx);
                if !last.truthy() {
                    break;
                }
            }
            last
        }
        Expr::Or(xs) => {
            let mut last = Val::Bool(false);
            for x in xs {
                last = eval(x, ctx);
                if last.truthy() {
                    break;
                }
            }
            last
        }
        Expr::Eq(a, b, negate) => Val::Bool(loose_eq(&eval(a, ctx), &eval(b, ctx)) != *negate),
        Expr::Call(f, args) => {
            let arg = |i: usize| args.get(i).map_or(String::new(), |a| eval(a, ctx).to_text());
            Val::Bool(match f {
                Func::Success => status_success(ctx),
                Func::Failure => ctx.needs_results.contains(&JobResult::Failure),
                Func::Always => true,
                Func::Cancelled => ctx.run_cancelled,
                Func::Contains => arg(0).contains(arg(1).as_str()),
                Func::StartsWith => arg(0).starts_with(arg(1).as_str()),
                Func::EndsWith => arg(0).ends_with(arg(1).as_str()),
            })
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Num(f64),
    Ident(String),
    EqEq,
    NotEq,
    AndAnd,
    OrOr,
    Bang,
    LParen,
    RParen,
    Comma,
}

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, ExprError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let two = bytes.get(i..i + 2);
        let tok = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'(' => Tok::LParen,
            b')' => Tok::RParen,
            b',' => Tok::Comma,
            _ if two == Some(b"==") => Tok::EqEq,
            _ if two == Some(b"!=") => Tok::NotEq,
            _ if two == Some(b"&&") => Tok::AndAnd,
            _ if two == Some(b"||") => Tok::OrOr,
            b'!' => Tok::Bang,
            b'\'' | b'"' => {
                let mut s = String::new();
                let mut j = i + 1;
                loop {
                    let Some(ch) = src[j..].chars().next() else {
                        return Err(ExprError::new(start, "unterminated string; close it with a matching quote"));
                    };
                    if ch as u32 == u32::from(c) {
                        if c == b'\'' && bytes.get(j + 1) == Some(&b'\'') {
                            s.push('\'');
                            j += 2;
                            continue;
                        }
                        j += 1;
                        break;
                    }
                    s.push(ch);
                    j += ch.len_utf8();
                }
                out.push((Tok::Str(s), start));
                i = j;
                continue;
            }
            b'0'..=b'9' | b'-' => {
                let mut j = i + 1;
                while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.') {
                    j += 1;
                }
                let text = &src[i..j];
                let n: f64 = text
                    .parse()
                    .ok()
                    .filter(|_| text != "-")
                    .ok_or_else(|| ExprError::new(start, format!("invalid number `{}`", text.escape_debug())))?;
                out.push((Tok::Num(n), start));
                i = j;
                continue;
            }
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || matches!(bytes[j], b'_' | b'-' | b'.')) {
                    j += 1;
                }
                out.push((Tok::Ident(src[i..j].to_string()), start));
                i = j;
                continue;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(ExprError::new(start, format!("unexpected character `{}`", ch.escape_debug())));
            }
        };
        i += if matches!(tok, Tok::EqEq | Tok::NotEq | Tok::AndAnd | Tok::OrOr) { 2 } else { 1 };
        out.push((tok, start));
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    at: usize,
    end: usize,
    depth: usize,
    mode: Mode,
}

/// Parse one expression (no `${{ }}` wrapper).
pub(crate) fn parse_expr(src: &str, mode: Mode) -> Result<Expr, ExprError> {
    if src.len() > MAX_EXPR_CHARS {
        return Err(ExprError::new(
            0,
            format!("the expression is {} bytes long; at most {MAX_EXPR_CHARS} are allowed", src.len()),
        ));
    }
    let toks = lex(src)?;
    if toks.is_empty() {
        return Err(ExprError::new(0, "the expression is empty"));
    }
    let mut p = Parser { toks, at: 0, end: src.len(), depth: 0, mode };
    let e = p.or()?;
    match p.toks.get(p.at) {
        None => Ok(e),
        Some((t, pos)) => Err(ExprError::new(*pos, format!("unexpected {} after a complete expression", describe(t)))),
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Str(_) => "string".into(),
        Tok::Num(_) => "number".into(),
        Tok::Ident(s) => format!("`{}`", s.escape_debug()),
        Tok::EqEq => "`==`".into(),
        Tok::NotEq => "`!=`".into(),
        Tok::AndAnd => "`&&`".into(),
        Tok::OrOr => "`||`".into(),
        Tok::Bang => "`!`".into(),
        Tok::LParen => "`(`".into(),
        Tok::RParen => "`)`".into(),
        Tok::Comma => "`,`".into(),
    }
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|(t, _)| t)
    }

    fn pos(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |(_, p)| *p)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<(), ExprError> {
        self.depth += 1;
        if self.depth > MAX_EXPR_DEPTH {
            return Err(ExprError::new(
                self.pos(),
                format!("the expression nests deeper than {MAX_EXPR_DEPTH} levels"),
            ));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, ExprError> {
        self.enter()?;
        let mut xs = vec![self.and()?];
        while self.eat(&Tok::OrOr) {
            xs.push(self.and()?);
        }
        self.depth -= 1;
        Ok(if xs.len() == 1 { xs.pop().expect("one operand") } else { Expr::Or(xs) })
    }

    fn and(&mut self) -> Result<Expr, ExprError> {
        let mut xs = vec![self.cmp()?];
        while self.eat(&Tok::AndAnd) {
            xs.push(self.cmp()?);
        }
        Ok(if xs.len() == 1 { xs.pop().expect("one operand") } else { Expr::And(xs) })
    }

    fn cmp(&mut self) -> Result<Expr, ExprError> {
        let a = self.unary()?;
        let negate = match self.peek() {
            Some(Tok::EqEq) => false,
            Some(Tok::NotEq) => true,
            _ => return Ok(a),
        };
        self.at += 1;
        let b = self.unary()?;
        if matches!(self.peek(), Some(Tok::EqEq | Tok::NotEq)) {
            return Err(ExprError::new(self.pos(), "comparisons cannot be chained; add parentheses"));
        }
        Ok(Expr::Eq(Box::new(a), Box::new(b), negate))
    }

    fn unary(&mut self) -> Result<Expr, ExprError> {
        if self.eat(&Tok::Bang) {
            self.enter()?;
            let x = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(x)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, ExprError> {
        let pos = self.pos();
        let Some(tok) = self.peek().cloned() else {
            return Err(ExprError::new(pos, "the expression ends too early; a value is missing"));
        };
        self.at += 1;
        match tok {
            Tok::Str(s) => Ok(Expr::Lit(Val::Str(s))),
            Tok::Num(n) => Ok(Expr::Lit(Val::Num(n))),
            Tok::LParen => {
                let e = self.or()?;
                if !self.eat(&Tok::RParen) {
                    return Err(ExprError::new(self.pos(), "missing `)`"));
                }
                Ok(e)
            }
            Tok::Ident(name) => self.ident(name, pos),
            other => Err(ExprError::new(pos, format!("expected a value, found {}", describe(&other)))),
        }
    }

    fn ident(&mut self, name: String, pos: usize) -> Result<Expr, ExprError> {
        if self.peek() == Some(&Tok::LParen) {
            let Some((func, arity)) = Func::lookup(&name) else {
                return Err(ExprError::new(
                    pos,
                    format!(
                        "unknown function `{}`; available: success(), failure(), always(), cancelled(), contains(a, b), startsWith(a, b), endsWith(a, b)",
                        name.escape_debug()
                    ),
                ));
            };
            if func.is_status() && self.mode == Mode::Template {
                return Err(ExprError::new(pos, format!("`{name}()` can only be used in `if:`")));
            }
            self.at += 1;
            let mut args = Vec::new();
            if !self.eat(&Tok::RParen) {
                self.enter()?;
                loop {
                    args.push(self.or()?);
                    if self.eat(&Tok::Comma) {
                        continue;
                    }
                    if self.eat(&Tok::RParen) {
                        break;
                    }
                    return Err(ExprError::new(
                        self.pos(),
                        format!("expected `,` or `)` in the arguments of `{name}`"),
                    ));
                }
                self.depth -= 1;
            }
            if args.len() != arity {
                return Err(ExprError::new(
                    pos,
                    format!(
                        "`{name}` takes {arity} argument{}, found {}",
                        if arity == 1 { "" } else { "s" },
                        args.len()
                    ),
                ));
            }
            return Ok(Expr::Call(func, args));
        }
        Ok(match name.as_str() {
            "true" => Expr::Lit(Val::Bool(true)),
            "false" => Expr::Lit(Val::Bool(false)),
            "null" => Expr::Lit(Val::Null),
            "event" => Expr::Name(Name::Event),
            "ref" => Expr::Name(Name::Ref),
            "branch" => Expr::Name(Name::Branch),
            "commit.sha" => Expr::Name(Name::Commit(CommitField::Sha)),
            "commit.short_sha" => Expr::Name(Name::Commit(CommitField::ShortSha)),
            "commit.title" => Expr::Name(Name::Commit(CommitField::Title)),
            "commit.author" => Expr::Name(Name::Commit(CommitField::Author)),
            _ => match name.strip_prefix("inputs.") {
                Some(input) if !input.is_empty() && !input.contains('.') => Expr::Name(Name::Input(input.to_string())),
                _ if name.starts_with("needs.") => return output_name(&name, pos),
                _ if self.mode == Mode::Condition && matrix_ref(&name).is_some() => {
                    Expr::Name(Name::Matrix(matrix_ref(&name).unwrap_or_default().to_string()))
                }
                _ => {
                    // A name of another CI system gets what Kiln has for it.
                    let hint = foreign_hint(&name).unwrap_or_else(|| NAMES.to_string());
                    return Err(ExprError::new(pos, format!("unknown name `{}`; {hint}", name.escape_debug())));
                }
            },
        })
    }
}

/// What an unknown name is told expressions may use.
const NAMES: &str = "expressions may use `event`, `ref`, `branch`, `inputs.<name>`, `needs.<job>.outputs.<name>`, \
                     `commit.sha`, `commit.short_sha`, `commit.title` and `commit.author`";

/// What Kiln has for a name of another CI system's expressions (GitHub
/// Actions' `github.*`, `secrets.*`, `env.*`, `runner.*`), if anything.
fn foreign_hint(name: &str) -> Option<String> {
    let (head, rest) = name.split_once('.').unwrap_or((name, ""));
    let text = match (head, rest) {
        ("github", "sha") => "use `commit.sha` (`commit.short_sha` for 7 digits; `$KILN_COMMIT` in a step)".into(),
        ("github", "ref") => "use `ref` (e.g. `refs/heads/main`)".into(),
        ("github", "ref_name" | "head_ref" | "base_ref") => {
            "use `branch` (the branch of the run's ref; pull requests' base branches are filtered in `on:`)".into()
        }
        ("github", "event_name") => "use `event` (`push`, `pull_request`, `schedule` or `manual`)".into(),
        ("github", "actor" | "triggering_actor") => {
            "Kiln has no actor in expressions; `commit.author` is the commit's author".into()
        }
        ("github", "run_id" | "run_number" | "run_attempt") => {
            "read `$KILN_RUN_ID` in a step (and `$KILN_EPOCH`, the job's attempt)".into()
        }
        ("github", "job") => "read `$KILN_JOB` in a step".into(),
        ("github", "workspace") => "read `$KILN_WORKSPACE` in a step (steps start in the checkout)".into(),
        ("github", "repository" | "repository_owner") => {
            "Kiln has no repository name in expressions; the run's commit is `commit.sha`".into()
        }
        ("github", "event") => "Kiln has no event payload in expressions; use `event`, `ref`, `branch` and `commit.*`".into(),
        ("github", _) => "GitHub's `github` context is not available; Kiln has `event`, `ref`, `branch` and `commit.*`".into(),
        ("secrets", s) if !s.is_empty() => format!(
            "secrets are not expressions in Kiln: list the secret in the job's `secrets: [{s}]` and read `${s}` in the step"
        ),
        ("env", v) if !v.is_empty() => format!("read the variable as `${v}` in the step (environment variables are not expressions)"),
        ("runner", _) => "choose the machine with `runs-on` labels; `runner.*` is not available".into(),
        ("vars", _) => "set the value in `env` (or an input) instead; `vars.*` is not available".into(),
        ("steps", _) => "steps pass values to later jobs through `outputs` (`needs.<job>.outputs.<name>`); `steps.*` is not available".into(),
        ("matrix", _) => "`matrix.<key>` is only substituted in a matrix job, in `${{ matrix.<key> }}` or an `if:`".into(),
        _ => return None,
    };
    Some(text)
}

/// `needs.<job>.outputs.<output>` → the name. A job name may contain
/// dots, so the job is everything between `needs.` and the last
/// `.outputs.`; the output is a plain identifier.
fn output_name(name: &str, pos: usize) -> Result<Expr, ExprError> {
    let rest = &name["needs.".len()..];
    let parsed = rest.rsplit_once(".outputs.").filter(|(job, output)| {
        !job.is_empty() && !output.is_empty() && !output.contains('.') && output_name_ok(output)
    });
    match parsed {
        Some((job, output)) => Ok(Expr::Name(Name::Output { job: job.to_string(), output: output.to_string() })),
        None => Err(ExprError::new(
            pos,
            format!(
                "`{}` is not a job output; write `needs.<job>.outputs.<name>` (the job's name, then one of its declared `outputs`)",
                name.escape_debug()
            ),
        )),
    }
}

/// A job output's name: a letter or `_`, then letters, digits, `_` or `-`
/// (the `name=value` lines of `$KILN_OUTPUT` use the same rule).
pub fn output_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= 100
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapper_and_offsets() {
        assert!(parse_condition("${{ event == 'push' }}").is_ok());
        let e = parse_condition("${{ event = 'push' }}").unwrap_err();
        assert_eq!(e.offset, 10, "{e}");
        assert!(parse_condition("").is_err());
        assert!(parse_condition("${{ }}").is_err());
    }

    #[test]
    fn depth_is_bounded() {
        let ok = format!("{}true{}", "(".repeat(MAX_EXPR_DEPTH - 1), ")".repeat(MAX_EXPR_DEPTH - 1));
        assert!(parse_condition(&ok).is_ok());
        let deep = format!("{}true{}", "(".repeat(MAX_EXPR_DEPTH), ")".repeat(MAX_EXPR_DEPTH));
        assert!(parse_condition(&deep).unwrap_err().message.contains("deeper"));
        assert!(parse_condition(&"!".repeat(200)).is_err());
    }

    #[test]
    fn templates() {
        let ctx = ConditionContext {
            event: "push".into(),
            branch: Some("main".into()),
            inputs: BTreeMap::from([("env".into(), "staging".into())]),
            ..Default::default()
        };
        assert_eq!(render_group("deploy-${{ branch }}", &ctx).unwrap(), "deploy-main");
        assert_eq!(render_group("${{ inputs.env }}/${{ inputs.x || 'prod' }}", &ctx).unwrap(), "staging/prod");
        assert_eq!(render_group("plain", &ctx).unwrap(), "plain");
        assert_eq!(render_group("${{ 3 }}-${{ ref }}", &ctx).unwrap(), "3-");
        assert!(render_group("x-${{ branch", &ctx).is_err());
        assert!(render_group("${{ success() }}", &ctx).is_err());
        assert!(render_group("${{ matrix.os }}", &ctx).is_err());
    }
}
