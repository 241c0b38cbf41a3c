//! Scripted models for runs driven by `--script`: the script's model, or — for a resumed
//! run — the same script positioned at the step the run reached, under the script's id.

use std::sync::Arc;

use futures::stream::BoxStream;
use keel_core::{Model, ModelCapabilities, ModelError, ModelRequest, StreamEvent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde::Deserialize;

use crate::CliError;

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Steps(Vec<ScriptStep>),
    // `turns`: the key of `keel mock-llm` scripts, so one file drives both.
    Object {
        #[serde(alias = "turns")]
        steps: Vec<ScriptStep>,
    },
}

/// A scripted model over the steps of `path` from `skip` on. Tool calls without an id get
/// the id they would have had without skipping (`call_{step}_{n}`), so ids stay unique.
pub fn scripted_from(
    path: &std::path::Path,
    skip: usize,
) -> Result<(Arc<dyn Model>, Arc<ScriptedModel>), CliError> {
    let full = ScriptedModel::from_file(path).map_err(|e| CliError::usage(e.to_string()))?;
    let id = full.id();
    if skip == 0 {
        let scripted = Arc::new(full);
        return Ok((scripted.clone(), scripted));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read script {}: {e}", path.display())))?;
    let file: ScriptFile = serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("cannot parse script {}: {e}", path.display())))?;
    let (ScriptFile::Steps(steps) | ScriptFile::Object { steps }) = file;
    let rest: Vec<ScriptStep> = steps
        .into_iter()
        .enumerate()
        .skip(skip)
        .map(|(index, mut step)| {
            for (n, call) in step.tool_calls.iter_mut().enumerate() {
                if call.id.is_none() {
                    call.id = Some(format!("call_{index}_{n}"));
                }
            }
            step
        })
        .collect();
    let scripted = Arc::new(ScriptedModel::new(rest));
    let model: Arc<dyn Model> = Arc::new(Renamed {
        id,
        inner: scripted.clone(),
    });
    Ok((model, scripted))
}

/// A model under another id (a resumed script keeps its file's id).
struct Renamed {
    id: String,
    inner: Arc<ScriptedModel>,
}

impl Model for Renamed {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn capabilities(&self) -> ModelCapabilities {
        self.inner.capabilities()
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        self.inner.stream(request)
    }

    fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        self.inner.estimate_tokens(request)
    }
}
