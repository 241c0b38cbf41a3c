//! [`Agent`]: the facade's handle on an agent — any [`keel_runtime::Agent`] (the
//! tool-calling [`keel_runtime::ToolAgent`], a custom agent, a composition) together with
//! the [`RunContext`] its runs use (store, observers, approvals, cancellation). It turns
//! the runtime's "run on a thread with a context" into one call: [`Agent::prompt`].

use std::path::Path;
use std::sync::Arc;

use futures::FutureExt;
use futures::stream::BoxStream;
use keel_app::{AgentRef, AgentRequest, App};
use keel_core::{EndState, Message};
use keel_runtime::{AgentUpdate, RunApprovalMode, RunContext, RunOutcome, RunStatus, Thread};
use tokio::sync::OnceCell;

use crate::builder::AgentBuilder;
use crate::error::Error;

/// How many times [`Agent::prompt_typed`] sends a schema violation back to the model
/// before giving up, unless [`Agent::with_max_repairs`] says otherwise.
pub const DEFAULT_MAX_REPAIRS: u32 = 2;

/// An agent ready to be prompted: a [`keel_runtime::Agent`] and the [`RunContext`] of its
/// runs. Cheap to clone (clones share the agent and the context) and safe to use from
/// many tasks at once: each prompt runs on its own thread.
///
/// Three ways to get one:
/// - [`Agent::from_config`]: an agent declared in keel.toml (`[agents.<name>]`) or an agent
///   file, built exactly as `keel run --agent NAME` builds it, with keel.toml's store;
/// - [`Agent::builder`]: a tool-calling agent from a model, instructions and tools;
/// - [`Agent::new`]: any implementation of [`keel_runtime::Agent`] (a custom agent).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel::Error> {
/// use std::sync::Arc;
/// use keel_testkit::{ScriptStep, ScriptedModel};
///
/// let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("Hello!")]));
/// let agent = keel::Agent::builder("greeter", model)
///     .instructions("Greet the user.")
///     .build()?;
/// assert_eq!(agent.prompt("Hi").await?, "Hello!");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    /// The agent's name, or the reference given to `from_config` until it is built.
    name: String,
    /// Where the agent and the context come from when they are not ready yet.
    app: Option<Arc<ConfigSource>>,
    agent: OnceCell<Built>,
    context: OnceCell<RunContext>,
    max_repairs: u32,
}

/// An agent declared in configuration, built (and its store opened) on first use when
/// that could not be done at once.
struct ConfigSource {
    app: App,
    request: AgentRequest,
}

#[derive(Clone)]
struct Built {
    agent: Arc<dyn keel_runtime::Agent>,
    /// The definition's own approval mode (`approve = "ask"`), for the run context.
    approve: Option<RunApprovalMode>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field("built", &self.inner.agent.initialized())
            .field("context", &self.inner.context.get())
            .field("max_repairs", &self.inner.max_repairs)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// The agent `agent` of the configuration at `path`: an `[agents.<name>]` name of that
    /// keel.toml, or an agent file (relative to the current directory) — built exactly as
    /// `keel run --config PATH --agent AGENT` builds it (model, tools, budget, critic…),
    /// running on keel.toml's store (`KEEL_STORE` > `[store] url` > `.keel/keel.db`) with
    /// its approval modes.
    ///
    /// keel.toml and the agent definition are checked now: a bad file, an unknown agent,
    /// tool or model fails here, naming the file, key and line, before any model call.
    /// The agent is built now too, unless keel.toml declares MCP servers (they are
    /// connected on the first prompt, inside your runtime); the store is opened on the
    /// first prompt. Every run records the agent by name, so `keel resume THREAD` (run
    /// next to the same keel.toml) can continue it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), keel::Error> {
    /// let agent = keel::Agent::from_config("keel.toml", "detective")?;
    /// let text = agent.prompt("Assess release v2.1.0").await?;
    /// # let _ = text; Ok(()) }
    /// ```
    pub fn from_config(path: impl AsRef<Path>, agent: &str) -> Result<Self, Error> {
        Self::from_app(App::load(Some(path.as_ref()))?, agent)
    }

    /// [`Agent::from_config`] over an application already loaded, e.g. with
    /// [`App::from_toml_str`] and an explicit environment, or with your own tools added to
    /// its catalog ([`App::with_tools`]) so the configuration can name them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keel::Error> {
    /// use std::sync::Arc;
    ///
    /// let toml = r#"
    ///     [store]
    ///     url = "memory:"
    ///
    ///     [providers.openai]
    ///     base_url = "http://127.0.0.1:9/v1"   # a local mock; nothing is called here
    ///
    ///     [agents.helper]
    ///     instructions = "Answer concisely."
    ///     model = "openai:gpt-4.1-mini"
    ///     tools = ["calculator"]
    /// "#;
    /// let env = Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    /// let app = keel::app::App::from_toml_str(toml, std::path::Path::new("."), env)?;
    /// let agent = keel::Agent::from_app(app, "helper")?;
    /// assert_eq!(agent.name(), "helper");
    ///
    /// // A typo is caught before any model call, with the nearest valid name.
    /// let app = keel::app::App::from_toml_str(toml, std::path::Path::new("."), Arc::new(|_: &str| None))?;
    /// let error = keel::Agent::from_app(app, "helpr").unwrap_err();
    /// assert!(error.to_string().contains("did you mean `helper`?"), "{error}");
    /// # Ok(()) }
    /// ```
    pub fn from_app(app: App, agent: &str) -> Result<Self, Error> {
        let reference = app.find_agent(agent)?;
        let request = AgentRequest {
            agent: Some(reference),
            ..AgentRequest::default()
        };
        let source = ConfigSource { app, request };
        let mut name = agent.to_string();
        let mut built = None;
        // Building needs no I/O unless MCP servers must be connected: do it now, so a bad
        // definition fails here. (`now_or_never` only runs it inside a runtime, in case a
        // model adapter touches the reactor.)
        if source.app.config().mcp.servers.is_empty()
            && tokio::runtime::Handle::try_current().is_ok()
            && let Some(result) = source.build().now_or_never()
        {
            let (agent, resolved_name) = result?;
            name = resolved_name;
            built = Some(agent);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                app: Some(Arc::new(source)),
                agent: OnceCell::new_with(built),
                context: OnceCell::new(),
                max_repairs: DEFAULT_MAX_REPAIRS,
            }),
        })
    }

    /// Starts building a tool-calling agent ([`keel_runtime::ToolAgent`]) on `model`.
    /// Its runs use an in-memory store unless you give it a context
    /// ([`AgentBuilder::context`]).
    pub fn builder(name: impl Into<String>, model: Arc<dyn keel_core::Model>) -> AgentBuilder {
        AgentBuilder::new(name, model)
    }

    /// Wraps any agent — typically your own implementation of [`keel_runtime::Agent`] —
    /// with an in-memory store. Give it a durable one with [`Agent::with_context`].
    pub fn new(agent: impl keel_runtime::Agent + 'static) -> Self {
        Self::from_arc(Arc::new(agent))
    }

    /// [`Agent::new`] for an agent already shared.
    pub fn from_arc(agent: Arc<dyn keel_runtime::Agent>) -> Self {
        Self::ready(agent, RunContext::default())
    }

    pub(crate) fn ready(agent: Arc<dyn keel_runtime::Agent>, context: RunContext) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: agent.name().to_string(),
                app: None,
                agent: OnceCell::new_with(Some(Built {
                    agent,
                    approve: None,
                })),
                context: OnceCell::new_with(Some(context)),
                max_repairs: DEFAULT_MAX_REPAIRS,
            }),
        }
    }

    /// The same agent with runs in `context` (its store, observers, approval handler,
    /// user-input source and cancellation token) instead of the current one.
    ///
    /// ```
    /// use keel::runtime::RunContext;
    /// # use std::sync::Arc;
    /// # let model = Arc::new(keel_testkit::ScriptedModel::new(vec![]));
    /// # let agent = keel::Agent::builder("a", model).build().unwrap();
    /// let store = Arc::new(keel::core::MemoryStore::new());
    /// let agent = agent.with_context(RunContext::new(store));
    /// ```
    #[must_use]
    pub fn with_context(&self, context: RunContext) -> Self {
        self.rebuilt(|inner| inner.context = OnceCell::new_with(Some(context)))
    }

    /// The same agent, with at most `repairs` schema violations sent back to the model by
    /// [`Agent::prompt_typed`] (default [`DEFAULT_MAX_REPAIRS`]; 0 accepts only a first
    /// answer that matches).
    #[must_use]
    pub fn with_max_repairs(&self, repairs: u32) -> Self {
        self.rebuilt(|inner| inner.max_repairs = repairs)
    }

    fn rebuilt(&self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Inner {
            name: self.inner.name.clone(),
            app: self.inner.app.clone(),
            agent: OnceCell::new_with(self.inner.agent.get().cloned()),
            context: OnceCell::new_with(self.inner.context.get().cloned()),
            max_repairs: self.inner.max_repairs,
        };
        change(&mut inner);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How many schema violations [`Agent::prompt_typed`] sends back before failing.
    pub fn max_repairs(&self) -> u32 {
        self.inner.max_repairs
    }

    /// The runtime agent (built now if it was not yet).
    pub async fn runtime_agent(&self) -> Result<Arc<dyn keel_runtime::Agent>, Error> {
        Ok(Arc::clone(&self.built().await?.agent))
    }

    /// The run context of this agent's runs (the store is opened now if it was not yet).
    /// Add observers or an approval handler to a clone and pass it to
    /// [`Agent::with_context`].
    pub async fn context(&self) -> Result<RunContext, Error> {
        Ok(self.ready_context().await?.clone())
    }

    /// A new, empty thread (a new conversation) for [`Agent::run`].
    pub fn thread(&self) -> Thread {
        Thread::new()
    }

    /// Loads a thread from this agent's store, to continue the conversation.
    pub async fn load_thread(&self, thread_id: &str) -> Result<Thread, Error> {
        let context = self.ready_context().await?;
        Ok(Thread::load(context.store.as_ref(), thread_id).await?)
    }

    /// Sends `text` on a new thread and returns the final answer. A run that ends other
    /// than `done` — or pauses for an approval — is an [`Error`] carrying the end state,
    /// the reason and the thread id.
    pub async fn prompt(&self, text: impl Into<String>) -> Result<String, Error> {
        let mut thread = Thread::new();
        let outcome = self.run(vec![Message::user(text)], &mut thread).await?;
        final_text(outcome)
    }

    /// Runs the agent on `thread` with `messages` (the runtime's
    /// [`keel_runtime::Agent::run`] in this agent's context). The outcome says how the run
    /// ended; `Err` is kept for runs that could not be driven.
    pub async fn run(
        &self,
        messages: Vec<Message>,
        thread: &mut Thread,
    ) -> Result<RunOutcome, Error> {
        let agent = Arc::clone(&self.built().await?.agent);
        let context = self.ready_context().await?;
        Ok(agent.run(messages, thread, context).await?)
    }

    /// Continues the run in progress on `thread` (after a pause or a crash).
    pub async fn resume(&self, thread: &mut Thread) -> Result<RunOutcome, Error> {
        let agent = Arc::clone(&self.built().await?.agent);
        let context = self.ready_context().await?;
        Ok(agent.resume(thread, context).await?)
    }

    /// [`Agent::run`] as a stream of updates: every event as it is appended, every
    /// fragment of the model's answer as it arrives, then
    /// [`AgentUpdate::Finished`] with the outcome. Fails before streaming when the agent
    /// cannot be built or its store opened.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keel::Error> {
    /// use futures::StreamExt;
    /// use keel::runtime::AgentUpdate;
    /// # use std::sync::Arc;
    /// # let model = Arc::new(keel_testkit::ScriptedModel::new(vec![keel_testkit::ScriptStep::text("Hello there")]));
    /// # let agent = keel::Agent::builder("a", model).build()?;
    ///
    /// let mut thread = agent.thread();
    /// let mut updates = agent
    ///     .run_stream(vec![keel::core::Message::user("Hi")], &mut thread)
    ///     .await?;
    /// let mut streamed = String::new();
    /// while let Some(update) = updates.next().await {
    ///     match update {
    ///         AgentUpdate::Stream(keel::core::StreamEvent::TextDelta(delta)) => streamed.push_str(&delta),
    ///         AgentUpdate::Finished(outcome) => assert!(outcome.is_ok()),
    ///         _ => {}
    ///     }
    /// }
    /// assert_eq!(streamed, "Hello there");
    /// # Ok(()) }
    /// ```
    pub async fn run_stream<'a>(
        &'a self,
        messages: Vec<Message>,
        thread: &'a mut Thread,
    ) -> Result<BoxStream<'a, AgentUpdate>, Error> {
        let built = self.built().await?;
        let context = self.ready_context().await?;
        Ok(built.agent.run_stream(messages, thread, context))
    }

    /// Disconnects the MCP servers the configuration connected, if any.
    pub async fn shutdown(&self) {
        if let Some(source) = &self.inner.app {
            source.app.shutdown().await;
        }
    }

    async fn built(&self) -> Result<&Built, Error> {
        self.inner
            .agent
            .get_or_try_init(|| async {
                match &self.inner.app {
                    Some(source) => source.build().await.map(|(built, _)| built),
                    None => Err(keel_app::AppError::Invalid(
                        "the agent has no definition to build it from".into(),
                    )
                    .into()),
                }
            })
            .await
    }

    async fn ready_context(&self) -> Result<&RunContext, Error> {
        self.inner
            .context
            .get_or_try_init(|| async {
                let Some(source) = &self.inner.app else {
                    return Ok(RunContext::default());
                };
                let approve = self.built().await?.approve;
                let store = source.app.open_store(None).await?;
                Ok(source.app.run_context(store.events, None, approve))
            })
            .await
    }
}

impl ConfigSource {
    /// Builds the agent the request names, recording how to rebuild it (by keel.toml name
    /// or agent file, and the model chosen) so `keel resume` can continue its runs.
    async fn build(&self) -> Result<(Built, String), Error> {
        let mut recipe = serde_json::Map::new();
        match &self.request.agent {
            Some(AgentRef::Named(name)) => {
                recipe.insert("agent_name".into(), name.clone().into());
            }
            Some(AgentRef::File(path)) => {
                recipe.insert("agent".into(), path.display().to_string().into());
            }
            _ => {}
        }
        // A remote A2A agent (`a2a = "…"`) answers with its own model: no builder.
        if let Some(reference) = &self.request.agent
            && self.app.agent_kind(reference)? == keel_config::AgentKind::A2a
        {
            let recipe = serde_json::Value::Object(recipe);
            let (agent, resolution) = self.app.a2a_agent(&self.request, recipe)?;
            let built = Built {
                agent: Arc::new(agent),
                approve: None,
            };
            return Ok((built, resolution.name));
        }
        let (builder, resolution) = self.app.agent_builder(&self.request).await?;
        if let Some(model) = &resolution.model_spec {
            recipe.insert("model".into(), model.clone().into());
        }
        // Composed: an agent with `handoffs` runs as a group that follows them.
        let recipe = serde_json::Value::Object(recipe);
        let agent = self
            .app
            .compose(
                builder.recipe(recipe.clone()),
                &resolution,
                &self.request,
                recipe,
            )
            .await?;
        let built = Built {
            agent: Arc::new(agent),
            approve: resolution.approve,
        };
        Ok((built, resolution.name))
    }
}

/// The final answer of a run that ended `done`; any other ending is an error.
pub(crate) fn final_text(outcome: RunOutcome) -> Result<String, Error> {
    match outcome.status {
        RunStatus::Ended {
            end_state: EndState::Done,
        } => Ok(outcome.final_text.unwrap_or_default()),
        RunStatus::Ended { end_state } => Err(Error::RunEnded {
            end_state,
            reason: outcome
                .reason
                .or_else(|| outcome.clarification.map(|c| c.question)),
            thread_id: outcome.thread_id,
            run_id: outcome.run_id,
        }),
        RunStatus::AwaitingApproval { call_id, tool } => Err(Error::AwaitingApproval {
            thread_id: outcome.thread_id,
            run_id: outcome.run_id,
            call_id,
            tool,
        }),
    }
}
