//! The calculator's expression evaluator (`keel_tools::expr`). The first byte picks a mode:
//! - raw text: never panics; `Ok` only for finite values; a syntax error points inside
//!   the text;
//! - generated expression: a random expression tree printed fully parenthesized must
//!   evaluate to exactly what a direct evaluation of the tree gives (same f64 operations in
//!   the same order), including division by zero and non-finite results.
#![no_main]

use arbitrary::{Result, Unstructured};
use keel_tools::expr::{ExprError, evaluate};
use libfuzzer_sys::fuzz_target;

#[derive(Debug)]
enum Tree {
    Number(String),
    Neg(Box<Tree>),
    Pos(Box<Tree>),
    Bin(u8, Box<Tree>, Box<Tree>),
}

fn arb_tree(u: &mut Unstructured, depth: u32) -> Result<Tree> {
    if depth == 0 || u.ratio(1u8, 3u8)? {
        let whole = u.int_in_range(0u32..=1000)?;
        let text = match u.int_in_range(0..=3)? {
            0 => format!("{whole}.{}", u.int_in_range(0u32..=999)?),
            1 => format!(".{}", u.int_in_range(0u32..=99)?),
            2 => format!("{whole}."),
            _ => whole.to_string(),
        };
        return Ok(Tree::Number(text));
    }
    Ok(match u.int_in_range(0..=6)? {
        0 => Tree::Neg(Box::new(arb_tree(u, depth - 1)?)),
        1 => Tree::Pos(Box::new(arb_tree(u, depth - 1)?)),
        _ => Tree::Bin(
            *u.choose(b"+-*/^")?,
            Box::new(arb_tree(u, depth - 1)?),
            Box::new(arb_tree(u, depth - 1)?),
        ),
    })
}

/// Fully parenthesized, with arbitrary-looking spacing.
fn print(tree: &Tree, out: &mut String) {
    match tree {
        Tree::Number(text) => out.push_str(text),
        Tree::Neg(inner) | Tree::Pos(inner) => {
            out.push_str(if matches!(tree, Tree::Neg(_)) {
                "-("
            } else {
                "+ ("
            });
            print(inner, out);
            out.push(')');
        }
        Tree::Bin(op, left, right) => {
            out.push('(');
            print(left, out);
            out.push_str(") ");
            out.push(char::from(*op));
            out.push_str("\t(");
            print(right, out);
            out.push(')');
        }
    }
}

fn eval(tree: &Tree) -> std::result::Result<f64, ExprError> {
    Ok(match tree {
        Tree::Number(text) => text.parse::<f64>().map_err(|_| ExprError::NotFinite)?,
        Tree::Neg(inner) => -eval(inner)?,
        Tree::Pos(inner) => eval(inner)?,
        Tree::Bin(op, left, right) => {
            let a = eval(left)?;
            let b = eval(right)?;
            match op {
                b'+' => a + b,
                b'-' => a - b,
                b'*' => a * b,
                b'/' if b == 0.0 => return Err(ExprError::DivisionByZero),
                b'/' => a / b,
                _ => a.powf(b),
            }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        match evaluate(text) {
            Ok(value) => assert!(value.is_finite(), "{text:?} gave {value}"),
            Err(ExprError::Syntax { position, .. }) => {
                assert!(
                    position <= text.len(),
                    "error position {position} past the end"
                )
            }
            Err(_) => {}
        }
        return;
    }
    let mut u = Unstructured::new(rest);
    // Depth 12 keeps nesting (two levels per node at most) under the evaluator's limit.
    let Ok(tree) = arb_tree(&mut u, 12) else {
        return;
    };
    let mut text = String::new();
    print(&tree, &mut text);
    let expected = eval(&tree).and_then(|v| {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(ExprError::NotFinite)
        }
    });
    let got = evaluate(&text);
    match (&got, &expected) {
        (Ok(a), Ok(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{text} = {a}, expected {b}"),
        _ => assert_eq!(got, expected, "{text}"),
    }
});
