//! The eval pages over real eval results, a model call's time to first token on the run
//! page, and answering the agent's question from the page.
//!
//! [`EvalFixture`] runs a tiny suite twice through keel-eval's API (`run_suite`, the agent
//! a keel.toml agent, its model `openai:gpt-4.1-mini` against the wire-protocol mock LLM,
//! so the trials' model calls stream and record their first token) and saves both reports
//! as `keel eval run` does: the first as baseline `main`, the second compared with it
//! (`mul` drops from 2/2 to 0/2: a significant regression; `half` rises from 0/2 to 2/2).
//! It also seeds two threads whose runs asked the user a question: one ended
//! `clarify_needed`, one still waiting (its process died while it waited).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_app::App;
use keel_app::recipe::Recipe;
use keel_core::{EndState, EventKind, EventStore, Message};
use keel_eval::{EvalReport, RunOptions, Suite};
use keel_runtime::{RunStatus, Thread, UserInputSource};
use keel_store::{EvalResultStore, EvalRunId};
use keel_telemetry::Redactor;
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use keel_testkit::{ScriptStep, ScriptedModel};
use keel_ui::{AppResumer, RunSource, Scope, Ui};
use serde_json::json;

use crate::common::{get, wait_until};

const KEEL_TOML: &str = r#"
[providers.openai.retry]
max_attempts = 1

[agents.calc]
instructions = "Answer arithmetic with the calculator."
tools = ["calculator"]
"#;

/// A fact the baseline's `half` scenario requires: HTML (shown as text) and a secret
/// (never shown) in a check's reason.
pub const HTML_FACT: &str = "<b>21</b> sk-ant-api03-abcdefghijklmnopqrstuvwx";
const SECRET: &str = "sk-ant-api03-abcdefghijklmnopqrstuvwx";

/// The question the seeded runs ask.
pub const QUESTION: &str = "Which city do you mean?";

fn suite(mul_fact: &str, half_fact: &str) -> Suite {
    let text = format!(
        r#"
[suite]
name = "calc"
agent = "calc"
trials = 2
concurrency = 2

[[scenarios]]
id = "mul"
input = "what is 6*7?"
[scenarios.expect.tool_usage]
required = ["calculator"]
[scenarios.expect.decision_quality]
required_facts = [{mul_fact:?}]
[scenarios.expect.robustness]
end_state = "done"

[[scenarios]]
id = "half"
input = "what is 6*7, and what is half of it?"
[scenarios.expect.tool_usage]
required = ["calculator"]
[scenarios.expect.decision_quality]
required_facts = [{half_fact:?}]
"#
    );
    Suite::parse(&text, "suite.toml").unwrap()
}

/// Never answers: the run waits until its process is gone.
struct NeverAnswers;

#[async_trait]
impl UserInputSource for NeverAnswers {
    async fn answer(&self, _: &str, _: &str, _: &[String]) -> Option<String> {
        std::future::pending().await
    }
}

pub struct EvalFixture {
    pub _dir: tempfile::TempDir,
    pub _mock: MockLlmServer,
    pub store: Arc<dyn EventStore>,
    pub results: Arc<dyn EvalResultStore>,
    pub base: String,
    pub baseline: EvalRunId,
    pub current: EvalRunId,
    pub baseline_report: EvalReport,
    pub current_report: EvalReport,
    /// A thread whose run ended `clarify_needed` with [`QUESTION`].
    pub asked: String,
    /// A thread whose run still waits for the answer to [`QUESTION`].
    pub waiting: String,
}

impl EvalFixture {
    pub async fn new() -> EvalFixture {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("keel.db").display());
        let opened = keel_app::store::open_store(&url).await.unwrap();
        let (store, results) = (opened.events.clone(), opened.eval_results.clone());
        // Every conversation follows the script from its start; the first answer comes
        // after a pause, so its first token is measurably after the call's start.
        let script = MockScript::from_json(
            &json!({
                "turn_by": "conversation",
                "turns": [
                    {"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}], "delay_ms": 30},
                    {"text": "6*7 = 42, and half of it is 21."}
                ]
            })
            .to_string(),
        )
        .unwrap();
        let mock = MockLlmServer::start(script).await.unwrap();
        let env = Arc::new(|n: &str| (n == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
        let app = Arc::new(App::from_toml_str(KEEL_TOML, dir.path(), env).unwrap());
        let options = RunOptions {
            model: Some("openai:gpt-4.1-mini".into()),
            base_url: Some(mock.base_url()),
            store: Some(url.clone()),
            ..RunOptions::default()
        };

        // The baseline: mul passes, half misses its (odd) fact.
        let baseline_report = keel_eval::run_suite(&app, &suite("42", HTML_FACT), &options)
            .await
            .unwrap();
        let baseline = keel_eval::save_report(results.as_ref(), &baseline_report, None)
            .await
            .unwrap();
        results.save_baseline("main", &baseline).await.unwrap();

        // The current run, compared with baseline main as `keel eval run --baseline main`.
        let mut current_report = keel_eval::run_suite(&app, &suite("forty-two", "21"), &options)
            .await
            .unwrap();
        let comparison = keel_eval::compare(&current_report, &baseline_report, 0.05);
        current_report.attach(&comparison);
        current_report.run.as_mut().unwrap().baseline = Some(keel_eval::BaselineRef {
            name: "main".into(),
            run_id: baseline.0,
            threshold: 0.05,
        });
        let current = keel_eval::save_report(results.as_ref(), &current_report, None)
            .await
            .unwrap();

        // A run that asked the user and ended clarify_needed.
        let ask = || {
            vec![ScriptStep::tool_call(
                "ask_user",
                json!({"question": QUESTION, "missing_fields": ["city"]}),
            )]
        };
        let recipe = Recipe::default();
        let built = recipe
            .build_agent(&app, Some(Arc::new(ScriptedModel::new(ask()))))
            .await
            .unwrap();
        let context = app.run_context(store.clone(), None, built.approve);
        let mut thread = Thread::new();
        let outcome = built
            .agent
            .run(vec![Message::user("book a table")], &mut thread, &context)
            .await
            .unwrap();
        assert_eq!(
            outcome.status,
            RunStatus::Ended {
                end_state: EndState::ClarifyNeeded
            }
        );
        let asked = thread.id().to_string();

        // A run still waiting for the answer: its process is gone (the task is aborted
        // while it waits), so the log ends with the question.
        let waiting_thread = Thread::new();
        let waiting = waiting_thread.id().to_string();
        let task = {
            let (app, store) = (app.clone(), store.clone());
            tokio::spawn(async move {
                let built = Recipe::default()
                    .build_agent(&app, Some(Arc::new(ScriptedModel::new(ask()))))
                    .await
                    .unwrap();
                let context = app
                    .run_context(store, None, built.approve)
                    .with_user_input(Arc::new(NeverAnswers));
                let mut thread = waiting_thread;
                let _ = built
                    .agent
                    .run(vec![Message::user("book a table")], &mut thread, &context)
                    .await;
            })
        };
        wait_until(Duration::from_secs(30), || {
            let store = store.clone();
            let id = waiting.clone();
            async move {
                store
                    .load(&id)
                    .await
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e.kind, EventKind::UserAsked { .. }))
            }
        })
        .await;
        task.abort();
        let _ = task.await;

        let resumer = AppResumer::new(app).with_models(Arc::new(|_recipe, _steps| {
            Ok(Some(Arc::new(ScriptedModel::new(vec![ScriptStep::text(
                "Booked in Paris.",
            )])) as Arc<dyn keel_core::Model>))
        }));
        let ui = Ui::new(RunSource::new(store.clone(), Redactor::default()))
            .with_resumer(Arc::new(resumer))
            .with_eval_results(results.clone());
        let base = serve(ui).await;
        EvalFixture {
            _dir: dir,
            _mock: mock,
            store,
            results,
            base,
            baseline,
            current,
            baseline_report,
            current_report,
            asked,
            waiting,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The trial threads of `report`, in report order.
    pub fn threads(report: &EvalReport) -> Vec<String> {
        report
            .scenarios
            .iter()
            .flat_map(|s| s.trials.iter().map(|t| t.thread_id.clone()))
            .collect()
    }
}

/// Serves `ui` on a loopback port; returns its base URL.
pub async fn serve(ui: Ui) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keel_ui::serve(
        listener,
        keel_ui::router(ui),
        std::future::pending(),
    ));
    base
}

/// The text between `start` and the next `end` after it.
fn section<'a>(html: &'a str, start: &str, end: &str) -> &'a str {
    let from = html
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in {html}"));
    let rest = &html[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// Text as maud writes it into HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn post_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn post(url: &str, body: &str, origin: &str) -> reqwest::Response {
    post_client()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", origin)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_runs_grid_and_baseline_comparison() {
    let f = EvalFixture::new().await;
    let (current, baseline) = (f.current, f.baseline);

    // The reports say what the runner measured.
    let meta = f.current_report.run.as_ref().unwrap();
    assert_eq!(meta.agent, "calc");
    assert_eq!(meta.model.as_deref(), Some("openai:gpt-4.1-mini"));
    assert_eq!(meta.trials, 2);
    assert!(meta.cost_usd.unwrap() > 0.0, "{meta:?}");
    let trial = &f.current_report.scenarios[0].trials[0];
    assert_eq!(trial.facts.end_state.as_deref(), Some("done"));
    assert_eq!(trial.facts.model_calls, Some(2));

    let expected = keel_eval::compare(&f.current_report, &f.baseline_report, 0.05);
    assert!(expected.is_regression());
    let significant = expected
        .regressions
        .iter()
        .filter(|c| c.significant)
        .count();

    // The list: both runs, newest first, with their figures and baseline.
    let (status, html) = get(&f.url("/evals")).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("id=\"nav-evals\""), "{html}");
    let body = section(&html, "id=\"evals-body\"", "</tbody>");
    let order: Vec<&str> = body
        .split("data-run=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect();
    assert_eq!(order, [current.to_string(), baseline.to_string()]);
    let row = section(body, &format!("data-run=\"{current}\""), "</tr>");
    assert!(row.contains("calc · "), "{row}");
    assert!(row.contains("openai:gpt-4.1-mini"), "{row}");
    assert!(row.contains("50.0%"), "{row}");
    assert!(row.contains(&format!(">{significant} regression")), "{row}");
    assert!(
        row.contains(&format!("${:.4}", meta.cost_usd.unwrap())),
        "{row}"
    );
    let base_row = section(body, &format!("data-run=\"{baseline}\""), "</tr>");
    assert!(base_row.contains("badge baseline\">main<"), "{base_row}");
    assert!(html.contains("id=\"evals-trend\""));
    let (_, filtered) = get(&f.url("/evals?suite=other")).await;
    assert!(filtered.contains("id=\"evals-empty\""), "{filtered}");
    let (_, one) = get(&f.url("/evals?limit=1")).await;
    assert!(one.contains("id=\"evals-next\""), "{one}");

    // One run's grid: a row per scenario, a cell per trial, each cell linking to the
    // trial's run page and saying why it failed.
    let (status, html) = get(&f.url(&format!("/evals/{current}"))).await;
    assert_eq!(status, 200, "{html}");
    // The grid holds the checks tables: it ends at its own body's end.
    let grid = section(&html, "id=\"eval-grid\"", "</tbody></table>");
    for scenario in &f.current_report.scenarios {
        let row = section(grid, &format!("data-scenario=\"{}\"", scenario.id), "</tr>");
        let status = serde_json::to_value(scenario.status).unwrap();
        assert!(
            row.contains(&format!("data-status=\"{}\"", status.as_str().unwrap())),
            "{row}"
        );
        for (n, trial) in scenario.trials.iter().enumerate() {
            let cell = section(row, &format!("data-trial=\"{}\"", n + 1), "</td>");
            assert!(
                cell.contains(&format!("href=\"/runs/{}\"", trial.thread_id)),
                "{cell}"
            );
            for check in trial.checks.iter().filter(|c| !c.passed) {
                let reason = escape(&check.reason);
                assert!(cell.contains(&reason), "{cell} lacks {reason}");
            }
        }
    }
    let mul = section(grid, "data-scenario=\"mul\"", "</tr>");
    assert!(mul.contains("data-status=\"failed\""), "{mul}");
    assert!(mul.contains("forty-two"), "{mul}");
    assert!(html.contains(&format!("?baseline={baseline}\"")), "{html}");
    assert!(html.contains("baseline main (#"), "{html}");
    // A trial's run page names its eval run, and shows each model call's first token.
    let thread = &f.current_report.scenarios[0].trials[0].thread_id;
    let (_, run_page) = get(&f.url(&format!("/runs/{thread}"))).await;
    assert!(
        run_page.contains(&format!("href=\"/evals/{current}\"")),
        "{run_page}"
    );
    assert!(
        run_page.contains("Trial 1 of scenario <code>mul</code>"),
        "{run_page}"
    );

    // A trial whose thread left the store is shown without a link.
    let gone = f.current_report.scenarios[1].trials[1]
        .thread_id
        .to_string();
    assert!(f.store.delete_thread(&gone).await.unwrap());
    let (_, html) = get(&f.url(&format!("/evals/{current}"))).await;
    let cell = section(&html, &format!("data-thread=\"{gone}\""), "</td>");
    assert!(
        cell.contains("trial-gone") && !cell.contains("href="),
        "{cell}"
    );

    // The baseline's reasons quote its odd fact: escaped, and the secret redacted.
    let (_, html) = get(&f.url(&format!("/evals/{baseline}"))).await;
    assert!(html.contains("&lt;b&gt;21&lt;/b&gt;"), "{html}");
    assert!(!html.contains("<b>21</b>"));
    assert!(!html.contains(SECRET));

    // The comparison: what keel_eval::compare says, highlighted.
    for url in [
        format!("/evals/{current}/compare"),
        format!("/evals/{current}/compare?baseline=main"),
        format!("/evals/{current}/compare?baseline={baseline}&threshold=0.05"),
    ] {
        let (status, html) = get(&f.url(&url)).await;
        assert_eq!(status, 200, "{url}: {html}");
        assert!(html.contains("data-regression=\"true\""), "{url}: {html}");
        let chart = section(&html, "id=\"compare-chart\"", "</svg>");
        for change in &expected.regressions {
            let bar = format!(
                "data-scenario=\"{}\" data-metric=\"{}\" data-delta=\"{:.6}\" data-significant=\"{}\"",
                change.scenario, change.metric, change.delta, change.significant
            );
            assert!(chart.contains(&bar), "{bar} not in {chart}");
        }
        for change in &expected.improvements {
            let bar = format!(
                "data-scenario=\"{}\" data-metric=\"{}\" data-delta=\"{:.6}\"",
                change.scenario, change.metric, change.delta
            );
            assert!(chart.contains(&bar), "{bar} not in {chart}");
        }
        let grid = section(&html, "id=\"compare-grid\"", "</table>");
        assert!(
            grid.contains("data-scenario=\"mul\" data-change=\"regressed\""),
            "{grid}"
        );
        assert!(
            grid.contains("data-scenario=\"half\" data-change=\"improved\""),
            "{grid}"
        );
        let summary = section(&html, "id=\"compare-summary\"", "</table>");
        assert!(summary.contains("data-metric=\"pass_rate\""), "{summary}");
    }
    let mul_drop = expected
        .regressions
        .iter()
        .find(|c| c.scenario == "mul" && c.metric == "pass_rate")
        .unwrap();
    assert!(
        mul_drop.significant && mul_drop.delta < -0.99,
        "{mul_drop:?}"
    );
    // A threshold above every change lists none.
    let (_, calm) = get(&f.url(&format!(
        "/evals/{current}/compare?baseline=main&threshold=1"
    )))
    .await;
    assert!(calm.contains("data-regression=\"false\""), "{calm}");
    assert!(calm.contains("id=\"compare-chart-empty\""), "{calm}");
    // The baseline run itself was compared with nothing: the page offers the baselines.
    let (status, chooser) = get(&f.url(&format!("/evals/{baseline}/compare"))).await;
    assert_eq!(status, 200);
    assert!(chooser.contains("id=\"baseline-choices\""), "{chooser}");

    // Bad input: 404 for unknown runs, 400 naming the parameter.
    for (url, code, says) in [
        ("/evals/999".to_string(), 404, "there is no eval run 999"),
        ("/evals/abc".to_string(), 404, "there is no eval run abc"),
        ("/evals?limit=0".to_string(), 400, "invalid `limit`"),
        ("/evals?color=red".to_string(), 400, "invalid `color`"),
        (
            format!("/evals/{current}/compare?baseline=nightly"),
            400,
            "no baseline named",
        ),
        (
            format!("/evals/{current}/compare?baseline=999"),
            400,
            "there is no eval run 999",
        ),
        (
            format!("/evals/{current}/compare?threshold=2"),
            400,
            "invalid `threshold`",
        ),
    ] {
        let (status, html) = get(&f.url(&url)).await;
        assert_eq!(status, code, "{url}: {html}");
        assert!(html.contains(says), "{url}: {html}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_pages_respect_the_scope_and_need_eval_results() {
    let f = EvalFixture::new().await;
    // A tenant's scope holds none of the eval's threads: no eval run is shown.
    let scoped = Ui::new(
        RunSource::new(f.store.clone(), Redactor::default())
            .with_scope(Scope::ThreadPrefix("acme.".into())),
    )
    .with_eval_results(f.results.clone());
    let base = serve(scoped).await;
    let (status, html) = get(&format!("{base}/evals")).await;
    assert_eq!(status, 200);
    assert!(html.contains("id=\"evals-empty\""), "{html}");
    let (status, _) = get(&format!("{base}/evals/{}", f.current)).await;
    assert_eq!(status, 404);
    let (status, html) = get(&format!("{base}/evals/{}/compare?baseline=main", f.current)).await;
    assert_eq!(status, 404, "{html}");
    // Without eval results: no link, and the pages are 404.
    let plain = serve(Ui::new(RunSource::new(
        f.store.clone(),
        Redactor::default(),
    )))
    .await;
    let (_, runs) = get(&format!("{plain}/runs")).await;
    assert!(!runs.contains("nav-evals"));
    let (status, html) = get(&format!("{plain}/evals")).await;
    assert_eq!(status, 404);
    assert!(html.contains("shows no eval results"), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_calls_show_their_time_to_first_token() {
    let f = EvalFixture::new().await;
    let thread = &f.current_report.scenarios[0].trials[0].thread_id;
    let events = f.store.load(thread).await.unwrap();
    let answers: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponded {
                first_token_ms,
                latency_ms,
                ..
            } => Some((first_token_ms.unwrap(), *latency_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 2);
    // The first answer waited 30 ms at the mock before anything was sent.
    assert!(answers[0].0 >= 30, "{answers:?}");
    assert!(
        answers.iter().all(|(first, latency)| first <= latency),
        "{answers:?}"
    );

    let (status, html) = get(&f.url(&format!("/runs/{thread}"))).await;
    assert_eq!(status, 200);
    for (first, _) in &answers {
        assert!(
            html.contains(&format!("data-ttft-ms=\"{first}\"")),
            "{first} not in {html}"
        );
    }
    assert_eq!(html.matches("<span class=\"ttft\"").count(), 2, "{html}");
    assert!(html.contains(" · ttft "), "{html}");
    // The span's details say it too.
    let chat = html
        .split("data-span-id=\"")
        .skip(1)
        .find(|s| s.contains("data-kind=\"chat\"") && s.contains("data-ttft-ms"))
        .map(|s| s[..s.find('"').unwrap()].to_string())
        .unwrap();
    let (status, detail) = get(&f.url(&format!("/runs/{thread}/spans/{chat}"))).await;
    assert_eq!(status, 200, "{detail}");
    assert!(
        detail.contains(&format!(
            "class=\"ttft-value\" data-ms=\"{}\"",
            answers[0].0
        )),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answering_the_question_from_the_page() {
    let f = EvalFixture::new().await;

    // A run that ended clarify_needed: the question and the form.
    let asked = f.asked.clone();
    let (status, html) = get(&f.url(&format!("/runs/{asked}"))).await;
    assert_eq!(status, 200);
    let question = section(&html, "id=\"question\"", "</form>");
    assert!(question.contains("data-in-run=\"false\""), "{question}");
    assert!(question.contains(QUESTION), "{question}");
    assert!(question.contains("It needs: city"), "{question}");
    assert!(
        question.contains(&format!("action=\"/runs/{asked}/reply\"")),
        "{question}"
    );

    // Refused: another site, no anti-forgery token, an empty answer, a thread not waiting.
    let token = crate::common::csrf_of(&html);
    let url = f.url(&format!("/runs/{asked}/reply"));
    assert_eq!(
        post(&url, "answer=Paris", &f.base).await.status().as_u16(),
        403
    );
    assert_eq!(
        post(
            &url,
            &format!("answer=Paris&csrf={token}"),
            "http://evil.example"
        )
        .await
        .status()
        .as_u16(),
        403
    );
    assert_eq!(
        post(&url, &format!("answer=+&csrf={token}"), &f.base)
            .await
            .status()
            .as_u16(),
        400
    );
    let done = EvalFixture::threads(&f.current_report).remove(0);
    let conflict = post(
        &f.url(&format!("/runs/{done}/reply")),
        &format!("answer=x&csrf={token}"),
        &f.base,
    )
    .await;
    assert_eq!(conflict.status().as_u16(), 409);

    // The answer starts the thread's next run, with the answer as its message.
    let sent = post(
        &url,
        &format!("answer=Paris%2C+France&csrf={token}"),
        &f.base,
    )
    .await;
    assert_eq!(sent.status().as_u16(), 303);
    let events = wait_for_end(&f, &asked, 2).await;
    let answers: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage { message } => Some(message.text()),
            _ => None,
        })
        .collect();
    assert_eq!(answers, ["book a table", "Paris, France"]);
    let last = events.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunEnded {
            end_state,
            final_text,
            ..
        } => Some((*end_state, final_text.clone())),
        _ => None,
    });
    assert_eq!(
        last,
        Some((EndState::Done, Some("Booked in Paris.".to_string())))
    );
    let (_, html) = get(&f.url(&format!("/runs/{asked}"))).await;
    assert!(!html.contains("id=\"question\""), "{html}");
    assert!(html.contains("id=\"run-state\">done<"), "{html}");

    // A run still waiting: the answer goes into that run, which continues.
    let waiting = f.waiting.clone();
    let (_, html) = get(&f.url(&format!("/runs/{waiting}"))).await;
    let question = section(&html, "id=\"question\"", "</form>");
    assert!(question.contains("data-in-run=\"true\""), "{question}");
    let sent = post(
        &f.url(&format!("/runs/{waiting}/reply")),
        &format!("answer=Lyon&csrf={token}"),
        &f.base,
    )
    .await;
    assert_eq!(sent.status().as_u16(), 303);
    let events = wait_for_end(&f, &waiting, 1).await;
    let answered = events.iter().any(|e| {
        matches!(&e.kind, EventKind::ToolCallFinished { result }
            if result.name == "ask_user" && result.outcome.is_ok() && result.content.contains("Lyon"))
    });
    assert!(answered, "{events:#?}");
    let ended = events.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunEnded { end_state, .. } => Some(*end_state),
        _ => None,
    });
    assert_eq!(ended, Some(EndState::Done));
}

/// Waits until `thread` holds `runs` ended runs; returns its log.
async fn wait_for_end(f: &EvalFixture, thread: &str, runs: usize) -> Vec<keel_core::Event> {
    let count = || async {
        f.store
            .load(thread)
            .await
            .unwrap()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RunEnded { .. }))
            .count()
    };
    let ended = wait_until(Duration::from_secs(30), || async { count().await >= runs });
    if tokio::time::timeout(Duration::from_secs(31), ended)
        .await
        .is_err()
    {
        let (_, page) = get(&f.url(&format!("/runs/{thread}"))).await;
        panic!("thread {thread} did not end {runs} runs: {page}");
    }
    f.store.load(thread).await.unwrap()
}
