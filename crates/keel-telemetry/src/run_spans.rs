//! Per-run state of the span fold: the open spans of one run, its totals and the id
//! bookkeeping that keeps span ids unique and stable across replays.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use keel_core::Message;
use serde::Serialize;

use crate::ids::{derive_span_id, valid_span_id};
use crate::spans::{
    AttrValue, MAX_CONTENT_ATTR, SpanEventRecord, SpanKind, SpanRecord, SpanStatus,
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
        a.insert("gen_ai.conversation.id".into(), s(self.thread_id.clone()));
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
