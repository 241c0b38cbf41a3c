//! One generation on the model's worker thread: tokenize, find the reusable prefix in the
//! prompt cache (`kv_cache`), evaluate the rest of the prompt in batches, then sample
//! token by token with the llguidance mask applied to the logits, streaming events.
//!
//! The job checks before every batch and every token whether its stream was dropped and
//! stops at once if so; the cache records only tokens whose evaluation finished, so a
//! stopped generation leaves a consistent slot behind.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llguidance::Matcher;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;

use keel_core::{ModelError, ModelErrorKind, StopReason, StreamEvent, ToolCall, Usage};

use crate::engine::{ActiveGuard, Engine, Sender, backend};
use crate::grammar::{Constraint, ParsedOutput, ToolFormat, starts_call_block};
use crate::kv_cache::{ContextKey, PromptCache};
use crate::stats::GenerationStats;

/// Sampling settings of one generation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: u32,
}

/// A queued generation.
pub(crate) struct Job {
    /// Keeps the engine alive and counts the job as active until it is dropped.
    pub guard: ActiveGuard,
    /// Where events go; closed when the caller dropped the stream.
    pub tx: Sender,
    /// What to generate.
    pub spec: Spec,
}

/// Everything one generation needs, owned, for the worker thread.
pub(crate) struct Spec {
    pub prompt: crate::text::Prompt,
    pub format: ToolFormat,
    pub constraint: Constraint,
    pub max_tokens: u32,
    pub n_ctx: u32,
    pub threads: u32,
    pub batch_threads: u32,
    pub batch_size: u32,
    /// Prompt cache slots (`0`: the cache is off).
    pub cache_slots: u32,
    /// KV cells of the cache.
    pub cache_tokens: u32,
    pub sampling: Sampling,
    pub max_digits: u32,
    pub ignore_eos: bool,
    /// How long to wait for a caller that stopped reading the stream.
    pub stall_timeout: Duration,
    /// Which prompt-cache slots this generation may reuse (see `kv_cache`).
    pub partition: Option<String>,
}

fn other(what: impl std::fmt::Display) -> ModelError {
    ModelError::new(ModelErrorKind::Other, what.to_string())
}

/// Returned when the receiver is gone: generation stops quietly.
struct Cancelled;

/// Where a generation's events go, and how long it waits for a caller that holds the
/// stream but stopped reading it.
struct Out<'j> {
    tx: &'j Sender,
    stall_timeout: Duration,
}

impl Out<'_> {
    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Sends an event. When the stream's buffer is full, waits for the caller to read, at
/// most `stall_timeout`: a caller that keeps the stream but never polls it again would
/// otherwise hold the model's only worker thread (every other generation on the model
/// queued behind it) for good. Past the limit the generation stops as if cancelled.
fn send(out: &Out<'_>, event: StreamEvent) -> Result<(), Cancelled> {
    send_item(out, Ok(event))
}

/// Ends a job's stream with its error (the same bounded wait as [`send`]).
pub(crate) fn send_error(job: &Job, error: ModelError) {
    let out = Out {
        tx: &job.tx,
        stall_timeout: job.spec.stall_timeout,
    };
    let _ = send_item(&out, Err(error));
}

fn send_item(out: &Out<'_>, item: Result<StreamEvent, ModelError>) -> Result<(), Cancelled> {
    use tokio::sync::mpsc::error::TrySendError;
    let item = match out.tx.try_send(item) {
        Ok(()) => return Ok(()),
        Err(TrySendError::Closed(_)) => return Err(Cancelled),
        Err(TrySendError::Full(item)) => item,
    };
    // The timer is made inside `block_on`: it needs the runtime's time driver.
    let sent = STALL_RUNTIME.with(|runtime| match runtime {
        Some(runtime) => runtime
            .block_on(async { tokio::time::timeout(out.stall_timeout, out.tx.send(item)).await }),
        None => Ok(out.tx.blocking_send(item)),
    });
    match sent {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Cancelled),
        Err(_) => {
            tracing::warn!(
                target: "keel_local",
                timeout_ms = out.stall_timeout.as_millis() as u64,
                "the caller stopped reading a local generation's stream; stopping it"
            );
            Err(Cancelled)
        }
    }
}

thread_local! {
    /// A timer for [`send`]'s wait on the worker thread (which runs no async runtime of
    /// its own): a current-thread runtime with only the time driver, made on the thread's
    /// first stalled send and dropped with the thread. `None` if it cannot be made (then
    /// the wait is unbounded, as it was before).
    static STALL_RUNTIME: Option<tokio::runtime::Runtime> =
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|error| tracing::warn!(%error, "no timer for stalled streams"))
            .ok();
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Runs a job with the worker's cached context (created, or re-created when the job needs
/// another shape). Cancellation is not an error.
pub(crate) fn run<'m>(
    job: &Job,
    model: &'m LlamaModel,
    cache: &mut Option<PromptCache<'m>>,
) -> Result<(), ModelError> {
    let engine = Arc::clone(job.guard.engine());
    let batch_size = job.spec.batch_size.max(16);
    let key = ContextKey {
        cells: job.spec.cache_tokens.max(job.spec.n_ctx),
        slots: job.spec.cache_slots.clamp(1, 64),
        batch: batch_size,
        threads: job.spec.threads,
        batch_threads: job.spec.batch_threads,
    };
    if cache.as_ref().is_none_or(|c| c.key() != key) {
        *cache = None; // free the old context's memory first
        *cache = Some(PromptCache::new(model, backend()?, key)?);
    }
    let Some(cache) = cache.as_mut() else {
        return Err(other("no llama context"));
    };
    match generate(&engine, job, cache) {
        Ok(Ok(())) | Ok(Err(Cancelled)) => Ok(()),
        Err(e) => Err(e),
    }
}

fn generate(
    engine: &Engine,
    job: &Job,
    cache: &mut PromptCache<'_>,
) -> Result<Result<(), Cancelled>, ModelError> {
    let tx = &Out {
        tx: &job.tx,
        stall_timeout: job.spec.stall_timeout,
    };
    let started = Instant::now();
    let prompt_tokens = engine.tokenize(&job.spec.prompt);
    let n_prompt = to_u32(prompt_tokens.len());
    check_not_empty(&prompt_tokens)?;
    let special_tokens = to_u32(
        prompt_tokens
            .iter()
            .filter(|t| engine.specials.contains(**t))
            .count(),
    );
    if n_prompt.saturating_add(1) >= job.spec.n_ctx {
        return Err(ModelError::new(
            ModelErrorKind::ContextOverflow,
            format!(
                "the prompt has {n_prompt} tokens; the local context window is {} (raise \
                 LocalModelOptions::context_size, at most the model's {})",
                job.spec.n_ctx, engine.n_ctx_train
            ),
        ));
    }
    let mut matcher = match &job.spec.constraint {
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
    let grammar_ms = started.elapsed().as_millis();

    // The reusable prefix, then the rest of the prompt in batches, checking for
    // cancellation between them.
    let plan = cache.prepare(
        &prompt_tokens,
        job.spec.cache_slots > 0,
        job.spec.partition.as_deref(),
    );
    let slot = plan.target;
    let cached = to_u32(plan.keep);
    let prompt_started = Instant::now();
    let batch_cap = usize::try_from(batch_size(job)).unwrap_or(512);
    let mut batch = LlamaBatch::new(batch_cap, 1);
    let rest = prompt_tokens.get(plan.keep..).unwrap_or_default();
    let n_chunks = rest.chunks(batch_cap).count();
    for (i, chunk) in rest.chunks(batch_cap).enumerate() {
        if tx.is_closed() {
            return Ok(Err(Cancelled));
        }
        cache
            .decode(slot, chunk, i + 1 == n_chunks, &mut batch)
            .map_err(|e| prefix_error("prompt evaluation", e))?;
        engine
            .evaluated_prompt_tokens
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    cache.ctx().synchronize();
    let prompt_time = prompt_started.elapsed();

    let vocab = engine.model.vocab();
    let n_vocab = usize::try_from(engine.model.n_vocab()).unwrap_or(0);
    let mut sampler = (job.spec.sampling.temperature > 0.0).then(|| {
        LlamaSampler::chain_simple([
            LlamaSampler::top_k(to_i32(job.spec.sampling.top_k.max(1))),
            LlamaSampler::top_p(job.spec.sampling.top_p.clamp(0.01, 1.0), 1),
            LlamaSampler::temp(job.spec.sampling.temperature),
            LlamaSampler::dist(job.spec.sampling.seed),
        ])
    });
    let mut candidates = LlamaTokenDataArray::new(Vec::with_capacity(n_vocab), false);
    let mut out = Output::new(matches!(job.spec.constraint, Constraint::Free));
    let mut n_gen: u32 = 0;
    let mut stop = StopReason::MaxTokens;
    let mut piece = Vec::with_capacity(32);
    let mut first_token: Option<Instant> = None;
    let mut mask_time = Duration::ZERO;
    let mut eval_time = Duration::ZERO;

    while n_gen < job.spec.max_tokens && to_u32(cache.tokens(slot).len()) < job.spec.n_ctx {
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
                if out.digit_run >= job.spec.max_digits {
                    limit_digits(&mut mask, &engine.digit_start);
                }
                Some(mask)
            }
            None => None,
        };
        let logits = cache
            .ctx()
            .get_logits_ith(batch.n_tokens().saturating_sub(1));
        let eog_allowed = !job.spec.ignore_eos || mask.is_some();
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
        first_token.get_or_insert_with(Instant::now);
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
        let t = Instant::now();
        cache
            .decode(slot, &[token], true, &mut batch)
            .map_err(|e| prefix_error("decoding", e))?;
        eval_time += t.elapsed();
    }
    if tx.is_closed() {
        return Ok(Err(Cancelled));
    }
    let first = first_token.unwrap_or_else(Instant::now);
    let stats = GenerationStats {
        prompt_tokens: n_prompt,
        special_tokens,
        cached_tokens: cached,
        evaluated_tokens: n_prompt.saturating_sub(cached),
        output_tokens: n_gen,
        time_to_first_token: first.duration_since(started),
        prompt_time,
        decode_time: first.elapsed(),
    };
    tracing::info!(
        target: "keel_local",
        prompt_tokens = n_prompt,
        cached_tokens = cached,
        ttft_ms = stats.time_to_first_token.as_millis() as u64,
        prompt_ms = prompt_time.as_millis() as u64,
        prompt_tokens_per_second = stats.prompt_tokens_per_second(),
        output_tokens = n_gen,
        grammar_ms = grammar_ms as u64,
        mask_ms = mask_time.as_millis() as u64,
        eval_ms = eval_time.as_millis() as u64,
        tokens_per_second = stats.decode_tokens_per_second(),
        slot,
        "local generation finished"
    );
    *engine
        .last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(stats);
    if let Err(Cancelled) = finish(out, stop, job.spec.format, tx, n_prompt, cached, n_gen) {
        return Ok(Err(Cancelled));
    }
    Ok(Ok(()))
}

/// Refuses a prompt without tokens: with nothing evaluated, sampling would read the
/// logits the previous job left in the context.
fn check_not_empty(prompt_tokens: &[LlamaToken]) -> Result<(), ModelError> {
    if prompt_tokens.is_empty() {
        return Err(ModelError::new(
            ModelErrorKind::InvalidRequest,
            "the prompt is empty (no tokens to evaluate)",
        ));
    }
    Ok(())
}

fn batch_size(job: &Job) -> u32 {
    job.spec.batch_size.max(16)
}

fn prefix_error(what: &str, error: ModelError) -> ModelError {
    ModelError::new(error.kind, format!("{what}: {}", error.message))
}

fn finish(
    mut out: Output,
    mut stop: StopReason,
    format: ToolFormat,
    tx: &Out<'_>,
    n_prompt: u32,
    cached: u32,
    n_gen: u32,
) -> Result<(), Cancelled> {
    if let Some(delta) = out.flush() {
        send(tx, StreamEvent::TextDelta(delta))?;
    }
    if !out.streaming {
        match format.parse_output(&out.text) {
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
            cache_read_tokens: u64::from(cached),
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
    fn an_empty_prompt_is_refused_before_sampling() {
        let error = super::check_not_empty(&[]).unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::InvalidRequest);
        assert!(error.message.contains("empty"), "{}", error.message);
        super::check_not_empty(&[LlamaToken(1)]).unwrap();
    }

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
