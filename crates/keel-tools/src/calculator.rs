//! `calculator`: evaluates arithmetic expressions safely (see [`crate::expr`]).

use keel_core::{Tool, ToolContext, ToolError, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::expr::{ExprError, evaluate};

/// Arguments of `calculator`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CalculatorArgs {
    /// An arithmetic expression using numbers, + - * / ^ and parentheses, e.g. `2*(3+4)`.
    #[schemars(length(min = 1, max = 1000))]
    pub expression: String,
}

/// Output of `calculator`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CalculatorOutput {
    /// The expression as given.
    pub expression: String,
    /// Its value.
    pub result: f64,
    /// The thread the call ran in.
    pub thread_id: String,
    /// The run the call ran in.
    pub run_id: String,
}

/// The `calculator` tool.
#[derive(Debug, Default, Clone, Copy)]
pub struct Calculator;

const USAGE: &str = "\
calculator — Usage Guide

Primary purpose:
- Compute the exact value of an arithmetic expression instead of doing arithmetic yourself.

Rules:
- Supports numbers (decimals allowed), + - * / ^ (power), unary minus and parentheses.
- No variables, functions, units or percentages: rewrite `15% of 80` as `0.15*80`.
- Read-only and deterministic: calling it again with the same expression gives the same result.

Arguments:
- expression: the expression to evaluate, e.g. `2*(3+4)` (required, 1 to 1000 characters).

Error codes:
- invalid_input: syntax error (the message gives the position), division by zero, or a result that is not finite.

Good usage:
- {\"expression\": \"17*23\"}
- {\"expression\": \"(1.5 + 2.25) / 3\"}

Bad usage:
- {\"expression\": \"sqrt(2)\"} (functions are not supported; use 2^0.5)
- {\"expression\": \"17 times 23\"} (words are not operators)";

impl Tool for Calculator {
    type Args = CalculatorArgs;
    type Output = CalculatorOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "calculator",
            "Evaluate an arithmetic expression (+ - * / ^, parentheses, decimals) exactly.",
            USAGE,
        )
    }

    async fn call(
        &self,
        args: CalculatorArgs,
        ctx: &ToolContext,
    ) -> Result<CalculatorOutput, ToolError> {
        match evaluate(&args.expression) {
            Ok(result) => Ok(CalculatorOutput {
                expression: args.expression,
                result,
                thread_id: ctx.thread_id.clone(),
                run_id: ctx.run_id.clone(),
            }),
            Err(error) => {
                let hint = match &error {
                    ExprError::DivisionByZero => "change the divisor",
                    ExprError::Syntax { .. } => "use only numbers, + - * / ^ and parentheses",
                    ExprError::NotFinite | ExprError::TooDeep => "simplify the expression",
                };
                Err(ToolError::invalid_input(format!(
                    "cannot evaluate `{}`: {error}; {hint}",
                    args.expression
                )))
            }
        }
    }
}
