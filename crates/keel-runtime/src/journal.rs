//! The journal: the only way a run writes its log. It stamps events (seq, time, ids),
//! folds them into the thread's state, persists them to the store, then tells the
//! observers.
//!
//! # The durability rule
//!
//! **An event is durable before any effect outside the process that depends on it**
//! (docs/durability.md). Concretely, the runner appends — carrying everything staged
//! before it in the same transaction — before a tool call that is not read-only starts
//! (synchronously: the model's answer with the call's id, and the call's start with its
//! effect and idempotency key, are on stable storage first), before a sub-agent or a
//! handoff starts, before the run pauses for a human, and before its outcome is returned.
//! Nothing else needs to be durable first: a model's request and answer and read-only
//! tool calls are [`Journal::stage`]d — stamped and folded at once, so `decide` sees them,
//! written with the next durable point. A crash before that point loses only work that
//! is done again on resume: the model is asked again (cost, never an effect) and read-only
//! calls run again. So a one-tool read-only conversation commits once, when it returns.
//! A staged run still writes before its [`MAX_STAGED_MODEL_CALLS`]th model call, which
//! bounds what a crash costs; `RunDurability::Steps` (per agent) also writes before every
//! model call, for viewers in another process that watch each step as it happens.
//! Observers hear of staged events when they are written — live ones
//! ([`crate::RunObserver::live`]: a terminal, an in-process stream) when they are staged.
//!
//! If the append carrying staged events fails, the thread's folded state is ahead of its
//! log: it is marked diverged and the next run or resume reloads it from the store.

use std::sync::Arc;

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
    /// The ids every event of the run carries, shared by all of them.
    thread_id: Arc<str>,
    run_id: Arc<str>,
    trace_id: Arc<str>,
    run_span: String,
    /// The span a new run nests under; stamped on its `RunStarted`.
    parent_span: Option<String>,
    /// How many of the run's latest events are staged: stamped, folded and kept with the
    /// run's events, not yet in the store (see [`Journal::stage`]).
    staged: usize,
    /// How many model requests are among the staged events.
    staged_model_calls: u32,
}

/// The most model calls a run makes with their requests staged: before the next, what is
/// staged is written, so a crash asks the model again for at most this many answers.
pub(crate) const MAX_STAGED_MODEL_CALLS: u32 = 8;

impl<'a> Journal<'a> {
    /// A journal for a new run: in a new trace, or — when the context names a parent span
    /// ([`RunContext::parent`]) — in the parent's trace, its `RunStarted` recording the
    /// parent span.
    pub(crate) fn start(thread: &'a mut Thread, ctx: &'a RunContext, run_id: String) -> Self {
        thread.run_events_mut().clear();
        let (trace_id, parent_span) = match &ctx.parent {
            Some(parent) => (parent.trace_id.clone(), Some(parent.span_id.clone())),
            None => (new_trace_id(), None),
        };
        Self {
            thread_id: thread.id().into(),
            thread,
            ctx,
            run_id: run_id.into(),
            trace_id: trace_id.into(),
            run_span: new_span_id(),
            parent_span,
            staged: 0,
            staged_model_calls: 0,
        }
    }

    /// A journal continuing the thread's latest run (its events are kept by the thread).
    pub(crate) fn resume(thread: &'a mut Thread, ctx: &'a RunContext) -> Self {
        let first = thread.run_events().first();
        let run_id = first.map_or_else(|| Arc::from(""), |e| Arc::clone(&e.run_id));
        let trace_id = first.map_or_else(|| new_trace_id().into(), |e| Arc::clone(&e.trace_id));
        let run_span = first.map(|e| e.span_id.clone()).unwrap_or_else(new_span_id);
        Self {
            thread_id: thread.id().into(),
            thread,
            ctx,
            run_id,
            trace_id,
            run_span,
            parent_span: None,
            staged: 0,
            staged_model_calls: 0,
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

    /// The run's trace id.
    pub(crate) fn trace_id(&self) -> &str {
        &self.trace_id
    }

    pub(crate) fn run_events(&self) -> &[Arc<Event>] {
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

    /// Appends events atomically, together with any staged ones; with
    /// [`AppendDurability::Sync`] the batch is on stable storage when this returns,
    /// whatever the store's configured level.
    pub(crate) async fn append_batch_with(
        &mut self,
        items: Vec<(EventKind, String)>,
        durability: AppendDurability,
    ) -> Result<(), RunError> {
        let fresh = self.stamp(items);
        let fresh_len = fresh.len();
        let (state, run_events) = self.thread.parts_mut();
        run_events.extend(fresh.into_iter().map(Arc::new));
        let pending = self.staged.saturating_add(fresh_len);
        let start = run_events.len().saturating_sub(pending);
        let Some(batch) = run_events.get(start..).filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let first_seq = batch.first().map_or_else(|| state.next_seq(), |e| e.seq);
        if let Err(error) = self
            .ctx
            .store
            .append_shared(state.thread_id(), first_seq, batch, durability)
            .await
        {
            let (_, run_events) = self.thread.parts_mut();
            run_events.truncate(run_events.len().saturating_sub(fresh_len));
            if self.staged > 0 {
                // The state already folded the staged events: it is ahead of the log.
                self.staged = 0;
                self.staged_model_calls = 0;
                self.thread.mark_diverged();
            }
            return Err(error.into());
        }
        self.staged = 0;
        self.staged_model_calls = 0;
        let (state, run_events) = self.thread.parts_mut();
        let fold_from = run_events.len().saturating_sub(fresh_len);
        for (index, event) in run_events.iter().enumerate().skip(start) {
            let fresh = index >= fold_from;
            if fresh {
                state.apply(event);
            }
            // Live observers heard of the staged events when they were staged.
            for observer in &self.ctx.observers {
                if fresh || !observer.live() {
                    observer.on_event(event);
                }
            }
        }
        Ok(())
    }

    /// Stamps, folds and keeps events to be written with the next append (or
    /// [`Journal::flush`]). Only for batches after which the caller does nothing outside
    /// the process before its next append: see the module's documentation.
    pub(crate) fn stage(&mut self, items: Vec<(EventKind, String)>) {
        let requests = items
            .iter()
            .filter(|(kind, _)| matches!(kind, EventKind::ModelRequested { .. }))
            .count();
        self.staged_model_calls = self
            .staged_model_calls
            .saturating_add(u32::try_from(requests).unwrap_or(u32::MAX));
        let events = self.stamp(items);
        self.staged = self.staged.saturating_add(events.len());
        let (state, run_events) = self.thread.parts_mut();
        for event in &events {
            state.apply(event);
            for observer in self.ctx.observers.iter().filter(|o| o.live()) {
                observer.on_event(event);
            }
        }
        run_events.extend(events.into_iter().map(Arc::new));
    }

    /// How many model requests are staged, waiting for the next append.
    pub(crate) fn staged_model_calls(&self) -> u32 {
        self.staged_model_calls
    }

    /// Whether events are staged, waiting for the next append.
    pub(crate) fn has_staged(&self) -> bool {
        self.staged > 0
    }

    /// Writes the staged events, if any.
    pub(crate) async fn flush(&mut self) -> Result<(), RunError> {
        self.append_batch_with(Vec::new(), AppendDurability::Default)
            .await
    }

    /// Stamps events with the next sequence numbers (after the staged ones).
    fn stamp(&self, items: Vec<(EventKind, String)>) -> Vec<Event> {
        let first_seq = self.thread.state().next_seq();
        let ts = Utc::now();
        items
            .into_iter()
            .enumerate()
            .map(|(offset, (mut kind, span_id))| {
                if let EventKind::RunStarted { parent_span_id, .. } = &mut kind
                    && parent_span_id.is_none()
                {
                    parent_span_id.clone_from(&self.parent_span);
                }
                Event {
                    v: EVENT_SCHEMA_VERSION,
                    seq: first_seq.saturating_add(offset as u64),
                    ts,
                    thread_id: Arc::clone(&self.thread_id),
                    run_id: Arc::clone(&self.run_id),
                    trace_id: Arc::clone(&self.trace_id),
                    span_id,
                    kind,
                }
            })
            .collect()
    }
}

impl Drop for Journal<'_> {
    /// Staged events that never reached the store (the run stopped on an error, or its
    /// future was dropped) leave the folded state ahead of the log.
    fn drop(&mut self) {
        if self.staged > 0 {
            self.thread.mark_diverged();
        }
    }
}
