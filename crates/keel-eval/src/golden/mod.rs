//! Golden conversations (seed 000 §9.3): a run recorded as a [`Cassette`] (`keel run
//! --record FILE`) and replayed offline (`keel eval replay FILE`, [`replay`]) against the
//! agent as it is *now* — its current agent file, tools, policies, critic and budget —
//! with the model answering from the recording and every tool keeping its contract but
//! answering with its recorded output. The replay fails when the action trace (tool
//! names, order, arguments, outcomes; the end state; the final text) deviates beyond the
//! cassette's [`Allowances`]; ids and timestamps are never compared.
//!
//! With a live model ([`ReplayOptions::model`]) the same cassette checks a new model (or
//! a changed prompt) against the recorded behaviour, its tools still answering from the
//! recording — there the allowances for final text and argument fields earn their keep.

pub mod cassette;
pub mod diff;
pub mod stand_ins;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_app::recipe::Recipe;
use keel_app::{AgentRequest, App};
use keel_core::{CancellationToken, EventStore, MemoryStore, Message, Model};
use keel_runtime::Thread;
use serde::{Deserialize, Serialize};

pub use cassette::{
    Allowances, CASSETTE_FORMAT, Cassette, CassetteError, ExpectedCall, ExpectedTrace,
    RecordedResponse, RecordedToolOutput,
};
pub use diff::Difference;

use crate::trace::RunTrace;
use stand_ins::{
    RecordedOutputs, ReplayAnswers, ReplayApprovals, ReplayModel, ReplaySummarizer, replay_tools,
};

/// The default limit on one replay (a replay does no I/O; this only bounds a live model).
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_secs(300);

/// How to replay.
#[derive(Clone)]
pub struct ReplayOptions {
    /// Replay against this agent (a keel.toml name or a file) instead of the recorded one.
    pub agent: Option<String>,
    /// A live model instead of the recorded responses (tools still answer from the
    /// recording).
    pub model: Option<Arc<dyn Model>>,
    /// Differences allowed on top of the cassette's own `allow`.
    pub allow: Allowances,
    /// Longest the replayed run may take.
    pub timeout: Duration,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            agent: None,
            model: None,
            allow: Allowances::default(),
            timeout: DEFAULT_REPLAY_TIMEOUT,
        }
    }
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The cassette file.
    pub cassette: PathBuf,
    /// The agent replayed.
    pub agent: String,
    /// The model: the recording's id, or the live model's.
    pub model: String,
    /// Whether the model was live.
    pub live_model: bool,
    /// No difference beyond the allowances.
    pub passed: bool,
    /// Every difference, in trace order.
    pub differences: Vec<Difference>,
    /// Things worth knowing that are not failures (e.g. the system prompt changed).
    pub notices: Vec<String>,
    /// The replayed action trace.
    pub replayed: ExpectedTrace,
    /// Recorded model responses the replay used, of the recorded total.
    pub responses_used: usize,
    /// Recorded model responses.
    pub responses_recorded: usize,
    /// Why the run itself failed, when it returned an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_error: Option<String>,
}

impl ReplayReport {
    /// The report as the CLI prints it: one status line, then each difference with what
    /// was recorded and what the replay did.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let calls = self.replayed.calls.len();
        if self.passed {
            out.push_str(&format!(
                "ok      {}: {} call{}, end state {}, {} of {} recorded model responses{}\n",
                self.cassette.display(),
                calls,
                if calls == 1 { "" } else { "s" },
                self.replayed.end_state,
                self.responses_used,
                self.responses_recorded,
                if self.live_model {
                    format!(" (live model {})", self.model)
                } else {
                    String::new()
                }
            ));
        } else {
            out.push_str(&format!(
                "FAILED  {}: {} difference{} from the recording (agent {}, model {}{})\n",
                self.cassette.display(),
                self.differences.len(),
                if self.differences.len() == 1 { "" } else { "s" },
                self.agent,
                self.model,
                if self.live_model { ", live" } else { "" }
            ));
            for difference in &self.differences {
                out.push_str(&difference.to_string());
                out.push('\n');
            }
            if let Some(error) = &self.run_error {
                out.push_str(&format!("  the replayed run returned an error: {error}\n"));
            }
        }
        for notice in &self.notices {
            out.push_str(&format!("  note: {notice}\n"));
        }
        out
    }
}

/// Why a replay could not run at all (as opposed to a replay that found differences).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The cassette could not be read.
    #[error(transparent)]
    Cassette(#[from] CassetteError),
    /// The agent could not be built (unknown agent, invalid agent file, unknown tool).
    #[error("{cassette}: cannot build the agent to replay: {message}")]
    Agent {
        /// The cassette file.
        cassette: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The replayed run's events could not be read back.
    #[error("{cassette}: cannot read the replayed run: {message}")]
    Store {
        /// The cassette file.
        cassette: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Replays the cassette at `path` (see the module doc).
pub async fn replay(
    app: &App,
    path: &Path,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let cassette = Cassette::load(path)?;
    replay_cassette(app, &cassette, path, options).await
}

/// Replays an already loaded cassette (`path` resolves its agent file and names it).
pub async fn replay_cassette(
    app: &App,
    cassette: &Cassette,
    path: &Path,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let agent_error = |message: String| ReplayError::Agent {
        cassette: path.to_path_buf(),
        message,
    };
    options.allow.validate().map_err(agent_error)?;
    let allow = cassette.allow.merged(&options.allow);
    let mut recipe: Recipe = if cassette.recipe.is_null() {
        Recipe::default()
    } else {
        serde_json::from_value(cassette.recipe.clone()).map_err(|e| {
            agent_error(format!(
                "the cassette's `recipe` cannot be read ({e}); record it again with \
                 `keel run --record`"
            ))
        })?
    };
    let mut notices = Vec::new();
    if let Some(reference) = &options.agent {
        recipe.set_agent(
            app.find_agent(reference)
                .map_err(|e| agent_error(e.to_string()))?,
        );
    } else if let Some(file) = cassette.agent_file(path) {
        if !file.exists() {
            return Err(agent_error(format!(
                "the recorded agent file {} does not exist (moved? pass --agent FILE)",
                file.display()
            )));
        }
        recipe.agent = Some(file);
    }
    let replay_model = Arc::new(ReplayModel::new(cassette));
    let model: Arc<dyn Model> = match &options.model {
        Some(live) => Arc::clone(live),
        None => replay_model.clone(),
    };
    let request = AgentRequest {
        agent: recipe.agent_ref(),
        model: None,
        model_override: Some(Arc::clone(&model)),
        base_url: None,
        tools: recipe.tools.clone(),
        instructions: recipe.instructions.clone(),
        max_turns: recipe.max_turns,
        context_strategy: recipe.context_strategy.clone(),
        context_window: recipe.context_window,
        max_output_tokens: recipe.max_output_tokens,
        cache_partition: None,
    };
    let (builder, resolution) = app
        .agent_builder(&request)
        .await
        .map_err(|e| agent_error(e.to_string()))?;
    let outputs = Arc::new(RecordedOutputs::new(cassette));
    let mut builder = builder.map_tools(|real| replay_tools(real, &outputs));
    if options.model.is_none() && !cassette.summaries.is_empty() {
        builder = builder.summarizer_model(Arc::new(ReplaySummarizer::new(cassette)));
    }
    let agent = builder.build();
    let fingerprint = &agent.definition().fingerprint;
    let tools_offered: Vec<String> = fingerprint.tools.iter().map(|t| t.name.clone()).collect();
    if let Some(recorded) = &cassette.system_prompt_sha256
        && recorded != &fingerprint.system_prompt_sha256
    {
        notices.push(
            "the agent's system prompt (instructions or tool guidance) changed since the \
             recording"
                .into(),
        );
    }

    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let cancel = CancellationToken::new();
    let context = app
        .run_context(store.clone(), recipe.approve, resolution.approve)
        .with_approvals(Arc::new(ReplayApprovals::new(cassette)))
        .with_user_input(Arc::new(ReplayAnswers::new(cassette)))
        .with_cancel(cancel.clone());
    let mut thread = Thread::new();
    let thread_id = thread.id().to_string();
    let input: Vec<Message> = cassette.input.iter().map(Message::user).collect();
    let run = agent.run(input, &mut thread, &context);
    tokio::pin!(run);
    let run_error = tokio::select! {
        result = &mut run => result.err().map(|e| keel_app::worker::run_error(&e)),
        () = tokio::time::sleep(options.timeout) => {
            cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(10), &mut run).await;
            Some(format!("the replay timed out after {} s", options.timeout.as_secs()))
        }
    };
    let events = store
        .load(&thread_id)
        .await
        .map_err(|e| ReplayError::Store {
            cassette: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let replayed = ExpectedTrace::of(&RunTrace::from_events(&events));
    let differences = diff::compare(
        &cassette.tools_offered,
        &tools_offered,
        &cassette.expected,
        &replayed,
        &allow,
    );
    let responses_used = replay_model.served();
    if options.model.is_none()
        && differences.is_empty()
        && responses_used < cassette.model_responses.len()
    {
        notices.push(format!(
            "the replay used {responses_used} of {} recorded model responses",
            cassette.model_responses.len()
        ));
    }
    Ok(ReplayReport {
        cassette: path.to_path_buf(),
        agent: agent.name().to_string(),
        model: model.id(),
        live_model: options.model.is_some(),
        passed: differences.is_empty(),
        differences,
        notices,
        replayed,
        responses_used,
        responses_recorded: cassette.model_responses.len(),
        run_error,
    })
}
