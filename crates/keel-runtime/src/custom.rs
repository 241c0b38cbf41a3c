//! [`RunRecorder`]: what a custom [`crate::Agent`] uses to write its run to the thread's
//! log with the same guarantees as the tool-calling agent — each event in the store
//! before the call returns, observers told, one `run_started` … `run_ended` per run — so
//! `keel threads show`, `keel trace show` and resume treat its runs like any other.

use keel_core::new_id;
use keel_core::{Budget, EndState, EventKind, Message, RunState};

use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;

/// Writes one run of a custom agent: [`start`](RunRecorder::start) appends `run_started`
/// and the new user messages, [`record`](RunRecorder::record) and
/// [`reply`](RunRecorder::reply) append what the agent does,
/// [`finish`](RunRecorder::finish) appends `run_ended` and returns the outcome.
///
/// ```
/// use keel_core::{EndState, Message};
/// use keel_runtime::{RunContext, RunRecorder, Thread};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_runtime::RunError> {
/// let context = RunContext::default();
/// let mut thread = Thread::new();
/// let hello = vec![Message::user("hello")];
/// let mut run = RunRecorder::start("counter", "custom:counter", hello, &mut thread, &context).await?;
/// let seen = run.state().messages().len(); // the conversation so far, this message included
/// run.reply("counter", Message::assistant(format!("{seen} message(s)"))).await?;
/// let outcome = run.finish(EndState::Done, None, Some(seen.to_string())).await?;
/// assert_eq!(outcome.final_text.as_deref(), Some("1"));
///
/// // The next run on the thread sees the whole conversation; a failure is recorded as data.
/// let again = vec![Message::user("again")];
/// let run = RunRecorder::start("counter", "custom:counter", again, &mut thread, &context).await?;
/// assert_eq!(run.state().messages().len(), 3);
/// let outcome = run.finish(EndState::Failed, Some("gave up".into()), None).await?;
/// assert_eq!(outcome.end_state(), Some(EndState::Failed));
/// # Ok(()) }
/// ```
pub struct RunRecorder<'a> {
    journal: Journal<'a>,
}

impl std::fmt::Debug for RunRecorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRecorder")
            .field("thread_id", &self.journal.thread_id())
            .field("run_id", &self.journal.run_id())
            .finish_non_exhaustive()
    }
}

impl<'a> RunRecorder<'a> {
    /// Starts a run of `agent` on `thread` with `new_messages` (at least one, unless the
    /// thread's latest run handed the conversation off to `agent`). `model`
    /// names what answers (`"custom:echo"`, `"openai-responses:gpt-5"`), for traces.
    /// Fails, appending nothing, when the thread already has a run in progress.
    pub async fn start(
        agent: &str,
        model: &str,
        new_messages: Vec<Message>,
        thread: &'a mut Thread,
        context: &'a RunContext,
    ) -> Result<Self, RunError> {
        let opening = RunOpening {
            agent: agent.to_string(),
            model: model.to_string(),
            budget: Budget::default(),
            definition: None,
        };
        let (mut journal, batch) = open_run(thread, context, opening, new_messages).await?;
        journal.append_batch(batch).await?;
        Ok(Self { journal })
    }

    /// [`start`](Self::start), recording `definition` in `run_started` — how the
    /// application layer rebuilds the agent (its recipe) — so `keel resume`, `reply` and
    /// workers can continue the thread from its log alone.
    pub async fn start_with_definition(
        agent: &str,
        model: &str,
        definition: keel_core::AgentDefinition,
        new_messages: Vec<Message>,
        thread: &'a mut Thread,
        context: &'a RunContext,
    ) -> Result<Self, RunError> {
        let opening = RunOpening {
            agent: agent.to_string(),
            model: model.to_string(),
            budget: Budget::default(),
            definition: Some(Box::new(definition)),
        };
        let (mut journal, batch) = open_run(thread, context, opening, new_messages).await?;
        journal.append_batch(batch).await?;
        Ok(Self { journal })
    }

    /// Continues the run in progress on `thread` (interrupted, or paused and since
    /// answered): later events join that run. Fails, appending nothing, when no run is in
    /// progress.
    pub async fn resume(thread: &'a mut Thread, context: &'a RunContext) -> Result<Self, RunError> {
        thread.reload_if_diverged(context.store.as_ref()).await?;
        if !thread.state().run_in_progress() {
            return Err(RunError::NothingToResume(thread.id().to_string()));
        }
        Ok(Self {
            journal: Journal::resume(thread, context),
        })
    }

    /// The events of this run so far, in order.
    pub fn run_events(&self) -> &[std::sync::Arc<keel_core::Event>] {
        self.journal.run_events()
    }

    /// The thread's folded state: the conversation so far ([`RunState::messages`]),
    /// including this run's user messages.
    pub fn state(&self) -> &RunState {
        self.journal.state()
    }

    /// The thread's id.
    pub fn thread_id(&self) -> &str {
        self.journal.thread_id()
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.journal.run_id()
    }

    /// The span id of the run (the parent of spans the agent opens).
    pub fn span_id(&self) -> &str {
        self.journal.run_span()
    }

    /// The run's trace id (with [`span_id`](Self::span_id) or a child span: what
    /// [`RunContext::with_parent_span`] takes to nest another run under this one).
    pub fn trace_id(&self) -> &str {
        self.journal.trace_id()
    }

    /// The run context.
    pub fn context(&self) -> &RunContext {
        self.journal.ctx()
    }

    /// Appends one event in the run's span; it is durable when this returns.
    pub async fn record(&mut self, kind: EventKind) -> Result<(), RunError> {
        self.journal.append(kind).await
    }

    /// Appends events atomically, each in the span given (see [`keel_core::event::new_span_id`]
    /// for child spans).
    pub async fn record_batch(&mut self, items: Vec<(EventKind, String)>) -> Result<(), RunError> {
        self.journal.append_batch(items).await
    }

    /// Adds the agent's assistant message to the conversation (`agent_message`).
    pub async fn reply(&mut self, agent: &str, message: Message) -> Result<(), RunError> {
        self.record(EventKind::AgentMessage {
            agent: agent.to_string(),
            message,
        })
        .await
    }

    /// Appends `events` and `run_ended` atomically (no reader ever sees the events
    /// without the end) and returns the run's outcome.
    pub async fn finish_with(
        mut self,
        mut events: Vec<(EventKind, String)>,
        end_state: EndState,
        reason: Option<String>,
        final_text: Option<String>,
    ) -> Result<RunOutcome, RunError> {
        let span = self.journal.run_span().to_string();
        events.push((
            EventKind::RunEnded {
                end_state,
                reason,
                final_text,
            },
            span,
        ));
        self.journal.append_batch(events).await?;
        Ok(RunOutcome::from_run_events(
            self.journal.thread_id(),
            self.journal.run_id(),
            self.journal.run_events(),
            RunStatus::Ended { end_state },
        ))
    }

    /// Ends the run (`run_ended`) and returns its outcome.
    pub async fn finish(
        mut self,
        end_state: EndState,
        reason: Option<String>,
        final_text: Option<String>,
    ) -> Result<RunOutcome, RunError> {
        self.journal
            .append(EventKind::RunEnded {
                end_state,
                reason,
                final_text,
            })
            .await?;
        Ok(RunOutcome::from_run_events(
            self.journal.thread_id(),
            self.journal.run_id(),
            self.journal.run_events(),
            RunStatus::Ended { end_state },
        ))
    }
}

/// What a new run records about its agent in `run_started`.
pub(crate) struct RunOpening {
    pub(crate) agent: String,
    pub(crate) model: String,
    pub(crate) budget: Budget,
    pub(crate) definition: Option<Box<keel_core::AgentDefinition>>,
}

/// Opens a new run on `thread`, for every kind of agent: refuses a thread with a run in
/// progress, or no new message unless the thread was handed off to this agent, and
/// returns the journal with the run's first batch (`run_started` and the user messages)
/// for the caller to append or stage. Nothing is written here.
pub(crate) async fn open_run<'a>(
    thread: &'a mut Thread,
    context: &'a RunContext,
    opening: RunOpening,
    new_messages: Vec<Message>,
) -> Result<(Journal<'a>, Vec<(EventKind, String)>), RunError> {
    thread.reload_if_diverged(context.store.as_ref()).await?;
    // No new message: only to take over a conversation handed off to this agent.
    if new_messages.is_empty() && !crate::handoff::takes_over(thread, &opening.agent) {
        return Err(RunError::NoInput);
    }
    if let Some(run) = thread
        .state()
        .run()
        .filter(|_| thread.state().run_in_progress())
    {
        return Err(RunError::RunInProgress {
            thread_id: thread.id().to_string(),
            run_id: run.run_id.clone(),
        });
    }
    let goal = match new_messages.is_empty() {
        true => crate::handoff::handed_off_goal(thread),
        false => new_messages
            .iter()
            .map(Message::text)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let journal = Journal::start(thread, context, new_id("run"));
    let span = journal.run_span().to_string();
    let mut batch = vec![(
        EventKind::RunStarted {
            agent: opening.agent,
            model: opening.model,
            goal,
            constraints: Vec::new(),
            budget: opening.budget,
            definition: opening.definition,
            parent_span_id: None,
        },
        span.clone(),
    )];
    batch.extend(
        new_messages
            .into_iter()
            .map(|message| (EventKind::UserMessage { message }, span.clone())),
    );
    Ok((journal, batch))
}

/// The whole run of an agent that answers `new_messages` with `answer` and nothing else:
/// `run_started`, the user messages, the answer as an `agent_message`, `run_ended done`.
pub async fn finish_run(
    agent: &str,
    new_messages: Vec<Message>,
    answer: String,
    thread: &mut Thread,
    context: &RunContext,
) -> Result<RunOutcome, RunError> {
    let model = format!("custom:{agent}");
    let mut run = RunRecorder::start(agent, &model, new_messages, thread, context).await?;
    run.reply(agent, Message::assistant(answer.clone())).await?;
    run.finish(EndState::Done, None, Some(answer)).await
}
