//! Property tests of the condition language: any input is parsed without
//! panicking, and generated well-formed conditions, written out with
//! varying spacing and parentheses, evaluate as this file's own reference
//! evaluator says (precedence, short-circuiting, NaN, missing samples).

use kiln_deploy::condition::{Condition, EvalError, MAX_LEN};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Operand {
    Number(f64, bool), // value, written in scientific notation
    Result,            // `result`
    Sample(usize),     // `result[i]`
    Len,               // `len(result)`
}

#[derive(Debug, Clone)]
enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Paren(Box<Expr>),
    Cmp(Operand, &'static str, Operand),
}

/// What the reference evaluator says: a boolean, or the sample it missed.
type Outcome = Result<bool, (usize, usize)>;

fn operand_value(o: &Operand, v: &[f64]) -> Result<f64, (usize, usize)> {
    match o {
        Operand::Number(n, _) => Ok(*n),
        Operand::Result => v.first().copied().ok_or((0, v.len())),
        Operand::Sample(i) => v.get(*i).copied().ok_or((*i, v.len())),
        Operand::Len => Ok(v.len() as f64),
    }
}

fn reference(e: &Expr, v: &[f64]) -> Outcome {
    match e {
        Expr::Or(a, b) => Ok(reference(a, v)? || reference(b, v)?),
        Expr::And(a, b) => Ok(reference(a, v)? && reference(b, v)?),
        Expr::Not(a) => Ok(!reference(a, v)?),
        Expr::Paren(a) => reference(a, v),
        Expr::Cmp(a, op, b) => {
            let (a, b) = (operand_value(a, v)?, operand_value(b, v)?);
            // NaN meets no comparison, `!=` included.
            if a.is_nan() || b.is_nan() {
                return Ok(false);
            }
            Ok(match *op {
                "<" => a < b,
                "<=" => a <= b,
                ">" => a > b,
                ">=" => a >= b,
                "==" => a == b,
                "!=" => a != b,
                _ => unreachable!(),
            })
        }
    }
}

const OR: u8 = 0;
const AND: u8 = 1;
const UNARY: u8 = 2;

/// Writes `e` with the fewest parentheses its precedence needs (plus the
/// explicit `Paren` nodes); `space` picks the whitespace between tokens.
fn render(e: &Expr, ctx: u8, space: &mut impl FnMut() -> &'static str) -> String {
    let (prec, text) = match e {
        Expr::Or(a, b) => {
            let l = render(a, OR, space);
            let (s1, s2) = (space(), space());
            (OR, format!("{l}{s1}||{s2}{}", render(b, AND, space)))
        }
        Expr::And(a, b) => {
            let l = render(a, AND, space);
            let (s1, s2) = (space(), space());
            (AND, format!("{l}{s1}&&{s2}{}", render(b, UNARY, space)))
        }
        Expr::Not(a) => {
            let s = space();
            (UNARY, format!("!{s}{}", render(a, UNARY, space)))
        }
        Expr::Paren(a) => {
            let (s1, s2) = (space(), space());
            (UNARY, format!("({s1}{}{s2})", render(a, OR, space)))
        }
        Expr::Cmp(a, op, b) => {
            let (s1, s2) = (space(), space());
            (UNARY, format!("{}{s1}{op}{s2}{}", operand(a, space), operand(b, space)))
        }
    };
    if prec < ctx {
        let (s1, s2) = (space(), space());
        format!("({s1}{text}{s2})")
    } else {
        text
    }
}

fn operand(o: &Operand, space: &mut impl FnMut() -> &'static str) -> String {
    match o {
        Operand::Number(n, true) => format!("{n:e}"),
        Operand::Number(n, false) => format!("{n}"),
        Operand::Result => "result".into(),
        Operand::Sample(i) => {
            let (s1, s2, s3) = (space(), space(), space());
            format!("result{s1}[{s2}{i}{s3}]")
        }
        Operand::Len => {
            let (s1, s2, s3) = (space(), space(), space());
            format!("len{s1}({s2}result{s3})")
        }
    }
}

fn interesting_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(0.05),
        Just(1.0),
        Just(-1.0),
        Just(2.0),
        (-1e6f64..1e6f64),
        (-300i32..300).prop_map(|e| 10f64.powi(e)),
    ]
}

fn sample() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => interesting_f64(),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

fn operand_strategy() -> impl Strategy<Value = Operand> {
    prop_oneof![
        (interesting_f64(), any::<bool>()).prop_map(|(n, sci)| Operand::Number(n, sci)),
        Just(Operand::Result),
        (0usize..5).prop_map(Operand::Sample),
        Just(Operand::Len),
    ]
}

fn expr_strategy() -> impl Strategy<Value = Expr> {
    let op = prop::sample::select(vec!["<", "<=", ">", ">=", "==", "!="]);
    let leaf = (operand_strategy(), op, operand_strategy()).prop_map(|(a, o, b)| Expr::Cmp(a, o, b));
    leaf.prop_recursive(6, 24, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            inner.clone().prop_map(|a| Expr::Not(Box::new(a))),
            inner.prop_map(|a| Expr::Paren(Box::new(a))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn generated_conditions_evaluate_as_the_reference_does(
        expr in expr_strategy(),
        spaces in prop::collection::vec(prop::sample::select(vec!["", " ", "  ", "\t", "\n"]), 1..64),
        values in prop::collection::vec(sample(), 0..4),
    ) {
        let mut k = 0;
        let mut space = || { k += 1; spaces[k % spaces.len()] };
        let text = render(&expr, OR, &mut space);
        prop_assume!(text.len() <= MAX_LEN);
        let condition = Condition::parse(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?} did not parse: {e}")))?;
        let got = condition.evaluate(&values).map_err(|e| match e {
            EvalError::MissingSample { index, series } => (index, series),
        });
        prop_assert_eq!(got, reference(&expr, &values), "{:?} on {:?}", text, values);
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,200}") {
        if let Ok(c) = Condition::parse(&text) {
            let _ = c.evaluate(&[0.5, f64::NAN]);
        }
    }

    #[test]
    fn condition_like_text_never_panics(text in "[ result\\[\\]()!&|<>=0-9.eE+len-]{0,120}") {
        match Condition::parse(&text) {
            Ok(c) => {
                let _ = c.evaluate(&[]);
                let _ = c.evaluate(&[1.0, 2.0]);
            }
            Err(e) => {
                // The column points into the input or just past its end.
                prop_assert!(e.column >= 1 && e.column <= text.chars().count() + 1, "{e} for {text:?}");
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn long_or_deep_input_is_refused_not_overflowed(n in 0usize..20_000, open in any::<bool>()) {
        let text = if open { "(".repeat(n) } else { "!".repeat(n) + "result < 1" };
        let parsed = Condition::parse(&text);
        if n > 40 {
            prop_assert!(parsed.is_err());
        }
    }
}
