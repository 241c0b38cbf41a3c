//! Grounded arguments in the grammar: each string a call rule requires to cite the run's
//! tool results ([`keel_core::GroundedArgument`]) gets a JSON Schema `pattern` that only
//! strings opening with one of the citations match, as a whole token, written as the
//! results write it: "payments::capture::test_capture_partial_refund fails", "2 of 142
//! tests fail", "0.02 error rate against 0.004".
//!
//! Measured on SmolLM2-135M over the Detective's v2.1.0 (docs/local-model.md): with the
//! grammar checking only the schema, it filed findings such as `["v2.1.0"]`, the runtime
//! refused them for citing nothing, and greedy decoding wrote the same call again until
//! the run gave up. With a citation required *anywhere* in the string, it wrote what it
//! wanted to (`v2.1.0`), could not close the string, and ran on (`v2.1.0.v2.v2…`) to the
//! length cap. Required first, it opens with a figure or a name and closes when it likes;
//! the call may still be refused for quoting a figure no tool returned (the pattern says
//! nothing about the rest of the string). The runtime's check ignores case; the pattern
//! does not, because a case-insensitive alternation of a release's few dozen citations
//! exhausted llguidance's lexer budget on the first token of the string.

use keel_core::GroundedArgument;
use serde_json::{Value, json};

/// Characters that continue a token of a finding as the call rules read it (letters,
/// digits, `_ . % -`): a citation must not touch one, or the token it stands in is
/// another one ("paymentsx"). A `.` may follow it when no such character comes next
/// (the end of a sentence).
const TOKEN_CHARS: &str = "A-Za-z0-9_.%-";

/// A regular expression (JSON Schema `pattern`) matching strings that open with one of
/// `citations` as a whole token, as written; anything may follow it. `None` when there
/// is nothing to cite.
pub fn citation_pattern(citations: &[String]) -> Option<String> {
    if citations.is_empty() {
        return None;
    }
    let alternatives: Vec<String> = citations.iter().map(|c| regex_syntax::escape(c)).collect();
    Some(format!(
        "^(?:{})(?:$|[^{TOKEN_CHARS}]|\\.(?:$|[^{TOKEN_CHARS}]))",
        alternatives.join("|")
    ))
}

/// Adds the pattern of `grounded` to the (capped) input schema of its tool: at its
/// pointer (`/findings`), each string — or each string item of the array there — must
/// match [`citation_pattern`]. A pointer the schema does not describe as a string or an
/// array of strings is left alone: the runtime still checks the call.
pub fn require_citations(arguments_schema: &mut Value, grounded: &GroundedArgument) {
    let Some(pattern) = citation_pattern(&grounded.citations) else {
        return;
    };
    let mut node = arguments_schema;
    for segment in grounded.pointer.split('/').skip(1) {
        let key = segment.replace("~1", "/").replace("~0", "~");
        let child = if node.get("properties").and_then(|p| p.get(&key)).is_some() {
            node.get_mut("properties").and_then(|p| p.get_mut(&key))
        } else if key.parse::<usize>().is_ok() {
            node.get_mut("items")
        } else {
            None
        };
        let Some(child) = child else { return };
        node = child;
    }
    if is_type(node, "array") {
        match node.get_mut("items") {
            Some(items) => node = items,
            None => return,
        }
    }
    if !is_type(node, "string") {
        return;
    }
    let Value::Object(map) = node else { return };
    if map.contains_key("pattern") {
        // The schema's own pattern stays; both must match.
        let all = map.entry("allOf").or_insert_with(|| json!([]));
        if let Value::Array(all) = all {
            all.push(json!({ "pattern": pattern }));
        }
    } else {
        map.insert("pattern".into(), Value::String(pattern));
    }
}

fn is_type(schema: &Value, name: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(types)) => types.iter().any(|t| t.as_str() == Some(name)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn findings(citations: &[&str]) -> GroundedArgument {
        GroundedArgument {
            tool: "file_risk_report".into(),
            pointer: "/findings".into(),
            citations: citations.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn the_pattern_matches_strings_opening_with_a_citation_as_a_whole_token() {
        let pattern = citation_pattern(&[
            "test_capture_refund".to_string(),
            "0.02".to_string(),
            "payments".to_string(),
        ])
        .unwrap();
        let regex = regex_lite(&pattern);
        for cited in [
            "payments::capture::test_capture_refund fails",
            "0.02 error rate against 0.004",
            "payments: 2 of 51 tests fail.",
            "payments.",
            "payments",
        ] {
            assert!(regex(cited), "{cited:?} should match {pattern}");
        }
        for uncited in [
            "v2.1.0",
            "fails in payments",
            "Error rate 0.02",
            "paymentsx fail",
            "error rate 0.021",
            "10.02 ms",
            "payments.v2 failed",
            "Payments fail",
            "The release looks fine",
        ] {
            assert!(!regex(uncited), "{uncited:?} should not match {pattern}");
        }
        assert_eq!(citation_pattern(&[]), None);
    }

    #[test]
    fn the_pattern_goes_on_the_strings_at_the_pointer() {
        let mut schema = json!({"type": "object", "properties": {
            "release_id": {"type": "string"},
            "findings": {"type": "array", "items": {"type": "string", "maxLength": 200}},
            "summary": {"type": "string", "pattern": "^[A-Z]"}
        }});
        require_citations(&mut schema, &findings(&["payments"]));
        let items = &schema["properties"]["findings"]["items"];
        assert!(items["pattern"].as_str().unwrap().contains("payments"));
        assert_eq!(items["maxLength"], 200);
        assert!(schema["properties"]["release_id"].get("pattern").is_none());
        // A string with a pattern of its own keeps it; the citation joins it.
        let mut summary = findings(&["payments"]);
        summary.pointer = "/summary".into();
        require_citations(&mut schema, &summary);
        assert_eq!(schema["properties"]["summary"]["pattern"], "^[A-Z]");
        assert!(
            schema["properties"]["summary"]["allOf"][0]["pattern"]
                .as_str()
                .unwrap()
                .contains("payments")
        );
        // A pointer the schema does not describe, or no citation: nothing changes.
        let before = schema.clone();
        let mut elsewhere = findings(&["payments"]);
        elsewhere.pointer = "/missing".into();
        require_citations(&mut schema, &elsewhere);
        require_citations(&mut schema, &findings(&[]));
        assert_eq!(schema, before);
    }

    /// Matches as a JSON Schema validator does (unanchored), with the `regex` crate;
    /// llguidance's reading of the same pattern is checked against a real model in
    /// `tests/local_model.rs`.
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).unwrap();
        move |text: &str| re.is_match(text)
    }
}
