//! [`LocalModelOptions`]: threads, context size, output cap, sampling, the length caps
//! that keep grammar-constrained generation finite, the prompt (KV) cache and the
//! tool-call format.

use serde::{Deserialize, Serialize};

use crate::grammar::ToolFormat;

/// How a [`crate::LocalModel`] runs. Every field has a default that suits a small model on
/// a laptop CPU; `Default::default()` is the recommended starting point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalModelOptions {
    /// CPU threads for decoding (one token at a time). `None`: the number of available
    /// cores, at most 8.
    pub threads: Option<u32>,
    /// CPU threads for prompt processing. `None`: same as `threads`.
    pub batch_threads: Option<u32>,
    /// Context window in tokens (prompt plus answer). `None`: the model's training
    /// context, at most 8192. Larger windows cost memory for the KV cache.
    pub context_size: Option<u32>,
    /// Default cap on generated tokens per answer, used when the request sets none.
    pub max_tokens: u32,
    /// Default sampling temperature when the request sets none. `0.0` is greedy
    /// decoding (deterministic).
    pub temperature: f32,
    /// Nucleus sampling default when the request sets none (ignored when greedy).
    pub top_p: f32,
    /// Top-k sampling (ignored when greedy).
    pub top_k: u32,
    /// Seed of the sampler's random number generator.
    pub seed: u32,
    /// Prompt tokens per `decode` call.
    pub batch_size: u32,
    /// `maxLength` given to JSON strings in tool and response schemas that declare none.
    pub max_string_length: u64,
    /// `maxItems` given to JSON arrays in tool and response schemas that declare none.
    pub max_array_items: u64,
    /// Longest run of consecutive digits a constrained answer may contain (bounds numbers,
    /// which JSON Schema cannot bound by length).
    pub max_number_digits: u32,
    /// Most tool calls in one answer.
    pub max_tool_calls: u32,
    /// With `ToolChoice::Auto` and tools offered: require a tool call while the user's
    /// message is the last one, and a text answer right after tool results (one tool round
    /// per user turn). Very small models almost never choose a tool on their own, and
    /// repeat calls they see in the history (Qwen2.5-Coder-0.5B, left to choose, writes
    /// the call as JSON text or a code block instead of a `<tool_call>` block, and the 1.5B
    /// writes a report as a fenced JSON block before reading anything). `None`: on for
    /// models under [`crate::EAGER_TOOLS_BELOW_PARAMS`] parameters, off otherwise (the
    /// model chooses).
    pub eager_tools: Option<bool>,
    /// Threads (conversations) whose evaluated prompt is kept between calls: a request
    /// whose prompt starts like a kept one evaluates only the rest. `0` turns the prompt
    /// cache off (every prompt is evaluated whole). At most 64.
    pub cache_slots: u32,
    /// KV cache size in tokens, shared by the kept threads (a prefix they share, such as
    /// the system prompt, is stored once); when it is full the least recently used
    /// thread is dropped. `None`: the context window (no more memory than one
    /// generation needs). Never less than the context window.
    pub cache_tokens: Option<u32>,
    /// How tool calls are written. `None`: detected from the model file (Hermes for Qwen
    /// and templates that mention `<tool_call>`, the JSON-array format otherwise).
    pub tool_format: Option<ToolFormat>,
    /// Keep generating past end-of-turn until the token cap (for decode benchmarks only;
    /// ignored by constrained generations).
    pub ignore_eos: bool,
    /// How long (ms) a generation waits for a caller that holds its stream but stopped
    /// reading it before it stops (the model's one worker thread is free again). Default
    /// two minutes; at most an hour.
    pub stalled_reader_timeout_ms: u64,
    /// Who may share the prompt (KV) cache: generations of handles with the same
    /// partition reuse each other's cached prefixes, others never see them (not even
    /// through `cache_read_tokens` or the time to first token, which would tell a caller
    /// how much of a guessed prompt another one sent). `None`: one partition for the
    /// process. `keel serve` sets the tenant.
    pub cache_partition: Option<String>,
    /// SHA-256 digests (lowercase hex) a model file must have to be loaded. Empty: any
    /// GGUF that passes the header checks loads (the pinned models are verified by
    /// [`crate::models::resolve_model`] either way).
    pub allowed_sha256: Vec<String>,
}

impl Default for LocalModelOptions {
    fn default() -> Self {
        Self {
            threads: None,
            batch_threads: None,
            context_size: None,
            max_tokens: 512,
            temperature: 0.0,
            top_p: 0.95,
            top_k: 40,
            seed: 42,
            batch_size: 512,
            max_string_length: 200,
            max_array_items: 8,
            max_number_digits: 15,
            max_tool_calls: 4,
            eager_tools: None,
            cache_slots: 4,
            cache_tokens: None,
            tool_format: None,
            ignore_eos: false,
            stalled_reader_timeout_ms: 120_000,
            cache_partition: None,
            allowed_sha256: Vec::new(),
        }
    }
}

impl LocalModelOptions {
    /// Sets the decode threads.
    pub fn with_threads(mut self, threads: u32) -> Self {
        self.threads = Some(threads);
        self
    }

    /// Sets the context window.
    pub fn with_context_size(mut self, tokens: u32) -> Self {
        self.context_size = Some(tokens);
        self
    }

    /// Sets the default output cap.
    pub fn with_max_tokens(mut self, tokens: u32) -> Self {
        self.max_tokens = tokens;
        self
    }

    /// Sets the default temperature (`0.0` is greedy).
    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = temperature;
        self
    }

    /// Sets the number of threads kept in the prompt cache (`0`: no prompt cache).
    pub fn with_cache_slots(mut self, slots: u32) -> Self {
        self.cache_slots = slots;
        self
    }

    /// Sets the prompt-cache partition ([`LocalModelOptions::cache_partition`]).
    pub fn with_cache_partition(mut self, partition: impl Into<String>) -> Self {
        self.cache_partition = Some(partition.into());
        self
    }

    /// The stall limit of a stream's reader, bounded to one hour.
    pub fn stalled_reader_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.stalled_reader_timeout_ms.clamp(1, 3_600_000))
    }

    /// Sets the sampler seed.
    pub fn with_seed(mut self, seed: u32) -> Self {
        self.seed = seed;
        self
    }

    /// The decode thread count actually used.
    pub fn effective_threads(&self) -> u32 {
        self.threads.filter(|t| *t > 0).unwrap_or_else(|| {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2);
            u32::try_from(cores.min(8)).unwrap_or(2)
        })
    }

    /// The prompt-processing thread count actually used.
    pub fn effective_batch_threads(&self) -> u32 {
        self.batch_threads
            .filter(|t| *t > 0)
            .unwrap_or_else(|| self.effective_threads())
    }
}
