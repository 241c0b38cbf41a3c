//! Typed answers ([`Agent::prompt_typed`]): the model is asked for JSON matching the JSON
//! Schema of a Rust type (generated with schemars), the answer is checked with
//! `jsonschema`, and while it does not match, the violations are sent back on the same
//! thread — a bounded number of times — before the call fails listing the last ones.
//!
//! Before validation the answer goes through the runtime's bounded output repair
//! ([`keel_runtime::repair`]): coercions that invent nothing (`"3"` → `3`, a missing field
//! with a schema default), so a nearly right answer costs no extra model call.

use std::marker::PhantomData;

use keel_core::Message;
use keel_runtime::Thread;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::agent::{Agent, final_text};
use crate::error::Error;

/// The most violations reported for one answer (to the model and in the error).
const MAX_VIOLATIONS: usize = 8;

impl Agent {
    /// Sends `text` on a new thread asking for a JSON answer matching `T`'s JSON Schema,
    /// and returns it as a `T`. An answer that does not match is sent back with its
    /// violations on the same thread, up to [`Agent::max_repairs`] times (default 2);
    /// then the call fails with [`Error::InvalidOutput`] listing the last violations. A
    /// run that ends other than `done` fails as in [`Agent::prompt`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keel::Error> {
    /// use std::sync::Arc;
    /// use keel_testkit::{ScriptStep, ScriptedModel};
    /// use schemars::JsonSchema;
    /// use serde::Deserialize;
    ///
    /// #[derive(Debug, Deserialize, JsonSchema)]
    /// struct Verdict {
    ///     /// Whether the release may ship.
    ///     ship: bool,
    ///     /// Risk score, 0 to 10.
    ///     #[schemars(range(min = 0, max = 10))]
    ///     risk: u8,
    /// }
    ///
    /// let model = Arc::new(ScriptedModel::new(vec![
    ///     ScriptStep::text(r#"{"ship": true, "risk": 42}"#), // out of range: sent back
    ///     ScriptStep::text(r#"{"ship": true, "risk": 4}"#),
    /// ]));
    /// let agent = keel::Agent::builder("reviewer", model.clone()).build()?;
    /// let verdict: Verdict = agent.prompt_typed("Review release v2.1.0").await?;
    /// assert_eq!((verdict.ship, verdict.risk), (true, 4));
    /// // The violation went back to the model on the same thread.
    /// let repair = model.requests()[1].messages.last().unwrap().text();
    /// assert!(repair.contains("/risk"), "{repair}");
    /// # Ok(()) }
    /// ```
    pub async fn prompt_typed<T>(&self, text: impl Into<String>) -> Result<T, Error>
    where
        T: JsonSchema + DeserializeOwned,
    {
        let contract = Contract::<T>::new()?;
        let mut thread = Thread::new();
        let mut request = format!("{}\n\n{}", text.into(), contract.instructions());
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let outcome = self.run(vec![Message::user(request)], &mut thread).await?;
            let answer = final_text(outcome)?;
            match contract.check(&answer) {
                Ok(value) => return Ok(value),
                Err(violations) if attempts > self.max_repairs() => {
                    return Err(Error::InvalidOutput {
                        type_name: contract.type_name.clone(),
                        thread_id: thread.id().to_string(),
                        attempts,
                        violations,
                        output: answer,
                    });
                }
                Err(violations) => request = repair_request(&violations),
            }
        }
    }
}

/// The JSON Schema of `T`, compiled.
struct Contract<T> {
    schema: Value,
    validator: jsonschema::Validator,
    type_name: String,
    _type: PhantomData<fn() -> T>,
}

impl<T: JsonSchema + DeserializeOwned> Contract<T> {
    fn new() -> Result<Self, Error> {
        let type_name = short_type_name(std::any::type_name::<T>());
        let schema = keel_core::tool::schema_for::<T>();
        let validator = jsonschema::validator_for(&schema).map_err(|e| Error::Schema {
            type_name: type_name.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            schema,
            validator,
            type_name,
            _type: PhantomData,
        })
    }

    /// What the model is told about the answer's form.
    fn instructions(&self) -> String {
        let schema = serde_json::to_string_pretty(&self.schema).unwrap_or_default();
        format!(
            "Answer with one JSON value that matches this JSON Schema, and nothing else (no \
             prose, no Markdown code fence):\n{schema}"
        )
    }

    /// The answer as a `T`, or every way it fails the schema.
    fn check(&self, answer: &str) -> Result<T, Vec<String>> {
        let mut value = extract_json(answer).map_err(|e| vec![e])?;
        let mut repaired = value.clone();
        if keel_runtime::repair::within_bounds(&keel_runtime::repair::repair(
            &mut repaired,
            &self.schema,
        )) {
            value = repaired;
        }
        let violations: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(MAX_VIOLATIONS)
            .map(|error| {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() { "/".into() } else { path };
                format!("at `{path}`: {error}")
            })
            .collect();
        if !violations.is_empty() {
            return Err(violations);
        }
        serde_json::from_value(value).map_err(|e| vec![format!("{e}")])
    }
}

/// A type's name without module paths: `alloc::vec::Vec<app::Report>` → `Vec<Report>`.
fn short_type_name(full: &str) -> String {
    let mut short = String::new();
    let mut path = String::new();
    let last = |path: &str| path.rsplit("::").next().unwrap_or_default().to_string();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            path.push(c);
        } else {
            short.push_str(&last(&path));
            path.clear();
            short.push(c);
        }
    }
    short.push_str(&last(&path));
    short
}

/// The JSON value in a model's answer: the whole text, else the inside of a Markdown code
/// fence, else the span from the first `{`/`[` to the last `}`/`]`.
fn extract_json(answer: &str) -> Result<Value, String> {
    let text = answer.trim();
    let first_error = match serde_json::from_str(text) {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    if let Some(fenced) = text.strip_prefix("```") {
        let body = fenced.split_once('\n').map_or("", |(_, rest)| rest);
        let body = body.trim_end().strip_suffix("```").unwrap_or(body);
        if let Ok(value) = serde_json::from_str(body.trim()) {
            return Ok(value);
        }
    }
    let start = text.find(['{', '[']);
    let end = text.rfind(['}', ']']);
    if let (Some(start), Some(end)) = (start, end)
        && let Some(span) = text.get(start..=end)
        && let Ok(value) = serde_json::from_str(span)
    {
        return Ok(value);
    }
    Err(format!(
        "the answer is not a JSON value ({first_error}); answer with the JSON alone"
    ))
}

/// The message that sends violations back to the model.
fn repair_request(violations: &[String]) -> String {
    let list: Vec<String> = violations.iter().map(|v| format!("- {v}")).collect();
    format!(
        "Your answer does not match the JSON Schema I gave you:\n{}\nReply again with only \
         the corrected JSON value.",
        list.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_found_bare_fenced_or_inside_prose() {
        assert_eq!(
            extract_json(" {\"a\": 1} ").unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            extract_json("```json\n{\"a\": 1}\n```").unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            extract_json("Here it is: [1, 2] — done.").unwrap(),
            serde_json::json!([1, 2])
        );
        let error = extract_json("no json here").unwrap_err();
        assert!(error.contains("not a JSON value"), "{error}");
    }

    #[test]
    fn type_names_lose_their_module_paths() {
        assert_eq!(short_type_name("app::report::Report"), "Report");
        assert_eq!(
            short_type_name("alloc::vec::Vec<app::Report>"),
            "Vec<Report>"
        );
        assert_eq!(
            short_type_name("std::collections::HashMap<alloc::string::String, u8>"),
            "HashMap<String, u8>"
        );
    }

    #[derive(Debug, serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Pair {
        left: u32,
        right: String,
    }

    #[test]
    fn violations_name_the_path_and_coercions_need_no_repair_round() {
        let contract = Contract::<Pair>::new().unwrap();
        let violations = contract
            .check(r#"{"left": "x", "right": "r"}"#)
            .unwrap_err();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("at `/left`"), "{violations:?}");
        let missing = contract.check(r#"{"left": 1}"#).unwrap_err();
        assert!(missing[0].contains("right"), "{missing:?}");
        // "3" → 3 invents nothing: accepted without asking the model again.
        let pair = contract.check(r#"{"left": "3", "right": "r"}"#).unwrap();
        assert_eq!(pair.left, 3);
    }
}
