//! Token estimates: the real BPE tokenizer (tiktoken) for OpenAI-family models, and
//! keel-core's documented heuristic (one token per 4 bytes) for everything else.
//! Provider-reported usage always wins over these estimates.

use keel_core::{Message, ModelRequest, Part};
use tiktoken_rs::CoreBPE;

/// Per-message overhead of the chat format (role markers), per OpenAI's cookbook.
const PER_MESSAGE: u64 = 3;
/// Tokens that prime the assistant's reply.
const REPLY_PRIMING: u64 = 3;

/// The tokenizer of an OpenAI-family model, if it is one (`gpt-4o`, `gpt-5`, `o3`,
/// `openai/gpt-4.1` on OpenRouter, …).
pub fn openai_tokenizer(model: &str) -> Option<&'static CoreBPE> {
    let name = model.strip_prefix("openai/").unwrap_or(model);
    let o200k = [
        "gpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-5",
        "o1",
        "o3",
        "o4",
        "chatgpt-4o",
        "gpt-oss",
    ];
    if o200k.iter().any(|p| name.starts_with(p)) {
        return Some(tiktoken_rs::o200k_base_singleton());
    }
    if name.starts_with("gpt-4") || name.starts_with("gpt-3.5") {
        return Some(tiktoken_rs::cl100k_base_singleton());
    }
    None
}

/// The most tokens [`count_request_tokens`] can find in a request whose
/// [`keel_core::model::estimate_request_tokens`] heuristic is `heuristic`: a BPE token is
/// at least one byte and the heuristic gives every text at least a quarter of its bytes
/// plus one (and each message, call and result more overhead than the chat format has),
/// so four times the heuristic, plus the reply priming and the system message's marker,
/// bounds the exact count.
pub fn exact_count_at_most(heuristic: u64) -> u64 {
    heuristic
        .saturating_mul(4)
        .saturating_add(REPLY_PRIMING + PER_MESSAGE)
}

fn count(bpe: &CoreBPE, text: &str) -> u64 {
    bpe.encode_with_special_tokens(text).len() as u64
}

/// Counts a request's input tokens with a BPE tokenizer.
pub fn count_request_tokens(bpe: &CoreBPE, request: &ModelRequest<'_>) -> u64 {
    let mut total = REPLY_PRIMING;
    if let Some(system) = request.system {
        total = total
            .saturating_add(PER_MESSAGE)
            .saturating_add(count(bpe, system));
    }
    for message in request.messages {
        total = total.saturating_add(count_message(bpe, message));
    }
    for tool in request.tools {
        total = total
            .saturating_add(count(bpe, &tool.name))
            .saturating_add(count(bpe, &tool.description))
            .saturating_add(count(bpe, &tool.input_schema.to_string()))
            .saturating_add(PER_MESSAGE);
    }
    total
}

fn count_message(bpe: &CoreBPE, message: &Message) -> u64 {
    let mut total = PER_MESSAGE;
    for part in &message.parts {
        let tokens = match part {
            Part::Text { text } | Part::Summary { text, .. } => count(bpe, text),
            Part::ToolCall(call) => count(bpe, &call.name)
                .saturating_add(count(bpe, &call.arguments))
                .saturating_add(PER_MESSAGE),
            Part::ToolResult(result) => count(bpe, &result.content).saturating_add(PER_MESSAGE),
            Part::ProviderItem { item, .. } => count(bpe, &item.to_string()),
        };
        total = total.saturating_add(tokens);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_families() {
        assert!(openai_tokenizer("gpt-4o-mini").is_some());
        assert!(openai_tokenizer("openai/gpt-5").is_some());
        assert!(openai_tokenizer("claude-sonnet-4-5").is_none());
        let bpe = openai_tokenizer("gpt-4o").unwrap();
        let messages = [Message::user("hello world")];
        let request = ModelRequest::new(&messages);
        // 3 priming + 3 per message + 2 tokens of text.
        assert_eq!(count_request_tokens(bpe, &request), 8);
    }

    /// The bound holds for texts that tokenize worst (one token per byte) and for
    /// messages of every part kind.
    #[test]
    fn the_exact_count_never_exceeds_its_bound() {
        let bpe = openai_tokenizer("gpt-4o").unwrap();
        let worst = "\u{1}\u{2}\u{3}~`|^ \u{7f}".repeat(50);
        let call = keel_core::ToolCall {
            id: "c1".into(),
            name: "x".into(),
            arguments: "{\"a\":\"\u{1}\"}".into(),
        };
        let messages = [
            Message::user(worst.clone()),
            Message::user(""),
            Message {
                role: keel_core::Role::Assistant,
                parts: vec![Part::ToolCall(call)],
            },
            Message::user("héllo wörld 漢字 🙂".repeat(20)),
        ];
        let mut request = ModelRequest::new(&messages);
        request.system = Some(&worst);
        let heuristic = keel_core::model::estimate_request_tokens(&request);
        assert!(count_request_tokens(bpe, &request) <= exact_count_at_most(heuristic));
    }
}
