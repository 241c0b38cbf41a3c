//! The comparison of a replayed run with its cassette: the tools offered to the model, each
//! call (tool, arguments minus the allowed pointers, outcome), the number of calls, the
//! end state and the final text. Every difference is one [`Difference`] whose text says
//! where, what was recorded and what the replay did — the readable diff a failing golden
//! test prints.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cassette::{Allowances, ExpectedCall, ExpectedTrace};

/// One way the replay differs from the recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// Where: `tools offered`, `call 2`, `calls`, `end state`, `final text`.
    pub at: String,
    /// What the cassette recorded.
    pub recorded: String,
    /// What the replay did.
    pub replayed: String,
    /// A hint at the likely cause, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "  {}:", self.at)?;
        writeln!(f, "    - recorded: {}", self.recorded)?;
        write!(f, "    + replayed: {}", self.replayed)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n      ({hint})")?;
        }
        Ok(())
    }
}

/// Compares what the replay offered and did with what the cassette expects.
pub fn compare(
    recorded_tools: &[String],
    replayed_tools: &[String],
    expected: &ExpectedTrace,
    replayed: &ExpectedTrace,
    allow: &Allowances,
) -> Vec<Difference> {
    let mut differences = Vec::new();
    let missing: Vec<&String> = recorded_tools
        .iter()
        .filter(|t| !replayed_tools.contains(t))
        .collect();
    let added: Vec<&String> = replayed_tools
        .iter()
        .filter(|t| !recorded_tools.contains(t))
        .collect();
    if !recorded_tools.is_empty() && (!missing.is_empty() || !added.is_empty()) {
        differences.push(Difference {
            at: "tools offered to the model".into(),
            recorded: list(recorded_tools.iter()),
            replayed: list(replayed_tools.iter()),
            hint: Some(tools_hint(&missing, &added)),
        });
    }
    for (index, (want, got)) in expected.calls.iter().zip(&replayed.calls).enumerate() {
        differences.extend(compare_call(index + 1, want, got, replayed_tools, allow));
    }
    let (want, got) = (expected.calls.len(), replayed.calls.len());
    if want != got {
        let extra =
            |calls: &[ExpectedCall]| list(calls.iter().skip(want.min(got)).map(|c| c.tool.clone()));
        differences.push(Difference {
            at: "number of tool calls".into(),
            recorded: format!(
                "{want}{}",
                if want > got {
                    format!(" (the replay lacks: {})", extra(&expected.calls))
                } else {
                    String::new()
                }
            ),
            replayed: format!(
                "{got}{}",
                if got > want {
                    format!(" (extra: {})", extra(&replayed.calls))
                } else {
                    String::new()
                }
            ),
            hint: None,
        });
    }
    if expected.end_state != replayed.end_state {
        differences.push(Difference {
            at: "end state".into(),
            recorded: expected.end_state.clone(),
            replayed: replayed.end_state.clone(),
            hint: None,
        });
    }
    if !allow.final_text && expected.final_text != replayed.final_text {
        differences.push(Difference {
            at: "final text".into(),
            recorded: quoted(expected.final_text.as_deref()),
            replayed: quoted(replayed.final_text.as_deref()),
            hint: Some(
                "allow it with \"allow\": {\"final_text\": true} in the cassette or \
                 --allow-final-text"
                    .into(),
            ),
        });
    }
    differences
}

/// The differences of call `n` (1-based).
fn compare_call(
    n: usize,
    want: &ExpectedCall,
    got: &ExpectedCall,
    replayed_tools: &[String],
    allow: &Allowances,
) -> Vec<Difference> {
    let at = format!("call {n} ({})", want.tool);
    let mut differences = Vec::new();
    if want.tool != got.tool {
        differences.push(Difference {
            at: format!("call {n}: tool"),
            recorded: want.tool.clone(),
            replayed: got.tool.clone(),
            hint: None,
        });
        return differences;
    }
    let pointers: Vec<&str> = allow.pointers_for(&want.tool).collect();
    let (a, b) = (
        without(&want.arguments, &pointers),
        without(&got.arguments, &pointers),
    );
    if a != b {
        differences.push(Difference {
            at: format!("{at}: arguments"),
            recorded: a.to_string(),
            replayed: b.to_string(),
            hint: Some(format!(
                "fields differing: {}; allow a field with \"allow\": {{\"arguments\": \
                 [\"{}:/pointer\"]}} or --allow-argument {}:/pointer",
                differing_pointers(&a, &b, "").join(", "),
                want.tool,
                want.tool
            )),
        });
    }
    if want.outcome != got.outcome {
        let hint =
            (got.outcome == "error:not_found" && !replayed_tools.contains(&want.tool)).then(|| {
                format!(
                    "the agent has no tool `{}` any more — renamed or removed? It offers: {}",
                    want.tool,
                    list(replayed_tools.iter())
                )
            });
        differences.push(Difference {
            at: format!("{at}: outcome"),
            recorded: want.outcome.clone(),
            replayed: got.outcome.clone(),
            hint,
        });
    }
    differences
}

/// `value` with the fields at `pointers` removed (pointers that do not resolve are ignored).
fn without(value: &Value, pointers: &[&str]) -> Value {
    let mut value = value.clone();
    for pointer in pointers {
        if pointer.is_empty() {
            return Value::Null;
        }
        let Some((parent, last)) = pointer.rsplit_once('/') else {
            continue;
        };
        let last = last.replace("~1", "/").replace("~0", "~");
        match value.pointer_mut(parent) {
            Some(Value::Object(map)) => {
                map.remove(&last);
            }
            Some(Value::Array(items)) => {
                if let Ok(index) = last.parse::<usize>()
                    && index < items.len()
                {
                    items.remove(index);
                }
            }
            _ => {}
        }
    }
    value
}

/// The JSON pointers at which `a` and `b` differ (objects and arrays walked; at most 8).
fn differing_pointers(a: &Value, b: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    walk(a, b, at, &mut out);
    out.truncate(8);
    if out.is_empty() {
        out.push("/".into());
    }
    out
}

fn walk(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let path = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                match (x.get(key), y.get(key)) {
                    (Some(p), Some(q)) => walk(p, q, &path, out),
                    _ => out.push(path),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                walk(p, q, &format!("{at}/{i}"), out);
            }
        }
        _ if a != b => out.push(if at.is_empty() { "/".into() } else { at.into() }),
        _ => {}
    }
}

fn tools_hint(missing: &[&String], added: &[&String]) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("no longer offered: {}", list(missing.iter())));
    }
    if !added.is_empty() {
        parts.push(format!("new: {}", list(added.iter())));
    }
    if missing.len() == 1 && added.len() == 1 {
        parts.push("a renamed tool?".into());
    }
    parts.join("; ")
}

fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let items: Vec<String> = items.map(|i| i.to_string()).collect();
    if items.is_empty() {
        "(none)".into()
    } else {
        items.join(", ")
    }
}

fn quoted(text: Option<&str>) -> String {
    match text {
        None => "(none)".into(),
        Some(text) => {
            let mut shown: String = text.chars().take(300).collect();
            if shown.len() < text.len() {
                shown.push('…');
            }
            format!("{shown:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(tool: &str, arguments: Value, outcome: &str) -> ExpectedCall {
        ExpectedCall {
            tool: tool.into(),
            arguments,
            outcome: outcome.into(),
        }
    }

    fn trace(calls: Vec<ExpectedCall>, end: &str, text: &str) -> ExpectedTrace {
        ExpectedTrace {
            calls,
            end_state: end.into(),
            final_text: Some(text.into()),
        }
    }

    #[test]
    fn identical_traces_have_no_difference() {
        let t = trace(vec![call("a", json!({"x": 1}), "ok")], "done", "fine");
        let tools = vec!["a".to_string()];
        assert!(compare(&tools, &tools, &t, &t, &Allowances::default()).is_empty());
    }

    #[test]
    fn a_renamed_tool_is_named_with_a_hint() {
        let recorded = trace(
            vec![call("get_summary", json!({"id": "v1"}), "ok")],
            "done",
            "x",
        );
        let replayed = trace(
            vec![call("get_summary", json!({"id": "v1"}), "error:not_found")],
            "done",
            "x",
        );
        let d = compare(
            &["get_summary".into()],
            &["fetch_summary".into()],
            &recorded,
            &replayed,
            &Allowances::default(),
        );
        assert_eq!(d.len(), 2, "{d:#?}");
        assert!(d[0].hint.as_deref().unwrap().contains("a renamed tool?"));
        assert_eq!(d[1].at, "call 1 (get_summary): outcome");
        assert!(
            d[1].hint
                .as_deref()
                .unwrap()
                .contains("no tool `get_summary` any more"),
            "{}",
            d[1]
        );
    }

    #[test]
    fn allowed_argument_fields_and_final_text_are_not_differences() {
        let recorded = trace(
            vec![call(
                "file",
                json!({"severity": "high", "findings": ["a"]}),
                "ok",
            )],
            "done",
            "one",
        );
        let replayed = trace(
            vec![call(
                "file",
                json!({"severity": "high", "findings": ["b"]}),
                "ok",
            )],
            "done",
            "two",
        );
        let tools = vec!["file".to_string()];
        let strict = compare(&tools, &tools, &recorded, &replayed, &Allowances::default());
        assert_eq!(strict.len(), 2, "{strict:#?}");
        assert!(strict[0].hint.as_deref().unwrap().contains("/findings/0"));
        let allow = Allowances {
            final_text: true,
            arguments: vec!["file:/findings".into()],
        };
        assert!(compare(&tools, &tools, &recorded, &replayed, &allow).is_empty());
        let wrong_tool = Allowances {
            final_text: true,
            arguments: vec!["other:/findings".into()],
        };
        assert_eq!(
            compare(&tools, &tools, &recorded, &replayed, &wrong_tool).len(),
            1
        );
    }

    #[test]
    fn missing_calls_and_end_states_are_listed() {
        let recorded = trace(
            vec![call("a", json!({}), "ok"), call("b", json!({}), "ok")],
            "done",
            "x",
        );
        let replayed = trace(vec![call("a", json!({}), "ok")], "failed", "x");
        let d = compare(&[], &[], &recorded, &replayed, &Allowances::default());
        let text: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(d.len(), 2, "{text:#?}");
        assert!(text[0].contains("the replay lacks: b"), "{}", text[0]);
        assert!(text[1].contains("- recorded: done") && text[1].contains("+ replayed: failed"));
    }
}
