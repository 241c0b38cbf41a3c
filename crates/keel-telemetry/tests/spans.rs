//! The span fold on edge cases: failed model calls, parallel tools, compaction, content
//! capture, runs cut short, and ids that are missing or invalid.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel_core::event::ModelFailure;
use keel_core::{EndState, EventKind, Message, ModelErrorKind, ToolErrorCode};
use keel_telemetry::{AttrValue, Completed, SpanOptions, SpanRecord, SpanStatus, spans_for_events};

fn spans(out: &[Completed]) -> Vec<&SpanRecord> {
    out.iter()
        .filter_map(|c| {
            if let Completed::Span(s) = c {
                Some(s)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn failed_model_call_parallel_tools_and_compaction() {
    let mut b = common::RunBuilder::new(9, "detective", "openai:gpt-4o", "goal");
    b.user("go");
    b.request(1);
    b.respond(
        100,
        "",
        &[("a", "fetch", "{}"), ("b", "search", "{}")],
        (10, 5),
        0.0,
    );
    // Parallel: both start, then finish in reverse order.
    b.push(1, EventKind::tool_call_started("a", "fetch"));
    b.tool(
        "b",
        "search",
        40,
        1,
        Some(ToolErrorCode::NotFound),
        "nothing",
    );
    b.push(
        10,
        EventKind::ToolCallFinished {
            result: std::sync::Arc::new(keel_core::ToolResult {
                call_id: "a".into(),
                name: "fetch".into(),
                outcome: keel_core::ToolOutcome {
                    tool: "fetch".into(),
                    call_id: "a".into(),
                    thread_id: b.thread_id.clone(),
                    run_id: b.run_id.clone(),
                    attempts: 1,
                    latency_ms: 51,
                    repairs: vec![],
                    result: keel_core::ToolResultKind::Ok {
                        data: serde_json::json!(1),
                        schema_validated: true,
                        truncated: false,
                    },
                },
                content: "1".into(),
            }),
        },
    );
    b.push(
        1,
        EventKind::Compacted {
            strategy: "summarize".into(),
            replaced: 4,
            messages: vec![Message::user("summary")],
        },
    );
    let turn = b.request(1);
    b.push(
        300,
        EventKind::ModelFailed {
            turn,
            error: ModelFailure {
                kind: ModelErrorKind::Overloaded,
                message: "busy".into(),
                status: Some(529),
            },
        },
    );
    let run = b.end(EndState::Failed, None);
    let out = spans_for_events(
        &run,
        SpanOptions {
            capture_content: true,
        },
    );
    let spans = spans(&out);
    let root = spans.iter().find(|s| s.parent_span_id.is_none()).unwrap();
    assert!(matches!(root.status, SpanStatus::Error { .. }));
    assert_eq!(root.attr("keel.tool_errors"), Some(&AttrValue::Int(1)));
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique");
    assert!(spans.iter().all(|s| *s.trace_id == *run[0].trace_id));
    let fetch = spans
        .iter()
        .find(|s| s.name == "execute_tool fetch")
        .unwrap();
    assert_eq!(
        fetch.duration_ms(),
        41 + 10,
        "from its own start to its own finish"
    );
    let failed = spans
        .iter()
        .find(|s| s.name == "chat gpt-4o" && matches!(s.status, SpanStatus::Error { .. }))
        .unwrap();
    assert_eq!(
        failed.attr("error.type"),
        Some(&AttrValue::Str("overloaded".into()))
    );
    assert_eq!(
        failed.attr("http.response.status_code"),
        Some(&AttrValue::Int(529))
    );
    assert_eq!(failed.duration_ms(), 300);
    // The second call's captured input is the compacted context.
    let input = failed
        .attr("gen_ai.input.messages")
        .unwrap()
        .as_str()
        .unwrap();
    assert!(
        input.contains("summary") && !input.contains("\"go\""),
        "{input}"
    );
    let compact = spans
        .iter()
        .find(|s| s.name == "compact summarize")
        .unwrap();
    assert_eq!(
        compact.attr("keel.compaction.replaced"),
        Some(&AttrValue::Int(4))
    );
    assert_eq!(
        compact.parent_span_id.as_deref(),
        Some(root.span_id.as_str())
    );
}

#[test]
fn a_run_cut_short_still_closes_its_spans() {
    let mut b = common::tool_using_run(11);
    b.request(1);
    let events = b.events.clone(); // no response, no run_ended
    let out = spans_for_events(&events, SpanOptions::default());
    let spans = spans(&out);
    let root = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent"))
        .unwrap();
    assert_eq!(
        root.attr("keel.end_state"),
        Some(&AttrValue::Str("incomplete".into()))
    );
    assert_eq!(
        spans.iter().filter(|s| s.name.starts_with("chat")).count(),
        3
    );
}

#[test]
fn invalid_ids_are_replaced_by_stable_derived_ones() {
    let mut run = common::tool_using_run(12).end(EndState::Done, None);
    for e in &mut run {
        e.trace_id = "not-a-trace-id".into();
        e.span_id = String::new();
    }
    let a = spans_for_events(&run, SpanOptions::default());
    let b = spans_for_events(&run, SpanOptions::default());
    assert_eq!(a, b, "replaying the log gives the same spans");
    for s in spans(&a) {
        assert_eq!(s.trace_id.len(), 32);
        assert_eq!(s.span_id.len(), 16);
    }
}
