//! Metrics over 100 scripted runs with injected tool and model failures, compared with
//! values computed by hand (the derivation is in the comments).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel_core::event::ModelFailure;
use keel_core::{EndState, Event, EventKind, ModelErrorKind, ToolErrorCode};
use keel_telemetry::{MetricsOptions, compute_metrics, render_prometheus, render_summary};

struct Latencies {
    search: u64,
    fetch: u64,
}

impl Latencies {
    /// Each tool's latencies are a permutation of 1..=N ms (N = 250 search calls, 110
    /// fetch calls; 37 is coprime with both), so p50 = ceil(N/2), p95 = ceil(0.95 N).
    fn next(&mut self, tool: &str) -> u64 {
        let (c, n) = match tool {
            "search" => (&mut self.search, 250),
            _ => (&mut self.fetch, 110),
        };
        let v = (*c * 37) % n + 1;
        *c += 1;
        v
    }
}

/// One model call answered with one tool call, then the tool call.
fn step(
    b: &mut common::RunBuilder,
    lat: &mut Latencies,
    call: usize,
    tool: &str,
    attempts: u32,
    error: Option<ToolErrorCode>,
) {
    let turn = b.request(1);
    let id = format!("c{call}");
    b.respond(
        500,
        "",
        &[(&id, tool, "{}")],
        (1000 * u64::from(turn), 100),
        0.01,
    );
    let latency = lat.next(tool);
    b.tool(&id, tool, latency, attempts, error, "result");
}

fn final_answer(b: &mut common::RunBuilder) {
    let turn = b.request(1);
    b.respond(500, "answer", &[], (1000 * u64::from(turn), 100), 0.01);
}

fn runs() -> Vec<Event> {
    let mut lat = Latencies {
        search: 0,
        fetch: 0,
    };
    let mut all = Vec::new();
    for i in 0..100u64 {
        let model = if i % 2 == 0 {
            "anthropic:claude-sonnet-4"
        } else {
            "openai:gpt-4o"
        };
        let mut b = common::RunBuilder::new(i, "detective", model, "goal");
        if i % 2 == 1 {
            b.window = None; // taken from MetricsOptions::context_windows
        }
        let events = match i {
            // 60 healthy runs: search, search, fetch, answer.
            0..=59 => {
                step(&mut b, &mut lat, 0, "search", 1, None);
                step(&mut b, &mut lat, 1, "search", 1, None);
                step(&mut b, &mut lat, 2, "fetch", 1, None);
                final_answer(&mut b);
                b.end(EndState::Done, Some("answer"))
            }
            // 20 repaired runs: search fails invalid_input, search again works, fetch, answer.
            60..=79 => {
                step(
                    &mut b,
                    &mut lat,
                    0,
                    "search",
                    1,
                    Some(ToolErrorCode::InvalidInput),
                );
                step(&mut b, &mut lat, 1, "search", 1, None);
                step(&mut b, &mut lat, 2, "fetch", 1, None);
                final_answer(&mut b);
                b.end(EndState::Done, Some("answer"))
            }
            // 10 runs whose fetch keeps breaking its output schema three times.
            80..=89 => {
                for c in 0..3 {
                    step(
                        &mut b,
                        &mut lat,
                        c,
                        "fetch",
                        1,
                        Some(ToolErrorCode::OutputSchemaMismatch),
                    );
                }
                b.end(EndState::UnrecoverableToolContract, None)
            }
            // 5 runs: search times out after 3 attempts, then the model is rate limited.
            90..=94 => {
                step(
                    &mut b,
                    &mut lat,
                    0,
                    "search",
                    3,
                    Some(ToolErrorCode::Timeout),
                );
                let turn = b.request(1);
                b.push(
                    1,
                    EventKind::ModelFailed {
                        turn,
                        error: ModelFailure {
                            kind: ModelErrorKind::RateLimited,
                            message: "429".into(),
                            status: Some(429),
                        },
                    },
                );
                b.end(EndState::Failed, None)
            }
            // 5 long runs: 17 searches (the first needs 2 attempts), then the budget ends them.
            _ => {
                for c in 0..17 {
                    step(
                        &mut b,
                        &mut lat,
                        c,
                        "search",
                        if c == 0 { 2 } else { 1 },
                        None,
                    );
                }
                b.end(EndState::BudgetExceeded, None)
            }
        };
        all.extend(events);
    }
    assert_eq!(
        (lat.search, lat.fetch),
        (250, 110),
        "latency permutation sizes"
    );
    all
}

#[test]
fn metrics_over_100_runs_match_hand_computed_values() {
    let events = runs();
    let mut options = MetricsOptions::default();
    options.context_windows.insert("gpt-4o".into(), 128_000);
    let m = compute_metrics(&events, &options);

    assert_eq!(m.runs, 100);
    let states: Vec<(&str, u64)> = m.end_states.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        states,
        [
            ("budget_exceeded", 5),
            ("done", 80),
            ("failed", 5),
            ("unrecoverable_tool_contract", 10)
        ]
    );

    // Tool calls: 60·3 + 20·3 + 10·3 + 5·1 + 5·17 = 360; ok: 180 + 40 + 0 + 0 + 85 = 305.
    assert_eq!(m.tool_calls, 360);
    assert_eq!(m.tool_calls_ok, 305);
    assert_eq!(m.step_success_rate, Some(305.0 / 360.0));

    // Survival: runs failing before k calls are the 5 timeouts (1 call) for k = 2, plus
    // the 10 schema runs (3 calls) for k ≥ 4; the budget runs made 17 calls.
    let curve: Vec<(u32, u64, u64)> = m
        .survival
        .iter()
        .map(|p| (p.tool_calls, p.reached, p.alive))
        .collect();
    assert_eq!(curve, [(2, 95, 95), (4, 5, 85), (8, 5, 85), (16, 5, 85)]);
    assert_eq!(m.survival[0].rate, 0.95);
    assert_eq!(m.survival[3].rate, 0.85);

    // Repairs: 20 invalid_input searches fixed by the next search; the schema runs make 2
    // failed attempts each (call 1→2, 2→3; call 3 has no successor) = 20 more.
    assert_eq!((m.repair_attempts, m.repairs_succeeded), (40, 20));
    assert_eq!(m.repair_success_rate, Some(0.5));

    // Retries: 5 timeouts × 2 + 5 long runs × 1 = 15 over 360 calls; one retry event each.
    assert_eq!(m.tool_retries, 15);
    assert_eq!(m.mean_retries, Some(15.0 / 360.0));
    assert_eq!(m.retry_events.get("tool"), Some(&15));

    let errors: Vec<(&str, u64)> = m
        .tool_errors
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        errors,
        [
            ("invalid_input", 20),
            ("output_schema_mismatch", 30),
            ("timeout", 5)
        ]
    );
    assert_eq!(m.model_errors.get("rate_limited"), Some(&5));

    // Latency percentiles (nearest rank): search N=250 → 125, 238; fetch N=110 → 55, 105.
    let search = &m.tools["search"];
    assert_eq!(
        (
            search.calls,
            search.errors,
            search.p50_ms,
            search.p95_ms,
            search.retries
        ),
        (250, 25, 125, 238, 15)
    );
    let fetch = &m.tools["fetch"];
    assert_eq!(
        (
            fetch.calls,
            fetch.errors,
            fetch.p50_ms,
            fetch.p95_ms,
            fetch.retries
        ),
        (110, 30, 55, 105, 0)
    );

    // Models: even runs anthropic, odd runs openai. Answered calls per run: 4, 4, 3, 1, 17;
    // even/odd split of the groups: 30/30, 10/10, 5/5, 3/2, 2/3.
    // Input tokens of a run with m calls: 1000·m(m+1)/2 → 10000, 10000, 6000, 1000, 153000.
    let a = &m.models["anthropic:claude-sonnet-4"];
    assert_eq!(a.calls, 30 * 4 + 10 * 4 + 5 * 3 + 3 + 2 * 17);
    assert_eq!(a.calls, 212);
    assert_eq!(a.failures, 3);
    assert_eq!(
        a.input_tokens,
        30 * 10_000 + 10 * 10_000 + 5 * 6_000 + 3 * 1_000 + 2 * 153_000
    );
    assert_eq!(a.output_tokens, 212 * 100);
    assert!((a.cost_usd - 2.12).abs() < 1e-9, "{}", a.cost_usd);
    assert_eq!((a.p50_ms, a.p95_ms), (500, 500));
    assert!((a.context_utilization_mean.unwrap() - 739_000.0 / 212.0 / 200_000.0).abs() < 1e-12);
    assert_eq!(a.context_utilization_max, Some(17_000.0 / 200_000.0));
    let o = &m.models["openai:gpt-4o"];
    assert_eq!(o.calls, 228);
    assert_eq!(o.failures, 2);
    assert_eq!(o.input_tokens, 891_000);
    assert_eq!(o.output_tokens, 22_800);
    assert!((o.cost_usd - 2.28).abs() < 1e-9, "{}", o.cost_usd);
    assert!((o.context_utilization_mean.unwrap() - 891_000.0 / 228.0 / 128_000.0).abs() < 1e-12);
    assert_eq!(o.context_utilization_max, Some(17_000.0 / 128_000.0));

    let prom = render_prometheus(&m);
    for line in [
        "keel_runs_total{end_state=\"done\"} 80",
        "keel_turn_survival_ratio{tool_calls=\"4\"} 0.85",
        "keel_tool_calls_total{tool=\"search\",outcome=\"error\"} 25",
        "keel_tool_latency_ms{tool=\"search\",quantile=\"0.95\"} 238",
        "keel_tool_errors_total{code=\"output_schema_mismatch\"} 30",
        "keel_repair_success_ratio 0.5",
        "keel_model_tokens_total{model=\"openai:gpt-4o\",type=\"input\"} 891000",
        "keel_model_errors_total{kind=\"rate_limited\"} 5",
        "# TYPE keel_tool_latency_ms summary",
    ] {
        assert!(
            prom.lines().any(|l| l == line),
            "missing {line:?} in\n{prom}"
        );
    }
    let summary = render_summary(&m);
    assert!(summary.contains("runs: 100"), "{summary}");
    assert!(summary.contains("repairs: 20/40 (50.0%)"), "{summary}");
}

#[test]
fn percentile_is_nearest_rank() {
    use keel_telemetry::metrics::percentile;
    assert_eq!(percentile(&[], 50.0), 0);
    assert_eq!(percentile(&[7], 95.0), 7);
    assert_eq!(percentile(&[1, 2, 3, 4], 50.0), 2);
    assert_eq!(percentile(&[1, 2, 3, 4], 95.0), 4);
}
