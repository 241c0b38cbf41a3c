//! The loaded model shared by every [`crate::LocalModel`] handle on the same file, and the
//! thread that runs its generations.
//!
//! The llama backend is initialised once per process; a model file is loaded once per
//! process (a weak cache keyed by canonical path). Each loaded model has one worker
//! thread (`keel-local`), started with the first generation, that owns the model's llama
//! context and its prompt cache (`kv_cache`) and runs the queued generations one at a
//! time (a CPU is saturated by one; see `decode`). The context borrows the weights, so it
//! lives on that thread's stack next to its own reference to them; the thread ends when
//! the model is dropped (its queue closes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llguidance::ParserFactory;
use llguidance::toktrie::TokEnv;
use tokio::sync::mpsc;

use keel_core::{ModelError, ModelErrorKind, StreamEvent};

use crate::decode::{Job, Spec};
use crate::grammar::ToolFormat;
use crate::kv_cache::PromptCache;
use crate::prompt::MarkedTurn;
use crate::stats::GenerationStats;
use crate::text::{Prompt, SpecialTokens};

/// The process-wide llama backend.
pub(crate) fn backend() -> Result<&'static LlamaBackend, ModelError> {
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
    /// The model (also held by the worker thread, whose context borrows it).
    pub model: Arc<LlamaModel>,
    /// The chat template from the GGUF metadata (ChatML when absent).
    pub template: LlamaChatTemplate,
    /// Whether the template came from the file.
    pub template_from_file: bool,
    /// llguidance's view of the vocabulary.
    pub factory: ParserFactory,
    /// For each token: does its text start with an ASCII digit?
    pub digit_start: Vec<bool>,
    /// The vocabulary's control and user-defined tokens, found only in markup.
    pub specials: SpecialTokens,
    /// Training context of the model.
    pub n_ctx_train: u32,
    /// Parameter count.
    pub n_params: u64,
    /// The file.
    pub path: PathBuf,
    /// The tool-call format detected from the metadata.
    pub format: ToolFormat,
    /// Generations queued or running.
    pub active: AtomicUsize,
    /// Prompt tokens evaluated (not served from the KV cache) since loading.
    pub evaluated_prompt_tokens: AtomicU64,
    /// The figures of the latest finished generation.
    pub last: Mutex<Option<GenerationStats>>,
    /// The worker's queue; `None` until the first generation.
    queue: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
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

/// The loaded engines, by canonical path (weak: an engine unloads with its last model).
static CACHE: OnceLock<Mutex<HashMap<PathBuf, Weak<Engine>>>> = OnceLock::new();

/// Waits until no engine has a generation queued or running, or `timeout` passed; true
/// when idle. A process must call it before it exits: a generation whose caller went away
/// (a run that timed out or was cancelled) stops at its next batch boundary, but one
/// still inside llama.cpp when `exit` runs the C++ library's static destructors crashes
/// the process (a segfault on the `keel-local` thread after the command's work is done).
pub fn wait_until_idle(timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let busy = CACHE.get().is_some_and(|cache| {
            cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .values()
                .filter_map(Weak::upgrade)
                .any(|engine| engine.active.load(Ordering::SeqCst) > 0)
        });
        if !busy {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Loads (or returns the cached) engine for a file.
pub(crate) fn load(path: &Path) -> Result<Arc<Engine>, ModelError> {
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
    // llama.cpp trusts the file's metadata further than a file from an agent file
    // deserves (a context length past i32 panics llama-cpp-2 on this thread): read the
    // header with every length bounded first, then load under `catch_unwind`.
    crate::gguf::check_file(path).map_err(|e| load_error(path, e))?;
    std::panic::catch_unwind(|| load_checked(path)).unwrap_or_else(|_| {
        Err(load_error(
            path,
            "llama.cpp or llama-cpp-2 panicked while reading it (its metadata is out of range)",
        ))
    })
}

fn load_checked(path: &Path) -> Result<Engine, ModelError> {
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
    let architecture = model.meta_val_str("general.architecture").ok();
    let template_text = model.meta_val_str("tokenizer.chat_template").ok();
    let format = ToolFormat::detect(architecture.as_deref(), template_text.as_deref());
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
    let specials = SpecialTokens::of(&model);
    tracing::info!(
        path = %path.display(),
        params = model.n_params(),
        n_ctx_train = model.n_ctx_train(),
        ms = started.elapsed().as_millis() as u64,
        ?format,
        "loaded local model"
    );
    Ok(Engine {
        n_ctx_train: model.n_ctx_train(),
        n_params: model.n_params(),
        model: Arc::new(model),
        template,
        template_from_file,
        factory,
        digit_start,
        specials,
        path: path.to_path_buf(),
        format,
        active: AtomicUsize::new(0),
        evaluated_prompt_tokens: AtomicU64::new(0),
        last: Mutex::new(None),
        queue: Mutex::new(None),
    })
}

impl Engine {
    /// Applies the chat template, ending with the assistant's opening. llama.cpp's
    /// template engine only sees a placeholder for each turn's content; the content goes
    /// back in afterwards with its data still marked, so templating cannot make data
    /// markup.
    pub fn apply_template(&self, turns: &[MarkedTurn]) -> Result<Prompt, ModelError> {
        let mut chat = Vec::with_capacity(turns.len());
        for (i, turn) in turns.iter().enumerate() {
            let message = LlamaChatMessage::new(turn.role.to_string(), placeholder(i))
                .map_err(|e| ModelError::new(ModelErrorKind::InvalidRequest, e.to_string()))?;
            chat.push(message);
        }
        let templated = self
            .model
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
            })?;
        Ok(fill_placeholders(&templated, turns))
    }

    /// Tokenizes a rendered prompt: special tokens where its markup spells them, its
    /// data as text (see [`crate::text`]).
    pub fn tokenize(&self, prompt: &Prompt) -> Vec<LlamaToken> {
        let add_bos = self.model.vocab().should_add_bos();
        self.specials.tokenize(&self.model, prompt, add_bos)
    }
}

/// Marks where turn `i`'s content goes: private-use characters no template writes and
/// no template function changes (no letters, no whitespace to trim).
fn placeholder(i: usize) -> String {
    format!("\u{E000}{i}\u{E001}")
}

/// Puts each turn's content where the template wrote its placeholder (a template that
/// drops a turn drops its content; one that repeats it repeats it).
fn fill_placeholders(templated: &str, turns: &[MarkedTurn]) -> Prompt {
    let mut out = Prompt::new();
    let mut rest = templated;
    while let Some(start) = rest.find('\u{E000}') {
        let (before, marker) = rest.split_at(start);
        let body = marker.get('\u{E000}'.len_utf8()..).unwrap_or_default();
        let digits = body.bytes().take_while(u8::is_ascii_digit).count();
        let closed = body
            .get(digits..)
            .is_some_and(|t| t.starts_with('\u{E001}'));
        let turn = body
            .get(..digits)
            .and_then(|d| d.parse::<usize>().ok())
            .and_then(|i| turns.get(i));
        out.markup(before);
        match turn {
            Some(turn) if closed => {
                out.append(&turn.content);
                rest = body
                    .get(digits.saturating_add('\u{E001}'.len_utf8())..)
                    .unwrap_or_default();
            }
            // Not one of ours (cannot happen: no content reaches the template).
            _ => {
                out.data("\u{E000}");
                rest = body;
            }
        }
    }
    out.markup(rest);
    out
}

/// The receiving end of a generation's events; dropping it cancels the generation.
pub(crate) type Events = mpsc::Receiver<Result<StreamEvent, ModelError>>;

/// Queues a generation on the model's worker thread (starting it if needed).
pub(crate) fn submit(engine: &Arc<Engine>, spec: Spec) -> Events {
    let (tx, rx) = mpsc::channel(64);
    let job = Job {
        guard: ActiveGuard::new(Arc::clone(engine)),
        tx: tx.clone(),
        spec,
    };
    let mut queue = engine
        .queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let job = match queue.as_ref() {
        Some(q) => match q.send(job) {
            Ok(()) => return rx,
            Err(std::sync::mpsc::SendError(job)) => job, // the worker is gone: restart it
        },
        None => job,
    };
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
    let model = Arc::clone(&engine.model);
    let spawned = std::thread::Builder::new()
        .name("keel-local".into())
        .spawn(move || worker(model, jobs_rx));
    match spawned {
        Ok(_) => {
            let _ = jobs_tx.send(job);
            *queue = Some(jobs_tx);
        }
        Err(e) => {
            let _ = tx.try_send(Err(ModelError::new(
                ModelErrorKind::Other,
                format!("cannot start the local generation thread: {e}"),
            )));
        }
    }
    rx
}

/// The worker: runs queued jobs one at a time, keeping the context between them. A
/// panic inside llama-cpp-2 ends that job's stream with an error and drops the context
/// (its cache state is then unknown).
fn worker(model: Arc<LlamaModel>, jobs: std::sync::mpsc::Receiver<Job>) {
    let weights = model;
    let model: &LlamaModel = &weights;
    let mut cache: Option<PromptCache<'_>> = None;
    while let Ok(job) = jobs.recv() {
        if job.tx.is_closed() {
            continue; // cancelled while queued
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::decode::run(&job, model, &mut cache)
        }));
        let result = outcome.unwrap_or_else(|_| {
            cache = None;
            Err(ModelError::new(
                ModelErrorKind::Other,
                "the local generation thread panicked",
            ))
        });
        if let Err(error) = result {
            crate::decode::send_error(&job, error);
        }
    }
}

/// Where a generation sends its events.
pub(crate) type Sender = mpsc::Sender<Result<StreamEvent, ModelError>>;

/// Counts a queued or running generation for [`Engine::active`], until its job is dropped.
pub(crate) struct ActiveGuard(Arc<Engine>);

impl ActiveGuard {
    fn new(engine: Arc<Engine>) -> Self {
        engine.active.fetch_add(1, Ordering::SeqCst);
        Self(engine)
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.0
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}
