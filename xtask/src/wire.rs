//! Checks every request the mock LLM receives for what providers reject: a tool result
//! that does not answer a tool call of the assistant message before it (an orphan), and an
//! assistant tool call left without a result before the conversation moves on. Covers the
//! OpenAI Chat (`role: tool` messages), Anthropic (`tool_use` / `tool_result` blocks) and
//! OpenAI Responses (`function_call` / `function_call_output` items) shapes.

use std::collections::HashSet;
use std::sync::Mutex;

use keel_testkit::mock_llm::{MockRequest, Protocol};
use serde_json::Value;

/// What the checks found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireTally {
    /// Model requests checked.
    pub requests: u64,
    /// Tool results seen (summed over requests).
    pub tool_results: u64,
    /// Tool results that answer no call of the assistant message before them.
    pub orphan_results: u64,
    /// Tool calls without a result before the next message (or the end of the request).
    pub unanswered_calls: u64,
    /// The first few problems, described.
    pub examples: Vec<String>,
}

/// Collects [`WireTally`] figures from requests as they arrive (see
/// `keel_testkit::mock_llm::MockServerOptions::on_request`).
#[derive(Debug, Default)]
pub struct WireCheck {
    tally: Mutex<WireTally>,
}

const EXAMPLES: usize = 5;

impl WireCheck {
    /// Checks one request.
    pub fn observe(&self, request: &MockRequest) {
        let Some(protocol) = request.protocol else {
            return;
        };
        let found = check_body(protocol, &request.body);
        let mut tally = match self.tally.lock() {
            Ok(tally) => tally,
            Err(poisoned) => poisoned.into_inner(),
        };
        tally.requests += 1;
        tally.tool_results += found.tool_results;
        tally.orphan_results += found.orphans.len() as u64;
        tally.unanswered_calls += found.unanswered.len() as u64;
        for id in found.orphans {
            if tally.examples.len() < EXAMPLES {
                tally.examples.push(format!(
                    "request #{}: tool result for `{id}` answers no preceding call",
                    request.seq
                ));
            }
        }
        for id in found.unanswered {
            if tally.examples.len() < EXAMPLES {
                tally.examples.push(format!(
                    "request #{}: tool call `{id}` has no result",
                    request.seq
                ));
            }
        }
    }

    /// The figures so far.
    pub fn tally(&self) -> WireTally {
        match self.tally.lock() {
            Ok(tally) => tally.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// What one request body holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BodyCheck {
    /// Tool results in the body.
    pub tool_results: u64,
    /// Ids of orphan tool results.
    pub orphans: Vec<String>,
    /// Ids of calls left without a result.
    pub unanswered: Vec<String>,
}

/// Walks the conversation in a request body: each tool result must answer a call of the
/// latest assistant message that is still open, and every call must be answered before
/// the next assistant or user turn.
pub fn check_body(protocol: Protocol, body: &Value) -> BodyCheck {
    let mut out = BodyCheck::default();
    let mut open: HashSet<String> = HashSet::new();
    let close_all = |open: &mut HashSet<String>, out: &mut BodyCheck| {
        let mut left: Vec<String> = open.drain().collect();
        left.sort();
        out.unanswered.extend(left);
    };
    let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    match protocol {
        Protocol::Anthropic => {
            for message in array(body, "messages") {
                let blocks = array(message, "content");
                match message.get("role").and_then(Value::as_str) {
                    Some("assistant") => {
                        close_all(&mut open, &mut out);
                        open.extend(
                            blocks
                                .iter()
                                .filter(|b| str_of(b, "type").as_deref() == Some("tool_use"))
                                .filter_map(|b| str_of(b, "id")),
                        );
                    }
                    _ => {
                        for block in blocks
                            .iter()
                            .filter(|b| str_of(b, "type").as_deref() == Some("tool_result"))
                        {
                            out.tool_results += 1;
                            let id = str_of(block, "tool_use_id").unwrap_or_default();
                            if !open.remove(&id) {
                                out.orphans.push(id);
                            }
                        }
                        // Anthropic wants every result in the very next user message.
                        close_all(&mut open, &mut out);
                    }
                }
            }
        }
        Protocol::OpenAiResponses => {
            for item in array(body, "input") {
                match str_of(item, "type").as_deref() {
                    Some("function_call") => {
                        open.extend(str_of(item, "call_id"));
                    }
                    Some("function_call_output") => {
                        out.tool_results += 1;
                        let id = str_of(item, "call_id").unwrap_or_default();
                        if !open.remove(&id) {
                            out.orphans.push(id);
                        }
                    }
                    Some("reasoning") => {}
                    _ => close_all(&mut open, &mut out),
                }
            }
        }
        Protocol::OpenAi | Protocol::OpenRouter | Protocol::Ollama => {
            for message in array(body, "messages") {
                match message.get("role").and_then(Value::as_str) {
                    Some("tool") => {
                        out.tool_results += 1;
                        let id = str_of(message, "tool_call_id").unwrap_or_default();
                        if !open.remove(&id) {
                            out.orphans.push(id);
                        }
                    }
                    Some("assistant") => {
                        close_all(&mut open, &mut out);
                        open.extend(
                            array(message, "tool_calls")
                                .iter()
                                .filter_map(|c| str_of(c, "id")),
                        );
                    }
                    _ => close_all(&mut open, &mut out),
                }
            }
        }
    }
    close_all(&mut open, &mut out);
    out
}

fn array<'v>(value: &'v Value, key: &str) -> &'v [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn openai_chat_orphans_and_unanswered_calls() {
        let good = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "tool_call_id": "b", "content": "x"},
            {"role": "tool", "tool_call_id": "a", "content": "y"},
            {"role": "assistant", "content": "done"},
        ]});
        let check = check_body(Protocol::OpenAi, &good);
        assert_eq!(check.tool_results, 2);
        assert!(check.orphans.is_empty() && check.unanswered.is_empty());
        let bad = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "z", "content": "orphan"},
            {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "tool_call_id": "a", "content": "y"},
            {"role": "tool", "tool_call_id": "a", "content": "twice"},
            {"role": "user", "content": "next"},
        ]});
        let check = check_body(Protocol::OpenAi, &bad);
        assert_eq!(check.orphans, vec!["z".to_string(), "a".to_string()]);
        assert_eq!(check.unanswered, vec!["b".to_string()]);
    }

    #[test]
    fn anthropic_results_must_follow_their_calls_at_once() {
        let good = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "t"}, {"type": "tool_use", "id": "u1"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1"}]},
        ]});
        let check = check_body(Protocol::Anthropic, &good);
        assert_eq!(
            (
                check.tool_results,
                check.orphans.len(),
                check.unanswered.len()
            ),
            (1, 0, 0)
        );
        let late = json!({"messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "u1"}]},
            {"role": "user", "content": "something else"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1"}]},
        ]});
        let check = check_body(Protocol::Anthropic, &late);
        assert_eq!(check.unanswered, vec!["u1".to_string()]);
        assert_eq!(check.orphans, vec!["u1".to_string()]);
    }

    #[test]
    fn responses_items() {
        let body = json!({"input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c9"},
        ]});
        let check = check_body(Protocol::OpenAiResponses, &body);
        assert_eq!(check.orphans, vec!["c9".to_string()]);
        assert_eq!(check.tool_results, 2);
    }
}
