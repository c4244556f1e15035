//! A gate's `success` condition: a small boolean language over the values
//! one Prometheus instant query returned, in the spirit of Argo Rollouts'
//! `successCondition` (`result < 0.05`, `result[0] >= 0.99 && len(result) == 2`).
//!
//! Grammar (whitespace is free between tokens):
//!
//! ```text
//! condition  := or
//! or         := and ( "||" and )*
//! and        := unary ( "&&" unary )*
//! unary      := "!" unary | "(" or ")" | comparison
//! comparison := operand ( "<" | "<=" | ">" | ">=" | "==" | "!=" ) operand
//! operand    := number | "result" | "result" "[" index "]" | "len" "(" "result" ")"
//! number     := [+-]? ( digits [ "." digits? ] | "." digits ) ( [eE] [+-]? digits )?
//! ```
//!
//! * `result` is the first sample (`result[0]`): the value of a scalar, or
//!   the first series of an instant vector; `result[i]` is the i-th series
//!   in the order Prometheus returned them (wrap the query in `sort()` or
//!   `sort_desc()` when the order matters); `len(result)` is the number of
//!   series (1 for a scalar).
//! * Every comparison involving NaN is false, `!=` included (unlike IEEE
//!   754): a NaN never meets a comparison. `!` still negates that false.
//! * `&&` and `||` evaluate left to right and short-circuit: `len(result) == 0
//!   || result < 1` is met by an empty answer, while a `result[i]` that is
//!   evaluated on an answer with fewer series is an [`EvalError`].
//!
//! The parser never panics: inputs longer than [`MAX_LEN`] bytes or nested
//! deeper than [`MAX_DEPTH`] are refused before they can exhaust anything
//! (property tests in `tests/condition_props.rs`).

use std::fmt;
use std::str::FromStr;

/// The longest condition accepted, in bytes.
pub const MAX_LEN: usize = 1024;
/// How deep `(` and `!` may nest.
pub const MAX_DEPTH: usize = 32;

/// A parsed `success` condition. [`Display`](fmt::Display) gives the source
/// text as written (trimmed), which is what messages quote.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    source: String,
    expr: Expr,
}

/// Why a condition does not parse: what was expected, and the 1-based
/// column (in characters) where the parser stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at column {column}")]
pub struct ConditionError {
    pub column: usize,
    pub message: String,
}

/// Why a condition cannot be evaluated on an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The condition reads `result[index]` but the answer has only `series`
    /// samples (0: the query returned no series).
    #[error("{}", missing_sample(*index, *series))]
    MissingSample { index: usize, series: usize },
}

fn missing_sample(index: usize, series: usize) -> String {
    match series {
        0 => "the query returned no series".to_string(),
        1 => format!("`result[{index}]` does not exist: the query returned 1 series"),
        n => format!("`result[{index}]` does not exist: the query returned {n} series"),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Cmp(Operand, CmpOp, Operand),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Operand {
    Number(f64),
    Sample(usize),
    Len,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl CmpOp {
    fn holds(self, a: f64, b: f64) -> bool {
        if a.is_nan() || b.is_nan() {
            return false;
        }
        match self {
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
        }
    }
}

impl Condition {
    /// Parses a condition; see the module docs for the grammar.
    pub fn parse(source: &str) -> Result<Condition, ConditionError> {
        if source.len() > MAX_LEN {
            return Err(ConditionError {
                column: 1,
                message: format!("the condition is {} bytes long; at most {MAX_LEN} are accepted", source.len()),
            });
        }
        let tokens = lex(source)?;
        let mut parser = Parser { tokens, pos: 0 };
        let expr = parser.or(0)?;
        let end = parser.peek();
        if end.kind != Tok::End {
            return Err(ConditionError {
                column: end.column,
                message: format!(
                    "unexpected {} after a complete condition; join conditions with `&&` or `||`",
                    end.kind.describe()
                ),
            });
        }
        Ok(Condition { source: source.trim().to_string(), expr })
    }

    /// The condition as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Evaluates the condition on the samples of one answer, in
    /// Prometheus's order (a scalar is one sample).
    pub fn evaluate(&self, samples: &[f64]) -> Result<bool, EvalError> {
        eval(&self.expr, samples)
    }

    /// Whether the condition reads a sample (`result`, `result[i]`)
    /// anywhere, as opposed to only `len(result)` and numbers. A condition
    /// that does not can be met by an answer with no series.
    pub fn reads_samples(&self) -> bool {
        fn reads(e: &Expr) -> bool {
            match e {
                Expr::Or(a, b) | Expr::And(a, b) => reads(a) || reads(b),
                Expr::Not(a) => reads(a),
                Expr::Cmp(a, _, b) => matches!(a, Operand::Sample(_)) || matches!(b, Operand::Sample(_)),
            }
        }
        reads(&self.expr)
    }
}

fn eval(e: &Expr, samples: &[f64]) -> Result<bool, EvalError> {
    Ok(match e {
        Expr::Or(a, b) => eval(a, samples)? || eval(b, samples)?,
        Expr::And(a, b) => eval(a, samples)? && eval(b, samples)?,
        Expr::Not(a) => !eval(a, samples)?,
        Expr::Cmp(a, op, b) => op.holds(operand(*a, samples)?, operand(*b, samples)?),
    })
}

fn operand(o: Operand, samples: &[f64]) -> Result<f64, EvalError> {
    match o {
        Operand::Number(n) => Ok(n),
        Operand::Len => Ok(samples.len() as f64),
        Operand::Sample(index) => {
            samples.get(index).copied().ok_or(EvalError::MissingSample { index, series: samples.len() })
        }
    }
}

impl FromStr for Condition {
    type Err = ConditionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Condition::parse(s)
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

// ---- lexer ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A number as written (its value is checked by the parser, which also
    /// reads sample indices from the same text).
    Num(String),
    Ident(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Not,
    And,
    Or,
    Cmp(CmpOp),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Num(n) => format!("number `{n}`"),
            Tok::Ident(i) => format!("`{i}`"),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::LBracket => "`[`".into(),
            Tok::RBracket => "`]`".into(),
            Tok::Not => "`!`".into(),
            Tok::And => "`&&`".into(),
            Tok::Or => "`||`".into(),
            Tok::Cmp(op) => format!("`{}`", op_str(*op)),
            Tok::End => "the end of the condition".into(),
        }
    }
}

fn op_str(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: Tok,
    column: usize,
}

fn lex(source: &str) -> Result<Vec<Token>, ConditionError> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let err = |i: usize, message: String| ConditionError { column: i + 1, message };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        let kind = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            '[' => Tok::LBracket,
            ']' => Tok::RBracket,
            '&' if next == Some('&') => Tok::And,
            '&' => return Err(err(i, "expected `&&`, found a single `&`".into())),
            '|' if next == Some('|') => Tok::Or,
            '|' => return Err(err(i, "expected `||`, found a single `|`".into())),
            '!' if next == Some('=') => Tok::Cmp(CmpOp::Ne),
            '!' => Tok::Not,
            '=' if next == Some('=') => Tok::Cmp(CmpOp::Eq),
            '=' => return Err(err(i, "expected `==`, found a single `=`".into())),
            '<' if next == Some('=') => Tok::Cmp(CmpOp::Le),
            '<' => Tok::Cmp(CmpOp::Lt),
            '>' if next == Some('=') => Tok::Cmp(CmpOp::Ge),
            '>' => Tok::Cmp(CmpOp::Gt),
            c if c.is_ascii_digit()
                || c == '.'
                || ((c == '-' || c == '+') && next.is_some_and(|n| n.is_ascii_digit() || n == '.')) =>
            {
                let end = number_end(&chars, i);
                if end == i {
                    return Err(err(i, format!("unexpected `{c}`")));
                }
                let text: String = chars[i..end].iter().collect();
                i = end;
                tokens.push(Token { kind: Tok::Num(text), column: start + 1 });
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut end = i;
                while end < chars.len() && (chars[end].is_ascii_alphanumeric() || chars[end] == '_') {
                    end += 1;
                }
                let text: String = chars[i..end].iter().collect();
                i = end;
                tokens.push(Token { kind: Tok::Ident(text), column: start + 1 });
                continue;
            }
            c => {
                return Err(err(i, format!("unexpected character `{}`", c.escape_debug())));
            }
        };
        i += match kind {
            Tok::And | Tok::Or | Tok::Cmp(CmpOp::Ne | CmpOp::Eq | CmpOp::Le | CmpOp::Ge) => 2,
            _ => 1,
        };
        tokens.push(Token { kind, column: start + 1 });
    }
    tokens.push(Token { kind: Tok::End, column: chars.len() + 1 });
    Ok(tokens)
}

/// The end (exclusive) of the number starting at `i`, or `i` when there is
/// none. Accepts `[+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?`.
fn number_end(chars: &[char], mut i: usize) -> usize {
    let start = i;
    let digits = |mut j: usize| {
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    if matches!(chars.get(i), Some('+' | '-')) {
        i += 1;
    }
    let int_end = digits(i);
    let mut end = int_end;
    if chars.get(end) == Some(&'.') {
        let frac_end = digits(end + 1);
        if int_end == i && frac_end == end + 1 {
            return start; // a lone `.`
        }
        end = frac_end;
    } else if int_end == i {
        return start;
    }
    if matches!(chars.get(end), Some('e' | 'E')) {
        let mut j = end + 1;
        if matches!(chars.get(j), Some('+' | '-')) {
            j += 1;
        }
        let exp_end = digits(j);
        if exp_end > j {
            end = exp_end;
        }
    }
    end
}

// ---- parser ----

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

const OPERAND_HINT: &str = "`result`, `result[i]`, `len(result)` or a number";

impl Parser {
    fn peek(&self) -> &Token {
        // The lexer always ends the list with `End`, which is never consumed.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.kind != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn error<T>(&self, message: String) -> Result<T, ConditionError> {
        Err(ConditionError { column: self.peek().column, message })
    }

    fn or(&mut self, depth: usize) -> Result<Expr, ConditionError> {
        let mut left = self.and(depth)?;
        while self.peek().kind == Tok::Or {
            self.bump();
            let right = self.and(depth)?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Expr, ConditionError> {
        let mut left = self.unary(depth)?;
        while self.peek().kind == Tok::And {
            self.bump();
            let right = self.unary(depth)?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self, depth: usize) -> Result<Expr, ConditionError> {
        if depth >= MAX_DEPTH {
            return self.error(format!("the condition nests `(` and `!` more than {MAX_DEPTH} deep"));
        }
        match self.peek().kind {
            Tok::Not => {
                self.bump();
                Ok(Expr::Not(Box::new(self.unary(depth + 1)?)))
            }
            Tok::LParen => {
                let open = self.bump();
                let inner = self.or(depth + 1)?;
                if self.peek().kind != Tok::RParen {
                    return self.error(format!(
                        "expected `)` to close the `(` at column {}, found {}",
                        open.column,
                        self.peek().kind.describe()
                    ));
                }
                self.bump();
                Ok(inner)
            }
            _ => self.comparison(),
        }
    }

    fn comparison(&mut self) -> Result<Expr, ConditionError> {
        let (left, left_text) =
            self.operand(|found| format!("expected a comparison such as `result < 0.05`, found {found}"))?;
        let op = match self.peek().kind {
            Tok::Cmp(op) => {
                self.bump();
                op
            }
            ref other => {
                return self.error(format!(
                    "expected a comparison operator (<, <=, >, >=, ==, !=) after `{left_text}`, found {}",
                    other.describe()
                ));
            }
        };
        let want = if matches!(left, Operand::Number(_)) { OPERAND_HINT } else { "a number" };
        let (right, _) = self.operand(|found| format!("expected {want} after `{}`, found {found}", op_str(op)))?;
        Ok(Expr::Cmp(left, op, right))
    }

    /// One operand and its text; `expected` words the error when there is
    /// none, given what was found instead.
    fn operand(&mut self, expected: impl Fn(&str) -> String) -> Result<(Operand, String), ConditionError> {
        let token = self.peek().clone();
        match &token.kind {
            Tok::Num(text) => {
                let value: f64 = text.parse().map_err(|_| ConditionError {
                    column: token.column,
                    message: format!("`{text}` is not a number"),
                })?;
                if !value.is_finite() {
                    return self.error(format!("the number `{text}` is out of range"));
                }
                self.bump();
                Ok((Operand::Number(value), text.clone()))
            }
            Tok::Ident(name) if name == "result" => {
                self.bump();
                if self.peek().kind != Tok::LBracket {
                    return Ok((Operand::Sample(0), "result".into()));
                }
                self.bump();
                let index = match &self.peek().kind {
                    Tok::Num(text) if text.bytes().all(|b| b.is_ascii_digit()) => text.parse::<usize>().ok(),
                    _ => None,
                };
                let Some(index) = index else {
                    return self.error(format!(
                        "expected a sample index (0, 1, 2, …) inside `result[ ]`, found {}",
                        self.peek().kind.describe()
                    ));
                };
                self.bump();
                if self.peek().kind != Tok::RBracket {
                    return self
                        .error(format!("expected `]` after `result[{index}`, found {}", self.peek().kind.describe()));
                }
                self.bump();
                Ok((Operand::Sample(index), format!("result[{index}]")))
            }
            Tok::Ident(name) if name == "len" => {
                self.bump();
                for (want, text) in
                    [(Tok::LParen, "`(`"), (Tok::Ident("result".into()), "`result`"), (Tok::RParen, "`)`")]
                {
                    if self.peek().kind != want {
                        return self
                            .error(format!("expected {text} in `len(result)`, found {}", self.peek().kind.describe()));
                    }
                    self.bump();
                }
                Ok((Operand::Len, "len(result)".into()))
            }
            Tok::Ident(name) => {
                let hint = match name.to_ascii_lowercase().as_str() {
                    "and" => "; write `&&` for `and`".to_string(),
                    "or" => "; write `||` for `or`".to_string(),
                    "not" => "; write `!` for `not`".to_string(),
                    _ => format!("; use {OPERAND_HINT}"),
                };
                self.error(format!("unknown name `{name}`{hint}"))
            }
            other => {
                let message = expected(&other.describe());
                self.error(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval_str(s: &str, v: &[f64]) -> Result<bool, EvalError> {
        Condition::parse(s).unwrap().evaluate(v)
    }

    #[test]
    fn argo_style_conditions() {
        assert!(eval_str("result < 0.05", &[0.01]).unwrap());
        assert!(!eval_str("result < 0.05", &[0.31]).unwrap());
        assert!(eval_str("result[0] >= 0.99", &[0.995]).unwrap());
        assert!(eval_str("result == 0", &[0.0]).unwrap());
        assert!(eval_str("result[1] > 1e-3 && len(result) == 2", &[0.0, 0.01]).unwrap());
        assert!(eval_str("!(result > 5) || result == 7", &[7.0]).unwrap());
        assert!(eval_str("-1 < result", &[0.0]).unwrap());
        assert!(eval_str(".5E+1 == result", &[5.0]).unwrap());
    }

    #[test]
    fn precedence_and_binds_tighter_than_or() {
        // false && false || true  ==  (false && false) || true
        assert!(eval_str("result > 1 && result > 2 || result < 1", &[0.0]).unwrap());
        // true || false && false  ==  true || (false && false)
        assert!(eval_str("result < 1 || result > 2 && result > 3", &[0.0]).unwrap());
        // `!` negates the comparison that follows it: `!(result < 1)`.
        assert!(eval_str("!result < 1", &[5.0]).unwrap());
    }

    #[test]
    fn nan_compares_false_even_with_not_equal() {
        for op in ["<", "<=", ">", ">=", "==", "!="] {
            assert!(!eval_str(&format!("result {op} 1"), &[f64::NAN]).unwrap(), "{op}");
        }
        assert!(eval_str("!(result < 1)", &[f64::NAN]).unwrap());
        assert!(eval_str("result > 1", &[f64::INFINITY]).unwrap());
    }

    #[test]
    fn missing_samples_and_short_circuit() {
        assert_eq!(eval_str("result < 1", &[]), Err(EvalError::MissingSample { index: 0, series: 0 }));
        assert_eq!(
            eval_str("result[2] < 1", &[0.0, 0.0]).unwrap_err().to_string(),
            "`result[2]` does not exist: the query returned 2 series"
        );
        assert!(eval_str("len(result) == 0 || result < 1", &[]).unwrap());
        assert!(!Condition::parse("len(result) == 0").unwrap().reads_samples());
        assert!(Condition::parse("len(result) == 0 || !(result[3] > 1)").unwrap().reads_samples());
    }

    #[test]
    fn errors_say_what_was_expected_and_where() {
        let cases = [
            ("result < ", "expected a number after `<`, found the end of the condition at column 10"),
            ("result <", "expected a number after `<`, found the end of the condition at column 9"),
            ("result < x", "unknown name `x`; use `result`, `result[i]`, `len(result)` or a number at column 10"),
            (
                "result",
                "expected a comparison operator (<, <=, >, >=, ==, !=) after `result`, found the end of the condition at column 7",
            ),
            ("result = 1", "expected `==`, found a single `=` at column 8"),
            ("result < 1 & result > 0", "expected `&&`, found a single `&` at column 12"),
            (
                "result < 1 and result > 0",
                "unexpected `and` after a complete condition; join conditions with `&&` or `||` at column 12",
            ),
            ("(result < 1", "expected `)` to close the `(` at column 1, found the end of the condition at column 12"),
            (
                "result[-1] < 1",
                "expected a sample index (0, 1, 2, …) inside `result[ ]`, found number `-1` at column 8",
            ),
            (
                "result[1.5] < 1",
                "expected a sample index (0, 1, 2, …) inside `result[ ]`, found number `1.5` at column 8",
            ),
            ("result < 1e999", "the number `1e999` is out of range at column 10"),
            ("len(x) > 1", "expected `result` in `len(result)`, found `x` at column 5"),
            ("1 < 2 <", "unexpected `<` after a complete condition; join conditions with `&&` or `||` at column 7"),
            ("1 < )", "expected `result`, `result[i]`, `len(result)` or a number after `<`, found `)` at column 5"),
            ("", "expected a comparison such as `result < 0.05`, found the end of the condition at column 1"),
            ("résult < 1", "unexpected character `é` at column 2"),
            ("not result < 1", "unknown name `not`; write `!` for `not` at column 1"),
        ];
        for (src, want) in cases {
            assert_eq!(Condition::parse(src).unwrap_err().to_string(), want, "{src:?}");
        }
    }

    #[test]
    fn length_and_depth_are_limited() {
        let long = format!("result < {}", "1".repeat(MAX_LEN));
        assert!(Condition::parse(&long).unwrap_err().message.contains("at most 1024"));
        let deep = format!("{}result < 1{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(Condition::parse(&deep).unwrap_err().message.contains("more than 32 deep"));
        let ok = format!("{}result < 1{}", "(".repeat(MAX_DEPTH - 1), ")".repeat(MAX_DEPTH - 1));
        assert!(Condition::parse(&ok).is_ok());
        let nots = format!("{}result < 1", "!".repeat(MAX_DEPTH + 1));
        assert!(Condition::parse(&nots).is_err());
    }

    #[test]
    fn display_is_the_trimmed_source() {
        let c: Condition = "  result <  0.05 ".parse().unwrap();
        assert_eq!(c.to_string(), "result <  0.05");
    }
}
