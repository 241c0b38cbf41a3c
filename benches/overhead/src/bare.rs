//! The baseline: a plain reqwest + tokio agent loop making exactly the HTTP calls Keel's
//! `openai:` provider makes — the same Chat Completions request body (system prompt, tool
//! definitions, `tool_choice`, `max_completion_tokens`, `stream: true` with usage), the
//! same SSE parsing into text and tool calls, the same calculator evaluation — with no
//! event log, no store, no validation, no retries.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// What every request shares, taken from a built Keel agent by the orchestrator so the
/// baseline sends the same bodies (see `keel::request_template`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestTemplate {
    /// Model name.
    pub model: String,
    /// The agent's full system prompt.
    pub system: String,
    /// The `tools` array as Keel sends it.
    pub tools: Vec<Value>,
    /// `max_completion_tokens`.
    pub max_completion_tokens: u32,
}

/// The request a hand-written client sends (`bare-minimal`): a one-line system prompt and
/// the calculator's definition alone, as a user of a bare HTTP client would write them —
/// not Keel's prompt with usage guides and its whole tool list.
pub fn minimal_template(model: &str) -> RequestTemplate {
    RequestTemplate {
        model: model.to_owned(),
        system: "You are a helpful assistant.".to_owned(),
        tools: vec![json!({"type": "function", "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"]
            }
        }})],
        max_completion_tokens: 1024,
    }
}

/// A bare client: one reqwest client (one connection pool) shared by every conversation.
pub struct Bare {
    client: reqwest::Client,
    url: String,
    template: RequestTemplate,
}

/// One streamed answer, assembled.
#[derive(Default)]
struct Answer {
    text: String,
    calls: Vec<(String, String, String)>,
}

impl Bare {
    /// A client for the mock at `base_url`.
    pub fn new(base_url: &str, template: RequestTemplate) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .no_proxy()
            .build()
            .context("building the reqwest client")?;
        Ok(Self {
            client,
            url: format!("{}/v1/chat/completions", base_url.trim_end_matches('/')),
            template,
        })
    }

    /// One conversation: requests until the model answers with text. Returns the number
    /// of model requests made.
    pub async fn conversation(&self, prompt: &str) -> anyhow::Result<u32> {
        let mut messages = vec![
            json!({"role": "system", "content": self.template.system}),
            json!({"role": "user", "content": prompt}),
        ];
        let mut requests = 0;
        loop {
            requests += 1;
            let answer = self.request(&messages).await?;
            if answer.calls.is_empty() {
                if answer.text.is_empty() {
                    bail!("the model answered with neither text nor tool calls");
                }
                return Ok(requests);
            }
            let calls: Vec<Value> = answer
                .calls
                .iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for (id, _, arguments) in &answer.calls {
                messages.push(json!({"role": "tool", "tool_call_id": id,
                                     "content": run_calculator(arguments)}));
            }
        }
    }

    async fn request(&self, messages: &[Value]) -> anyhow::Result<Answer> {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.template.model));
        body.insert("messages".into(), Value::Array(messages.to_vec()));
        body.insert("tools".into(), Value::Array(self.template.tools.clone()));
        body.insert("tool_choice".into(), json!("auto"));
        body.insert(
            "max_completion_tokens".into(),
            json!(self.template.max_completion_tokens),
        );
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        let body = serde_json::to_vec(&Value::Object(body))?;
        let response = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .bearer_auth("bench")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(body)
            .send()
            .await
            .context("sending the request")?;
        if !response.status().is_success() {
            bail!("the mock answered HTTP {}", response.status());
        }
        let mut stream = response.bytes_stream();
        let mut buffer: Vec<u8> = Vec::new();
        let mut answer = Answer::default();
        while let Some(chunk) = stream.next().await {
            buffer.extend_from_slice(&chunk.context("reading the stream")?);
            while let Some(end) = find(&buffer, b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                if absorb(&event, &mut answer)? {
                    return Ok(answer);
                }
            }
        }
        bail!("the stream ended before [DONE]")
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Folds one SSE event into `answer`; true at `[DONE]`.
fn absorb(event: &[u8], answer: &mut Answer) -> anyhow::Result<bool> {
    let text = std::str::from_utf8(event).context("SSE event is not UTF-8")?;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(data).context("SSE data is not JSON")?;
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(piece) = delta.get("content").and_then(Value::as_str) {
                answer.text.push_str(piece);
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let index = usize::try_from(index)?;
                while answer.calls.len() <= index {
                    answer.calls.push(Default::default());
                }
                if let Some((id, name, arguments)) = answer.calls.get_mut(index) {
                    if let Some(v) = call.get("id").and_then(Value::as_str) {
                        *id = v.to_owned();
                    }
                    let function = call.get("function").unwrap_or(&Value::Null);
                    if let Some(v) = function.get("name").and_then(Value::as_str) {
                        name.push_str(v);
                    }
                    if let Some(v) = function.get("arguments").and_then(Value::as_str) {
                        arguments.push_str(v);
                    }
                }
            }
        }
    }
    Ok(false)
}

/// The tool's work, the same evaluator Keel's `calculator` uses.
fn run_calculator(arguments: &str) -> String {
    let expression = serde_json::from_str::<Value>(arguments)
        .ok()
        .and_then(|v| v.get("expression")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    match keel_tools::expr::evaluate(&expression) {
        Ok(result) => json!({"expression": expression, "result": result}).to_string(),
        Err(error) => json!({"error": error.to_string()}).to_string(),
    }
}
