//! Per-run state of the span fold: the open spans of one run, its totals and the id
//! bookkeeping that keeps span ids unique and stable across replays.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use keel_core::{EndState, Event, EventKind, Message};
use serde::Serialize;

use crate::ids::{derive_span_id, valid_span_id};
use crate::spans::{
    AttrValue, Completed, MAX_CONTENT_ATTR, SpanEventRecord, SpanKind, SpanRecord, SpanStatus,
};
use crate::turns::TurnTracker;

#[derive(Debug, Clone)]
pub(crate) struct OpenSpan {
    pub(crate) span_id: String,
    pub(crate) name: String,
    pub(crate) kind: SpanKind,
    pub(crate) start: DateTime<Utc>,
    pub(crate) attributes: BTreeMap<String, AttrValue>,
    pub(crate) events: Vec<SpanEventRecord>,
}

#[derive(Debug, Default)]
pub(crate) struct RunSpans {
    pub(crate) trace_id: String,
    pub(crate) thread_id: String,
    pub(crate) agent: String,
    pub(crate) provider: Option<String>,
    pub(crate) model: String,
    pub(crate) root: Option<OpenSpan>,
    /// The span the run nests under (`RunStarted.parent_span_id`): a tool call or handoff
    /// of another run in the same trace.
    pub(crate) parent: Option<String>,
    pub(crate) chat: Option<(u32, OpenSpan)>,
    pub(crate) tools: HashMap<String, OpenSpan>,
    pub(crate) requested: HashMap<String, (DateTime<Utc>, String, Option<String>, bool)>,
    pub(crate) used_ids: HashSet<String>,
    pub(crate) messages: Vec<Message>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost_usd: f64,
    pub(crate) model_calls: i64,
    pub(crate) tool_calls: i64,
    pub(crate) tool_errors: i64,
    pub(crate) retries: i64,
    pub(crate) last_ts: Option<DateTime<Utc>>,
    pub(crate) turns: TurnTracker,
}

pub(crate) fn snake<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::from("unknown"),
    }
}

pub(crate) fn clip(mut text: String) -> String {
    if text.len() > MAX_CONTENT_ATTR {
        let mut cut = MAX_CONTENT_ATTR;
        while !text.is_char_boundary(cut) {
            cut = cut.saturating_sub(1);
        }
        text.truncate(cut);
        text.push_str("…[truncated]");
    }
    text
}

pub(crate) fn int(v: u64) -> AttrValue {
    AttrValue::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

pub(crate) fn s(v: impl Into<String>) -> AttrValue {
    AttrValue::Str(v.into())
}

impl RunSpans {
    pub(crate) fn new_id(&mut self, preferred: &str, run_id: &str, salt: &str) -> String {
        let root = self.root.as_ref().map(|r| r.span_id.as_str()).unwrap_or("");
        let id = if valid_span_id(preferred)
            && preferred != root
            && !self.used_ids.contains(preferred)
        {
            preferred.to_string()
        } else {
            let mut n = 0u32;
            loop {
                let candidate = derive_span_id(&self.trace_id, run_id, &format!("{salt}#{n}"));
                if !self.used_ids.contains(&candidate) {
                    break candidate;
                }
                n = n.saturating_add(1);
            }
        };
        self.used_ids.insert(id.clone());
        id
    }

    pub(crate) fn base_attrs(&self, operation: &str) -> BTreeMap<String, AttrValue> {
        let mut a = BTreeMap::new();
        a.insert("gen_ai.operation.name".into(), s(operation));
        a.insert(
            "gen_ai.conversation.id".into(),
            s(self.thread_id.to_string()),
        );
        if !self.agent.is_empty() {
            a.insert("gen_ai.agent.name".into(), s(self.agent.clone()));
        }
        a
    }

    pub(crate) fn root_id(&self) -> Option<String> {
        self.root.as_ref().map(|r| r.span_id.clone())
    }

    pub(crate) fn close(
        &self,
        open: OpenSpan,
        parent: Option<String>,
        end: DateTime<Utc>,
        status: SpanStatus,
    ) -> SpanRecord {
        SpanRecord {
            trace_id: self.trace_id.clone(),
            span_id: open.span_id,
            parent_span_id: parent,
            name: open.name,
            kind: open.kind,
            start: open.start,
            end: end.max(open.start),
            status,
            attributes: open.attributes,
            events: open.events,
        }
    }
}

pub(crate) fn open_tool(
    run: &mut RunSpans,
    event: &Event,
    call_id: &str,
    name: &str,
    capture: bool,
) -> OpenSpan {
    let id = run.new_id(&event.span_id, &event.run_id, &format!("tool:{call_id}"));
    let mut a = run.base_attrs("execute_tool");
    a.insert("gen_ai.tool.name".into(), s(name));
    a.insert("gen_ai.tool.call.id".into(), s(call_id));
    a.insert("gen_ai.tool.type".into(), s("function"));
    a.insert("openinference.span.kind".into(), s("TOOL"));
    let mut start = event.ts;
    if let Some((requested_at, args, effect, approval)) = run.requested.remove(call_id) {
        if let Some(e) = effect {
            a.insert("keel.tool.effect".into(), s(e));
        }
        a.insert(
            "keel.tool.requires_approval".into(),
            AttrValue::Bool(approval),
        );
        if capture {
            a.insert("gen_ai.tool.call.arguments".into(), s(clip(args)));
        }
        if matches!(event.kind, EventKind::ToolCallFinished { .. }) {
            start = requested_at;
        }
    }
    OpenSpan {
        span_id: id,
        name: format!("execute_tool {name}"),
        kind: SpanKind::Internal,
        start,
        attributes: a,
        events: Vec::new(),
    }
}

pub(crate) fn close_children(run: &mut RunSpans, at: DateTime<Utc>, why: &str) -> Vec<Completed> {
    let parent = run.root_id();
    let mut out = Vec::new();
    if let Some((_, open)) = run.chat.take() {
        out.push(Completed::Span(run.close(
            open,
            parent.clone(),
            at,
            SpanStatus::Error {
                message: why.into(),
            },
        )));
    }
    let mut tools: Vec<(String, OpenSpan)> = run.tools.drain().collect();
    tools.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, open) in tools {
        out.push(Completed::Span(run.close(
            open,
            parent.clone(),
            at,
            SpanStatus::Error {
                message: why.into(),
            },
        )));
    }
    out
}

pub(crate) fn finish_root(
    run: &RunSpans,
    root: &mut OpenSpan,
    end_state: Option<EndState>,
    reason: Option<&str>,
    final_text: Option<&str>,
    capture: bool,
) {
    let a = &mut root.attributes;
    a.insert(
        "keel.end_state".into(),
        s(end_state.map(EndState::as_str).unwrap_or("incomplete")),
    );
    if let Some(r) = reason {
        a.insert("keel.end_reason".into(), s(r));
    }
    if capture && let Some(t) = final_text {
        a.insert("keel.final_text".into(), s(clip(t.to_string())));
    }
    a.insert("gen_ai.usage.input_tokens".into(), int(run.input_tokens));
    a.insert("gen_ai.usage.output_tokens".into(), int(run.output_tokens));
    a.insert("keel.cost_usd".into(), AttrValue::Float(run.cost_usd));
    a.insert("keel.model_calls".into(), AttrValue::Int(run.model_calls));
    a.insert("keel.tool_calls".into(), AttrValue::Int(run.tool_calls));
    a.insert("keel.tool_errors".into(), AttrValue::Int(run.tool_errors));
    a.insert("keel.retries".into(), AttrValue::Int(run.retries));
}
