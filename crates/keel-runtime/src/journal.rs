//! The journal: the only way a run writes its log. It stamps events (seq, time, ids),
//! persists each batch to the store BEFORE the state changes or anyone acts on it, folds
//! it into the thread's state, then tells the observers.

use chrono::Utc;
use keel_core::event::{new_span_id, new_trace_id};
use keel_core::{AppendDurability, EVENT_SCHEMA_VERSION, Event, EventKind, RunState};

use crate::context::RunContext;
use crate::outcome::RunError;
use crate::thread::Thread;

/// Appends a run's events.
pub(crate) struct Journal<'a> {
    thread: &'a mut Thread,
    ctx: &'a RunContext,
    run_id: String,
    trace_id: String,
    run_span: String,
}

impl<'a> Journal<'a> {
    /// A journal for a new run.
    pub(crate) fn start(thread: &'a mut Thread, ctx: &'a RunContext, run_id: String) -> Self {
        thread.run_events_mut().clear();
        Self {
            thread,
            ctx,
            run_id,
            trace_id: new_trace_id(),
            run_span: new_span_id(),
        }
    }

    /// A journal continuing the thread's latest run (its events are kept by the thread).
    pub(crate) fn resume(thread: &'a mut Thread, ctx: &'a RunContext) -> Self {
        let first = thread.run_events().first();
        let run_id = first.map(|e| e.run_id.clone()).unwrap_or_default();
        let trace_id = first
            .map(|e| e.trace_id.clone())
            .unwrap_or_else(new_trace_id);
        let run_span = first.map(|e| e.span_id.clone()).unwrap_or_else(new_span_id);
        Self {
            thread,
            ctx,
            run_id,
            trace_id,
            run_span,
        }
    }

    pub(crate) fn state(&self) -> &RunState {
        self.thread.state()
    }

    pub(crate) fn ctx(&self) -> &RunContext {
        self.ctx
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    pub(crate) fn thread_id(&self) -> &str {
        self.thread.id()
    }

    pub(crate) fn run_span(&self) -> &str {
        &self.run_span
    }

    pub(crate) fn run_events(&self) -> &[Event] {
        self.thread.run_events()
    }

    /// Appends one event in the run's own span.
    pub(crate) async fn append(&mut self, kind: EventKind) -> Result<(), RunError> {
        let span = self.run_span.clone();
        self.append_batch(vec![(kind, span)]).await
    }

    /// Appends events atomically, each with its span id, at the store's durability.
    pub(crate) async fn append_batch(
        &mut self,
        items: Vec<(EventKind, String)>,
    ) -> Result<(), RunError> {
        self.append_batch_with(items, AppendDurability::Default)
            .await
    }

    /// Appends events atomically; with [`AppendDurability::Sync`] the batch is on stable
    /// storage when this returns, whatever the store's configured level.
    pub(crate) async fn append_batch_with(
        &mut self,
        items: Vec<(EventKind, String)>,
        durability: AppendDurability,
    ) -> Result<(), RunError> {
        if items.is_empty() {
            return Ok(());
        }
        let first_seq = self.thread.state().next_seq();
        let ts = Utc::now();
        let events: Vec<Event> = items
            .into_iter()
            .enumerate()
            .map(|(offset, (kind, span_id))| Event {
                v: EVENT_SCHEMA_VERSION,
                seq: first_seq.saturating_add(offset as u64),
                ts,
                thread_id: self.thread.id().to_string(),
                run_id: self.run_id.clone(),
                trace_id: self.trace_id.clone(),
                span_id,
                kind,
            })
            .collect();
        self.ctx
            .store
            .append_with(self.thread.id(), first_seq, &events, durability)
            .await?;
        for event in &events {
            self.thread.state_mut().apply(event);
            for observer in &self.ctx.observers {
                observer.on_event(event);
            }
        }
        self.thread.run_events_mut().extend(events);
        Ok(())
    }
}
