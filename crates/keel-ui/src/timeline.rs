//! A run's spans on a time axis. The spans are the ones `keel-telemetry` exports over OTLP
//! and writes to trace files — folded from the (redacted) log by the same
//! [`keel_telemetry::SpanAssembler`], so ids and nesting match what a collector shows —
//! plus the waits for approval, which carry no span of their own. Spans still open (a
//! run in progress) end at the last event, or at "now" while the run is running.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use keel_core::store::ThreadStatus;
use keel_core::{Event, EventKind};
use keel_telemetry::spans::SpanEventRecord;
use keel_telemetry::{AttrValue, Completed, SpanAssembler, SpanOptions, SpanRecord, SpanStatus};

/// The attribute of a `chat` span holding its time to first token (milliseconds from the
/// call's start; `ModelResponded.first_token_ms`).
pub(crate) const FIRST_TOKEN_ATTR: &str = "keel.time_to_first_token_ms";

/// What a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Agent,
    Chat,
    Tool,
    Retry,
    Compact,
    Critique,
    Approval,
    Step,
    Other,
}

impl Kind {
    fn of(name: &str) -> Self {
        let head = name.split(' ').next().unwrap_or("");
        match head {
            "invoke_agent" => Self::Agent,
            "chat" => Self::Chat,
            "execute_tool" => Self::Tool,
            "retry" => Self::Retry,
            "compact" => Self::Compact,
            "critique" => Self::Critique,
            "workflow_step" => Self::Step,
            _ => Self::Other,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Chat => "chat",
            Self::Tool => "tool",
            Self::Retry => "retry",
            Self::Compact => "compact",
            Self::Critique => "critique",
            Self::Approval => "approval",
            Self::Step => "step",
            Self::Other => "other",
        }
    }
}

/// One span of the waterfall.
#[derive(Debug, Clone)]
pub(crate) struct SpanView {
    pub id: String,
    pub parent: Option<String>,
    pub name: String,
    pub kind: Kind,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Not finished yet.
    pub open: bool,
    /// The status message of a failed span.
    pub error: Option<String>,
    pub attributes: BTreeMap<String, AttrValue>,
    pub events: Vec<SpanEventRecord>,
    /// Nesting level (0 for a run's root).
    pub depth: usize,
}

impl SpanView {
    pub(crate) fn attr_str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(AttrValue::as_str)
    }

    pub(crate) fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(AttrValue::as_i64)
    }

    pub(crate) fn duration_ms(&self) -> i64 {
        (self.end - self.start).num_milliseconds()
    }

    fn from_record(span: SpanRecord, open: bool) -> Self {
        // A span closed only to be drawn (still open) carries the assembler's "shut down
        // before the call finished" error: it has not failed.
        let error = match &span.status {
            SpanStatus::Error { message } if !open => Some(message.clone()),
            _ => None,
        };
        Self {
            kind: Kind::of(&span.name),
            id: span.span_id,
            parent: span.parent_span_id,
            name: span.name,
            start: span.start,
            end: span.end,
            open,
            error,
            attributes: span.attributes,
            events: span.events,
            depth: 0,
        }
    }
}

/// A thread's spans in tree order (each span followed by its children, by start time).
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub spans: Vec<SpanView>,
    pub t0: DateTime<Utc>,
    pub t1: DateTime<Utc>,
}

/// How long an open span may be drawn past the last event of a running thread (a run
/// whose process died stays "running" in the log; it must not stretch the axis forever).
const LIVE_HORIZON_MINUTES: i64 = 10;

/// Folds a thread's (redacted) log into its timeline. `now` ends open spans of a running
/// thread.
pub(crate) fn build(events: &[Event], now: DateTime<Utc>) -> Timeline {
    let mut assembler = SpanAssembler::new(SpanOptions {
        capture_content: false,
    });
    let mut spans = Vec::new();
    let mut status = ThreadStatus::Running;
    for event in events {
        status = ThreadStatus::after(status, &event.kind);
        for done in assembler.apply(event) {
            if let Completed::Span(span) = done {
                spans.push(SpanView::from_record(span, false));
            }
        }
    }
    let first = events.first().map_or(now, |e| e.ts);
    let last = events.last().map_or(now, |e| e.ts);
    let open_end = if status == ThreadStatus::Running {
        now.clamp(last, last + Duration::minutes(LIVE_HORIZON_MINUTES))
    } else {
        last
    };
    for done in assembler.finish_all() {
        if let Completed::Span(span) = done {
            let mut view = SpanView::from_record(span, true);
            view.end = open_end.max(view.start);
            spans.push(view);
        }
    }
    spans.extend(approval_spans(events, &spans, open_end));
    let t1 = spans.iter().map(|s| s.end).max().unwrap_or(last).max(last);
    Timeline {
        spans: tree_order(spans),
        t0: first,
        t1,
    }
}

/// The waits for a human decision: from `approval_requested` to the decision (open while
/// none came), under the root span of their run.
fn approval_spans(events: &[Event], spans: &[SpanView], open_end: DateTime<Utc>) -> Vec<SpanView> {
    let roots: HashMap<&str, &str> = spans
        .iter()
        .filter(|s| s.kind == Kind::Agent)
        .filter_map(|s| Some((s.attr_str("keel.run.id")?, s.id.as_str())))
        .collect();
    let mut out: Vec<SpanView> = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::ApprovalRequested {
                call_id,
                name,
                arguments: _,
            } => {
                let mut attributes = BTreeMap::new();
                attributes.insert(
                    "gen_ai.tool.call.id".into(),
                    AttrValue::Str(call_id.clone()),
                );
                attributes.insert("gen_ai.tool.name".into(), AttrValue::Str(name.clone()));
                attributes.insert(
                    "keel.run.id".into(),
                    AttrValue::Str(event.run_id.to_string()),
                );
                out.push(SpanView {
                    id: format!("approval-{}", sanitize(call_id)),
                    parent: roots.get(event.run_id.as_ref()).map(|id| id.to_string()),
                    name: format!("approval {name}"),
                    kind: Kind::Approval,
                    start: event.ts,
                    end: open_end.max(event.ts),
                    open: true,
                    error: None,
                    attributes,
                    events: Vec::new(),
                    depth: 0,
                });
            }
            EventKind::ApprovalGranted { call_id, .. }
            | EventKind::ApprovalDenied { call_id, .. } => {
                let id = format!("approval-{}", sanitize(call_id));
                if let Some(span) = out.iter_mut().rev().find(|s| s.id == id && s.open) {
                    span.end = event.ts.max(span.start);
                    span.open = false;
                    let decision = if matches!(event.kind, EventKind::ApprovalGranted { .. }) {
                        "granted"
                    } else {
                        "denied"
                    };
                    span.attributes
                        .insert("keel.approval".into(), AttrValue::Str(decision.into()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Keeps an id usable in a URL path and an HTML id.
pub(crate) fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Each span followed by its children (by start time); spans whose parent is not here
/// (the root of a run, a nested run's root under another thread) start a tree.
fn tree_order(spans: Vec<SpanView>) -> Vec<SpanView> {
    let ids: HashSet<String> = spans.iter().map(|s| s.id.clone()).collect();
    let mut children: HashMap<Option<String>, Vec<SpanView>> = HashMap::new();
    for span in spans {
        let parent = span.parent.clone().filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(span);
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| a.start.cmp(&b.start).then(a.id.cmp(&b.id)));
    }
    let mut out = Vec::new();
    let mut stack: Vec<(SpanView, usize)> = children
        .remove(&None)
        .unwrap_or_default()
        .into_iter()
        .rev()
        .map(|s| (s, 0))
        .collect();
    let mut seen = HashSet::new();
    while let Some((mut span, depth)) = stack.pop() {
        if !seen.insert(span.id.clone()) {
            continue;
        }
        span.depth = depth;
        if let Some(kids) = children.remove(&Some(span.id.clone())) {
            stack.extend(kids.into_iter().rev().map(|k| (k, depth.saturating_add(1))));
        }
        out.push(span);
    }
    // Anything left sits in a parent cycle (never produced by the assembler): shown flat.
    for (_, rest) in children {
        out.extend(rest.into_iter().filter(|s| !seen.contains(&s.id)));
    }
    out
}

impl Timeline {
    /// The span `id`.
    pub(crate) fn span(&self, id: &str) -> Option<&SpanView> {
        self.spans.iter().find(|s| s.id == id)
    }

    /// The run a span belongs to (its root's `keel.run.id`).
    pub(crate) fn run_of(&self, span: &SpanView) -> Option<String> {
        let mut current = Some(span);
        let mut hops = 0;
        while let Some(s) = current {
            if let Some(run) = s.attr_str("keel.run.id") {
                return Some(run.to_string());
            }
            hops += 1;
            if hops > 64 {
                break;
            }
            current = s.parent.as_deref().and_then(|p| self.span(p));
        }
        None
    }

    /// `(left %, width %)` of a span on the axis.
    pub(crate) fn position(&self, span: &SpanView) -> (f64, f64) {
        let micros = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(i64::MAX).max(0) as f64;
        let total = micros(self.t1 - self.t0).max(1.0);
        let left = (micros(span.start - self.t0) / total * 100.0).clamp(0.0, 100.0);
        let width = (micros(span.end - span.start) / total * 100.0).clamp(0.0, 100.0 - left);
        (left, width)
    }

    /// Where on the axis (%) `span`'s start plus `ms` milliseconds falls, kept inside the
    /// span's bar.
    pub(crate) fn offset_of(&self, span: &SpanView, ms: i64) -> f64 {
        let (left, width) = self.position(span);
        let took = (span.end - span.start)
            .num_microseconds()
            .unwrap_or(i64::MAX)
            .max(1) as f64;
        let share = (ms.max(0) as f64 * 1000.0 / took).clamp(0.0, 1.0);
        left + width * share
    }

    /// Total span of the axis in microseconds.
    pub(crate) fn total_us(&self) -> i64 {
        (self.t1 - self.t0)
            .num_microseconds()
            .unwrap_or(i64::MAX)
            .max(0)
    }
}
