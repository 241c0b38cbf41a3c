//! Trace files: the sink writes one JSONL file per trace holding every event, span and
//! per-turn record; the reader round-trips it; the timeline and list render from it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel_core::{EndState, EventKind, ToolErrorCode};
use keel_telemetry::{
    AttrValue, TelemetryConfig, TelemetrySink, TraceFileWriter, TraceRecord, TurnRole, list_traces,
    read_trace, read_trace_file, render_timeline, render_trace_list, trace_file_path,
};

fn scripted_run() -> Vec<keel_core::Event> {
    let mut b = common::tool_using_run(7);
    // A third turn with a tool that times out once, then fails for good, and a retry.
    let events_before_end = b.events.len();
    assert!(events_before_end > 0);
    b.request(5);
    b.respond(
        700,
        "",
        &[("call_2", "search_issues", r#"{"query":"crash"}"#)],
        (2100, 40),
        0.0071,
    );
    b.tool(
        "call_2",
        "search_issues",
        2500,
        2,
        Some(ToolErrorCode::Timeout),
        "upstream did not answer",
    );
    b.push(
        3,
        EventKind::Critique {
            satisfied: true,
            known_gaps: vec![],
            next: keel_core::event::CriticNext::Stop,
            next_tool: None,
        },
    );
    b.end(EndState::Done, Some("Risk: low."))
}

#[tokio::test]
async fn trace_file_round_trips_and_renders() {
    let dir = tempfile::tempdir().unwrap();
    let config = TelemetryConfig {
        trace_dir: Some(dir.path().to_path_buf()),
        ..TelemetryConfig::default()
    };
    let run = scripted_run();
    let sink = TelemetrySink::new(&config).unwrap();
    for e in &run {
        sink.record(e);
    }
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(stats.events, run.len() as u64);
    assert_eq!(stats.file_errors, 0, "{:?}", stats.last_error);

    let path = trace_file_path(dir.path(), &run[0].trace_id);
    let records = read_trace_file(&path).unwrap();

    // Every event, in order, unchanged (nothing in this run needs redaction).
    let events: Vec<_> = records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::Event { event } = r {
                Some(event.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(events, run);

    // Spans: run, 3 chats, 2 tools, 1 retry, 1 critique.
    let spans: Vec<_> = records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::Span { span } = r {
                Some(span)
            } else {
                None
            }
        })
        .collect();
    let mut names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "chat claude-sonnet-4",
            "chat claude-sonnet-4",
            "chat claude-sonnet-4",
            "critique",
            "execute_tool get_release",
            "execute_tool search_issues",
            "invoke_agent detective",
            "retry tool"
        ]
    );
    let root = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent"))
        .unwrap();
    assert_eq!(
        root.span_id,
        format!("{:016x}", 0x00f0_67aa_0ba9_0000u64 + 7),
        "root span keeps the RunStarted span id"
    );
    assert_eq!(
        root.attr("gen_ai.usage.input_tokens"),
        Some(&AttrValue::Int(1534 + 1820 + 2100))
    );
    let failing = spans
        .iter()
        .find(|s| s.name == "execute_tool search_issues")
        .unwrap();
    assert_eq!(
        failing.parent_span_id.as_deref(),
        Some(root.span_id.as_str())
    );
    assert_eq!(
        failing.attr("keel.tool.error_code"),
        Some(&AttrValue::Str("timeout".into()))
    );
    assert_eq!(failing.attr("keel.tool.attempts"), Some(&AttrValue::Int(2)));
    assert_eq!(failing.duration_ms(), 2500);
    let retry = spans.iter().find(|s| s.name == "retry tool").unwrap();
    assert_eq!(
        retry.parent_span_id.as_deref(),
        Some(failing.span_id.as_str()),
        "tool retries nest under the tool span"
    );
    // Content is not captured by default.
    assert!(
        spans
            .iter()
            .all(|s| !s.attributes.contains_key("gen_ai.output.messages"))
    );
    assert!(
        spans
            .iter()
            .all(|s| !s.attributes.contains_key("gen_ai.tool.call.arguments"))
    );

    // Per-turn records (seed 000 §8): 3 planner, 2 executor, 1 critic.
    let turns: Vec<_> = records
        .iter()
        .filter_map(|r| {
            if let TraceRecord::Turn { turn } = r {
                Some(turn)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        turns.iter().filter(|t| t.role == TurnRole::Planner).count(),
        3
    );
    assert_eq!(
        turns
            .iter()
            .filter(|t| t.role == TurnRole::Executor)
            .count(),
        2
    );
    assert_eq!(
        turns.iter().filter(|t| t.role == TurnRole::Critic).count(),
        1
    );
    let failed_turn = turns
        .iter()
        .find(|t| t.tool_result.as_ref().is_some_and(|r| !r.ok))
        .unwrap();
    let json = serde_json::to_value(failed_turn).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "trace_id": run[0].trace_id,
            "turn": 3,
            "role": "executor",
            "intent": "call_tool",
            "tool_call": {"name": "search_issues", "args_valid": true},
            "tool_result": {"ok": false, "err": "timeout", "schema_ok": true},
            "policy": {"max_turns": 16, "time_budget_s": 600},
            "outcome": {"status": "continue", "next_action": "call_model"},
            "timings": {"latency_ms": 2500},
            "tokens": {"input": 0, "output": 0}
        })
    );
    let last = turns.last().unwrap();
    assert_eq!(last.role, TurnRole::Critic);
    assert_eq!(
        last.outcome.status, "done",
        "the record before run_ended carries the end state"
    );

    // Writing the records again and reading them back gives the same records.
    let copy_dir = tempfile::tempdir().unwrap();
    let mut writer = TraceFileWriter::new(copy_dir.path());
    for r in &records {
        writer.append(&run[0].trace_id, r).unwrap();
    }
    writer.flush().unwrap();
    assert_eq!(
        read_trace_file(&trace_file_path(copy_dir.path(), &run[0].trace_id)).unwrap(),
        records
    );
    // A unique prefix finds the trace.
    assert_eq!(
        read_trace(dir.path(), &run[0].trace_id[..12]).unwrap(),
        records
    );

    insta::assert_snapshot!("timeline", render_timeline(&records));
    let list = list_traces(dir.path()).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].end_state, "done");
    assert_eq!(list[0].tool_calls, 2);
    assert_eq!(list[0].tool_errors, 1);
    insta::assert_snapshot!("trace_list", render_trace_list(&list));
}

#[test]
fn a_bad_line_is_reported_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.jsonl");
    std::fs::write(&path, "\n{\"record\":\"nope\"}\n").unwrap();
    let err = read_trace_file(&path).unwrap_err();
    assert!(err.to_string().contains("x.jsonl:2"), "{err}");
    assert_eq!(err.code(), "trace_file");
}
