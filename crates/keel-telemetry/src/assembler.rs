//! The pure fold that turns a run's events into OpenTelemetry GenAI spans with explicit
//! start and end times: `invoke_agent {agent}` per run, `chat {model}` per model call,
//! `execute_tool {tool}` per tool call, `workflow_step {step}` per step of a workflow, and
//! `retry`, `compact` and `critique` spans, all children of the run span (retries nest under the call they retry). A run started by
//! another run — an agent called as a tool, a handoff's target — records its parent span
//! (`RunStarted.parent_span_id`): its `invoke_agent` span nests under that tool call.
//!
//! No I/O here: [`SpanAssembler::apply`] takes one event and returns the spans and per-turn
//! records that the event completed. The sink writes them to trace files and exporters.

use std::collections::{BTreeMap, HashMap};

use chrono::{Duration, Utc};
use keel_core::{EndState, Event, EventKind, Message, Part, Role, ToolResultKind};

use crate::ids::{derive_span_id, derive_trace_id, valid_span_id, valid_trace_id};
use crate::run_spans::{
    OpenSpan, RunSpans, clip, close_children, finish_root, int, open_tool, s, snake,
};
use crate::spans::{
    AttrValue, Completed, SpanEventRecord, SpanKind, SpanOptions, SpanStatus, finish_reason,
    split_model,
};

/// Key prefix of a workflow step's open span among a run's open child spans (tool calls
/// are keyed by call id, which never has this prefix).
const WORKFLOW_STEP_KEY: &str = "\u{0}workflow_step:";

/// Folds events of any number of interleaved runs into spans.
#[derive(Debug, Default)]
pub struct SpanAssembler {
    options: SpanOptions,
    runs: HashMap<String, RunSpans>,
}

impl SpanAssembler {
    /// A new assembler.
    pub fn new(options: SpanOptions) -> Self {
        Self {
            options,
            runs: HashMap::new(),
        }
    }

    /// Runs with spans still open.
    pub fn open_runs(&self) -> usize {
        self.runs.len()
    }

    /// Folds one event; returns what it completed, children before parents.
    pub fn apply(&mut self, event: &Event) -> Vec<Completed> {
        let capture = self.options.capture_content;
        let run = self
            .runs
            .entry(event.run_id.to_string())
            .or_insert_with(|| RunSpans {
                trace_id: if valid_trace_id(&event.trace_id) {
                    event.trace_id.to_ascii_lowercase()
                } else {
                    derive_trace_id(&event.run_id)
                },
                thread_id: event.thread_id.to_string(),
                ..RunSpans::default()
            });
        run.last_ts = Some(event.ts);
        let mut out: Vec<Completed> = run
            .turns
            .before(event)
            .into_iter()
            .map(Completed::Turn)
            .collect();
        let run_id = &*event.run_id;
        let root_parent = run.root_id();
        match &event.kind {
            EventKind::RunStarted {
                agent,
                model,
                goal,
                budget,
                parent_span_id,
                ..
            } => {
                run.agent = agent.clone();
                run.parent = parent_span_id
                    .as_deref()
                    .filter(|id| valid_span_id(id))
                    .map(str::to_ascii_lowercase);
                let (provider, model_name) = split_model(model);
                run.provider = provider.map(str::to_string);
                run.model = model_name.to_string();
                let id = if valid_span_id(&event.span_id) {
                    event.span_id.to_ascii_lowercase()
                } else {
                    derive_span_id(&run.trace_id, run_id, "run")
                };
                run.used_ids.insert(id.clone());
                let mut attributes = run.base_attrs("invoke_agent");
                attributes.insert("gen_ai.request.model".into(), s(run.model.clone()));
                if let Some(p) = &run.provider {
                    attributes.insert("gen_ai.provider.name".into(), s(p.clone()));
                }
                attributes.insert("openinference.span.kind".into(), s("AGENT"));
                attributes.insert("keel.run.id".into(), s(run_id));
                attributes.insert("keel.thread.id".into(), s(event.thread_id.to_string()));
                if let Some(t) = budget.max_turns {
                    attributes.insert("keel.budget.max_turns".into(), int(u64::from(t)));
                }
                if capture {
                    attributes.insert("keel.goal".into(), s(clip(goal.clone())));
                }
                run.turns.start(event, budget);
                run.root = Some(OpenSpan {
                    span_id: id,
                    name: format!("invoke_agent {agent}"),
                    kind: SpanKind::Internal,
                    start: event.ts,
                    attributes,
                    events: Vec::new(),
                });
            }
            EventKind::UserMessage { message } if capture => run.messages.push(message.clone()),
            EventKind::ModelRequested {
                turn,
                model,
                message_count,
                tool_count,
                estimated_input_tokens,
                provider,
                temperature,
                max_tokens,
                context_window,
            } => {
                let (p, model_name) = split_model(model);
                let provider = provider
                    .clone()
                    .or_else(|| p.map(str::to_string))
                    .or_else(|| run.provider.clone());
                let id = run.new_id(&event.span_id, run_id, &format!("chat:{turn}"));
                let mut a = run.base_attrs("chat");
                a.insert("gen_ai.request.model".into(), s(model_name));
                if let Some(p) = provider {
                    a.insert("gen_ai.provider.name".into(), s(p));
                }
                if let Some(t) = temperature {
                    // f32 -> f64 through its shortest decimal form, so 0.2 stays 0.2.
                    let v = t.to_string().parse::<f64>().unwrap_or(f64::from(*t));
                    a.insert("gen_ai.request.temperature".into(), AttrValue::Float(v));
                }
                if let Some(m) = max_tokens {
                    a.insert("gen_ai.request.max_tokens".into(), int(u64::from(*m)));
                }
                if let Some(w) = context_window {
                    a.insert("keel.context_window".into(), int(*w));
                }
                a.insert("openinference.span.kind".into(), s("LLM"));
                a.insert("keel.turn".into(), int(u64::from(*turn)));
                a.insert(
                    "keel.request.message_count".into(),
                    int(u64::from(*message_count)),
                );
                a.insert(
                    "keel.request.tool_count".into(),
                    int(u64::from(*tool_count)),
                );
                a.insert(
                    "keel.request.estimated_input_tokens".into(),
                    int(*estimated_input_tokens),
                );
                if capture {
                    let json = serde_json::to_string(&run.messages).unwrap_or_default();
                    a.insert("gen_ai.input.messages".into(), s(clip(json)));
                }
                // A repeated ModelRequested (crash and resume) supersedes the open one.
                run.chat = Some((
                    *turn,
                    OpenSpan {
                        span_id: id,
                        name: format!("chat {model_name}"),
                        kind: SpanKind::Client,
                        start: event.ts,
                        attributes: a,
                        events: Vec::new(),
                    },
                ));
            }
            EventKind::ModelResponded {
                turn,
                message,
                usage,
                latency_ms,
                stop_reason,
                response_id,
                cost_usd,
                first_token_ms,
            } => {
                run.model_calls += 1;
                run.input_tokens = run.input_tokens.saturating_add(usage.input_tokens);
                run.output_tokens = run.output_tokens.saturating_add(usage.output_tokens);
                run.cost_usd += cost_usd.unwrap_or(0.0);
                let open = match run.chat.take() {
                    Some((_, open)) => open,
                    None => OpenSpan {
                        span_id: run.new_id("", run_id, &format!("chat:{turn}")),
                        name: format!("chat {}", run.model),
                        kind: SpanKind::Client,
                        start: event.ts
                            - Duration::milliseconds(i64::try_from(*latency_ms).unwrap_or(0)),
                        attributes: run.base_attrs("chat"),
                        events: Vec::new(),
                    },
                };
                let mut open = open;
                let a = &mut open.attributes;
                if let Some(id) = response_id {
                    a.insert("gen_ai.response.id".into(), s(id.clone()));
                }
                a.insert(
                    "gen_ai.response.finish_reasons".into(),
                    AttrValue::StrArray(vec![finish_reason(*stop_reason).into()]),
                );
                a.insert("gen_ai.usage.input_tokens".into(), int(usage.input_tokens));
                a.insert(
                    "gen_ai.usage.output_tokens".into(),
                    int(usage.output_tokens),
                );
                if usage.cache_read_tokens > 0 {
                    a.insert(
                        "gen_ai.usage.cache_read.input_tokens".into(),
                        int(usage.cache_read_tokens),
                    );
                }
                if usage.cache_write_tokens > 0 {
                    a.insert(
                        "gen_ai.usage.cache_creation.input_tokens".into(),
                        int(usage.cache_write_tokens),
                    );
                }
                if let Some(c) = cost_usd {
                    a.insert("keel.cost_usd".into(), AttrValue::Float(*c));
                }
                a.insert("keel.latency_ms".into(), int(*latency_ms));
                if let Some(first) = first_token_ms {
                    a.insert("keel.time_to_first_token_ms".into(), int(*first));
                }
                a.insert(
                    "keel.response.tool_calls".into(),
                    int(message.tool_calls().count() as u64),
                );
                if capture {
                    let json = serde_json::to_string(&[message]).unwrap_or_default();
                    a.insert("gen_ai.output.messages".into(), s(clip(json)));
                    run.messages.push(message.clone());
                }
                out.push(Completed::Span(run.close(
                    open,
                    root_parent,
                    event.ts,
                    SpanStatus::Ok,
                )));
            }
            EventKind::ModelFailed { turn, error } => {
                let open = match run.chat.take() {
                    Some((_, open)) => open,
                    None => OpenSpan {
                        span_id: run.new_id("", run_id, &format!("chat:{turn}")),
                        name: format!("chat {}", run.model),
                        kind: SpanKind::Client,
                        start: event.ts,
                        attributes: run.base_attrs("chat"),
                        events: Vec::new(),
                    },
                };
                let mut open = open;
                let kind = snake(&error.kind);
                open.attributes.insert("error.type".into(), s(kind.clone()));
                if let Some(status) = error.status {
                    open.attributes
                        .insert("http.response.status_code".into(), int(u64::from(status)));
                }
                let message = format!("{kind}: {}", error.message);
                out.push(Completed::Span(run.close(
                    open,
                    root_parent,
                    event.ts,
                    SpanStatus::Error { message },
                )));
            }
            EventKind::ToolCallRequested {
                call,
                effect,
                requires_approval,
            } => {
                run.requested.insert(
                    call.id.clone(),
                    (
                        event.ts,
                        call.arguments.clone(),
                        effect.map(|e| snake(&e)),
                        *requires_approval,
                    ),
                );
            }
            EventKind::ToolCallStarted { call_id, name, .. } => {
                let open = open_tool(run, event, call_id, name, capture);
                run.tools.insert(call_id.clone(), open);
            }
            EventKind::ApprovalGranted { call_id, .. }
            | EventKind::ApprovalDenied { call_id, .. } => {
                let decision = if matches!(event.kind, EventKind::ApprovalGranted { .. }) {
                    "granted"
                } else {
                    "denied"
                };
                if let Some(root) = run.root.as_mut() {
                    let mut attributes = BTreeMap::new();
                    attributes.insert("gen_ai.tool.call.id".into(), s(call_id.clone()));
                    attributes.insert("keel.approval".into(), s(decision));
                    root.events.push(SpanEventRecord {
                        name: format!("approval_{decision}"),
                        ts: event.ts,
                        attributes,
                    });
                }
            }
            EventKind::ToolCallFinished { result } => {
                run.tool_calls += 1;
                let mut open = match run.tools.remove(&result.call_id) {
                    Some(open) => open,
                    None => {
                        let mut open =
                            open_tool(run, event, &result.call_id, &result.name, capture);
                        open.start = event.ts
                            - Duration::milliseconds(
                                i64::try_from(result.outcome.latency_ms).unwrap_or(0),
                            );
                        open
                    }
                };
                let a = &mut open.attributes;
                a.insert(
                    "keel.tool.attempts".into(),
                    int(u64::from(result.outcome.attempts)),
                );
                if !result.outcome.repairs.is_empty() {
                    a.insert(
                        "keel.tool.repairs".into(),
                        AttrValue::StrArray(result.outcome.repairs.clone()),
                    );
                }
                a.insert(
                    "keel.tool.latency_ms".into(),
                    int(result.outcome.latency_ms),
                );
                if capture {
                    a.insert(
                        "gen_ai.tool.call.result".into(),
                        s(clip(result.content.clone())),
                    );
                }
                let status = match &result.outcome.result {
                    ToolResultKind::Ok {
                        schema_validated,
                        truncated,
                        ..
                    } => {
                        a.insert("keel.tool.outcome".into(), s("ok"));
                        a.insert(
                            "keel.tool.schema_validated".into(),
                            AttrValue::Bool(*schema_validated),
                        );
                        a.insert("keel.tool.truncated".into(), AttrValue::Bool(*truncated));
                        SpanStatus::Ok
                    }
                    ToolResultKind::Error { code, message, .. } => {
                        run.tool_errors += 1;
                        a.insert("keel.tool.outcome".into(), s("error"));
                        a.insert("keel.tool.error_code".into(), s(code.as_str()));
                        a.insert("error.type".into(), s(code.as_str()));
                        SpanStatus::Error {
                            message: format!("{code}: {message}"),
                        }
                    }
                };
                if capture {
                    run.messages.push(Message {
                        role: Role::Tool,
                        parts: vec![Part::ToolResult(result.clone())],
                    });
                }
                out.push(Completed::Span(run.close(
                    open,
                    root_parent,
                    event.ts,
                    status,
                )));
            }
            EventKind::WorkflowStepStarted {
                step,
                agent,
                child_thread,
                ..
            } => {
                // The step's span is the parent of the step's own run (which records it as
                // `parent_span_id`), so its `invoke_agent` span nests here.
                let id = run.new_id(&event.span_id, run_id, &format!("step:{step}"));
                let mut a = run.base_attrs("workflow_step");
                a.insert("keel.workflow.step".into(), s(step.clone()));
                a.insert("gen_ai.agent.name".into(), s(agent.clone()));
                a.insert("keel.workflow.child_thread".into(), s(child_thread.clone()));
                a.insert("openinference.span.kind".into(), s("CHAIN"));
                run.tools.insert(
                    format!("{WORKFLOW_STEP_KEY}{step}"),
                    OpenSpan {
                        span_id: id,
                        name: format!("workflow_step {step}"),
                        kind: SpanKind::Internal,
                        start: event.ts,
                        attributes: a,
                        events: Vec::new(),
                    },
                );
            }
            EventKind::WorkflowStepFinished {
                step,
                child_run_id,
                end_state,
                reason,
                ..
            } => {
                if let Some(mut open) = run.tools.remove(&format!("{WORKFLOW_STEP_KEY}{step}")) {
                    open.attributes
                        .insert("keel.workflow.child_run_id".into(), s(child_run_id.clone()));
                    open.attributes
                        .insert("keel.end_state".into(), s(end_state.as_str()));
                    let status = if *end_state == EndState::Done {
                        SpanStatus::Ok
                    } else {
                        SpanStatus::Error {
                            message: reason.clone().unwrap_or_else(|| end_state.to_string()),
                        }
                    };
                    out.push(Completed::Span(run.close(
                        open,
                        root_parent,
                        event.ts,
                        status,
                    )));
                }
            }
            EventKind::Retry {
                scope,
                attempt,
                class,
                wait_ms,
                call_id,
            } => {
                run.retries += 1;
                let parent = match (scope.as_str(), call_id) {
                    ("tool", Some(id)) => run.tools.get(id).map(|t| t.span_id.clone()),
                    ("model", _) => run.chat.as_ref().map(|(_, c)| c.span_id.clone()),
                    _ => None,
                }
                .or(root_parent);
                let mut a = run.base_attrs("retry");
                a.insert("keel.retry.scope".into(), s(scope.clone()));
                a.insert("keel.retry.attempt".into(), int(u64::from(*attempt)));
                a.insert("keel.retry.class".into(), s(class.clone()));
                a.insert("keel.retry.wait_ms".into(), int(*wait_ms));
                if let Some(id) = call_id {
                    a.insert("gen_ai.tool.call.id".into(), s(id.clone()));
                }
                let id = run.new_id("", run_id, &format!("retry:{}", event.seq));
                let open = OpenSpan {
                    span_id: id,
                    name: format!("retry {scope}"),
                    kind: SpanKind::Internal,
                    start: event.ts,
                    attributes: a,
                    events: Vec::new(),
                };
                let end = event.ts + Duration::milliseconds(i64::try_from(*wait_ms).unwrap_or(0));
                out.push(Completed::Span(run.close(
                    open,
                    parent,
                    end,
                    SpanStatus::Unset,
                )));
            }
            EventKind::Compacted {
                strategy,
                replaced,
                messages,
            } => {
                let mut a = run.base_attrs("compact");
                a.insert("keel.compaction.strategy".into(), s(strategy.clone()));
                a.insert("keel.compaction.replaced".into(), int(u64::from(*replaced)));
                a.insert(
                    "keel.compaction.messages_after".into(),
                    int(messages.len() as u64),
                );
                if capture {
                    run.messages = messages.clone();
                }
                let id = run.new_id("", run_id, &format!("compact:{}", event.seq));
                let open = OpenSpan {
                    span_id: id,
                    name: format!("compact {strategy}"),
                    kind: SpanKind::Internal,
                    start: event.ts,
                    attributes: a,
                    events: Vec::new(),
                };
                out.push(Completed::Span(run.close(
                    open,
                    root_parent,
                    event.ts,
                    SpanStatus::Ok,
                )));
            }
            EventKind::Critique {
                satisfied,
                known_gaps,
                next,
                ..
            } => {
                let mut a = run.base_attrs("critique");
                a.insert(
                    "keel.critique.satisfied".into(),
                    AttrValue::Bool(*satisfied),
                );
                a.insert("keel.critique.next".into(), s(snake(next)));
                a.insert(
                    "keel.critique.known_gaps".into(),
                    int(known_gaps.len() as u64),
                );
                if capture && !known_gaps.is_empty() {
                    a.insert(
                        "keel.critique.gaps".into(),
                        AttrValue::StrArray(known_gaps.clone()),
                    );
                }
                let id = run.new_id("", run_id, &format!("critique:{}", event.seq));
                let open = OpenSpan {
                    span_id: id,
                    name: "critique".into(),
                    kind: SpanKind::Internal,
                    start: event.ts,
                    attributes: a,
                    events: Vec::new(),
                };
                out.push(Completed::Span(run.close(
                    open,
                    root_parent,
                    event.ts,
                    SpanStatus::Ok,
                )));
            }
            EventKind::PolicyApplied {
                call_id,
                tool,
                error_code,
                decision,
            } => {
                if let Some(root) = run.root.as_mut() {
                    let mut attributes = BTreeMap::new();
                    attributes.insert("gen_ai.tool.call.id".into(), s(call_id.clone()));
                    attributes.insert("gen_ai.tool.name".into(), s(tool.clone()));
                    attributes.insert("keel.tool.error_code".into(), s(error_code.as_str()));
                    let decision = serde_json::to_value(decision).unwrap_or_default();
                    let action = decision
                        .get("action")
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                        .unwrap_or_else(|| decision.to_string());
                    attributes.insert("keel.policy.decision".into(), s(action));
                    root.events.push(SpanEventRecord {
                        name: "policy_applied".into(),
                        ts: event.ts,
                        attributes,
                    });
                }
            }
            EventKind::Handoff {
                from,
                to,
                reason,
                call_id,
            } => {
                if let Some(root) = run.root.as_mut() {
                    let mut attributes = BTreeMap::new();
                    attributes.insert("keel.handoff.from".into(), s(from.clone()));
                    attributes.insert("keel.handoff.to".into(), s(to.clone()));
                    attributes.insert("gen_ai.tool.call.id".into(), s(call_id.clone()));
                    if capture && let Some(reason) = reason {
                        attributes.insert("keel.handoff.reason".into(), s(clip(reason.clone())));
                    }
                    root.attributes
                        .insert("keel.handoff.to".into(), s(to.clone()));
                    root.events.push(SpanEventRecord {
                        name: "handoff".into(),
                        ts: event.ts,
                        attributes,
                    });
                }
            }
            EventKind::Notice { code, message, .. } => {
                if let Some(root) = run.root.as_mut() {
                    let mut attributes = BTreeMap::new();
                    attributes.insert("keel.notice.code".into(), s(code.clone()));
                    attributes.insert("keel.notice.message".into(), s(message.clone()));
                    root.events.push(SpanEventRecord {
                        name: "notice".into(),
                        ts: event.ts,
                        attributes,
                    });
                }
            }
            EventKind::RunEnded {
                end_state,
                reason,
                final_text,
            } => {
                let mut done = close_children(run, event.ts, "run ended first");
                out.append(&mut done);
                if let Some(mut root) = run.root.take() {
                    finish_root(
                        run,
                        &mut root,
                        Some(*end_state),
                        reason.as_deref(),
                        final_text.as_deref(),
                        capture,
                    );
                    let status = match end_state {
                        EndState::Done => SpanStatus::Ok,
                        EndState::Failed
                        | EndState::UnrecoverableToolContract
                        | EndState::BudgetExceeded => SpanStatus::Error {
                            message: reason
                                .clone()
                                .unwrap_or_else(|| end_state.as_str().to_string()),
                        },
                        EndState::ClarifyNeeded | EndState::Cancelled => SpanStatus::Unset,
                    };
                    let parent = run.parent.clone();
                    out.push(Completed::Span(run.close(root, parent, event.ts, status)));
                }
                out.extend(run.turns.end(event).into_iter().map(Completed::Turn));
                self.runs.remove(run_id);
                return out;
            }
            // Approvals requested, user questions and answers, replans and kinds added
            // later carry no span of their own.
            _ => {}
        }
        if let Some(run) = self.runs.get_mut(run_id) {
            out.extend(run.turns.after(event).into_iter().map(Completed::Turn));
        }
        out
    }

    /// Ends every open span (at its run's last event time) without an end state, e.g. on
    /// shutdown while runs are still going. Their root spans carry `keel.end_state =
    /// incomplete`.
    pub fn finish_all(&mut self) -> Vec<Completed> {
        let mut out = Vec::new();
        let mut runs: Vec<(String, RunSpans)> = self.runs.drain().collect();
        runs.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, mut run) in runs {
            let at = run.last_ts.unwrap_or_else(Utc::now);
            out.extend(run.turns.flush().into_iter().map(Completed::Turn));
            out.append(&mut close_children(
                &mut run,
                at,
                "telemetry shut down before the call finished",
            ));
            if let Some(mut root) = run.root.take() {
                finish_root(&run, &mut root, None, None, None, false);
                let parent = run.parent.clone();
                out.push(Completed::Span(run.close(
                    root,
                    parent,
                    at,
                    SpanStatus::Unset,
                )));
            }
        }
        out
    }
}

/// Folds a complete event sequence into spans and turn records (for tests, replays and
/// trace files written after the fact).
pub fn spans_for_events<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    options: SpanOptions,
) -> Vec<Completed> {
    let mut asm = SpanAssembler::new(options);
    let mut out = Vec::new();
    for e in events {
        out.extend(asm.apply(e));
    }
    out.extend(asm.finish_all());
    out
}
