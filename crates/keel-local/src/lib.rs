//! `keel-local` is Keel's embedded local model: any GGUF file run in-process by llama.cpp
//! (through the `llama-cpp-2` crate, CPU only), with tool calls and structured answers
//! constrained by an llguidance grammar so that every tool call the model makes parses
//! and validates against its tool's input schema. It is the offline default: a user with
//! no API key runs agents on SmolLM2-135M-Instruct, fetched from PyPI by [`models::pull`].
//!
//! [`LocalModel`] implements [`keel_core::Model`]. Generation runs on a dedicated thread,
//! never on the async runtime; dropping the stream stops it between two tokens. The
//! evaluated prompt of recent threads stays in a KV cache, so the next turn of a thread
//! evaluates only its new tokens ([`LocalModelOptions::cache_slots`]). Tool calls use the
//! model family's own format ([`grammar::ToolFormat`]: SmolLM2's JSON array, Qwen's
//! Hermes blocks).
//!
//! This crate must not reach the network except in [`models::pull`] (which shells out to
//! `pip`), must not block the async runtime, and must not panic on any model output.
//! `unsafe` stays forbidden here: the FFI is entirely inside `llama-cpp-2`.

#![forbid(unsafe_code)]

mod decode;
mod engine;
mod gguf;
pub mod grammar;
pub mod grounding;
pub mod hermes;
mod kv_cache;
pub mod models;
mod options;
pub mod prompt;
mod stats;
mod text;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;

use keel_core::{
    Model, ModelCapabilities, ModelError, ModelErrorKind, ModelRequest, Role, StreamEvent,
    ToolChoice, ToolDefinition,
};

pub use engine::wait_until_idle;
pub use grammar::ToolFormat;
pub use models::{
    InstalledModel, KnownModel, ModelsError, default_model_path, list, pull, resolve_model,
};
pub use options::LocalModelOptions;
pub use stats::GenerationStats;

/// Refuses a file whose SHA-256 is not in `allowed` (when the list is not empty). Each
/// file is hashed once per process while its size, modification and change times stay
/// the same.
fn check_allowed(path: &Path, allowed: &[String]) -> Result<(), ModelError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Stamp = (u64, Option<std::time::SystemTime>, i64, i64);
    static HASHED: OnceLock<Mutex<HashMap<PathBuf, (Stamp, String)>>> = OnceLock::new();
    if allowed.is_empty() {
        return Ok(());
    }
    let refused = |what: String| {
        ModelError::new(
            ModelErrorKind::InvalidRequest,
            format!(
                "cannot load local model {}: {what}. Add its SHA-256 to the allowed list \
                 ([local] allowed_sha256 in keel.toml) only if you trust where it came from",
                path.display()
            ),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| refused(format!("cannot read it ({e})")))?;
    let stamp: Stamp = {
        use std::os::unix::fs::MetadataExt;
        (
            meta.len(),
            meta.modified().ok(),
            meta.ctime(),
            meta.ctime_nsec(),
        )
    };
    let hashed = HASHED.get_or_init(|| Mutex::new(HashMap::new()));
    let known = hashed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(path)
        .filter(|(s, _)| *s == stamp)
        .map(|(_, hash)| hash.clone());
    let hash = match known {
        Some(hash) => hash,
        None => {
            let hash = models::sha256_file(path).map_err(|e| refused(e.to_string()))?;
            hashed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(path.to_path_buf(), (stamp, hash.clone()));
            hash
        }
    };
    if allowed.iter().any(|a| a.trim().eq_ignore_ascii_case(&hash)) {
        Ok(())
    } else {
        Err(refused(format!(
            "its SHA-256 {hash} is not in the allowed list"
        )))
    }
}

/// One token of a prompt as the model reads it ([`LocalModel::prompt_tokens`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptToken {
    /// The token id.
    pub id: i32,
    /// Its text.
    pub text: String,
    /// Whether it is a special (control or user-defined) token.
    pub special: bool,
}

use decode::{Sampling, Spec};
use engine::Engine;
use grammar::build_constraint;

/// Largest context window used when the options do not set one.
const DEFAULT_MAX_CONTEXT: u32 = 8192;

/// Models with fewer parameters than this get [`LocalModelOptions::eager_tools`] unless it
/// is set: every model Keel names, up to Qwen2.5-Coder-1.5B (1.78 billion as llama.cpp
/// counts them, embeddings included). Measured on the Detective (docs/local-model.md):
/// left to choose, the 1.5B writes its report as a fenced JSON block before reading
/// anything; with eager tools it reads, then files.
pub const EAGER_TOOLS_BELOW_PARAMS: u64 = 2_000_000_000;

/// A GGUF model run in-process. Cheap to clone; clones share the loaded weights (and so
/// do separate [`LocalModel::load`]s of the same file).
#[derive(Clone)]
pub struct LocalModel {
    engine: Arc<Engine>,
    options: LocalModelOptions,
    name: String,
    n_ctx: u32,
}

impl std::fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalModel")
            .field("name", &self.name)
            .field("path", &self.engine.path)
            .field("context_window", &self.n_ctx)
            .field("options", &self.options)
            .finish()
    }
}

impl LocalModel {
    /// Loads a GGUF file (blocking: call it from `spawn_blocking` in async code, or use
    /// [`LocalModel::load_async`]). Errors name the path and the fix.
    pub fn load(path: impl AsRef<Path>, options: LocalModelOptions) -> Result<Self, ModelError> {
        let path = path.as_ref();
        check_allowed(path, &options.allowed_sha256)?;
        let engine = engine::load(path)?;
        let name = model_name(path);
        let cap = options
            .context_size
            .unwrap_or(DEFAULT_MAX_CONTEXT.min(engine.n_ctx_train));
        let n_ctx = cap.clamp(256, engine.n_ctx_train.max(256));
        Ok(Self {
            engine,
            options,
            name,
            n_ctx,
        })
    }

    /// [`LocalModel::load`] on the blocking thread pool.
    pub async fn load_async(path: PathBuf, options: LocalModelOptions) -> Result<Self, ModelError> {
        tokio::task::spawn_blocking(move || Self::load(path, options))
            .await
            .map_err(|e| {
                ModelError::new(
                    ModelErrorKind::Other,
                    format!("model loading task failed: {e}"),
                )
            })?
    }

    /// Resolves a spec (`smollm2`, `local:smollm2`, or a path) and loads it.
    pub fn load_spec(spec: &str, options: LocalModelOptions) -> Result<Self, ModelError> {
        let path = resolve_model(spec)?;
        Self::load(path, options)
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.engine.path
    }

    /// The short name used in [`Model::id`] (`local:<name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The options it runs with.
    pub fn options(&self) -> &LocalModelOptions {
        &self.options
    }

    /// Whether the chat template came from the GGUF metadata (else ChatML is used).
    pub fn has_own_chat_template(&self) -> bool {
        self.engine.template_from_file
    }

    /// Generations of this model file currently running or queued (their worker threads
    /// are alive). Drops to zero shortly after every stream is dropped or finished.
    pub fn active_generations(&self) -> usize {
        self.engine.active.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The exact prompt text the model sees for a request (chat template applied).
    pub fn render_prompt(&self, request: &ModelRequest<'_>) -> Result<String, ModelError> {
        self.marked_prompt(request).map(text::Prompt::into_text)
    }

    /// The prompt with its data marked: what [`Engine::tokenize`] keeps as text.
    fn marked_prompt(&self, request: &ModelRequest<'_>) -> Result<text::Prompt, ModelError> {
        let request = self.effective(request);
        match self.tool_format() {
            ToolFormat::Hermes => Ok(hermes::render_prompt(&request)),
            ToolFormat::JsonArray => self.engine.apply_template(&prompt::render_turns(&request)),
        }
    }

    /// The tokens the model evaluates for a request, each with its text and whether it
    /// is a special (control or user-defined) token. Special tokens come only from the
    /// chat format's own markup: message text, tool results, tool arguments and tool
    /// definitions are tokenized as text, whatever they spell (`<|im_start|>system` in a
    /// tool result is ordinary text to the model). For inspecting what a model reads.
    pub fn prompt_tokens(
        &self,
        request: &ModelRequest<'_>,
    ) -> Result<Vec<PromptToken>, ModelError> {
        let prompt = self.marked_prompt(request)?;
        let vocab = self.engine.model.vocab();
        Ok(self
            .engine
            .tokenize(&prompt)
            .into_iter()
            .map(|token| PromptToken {
                id: token.0,
                text: String::from_utf8_lossy(&vocab.token_to_piece(token, true, None))
                    .into_owned(),
                special: self.engine.specials.contains(token),
            })
            .collect())
    }

    /// How llama.cpp alone tokenizes `text` with special-token parsing on (what every
    /// prompt went through before data was kept as text): for comparisons.
    pub fn tokenize_with_specials(&self, text: &str) -> Vec<i32> {
        let vocab = self.engine.model.vocab();
        vocab
            .tokenize(text.as_bytes(), vocab.should_add_bos(), true)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// How many special (control and user-defined) tokens the vocabulary has.
    pub fn special_token_count(&self) -> usize {
        self.engine.specials.len()
    }

    /// The tool-call format in use ([`LocalModelOptions::tool_format`], else detected from
    /// the file).
    pub fn tool_format(&self) -> ToolFormat {
        self.options.tool_format.unwrap_or(self.engine.format)
    }

    /// Whether [`LocalModelOptions::eager_tools`] is in effect for this model (by default:
    /// fewer than [`EAGER_TOOLS_BELOW_PARAMS`] parameters).
    pub fn eager_tools(&self) -> bool {
        self.options
            .eager_tools
            .unwrap_or(self.engine.n_params < EAGER_TOOLS_BELOW_PARAMS)
    }

    /// The figures of the latest generation on this model file (any handle), finished
    /// or not cancelled: cached and evaluated prompt tokens, time to first token, rates.
    pub fn last_generation(&self) -> Option<GenerationStats> {
        *self
            .engine
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prompt tokens evaluated on this model file since it was loaded (tokens served
    /// from the prompt cache are not counted).
    pub fn evaluated_prompt_tokens(&self) -> u64 {
        self.engine
            .evaluated_prompt_tokens
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The request as this model runs it. With eager tools and `Auto`: `Required` while
    /// the user's message is the last one; right after tool results, `Required` while the
    /// agent's call rules still expect a tool ([`ModelRequest::expected_tools`]: the reads
    /// before a report, then the report), else `None` (answer now).
    fn effective<'r>(&self, request: &ModelRequest<'r>) -> ModelRequest<'r> {
        static REQUIRED: ToolChoice = ToolChoice::Required;
        static NONE: ToolChoice = ToolChoice::None;
        let mut request = *request;
        request.tool_choice = choice_past_withheld(&request);
        if !self.eager_tools()
            || request.tools.is_empty()
            || *request.tool_choice != ToolChoice::Auto
        {
            return request;
        }
        match request.messages.last().map(|m| m.role) {
            Some(Role::User) => request.tool_choice = &REQUIRED,
            Some(Role::Tool) if expected_callable(&request) => request.tool_choice = &REQUIRED,
            Some(Role::Tool) => request.tool_choice = &NONE,
            _ => {}
        }
        request
    }

    fn prepare(&self, request: &ModelRequest<'_>) -> Result<Spec, ModelError> {
        let request = &self.effective(request);
        let prompt = self.marked_prompt(request)?;
        let format = self.tool_format();
        let allowed = grammar_tools(request, self.eager_tools());
        let constraint = build_constraint(
            format,
            &allowed,
            request.tool_choice,
            request.response_schema,
            request.grounded_arguments,
            &self.options,
        )
        .map_err(|e| ModelError::new(ModelErrorKind::InvalidRequest, e.to_string()))?;
        let max_tokens = request
            .max_output_tokens
            .unwrap_or(self.options.max_tokens)
            .max(1);
        Ok(Spec {
            prompt,
            format,
            constraint,
            max_tokens,
            n_ctx: self.n_ctx,
            threads: self.options.effective_threads(),
            batch_threads: self.options.effective_batch_threads(),
            // A batch larger than the context cannot be filled (and one past i32 would
            // panic in llama-cpp-2's `LlamaBatch::new`).
            batch_size: self.options.batch_size.clamp(16, self.n_ctx.max(16)),
            cache_slots: self.options.cache_slots,
            cache_tokens: self.options.cache_tokens.unwrap_or(self.n_ctx),
            sampling: Sampling {
                temperature: request.temperature.unwrap_or(self.options.temperature),
                top_p: request.top_p.unwrap_or(self.options.top_p),
                top_k: self.options.top_k,
                seed: self.options.seed,
            },
            max_digits: self.options.max_number_digits.max(1),
            ignore_eos: self.options.ignore_eos,
            stall_timeout: self.options.stalled_reader_timeout(),
            partition: self.options.cache_partition.clone(),
        })
    }
}

/// The tool choice once the withheld tools ([`ModelRequest::withheld_tools`]) are out of
/// reach: a forced tool that is withheld becomes "call one of the others" (the critic
/// asked for a report the rules refuse until the reads are done: the model does the
/// reads), and a required call with every tool withheld becomes an answer.
fn choice_past_withheld<'r>(request: &ModelRequest<'r>) -> &'r ToolChoice {
    static REQUIRED: ToolChoice = ToolChoice::Required;
    static NONE: ToolChoice = ToolChoice::None;
    if request.withheld_tools.is_empty() {
        return request.tool_choice;
    }
    let any_allowed = request
        .tools
        .iter()
        .any(|t| !request.withheld_tools.contains(&t.name));
    match request.tool_choice {
        ToolChoice::Tool(name) if request.withheld_tools.contains(name) => {
            if any_allowed {
                &REQUIRED
            } else {
                &NONE
            }
        }
        ToolChoice::Required if !any_allowed => &NONE,
        other => other,
    }
}

/// The tools the grammar lets the model call: the offered ones less the withheld ones,
/// and with eager tools and a required call, only the expected ones when there are any
/// (a small model keeps to the sequence the call rules declare instead of repeating a
/// call it sees in the history). The prompt still lists every offered tool, so it stays
/// the same from turn to turn and the prompt cache keeps serving it. When every tool is
/// withheld the choice is `None` (see [`choice_past_withheld`]) and the full list is
/// kept: the grammar then only needs it to forbid text that imitates a call.
fn grammar_tools<'r>(
    request: &ModelRequest<'r>,
    eager: bool,
) -> std::borrow::Cow<'r, [ToolDefinition]> {
    let only_expected =
        eager && *request.tool_choice == ToolChoice::Required && expected_callable(request);
    if (request.withheld_tools.is_empty() && !only_expected)
        || *request.tool_choice == ToolChoice::None
    {
        return std::borrow::Cow::Borrowed(request.tools);
    }
    std::borrow::Cow::Owned(
        request
            .tools
            .iter()
            .filter(|t| !request.withheld_tools.contains(&t.name))
            .filter(|t| !only_expected || request.expected_tools.contains(&t.name))
            .cloned()
            .collect(),
    )
}

/// Whether an expected tool ([`ModelRequest::expected_tools`]) is offered and not withheld.
fn expected_callable(request: &ModelRequest<'_>) -> bool {
    request.tools.iter().any(|t| {
        request.expected_tools.contains(&t.name) && !request.withheld_tools.contains(&t.name)
    })
}

fn model_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(known) = models::known_models().iter().find(|m| m.file_name == file) {
        return known.name.to_string();
    }
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

enum StreamState {
    Pending(Box<Spec>, Arc<Engine>),
    Running(tokio::sync::mpsc::Receiver<Result<StreamEvent, ModelError>>),
}

impl Model for LocalModel {
    fn id(&self) -> String {
        format!("local:{}", self.name)
    }

    fn capabilities(&self) -> ModelCapabilities {
        ModelCapabilities {
            tool_calling: true,
            parallel_tool_calls: self.options.max_tool_calls > 1,
            streaming: true,
            structured_output: true,
            grammar_constrained_tools: true,
            context_window: self.n_ctx,
            max_output_tokens: self.options.max_tokens.min(self.n_ctx),
        }
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let spec = match self.prepare(&request) {
            Ok(spec) => spec,
            Err(error) => return futures::stream::once(async move { Err(error) }).boxed(),
        };
        // The worker starts on the first poll; dropping the stream drops the receiver,
        // which the worker notices before its next token.
        futures::stream::unfold(
            Some(StreamState::Pending(
                Box::new(spec),
                Arc::clone(&self.engine),
            )),
            |state| async move {
                let mut rx = match state? {
                    StreamState::Pending(spec, engine) => engine::submit(&engine, *spec),
                    StreamState::Running(rx) => rx,
                };
                let item = rx.recv().await?;
                Some((item, Some(StreamState::Running(rx))))
            },
        )
        .boxed()
    }

    fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        match self.marked_prompt(request) {
            Ok(prompt) => self.engine.tokenize(&prompt).len() as u64,
            Err(_) => keel_core::model::estimate_request_tokens(request),
        }
    }
}

#[cfg(test)]
mod withheld_tests {
    use keel_core::{Message, ModelRequest, ToolChoice, ToolDefinition};
    use serde_json::json;

    use super::{choice_past_withheld, grammar_tools};

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
        }
    }

    #[test]
    fn withheld_tools_leave_the_grammar_but_not_the_prompt() {
        let tools = [tool("read"), tool("file")];
        let withheld = ["file".to_string()];
        let messages: [Message; 0] = [];
        let forced = ToolChoice::Tool("file".into());
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.withheld_tools = &withheld;
        request.tool_choice = &forced;
        // Forced to a withheld tool: call one of the others instead.
        assert_eq!(*choice_past_withheld(&request), ToolChoice::Required);
        request.tool_choice = &ToolChoice::Auto;
        assert_eq!(*choice_past_withheld(&request), ToolChoice::Auto);
        let names: Vec<String> = grammar_tools(&request, false)
            .iter()
            .map(|t| t.name.clone())
            .collect();
        assert_eq!(names, ["read"]);
        // Nothing withheld: the request's tools as they are.
        request.withheld_tools = &[];
        assert_eq!(grammar_tools(&request, false).len(), 2);
        // Every tool withheld: a required call becomes an answer.
        let all = ["read".to_string(), "file".to_string()];
        request.withheld_tools = &all;
        request.tool_choice = &ToolChoice::Required;
        assert_eq!(*choice_past_withheld(&request), ToolChoice::None);
    }

    #[test]
    fn eager_required_calls_keep_to_the_expected_tools() {
        let tools = [tool("summary"), tool("details"), tool("file"), tool("ask")];
        let withheld = ["file".to_string()];
        let expected = ["details".to_string()];
        let messages: [Message; 0] = [];
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.withheld_tools = &withheld;
        request.expected_tools = &expected;
        request.tool_choice = &ToolChoice::Required;
        let names = |request: &ModelRequest<'_>, eager: bool| -> Vec<String> {
            grammar_tools(request, eager)
                .iter()
                .map(|t| t.name.clone())
                .collect()
        };
        assert_eq!(names(&request, true), ["details"]);
        // Not eager: the model chooses among everything not withheld.
        assert_eq!(names(&request, false), ["summary", "details", "ask"]);
        // An expected tool that is withheld (or not offered) restricts nothing.
        let expected_withheld = ["file".to_string()];
        request.expected_tools = &expected_withheld;
        assert_eq!(names(&request, true), ["summary", "details", "ask"]);
        assert!(!super::expected_callable(&request));
    }
}
