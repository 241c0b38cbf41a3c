//! A small, safe arithmetic expression evaluator for the `calculator` tool.
//!
//! Hand-written because the crates that evaluate expressions (evalexpr, meval, ...) accept
//! far more than arithmetic — variables, assignments, functions, strings — and the tool's
//! contract is exactly `+ - * / ^`, unary minus, parentheses and decimals. A recursive-
//! descent parser over that grammar is about a hundred lines and cannot execute anything.
//!
//! Grammar: `expr := term (('+'|'-') term)*`, `term := unary (('*'|'/') unary)*`,
//! `unary := '-' unary | '+' unary | power`, `power := atom ('^' unary)?`
//! (right-associative, binding tighter than unary minus: `-2^2` is -4), `atom := number |
//! '(' expr ')'`.

use std::fmt;

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprError {
    /// The text is not a valid expression; `position` is a byte offset.
    Syntax {
        /// Byte offset of the problem.
        position: usize,
        /// What was expected.
        message: String,
    },
    /// Division by zero.
    DivisionByZero,
    /// The result is infinite or not a number.
    NotFinite,
    /// Nested too deeply.
    TooDeep,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { position, message } => {
                write!(f, "syntax error at {position}: {message}")
            }
            Self::DivisionByZero => f.write_str("division by zero"),
            Self::NotFinite => f.write_str("the result is not a finite number"),
            Self::TooDeep => f.write_str("the expression is nested too deeply (limit 64)"),
        }
    }
}

const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
}

/// Evaluates an arithmetic expression.
pub fn evaluate(text: &str) -> Result<f64, ExprError> {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        pos: 0,
        depth: 0,
    };
    let value = parser.expr()?;
    parser.skip_ws();
    if parser.pos < parser.bytes.len() {
        return Err(parser.error("unexpected character; expected an operator or the end"));
    }
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ExprError::NotFinite)
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn error(&self, message: &str) -> ExprError {
        ExprError::Syntax {
            position: self.pos,
            message: message.to_string(),
        }
    }

    fn expr(&mut self) -> Result<f64, ExprError> {
        let mut value = self.term()?;
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'+') => {
                    self.pos += 1;
                    value += self.term()?;
                }
                Some(b'-') => {
                    self.pos += 1;
                    value -= self.term()?;
                }
                _ => return Ok(value),
            }
        }
    }

    fn term(&mut self) -> Result<f64, ExprError> {
        let mut value = self.unary()?;
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'*') => {
                    self.pos += 1;
                    value *= self.unary()?;
                }
                Some(b'/') => {
                    self.pos += 1;
                    let divisor = self.unary()?;
                    if divisor == 0.0 {
                        return Err(ExprError::DivisionByZero);
                    }
                    value /= divisor;
                }
                _ => return Ok(value),
            }
        }
    }

    fn power(&mut self) -> Result<f64, ExprError> {
        let base = self.atom()?;
        self.skip_ws();
        if self.peek() == Some(b'^') {
            self.pos += 1;
            let exponent = self.nested(Self::unary)?;
            return Ok(base.powf(exponent));
        }
        Ok(base)
    }

    fn unary(&mut self) -> Result<f64, ExprError> {
        self.skip_ws();
        match self.peek() {
            Some(b'-') => {
                self.pos += 1;
                Ok(-self.nested(Self::unary)?)
            }
            Some(b'+') => {
                self.pos += 1;
                self.nested(Self::unary)
            }
            _ => self.power(),
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Result<f64, ExprError>) -> Result<f64, ExprError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ExprError::TooDeep);
        }
        let value = f(self);
        self.depth -= 1;
        value
    }

    fn atom(&mut self) -> Result<f64, ExprError> {
        self.skip_ws();
        match self.peek() {
            Some(b'(') => {
                self.pos += 1;
                let value = self.nested(Self::expr)?;
                self.skip_ws();
                if self.peek() != Some(b')') {
                    return Err(self.error("expected `)`"));
                }
                self.pos += 1;
                Ok(value)
            }
            Some(b) if b.is_ascii_digit() || b == b'.' => self.number(),
            Some(_) => Err(self.error("expected a number or `(`")),
            None => Err(self.error("unexpected end of expression")),
        }
    }

    fn number(&mut self) -> Result<f64, ExprError> {
        let start = self.pos;
        let mut seen_dot = false;
        while let Some(b) = self.peek() {
            if b.is_ascii_digit() {
                self.pos += 1;
            } else if b == b'.' && !seen_dot {
                seen_dot = true;
                self.pos += 1;
            } else {
                break;
            }
        }
        let text = std::str::from_utf8(self.bytes.get(start..self.pos).unwrap_or_default())
            .unwrap_or_default();
        text.parse::<f64>().map_err(|_| ExprError::Syntax {
            position: start,
            message: format!("`{text}` is not a number"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn arithmetic() {
        assert_eq!(evaluate("2*(3+4)"), Ok(14.0));
        assert_eq!(evaluate(" 17 * 23 "), Ok(391.0));
        assert_eq!(evaluate("2^3^2"), Ok(512.0));
        assert_eq!(evaluate("-2^2"), Ok(-4.0));
        assert_eq!(evaluate("2^-1"), Ok(0.5));
        assert_eq!(evaluate("1.5 + .5"), Ok(2.0));
        assert_eq!(evaluate("10/4"), Ok(2.5));
        assert_eq!(evaluate("-(3 - 5)"), Ok(2.0));
        assert_eq!(evaluate("1/0"), Err(ExprError::DivisionByZero));
        assert!(matches!(evaluate("2 +"), Err(ExprError::Syntax { .. })));
        assert!(matches!(evaluate("2 3"), Err(ExprError::Syntax { .. })));
        assert!(matches!(evaluate("abs(3)"), Err(ExprError::Syntax { .. })));
        assert!(matches!(evaluate("1.2.3"), Err(ExprError::Syntax { .. })));
        assert_eq!(evaluate(&"(".repeat(200)), Err(ExprError::TooDeep));
    }

    proptest! {
        #[test]
        fn never_panics(text in ".{0,64}") {
            let _ = evaluate(&text);
        }

        #[test]
        fn integer_sums_and_products(a in -1000i64..1000, b in -1000i64..1000, c in 1i64..1000) {
            let text = format!("({a}) + ({b}) * ({c})");
            prop_assert_eq!(evaluate(&text), Ok((a + b * c) as f64));
        }
    }
}
