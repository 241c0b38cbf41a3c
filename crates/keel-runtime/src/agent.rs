//! The [`Agent`] trait: seed 003's "an agent is anything that processes messages in a
//! thread". [`crate::ToolAgent`] (model + tools + policies) is the main implementation;
//! custom agents, provider-backed agents and compositions implement the same trait, so
//! every surface (CLI, server, library, workflows, agent-as-tool) drives them alike.
//!
//! The contract every implementation keeps: events go to `context.store` before they are
//! acted on, observers see each appended event, the run honours `context.cancel`, and
//! failures are returned as data ([`RunOutcome`] with an end state) — `Err` is kept for
//! "could not run at all" (store failure, incompatible thread, nothing to resume).

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use keel_core::{Event, Message, StreamEvent};

use crate::context::{ChannelObserver, RunContext, RunUpdate};
use crate::outcome::{RunError, RunOutcome};
use crate::thread::Thread;

/// Anything that processes messages in a thread.
///
/// Implement [`run`](Agent::run) (and [`resume`](Agent::resume) when a paused or
/// interrupted run of yours can be continued); streaming comes for free through
/// [`run_stream`](Agent::run_stream). A custom agent writes its run with
/// [`RunRecorder`](crate::RunRecorder), which keeps the contract above for it:
///
/// ```
/// use keel_core::{EndState, Message};
/// use keel_runtime::{Agent, RunContext, RunError, RunOutcome, RunRecorder, Thread};
///
/// /// Repeats what it is told.
/// struct Echo;
///
/// #[async_trait::async_trait]
/// impl Agent for Echo {
///     fn name(&self) -> &str {
///         "echo"
///     }
///
///     async fn run(
///         &self,
///         new_messages: Vec<Message>,
///         thread: &mut Thread,
///         context: &RunContext,
///     ) -> Result<RunOutcome, RunError> {
///         let text = new_messages.iter().map(Message::text).collect::<Vec<_>>().join("\n");
///         let mut run = RunRecorder::start("echo", "custom:echo", new_messages, thread, context).await?;
///         run.reply("echo", Message::assistant(text.clone())).await?;
///         run.finish(EndState::Done, None, Some(text)).await
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), RunError> {
/// let context = RunContext::default(); // an in-memory store
/// let mut thread = Thread::new();
/// let outcome = Echo.run(vec![Message::user("hello")], &mut thread, &context).await?;
/// assert_eq!(outcome.end_state(), Some(EndState::Done));
/// assert_eq!(outcome.final_text.as_deref(), Some("hello"));
/// // Durable like any run: run_started, user_message, agent_message, run_ended.
/// assert_eq!(context.store.load(thread.id()).await?.len(), 4);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Agent: Send + Sync {
    /// The agent's name (recorded on its runs, shown in traces, used by handoffs).
    fn name(&self) -> &str;

    /// What the agent does, in one or two sentences: shown to a model that is offered
    /// this agent as a tool or as a handoff target.
    fn description(&self) -> &str {
        ""
    }

    /// Where this agent keeps the conversations of the threads it runs on: `None` (the
    /// default) in the thread's own log; `Some(provider)` on that provider's service
    /// (e.g. `openai-responses` for an agent on the Responses API's stored
    /// conversations). See [`crate::ThreadHome`] and [`Thread::check_home`].
    fn home_provider(&self) -> Option<&str> {
        None
    }

    /// Runs the agent on `thread` with `new_messages` until the run ends or pauses.
    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError>;

    /// Continues the run in progress on `thread` (after a pause or a crash). Agents that
    /// cannot continue a run say so with [`RunError::NothingToResume`].
    async fn resume(
        &self,
        thread: &mut Thread,
        _context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        Err(RunError::NothingToResume(thread.id().to_string()))
    }

    /// [`run`](Agent::run) as a stream: every durable event and every model stream
    /// fragment as it happens, then [`AgentUpdate::Finished`] with the outcome. Nothing
    /// is dropped (the channel is unbounded) and the stream ends after `Finished`.
    fn run_stream<'a>(
        &'a self,
        new_messages: Vec<Message>,
        thread: &'a mut Thread,
        context: &RunContext,
    ) -> BoxStream<'a, AgentUpdate> {
        let (observer, receiver) = ChannelObserver::new();
        let context = context.clone().with_observer(Arc::new(observer));
        let run = async move { self.run(new_messages, thread, &context).await }.boxed();
        stream_run(run, receiver)
    }
}

/// One item of [`Agent::run_stream`].
#[derive(Debug)]
#[non_exhaustive]
pub enum AgentUpdate {
    /// An event was appended to the thread's log.
    Event(Arc<Event>),
    /// A fragment of a model's streamed answer (text delta, tool-call fragment, retry).
    Stream(StreamEvent),
    /// The run returned; the last item of the stream (boxed: an outcome is large next to
    /// the other updates).
    Finished(Box<Result<RunOutcome, RunError>>),
}

impl From<RunUpdate> for AgentUpdate {
    fn from(update: RunUpdate) -> Self {
        match update {
            RunUpdate::Event(event) => Self::Event(event),
            RunUpdate::Stream(stream) => Self::Stream(stream),
        }
    }
}

/// Interleaves a run's observer channel with the run itself: updates as they arrive,
/// and once the run returns, the updates still queued and then `Finished`.
fn stream_run<'a>(
    run: BoxFuture<'a, Result<RunOutcome, RunError>>,
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<RunUpdate>,
) -> BoxStream<'a, AgentUpdate> {
    let mut run: Option<Pin<Box<dyn std::future::Future<Output = _> + Send + 'a>>> = Some(run);
    let mut result: Option<Result<RunOutcome, RunError>> = None;
    futures::stream::poll_fn(move |cx| {
        if let Some(pending) = run.as_mut() {
            if let Poll::Ready(Some(update)) = receiver.poll_recv(cx) {
                return Poll::Ready(Some(AgentUpdate::from(update)));
            }
            match pending.as_mut().poll(cx) {
                Poll::Ready(finished) => {
                    run = None;
                    result = Some(finished);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        // The run has returned (its context, and with it the sender, is dropped): drain
        // what is queued, then report the outcome once.
        if let Ok(update) = receiver.try_recv() {
            return Poll::Ready(Some(AgentUpdate::from(update)));
        }
        Poll::Ready(result.take().map(|r| AgentUpdate::Finished(Box::new(r))))
    })
    .boxed()
}

#[async_trait]
impl Agent for crate::ToolAgent {
    fn name(&self) -> &str {
        crate::ToolAgent::name(self)
    }

    fn description(&self) -> &str {
        crate::ToolAgent::description(self)
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        crate::ToolAgent::run(self, new_messages, thread, context).await
    }

    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        crate::ToolAgent::resume(self, thread, context).await
    }
}

#[async_trait]
impl<A: Agent + ?Sized> Agent for Arc<A> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn description(&self) -> &str {
        (**self).description()
    }

    fn home_provider(&self) -> Option<&str> {
        (**self).home_provider()
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        (**self).run(new_messages, thread, context).await
    }

    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        (**self).resume(thread, context).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::{EndState, EventKind};

    /// An agent that records one user message and ends: the smallest custom agent.
    struct Echo;

    #[async_trait]
    impl Agent for Echo {
        fn name(&self) -> &str {
            "echo"
        }

        async fn run(
            &self,
            new_messages: Vec<Message>,
            thread: &mut Thread,
            context: &RunContext,
        ) -> Result<RunOutcome, RunError> {
            let text = new_messages
                .iter()
                .map(Message::text)
                .collect::<Vec<_>>()
                .join(" ");
            crate::custom::finish_run(self.name(), new_messages, text, thread, context).await
        }
    }

    #[tokio::test]
    async fn run_stream_yields_every_event_then_the_outcome() {
        let context = RunContext::default();
        let mut thread = Thread::new();
        let agent = Echo;
        let updates: Vec<AgentUpdate> = agent
            .run_stream(vec![Message::user("hello")], &mut thread, &context)
            .collect()
            .await;
        let events: Vec<&EventKind> = updates
            .iter()
            .filter_map(|u| match u {
                AgentUpdate::Event(e) => Some(&e.kind),
                _ => None,
            })
            .collect();
        assert!(matches!(events.first(), Some(EventKind::RunStarted { .. })));
        assert!(matches!(events.last(), Some(EventKind::RunEnded { .. })));
        match updates.last() {
            Some(AgentUpdate::Finished(result)) if result.is_ok() => {
                let outcome = result.as_ref().as_ref().unwrap();
                assert_eq!(outcome.final_text.as_deref(), Some("hello"));
                assert_eq!(
                    outcome.status,
                    crate::RunStatus::Ended {
                        end_state: EndState::Done
                    }
                );
            }
            other => panic!("last update is not the outcome: {other:?}"),
        }
        let stored = context.store.load(thread.id()).await.unwrap();
        assert_eq!(stored.len(), events.len());
    }

    #[tokio::test]
    async fn default_resume_says_there_is_nothing_to_resume() {
        let mut thread = Thread::new();
        let err = Echo
            .resume(&mut thread, &RunContext::default())
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::NothingToResume(_)));
    }
}
