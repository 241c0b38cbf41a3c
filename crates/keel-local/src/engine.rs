//! The loaded model shared by every [`crate::LocalModel`] handle on the same file, and the
//! blocking decode loop that runs on its own thread.
//!
//! The llama backend is initialised once per process; a model file is loaded once per
//! process (a weak cache keyed by canonical path). Each generation creates its own
//! llama context (KV cache), evaluates the prompt, then samples token by token with the
//! llguidance mask applied to the logits. Generations on one model run one at a time
//! (a CPU is saturated by one), and each checks between tokens whether its stream was
//! dropped, stopping at once if so.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use tokio::sync::mpsc;

use keel_core::{ModelError, ModelErrorKind, StopReason, StreamEvent, ToolCall, Usage};

use crate::grammar::{Constraint, ParsedOutput, parse_output, starts_call_block};
use crate::prompt::Turn;

/// The process-wide llama backend.
fn backend() -> Result<&'static LlamaBackend, ModelError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| ModelError::new(ModelErrorKind::Other, format!("llama backend: {e}")))
}

/// A loaded GGUF model with what grammar-constrained decoding needs.
pub(crate) struct Engine {
    /// The model.
    pub model: LlamaModel,
    /// The chat template from the GGUF metadata (ChatML when absent).
    pub template: LlamaChatTemplate,
    /// Whether the template came from the file.
    pub template_from_file: bool,
    /// llguidance's view of the vocabulary.
    pub factory: ParserFactory,
    /// For each token: does its text start with an ASCII digit?
    pub digit_start: Vec<bool>,
    /// Training context of the model.
    pub n_ctx_train: u32,
    /// Parameter count.
    pub n_params: u64,
    /// The file.
    pub path: PathBuf,
    /// One generation at a time.
    pub busy: Mutex<()>,
    /// Worker threads alive (running or waiting for `busy`).
    pub active: AtomicUsize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn load_error(path: &Path, what: impl std::fmt::Display) -> ModelError {
    ModelError::new(
        ModelErrorKind::InvalidRequest,
        format!(
            "cannot load local model {}: {what}. Use a complete GGUF file of an architecture \
             llama.cpp supports (for the default model run `keel models pull smollm2` or \
             `./scripts/fetch-model`)",
            path.display()
        ),
    )
}

/// Loads (or returns the cached) engine for a file.
pub(crate) fn load(path: &Path) -> Result<Arc<Engine>, ModelError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Weak<Engine>>>> = OnceLock::new();
    let canonical = std::fs::canonicalize(path).map_err(|e| {
        ModelError::new(
            ModelErrorKind::NotFound,
            format!(
                "local model file {} not found ({e}); for the default model run `keel models \
                 pull smollm2` or `./scripts/fetch-model`, or pass --model local:/path/to/file.gguf",
                path.display()
            ),
        )
    })?;
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(engine) = cache.get(&canonical).and_then(Weak::upgrade) {
        return Ok(engine);
    }
    let engine = Arc::new(load_uncached(&canonical)?);
    cache.retain(|_, weak| weak.strong_count() > 0);
    cache.insert(canonical, Arc::downgrade(&engine));
    Ok(engine)
}

fn load_uncached(path: &Path) -> Result<Engine, ModelError> {
    let mut magic = [0u8; 4];
    let read_magic =
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    if let Err(e) = read_magic {
        return Err(load_error(path, format!("cannot read it ({e})")));
    }
    if &magic != b"GGUF" {
        return Err(load_error(
            path,
            "it is not a GGUF file (no GGUF magic bytes)",
        ));
    }
    let backend = backend()?;
    let started = Instant::now();
    let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
        .map_err(|e| load_error(path, format!("llama.cpp refused it ({e})")))?;
    let (template, template_from_file) = match model.chat_template(None) {
        Ok(t) => (t, true),
        Err(_) => {
            tracing::warn!(path = %path.display(), "no chat template in the GGUF metadata; using ChatML");
            let t = LlamaChatTemplate::new("chatml")
                .map_err(|e| load_error(path, format!("chat template: {e}")))?;
            (t, false)
        }
    };
    let tok_env: TokEnv = LlamaSampler::llguidance_tok_env(&model);
    let mut factory = ParserFactory::new_simple(&tok_env)
        .map_err(|e| load_error(path, format!("llguidance tokenizer setup failed ({e})")))?;
    factory.quiet();
    let n_vocab = model.n_vocab();
    let digit_start = (0..n_vocab)
        .map(|i| {
            let piece = model.vocab().token_to_piece(LlamaToken(i), false, None);
            piece.first().is_some_and(u8::is_ascii_digit)
        })
        .collect();
    tracing::info!(
        path = %path.display(),
        params = model.n_params(),
        n_ctx_train = model.n_ctx_train(),
        ms = started.elapsed().as_millis() as u64,
        "loaded local model"
    );
    Ok(Engine {
        n_ctx_train: model.n_ctx_train(),
        n_params: model.n_params(),
        model,
        template,
        template_from_file,
        factory,
        digit_start,
        path: path.to_path_buf(),
        busy: Mutex::new(()),
        active: AtomicUsize::new(0),
    })
}

impl Engine {
    /// Applies the chat template, ending with the assistant's opening.
    pub fn apply_template(&self, turns: &[Turn]) -> Result<String, ModelError> {
        let mut chat = Vec::with_capacity(turns.len());
        for turn in turns {
            let message =
                LlamaChatMessage::new(turn.role.to_string(), turn.content.replace('\0', ""))
                    .map_err(|e| ModelError::new(ModelErrorKind::InvalidRequest, e.to_string()))?;
            chat.push(message);
        }
        self.model
            .apply_chat_template(&self.template, &chat, true)
            .map_err(|e| {
                ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    format!(
                        "llama.cpp cannot apply the chat template of {} ({e}); this template is \
                     not supported by llama.cpp's built-in template engine",
                        self.path.display()
                    ),
                )
            })
    }

    /// Tokenizes a templated prompt.
    pub fn tokenize(&self, prompt: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let add_bos = vocab.should_add_bos();
        vocab.tokenize(prompt.as_bytes(), add_bos, true)
    }
}

/// Sampling settings of one generation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: u32,
}

/// Everything one generation needs, owned, for the worker thread.
pub(crate) struct Job {
    pub engine: Arc<Engine>,
    pub prompt: String,
    pub constraint: Constraint,
    pub max_tokens: u32,
    pub n_ctx: u32,
    pub threads: u32,
    pub batch_threads: u32,
    pub batch_size: u32,
    pub sampling: Sampling,
    pub max_digits: u32,
    pub ignore_eos: bool,
}

type Sender = mpsc::Sender<Result<StreamEvent, ModelError>>;

/// Starts a job on its own thread; events arrive on the returned receiver, which the
/// caller drops to cancel.
pub(crate) fn spawn(job: Job) -> mpsc::Receiver<Result<StreamEvent, ModelError>> {
    let (tx, rx) = mpsc::channel(64);
    let guard = ActiveGuard::new(Arc::clone(&job.engine));
    let spawned = std::thread::Builder::new()
        .name("keel-local".into())
        .spawn({
            let tx = tx.clone();
            move || {
                let _guard = guard;
                // A panic inside llama-cpp-2 must end the stream with an error, not silently.
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(job, &tx)))
                        .unwrap_or_else(|_| Err(other("the local generation thread panicked")));
                if let Err(error) = result {
                    let _ = tx.blocking_send(Err(error));
                }
            }
        });
    if let Err(e) = spawned {
        let _ = tx.try_send(Err(ModelError::new(
            ModelErrorKind::Other,
            format!("cannot start the local generation thread: {e}"),
        )));
    }
    rx
}

fn other(what: impl std::fmt::Display) -> ModelError {
    ModelError::new(ModelErrorKind::Other, what.to_string())
}

/// Returned when the receiver is gone: generation stops quietly.
struct Cancelled;

fn send(tx: &Sender, event: StreamEvent) -> Result<(), Cancelled> {
    tx.blocking_send(Ok(event)).map_err(|_| Cancelled)
}

/// Counts a live worker for [`Engine::active`], from spawn to the end of the thread.
struct ActiveGuard(Arc<Engine>);

impl ActiveGuard {
    fn new(engine: Arc<Engine>) -> Self {
        engine.active.fetch_add(1, Ordering::SeqCst);
        Self(engine)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run(job: Job, tx: &Sender) -> Result<(), ModelError> {
    let engine = Arc::clone(&job.engine);
    let _busy = engine
        .busy
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if tx.is_closed() {
        return Ok(());
    }
    match generate(&engine, &job, tx) {
        Ok(Ok(())) | Ok(Err(Cancelled)) => Ok(()),
        Err(e) => Err(e),
    }
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn generate(engine: &Engine, job: &Job, tx: &Sender) -> Result<Result<(), Cancelled>, ModelError> {
    let backend = backend()?;
    let prompt_tokens = engine.tokenize(&job.prompt);
    let n_prompt = u32::try_from(prompt_tokens.len()).unwrap_or(u32::MAX);
    if n_prompt.saturating_add(1) >= job.n_ctx {
        return Err(ModelError::new(
            ModelErrorKind::ContextOverflow,
            format!(
                "the prompt has {n_prompt} tokens; the local context window is {} (raise \
                 LocalModelOptions::context_size, at most the model's {})",
                job.n_ctx, engine.n_ctx_train
            ),
        ));
    }
    let grammar_started = Instant::now();
    let mut matcher = match &job.constraint {
        Constraint::Free => None,
        Constraint::Lark(lark) => {
            let parser = engine
                .factory
                .create_parser(TopLevelGrammar::from_lark(lark.clone()));
            let matcher = Matcher::new(parser);
            if let Some(error) = matcher.get_error() {
                return Err(ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    format!(
                        "the tool or response schemas cannot be turned into a grammar: {error}"
                    ),
                ));
            }
            Some(matcher)
        }
    };

    let grammar_ms = grammar_started.elapsed().as_millis();
    let batch_size = job.batch_size.max(16);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(job.n_ctx))
        .with_n_batch(batch_size)
        .with_n_ubatch(batch_size)
        .with_n_threads(to_i32(job.threads))
        .with_n_threads_batch(to_i32(job.batch_threads));
    let mut ctx = engine.model.new_context(backend, params).map_err(|e| {
        other(format!(
            "cannot create a llama context of {} tokens: {e}",
            job.n_ctx
        ))
    })?;

    // Prompt evaluation, in batches, checking for cancellation between them.
    let started = Instant::now();
    let batch_cap = usize::try_from(batch_size).unwrap_or(512);
    let mut batch = LlamaBatch::new(batch_cap, 1);
    let mut pos: i32 = 0;
    let chunks: Vec<&[LlamaToken]> = prompt_tokens.chunks(batch_cap).collect();
    let n_chunks = chunks.len();
    for (i, chunk) in chunks.into_iter().enumerate() {
        if tx.is_closed() {
            return Ok(Err(Cancelled));
        }
        batch.clear();
        let last_chunk = i + 1 == n_chunks;
        for (j, token) in chunk.iter().enumerate() {
            let logits = last_chunk && j + 1 == chunk.len();
            batch.add(*token, pos, &[0], logits).map_err(other)?;
            pos = pos.saturating_add(1);
        }
        ctx.decode(&mut batch)
            .map_err(|e| other(format!("prompt evaluation failed: {e}")))?;
    }
    let prompt_ms = started.elapsed().as_millis();

    let vocab = engine.model.vocab();
    let n_vocab = usize::try_from(engine.model.n_vocab()).unwrap_or(0);
    let mut sampler = (job.sampling.temperature > 0.0).then(|| {
        LlamaSampler::chain_simple([
            LlamaSampler::top_k(to_i32(job.sampling.top_k.max(1))),
            LlamaSampler::top_p(job.sampling.top_p.clamp(0.01, 1.0), 1),
            LlamaSampler::temp(job.sampling.temperature),
            LlamaSampler::dist(job.sampling.seed),
        ])
    });
    let mut candidates = LlamaTokenDataArray::new(Vec::with_capacity(n_vocab), false);
    let mut out = Output::new(matches!(job.constraint, Constraint::Free));
    let mut n_gen: u32 = 0;
    let mut stop = StopReason::MaxTokens;
    let mut piece = Vec::with_capacity(32);
    let decode_started = Instant::now();
    let mut mask_time = std::time::Duration::ZERO;
    let mut eval_time = std::time::Duration::ZERO;

    while n_gen < job.max_tokens && u32::try_from(pos).unwrap_or(u32::MAX) < job.n_ctx {
        if tx.is_closed() {
            return Ok(Err(Cancelled));
        }
        let mask = match matcher.as_mut() {
            Some(m) if m.is_stopped() => {
                stop = StopReason::EndTurn;
                break;
            }
            Some(m) => {
                let t = Instant::now();
                let mut mask = m
                    .compute_mask()
                    .map_err(|e| other(format!("grammar: {e}")))?;
                mask_time += t.elapsed();
                if out.digit_run >= job.max_digits {
                    limit_digits(&mut mask, &engine.digit_start);
                }
                Some(mask)
            }
            None => None,
        };
        let logits = ctx.get_logits_ith(batch.n_tokens().saturating_sub(1));
        let eog_allowed = !job.ignore_eos || mask.is_some();
        let token = match sampler.as_mut() {
            None => argmax(logits, mask.as_ref(), |t| eog_allowed || !vocab.is_eog(t)),
            Some(sampler) => {
                candidates.data.clear();
                candidates.selected = None;
                candidates.sorted = false;
                for (i, logit) in logits.iter().enumerate() {
                    let id = i32::try_from(i).unwrap_or(i32::MAX);
                    let allowed = mask
                        .as_ref()
                        .is_none_or(|m| m.is_allowed(id.cast_unsigned()))
                        && (eog_allowed || !vocab.is_eog(LlamaToken(id)));
                    let logit = if allowed { *logit } else { f32::NEG_INFINITY };
                    candidates
                        .data
                        .push(LlamaTokenData::new(LlamaToken(id), logit, 0.0));
                }
                candidates.apply_sampler(sampler);
                candidates.selected_token()
            }
        };
        let Some(token) = token else {
            return Err(other(
                "the grammar allows no token here (this is a bug in keel-local)",
            ));
        };
        if vocab.is_eog(token) {
            stop = StopReason::EndTurn;
            break;
        }
        if let Some(m) = matcher.as_mut() {
            m.consume_token(token.0.cast_unsigned())
                .map_err(|e| other(format!("grammar rejected the sampled token: {e}")))?;
        }
        n_gen = n_gen.saturating_add(1);
        piece.clear();
        vocab.token_to_piece_into(token, &mut piece, false, None);
        if let Some(delta) = out.push(&piece)
            && send(tx, StreamEvent::TextDelta(delta)).is_err()
        {
            return Ok(Err(Cancelled));
        }
        batch.clear();
        batch.add(token, pos, &[0], true).map_err(other)?;
        pos = pos.saturating_add(1);
        let t = Instant::now();
        ctx.decode(&mut batch)
            .map_err(|e| other(format!("decoding failed: {e}")))?;
        eval_time += t.elapsed();
    }
    if tx.is_closed() {
        return Ok(Err(Cancelled));
    }
    let decode_secs = decode_started.elapsed().as_secs_f64();
    tracing::debug!(
        prompt_tokens = n_prompt,
        prompt_ms = prompt_ms as u64,
        output_tokens = n_gen,
        grammar_ms = grammar_ms as u64,
        mask_ms = mask_time.as_millis() as u64,
        eval_ms = eval_time.as_millis() as u64,
        tokens_per_second = if decode_secs > 0.0 {
            f64::from(n_gen) / decode_secs
        } else {
            0.0
        },
        "local generation finished"
    );
    if let Err(Cancelled) = finish(out, stop, tx, n_prompt, n_gen) {
        return Ok(Err(Cancelled));
    }
    Ok(Ok(()))
}

fn finish(
    mut out: Output,
    mut stop: StopReason,
    tx: &Sender,
    n_prompt: u32,
    n_gen: u32,
) -> Result<(), Cancelled> {
    if let Some(delta) = out.flush() {
        send(tx, StreamEvent::TextDelta(delta))?;
    }
    if !out.streaming {
        match parse_output(&out.text) {
            Ok(ParsedOutput::Calls(calls)) => {
                for call in calls {
                    send(
                        tx,
                        StreamEvent::ToolCall(ToolCall {
                            id: keel_core::new_id("call"),
                            name: call.name,
                            arguments: call.arguments,
                        }),
                    )?;
                }
                if stop == StopReason::EndTurn {
                    stop = StopReason::ToolUse;
                }
            }
            Ok(ParsedOutput::Text(text)) => send(tx, StreamEvent::TextDelta(text))?,
            Err(why) => {
                // Only a generation cut off by the token cap can end here.
                tracing::warn!(%why, "local model output is an unfinished tool call");
                send(tx, StreamEvent::TextDelta(out.text.clone()))?;
            }
        }
    }
    send(
        tx,
        StreamEvent::Usage(Usage {
            input_tokens: u64::from(n_prompt),
            output_tokens: u64::from(n_gen),
            ..Usage::default()
        }),
    )?;
    send(
        tx,
        StreamEvent::Stop {
            reason: stop,
            response_id: None,
        },
    )
}

/// Disallows tokens that would extend a run of digits, unless nothing else is allowed.
fn limit_digits(mask: &mut SimpleVob, digit_start: &[bool]) {
    let mut limited = mask.clone();
    let mut any = false;
    for (i, starts_digit) in digit_start.iter().enumerate() {
        let id = u32::try_from(i).unwrap_or(u32::MAX);
        if limited.is_allowed(id) {
            if *starts_digit {
                limited.disallow_token(id);
            } else {
                any = true;
            }
        }
    }
    if any {
        *mask = limited;
    }
}

fn argmax(
    logits: &[f32],
    mask: Option<&SimpleVob>,
    extra: impl Fn(LlamaToken) -> bool,
) -> Option<LlamaToken> {
    let mut best: Option<(i32, f32)> = None;
    for (i, logit) in logits.iter().enumerate() {
        let id = i32::try_from(i).unwrap_or(i32::MAX);
        if mask.is_some_and(|m| !m.is_allowed(id.cast_unsigned())) {
            continue;
        }
        if best.is_none_or(|(_, b)| *logit > b) && extra(LlamaToken(id)) {
            best = Some((id, *logit));
        }
    }
    best.map(|(id, _)| LlamaToken(id))
}

/// The generated text so far: UTF-8 assembly across token boundaries, the digit-run
/// counter, and whether text is streamed as it comes (answers) or held back (tool calls).
struct Output {
    text: String,
    pending: Vec<u8>,
    /// Decided: stream text deltas as they come.
    streaming: bool,
    /// Decided one way or the other.
    decided: bool,
    digit_run: u32,
}

impl Output {
    fn new(free: bool) -> Self {
        Self {
            text: String::new(),
            pending: Vec::new(),
            streaming: free,
            decided: free,
            digit_run: 0,
        }
    }

    /// Adds a token's bytes; returns text to stream now.
    fn push(&mut self, bytes: &[u8]) -> Option<String> {
        for b in bytes {
            if b.is_ascii_digit() {
                self.digit_run = self.digit_run.saturating_add(1);
            } else {
                self.digit_run = 0;
            }
        }
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        if valid == 0 {
            return None;
        }
        let chunk: Vec<u8> = self.pending.drain(..valid).collect();
        let chunk = String::from_utf8_lossy(&chunk).into_owned();
        let before = self.text.len();
        self.text.push_str(&chunk);
        if !self.decided {
            if self.text.trim_start().is_empty() {
                return None;
            }
            let call = starts_call_block(&self.text);
            if call && self.text.trim_start().len() < crate::grammar::CALL_OPEN.len() {
                return None; // could still become a tool-call block
            }
            self.decided = true;
            self.streaming = !call;
            return self.streaming.then(|| self.text.clone());
        }
        if self.streaming {
            self.text.get(before..).map(str::to_string)
        } else {
            None
        }
    }

    /// Whatever is left at the end.
    fn flush(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.text.push_str(&String::from_utf8_lossy(&rest));
        }
        if !self.decided {
            self.decided = true;
            self.streaming = !starts_call_block(&self.text);
            return (self.streaming && !self.text.is_empty()).then(|| self.text.clone());
        }
        if self.streaming && !rest.is_empty() {
            return Some(String::from_utf8_lossy(&rest).into_owned());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_streams_text_and_holds_back_calls() {
        let mut out = Output::new(false);
        assert_eq!(out.push(b"He"), Some("He".into()));
        assert_eq!(out.push(b"llo \xe2\x82"), Some("llo ".into()));
        assert_eq!(out.push(b"\xac"), Some("€".into()));
        assert_eq!(out.flush(), None);
        assert!(out.streaming);

        let mut out = Output::new(false);
        assert_eq!(out.push(b"<tool"), None);
        assert_eq!(out.push(b"_call>[{\"a\": 12"), None);
        assert_eq!(out.digit_run, 2);
        assert_eq!(out.flush(), None);
        assert!(!out.streaming);
    }

    #[test]
    fn argmax_respects_mask() {
        let logits = [0.1, 5.0, 3.0];
        let mut mask = SimpleVob::alloc(3);
        mask.allow_token(0);
        mask.allow_token(2);
        assert_eq!(argmax(&logits, Some(&mask), |_| true), Some(LlamaToken(2)));
        assert_eq!(argmax(&logits, None, |_| true), Some(LlamaToken(1)));
        let empty = SimpleVob::alloc(3);
        assert_eq!(argmax(&logits, Some(&empty), |_| true), None);
    }
}
