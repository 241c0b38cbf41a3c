//! [`ResponsesAgent`]: an agent backed by OpenAI's Responses API in its stateful mode
//! (seed 003's `ResponsesAgent`). The provider stores the conversation: each run sends only
//! the messages the provider has not seen (normally just the new ones) with
//! `previous_response_id` = the last response recorded on the thread and `store: true`,
//! and records the answer with the new response id ([`ThreadHome::marker`]) before it
//! returns. The thread is then provider-homed: a tool-calling agent refuses to continue
//! it, and this agent refuses a thread in which a local agent answered
//! ([`keel_runtime::RunError::IncompatibleThread`], nothing appended).
//!
//! keel.toml: `[agents.<name>] kind = "openai-responses"` with `model` (`gpt-5`,
//! `openai-responses:gpt-5` or a `[models]` alias of an `openai-responses` model),
//! `instructions` (sent with every request: the API does not carry them over),
//! `temperature` and `max_output_tokens`. Client-side function tools are not supported.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use keel_config::{AgentDefinition, AgentKind, DiagnosticCode};
use keel_core::event::{ModelFailure, new_span_id};
use keel_core::model::ResponseAssembler;
use keel_core::{EndState, EventKind, Message, ModelError, ModelRequest, Part, Role};
use keel_providers::{STORED_RESPONSES_PROVIDER, StoredResponses};
use keel_runtime::{Agent, RunContext, RunError, RunOutcome, RunRecorder, Thread, ThreadHome};

use crate::App;
use crate::build::{AgentRequest, Resolution};
use crate::definition::{AgentRef, Resolved};
use crate::error::AppError;
use crate::model::{model_settings, provider_options};

/// The keys of an agent definition a Responses agent cannot honour (it has no
/// client-side tools, planner, critic or context management: the provider holds the
/// conversation).
const UNSUPPORTED_KEYS: [&str; 10] = [
    "tools",
    "env",
    "planner",
    "observation",
    "critic",
    "context",
    "budget",
    "handoffs",
    "max_handoffs",
    "agents_as_tools",
];

/// An agent whose threads live on OpenAI's Responses API (stored conversations).
pub struct ResponsesAgent {
    name: String,
    description: String,
    instructions: Option<String>,
    client: Arc<StoredResponses>,
    temperature: Option<f32>,
    max_output_tokens: Option<u32>,
}

impl std::fmt::Debug for ResponsesAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponsesAgent")
            .field("name", &self.name)
            .field("model", &self.client.id())
            .finish_non_exhaustive()
    }
}

impl ResponsesAgent {
    /// An agent named `name` answering through `client`.
    pub fn new(name: impl Into<String>, client: StoredResponses) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            instructions: None,
            client: Arc::new(client),
            temperature: None,
            max_output_tokens: None,
        }
    }

    /// What the agent does (shown to models that are offered it as a tool or handoff).
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// System instructions, sent with every request.
    #[must_use]
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Sampling temperature.
    #[must_use]
    pub fn temperature(mut self, temperature: Option<f32>) -> Self {
        self.temperature = temperature;
        self
    }

    /// Output limit per answer.
    #[must_use]
    pub fn max_output_tokens(mut self, tokens: Option<u32>) -> Self {
        self.max_output_tokens = tokens;
        self
    }

    /// `openai-responses:<model>`.
    pub fn model_id(&self) -> String {
        self.client.id()
    }

    /// Streams the answer to `input` after `previous`, telling observers each fragment
    /// and collecting retry records into `batch`. `Err(None)` means cancelled.
    async fn answer(
        &self,
        run: &RunRecorder<'_>,
        request: ModelRequest<'_>,
        previous: Option<&str>,
        span: &str,
        batch: &mut Vec<(EventKind, String)>,
        first_token: &mut keel_runtime::runner::FirstToken,
    ) -> Result<keel_core::ModelResponse, Option<ModelError>> {
        let context = run.context();
        let mut stream = self.client.stream(previous, request);
        let mut assembler = ResponseAssembler::new();
        loop {
            // The driver bounds every wait (connect, idle, overall call deadline).
            let next = tokio::select! {
                next = stream.next() => next,
                () = context.cancel.cancelled() => return Err(None),
            };
            let event = match next {
                None if assembler.is_complete() => return Ok(assembler.finish()),
                None => {
                    return Err(Some(ModelError::new(
                        keel_core::ModelErrorKind::StreamInterrupted,
                        "openai-responses: the stream ended before the answer was complete",
                    )));
                }
                Some(Err(error)) => return Err(Some(error)),
                Some(Ok(event)) => event,
            };
            for observer in &context.observers {
                observer.on_stream(run.thread_id(), run.run_id(), &event);
            }
            first_token.observe(&event);
            if let Some(kind) = keel_runtime::runner::stream_event_record(&event) {
                batch.push((kind, span.to_string()));
            }
            assembler.push(&event);
        }
    }
}

/// What the provider is sent of a message it has not seen: its text (a stored
/// conversation holds no client-side tool calls).
fn text_only(message: &Message) -> Option<Message> {
    let parts: Vec<Part> = message
        .parts
        .iter()
        .filter(|part| matches!(part, Part::Text { text } if !text.is_empty()))
        .cloned()
        .collect();
    (!parts.is_empty()).then_some(Message {
        role: message.role,
        parts,
    })
}

#[async_trait]
impl Agent for ResponsesAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn home_provider(&self) -> Option<&str> {
        Some(STORED_RESPONSES_PROVIDER)
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        if new_messages.is_empty() {
            return Err(RunError::NoInput);
        }
        // Before anything is appended: a thread a local agent answered in is refused.
        thread.check_home(&self.name, Some(STORED_RESPONSES_PROVIDER))?;
        let model = self.client.id();
        let mut run = RunRecorder::start(&self.name, &model, new_messages, thread, context).await?;
        let messages = run.state().messages();
        let previous = match ThreadHome::of(messages) {
            ThreadHome::Provider { conversation, .. } => Some(conversation),
            _ => None,
        };
        let input: Vec<Message> = ThreadHome::unsent(messages)
            .iter()
            .filter(|m| matches!(m.role, Role::User | Role::Assistant))
            .filter_map(text_only)
            .collect();
        let mut request = ModelRequest::new(&input);
        request.system = self.instructions.as_deref();
        request.temperature = self.temperature;
        request.max_output_tokens = self.max_output_tokens;
        let span = new_span_id();
        run.record_batch(vec![(
            EventKind::ModelRequested {
                turn: 1,
                model: model.clone(),
                message_count: u32::try_from(input.len()).unwrap_or(u32::MAX),
                tool_count: 0,
                estimated_input_tokens: self.client.estimate_tokens(&request),
                provider: Some(STORED_RESPONSES_PROVIDER.to_string()),
                temperature: self.temperature,
                max_tokens: self.max_output_tokens,
                context_window: Some(u64::from(self.client.capabilities().context_window)),
            },
            span.clone(),
        )])
        .await?;
        let started = Instant::now();
        let mut first_token = keel_runtime::runner::FirstToken::new(started);
        let mut batch = Vec::new();
        let result = self
            .answer(
                &run,
                request,
                previous.as_deref(),
                &span,
                &mut batch,
                &mut first_token,
            )
            .await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let response = match result {
            Ok(response) => response,
            Err(None) => {
                run.record_batch(batch).await?;
                return run
                    .finish(
                        EndState::Cancelled,
                        Some("cancelled by the user".into()),
                        None,
                    )
                    .await;
            }
            Err(Some(error)) => return fail(run, batch, span, error).await,
        };
        let Some(response_id) = response.response_id.clone() else {
            let error = ModelError::new(
                keel_core::ModelErrorKind::Other,
                "openai-responses: the answer carried no response id, so the conversation \
                 could not be continued from it",
            );
            return fail(run, batch, span, error).await;
        };
        let text = response.message.text();
        let mut parts: Vec<Part> = response
            .message
            .parts
            .into_iter()
            .filter(|part| matches!(part, Part::Text { .. } | Part::ProviderItem { .. }))
            .collect();
        parts.push(ThreadHome::marker(STORED_RESPONSES_PROVIDER, &response_id));
        batch.push((
            EventKind::ModelResponded {
                turn: 1,
                message: Message {
                    role: Role::Assistant,
                    parts,
                },
                usage: response.usage,
                latency_ms,
                stop_reason: response.stop_reason,
                response_id: Some(response_id),
                cost_usd: response.cost_usd,
                first_token_ms: first_token.millis(),
            },
            span,
        ));
        // The response id is durable before the run reports anything.
        run.record_batch(batch).await?;
        if text.trim().is_empty() {
            let reason = format!(
                "the model answered with no text (stop reason: {:?})",
                response.stop_reason
            );
            return run.finish(EndState::Failed, Some(reason), None).await;
        }
        run.finish(EndState::Done, None, Some(text)).await
    }
}

/// Records a failed call (`model_failed`, with the retries before it) and ends the run
/// `failed` with the error. The conversation on the provider is unchanged: the next run
/// sends this run's messages again with its own.
async fn fail(
    mut run: RunRecorder<'_>,
    mut batch: Vec<(EventKind, String)>,
    span: String,
    error: ModelError,
) -> Result<RunOutcome, RunError> {
    let reason = format!("model error ({}): {}", error.kind, error.message);
    batch.push((
        EventKind::ModelFailed {
            turn: 1,
            error: ModelFailure {
                kind: error.kind,
                message: error.message,
                status: error.status,
            },
        },
        span,
    ));
    run.record_batch(batch).await?;
    let mut outcome = run.finish(EndState::Failed, Some(reason), None).await?;
    // Not continued by `resume`: a new run on the thread sends the unsent messages again.
    outcome.resumable = false;
    Ok(outcome)
}

/// The kind of agent a definition describes.
pub(crate) fn kind_of(definition: &AgentDefinition) -> AgentKind {
    definition.agent_kind()
}

/// The error for building a Responses agent as a tool-calling one (a surface that only
/// drives tool-calling agents: resume of a tool-agent run, workflows, workers), located
/// at its `kind`.
pub(crate) fn not_a_tool_agent(resolved: &Resolved) -> Option<AppError> {
    (kind_of(&resolved.definition) == AgentKind::OpenAiResponses).then(|| {
        let name = (resolved.name.clone())
            .or_else(|| resolved.file.as_ref().map(|p| p.display().to_string()))
            .unwrap_or_else(|| "agent".into());
        resolved.error(
            DiagnosticCode::InvalidValue,
            "kind",
            format!(
                "agent `{name}` has kind = \"openai-responses\": its conversations live on \
                 OpenAI, so it is not a tool-calling agent and this command cannot drive it; \
                 run it with `keel run --agent {name}` (add `--thread ID` to continue one of \
                 its conversations)"
            ),
        )
    })
}

impl App {
    /// The kind of agent `reference` names (`tool` or `openai-responses`), so a surface
    /// knows which builder to call ([`App::agent`] or [`App::responses_agent`]).
    pub fn agent_kind(&self, reference: &AgentRef) -> Result<AgentKind, AppError> {
        Ok(kind_of(
            &Resolved::load(self.loaded(), reference)?.definition,
        ))
    }

    /// Builds the Responses agent `request.agent` names (`kind = "openai-responses"`).
    /// The model is the request's, else the definition's, else `[defaults] model`; a bare
    /// model name means `openai-responses:<name>`. Keys a Responses agent cannot honour
    /// (`tools`, `planner`, `critic`, `context`, `budget`…) are errors at their line.
    pub async fn responses_agent(
        &self,
        request: &AgentRequest,
    ) -> Result<(ResponsesAgent, Resolution), AppError> {
        let Some(reference) = &request.agent else {
            return Err(AppError::Invalid(
                "a Responses agent is built from a definition with kind = \"openai-responses\""
                    .into(),
            ));
        };
        let resolved = Resolved::load(self.loaded(), reference)?;
        let def = &resolved.definition;
        let name = def
            .name
            .clone()
            .or_else(|| resolved.name.clone())
            .or_else(|| {
                resolved
                    .file
                    .as_ref()
                    .and_then(|p| p.file_stem())
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "keel".into());
        let mut problems = Vec::new();
        let set = def.set_keys();
        for key in UNSUPPORTED_KEYS.iter().filter(|key| set.contains(key)) {
            problems.push(resolved.error(
                DiagnosticCode::InvalidValue,
                key,
                format!(
                    "`{key}` is not supported by kind = \"openai-responses\" agents (the \
                     provider holds the conversation; client-side tools, planners, critics, \
                     context management, budgets and compositions are the tool-calling \
                     agent's): remove it, or drop `kind`"
                ),
            ));
        }
        if !request.tools.is_empty() {
            problems.push(AppError::Invalid(format!(
                "agent `{name}` (kind = \"openai-responses\") takes no tools; remove --tool {}",
                request.tools.join(", ")
            )));
        }
        if let Some(t) = def.temperature
            && !(0.0..=2.0).contains(&t)
        {
            problems.push(resolved.error(
                DiagnosticCode::InvalidValue,
                "temperature",
                format!("temperature must be between 0 and 2, got {t}"),
            ));
        }
        let config = self.config();
        let spec = request
            .model
            .clone()
            .or_else(|| def.model.clone())
            .or_else(|| config.defaults.model.clone())
            .unwrap_or_else(|| "gpt-5".to_string());
        let qualified = if config.models.contains_key(&spec) || spec.contains(':') {
            spec.clone()
        } else {
            format!("{STORED_RESPONSES_PROVIDER}:{spec}")
        };
        let (provider_spec, options) =
            provider_options(config, &qualified, request.base_url.clone(), self.env());
        if !provider_spec.starts_with(&format!("{STORED_RESPONSES_PROVIDER}:")) {
            problems.push(resolved.error(
                DiagnosticCode::InvalidValue,
                "model",
                format!(
                    "model `{spec}` is `{provider_spec}`, but a kind = \"openai-responses\" agent \
                     needs an openai-responses model (e.g. `gpt-5` or `openai-responses:gpt-5`)"
                ),
            ));
        }
        let instructions = match (
            &request.instructions,
            &def.instructions,
            &def.instructions_file,
        ) {
            (Some(text), _, _) => Some(text.clone()),
            (None, Some(text), _) => Some(text.clone()),
            (None, None, Some(file)) => {
                let path = resolved.dir_of("instructions_file").join(file);
                match std::fs::read_to_string(&path) {
                    Ok(text) => Some(text),
                    Err(e) => {
                        problems.push(resolved.error(
                            DiagnosticCode::MissingFile,
                            "instructions_file",
                            format!(
                                "cannot read instructions file `{}` ({e}); paths are relative \
                                 to the file that names them",
                                file.display()
                            ),
                        ));
                        None
                    }
                }
            }
            (None, None, None) => None,
        };
        if let Some(first) = AppError::merge(problems) {
            return Err(first);
        }
        let env = self.env();
        let client = StoredResponses::with_env(&provider_spec, &options, &|name| env(name))
            .map_err(|e| AppError::Model {
                spec: spec.clone(),
                message: e.to_string(),
            })?;
        let settings = model_settings(config, &spec);
        let mut agent = ResponsesAgent::new(name.clone(), client)
            .temperature(def.temperature.or(settings.temperature))
            .max_output_tokens(
                request
                    .max_output_tokens
                    .or(def.max_output_tokens)
                    .or(settings.max_output_tokens),
            );
        if let Some(text) = instructions {
            agent = agent.instructions(text);
        }
        if let Some(description) = &def.description {
            agent = agent.description(description.clone());
        }
        let resolution = Resolution {
            name,
            agent_name: resolved.name.clone(),
            agent_file: resolved.file.clone(),
            model_spec: Some(provider_spec),
            tools: Vec::new(),
            approve: def.approve,
            notices: Vec::new(),
            definition: Some(def.clone()),
        };
        Ok((agent, resolution))
    }
}
